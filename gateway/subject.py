"""Destination names: EMS/RV subjects, their limits and their wildcards.

A name is a string of elements separated by ``.`` (TIBCO EMS User's Guide,
"Destination Name Syntax"). ``*`` as a whole element matches exactly one element; ``>`` as the
last element matches one or more trailing elements (EMS User's Guide, "Wildcards"). A dot
cannot be escaped: a backslash stays part of the element (EMS User's Guide,
"Destination Name Syntax"). Limits (EMS User's Guide, "Destination Name Syntax"): at most 249
characters, 64 elements, 127 characters per element; no empty element. ``$`` may not start a
client-created name (EMS User's Guide, "Naming Conventions"): the ``$sys.`` namespace belongs
to the server, ``$TMP$.`` to temporary destinations.

Every adapter maps its own syntax onto these names (MQTT ``a/b``, STOMP ``/queue/x``, AMQP
``queue://x``) in its own package; nothing here knows about protocols.
"""

from __future__ import annotations

from typing import NewType

from gateway.errors import InvalidDestinationError

Subject = NewType("Subject", str)

MAX_NAME_LENGTH = 249  # EMS User's Guide, "Destination Name Syntax"
MAX_ELEMENTS = 64  # EMS User's Guide, "Destination Name Syntax"
MAX_ELEMENT_LENGTH = 127  # EMS User's Guide, "Destination Name Syntax"

STAR = "*"
GT = ">"


def validate(name: str, *, wildcards: bool = False, system: bool = False) -> list[str]:
    """Check ``name`` against the EMS syntax and return its elements.

    Args:
        name: the destination name.
        wildcards: allow ``*`` and ``>`` elements (subscriptions and config definitions).
        system: allow a leading ``$`` (server-created names such as ``$sys.undelivered``).

    Raises:
        InvalidDestinationError: saying which rule the name breaks.
    """
    if not name:
        raise InvalidDestinationError("destination name is empty")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidDestinationError(
            f"destination name is {len(name)} characters; the limit is {MAX_NAME_LENGTH}"
        )
    if name[0] == "$" and not system:
        raise InvalidDestinationError(f"destination name {name!r} may not start with '$'")
    elements = name.split(".")
    if len(elements) > MAX_ELEMENTS:
        raise InvalidDestinationError(
            f"destination name has {len(elements)} elements; the limit is {MAX_ELEMENTS}"
        )
    last = len(elements) - 1
    for i, el in enumerate(elements):
        if not el:
            raise InvalidDestinationError(f"destination name {name!r} has an empty element")
        if len(el) > MAX_ELEMENT_LENGTH:
            raise InvalidDestinationError(
                f"element {i + 1} of {name!r} is {len(el)} characters; "
                f"the limit is {MAX_ELEMENT_LENGTH}"
            )
        if el == STAR or el == GT:
            if not wildcards:
                raise InvalidDestinationError(
                    f"destination name {name!r} contains the wildcard {el!r}"
                )
            if el == GT and i != last:
                raise InvalidDestinationError(f"'>' must be the last element in {name!r}")
        elif "*" in el or ">" in el:
            raise InvalidDestinationError(
                f"'*' and '>' may only stand as whole elements, not inside {el!r}"
            )
    return elements


def is_wildcard(name: str) -> bool:
    """True if ``name`` has a ``*`` or ``>`` element."""
    if "*" not in name and ">" not in name:
        return False
    return any(el == STAR or el == GT for el in name.split("."))


def matches(pattern: str, name: str) -> bool:
    """True if the wildcard ``pattern`` matches the literal ``name`` (EMS User's Guide,
    "Wildcards")."""
    return _match(pattern.split("."), name.split("."))


def _match(p: list[str], n: list[str]) -> bool:
    for i, el in enumerate(p):
        if el == GT:
            return len(n) > i
        if i >= len(n):
            return False
        if el != STAR and el != n[i]:
            return False
    return len(p) == len(n)


def contains(outer: str, inner: str) -> bool:
    """True if every name ``inner`` matches is also matched by ``outer``.

    ``foo.>`` contains ``foo.bar.*`` and ``foo.*.baz``; ``foo.bar.*`` and ``foo.*.baz``
    merely intersect (EMS User's Guide, "Implications of Wildcards on Permissions").
    """
    o, i = outer.split("."), inner.split(".")
    for k, el in enumerate(o):
        if el == GT:
            return len(i) > k
        if k >= len(i):
            return False
        if i[k] == GT:
            return False
        if el != STAR and (i[k] == STAR or el != i[k]):
            return False
    return len(o) == len(i)


def intersects(a: str, b: str) -> bool:
    """True if some literal name is matched by both patterns."""
    pa, pb = a.split("."), b.split(".")
    for k in range(max(len(pa), len(pb))):
        ea = pa[k] if k < len(pa) else None
        eb = pb[k] if k < len(pb) else None
        if ea == GT:
            return eb is not None
        if eb == GT:
            return ea is not None
        if ea is None or eb is None:
            return False
        if ea != STAR and eb != STAR and ea != eb:
            return False
    return True
