"""The declarative mapping engine: YAML rules compiled once into plain functions.

How this works. A mapping file is a list of *rules*; each rule has a ``match`` (destination
patterns, the direction, and optionally protocols and transports) and a list of ``steps``
(``decode_json``, ``lift``, ``copy``, ``move``, ``rename``, ``set``, ``default``, ``set_type``,
``drop``, ``require``, ``encode_json``, ``convert``, ``copy_all``). Loading composes the YAML
into nodes (so every error names file, line and field), parses every field path once
(:mod:`mappings.fields`, and :mod:`mappings.wire` for a protocol's own ``wire.…`` form) and
turns every step into a small closure ``step(msg)``; nothing is parsed per message.

Two kinds of rule files. The *default mappings* (``mappings/defaults/<protocol>.yaml``, in the
package) are the protocol mappings themselves: one named rule per row of the protocol's
tables, reading one side (the wire form, or the core message) and writing the other.
*User rules* (``<config dir>/mappings/*.yaml``, files in name order) change messages on the
core side, and may also replace (``replaces:``) or extend (``extends:``) a default rule, or
read and write ``wire.…`` fields, for the destinations and transports they match.

Callers. :meth:`MappingSet.wire_for` gives an adapter or transport the whole mapping of one
destination, protocol, direction and transport as a function with the signature of the
protocol's hand-written mapping (``stomp_to_message`` …): that hand-written function itself
when no user rule matches (the fast path, which tests prove equal to the default rules), the
fast path composed with the core-side rules when only those match, and else the interpreted
pipeline: the default rules, each replaced or extended as the user rules say, with the other
user rules after them (``in``) or before them (``out``; after them if they address wire
fields). :meth:`MappingSet.compile_for` gives the core-side rules alone (what a caller that
maps the wire form itself applies after it on the way in and before it on the way out).
Answers are cached in bounded dicts. A function never changes the message it is given (a
delivered message is shared by every subscriber): it works on a copy, and raises
:class:`MappingFailed` for a user rule's failure (a default rule fails with the protocol
mapping's own error); a message is never half transformed. ``mappings/README.md``
("Declarative mappings (YAML)") documents the format, every step, field and converter, the
matching and the failure behaviour.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from importlib import resources
from itertools import islice
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from gateway.errors import ConfigError, ConfigErrors, GatewayError
from gateway.message import Destination, DestKind, Message
from gateway.subject import matches as subject_matches
from gateway.subject import validate as validate_subject
from gateway.types import MAX_NESTING as _MAX_NESTING
from gateway.types import Int64, UInt64
from mappings import amqp as _amqp
from mappings import mqtt as _mqtt
from mappings import stomp as _stomp
from mappings.amqp_values import _parse_record
from mappings.converters import CONVERTERS
from mappings.fields import (
    _ALWAYS_SET,
    _MAP,
    _READ_ONLY,
    _STEP_ERRORS,
    _STREAM,
    PROPERTIES,
    TYPE_NAMES,
    Section,
    Step,
    _coercer,
    _copy_message,
    _deep,
    _Field,
    _step_convert,
    _step_copy,
    _step_copy_all,
    _step_decode_json,
    _step_encode_json,
    _step_rename,
    _step_require,
    _step_set,
    _step_set_type,
    parse_field,
)
from mappings.mqtt import MqttOut as MqttOutTuple
from mappings.wire import (
    WIRE_PROTOCOLS,
    AmqpIn,
    AmqpOut,
    MqttIn,
    MqttOut,
    StompIn,
    StompOut,
    Work,
    wire_parser,
    wire_section,
)

__all__ = ["DIRECTIONS", "PROTOCOLS", "STEP_KINDS", "MappingFailed", "MappingSet",
           "_copy_message"]  # fmt: skip

PROTOCOLS = ("mqtt", "amqp", "stomp", "rv", "inproc")
DIRECTIONS = ("in", "out", "both")
STEP_KINDS = (
    "decode_json", "encode_json", "lift", "copy", "move", "rename", "set", "default",
    "set_type", "drop", "require", "convert", "copy_all",
)  # fmt: skip
CACHE_SIZE = 4096  # compile_for / wire_for keys (destination, protocol, direction, transport)
_TRANSPORT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # as a transports.conf section
_MISSING: Any = object()


class MappingFailed(GatewayError):
    """A rule could not be applied to a message; the caller's message was not changed.

    ``str()`` is ``mapping 'RULE' (FILE:LINE) STEP FIELD: DETAIL``; each part is an attribute.
    """

    reason = "mapping-failed"

    def __init__(self, rule: str, file: str, line: int, step: str, field: str, detail: str):
        self.rule, self.file, self.line = rule, file, line
        self.step, self.field, self.detail = step, field, detail
        super().__init__(f"mapping {rule!r} ({file}:{line}) {step} {field}: {detail}")


class _Where(NamedTuple):
    rule: str
    file: str
    line: int
    step: str
    field: str
    raw: bool = False  # a default rule's step: its error is the protocol mapping's own


def _runner(steps: tuple[tuple[Step, _Where], ...]) -> Callable[[Message], None]:
    """Run steps in order; a user rule's failure becomes :class:`MappingFailed`."""

    def run(m: Message) -> None:
        try:
            for step, _where in steps:
                step(m)
        except _STEP_ERRORS as exc:
            if _where.raw:
                raise
            raise MappingFailed(*_where[:5], str(exc)) from exc

    return run


