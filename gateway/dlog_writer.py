"""The delivery log's writer process: formats records as JSON lines and writes the files.

How this works. :class:`~gateway.dlog.DeliveryLog` starts ``python -m gateway.dlog_writer``
(a fresh interpreter, never a ``fork`` of the threaded gateway) and talks to it over two
pipes in frames of one kind byte, a 4-byte little-endian length and a ``marshal`` payload
(a chunk of records with a typed property value: ``pickle``, see :func:`~gateway.dlog_format.encode`):

==========  =====================================  ========================================
direction   frame                                  meaning
==========  =====================================  ========================================
to it       ``I`` (directory, gateway_id, max)     the first frame: what :class:`LogFiles` needs
to it       ``B`` [value, ...]                     a chunk, ``WIDTH`` values a record: write it
to it       ``F`` token                            a barrier: answer ``A`` once done with the above
to it       ``C``                                  finish: fsync, close, answer ``C``, exit
from it     ``O`` (path, seq)                      a new file, sent before anything is written to it
from it     ``D`` (written, errors, path, size,    after each batch: records in the files so
            error)                                 far, failed writes, the open file and its size
from it     ``A`` (token, error)                   the barrier; error of the last write, or None
from it     ``C`` error                            closed; it exits next
==========  =====================================  ========================================

The parent marshals records in chunks of 500 as they are made (``marshal.dumps``, C code,
about 0.1 µs a record against 1 µs to format one); its writer thread writes the chunks, a
frame each, with one ``os.writev``, which releases the GIL while the pipe is full. The
formatting, the files, rotation and fsync are :class:`LogFiles`, the same code the
in-process mode runs, so the files are the same.

Failure. The writer ignores SIGINT and SIGTERM and ends when its input ends: if the gateway
is killed, it reads what is left in the pipe, writes it, fsyncs and exits. If the writer
dies, the parent sees the pipe break (or its reports end), and :meth:`WriterProcess.recover`
works out what it wrote: each batch sent is kept (as its encoded bytes) until a ``D``
report counts its records as written; lines in the files past the last reported size were
written but not reported (a cut last line is cut off), and the rest is written in-process.
"""

from __future__ import annotations

import logging
import marshal
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from gateway.dlog_files import Counters, LogFiles, Stats
from gateway.dlog_format import WIDTH, decode_batch, encode_batch

log = logging.getLogger("gateway.dlog")

_HEAD = struct.Struct("<cI")  # kind, payload length
_INIT, _BATCH, _FLUSH, _CLOSE = b"I", b"B", b"F", b"C"  # to the writer
_OPENED, _DONE, _ACK, _CLOSED = b"O", b"D", b"A", b"C"  # from the writer
_FRAMES_PER_WRITE = 500  # two iovecs a frame; Linux takes at most 1,024 in one writev
PIPE_BYTES = 1 << 20  # pipe size asked for: ~10,000 records in flight (Linux default max)

_Error = tuple[Any, str] | None  # (errno, strerror) of a failed write, for OSError(*error)


def _read_frame(fd: int) -> tuple[bytes, bytes] | None:
    """One frame from ``fd``; None at the end of input (a cut frame is dropped)."""
    head = _read_exact(fd, _HEAD.size)
    if head is None:
        return None
    kind, n = _HEAD.unpack(head)
    payload = _read_exact(fd, n)
    return None if payload is None else (kind, payload)


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _write_frame(fd: int, kind: bytes, payload: bytes) -> None:
    """One frame to ``fd``; blocks (GIL released) while the pipe is full."""
    _write_frames(fd, [(kind, payload)])


def _write_frames(fd: int, frames: list[tuple[bytes, bytes]]) -> None:
    """Frames to ``fd`` with one ``writev`` (one wait for the GIL after it, however many);
    blocks (GIL released) while the pipe is full."""
    parts: list[bytes] = []
    for kind, payload in frames:
        parts += (_HEAD.pack(kind, len(payload)), payload)
    total = sum(map(len, parts))
    done = os.writev(fd, parts)
    if done < total:  # a signal cut the write short
        rest = memoryview(b"".join(parts))[done:]
        while rest:
            rest = rest[os.write(fd, rest) :]


def unreported_lines(touched: list[tuple[str, int]]) -> tuple[int, tuple[str, int] | None]:
    """Lines a dead writer wrote past the sizes it last reported, in ``touched`` files.

    ``touched`` is the file open at its last report (with the size reported) and the files
    it opened after it (size 0), in order. Returns the number of complete lines found and
    the last file with its size, after cutting off a line the writer was killed in the
    middle of (the record is written again, whole). A cut line at the end of an earlier
    file was left by a failed write; its record is in a later file, so it is not counted.
    Every file touched is fsynced.
    """
    lines = 0
    last: tuple[str, int] | None = None
    for i, (path, reported) in enumerate(touched):
        try:
            with open(path, "rb") as f:
                f.seek(reported)
                tail = f.read()
                os.fsync(f.fileno())
        except OSError:
            continue
        lines += tail.count(b"\n")
        size = reported + len(tail)
        if i == len(touched) - 1:
            cut = len(tail) - (tail.rfind(b"\n") + 1)
            try:
                if cut:
                    os.truncate(path, size - cut)
                    size -= cut
                last = (path, size)
            except OSError:  # keep the cut line (readers skip it); go on in a new file
                pass
    return lines, last


