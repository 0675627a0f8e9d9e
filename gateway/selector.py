"""JMS / EMS message selectors, compiled once into a Python function.

How this works. A selector (TIBCO EMS User's Guide, "Message Selectors"; JMS 1.1 §3.8.1.1) is
parsed by a lark LALR(1) parser (``selector.lark``) whose rule callbacks (:class:`_Builder`)
build small typed nodes while parsing, checking types as they go, so no parse tree is kept
and deep input never recurses. :class:`_CodeGen` then turns the nodes into the source of one
Python function, ``_match(m)``, which reads each identifier with ``m.header(name)`` and
computes SQL's three-valued logic with ``True`` / ``False`` / ``None`` (UNKNOWN); the
selector matches only when the result ``is True`` (EMS User's Guide, "Message Selectors"). A
top-level AND / OR becomes a run of ``if`` statements that returns as soon as the answer is
known. Common shapes are inlined (``color = 'red'``, ``weight > 10``, ``x BETWEEN 1 AND 9``, ``c IN
(...)``, prefix / suffix / contains ``LIKE``); the rest call the run-time helpers of
:mod:`gateway.selector_runtime` (``_eq``, ``_lt``, ``_arith`` ...), which the inlined code
also falls back to for unusual value types. A
subtree whose code nests too deeply for CPython's parser, or a long AND / OR run, becomes a
function of its own. Compiled selectors are cached by text, since consumers share them.

Semantic choices (the JMS and EMS texts leave these open):

* Types. Numbers are ``int`` / ``float`` and the width types of :mod:`gateway.types`
  (``bool`` is not a number); ``str`` and ``Char`` are strings; ``bool`` is boolean. Any other
  value (bytes, map, stream, array) compares with nothing.
* Comparison of incomparable types is FALSE for every operator, ``<>`` included; a NULL
  operand makes it UNKNOWN (EMS User's Guide, "Message Selectors"). So ``x <> 'a'`` is FALSE
  when ``x`` is 5, and ``x IN (...)``, ``x NOT IN (...)``, ``x LIKE ...`` and
  ``x NOT LIKE ...`` are all FALSE when ``x`` holds a non-string.
* Ordering (``< <= > >=``) of strings or booleans (EMS User's Guide, "Message Selectors") is
  rejected at compile time when either operand is a string or boolean literal or a condition;
  between two identifiers that hold strings at run time it is FALSE.
* Static type errors are :class:`InvalidSelectorError` with a position: arithmetic on a
  string or boolean literal, ``'a' = 1``, ``NOT 5``, a selector that is not a condition,
  ``IN`` / ``LIKE`` / ``IS NULL`` on anything but an identifier (as JMS's grammar says).
* An identifier used alone as a condition (``JMSRedelivered``, ``NOT flag``) reads as
  ``ident = TRUE``: TRUE / FALSE for a boolean, UNKNOWN for NULL, FALSE for anything else.
* Arithmetic follows Java's promotion (EMS User's Guide, "Message Selectors"): integers of
  every width compute as Java ``long`` (64-bit two's complement wrap-around, ``/`` truncates
  toward zero); a ``Float32`` with integers or ``Float32`` computes as Java ``float`` (rounded
  to float32, overflow to infinity); anything with a ``float`` computes as ``double``. Mixed
  comparisons convert the integer to the floating side's type first, as Java does. Division by
  zero (of any type) and arithmetic on NULL or on a non-number give NULL, never an exception.
* Literals: exact literals are Java ``long`` literals (decimal, ``0x`` hex, ``0`` octal,
  optional ``L``; hex and octal up to 64 bits, read as two's complement as in Java);
  approximate literals are Java ``double`` literals (``7.``, ``.5``, ``7E3``, optional ``D``)
  or, with an ``F`` suffix, ``Float32``. Out-of-range literals are errors.
* ``LIKE``: ``_`` is one character (a code point), ``%`` any run; the escape character
  makes the next character literal, whatever it is; a pattern that ends with the escape
  character is an error.
* Header identifiers are whatever :meth:`gateway.message.Message.header` returns (all 11
  JMS headers; ``JMSDeliveryMode`` reads as ``'PERSISTENT'`` / ``'NON_PERSISTENT'``).
* ``selector_logical_operator_limit`` (EMS User's Guide, "tibemsd.conf",
  selector_logical_operator_limit) is not implemented: it guards EMS's recursive evaluator;
  here AND / OR runs are flat loops of statements and nesting is capped at compile time by
  :data:`MAX_NESTING`.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from typing import Any, Protocol

from lark import Lark, Token
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from gateway.errors import InvalidSelectorError
from gateway.selector_runtime import (
    EXACT_IN_FLOAT,
    FLOATS,
    INTS,
    LONG_MAX,
    NUMS,
    RUNTIME,
    ULONG_SPAN,
    negate,
    wrap,
)
from gateway.types import Float32

__all__ = ["MAX_NESTING", "SELECTOR_CACHE_SIZE", "HasHeaders", "Selector", "compile_selector"]

# Deeper nesting is refused: compiling walks the nodes recursively and a real selector never
# comes near (EMS guards its evaluator for the same reason, EMS User's Guide, "tibemsd.conf",
# selector_logical_operator_limit).
MAX_NESTING = 200
# Distinct selector texts kept compiled; consumers of one application share a few texts.
SELECTOR_CACHE_SIZE = 1024
# Generated code nests about two parentheses per node; CPython refuses 200 (too many nested
# parentheses), so a subtree deeper than this becomes a function of its own.
_HOIST_DEPTH = 40
# JMS white space (EMS User's Guide, "Message Selectors"); a selector of only these is no selector.
_WHITESPACE = " \t\f\r\n"


class HasHeaders(Protocol):
    """What a selector reads: :class:`gateway.message.Message` and test doubles."""

    def header(self, name: str) -> Any: ...


class Selector:
    """A compiled selector. ``matches(msg)`` is TRUE only if the selector evaluates to TRUE.

    ``text`` is the selector as given, ``identifiers`` the header and property names it
    reads, ``source`` the generated Python source (for debugging).
    """

    __slots__ = ("text", "identifiers", "source", "_match")

    def __init__(
        self,
        text: str,
        identifiers: frozenset[str],
        match: Callable[[HasHeaders], bool],
        source: str,
    ) -> None:
        self.text = text
        self.identifiers = identifiers
        self.source = source
        self._match = match

    def matches(self, msg: HasHeaders) -> bool:
        """Whether ``msg`` is selected; runs on the hot path, never raises."""
        return self._match(msg)

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Selector) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_compile_cached, (self.text,))


def compile_selector(text: str | None) -> Selector | None:
    """Compile a selector; ``None`` or blank text means no selector (select everything).

    A null or empty selector means none (JMS 1.1 §3.8.1.1). Results are cached by text.

    Raises:
        InvalidSelectorError: the text does not parse or does not type-check; ``position``
            is the 0-based offset where it failed.
    """
    if text is None or not text.strip(_WHITESPACE):
        return None
    return _compile_cached(text)


@functools.lru_cache(maxsize=SELECTOR_CACHE_SIZE)
def _compile_cached(text: str) -> Selector:
    gen = _CodeGen()
    try:
        source = gen.match_function(_condition(_parser().parse(text), "a selector"))
    except _SemanticError as exc:
        raise InvalidSelectorError(exc.message, text, exc.position) from None
    except UnexpectedInput as exc:
        raise InvalidSelectorError(_describe(exc), text, _error_position(exc, text)) from None
    namespace: dict[str, Any] = dict(RUNTIME)
    namespace.update(gen.constants)
    try:
        exec(compile(source, "<selector>", "exec"), namespace)
    except RecursionError:  # not expected after hoisting; refuse rather than crash
        raise InvalidSelectorError("selector is too complex", text, 0) from None
    return Selector(text, frozenset(gen.names), namespace["_match"], source)


# -- nodes ----------------------------------------------------------------------------------

NUM, STR, BOOL, ANY = "number", "string", "boolean", "identifier"


class _SemanticError(Exception):
    """Raised by the builder and code generator; becomes :class:`InvalidSelectorError`."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(message)
        self.message = message
        self.position = position


