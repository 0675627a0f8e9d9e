"""Bad STOMP input against the running gateway, over raw sockets: each refusal is one exact
ERROR frame, then that connection -- and only it -- is closed, and nothing confirmed is lost.

How this works. :class:`RawStomp` is a blocking socket that sends literal bytes (a test
writes escapes, CR LF and broken frames by hand) and reads frames back with a small parser
of its own (LF line ends, ``content-length`` or NUL, 1.1/1.2 unescaping), independent of the
gateway's codec. Every case of :data:`CASES` runs the same scenario: a bystander STOMP client
connects and subscribes; the client under test connects, sends a persistent message with a
``receipt`` and waits for the RECEIPT; then it sends the bad bytes. The gateway must answer
with one ERROR frame -- ``message`` header and body as the adapter writes them,
``content-type:text/plain``, ``receipt-id`` when the bad frame asked for a receipt -- and
close the socket. Afterwards the confirmed message is still pending in its queue (asked on
the gateway's loop with ``g.call``) and the bystander still sends and receives.

Frames that the codec cannot parse (no colon, a bad escape, bad UTF-8, a limit) have no
receipt the gateway could know, so their ERROR frames carry none.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from gw import GatewayThread

TIMEOUT = 5.0  # seconds to wait for an expected frame or for the server to close
NOTHING = 0.3  # seconds to wait for "nothing arrives"
MAX_MSG = 1024  # max_client_msg_size = 1KB below
_UNESCAPE = {"1.1": {"n": "\n", "c": ":", "\\": "\\"},
             "1.2": {"r": "\r", "n": "\n", "c": ":", "\\": "\\"}}


# --- a raw STOMP client ----------------------------------------------------------------------


def frame(command: str, headers: Any = (), body: bytes = b"") -> bytes:
    """One frame, literally: ``headers`` as given (a dict or (name, value) pairs), no
    escaping and no content-length added."""
    items = headers.items() if isinstance(headers, dict) else headers
    head = "".join(f"{k}:{v}\n" for k, v in items)
    return f"{command}\n{head}\n".encode() + body + b"\0"


@dataclass
class Frame:
    command: str
    headers: list[tuple[str, str]]
    body: bytes

    def __getitem__(self, name: str) -> str:
        value = self.get(name)
        if value is None:
            raise KeyError(name)
        return value

    def get(self, name: str) -> str | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None

    @property
    def names(self) -> list[str]:
        return [k for k, _ in self.headers]


class Closed(Exception):
    """The server closed the socket before a frame was complete."""


class RawStomp:
    """A blocking STOMP client on a raw socket (see the module docstring)."""

    def __init__(self, port: int, *, timeout: float = TIMEOUT) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.eof = False
        self.version = "1.0"
        self.backlog: list[Frame] = []  # frames read while waiting for a RECEIPT

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> None:
        if self.eof:
            raise Closed(self.buf)
        try:
            chunk = self.sock.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            self.eof = True
            raise Closed(self.buf)
        self.buf += chunk

    def _unescape(self, text: str, command: str) -> str:
        table = _UNESCAPE.get(self.version)
        if table is None or command == "CONNECTED" or "\\" not in text:
            return text
        return re.sub(r"\\(.)", lambda m: table[m.group(1)], text)

    def frame(self, timeout: float = TIMEOUT) -> Frame:
        """The next frame (heart-beats skipped). Raises Closed, or TimeoutError."""
        if self.backlog:
            return self.backlog.pop(0)
        self.sock.settimeout(timeout)
        while True:
            self.buf = self.buf.lstrip(b"\r\n")
            end = self.buf.find(b"\n\n")
            if end < 0:
                self._fill()
                continue
            command, *lines = self.buf[:end].decode().split("\n")
            headers = []
            for line in lines:
                name, _, value = line.partition(":")
                headers.append((self._unescape(name, command), self._unescape(value, command)))
            start = end + 2
            length = next((int(v) for k, v in headers if k == "content-length"), None)
            if length is None:
                stop = self.buf.find(b"\0", start)
                if stop < 0:
                    self._fill()
                    continue
            else:
                stop = start + length
                if len(self.buf) <= stop:
                    self._fill()
                    continue
                assert self.buf[stop] == 0, self.buf
            body = self.buf[start:stop]
            self.buf = self.buf[stop + 1:]
            return Frame(command, headers, body)

    def frames_until_closed(self, timeout: float = TIMEOUT) -> list[Frame]:
        """Every frame until the server closes the socket (which it must do in time)."""
        got = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                got.append(self.frame(max(0.01, deadline - time.monotonic())))
            except Closed as exc:
                assert exc.args[0].strip(b"\r\n") == b"", f"half a frame: {exc.args[0]!r}"
                return got
            except TimeoutError:
                pytest.fail(f"the server did not close the connection; got {got!r}")

    def nothing(self, timeout: float = NOTHING) -> bool:
        try:
            self.frame(timeout)
        except TimeoutError:
            return True
        return False

    def connect(self, version: str = "1.2", **headers: str) -> Frame:
        self.send(frame("CONNECT", {"accept-version": version, "host": "gw", **headers}))
        got = self.frame()
        assert got.command == "CONNECTED", got
        self.version = got["version"]
        return got

    def request(self, data: bytes, receipt: str) -> None:
        """Send ``data`` (whose last frame asks for ``receipt``) and wait for the RECEIPT;
        frames that come before it are kept for :meth:`frame`."""
        self.send(data)
        before = []
        while True:
            got = self.frame()
            if got.command == "RECEIPT" and got.get("receipt-id") == receipt:
                self.backlog = before + self.backlog
                return
            assert got.command != "ERROR", got
            before.append(got)

    def close(self) -> None:
        self.sock.close()


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    g = GatewayThread(tmp_path_factory.mktemp("stomp-errors") / "gw",
                      gateway="listen = stomp://127.0.0.1:0\n"
                              f"max_client_msg_size = {MAX_MSG // 1024}KB\n").start()
    yield g
    g.stop()


@pytest.fixture
def clients(gw: GatewayThread) -> Iterator[Any]:
    """``clients()``: a new RawStomp on the gateway; all are closed after the test."""
    made: list[RawStomp] = []

    def make(port: int | None = None) -> RawStomp:
        c = RawStomp(port if port is not None else gw.port("stomp"))
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


class Bystander:
    """An already connected STOMP client that must keep working while others are refused."""

    def __init__(self, client: RawStomp, queue: str) -> None:
        self.c = client
        self.queue = queue
        self.n = 0
        client.connect()
        client.request(frame("SUBSCRIBE", {"id": "by", "destination": f"/queue/{queue}",
                                           "receipt": "by-sub"}), "by-sub")

    def still_works(self) -> None:
        self.n += 1
        body = f"still here {self.n}".encode()
        self.c.request(frame("SEND", {"destination": f"/queue/{self.queue}",
                                      "receipt": f"by-{self.n}"}, body), f"by-{self.n}")
        got = self.c.frame()
        assert (got.command, got.body, got["destination"]) == (
            "MESSAGE", body, f"/queue/{self.queue}")


def pending(gw: GatewayThread, queue: str) -> int:
    return gw.call(lambda: gw.broker.queues[queue].info()["pending"])  # type: ignore[no-any-return]


def check_error(err: Frame, message: str, body: str, receipt: str | None) -> None:
    """The ERROR frame: its message, text/plain body and receipt-id, exactly."""
    assert err.command == "ERROR", err
    assert err["message"] == message
    assert err["content-type"] == "text/plain"
    assert err.get("receipt-id") == receipt
    assert err.body == body.encode() and err.body
    assert err["content-length"] == str(len(err.body))


# --- the refusals ----------------------------------------------------------------------------


@dataclass
class Case:
    id: str
    bad: bytes  # sent after CONNECT (or instead of it when ``connect`` is False)
    message: str
    body: str
    receipt: str | None = None
    version: str = "1.2"
    connect: bool = True
    setup: list[tuple[bytes, str]] = field(default_factory=list)  # (frames, receipt) first


SEND_X = {"destination": "/queue/errors.x"}
OVER = MAX_MSG + 1
CASES = [
    Case("frame-before-connect", frame("SEND", {**SEND_X, "receipt": "r-early"}, b"hi"),
         "not connected", "SEND before CONNECT", "r-early", connect=False),
    Case("subscribe-before-connect", frame("SUBSCRIBE", {**SEND_X, "id": "1"}),
         "not connected", "SUBSCRIBE before CONNECT", connect=False),
    Case("second-connect", frame("CONNECT", {"accept-version": "1.2", "receipt": "r-2"}),
         "already connected", "a second CONNECT frame", "r-2"),
    Case("second-connect-as-stomp", frame("STOMP", {"accept-version": "1.2"}),
         "already connected", "a second STOMP frame"),
    Case("unknown-command", frame("FOO", {"receipt": "r-foo"}), "unknown command",
         "'FOO' is not a STOMP client frame", "r-foo"),
    Case("server-frame-from-a-client", frame("MESSAGE", {**SEND_X, "receipt": "r-m"}),
         "unknown command", "'MESSAGE' is not a STOMP client frame", "r-m"),
    Case("header-without-colon", b"SEND\ndestination:/queue/errors.x\nbadline\n\nx\0",
         "malformed frame", "header line has no colon: 'badline'"),
    Case("empty-header-name", b"SEND\ndestination:/queue/errors.x\n:v\n\nx\0",
         "malformed frame", "header name is empty"),
    Case("undefined-escape-1.2", b"SEND\ndestination:/queue/errors.x\nh:a\\tb\n\nx\0",
         "malformed frame", "undefined escape sequence in header: \\t (STOMP 1.2)"),
    Case("cr-escape-in-1.1", b"SEND\ndestination:/queue/errors.x\nh:a\\rb\n\nx\0",
         "malformed frame", "undefined escape sequence in header: \\r (STOMP 1.1)",
         version="1.1"),
    Case("bad-utf8-header", b"SEND\ndestination:/queue/errors.x\nh:\xff\xfe\n\nx\0",
         "malformed frame", "header is not valid UTF-8"),
    Case("content-length-not-a-number",
         b"SEND\ndestination:/queue/errors.x\ncontent-length:12a\n\nx\0",
         "malformed frame", "content-length is not a decimal number: '12a'"),
    Case("negative-content-length",
         b"SEND\ndestination:/queue/errors.x\ncontent-length:-1\n\nx\0",
         "malformed frame", "content-length is not a decimal number: '-1'"),
    Case("body-longer-than-content-length",
         b"SEND\ndestination:/queue/errors.x\ncontent-length:2\n\nxyz\0",
         "malformed frame", "frame body longer than content-length (no NUL after it)"),
    # the header block parsed, the body did not: the ERROR still names the receipt
    Case("body-longer-than-content-length-with-receipt",
         b"SEND\ndestination:/queue/errors.x\nreceipt:r-b\ncontent-length:2\n\nxyz\0",
         "malformed frame", "frame body longer than content-length (no NUL after it)", "r-b"),
    Case("content-length-not-a-number-with-receipt",
         b"SEND\ndestination:/queue/errors.x\nreceipt:r\\cn\ncontent-length:x\n\nx\0",
         "malformed frame", "content-length is not a decimal number: 'x'", "r:n"),
    Case("declared-body-over-max-size-with-receipt",
         f"SEND\ndestination:/queue/errors.x\nreceipt:r-big\ncontent-length:{OVER}\n\n".encode(),
         "frame too large", f"content-length {OVER} over the limit of {MAX_MSG} octets",
         "r-big"),
    # a header block that never ends: refused once it is over the limit, not at its end
    Case("header-block-over-64KiB", b"SEND\ndestination:/queue/errors.x\nh:" + b"a" * 70000,
         "frame too large", "header block longer than 65536 octets"),
    Case("more-than-1000-headers", b"SEND\ndestination:/queue/errors.x\n"
         + b"".join(b"h%d:v\n" % i for i in range(1001)) + b"\nx\0",
         "frame too large", "more than 1000 headers"),
    # the body is never sent: the declared length alone is refused
    Case("declared-body-over-max-size",
         f"SEND\ndestination:/queue/errors.x\ncontent-length:{OVER}\n\n".encode(),
         "frame too large", f"content-length {OVER} over the limit of {MAX_MSG} octets"),
    # no NUL yet: refused as soon as more than the limit has arrived
    Case("undeclared-body-over-max-size",
         b"SEND\ndestination:/queue/errors.x\n\n" + b"x" * (MAX_MSG + 100),
         "frame too large", f"frame body over the limit of {MAX_MSG} octets"),
    Case("send-without-destination", frame("SEND", {"receipt": "r-nd"}, b"x"),
         "missing destination header", "SEND needs destination", "r-nd"),
    Case("send-to-unknown-prefix", frame("SEND", {"destination": "/elsewhere/x",
                                                  "receipt": "r-ex"}, b"x"),
         "unknown destination", "'/elsewhere/x': a destination starts with /queue/, /topic/, "
         "/temp-queue/, /temp-topic/, /amq/queue/, /exchange/ or /reply-queue/", "r-ex"),
    Case("send-to-an-unknown-exchange", frame("SEND", {"destination": "/exchange/x/k",
                                                       "receipt": "r-ux"}, b"x"),
         "unknown destination", "'/exchange/x/k': exchange 'x' is not one the gateway has "
         "(amq.topic, amq.direct, amq.fanout)", "r-ux"),
    Case("subscribe-to-a-missing-amq-queue",
         frame("SUBSCRIBE", {"destination": "/amq/queue/errors.none", "id": "1",
                             "receipt": "r-aq"}),
         "unknown destination", "'/amq/queue/errors.none': queue 'errors.none' does not exist "
         "(/amq/queue/ names an existing queue)", "r-aq"),
    Case("hash-not-last-in-a-routing-key",
         frame("SUBSCRIBE", {"destination": "/topic/a.#.b", "id": "1", "receipt": "r-h"}),
         "unknown destination", "'/topic/a.#.b': '#' is supported only as the last word of a "
         "routing key (the gateway's '>')", "r-h"),
    Case("wildcard-in-a-direct-key",
         frame("SEND", {"destination": "/exchange/amq.direct/a.*", "receipt": "r-dk"}, b"x"),
         "unknown destination", "'/exchange/amq.direct/a.*': a direct exchange's routing key "
         "is literal; the gateway's topics read *, # and > as wildcards", "r-dk"),
    Case("send-to-a-prefix-alone", frame("SEND", {"destination": "/queue/"}, b"x"),
         "unknown destination", "'/queue/' names no destination"),
    Case("subscribe-without-id", frame("SUBSCRIBE", {**SEND_X, "receipt": "r-s"}),
         "missing id header", "SUBSCRIBE needs an id (STOMP 1.1+)", "r-s"),
    Case("subscribe-without-id-1.1", frame("SUBSCRIBE", SEND_X),
         "missing id header", "SUBSCRIBE needs an id (STOMP 1.1+)", version="1.1"),
    Case("duplicate-subscription-id",
         frame("SUBSCRIBE", {"id": "s1", "destination": "/queue/errors.y", "receipt": "r-d"}),
         "duplicate subscription id", "subscription 's1' exists", "r-d",
         setup=[(frame("SUBSCRIBE", {"id": "s1", "destination": "/queue/errors.x",
                                     "receipt": "ok"}), "ok")]),
    Case("bad-ack-mode", frame("SUBSCRIBE", {**SEND_X, "id": "1", "ack": "sometimes",
                                             "receipt": "r-a"}),
         "bad ack mode", "ack 'sometimes': use auto, client or client-individual", "r-a"),
    Case("unsupported-transformation",
         frame("SUBSCRIBE", {**SEND_X, "id": "1", "transformation": "jms-map-yaml",
                             "receipt": "r-t"}),
         "unsupported transformation", "'jms-map-yaml': a subscription may ask for jms-byte, "
         "jms-json, jms-map-json, jms-map-xml, jms-object-json, jms-object-xml, "
         "jms-stream-json, jms-xml", "r-t"),
    Case("send-with-unsupported-transformation",
         frame("SEND", {**SEND_X, "transformation": "jms-object-xml", "receipt": "r-st"},
               b"<m/>"),
         "unsupported transformation", "'jms-object-xml': a SEND may name jms-byte, jms-json, "
         "jms-map-json, jms-map-xml, jms-stream-json", "r-st"),
    Case("send-map-xml-not-a-map",
         frame("SEND", {**SEND_X, "transformation": "jms-map-xml", "receipt": "r-mx"},
               b"<string>x</string>"),
         "malformed message", "jms-map-xml body must be a <map> or a <list>, not <string>",
         "r-mx"),
    Case("send-map-json-not-an-object",
         frame("SEND", {**SEND_X, "transformation": "jms-map-json", "receipt": "r-mj"}, b"[1]"),
         "malformed message", "jms-map-json body must be an object", "r-mj"),
    Case("ack-unknown-ack-id", frame("ACK", {"id": "999", "receipt": "r-ack"}),
         "unknown ack id", "no message was sent with ack '999'", "r-ack"),
    Case("ack-without-id", frame("ACK", {"receipt": "r-ack2"}),
         "missing id header", "ACK needs the ack id", "r-ack2"),
    Case("nack-in-1.0", frame("NACK", {"message-id": "m-1", "receipt": "r-n"}),
         "unknown command", "NACK is STOMP 1.1 and later", "r-n", version="1.0"),
    Case("commit-unknown-transaction", frame("COMMIT", {"transaction": "tx9", "receipt": "r-c"}),
         "unknown transaction", "no transaction 'tx9' was begun", "r-c"),
    Case("send-in-unknown-transaction",
         frame("SEND", {**SEND_X, "transaction": "tx8", "receipt": "r-st8"}, b"x"),
         "unknown transaction", "no transaction 'tx8' was begun", "r-st8"),
    Case("begin-twice", frame("BEGIN", {"transaction": "tx1", "receipt": "r-b"}),
         "transaction already begun", "transaction 'tx1' is open", "r-b",
         setup=[(frame("BEGIN", {"transaction": "tx1", "receipt": "ok"}), "ok")]),
    Case("begin-without-transaction", frame("BEGIN", {"receipt": "r-b2"}),
         "missing transaction header", "BEGIN needs one", "r-b2"),
    Case("bad-priority", frame("SEND", {**SEND_X, "priority": "high", "receipt": "r-p"}, b"x"),
         "malformed message", "priority must be a digit 0-9, not 'high'", "r-p"),
    Case("bad-expires", frame("SEND", {**SEND_X, "expires": "tomorrow", "receipt": "r-e"}, b"x"),
         "malformed message", "expires must be a number of milliseconds, not 'tomorrow'", "r-e"),
    Case("invalid-selector",
         frame("SUBSCRIBE", {**SEND_X, "id": "1", "selector": "color = = 'red'",
                             "receipt": "r-sel"}),
         "invalid selector", "unexpected '='; expected (, + or -, FALSE, TRUE, a number, a "
         "string literal, an identifier\n  color = = 'red'\n          ^", "r-sel"),
    Case("durable-subscription-without-client-id",
         frame("SUBSCRIBE", {"destination": "/topic/errors.t", "id": "1",
                             "activemq.subscriptionName": "d1", "receipt": "r-du"}),
         "durable subscription needs a client-id",
         "send client-id in CONNECT to name durable subscriptions", "r-du"),
    Case("durable-subscription-on-a-queue",
         frame("SUBSCRIBE", {**SEND_X, "id": "1", "durable-subscription-name": "d1",
                             "receipt": "r-dq"}),
         "durable subscriptions are for topics", "/queue/errors.x", "r-dq"),
    # a raw CR inside a header line (STOMP 1.2 "Augmented BNF"; 1.1 and 1.0 cannot escape
    # it back either)
    Case("raw-cr-in-a-header-1.1", b"SEND\ndestination:/queue/errors.x\nreceipt:a\rb\n\nx\0",
         "malformed frame", "CR not followed by LF in a header line", version="1.1"),
    Case("raw-cr-in-a-header-1.0", b"SEND\ndestination:/queue/errors.x\nreceipt:a\rb\n\nx\0",
         "malformed frame", "CR not followed by LF in a header line", version="1.0"),
    Case("bad-heart-beat", frame("CONNECT", {"accept-version": "1.2", "heart-beat": "10",
                                             "receipt": "r-hb"}),
         "bad heart-beat header", "'10' is not two numbers cx,cy", "r-hb", connect=False),
    Case("bad-heart-beat-not-numbers",
         frame("CONNECT", {"accept-version": "1.2", "heart-beat": "a,b"}),
         "bad heart-beat header", "'a,b' is not two numbers cx,cy", connect=False),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_refusal_is_one_error_frame_and_closes_only_that_connection(gw, clients, case):
    bystander = Bystander(clients(), f"bystander.{case.id}")
    c = clients()
    kept = f"kept.{case.id}"
    if case.connect:
        c.connect(case.version)
        c.request(frame("SEND", {"destination": f"/queue/{kept}", "persistent": "true",
                                 "receipt": "kept"}, b"confirmed before"), "kept")
        for data, receipt in case.setup:
            c.request(data, receipt)
    else:
        c.version = case.version
    c.send(case.bad)
    got = c.frames_until_closed()
    assert [f.command for f in got] == ["ERROR"], got
    check_error(got[0], case.message, case.body, case.receipt)
    if case.connect:
        assert pending(gw, kept) == 1  # confirmed before the bad frame: still there
    bystander.still_works()


def test_unsupported_version_is_refused_with_the_versions_we_speak(gw, clients):
    bystander = Bystander(clients(), "bystander.version")
    c = clients()
    c.send(frame("CONNECT", {"accept-version": "2.0", "host": "gw", "receipt": "r-v"}))
    (err,) = c.frames_until_closed()
    assert err.command == "ERROR"
    assert err["version"] == "1.0,1.1,1.2"  # STOMP 1.2 "Protocol Negotiation"
    check_error(err, "unsupported protocol version",
                "Supported protocol versions are 1.0 1.1 1.2, not 2.0", "r-v")
    bystander.still_works()


def test_subscribe_without_id_works_in_stomp_1_0(gw, clients):
    c = clients()
    c.connect("1.0")
    assert c.version == "1.0"
    c.request(frame("SUBSCRIBE", {"destination": "/queue/errors.v10", "receipt": "s"}), "s")
    c.request(frame("SEND", {"destination": "/queue/errors.v10", "receipt": "p"}, b"one-oh"),
              "p")
    got = c.frame()
    assert (got.command, got.body) == ("MESSAGE", b"one-oh")
    assert got["subscription"] == "/queue/errors.v10"  # 1.0: the destination names it
    # 1.0 unsubscribes by destination too
    c.request(frame("UNSUBSCRIBE", {"destination": "/queue/errors.v10", "receipt": "u"}), "u")
    c.request(frame("SEND", {"destination": "/queue/errors.v10", "receipt": "p2"}, b"later"),
              "p2")
    assert c.nothing()
    assert pending(gw, "errors.v10") == 1


def test_a_header_a_version_cannot_carry_is_left_out_and_the_message_arrives(gw, clients):
    """1.0 has no escapes (a LF cannot be in a value), 1.1 none for CR: such a header is not
    sent to those subscribers, who still get the message; 1.2 gets it escaped."""
    subs = {}
    for version in ("1.0", "1.1", "1.2"):
        c = subs[version] = clients()
        c.connect(version)
        c.request(frame("SUBSCRIBE", {"id": "1", "destination": "/topic/errors.lines",
                                      "receipt": "s"}), "s")
    p = clients()
    p.connect("1.2")
    p.request(b"SEND\ndestination:/topic/errors.lines\nlf:a\\nb\ncr:a\\rb\nok:fine\n"
              b"receipt:p\n\nbody\0", "p")
    got = {v: c.frame() for v, c in subs.items()}
    assert {v: (m.command, m.body, m["ok"]) for v, m in got.items()} == {
        v: ("MESSAGE", b"body", "fine") for v in subs}
    assert (got["1.2"]["lf"], got["1.2"]["cr"]) == ("a\nb", "a\rb")
    assert (got["1.1"]["lf"], got["1.1"].get("cr")) == ("a\nb", None)
    assert (got["1.0"].get("lf"), got["1.0"].get("cr")) == (None, None)
    for c in subs.values():  # all still connected
        c.request(frame("UNSUBSCRIBE", {"id": "1", "receipt": "u"}), "u")


def test_duplicate_client_id_is_refused_and_the_first_connection_goes_on(gw, clients):
    first = clients()
    first.connect(**{"client-id": "dup-client"})
    first.request(frame("SUBSCRIBE", {"id": "1", "destination": "/queue/errors.dup",
                                      "receipt": "s"}), "s")
    second = clients()
    second.send(frame("CONNECT", {"accept-version": "1.2", "client-id": "dup-client",
                                  "receipt": "r-dup"}))
    (err,) = second.frames_until_closed()
    check_error(err, "CONNECT refused", "client id 'dup-client' is already connected", "r-dup")
    first.request(frame("SEND", {"destination": "/queue/errors.dup", "receipt": "p"}, b"mine"),
                  "p")
    got = first.frame()
    assert (got.command, got.body) == ("MESSAGE", b"mine")


def test_valid_frames_before_a_malformed_one_in_the_same_read_are_handled(gw, clients):
    """STOMP frames are handled in order: the CONNECT and the SEND that precede a broken
    frame in one TCP segment take effect, and the CONNECTED comes before the ERROR."""
    c = clients()
    c.send(frame("CONNECT", {"accept-version": "1.2"})
           + frame("SEND", {"destination": "/queue/errors.pipelined", "persistent": "true"},
                   b"before the bad one")
           + b"SEND\ndestination:/queue/errors.pipelined\nno colon here\n\nx\0")
    got = c.frames_until_closed()
    assert [f.command for f in got] == ["CONNECTED", "ERROR"], got
    check_error(got[1], "malformed frame", "header line has no colon: 'no colon here'", None)
    assert pending(gw, "errors.pipelined") == 1


# --- login ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def auth_gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    g = GatewayThread(tmp_path_factory.mktemp("stomp-auth") / "gw",
                      gateway="listen = stomp://127.0.0.1:0\nauthorization = enabled\n"
                              "allow_anonymous = disabled\n",
                      users='alice:pw1:"Alice"\n').start()
    yield g
    g.stop()


@pytest.mark.parametrize(("login", "body"), [
    ({"login": "alice", "passcode": "wrong"}, "authentication failed for user 'alice'"),
    ({"login": "mallory", "passcode": "pw1"}, "authentication failed for user 'mallory'"),
    ({}, "anonymous connections are not allowed"),
], ids=["wrong-passcode", "unknown-user", "anonymous"])
def test_login_refused(auth_gw, clients, login, body):
    port = auth_gw.port("stomp")
    alice = clients(port)
    alice.connect(login="alice", passcode="pw1")
    alice.request(frame("SUBSCRIBE", {"id": "1", "destination": "/queue/auth.q",
                                      "receipt": "s"}), "s")
    c = clients(port)
    c.send(frame("CONNECT", {"accept-version": "1.2", "host": "gw", **login,
                             "receipt": "r-login"}))
    (err,) = c.frames_until_closed()
    check_error(err, "authentication failed", body, "r-login")
    alice.request(frame("SEND", {"destination": "/queue/auth.q", "receipt": "p"}, b"ok"), "p")
    assert alice.frame().body == b"ok"


# --- a consumer that vanishes -----------------------------------------------------------------


@pytest.mark.parametrize("ack", ["client", "client-individual"])
def test_a_client_that_vanishes_mid_delivery_loses_nothing(gw, clients, ack):
    queue = f"errors.vanish.{ack}"
    producer = clients()
    producer.connect()
    for i in range(5):
        producer.request(frame("SEND", {"destination": f"/queue/{queue}", "persistent": "true",
                                        "receipt": f"p{i}"}, f"job {i}".encode()), f"p{i}")
    taker = clients()
    taker.connect()
    taker.request(frame("SUBSCRIBE", {"id": "t", "destination": f"/queue/{queue}", "ack": ack,
                                      "activemq.prefetchSize": "3", "receipt": "s"}), "s")
    taken = [taker.frame() for _ in range(3)]
    assert [m.body for m in taken] == [b"job 0", b"job 1", b"job 2"]
    assert all(m.get("redelivered") is None for m in taken)
    assert taker.nothing()  # the prefetch window is full
    # ACK the first one only (in client mode, ACK of job 0 settles job 0 alone: the first)
    taker.request(frame("ACK", {"id": taken[0]["ack"], "receipt": "a"}), "a")
    third = taker.frame()  # the window has room for one more
    assert (third.body, third.get("redelivered")) == (b"job 3", None)
    taker.sock.shutdown(socket.SHUT_RDWR)  # gone, without DISCONNECT or more ACKs
    taker.close()
    other = clients()
    other.connect()
    other.request(frame("SUBSCRIBE", {"id": "o", "destination": f"/queue/{queue}",
                                      "ack": "client-individual", "receipt": "s2"}), "s2")
    got = [other.frame() for _ in range(4)]
    assert sorted((m.body, m.get("redelivered")) for m in got) == [
        (b"job 1", "true"), (b"job 2", "true"), (b"job 3", "true"), (b"job 4", None)]
    for m in got:
        other.request(frame("ACK", {"id": m["ack"], "receipt": "ack-" + m["ack"]}),
                      "ack-" + m["ack"])
    assert other.nothing()
    assert pending(gw, queue) == 0


# --- chunking --------------------------------------------------------------------------------


def test_a_session_sent_one_byte_at_a_time_works(gw, clients):
    c = clients()
    session = (
        b"CONNECT\r\naccept-version:1.1,1.2\r\nhost:gw\r\n\r\n\0"
        + b"\n\r\n"  # heart-beats between frames
        + frame("SUBSCRIBE", {"id": "1", "destination": "/queue/errors.bytewise",
                              "receipt": "s"})
        + frame("SEND", {"destination": "/queue/errors.bytewise", "content-length": "5",
                         "h": "a\\cb\\\\c\\nd", "receipt": "p"}, b"x\0y\0z")
        + frame("SEND", {"destination": "/queue/errors.bytewise", "receipt": "p2"},
                "grüße".encode())
    )
    for i in range(len(session)):
        c.send(session[i:i + 1])
        time.sleep(0.0005)
    connected = c.frame()
    assert (connected.command, connected["version"]) == ("CONNECTED", "1.2")
    c.version = "1.2"
    seen = [c.frame() for _ in range(5)]
    receipts = [f["receipt-id"] for f in seen if f.command == "RECEIPT"]
    messages = [f for f in seen if f.command == "MESSAGE"]
    assert receipts == ["s", "p", "p2"]
    assert [m.body for m in messages] == [b"x\0y\0z", "grüße".encode()]
    assert messages[0]["h"] == "a:b\\c\nd"
    c.send(frame("DISCONNECT", {"receipt": "bye"}))
    (bye,) = c.frames_until_closed()
    assert (bye.command, bye["receipt-id"]) == ("RECEIPT", "bye")
