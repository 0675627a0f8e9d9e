"""Child process of test_store's crash test: writes persistent messages until it is killed.

Usage: ``python store_crash_child.py DB_PATH RUN``. It opens the SQLite store (sync on),
prints ``open <recovered message count>``, then keeps ``PRODUCERS`` producers busy, each
sending its next message when the commit callback of its previous one fires. Only in that
callback -- after the message is durable -- does it print ``stored <store_id> <body>``.
Every third stored message is then acknowledged (``remove_entry`` + ``delete_message``) and
``acked <store_id>`` is printed once that commit's callback fires. The parent kills it with
SIGKILL mid-stream and checks the store against what was printed.
"""

from __future__ import annotations

import asyncio
import sys

from gateway.message import Destination, Message
from gateway.store import SqliteStore

ENDPOINT = "queue:crash"
PRODUCERS = 20


async def main(path: str, run: str) -> None:
    loop = asyncio.get_running_loop()
    store = SqliteStore(path, sync=True)
    recovered = store.open(loop.call_soon_threadsafe)
    out = sys.stdout
    out.write(f"open {len(recovered.messages)}\n")
    out.flush()
    store.put_endpoint(ENDPOINT, {"type": "queue", "name": "crash"})
    store.commit()
    counter = 0

    def send() -> None:
        nonlocal counter
        counter += 1
        body = f"run{run}-msg{counter}"
        msg = Message.text(body, destination=Destination.queue("crash"))
        sid = store.put_message(msg)
        store.add_entry(ENDPOINT, sid, 0)

        def acked() -> None:
            out.write(f"acked {sid}\n")
            out.flush()

        def stored() -> None:
            out.write(f"stored {sid} {body}\n")
            out.flush()
            if sid % 3 == 0:
                store.remove_entry(ENDPOINT, sid)
                store.delete_message(sid)
                store.commit(acked)
            send()

        store.commit(stored)

    for _ in range(PRODUCERS):
        send()
    await asyncio.Event().wait()  # until killed


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