def _run_steps(
    steps: tuple[tuple[Step, _Where], ...], into_body: bool
) -> Callable[[Message], Message]:
    """One function for the steps of every matching rule. ``into_body``: some step changes a
    map or stream body in place, so the (shared) body is copied first."""
    run = _runner(steps)

    def mapped(msg: Message) -> Message:
        m = _copy_message(msg)
        if into_body and (m.body_kind is _MAP or m.body_kind is _STREAM):
            m.body = _deep(m.body)
        run(m)
        return m

    return mapped


# -- loading: YAML nodes → rules, every error with file, line and field -------------------------

_Node = yaml.Node
_NULL_TAG = "tag:yaml.org,2002:null"
_FROM_TO, _FIELD_VALUE = ("from", "to"), ("field", "value")
_STEP_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {  # (required, optional)
    "decode_json": ((), ()), "encode_json": ((), ("as",)), "lift": (_FROM_TO, ("type",)),
    "copy": (_FROM_TO, ("type",)), "move": (_FROM_TO, ("type",)), "rename": (_FROM_TO, ()),
    "set": (_FIELD_VALUE, ("type",)), "default": (_FIELD_VALUE, ("type",)),
    "set_type": (("field", "type"), ()), "convert": (("from", "to", "via"), ()),
    "copy_all": (_FROM_TO, ("except", "via")),
}  # fmt: skip


class _Rule(NamedTuple):
    patterns: tuple[tuple[DestKind | None, str], ...]
    protocols: frozenset[str] | None
    transports: frozenset[str] | None
    directions: frozenset[str]
    steps: tuple[tuple[Step, _Where], ...]
    into_body: bool  # a step changes a map or stream body in place
    info: dict[str, Any]
    target: str | None = None  # the default rule it replaces or extends
    replaces: bool = False  # replaces (else extends) ``target``
    wire: bool = False  # some step addresses a wire field

    def matches(self, d: Destination, protocol: str, direction: str, transport: str | None) -> bool:
        return (
            direction in self.directions
            and (self.protocols is None or protocol in self.protocols)
            and (self.transports is None or transport in self.transports)
            and any((k is None or k is d.kind) and subject_matches(p, d.name)
                    for k, p in self.patterns)
        )  # fmt: skip


def _problem(f: _Field, use: str) -> str:
    """Why ``f`` cannot be used so (``write``, ``drop``, ``move``, ``default``, ``set_type``)."""
    name = f.path[0] if f.section == "header" else None
    if name in _READ_ONLY and use not in ("copy", "require"):
        return f"{f.text} is read-only"
    if f.fixed and use not in ("copy", "require"):
        return f.fixed
    if use == "set_type" and (f.section not in ("property", "body") or f.text == "body"):
        return f"{f.text} has no type to set (set_type takes a property or a body field)"
    if use == "default" and name in _ALWAYS_SET:
        return f"{f.text} always has a value (use set)"
    if use in ("drop", "move") and name in _ALWAYS_SET:
        return f"{f.text} cannot be dropped" + (" (use copy)" if use == "move" else "")
    return ""


def _check_constant(v: Any, depth: int = 0) -> Any:
    """A YAML value as a message value (an int beyond a long → ``UInt64``), or raise."""
    t = type(v)
    if v is None or t in (bool, float, str, bytes):
        return v
    if t is int:
        return v if Int64.MIN <= v <= Int64.MAX else UInt64(v)  # OverflowError beyond
    if depth < _MAX_NESTING and t is list:
        return [_check_constant(x, depth + 1) for x in v]
    if depth < _MAX_NESTING and t is dict and all(type(k) is str for k in v):
        return {k: _check_constant(x, depth + 1) for k, x in v.items()}
    raise ValueError(f"a YAML {t.__name__} is not a message value (quote it to make a string)")


