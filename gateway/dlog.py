"""The delivery log: one record per thing that happened to a message, written off the hot path.

How this works. Every publish, delivery, acknowledgement, redelivery, expiry, drop, discard,
dead-lettering, rejection, import and export calls :meth:`DeliveryLog.record`, which
extends a list by the record's seven values and returns -- no formatting, no I/O; every
500 records the list is *sealed* into a ``marshal``-ed chunk (about 0.1 µs a record, in
C). A background thread wakes every ``flush_interval`` (or as soon as 10,000 records are
sealed), seals what is left, and hands the chunks through a pipe to a writer process
(:mod:`gateway.dlog_writer`) with one ``writev``; the process formats them as JSON lines
and writes them with one ``write()`` per chunk: formatting costs about 1 µs a record
(:func:`format_records`), and done in a thread of this process it held the GIL the event
loop needs (on two cores it cost the gateway 60% of its throughput). With
``in_process=True``, or if the writer process cannot start or dies, the thread formats and
writes the records itself -- the same :class:`LogFiles` code, the same files. Files rotate
past ``max_file_bytes``; :meth:`close` writes what is left and fsyncs. A Spark job
(``spark/``) reads these files from every gateway and reconciles them message by message on
``trace_id``. The schema is documented in ``docs/delivery-log.md``.

Why JSON Lines. A line is a complete record, so the file is appendable by a writer that may
crash at any moment: at worst the last line is cut short, and a reader in ``PERMISSIVE`` or
``DROPMALFORMED`` mode skips it while every earlier line stays readable. Spark's JSON reader
takes a directory of such files with an explicit schema (no inference pass), and an operator
can ``grep`` a trace id across a day of logs. Parquet would need a batch writer that holds
row groups in memory until a file is closed (a crash loses the open file) and would make
pyarrow a runtime dependency of the gateway.

The hot path. The pending list is flat, ``WIDTH`` values a record, not a list of tuples:
the values are numbers, strings and one small tuple per *message*, its *head* (trace id,
message id, delivery mode, size, and what its body and properties hashes are made from:
what every record of the message repeats), made at its first record and kept on the message
(``Message.log_head``; ``Broker.publish`` makes it anew, as a producer may send the same
object again). So a record costs one attribute read instead of six, and the writer sends,
hashes and formats a head once per message (``marshal`` keeps the sharing; a head that
comes again in a later chunk finds its hashes in the writer's cache, :func:`hashes_json`).
The hashes (``body_hash``, ``props_hash``: BLAKE2b, 8 bytes) are made by the writer, not
here: a head holds a text or bytes body itself (up to :data:`SHIP_LIMIT`, a reference,
copied only when the chunk is marshalled) and the message's own properties dict, which the
writer sorts and encodes (:func:`canonical_properties`) before hashing (see
:func:`content`). A reference, not a copy: the core never changes the properties of a
message once it is published or imported (mapping rules work on copies, a transport adds
its import marker before the publish, the in-process producer sends a copy to reuse a
message), and a copy cost a dict, a tracked object, a message. Hashing 64 bytes on the loop cost about 0.5 µs, a tenth of what a
publish and its delivery cost in all; sorting and encoding two properties on the loop cost
1.3 µs, and a quarter of the throughput of messages that carry them (every MQTT publish
does). ``marshal`` takes no typed value (``Int8`` ...: every MQTT publish carries its QoS as
one), so a chunk with a typed property is sealed with ``pickle`` instead (see
:func:`encode`), which costs the loop about 2,000 instructions a message more. So a head
holds, for a set of properties met again (the same names with the very same value objects
as the set met last: an adapter takes its typed values from a table), the set's canonical
bytes instead of the dict, encoded once per set, and the chunk is marshalled (see
:meth:`DeliveryLog._property_set`). The few records with more to say (an import's or
export's far-side names, the rules that changed an export, a bus's count of lost messages)
carry it in their reason's place, as one tuple with the reason: an eighth value would cost
every record. A tuple per *record* was a tracked allocation that stayed
alive until the writer took it; ten thousand of them made the cyclic collector run every
few hundred messages and cost the gateway about 15% of its throughput. A head without
properties holds only strings, bytes and numbers, so the first collection that sees it stops
tracking it: measured, the collector costs the gateway under 0.5% more with the log on than
off. A head that holds a property dict stays tracked while its message lives when a value
in it is typed (``Int8`` ... are tracked objects), as the dict itself does: two more
tracked objects a message, one per message, not per record (a head that holds its set's
canonical bytes is not). The writer process reads the records straight from the flat
list.

Sealing. The thread that records the 500th pending record seals them: under a lock, it
marshals the pending list as it is and deletes its first ``n`` values (``del p[:n]``, ``n``
read before): ``marshal`` runs no Python code, so no other thread appends while it runs (a
length other than ``n`` after it says one did before it: then the first ``n`` values are
marshalled again, copied out), and the deletion is a single C-level list operation under
the GIL, as is the hot path's ``+=`` of a tuple, so ``n`` is always a whole number of
records and a record racing with it lands after them. A chunk to pickle is copied out
first (``flat = p[:n]``), as the pickler calls Python code, where another thread may
append. The bytes are appended to a queue of chunks; the writer thread seals a partial list
the same way, so chunks queue in the order their records were made. Sealing in the recording
thread, in small chunks, keeps the pending list in the CPU's caches and keeps ``marshal``
off the writer thread, which would otherwise take the GIL from the event loop once per
batch; the writer thread only needs the GIL to take the queue and call ``writev`` (released
while the pipe is full). A sealed record costs about 50 bytes instead of its Python objects.

Bounded memory. If records come faster than they can be written (a slow or stuck disk: the
writer process falls behind, its pipe fills, and the thread blocks writing to it), sealed
chunks pile up. Past ``max_pending`` sealed records (default 1,000,000, some 50 MB, and up
to 256 MB more where every record is of another message with a body: a head carries up to
:data:`SHIP_LIMIT` bytes of it), the thread that seals waits, until the writer has sent
what was sealed: the gateway slows to the speed of its log rather than dropping records or
running out of memory. Each such wait
counts in ``stalls``; the first is logged as a warning.

Threads: :meth:`record` may be called from any thread; the writer thread (or the writer
process) owns the files; :meth:`flush` and :meth:`close` may be called from any thread and
serialise with the writer.
"""

