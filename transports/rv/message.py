"""Self-describing messages of the RV-style bus: ordered, typed, optionally named fields.

How this works. A :class:`Message` is an ordered list of :class:`Field` s (TIBCO Rendezvous
Concepts, Data, "Message Structure"); each field has an optional name, an optional 16-bit id,
an explicit type code and a value. The type is kept exactly as added or received, so a field
that arrived as ``U8`` leaves as ``U8`` (the codec never guesses a type from a value). The
type codes are Rendezvous' own public numbers (:class:`RvType`, TIBCO Rendezvous Concepts,
Data, "Rendezvous Datatypes", Table 16) so that tools and people can recognise them; the
wire format is ours (``codec.py``), not TIBCO's.

Rules kept by :meth:`Message.add` (TIBCO Rendezvous Concepts, Data, "Field Names and Field
Identifiers"): several fields may share a name; a non-zero id is unique within one message
level (a submessage has its own id space) and needs a name; names starting with ``_`` are
reserved (``_data_``) and refused unless ``internal=True``; a name has at most 127 UTF-8 bytes
(``TIBRVMSG_FIELDNAME_MAX``). An empty name is the same as no name.

Values, by type (each adder converts and range-checks once, so encoding can trust them):

=====================  ==============================================================
``MSG``                :class:`Message` (nested to any depth)
``DATETIME``           :class:`RvDateTime` (``datetime`` is converted; naive is UTC)
``OPAQUE``, ``XML``    ``bytes`` (``XML`` also takes ``str``, stored as UTF-8)
``STRING``             ``str`` without NUL; ``bytes`` = already encoded, kept raw (a
                       received string that its encoding could not decode stays bytes)
``BOOL``               ``bool``
``I8`` … ``U64``       ``int`` in the type's range
``F32``, ``F64``       ``float`` (an ``F32`` is rounded to binary32 when added)
``IPADDR32``           ``ipaddress.IPv4Address`` (a dotted string or an int converts)
``IPPORT16``           ``int`` 0..65535
numeric arrays         ``array.array`` of the type's element (any iterable converts)
``STRINGARRAY``        ``list`` of ``str`` (or raw ``bytes`` as for ``STRING``)
``MSGARRAY``           ``list`` of :class:`Message`
``ENCRYPTED``, others  ``bytes``: carried and re-encoded unchanged
=====================  ==============================================================

Type inference when ``type`` is not given (:func:`infer_type`): ``bool`` → BOOL, ``int`` →
I64 (always I64, whatever the value: a field's type should not change with its value, and
I64 is what the JMS side calls ``long``; an int outside I64 needs an explicit ``U64``),
``float`` → F64, ``str`` → STRING, ``bytes``/``bytearray``/``memoryview`` → OPAQUE,
:class:`Message` → MSG, ``datetime`` / :class:`RvDateTime` → DATETIME, ``IPv4Address`` →
IPADDR32, ``array.array`` → the array type of its typecode (``'l'`` by its item size), a
non-empty ``list`` of ``str`` → STRINGARRAY and of :class:`Message` → MSGARRAY. Anything
else (an empty list, a list of ints) needs ``type=``.

The envelope travels with a top-level message (TIBCO Rendezvous Concepts, Fundamentals,
"Supplementary Information for Messages"): :attr:`Message.send_subject`,
:attr:`Message.reply_subject`, the string-encoding tag :attr:`Message.encoding` (``None`` =
UTF-8), the certified-delivery label :attr:`Message.cm` and the gateway-origin marker
:attr:`Message.origin` (used to stop bridging loops), and the routing marker
:attr:`Message.route` (the network a router picked the message up on, and its router hops:
:mod:`transports.rv.router`). A nested message's envelope is not encoded.

Equality is exact: fields in order with the same names, ids, types and values, where floats
compare by their bits (two NaNs with the same bits are equal, ``-0.0`` is not ``0.0``), and
the same envelope. Messages are not thread-safe (as in Rendezvous).
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from enum import IntEnum
from ipaddress import IPv4Address
from operator import index
from typing import Any, NamedTuple


class RvType(IntEnum):
    """Field type codes: Rendezvous' ``TIBRVMSG_*`` numbers (Concepts, Data, Table 16)."""

    MSG = 1
    DATETIME = 3
    OPAQUE = 7
    STRING = 8
    BOOL = 9
    I8 = 14
    U8 = 15
    I16 = 16
    U16 = 17
    I32 = 18
    U32 = 19
    I64 = 20
    U64 = 21
    F32 = 24
    F64 = 25
    IPPORT16 = 26
    IPADDR32 = 27
    ENCRYPTED = 32  # obsolete since release 6 (Concepts, Architecture, "Encrypted Fields")
    I8ARRAY = 34
    U8ARRAY = 35
    I16ARRAY = 36
    U16ARRAY = 37
    I32ARRAY = 38
    U32ARRAY = 39
    I64ARRAY = 40
    U64ARRAY = 41
    F32ARRAY = 44
    F64ARRAY = 45
    XML = 47
    STRINGARRAY = 48
    MSGARRAY = 49


