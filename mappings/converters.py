"""Named converters: the conversions of the default mappings that are more than a rename or a
JMS type conversion, referenced from YAML as ``convert: {from: …, to: …, via: NAME}`` (and
``copy_all: {…, via: NAME}``).

How this works. Each converter is a plain function ``fn(msg, *values)`` registered in
:data:`CONVERTERS` with how many fields it reads (``from``) and writes (``to``); the loader
checks both counts. The values are the fields' values (``None`` when absent); the answer is
one value per target, :data:`~mappings.fields.SKIP` for "write nothing". The rules themselves
are the protocol mapping modules' own functions (:mod:`mappings.stomp`,
:mod:`mappings.mqtt`, :mod:`mappings.amqp`, :mod:`mappings.rv`), so the fast path
(``stomp_to_message`` / ``message_to_stomp`` …) and the rules share one definition of each.
The AMQP converters also read and write the types record of the wire form (``m.w.tree``,
``m.w.marks``).
Converters that collect ``gw-types`` entries append them to the outgoing wire form's
``types``. Every converter is listed, with what it does, in ``mappings/README.md``
("Converters").
"""

from __future__ import annotations

from typing import Any

import cproton

from gateway.message import DEFAULT_PRIORITY, BodyKind, DeliveryMode, Destination, Message
from mappings import amqp, amqp_values, mqtt, rv, stomp
from mappings.fields import SKIP, Body, Converter, Kept
from mappings.typedtext import JSON_CONTENT_TYPE, render_properties
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


def _mqtt_user_record_in(m: Message, pairs: list[tuple[str, str]] | None) -> Any:
    record = mqtt.user_record_in(pairs)
    return SKIP if record is None else record


def _mqtt_retain_in(m: Message, retain: bool | None) -> Any:
    return True if retain else SKIP


def _mqtt_mode_in(m: Message, qos: int) -> DeliveryMode:
    return mqtt.mode_in(qos)


# -- MQTT, out --------------------------------------------------------------------------------


def _mqtt_body_out(m: Message, kind: str, body: Any, pfi: Any, qos: Any) -> tuple[Any, ...]:
    payload, utf8, json_body = mqtt.body_out(BodyKind[kind], body)
    indicator = mqtt.pfi_out(utf8, json_body, pfi, qos)
    return (payload, SKIP if indicator is None else indicator,
            JSON_CONTENT_TYPE if json_body else SKIP)


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


def _mqtt_message_id_out(m: Message, message_id: Any, qos: Any) -> Any:
    text = mqtt.message_id_out(None if message_id is None else str(message_id), qos, _types(m))
    return SKIP if text is None else text


def _mqtt_user_record_out(m: Message, record: Any, pairs: list[tuple[str, Any]]) -> Any:
    if record is None or _types(m):  # a typed property is there: the record cannot agree
        return SKIP
    recorded = mqtt.user_record_out(record, pairs)
    return SKIP if recorded is None else recorded


def _mqtt_priority_out(m: Message, priority: int) -> Any:
    return SKIP if priority == DEFAULT_PRIORITY else str(int(priority))


# -- AMQP 1.0, in -----------------------------------------------------------------------------


def _amqp_property_in(m: Any, name: Any, value: Any) -> Any:
    item = amqp.property_in(m.properties, name, value, m.w.tree, m.w.marks)
    return SKIP if item is None else item


def _amqp_body_in(m: Any, body: Any, section: str | None, content_type: Any,
                  msg_type: Any) -> Body:  # fmt: skip
    code = amqp.SECTION_CODES.get(section, 0) if section is not None else 0
    return Body(*amqp.body_in(body, code, content_type, msg_type, m.w.tree, m.w.marks))


def _amqp_mode_in(m: Message, durable: Any, gw_mode: Any) -> DeliveryMode:
    return amqp.mode_in(durable, gw_mode)


def _skip_none(v: Any) -> Any:
    return SKIP if v is None else v


def _amqp_user_id_in(m: Message, user_id: bytes | None) -> Any:
    value = amqp.user_id_in(user_id)
    return SKIP if value is None else Kept(value)  # bytes when it is not UTF-8


def _amqp_string_in(m: Message, text: Any) -> Any:
    return SKIP if text is None else str(text)


