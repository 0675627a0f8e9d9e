"""A STOMP client written for ActiveMQ, unchanged, against the gateway: the ``transformation``
header of ActiveMQ's STOMP connector (its STOMP page, "Message transformation").

How this works. One gateway listens for STOMP, MQTT and AMQP on loopback. The STOMP side is
stomp.py (``Peer`` of test_stomp_py.py) sending and subscribing with ActiveMQ's
``transformation`` values; the other side is python-qpid-proton (amqpclient.py) or paho-mqtt.
The XML and JSON bodies are ActiveMQ's own forms (XStream, and XStream through Jettison):
the first tests send the same frames to a private ActiveMQ 5.17 broker (tests/peers/
activemq.py) and to the gateway and compare what comes back; the others cross the gateway
into AMQP map bodies with their types and nesting, and AMQP maps come out as ActiveMQ would
have written them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import proton
import pytest
from amqpclient import connect
from gw import GatewayThread
from peers.activemq import ActiveMQ, start_activemq
from test_mqtt_paho import V5, Client
from test_stomp_py import Peer

from mappings import xstream

# The ActiveMQ form of one nested map with a value of every type (as ActiveMQ writes it:
# jms-map-json through Jettison, jms-map-xml pretty-printed by XStream).
MAP_JSON = (
    '{"map":{"entry":[{"string":["name","Dejan"]},{"string":"i","int":5},'
    '{"string":"l","long":9007199254740993},{"string":"d","double":1.5},'
    '{"string":"f","float":2.5},{"string":"b","boolean":true},{"string":"s","short":-3},'
    '{"string":"y","byte":4},{"string":"c","char":"x"},{"string":["num",123]},'
    '{"string":"m","map":{"entry":[{"string":["k","v"]},'
    '{"string":"inner","list":{"int":[1,2]}}]}},{"string":"n","null":""},'
    '{"string":"ba","byte-array":"AQID"}]}}'
)
MAP_XML = """<map>
  <entry>
    <string>name</string>
    <string>Dejan</string>
  </entry>
  <entry>
    <string>i</string>
    <int>5</int>
  </entry>
  <entry>
    <string>l</string>
    <long>9007199254740993</long>
  </entry>
  <entry>
    <string>d</string>
    <double>1.5</double>
  </entry>
  <entry>
    <string>f</string>
    <float>2.5</float>
  </entry>
  <entry>
    <string>b</string>
    <boolean>true</boolean>
  </entry>
  <entry>
    <string>s</string>
    <short>-3</short>
  </entry>
  <entry>
    <string>y</string>
    <byte>4</byte>
  </entry>
  <entry>
    <string>c</string>
    <char>x</char>
  </entry>
  <entry>
    <string>num</string>
    <string>123</string>
  </entry>
  <entry>
    <string>m</string>
    <map>
      <entry>
        <string>k</string>
        <string>v</string>
      </entry>
      <entry>
        <string>inner</string>
        <list>
          <int>1</int>
          <int>2</int>
        </list>
      </entry>
    </map>
  </entry>
  <entry>
    <string>n</string>
    <null/>
  </entry>
  <entry>
    <string>ba</string>
    <byte-array>AQID</byte-array>
  </entry>