# Plain ints for the hot paths (an IntEnum member compares slower than an int).
MSG = 1
DATETIME = 3
OPAQUE = 7
STRING = 8
BOOL = 9
I8, U8, I16, U16, I32, U32, I64, U64 = 14, 15, 16, 17, 18, 19, 20, 21
F32, F64 = 24, 25
IPPORT16, IPADDR32 = 26, 27
ENCRYPTED = 32
I8ARRAY, U8ARRAY, I16ARRAY, U16ARRAY, I32ARRAY, U32ARRAY, I64ARRAY, U64ARRAY = range(34, 42)
F32ARRAY, F64ARRAY = 44, 45
XML = 47
STRINGARRAY = 48
MSGARRAY = 49

TYPE_NAMES: dict[int, str] = {t.value: t.name.lower() for t in RvType}
"""Lower-case Rendezvous names (``i16``, ``stringarray``) used by the text and JSON forms."""
TYPES_BY_NAME: dict[str, int] = {n: t for t, n in TYPE_NAMES.items()}

INT_RANGES: dict[int, tuple[int, int]] = {
    I8: (-(1 << 7), (1 << 7) - 1), U8: (0, (1 << 8) - 1),
    I16: (-(1 << 15), (1 << 15) - 1), U16: (0, (1 << 16) - 1),
    I32: (-(1 << 31), (1 << 31) - 1), U32: (0, (1 << 32) - 1),
    I64: (-(1 << 63), (1 << 63) - 1), U64: (0, (1 << 64) - 1),
    IPPORT16: (0, (1 << 16) - 1),
}
"""Each integer type's inclusive range (from the bit widths of Concepts, Data, Table 16)."""


def _typecode(signed: bool, size: int) -> str:
    for c in ("bhilq" if signed else "BHILQ"):
        if array(c).itemsize == size:
            return c
    raise RuntimeError(f"no array typecode of {size} bytes")  # pragma: no cover


ARRAY_TYPECODES: dict[int, str] = {
    I8ARRAY: "b", U8ARRAY: "B",
    I16ARRAY: _typecode(True, 2), U16ARRAY: _typecode(False, 2),
    I32ARRAY: _typecode(True, 4), U32ARRAY: _typecode(False, 4),
    I64ARRAY: _typecode(True, 8), U64ARRAY: _typecode(False, 8),
    F32ARRAY: "f", F64ARRAY: "d",
}
"""The ``array.array`` typecode each numeric array type is held in."""
ARRAY_ELEMENTS: dict[int, int] = {
    I8ARRAY: I8, U8ARRAY: U8, I16ARRAY: I16, U16ARRAY: U16, I32ARRAY: I32, U32ARRAY: U32,
    I64ARRAY: I64, U64ARRAY: U64, F32ARRAY: F32, F64ARRAY: F64,
}
"""Each numeric array type's element type."""
_ARRAY_BY_TYPECODE: dict[str, int] = {}
for _t, _c in ARRAY_TYPECODES.items():
    _ARRAY_BY_TYPECODE[_c] = _t
