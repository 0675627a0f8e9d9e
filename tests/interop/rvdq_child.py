"""A distributed-queue member for tests/interop/test_rv_dq.py, driven through its pipes.

``rvdq_child.py SERVICE NETWORK QUEUE SUBJECT SCHEDULER_WEIGHT WORKER_TASKS WORK_MS``: a
member of distributed queue QUEUE listening to SUBJECT; each task takes WORK_MS
milliseconds, then it prints ``{"n": <its n>, "seq": <sequence number>}``; it prints
``{"scheduler": true}`` / ``{"scheduler": false}`` on QUEUE.SCHEDULER.ACTIVE / INACTIVE.
Prints ``{"ready": QUEUE}`` first, and leaves the queue and exits when standard input
closes.
"""

from __future__ import annotations

import sys
import time

from rvcm_child import out

from transports.rv import Dispatcher, Listener, Message, Transport, default_queue
from transports.rv.dqtransport import DqListener, DqTransport


def main() -> None:
    service, network, name, subject, sched_weight, tasks, work_ms = sys.argv[1:]
    t = Transport(service, network, ttl=0)
    dispatcher = Dispatcher(default_queue())
    Listener(t, "_RV.INFO.RVCM.QUEUE.SCHEDULER.>",
             lambda m, _: out({"scheduler": ".ACTIVE." in (m.send_subject or "")}))
    dq = DqTransport(t, name, scheduler_weight=int(sched_weight), worker_tasks=int(tasks),
                     scheduler_heartbeat=0.5, scheduler_activation=2.0, request_interval=0.5)

    def work(msg: Message, _: DqListener) -> None:
        time.sleep(int(work_ms) / 1000)
        label = msg.cm
        out({"n": msg.get("n"), "seq": label.sequence if label else 0})

    dq.listen(subject, work)
    out({"ready": name})
    for _ in sys.stdin:
        pass
    dq.close()
    dispatcher.stop()
    t.close()


if __name__ == "__main__":
    main()
