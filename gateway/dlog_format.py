"""The delivery log's records as bytes: their hashes, their JSON lines, and the chunks in which
they travel from the event loop to the writer.

How this works. A record is :data:`WIDTH` values in a flat list, and each message's records
share one *head* (:mod:`gateway.dlog`, "The hot path"), which holds what the record's hashes
are made from (:func:`content`): a short text or bytes body itself, a longer one's hash, and
the message's properties. The writer -- the writer process (:mod:`gateway.dlog_writer`) or
the in-process writer thread, both through :class:`gateway.dlog_files.LogFiles` -- formats
each record as one JSON line, keys in :data:`FIELDS` order (:func:`format_records`): a line
is joined from pieces made once per head, destination and client, and the hashes (BLAKE2b
over the canonical encoding of a map or stream body and of the properties,
:func:`canonical_value`, :func:`canonical_properties`) are made once per content
(:func:`hashes_json`). Between the loop and the writer, records travel in chunks of
``marshal`` bytes, or ``pickle``'s for a chunk that holds a typed property value
(:func:`encode`, :func:`decode_batch`). Nothing here does I/O or holds state but the
formatter's hash caches. The schema is documented in ``docs/delivery-log.md``.
"""

from __future__ import annotations

import _pickle  # the C pickler, subclassed below by its own module's name (for mypyc)
import hashlib
import io
import marshal
import pickle
from json.encoder import encode_basestring_ascii
from typing import TYPE_CHECKING, Any, Final

from mypy_extensions import mypyc_attr

from gateway.message import BodyKind, DeliveryMode
from gateway.serial import write_value
from gateway.types import ARRAY_TYPES, SCALAR_TYPES

if TYPE_CHECKING:
    from gateway.message import Message

SCHEMA_VERSION = 2

EVENTS = (
    "publish",  # a local producer's message was accepted into a destination
    "deliver",  # the message was sent to a consumer for the first time (count = 1)
    "ack",  # the consumer acknowledged it; the gateway forgets it for that consumer
    "redeliver",  # sent to a consumer again after recover/rollback/close (count >= 2)
    # its expiration passed before it was consumed (TIBCO EMS User's Guide,
    # "Destination Properties", expiration)
    "expire",
    "drop",  # the gateway let it go without telling the producer (reason says why)
    "discard",  # the oldest message was discarded to make room, overflowPolicy=discardOld
    # moved to $sys.undelivered (expired or maxRedelivery; EMS User's Guide,
    # "Undelivered Message Queue")
    "undeliverable",
    "import",  # it entered from an external system through a transport (client = transport)
    "export",  # it was sent out to an external system through a transport (client = transport)
    "reject",  # the producer was refused with an error (limit, permission, name; reason)
)
"""Every event name, in the order of ``docs/delivery-log.md``."""

FIELDS = (
    "v", "ts", "gw", "event", "trace_id", "msg_id", "dest", "client", "count", "mode",
    "size", "reason",
    # version 2, after every key of version 1:
    "body_hash", "props_hash", "rules", "far_id", "far_dest", "lost",
)  # fmt: skip
"""The keys of every record, in the order they are written."""

HASH_BYTES = 8  # blake2b digest size: 16 hex digits, a collision once in 2**64 pairs
# Body bytes (or characters) up to which the writer hashes a body: a longer one is hashed on
# the loop, so what waits for the writer (at most MAX_PENDING records) holds no more than 256
# bytes of body a record.
SHIP_LIMIT: Final = 256
WIDTH: Final = 7  # values per record in the pending list (:mod:`gateway.dlog`, "The hot path")

_MODE_JSON: dict[Any, str] = {m: '"' + m.name + '"' for m in DeliveryMode}
_EVENT_JSON: dict[str, str] = {e: '"' + e + '"' for e in EVENTS}
_BYTES = (bytes, bytearray, memoryview)
_PLAIN = frozenset({str, int, float, bool, bytes, type(None)})  # what marshal takes as is

# One record: (time.time(), event, head, dest, client, count, reason), where head is the
# message's (trace_id, message_id, delivery_mode, size, body, properties), shared by all its
# records (body and properties as :func:`content` gives them), and reason is the reason, or
# for the few records with version 2's other values, (reason, rules, far_id, far_dest, lost):
# an eighth value a record would cost every record more than these few.
_Head = tuple[Any, Any, Any, Any, Any, Any]
_Record = tuple[float, str, _Head, Any, Any, int, Any]
_blake2b = hashlib.blake2b
_STR_BODY = (str, bytes)
_CANONICAL = (BodyKind.MAP, BodyKind.STREAM)
# The typed values (gateway/types.py) a chunk may carry to the writer in its properties.
_TYPED: frozenset[type] = frozenset({*SCALAR_TYPES.values(), *ARRAY_TYPES})
# The property value types no one can change (typed arrays are tuples): a set of properties
# recognised by the identity of its values (DeliveryLog._property_set) holds only these.
_FIXED: frozenset[type] = frozenset({*_TYPED, str, bytes, int, float, bool})
_PICKLED = b"\x80"  # what a chunk in pickle's format begins with (PROTO); never marshal's