for _c in "bBhHiIlLqQ":
    _a = array(_c)
    _ARRAY_BY_TYPECODE.setdefault(_c, {(True, 1): I8ARRAY, (False, 1): U8ARRAY,
                                       (True, 2): I16ARRAY, (False, 2): U16ARRAY,
                                       (True, 4): I32ARRAY, (False, 4): U32ARRAY,
                                       (True, 8): I64ARRAY, (False, 8): U64ARRAY}
                                  [(_c.islower(), _a.itemsize)])

_INT_TYPECODES = frozenset("bBhHiIlLqQ")
ARRAY_WIDTHS: dict[int, int] = {t: array(c).itemsize for t, c in ARRAY_TYPECODES.items()}
"""Each numeric array type's element width in bytes."""

MAX_FIELD_NAME = 127
"""Most UTF-8 bytes in a field name (``TIBRVMSG_FIELDNAME_MAX``)."""
MAX_FIELD_ID = 0xFFFF  # a field id is a 16-bit unsigned integer; 0 means "no id"

DATETIME_MIN = -(1 << 39)
DATETIME_MAX = (1 << 39) - 1
"""DATETIME seconds are 40 signed bits (Concepts, Data, "DateTime Format")."""

_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")
_UTC = UTC
_EPOCH = datetime(1970, 1, 1, tzinfo=_UTC)


class FieldError(ValueError):
    """A field breaks a rule of the message model; the message says which."""


class RvDateTime(NamedTuple):
    """A DATETIME: seconds since 1970-01-01T00:00:00Z (40 bits, signed) and microseconds.

    Its range (about ±17,432 years) is wider than ``datetime``'s, so this is the stored form;
    :meth:`to_datetime` converts when the year is 1..9999.
    """

    seconds: int
    microseconds: int = 0

    @classmethod
    def from_datetime(cls, dt: datetime) -> RvDateTime:
        """The DATETIME of ``dt``; a naive ``datetime`` is taken as UTC."""
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=_UTC)
        d = dt - _EPOCH
        return cls(d.days * 86400 + d.seconds, d.microseconds)

    def to_datetime(self) -> datetime:
        """An aware UTC ``datetime``; ``OverflowError`` outside years 1..9999."""
        return _EPOCH + timedelta(seconds=self.seconds, microseconds=self.microseconds)

    def isoformat(self) -> str:
        """``YYYY-MM-DDTHH:MM:SS.ffffffZ`` when ``datetime`` can hold it, else ``@S.ffffff``: the
        signed decimal number of seconds since the epoch (``@-1.5`` is 1.5 s before it)."""
        try:
            return self.to_datetime().isoformat(timespec="microseconds")[:-6] + "Z"
        except OverflowError:
            total = self.seconds * 1_000_000 + self.microseconds
            sign = "-" if total < 0 else ""
            total = abs(total)
            return f"@{sign}{total // 1_000_000}.{total % 1_000_000:06d}"


class CmLabel(NamedTuple):
    """The certified-delivery label of the envelope (Concepts, Certified Message Delivery).

    ``sender`` is the correspondent name, ``sequence`` the per-subject sequence number (U64),
    ``time_limit`` seconds after which the sender no longer certifies the message (0 = none).
    """

    sender: str
    sequence: int
    time_limit: float = 0.0


class Origin(NamedTuple):
    """The gateway-origin marker of the envelope: who injected the message and after how many
    bridge hops, so a gateway never re-exports what it imported (loop prevention)."""

    origin_id: str
    hops: int = 0