class _Loader:
    """Builds the rules of one file from its YAML nodes, collecting every error with its line.

    ``defaults``: the default rules by name (what ``replaces`` / ``extends`` may name);
    ``is_default``: this is a default mapping file (every rule named, steps fail raw)."""

    def __init__(self, file: str, errors: list[ConfigError],
                 defaults: dict[str, _Rule] | None = None, is_default: bool = False) -> None:
        self.file, self.errors = file, errors
        self.defaults, self.is_default = defaults or {}, is_default
        self.constructor = yaml.constructor.SafeConstructor()
        self.into_body = False  # of the rule being read
        self.uses_wire = False  # of the rule being read
        self.context: tuple[str, str] | None = None  # (protocol, direction) for wire fields

    def changes(self, *fields: _Field) -> None:
        """Note fields written or removed in place (below ``body``: the body is copied first)."""
        self.into_body = self.into_body or any(f.section == "body" and f.path for f in fields)

    def error(self, node: _Node, field: str, message: str) -> None:
        self.errors.append(ConfigError(self.file, node.start_mark.line + 1, f"{field}: {message}"))

    def mapping(self, node: _Node, field: str, required: Sequence[str],
                optional: Sequence[str] = ()) -> dict[str, _Node] | None:  # fmt: skip
        if not isinstance(node, yaml.MappingNode):
            self.error(node, field, "must be a mapping of keys to values")
            return None
        out: dict[str, _Node] = {}
        for k, v in node.value:
            key = k.value if isinstance(k, yaml.ScalarNode) else None
            if key is None or key not in required and key not in optional:
                known = ", ".join((*required, *optional)) or "none"
                self.error(k, field, f"unknown key {key!r} (known: {known})")
            elif key in out:
                self.error(k, f"{field}.{key}", "given twice")
            else:
                out[key] = v
        missing = [k for k in required if k not in out]
        if missing:
            self.error(node, field, f"missing {missing[0]!r}")
            return None
        return out

    def text(self, node: _Node, field: str) -> str | None:
        if isinstance(node, yaml.ScalarNode) and node.tag != _NULL_TAG and node.value != "":
            return str(node.value)
        self.error(node, field, "must be a text")
        return None

    def texts(self, node: _Node, field: str) -> list[tuple[_Node, str]]:
        """A text or a list of texts, each with its node (for the line of an error)."""
        items = node.value if isinstance(node, yaml.SequenceNode) else [node]
        if not items:
            self.error(node, field, "is an empty list")
        return [(n, t) for n in items if (t := self.text(n, field)) is not None]

    def field(self, node: _Node, label: str, use: str) -> _Field | None:
        text = self.text(node, label)
        if text is None:
            return None
        wire = wire_parser(*self.context) if self.context is not None else None
        try:
            f = parse_field(text, wire)
        except ValueError as exc:
            self.error(node, label, f"bad field {text!r}: {exc}")
            return None
        problem = _problem(f, use)
        if problem:
            self.error(node, label, problem)
            return None
        self.uses_wire = self.uses_wire or f.section == "wire"
        return f

    def section(self, node: _Node, label: str, write: bool) -> Section | None:
        text = self.text(node, label)
        if text is None:
            return None
        found = PROPERTIES if text == "property" else None
        if text.startswith("wire.") and self.context is not None:
            found = wire_section(*self.context, text[5:])
            self.uses_wire = True
        if found is None:
            self.error(node, label, f"{text!r} is not a section (property, or a wire section "
                                    "of the rule's one protocol and direction: wire.header)")
            return None
        if write and found.fixed:
            self.error(node, label, found.fixed)
            return None
        return found

    def rule(self, node: _Node, index: int) -> _Rule | None:
        where, before = f"mappings[{index}]", len(self.errors)
        self.into_body = self.uses_wire = False
        self.context = None
        optional = ("name", "replaces", "extends") if not self.is_default else ("name",)
        top = self.mapping(node, where, ("match", "steps"), optional)
        if top is None:
            return None
        line = node.start_mark.line + 1
        if self.is_default and "name" not in top:
            self.error(node, where, "a default rule has a name")
        name = (self.text(top["name"], f"{where}.name") if "name" in top else None) or (
            f"{self.file}:{line}")  # fmt: skip
        target: _Rule | None = None
        mode = "replaces" if "replaces" in top else "extends" if "extends" in top else None
        if "replaces" in top and "extends" in top:
            self.error(top["extends"], f"{where}.extends", "a rule replaces or extends, not both")
        elif mode is not None:
            tname = self.text(top[mode], f"{where}.{mode}")
            if tname is not None:
                target = self.defaults.get(tname)
                if target is None:
                    some = ", ".join(list(self.defaults)[:4])
                    self.error(top[mode], f"{where}.{mode}",
                               f"unknown default rule {tname!r} (they are named like {some}, …; "
                               "mappings/README.md lists them)")
        match = self.match(top["match"], f"{where}.match", target, mode is not None)
        if match is not None:
            protocols, directions = match[1], match[3]
            if protocols is not None and len(protocols) == 1 and len(directions) == 1:
                (protocol,), (direction,) = protocols, directions
                if protocol in WIRE_PROTOCOLS:
                    self.context = (protocol, direction)
        steps: list[tuple[Step, _Where]] = []
        kinds: list[str] = []
        may_be_empty = mode == "replaces"
        if not isinstance(top["steps"], yaml.SequenceNode) or (
                not top["steps"].value and not may_be_empty):
            self.error(top["steps"], f"{where}.steps", "must be a list of one or more steps"
                       + (" (or [] with replaces)" if not self.is_default else ""))
        else:
            for i, s in enumerate(top["steps"].value):
                made = self.step(s, f"{where}.steps[{i}]", name)
                steps.extend(made)
                if made:
                    kinds.append(made[0][1].step)
        if match is None or len(self.errors) > before:
            return None
        patterns, protocols, transports, directions, info = match
        info = {"name": name, "file": self.file, "line": line, "match": info,
                "steps": kinds}  # fmt: skip
        if target is not None:
            info[str(mode)] = target.info["name"]
        return _Rule(patterns, protocols, transports, directions, tuple(steps), self.into_body,
                     info, target.info["name"] if target is not None else None,
                     mode == "replaces", self.uses_wire)  # fmt: skip

    def match(self, node: _Node, where: str, target: _Rule | None, named: bool = False) -> Any:
        implied = ("direction",) if named else ()
        m = self.mapping(node, where, ("destination", *(("direction",) if not implied else ())),
                         ("protocol", "transport", *implied))  # fmt: skip
        if m is None:
            return None
        patterns: list[tuple[DestKind | None, str]] = []
        destinations = self.texts(m["destination"], f"{where}.destination")
        for n, text in destinations:
            prefixed = text.startswith(("topic:", "queue:"))
            kind, name = (text[:5], text[6:]) if prefixed else ("", text)
            try:
                validate_subject(name, wildcards=True, system=True)
                patterns.append((DestKind[kind.upper()] if kind else None, name))
            except GatewayError as exc:
                self.error(n, f"{where}.destination", str(exc))
        info: dict[str, Any] = {"destination": [t for _, t in destinations]}
        filters: list[frozenset[str] | None] = []
        for key in ("protocol", "transport"):
            values: list[str] = []
            for n, text in self.texts(m[key], f"{where}.{key}") if key in m else ():
                if key == "protocol" and text not in PROTOCOLS:
                    self.error(n, f"{where}.protocol",
                               f"unknown protocol {text!r} (one of {', '.join(PROTOCOLS)})")
                elif key == "transport" and not _TRANSPORT_NAME.fullmatch(text):
                    self.error(n, f"{where}.transport", f"invalid transport name {text!r}")
                values.append(text)
            filters.append(frozenset(values) if key in m else None)
            info[key] = values if key in m else None
        if target is not None:  # protocol and direction are the default rule's
            if filters[0] is not None and filters[0] != target.protocols:
                self.error(m["protocol"], f"{where}.protocol",
                           f"must be {', '.join(sorted(target.protocols or ()))} "
                           f"(that of {target.info['name']}) or left out")
            filters[0] = target.protocols
            info["protocol"] = sorted(target.protocols or ())
        direction = None
        if "direction" in m:
            direction = self.text(m["direction"], f"{where}.direction")
            if direction is not None and direction not in DIRECTIONS:
                self.error(m["direction"], f"{where}.direction",
                           f"must be in, out or both, not {direction!r}")  # fmt: skip
        if target is not None:
            (implied_direction,) = target.directions
            if direction is not None and direction != implied_direction:
                self.error(m["direction"], f"{where}.direction",
                           f"must be {implied_direction} (that of {target.info['name']}) "
                           "or left out")
            direction = implied_direction
        info["direction"] = direction
        directions = frozenset(("in", "out") if direction == "both" else (direction,))
        return tuple(patterns), filters[0], filters[1], directions, info

    def step(self, node: _Node, where: str, rule: str) -> list[tuple[Step, _Where]]:
        kinds = ", ".join(STEP_KINDS)
        if not isinstance(node, yaml.MappingNode) or len(node.value) != 1:
            self.error(node, where, f"a step is one key, its kind ({kinds}), with its arguments")
            return []
        key_node, args = node.value[0]
        kind = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else ""
        if kind not in STEP_KINDS:
            self.error(key_node, where, f"unknown step {kind!r} (one of {kinds})")
            return []
        label, line = f"{where}.{kind}", node.start_mark.line + 1

        def at(field: str) -> _Where:
            return _Where(rule, self.file, line, kind, field, self.is_default)

        if kind in ("drop", "require"):
            fields = [f for n, _ in self.texts(args, label) if (f := self.field(n, label, kind))]
            if kind == "require":
                return [(_step_require(f), at(f.text)) for f in fields]
            self.changes(*fields)
            return [(f.delete, at(f.text)) for f in fields]
        required, optional = _STEP_KEYS[kind]
        empty = isinstance(args, yaml.ScalarNode) and args.tag == _NULL_TAG and not required
        a = {} if empty else self.mapping(args, label, required, optional)
        if a is None:
            return []
        if kind == "decode_json":
            return [(_step_decode_json, at("body"))]
        if kind == "encode_json":
            form = self.text(a["as"], f"{label}.as") if "as" in a else "text"
            if form not in ("text", "bytes", None):
                self.error(a["as"], f"{label}.as", f"must be text or bytes, not {form!r}")
            return [(_step_encode_json(form != "bytes"), at("body"))]
        if kind == "convert":
            return self.convert(a, label, at)
        if kind == "copy_all":
            return self.copy_all(a, label, at)
        coerce = None
        if "type" in a:
            t = self.text(a["type"], f"{label}.type")
            if t not in TYPE_NAMES:
                if t is not None:
                    self.error(a["type"], f"{label}.type",
                               f"unknown type {t!r} (one of {', '.join(TYPE_NAMES)})")
                return []
            coerce = _coercer(t)
        if kind in ("set", "default", "set_type"):
            f = self.field(a["field"], f"{label}.field", kind if kind != "set" else "write")
            if f is None:
                return []
            self.changes(f)
            if kind == "set_type" and coerce is not None:
                return [(_step_set_type(f, coerce), at(f.text))]
            try:  # a constant is converted once, and tried on an empty message
                value = _check_constant(self.constructor.construct_object(a["value"], deep=True))
                value = coerce(value) if coerce is not None else value
                if f.section != "wire" and (f.section != "body" or not f.path):  # not below body
                    f.write(Message(), value)
            except (yaml.YAMLError, *_STEP_ERRORS) as exc:
                self.error(a["value"], f"{label}.value", f"cannot go in {f.text}: {exc}")
                return []
            return [(_step_set(f, value, kind == "default"), at(f.text))]
        moves = kind in ("move", "rename")
        src = self.field(a["from"], f"{label}.from", "move" if moves else "copy")
        dst = self.field(a["to"], f"{label}.to", "write")
        if src is None or dst is None:
            return []
        problem = ""
        if src.text == dst.text:
            problem = "from and to are the same field"
        elif kind == "lift" and (src.section != "body" or dst.section == "body"):
            problem = "lift takes a body field to a property or a header (else use copy or move)"
        elif kind == "rename" and not (
            src.section == dst.section == "property" or src.section == dst.section == "body"
            and src.path and dst.path and src.path[:-1] == dst.path[:-1]
            and type(src.path[-1]) is str and type(dst.path[-1]) is str
        ):  # fmt: skip
            problem = "rename gives a property or map field a new name in its place (else move)"
        if problem:
            self.error(node, label, problem)
            return []
        self.changes(dst, *([src] if kind in ("move", "rename") else []))
        made = _step_rename(src, dst) if kind == "rename" else _step_copy(
            src, dst, coerce, kind == "move")  # fmt: skip
        return [(made, at(f"{src.text} -> {dst.text}"))]

    def convert(self, a: dict[str, _Node], label: str,
                at: Callable[[str], _Where]) -> list[tuple[Step, _Where]]:
        """``convert: {from: F | [F…], to: T | [T…], via: NAME}``."""
        srcs = [self.field(n, f"{label}.from", "copy") for n, _ in self.texts(a["from"],
                                                                               f"{label}.from")]
        dsts = [self.field(n, f"{label}.to", "write") for n, _ in self.texts(a["to"],
                                                                             f"{label}.to")]
        via = self.text(a["via"], f"{label}.via")
        conv = CONVERTERS.get(via or "")
        if via is not None and (conv is None or conv.item):
            self.error(a["via"], f"{label}.via", f"unknown converter {via!r} (one of "
                       f"{', '.join(k for k, c in CONVERTERS.items() if not c.item)})")
            return []
        if conv is None or None in srcs or None in dsts or not srcs or not dsts:
            return []
        if (len(srcs), len(dsts)) != (conv.sources, conv.targets):
            self.error(a["via"], f"{label}.via", f"{via} reads {conv.sources} and writes "
                       f"{conv.targets} fields, not {len(srcs)} and {len(dsts)}")
            return []
        fields: list[_Field] = [f for f in (*srcs, *dsts) if f is not None]
        self.changes(*fields[len(srcs):])
        text = ", ".join(f.text for f in fields[:len(srcs)]) + " -> " + ", ".join(
            f.text for f in fields[len(srcs):])  # fmt: skip
        return [(_step_convert(fields[:len(srcs)], fields[len(srcs):], conv), at(text))]

    def copy_all(self, a: dict[str, _Node], label: str,
                 at: Callable[[str], _Where]) -> list[tuple[Step, _Where]]:
        """``copy_all: {from: SECTION, to: SECTION, except: [NAME…], via: NAME}``."""
        src = self.section(a["from"], f"{label}.from", False)
        dst = self.section(a["to"], f"{label}.to", True)
        skip = frozenset(t for _, t in self.texts(a["except"], f"{label}.except")) if (
            "except" in a) else frozenset()  # fmt: skip
        fn = None
        if "via" in a:
            via = self.text(a["via"], f"{label}.via")
            conv = CONVERTERS.get(via or "")
            if via is not None and (conv is None or not conv.item):
                self.error(a["via"], f"{label}.via", f"unknown item converter {via!r} (one of "
                           f"{', '.join(k for k, c in CONVERTERS.items() if c.item)})")
                return []
            fn = conv.fn if conv is not None else None
        if src is None or dst is None:
            return []
        if src is dst:
            self.error(a["to"], f"{label}.to", "from and to are the same section")
            return []
        return [(_step_copy_all(src, dst, skip, fn), at(f"{src.text} -> {dst.text}"))]