def content(msg: Message) -> tuple[Any, Any]:
    """What the log's ``body_hash`` and ``props_hash`` are computed from, as the head holds it.

    The body: ``None`` (no body: the hash is null), the body itself when it is text or bytes
    of at most :data:`SHIP_LIMIT` (the writer hashes it, off the event loop), otherwise its
    hash already made, as an ``int`` (a long body is hashed here rather than copied to the
    writer). The properties: ``None`` when there are none, else a copy of the dict (the
    writer encodes and hashes it, :func:`canonical_properties`; a copy, as this is for
    :meth:`DeliveryLog.head`, whose message is changed after it; :meth:`DeliveryLog.record`
    takes the dict itself, or the canonical bytes of a set met again, see
    :meth:`DeliveryLog._property_set`). ``docs/delivery-log.md`` ("Hashes") defines the
    bytes.
    """
    props = msg.properties
    return content_body(msg), (dict(props) if props else None)


def content_body(msg: Message) -> Any:
    """The body's part of :func:`content`."""
    body = msg.body
    if body is not None:
        if type(body) in _STR_BODY:
            if len(body) > SHIP_LIMIT:
                body = _int_hash(_body_bytes(body))
        elif msg.body_kind in _CANONICAL or type(body) in (dict, list):
            data = canonical_value(body)
            body = data if len(data) <= SHIP_LIMIT else _int_hash(data)
        else:
            body = _int_hash(_body_bytes(body))
    return body


def _body_bytes(body: Any) -> bytes:
    if type(body) is str:
        return str(body).encode("utf-8", "surrogatepass")
    return bytes(body)


def _int_hash(data: bytes) -> int:
    return int.from_bytes(_blake2b(data, digest_size=HASH_BYTES).digest(), "big")


def _sorted(v: Any) -> Any:
    """``v`` with the entries of every map in it sorted by name (maps nest in streams)."""
    t = type(v)
    if t is dict:
        return {k: _sorted(v[k]) for k in sorted(v)}
    if t is list:
        return [_sorted(x) for x in v]
    return v


def canonical_value(v: Any) -> bytes:
    """A map or stream body as the store's tagged value encoding (``gateway/serial.py``,
    without its version byte), every map's entries in name order."""
    out = bytearray()
    write_value(out, _sorted(v))
    return bytes(out)


def canonical_properties(props: dict[str, Any]) -> bytes:
    """The properties in name order, each its name as a value, then its tagged value
    (``gateway/serial.py``): the same set of names, values and types gives the same bytes."""
    out = bytearray()
    for name in sorted(props):
        write_value(out, name)
        write_value(out, props[name])
    return bytes(out)


def fixed_canonical(props: dict[str, Any]) -> bytes | None:
    """:func:`canonical_properties` of ``props`` if all their values are of types no one can
    change (:data:`_FIXED`), else None; None too for a value of no property type (a caller's
    bug: the writer writes what it can of it, see :func:`format_records`)."""
    if not _FIXED.issuperset(map(type, props.values())):
        return None
    try:
        return canonical_properties(props)
    except Exception:
        return None


def hash_json(v: Any) -> str:
    """The JSON of a hash slot of a head (see :func:`content`): a quoted hex string or null."""
    if v is None:
        return "null"
    if type(v) is int:
        return '"' + v.to_bytes(HASH_BYTES, "big").hex() + '"'
    if type(v) is dict:
        v = canonical_properties(v)
    elif type(v) is str:
        v = v.encode("utf-8", "surrogatepass")
    return '"' + _blake2b(v, digest_size=HASH_BYTES).hexdigest() + '"'


HASH_CACHE = 4096  # contents whose hashes the formatter keeps (see hashes_json)
_hashes: dict[tuple[Any, str], tuple[str, str]] = {}  # (body slot, props_hash JSON) -> JSON
_props_hashes: dict[Any, str] = {}  # (items, their values' types) -> props_hash JSON
# Property value types whose equality is their identity as hashed (not float: 0.0 == -0.0).
_EXACT: frozenset[type] = frozenset(
    {str, bytes, bool, int, *(t for t in SCALAR_TYPES.values() if issubclass(t, (int, str)))}
)
_NO_EXTRA = ',"rules":null,"far_id":null,"far_dest":null,"lost":null}\n'