class Route(NamedTuple):
    """The routing marker of the envelope (:mod:`transports.rv.router`): the network name of
    the bus where a router first picked the message up, and how many routers forwarded it
    since (the hop limit's count)."""

    network: str
    hops: int = 0


class Field:
    """One field: ``name`` (``None`` for none), ``fid`` (0 for none), ``type`` code, ``value``.

    Change fields through :meth:`Message.update`; a value set directly is not checked.
    """

    __slots__ = ("name", "fid", "type", "value", "name_bytes")

    def __init__(self, name: str | None, fid: int, type: int, value: Any,
                 name_bytes: bytes = b"") -> None:
        self.name = name
        self.fid = fid
        self.type = type
        self.value = value
        self.name_bytes = name_bytes if name_bytes or name is None else name.encode()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Field):
            return NotImplemented
        return (self.name == other.name and self.fid == other.fid and self.type == other.type
                and same_value(self.type, self.value, other.value))

    def __hash__(self) -> int:
        raise TypeError("a Field is mutable and not hashable")

    def __repr__(self) -> str:
        tname = TYPE_NAMES.get(self.type, str(self.type))
        fid = f", fid={self.fid}" if self.fid else ""
        return f"Field({self.name!r}{fid}, {tname}, {self.value!r})"


def same_value(t: int, a: Any, b: Any) -> bool:
    """Exact equality of two values of type ``t`` (floats by bits, arrays element-exact)."""
    if t == F64 or t == F32:
        return isinstance(a, float) and isinstance(b, float) and _F64.pack(a) == _F64.pack(b)
    if t == F32ARRAY or t == F64ARRAY:
        return (isinstance(a, array) and isinstance(b, array) and a.typecode == b.typecode
                and a.tobytes() == b.tobytes())
    return bool(type(a) is type(b) and a == b)


def infer_type(value: object) -> int:
    """The type :meth:`Message.add` gives ``value`` when none is named (module docstring).

    Raises:
        FieldError: no type follows from the value.
    """
    if isinstance(value, bool):
        return BOOL
    if isinstance(value, int):
        return I64
    if isinstance(value, float):
        return F64
    if isinstance(value, str):
        return STRING
    if isinstance(value, (bytes, bytearray, memoryview)):
        return OPAQUE
    if isinstance(value, Message):
        return MSG
    if isinstance(value, (datetime, RvDateTime)):
        return DATETIME
    if isinstance(value, IPv4Address):
        return IPADDR32
    if isinstance(value, array):
        t = _ARRAY_BY_TYPECODE.get(value.typecode)
        if t is None:
            raise FieldError(f"no Rendezvous array type for array typecode {value.typecode!r}")
        return t
    if isinstance(value, (list, tuple)) and value:
        if all(isinstance(v, str) for v in value):
            return STRINGARRAY
        if all(isinstance(v, Message) for v in value):
            return MSGARRAY
    raise FieldError(f"cannot infer a field type from {type(value).__name__} {value!r:.40}; "
                     "name one with type=")


def _int(t: int, v: object) -> int:
    if isinstance(v, bool):
        raise FieldError(f"{TYPE_NAMES[t]} takes an int, not a bool")
    try:
        i = index(v)  # type: ignore[arg-type]
    except TypeError:
        raise FieldError(f"{TYPE_NAMES[t]} takes an int, not {type(v).__name__}") from None
    lo, hi = INT_RANGES[t]
    if not lo <= i <= hi:
        raise FieldError(f"{i} is outside {TYPE_NAMES[t]}'s range {lo}..{hi}")
    return i


def _string(v: object) -> str | bytes:
    if isinstance(v, str):
        if "\0" in v:
            raise FieldError("a STRING cannot contain NUL (it is NUL-terminated)")
        return v
    if isinstance(v, (bytes, bytearray, memoryview)):
        b = bytes(v)
        if b"\0" in b:
            raise FieldError("a STRING cannot contain NUL (it is NUL-terminated)")
        return b
    raise FieldError(f"a string takes str (or encoded bytes), not {type(v).__name__}")


