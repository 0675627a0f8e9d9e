"""Named converters: the conversions of the default mappings that are more than a rename or a
JMS type conversion, referenced from YAML as ``convert: {from: …, to: …, via: NAME}`` (and
``copy_all: {…, via: NAME}``).

How this works. Each converter is a plain function ``fn(msg, *values)`` registered in
:data:`CONVERTERS` with how many fields it reads (``from``) and writes (``to``); the loader
checks both counts. The values are the fields' values (``None`` when absent); the answer is
one value per target, :data:`~mappings.fields.SKIP` for "write nothing". The rules themselves
are the protocol mapping modules' own functions (:mod:`mappings.stomp`,
:mod:`mappings.mqtt`), so the fast path
(``stomp_to_message`` / ``message_to_stomp``) and the rules share one definition of each.
Converters that collect ``gw-types`` entries append them to the outgoing wire form's
``types``. Every converter is listed, with what it does, in ``mappings/README.md``
("Converters").
"""

from __future__ import annotations

from typing import Any

from gateway.message import DEFAULT_PRIORITY, BodyKind, DeliveryMode, Message
from mappings import mqtt, stomp
from mappings.fields import SKIP, Body, Converter
from mappings.mqtt import render_properties
from mappings.wire import TYPES_MARK

__all__ = ["CONVERTERS"]

_PERSISTENT, _NON_PERSISTENT = DeliveryMode.PERSISTENT, DeliveryMode.NON_PERSISTENT


def _types(m: Any) -> list[str]:
    """The gw-types entries the outgoing wire form collects (converters append to them)."""
    types: list[str] = m.w.types
    return types


# -- STOMP, in ---------------------------------------------------------------------------------


def _stomp_body_in(m: Message, body: bytes, transformation: str | None,
                   content_type: str | None, has_length: bool) -> Body:
    return Body(*stomp.body_in(body, transformation, content_type, bool(has_length)))


def _stomp_content_type_in(m: Message, content_type: str | None, kind: str) -> Any:
    if content_type is None or not stomp.content_type_kept(content_type, BodyKind[kind]):
        return SKIP
    return content_type


def _stomp_types_in(m: Message, types: str | None, props: dict[str, Any], correlation: Any,
                    msg_type: str | None, trace: str | None) -> tuple[Any, ...]:
    if not types:
        return SKIP, SKIP, SKIP, SKIP
    props, correlation, msg_type, trace = stomp.apply_header_types(
        types, props, correlation, msg_type, trace)
    return (props, SKIP if correlation is None else correlation,
            SKIP if msg_type is None else msg_type, SKIP if trace is None else trace)


def _stomp_persistent_in(m: Message, text: str | None) -> DeliveryMode:
    return _PERSISTENT if text is not None and text.lower() == "true" else _NON_PERSISTENT


def _stomp_priority_in(m: Message, text: str | None) -> Any:
    return SKIP if text is None else stomp.priority_in(text)


def _stomp_expires_in(m: Message, text: str | None) -> Any:
    return SKIP if text is None else stomp.expires_in(text)


def _stomp_delay_in(m: Message, text: str | None, now: int) -> Any:
    return SKIP if text is None else stomp.delivery_time_in(text, now)


# -- STOMP, out --------------------------------------------------------------------------------


def _stomp_body_out(m: Message, kind: str, body: Any, content_type: Any) -> tuple[Any, ...]:
    payload, ct, transformation = stomp.body_out(
        BodyKind[kind], body, content_type if type(content_type) is str else None)
    return payload, SKIP if ct is None else ct, SKIP if transformation is None else transformation


def _stomp_persistent_out(m: Message, mode: str) -> Any:
    return "true" if mode == "PERSISTENT" else SKIP


def _ms_text(m: Message, ms: int | None) -> Any:
    return str(int(ms)) if ms else SKIP


def _stomp_correlation_out(m: Message, corr: str | bytes | None) -> Any:
    return SKIP if corr is None else stomp.correlation_out(corr, _types(m))


def _stomp_text_out(m: Message, name: str, text: Any) -> Any:
    return SKIP if text is None else stomp.text_out(name, str(text), _types(m))


def _typed_text(m: Message, name: str, value: Any) -> Any:
    pairs: list[tuple[str, str]] = []
    render_properties(pairs, _types(m), {name: value}, frozenset())
    return pairs[0]


def _gw_types(m: Message, types: list[str]) -> Any:
    return TYPES_MARK


# -- MQTT, in ---------------------------------------------------------------------------------


def _mqtt_body_in(m: Message, payload: bytes, pfi: int | None, content_type: str | None) -> Body:
    if type(payload) is not bytes:
        payload = bytes(payload)
    return Body(*mqtt.body_in(payload, pfi, content_type))


