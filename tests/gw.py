"""A real gateway for black-box tests: started in a background thread on loopback ports.

Tests talk to it over sockets with independent clients (paho-mqtt, the mosquitto command-line
clients, raw sockets). ``call`` runs a function on the gateway's loop, for tests that also
use the in-process client API (cross-protocol checks).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from adminapi import admin_get, admin_post
from corehelp import write_config

from gateway.config import load_config
from gateway.server import Gateway


def wait_for(cond: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll ``cond`` from the test's thread until it is truthy (returned) or ``timeout`` s."""
    end = time.time() + timeout
    while time.time() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class GatewayThread:
    """A gateway on an event loop in a thread of the test process: asyncio's own loop, or
    uvloop's (``uvloop=True``, the loop ``gateway serve`` runs on) where a test is about
    what the loop does with sockets."""

    def __init__(self, directory: Path, *, uvloop: bool = False, **files: str) -> None:
        self.directory = directory
        self.uvloop = uvloop
        gw = files.pop("gateway", "")
        if "listen" not in gw:
            gw += "\nlisten = mqtt://127.0.0.1:0\nlisten = http://127.0.0.1:0\n"
        write_config(directory, gateway=gw, **files)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.gateway: Gateway | None = None
        self.thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None

    def start(self) -> GatewayThread:
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()

        async def main() -> None:
            self.loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            try:
                self.gateway = Gateway(load_config(str(self.directory)))
                await self.gateway.start()
            except BaseException as exc:
                ready.set_exception(exc)
                return
            ready.set_result(None)
            await self._stop.wait()
            await self.gateway.stop()

        if self.uvloop:
            import uvloop

            run: Any = uvloop.run
        else:
            run = asyncio.run
        self.thread = threading.Thread(target=lambda: run(main()), daemon=True)
        self.thread.start()
        ready.result(timeout=30)
        return self

    def stop(self) -> None:
        if self.loop is not None and self._stop is not None and self.thread is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
            self.thread.join(timeout=30)
        self.thread = None

    def restart(self) -> GatewayThread:
        self.stop()
        return self.start()

    def port(self, scheme: str) -> int:
        assert self.gateway is not None
        return self.gateway.addresses[scheme][1]

    @property
    def broker(self) -> Any:
        assert self.gateway is not None
        return self.gateway.broker

    def admin_get(self, path: str, **kw: Any) -> Any:
        """``GET path`` of the admin API (``/api/v1/...``) on the http listener, as JSON,
        with the predefined ``admin`` user's credentials unless ``user`` / ``password``."""
        return admin_get(self.port("http"), path, **kw)

    def admin_post(self, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        """``POST path`` of the admin API with ``body`` as JSON: ``(status, answer)``."""
        return admin_post(self.port("http"), path, body, **kw)

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the gateway's loop and return its result (a coroutine is awaited)."""
        assert self.loop is not None

        async def run() -> Any:
            r = fn()
            if asyncio.iscoroutine(r):
                r = await r
            return r

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=30)

    def __enter__(self) -> GatewayThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
