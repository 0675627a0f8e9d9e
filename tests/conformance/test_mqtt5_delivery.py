"""MQTT 5 delivery scenarios against a live gateway, run with two independent clients.

How this works. One gateway per module listens for MQTT and STOMP on loopback
(:class:`gw.GatewayThread`). Every scenario runs twice, once with paho-mqtt (v2, MQTTv5) and
once with gmqtt (asyncio), through a small adapter (:class:`Paho`, :class:`Gmqtt`) that gives
both the same blocking interface: ``subscribe`` answers the SUBACK's reason codes, ``get``
the next PUBLISH received as a :class:`Got` (topic, payload, QoS, RETAIN flag and its MQTT 5
properties under the codec's names). Where a scenario must withhold an acknowledgement it
uses :class:`mqttclient.RawClient`, the conformance suite's raw client.

Scenarios are numbered as in ``test_mqtt_conformance.py`` and each docstring names the
normative statements (OASIS MQTT Version 5.0) it checks. Client ids and topics carry the
scenario number and the client's name, so the runs never see each other's traffic. "Nothing
arrives" is checked with a short wait (:data:`NOTHING`); expected packets are waited for.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import gmqtt
import paho.mqtt.client as paho
import pytest
import stomp
from gw import GatewayThread, wait_for
from mqttclient import RawClient
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from adapters.mqtt.packets import PubAck, PubComp, Publish, PubRec, PubRel

NOTHING = 0.5  # seconds to wait for "nothing arrives"

# MQTT 5 PUBLISH properties by the codec's names, and paho's names for them.
PAHO_NAMES = {
    "payload_format_indicator": "PayloadFormatIndicator",
    "message_expiry_interval": "MessageExpiryInterval",
    "content_type": "ContentType",
    "response_topic": "ResponseTopic",
    "correlation_data": "CorrelationData",
    "user_property": "UserProperty",
    "subscription_identifier": "SubscriptionIdentifier",
}


# gmqtt's name that differs from the codec's.
GMQTT_PFI = "payload_format_id"


class Got(NamedTuple):
    """One PUBLISH as a client received it; ``props`` by the codec's property names."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    props: dict[str, Any]


class Sub(NamedTuple):
    """One subscription request (one SUBSCRIBE carries one Subscription Identifier)."""

    filter: str
    qos: int = 1
    no_local: bool = False
    retain_as_published: bool = False


class Paho:
    """paho-mqtt 2 (CallbackAPIVersion.VERSION2) behind the scenarios' interface."""

    name = "paho"

    def __init__(self, port: int, cid: str, *, version: int = 5, clean_start: bool = True,
                 expiry: int = 0) -> None:
        self.v5 = version == 5
        self.c = paho.Client(CallbackAPIVersion.VERSION2, client_id=cid,
                             protocol=paho.MQTTv5 if self.v5 else paho.MQTTv311,
                             **({} if self.v5 else {"clean_session": clean_start}))
        self.received: queue.Queue[Got] = queue.Queue()
        self.acks: queue.Queue[list[int]] = queue.Queue()
        connacks: queue.Queue[Any] = queue.Queue()
        self.c.on_message = lambda c, u, m: self.received.put(self._got(m))
        self.c.on_connect = lambda c, u, f, rc, p=None: connacks.put(rc)
        self.c.on_subscribe = lambda c, u, mid, rcs, p=None: self.acks.put(
            [int(r.value) for r in rcs])
        if self.v5:
            props = None
            if expiry:
                props = Properties(PacketTypes.CONNECT)
                props.SessionExpiryInterval = expiry
            self.c.connect("127.0.0.1", port, clean_start=clean_start, properties=props)
        else:
            self.c.connect("127.0.0.1", port)
        self.c.loop_start()
        assert connacks.get(timeout=10) == 0

    @staticmethod
    def _got(m: Any) -> Got:
        props: dict[str, Any] = {}
        if m.properties is not None:
            for name, paho_name in PAHO_NAMES.items():
                if hasattr(m.properties, paho_name):
                    value = getattr(m.properties, paho_name)
                    if name == "subscription_identifier" and not isinstance(value, list):
                        value = [value]
                    props[name] = value
        return Got(m.topic, bytes(m.payload), m.qos, bool(m.retain), props)

    def subscribe(self, *subs: Sub, sub_id: int | None = None) -> list[int]:
        props = None
        if sub_id is not None:
            props = Properties(PacketTypes.SUBSCRIBE)
            props.SubscriptionIdentifier = sub_id
        if self.v5:
            self.c.subscribe([(s.filter, SubscribeOptions(
                qos=s.qos, noLocal=s.no_local, retainAsPublished=s.retain_as_published))
                for s in subs], properties=props)
        else:
            self.c.subscribe([(s.filter, s.qos) for s in subs])
        return self.acks.get(timeout=10)

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False,
                **props: Any) -> None:
        p = None
        if props:
            p = Properties(PacketTypes.PUBLISH)
            for name, value in props.items():
                setattr(p, PAHO_NAMES[name], value)
        self.c.publish(topic, payload, qos=qos, retain=retain, properties=p).wait_for_publish(10)

    def get(self, timeout: float = 5) -> Got:
        return self.received.get(timeout=timeout)

    def none(self, wait: float = NOTHING) -> bool:
        try:
            self.received.get(timeout=wait)
        except queue.Empty:
            return True
        return False

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()
        # paho closes its wake-up socket pair only here (or when the client is collected)
        self.c.reinitialise()