class _Node:
    """A typed node. ``type`` is NUM, STR, BOOL (every condition) or ANY (an identifier).

    ============  ======================================  ==================================
    ``kind``      ``kids``                                ``arg``
    ============  ======================================  ==================================
    ``lit``       --                                      the value
    ``ident``     --                                      the name
    ``unary``     operand                                 ``"-"`` or ``"+"``
    ``arith``     operands of a left-associative run      one operator character per step
    ``compare``   left, right                             the operator
    ``between``   operand, low, high                      --
    ``in``        the identifier                          frozenset of strings
    ``like``      the identifier                          (test, argument), see _like_plan
    ``isnull``    the identifier                          --
    ``not``       operand (a condition)                   --
    ``truth``     an identifier used as a condition       --
    ``and/or``    conditions, flattened                   --
    ============  ======================================  ==================================
    """

    __slots__ = ("kind", "pos", "type", "kids", "arg", "negated", "depth")
    depth: int

    def __init__(
        self,
        kind: str,
        pos: int,
        type: str,
        kids: list[_Node] | None = None,
        arg: Any = None,
        negated: bool = False,
    ) -> None:
        self.kind = kind
        self.pos = pos
        self.type = type
        self.kids = kids if kids is not None else []
        self.arg = arg
        self.negated = negated
        depth = 0
        for kid in self.kids:
            if kid.kind == "lit" and kid.arg.__class__ is int and kid.arg > LONG_MAX:
                # 9223372036854775808 is legal only right under a unary minus
                raise _SemanticError("exact numeric literal is out of the range of long", kid.pos)
            depth = max(depth, kid.depth)
        if depth >= MAX_NESTING:
            raise _SemanticError("selector nests deeper than " + str(MAX_NESTING) + " levels", pos)
        self.depth = depth + 1


