"""A test's child process that reports in JSON lines, for the RV bus's interop tests.

The child is ``python SCRIPT ARGS...`` with the repository on its path. A reader thread
hands each object it prints to :meth:`JsonChild.take`; what that does not keep goes to
:attr:`JsonChild.lines`. The first line must have ``ready``. Closing its standard input asks
it to finish; :meth:`kill` is SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


class JsonChild:
    def __init__(self, script: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, script, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        first = self.lines.get(timeout=60)
        assert "ready" in first, first

    def take(self, obj: dict[str, Any]) -> bool:
        """Keep a reported object (True), or leave it to :attr:`lines` (False)."""
        return False

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            obj = json.loads(line)
            if not self.take(obj):
                self.lines.put(obj)

    def say(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.stop()

    def stop(self) -> None:
        """Close its standard input, wait for it (killing it after 30 s), close its pipes."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if not self.proc.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(timeout=10)
        self.proc.stdout.close()