class Gmqtt:
    """gmqtt (asyncio) on a loop of its own in a thread, behind the scenarios' interface."""

    name = "gmqtt"

    def __init__(self, port: int, cid: str, *, version: int = 5, clean_start: bool = True,
                 expiry: int = 0) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.received: queue.Queue[Got] = queue.Queue()
        self.acks: queue.Queue[list[int]] = queue.Queue()
        kw: dict[str, Any] = {"session_expiry_interval": expiry} if version == 5 and expiry \
            else {}
        self.c = gmqtt.Client(cid, clean_session=clean_start, **kw)
        self.c.on_message = self._on_message
        self.c.on_subscribe = lambda c, mid, codes, props: self.acks.put(
            [int(x) for x in codes])
        self.run(self.c.connect("127.0.0.1", port, version=version))

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=10)

    def _on_message(self, client: Any, topic: str, payload: bytes, qos: int,
                    properties: dict[str, Any]) -> int:
        props: dict[str, Any] = {}
        if GMQTT_PFI in properties:
            props["payload_format_indicator"] = properties[GMQTT_PFI][0]
        for name in PAHO_NAMES:
            if name in properties:
                value = properties[name]
                if name == "user_property":
                    value = [tuple(v) for v in value]
                elif name != "subscription_identifier":
                    value = value[0]
                props[name] = value
        self.received.put(Got(topic, bytes(payload), qos, bool(properties.get("retain")),
                              props))
        return 0

    def subscribe(self, *subs: Sub, sub_id: int | None = None) -> list[int]:
        kw = {"subscription_identifier": sub_id} if sub_id is not None else {}
        self.loop.call_soon_threadsafe(lambda: self.c.subscribe(
            [gmqtt.Subscription(s.filter, qos=s.qos, no_local=s.no_local,
                                retain_as_published=s.retain_as_published) for s in subs],
            **kw))
        return self.acks.get(timeout=10)

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False,
                **props: Any) -> None:
        if "payload_format_indicator" in props:
            props[GMQTT_PFI] = props.pop("payload_format_indicator")

        async def publish() -> None:
            self.c.publish(topic, payload, qos=qos, retain=retain, **props)
            # Acknowledged by the gateway when the QoS 1 / 2 exchange has left gmqtt's
            # in-flight store (gmqtt has no public call that says so).
            await self.c._persistent_storage.wait_empty()

        self.run(publish())

    def get(self, timeout: float = 5) -> Got:
        return self.received.get(timeout=timeout)

    def none(self, wait: float = NOTHING) -> bool:
        try:
            self.received.get(timeout=wait)
        except queue.Empty:
            return True
        return False

    def close(self) -> None:
        if self.loop.is_closed():
            return
        try:
            self.run(self.c.disconnect())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
            self.loop.close()


