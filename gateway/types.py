"""Typed values: the scalars, arrays and containers a message may carry.

How this works. JMS property and map values have Java types (byte, short, int, long, float,
double, char, boolean, String, byte[]); EMS adds nested maps and streams and typed arrays,
and the RV-style bus adds unsigned widths. A value must keep its width and signedness through
every hop (an RV ``U16`` imported here leaves as ``U16``), yet still compare and compute as a
number in selectors. So each width is a tiny subclass of ``int`` or ``float`` with no per-
instance state (``__slots__ = ()``): arithmetic yields plain numbers, equality and hashing are
those of the number, and ``type(v)`` tells the width.

Plain Python values are accepted everywhere and read with a fixed meaning:

==================  =====================  =========================
Python value        gateway type name      JMS type
==================  =====================  =========================
``bool``            ``boolean``            boolean
``Int8``            ``byte`` (int8)        byte
``Int16``           ``short`` (int16)      short
``Int32``           ``int`` (int32)        int
``int``, ``Int64``  ``long`` (int64)       long
``UInt8..UInt64``   ``uint8..uint64``      (EMS/RV extension)
``Float32``         ``float`` (float32)    float
``float``           ``double`` (float64)   double
``Char``            ``char``               char
``str``             ``string``             String
``bytes``           ``bytes``              byte[]
``dict``            ``map``                nested MapMessage (EMS)
``list``            ``stream``             nested StreamMessage (EMS)
``Int16Array`` ...  ``int16[]`` ...        short[] ... (EMS arrays)
==================  =====================  =========================

:func:`convert` implements the JMS conversion table (TIBCO EMS User's Guide,
"Data Type Conversion").
"""

from __future__ import annotations

import math
import struct
from typing import Any, ClassVar

from gateway.errors import MessageFormatError


class _Width(int):
    """An integer of a fixed width; out-of-range construction raises ``OverflowError``."""

    __slots__ = ()
    MIN: ClassVar[int]
    MAX: ClassVar[int]
    NAME: ClassVar[str]

    def __new__(cls, value: Any = 0) -> _Width:
        if isinstance(value, float):
            if not value.is_integer():
                raise ValueError(f"{value!r} is not an integral value for {cls.NAME}")
        v = int(value)
        if v < cls.MIN or v > cls.MAX:
            raise OverflowError(f"{v} out of range for {cls.NAME} [{cls.MIN}, {cls.MAX}]")
        return super().__new__(cls, v)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({int(self)})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (int(self),))


class Int8(_Width):
    __slots__ = ()
    MIN, MAX, NAME = -(2**7), 2**7 - 1, "int8"


class Int16(_Width):
    __slots__ = ()
    MIN, MAX, NAME = -(2**15), 2**15 - 1, "int16"


class Int32(_Width):
    __slots__ = ()
    MIN, MAX, NAME = -(2**31), 2**31 - 1, "int32"


class Int64(_Width):
    __slots__ = ()
    MIN, MAX, NAME = -(2**63), 2**63 - 1, "int64"


class UInt8(_Width):
    __slots__ = ()
    MIN, MAX, NAME = 0, 2**8 - 1, "uint8"


class UInt16(_Width):
    __slots__ = ()
    MIN, MAX, NAME = 0, 2**16 - 1, "uint16"


class UInt32(_Width):
    __slots__ = ()
    MIN, MAX, NAME = 0, 2**32 - 1, "uint32"


class UInt64(_Width):
    __slots__ = ()
    MIN, MAX, NAME = 0, 2**64 - 1, "uint64"


_F32 = struct.Struct("<f")


class Float32(float):
    """A single-precision float: the value is rounded to float32 on construction."""

    __slots__ = ()
    NAME: ClassVar[str] = "float32"

    def __new__(cls, value: Any = 0.0) -> Float32:
        v = float(value)
        if math.isfinite(v):
            try:
                v = _F32.unpack(_F32.pack(v))[0]
            except OverflowError:
                raise OverflowError(f"{value!r} out of range for float32") from None
        return super().__new__(cls, v)

    def __repr__(self) -> str:
        return f"Float32({float(self)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Float32, (float(self),))


