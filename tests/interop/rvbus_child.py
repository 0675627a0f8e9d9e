"""A process on the RV-style bus for tests/interop/test_rv_bus.py, driven through its pipes.

``rvbus_child.py SERVICE NETWORK MODE ARGS...``, modes:

* ``listen SUBJECT...``: a listener per subject; prints ``{"msg": <message JSON>}`` per
  message received;
* ``respond SUBJECT ID``: answers each request on SUBJECT with ``{id=ID echo=<its n>}``;
* ``send SUBJECT N``: sends ``{n=0}`` ... ``{n=N-1}`` to SUBJECT (an inbox name works too);
* ``pair N``: starts a ``listen`` child on ``PAIR.>``, sends ``PAIR.WARM`` until the child
  has one (its first contact with this sender's stream), then ``{n=0}`` ... ``{n=N-1}`` on
  ``PAIR.DATA`` in bursts of 1 to 50, and prints ``{"got": [the n of each message the child
  printed, in order], "retransmitted": packets this sender resent}`` when the child has all
  N or after 60 s.

It prints ``{"ready": <transport id>}`` once its listeners exist, and closes its transport
and exits when its standard input closes (or, for ``send``, when it has sent).
"""

from __future__ import annotations

import json
import queue
import random
import subprocess
import sys
import threading
import time

from transports.rv import Dispatcher, Listener, Message, Transport, default_queue


def out(obj: object) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> None:
    service, network, mode, *args = sys.argv[1:]
    t = Transport(service, network, ttl=0)
    if mode == "pair":
        pair(t, service, network, int(args[0]))
        return
    if mode == "send":
        subject, n = args
        for i in range(int(n)):
            t.send(Message(subject).add("n", i))
        out({"sent": int(n)})
        t.close()
        return
    if mode == "listen":
        for subject in args:
            Listener(t, subject, lambda m, _: out({"msg": json.loads(m.to_json())}))
    elif mode == "respond":
        subject, ident = args

        def answer(m: Message, _: Listener) -> None:
            t.send_reply(Message().add("id", ident).add("echo", m.get("n", -1)), m)

        Listener(t, subject, answer)
    dispatcher = Dispatcher(default_queue())
    out({"ready": t.id})
    done = threading.Event()

    def wait_stdin() -> None:
        sys.stdin.read()
        done.set()

    threading.Thread(target=wait_stdin, daemon=True).start()
    done.wait()
    dispatcher.stop()
    t.close()


def pair(t: Transport, service: str, network: str, n: int) -> None:
    child = subprocess.Popen([sys.executable, __file__, service, network, "listen", "PAIR.>"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdin is not None
    lines: queue.Queue[dict[str, object]] = queue.Queue()

    def read() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            lines.put(json.loads(line))

    threading.Thread(target=read, daemon=True).start()
    assert "ready" in lines.get(timeout=30)
    while True:  # until the child has heard this sender's stream
        t.send(Message("PAIR.WARM"))
        try:
            lines.get(timeout=0.05)
            break
        except queue.Empty:
            pass
    rng = random.Random(n)
    i = 0
    while i < n:
        for _ in range(rng.randint(1, 50)):
            if i < n:
                t.send(Message("PAIR.DATA").add("n", i))
                i += 1
        time.sleep(0.001)
    got: list[int] = []
    deadline = time.monotonic() + 60
    while len(got) < n and time.monotonic() < deadline:
        try:
            m = lines.get(timeout=1)
        except queue.Empty:
            continue
        msg = m.get("msg")
        if isinstance(msg, dict) and msg.get("subject") == "PAIR.DATA":
            got.append(msg["fields"][0]["value"])
    assert t.host is not None
    out({"got": got, "retransmitted": t.host.engine.stats.retransmitted})
    child.stdin.close()
    child.wait(timeout=30)
    t.close()


if __name__ == "__main__":
    main()
