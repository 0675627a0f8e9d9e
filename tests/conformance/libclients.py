"""Two independent MQTT 5 client libraries behind one small blocking interface.

How this works. :class:`PahoClient` drives paho-mqtt 2 (its own network thread,
``loop_start``); :class:`GmqttClient` drives gmqtt, an asyncio client, on an event loop of
its own in a background thread, each call handed to that loop and waited for. Both connect
in the constructor and give the same view of what happened: the CONNACK (``session_present``,
``rc``, ``connack_props``), the messages received (:class:`Received`, properties as a dict
with the MQTT 5 names in snake case, e.g. ``message_expiry_interval``), and the DISCONNECT
reasons the server sent. Scenarios written against this interface run with both libraries,
so a finding does not rest on one library's reading of the protocol.

Neither library reconnects on its own here: a test that wants a new connection makes one.
"""

from __future__ import annotations

import asyncio
import queue
import re
import socket
import threading
from typing import Any, NamedTuple

import gmqtt
import paho.mqtt.client as mqtt
from gmqtt.mqtt.constants import MQTTv50
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

LIBS = ("paho", "gmqtt")
TIMEOUT = 10.0  # seconds to wait for what must arrive


class Received(NamedTuple):
    topic: str
    payload: bytes
    qos: int
    retain: bool
    props: dict[str, Any]
    dup: bool = False


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _paho_props(props: Properties | None) -> dict[str, Any]:
    if props is None:
        return {}
    return {_snake(k): v for k, v in props.json().items()}


def _paho_build(packet: int, values: dict[str, Any] | None) -> Properties | None:
    if not values:
        return None
    p = Properties(packet)
    for k, v in values.items():
        setattr(p, "".join(w.title() for w in k.split("_")), v)
    return p


def _gmqtt_props(props: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in (props or {}).items():
        if k in ("dup", "retain"):
            continue
        out[k] = v[0] if isinstance(v, list) and len(v) == 1 else v
    return out


class _Base:
    session_present: bool
    rc: int
    connack_props: dict[str, Any]

    def __init__(self) -> None:
        self.messages: queue.Queue[Received] = queue.Queue()
        self.disconnects: queue.Queue[int] = queue.Queue()

    def get(self, timeout: float = TIMEOUT) -> Received:
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("no message within the timeout") from None

    def none(self, timeout: float = 0.5) -> bool:
        """True if no message arrives within ``timeout``."""
        try:
            m = self.messages.get(timeout=timeout)
        except queue.Empty:
            return True
        self.messages.put(m)
        return False

    def drain(self, timeout: float = 0.5) -> list[Received]:
        out = []
        while True:
            try:
                out.append(self.messages.get(timeout=timeout))
            except queue.Empty:
                return out

    def server_disconnect(self, timeout: float = TIMEOUT) -> int:
        """The reason code of the server's DISCONNECT (or of the lost connection)."""
        return self.disconnects.get(timeout=timeout)


class PahoClient(_Base):
    """paho-mqtt 2, MQTT 5; see the module docstring."""

    def __init__(self, port: int, cid: str, *, clean: bool = True,
                 props: dict[str, Any] | None = None, keepalive: int = 60,
                 will: tuple[str, bytes, int, bool, dict[str, Any]] | None = None) -> None:
        super().__init__()
        c = self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=cid,
                                 protocol=mqtt.MQTTv5)
        self._connack: queue.Queue[tuple[Any, Any, Any]] = queue.Queue()
        self._subacks: queue.Queue[Any] = queue.Queue()

        def on_message(_c: Any, _u: Any, m: Any) -> None:
            self.messages.put(Received(m.topic, m.payload, m.qos, bool(m.retain),
                                       _paho_props(getattr(m, "properties", None)),
                                       bool(m.dup)))

        def on_disconnect(_c: Any, _u: Any, _f: Any, rc: Any, _p: Any = None) -> None:
            self.disconnects.put(int(getattr(rc, "value", rc)))

        c.on_message = on_message
        c.on_connect = lambda _c, _u, f, rc, p=None: self._connack.put((f, rc, p))
        c.on_disconnect = on_disconnect
        c.on_subscribe = lambda _c, _u, _mid, rcs, _p=None: self._subacks.put(rcs)
        c.reconnect_delay_set(3600, 3600)
        if will is not None:
            topic, payload, qos, retain, wprops = will
            c.will_set(topic, payload, qos, retain,
                       _paho_build(PacketTypes.WILLMESSAGE, wprops))
        c.connect("127.0.0.1", port, keepalive, clean_start=clean,
                  properties=_paho_build(PacketTypes.CONNECT, props))
        c.loop_start()
        flags, rc, p = self._connack.get(timeout=TIMEOUT)
        self.session_present = bool(flags.session_present)
        self.rc = int(getattr(rc, "value", rc))
        self.connack_props = _paho_props(p)

    def sub(self, flt: str, qos: int = 2) -> list[int]:
        self.c.subscribe(flt, qos=qos)
        return [int(getattr(r, "value", r)) for r in self._subacks.get(timeout=TIMEOUT)]

    def pub(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False,
            props: dict[str, Any] | None = None) -> None:
        info = self.c.publish(topic, payload, qos=qos, retain=retain,
                              properties=_paho_build(PacketTypes.PUBLISH, props))
        info.wait_for_publish(TIMEOUT)
        assert info.is_published(), f"publish to {topic!r} not acknowledged"

    def disconnect(self, props: dict[str, Any] | None = None, reason: int = 0) -> None:
        from paho.mqtt.reasoncodes import ReasonCode

        rc = ReasonCode(PacketTypes.DISCONNECT, identifier=reason)
        self.c.disconnect(rc, _paho_build(PacketTypes.DISCONNECT, props))
        self.c.loop_stop()

    def kill(self) -> None:
        """Drop the TCP connection without a DISCONNECT (the will is published)."""
        self.c.loop_stop()
        sock = self.c.socket()
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    close = kill