MakeClient = Callable[..., Any]


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    g = GatewayThread(tmp_path_factory.mktemp("mqtt5-delivery") / "gw",
                      gateway="listen = mqtt://127.0.0.1:0\nlisten = stomp://127.0.0.1:0\n"
                              "listen = http://127.0.0.1:0\n").start()
    yield g
    g.stop()


@pytest.fixture(params=[Paho, Gmqtt], ids=["paho", "gmqtt"])
def client(request: pytest.FixtureRequest, gw: GatewayThread) -> Iterator[MakeClient]:
    """``client(cid, **kw)``: a connected client of the parametrized kind on the module's
    gateway (``port=`` another's); its name is prefixed to the client id."""
    made: list[Any] = []
    kind = request.param

    def make(cid: str, *, port: int | None = None, **kw: Any) -> Any:
        c = kind(port if port is not None else gw.port("mqtt"), f"{kind.name}-{cid}", **kw)
        made.append(c)
        return c

    make.name = kind.name  # type: ignore[attr-defined]
    yield make
    for c in made:
        try:
            c.close()
        except Exception:  # noqa: BLE001 - closed by the test already, or the gateway gone
            pass


def session_unacked(gw: GatewayThread, cid: str) -> int:
    """Deliveries the core holds unacknowledged for the MQTT session ``cid``."""
    server = gw.broker.adapter_servers["mqtt"]
    return int(gw.call(lambda: len(server.sessions[cid].core_session.unacked)))


# ------------------------------------------------------------ 1. nothing added, nothing lost


def test_01a_user_properties_arrive_as_sent_in_order_and_nothing_is_added(
        client: MakeClient) -> None:
    """User properties reach the subscriber unaltered and in order, and no others
    ([MQTT-3.3.2-17], [MQTT-3.3.2-18]): not the gateway's JMSMessageID, not its trace id. A
    publish without user properties arrives without any, and a text payload the publisher
    did not mark gains no Payload Format Indicator ([MQTT-3.3.2-4])."""
    t = f"d01a/{client.name}"
    sub = client("01a-sub")
    assert sub.subscribe(Sub(f"{t}/#", 1)) == [1]
    pub = client("01a-pub")
    user = [("z", "last-name-first"), ("a", "1"), ("m", ""), ("unit", "°C")]
    pub.publish(f"{t}/x", b"21.5", 1, user_property=user)
    got = sub.get()
    assert (got.topic, got.payload, got.qos) == (f"{t}/x", b"21.5", 1)
    assert got.props == {"user_property": user}
    pub.publish(f"{t}/y", b"plain text", 1)
    assert sub.get().props == {}


def test_01e_repeated_and_empty_user_property_names_all_arrive_in_order(
        client: MakeClient) -> None:
    """A user property name may appear more than once ([MQTT-3.3.2-17]: all of them are
    forwarded unaltered; [MQTT-3.3.2-18]: in order), and a name may be empty (a UTF-8 string
    pair): the subscriber gets the list exactly as published."""
    t = f"d01e/{client.name}"
    sub = client("01e-sub")
    sub.subscribe(Sub(f"{t}/#", 1))
    pub = client("01e-pub")
    user = [("k", "first"), ("x", "1"), ("k", "second"), ("", "no name"), ("k", "first")]
    pub.publish(f"{t}/x", b"r", 1, user_property=user)
    assert sub.get().props == {"user_property": user}