def _mqtt_expiry_in(m: Message, interval: int | None, now: int) -> Any:
    return SKIP if interval is None else now + interval * 1000


def _mqtt_user_headers_in(m: Message, types: str | None, jms_type: str | None,
                          jms_priority: str | None, trace: str | None,
                          props: dict[str, Any]) -> tuple[Any, ...]:
    if types is None and jms_type is None and jms_priority is None and trace is None:
        return SKIP, SKIP, SKIP, SKIP
    props, msg_type, priority, trace_id = mqtt.user_headers_in(
        props, types, jms_type, jms_priority, trace)
    return (props, SKIP if msg_type is None else msg_type,
            SKIP if priority is None else priority, SKIP if trace_id is None else trace_id)


def _mqtt_retain_in(m: Message, retain: bool | None) -> Any:
    return True if retain else SKIP


def _mqtt_mode_in(m: Message, qos: int) -> DeliveryMode:
    return mqtt.mode_in(qos)


# -- MQTT, out --------------------------------------------------------------------------------


def _mqtt_body_out(m: Message, kind: str, body: Any) -> tuple[Any, ...]:
    payload, utf8, json_body = mqtt.body_out(BodyKind[kind], body)
    return payload, 1 if utf8 else SKIP, mqtt.JSON_CONTENT_TYPE if json_body else SKIP


def _mqtt_qos_out(m: Message, qos: Any, mode: str) -> int:
    return mqtt.qos_out(qos, DeliveryMode[mode])


def _mqtt_content_type_out(m: Message, content_type: Any, kind: str) -> Any:
    if type(content_type) is not str or kind in ("MAP", "STREAM"):
        return SKIP
    return content_type


def _mqtt_expiry_out(m: Message, expires: int | None, now: int) -> Any:
    return mqtt.expiry_out(expires, now) if expires else SKIP


def _mqtt_correlation_out(m: Message, corr: str | bytes | None) -> Any:
    if corr is None:
        return SKIP
    return corr if isinstance(corr, bytes) else corr.encode("utf-8", "surrogatepass")


def _mqtt_text_out(m: Message, name: str, text: Any) -> Any:
    return SKIP if text is None else mqtt.header_text_out(name, str(text), _types(m))


def _mqtt_priority_out(m: Message, priority: int) -> Any:
    return SKIP if priority == DEFAULT_PRIORITY else str(int(priority))


# name → converter; `named` converters get the target's last name (a header) before the values.
CONVERTERS: dict[str, Converter] = {
    "stomp-body-in": Converter(_stomp_body_in, 4, 1),
    "stomp-content-type-in": Converter(_stomp_content_type_in, 2, 1),
    "stomp-gw-types-in": Converter(_stomp_types_in, 5, 4),
    "stomp-persistent-in": Converter(_stomp_persistent_in, 1, 1),
    "stomp-priority-in": Converter(_stomp_priority_in, 1, 1),
    "stomp-expires-in": Converter(_stomp_expires_in, 1, 1),
    "stomp-delay-in": Converter(_stomp_delay_in, 2, 1),
    "stomp-body-out": Converter(_stomp_body_out, 3, 3),
    "stomp-persistent-out": Converter(_stomp_persistent_out, 1, 1),
    "ms-text": Converter(_ms_text, 1, 1),
    "stomp-correlation-out": Converter(_stomp_correlation_out, 1, 1),
    "stomp-text-out": Converter(_stomp_text_out, 1, 1, named=True),
    "typed-text": Converter(_typed_text, 0, 0, item=True),
    "gw-types-out": Converter(_gw_types, 1, 1),
    "mqtt-body-in": Converter(_mqtt_body_in, 3, 1),
    "mqtt-expiry-in": Converter(_mqtt_expiry_in, 2, 1),
    "mqtt-user-headers-in": Converter(_mqtt_user_headers_in, 5, 4),
    "mqtt-retain-in": Converter(_mqtt_retain_in, 1, 1),
    "mqtt-mode-in": Converter(_mqtt_mode_in, 1, 1),
    "mqtt-body-out": Converter(_mqtt_body_out, 2, 3),
    "mqtt-qos-out": Converter(_mqtt_qos_out, 2, 1),
    "mqtt-content-type-out": Converter(_mqtt_content_type_out, 2, 1),
    "mqtt-expiry-out": Converter(_mqtt_expiry_out, 2, 1),
    "mqtt-correlation-out": Converter(_mqtt_correlation_out, 1, 1),
    "mqtt-text-out": Converter(_mqtt_text_out, 1, 1, named=True),
    "mqtt-priority-out": Converter(_mqtt_priority_out, 1, 1),
}
