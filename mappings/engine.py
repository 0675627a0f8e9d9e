"""The declarative mapping engine: YAML rules compiled once into plain functions.

How this works. A mapping file is a list of *rules*; each rule has a ``match`` (destination
patterns, the direction, and optionally protocols and transports) and a list of ``steps``
(``decode_json``, ``lift``, ``copy``, ``move``, ``rename``, ``set``, ``default``, ``set_type``,
``drop``, ``require``, ``encode_json``, ``convert``, ``copy_all``). Loading composes the YAML
into nodes (so every error names file, line and field), parses every field path once
(:mod:`mappings.fields`, and :mod:`mappings.wire` for a protocol's own ``wire.…`` form) and
turns every step into a small closure ``step(msg)``; nothing is parsed per message. Loading
is :mod:`mappings.rules`; this module runs the rules and answers the callers.

Two kinds of rule files. The *default mappings* (``mappings/defaults/<protocol>.yaml``, in the
package) are the protocol mappings themselves: one named rule per row of the protocol's
tables, reading one side (the wire form, or the core message) and writing the other.
*User rules* (``<config dir>/mappings/*.yaml``, files in name order) change messages on the
core side, and may also replace (``replaces:``) or extend (``extends:``) a default rule, or
read and write ``wire.…`` fields, for the destinations and transports they match.

Callers. :meth:`MappingSet.wire_for` gives an adapter or transport the whole mapping of one
destination, protocol, direction and transport as a function with the signature of the
protocol's hand-written mapping (``stomp_to_message`` …): :func:`default_wire` (the
hand-written function itself, the fast path, which tests prove equal to the default rules)
when no user rule matches, the
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

import logging
from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

from gateway.errors import ConfigError, ConfigErrors, GatewayError
from gateway.message import DeliveryMode, Destination, DestKind, Message
from mappings import amqp as _amqp
from mappings import mqtt as _mqtt
from mappings import rv as _rv
from mappings import stomp as _stomp
from mappings.amqp_values import _parse_record
from mappings.fields import (
    _MAP,
    _STEP_ERRORS,
    _STREAM,
    Step,
    _copy_message,
    _deep,
)
from mappings.mqtt import MqttOut as MqttOutTuple
from mappings.rows import is_fast, why_not_fast
from mappings.rules import (  # loading (YAML → rules) and the default rules
    PROTOCOLS,
    _default_rules,
    _load_text,
    _Rule,
    _Where,
)
from mappings.wire import (
    AmqpIn,
    AmqpOut,
    MqttIn,
    MqttOut,
    RvIn,
    RvOut,
    StompIn,
    StompOut,
    Work,
)

__all__ = ["MappingFailed", "MappingSet", "_copy_message", "default_wire", "log_deliveries"]

CACHE_SIZE = 4096  # compile_for / wire_for keys (destination, protocol, direction, transport)
_MISSING: Any = object()


_ADAPTER_PROTOCOLS = frozenset({"mqtt", "amqp", "stomp"})  # Connection.protocol of adapters


def log_deliveries(broker: Any) -> None:
    """Let the broker's delivery log name the ``out`` rules an adapter runs on a delivery
    (``rules`` of a ``deliver``/``redeliver`` record, docs/delivery-log.md), when the
    gateway has mappings; called by each adapter as it starts listening."""
    mappings = broker.mappings
    dlog = broker.dlog
    if (mappings is not None and mappings.has_core_rules and broker.log_enabled
            and dlog.delivered_as is None):
        dlog.delivered_as = mappings.delivered_as(broker.connections)


class MappingFailed(GatewayError):
    """A rule could not be applied to a message; the caller's message was not changed.

    ``str()`` is ``mapping 'RULE' (FILE:LINE) STEP FIELD: DETAIL``; each part is an attribute.
    """

    reason = "mapping-failed"

    def __init__(self, rule: str, file: str, line: int, step: str, field: str, detail: str):
        self.rule, self.file, self.line = rule, file, line
        self.step, self.field, self.detail = step, field, detail
        super().__init__(f"mapping {rule!r} ({file}:{line}) {step} {field}: {detail}")


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


def _rv_in(run: Callable[[Message], None]) -> Callable[..., Message]:
    """The interpreted ``rv_to_message``."""

    def rv_in(rv: Any, *, destination: Destination, reply_to: Destination | None,
              delivery_mode: DeliveryMode = DeliveryMode.NON_PERSISTENT,
              now_ms: int) -> Message:  # fmt: skip
        m = Work()
        m.destination, m.reply_to = destination, reply_to
        m.w = RvIn(rv, delivery_mode, now_ms)
        run(m)
        m.expires_at = 0  # a new message: the broker sets the effective expiry on publish
        return _copy_message(m)

    return rv_in


def _rv_out(run: Callable[[Message], None], into_body: bool) -> Callable[..., Any]:
    """The interpreted ``message_to_rv``: a ``transports.rv.Message``."""

    def rv_out(msg: Message, *, send_subject: str, reply_subject: str | None,
               export_headers: bool = True, export_properties: bool = True) -> Any:
        m = _work_copy(msg, into_body)
        m.w = RvOut(_rv.RvMessage(send_subject, reply_subject), export_headers,
                    export_properties)  # fmt: skip
        run(m)
        return m.w.rv

    return rv_out


# protocol → (fast in, fast out, interpreted in, interpreted out)
_PROTOCOLS: dict[str, tuple[Callable[..., Any], Callable[..., Any], Any, Any]] = {
    "stomp": (_stomp.stomp_to_message, _stomp.message_to_stomp, _stomp_in, _stomp_out),
    "mqtt": (_mqtt.mqtt_to_message, _mqtt.message_to_mqtt, _mqtt_in, _mqtt_out),
    "amqp": (_amqp.amqp_to_message, _amqp.message_to_amqp, _amqp_in, _amqp_out),
    "rv": (_rv.rv_to_message, _rv.message_to_rv, _rv_in, _rv_out),
}


log = logging.getLogger("gateway.mappings")
_DEFAULT_WIRE: dict[tuple[str, str], Callable[..., Any]] = {}


def default_wire(protocol: str, direction: str) -> Callable[..., Any]:
    """The default wire mapping of ``protocol`` and ``direction``: its hand-written fast path
    when the default rows are the ones it is written for (:func:`mappings.rows.is_fast`; the
    tests prove the two agree), else the engine running the rows, which is logged once. A
    changed default row is so right at once, and fast again when its fast path follows it.

    Raises:
        ValueError: no such protocol or direction.
    """
    fn = _DEFAULT_WIRE.get((protocol, direction))
    if fn is None:
        if protocol not in _PROTOCOLS or direction not in ("in", "out"):
            raise ValueError(f"no wire mapping for protocol {protocol!r} direction "
                             f"{direction!r}")
        fast_in, fast_out, interpreted_in, interpreted_out = _PROTOCOLS[protocol]
        why = why_not_fast(protocol, direction)
        if why is None:
            fn = fast_in if direction == "in" else fast_out
        else:
            log.warning("the default %s mapping (%s) runs on the engine, not its fast path: %s",
                        protocol, direction, why)
            run = _runner(_pipeline((), protocol, direction))
            fn = interpreted_in(run) if direction == "in" else interpreted_out(run, False)
        _DEFAULT_WIRE[protocol, direction] = fn
    return fn


class MappingSet:
    """The compiled rules of one or more mapping files, in order."""

    def __init__(self, rules: Sequence[_Rule] = (), *, cache_size: int = CACHE_SIZE) -> None:
        self._rules = tuple(rules)
        self._core = tuple(r for r in self._rules if r.target is None and not r.wire)
        self._wire = tuple(r for r in self._rules if r.target is not None or r.wire)
        self._cache: dict[tuple[Destination, str, str, str | None], Any] = {}
        self._wire_cache: dict[tuple[Destination, str, str, str | None], Any] = {}
        self._default_wire: dict[tuple[Destination, str, str, str | None], bool] = {}
        self._names: dict[tuple[Destination, str, str, str | None], Any] = {}
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

    def rule_names(self, destination: Destination | None, *, protocol: str, direction: str,
                   transport: str | None = None) -> str | None:
        """The names of the core-side rules :meth:`compile_for` runs for this key, in the
        order they run, joined by ``,`` (a rule without a ``name`` is named ``file:line``);
        None when none matches. The delivery log's ``rules`` (docs/delivery-log.md). Cached
        per key."""
        if destination is None:
            return None
        key = (destination, protocol, direction, transport)
        names = self._names.get(key, _MISSING)
        if names is _MISSING:
            found = [str(r.info["name"]) for r in self._core
                     if r.matches(destination, protocol, direction, transport)]
            names = ",".join(found) if found else None
            self._remember(self._names, key, names)
        return names  # type: ignore[no-any-return]

    def delivered_as(self, connections: dict[str, Any]
                     ) -> Callable[[Message, str | None], tuple[Message, str] | None]:
        """For the delivery log (:attr:`gateway.dlog.DeliveryLog.delivered_as`): given a
        message delivered to the connection with id ``client`` (one of ``connections``), the
        copy this set's core-side ``out`` rules make of it for that connection's protocol
        (MQTT, AMQP, STOMP: the adapters apply them after the core has written its
        ``deliver`` record) and their names (:meth:`rule_names`); None when no rule matches
        or one fails (the adapter then refuses the delivery). A transport's deliveries are
        not its concern: its ``export`` record names the rules (``transports/base.py``)."""

        def delivered_as(msg: Message, client: str | None) -> tuple[Message, str] | None:
            conn = connections.get(client) if client is not None else None
            if conn is None:
                return None
            protocol = conn.protocol
            if protocol not in _ADAPTER_PROTOCOLS:
                return None
            names = self.rule_names(msg.destination, protocol=protocol, direction="out")
            if names is None:
                return None
            try:
                return self.apply(msg, protocol=protocol, direction="out"), names
            except MappingFailed:
                return None

        return delivered_as

    def wire_for(self, destination: Destination, *, protocol: str, direction: str,
                 transport: str | None = None, fast: bool = True) -> Callable[..., Any]:
        """The wire side of the mapping of ``destination``: ``protocol``'s wire form ⇄ core.

        The function has the signature of the protocol's hand-written mapping
        (``stomp_to_message`` / ``message_to_stomp``, ``mqtt_to_message`` /
        ``message_to_mqtt``, ``amqp_to_message`` / ``message_to_amqp``, ``rv_to_message`` /
        ``message_to_rv``) and is
        that function when no user rule replaces or extends a default rule or addresses a
        wire field for this key; else it runs the default rules so changed, then the user
        rules that address wire fields. The core-side rules are not in it: the caller applies
        :meth:`compile_for`'s function after it (``in``) or before it (``out``), as with the
        hand-written mapping. It raises the hand-written mapping's errors for the default
        rules' failures and :class:`MappingFailed` for the user rules'. ``fast=False``: the
        interpreted rules even without a user rule (the tests compare the two); not cached.
        """
        if fast and not self._wire:  # no user rule on the wire side at all
            return default_wire(protocol, direction)
        key = (destination, protocol, direction, transport)
        if fast:
            fn = self._wire_cache.get(key)
            if fn is not None:
                return fn  # type: ignore[no-any-return]
        if protocol not in _PROTOCOLS or direction not in ("in", "out"):
            raise ValueError(f"no wire mapping for protocol {protocol!r} direction {direction!r}")
        _, _, interpreted_in, interpreted_out = _PROTOCOLS[protocol]
        rules = [r for r in self._wire if r.matches(destination, protocol, direction, transport)]
        if fast and not rules:
            fn = default_wire(protocol, direction)
        else:
            run = _runner(_pipeline(rules, protocol, direction))
            into_body = any(r.into_body for r in rules)
            fn = interpreted_in(run) if direction == "in" else interpreted_out(run, into_body)
        if fast:
            self._remember(self._wire_cache, key, fn)
        return fn

    def wire_is_default(self, destination: Destination, *, protocol: str, direction: str,
                        transport: str | None = None) -> bool:
        """Whether :meth:`wire_for` gives the protocol's hand-written mapping for this key
        unchanged: no user rule replaces or extends a default rule, or addresses a wire field,
        here. A caller with a faster codec for the default mapping (``mappings.amqp_fast``)
        may use it exactly when this is True. Cached per key as :meth:`wire_for` is."""
        if not is_fast(protocol, direction):  # the engine runs the default rows
            return False
        if not self._wire:  # no user rule on the wire side at all
            return True
        key = (destination, protocol, direction, transport)
        default = self._default_wire.get(key)
        if default is None:
            default = not any(r.matches(destination, protocol, direction, transport)
                              for r in self._wire)
            self._remember(self._default_wire, key, default)
        return default

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
    def has_core_rules(self) -> bool:
        """Whether any rule works on the core-side message (not only on a wire form)."""
        return bool(self._core)

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