def test_01b_the_payload_format_indicator_is_the_publishers(client: MakeClient) -> None:
    """The Payload Format Indicator is sent unaltered to every subscriber [MQTT-3.3.2-4]:
    1 stays 1, 0 stays 0, none stays none -- also for a payload the gateway reads as text
    because of its content type ([MQTT-3.3.2-20]: the content type, unaltered)."""
    t = f"d01b/{client.name}"
    sub = client("01b-sub")
    sub.subscribe(Sub(f"{t}/#", 1))
    pub = client("01b-pub")
    cases: list[tuple[dict[str, Any], int | None]] = [
        ({"payload_format_indicator": 1}, 1),
        ({"payload_format_indicator": 0}, 0),
        ({"content_type": "text/plain"}, None),
        ({"payload_format_indicator": 1, "content_type": "text/plain; charset=utf-8"}, 1),
        ({"payload_format_indicator": 0, "content_type": "application/json"}, 0),
    ]
    for i, (props, _) in enumerate(cases):
        pub.publish(f"{t}/{i}", b'{"v": "text"}', 1, **props)
    for i, (props, pfi) in enumerate(cases):
        got = sub.get()
        assert got.topic == f"{t}/{i}"
        assert got.props.get("payload_format_indicator") == pfi, (props, got.props)
        assert got.props.get("content_type") == props.get("content_type")


def test_01c_response_topic_and_correlation_data_pass_through(client: MakeClient) -> None:
    """Response Topic and Correlation Data reach the subscriber unaltered ([MQTT-3.3.2-15],
    [MQTT-3.3.2-16]), correlation data byte for byte."""
    t = f"d01c/{client.name}"
    sub = client("01c-sub")
    sub.subscribe(Sub(f"{t}/req", 2))
    pub = client("01c-pub")
    pub.publish(f"{t}/req", b"?", 2, response_topic=f"{t}/replies/7",
                correlation_data=b"\x00\xffcorr\x00")
    got = sub.get()
    assert got.qos == 2
    assert got.props["response_topic"] == f"{t}/replies/7"
    assert got.props["correlation_data"] == b"\x00\xffcorr\x00"
    assert set(got.props) == {"response_topic", "correlation_data"}


def test_01d_message_expiry_interval_is_what_is_left(client: MakeClient) -> None:
    """The Message Expiry Interval a subscriber gets is the publisher's less the time the
    message waited in the server [MQTT-3.3.2-6]: a message kept for a persistent session
    while its client was away arrives with less; one that ran out is not sent
    [MQTT-3.3.2-5]."""
    t = f"d01d/{client.name}"
    sub = client("01d-sub", clean_start=True, expiry=300)
    sub.subscribe(Sub(f"{t}/#", 1))
    pub = client("01d-pub")
    pub.publish(f"{t}/live", b"now", 1, message_expiry_interval=100)
    assert sub.get().props["message_expiry_interval"] in (99, 100)
    sub.close()
    pub.publish(f"{t}/kept", b"later", 1, message_expiry_interval=60)
    pub.publish(f"{t}/gone", b"short", 1, message_expiry_interval=1)
    time.sleep(1.3)  # time passes while the subscriber is away (the check below is exact)
    back = client("01d-sub", clean_start=False, expiry=300)
    got = back.get()
    assert (got.topic, got.payload) == (f"{t}/kept", b"later")
    assert got.props["message_expiry_interval"] <= 59  # 60 s less the 1.3 s waited
    assert back.none()  # the one with 1 s expired while waiting


# ------------------------------------------------------ 2. subscription identifiers, options