def _load_text(text: str, file: str, errors: list[ConfigError],
               defaults: dict[str, _Rule] | None = None,
               is_default: bool = False) -> list[_Rule]:  # fmt: skip
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        errors.append(ConfigError(file, line, f"not valid YAML: {exc.problem or exc.context}"))
        return []
    except yaml.YAMLError as exc:
        errors.append(ConfigError(file, None, f"not valid YAML: {exc}"))
        return []
    if root is None:
        return []  # an empty file
    loader = _Loader(file, errors, _default_rules() if defaults is None else defaults,
                     is_default)
    top = loader.mapping(root, "top level", ("mappings",))
    if top is None:
        return []
    if not isinstance(top["mappings"], yaml.SequenceNode):
        loader.error(top["mappings"], "mappings", "must be a list of rules")
        return []
    rules = (loader.rule(node, i) for i, node in enumerate(top["mappings"].value))
    return [r for r in rules if r is not None]


# -- the default mappings (package data) and the protocols' entry points -----------------------

_DEFAULTS: dict[str, _Rule] | None = None


def _default_rules() -> dict[str, _Rule]:
    """Every default rule by name, from ``mappings/defaults/<protocol>.yaml`` (loaded once)."""
    global _DEFAULTS
    if _DEFAULTS is None:
        errors: list[ConfigError] = []
        found: dict[str, _Rule] = {}
        for protocol in WIRE_PROTOCOLS:
            ref = resources.files("mappings") / "defaults" / f"{protocol}.yaml"
            text = ref.read_text(encoding="utf-8")
            for r in _load_text(text, f"defaults/{protocol}.yaml", errors, found, True):
                if r.info["name"] in found:
                    errors.append(ConfigError(r.info["file"], r.info["line"],
                                              f"rule {r.info['name']!r} named twice"))
                found[r.info["name"]] = r
        if errors:
            raise ConfigErrors(errors)  # a broken package: the tests load them
        _DEFAULTS = found
    return _DEFAULTS


