"""A certified-delivery process for tests/interop/test_rv_certified.py, driven through its pipes.

``rvcm_child.py SERVICE NETWORK MODE NAME LEDGER SUBJECT``, modes:

* ``listen``: a persistent CM listener (``require_old``) on SUBJECT; prints
  ``{"n": <its n>, "seq": <sequence number, 0 if not certified>}`` per message and
  ``{"certified": <sender>}`` on REGISTRATION.CERTIFIED;
* ``send``: a persistent CM sender; each line ``FIRST LAST RATE`` on its standard input sends
  ``{n=FIRST}`` ... ``{n=LAST}`` to SUBJECT at RATE messages a second and prints
  ``{"sent": LAST}``; the line ``stored`` prints ``{"stored": <messages kept unconfirmed>}``.

Both print ``{"ready": NAME}`` first, and close their transports and exit when standard input
closes.
"""

from __future__ import annotations

import json
import sys
import threading
import time

from transports.rv import Dispatcher, Listener, Message, Transport, default_queue
from transports.rv.cmtransport import CmListener, CmTransport

_out_lock = threading.Lock()


def out(obj: object) -> None:
    with _out_lock:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()


def main() -> None:
    service, network, mode, name, ledger, subject = sys.argv[1:]
    t = Transport(service, network, ttl=0)
    dispatcher = Dispatcher(default_queue())
    cm = CmTransport(t, name, ledger_file=ledger, require_old=(mode == "listen"),
                     request_interval=0.5)
    if mode == "listen":
        def got(msg: Message, _: CmListener) -> None:
            label = msg.cm
            out({"n": msg.get("n"), "seq": label.sequence if label else 0})

        Listener(t, "_RV.INFO.RVCM.REGISTRATION.CERTIFIED.>",
                 lambda m, _: out({"certified": m.get("sender")}))
        cm.listen(subject, got)
        out({"ready": name})
        for _ in sys.stdin:
            pass
    else:
        out({"ready": name})
        for line in sys.stdin:
            if line.strip() == "stored":
                out({"stored": cm.stored_count()})
                continue
            first, last, rate = line.split()
            start = time.monotonic()
            for i, n in enumerate(range(int(first), int(last) + 1)):
                cm.send(Message(subject).add("n", n))
                ahead = start + i / float(rate) - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
            out({"sent": int(last)})
    cm.close()
    dispatcher.stop()
    t.close()


if __name__ == "__main__":
    main()
