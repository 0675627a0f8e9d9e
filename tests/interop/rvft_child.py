"""A fault-tolerance group member for tests/interop/test_rv_ft.py, driven through its pipes.

``rvft_child.py SERVICE NETWORK GROUP WEIGHT HEARTBEAT ACTIVATION``: joins GROUP and prints
``{"action": <ACTIVATE | DEACTIVATE | PREPARE_TO_ACTIVATE>, "t": <time.time()>}`` per action
(after ``{"ready": true}``); withdraws and exits when its standard input closes.
"""

from __future__ import annotations

import json
import sys
import time

from transports.rv import Dispatcher, Transport, default_queue
from transports.rv.fttransport import FtMember


def out(obj: object) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> None:
    service, network, group, weight, heartbeat, activation = sys.argv[1:]
    t = Transport(service, network, ttl=0)
    dispatcher = Dispatcher(default_queue())
    member = FtMember(t, group, lambda m, g, action: out({"action": action.value,
                                                          "t": time.time()}),
                      weight=int(weight), heartbeat=float(heartbeat),
                      activation=float(activation))
    out({"ready": True})
    for _ in sys.stdin:
        pass
    member.destroy()
    time.sleep(0.1)  # the LEAVE goes out
    dispatcher.stop()
    t.close()


if __name__ == "__main__":
    main()
