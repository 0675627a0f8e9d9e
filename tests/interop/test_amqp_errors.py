"""Bad AMQP input gets the right error condition on the right performative; nothing accepted
is lost."""

from __future__ import annotations

import socket
import time

import pytest
from amqpclient import (
    AMQP_HEADER,
    ATTACH,
    BEGIN,
    CLOSE,
    DETACH,
    OPEN,
    connect,
    error_of,
    exchange,
    frame,
    performatives,
)
from gw import GatewayThread
from proton import ConnectionException, Described, Message, Terminus, symbol, uint
from proton.reactor import LinkOption, Selector
from proton.utils import LinkDetached, SendException


def start(tmp_path, gateway: str = "", **files: str) -> GatewayThread:
    return GatewayThread(
        tmp_path / "gw", gateway="listen = amqp://127.0.0.1:0\n" + gateway, **files
    ).start()


@pytest.fixture
def gw(tmp_path):
    g = start(tmp_path)
    yield g
    g.stop()


def open_frame() -> bytes:
    return frame(OPEN, ["raw-client"])


def test_malformed_frame_closes_with_a_decode_error_and_loses_nothing(gw):
    port = gw.port("amqp")
    c = connect(port)
    s = c.create_sender("queue://kept")
    for i in range(3):
        s.send(Message(body=f"kept {i}", durable=True))
    c.close()
    garbage = b"\x00\x00\x00\x10\x02\x00\x00\x00" + b"\xff\xfe\xfd\xfc\xfb\xfa\xf9\xf8"
    out = performatives(exchange(port, AMQP_HEADER + open_frame() + garbage))
    kinds = [k for k, _ in out]
    assert kinds[0] == OPEN and kinds[-1] == CLOSE
    assert error_of(out[-1][1], 0) in ("amqp:decode-error", "amqp:connection:framing-error")
    c = connect(port)
    r = c.create_receiver("queue://kept", credit=10)
    got = []
    for _ in range(3):
        got.append(r.receive(timeout=5).body)
        r.accept()
    assert got == ["kept 0", "kept 1", "kept 2"]
    c.close()


def test_a_frame_over_the_max_frame_size_is_a_framing_error(gw):
    huge = b"\x00\x10\x00\x00\x02\x00\x00\x00" + b"\x00" * 64  # announces 1 MiB
    out = performatives(exchange(gw.port("amqp"), AMQP_HEADER + open_frame() + huge))
    assert out[-1][0] == CLOSE
    assert error_of(out[-1][1], 0) == "amqp:connection:framing-error"


def test_not_amqp_at_all_is_answered_with_our_header_and_closed(gw):
    data = exchange(gw.port("amqp"), b"GET / HTTP/1.1\r\n\r\n")
    assert data.startswith(b"AMQP")


def test_a_link_before_a_session_is_a_connection_error(gw):
    attach = frame(ATTACH, ["l", uint(0), False, None, None, None, None], channel=3)
    out = performatives(exchange(gw.port("amqp"), AMQP_HEADER + open_frame() + attach))
    assert out[-1][0] == CLOSE and error_of(out[-1][1], 0) is not None


def test_unknown_address_is_refused_with_not_found(tmp_path):
    g = start(tmp_path, queues="known.>\n", topics="known.>\n")
    try:
        c = connect(g.port("amqp"))
        with pytest.raises(LinkDetached) as e:
            c.create_sender("queue://unknown")
        assert "amqp:not-found" in str(e.value)
        with pytest.raises(LinkDetached) as e:
            c.create_receiver("queue://unknown.too")
        assert "amqp:not-found" in str(e.value)
        s = c.create_sender("queue://known.q")  # the connection is still usable
        s.send(Message(body="ok"))
        c.close()
    finally:
        g.stop()