from __future__ import annotations

import _pickle  # the C pickler, subclassed below by its own module's name (for mypyc)
import hashlib
import io
import logging
import marshal
import operator
import os
import pickle
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from json.encoder import encode_basestring_ascii
from typing import TYPE_CHECKING, Any, Final, Protocol

from mypy_extensions import mypyc_attr

from gateway.message import BodyKind, DeliveryMode
from gateway.serial import write_value
from gateway.types import ARRAY_TYPES, SCALAR_TYPES

if TYPE_CHECKING:
    from gateway.dlog_writer import WriterProcess
    from gateway.message import Destination, Message

log = logging.getLogger(__name__)

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

CHUNK_RECORDS: Final = 500  # the recording thread seals (marshals) the pending list this often
BATCH_RECORDS = 10_000  # wake the writer early past this many sealed records
DEFAULT_FLUSH_INTERVAL = 0.2  # seconds; bounds how stale the file is behind the gateway
DEFAULT_MAX_FILE_BYTES = 64 << 20  # rotate past 64 MiB: one Spark input split per file or so
WIDTH: Final = 7  # values per record in the pending list (see "The hot path" above)
CHUNK_ITEMS: Final = CHUNK_RECORDS * WIDTH  # Final: constants in compiled code
MAX_PENDING = 1_000_000  # sealing waits past this many sealed records (~50 MB, ~3 s at
#                          full speed: far more than a healthy writer ever lets pile up)
CLOSE_TIMEOUT = 30.0  # seconds close() waits for the writer process before taking over

