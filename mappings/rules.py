"""Loading the declarative mappings: YAML rule files → rules, every error with file, line
and field; and the default mappings (``mappings/defaults/<protocol>.yaml``), loaded once.

How this works. Loading composes the YAML into nodes, checks each rule's ``match`` and each
step's fields and values, parses every field path once (:mod:`mappings.fields`, and
:mod:`mappings.wire` for a protocol's own ``wire.…`` form) and turns every step into a small
closure ``step(msg)`` with where it came from (:class:`_Where`); :mod:`mappings.engine` runs
them and answers the adapters and transports. ``mappings/README.md`` ("Declarative mappings
(YAML)") documents the format.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any, NamedTuple

import yaml

from gateway.errors import ConfigError, ConfigErrors, GatewayError
from gateway.message import Destination, DestKind, Message
from gateway.subject import matches as subject_matches
from gateway.subject import validate as validate_subject
from gateway.types import MAX_NESTING as _MAX_NESTING
from gateway.types import Int64, UInt64
from mappings.converters import CONVERTERS
from mappings.fields import (
    _ALWAYS_SET,
    _READ_ONLY,
    _STEP_ERRORS,
    PROPERTIES,
    TYPE_NAMES,
    Section,
    Step,
    _coercer,
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
from mappings.wire import WIRE_PROTOCOLS, wire_parser, wire_section

__all__ = ["DIRECTIONS", "PROTOCOLS", "STEP_KINDS", "default_rules"]

PROTOCOLS = ("mqtt", "amqp", "stomp", "rv", "inproc")
DIRECTIONS = ("in", "out", "both")
STEP_KINDS = (
    "decode_json", "encode_json", "lift", "copy", "move", "rename", "set", "default",
    "set_type", "drop", "require", "convert", "copy_all",
)  # fmt: skip
_TRANSPORT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # as a transports.conf section


class _Where(NamedTuple):
    rule: str
    file: str
    line: int
    step: str
    field: str
    raw: bool = False  # a default rule's step: its error is the protocol mapping's own


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


# -- the default mappings (package data) -------------------------------------------------------

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
