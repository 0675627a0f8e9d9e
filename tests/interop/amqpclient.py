"""Clients for the AMQP tests: python-qpid-proton's blocking API, and raw frames for bad input."""

from __future__ import annotations

import socket
import struct
from typing import Any

from proton import Data
from proton.reactor import Container
from proton.utils import BlockingConnection

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"
OPEN, BEGIN, ATTACH, DETACH, END, CLOSE = 0x10, 0x11, 0x12, 0x16, 0x17, 0x18


def connect(port: int, *, container_id: str | None = None, timeout: float = 10,
            **kw: Any) -> BlockingConnection:
    """A blocking python-qpid-proton connection to the gateway on 127.0.0.1."""
    ct = Container()
    if container_id is not None:
        ct.container_id = container_id
    return BlockingConnection(f"amqp://127.0.0.1:{port}", timeout=timeout, container=ct, **kw)


def frame(performative: int, fields: list[Any], channel: int = 0, payload: bytes = b"") -> bytes:
    from proton import Described, ulong

    d = Data()
    d.put_object(Described(ulong(performative), fields))
    body = d.encode() + payload
    return struct.pack(">IBBH", 8 + len(body), 2, 0, channel) + body


def exchange(port: int, data: bytes, *, timeout: float = 5.0) -> bytes:
    """Send raw bytes, then read until the gateway closes the socket (or ``timeout``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        chunks = []
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        except TimeoutError:
            pass
    return b"".join(chunks)


def performatives(data: bytes) -> list[tuple[int, list[Any]]]:
    """The (descriptor, fields) of every AMQP frame in ``data``, headers skipped."""
    out: list[tuple[int, list[Any]]] = []
    while len(data) >= 8:
        if data.startswith(b"AMQP"):
            data = data[8:]
            continue
        size, doff = struct.unpack_from(">IB", data)
        body = data[doff * 4 : size]
        data = data[size:]
        if not body:
            continue  # an empty (heartbeat) frame
        d = Data()
        d.decode(body)
        obj = d.get_object()
        out.append((int(obj.descriptor), list(obj.value)))
    return out


def error_of(fields: list[Any], index: int) -> str | None:
    """The condition name of the error field at ``index`` of a performative, if any."""
    if len(fields) <= index or fields[index] is None:
        return None
    err = fields[index]
    return str(err.value[0]) if hasattr(err, "value") else str(err)