def default_rules(protocol: str, direction: str) -> list[dict[str, Any]]:
    """The default rules of a protocol and direction, in order (name, file, line, steps)."""
    return [dict(r.info) for r in _default_rules().values()
            if protocol in (r.protocols or ()) and direction in r.directions]


def _work_copy(msg: Message, into_body: bool) -> Work:
    m: Work = _copy_message(msg, cls=Work)  # type: ignore[assignment]
    if into_body and (m.body_kind is _MAP or m.body_kind is _STREAM):
        m.body = _deep(m.body)
    return m


def _stomp_in(run: Callable[[Message], None]) -> Callable[..., Message]:
    """The interpreted ``stomp_to_message``."""

    def stomp_in(headers: dict[str, str], body: bytes, *, has_length: bool,
                 destination: Destination, reply_to: Destination | None,
                 now_ms: int) -> Message:  # fmt: skip
        m = Work()
        m.destination, m.reply_to = destination, reply_to
        m.w = StompIn(headers, body, has_length, now_ms)
        run(m)
        m.expires_at = 0  # a new message: the broker sets the effective expiry on publish
        m.size = len(body) + 64 + 48 * len(m.properties)  # as stomp_to_message estimates it
        out = _copy_message(m)
        out.size = m.size
        return out

    return stomp_in


