"""A virtual circuit terminal for tests/interop/test_rv_vc.py in its own process.

``rvvc_child.py SERVICE NETWORK CONNECT_SUBJECT HEARTBEAT``: connects to CONNECT_SUBJECT,
prints ``{"connected": true}``, then sends back on the circuit every message it receives
there on ORDERS.> (subject ``ECHO.<its subject>``); exits when its standard input closes.
"""

from __future__ import annotations

import json
import sys

from transports.rv import Dispatcher, Listener, Message, Transport, default_queue
from transports.rv.vc import VcTransport


def main() -> None:
    service, network, connect_subject, heartbeat = sys.argv[1:]
    t = Transport(service, network, ttl=0)
    dispatcher = Dispatcher(default_queue())
    vc = VcTransport.create_connect(t, connect_subject, heartbeat=float(heartbeat))

    def echo(msg: Message, _: Listener) -> None:
        msg.send_subject = "ECHO." + (msg.send_subject or "")
        vc.send(msg)

    Listener(vc, "ORDERS.>", echo)
    if vc.wait_for_vc_connection(30):
        sys.stdout.write(json.dumps({"connected": True}) + "\n")
        sys.stdout.flush()
    for _ in sys.stdin:
        pass
    vc.close()
    dispatcher.stop()
    t.close()


if __name__ == "__main__":
    main()