class WriterProcess:
    """The gateway's side of one writer process: start it, send batches, read its reports.

    Not thread-safe except where said: the :class:`~gateway.dlog.DeliveryLog` calls it
    holding its I/O lock. A reader thread applies the reports to ``stats`` (the counters
    of the DeliveryLog) and calls ``on_exit`` once the process has ended.
    """

    def __init__(
        self,
        directory: str,
        gateway_id: str,
        max_file_bytes: int,
        stats: Stats,
        on_exit: Callable[[], None],
    ) -> None:
        self.stats = stats
        self.on_exit = on_exit
        self.dead = False  # its reports ended: it exited or was killed
        self.retry = False  # its last write failed; it holds records for a retry
        self._sent = 0  # records sent
        self._retained: deque[tuple[int, int, bytes]] = deque()  # (first, count, payload)
        self._written = 0  # records it reported written
        self._errors = 0  # write errors it reported
        self._path: str | None = None  # its open file at its last D report
        self._size = 0
        self._opened: list[str] = []  # files it opened since
        self._seq = 0
        self._token = 0
        self._acked = 0
        self._ack_error: _Error = None
        self._closed: list[_Error] = []  # its C report
        self._cond = threading.Condition()
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "gateway.dlog_writer"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, env=env,
        )  # fmt: skip
        self.pid = self.proc.pid
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._to = self.proc.stdin
        self._from = self.proc.stdout
        try:
            import fcntl

            fcntl.fcntl(self._to.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        except (ImportError, AttributeError, OSError):
            pass  # not Linux, or over /proc/sys/fs/pipe-max-size: the default 64 KiB
        try:
            self._send(_INIT, marshal.dumps((directory, gateway_id, max_file_bytes)))
        except OSError:
            self.stop()
            raise
        self._reader = threading.Thread(
            target=self._read, name=f"dlog-{gateway_id}-reports", daemon=True
        )
        self._reader.start()

    # -- called by the DeliveryLog, under its I/O lock ----------------------------------

    def send(self, flat: list[Any]) -> None:
        """Send a flat batch (kept until reported written); OSError if the process is gone."""
        self.send_encoded([(len(flat) // WIDTH, encode_batch(flat))])

    def send_encoded(self, chunks: list[tuple[int, bytes]]) -> None:
        """Send chunks of (number of records, :func:`~gateway.dlog_format.encode_batch` bytes),
        each kept until reported written, with one ``writev``; OSError if the process is
        gone (the chunks are kept all the same: :meth:`recover` finds what was not written)."""
        frames = []
        for n, payload in chunks:
            self._retained.append((self._sent, n, payload))
            self._sent += n
            frames.append((_BATCH, payload))
        for i in range(0, len(frames), _FRAMES_PER_WRITE):
            _write_frames(self._to.fileno(), frames[i : i + _FRAMES_PER_WRITE])

    def barrier(self) -> _Error:
        """Wait until everything sent is written; the error of its last write, or None.

        Raises OSError if the process is gone.
        """
        self._token += 1
        token = self._token
        self._send(_FLUSH, marshal.dumps(token))
        with self._cond:
            while self._acked < token:
                if self.dead:
                    raise BrokenPipeError("the delivery log writer process is gone")
                self._cond.wait()
            return self._ack_error

    def close(self, timeout: float) -> _Error:
        """Tell it to finish and wait for it to exit; its last write error, or None.

        Raises OSError if it is gone without finishing, TimeoutError after ``timeout``.
        """
        self._send(_CLOSE, b"")
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self.dead:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("the delivery log writer process did not finish")
                self._cond.wait(left)
        self.stop()
        if not self._closed:
            raise BrokenPipeError("the delivery log writer process ended before closing")
        return self._closed[0]

    def stop(self) -> int | None:
        """Kill it unless it has exited, reap it, let the reader finish; its exit code."""
        if self.proc.poll() is None:
            self.proc.kill()
        code = self.proc.wait()
        if getattr(self, "_reader", None) is not None:
            self._reader.join()
        for pipe in (self._to, self._from):
            try:
                pipe.close()
            except OSError:
                pass
        return code

    def recover(self, files: LogFiles) -> list[Any]:
        """After :meth:`stop`: the records it did not write, in order; ``files`` continues.

        Counts the records it wrote without reporting them into ``stats`` and leaves
        ``files`` appending to its last file (or opening the next number).
        """
        touched = [(self._path, self._size)] if self._path else []
        touched += [(path, 0) for path in self._opened]
        lines, last = unreported_lines(touched)
        self.stats.records_written += lines
        done = self._written + lines
        left: list[Any] = []  # flat, WIDTH values a record
        for first, count, payload in self._retained:
            if first + count > done:
                left.extend(decode_batch(payload)[max(0, done - first) * WIDTH :])
        files.seq = self._seq
        if last is not None:
            files.adopt(*last)
        return left

    def _send(self, kind: bytes, payload: bytes) -> None:
        _write_frame(self._to.fileno(), kind, payload)

    # -- the reader thread --------------------------------------------------------------

    def _read(self) -> None:
        fd = self._from.fileno()
        try:
            while True:
                frame = _read_frame(fd)
                if frame is None:
                    break
                self._apply(frame[0], marshal.loads(frame[1]))
        except Exception:
            log.exception("delivery log: bad report from the writer process; stopping it")
            self.proc.kill()
        finally:
            try:
                self.proc.wait(5.0)
            except subprocess.TimeoutExpired:  # closed its output but lives on: not ours
                self.proc.kill()
                self.proc.wait()
            with self._cond:
                self.dead = True
                self._cond.notify_all()
            self.on_exit()

    def _apply(self, kind: bytes, value: Any) -> None:
        error: _Error = None
        with self._cond:
            if kind == _DONE:
                written, errors, self._path, self._size, error = value
                self.stats.records_written += written - self._written
                self.stats.write_errors += errors - self._errors
                self._written, self._errors = written, errors
                self._opened.clear()
                self.retry = error is not None
                kept = self._retained
                while kept and kept[0][0] + kept[0][1] <= written:
                    kept.popleft()
            elif kind == _OPENED:
                path, seq = value
                self.stats.files.append(path)
                self._opened.append(path)
                self._seq = max(self._seq, seq)
            elif kind == _ACK:
                self._acked, self._ack_error = value
            elif kind == _CLOSED:
                self._closed.append(value)
            else:
                raise ValueError(f"unknown report {kind!r}")
            self._cond.notify_all()
        if error is not None:
            log.error("delivery log: writing a batch failed: %s", OSError(*error))


# -- the writer process ----------------------------------------------------------------


class _Writer:
    """The loop of the writer process: frames in, files written, reports out."""

    def __init__(self, out: int, directory: str, gateway_id: str, max_file_bytes: int) -> None:
        self.out = out
        self.counts = Counters()
        self.files = LogFiles(directory, gateway_id, max_file_bytes, self.counts, self._opened)
        self.error: _Error = None  # of the last write

    def run(self) -> int:
        while True:
            frame = _read_frame(0)
            if frame is None:  # the gateway is gone (or closed the pipe): finish
                self._finish()
                return 0
            kind, payload = frame
            if kind == _BATCH:
                self._write(decode_batch(payload))
            elif kind == _FLUSH:
                self._reply(_ACK, (marshal.loads(payload), self.error))
            elif kind == _CLOSE:
                self._finish()
                self._reply(_CLOSED, self.error)
                return 0
            else:
                raise ValueError(f"delivery log writer: unknown frame {kind!r}")

    def _write(self, flat: list[Any]) -> None:
        try:
            self.files.write(flat)
            self.error = None
        except OSError as e:
            self.error = (e.errno, e.strerror or str(e))
        self._done()

    def _finish(self) -> None:
        try:
            self.files.close()
            self.error = None
        except OSError as e:
            self.error = (e.errno, e.strerror or str(e))
        self._done()

    def _done(self) -> None:
        f = self.files
        c = self.counts
        self._reply(_DONE, (c.records_written, c.write_errors, f.path, f.file_bytes, self.error))

    def _opened(self, path: str, seq: int) -> None:
        self._reply(_OPENED, (path, seq))

    def _reply(self, kind: bytes, value: Any) -> None:
        if self.out < 0:
            return
        try:
            _write_frame(self.out, kind, marshal.dumps(value))
        except OSError:
            self.out = -1  # the gateway is gone: go on writing the files


NICENESS = 10  # scheduling priority offset of the writer process (0 = same as the gateway)


def main() -> int:
    """The writer process: ``python -m gateway.dlog_writer``, started by DeliveryLog."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # it ends when its input ends
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Formatting can lag a little behind: give the CPU to the gateway and its peers first
    # (the gateway's pending bound holds it back if the writer falls too far behind).
    try:
        os.nice(NICENESS)
    except OSError:
        pass
    out = os.dup(1)
    os.dup2(2, 1)  # a stray print() goes to stderr, not into the reports
    frame = _read_frame(0)
    if frame is None or frame[0] != _INIT:
        return 2
    directory, gateway_id, max_file_bytes = marshal.loads(frame[1])
    return _Writer(out, directory, gateway_id, max_file_bytes).run()


if __name__ == "__main__":
    sys.exit(main())
