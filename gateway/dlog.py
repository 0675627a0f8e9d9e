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
``trace_id``. The schema is documented in ``docs/delivery-log.md``. A record's hashes, its
JSON line and the chunks' encoding are :mod:`gateway.dlog_format`'s; the files,
:mod:`gateway.dlog_files`'.

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

import logging
import marshal
import operator
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from gateway.dlog_files import LogFiles
from gateway.dlog_format import (
    SHIP_LIMIT,
    WIDTH,
    content,
    content_body,
    decode_batch,
    encode,
    fixed_canonical,
)

if TYPE_CHECKING:
    from gateway.dlog_writer import WriterProcess
    from gateway.message import Destination, Message

log = logging.getLogger(__name__)

CHUNK_RECORDS: Final = 500  # the recording thread seals (marshals) the pending list this often
BATCH_RECORDS = 10_000  # wake the writer early past this many sealed records
DEFAULT_FLUSH_INTERVAL = 0.2  # seconds; bounds how stale the file is behind the gateway
DEFAULT_MAX_FILE_BYTES = 64 << 20  # rotate past 64 MiB: one Spark input split per file or so
CHUNK_ITEMS: Final = CHUNK_RECORDS * WIDTH  # Final: constants in compiled code
MAX_PENDING = 1_000_000  # sealing waits past this many sealed records (~50 MB, ~3 s at
#                          full speed: far more than a healthy writer ever lets pile up)
CLOSE_TIMEOUT = 30.0  # seconds close() waits for the writer process before taking over

_time = time.time
# The plain int of an IntEnum (a delivery mode: marshal takes no int subclass), for about a
# quarter of what int() costs it.
_index = operator.index

# Property sets (DeliveryLog._property_set): while a chunk of R records was made, more than
# 2 + R // SET_MISSES sets new to the log stop their recognition for the next SET_PAUSE
# chunks with typed values: sets that change that often are not worth it (a miss costs about
# what marshal saves), and a pause costs what the log cost before it recognised sets.
SET_MISSES: Final = 16
SET_PAUSE: Final = 64
_ABSENT: Any = object()  # no property value is this object
# record()'s inline test when no set is known: (size, bytes, name, value, name, value).
_NO_SET: tuple[int, bytes | None, Any, Any, Any, Any] = (-1, None, *(_ABSENT,) * 4)


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
                    canon = fixed_canonical(props)
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
