"""paho's MQTT client as the ``mqtt`` transport drives it (``transports/mqtt.py``): its I/O on
the gateway's event loop, and fast paths for the per-message steps where paho costs most.

Why this is here and not in paho. paho-mqtt keeps the MQTT session (connect, subscriptions,
packet ids, in-flight exports and their resends after a reconnect, QoS 2 exchanges,
keepalive) and the transport keeps it; but paho's own loop reads a packet in three or more
``recv`` calls, writes each packet with its own ``send`` and builds objects per packet that
cost more than everything else the transport does per message. What this module adds:

* Buffered I/O (:class:`Client`): what paho writes in one loop iteration goes out at once,
  and paho's reads are served from what arrived. Over plain TCP the socket is handed to the
  loop as a transport (:class:`Wire`), which reads and writes it: uvloop does so without
  releasing the GIL, which a ``send`` from Python does -- and then waits for the store's or
  the delivery log's thread to give it back. Over TLS the socket stays paho's
  ``SSLSocket``, watched with ``add_reader`` as paho's ``loop_asyncio`` example does (a
  read takes all the socket has, a write is one ``send``, ``add_writer`` only while the
  socket is full).
* Fast paths for the common case only, each checked against paho's result for the same
  bytes (``tests/unit/test_transport_mqtt_acks.py``): a plain success PUBACK / PUBCOMP
  (paho builds a ``ReasonCode``, which copies a table of names, and ``Properties`` for
  each), a QoS 0 / 1 PUBLISH (read with the MQTT adapter's codec helpers instead of paho's
  ``MQTTMessage`` and ``Properties``), whole packets of both kinds taken straight from the
  input buffer without paho's packet reader, the PUBACK of an import, and the encoding of a
  QoS 1 / 2 export (with the adapter's encoder, entered in paho's session as paho's
  ``publish`` enters it, with a progress record that needs no ``threading.Condition``).
  Anything unusual goes to paho's own code.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import Any, Protocol

import paho.mqtt.client as paho
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from adapters.mqtt.encoding import encode_publish
from adapters.mqtt.packets import PUBLISH, MqttRemoteProtocolError
from adapters.mqtt.properties import encode_properties, read_properties

READ_SIZE = 65536  # bytes asked of the socket at once
_PUBACK = struct.Struct("!BBH")  # fixed header, remaining length 2, packet id

# MQTT 5 PUBLISH properties: the codec's names (mappings.mqtt) ↔ paho's.
PAHO_NAMES = {
    "payload_format_indicator": "PayloadFormatIndicator",
    "message_expiry_interval": "MessageExpiryInterval",
    "content_type": "ContentType",
    "response_topic": "ResponseTopic",
    "correlation_data": "CorrelationData",
    "user_property": "UserProperty",
}


class Client(paho.Client):
    """paho's client with its socket I/O buffered (paho reads a packet in three or more
    ``recv`` calls and writes each packet with its own ``send``: on a busy link those system
    calls cost more than the rest of paho).

    While :attr:`buffered` is on (the transport sets it once connected; the blocking connect
    in an executor thread runs unbuffered), reads are served from what the :class:`Wire`
    received (:meth:`feed`), or over TLS from one ``recv`` of up to :data:`READ_SIZE` bytes,
    and writes are collected in :attr:`out` for the transport to send once per loop
    iteration (:meth:`flush`: into the wire, or ``send``). Both buffers are dropped with the
    socket; what was unconfirmed is resent by paho after reconnecting, as without buffers.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.buffered = False
        self.inbuf = b""
        self.inpos = 0
        self.out = bytearray()
        # Called for each QoS 0 / 1 PUBLISH instead of on_message (see _handle_publish).
        self.on_publish_packet: Callable[..., None] | None = None
        # The event loop's transport over the socket (plain TCP), when it does the I/O.
        self.wire: asyncio.Transport | None = None
        self.wire_loop: asyncio.AbstractEventLoop | None = None
        self.eof = False  # the wire's connection is gone: reads end once the input is taken
        self.hold = False  # the transport paused reading: take_packets stops

    def feed(self, data: bytes) -> None:
        """Bytes the wire received: paho reads them through :meth:`_sock_recv`."""
        pos = self.inpos
        if pos >= len(self.inbuf):
            self.inbuf = data
        else:
            self.inbuf = self.inbuf[pos:] + data
        self.inpos = 0

    def _sock_recv(self, bufsize: int) -> bytes:
        data, pos = self.inbuf, self.inpos
        if pos >= len(data):
            if self.wire is not None:
                if self.eof:
                    return b""
                raise BlockingIOError
            # TLS: read until the socket says it is empty (it may hold decrypted bytes that
            # no readable event announces). BlockingIOError when empty, b"" at EOF.
            data = super()._sock_recv(READ_SIZE)
            if len(data) <= bufsize:
                self.inbuf, self.inpos = b"", 0
                return data
            self.inbuf, pos = data, 0
        end = pos + bufsize
        self.inpos = end
        return data[pos:end]

    def _sock_send(self, buf: bytes | bytearray) -> int:
        if not self.buffered:
            return super()._sock_send(buf)
        self.out += buf
        return len(buf)

    def _handle_pubackcomp(self, cmd: Any) -> MQTTErrorCode:
        """paho's PUBACK / PUBCOMP handler, without its cost for the usual acknowledgement.

        An acknowledgement without properties (remaining length 2: success, MQTT 5.0
        3.4.2.1; or 3 / 4 with a reason code and an empty property block -- mosquitto says
        0x10 "No matching subscribers" for a topic nobody reads) is what nearly every
        acknowledgement is: paho decodes each into a fresh ``ReasonCode`` (which copies a
        table of ~50 names) and ``Properties``, and rescans every in-flight message
        afterwards; together that costs more than the rest of an export. Here such an
        acknowledgement does what paho's ``_do_on_publish`` does -- ``on_publish`` with a
        shared reason code object of the same value, then the message leaves
        ``_out_messages`` and the in-flight count -- and paho's own handler takes everything
        else (properties, a code the packet type does not allow).
        """
        packet = self._in_packet["packet"]
        n = len(packet)
        codes = _ACK_REASONS[cmd]
        reason: ReasonCode | None = None
        if n == 2:
            reason = codes[0]
        elif n == 3 or (n == 4 and not packet[3]):
            reason = codes.get(packet[2])
        if reason is None:  # properties, or a code this packet type does not have
            return super()._handle_pubackcomp(cmd)  # type: ignore[no-any-return]
        return self._settle((packet[0] << 8) | packet[1], reason)

    def _settle(self, mid: int, reason: ReasonCode) -> MQTTErrorCode:
        """What paho's ``_do_on_publish`` does for a plain acknowledgement of ``mid``."""
        with self._out_message_mutex:
            out = self._out_messages
            msg = out.get(mid)
            if msg is None:
                return MQTTErrorCode.MQTT_ERR_SUCCESS
            on_publish: Any = self.on_publish  # the VERSION2 signature (the transport's)
            if on_publish is not None:
                on_publish(self, self._userdata, mid, reason, _NO_PROPERTIES)
            out.pop(mid, None)
            msg.info._set_as_published()
            if msg.qos > 0:
                self._inflight_messages -= 1
                if len(out) > self._inflight_messages:  # some wait for a free slot
                    return self._update_inflight()  # type: ignore[no-any-return]
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    def take_packets(self, limit: int) -> tuple[int, MQTTErrorCode]:
        """Handle the whole packets at the head of the buffered input that need nothing of
        paho's reader (a dict of read state and three ``recv`` calls a packet, on a busy
        link most of what the transport does per message): plain PUBACK / PUBCOMP (four
        bytes each: success, MQTT 5.0 3.4.2.1), settled as :meth:`_handle_pubackcomp`
        settles them, and QoS 0 / 1 PUBLISH packets, handed on as :meth:`_handle_publish`
        hands them. Stops at anything else, at a packet not wholly buffered, after
        ``limit`` packets, and when :attr:`hold` is set (the transport paused reading).

        Only between packets (paho is not half-way through one). Returns how many it took
        and the result of the last (an error from resending what waited for a free slot is
        for paho's loop to handle).
        """
        rc = MQTTErrorCode.MQTT_ERR_SUCCESS
        if self._in_packet["command"]:
            return 0, rc
        data = self.inbuf
        pos = self.inpos
        end = len(data)
        deliver = self.on_publish_packet if self._manual_ack else None
        taken = 0
        while taken < limit and pos + 2 <= end and not self.hold:
            first = data[pos]
            if first == 0x40 or first == 0x70:
                if data[pos + 1] != 2 or pos + 4 > end:
                    break
                mid = (data[pos + 2] << 8) | data[pos + 3]
                pos += 4
                self.inpos = pos
                rc = self._settle(mid, ACK_SUCCESS if first == 0x40 else COMP_SUCCESS)
            elif (first & 0xF0) == 0x30 and (first & 0x06) < 4 and deliver is not None:
                p = pos + 1  # the Remaining Length: one to four bytes
                length = mult = 0
                while True:
                    if p >= end or mult > 21:
                        length = -1
                        break
                    byte = data[p]
                    p += 1
                    length |= (byte & 0x7F) << mult
                    mult += 7
                    if not byte & 0x80:
                        break
                stop = p + length
                if length < 2 or stop > end:
                    break
                parsed = self._parse_publish(first, data, p, stop)
                if parsed is None:
                    break
                pos = stop
                self.inpos = pos
                deliver(self, *parsed)
            else:
                break
            taken += 1
            if rc or self.inbuf is not data:  # an error, or the socket went with its buffer
                break
        if taken:
            with self._msgtime_mutex:
                self._last_bytes_received = paho.time_func()
        return taken, rc

    def _handle_publish(self) -> MQTTErrorCode:
        """paho's PUBLISH handler, without its cost for a QoS 0 / 1 message.

        paho decodes each PUBLISH into an ``MQTTMessage`` with a ``Properties`` object and
        matches it against its callback filters: more than the transport's own import work.
        A QoS 0 / 1 PUBLISH is read here with the MQTT adapter's codec helpers and handed to
        :attr:`on_publish_packet` with its properties by the codec's names (the six a
        message keeps, as the transport reads them from paho); with ``manual_ack`` on, as
        the transport has it, paho would do nothing else for it. QoS 2 (paho keeps its
        exchange state), a packet that does not parse (paho reports it its own way) and
        one with properties a message does not keep (a Topic Alias the transport never
        allowed) go to paho's handler.
        """
        deliver = self.on_publish_packet
        command = self._in_packet["command"]
        if deliver is None or (command >> 1) & 3 > 1 or not self._manual_ack:
            return super()._handle_publish()  # type: ignore[no-any-return]
        data = bytes(self._in_packet["packet"])  # paho reads into a bytearray
        parsed = self._parse_publish(command, data, 0, len(data))
        if parsed is None:
            return super()._handle_publish()  # type: ignore[no-any-return]
        deliver(self, *parsed)
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    def _parse_publish(self, command: int, data: bytes, p: int,
                       end: int) -> tuple[str, bytes, int, bool, int, dict[str, Any]] | None:
        """The QoS 0 / 1 PUBLISH whose variable header starts at ``data[p]`` and which ends at
        ``end``, as :attr:`on_publish_packet`'s arguments; None for what paho must judge."""
        qos = (command >> 1) & 3
        try:
            start = p + 2
            p = start + ((data[p] << 8) | data[p + 1])
            topic = data[start:p].decode()
            mid = 0
            if qos:
                mid = (data[p] << 8) | data[p + 1]
                p += 2
            props: dict[str, Any] = {}
            if self._protocol == paho.MQTTv5:
                props, p = read_properties(data, p, end, PUBLISH)
        except (IndexError, UnicodeDecodeError, MqttRemoteProtocolError):
            return None
        if p > end or not topic or not _KEPT_PROPERTIES.issuperset(props):
            return None
        return topic, data[p:end], qos, bool(command & 1), mid, props

    def publish_fields(self, topic: str, payload: bytes, qos: int,
                       fields: dict[str, Any] | None) -> int | None:
        """paho's ``publish`` of a QoS 1 / 2 message, with the PUBLISH encoded by the MQTT
        adapter's encoder (``fields``: MQTT 5 properties by the codec's names).

        The message is entered in paho's ``_out_messages`` and in-flight count exactly as
        paho's ``publish`` enters it, so paho acknowledges it, and resends it after a
        reconnect, as its own; only the per-message objects paho builds on the way (a topic
        check on bytes, a packet built byte by byte, its logging calls, the packet record
        its writer takes) are not made: the bytes go straight into :attr:`out`, or after
        paho's own packets when some still wait to be written.
        Returns the packet id, or None when paho's ``publish`` must take the message (QoS 0,
        not connected, paho's window full: paho queues or refuses it its own way).

        Raises:
            MqttLocalProtocolError: the topic is not a valid topic name.
        """
        if (qos == 0 or self._sock is None or not self.buffered
                or self._inflight_messages >= self._max_inflight_messages > 0):
            return None
        v5 = self._protocol == paho.MQTTv5
        mid = self._mid_generate()
        data = encode_publish(topic, payload, qos, False, False, mid, fields if v5 else None,
                              5 if v5 else 4)
        message = _OutMessage(mid, topic.encode())
        message.timestamp = paho.time_func()
        message.payload = payload
        message.qos = qos
        message.properties = Packed(fields) if v5 and fields else None  # type: ignore[assignment]
        with self._out_message_mutex:
            out = self._out_messages
            if mid in out:  # 65,535 unconfirmed: paho refuses it (MQTT_ERR_QUEUE_SIZE)
                return None
            out[mid] = message
            self._inflight_messages += 1
            message.state = (paho.mqtt_ms_wait_for_puback if qos == 1
                             else paho.mqtt_ms_wait_for_pubrec)
        if self._out_packet:  # some of paho's own packets wait to be written: after them
            self._packet_queue(data[0], data, mid, qos, message.info)
        else:  # straight into the buffer, as paho's writer would put it there
            self.out += data
            self._call_socket_register_write()
        return mid

    def send_puback(self, mid: int) -> None:
        """paho's ``ack(mid, 1)``: the PUBACK of an imported QoS 1 message (success, no
        properties: four bytes in both versions, MQTT 5.0 3.4.2.1) put straight into
        :attr:`out`, without the packet record and log call paho makes for it. paho's own
        path when something of paho's still waits to be written (the order is kept) or the
        buffer is off."""
        if self.buffered and self._sock is not None and not self._out_packet:
            self.out += _PUBACK.pack(0x40, 2, mid)
            self._call_socket_register_write()
            return
        self.ack(mid, 1)

    def has_input(self) -> bool:
        """Bytes read from the socket and not yet taken by paho: no readable event will come
        for them."""
        return self.inpos < len(self.inbuf)

    def _sock_close(self) -> None:
        self.buffered = False
        self.inbuf, self.inpos = b"", 0
        self.out.clear()
        wire, self.wire = self.wire, None
        if wire is not None:
            # The wire holds a reference on the socket: paho's close below leaves the file
            # descriptor to it, and closing the wire closes it (on the loop's thread).
            loop = self.wire_loop
            assert loop is not None
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                wire.close()
            else:
                loop.call_soon_threadsafe(wire.close)
        super()._sock_close()

    def flush(self) -> bool:
        """Send what is buffered; False while some is left (the socket is full)."""
        out = self.out
        wire = self.wire
        if not out:
            return True
        # What went into the buffer straight (exports, PUBACKs) passed no paho writer, which
        # is where paho notes when it last sent something (its keepalive's clock).
        with self._msgtime_mutex:
            self._last_msg_out = paho.time_func()
        if wire is not None:
            wire.write(bytes(out))  # the loop's transport keeps what the socket refuses
            out.clear()
            return True
        while out:
            try:
                n = super()._sock_send(out)
            except BlockingIOError:
                return False
            del out[:n]
        return True