_MODE_JSON: dict[Any, str] = {m: '"' + m.name + '"' for m in DeliveryMode}
_EVENT_JSON: dict[str, str] = {e: '"' + e + '"' for e in EVENTS}
_FILE_SAFE = re.compile(r"[^A-Za-z0-9_.-]")
_BYTES = (bytes, bytearray, memoryview)
_PLAIN = frozenset({str, int, float, bool, bytes, type(None)})  # what marshal takes as is
_time = time.time
# The plain int of an IntEnum (a delivery mode: marshal takes no int subclass), for about a
# quarter of what int() costs it.
_index = operator.index

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
# Property sets (DeliveryLog._property_set): while a chunk of R records was made, more than
# 2 + R // SET_MISSES sets new to the log stop their recognition for the next SET_PAUSE
# chunks with typed values: sets that change that often are not worth it (a miss costs about
# what marshal saves), and a pause costs what the log cost before it recognised sets.
SET_MISSES: Final = 16
SET_PAUSE: Final = 64
_ABSENT: Any = object()  # no property value is this object
# record()'s inline test when no set is known: (size, bytes, name, value, name, value).
_NO_SET: tuple[int, bytes | None, Any, Any, Any, Any] = (-1, None, *(_ABSENT,) * 4)


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


def _fixed_canonical(props: dict[str, Any]) -> bytes | None:
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


class Stats(Protocol):
    """Where :class:`LogFiles` counts: a :class:`DeliveryLog`, or :class:`Counters`."""

    records_written: int
    write_errors: int
    files: list[str]


class Counters:
    """A :class:`Stats` of its own (the writer process reports its counts from here)."""

    def __init__(self) -> None:
        self.records_written = 0
        self.write_errors = 0
        self.files: list[str] = []