class Char(str):
    """A JMS ``char``: exactly one UTF-16 code unit (one BMP character)."""

    __slots__ = ()
    NAME: ClassVar[str] = "char"

    def __new__(cls, value: str) -> Char:
        if len(value) != 1 or ord(value) > 0xFFFF:
            raise ValueError(f"{value!r} is not a single char")
        return super().__new__(cls, value)

    def __repr__(self) -> str:
        return f"Char({str(self)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Char, (str(self),))


class TypedArray(tuple):  # type: ignore[type-arg]
    """An EMS typed array (``short[]``, ``int[]``, ...): a tuple whose elements share one width."""

    __slots__ = ()
    ELEMENT: ClassVar[type]
    NAME: ClassVar[str]

    def __new__(cls, values: Any = ()) -> TypedArray:
        el = cls.ELEMENT
        return super().__new__(cls, (v if type(v) is el else el(v) for v in values))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (tuple(self),))


def _array(el: type, name: str) -> type[TypedArray]:
    return type(el.__name__ + "Array", (TypedArray,), {"__slots__": (), "ELEMENT": el, "NAME": name})


Int8Array = _array(Int8, "int8[]")
Int16Array = _array(Int16, "int16[]")
Int32Array = _array(Int32, "int32[]")
Int64Array = _array(Int64, "int64[]")
UInt8Array = _array(UInt8, "uint8[]")
UInt16Array = _array(UInt16, "uint16[]")
UInt32Array = _array(UInt32, "uint32[]")
UInt64Array = _array(UInt64, "uint64[]")
Float32Array = _array(Float32, "float32[]")
Float64Array = _array(float, "float64[]")
BoolArray = _array(bool, "boolean[]")

ARRAY_TYPES: tuple[type[TypedArray], ...] = (
    Int8Array, Int16Array, Int32Array, Int64Array, UInt8Array, UInt16Array, UInt32Array,
    UInt64Array, Float32Array, Float64Array, BoolArray,
)  # fmt: skip

# Type names, as written in mappings, the store codec and the delivery log.
SCALAR_TYPES: dict[str, type] = {
    "boolean": bool,
    "int8": Int8,
    "int16": Int16,
    "int32": Int32,
    "int64": Int64,
    "uint8": UInt8,
    "uint16": UInt16,
    "uint32": UInt32,
    "uint64": UInt64,
    "float32": Float32,
    "float64": float,
    "char": Char,
    "string": str,
    "bytes": bytes,
}
ARRAY_BY_NAME: dict[str, type[TypedArray]] = {a.NAME: a for a in ARRAY_TYPES}

# JMS names for the same types (JMS conversion table rows and columns).
JMS_NAMES: dict[str, str] = {
    "boolean": "boolean",
    "byte": "int8",
    "short": "int16",
    "int": "int32",
    "long": "int64",
    "float": "float32",
    "double": "float64",
    "char": "char",
    "String": "string",
    "string": "string",
    "byte[]": "bytes",
}


def type_name(value: Any) -> str:
    """The gateway type name of a value (``int64`` for a plain ``int``)."""
    t = type(value)
    if t is bool:
        return "boolean"
    if t is int:
        return "int64"
    if t is float:
        return "float64"
    if t is str:
        return "string"
    if t is bytes:
        return "bytes"
    if t is dict:
        return "map"
    if t is list:
        return "stream"
    name = getattr(t, "NAME", None)
    if name is not None:
        return str(name)
    raise MessageFormatError(f"unsupported value type {t.__name__}")