def coerce(t: int, value: object) -> Any:
    """``value`` converted to what a field of type ``t`` holds, with its range checked.

    Raises:
        FieldError: the value does not fit the type.
    """
    if t in INT_RANGES:
        return _int(t, value)
    if t == STRING:
        return _string(value)
    if t == F64 or t == F32:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise FieldError(f"{TYPE_NAMES[t]} takes a float, not {type(value).__name__}")
        f = float(value)
        if t == F32:
            try:
                f = _F32.unpack(_F32.pack(f))[0]
            except OverflowError:
                raise FieldError(f"{f} is outside f32's range") from None
        return f
    if t == BOOL:
        if not isinstance(value, bool):
            raise FieldError(f"bool takes a bool, not {type(value).__name__}")
        return value
    if t == MSG:
        if not isinstance(value, Message):
            raise FieldError(f"msg takes a Message, not {type(value).__name__}")
        return value
    if t == DATETIME:
        if isinstance(value, datetime):
            value = RvDateTime.from_datetime(value)
        if not isinstance(value, RvDateTime):
            raise FieldError(f"datetime takes a datetime or RvDateTime, not "
                             f"{type(value).__name__}")
        s, us = value
        if not DATETIME_MIN <= s <= DATETIME_MAX:
            raise FieldError(f"DATETIME seconds {s} outside the 40-bit range")
        if not 0 <= us <= 999_999:
            raise FieldError(f"DATETIME microseconds {us} outside 0..999999")
        return RvDateTime(s, us)
    if t == IPADDR32:
        if isinstance(value, IPv4Address):
            return value
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            try:
                return IPv4Address(value)
            except ValueError as e:
                raise FieldError(f"ipaddr32: {e}") from None
        raise FieldError(f"ipaddr32 takes an IPv4Address, not {type(value).__name__}")
    if t in ARRAY_TYPECODES:
        tc = ARRAY_TYPECODES[t]
        if isinstance(value, array) and value.typecode == tc:
            return value
        if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
            raise FieldError(f"{TYPE_NAMES[t]} takes an array or a sequence of numbers")
        elem = ARRAY_ELEMENTS[t]
        if elem not in INT_RANGES:  # floats one by one: array('f') would turn 1e39 into inf
            return array(tc, [coerce(elem, v) for v in value])
        if (isinstance(value, array) and value.typecode in _INT_TYPECODES
                and value.itemsize == ARRAY_WIDTHS[t] and value.typecode.islower() == tc.islower()):
            a = array(tc)  # the same integers under another typecode ('q' and 'l')
            a.frombytes(value.tobytes())
            return a
        try:
            return array(tc, value)  # the array checks each element's range and type
        except (OverflowError, TypeError) as e:
            raise FieldError(f"{TYPE_NAMES[t]}: {e}") from None
    if t == STRINGARRAY:
        if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
            raise FieldError("stringarray takes a list of str")
        return [_string(v) for v in value]
    if t == MSGARRAY:
        if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
            raise FieldError("msgarray takes a list of Message")
        out = list(value)
        for m in out:
            if not isinstance(m, Message):
                raise FieldError(f"msgarray takes Messages, not {type(m).__name__}")
        return out
    if t == XML and isinstance(value, str):
        return value.encode()
    if not 0 <= t <= 255:
        raise FieldError(f"a type code is 0..255, not {t}")
    # OPAQUE, XML, ENCRYPTED and codes this module does not know: bytes, carried unchanged.
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise FieldError(f"{TYPE_NAMES.get(t, t)} takes bytes, not {type(value).__name__}")
    return bytes(value)


