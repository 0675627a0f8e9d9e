"""Hypothesis strategies for RV-style messages: every field type, nesting, ids, envelopes."""

from __future__ import annotations

from ipaddress import IPv4Address
from typing import Any

from hypothesis import strategies as st

from transports.rv.message import (
    ARRAY_ELEMENTS,
    DATETIME_MAX,
    DATETIME_MIN,
    INT_RANGES,
    CmLabel,
    Message,
    Origin,
    RvDateTime,
    RvType,
)

KNOWN = {t.value for t in RvType}
UNKNOWN_CODES = [c for c in range(256) if c not in KNOWN]

text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\0"), max_size=12)
names = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\0"),
                min_size=1, max_size=10)
subjects = st.lists(st.text("abcXYZ_01", min_size=1, max_size=5), min_size=1,
                    max_size=4).map(".".join)


def scalar(t: int) -> st.SearchStrategy[Any]:
    """Values of a scalar type ``t`` (an int type, a float type, BOOL...)."""
    if t in INT_RANGES:
        lo, hi = INT_RANGES[t]
        return st.integers(lo, hi)
    if t == RvType.F32:
        return st.floats(width=32)
    if t == RvType.F64:
        return st.floats()
    raise AssertionError(t)


def value_of(t: int, depth: int) -> st.SearchStrategy[Any]:
    """Values for a field of type ``t``; submessages nest at most ``depth`` more levels."""
    if t == RvType.MSG:
        return messages(depth - 1)
    if t == RvType.MSGARRAY:
        return st.lists(messages(depth - 1), max_size=3)
    if t in ARRAY_ELEMENTS:
        return st.lists(scalar(ARRAY_ELEMENTS[t]), max_size=5)
    if t == RvType.STRING:
        return text
    if t == RvType.STRINGARRAY:
        return st.lists(text, max_size=4)
    if t == RvType.BOOL:
        return st.booleans()
    if t == RvType.DATETIME:
        return st.builds(RvDateTime, st.integers(DATETIME_MIN, DATETIME_MAX),
                         st.integers(0, 999_999))
    if t == RvType.IPADDR32:
        return st.integers(0, 2**32 - 1).map(IPv4Address)
    if t in INT_RANGES or t in (RvType.F32, RvType.F64):
        return scalar(t)
    return st.binary(max_size=12)  # OPAQUE, XML, ENCRYPTED, unknown codes


FLAT = [t.value for t in RvType if t not in (RvType.MSG, RvType.MSGARRAY)]
field_types = st.sampled_from([t.value for t in RvType]) | st.sampled_from(UNKNOWN_CODES)
flat_types = st.sampled_from(FLAT) | st.sampled_from(UNKNOWN_CODES)


@st.composite
def messages(draw: st.DrawFn, depth: int = 3) -> Message:
    """A message of up to 6 fields of any type, nesting up to ``depth`` levels below it."""
    m = Message()
    used: set[int] = set()
    for _ in range(draw(st.integers(0, 6))):
        t = draw(field_types if depth > 0 else flat_types)
        name = draw(st.none() | names)
        fid = 0
        if name is not None and draw(st.booleans()):
            fid = draw(st.integers(1, 65535))
            if fid in used:
                fid = 0
            used.add(fid)
        m.add(name, draw(value_of(t, depth)), t, fid, internal=True)
    return m


@st.composite
def top_messages(draw: st.DrawFn) -> Message:
    """A message with an envelope: subject, and sometimes reply, encoding, CM label, origin."""
    m = draw(messages())
    m.send_subject = draw(st.none() | subjects)
    m.reply_subject = draw(st.none() | subjects)
    if draw(st.booleans()):
        m.cm = CmLabel(draw(names), draw(st.integers(0, 2**64 - 1)),
                       draw(st.floats(0, 1e9)))
    if draw(st.booleans()):
        m.origin = Origin(draw(names), draw(st.integers(0, 255)))
    return m
