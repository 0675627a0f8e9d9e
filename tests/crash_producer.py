"""Crash-test producer: runs a broker on a config dir, sends persistent messages, and
prints each message's number only once its send is confirmed (durable).

Usage: python tests/crash_producer.py CONFIG_DIR
The parent test kills this process with SIGKILL in the middle of the traffic.
"""

from __future__ import annotations

import asyncio
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])

from corehelp import Q, T, running_broker  # noqa: E402

from gateway.message import Message  # noqa: E402


async def main(directory: str) -> None:
    from pathlib import Path

    async with running_broker(Path(directory)) as broker:
        c = broker.connect(client_id="crash-sub")
        c.session().consumer(T("crash.topic"), durable_name="d").close()
        p = broker.connect().session().producer()
        n = 0
        pending: list[tuple[int, asyncio.Future[None] | None, asyncio.Future[None] | None]] = []
        while True:
            for _ in range(50):
                n += 1
                f1 = p.send(Message.text(str(n)), Q("crash.queue"))
                f2 = p.send(Message.text(str(n)), T("crash.topic"))
                pending.append((n, f1, f2))
            for i, f1, f2 in pending:
                if f1 is not None:
                    await f1
                if f2 is not None:
                    await f2
                sys.stdout.write(f"{i}\n")
            sys.stdout.flush()
            pending.clear()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