def test_02a_overlapping_subscriptions_one_copy_at_the_highest_qos(client: MakeClient,
                                                                   gw: GatewayThread) -> None:
    """Two subscriptions of one client match a message (``a/+`` at QoS 0 and ``a/#`` at
    QoS 2; then ``a`` and ``a/#``, where ``#`` matches the parent [MQTT-4.7.1-2]): one
    PUBLISH at the highest granted QoS ([MQTT-3.3.4-2]; §3.3.4 allows one copy), carrying
    both Subscription Identifiers ([MQTT-3.3.4-3], [MQTT-3.3.4-5]); the client's PUBREC /
    PUBACK settles every matching subscription's delivery in the core."""
    t = f"d02a/{client.name}"
    sub = client("02a-sub")
    assert sub.subscribe(Sub(f"{t}/+", 0), sub_id=11) == [0]
    assert sub.subscribe(Sub(f"{t}/#", 2), sub_id=12) == [2]
    assert sub.subscribe(Sub(t, 1), sub_id=13) == [1]
    pub = client("02a-pub")
    pub.publish(f"{t}/x", b"one", 2)
    got = sub.get()
    assert (got.topic, got.payload, got.qos) == (f"{t}/x", b"one", 2)
    assert sorted(got.props["subscription_identifier"]) == [11, 12]
    pub.publish(t, b"parent", 1)
    got = sub.get()
    assert (got.topic, got.qos) == (t, 1)  # the message's own QoS 1 caps the 2 granted
    assert sorted(got.props["subscription_identifier"]) == [12, 13]
    assert sub.none()
    wait_for(lambda: session_unacked(gw, f"{client.name}-02a-sub") == 0,
             what="every delivery settled")


def test_02b_each_subscription_identifier_alone_when_one_matches(client: MakeClient) -> None:
    """A message matching one subscription carries that subscription's identifier only
    ([MQTT-3.3.4-3]); one subscribed without an identifier gets none ([MQTT-3.3.4-5])."""
    t = f"d02b/{client.name}"
    sub = client("02b-sub")
    sub.subscribe(Sub(f"{t}/a", 1), sub_id=7)
    sub.subscribe(Sub(f"{t}/b", 1))
    pub = client("02b-pub")
    pub.publish(f"{t}/a", b"a", 1)
    assert sub.get().props["subscription_identifier"] == [7]
    pub.publish(f"{t}/b", b"b", 1)
    assert "subscription_identifier" not in sub.get().props


def test_02c_retain_as_published_per_subscription(client: MakeClient) -> None:
    """Retain As Published: 1 keeps the RETAIN flag of a live publish, 0 clears it
    ([MQTT-3.3.1-12], [MQTT-3.3.1-13]); with overlapping subscriptions the one with the
    highest QoS decides (the gateway's documented choice)."""
    t = f"d02c/{client.name}"
    keep = client("02c-keep")
    keep.subscribe(Sub(f"{t}/#", 1, retain_as_published=True))
    clear = client("02c-clear")
    clear.subscribe(Sub(f"{t}/#", 1))
    both = client("02c-both")
    both.subscribe(Sub(f"{t}/+", 0))
    both.subscribe(Sub(f"{t}/#", 1, retain_as_published=True))
    pub = client("02c-pub")
    pub.publish(f"{t}/r", b"kept", 1, retain=True)
    assert keep.get().retain is True
    assert clear.get().retain is False
    got = both.get()
    assert (got.retain, got.qos) == (True, 1)
    assert both.none()
    pub.publish(f"{t}/r", b"", 1, retain=True)  # clear the retained message
    assert keep.get().payload == b""


def test_02d_no_local_leaves_out_only_its_subscription(client: MakeClient) -> None:
    """No Local: a client's own message is not sent for a subscription with No Local set
    [MQTT-3.8.3-3], but is for its overlapping subscription without it -- once, at that
    subscription's QoS and with only its identifier."""
    t = f"d02d/{client.name}"
    c = client("02d")
    c.subscribe(Sub(f"{t}/#", 2, no_local=True), sub_id=1)
    c.subscribe(Sub(f"{t}/x", 0), sub_id=2)
    c.publish(f"{t}/x", b"own", 1)
    got = c.get()
    assert (got.payload, got.qos, got.props["subscription_identifier"]) == (b"own", 0, [2])
    assert c.none()
    other = client("02d-other")
    other.publish(f"{t}/x", b"theirs", 2)
    got = c.get()
    assert (got.payload, got.qos, sorted(got.props["subscription_identifier"])) == (
        b"theirs", 2, [1, 2])
    assert c.none()