def _check_name(name: str | None, fid: int, internal: bool) -> tuple[str | None, bytes]:
    if not name:
        if fid:
            raise FieldError(f"field id {fid} needs a name (a non-zero id with no name is "
                             "illegal: Concepts, Data, Field Names and Field Identifiers)")
        return None, b""
    if not isinstance(name, str):
        raise FieldError(f"a field name is a str, not {type(name).__name__}")
    if name[0] == "_" and not internal:
        raise FieldError(f"field name {name!r}: names starting with '_' are reserved "
                         "(Concepts, Data, Message Structure)")
    try:
        nb = name.encode()
    except UnicodeEncodeError:
        raise FieldError(f"field name {name!r} is not encodable in UTF-8") from None
    if len(nb) > MAX_FIELD_NAME:
        raise FieldError(f"field name of {len(nb)} bytes; at most {MAX_FIELD_NAME}")
    if b"\0" in nb:
        raise FieldError("a field name cannot contain NUL")
    return name, nb


class Message:
    """An ordered collection of typed fields, with its envelope (module docstring).

    Args:
        send_subject: where it is sent (checked when sent, not here).
        reply_subject: where replies go, usually an inbox.
    """

    __slots__ = ("fields", "send_subject", "reply_subject", "encoding", "cm", "origin", "route")

    def __init__(self, send_subject: str | None = None,
                 reply_subject: str | None = None) -> None:
        self.fields: list[Field] = []
        """The fields in order. Read freely; change through the methods."""
        self.send_subject = send_subject
        self.reply_subject = reply_subject
        self.encoding: str | None = None
        """Codec name of STRING data when not UTF-8 (the envelope's encoding tag)."""
        self.cm: CmLabel | None = None
        self.origin: Origin | None = None
        self.route: Route | None = None

    # -- building ------------------------------------------------------------------------

    def add(self, name: str | None, value: object, type: int | None = None, fid: int = 0,
            *, internal: bool = False) -> Message:
        """Append a field and return the message (so adds chain).

        ``type`` is an :class:`RvType` (or its number); without it the type is inferred
        (:func:`infer_type`). Rules (TIBCO Rendezvous Concepts, Data, "Field Names and Field
        Identifiers"): ``fid`` 1..65535 is unique in this message (not in its submessages) and
        needs a name; ``_`` names are reserved unless ``internal``.

        Raises:
            FieldError: a rule is broken or the value does not fit the type.
        """
        t = infer_type(value) if type is None else int(type)
        name, nb = _check_name(name, fid, internal)
        if fid:
            if isinstance(fid, bool) or not isinstance(fid, int) or not 0 < fid <= MAX_FIELD_ID:
                raise FieldError(f"a field id is 1..65535 (0 for none), not {fid!r}")
            for f in self.fields:
                if f.fid == fid:
                    raise FieldError(f"field id {fid} is already used in this message "
                                     "(ids are unique per level)")
        v = coerce(t, value)
        if v is self:
            raise FieldError("a message cannot contain itself")
        self.fields.append(Field(name, fid, t, v, nb))
        return self

    def update(self, name: str | None, value: object, type: int | None = None, fid: int = 0,
               *, internal: bool = False) -> Message:
        """Change the value of the field ``fid`` (when given) or the first field ``name``; add
        the field when there is none. The type stays: naming a different one is an error, as
        in Rendezvous' update calls.

        Raises:
            FieldError: the type differs, the id belongs to another name, or the value does not
            fit.
        """
        f = self.get_field(fid if fid else name)
        if f is None or (fid and not name):
            return self.add(name, value, type, fid, internal=internal)
        if fid and f.name != name:
            raise FieldError(f"field id {fid} belongs to {f.name!r}, not {name!r}")
        if type is not None and int(type) != f.type:
            raise FieldError(f"field {f.name!r} is {TYPE_NAMES.get(f.type, f.type)}; "
                             f"update cannot make it {TYPE_NAMES.get(int(type), type)}")
        v = coerce(f.type, value)
        if v is self:
            raise FieldError("a message cannot contain itself")
        f.value = v
        return self

    def remove(self, key: str | int) -> bool:
        """Remove the first field named ``key`` (a str) or with id ``key`` (an int).

        Returns False when there is none.
        """
        fields = self.fields
        if isinstance(key, int) and not key:
            return False  # 0 is "no id", not an id
        for i, f in enumerate(fields):
            if (f.fid == key) if isinstance(key, int) else (f.name == key):
                del fields[i]
                return True
        return False

    def remove_all(self, name: str) -> int:
        """Remove every field named ``name``; returns how many."""
        before = len(self.fields)
        self.fields = [f for f in self.fields if f.name != name]
        return before - len(self.fields)

    def clear(self) -> None:
        """Remove every field (the envelope stays)."""
        self.fields = []

    # -- reading ------------------------------------------------------------------------

    def get_field(self, key: str | int | None) -> Field | None:
        """The first field named ``key`` (a str) or with id ``key`` (a non-zero int)."""
        if isinstance(key, int):
            if key:
                for f in self.fields:
                    if f.fid == key:
                        return f
            return None
        for f in self.fields:
            if f.name == key:
                return f
        return None

    def get(self, key: str | int, default: Any = None) -> Any:
        """The value of :meth:`get_field` ``(key)``, or ``default``."""
        f = self.get_field(key)
        return default if f is None else f.value

    def get_all(self, name: str) -> list[Any]:
        """The values of every field named ``name``, in order."""
        return [f.value for f in self.fields if f.name == name]

    def __getitem__(self, key: str | int) -> Any:
        f = self.get_field(key)
        if f is None:
            raise KeyError(key)
        return f.value

    def __contains__(self, key: object) -> bool:
        return isinstance(key, (str, int)) and self.get_field(key) is not None

    def __iter__(self) -> Iterator[Field]:
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    def names(self) -> list[str | None]:
        """Every field's name in order (``None`` for nameless fields)."""
        return [f.name for f in self.fields]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return (self.fields == other.fields and self.send_subject == other.send_subject
                and self.reply_subject == other.reply_subject
                and self.encoding == other.encoding and self.cm == other.cm
                and self.origin == other.origin and self.route == other.route)

    def __hash__(self) -> int:
        raise TypeError("a Message is mutable and not hashable")

    def copy(self) -> Message:
        """A deep copy: nested messages, arrays and lists are copied too."""
        m = Message(self.send_subject, self.reply_subject)
        m.encoding = self.encoding
        m.cm = self.cm
        m.origin = self.origin
        m.route = self.route
        m.fields = [Field(f.name, f.fid, f.type, _copy_value(f.type, f.value), f.name_bytes)
                    for f in self.fields]
        return m

    # -- text and JSON forms (msgtext.py) ----------------------------------------------

    def to_text(self, types: bool = False) -> str:
        """The tibrvlisten-like form ``{name="x" n=5 sub={a=1}}``; ``types`` adds ``:i16``."""
        from transports.rv.msgtext import to_text

        return to_text(self, types)

    def to_json(self, **dumps_args: Any) -> str:
        """The JSON form, with every type explicit (``msgtext`` module docstring)."""
        from transports.rv.msgtext import to_json

        return to_json(self, **dumps_args)

    @classmethod
    def from_json(cls, text: str | bytes | dict[str, Any]) -> Message:
        """The message of a JSON form made by :meth:`to_json`.

        Raises:
            FieldError: the JSON is not a message form.
        """
        from transports.rv.msgtext import from_json

        return from_json(text)

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        env = f"{self.send_subject!r}, " if self.send_subject is not None else ""
        return f"Message({env}{self.to_text(True)})"


def _copy_value(t: int, v: Any) -> Any:
    if t == MSG:
        return v.copy()
    if t == MSGARRAY:
        return [m.copy() for m in v]
    if isinstance(v, (array, list)):
        return v[:]
    return v
