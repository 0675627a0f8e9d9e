"""The delivery log's files: one write per batch, rotation, fsync, and a failed write retried.

How this works. :class:`LogFiles` owns the files of one delivery log: it formats a batch of
records (:func:`gateway.dlog_format.format_records`) and writes it with one ``write()`` to
``dlog-<gateway_id>-<UTC yyyymmddTHHMMSS>-<seq>.jsonl`` in the log's directory, opening a new
file (exclusively created, so a previous run in the same second is never appended to) when
there is none, and fsyncing and closing the file once it has passed ``max_file_bytes``. A
write that fails keeps its unwritten whole lines and retries them, first thing, in a new file
with the next batch; the old file may end in a cut line, which readers skip. The writer
process (:mod:`gateway.dlog_writer`) runs it, and so does :class:`gateway.dlog.DeliveryLog`'s
writer thread when it writes in-process, so the files are the same either way;
``docs/delivery-log.md`` ("Files") is its contract. It counts into a :class:`Stats`.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from typing import Any, Protocol

from gateway.dlog_format import WIDTH, format_records

_FILE_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


class Stats(Protocol):
    """Where :class:`LogFiles` counts: a :class:`~gateway.dlog.DeliveryLog`, or :class:`Counters`."""

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
    :class:`~gateway.dlog.DeliveryLog`'s own thread; ``docs/delivery-log.md`` (Files) is its contract.
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