def test_02e_shared_subscriptions_are_not_merged(client: MakeClient) -> None:
    """A shared subscription is a subscription of its own ([MQTT-4.8.2-3]): a client with
    ``$share/g/t`` and ``t`` gets the message for each."""
    t = f"d02e/{client.name}"
    c = client("02e")
    c.subscribe(Sub(f"$share/g/{t}/x", 1))
    c.subscribe(Sub(f"{t}/x", 1))
    client("02e-pub").publish(f"{t}/x", b"m", 1)
    assert [c.get().payload, c.get().payload] == [b"m", b"m"]
    assert c.none()


def test_02f_overlap_in_a_persistent_session_is_one_copy_and_fully_acknowledged(
        client: MakeClient, gw: GatewayThread) -> None:
    """A persistent session with overlapping durable subscriptions: what was published while
    the client was away arrives once when it comes back ([MQTT-3.1.2-4]), and its PUBACK
    settles the message in every matching subscription: nothing is held unacknowledged and
    nothing comes again on the next reconnect."""
    t = f"d02f/{client.name}"
    cid = f"{client.name}-02f"
    c = client("02f", expiry=300)
    c.subscribe(Sub(f"{t}/#", 1), sub_id=1)
    c.subscribe(Sub(f"{t}/+", 1), sub_id=2)
    c.close()
    pub = client("02f-pub")
    pub.publish(f"{t}/x", b"while away", 1)
    back = client("02f", clean_start=False, expiry=300)
    got = back.get()
    assert (got.payload, sorted(got.props["subscription_identifier"])) == (b"while away",
                                                                           [1, 2])
    assert back.none()
    wait_for(lambda: session_unacked(gw, cid) == 0, what="both deliveries acknowledged")
    back.close()
    again = client("02f", clean_start=False, expiry=300)
    assert again.none()


def test_02g_overlapping_qos0_subscriptions_of_a_persistent_session_one_copy(
        client: MakeClient, gw: GatewayThread) -> None:
    """Two overlapping QoS 0 subscriptions of a persistent session (durables whose copies
    are settled as they are sent) and a QoS 1 message: one PUBLISH at QoS 0 ([MQTT-3.3.4-2],
    the granted QoS caps it), and nothing is left held in the core."""
    t = f"d02g/{client.name}"
    c = client("02g", expiry=300)
    c.subscribe(Sub(f"{t}/#", 0))
    c.subscribe(Sub(f"{t}/+", 0))
    client("02g-pub").publish(f"{t}/x", b"m", 1)
    got = c.get()
    assert (got.payload, got.qos) == (b"m", 0)
    assert c.none()
    wait_for(lambda: session_unacked(gw, f"{client.name}-02g") == 0, what="nothing held")


# ----------------------------------------------------------------- 3. refused subscriptions


@pytest.fixture(scope="module")
def acl_gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    g = GatewayThread(tmp_path_factory.mktemp("mqtt5-acl") / "gw",
                      gateway="authorization = enabled\nallow_anonymous = enabled\n",
                      users='ops:pw2:"operator"\n',
                      topics="secure.> secure\n>\n",
                      acl="TOPIC=secure.> USER=ops PERM=publish,subscribe\n").start()
    yield g
    g.stop()


@pytest.mark.parametrize("version", [4, 5], ids=["3.1.1", "5.0"])
def test_03_a_refused_filter_fails_alone(client: MakeClient, acl_gw: GatewayThread,
                                         version: int) -> None:
    """With authorization on and anonymous clients allowed, an anonymous SUBSCRIBE to a
    ``secure`` topic it may not read gets 0x87 (Not authorized; 3.1.1: 0x80) for that
    filter, and the other filters of the same SUBSCRIBE are granted ([MQTT-3.8.4-6],
    [MQTT-3.9.3-1]; 3.1.1 [MQTT-3.8.4-5]) and work; its publish to the secure topic
    reaches nobody."""
    t = f"d03/{client.name}/{version}"
    port = acl_gw.port("mqtt")
    c = client(f"03-{version}", port=port, version=version)
    refused = 0x87 if version == 5 else 0x80
    assert c.subscribe(Sub(f"secure/{t}/#", 1), Sub(f"{t}/#", 1), Sub(f"{t}/b", 0)) == [
        refused, 1, 0]
    other = client(f"03-pub-{version}", port=port, version=version)
    other.publish(f"{t}/a", b"open", 1)
    got = c.get()
    assert (got.topic, got.payload) == (f"{t}/a", b"open")
    other.publish(f"secure/{t}/x", b"denied", 1)
    assert c.none()


