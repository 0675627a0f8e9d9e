"""A stand-in engine for testing the RV-style bus's asyncio shell, and a child process that runs one.

``StandInEngine`` has the reliable multicast engine's interface and none of its protocol:
``send`` queues the payload for the multicast destination, ``send_to`` for one inbox, and
every datagram received becomes an event ``(data, addr, now)``. ``close`` queues one
multicast ``b"bye:<inbox port>"``. A test can set ``deadline`` to see the shell's timer call
``tick``.

Run as a script it is one process on the bus, driven through stdin and reporting on stdout,
one JSON object a line::

    python tests/rvstandin.py --service S --network N [--ttl T] [--loop uvloop]

    out: {"ready": [ip, inbox_port], "service": port, "send": [addr, port]}
    in:  {"send": "<hex>"} | {"send_to": [ip, port], "data": "<hex>"} | {"close": true}
    out: {"got": "<hex>", "addr": [ip, port]}   for every datagram received
    out: {"closed": true}                       after the shell has closed
    out: {"error": "..."}                       if the shell could not start

``--pair`` runs two such processes on the given (by default, the default) service and
network: this one and a child. This one multicasts ``b"pair"`` and prints one line, the
service port, whether the network is broadcast, its inbox, the source addresses the child
saw ``b"pair"`` from, and whether it heard itself (or ``{"error": ...}``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from transports.rv.net import ParameterError  # noqa: E402
from transports.rv.shell import Shell  # noqa: E402

# The engine's multicast destination: anything that is not an (ip, port) tuple.
MULTICAST = "multicast"


class StandInEngine:
    """Records what arrives, sends what it is told; no reliability at all."""

    def __init__(self, *, ip: str, port: int, service: int) -> None:
        self.ip = ip
        self.port = port
        self.service = service
        self.outgoing: list[tuple[bytes, Any]] = []
        self.pending_events: list[tuple[bytes, tuple[str, int], float]] = []
        self.received: list[tuple[bytes, tuple[str, int], float]] = []
        self.ticks: list[float] = []
        self.deadline: float | None = None
        self.closed_at: float | None = None

    def receive_datagram(self, data: bytes, addr: tuple[str, int], now: float) -> None:
        self.received.append((data, addr, now))
        self.pending_events.append((data, addr, now))

    def send(self, payload: bytes, now: float) -> None:
        self.outgoing.append((payload, MULTICAST))

    def send_to(self, dest: tuple[str, int], payload: bytes, now: float) -> None:
        self.outgoing.append((payload, dest))

    def datagrams_to_send(self) -> list[tuple[bytes, Any]]:
        out, self.outgoing = self.outgoing, []
        return out

    def events(self) -> list[Any]:
        out, self.pending_events = self.pending_events, []
        return out

    def tick(self, now: float) -> None:
        self.ticks.append(now)
        if self.deadline is not None and now >= self.deadline:
            self.deadline = None

    def next_deadline(self) -> float | None:
        return self.deadline

    def close(self, now: float) -> None:
        self.closed_at = now
        self.outgoing.append((b"bye:%d" % self.port, MULTICAST))


def _emit(obj: object) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def _child(args: argparse.Namespace) -> None:
    def on_events(events: list[Any]) -> None:
        for data, addr, _now in events:
            _emit({"got": data.hex(), "addr": list(addr)})

    try:
        shell = await Shell.start(
            StandInEngine, args.service, args.network, on_events=on_events, ttl=args.ttl
        )
    except (ParameterError, OSError) as exc:
        _emit({"error": str(exc)})
        return
    _emit({
        "ready": list(shell.inbox_address),
        "service": shell.sockets.service.port,
        "send": list(shell.sockets.send_destination),
    })
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        command = json.loads(line)
        if "send" in command:
            shell.send(bytes.fromhex(command["send"]))
        elif "send_to" in command:
            ip, port = command["send_to"]
            shell.send_to((ip, int(port)), bytes.fromhex(command["data"]))
        elif command.get("close"):
            break
    await shell.close()
    _emit({"closed": True})


async def _pair(args: argparse.Namespace) -> None:
    own: list[tuple[bytes, tuple[str, int]]] = []

    def on_events(events: list[Any]) -> None:
        own.extend((data, addr) for data, addr, _now in events)

    command = [sys.executable, __file__, "--network", args.network, "--ttl", str(args.ttl)]
    if args.service is not None:
        command += ["--service", args.service]
    child = await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    assert child.stdin is not None and child.stdout is not None
    ready = json.loads(await asyncio.wait_for(child.stdout.readline(), 30))
    if "error" in ready:
        _emit(ready)
        await child.wait()
        return
    shell = await Shell.start(
        StandInEngine, args.service, args.network, on_events=on_events, ttl=args.ttl
    )
    shell.send(b"pair")
    child_got: list[list[Any]] = []
    while not child_got:
        line = json.loads(await asyncio.wait_for(child.stdout.readline(), 30))
        if line.get("got") == b"pair".hex():
            child_got.append(line["addr"])
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while not any(data == b"pair" for data, _ in own) and loop.time() < deadline:
        await asyncio.sleep(0.01)
    child.stdin.write(b'{"close": true}\n')
    await child.stdin.drain()
    await asyncio.wait_for(child.wait(), 30)
    _emit({
        "service": shell.sockets.service.port,
        "broadcast": shell.sockets.endpoint.broadcast,
        "send": list(shell.sockets.send_destination),
        "inbox": list(shell.inbox_address),
        "child_got": child_got,
        "own_got": any(data == b"pair" for data, _ in own),
    })
    await shell.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--service", default=None)
    parser.add_argument("--network", default="")
    parser.add_argument("--ttl", type=int, default=1)
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    parser.add_argument("--pair", action="store_true")
    args = parser.parse_args()
    if args.pair:
        asyncio.run(_pair(args))
        return
    if args.loop == "uvloop":
        import uvloop

        uvloop.run(_child(args))
    else:
        asyncio.run(_child(args))


if __name__ == "__main__":
    main()