class GmqttClient(_Base):
    """gmqtt, MQTT 5, on an event loop in its own thread; see the module docstring."""

    def __init__(self, port: int, cid: str, *, clean: bool = True,
                 props: dict[str, Any] | None = None, keepalive: int = 60,
                 will: tuple[str, bytes, int, bool, dict[str, Any]] | None = None) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        will_msg = None
        if will is not None:
            topic, payload, qos, retain, wprops = will
            will_msg = gmqtt.Message(topic, payload, qos=qos, retain=retain, **wprops)
        self._subacks: queue.Queue[list[int]] = queue.Queue()

        def make() -> gmqtt.Client:
            c = gmqtt.Client(cid or None, clean_session=clean, will_message=will_msg,
                             **(props or {}))
            c.set_config({"reconnect_retries": 0, "reconnect_delay": 3600})
            return c

        self.c = self._run_sync(make)
        self.c.on_message = self._on_message
        self.c.on_subscribe = lambda _c, _mid, qos, _p: self._subacks.put(list(qos))
        self.c.on_disconnect = lambda _c, packet, exc=None: self.disconnects.put(
            packet.reason_code if packet is not None and hasattr(packet, "reason_code") else -1)
        connack: dict[str, Any] = {}

        def on_connect(_c: Any, flags: Any, rc: int, props: Any) -> None:
            connack.update(flags=flags, rc=rc, props=props)

        self.c.on_connect = on_connect
        self._run(self.c.connect("127.0.0.1", port, keepalive=keepalive, version=MQTTv50))
        self.session_present = bool(connack.get("flags"))
        self.rc = int(connack.get("rc", -1))
        self.connack_props = _gmqtt_props(connack.get("props"))

    def _on_message(self, _c: Any, topic: str, payload: bytes, qos: int,
                    props: dict[str, Any]) -> int:
        retain = bool(props.get("retain"))
        self.messages.put(Received(topic, payload, qos, retain, _gmqtt_props(props),
                                   bool(props.get("dup"))))
        return 0

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=TIMEOUT)

    def _run_sync(self, fn: Any) -> Any:
        async def call() -> Any:
            return fn()

        return self._run(call())

    def sub(self, flt: str, qos: int = 2) -> list[int]:
        self._run_sync(lambda: self.c.subscribe(flt, qos=qos))
        return self._subacks.get(timeout=TIMEOUT)

    def pub(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False,
            props: dict[str, Any] | None = None) -> None:
        storage = self.c._persistent_storage

        def send() -> None:
            self.c.publish(topic, payload, qos=qos, retain=retain, **(props or {}))

        self._run_sync(send)
        if qos:
            async def acked() -> None:
                await storage.wait_empty()

            self._run(acked())

    def disconnect(self, props: dict[str, Any] | None = None, reason: int = 0) -> None:
        self._run(self.c.disconnect(reason_code=reason, **(props or {})))
        self._stop()

    def kill(self) -> None:
        if self.loop.is_closed():
            return

        def abort() -> None:
            self.c._is_active = False  # no reconnect
            conn = self.c._connection
            if conn is not None:
                conn._transport.abort()

        self._run_sync(abort)
        self._stop()

    close = kill

    def _stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=TIMEOUT)
        if not self.loop.is_running() and not self.loop.is_closed():
            for task in asyncio.all_tasks(self.loop):
                task.cancel()
            self.loop.run_until_complete(asyncio.sleep(0))
            self.loop.close()


def connect(lib: str, port: int, cid: str, **kw: Any) -> PahoClient | GmqttClient:
    """A connected MQTT 5 client of library ``lib`` (``"paho"`` or ``"gmqtt"``)."""
    if lib == "paho":
        return PahoClient(port, cid, **kw)
    return GmqttClient(port, cid, **kw)