_KEPT_PROPERTIES = frozenset(PAHO_NAMES)  # what an imported PUBLISH's properties may hold

# What the fast acknowledgement path hands to ``on_publish`` (read-only, shared): a reason
# code object per value the packet type allows (MQTT 5.0 3.4.2.1, 3.7.2.1).
_ACK_REASONS: dict[str, dict[int, ReasonCode]] = {
    name: {code: ReasonCode(packet_type, identifier=code)  # type: ignore[no-untyped-call]
           for code, names in ReasonCode.names.items()
           if any(packet_type in types for types in names.values())}
    for name, packet_type in (("PUBACK", PacketTypes.PUBACK), ("PUBCOMP", PacketTypes.PUBCOMP))
}
ACK_SUCCESS = _ACK_REASONS["PUBACK"][0]
COMP_SUCCESS = _ACK_REASONS["PUBCOMP"][0]
# The first byte of what take_packets may take: PUBACK, PUBCOMP, PUBLISH at QoS 0 / 1.
FAST_FIRST = frozenset((0x40, 0x70, 0x30, 0x31, 0x32, 0x33, 0x38, 0x39, 0x3A, 0x3B))
_NO_PROPERTIES = Properties(PacketTypes.PUBACK)  # type: ignore[no-untyped-call]


class _Info(paho.MQTTMessageInfo):
    """paho's record of a message's progress, for the exports :meth:`Client.publish_fields`
    enters: nobody waits on one (paho's ``wait_for_publish``), so there is no
    ``threading.Condition`` a message to make and notify, only the flag."""

    __slots__ = ()

    def __init__(self, mid: int) -> None:
        self.mid = mid
        self._published = False
        self.rc = MQTTErrorCode.MQTT_ERR_SUCCESS
        self._iterpos = 0

    def _set_as_published(self) -> None:
        self._published = True

    def is_published(self) -> bool:
        return self._published

    def wait_for_publish(self, timeout: float | None = None) -> None:
        raise RuntimeError("an export's publication is reported through on_publish")


