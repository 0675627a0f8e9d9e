"""MQTT topic names and filters ↔ gateway subjects.

How this works. An MQTT topic ``a/b/c`` is the subject ``a.b.c``: each MQTT level becomes
one subject element. Characters that MQTT allows in a level but that are special in a
subject are percent-escaped, and an empty level (``a//b``, a leading or trailing ``/``)
becomes a lone ``%``, so every MQTT topic maps to a valid subject and back unchanged:

===========  =========  ==========================================
MQTT level   element    why
===========  =========  ==========================================
``%``        ``%25``    the escape character itself
``.``        ``%2E``    the subject separator
``*``        ``%2A``    one-element wildcard in subjects
``>``        ``%3E``    trailing wildcard in subjects
(empty)      ``%``      subjects have no empty elements (TIBCO EMS User's Guide,
                        "Destination Name Syntax")
===========  =========  ==========================================

In the other direction (a subject made by a JMS, AMQP or STOMP client, delivered to an MQTT
subscriber) only those escapes are decoded; a ``/``, ``+`` or ``#`` inside an element, legal
in EMS names but not in one MQTT level, is written ``%2F``, ``%2B``, ``%23``.

Filters: ``+`` ↔ ``*``; ``#`` ↔ ``>``, and ``a/#`` also matches ``a`` (MQTT's parent match,
[MQTT-4.7.1-2]) through the subscription index's ``parent_match``. ``$share/group/f`` is a
core shared subscription named ``group`` on ``f`` ([MQTT-4.8.2]). Filters starting with a
wildcard do not match topics starting with ``$`` ([MQTT-4.7.2-1]); the subscription index
applies that rule.

EMS limits apply to the mapped subject (249 characters, 64 elements, 127 per element);
a longer topic is refused with "topic name invalid".
"""

from __future__ import annotations

from typing import NamedTuple

from gateway import subject
from gateway.errors import InvalidDestinationError

_ESCAPE_IN = str.maketrans({"%": "%25", ".": "%2E", "*": "%2A", ">": "%3E"})
_DECODE = {"%25": "%", "%2E": ".", "%2A": "*", "%3E": ">", "%2e": ".", "%2a": "*", "%3e": ">"}
_ESCAPE_OUT = str.maketrans({"/": "%2F", "+": "%2B", "#": "%23"})
EMPTY_LEVEL = "%"


def _level_to_element(level: str) -> str:
    if not level:
        return EMPTY_LEVEL
    if "%" in level or "." in level or "*" in level or ">" in level:
        return level.translate(_ESCAPE_IN)
    return level


def element_to_level(el: str) -> str:
    """One element of a core subject as an MQTT topic level (the escapes undone)."""
    if el == EMPTY_LEVEL:
        return ""
    if "%" in el:
        out = []
        i = 0
        n = len(el)
        while i < n:
            c = el[i]
            if c == "%" and el[i : i + 3] in _DECODE:
                out.append(_DECODE[el[i : i + 3]])
                i += 3
                continue
            out.append(c)
            i += 1
        el = "".join(out)
    if "/" in el or "+" in el or "#" in el:
        el = el.translate(_ESCAPE_OUT)
    return el


def mqtt_topic_to_subject(topic: str) -> str:
    """Map an MQTT topic name to a subject.

    Raises:
        InvalidDestinationError: the mapped name breaks an EMS limit.
    """
    name = ".".join([_level_to_element(level) for level in topic.split("/")])
    subject.validate(name, system=name.startswith("$"))
    return name


def subject_to_mqtt_topic(name: str) -> str:
    """Map a subject to the MQTT topic name an MQTT subscriber sees."""
    if "%" not in name and "/" not in name and "+" not in name and "#" not in name:
        return name.replace(".", "/")
    return "/".join([element_to_level(el) for el in name.split(".")])


class MqttFilter(NamedTuple):
    """A topic filter mapped onto the core: pattern, parent match and shared group."""

    pattern: str
    parent_match: bool
    share: str | None


def mqtt_filter_to_subject(topic_filter: str) -> MqttFilter:
    """Map an MQTT topic filter (possibly ``$share/group/...``) to a core subscription.

    Raises:
        InvalidDestinationError: bad shared-subscription syntax or EMS limits.
    """
    share = None
    if topic_filter.startswith("$share/"):
        parts = topic_filter.split("/", 2)
        if len(parts) < 3 or not parts[1] or "+" in parts[1] or "#" in parts[1] or not parts[2]:
            raise InvalidDestinationError(f"malformed shared subscription {topic_filter!r}")
        share = parts[1]
        topic_filter = parts[2]
    levels = topic_filter.split("/")
    elements = []
    for level in levels:
        if level == "+":
            elements.append(subject.STAR)
        elif level == "#":
            elements.append(subject.GT)
        else:
            elements.append(_level_to_element(level))
    parent = len(elements) > 1 and elements[-1] == subject.GT
    pattern = ".".join(elements)
    subject.validate(pattern, wildcards=True, system=pattern.startswith("$"))
    return MqttFilter(pattern, parent, share)
