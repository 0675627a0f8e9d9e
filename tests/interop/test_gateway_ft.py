"""Two gateways in one fault-tolerance group of the RV-style bus (``ft_group``), sharing a
store: the backup stands by, takes over when the primary is killed with SIGKILL mid-stream
of certified imports, and imports none of them twice (TIBCO EMS User's Guide, "Fault
Tolerance"; TIBCO Rendezvous Concepts, Fault Tolerance Concepts)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gw import wait_for
from test_transport_rv import Bus
from test_transport_rvcm import GatewayProcess, drain_amqp, free_port, warm_up

from transports.rv import Message
from transports.rv.cmtransport import CmTransport

SUBJECT = "orders.new"
HEARTBEAT, ACTIVATION = 0.3, 1.5


@pytest.fixture
def bus() -> Iterator[Bus]:
    b = Bus()
    yield b
    b.close()


def pair(tmp_path: Path, bus: Bus) -> tuple[GatewayProcess, GatewayProcess]:
    shared, ports = tmp_path / "shared", (free_port(), free_port(), free_port())
    ft = (f"ft_group = GW.PAIR\nft_service = {bus.service}\nft_network = {bus.network}\n"
          f"ft_heartbeat = {int(HEARTBEAT * 1000)} msec\n"
          f"ft_activation = {int(ACTIVATION * 1000)} msec\n")
    primary = GatewayProcess(tmp_path / "primary", bus, store=shared, ports=ports,
                             extra=ft + "ft_weight = 20\n")
    backup = GatewayProcess(tmp_path / "backup", bus, store=shared, ports=ports,
                            extra=ft + "ft_weight = 10\n")
    return primary, backup


def test_the_backup_gateway_takes_over_and_imports_nothing_twice(bus, tmp_path):
    n = 300
    primary, backup = pair(tmp_path, bus)
    sender = CmTransport(bus.t, "SENDER", ledger_file=tmp_path / "sender.ledger",
                         request_interval=0.3)
    try:
        primary.start()
        backup.start(ready=False)
        wait_for(lambda: backup.said("gateway standby"), timeout=30, what="the backup standing by")
        warm_up(sender)
        start = time.monotonic()
        killed_at = 0.0
        for i in range(1, n + 1):
            sender.send(Message(SUBJECT).add("n", i))
            time.sleep(max(0.0, start + i / 300 - time.monotonic()))
            if i == n // 3:
                wait_for(lambda: primary.queued() >= n // 8, timeout=30,
                         what="imports under way")
                assert not backup.said("gateway ready")
                killed_at = time.time()
                primary.kill()
        backup.wait_up()
        ready_at = time.time()
        assert ready_at - killed_at >= ACTIVATION - HEARTBEAT - 0.05  # not before the loss
        wait_for(lambda: sender.stored_count() == 0, timeout=60,
                 what="the sender's ledger to empty (every message confirmed)")
        got = drain_amqp(backup.amqp, SUBJECT, set(range(1, n + 1)))
        # (the warm-ups, n = 0, are sent until the registration is in)
        assert sorted(x for x in got if x) == list(range(1, n + 1)), "every message once"
    finally:
        sender.close()
        backup.stop()
        primary.stop()


def test_a_stopped_primary_hands_over_at_once_and_gets_it_back_when_heavier(bus, tmp_path):
    primary, backup = pair(tmp_path, bus)
    try:
        primary.start()
        backup.start(ready=False)
        wait_for(lambda: backup.said("gateway standby"), timeout=30, what="the backup standing by")
        stopped_at = time.monotonic()
        primary.stop()  # SIGTERM: it withdraws from the group, so no activation interval
        backup.wait_up()
        assert time.monotonic() - stopped_at < 30
        primary.start(ready=False)  # heavier: the backup gives way once it is active
        wait_for(lambda: backup.said("deactivates this gateway"), timeout=30,
                 what="the backup deactivated")
        primary.wait_up()
    finally:
        backup.stop()
        primary.stop()
