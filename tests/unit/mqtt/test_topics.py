"""MQTT topic and filter mapping onto subjects: reversible, and matching as MQTT does."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.mqtt.topics import (
    mqtt_filter_to_subject,
    mqtt_topic_to_subject,
    subject_to_mqtt_topic,
)
from gateway.errors import InvalidDestinationError
from gateway.subindex import SubIndex

CASES = [
    ("a/b/c", "a.b.c"),
    ("sensor", "sensor"),
    ("/leading", "%.leading"),
    ("trailing/", "trailing.%"),
    ("a//b", "a.%.b"),
    ("/", "%.%"),
    ("v1.2/x", "v1%2E2.x"),
    ("star*/gt>", "star%2A.gt%3E"),
    ("100%/done", "100%25.done"),
    ("%2E", "%252E"),
    ("$SYS/broker", "$SYS.broker"),
    ("ünïcode/日本", "ünïcode.日本"),
]


@pytest.mark.parametrize("topic,name", CASES)
def test_topic_maps_both_ways(topic, name):
    assert mqtt_topic_to_subject(topic) == name
    assert subject_to_mqtt_topic(name) == topic


@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",),
                                               blacklist_characters="/+#\x00"), max_size=8),
                min_size=1, max_size=6))
def test_every_mqtt_topic_round_trips(levels):
    topic = "/".join(levels)
    if not topic:
        return
    try:
        name = mqtt_topic_to_subject(topic)
    except InvalidDestinationError:
        return  # over an EMS limit
    assert subject_to_mqtt_topic(name) == topic


def test_foreign_subject_characters_are_escaped_for_mqtt():
    assert subject_to_mqtt_topic("foo/bar.baz") == "foo%2Fbar/baz"
    assert subject_to_mqtt_topic("a+b.c#") == "a%2Bb/c%23"
    assert subject_to_mqtt_topic("50%.x") == "50%/x"


def test_filters():
    assert mqtt_filter_to_subject("a/+/c") == ("a.*.c", False, None)
    assert mqtt_filter_to_subject("a/#") == ("a.>", True, None)
    assert mqtt_filter_to_subject("#") == (">", False, None)
    assert mqtt_filter_to_subject("+") == ("*", False, None)
    assert mqtt_filter_to_subject("$share/g1/a/#") == ("a.>", True, "g1")
    for bad in ("$share/g1", "$share//a", "$share/g+/a"):
        with pytest.raises(InvalidDestinationError):
            mqtt_filter_to_subject(bad)


@pytest.mark.parametrize(
    "flt,topic,expected",
    [
        ("sport/tennis/#", "sport/tennis", True),  # [MQTT-4.7.1-2] parent match
        ("sport/tennis/#", "sport/tennis/player1/ranking", True),
        ("sport/#", "sport", True),
        ("#", "sport/tennis", True),
        ("sport/+", "sport/", True),
        ("sport/+", "sport", False),
        ("+/+", "/finance", True),
        ("/+", "/finance", True),
        ("+", "/finance", False),
        ("#", "$SYS/x", False),  # [MQTT-4.7.2-1]
        ("+/monitor", "$SYS/monitor", False),
        ("$SYS/#", "$SYS/monitor", True),
        ("a/b", "a/b", True),
        ("a/b", "a/b/c", False),
        ("v1.2/+", "v1.2/x", True),
        ("v1.2/+", "v1/2/x", False),
    ],
)
def test_matching_follows_mqtt(flt, topic, expected):
    idx = SubIndex()
    f = mqtt_filter_to_subject(flt)
    idx.insert(f.pattern, "sub", parent_match=f.parent_match)
    assert bool(idx.match(mqtt_topic_to_subject(topic))) is expected