def _amqp_group_sequence_in(m: Message, seq: int | None) -> Any:
    return _skip_none(amqp.group_seq_in(seq))


def _amqp_content_type_in(m: Message, content_type: Any, kind: str) -> Any:
    return _skip_none(amqp.content_type_in(content_type, BodyKind[kind]))


def _kept_ms(ms: int) -> Any:
    return Kept(int(ms)) if ms else SKIP  # AMQP times are signed: kept before 1970 too


def _amqp_delivery_time_in(m: Message, time: Any, delay: Any, now: int) -> Any:
    return _kept_ms(amqp.delivery_time_in(time, delay, now))


def _amqp_time_in(m: Message, ms: Any) -> Any:
    return SKIP if ms is None else _kept_ms(ms)


def _amqp_trace_id_in(m: Any, value: Any) -> Any:
    return _skip_none(amqp.trace_id_in(value, m.w.tree))


def _amqp_annotation_in(m: Any, key: Any, value: Any) -> Any:
    w = m.w
    if amqp.annotation_consumed(key, value, w.section, m.body_kind, w.pm.body,
                                cproton.pn_message_is_durable(w.raw)):  # fmt: skip
        return SKIP
    item = amqp.annotation_in(m.properties, amqp.MA_PREFIX, key, value, w.tree, w.marks)
    return SKIP if item is None else item


def _amqp_delivery_annotation_in(m: Any, key: Any, value: Any) -> Any:
    item = amqp.annotation_in(m.properties, amqp.DA_PREFIX, key, value, m.w.tree, m.w.marks)
    return SKIP if item is None else item


def _amqp_priority_in(m: Message, priority: int) -> tuple[Any, Any]:
    priority, kept = amqp.priority_in(int(priority))
    return priority, _skip_none(kept)


def _amqp_expiry_in(m: Message, expiry: Any, ttl: Any, now: int) -> Any:
    return _kept_ms(amqp.expiration_in(expiry, ttl, now))


def _amqp_id_in(field: str) -> Any:
    def convert(m: Any, value: Any) -> Any:
        return _skip_none(amqp.id_in(value, m.w.tree, field))

    return convert


def _amqp_reply_to_in(m: Any, address: Any, hint: Any) -> tuple[Any, Any]:
    dest, unnamed = amqp.reply_to_in(address, hint, m.w.default_kind, m.w.tree)
    return _skip_none(dest), _skip_none(unnamed)


def _amqp_subject_in(m: Any, subject: Any) -> Any:
    return _skip_none(amqp_values._unescape(m.w.tree, "subject", subject))


def _amqp_types_in(m: Message, marks: list[Any]) -> Any:
    return amqp.types_json(marks) if marks else SKIP


# -- AMQP 1.0, out ----------------------------------------------------------------------------


def _amqp_property_out(m: Any, name: str, value: Any) -> Any:
    if name.startswith("JMS_GW_AMQP_") and name.startswith((amqp.MA_PREFIX, amqp.DA_PREFIX)):
        item = amqp.annotation_out(name, value, m.w.tree, m.w.marks)
        if item is not None:
            (m.w.carried if name[12] == "M" else m.w.inst)[item[0]] = item[1]
            return SKIP
    return name, value  # wire.application records its type as message_to_amqp does


def _amqp_body_out(m: Any, kind: str, body: Any) -> tuple[Any, ...]:
    value, section, code, content_type = amqp.body_out(BodyKind[kind], body, m.w.tree,
                                                       m.w.marks)  # fmt: skip
    name = amqp.SECTION_NAMES[section]
    return (SKIP if name is None else Kept(value), SKIP if name is None else name,
            amqp._BYTE[code],
            _skip_none(content_type))


def _amqp_durable_out(m: Message, mode: str) -> tuple[Any, Any]:
    return mode == "PERSISTENT", amqp.RELIABLE if mode == "RELIABLE" else SKIP


def _amqp_ttl_out(m: Message, expires: int | None, now: int) -> Any:
    return amqp.ttl_out(expires or 0, now) or SKIP


def _amqp_delivery_count_out(m: Message, count: int) -> tuple[Any, Any]:
    return (count - 1, SKIP) if count > 1 else (SKIP, True)