def _condition(node: _Node, where: str) -> _Node:
    """``node`` as a condition: conditions as they are, an identifier through ``truth``."""
    if node.type == BOOL:
        return node
    if node.type == ANY:
        return _Node("truth", node.pos, BOOL, [node])
    raise _SemanticError(where + " needs a condition, not a " + node.type, node.pos)


def _numeric(node: _Node, what: str) -> _Node:
    if node.type not in (NUM, ANY):
        raise _SemanticError(what + " needs a number, not a " + node.type, node.pos)
    return node


def _identifier(node: _Node, what: str) -> _Node:
    if node.kind != "ident":
        raise _SemanticError(what + " needs an identifier on its left", node.pos)
    return node


def _string_value(token: Any) -> str:
    return str(token)[1:-1].replace("''", "'")


# -- parse callbacks ----------------------------------------------------------------------


class _Builder:
    """lark callbacks, one per aliased rule in ``selector.lark``; each gets the children."""

    def string(self, c: list[Any]) -> _Node:
        return _Node("lit", c[0].start_pos, STR, arg=_string_value(c[0]))

    def true(self, c: list[Any]) -> _Node:
        return _Node("lit", c[0].start_pos, BOOL, arg=True)

    def false(self, c: list[Any]) -> _Node:
        return _Node("lit", c[0].start_pos, BOOL, arg=False)

    def ident(self, c: list[Any]) -> _Node:
        return _Node("ident", c[0].start_pos, ANY, arg=str(c[0]))

    def number(self, c: list[Any]) -> _Node:
        return _Node("lit", c[0].start_pos, NUM, arg=_number(str(c[0]), c[0].start_pos))

    def unary(self, c: list[Any]) -> _Node:
        op, operand, pos = str(c[0]), c[1], c[0].start_pos
        _numeric(operand, "unary " + op)
        if operand.kind == "lit":  # fold the sign in (Java: -9223372036854775808 is a long)
            return _Node("lit", pos, NUM, arg=negate(operand.arg) if op == "-" else operand.arg)
        if operand.kind == "unary":  # - - x is + x; + - x is - x
            op = ("+" if operand.arg == "-" else "-") if op == "-" else operand.arg
            operand = operand.kids[0]
        return _Node("unary", pos, NUM, [operand], op)

    def arith(self, c: list[Any]) -> _Node:
        left, op, right = _numeric(c[0], "arithmetic " + c[1]), str(c[1]), c[2]
        _numeric(right, "arithmetic " + op)
        if left.kind == "arith" and (left.arg[0] in "+-") == (op in "+-"):
            return _Node("arith", left.pos, NUM, [*left.kids, right], left.arg + op)
        return _Node("arith", left.pos, NUM, [left, right], op)

    def compare(self, c: list[Any]) -> _Node:
        left, op, right, pos = c[0], str(c[1]), c[2], c[1].start_pos
        lt, rt = left.type, right.type
        if op in ("=", "<>"):
            if lt != ANY and rt != ANY and lt != rt:
                raise _SemanticError("cannot compare a " + lt + " with a " + rt, pos)
        else:
            for t in (lt, rt):
                if t in (STR, BOOL):
                    raise _SemanticError("a " + t + " can only be compared with = and <>", pos)
        return _Node("compare", left.pos, BOOL, [left, right], op)

    def between(self, c: list[Any]) -> _Node:
        kids = [_numeric(n, "BETWEEN") for n in (c[0], c[-3], c[-1])]
        return _Node("between", c[0].pos, BOOL, kids, negated=_negated(c))

    def string_list(self, c: list[Any]) -> frozenset[str]:
        return frozenset(_string_value(t) for t in c)

    def in_(self, c: list[Any]) -> _Node:
        return _Node("in", c[0].pos, BOOL, [_identifier(c[0], "IN")], c[-1], _negated(c))

    def like(self, c: list[Any]) -> _Node:
        operand = _identifier(c[0], "LIKE")
        escape: str | None = None
        pattern = c[-1]
        if getattr(c[-2], "type", None) == "ESCAPE":
            escape, pattern = _string_value(c[-1]), c[-3]
            if len(escape) != 1:
                raise _SemanticError("ESCAPE needs exactly one character", c[-1].start_pos)
        plan = _like_plan(_string_value(pattern), escape, pattern.start_pos)
        return _Node("like", operand.pos, BOOL, [operand], plan, _negated(c))

    def is_null(self, c: list[Any]) -> _Node:
        operand = _identifier(c[0], "IS NULL")
        return _Node("isnull", operand.pos, BOOL, [operand], None, _negated(c))

    def not_(self, c: list[Any]) -> _Node:
        operand = _condition(c[1], "NOT")
        if operand.kind == "not":  # NOT NOT x is x in three-valued logic too
            return operand.kids[0]
        return _Node("not", c[0].start_pos, BOOL, [operand])

    def and_(self, c: list[Any]) -> _Node:
        return _logic("and", _condition(c[0], "AND"), _condition(c[2], "AND"))

    def or_(self, c: list[Any]) -> _Node:
        return _logic("or", _condition(c[0], "OR"), _condition(c[2], "OR"))


