"""A process on the RV-style bus for tests/interop/test_rv_bus.py, driven through its pipes.

``rvbus_child.py SERVICE NETWORK MODE ARGS...``, modes:

* ``listen SUBJECT...``: a listener per subject; prints ``{"msg": <message JSON>}`` per
  message received;
* ``respond SUBJECT ID``: answers each request on SUBJECT with ``{id=ID echo=<its n>}``;
* ``send SUBJECT N``: sends ``{n=0}`` ... ``{n=N-1}`` to SUBJECT (an inbox name works too).

It prints ``{"ready": <transport id>}`` once its listeners exist, and closes its transport
and exits when its standard input closes (or, for ``send``, when it has sent).
"""

from __future__ import annotations

import json
import sys
import threading

from transports.rv import Dispatcher, Listener, Message, Transport, default_queue


def out(obj: object) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> None:
    service, network, mode, *args = sys.argv[1:]
    t = Transport(service, network, ttl=0)
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


if __name__ == "__main__":
    main()