# ------------------------------------------------------------- 4. resend after a reconnect


@pytest.fixture
def restart_gw(tmp_path: Path) -> Iterator[GatewayThread]:
    g = GatewayThread(tmp_path / "gw").start()
    yield g
    g.stop()


def persistent(port: int, cid: str, *, clean: bool) -> RawClient:
    c = RawClient(port)
    c.connect(cid, 5, clean=clean, properties={"session_expiry_interval": 300})
    return c


@pytest.mark.parametrize("restart", [False, True], ids=["reconnect", "gateway-restart"])
def test_04_a_merged_publish_is_resent_once_and_settles_every_subscription(
        restart_gw: GatewayThread, restart: bool) -> None:
    """A QoS 1 PUBLISH sent once for two overlapping subscriptions of a persistent session
    and not acknowledged is sent again when the client comes back -- also after a gateway
    restart -- with the same packet id and DUP set ([MQTT-4.4.0-1], [MQTT-3.3.1-1]), once,
    not once per subscription; its PUBACK settles both subscriptions' deliveries in the
    core, so nothing comes on the next reconnect either."""
    g = restart_gw
    cid = f"raw-04-{restart}"
    c = persistent(g.port("mqtt"), cid, clean=True)
    c.subscribe(("d04/raw/#", 1), properties={"subscription_identifier": [4]})
    c.subscribe(("d04/raw/+", 1), properties={"subscription_identifier": [5]})
    pub = RawClient(g.port("mqtt"))
    pub.connect(f"{cid}-pub", 5)
    pub.publish("d04/raw/x", b"once", 1)
    pub.expect(PubAck)
    pub.close()
    first = c.expect(Publish)
    assert first.qos == 1 and not first.dup
    assert sorted(first.properties["subscription_identifier"]) == [4, 5]
    c.close()
    if restart:
        g.restart()
    again = persistent(g.port("mqtt"), cid, clean=False)
    resent = again.expect(Publish)
    assert (resent.packet_id, resent.dup, resent.payload) == (first.packet_id, True, b"once")
    assert sorted(resent.properties["subscription_identifier"]) == [4, 5]
    assert [p for p in again.drain(NOTHING) if isinstance(p, Publish)] == []
    again.send(PubAck(resent.packet_id))
    wait_for(lambda: session_unacked(g, cid) == 0, what="both deliveries acknowledged")
    again.close()
    last = persistent(g.port("mqtt"), cid, clean=False)
    assert [p for p in last.drain(NOTHING) if isinstance(p, Publish)] == []
    last.close()


def test_04b_pubrec_settles_every_subscription_of_a_merged_qos2_publish(
        gw: GatewayThread) -> None:
    """QoS 2: from PUBREC on the client owns the message ([MQTT-4.3.3-8]: the PUBLISH is
    not sent again), so the PUBREC of a PUBLISH sent once for two overlapping
    subscriptions settles both subscriptions' deliveries in the core, before PUBCOMP."""
    port = gw.port("mqtt")
    c = RawClient(port)
    c.connect("raw-04b", 5)
    c.subscribe(("d04b/raw/#", 2), ("d04b/raw/+", 2))
    pub = RawClient(port)
    pub.connect("raw-04b-pub", 5)
    pub.publish("d04b/raw/x", b"two", 2)
    pub.expect(PubRec)
    m = c.expect(Publish)
    assert m.qos == 2
    assert [p for p in c.drain(NOTHING) if isinstance(p, Publish)] == []
    c.send(PubRec(m.packet_id))
    assert c.expect(PubRel).packet_id == m.packet_id
    wait_for(lambda: session_unacked(gw, "raw-04b") == 0, what="both settled at PUBREC")
    c.send(PubComp(m.packet_id))
    c.close()
    pub.close()