def _negated(c: list[Any]) -> bool:
    """Whether a predicate's tokens include NOT (``NOT BETWEEN``, ``IS NOT NULL`` ...)."""
    return any(isinstance(t, Token) and t.type == "NOT" for t in c)


def _logic(kind: str, left: _Node, right: _Node) -> _Node:
    """AND / OR runs are flattened: ``a OR b OR c`` is one node, evaluated left to right."""
    items: list[_Node] = []
    for node in (left, right):
        items.extend(node.kids if node.kind == kind else [node])
    return _Node(kind, left.pos, BOOL, items)


def _number(text: str, pos: int) -> Any:
    """The value of a Java integer or floating-point literal (EMS User's Guide,
    "Message Selectors")."""
    low = text.lower()
    digits = low.rstrip("l")
    if digits.startswith("0x") or (len(digits) > 1 and digits[0] == "0" and digits.isdigit()):
        if digits[1] != "x" and ("8" in digits or "9" in digits):
            raise _SemanticError("invalid octal literal", pos)
        value = int(digits[2:], 16) if digits[1] == "x" else int(digits, 8)
        if value >= ULONG_SPAN:
            raise _SemanticError("exact numeric literal is out of the range of long", pos)
        return wrap(value)  # 64-bit hex and octal literals are two's complement, as in Java
    if "." in low or "e" in low or low[-1] in "fd":
        if low[-1] == "l":
            raise _SemanticError("invalid numeric literal", pos)
        value_f = float(text[:-1] if low[-1] in "fd" else text)
        if not math.isfinite(value_f):
            raise _SemanticError("approximate numeric literal is out of range", pos)
        if low[-1] != "f":
            return value_f
        try:
            return Float32(value_f)
        except OverflowError:
            raise _SemanticError("float literal is out of range", pos) from None
    if len(digits) > 19 or int(digits) > LONG_MAX + 1:
        raise _SemanticError("exact numeric literal is out of the range of long", pos)
    return int(digits)  # 2**63 is checked once we know whether a minus folds into it