</map>"""


def amqp_map() -> dict[Any, Any]:
    """The same map as proton types it."""
    return {
        "name": "Dejan", "i": proton.int32(5), "l": 9007199254740993, "d": 1.5,
        "f": proton.float32(2.5), "b": True, "s": proton.short(-3), "y": proton.byte(4),
        "c": proton.char("x"), "num": "123",
        "m": {"k": "v", "inner": [proton.int32(1), proton.int32(2)]}, "n": None,
        "ba": b"\x01\x02\x03",
    }  # fmt: skip


def typed(v: Any) -> Any:
    """A value with the type of every part (proton.int32(5) == 5 in Python)."""
    if isinstance(v, dict):
        return {k: typed(x) for k, x in v.items()}
    if isinstance(v, list):
        return [typed(x) for x in v]
    if isinstance(v, memoryview):  # proton's binary
        v = bytes(v)
    return (type(v).__name__, v)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    g = GatewayThread(tmp_path_factory.mktemp("stomp-amq") / "gw",
                      gateway="listen = stomp://127.0.0.1:0\nlisten = mqtt://127.0.0.1:0\n"
                              "listen = amqp://127.0.0.1:0\n").start()
    yield g
    g.stop()


@pytest.fixture(scope="module")
def amq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ActiveMQ]:
    with start_activemq(tmp_path_factory.mktemp("activemq"), transformations=True) as broker:
        yield broker


@pytest.fixture
def peers(gw: GatewayThread) -> Iterator[Any]:
    made: list[Peer] = []

    def make(version: str = "1.2", **kw: Any) -> Peer:
        p = Peer(gw.port("stomp"), version, **kw)
        made.append(p)
        return p

    yield make
    for p in made:
        if not p.disconnected:
            p.close()


@pytest.fixture
def amqp(gw: GatewayThread) -> Iterator[Any]:
    c = connect(gw.port("amqp"))
    yield c
    c.close()


def receive(amqp: Any, address: str) -> proton.Message:
    r = amqp.create_receiver(address, credit=10)
    m = r.receive(timeout=5)
    r.accept()
    r.close()
    return m


def amqp_send(amqp: Any, address: str, body: Any) -> None:
    s = amqp.create_sender(address)
    s.send(proton.Message(body=body))
    s.close()


# -- the same frames to ActiveMQ and to the gateway ---------------------------------------------

# One entry per value type (one entry: no hash order to differ, so byte for byte), then the
# whole nested map (compared as typed values: ActiveMQ's HashMap has its own order).
ENTRIES = [
    "<string>Dejan</string>", "<string>123</string>", "<string>true</string>",
    "<string></string>", '<string>a &lt;/b&gt; &amp; "c" \u00e9</string>', "<int>-5</int>",
    "<long>9007199254740993</long>", "<short>3</short>", "<byte>-4</byte>",
    "<double>1.5</double>", "<double>3.0</double>", "<double>1.0E10</double>",
    "<double>1.0E-5</double>", "<float>2.5</float>", "<boolean>false</boolean>",
    "<char>x</char>", "<null/>", "<map/>", "<list/>",
    "<map><entry><string>k</string><list><int>1</int><int>2</int></list></entry></map>",
]  # fmt: skip


def same_frames(port: int, queue: str, transformation: str, body: str) -> dict[str, bytes]:
    """SEND ``body`` with ``transformation`` and receive it back on a ``jms-map-xml`` and a
    ``jms-map-json`` subscription: the two bodies, as the broker at ``port`` wrote them."""
    # ActiveMQ applies a SEND's transformation only when it has no content-length.
    p = Peer(port, auto_content_length=False, auto_decode=False)
    try:
        out: dict[str, bytes] = {}
        for asked in ("jms-map-xml", "jms-map-json"):
            q = f"/queue/{queue}.{asked}"
            p.sub(q, asked, headers={"transformation": asked})
            p.send(q, body, {"transformation": transformation})
            f = p.get()
            assert "transformation-error" not in f.headers, (
                f"the broker could not transform: {f.headers} (ActiveMQ needs the XStream "
                "jars: bash tests/peers/install.sh)")
            assert f.headers["transformation"] == asked
            out[asked] = f.body
        return out
    finally:
        p.close()


@pytest.mark.parametrize("entry", range(len(ENTRIES)))
def test_one_value_comes_back_from_the_gateway_as_from_activemq(gw, amq, entry):
    body = f"<map><entry><string>v</string>{ENTRIES[entry]}</entry></map>"
    ours = same_frames(gw.port("stomp"), f"same.{entry}", "jms-map-xml", body)
    theirs = same_frames(amq.stomp_port, f"same.{entry}", "jms-map-xml", body)
    assert ours == theirs
    # and ActiveMQ's JSON, sent back, comes back the same from both again
    again = theirs["jms-map-json"].decode()
    ours = same_frames(gw.port("stomp"), f"again.{entry}", "jms-map-json", again)
    theirs = same_frames(amq.stomp_port, f"again.{entry}", "jms-map-json", again)
    assert ours == theirs


def test_a_nested_map_comes_back_with_the_same_typed_values(gw, amq):
    body = MAP_XML.replace("  <entry>\n    <string>ba</string>\n    <byte-array>AQID"
                           "</byte-array>\n  </entry>\n", "")  # refused by ActiveMQ's XStream
    ours = same_frames(gw.port("stomp"), "same.nested", "jms-map-xml", body)
    theirs = same_frames(amq.stomp_port, "same.nested", "jms-map-xml", body)
    for asked in ("jms-map-xml", "jms-map-json"):
        read = xstream.from_xml if asked.endswith("xml") else (
            lambda data: xstream.from_json(xstream.parse_json(data)))
        assert typed(read(ours[asked])) == typed(read(theirs[asked]))


# -- SEND with a transformation -> AMQP ------------------------------------------------------


@pytest.mark.parametrize(("transformation", "body"), [("jms-map-json", MAP_JSON),
                                                      ("jms-map-xml", MAP_XML)])
@pytest.mark.parametrize("length", [False, True], ids=["no-length", "content-length"])
def test_activemq_map_send_reaches_amqp_as_a_typed_nested_map(gw, peers, amqp, transformation,
                                                               body, length):
    # ActiveMQ's own clients send these without a content-length (ActiveMQ ignores the
    # transformation of a frame that has one); the gateway reads both the same.
    p = peers(auto_content_length=length)
    q = f"amq.in.{transformation}.{length}"
    p.send("/queue/" + q, body, {"transformation": transformation})
    m = receive(amqp, "queue://" + q)
    assert m.inferred is False  # an amqp-value section
    assert typed(m.body) == typed(amqp_map())
    assert m.annotations[proton.symbol("x-opt-jms-msg-type")] == 2  # a MapMessage


def test_activemq_map_send_reaches_mqtt_as_the_gateways_json(gw, peers):
    sub = Client(gw.port("mqtt"), "amq-map-mqtt", V5)
    try:
        sub.sub("amq/map/mqtt", qos=1)
        peers().send("/topic/amq.map.mqtt", MAP_XML, {"transformation": "jms-map-xml"})
        m = sub.get()
        assert json.loads(m.payload) == {
            "name": "Dejan", "i": 5, "l": 9007199254740993, "d": 1.5, "f": 2.5, "b": True,
            "s": -3, "y": 4, "c": "x", "num": "123", "m": {"k": "v", "inner": [1, 2]},
            "n": None, "ba": "AQID"}
    finally:
        sub.close()


# -- AMQP map -> SUBSCRIBE with a transformation -----------------------------------------------


@pytest.mark.parametrize(("asked", "header", "body"), [
    ("jms-map-json", "jms-map-json", MAP_JSON), ("jms-json", "jms-map-json", MAP_JSON),
    ("jms-object-json", "jms-object-json", MAP_JSON),
    ("jms-map-xml", "jms-map-xml", MAP_XML), ("jms-xml", "jms-map-xml", MAP_XML),
    ("jms-object-xml", "jms-object-xml", MAP_XML),
])
def test_amqp_map_reaches_a_transformation_subscriber_in_activemqs_form(gw, peers, amqp, asked,
                                                                        header, body):
    p = peers(auto_decode=False)
    q = f"amq.out.{asked}"
    p.sub("/queue/" + q, "1", headers={"transformation": asked})
    amqp_send(amqp, "queue://" + q, amqp_map())
    f = p.get()
    assert f.headers["transformation"] == header
    assert "content-type" not in f.headers  # as ActiveMQ sends it
    assert f.body == body.encode()
    assert f.headers["content-length"] == str(len(body))


def test_activemq_form_round_trips_stomp_to_stomp(gw, peers):
    p = peers(auto_decode=False)
    p.sub("/queue/amq.rt", "1", headers={"transformation": "jms-map-json"})
    p.send("/queue/amq.rt", MAP_XML, {"transformation": "jms-map-xml"})
    assert p.get().body == MAP_JSON.encode()


def test_a_stream_body_goes_as_an_xstream_list(gw, peers, amqp):
    p = peers(auto_decode=False)
    p.sub("/queue/amq.stream", "1", headers={"transformation": "jms-map-xml"})
    amqp_send(amqp, "queue://amq.stream", ["a", proton.int32(1), {"k": "v"}])
    f = p.get()
    assert f.body == (b"<list>\n  <string>a</string>\n  <int>1</int>\n  <map>\n    <entry>\n"
                      b"      <string>k</string>\n      <string>v</string>\n    </entry>\n"
                      b"  </map>\n</list>")


def test_jms_byte_delivers_a_text_message_as_bytes(gw, peers):
    p = peers(auto_decode=False)
    p.sub("/queue/amq.byte", "1", headers={"transformation": "jms-byte"})
    p.send("/queue/amq.byte", "grüße", content_type="text/plain;charset=utf-8")
    f = p.get()
    assert "content-type" not in f.headers
    assert f.headers["content-length"] == str(len("grüße".encode()))
    assert f.body == "grüße".encode()


def test_an_unsupported_transformation_on_send_is_an_error_naming_it(gw, peers):
    p = peers()
    # jms-object-json would need a Java object made from XStream's text
    p.conn.send("/queue/amq.bad", "{}", headers={"transformation": "jms-object-json",
                                                 "receipt": "bad-t"})
    err = p.error()
    assert err.headers["message"] == "unsupported transformation"
    assert err.headers["receipt-id"] == "bad-t"
    assert "'jms-object-json'" in err.body