def test_denied_attach_is_unauthorized_access(tmp_path):
    g = start(
        tmp_path,
        gateway="authorization = enabled\nallow_anonymous = disabled\n",
        users='alice:pw1:"Alice"\nbob:pw2:"Bob"\n',
        queues=">\nsecret secure\n",
        acl="QUEUE=secret USER=alice PERM=send,receive\n",
    )
    try:
        port = g.port("amqp")
        bob = connect(port, user="bob", password="pw2")
        with pytest.raises(LinkDetached) as e:
            bob.create_sender("queue://secret")
        assert "amqp:unauthorized-access" in str(e.value)
        with pytest.raises(LinkDetached) as e:
            bob.create_receiver("queue://secret")
        assert "amqp:unauthorized-access" in str(e.value)
        bob.close()
        alice = connect(port, user="alice", password="pw1")
        alice.create_sender("queue://secret").send(Message(body="for alice"))
        r = alice.create_receiver("queue://secret", credit=1)
        assert r.receive(timeout=5).body == "for alice"
        r.accept()
        alice.close()
        with pytest.raises(ConnectionException):
            connect(port, user="alice", password="wrong", timeout=5)
        with pytest.raises(ConnectionException):
            connect(port, timeout=5)  # anonymous is not allowed
    finally:
        g.stop()


def test_bad_selector_is_refused_with_invalid_field(gw):
    c = connect(gw.port("amqp"))
    with pytest.raises(LinkDetached) as e:
        c.create_receiver("queue://q", options=Selector("color = = 'red'"))
    assert "amqp:invalid-field" in str(e.value)
    c.close()


class _Coordinator(LinkOption):
    def apply(self, link):  # type: ignore[no-untyped-def]
        link.target.type = Terminus.COORDINATOR
        link.target.capabilities.put_object(symbol("amqp:local-transactions"))


def test_discharging_an_unknown_transaction_is_rejected(gw):
    c = connect(gw.port("amqp"))
    ctl = c.create_sender(None, options=_Coordinator())
    with pytest.raises(SendException):
        ctl.send(Message(body=Described(symbol("amqp:discharge:list"), [b"nope", False])))
    with pytest.raises(SendException):
        ctl.send(Message(body=Described(symbol("amqp:unknown:list"), [])))
    c.close()


def test_oversized_message_is_rejected_and_the_link_goes_on(tmp_path):
    g = start(tmp_path, gateway="max_client_msg_size = 1KB\n")
    try:
        c = connect(g.port("amqp"))
        s = c.create_sender("queue://big")
        with pytest.raises(SendException):
            s.send(Message(body=b"x" * 4096))
        s.send(Message(body=b"small"))
        r = c.create_receiver("queue://big", credit=1)
        assert r.receive(timeout=5).body == b"small"
        r.accept()
        c.close()
    finally:
        g.stop()


def test_a_consumer_that_vanishes_mid_delivery_loses_nothing(gw):
    port = gw.port("amqp")
    c = connect(port)
    c.create_sender("queue://work").send(Message(body="job", durable=True))
    c.close()
    # A raw client takes the message unsettled, then its socket is killed.
    attach = frame(ATTACH, ["taker", uint(0), True, None, None,
                            Described(symbol("amqp:source:list"), ["queue://work"]), None])
    # flow: next-incoming-id, incoming-window, next-outgoing-id, outgoing-window, handle,
    # delivery-count, link-credit
    flow = frame(0x13, [uint(0), uint(100), uint(0), uint(100), uint(0), uint(0), uint(100)])
    begin = frame(BEGIN, [None, uint(0), uint(100), uint(100)])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(AMQP_HEADER + open_frame() + begin + attach + flow)
        data = b""
        deadline = time.time() + 5
        while b"job" not in data and time.time() < deadline:
            data += s.recv(65536)
        assert b"job" in data  # the transfer arrived, unsettled
    c = connect(port)
    r = c.create_receiver("queue://work", credit=1)
    m = r.receive(timeout=5)
    assert m.body == "job"
    assert m.delivery_count == 1  # one earlier, failed, delivery (JMSXDeliveryCount 2)
    r.accept()
    c.close()


def test_detach_of_a_closed_session_channel_is_an_error(gw):
    detach = frame(DETACH, [uint(7), True], channel=9)
    out = performatives(exchange(gw.port("amqp"), AMQP_HEADER + open_frame() + detach))
    assert out[-1][0] == CLOSE and error_of(out[-1][1], 0) is not None
