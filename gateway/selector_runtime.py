"""What a compiled selector calls at run time: JMS's value semantics in plain functions.

:mod:`gateway.selector` generates each selector's ``_match`` function with the names of
:data:`RUNTIME` in its namespace. These helpers give SQL's three-valued logic (``None`` is
UNKNOWN) and Java's numeric rules (TIBCO EMS User's Guide, "Message Selectors"; the choices are
listed in :mod:`gateway.selector`'s docstring): integers of every width compute as a Java ``long``
(:func:`wrap`), a ``Float32`` as a Java ``float``, anything with a ``float`` as a
``double``; mixed comparisons promote the integer side first; incomparable values compare
FALSE; NULL, a non-number or a division by zero in arithmetic give NULL, never an exception.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

from gateway.types import Float32, Int8, Int16, Int32, Int64, UInt8, UInt16, UInt32, UInt64

LONG_MIN = -(1 << 63)
LONG_MAX = (1 << 63) - 1
ULONG_SPAN = 1 << 64

INTS = frozenset({int, Int8, Int16, Int32, Int64, UInt8, UInt16, UInt32, UInt64})
FLOATS = frozenset({float, Float32})
NUMS = INTS | FLOATS
# An integer literal this small converts exactly to float and double, so ``t OP lit`` in
# Python gives Java's answer for a value ``t`` of any numeric type.
EXACT_IN_FLOAT = 1 << 24


def _is_num(v: Any) -> bool:
    c = v.__class__
    return c in NUMS or (c is not bool and isinstance(v, (int, float)))


def wrap(v: int) -> int:
    """Java ``long`` overflow: two's complement wrap-around."""
    if LONG_MIN <= v <= LONG_MAX:
        return v
    return (v - LONG_MIN) % ULONG_SPAN + LONG_MIN


def _double(i: int) -> float:
    """Java long-to-double (round to nearest); beyond double's range is infinity."""
    try:
        return float(i)
    except OverflowError:
        return math.inf if i > 0 else -math.inf


def _to_float32(x: float) -> Float32:
    try:
        return Float32(x)
    except OverflowError:
        return Float32(math.copysign(math.inf, x))


def _float32_of_int(i: int) -> Float32:
    """Java long-to-float: one rounding to 24 significant bits, ties to even."""
    m = abs(i)
    n = m.bit_length()
    if n > 129:
        return Float32(math.inf if i > 0 else -math.inf)
    if n > 24:
        shift = n - 24
        q, r = m >> shift, m & ((1 << shift) - 1)
        half = 1 << (shift - 1)
        if r > half or (r == half and q & 1):
            q += 1
        m = q << shift
    return _to_float32(float(-m if i < 0 else m))


def _promote(a: Any, b: Any) -> tuple[Any, Any]:
    """Java binary numeric promotion of two numbers, for comparison."""
    ai = isinstance(a, int)
    if ai is isinstance(b, int):
        return a, b
    if ai:
        return (_float32_of_int(a) if isinstance(b, Float32) else _double(a)), b
    return a, (_float32_of_int(b) if isinstance(a, Float32) else _double(b))


_KINDS = {str: 1, bool: 3, **{c: 2 for c in NUMS}}


def _kind(v: Any) -> int:
    """1 string, 2 number, 3 boolean, 0 anything else (comparable with nothing)."""
    k = _KINDS.get(v.__class__)
    if k is not None:
        return k
    return 1 if isinstance(v, str) else 2 if isinstance(v, (int, float)) else 0


def _equality(test: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool | None]:
    def compare(a: Any, b: Any) -> bool | None:
        if a is None or b is None:
            return None  # NULL makes a comparison UNKNOWN (EMS User's Guide, "Message Selectors")
        k = _kind(a)
        if k == 0 or k != _kind(b):
            # incomparable types, = and <> alike (EMS User's Guide, "Message Selectors")
            return False
        if k == 2:
            a, b = _promote(a, b)
        return test(a, b)

    return compare


def _ordering(test: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool | None]:
    def compare(a: Any, b: Any) -> bool | None:
        if a is None or b is None:
            return None
        if _is_num(a) and _is_num(b):
            a, b = _promote(a, b)
            return test(a, b)
        return False  # strings, booleans and other types cannot be ordered

    return compare


_eq = _equality(lambda a, b: bool(a == b))
_ne = _equality(lambda a, b: bool(a != b))
_lt = _ordering(lambda a, b: bool(a < b))
_le = _ordering(lambda a, b: bool(a <= b))
_gt = _ordering(lambda a, b: bool(a > b))
_ge = _ordering(lambda a, b: bool(a >= b))


def _between(x: Any, low: Any, high: Any) -> bool | None:
    """``x BETWEEN low AND high`` is ``x >= low AND x <= high`` (EMS User's Guide,
    "Message Selectors")."""
    a = _ge(x, low)
    if a is False:
        return False
    b = _le(x, high)
    if b is False:
        return False
    return a and b


def _not_between(x: Any, low: Any, high: Any) -> bool | None:
    """``x NOT BETWEEN low AND high`` is ``x < low OR x > high`` (EMS User's Guide,
    "Message Selectors")."""
    a = _lt(x, low)
    if a is True:
        return True
    b = _gt(x, high)
    if b is True:
        return True
    return None if a is None or b is None else False


_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


def _arith(op: str, a: Any, b: Any) -> Any:
    """``a op b`` with Java promotion; NULL for NULL, non-numbers and division by zero."""
    if a is None or b is None or not _is_num(a) or not _is_num(b) or (op == "/" and not b):
        return None
    ai, bi = isinstance(a, int), isinstance(b, int)
    if ai and bi:
        if op != "/":
            return wrap(_OPS[op](a, b))
        q = abs(a) // abs(b)  # Java truncates toward zero
        return wrap(-q if (a < 0) != (b < 0) else q)
    single = (ai or isinstance(a, Float32)) and (bi or isinstance(b, Float32))
    convert = _float32_of_int if single else _double
    r = _OPS[op](float(convert(a) if ai else a), float(convert(b) if bi else b))
    return _to_float32(r) if single else r


def _chain(ops: str, first: Any, *rest: Any) -> Any:
    """A left-associative run ``a + b - c ...`` evaluated left to right."""
    value = first
    for op, operand in zip(ops, rest, strict=True):
        value = _arith(op, value, operand)
    return value


def negate(a: Any) -> Any:
    """Unary minus; also folds the sign into a literal at compile time."""
    if a is None or not _is_num(a):
        return None
    if isinstance(a, int):
        return wrap(-a)
    return Float32(-a) if isinstance(a, Float32) else -a


def _pos(a: Any) -> Any:
    return a if a is not None and _is_num(a) else None


RUNTIME: dict[str, Any] = {
    "_NUMS": NUMS, "_INTS": INTS, "_FLOATS": FLOATS,
    "_eq": _eq, "_ne": _ne, "_lt": _lt, "_le": _le, "_gt": _gt, "_ge": _ge,
    "_between": _between, "_not_between": _not_between,
    "_arith": _arith, "_chain": _chain, "_neg": negate, "_pos": _pos,
}  # fmt: skip