def hashes_json(body: Any, props: Any) -> tuple[str, str]:
    """``,"body_hash":..,"props_hash":..`` of a head's body and properties slots, and the
    same after a null reason and followed by null version 2 values to the end of the line
    (a record with no reason and no other value: most records).

    Made once per content, not per record: a message's records share one head within a
    chunk, but its later records (a delivery from a backlog, its ack) come in later chunks
    with a copy of the head, and the messages of one kind of producer tend to carry the same
    properties (an MQTT publish's QoS and retain flag), with bodies that differ. So the
    properties' hash is kept, keyed by the property names, values *and their types*
    (``Int8(1)`` equals ``True`` but hashes differently), and the result is kept, keyed by
    the body and that hash, each for the last :data:`HASH_CACHE` contents. Properties with a
    value of another type (a float: ``0.0`` equals ``-0.0``) are hashed every time.
    """
    key = (body, "null" if props is None else props_json(props))
    done = _hashes.get(key)
    if done is None:
        hashes = ',"body_hash":' + hash_json(body) + ',"props_hash":' + key[1]
        done = (hashes, "null" + hashes + _NO_EXTRA)
        if len(_hashes) >= HASH_CACHE:
            _hashes.clear()
        _hashes[key] = done
    return done


def props_json(props: Any) -> str:
    """The ``props_hash`` JSON of a head's properties slot (not None), cached as
    :func:`hashes_json` says."""
    key: Any = props  # its canonical bytes already (DeliveryLog._property_set)
    if type(props) is dict:
        types = tuple(map(type, props.values()))
        if not _EXACT.issuperset(types):
            return hash_json(props)
        key = (tuple(props.items()), types)
    done = _props_hashes.get(key)
    if done is None:
        done = hash_json(props)
        if len(_props_hashes) >= HASH_CACHE:
            _props_hashes.clear()
        _props_hashes[key] = done
    return done


def _s(value: Any) -> str:
    """A JSON string or null; bytes decoded, other non-strings (Destination) by ``str()``."""
    if value is None:
        return "null"
    if not isinstance(value, str):
        value = _decode(value) if isinstance(value, _BYTES) else str(value)
    return encode_basestring_ascii(value)


def _decode(value: bytes | bytearray | memoryview) -> str:
    """Bytes as text; every bytes-like type alike, as ``marshal`` turns them all into bytes."""
    return bytes(value).decode("utf-8", "replace")


def format_records(flat: list[Any], gateway_id: str) -> bytes:
    """Format records (``WIDTH`` values each, flat) as JSON lines, keys in :data:`FIELDS` order.

    Strings go through the C JSON string encoder with ``ensure_ascii``, so any value (lone
    surrogates included) yields valid UTF-8 that Spark and ``grep`` both read. A record with
    a value of the wrong type (a caller's bug) never costs the batch: the batch is then
    formatted one record at a time and the bad values are written as strings or null.
    """
    try:
        return _format_fast(flat, gateway_id)
    except Exception:
        return b"".join(_format_fast(list(_coerce(r)), gateway_id) for r in records(flat))


def _coerce(r: Any) -> _Record:
    """The record with every value of a type the fast formatter cannot take made safe."""
    t, event, head, dest, client, count, reason = _fields(r, WIDTH)
    trace_id, msg_id, mode, size, body, props = _fields(head, 6)
    if type(reason) is tuple:
        why, rules, far_id, far_dest, lost = _fields(reason, 5)
        reason = (_str(why), _str(rules), _str(far_id), _str(far_dest),
                  None if lost is None else _int(lost))
    else:
        reason = _str(reason)
    return (
        _float(t), _str(event) or "",
        (_str(trace_id), _str(msg_id), int(mode) if isinstance(mode, int) else _str(mode),
         _int(size), _hashable(body), _hashable(props)),
        _str(dest), _str(client), _int(count), reason,
    )  # fmt: skip


def _hashable(v: Any) -> Any:
    """A hash slot of a head as :func:`content` makes it (properties as their canonical
    bytes, which ``marshal`` takes), or None."""
    if v is None or type(v) in (str, bytes, int):
        return v
    if type(v) is dict:
        try:
            return canonical_properties(v)
        except Exception:
            return None
    return bytes(v) if isinstance(v, _BYTES) else None


def _fields(v: Any, n: int) -> tuple[Any, ...]:
    """``v`` as a tuple of ``n`` values, cut or padded with None if it is not one."""
    try:
        t = tuple(v)
    except Exception:
        t = ()
    return t[:n] + (None,) * (n - len(t))