def _stomp_out(run: Callable[[Message], None], into_body: bool
               ) -> Callable[..., tuple[list[tuple[str, str]], bytes]]:
    """The interpreted ``message_to_stomp``."""

    def stomp_out(msg: Message, *, destination: str, reply_to: str | None
                  ) -> tuple[list[tuple[str, str]], bytes]:
        m = _work_copy(msg, into_body)
        m.w = StompOut(destination, reply_to)
        run(m)
        result: tuple[list[tuple[str, str]], bytes] = m.w.finish()
        return result

    return stomp_out


def _mqtt_in(run: Callable[[Message], None]) -> Callable[..., Message]:
    """The interpreted ``mqtt_to_message``."""

    def mqtt_in(*, payload: bytes, qos: int, retain: bool, properties: dict[str, Any],
                level: int, destination: Destination, reply_to: Destination | None,
                now_ms: int) -> Message:  # fmt: skip
        m = Work()
        m.destination, m.reply_to = destination, reply_to
        m.w = MqttIn(payload, qos, retain, properties, level, now_ms)
        run(m)
        m.expires_at = 0  # a new message: the broker sets the effective expiry on publish
        m.size = len(payload) + 64 + 48 * len(m.properties)  # as mqtt_to_message estimates it
        out = _copy_message(m)
        out.size = m.size
        return out

    return mqtt_in


