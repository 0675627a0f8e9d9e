"""A private RabbitMQ node on loopback (AMQP 0-9-1 and 1.0, MQTT, STOMP), for interop tests
and benchmarks.

How this works: ``start_rabbitmq(workdir)`` runs Debian's RabbitMQ 3.10 as the current user
with everything it owns inside ``workdir``, so it never meets the system installation (whose
service tests/peers/install.sh keeps stopped) nor another private node:

* its own epmd (the Erlang port mapper), started by us in the foreground as
  ``epmd -address 127.0.0.1 -port P`` on a free port and named to every Erlang VM through
  ``ERL_EPMD_PORT``; the node is told not to start one itself (``-start_epmd false``);
* the node ``gwtest-<pid>-<n>@localhost`` (``RABBITMQ_NODENAME``), with its Erlang
  distribution listener on a free port of 127.0.0.1 (``RABBITMQ_DIST_PORT`` and
  ``-kernel inet_dist_use_interface {127,0,0,1}``, given to the server, to rabbitmqctl and,
  through ``ERL_FLAGS``, to the short-lived helper VMs they spawn), and a private ``HOME``
  holding a fresh ``.erlang.cookie``;
* a ``rabbitmq.conf`` (``RABBITMQ_CONFIG_FILE``) with one listener each for AMQP (0-9-1 and,
  through the rabbitmq_amqp1_0 plugin, 1.0 on the same port), MQTT and STOMP on free ports of
  127.0.0.1, the user guest/guest allowed from anywhere (``loopback_users = none``; the
  listeners are on loopback anyway) and guest as the default user of AMQP 1.0 connections
  without SASL or with SASL ANONYMOUS, of MQTT connections without credentials and of STOMP
  CONNECT frames without login;
* the plugins rabbitmq_amqp1_0, rabbitmq_mqtt and rabbitmq_stomp
  (``RABBITMQ_ENABLED_PLUGINS``, and the same list in ``RABBITMQ_ENABLED_PLUGINS_FILE`` for
  rabbitmq-plugins), the database under ``RABBITMQ_MNESIA_BASE``, the logs under
  ``RABBITMQ_LOG_BASE``, and an empty ``RABBITMQ_CONF_ENV_FILE`` so that
  /etc/rabbitmq/rabbitmq-env.conf is not read.

The server is started through /usr/lib/rabbitmq/bin/rabbitmq-server, not /usr/sbin's wrapper
(which, run as root, would switch to the ``rabbitmq`` account). Start-up waits until the log
says "Server startup complete" and the AMQP, MQTT and STOMP ports accept TCP connections. It
is slow: 8 to 12 s on an idle 2-CPU machine, 17 s with a second node busy on it
(``RabbitMQ.startup_seconds`` says how long it took): about 2.5 s of start scripts and
Erlang VM boot, 2 s of boot steps, and 3.3 to 6.3 s that the MQTT plugin waits, hard-coded,
on a node's first boot for cluster peers to appear before it elects itself leader of its
client-id tracker (mqtt_node:start/0, 11-20 times 300 ms), hence ``START_TIMEOUT`` and the
module-scoped fixture. Leaving the ``with`` block sends SIGTERM to the rabbitmq-server
script, which stops the node gracefully (about 1 s), then SIGKILLs whatever is left of its
process group, then stops the epmd.

AMQP 1.0 addressing of RabbitMQ 3.10's rabbitmq_amqp1_0 plugin, as found on this node (the
round trips of tests/peers/test_rabbitmq_peer.py rely on it; RabbitMQ 4 changed it):

    link target        a message goes to
    /queue/Q           the queue Q (declared when missing), through the default exchange
    Q (no slash)       the same (the legacy form)
    /amq/queue/Q       the queue Q, which must exist: otherwise it is dropped, yet accepted
    /queue             the default exchange, routing key = the message's subject
    /exchange/X/RK     exchange X with routing key RK
    /exchange/X        exchange X, routing key = the message's subject
    /topic/RK          amq.topic with routing key RK

    link source        messages come from
    /queue/Q, Q        the queue Q (declared when missing)
    /amq/queue/Q       the queue Q, which must exist
    /exchange/X/BK     a new queue amq.gen-... bound to exchange X with binding key BK
    /topic/BK          the same on amq.topic (``*`` and ``#`` wildcards in BK)

Quirks of 3.10: a missing exchange or queue (``/exchange/nosuch/RK``, ``/amq/queue/nosuch``
as a source) ends the whole session with amqp:not-found, not just the link; a queue the
plugin declares is durable only when the link's terminus is (durable >= 1); the amq.gen-
queues of ``/topic`` and ``/exchange`` sources are neither exclusive nor auto-delete, so
they outlive the link and keep collecting messages (``ctl("delete_queue", NAME)``); dynamic
sources are refused (the session ends with amqp:not-implemented "Dynamic sources not
supported"); source filters (selectors) and distribution-mode are ignored; detaching a link
of a ``/topic`` source gets no answer (close the connection instead); an amqp-value body
that is a list of two or more items makes the node drop the connection (framing-error);
presettled messages it has not routed yet when their connection closes are lost (a sender
should linger); a receiver whose queue holds more than its credit may get a few hundred
transfers beyond that credit (rhea prints "Received transfer when credit was 0"). Otherwise,
AMQP 1.0 to AMQP 1.0, every section and every type passes through unchanged (rhea's and
proton's typed values included). MQTT publishes go to amq.topic with the topic's ``/``
turned into ``.`` (MQTT ``bench/t`` is routing key ``bench.t``), so an AMQP 1.0 receiver on
``/topic/bench.t`` (or ``/exchange/amq.topic/bench.t``) gets them, the payload as one data
section. STOMP ``/amq/queue/Q`` is the same queue Q (STOMP's ``/queue/Q`` declares Q
durable, which clashes with the non-durable Q an AMQP 1.0 link declares).

The peers are installed by ``bash tests/peers/install.sh`` (the test command runs it first).
A missing RabbitMQ is an error, never a skip. Because a node takes seconds to start, the
``rabbitmq`` fixture is module-scoped: the tests of one module share a node (use distinct
queue names). Make it visible from the conftest.py of the test directory::

    # tests/interop/conftest.py
    from peers.rabbitmq import rabbitmq  # noqa: F401  (the fixture)

    # tests/interop/test_amqp_interop.py
    from peers.rabbitmq import RabbitMQ

    def test_something(rabbitmq: RabbitMQ) -> None:
        ...connect to rabbitmq.host, rabbitmq.amqp_port (or mqtt_port, stomp_port)...

Code that is not a test (benchmarks) uses ``with start_rabbitmq(workdir) as broker:``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from peers.mosquitto import (
    PeerFailedToStart,
    PeerMissing,
    find_command,
    free_port,
    stop_process,
    tail,
    wait_listening,
)

# Debian puts the real scripts here; /usr/sbin/rabbitmq-server is a wrapper that switches to
# the 'rabbitmq' account when run as root.
RABBITMQ_BIN_DIR = Path("/usr/lib/rabbitmq/bin")

PLUGINS = ("rabbitmq_amqp1_0", "rabbitmq_mqtt", "rabbitmq_stomp")

# A fresh node with these three plugins starts in 9-12 s on an idle 2-CPU machine (see the
# module docstring); a loaded CI machine gets ample slack.
START_TIMEOUT = 60.0
# SIGTERM makes the node close its listeners and connections and stop its applications,
# which takes about 1 s; SIGKILL after this.
STOP_GRACE = 30.0
# What the node logs once every plugin and listener is up (rabbit.erl, 3.x).
READY_LINE = "Server startup complete"

_instances = itertools.count()


def rabbitmq_command(name: str) -> str:
    """The path of a RabbitMQ script (rabbitmq-server, rabbitmqctl, ...) that runs as the
    current user, or ``PeerMissing``."""
    candidate = RABBITMQ_BIN_DIR / name
    if os.access(candidate, os.X_OK):
        return str(candidate)
    return find_command(name)  # another layout (generic-unix tarball): no wrapper there


class RabbitMQ:
    """A running private RabbitMQ node: where it listens, its processes and its files."""

    def __init__(
        self,
        host: str,
        amqp_port: int,
        mqtt_port: int,
        stomp_port: int,
        dist_port: int,
        epmd_port: int,
        nodename: str,
        proc: subprocess.Popen[bytes],
        epmd: subprocess.Popen[bytes],
        workdir: Path,
        env: dict[str, str],
    ) -> None:
        self.host = host
        self.amqp_port = amqp_port
        self.mqtt_port = mqtt_port
        self.stomp_port = stomp_port
        self.dist_port = dist_port
        self.epmd_port = epmd_port
        self.nodename = nodename
        self.proc = proc
        self.epmd = epmd
        self.workdir = workdir
        self.env = env
        self.output_path = workdir / "rabbitmq.out"
        self.log_path = workdir / "log" / f"{nodename}.log"
        self.startup_seconds = 0.0
        self.user = "guest"
        self.password = "guest"

    @property
    def pid(self) -> int:
        """The pid of the Erlang VM (beam.smp) once the node runs, else of the start script."""
        pid_file = self.workdir / "rabbitmq.pid"
        with contextlib.suppress(OSError, ValueError):
            return int(pid_file.read_text().strip())
        return self.proc.pid

    def url(self, scheme: str) -> str:
        port = {"amqp": self.amqp_port, "mqtt": self.mqtt_port, "stomp": self.stomp_port}
        return f"{scheme}://{self.host}:{port[scheme]}"

    @property
    def amqp_url(self) -> str:
        return self.url("amqp")

    @property
    def mqtt_url(self) -> str:
        return self.url("mqtt")

    @property
    def stomp_url(self) -> str:
        return self.url("stomp")

    def log_tail(self, lines: int = 20) -> str:
        """The end of the node's log file and of the start script's stdout/stderr."""
        parts = [tail(self.output_path, lines), tail(self.log_path, lines)]
        return "\n".join(p for p in parts if p)

    def ctl(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run ``rabbitmqctl -n NODE ARGS`` against this node (e.g. ``ctl("list_queues",
        "name", "messages")``); raises ``subprocess.CalledProcessError`` when it fails."""
        argv = [rabbitmq_command("rabbitmqctl"), "-n", self.nodename, *args]
        return subprocess.run(
            argv,
            env=self.env,
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
            stdin=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        """Stop the node (SIGTERM to its start script, which stops it gracefully; SIGKILL to
        what is left of its process group after ``STOP_GRACE``), then its epmd. Idempotent."""
        stop_process(self.proc, STOP_GRACE)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # beam's helpers (erl_child_setup, ...)
        stop_process(self.epmd, 5.0)

    def __repr__(self) -> str:
        return (
            f"<RabbitMQ {self.nodename} amqp={self.amqp_port} mqtt={self.mqtt_port} "
            f"stomp={self.stomp_port} pid={self.pid}>"
        )


def rabbitmq_config(
    host: str, amqp_port: int, mqtt_port: int, stomp_port: int, extra: Iterable[str] = ()
) -> str:
    """The text of a rabbitmq.conf (new-style, sysctl format) for one private node whose
    listeners are all on ``host``."""
    lines = [
        f"listeners.tcp.1 = {host}:{amqp_port}",
        f"mqtt.listeners.tcp.1 = {host}:{mqtt_port}",
        f"stomp.listeners.tcp.1 = {host}:{stomp_port}",
        "loopback_users = none",
        "default_user = guest",
        "default_pass = guest",
        # AMQP 1.0 connections without SASL, or with SASL ANONYMOUS, act as guest.
        "amqp1_0.default_user = guest",
        "amqp1_0.default_vhost = /",
        "mqtt.allow_anonymous = true",
        "mqtt.default_user = guest",
        "mqtt.default_pass = guest",
        "mqtt.vhost = /",
        "mqtt.exchange = amq.topic",
        "stomp.default_user = guest",
        "stomp.default_pass = guest",
        # A nearly full /tmp must not block publishers (the default alarm is at 50 MB free).
        "disk_free_limit.absolute = 1MB",
        "log.console = false",
        "log.file.level = info",
        *extra,
    ]
    return "\n".join(lines) + "\n"


def rabbitmq_env(
    workdir: Path, nodename: str, dist_port: int, epmd_port: int, plugins: Iterable[str]
) -> dict[str, str]:
    """The environment of the node's start script and of rabbitmqctl (rabbitmq-env(5))."""
    loopback_dist = "-kernel inet_dist_use_interface {127,0,0,1}"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RABBITMQ_", "ERL_")) and k != "HOME"
    }
    env.update(
        {
            "HOME": str(workdir / "home"),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "ERL_EPMD_PORT": str(epmd_port),
            # Every Erlang VM these scripts start, including short-lived helpers.
            "ERL_FLAGS": loopback_dist,
            "RABBITMQ_NODENAME": nodename,
            "RABBITMQ_DIST_PORT": str(dist_port),
            "RABBITMQ_CONF_ENV_FILE": str(workdir / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(workdir / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(workdir / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(workdir / "enabled_plugins"),
            "RABBITMQ_ENABLED_PLUGINS": ",".join(plugins),
            "RABBITMQ_MNESIA_BASE": str(workdir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(workdir / "log"),
            "RABBITMQ_PID_FILE": str(workdir / "rabbitmq.pid"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": f"{loopback_dist} -start_epmd false",
            "RABBITMQ_CTL_ERL_ARGS": loopback_dist,
        }
    )
    return env


def _write_files(workdir: Path, config: str, plugins: tuple[str, ...]) -> None:
    home = workdir / "home"
    home.mkdir(parents=True, exist_ok=True)
    cookie = home / ".erlang.cookie"
    if not cookie.exists():
        cookie.write_text(secrets.token_hex(16).upper())
        cookie.chmod(0o400)  # Erlang refuses a cookie file others can read
    for sub in ("mnesia", "log"):
        (workdir / sub).mkdir(exist_ok=True)
    (workdir / "rabbitmq-env.conf").write_text("# empty: /etc/rabbitmq's is not read\n")
    (workdir / "rabbitmq.conf").write_text(config)
    (workdir / "enabled_plugins").write_text(f"[{','.join(plugins)}].\n")


def _start_epmd(workdir: Path, port: int, timeout: float) -> subprocess.Popen[bytes]:
    binary = find_command("epmd")
    out = workdir / "epmd.out"
    with out.open("wb") as f:
        proc = subprocess.Popen(
            [binary, "-address", "127.0.0.1", "-port", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_listening("127.0.0.1", port, proc, timeout)
    except PeerFailedToStart as exc:
        stop_process(proc, 2.0)
        raise PeerFailedToStart(f"epmd {exc}:\n{tail(out)}") from None
    return proc


@contextlib.contextmanager
def start_rabbitmq(
    workdir: Path,
    host: str = "127.0.0.1",
    extra_config: Iterable[str] = (),
    plugins: Iterable[str] = PLUGINS,
    start_timeout: float = START_TIMEOUT,
) -> Iterator[RabbitMQ]:
    """Run a private RabbitMQ node listening on free ports of ``host`` (loopback), with all
    its files in ``workdir``; stop it (and its epmd) when the block ends.

    ``extra_config`` lines are appended to rabbitmq.conf. Raises ``PeerMissing`` when
    RabbitMQ is not installed and ``PeerFailedToStart`` (with the log's tail) when the node
    exits or does not listen within ``start_timeout`` seconds. A port taken by someone else
    between the choice and the node's bind is retried with other ports.
    """
    server = rabbitmq_command("rabbitmq-server")
    find_command("epmd")
    workdir.mkdir(parents=True, exist_ok=True)
    plugin_list = tuple(plugins)
    extra = tuple(extra_config)
    attempts = 3
    for attempt in range(attempts):
        t0 = time.monotonic()
        nodename = f"gwtest-{os.getpid()}-{next(_instances)}@localhost"
        amqp, mqtt, stomp, dist, epmd_port = (free_port(host) for _ in range(5))
        _write_files(workdir, rabbitmq_config(host, amqp, mqtt, stomp, extra), plugin_list)
        env = rabbitmq_env(workdir, nodename, dist, epmd_port, plugin_list)
        epmd = _start_epmd(workdir, epmd_port, min(start_timeout, 10.0))
        with (workdir / "rabbitmq.out").open("wb") as out:
            proc = subprocess.Popen(
                [server],
                env=env,
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        broker = RabbitMQ(
            host, amqp, mqtt, stomp, dist, epmd_port, nodename, proc, epmd, workdir, env
        )

        def started(broker: RabbitMQ = broker) -> bool:
            return READY_LINE in tail(broker.log_path, 400)

        try:
            deadline = t0 + start_timeout
            wait_listening(host, amqp, proc, start_timeout, ready=started)
            for port in (mqtt, stomp):
                wait_listening(host, port, proc, max(deadline - time.monotonic(), 0.1))
        except PeerFailedToStart as exc:
            broker.stop()
            log = broker.log_tail(30)
            if "eaddrinuse" in log and attempt + 1 < attempts:
                continue
            raise PeerFailedToStart(f"rabbitmq {exc}:\n{log}") from None
        broker.startup_seconds = time.monotonic() - t0
        break
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def rabbitmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitMQ]:
    """A private RabbitMQ node on 127.0.0.1 and free ports, shared by the tests of a module
    and stopped after them. Fails (does not skip) when RabbitMQ is not installed, naming
    tests/peers/install.sh."""
    missing = ""
    try:
        rabbitmq_command("rabbitmq-server")
        find_command("epmd")
    except PeerMissing as exc:
        missing = str(exc)
    if missing:
        pytest.fail(missing, pytrace=False)
    with start_rabbitmq(tmp_path_factory.mktemp("rabbitmq")) as broker:
        yield broker
