"""The default rows as data: what the hand-written fast paths take their tables from.

How this works. ``mappings/defaults/<protocol>.yaml`` is the definition of each default
mapping: the engine (:mod:`mappings.rules`) compiles its rows into steps, and the fast paths
(:mod:`mappings.stomp`, :mod:`mappings.mqtt`, :mod:`mappings.amqp` with
:mod:`mappings.amqp_fast` / :mod:`mappings.amqp_fast_out`) build their tables from the same
rows when they are imported, through this module: the header, property, user property and
annotation names each row reads and writes (:func:`name`), and the ``except`` lists of the
``copy_all`` rows (:func:`except_names`). What a fast path does with a row is its code; which
rows it is written for is its *shape*, one ``(rule, "kind via: from -> to")`` pair per row in
order, in which a field ``section.{}`` is a name the fast path takes from that row.

:func:`check_shape` compares that shape with the rows when the fast path is imported. When
they agree, the fast path is the protocol's default mapping for that direction
(:func:`is_fast`). When they do not (a row added, removed, moved, or given another step or
converter), the fast path is off for that direction and the engine runs the rows instead
(``mappings.engine.default_wire``, which logs why once): a row is one change in one place,
right at once, and the fast path is brought along when its speed is wanted (``mappings/
README.md``, "One source: the rows and the fast paths"). A name the fast path keeps that the
rows no longer give (:func:`name`: the rule is gone, or the field is in another section)
raises :class:`DefaultRowsMismatch` naming the file and the rule, so the package does not
import: the default rows are package data, never configuration.

The files are read once per protocol, as plain data (PyYAML's safe loader), and nothing here
runs per message: the fast paths keep what they take in module constants.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

import yaml

__all__ = ["DefaultRowsMismatch", "check_shape", "except_names", "is_fast", "name", "shape_of",
           "turn_off", "why_not_fast"]


class DefaultRowsMismatch(Exception):
    """A default row is not what a fast path is written for (a broken package)."""


_FILES: dict[str, dict[str, tuple[int, list[Any]]]] = {}  # protocol → rule → (index, steps)
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_OFF: dict[tuple[str, str], str] = {}  # (protocol, direction) → why its fast path is off


def _rules(protocol: str) -> dict[str, tuple[int, list[Any]]]:
    rules = _FILES.get(protocol)
    if rules is None:
        text = (resources.files("mappings") / "defaults" / f"{protocol}.yaml").read_text(
            encoding="utf-8")  # fmt: skip
        rules = {}
        for i, rule in enumerate(yaml.load(text, Loader=_LOADER)["mappings"]):
            rules[rule["name"]] = (i, rule["steps"])
        _FILES[protocol] = rules
    return rules


def _file(rule: str) -> str:
    return f"mappings/defaults/{rule.split('.', 1)[0]}.yaml"


def _step(rule: str) -> tuple[str, dict[str, Any]]:
    """The one step of ``rule`` as (kind, arguments)."""
    found = _rules(rule.split(".", 1)[0]).get(rule)
    if found is None:
        raise DefaultRowsMismatch(f"{_file(rule)}: no rule {rule!r}, which the fast path reads")
    steps = found[1]
    if len(steps) != 1:
        raise DefaultRowsMismatch(f"{_file(rule)}: rule {rule!r} has {len(steps)} steps; the "
                                  "fast path reads rules of one step")
    ((kind, args),) = steps[0].items()
    return kind, args


def _render(step: dict[str, Any]) -> str:
    ((kind, args),) = step.items()
    if not isinstance(args, dict):
        return kind
    text = kind if args.get("via") is None else f"{kind} {args['via']}"
    ends = []
    for end in ("from", "to", "field"):
        fields = args.get(end)
        if fields is not None:
            ends.append(", ".join(fields) if isinstance(fields, list) else str(fields))
    if "type" in args:
        ends[-1] += f" as {args['type']}"
    return f"{text}: {' -> '.join(ends)}" if ends else text


def shape_of(protocol: str, direction: str) -> tuple[tuple[str, str], ...]:
    """``(rule, "kind via: from -> to")`` of each row of ``protocol`` and ``direction``, in
    order (a ``copy_all``'s ``except`` list is not in it: the fast path takes it)."""
    return tuple((rule, "; ".join(_render(s) for s in steps))
                 for rule, (_, steps) in _rules(protocol).items()
                 if rule.split(".")[1] == direction)


def _agrees(row: str, fast: str) -> bool:
    """``row`` as ``fast`` says, where a field ``section.{}`` in ``fast`` is any name in that
    section (one the fast path takes from the row with :func:`name`)."""
    if row == fast:
        return True
    parts = re.split(r"([ ,:;>]+)", fast)
    got = re.split(r"([ ,:;>]+)", row)
    return len(parts) == len(got) and all(
        p == g or p.endswith(".{}") and g.startswith(p[:-2]) and _one(g[len(p) - 2:])
        for p, g in zip(parts, got, strict=True))


def _one(name: str) -> bool:
    """A name a fast path can take: not empty, and one element (no dot)."""
    return bool(name) and "." not in name


def check_shape(protocol: str, direction: str, shape: tuple[tuple[str, str], ...]) -> bool:
    """Whether the rows of ``protocol`` and ``direction`` are ``shape``: the same rules in
    the same order, each with the same steps, converters and fields (a field ``section.{}``
    of ``shape`` is a name the fast path takes from the row), which is what the fast path is
    written for. When not, its fast path is off (:func:`why_not_fast` says why)."""
    rows = shape_of(protocol, direction)
    for i in range(max(len(rows), len(shape))):
        row = rows[i] if i < len(rows) else None
        fast = shape[i] if i < len(shape) else None
        if row is not None and fast is not None and row[0] == fast[0]:
            if _agrees(row[1], fast[1]):
                continue
            what = f"rule {row[0]!r} is {row[1]!r}; the fast path is written for {fast[1]!r}"
        elif row is None:
            what = f"no rule {fast[0]!r} at row {i + 1} of {direction!r}"  # type: ignore[index]
        else:
            what = (f"rule {row[0]!r} ({row[1]}), row {i + 1} of {direction!r}, is not one the "
                    "fast path is written for" + (f" (it expects {fast[0]!r} there)"
                                                  if fast is not None else ""))
        _OFF[protocol, direction] = f"mappings/defaults/{protocol}.yaml: {what}"
        return False
    _OFF.pop((protocol, direction), None)
    return True


def turn_off(protocol: str, direction: str, why: str) -> None:
    """Turn the fast path of ``protocol`` and ``direction`` off: a fast path's own check of
    its rows (beyond :func:`check_shape`) failed, ``why``."""
    _OFF.setdefault((protocol, direction), f"mappings/defaults/{protocol}.yaml: {why}")


def is_fast(protocol: str, direction: str) -> bool:
    """Whether the fast path of ``protocol`` and ``direction`` is its default mapping (its
    rows agreed with it when it was imported)."""
    return (protocol, direction) not in _OFF


def why_not_fast(protocol: str, direction: str) -> str | None:
    """Why the fast path of ``protocol`` and ``direction`` is off; None when it is on."""
    return _OFF.get((protocol, direction))


def _field(rule: str, place: str, section: str) -> str:
    kind, args = _step(rule)
    end, _, index = place.partition("[")
    fields = args.get(end) if isinstance(args, dict) else None
    if isinstance(fields, str):
        fields = [fields]
    i = int(index.rstrip("]"))
    if not isinstance(fields, list) or i >= len(fields):
        raise DefaultRowsMismatch(f"{_file(rule)}: rule {rule!r} ({kind}) has no {place}, "
                                  "which the fast path reads")
    field = fields[i]
    prefix = section + "."
    if not isinstance(field, str) or not field.startswith(prefix) or not _one(
            field[len(prefix):]):
        raise DefaultRowsMismatch(f"{_file(rule)}: rule {rule!r}: {place} is {field!r}; the "
                                  f"fast path takes a {section}.<name> there")
    return field[len(prefix):]


def name(section: str, *places: str) -> str:
    """The one name the default rows read or write at ``places`` (each ``"RULE from[I]"`` or
    ``"RULE to[I]"``: the ``I``-th field of the row's ``from`` or ``to``), which must all be
    ``section.<the name>``: ``name("wire.header", "stomp.in.type from[0]")`` is ``"type"``.
    A fast path keeps it in one constant, so the rows it names must agree."""
    found = []
    for place in places:
        rule, _, where = place.partition(" ")
        found.append(_field(rule, where, section))
    if len(set(found)) != 1:
        raise DefaultRowsMismatch(
            f"{_file(places[0].partition(' ')[0])}: the fast path keeps one name for "
            + ", ".join(f"{p} ({n})" for p, n in zip(places, found, strict=True)))
    return found[0]


def except_names(rule: str) -> tuple[str, ...]:
    """The ``except`` list of a ``copy_all`` row, in order."""
    kind, args = _step(rule)
    names = args.get("except") if kind == "copy_all" else None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise DefaultRowsMismatch(f"{_file(rule)}: rule {rule!r} is not a copy_all with an "
                                  "except list, which the fast path reads")
    return tuple(names)