_MANY = object()  # '%' in a LIKE pattern
_ONE = object()  # '_'


def _like_plan(pattern: str, escape: str | None, pos: int) -> tuple[str, Any]:
    """Reduce a LIKE pattern to its cheapest test (EMS User's Guide, "Message Selectors").

    Returns ``(test, argument)``: ``any``; ``exact``, ``prefix``, ``suffix`` or
    ``contains`` with a string; or ``regex`` with a compiled pattern's ``fullmatch``.
    """
    parts: list[Any] = []
    literal: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == escape:
            i += 1
            if i == n:
                raise _SemanticError("LIKE pattern ends with its escape character", pos)
            literal.append(pattern[i])
        elif ch == "%" or ch == "_":
            if literal:
                parts.append("".join(literal))
                literal = []
            if not (ch == "%" and parts and parts[-1] is _MANY):
                parts.append(_MANY if ch == "%" else _ONE)
        else:
            literal.append(ch)
        i += 1
    if literal:
        parts.append("".join(literal))
    shape = tuple("%" if p is _MANY else "_" if p is _ONE else "s" for p in parts)
    simple = {(): ("exact", ""), ("%",): ("any", None), ("s",): ("exact", 0),
              ("s", "%"): ("prefix", 0), ("%", "s"): ("suffix", 1), ("%", "s", "%"): ("contains", 1)}  # fmt: skip
    if shape in simple:
        test, index = simple[shape]
        return test, parts[index] if isinstance(index, int) else index
    regex = "".join(".*" if p is _MANY else "." if p is _ONE else re.escape(p) for p in parts)
    return "regex", re.compile(regex, re.DOTALL).fullmatch


# -- code generation ------------------------------------------------------------------------

