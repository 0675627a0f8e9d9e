"""A private cluster of NATS servers with JetStream on loopback, for the cluster's tests.

How this works: ``start_nats_cluster(workdir, nodes=3)`` picks three free ports per server
on 127.0.0.1 (clients, routes, monitoring), writes each server's configuration into
``workdir`` (its ``server_name``, the cluster's name and every other server's route, and a
JetStream store directory of its own), starts Debian's ``nats-server -c CONF`` for each, and
waits until every server answers its monitoring port's ``/healthz`` (JetStream included),
lists a route to each of the others and knows the JetStream meta group's leader. Leaving the ``with`` block stops them: SIGTERM, then
SIGKILL after a grace period. A server can be killed (``kill()``, SIGKILL: a crash) and
started again on the same ports and store (``start()``).

The servers are installed by ``bash tests/peers/install.sh`` (the test command runs it first);
a missing binary is an error (``PeerMissing``), never a skip.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from peers.mosquitto import (
    PeerFailedToStart,
    find_command,
    free_port,
    stop_process,
    tail,
)

START_TIMEOUT = 30.0  # a JetStream cluster elects its meta leader within seconds; CI is slow
HOST = "127.0.0.1"
START_ATTEMPTS = 3  # starts on fresh ports when one picked free was taken meanwhile


class NatsServer:
    """One server of the cluster: its ports, files and process."""

    def __init__(self, name: str, workdir: Path, client: int, route: int,
                 monitor: int) -> None:
        self.name = name
        self.workdir = workdir
        self.client_port = client
        self.route_port = route
        self.monitor_port = monitor
        self.config_path = workdir / f"{name}.conf"
        self.log_path = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://{HOST}:{self.client_port}"

    def write_config(self, cluster: str, routes: list[int]) -> None:
        route_urls = ", ".join(f'"nats-route://{HOST}:{p}"' for p in routes)
        self.config_path.write_text(
            f'server_name: "{self.name}"\n'
            f"listen: {HOST}:{self.client_port}\n"
            f"http: {HOST}:{self.monitor_port}\n"
            f'jetstream {{ store_dir: "{self.workdir / self.name}" }}\n'
            f'cluster {{\n  name: "{cluster}"\n  listen: {HOST}:{self.route_port}\n'
            f"  routes: [{route_urls}]\n}}\n")

    def start(self) -> None:
        binary = find_command("nats-server")
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen([binary, "-c", str(self.config_path)],
                                         stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self) -> None:
        """SIGKILL: the server dies as in a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)

    def monitor(self, path: str) -> dict[str, object] | None:
        """The monitoring port's JSON answer for ``path``, None when it does not answer."""
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.monitor_port}{path}",
                                        timeout=2) as r:
                data: dict[str, object] = json.load(r)
                return data
        except (OSError, ValueError, urllib.error.URLError):
            return None

    def ready(self, peers: int) -> bool:
        """Healthy, routed to ``peers`` other servers, and in a JetStream meta group that
        has elected its leader."""
        health = self.monitor("/healthz?js-enabled=true")
        routes = self.monitor("/routez")
        jsz = self.monitor("/jsz")
        meta = jsz.get("meta_cluster") if jsz else None
        return bool(health and health.get("status") == "ok" and routes
                    and int(str(routes.get("num_routes", 0))) >= peers
                    and isinstance(meta, dict) and meta.get("leader"))


class NatsCluster:
    """The servers of one private cluster."""

    def __init__(self, servers: list[NatsServer]) -> None:
        self.servers = servers

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        running = [s for s in self.servers if s.proc is not None and s.proc.poll() is None]
        while not all(s.ready(len(running) - 1) for s in running):
            for s in running:
                if s.proc is not None and s.proc.poll() is not None:
                    raise PeerFailedToStart(f"nats-server {s.name} exited:\n{tail(s.log_path)}")
            if time.monotonic() > deadline:
                logs = "\n".join(f"{s.name}: {tail(s.log_path, 5)}" for s in running)
                raise PeerFailedToStart(f"NATS cluster not ready after {timeout:g} s:\n{logs}")
            time.sleep(0.1)

    def stop(self) -> None:
        for s in self.servers:
            s.stop()


@contextlib.contextmanager
def start_nats_cluster(workdir: Path, nodes: int = 3,
                       cluster: str = "gwtest") -> Iterator[NatsCluster]:
    """Run ``nodes`` NATS servers (JetStream, one cluster) on loopback; stop them at the end.

    A port picked free may be taken before its server binds it (by an outgoing connection's
    ephemeral port, the servers' own routes among them): the cluster is then started again
    on other ports, at most :data:`START_ATTEMPTS` times."""
    find_command("nats-server")
    for attempt in range(START_ATTEMPTS):
        where = workdir if attempt == 0 else workdir / f"again-{attempt}"
        where.mkdir(parents=True, exist_ok=True)
        servers = [NatsServer(f"n{i + 1}", where, free_port(HOST), free_port(HOST),
                              free_port(HOST)) for i in range(nodes)]
        for s in servers:
            s.write_config(cluster, [o.route_port for o in servers if o is not s])
        group = NatsCluster(servers)
        try:
            for s in servers:
                s.start()
            group.wait_ready()
        except PeerFailedToStart as exc:
            group.stop()
            if "address already in use" in str(exc) and attempt + 1 < START_ATTEMPTS:
                continue
            raise
        except BaseException:
            group.stop()
            raise
        try:
            yield group
        finally:
            group.stop()
        return