def _amqp_address_out(m: Any, field: str, text: str | None) -> tuple[Any, Any]:
    if text is None:
        return SKIP, SKIP
    return amqp.address_out(Destination.parse(text), field, m.w.marks)


def _amqp_text_out(m: Any, field: str, text: str | None) -> Any:
    return SKIP if text is None else amqp_values._escape(text, field, m.w.marks)


def _amqp_id_out(m: Any, field: str, value: Any) -> Any:
    return SKIP if value is None else amqp.id_out(value, field, m.w.marks)


def _amqp_time_out(m: Message, ms: int) -> Any:
    return int(ms) if ms else SKIP


def _amqp_trace_id_out(m: Any, trace: str | None) -> Any:
    return SKIP if trace is None else amqp_values._escape(trace, "trace-id", m.w.marks)


# property → its field's value, or None: it does not fit (README "core → AMQP")
_FITS: dict[str, Any] = {
    amqp.USER_ID: amqp.user_id_out,
    amqp.GROUP_ID: lambda v: amqp.string_field_out(v, False),
    amqp.REPLY_TO_GROUP_ID_PROPERTY: lambda v: amqp.string_field_out(v, False),
    amqp.CONTENT_ENCODING_PROPERTY: lambda v: amqp.string_field_out(v, True),
    amqp.GROUP_SEQ: amqp.group_seq_out,
    amqp.CONTENT_TYPE_PROPERTY: lambda v: amqp.string_field_out(v, True),
}


def _amqp_field_out(m: Any, name: str, value: Any) -> tuple[Any, Any]:
    if name not in m.properties:
        return SKIP, SKIP
    fit = _FITS[name](value)
    return (SKIP, fit) if fit is not None else (value, SKIP)


def _amqp_priority_out(m: Any, kept: Any, priority: int) -> tuple[Any, Any]:
    if amqp.PRIORITY_PROPERTY not in m.properties:
        return SKIP, int(priority)
    above = amqp.priority_out(priority, kept)
    return (SKIP, above) if above is not None else (kept, int(priority))


def _amqp_reply_to_property_out(m: Any, address: Any, reply_to: Any) -> tuple[Any, Any]:
    if amqp.REPLY_TO_PROPERTY not in m.properties:
        return SKIP, SKIP
    if reply_to is None and amqp.string_field_out(address, False) is not None:
        return SKIP, address
    return address, SKIP


def _amqp_types_out(m: Any, record: Any) -> Any:
    if amqp.TYPES_PROPERTY not in m.properties or type(record) is str:
        return SKIP
    return record  # not a types record: an application property (the record replaces it)


# -- RV-style bus --------------------------------------------------------------------------------


def _rv_body_in(m: Message, message: Any) -> Body:
    return Body(*rv.body_in(message))


def _rv_headers_in(m: Message, message: Any) -> tuple[Any, ...]:
    f = message.get_field(rv.HEADERS_FIELD)
    values = rv.headers_in(f.value if f is not None and f.type == rv.MSG else None)
    return tuple(SKIP if v is None else v for v in values)


def _rv_cm_expiry_in(m: Message, time_limit: Any, timestamp: int, expiration: int) -> Any:
    if expiration or not time_limit:
        return SKIP
    return rv.cm_expiration(time_limit, timestamp) or SKIP


def _rv_properties_in(m: Message, message: Any) -> dict[str, Any]:
    f = message.get_field(rv.PROPERTIES_FIELD)
    return rv.properties_in(f.value if f is not None and f.type == rv.MSG else None)


def _rv_headers_out(m: Message, export: bool) -> Any:
    return rv.headers_out(m) if export else SKIP


def _rv_properties_out(m: Message, props: dict[str, Any], export: bool) -> Any:
    return rv.properties_out(props) if export and props else SKIP