def _str(v: Any) -> str | None:
    if v is None or type(v) is str:
        return v
    if isinstance(v, str):
        return str.__str__(v)  # its value, as _s() writes it: not its __str__
    try:
        return _decode(v) if isinstance(v, _BYTES) else str(v)
    except Exception:
        return "<unprintable " + type(v).__name__ + ">"


def _int(v: Any) -> int:
    try:
        return int(v)
    except Exception:
        return 0


def _float(v: Any) -> float:
    try:
        f = float(v)
    except Exception:
        return 0.0
    return f if f == f and abs(f) != float("inf") else 0.0


_FRACTIONS = tuple(f".{i:03d}" for i in range(1000))  # the ts after its milliseconds
_COUNTS = {i: str(i) for i in range(100)}


def _format_fast(flat: list[Any], gateway_id: str) -> bytes:
    """The JSON lines of ``flat``; raises on a value of the wrong type.

    Most of a line repeats, so it is joined from pieces, each made once: a message's head
    is shared by all its records (by the same object within a batch, as ``marshal`` and
    ``pickle`` keep shared references), a destination meets few clients, and the time changes its
    millisecond a few hundred records apart. A line then costs a few lookups and the
    join (a fifth of an f-string with a float in it); the line of a record without a reason
    or version 2's other values (most records) ends in one piece made once per content
    (:func:`hashes_json`).
    """
    enc = encode_basestring_ascii
    gw = ',"gw":' + enc(gateway_id) + ',"event":'
    events = {e: gw + j + "," for e, j in _EVENT_JSON.items()}
    mode_json, fractions, counts = _MODE_JSON, _FRACTIONS, _COUNTS
    start = '{"v":' + str(SCHEMA_VERSION) + ',"ts":'
    heads: dict[int, tuple[str, str, str, str]] = {}  # id(head) -> its parts (heads live in flat)
    places: dict[Any, dict[Any, str]] = {}  # dest -> client -> '"dest":..,"client":..,"count":'
    last_ms, ts = -1, ""
    out: list[str] = []
    it = iter(flat)
    rows = zip(it, it, it, it, it, it, it, strict=False)  # WIDTH; one tuple, reused by zip
    for t, event, head, dest, client, count, reason in rows:
        us = round(t * 1_000_000.0)
        ms = us // 1000
        if ms != last_ms:
            if ms < 0:
                raise ValueError("a time before 1970")
            last_ms, ts = ms, start + str(ms)
        ev = events.get(event)
        if ev is None:
            ev = gw + enc(str(event)) + ","
        h = heads.get(id(head))
        if h is None:
            trace_id, msg_id, mode, size, body, props = head
            hashes, rest = hashes_json(body, props)
            h = heads[id(head)] = (
                f'"trace_id":{enc(trace_id) if type(trace_id) is str else _s(trace_id)},'
                f'"msg_id":{enc(msg_id) if type(msg_id) is str else _s(msg_id)},',
                f',"mode":{mode_json.get(mode) or _s(mode)},"size":{size or 0:d},"reason":',
                hashes, rest,
            )  # fmt: skip
        by_client = places.get(dest)
        if by_client is None:
            by_client = places[dest] = {}
        place = by_client.get(client)
        if place is None:
            place = by_client[client] = (
                f'"dest":{enc(dest) if type(dest) is str else _s(dest)},'
                f'"client":{enc(client) if type(client) is str else _s(client)},"count":'
            )
        c = counts.get(count)
        if c is None:
            c = f"{count:d}"
        if reason is None:  # most records: the rest of the line is the head's
            out += (ts, fractions[us - ms * 1000], ev, h[0], place, c, h[1], h[3])
        elif type(reason) is tuple:
            out += (ts, fractions[us - ms * 1000], ev, h[0], place, c, h[1], _s(reason[0]),
                    h[2], _extra_json(reason))  # fmt: skip
        else:
            out += (ts, fractions[us - ms * 1000], ev, h[0], place, c, h[1], _s(reason), h[2],
                    _NO_EXTRA)  # fmt: skip
    return "".join(out).encode("ascii")


def _extra_json(tail: Any) -> str:
    _, rules, far_id, far_dest, lost = tail
    return (
        f',"rules":{_s(rules)},"far_id":{_s(far_id)},"far_dest":{_s(far_dest)},'
        f'"lost":{"null" if lost is None else f"{lost:d}"}}}\n'
    )


def encode_batch(flat: list[Any]) -> bytes:
    """A flat batch (``WIDTH`` values a record) as bytes for the writer: see :func:`encode`."""
    return encode(flat, False)[0]