def _mqtt_out(run: Callable[[Message], None], into_body: bool) -> Callable[..., MqttOutTuple]:
    """The interpreted ``message_to_mqtt``."""

    def mqtt_out(msg: Message, *, level: int, now_ms: int,
                 reply_topic: str | None) -> MqttOutTuple:  # fmt: skip
        m = _work_copy(msg, into_body)
        m.w = MqttOut(level, now_ms, reply_topic)
        run(m)
        return MqttOutTuple(*m.w.finish())

    return mqtt_out


def _amqp_in(run: Callable[[Message], None]) -> Callable[..., Message]:
    """The interpreted ``amqp_to_message``."""

    def amqp_in(pm: Any, *, destination: Destination, default_kind: DestKind,
                now_ms: int) -> Message:  # fmt: skip
        m = Work()
        m.destination = destination
        m.w = AmqpIn(pm, default_kind, now_ms)
        run(m)
        m.expires_at = 0  # a new message: the broker sets the effective expiry on publish
        return _copy_message(m)

    return amqp_in


def _amqp_out(run: Callable[[Message], None], into_body: bool) -> Callable[..., Any]:
    """The interpreted ``message_to_amqp``: a ``proton.Message``."""

    def amqp_out(msg: Message, *, delivery_count: int, now_ms: int) -> Any:
        m = _work_copy(msg, into_body)
        record = m.properties.get(_amqp.TYPES_PROPERTY)
        m.w = AmqpOut(_parse_record(record) if type(record) is str else None,
                      delivery_count, now_ms)  # fmt: skip
        run(m)
        return m.w.finish()

    return amqp_out


# protocol → (fast in, fast out, interpreted in, interpreted out)
_PROTOCOLS: dict[str, tuple[Callable[..., Any], Callable[..., Any], Any, Any]] = {
    "stomp": (_stomp.stomp_to_message, _stomp.message_to_stomp, _stomp_in, _stomp_out),
    "mqtt": (_mqtt.mqtt_to_message, _mqtt.message_to_mqtt, _mqtt_in, _mqtt_out),
    "amqp": (_amqp.amqp_to_message, _amqp.message_to_amqp, _amqp_in, _amqp_out),
}


_FAST = {(p, d): fns[i] for p, fns in _PROTOCOLS.items() for i, d in enumerate(("in", "out"))}


