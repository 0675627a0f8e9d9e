"""What the delivery log says of a transport's own traffic, read back from the files a running
gateway wrote (docs/delivery-log.md, "Events"): shared by the transports' interop tests.

A transport's records name it (``client`` its name, never its core connection's id) and carry
no reason but a drop's; a message it imports enters the gateway once (its ``import``, no
``publish`` beside it) before anything is delivered; what it takes from the core to export is
no delivery (no ``deliver``, ``redeliver`` or ``ack``: its ``export`` is the way out); and a
copy it drops carries what its import would have.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gw import GatewayThread, wait_for

HAND_OFF = ("deliver", "redeliver", "ack")
ENTRIES = ("publish", "import")
# What a dropped copy repeats of its import record (msg_id and far_id are the copy's own).
AS_IMPORTED = ("dest", "trace_id", "far_dest", "body_hash", "props_hash", "mode", "size")


def log_records(g: GatewayThread) -> list[dict[str, Any]]:
    """Every delivery-log record the gateway has written so far, in file order."""
    g.call(lambda: g.broker.dlog.flush())
    out: list[dict[str, Any]] = []
    for f in sorted(Path(g.broker.config.gateway.delivery_log_dir).iterdir()):
        out += [json.loads(line) for line in f.read_text("utf-8").splitlines()]
    return out


def core_id(g: GatewayThread, name: str) -> str:
    """The id of transport ``name``'s connection to the core."""
    t = g.gateway.transports.transports[name]  # type: ignore[union-attr]
    return g.call(lambda: t.core.id)  # type: ignore[no-any-return]


def events_of(records: list[dict[str, Any]], rec: dict[str, Any]) -> list[str]:
    """The events, in file order, of the message of ``rec`` (its trace id: a delivery to a
    wildcard subscription names the subscription's destination)."""
    return [r["event"] for r in records if r["trace_id"] == rec["trace_id"]]


def check_transport_records(records: list[dict[str, Any]], name: str, core: str) -> None:
    """The records of transport ``name`` (core connection ``core``) say what the document
    says: its imports and exports name it and have no reason, nothing names its core
    connection, nothing is delivered to it or acknowledged by it, and each message it imported
    has one entry record, the import, written before its deliveries."""
    imports = [r for r in records if r["event"] == "import"]
    exports = [r for r in records if r["event"] == "export"]
    assert imports and exports, "an import and an export to check"
    for r in imports + exports:
        assert (r["client"], r["reason"]) == (name, None), r
    assert [r for r in records if r["client"] == core] == []
    assert [r for r in records if r["event"] in HAND_OFF and r["client"] == name] == []
    for imp in imports:
        events = events_of(records, imp)
        assert [e for e in events if e in ENTRIES] == ["import"], events
        assert events[0] == "import", events


def check_duplicate_drop(records: list[dict[str, Any]], name: str, trace_id: str) -> dict[str, Any]:
    """The one ``drop`` of a second copy of the message with ``trace_id``, imported once by
    transport ``name``: it names the transport, says ``duplicate`` and carries what the import
    record of the copy would have (a message id; the import's trace id, far-side destination,
    hashes, delivery mode and size). Returns the drop record."""
    (imported,) = [r for r in records if r["event"] == "import" and r["trace_id"] == trace_id]
    (drop,) = [r for r in records if r["event"] == "drop" and r["trace_id"] == trace_id]
    assert (drop["client"], drop["reason"]) == (name, "duplicate"), drop
    assert drop["msg_id"] is not None, drop
    assert {k: drop[k] for k in AS_IMPORTED} == {k: imported[k] for k in AS_IMPORTED}
    return drop


def check_resend_drops(records: list[dict[str, Any]], name: str) -> int:
    """The ``drop`` records of resends that transport ``name`` knew by their far-side
    message-id (no gateway sent them: each copy has a trace id of its own): each names the
    transport, says ``duplicate`` and carries what the copy's import record would have (a
    message id; the import's far-side id and destination, hashes, delivery mode and size).
    Returns how many there are."""
    imports = {r["far_id"]: r for r in records if r["event"] == "import"}
    drops = [r for r in records if r["event"] == "drop" and r["reason"] == "duplicate"]
    same = [k for k in ("far_id", *AS_IMPORTED) if k != "trace_id"]
    for drop in drops:
        assert drop["client"] == name and drop["msg_id"] is not None, drop
        first = imports[drop["far_id"]]
        assert {k: drop[k] for k in same} == {k: first[k] for k in same}
    return len(drops)


def exported_records(g: GatewayThread, name: str) -> list[dict[str, Any]]:
    """The gateway's records once transport ``name`` has written its export, checked as
    ``check_transport_records`` does; the exported message's records are its publish and
    its export (no hand-off), and each imported one's, a drop of a copy aside, its import,
    its delivery to the local consumer and the ack."""
    records: list[dict[str, Any]] = wait_for(
        lambda: (r := log_records(g)) and any(x["event"] == "export" for x in r) and r,
        what="the export record")
    check_transport_records(records, name, core_id(g, name))
    (exp,) = [r for r in records if r["event"] == "export"]
    assert events_of(records, exp) == ["publish", "export"]
    for imp in (r for r in records if r["event"] == "import"):
        assert [e for e in events_of(records, imp) if e != "drop"] == [
            "import", "deliver", "ack"]
    return records
