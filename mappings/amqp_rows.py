"""The AMQP 1.0 default rows as the fast paths take them: names, and the rows they are written for.

How this works. ``mappings/defaults/amqp.yaml`` defines the default AMQP mapping; the engine
runs its rows, and the hand-written fast paths (:mod:`mappings.amqp` on ``proton.Message``,
:mod:`mappings.amqp_fast` / :mod:`mappings.amqp_fast_out` on the encoded bytes) run the
same rows written out as code. Their code is written for the rows of ``SHAPE_IN`` and
``SHAPE_OUT`` (each a rule and its step as the rows say it), which :func:`mappings.rows.
check_shape` compares with the file when this module is imported (when they differ, the
engine runs the rows instead); the names they use -- the
JMS properties the AMQP properties fields and the header's priority become, the message
annotation keys, the properties that are not application properties -- are taken from the
rows here (a field ``section.{}`` of a shape), so a name changed in ``amqp.yaml`` changes the
engine and all three fast paths at once. The AMQP properties fields themselves
(``wire.properties.group-id`` …) are positions in the properties list (AMQP 1.0 Part 3
§3.2.4) that the code is written for, so the shapes name them as they are
(``mappings/README.md``, "One source: the rows and the fast paths").
"""

from __future__ import annotations

from mappings.rows import DefaultRowsMismatch, check_shape, except_names, turn_off
from mappings.rows import name as row_name

__all__ = ["SHAPE_IN", "SHAPE_OUT"]

SHAPE_IN = (
    ("amqp.in.application-properties", "copy_all amqp-property-in: wire.application -> property"),
    ("amqp.in.body", "convert amqp-body-in: wire.body, wire.body_section, "
                     "wire.properties.content-type, wire.annotation.{} -> body"),
    ("amqp.in.durable", "convert amqp-mode-in: wire.header.durable, wire.annotation.{} -> "
                        "header.JMSDeliveryMode"),
    ("amqp.in.user-id", "convert amqp-user-id-in: wire.properties.user-id -> property.{}"),
    ("amqp.in.group-id", "copy: wire.properties.group-id -> property.{}"),
    ("amqp.in.reply-to-group-id", "copy: wire.properties.reply-to-group-id -> property.{}"),
    ("amqp.in.content-encoding", "convert amqp-string-in: wire.properties.content-encoding -> "
                                 "property.{}"),
    ("amqp.in.group-sequence", "convert amqp-group-sequence-in: wire.properties.group-sequence "
                               "-> property.{}"),
    ("amqp.in.content-type", "convert amqp-content-type-in: wire.properties.content-type, "
                             "body_kind -> property.{}"),
    ("amqp.in.delivery-time", "convert amqp-delivery-time-in: wire.annotation.{}, "
                              "wire.annotation.{}, wire.now -> header.JMSDeliveryTime"),
    ("amqp.in.trace-id", "convert amqp-trace-id-in: wire.annotation.{} -> trace_id"),
    ("amqp.in.message-annotations", "copy_all amqp-annotation-in: wire.annotation -> property"),
    ("amqp.in.delivery-annotations", "copy_all amqp-delivery-annotation-in: "
                                     "wire.delivery_annotation -> property"),
    ("amqp.in.priority", "convert amqp-priority-in: wire.header.priority -> header.JMSPriority, "
                         "property.{}"),
    ("amqp.in.expiry", "convert amqp-expiry-in: wire.properties.absolute-expiry-time, "
                       "wire.header.ttl, wire.now -> header.JMSExpiration"),
    ("amqp.in.message-id", "convert amqp-message-id-in: wire.properties.message-id -> "
                           "header.JMSMessageID"),
    ("amqp.in.correlation-id", "convert amqp-correlation-id-in: wire.properties.correlation-id "
                               "-> header.JMSCorrelationID"),
    ("amqp.in.reply-to", "convert amqp-reply-to-in: wire.properties.reply-to, "
                         "wire.annotation.{} -> header.JMSReplyTo, property.{}"),
    ("amqp.in.subject", "convert amqp-subject-in: wire.properties.subject -> header.JMSType"),
    ("amqp.in.creation-time", "convert amqp-time-in: wire.properties.creation-time -> "
                              "header.JMSTimestamp"),
    ("amqp.in.types", "convert amqp-types-in: wire.types -> property.{}"),
)


def _field_out(rule: str, field: str) -> tuple[str, str]:
    """An ``amqp-field-out`` row: a property to its properties field, or to an application
    property of its own name when it does not fit."""
    return rule, f"convert amqp-field-out: property.{{}} -> wire.application.{{}}, {field}"


