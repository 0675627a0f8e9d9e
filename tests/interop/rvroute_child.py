"""A program on one RV-style bus for tests/interop/test_rv_router.py, driven through its pipes.

``rvroute_child.py SERVICE NETWORK``; commands on standard input, one a line:

* ``listen SUBJECT``: a listener; prints ``{"listening": SUBJECT}`` once it exists, then
  ``{"msg": {"subject", "n", "route": [network, hops] or null}}`` per message;
* ``send SUBJECT FIRST LAST``: sends ``{n=FIRST}`` ... ``{n=LAST}``; prints ``{"sent": LAST}``;
* ``respond SUBJECT TAG``: answers each request on SUBJECT with ``{tag=TAG echo=<its n>}``;
  prints ``{"responding": SUBJECT}``;
* ``request SUBJECT N TIMEOUT``: a request ``{n=N}``; prints ``{"reply": {"tag", "echo"}}``
  or ``{"timeout": N}``.

It prints ``{"ready": <transport id>}`` first, and closes its transport and exits when its
standard input closes.
"""

from __future__ import annotations

import sys

from rvcm_child import out

from transports.rv import Dispatcher, Listener, Message, RequestTimeout, Transport, default_queue


def main() -> None:
    service, network = sys.argv[1:3]
    t = Transport(service, network, ttl=0)
    dispatcher = Dispatcher(default_queue())

    def show(m: Message, _: Listener) -> None:
        route = m.route
        out({"msg": {"subject": m.send_subject, "n": m.get("n"),
                     "route": None if route is None else [route.network, route.hops]}})

    out({"ready": t.id})
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "listen":
            Listener(t, words[1], show)
            out({"listening": words[1]})
        elif words[0] == "send":
            subject, first, last = words[1], int(words[2]), int(words[3])
            for n in range(first, last + 1):
                t.send(Message(subject).add("n", n))
            out({"sent": last})
        elif words[0] == "respond":
            tag = words[2]

            def answer(m: Message, _: Listener, tag: str = tag) -> None:
                t.send_reply(Message().add("tag", tag).add("echo", m.get("n", -1)), m)

            Listener(t, words[1], answer)
            out({"responding": words[1]})
        elif words[0] == "request":
            n = int(words[2])
            try:
                reply = t.send_request(Message(words[1]).add("n", n), float(words[3]))
            except RequestTimeout:
                out({"timeout": n})
            else:
                out({"reply": {"tag": reply.get("tag"), "echo": reply.get("echo")}})
    dispatcher.stop()
    t.close()


if __name__ == "__main__":
    main()