def check_value(value: Any, *, nested: bool = True, depth: int = 0) -> None:
    """Raise :class:`MessageFormatError` if ``value`` is not a legal message value.

    Property values may not be ``bytes``, maps, streams or arrays (EMS User's Guide,
    "Data Type Conversion"); map and stream bodies may hold all of them, nested to any depth
    (EMS extension, EMS User's Guide, "EMS Extensions to JMS Messages").
    """
    if value is None:
        return
    t = type(value)
    if t in (bool, str, float, Float32, Char) or isinstance(value, _Width):
        return
    if t is int:
        if not (Int64.MIN <= value <= Int64.MAX):
            raise MessageFormatError(f"integer {value} does not fit a long; give it a width type")
        return
    if not nested:
        raise MessageFormatError(f"a property value cannot be {type_name(value)}")
    if t is bytes or isinstance(value, TypedArray):
        return
    if depth > MAX_NESTING:
        raise MessageFormatError(f"values nest deeper than {MAX_NESTING} levels")
    if t is dict:
        for k, v in value.items():
            if type(k) is not str:
                raise MessageFormatError(f"map field names must be strings, not {type(k).__name__}")
            check_value(v, depth=depth + 1)
        return
    if t is list:
        for v in value:
            check_value(v, depth=depth + 1)
        return
    raise MessageFormatError(f"unsupported value type {t.__name__}")


# Deep enough for any real message; bounded so a hostile body cannot exhaust the stack.
MAX_NESTING = 64

_INTS = (Int8, Int16, Int32, Int64)
_RANK = {"int8": 0, "int16": 1, "int32": 2, "int64": 3}


def convert(value: Any, target: str) -> Any:
    """Read ``value`` as the JMS type ``target`` following the JMS conversion table.

    ``target`` is a JMS name (``byte``, ``short``, ``int``, ``long``, ``float``, ``double``,
    ``boolean``, ``char``, ``String``, ``byte[]``) or a gateway type name. A ``None`` read as a
    number raises (JMS ``NumberFormatException``); read as ``boolean`` gives ``False`` and as
    ``String`` gives ``None``, as ``Boolean.valueOf(null)`` and JMS do.

    Raises:
        MessageFormatError: the conversion is not in the table, or a string does not parse.
    """
    tgt = JMS_NAMES.get(target, target)
    src = type_name(value) if value is not None else "null"
    if tgt == "string":
        if value is None or src == "string":
            return value
        if src in ("bytes", "map", "stream") or src.endswith("[]"):
            raise MessageFormatError(f"cannot read {src} as String")
        if src == "boolean":
            return "true" if value else "false"
        return str(value) if src == "char" else _number_text(value)
    if value is None:
        if tgt == "boolean":
            return False
        raise MessageFormatError(f"cannot read null as {target}")
    if src == "string":
        return _parse_string(value, tgt, target)
    if tgt == "boolean":
        if src == "boolean":
            return value
    elif tgt in _RANK:
        if src in _RANK and _RANK[src] <= _RANK[tgt]:
            return SCALAR_TYPES[tgt](value)
    elif tgt == "float32":
        if src == "float32":
            return value
    elif tgt == "float64":
        if src in ("float32", "float64"):
            return float(value)
    elif tgt == "char":
        if src == "char":
            return value
    elif tgt == "bytes":
        if src == "bytes":
            return value
    raise MessageFormatError(f"cannot read {src} as {target}")


def _number_text(value: Any) -> str:
    if type(value) is Float32:
        # Shortest text that reads back as the same float32, as Java's Float.toString does.
        for digits in range(1, 10):
            text = f"{float(value):.{digits}g}"
            try:
                same = Float32(float(text)) == value
            except OverflowError:  # rounded past the float32 maximum: more digits
                continue
            if same:
                return text if ("." in text or "e" in text or "n" in text) else text + ".0"
    if isinstance(value, float):
        return repr(float(value))
    return str(int(value))


def _parse_string(text: str, tgt: str, target: str) -> Any:
    try:
        if tgt == "boolean":
            return text.strip().lower() == "true"  # Boolean.valueOf semantics
        if tgt in _RANK:
            return SCALAR_TYPES[tgt](int(text.strip(), 10))
        if tgt in ("float32", "float64"):
            return SCALAR_TYPES[tgt](float(text.strip()))
    except (ValueError, OverflowError) as exc:
        raise MessageFormatError(f"cannot read string {text!r} as {target}: {exc}") from None
    raise MessageFormatError(f"cannot read String as {target}")


def is_number(value: Any) -> bool:
    """True for int and float values of every width, False for bool."""
    t = type(value)
    return t is not bool and (isinstance(value, int) or isinstance(value, float))


