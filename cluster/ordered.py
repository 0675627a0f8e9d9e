"""One way out to NATS in order: what a node's parts queue goes out one item after the other.

nats-py's calls are coroutines and the core's are not: the feeds and the shared records
hand what they send to an :class:`Ordered`, which one task drains, awaiting each
item's coroutine in turn, so that what was queued first reaches NATS first (an
acknowledgement after the publish it follows, a deletion after the write it undoes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


class Ordered:
    """Items handed to ``handler``, in the order queued, by one task at a time."""

    def __init__(self, handler: Callable[[Any], Awaitable[None]]) -> None:
        self.handler = handler
        self.items: list[Any] = []
        self.task: asyncio.Task[None] | None = None

    def put(self, item: Any) -> None:
        self.items.append(item)
        if self.task is None:
            self.task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        try:
            while self.items:
                batch, self.items = self.items, []
                for item in batch:
                    await self.handler(item)
        finally:
            self.task = None

    async def flush(self, timeout: float) -> None:
        """Wait (at most ``timeout`` seconds) for what is queued to go out."""
        if self.task is not None:
            await asyncio.wait([self.task], timeout=timeout)