_PY_OP = {"=": "==", "<>": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
_HELPER = {"=": "_eq", "<>": "_ne", "<": "_lt", "<=": "_le", ">": "_gt", ">=": "_ge"}
_MIRROR = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_CLASS_SET_NAMES = {NUMS: "_NUMS", INTS: "_INTS", FLOATS: "_FLOATS"}
# AND / OR runs longer than this become statements in a function of their own (a long run
# of conditional expressions nests in CPython's AST and exhausts its compiler's stack).
_INLINE_RUN = 8


def _fast_classes(value: Any) -> frozenset[type]:
    """Value classes for which ``t OP value`` in Python equals Java's comparison."""
    if isinstance(value, int):
        return NUMS if -EXACT_IN_FLOAT <= value <= EXACT_IN_FLOAT else INTS
    return FLOATS


class _CodeGen:
    """Turns nodes into Python: ``emit`` gives (expression, parenthesis nesting)."""

    def __init__(self) -> None:
        self.constants: dict[str, Any] = {}
        self.functions: list[str] = []
        self.names: set[str] = set()
        self._temps = 0

    def temp(self) -> str:
        self._temps += 1
        return "t" + str(self._temps)

    def constant(self, value: Any) -> str:
        name = "_k" + str(len(self.constants))
        self.constants[name] = value
        return name

    def literal(self, value: Any) -> str:
        return repr(value) if value.__class__ in (int, float, str, bool) else self.constant(value)

    def function(self, lines: list[str]) -> str:
        """Define ``_fN(h)`` with ``lines`` as its body; returns the call."""
        name = "_f" + str(len(self.functions))
        self.functions.append("def " + name + "(h):\n    " + "\n    ".join(lines) + "\n")
        return name + "(h)"

    def match_function(self, root: _Node) -> str:
        """The source of ``_match(m)``: TRUE only when the selector is TRUE."""
        if root.kind in ("and", "or"):
            lines = self.run(root, True)
        else:
            lines = ["return (" + self.emit(root)[0] + ") is True"]
        return (
            "".join(self.functions)
            + "def _match(m):\n    h = m.header\n    "
            + ("\n    ".join(lines) + "\n")
        )

    def emit(self, node: _Node) -> tuple[str, int]:
        code, depth = getattr(self, "emit_" + node.kind)(node)
        if depth > _HOIST_DEPTH:
            return self.function(["return " + code]), 1
        return code, depth

    def guarded(self, node: _Node, body: Callable[[str], str]) -> tuple[str, int]:
        """``None`` if ``node`` is NULL, else ``body(t)`` with ``t`` holding its value."""
        x, depth = self.emit(node)
        t = self.temp()
        return "(None if (" + t + " := " + x + ") is None else " + body(t) + ")", depth + 2

    def emit_lit(self, node: _Node) -> tuple[str, int]:
        return self.literal(node.arg), 0

    def emit_ident(self, node: _Node) -> tuple[str, int]:
        self.names.add(node.arg)
        return "h(" + repr(node.arg) + ")", 1

    def emit_unary(self, node: _Node) -> tuple[str, int]:
        x, depth = self.emit(node.kids[0])
        return ("_neg(" if node.arg == "-" else "_pos(") + x + ")", depth + 1

    def emit_arith(self, node: _Node) -> tuple[str, int]:
        parts = [self.emit(n) for n in node.kids]
        args = ", ".join(code for code, _ in parts)
        helper = "_arith(" if len(parts) == 2 else "_chain("
        return helper + repr(node.arg) + ", " + args + ")", max(d for _, d in parts) + 1

    def emit_compare(self, node: _Node) -> tuple[str, int]:
        op, (left, right) = node.arg, node.kids
        if left.kind == "lit" and right.kind != "lit":
            op, left, right = _MIRROR[op], right, left
        if right.kind != "lit":
            (a, da), (b, db) = self.emit(left), self.emit(right)
            return _HELPER[op] + "(" + a + ", " + b + ")", max(da, db) + 1
        lit = self.literal(right.arg)
        if right.type == STR:  # a string equals only a string
            if op == "=":
                return self.guarded(left, lambda t: t + " == " + lit)
            return self.guarded(
                left,
                lambda t: "(" + t + " != " + lit + ") if isinstance(" + t + ", str) else False",
            )
        if right.type == BOOL:  # only the same boolean is equal; a non-boolean is incomparable
            wanted = right.arg if op == "=" else not right.arg
            return self.guarded(left, lambda t: t + " is " + repr(wanted))
        classes = _CLASS_SET_NAMES[_fast_classes(right.arg)]
        fast = " " + _PY_OP[op] + " " + lit + ") if "
        slow = " else " + _HELPER[op] + "("
        return self.guarded(
            left,
            lambda t: "(" + t + fast + t + ".__class__ in " + classes + slow + t + ", " + lit + ")",
        )

    def emit_between(self, node: _Node) -> tuple[str, int]:
        helper = "_not_between" if node.negated else "_between"
        operand, low, high = node.kids
        classes = frozenset[type]()
        if low.kind == "lit" and high.kind == "lit":
            classes = _fast_classes(low.arg) & _fast_classes(high.arg)
        if not classes:
            parts = [self.emit(n) for n in node.kids]
            args = ", ".join(code for code, _ in parts)
            return helper + "(" + args + ")", max(d for _, d in parts) + 1
        lo, hi, name = self.literal(low.arg), self.literal(high.arg), _CLASS_SET_NAMES[classes]

        def body(t: str) -> str:
            if node.negated:
                test = "(" + t + " < " + lo + " or " + t + " > " + hi + ")"
            else:
                test = "(" + lo + " <= " + t + " <= " + hi + ")"
            slow = helper + "(" + t + ", " + lo + ", " + hi + ")"
            return test + " if " + t + ".__class__ in " + name + " else " + slow

        return self.guarded(operand, body)

    def emit_in(self, node: _Node) -> tuple[str, int]:
        values = self.constant(node.arg)
        test = " not in " if node.negated else " in "
        return self.guarded(
            node.kids[0],
            lambda t: "(" + t + test + values + ") if isinstance(" + t + ", str) else False",
        )

    def emit_like(self, node: _Node) -> tuple[str, int]:
        kind, arg = node.arg
        if kind == "regex":
            arg = self.constant(arg)

        def body(t: str) -> str:
            test = {
                "any": "True",
                "exact": t + " == " + repr(arg),
                "prefix": t + ".startswith(" + repr(arg) + ")",
                "suffix": t + ".endswith(" + repr(arg) + ")",
                "contains": repr(arg) + " in " + t,
                "regex": str(arg) + "(" + t + ") is not None",
            }[kind]
            test = "(not (" + test + "))" if node.negated else "(" + test + ")"
            return test + " if isinstance(" + t + ", str) else False"

        return self.guarded(node.kids[0], body)

    def emit_isnull(self, node: _Node) -> tuple[str, int]:
        x, depth = self.emit(node.kids[0])
        return "(" + x + (" is not None)" if node.negated else " is None)"), depth + 1

    def emit_not(self, node: _Node) -> tuple[str, int]:
        return self.guarded(node.kids[0], lambda t: "not " + t)

    def emit_truth(self, node: _Node) -> tuple[str, int]:
        x, depth = self.emit(node.kids[0])
        t = self.temp()
        code = "(" + t + " if (" + t + " := " + x + ").__class__ is bool else "
        return code + "None if " + t + " is None else False)", depth + 2

    def emit_and(self, node: _Node) -> tuple[str, int]:
        """AND: the first FALSE decides, else UNKNOWN if any is, else TRUE; OR is the dual."""
        if len(node.kids) > _INLINE_RUN:
            return self.function(self.run(node, False)), 1
        stop = "False" if node.kind == "and" else "True"
        parts = [self.emit(n) for n in node.kids]
        temps = [self.temp() for _ in parts]
        code = "("
        for (x, _), t in zip(parts, temps, strict=True):
            code += stop + " if (" + t + " := " + x + ") is " + stop + " else "
        if node.kind == "and":
            code += " and ".join(temps) + ")"
        else:
            code += "None if " + " or ".join(t + " is None" for t in temps) + " else False)"
        return code, max(d for _, d in parts) + 2

    emit_or = emit_and

    def run(self, node: _Node, root: bool) -> list[str]:
        """An AND / OR run as statements. At the root only TRUE matters, so an AND stops at
        the first item that is not TRUE and an OR need not tell FALSE from UNKNOWN."""
        is_and = node.kind == "and"
        stop = "False" if is_and else "True"
        lines = [] if root else ["u = False"]
        for item in node.kids:
            x, _ = self.emit(item)
            if root:
                lines += ["if (" + x + ") is " + ("not True:" if is_and else "True:")]
                lines += ["    return " + stop]
                continue
            t = self.temp()
            lines += [t + " = " + x, "if " + t + " is " + stop + ":", "    return " + stop]
            lines += ["if " + t + " is None:", "    u = True"]
        if root:
            lines.append("return " + str(is_and))
        else:
            lines.append("return None if u else " + str(is_and))
        return lines


# -- parser -----------------------------------------------------------------------------

_TERMINAL_NAMES = {
    "IDENT": "an identifier", "STRING": "a string literal", "NUMBER": "a number",
    "CMP_OP": "a comparison operator", "ADD_OP": "+ or -", "MUL_OP": "* or /",
    "LPAR": "(", "RPAR": ")", "COMMA": ",", "$END": "the end",
}  # fmt: skip


@functools.cache
def _parser() -> Any:
    """The LALR parser, built on first use; its callbacks build nodes while parsing."""
    options = {"parser": "lalr", "lexer": "basic", "transformer": _Builder()}
    return Lark.open("selector.lark", rel_to=__file__, **options)


def _error_position(exc: UnexpectedInput, text: str) -> int:
    pos: int | None = None
    if isinstance(exc, UnexpectedToken) and exc.token.type != "$END":
        pos = exc.token.start_pos
    elif isinstance(exc, UnexpectedCharacters):
        pos = exc.pos_in_stream
    return len(text) if pos is None or pos < 0 else pos


def _describe(exc: UnexpectedInput) -> str:
    if isinstance(exc, UnexpectedCharacters):
        return "unexpected character " + repr(exc.char)
    if isinstance(exc, UnexpectedToken):
        token = exc.token
        what = "end of selector" if token.type == "$END" else repr(str(token))
        expected = sorted(_TERMINAL_NAMES.get(name, name) for name in exc.expected)
        return "unexpected " + what + "; expected " + ", ".join(expected)
    return "unexpected end of selector"
