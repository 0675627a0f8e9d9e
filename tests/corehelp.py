"""Helpers for core tests: a broker on a config directory written by the test."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

import gateway.message
from gateway.broker import Broker
from gateway.config import load_config
from gateway.dlog import DeliveryLog
from gateway.message import Destination
from gateway.store import open_store

T = Destination.topic
Q = Destination.queue

# The run is on the compiled build (setup.py, tests/test_compiled.py): its classes refuse a
# value of the wrong type when it is set, and their methods cannot be replaced on an object.
COMPILED = not gateway.message.__file__.endswith(".py")
not_compiled = pytest.mark.skipif(
    COMPILED, reason="sets values of the wrong type or replaces a method: pure Python only")


def make_cert(directory: Path, name: str = "server") -> tuple[Path, Path]:
    """A self-signed certificate (``name.pem``) and its unencrypted key (``name.key``) for
    127.0.0.1, made with openssl: the configuration loads TLS files into a context."""
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        raise RuntimeError("openssl is needed to make a test certificate")
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )
    return cert, key


def write_config(directory: Path, **files: str) -> Path:
    """Write ``gateway.conf`` etc. (keyword ``gateway="..."`` → ``gateway.conf``)."""
    directory.mkdir(parents=True, exist_ok=True)
    defaults = {"topics": ">\n", "queues": ">\n"}
    defaults.update(files)
    gw = defaults.get("gateway", "")
    if "store" not in gw:
        gw += f"\nstore = {directory / 'data'}\n"
    if "listen" not in gw:
        gw += "\nlisten = none\n"
    defaults["gateway"] = gw
    for name, text in defaults.items():
        (directory / f"{name}.conf").write_text(text)
    return directory


@contextlib.asynccontextmanager
async def running_broker(directory: Path, *, store_type: str | None = None,
                         log: bool = True, **files: str) -> AsyncIterator[Broker]:
    """A started broker on a config dir; closes it (and flushes the store) on exit."""
    if files or not (directory / "gateway.conf").exists():
        write_config(directory, **files)
    config = load_config(str(directory))
    gw = config.gateway
    kind = store_type or gw.store_type
    os.makedirs(gw.store, exist_ok=True)
    store = open_store(kind, os.path.join(str(gw.store), "gateway.db"), gw.store_sync)
    loop = asyncio.get_running_loop()
    backlog = max(int(gw.destination_backlog_swapout), 1) if gw.msg_swapping else 0
    recovered = store.open(loop.call_soon_threadsafe, backlog)
    dlog = DeliveryLog(str(gw.delivery_log_dir), "test-gw", enabled=log)
    dlog.start()
    broker = Broker(config, store, dlog, gateway_id="test-gw")
    broker.start(recovered)
    try:
        yield broker
    finally:
        broker.close()
        await loop.run_in_executor(None, store.close)
        await loop.run_in_executor(None, dlog.close)


def collect() -> tuple[list[Any], Any]:
    """A listener that appends each delivery to a list."""
    got: list[Any] = []
    return got, got.append


async def settle(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


class CommitHook:
    """A broker's store with its ``commit`` replaced by ``commit(callback, on_error)``, the
    rest passed through: for tests that hold commit callbacks back. Put in ``broker.store``
    (a compiled store's methods cannot be replaced on the object itself)."""

    def __init__(self, store: Any, commit: Any) -> None:
        self.store = store
        self.commit = commit

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


async def until(cond: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> None:
    """Wait on the broker's loop until ``cond()`` is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)