class LogFiles:
    """The files of one delivery log: format a batch, write it, rotate, fsync, retry.

    Used by the writer process (:mod:`gateway.dlog_writer`) and, in-process, by
    :class:`DeliveryLog`'s own thread; ``docs/delivery-log.md`` (Files) is its contract.
    ``on_open(path, seq)`` is called after a new file is created and before anything is
    written to it. Not thread-safe: one owner at a time.
    """

    def __init__(
        self,
        directory: str,
        gateway_id: str,
        max_file_bytes: int,
        stats: Stats,
        on_open: Callable[[str, int], None] | None = None,
    ) -> None:
        self.directory = directory
        self.gateway_id = gateway_id
        self.max_file_bytes = max_file_bytes
        self.stats = stats
        self.on_open = on_open
        self.fd = -1
        self.path: str | None = None  # the open file, if any
        self.file_bytes = 0
        self.seq = 0  # the last <seq> used in a file name
        self.unwritten = b""  # bytes a failed write left over, retried on the next batch
        self.unwritten_records = 0
        self.file_tag = _FILE_SAFE.sub("_", gateway_id) or "_"

    def write(self, flat: list[Any]) -> None:
        """Write what a failed write left over, then the records of ``flat`` (``WIDTH``
        values each): one ``write()``; may raise."""
        data = format_records(flat, self.gateway_id) if flat else b""
        if self.unwritten:
            data = self.unwritten + data
        n = len(flat) // WIDTH + self.unwritten_records
        self.unwritten, self.unwritten_records = b"", 0
        if data:
            self._write(data)
        self.stats.records_written += n

    def close(self) -> None:
        """Write what a failed write left over, fsync and close the file (raises OSError)."""
        if self.unwritten:
            self.write([])
        if self.fd >= 0:
            fd, self.fd, self.path = self.fd, -1, None
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def adopt(self, path: str, size: int) -> None:
        """Go on appending to ``path`` (``size`` bytes), left open by a writer that died.

        A file already past ``max_file_bytes`` is only fsynced: that writer would have
        rotated it, so the next batch opens a new file.
        """
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        except OSError:
            return  # gone: the next batch opens a new file
        if size < self.max_file_bytes:
            self.fd, self.path, self.file_bytes = fd, path, size
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _write(self, data: bytes) -> None:
        """One batch, one ``write()`` (looping only on a short write); rotates afterwards.

        On an OSError the unwritten rest is kept from the last complete line on and
        retried on the next batch in a new file; the old file may end in a partial line,
        which readers skip (see docs/delivery-log.md).
        """
        if self.fd < 0:
            self._open()
        view = memoryview(data)
        done = 0
        try:
            while done < len(data):
                done += os.write(self.fd, view[done:])
        except OSError:
            self.stats.write_errors += 1
            cut = data.rfind(b"\n", 0, done) + 1
            self.unwritten = data[cut:]
            self.unwritten_records = self.unwritten.count(b"\n")
            self.stats.records_written += data.count(b"\n", 0, cut)
            os.close(self.fd)
            self.fd, self.path = -1, None
            raise
        self.file_bytes += done
        if self.file_bytes >= self.max_file_bytes:
            self._rotate()

    def _open(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        while True:
            self.seq += 1
            path = os.path.join(
                self.directory, f"dlog-{self.file_tag}-{stamp}-{self.seq:04d}.jsonl"
            )
            try:
                self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
            except FileExistsError:
                continue  # a previous run in the same second: take the next number
            break
        self.path = path
        self.file_bytes = 0
        self.stats.files.append(path)
        if self.on_open is not None:
            self.on_open(path, self.seq)

    def _rotate(self) -> None:
        fd, self.fd, self.path = self.fd, -1, None
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class DeliveryLog:
    """Writes delivery records to JSON Lines files in ``directory``, batched by a thread.

    Args:
        directory: where ``dlog-<gateway_id>-<UTC yyyymmddTHHMMSS>-<seq>.jsonl`` files go
            (created if missing).
        gateway_id: this gateway's id; the ``gw`` field of every record.
        flush_interval: seconds between batches.
        max_file_bytes: start a new file once the current one has passed this size (a file
            may exceed it by one batch: batches are never split).
        enabled: when False, :meth:`record` does nothing, no file is created and no writer
            process is started.
        in_process: format and write in this process's writer thread instead of a writer
            process (for platforms or tests where a child process is not wanted).
        max_pending: :meth:`record` waits for the writer past this many pending records.

    ``records_written`` counts records in the files, ``write_errors`` failed writes (and a
    writer process that died), ``stalls`` the waits of :meth:`record` at ``max_pending``;
    ``files`` lists every file opened, oldest first. ``in_process`` turns True if the
    writer process could not start or died.
    """

    def __init__(
        self,
        directory: str,
        gateway_id: str,
        *,
        flush_interval: float = DEFAULT_FLUSH_INTERVAL,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        enabled: bool = True,
        in_process: bool = False,
        max_pending: int = MAX_PENDING,
    ) -> None:
        self.directory = directory
        self.gateway_id = gateway_id
        self.flush_interval = flush_interval
        self.max_file_bytes = max_file_bytes
        self.enabled = enabled
        self.in_process = in_process
        self.max_pending = max(max_pending, BATCH_RECORDS + CHUNK_RECORDS)
        self.records_written = 0
        self.write_errors = 0
        self.stalls = 0
        self.files: list[str] = []  # every file this log has opened, oldest first
        self._pending: list[Any] = []  # WIDTH values per record, flat (see record())
        self._chunks: deque[tuple[int, bytes]] = deque()  # sealed: (records, marshal bytes)
        self._sealed = 0  # records in _chunks
        self._seal_lock = threading.Lock()  # one seal at a time: chunks stay in order
        self._typed = False  # the last chunk held a typed value (see encode)
        self._sets = False  # recognise property sets (see _property_set)
        self._set_misses = 0  # sets new to the log met since the last chunk was sealed
        self._sets_pause = 0  # chunks with typed values to seal before recognising again
        # The property set met last: its (name, value) pairs and, once met twice in a row,
        # its canonical bytes; and for record()'s inline test, when it has at most two names,
        # (size, bytes, name, value, name, value). Each one tuple, replaced whole, so that no
        # thread pairs one set's names with another set's bytes.
        self._last_set: tuple[tuple[tuple[str, Any], ...], bytes | None] = ((), None)
        self._known_set = _NO_SET
        self._wake = threading.Event()
        self._room = threading.Event()  # set by the writer each time it sends chunks
        self._io_lock = threading.Lock()  # the writer thread vs flush()/close()
        self._stop = False
        self._writer_thread: threading.Thread | None = None
        self._files: LogFiles | None = None  # in-process writing
        self._child: WriterProcess | None = None  # the writer process, once started
        # Set when adapters run mapping rules on their deliveries (mappings.engine
        # log_deliveries): (message, consumer's connection id) -> (the copy the rules make
        # of it for that consumer, the rules' names), or None when no rule runs.
        self.delivered_as: Callable[[Message, str | None], tuple[Message, str] | None] | None = (
            None
        )

    # -- the hot path -------------------------------------------------------------------

    def record(
        self,
        event: str,
        msg: Message,
        dest: str | Destination,
        client: str | None,
        count: int = 0,
        reason: str | None = None,
        extra: tuple[Any, Any, Any, Any] | None = None,
    ) -> None:
        """Log one event for ``msg`` on ``dest`` (``topic:a.b`` or a Destination).

        Runs on the hot path: seven values added to a list (see "The hot path" above).
        ``client`` is the connection id or transport name involved (producer, consumer or
        transport), ``count`` the delivery count (JMSXDeliveryCount) where there is one,
        ``reason`` a short word for drops, discards, rejections and dead-lettering;
        ``extra``, for the few records that have them, ``(rules, far_id, far_dest, lost)``:
        the mapping rules that changed the message on its way out, the far side's message
        id and destination (import, export), the messages a bus reported lost. See
        ``docs/delivery-log.md``. A ``deliver`` or ``redeliver`` to a consumer whose adapter
        runs mapping rules on it (:attr:`delivered_as`) is logged with the copy the rules
        make, and their names.

        The message's properties are hashed as they are when the writer gets to them, so
        they must not change after the message's first record (the core never changes
        them; call :meth:`head` first for a message that is changed after it).

        Pass ``dest`` as a string the caller keeps (e.g. computed once per destination),
        not a Destination object: the writer process is sent plain strings and numbers
        (anything else is converted, slowly, batch by batch). For the same reason the
        delivery mode is stored as a plain ``int``.

        Never drops a record: past ``max_pending`` pending records it waits for the writer
        thread to take a batch (see "Bounded memory" above).
        """
        if self.enabled:
            if self.delivered_as is not None and (event == "deliver" or event == "redeliver"):
                sent = self.delivered_as(msg, client)
                if sent is not None:  # the consumer's copy, changed by its out rules
                    msg = sent[0]
                    rest = (None, None, None) if extra is None else extra[1:]
                    extra = (sent[1], *rest)
            head = msg.log_head
            if head is None:  # content(msg), the common case inline
                body = msg.body
                if not ((type(body) is bytes or type(body) is str) and len(body) <= SHIP_LIMIT):
                    body = content_body(msg)
                props = msg.properties
                held: Any = None
                if props:
                    if self._sets:  # the set met last, by identity (see _property_set)
                        n, canon, name1, value1, name2, value2 = self._known_set
                        try:
                            if (len(props) == n and props[name1] is value1
                                    and props[name2] is value2):
                                held = canon
                            else:
                                held = self._property_set(props)
                        except KeyError:  # (a plain dict: no __missing__)
                            held = self._property_set(props)
                    else:
                        held = props
                head = msg.log_head = (
                    msg.trace_id, msg.message_id, _index(msg.delivery_mode), msg.size, body,
                    held,
                )  # fmt: skip
            p = self._pending
            p += (_time(), event, head, dest, client, count,
                  reason if extra is None else (reason, *extra))
            if len(p) >= CHUNK_ITEMS:
                self._seal()

    def _property_set(self, props: dict[str, Any]) -> Any:
        """What a head holds for a message's properties ``props`` (not empty) that
        :meth:`record` did not recognise inline: their canonical bytes if they are the set
        met last, else the dict itself, which becomes the set met last.

        Why. A typed value (``Int8``: every MQTT publish carries its QoS as one) makes a
        chunk cross to the writer in ``pickle``'s format, which costs the event loop about
        2,000 instructions a message more than ``marshal``'s. The canonical bytes
        (:func:`canonical_properties`: what the writer hashes, so it writes the same
        ``props_hash``) are plain bytes, made once per set and shared by the heads of the
        messages that carry it, so a chunk of such messages is marshalled, and the writer
        neither unpickles nor encodes their properties. "The same set" is the same names,
        each with *the very same value object*: identity, exact where equality is not
        (``Int8(1) == 1 == True``, ``0.0 == -0.0``), and true of the values an adapter
        takes from a table (``mappings/mqtt.py``'s QoS values) or that are unique
        (``True``); so only a set whose values are of types no one can change
        (:data:`_FIXED`) is held as its bytes. A set is sent as the dict the first time it
        is met, and its bytes are made the second time in a row (once), so properties that
        change from message to message cost the copy of their pairs made here, and
        :meth:`_seal` pauses the recognition while they do (:data:`SET_MISSES`).
        """
        pairs, canon = self._last_set
        if len(pairs) == len(props):
            for name, value in pairs:
                if props.get(name, _ABSENT) is not value:
                    break
            else:
                if canon is None:
                    canon = _fixed_canonical(props)
                    if canon is None:  # the writer hashes the dict as it finds it
                        self._last_set, self._known_set = ((), None), _NO_SET
                        return props
                    self._last_set = (pairs, canon)
                    if len(pairs) <= 2:  # record()'s inline test: size, and two names
                        (name1, value1), (name2, value2) = pairs[0], pairs[-1]
                        self._known_set = (len(pairs), canon, name1, value1, name2, value2)
                return canon
        self._set_misses += 1
        self._last_set, self._known_set = (tuple(props.items()), None), _NO_SET
        return props

    def head(self, msg: Message) -> None:
        """Make ``msg``'s head (its hashes, see :func:`content`) now, if it has none: for a
        message that is changed after this (a transport adds its markers to what it exports)
        and is logged later."""
        if self.enabled and msg.log_head is None:
            body, props = content(msg)
            msg.log_head = (
                msg.trace_id, msg.message_id, _index(msg.delivery_mode), msg.size, body, props
            )  # fmt: skip

    def _seal(self, wait: bool = True) -> None:
        """Marshal (or pickle: see :func:`encode`) the pending records into a chunk for the
        writer (see "Sealing" above); wake the writer past a batch, and past
        ``max_pending`` wait until it has sent some (unless ``wait`` is False: the caller
        holds ``_io_lock`` and is the one to send)."""
        with self._seal_lock:
            p = self._pending
            n = len(p)
            if not n:
                return
            records_n = n // WIDTH
            typed = self._typed
            payload = b""
            if not typed:
                try:
                    payload = marshal.dumps(p)  # no Python code: no thread appends meanwhile
                    if len(p) != n:  # one did before it: exactly n values
                        payload = marshal.dumps(p[:n])
                except ValueError:  # a typed value (or a caller's bug): see encode
                    payload = b""
            if payload:
                del p[:n]
            else:  # the pickler calls Python code, where another thread may append
                flat = p[:n]
                del p[:n]
                payload, typed = encode(flat, True)
            self._typed = typed
            if self._sets:  # property sets (see _property_set)
                if self._set_misses > 2 + records_n // SET_MISSES:
                    self._sets = False  # they change too often: pause
                    self._sets_pause = SET_PAUSE
            elif typed:  # a typed value went in pickle's format: recognise sets
                if self._sets_pause:
                    self._sets_pause -= 1
                else:
                    self._sets = True
            self._set_misses = 0
            self._chunks.append((records_n, payload))
            self._sealed += records_n
            sealed = self._sealed
        if sealed >= BATCH_RECORDS:
            self._wake.set()
            if sealed >= self.max_pending and wait:
                self._full()

    def _full(self) -> None:
        """Past ``max_pending``: wait until the writer has sent some."""
        thread = self._writer_thread
        if thread is None or thread is threading.current_thread():
            return  # without a writer thread, flush() and close() write everything
        self.stalls += 1
        if self.stalls == 1:
            log.warning(
                "delivery log: %d records pending; record() waits for the writer (the log "
                "is written slower than the gateway works)",
                self._sealed,
            )
        limit = self.max_pending
        while self._sealed >= limit and not self._stop and thread.is_alive():
            self._room.clear()
            if self._sealed < limit:
                break
            self._wake.set()
            self._room.wait(0.05)

    @property
    def pending(self) -> int:
        """Records appended and not yet taken by the writer."""
        return len(self._pending) // WIDTH + self._sealed

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Start the writer process and the writer thread (a daemon; :meth:`close` stops it)."""
        if not self.enabled or self._writer_thread is not None:
            return
        self._stop = False
        if not self.in_process:
            with self._io_lock:
                if self._child is None:
                    self._spawn()
        self._writer_thread = threading.Thread(
            target=self._run, name=f"dlog-{self.gateway_id}", daemon=True
        )
        self._writer_thread.start()

    def flush(self) -> None:
        """Write every record appended so far, now; blocks until they are in the files.

        With a writer process, sends the records and then a barrier, and waits for the
        process to answer it. Raises OSError if some records could not be written (they are
        retried with the next batch).
        """
        with self._io_lock:
            self._drain()
            child = self._child
            if child is None:
                return
            try:
                error = child.barrier()
            except OSError:
                self._take_over(child)
                return
            if error is not None:
                raise OSError(*error)

    def close(self) -> None:
        """Stop the writer, write everything pending, fsync and close the file.

        Every record logged before ``close`` is called is written; calls to :meth:`record`
        after it are ignored. The writer process is told to finish and waited for (at most
        :data:`CLOSE_TIMEOUT` seconds; then it is killed and this process writes the rest).
        """
        thread = self._writer_thread
        if thread is not None:
            self._stop = True
            self._wake.set()
            thread.join()
            self._writer_thread = None
        with self._io_lock:
            self.enabled = False
            self._drain()
            child = self._child
            if child is not None:
                try:
                    error = child.close(CLOSE_TIMEOUT)
                except OSError:
                    self._take_over(child)
                else:
                    self._child = None
                    if error is not None:
                        raise OSError(*error)
                    return
            if self._files is not None:
                self._files.close()

    # -- the writer ---------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop:
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            try:
                with self._io_lock:
                    self._drain()
            except Exception:  # keep the thread alive; records stay pending for a retry
                log.exception("delivery log: writing a batch failed")

    def _drain(self) -> None:
        """Send or write every pending record; caller holds ``_io_lock``."""
        self._seal(wait=False)
        chunks = self._chunks
        if not self.in_process:
            child = self._child
            if child is None:
                if not chunks:
                    return
                child = self._spawn()
            if child is not None:
                try:
                    if child.dead:
                        raise BrokenPipeError
                    if not chunks and child.retry:
                        child.send([])  # let it retry what a failed write left over
                    while chunks:
                        child.send_encoded(self._take_chunks())  # kept until reported written
                    return
                except OSError:
                    self._take_over(child)
        files = self._files
        if files is None:
            files = self._files = LogFiles(
                self.directory, self.gateway_id, self.max_file_bytes, self
            )
        flat: list[Any] = []  # written here: the chunks back into records, in order
        while chunks:
            for _, payload in self._take_chunks():
                flat += decode_batch(payload)
        if flat or files.unwritten:
            files.write(flat)

    def _take_chunks(self) -> list[tuple[int, bytes]]:
        """Every sealed chunk, oldest first, taken out (caller holds ``_io_lock``)."""
        with self._seal_lock:
            chunks = list(self._chunks)
            self._chunks.clear()
            self._sealed = 0
        self._room.set()
        return chunks

    def _spawn(self) -> WriterProcess | None:
        """Start the writer process; on failure, write in-process from now on."""
        try:
            from gateway.dlog_writer import WriterProcess

            self._child = WriterProcess(
                self.directory, self.gateway_id, self.max_file_bytes, self, self._wake.set
            )
        except Exception:
            log.exception("delivery log: cannot start the writer process; writing in-process")
            self.in_process = True
        return self._child

    def _take_over(self, child: WriterProcess) -> None:
        """The writer process died: write, here, every record it had not written.

        Counted as one write error and logged once; from now on this log writes
        in-process. What the process wrote without reporting it is found in its files (see
        :meth:`WriterProcess.recover`), so no record is lost or written twice.
        """
        self._child = None
        self.in_process = True
        code = child.stop()
        self.write_errors += 1
        log.error(
            "delivery log: the writer process (pid %d) ended unexpectedly (exit code %s); "
            "writing in-process from now on",
            child.pid,
            code,
        )
        files = self._files = LogFiles(self.directory, self.gateway_id, self.max_file_bytes, self)
        left = child.recover(files)
        if left:
            files.write(left)