SHAPE_OUT = (
    ("amqp.out.application-properties", "copy_all amqp-property-out: property -> "
                                        "wire.application"),
    ("amqp.out.body", "convert amqp-body-out: body_kind, body -> wire.body, wire.body_section, "
                      "wire.annotation.{}, wire.properties.content-type"),
    ("amqp.out.durable", "convert amqp-durable-out: header.JMSDeliveryMode -> "
                         "wire.header.durable, wire.annotation.{}"),
    ("amqp.out.ttl", "convert amqp-ttl-out: expiry, wire.now -> wire.header.ttl"),
    ("amqp.out.delivery-count", "convert amqp-delivery-count-out: wire.delivery_count -> "
                                "wire.header.delivery-count, wire.header.first-acquirer"),
    ("amqp.out.message-id", "convert amqp-id-out: header.JMSMessageID -> "
                            "wire.properties.message-id"),
    ("amqp.out.to", "convert amqp-address-out: header.JMSDestination -> wire.properties.to, "
                    "wire.annotation.{}"),
    ("amqp.out.subject", "convert amqp-text-out: header.JMSType -> wire.properties.subject"),
    ("amqp.out.reply-to", "convert amqp-address-out: header.JMSReplyTo -> "
                          "wire.properties.reply-to, wire.annotation.{}"),
    ("amqp.out.correlation-id", "convert amqp-id-out: header.JMSCorrelationID -> "
                                "wire.properties.correlation-id"),
    ("amqp.out.absolute-expiry-time", "convert amqp-time-out: header.JMSExpiration -> "
                                      "wire.properties.absolute-expiry-time"),
    ("amqp.out.creation-time", "convert amqp-time-out: header.JMSTimestamp -> "
                               "wire.properties.creation-time"),
    ("amqp.out.delivery-time", "convert amqp-time-out: header.JMSDeliveryTime -> "
                               "wire.annotation.{}"),
    ("amqp.out.trace-id", "convert amqp-trace-id-out: trace_id -> wire.annotation.{}"),
    _field_out("amqp.out.user-id", "wire.properties.user-id"),
    _field_out("amqp.out.group-id", "wire.properties.group-id"),
    _field_out("amqp.out.reply-to-group-id", "wire.properties.reply-to-group-id"),
    _field_out("amqp.out.content-encoding", "wire.properties.content-encoding"),
    _field_out("amqp.out.group-sequence", "wire.properties.group-sequence"),
    _field_out("amqp.out.content-type", "wire.properties.content-type"),
    ("amqp.out.priority", "convert amqp-priority-out: property.{}, header.JMSPriority -> "
                          "wire.application.{}, wire.header.priority"),
    ("amqp.out.reply-to-property", "convert amqp-reply-to-property-out: property.{}, "
                                   "header.JMSReplyTo -> wire.application.{}, "
                                   "wire.properties.reply-to"),
    ("amqp.out.types", "convert amqp-types-out: property.{} -> wire.application.{}"),
)
check_shape("amqp", "in", SHAPE_IN)
check_shape("amqp", "out", SHAPE_OUT)


def _property(rule_in: str, rule_out: str, i: int = 0) -> str:
    """The property ``rule_in`` writes (``to[i]``) and ``rule_out`` reads back, and writes as
    the application property of that name when the AMQP field cannot hold it: one name."""
    prop = row_name("property", f"{rule_in} to[{i}]", f"{rule_out} from[0]")
    if row_name("wire.application", f"{rule_out} to[0]") != prop:
        raise DefaultRowsMismatch(f"mappings/defaults/amqp.yaml: rule {rule_out!r} must write "
                                  f"{prop} to wire.application.{prop}, the name it reads")
    return prop


# -- JMS properties ----------------------------------------------------------------------------

USER_ID = _property("amqp.in.user-id", "amqp.out.user-id")  # properties user-id
GROUP_ID = _property("amqp.in.group-id", "amqp.out.group-id")  # properties group-id
# properties reply-to-group-id (Qpid JMS: JMS_AMQP_REPLY_TO_GROUP_ID)
REPLY_TO_GROUP_ID_PROPERTY = _property("amqp.in.reply-to-group-id",
                                       "amqp.out.reply-to-group-id")
CONTENT_ENCODING_PROPERTY = _property("amqp.in.content-encoding", "amqp.out.content-encoding")
GROUP_SEQ = _property("amqp.in.group-sequence", "amqp.out.group-sequence")
CONTENT_TYPE_PROPERTY = _property("amqp.in.content-type", "amqp.out.content-type")
# uint8: an AMQP priority above 9 (JMS caps it at 9)
PRIORITY_PROPERTY = _property("amqp.in.priority", "amqp.out.priority", 1)
# a reply-to naming no destination (empty name)
REPLY_TO_PROPERTY = _property("amqp.in.reply-to", "amqp.out.reply-to-property", 1)
# the types record (JSON), written and read by both sides
TYPES_PROPERTY = _property("amqp.in.types", "amqp.out.types")

# The properties the out rows after amqp.out.application-properties write, in their order
# (the order their application properties come out in), which that row leaves alone.
SPECIAL_ORDER = (USER_ID, GROUP_ID, REPLY_TO_GROUP_ID_PROPERTY, CONTENT_ENCODING_PROPERTY,
                 GROUP_SEQ, CONTENT_TYPE_PROPERTY, PRIORITY_PROPERTY, REPLY_TO_PROPERTY,
                 TYPES_PROPERTY)  # fmt: skip
if frozenset(SPECIAL_ORDER) != frozenset(except_names("amqp.out.application-properties")):
    turn_off("amqp", "out", "the except list of 'amqp.out.application-properties' is not the "
             f"properties the fast path writes after it: {', '.join(SPECIAL_ORDER)}")

# -- message annotation keys -------------------------------------------------------------------

_A = "wire.annotation"
MSG_TYPE = row_name(_A, "amqp.in.body from[3]", "amqp.out.body to[2]")
JMS_DEST = row_name(_A, "amqp.out.to to[1]")
JMS_REPLY_TO = row_name(_A, "amqp.in.reply-to from[1]", "amqp.out.reply-to to[1]")
DELIVERY_TIME = row_name(_A, "amqp.in.delivery-time from[0]", "amqp.out.delivery-time to[0]")
DELIVERY_DELAY = row_name(_A, "amqp.in.delivery-time from[1]")
TRACE_ID = row_name(_A, "amqp.in.trace-id from[0]", "amqp.out.trace-id to[0]")
GW_DELIVERY_MODE = row_name(_A, "amqp.in.durable from[1]", "amqp.out.durable to[1]")