class _OutMessage(paho.MQTTMessage):
    """paho's ``MQTTMessage`` with an :class:`_Info`."""

    __slots__ = ()

    def __init__(self, mid: int, topic: bytes) -> None:
        self.timestamp = 0.0
        self.state = paho.mqtt_ms_invalid
        self.dup = False
        self.mid = mid
        self._topic = topic
        self.payload = b""
        self.qos = 0
        self.retain = False
        self.info = _Info(mid)
        self.properties = None


class Packed:
    """PUBLISH properties by the codec's names, encoded by the MQTT adapter's codec when paho
    asks (``pack()``, which is all paho does with PUBLISH properties: its own ``Properties``
    class costs more than the rest of an export)."""

    __slots__ = ("fields",)

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields

    def pack(self) -> bytes:
        return encode_properties(self.fields, PUBLISH)

    def __repr__(self) -> str:
        return f"<properties {self.fields!r}>"


class WireOwner(Protocol):
    """What a :class:`Wire` tells of arriving input: the transport."""

    client: Client | None
    reading_paused: bool

    def _readable(self) -> None: ...


class Wire(asyncio.Protocol):
    """The event loop's protocol over a plain TCP connection of the paho client.

    A ``send`` / ``recv`` made from Python releases the GIL; when another thread of the
    gateway (the store's writer, the delivery log's) is waiting for it, the loop thread then
    waits in turn until that thread lets go (measured on an export stream: 255 µs a send, 56
    of them in the system call). The loop's own transport (uvloop) reads and writes without
    letting go, so with plain TCP paho's I/O goes through it: what arrives is handed to
    paho's reader (:meth:`Client.feed`, then the transport's read loop), what paho writes
    leaves with ``transport.write``. TLS sockets (paho's ``SSLSocket``) stay with the loop's
    reader callbacks.
    """

    def __init__(self, owner: WireOwner, client: Client) -> None:
        self.owner = owner
        self.client = client

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.client.wire = transport  # type: ignore[assignment]  # (uvloop's is no subclass)

    def data_received(self, data: bytes) -> None:
        c = self.client
        if c.wire is None:  # paho closed the socket: the rest is for nobody
            return
        c.feed(data)
        if self.owner.client is c and not self.owner.reading_paused:
            self.owner._readable()

    def eof_received(self) -> bool | None:
        return None  # close: paho reads the end of the stream and reports the disconnect

    def connection_lost(self, exc: Exception | None) -> None:
        c = self.client
        if c.wire is None:
            return
        c.eof = True
        if self.owner.client is c:
            self.owner._readable()