# ----------------------------------------------------------------- 5. from another protocol


def test_05_a_stomp_message_carries_only_what_the_mapping_says(client: MakeClient,
                                                               gw: GatewayThread) -> None:
    """A STOMP SEND to a topic an MQTT 5 client subscribes to arrives with what the
    documented mapping gives (mappings/README.md, core → MQTT): the text as UTF-8 with
    Payload Format Indicator 1 and its content type, its headers as user properties in
    order, then JMSType and JMSMessageID -- and no trace id ([MQTT-3.3.2-17]: nothing
    else)."""
    t = f"d05/{client.name}"
    sub = client("05-sub")
    sub.subscribe(Sub(f"{t}/#", 2))
    s = stomp.Connection([("127.0.0.1", gw.port("stomp"))])
    s.connect(wait=True)
    try:
        s.send(destination=f"/topic/{t.replace('/', '.')}.x", body="from stomp",
               content_type="text/plain", headers={"x-site": "north", "n": "5",
                                                   "type": "reading"})
        got = sub.get()
    finally:
        s.disconnect()
    assert (got.topic, got.payload, got.qos) == (f"{t}/x", b"from stomp", 1)
    assert got.props["payload_format_indicator"] == 1
    assert got.props["content_type"] == "text/plain"
    user = got.props["user_property"]
    # the headers in the frame's order (stomp.py chooses it), then the JMS header fields
    assert sorted(user[:2]) == [("n", "5"), ("x-site", "north")]
    assert user[2] == ("JMSType", "reading")
    assert [n for n, _ in user[3:]] == ["JMSMessageID"] and user[3][1].startswith("ID:")
    assert set(got.props) == {"payload_format_indicator", "content_type", "user_property"}


RULES = """\
mappings:
  - name: no message ids to MQTT here
    replaces: mqtt.out.message-id
    match: {destination: "d06.>"}
    steps: []
  - name: trace ids to MQTT here
    match: {protocol: mqtt, direction: out, destination: "d06.>"}
    steps:
      - convert: {from: trace_id, to: wire.user.gw-trace-id, via: mqtt-text-out}
"""


def test_06_mapping_rules_turn_a_header_off_and_the_trace_id_on(client: MakeClient,
                                                                tmp_path: Path) -> None:
    """What the default mapping adds for a message from another protocol is a rule each
    (mappings/README.md): a rule with ``replaces: mqtt.out.message-id`` and no steps leaves
    JMSMessageID out, and a rule sends the trace id where it is asked for -- for its
    destinations only."""
    (tmp_path / "gw" / "mappings").mkdir(parents=True)
    (tmp_path / "gw" / "mappings" / "mqtt.yaml").write_text(RULES)
    g = GatewayThread(tmp_path / "gw",
                      gateway="listen = mqtt://127.0.0.1:0\nlisten = stomp://127.0.0.1:0\n"
                              "listen = http://127.0.0.1:0\n").start()
    try:
        sub = client("06-sub", port=g.port("mqtt"))
        sub.subscribe(Sub("d06/#", 1), Sub("d06x/#", 1))
        s = stomp.Connection([("127.0.0.1", g.port("stomp"))])
        s.connect(wait=True)
        try:
            s.send(destination="/topic/d06.a", body="ruled", headers={"k": "v"})
            ruled = sub.get()
            s.send(destination="/topic/d06x.a", body="default", headers={"k": "v"})
            default = sub.get()
        finally:
            s.disconnect()
        names = [n for n, _ in ruled.props["user_property"]]
        assert names == ["k", "gw-trace-id"]
        assert ruled.props["user_property"][1][1]  # the message's trace id
        assert [n for n, _ in default.props["user_property"]] == ["k", "JMSMessageID"]
        sub.close()
    finally:
        g.stop()
