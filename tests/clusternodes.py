"""Nodes of a gateway cluster for the tests: ``gateway serve`` processes on a private NATS
cluster (``peers.natsserver``), and a STOMP client for queues across them."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import stomp
from adminapi import admin_get
from corehelp import write_config
from peers.natsserver import NatsCluster
from serveproc import ServeProcess

LISTEN = ("listen = mqtt://127.0.0.1:{mqtt}\nlisten = amqp://127.0.0.1:0\n"
          "listen = stomp://127.0.0.1:0\nlisten = http://127.0.0.1:0\n")


def node(tmp: Path, nats: NatsCluster, i: int, mqtt_port: int = 0,
         extra: str = "", **files: str) -> ServeProcess:
    """Node ``n<i>`` of cluster ``t``, on NATS server ``i`` (its store and log its own);
    ``extra`` goes into its gateway.conf, ``files`` are its other config files."""
    d = tmp / f"node{i}"
    write_config(d, gateway=LISTEN.format(mqtt=mqtt_port)
                 + f"cluster = {nats.urls[i - 1]}\ncluster_name = t\nnode_id = n{i}\n"
                 f"store = {d / 'data'}\n" + extra, **files)
    return ServeProcess(d)


def cluster_info(p: ServeProcess) -> dict[str, Any]:
    info: dict[str, Any] = admin_get(p.port("http"), "/api/v1/server")["cluster"]
    return info


class StompQueueClient(stomp.ConnectionListener):
    """A stomp.py client on a node: sends with receipts, and consumes a queue
    (``client-individual``) acknowledging what it receives unless ``hold`` is set."""

    def __init__(self, port: int, *, hold: bool = False, client_id: str | None = None) -> None:
        self.got: list[tuple[str, dict[str, str]]] = []
        self.acked: list[str] = []  # the bodies acknowledged, in order
        self.receipts: set[str] = set()
        self.errors: list[str] = []
        self.hold = hold
        self.cond = threading.Condition()
        self.conn = stomp.Connection12([("127.0.0.1", port)], reconnect_attempts_max=1)
        self.conn.set_listener("", self)
        self.conn.connect(wait=True, headers={"client-id": client_id} if client_id else {})

    def on_message(self, frame: Any) -> None:
        with self.cond:  # an ACK is sent, and counted, only while ``hold`` is not set
            self.got.append((frame.body, dict(frame.headers)))
            if not self.hold:
                self.conn.ack(frame.headers["ack"])
                self.acked.append(frame.body)
            self.cond.notify_all()

    def stop_acking(self) -> list[str]:
        """Acknowledge nothing more; what was acknowledged (every ACK sent already)."""
        with self.cond:
            self.hold = True
            return list(self.acked)

    def on_receipt(self, frame: Any) -> None:
        with self.cond:
            self.receipts.add(frame.headers["receipt-id"])
            self.cond.notify_all()

    def on_error(self, frame: Any) -> None:
        with self.cond:
            self.errors.append(f"{frame.headers.get('message', '')}: {frame.body}")
            self.cond.notify_all()

    def consume(self, dest: str, headers: dict[str, str] | None = None) -> None:
        self.conn.subscribe(dest, id="1", ack="client-individual",
                            headers={"receipt": "sub", **(headers or {})})
        self.answered("sub")

    def answered(self, rid: str) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: rid in self.receipts or self.errors, 30), rid

    def send(self, dest: str, body: str, *, persistent: bool = True) -> None:
        self.conn.send(dest, body, headers={"persistent": str(persistent).lower(),
                                            "receipt": body})
        self.answered(body)

    def bodies(self) -> list[str]:
        with self.cond:
            return [b for b, _ in self.got]

    def close(self) -> None:
        if self.conn.is_connected() and not self.errors:
            self.conn.disconnect()