def encode(flat: list[Any], typed: bool) -> tuple[bytes, bool]:
    """A flat batch (``WIDTH`` values a record) as bytes for the writer (:func:`decode_batch`),
    formatted as it would be.

    ``marshal`` takes exact str, int, float, bytes, None and containers of them: every batch
    whose properties (a head's dict) hold only such values. A batch with a typed value in
    them (``Int8`` ...: every MQTT publish carries one) goes in ``pickle``'s format instead,
    which takes the typed values of ``gateway/types.py`` and nothing else that is not plain
    (:class:`_ChunkPickler`). Which one is found by trying ``marshal`` first, which stops at
    the first value it does not take (the first head with a typed property, as a rule in the
    first record), unless ``typed`` says the last batch held a typed value (then pickle
    first): no pass over the batch to look. Pickling a batch of MQTT publishes costs the
    event loop about twice what marshalling it costs (and the writer unpickles it at half
    the speed), which is why :meth:`DeliveryLog.record` holds a set of properties met again
    as its canonical bytes (:meth:`DeliveryLog._property_set`). A value neither takes (a
    Destination object, an enum member, a caller's bug) is replaced, in that record only, by
    what the formatter would have written for it. Returns the bytes and whether the batch
    held a typed value.
    """
    try:
        if not typed:
            try:
                return marshal.dumps(flat), False
            except ValueError:  # a typed value (or a caller's bug): pickle takes the former
                pass
        buf = io.BytesIO()
        pickler = _ChunkPickler(buf, pickle.HIGHEST_PROTOCOL)
        pickler.dump(flat)
        return buf.getvalue(), pickler.typed
    except Exception:  # a value of a type neither format takes (or a head not a tuple)
        out: list[Any] = []
        for r in records(flat):
            out += _plain(r)
        return marshal.dumps(out), False


def decode_batch(payload: bytes) -> list[Any]:
    """The flat batch :func:`encode_batch` made."""
    if payload[:1] == _PICKLED:
        return _ChunkUnpickler(io.BytesIO(payload)).load()  # type: ignore[no-any-return]
    return marshal.loads(payload)  # type: ignore[no-any-return]


@mypyc_attr(native_class=False)
class _ChunkPickler(_pickle.Pickler):
    """Pickles a batch whose values are plain or typed values of ``gateway/types.py`` (so
    the writer process unpickles nothing but those); raises for any other object.

    Why pickle: ``marshal`` takes no subclass (``Int8``), and the properties' types are
    what ``props_hash`` must see; converting them here, message by message, would cost the
    event loop what hashing them in the writer saves. ``pickle`` handles exact str, int,
    float, bytes, tuples, lists and dicts in C without calling this; a typed value reaches
    :meth:`reducer_override` once a batch (after that, pickle's memo has it), as do the
    classes its reduction names."""

    typed = False  # set once a typed value was pickled

    def reducer_override(self, obj: Any) -> Any:
        if obj in _TYPED:
            return NotImplemented  # a class of gateway/types.py: pickled by its name
        if type(obj) in _TYPED:
            self.typed = True
            return obj.__reduce__()
        raise pickle.PicklingError(f"not a value of the delivery log: {type(obj).__name__}")


@mypyc_attr(native_class=False)
class _ChunkUnpickler(_pickle.Unpickler):
    """Unpickles what :class:`_ChunkPickler` pickles: no class but the typed values'."""

    def find_class(self, module: str, name: str) -> Any:
        cls = super().find_class(module, name)
        if module != "gateway.types" or cls not in _TYPED:
            raise pickle.UnpicklingError(f"not a class of the delivery log: {module}.{name}")
        return cls


def _plain(r: _Record) -> _Record:
    t, event, head, dest, client, count, reason = r
    if (type(head) is not tuple or len(head) != 6 or not all(type(v) in _PLAIN for v in head)
            or (type(reason) is tuple
                and (len(reason) != 5 or not all(type(v) in _PLAIN for v in reason)))):
        return _coerce(r)
    return (
        t if type(t) is float else _float(t), _text(event), head, _text(dest), _text(client),
        count if type(count) in _PLAIN else _int(count),
        reason if type(reason) is tuple else _text(reason),
    )  # fmt: skip


def _text(v: Any) -> Any:
    return v if type(v) in _PLAIN else _str(v)


def records(flat: list[Any]) -> list[_Record]:
    """The records of a flat pending list, as tuples (``WIDTH`` values each)."""
    it = iter(flat)
    return list(zip(*[it] * WIDTH, strict=False))  # type: ignore[arg-type]