def _rv_body_out(m: Message, kind: str, body: Any) -> Any:
    return SKIP if kind == "NONE" else Body(BodyKind[kind], body)


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
    "mqtt-user-record-in": Converter(_mqtt_user_record_in, 1, 1),
    "mqtt-retain-in": Converter(_mqtt_retain_in, 1, 1),
    "mqtt-mode-in": Converter(_mqtt_mode_in, 1, 1),
    "mqtt-body-out": Converter(_mqtt_body_out, 4, 3),
    "mqtt-qos-out": Converter(_mqtt_qos_out, 2, 1),
    "mqtt-content-type-out": Converter(_mqtt_content_type_out, 2, 1),
    "mqtt-expiry-out": Converter(_mqtt_expiry_out, 2, 1),
    "mqtt-correlation-out": Converter(_mqtt_correlation_out, 1, 1),
    "mqtt-text-out": Converter(_mqtt_text_out, 1, 1, named=True),
    "mqtt-priority-out": Converter(_mqtt_priority_out, 1, 1),
    "mqtt-message-id-out": Converter(_mqtt_message_id_out, 2, 1),
    "mqtt-user-record-out": Converter(_mqtt_user_record_out, 2, 1),
    "amqp-property-in": Converter(_amqp_property_in, 0, 0, item=True),
    "amqp-body-in": Converter(_amqp_body_in, 4, 1),
    "amqp-mode-in": Converter(_amqp_mode_in, 2, 1),
    "amqp-user-id-in": Converter(_amqp_user_id_in, 1, 1),
    "amqp-string-in": Converter(_amqp_string_in, 1, 1),
    "amqp-group-sequence-in": Converter(_amqp_group_sequence_in, 1, 1),
    "amqp-content-type-in": Converter(_amqp_content_type_in, 2, 1),
    "amqp-delivery-time-in": Converter(_amqp_delivery_time_in, 3, 1),
    "amqp-time-in": Converter(_amqp_time_in, 1, 1),
    "amqp-trace-id-in": Converter(_amqp_trace_id_in, 1, 1),
    "amqp-annotation-in": Converter(_amqp_annotation_in, 0, 0, item=True),
    "amqp-delivery-annotation-in": Converter(_amqp_delivery_annotation_in, 0, 0, item=True),
    "amqp-priority-in": Converter(_amqp_priority_in, 1, 2),
    "amqp-expiry-in": Converter(_amqp_expiry_in, 3, 1),
    "amqp-message-id-in": Converter(_amqp_id_in("message-id"), 1, 1),
    "amqp-correlation-id-in": Converter(_amqp_id_in("correlation-id"), 1, 1),
    "amqp-reply-to-in": Converter(_amqp_reply_to_in, 2, 2),
    "amqp-subject-in": Converter(_amqp_subject_in, 1, 1),
    "amqp-types-in": Converter(_amqp_types_in, 1, 1),
    "amqp-property-out": Converter(_amqp_property_out, 0, 0, item=True),
    "amqp-body-out": Converter(_amqp_body_out, 2, 4),
    "amqp-durable-out": Converter(_amqp_durable_out, 1, 2),
    "amqp-ttl-out": Converter(_amqp_ttl_out, 2, 1),
    "amqp-delivery-count-out": Converter(_amqp_delivery_count_out, 1, 2),
    "amqp-address-out": Converter(_amqp_address_out, 1, 2, named=True),
    "amqp-text-out": Converter(_amqp_text_out, 1, 1, named=True),
    "amqp-id-out": Converter(_amqp_id_out, 1, 1, named=True),
    "amqp-time-out": Converter(_amqp_time_out, 1, 1),
    "amqp-trace-id-out": Converter(_amqp_trace_id_out, 1, 1),
    "amqp-field-out": Converter(_amqp_field_out, 1, 2, named=True),
    "amqp-priority-out": Converter(_amqp_priority_out, 2, 2),
    "amqp-reply-to-property-out": Converter(_amqp_reply_to_property_out, 2, 2),
    "amqp-types-out": Converter(_amqp_types_out, 1, 1),
    "rv-body-in": Converter(_rv_body_in, 1, 1),
    "rv-headers-in": Converter(_rv_headers_in, 1, 6),
    "rv-cm-expiry-in": Converter(_rv_cm_expiry_in, 3, 1),
    "rv-properties-in": Converter(_rv_properties_in, 1, 1),
    "rv-headers-out": Converter(_rv_headers_out, 1, 1),
    "rv-properties-out": Converter(_rv_properties_out, 2, 1),
    "rv-body-out": Converter(_rv_body_out, 2, 1),
}
