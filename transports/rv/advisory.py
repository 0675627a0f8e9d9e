"""System advisories of the RV-style bus as ordinary messages.

An advisory is a :class:`~transports.rv.message.Message` on
``_RV.<ERROR|WARN|INFO>.SYSTEM.<NAME>[.<more>]`` (TIBCO Rendezvous Concepts, Appendix A,
System Advisory Messages); programs receive it by listening to its subject like any other.
Every advisory carries ``ADV_CLASS``, ``ADV_SOURCE`` and ``ADV_NAME`` (STRING: the class, the
source and the rest of the subject), then its own fields with the types Appendix A gives:

| advisory | fields |
|---|---|
| DATALOSS.* | ``host`` STRING (the other engine's IP), ``lost`` U32 (packets), ``scid`` U16 (the service port) |
| RETRANSMISSION.* | ``host`` STRING, ``lost`` U32 |
| QUEUE.LIMIT_EXCEEDED | ``ADV_DESC`` STRING (the queue's name) |
| CLIENT.SLOWCONSUMER | ``waiting`` U32, ``dropped`` U32, ``bytes_dropped`` U64, ``reason`` STRING |
| CLIENT.FASTPRODUCER | ``waiting`` U32 (messages waiting to be sent) |
| CLIENT.ILLEGAL_PUBLISH | ``sub``, ``tport``, ``descr`` STRING |
| LISTEN.START / LISTEN.STOP.<subject> | ``id`` STRING (the transport's id), ``sub`` STRING |
| LISTEN.QUERY | none: every engine that receives it announces LISTEN.START again for each subject its transports listen to |
| UNREACHABLE.TRANSPORT.<id> | ``id`` STRING |
| HOST.STATUS.<ip hex> | ``hostaddr`` IPADDR32, ``time`` DATETIME, ``up`` U32 (seconds), ``cc`` U32 (transports), ``ms`` ``bs`` ``mr`` ``br`` ``ps`` ``pr`` ``rx`` ``pm`` ``idl`` ``odl`` U64, ``ipport`` IPPORT16 (the daemon parameter's port), ``service``, ``network`` STRING |

LISTEN.START and LISTEN.STOP are not in Appendix A; they follow the Rendezvous daemon's
advisories of the same names (a transport began or stopped listening to a subject).
LISTEN.QUERY is this bus's own: a router (:mod:`transports.rv.router`) sends it when it
starts, to learn the listeners that already exist.

An ERROR or WARN advisory that no listener takes is logged (``transports.rv`` logger); an
INFO one is dropped (Appendix A, "Advisory Messages": unhandled errors and warnings go to
standard error, information is seen only by explicit listeners).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from transports.rv.message import Message, RvType

DATALOSS_MSG_TOO_LARGE: Final = "_RV.ERROR.SYSTEM.DATALOSS.MSG_TOO_LARGE"
QUEUE_LIMIT_EXCEEDED: Final = "_RV.WARN.SYSTEM.QUEUE.LIMIT_EXCEEDED"
CLIENT_SLOWCONSUMER: Final = "_RV.ERROR.SYSTEM.CLIENT.SLOWCONSUMER"
CLIENT_FASTPRODUCER: Final = "_RV.WARN.SYSTEM.CLIENT.FASTPRODUCER"
CLIENT_ILLEGAL_PUBLISH: Final = "_RV.ERROR.SYSTEM.CLIENT.ILLEGAL_PUBLISH"
LISTEN_START: Final = "_RV.INFO.SYSTEM.LISTEN.START."
LISTEN_STOP: Final = "_RV.INFO.SYSTEM.LISTEN.STOP."
LISTEN_QUERY: Final = "_RV.INFO.SYSTEM.LISTEN.QUERY"
UNREACHABLE_TRANSPORT: Final = "_RV.INFO.SYSTEM.UNREACHABLE.TRANSPORT."
HOST_STATUS: Final = "_RV.INFO.SYSTEM.HOST.STATUS."

FIELD_TYPES: Final[dict[str, int]] = {
    "host": RvType.STRING,
    "lost": RvType.U32,
    "scid": RvType.U16,
    "ADV_DESC": RvType.STRING,
    "waiting": RvType.U32,
    "dropped": RvType.U32,
    "bytes_dropped": RvType.U64,
    "reason": RvType.STRING,
    "sub": RvType.STRING,
    "tport": RvType.STRING,
    "descr": RvType.STRING,
    "id": RvType.STRING,
    # HOST.STATUS (Appendix A, HOST.STATUS)
    "hostaddr": RvType.IPADDR32,
    "time": RvType.DATETIME,
    "up": RvType.U32,
    "cc": RvType.U32,
    **{name: RvType.U64 for name in ("ms", "bs", "mr", "br", "ps", "pr", "rx", "pm", "idl",
                                     "odl")},
    "ipport": RvType.IPPORT16,
    "service": RvType.STRING,
    "network": RvType.STRING,
    # certified delivery (TIBCO Rendezvous Concepts, Appendix B)
    **{name: RvType.U64 for name in ("seqno", "seqno_begin", "seqno_end", "seqno_last_sent",
                                     "seqno_last_confirmed")},
}


def advisory_message(subject: str, fields: Mapping[str, object]) -> Message:
    """The advisory ``subject`` with ``fields`` as a message (types: the module's table)."""
    parts = subject.split(".", 3)  # _RV, class, source, name...
    msg = Message(subject)
    msg.add("ADV_CLASS", parts[1], RvType.STRING)
    msg.add("ADV_SOURCE", parts[2], RvType.STRING)
    msg.add("ADV_NAME", parts[3], RvType.STRING)
    for name, value in fields.items():
        msg.add(name, value, FIELD_TYPES.get(name, RvType.STRING if isinstance(value, str)
                                             else RvType.I64))
    return msg


def is_logged(subject: str) -> bool:
    """ERROR and WARN advisories nobody listens to are logged; INFO ones are dropped."""
    return not subject.startswith("_RV.INFO.")
