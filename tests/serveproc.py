"""``gateway serve`` in a process of its own, for tests that need real processes (a cluster's
nodes, a gateway killed with SIGKILL)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

from gw import wait_for

ROOT = Path(__file__).resolve().parent.parent


class ServeProcess:
    """``gateway serve`` in a process of its own, its output read by a thread (so the pipe
    never fills); the ports it listens on are read from its log lines."""

    def __init__(self, config_dir: Path) -> None:
        self.config_dir = config_dir
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config-dir", str(config_dir)],
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        wait_for(lambda: "gateway ready\n" in self.lines or self.proc.poll() is not None,
                 timeout=60, what="gateway serve to start")
        assert self.proc.poll() is None, "gateway serve exited:\n" + "".join(self.lines)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def port(self, scheme: str) -> int:
        pattern = re.compile(rf"listening for {scheme} on 127\.0\.0\.1:(\d+)")
        for line in self.lines:
            m = pattern.search(line)
            if m:
                return int(m.group(1))
        raise AssertionError(f"no {scheme} listener in:\n" + "".join(self.lines))

    def said(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def stop(self) -> None:
        """SIGTERM: the gateway's own shutdown."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
        self.reader.join(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def kill(self) -> None:
        """SIGKILL: no shutdown of any kind."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self.reader.join(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
