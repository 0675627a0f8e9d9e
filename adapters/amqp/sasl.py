"""The SASL layer of an AMQP 1.0 connection, server side, in front of proton's transport.

How this works. An AMQP 1.0 connection opens with a protocol header (AMQP 1.0 §2.2,
§5.3.1): ``AMQP 3 1 0 0`` starts a SASL exchange, ``AMQP 0 1 0 0`` the AMQP protocol itself.
:class:`SaslServer` reads the first header. For SASL it answers with its own header and a
``sasl-mechanisms`` frame, reads the client's ``sasl-init``, checks the credentials and
answers ``sasl-outcome``; the client then sends the AMQP header, and from there on every
byte belongs to proton's :class:`proton.Transport`. A client that skips SASL (``AMQP 0 1 0
0`` first) is let through only when anonymous access is allowed.

Why by hand. Proton's own server-side SASL verifies ``PLAIN`` only through Cyrus SASL and
its password database (its built-in implementation takes ``ANONYMOUS`` and ``EXTERNAL``
alone), while the gateway checks users against ``users.conf``. The exchange needed here is
three frames (§5.3.3); their fields are encoded and decoded with proton's :class:`Data`, so
the only hand-written part is the 8-byte frame header (§2.3.1).

Only ``PLAIN`` (RFC 4616) and ``ANONYMOUS`` (RFC 4505) are offered: ``PLAIN`` always,
``ANONYMOUS`` when the core takes clients without a user name (always with ``authorization``
disabled, otherwise per ``allow_anonymous``). The authenticator decides (the core's rules,
:meth:`gateway.broker.Broker.authenticate`). ``PLAIN`` sends the password in clear text; use
the TLS listener (``amqps://``) where that matters.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from proton import UNDESCRIBED, Array, Data, Described, symbol, ubyte, ulong

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
TLS_HEADER = b"AMQP\x02\x01\x00\x00"

_FRAME = struct.Struct(">IBBH")  # size, data offset (in 4-byte words), type, channel
_SASL_FRAME_TYPE = 1
_MECHANISMS, _INIT, _CHALLENGE, _RESPONSE, _OUTCOME = 0x40, 0x41, 0x42, 0x43, 0x44
_INIT_NAME = "amqp:sasl-init:list"
MAX_SASL_FRAME = 64 * 1024  # sasl frames are small; anything bigger is hostile (§5.3.1: 512
#                             is the minimum every peer must accept)

# sasl-code (§5.3.3.6)
OK, AUTH, SYS, SYS_PERM, SYS_TEMP = 0, 1, 2, 3, 4

Authenticator = Callable[[str | None, str | None], str | None]
"""``(user, password) -> user``: the authenticated user (``None``: anonymous); raises
:class:`SaslError` to refuse."""


class SaslError(Exception):
    """Authentication failed; the message is logged, never sent (the outcome code is)."""


class SaslServer:
    """Bytes in, bytes out, until the AMQP header: then :attr:`done` and :attr:`rest`.

    ``feed(data)`` returns the bytes to write back. Once :attr:`done` is true, :attr:`rest`
    holds the bytes that followed (the AMQP header first) for proton's transport, and
    :attr:`user` is who authenticated (``None`` for anonymous). :attr:`failed` says the
    connection must close once the returned bytes are written; :attr:`error` says why.
    """

    def __init__(self, authenticate: Authenticator, *, plain: bool, anonymous: bool) -> None:
        self.authenticate = authenticate
        self.mechanisms = (["PLAIN"] if plain else []) + (["ANONYMOUS"] if anonymous else [])
        self.anonymous = anonymous
        self.buf = b""
        self.state = "header"  # header → init → amqp-header → done
        self.done = False
        self.failed = False
        self.error = ""
        self.rest = b""
        self.user: str | None = None
        self.mechanism = ""

    def feed(self, data: bytes) -> bytes:
        self.buf += data
        out = b""
        while not self.done and not self.failed:
            step = self._step()
            if step is None:
                break
            out += step
        return out

    def _step(self) -> bytes | None:
        buf = self.buf
        if self.state in ("header", "amqp-header"):
            if len(buf) < 8:
                if buf and not (SASL_HEADER.startswith(buf[:4]) or b"AMQP".startswith(buf[:4])):
                    return self._fail_header()
                return None
            header, self.buf = buf[:8], buf[8:]
            if self.state == "header" and header == SASL_HEADER:
                self.state = "init"
                return SASL_HEADER + _frame(_MECHANISMS, [
                    Array(UNDESCRIBED, Data.SYMBOL,  # type: ignore[arg-type]
                          *[symbol(m) for m in self.mechanisms])
                ])
            if header == AMQP_HEADER:
                if self.state == "header" and not self.anonymous:
                    self.error = "a connection without SASL was refused (anonymous not allowed)"
                    self.failed = True
                    return SASL_HEADER  # the header we would have taken (§2.2)
                self.done = True
                self.rest = header + self.buf
                self.buf = b""
                return b""
            return self._fail_header()
        # state "init": one sasl frame
        if len(buf) < 8:
            return None
        size, doff, ftype, _ = _FRAME.unpack_from(buf)
        if size < 8 or size > MAX_SASL_FRAME or doff < 2 or ftype != _SASL_FRAME_TYPE:
            self.error = f"malformed SASL frame (size {size}, type {ftype})"
            self.failed = True
            return _frame(_OUTCOME, [ubyte(SYS_PERM)])
        if len(buf) < size:
            return None
        body, self.buf = buf[doff * 4 : size], buf[size:]
        return self._init(body)

    def _fail_header(self) -> bytes:
        self.error = "not an AMQP 1.0 protocol header"
        self.failed = True
        return SASL_HEADER if self.state == "header" else AMQP_HEADER

    def _init(self, body: bytes) -> bytes:
        try:
            d = Data()
            d.decode(body)
            frame: Any = d.get_object()
            descriptor = frame.descriptor
            if descriptor not in (_INIT, _INIT_NAME) or not isinstance(frame.value, list):
                raise ValueError(f"expected sasl-init, got {descriptor!r}")
            fields = list(frame.value) + [None, None, None]
            mechanism, response = str(fields[0] or ""), fields[1]
        except Exception as exc:  # any decoding error of hostile input
            self.error = f"malformed sasl-init: {exc}"
            self.failed = True
            return _frame(_OUTCOME, [ubyte(SYS_PERM)])
        self.mechanism = mechanism
        if mechanism not in self.mechanisms:
            return self._refuse(f"mechanism {mechanism!r} not offered")
        user: str | None = None
        password: str | None = None
        if mechanism == "PLAIN":
            try:
                _authzid, user, password = bytes(response or b"").decode("utf-8").split("\x00")
            except ValueError:
                return self._refuse("malformed PLAIN response")
        try:
            self.user = self.authenticate(user, password)
        except SaslError as exc:
            return self._refuse(str(exc))
        self.state = "amqp-header"
        return _frame(_OUTCOME, [ubyte(OK)])

    def _refuse(self, why: str) -> bytes:
        self.error = why
        self.failed = True
        return _frame(_OUTCOME, [ubyte(AUTH)])


def _frame(descriptor: int, fields: list[Any]) -> bytes:
    d = Data()
    d.put_object(Described(ulong(descriptor), fields))
    body = d.encode()
    return _FRAME.pack(8 + len(body), 2, _SASL_FRAME_TYPE, 0) + body