class MappingSet:
    """The compiled rules of one or more mapping files, in order."""

    def __init__(self, rules: Sequence[_Rule] = (), *, cache_size: int = CACHE_SIZE) -> None:
        self._rules = tuple(rules)
        self._core = tuple(r for r in self._rules if r.target is None and not r.wire)
        self._wire = tuple(r for r in self._rules if r.target is not None or r.wire)
        self._cache: dict[tuple[Destination, str, str, str | None], Any] = {}
        self._wire_cache: dict[tuple[Destination, str, str, str | None], Any] = {}
        self._cache_size = cache_size

    @classmethod
    def load(cls, paths: Iterable[str | Path], *, cache_size: int = CACHE_SIZE) -> MappingSet:
        """Load the files, and the ``*.yaml`` files of the directories (by name), in order.

        Raises:
            ConfigErrors: every problem found, each as ``file:line: field: message``.
        """
        errors: list[ConfigError] = []
        rules: list[_Rule] = []
        for p in map(Path, paths):
            for f in sorted(p.glob("*.yaml")) if p.is_dir() else [p]:
                try:
                    text = f.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError) as exc:
                    errors.append(ConfigError(str(f), None, f"cannot read: {exc}"))
                    continue
                rules.extend(_load_text(text, str(f), errors))
        if errors:
            raise ConfigErrors(errors)
        return cls(rules, cache_size=cache_size)

    @classmethod
    def from_text(cls, text: str, filename: str = "<text>") -> MappingSet:
        """The rules of YAML ``text``; raises :class:`ConfigErrors` as :meth:`load` does."""
        errors: list[ConfigError] = []
        rules = _load_text(text, filename, errors)
        if errors:
            raise ConfigErrors(errors)
        return cls(rules)

    def _remember(self, cache: dict[Any, Any], key: Any, fn: Any) -> None:
        if len(cache) >= self._cache_size:
            for k in list(islice(cache, (len(cache) + 1) // 2)):  # drop the older half
                del cache[k]
        if self._cache_size:
            cache[key] = fn

    def compile_for(self, destination: Destination, *, protocol: str, direction: str,
                    transport: str | None = None) -> Callable[[Message], Message] | None:
        """The core-side rules' function for ``destination``, or ``None`` if none matches.

        ``protocol``: the adapter's or transport's (``mqtt``, ``amqp``, ``stomp``, ``rv``,
        ``inproc``). ``direction``: ``in`` (after the protocol's default mapping into the core)
        or ``out`` (before the default mapping out of it). ``transport``: the
        ``transports.conf`` name, ``None`` for an adapter's client. The function returns a new
        message, leaves its argument alone, and raises :class:`MappingFailed`. Cached per key
        (a hit is one dict lookup). Rules that replace or extend a default rule, or address
        wire fields, are not in it: :meth:`wire_for` applies them.
        """
        key = (destination, protocol, direction, transport)
        fn = self._cache.get(key, _MISSING)
        if fn is not _MISSING:
            return fn  # type: ignore[no-any-return]
        if protocol not in PROTOCOLS or direction not in ("in", "out"):
            raise ValueError(f"unknown protocol {protocol!r} or direction {direction!r}")
        rules = [r for r in self._core if r.matches(destination, protocol, direction, transport)]
        steps = tuple(s for r in rules for s in r.steps)
        fn = _run_steps(steps, any(r.into_body for r in rules)) if steps else None
        self._remember(self._cache, key, fn)
        return fn

    def wire_for(self, destination: Destination, *, protocol: str, direction: str,
                 transport: str | None = None, fast: bool = True) -> Callable[..., Any]:
        """The wire side of the mapping of ``destination``: ``protocol``'s wire form ⇄ core.

        The function has the signature of the protocol's hand-written mapping
        (``stomp_to_message`` / ``message_to_stomp``, ``mqtt_to_message`` /
        ``message_to_mqtt``) and is
        that function when no user rule replaces or extends a default rule or addresses a
        wire field for this key; else it runs the default rules so changed, then the user
        rules that address wire fields. The core-side rules are not in it: the caller applies
        :meth:`compile_for`'s function after it (``in``) or before it (``out``), as with the
        hand-written mapping. It raises the hand-written mapping's errors for the default
        rules' failures and :class:`MappingFailed` for the user rules'. ``fast=False``: the
        interpreted rules even without a user rule (the tests compare the two); not cached.
        """
        if fast and not self._wire:  # no user rule on the wire side at all
            fn = _FAST.get((protocol, direction))
            if fn is not None:
                return fn
        key = (destination, protocol, direction, transport)
        if fast:
            fn = self._wire_cache.get(key)
            if fn is not None:
                return fn  # type: ignore[no-any-return]
        if protocol not in _PROTOCOLS or direction not in ("in", "out"):
            raise ValueError(f"no wire mapping for protocol {protocol!r} direction {direction!r}")
        fast_in, fast_out, interpreted_in, interpreted_out = _PROTOCOLS[protocol]
        rules = [r for r in self._wire if r.matches(destination, protocol, direction, transport)]
        if fast and not rules:
            fn = fast_in if direction == "in" else fast_out
        else:
            run = _runner(_pipeline(rules, protocol, direction))
            into_body = any(r.into_body for r in rules)
            fn = interpreted_in(run) if direction == "in" else interpreted_out(run, into_body)
        if fast:
            self._remember(self._wire_cache, key, fn)
        return fn

    def apply(self, msg: Message, *, protocol: str, direction: str,
              transport: str | None = None) -> Message:
        """``msg`` through the core-side rules that match its destination (itself when none).

        Raises:
            MappingFailed: a step failed; the message is refused (in) or not sent (out).
        """
        dest = msg.destination
        if dest is None or not self._core:
            return msg
        fn = self.compile_for(dest, protocol=protocol, direction=direction, transport=transport)
        return msg if fn is None else fn(msg)

    def rules(self) -> list[dict[str, Any]]:
        """Each rule's name, file, line, match and step kinds (and what it ``replaces`` or
        ``extends``), in order (for the admin API)."""
        return [dict(r.info) for r in self._rules]

    def __len__(self) -> int:
        return len(self._rules)

    @property
    def cache_len(self) -> int:
        return len(self._cache)


def _pipeline(rules: Sequence[_Rule], protocol: str, direction: str
              ) -> tuple[tuple[Step, _Where], ...]:
    """The steps of a protocol's default rules for one direction, each replaced or extended by
    the user ``rules`` that name it, then the user rules that address wire fields."""
    replaced: dict[str, list[_Rule]] = {}
    extended: dict[str, list[_Rule]] = {}
    for r in rules:
        if r.target is not None:
            (replaced if r.replaces else extended).setdefault(r.target, []).append(r)
    steps: list[tuple[Step, _Where]] = []
    for d in _default_rules().values():
        if protocol not in (d.protocols or ()) or direction not in d.directions:
            continue
        name = d.info["name"]
        by = replaced.get(name)
        steps.extend(d.steps if by is None else [s for r in by for s in r.steps])
        steps.extend(s for r in extended.get(name, ()) for s in r.steps)
    steps.extend(s for r in rules if r.target is None for s in r.steps)
    return tuple(steps)
