"""The RV-style bus: subjects, self-describing messages and their wire format.

Usable by a plain Python program without the gateway's core. This package imports only its
own light modules (no sockets, no asyncio); the engine, shell and bridge are separate modules.
"""

from transports.rv.codec import MAX_MESSAGE, FormatError, MessageTooLarge, decode, encode
from transports.rv.message import (
    CmLabel,
    Field,
    FieldError,
    Message,
    Origin,
    RvDateTime,
    RvType,
)
from transports.rv.subject import (
    SubjectError,
    SubjectMatcher,
    validate_listen_subject,
    validate_send_subject,
)

__all__ = [
    "MAX_MESSAGE",
    "CmLabel",
    "Field",
    "FieldError",
    "FormatError",
    "Message",
    "MessageTooLarge",
    "Origin",
    "RvDateTime",
    "RvType",
    "SubjectError",
    "SubjectMatcher",
    "decode",
    "encode",
    "validate_listen_subject",
    "validate_send_subject",
]
