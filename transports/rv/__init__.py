"""The RV-style bus: subjects, self-describing messages, transports, listeners and queues.

Usable by a plain Python program without the gateway's core::

    from transports.rv import Listener, Message, Transport, default_queue

Importing the package loads only its light modules (subjects, messages, the codec); the
programming interface (:mod:`transports.rv.transport`, :mod:`transports.rv.queue`), which
brings in sockets, threads and asyncio, is loaded on first use of one of its names.
"""

from typing import Any

from transports.rv.codec import FormatError, decode, encode
from transports.rv.events import MAX_MESSAGE, MessageTooLarge
from transports.rv.message import (
    CmLabel,
    Field,
    FieldError,
    Message,
    Origin,
    Route,
    RvDateTime,
    RvType,
)
from transports.rv.subject import (
    SubjectError,
    SubjectMatcher,
    validate_listen_subject,
    validate_send_subject,
)

_LAZY = {
    "AsyncTransport": "transports.rv.transport",
    "InitFailure": "transports.rv.transport",
    "Listener": "transports.rv.transport",
    "ProcessTransport": "transports.rv.transport",
    "RequestTimeout": "transports.rv.transport",
    "Transport": "transports.rv.transport",
    "TransportError": "transports.rv.transport",
    "process_transport": "transports.rv.transport",
    "DISCARD_FIRST": "transports.rv.queue",
    "DISCARD_LAST": "transports.rv.queue",
    "DISCARD_NEW": "transports.rv.queue",
    "DISCARD_NONE": "transports.rv.queue",
    "Dispatcher": "transports.rv.queue",
    "LimitPolicy": "transports.rv.queue",
    "Queue": "transports.rv.queue",
    "default_queue": "transports.rv.queue",
    "start": "transports.rv.bridge",  # the gateway's transport (registry entry for type = rv)
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [  # noqa: RUF022 - the lazy names follow the eager ones

    "MAX_MESSAGE",
    "CmLabel",
    "Field",
    "FieldError",
    "FormatError",
    "Message",
    "MessageTooLarge",
    "Origin",
    "Route",
    "RvDateTime",
    "RvType",
    "SubjectError",
    "SubjectMatcher",
    "decode",
    "encode",
    "validate_listen_subject",
    "validate_send_subject",
    *_LAZY,
]
