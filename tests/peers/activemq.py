r"""A private Apache ActiveMQ 5.17 broker (Debian's ``activemq`` package) on loopback with a
STOMP connector, for interop tests and benchmarks.

How this works: ``start_activemq(workdir)`` runs the broker's JVM directly as the current user
(never the system service, whose init script tests/peers/install.sh keeps stopped; the
package enables no instance anyway) with everything it owns inside ``workdir``::

    java -Xms64m -Xmx512m -Djava.net.preferIPv4Stack=true -Djava.awt.headless=true
         -Dactivemq.home=/usr/share/activemq -Dactivemq.base=WORK
         -Dactivemq.conf=WORK/conf -Dactivemq.data=WORK/data -Djava.io.tmpdir=WORK/tmp
         -jar /usr/share/activemq/bin/activemq.jar start xbean:file:WORK/conf/activemq.xml

not through /usr/bin/activemq, whose script reads /etc/default/activemq and
/usr/share/activemq/activemq-options (a fixed 512 MB heap, /var/lib/activemq as the base)
and switches to the ``activemq`` account when run as root. ``activemq.jar start`` stays in
the foreground: the process we start is the JVM. Its ``activemq.xml`` (written by
``activemq_config``) has

* one transport connector, ``stomp+nio://127.0.0.1:PORT`` on a free port, and an OpenWire
  one (``tcp://127.0.0.1:PORT2``) only when asked for (``openwire=True``): the broker needs
  none to run. ``-Djava.net.preferIPv4Stack=true`` makes the JVM bind a plain IPv4 socket
  (without it ``ss`` shows ``[::ffff:127.0.0.1]``, the same address on a dual-stack socket);
* ``useJmx="false"`` and no management connector, no web console (Debian's package ships no
  Jetty and the file imports none), ``schedulerSupport="false"``;
* ``persistent="false"`` (a MemoryPersistenceAdapter: nothing on disk) by default, or with
  ``persistent=True`` a KahaDB store in ``WORK/data/kahadb`` with its defaults (its journal is
  fsynced on every write batch, ``enableJournalDiskSyncs``; ``kahadb_attributes`` adds
  others): the durable path, for the benchmark's ``persistent:true`` figure;
* memory, store and temp-store limits that fit the 512 MB heap (the default 1 GB memory
  limit makes the broker warn and cut it to 70% of the heap) and a small disk;
* a unique ``brokerName`` per broker (``gwtest-<pid>-<n>``);
* with ``transformations=True`` only, ``WORK/lib`` holding links to the XStream, Jettison
  and XPP3 jars (``TRANSFORMATION_JARS``, from tests/peers/install.sh), which the launcher
  puts on the class path. Without them (Debian's package as it is, the default) the STOMP
  connector cannot transform: a SEND with ``transformation:jms-map-json`` closes the
  connection, and a subscription's ``transformation`` gets a ``transformation-error`` header.

Logging goes to ``WORK/data/activemq.log`` through the ``log4j.properties`` written into
``WORK/conf`` (Debian's ActiveMQ logs through log4j 1.2; the conf directory is on the
broker's class path), the JVM's own output to ``WORK/activemq.out``. Start-up waits until the
log says the broker "started" and the STOMP port answers a STOMP 1.2 CONNECT with CONNECTED:
1.5 to 3 s on a 2-CPU machine (``ActiveMQ.startup_seconds``), mostly the JVM and
Spring loading the XML. Leaving the ``with`` block sends SIGTERM (the broker's shutdown hook
stops it in well under a second), then SIGKILL after ``STOP_GRACE``.

STOMP on ActiveMQ 5.17, as found on this broker (tests/peers/test_activemq_peer.py checks
each): ``/queue/Q`` and ``/topic/T`` name a queue and a topic, created on first use; a SEND
without a ``persistent:true`` header makes a non-persistent message (unlike JMS, whose
default is persistent); a subscription's prefetch (how many unacknowledged messages the
broker sends) is its ``activemq.prefetchSize`` header; no login is needed (no
authentication plugin). MESSAGE frames carry the STOMP 1.2 ``ack`` header only in client and
client-individual mode, and ``persistent:true`` only on persistent messages; header values
are escaped both ways (``\c`` for a colon). A queue keeps its persistent and its
non-persistent messages in two cursors, so the order between the two kinds is not kept (each
kind stays in order). ActiveMQ's documentation adds: a SEND with a ``content-length`` header
becomes a JMS BytesMessage, without one a TextMessage; the default prefetch is 1000 for a
queue and 32766 for a topic.

Found by tests/bench/bench_stomp.py: the JIT needs 250k to 300k messages of a path before
the broker's rate stops climbing (from about 5k to 50k msgs/s on 2 CPUs); and a persistent
queue's subscription with ``activemq.prefetchSize:10000`` and ``client-individual`` ACKs
stops being dispatched to after some thousands of messages (the rest stay in the queue),
which 1000, or cumulative ``client`` ACKs, do not do.

The peers are installed by ``bash tests/peers/install.sh`` (the test command runs it first).
A missing ActiveMQ or java is an error, never a skip. The ``activemq`` fixture is
module-scoped, as RabbitMQ's is: the tests of one module share a broker (use distinct
destination names). Make it visible from the conftest.py of the test directory::

    # tests/interop/conftest.py
    from peers.activemq import activemq  # noqa: F401  (the fixture)

    def test_something(activemq: ActiveMQ) -> None:
        ...connect to activemq.host, activemq.stomp_port...

Code that is not a test (benchmarks) uses ``with start_activemq(workdir) as broker:``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import subprocess
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from xml.sax.saxutils import quoteattr

import pytest
from peers.mosquitto import (
    INSTALL_HINT,
    PeerFailedToStart,
    PeerMissing,
    find_command,
    free_port,
    stop_process,
    tail,
    wait_listening,
)

# Where Debian's package puts the broker (dpkg -L activemq, libactivemq-java).
ACTIVEMQ_HOME = Path("/usr/share/activemq")
RUN_JAR = ACTIVEMQ_HOME / "bin" / "activemq.jar"
# The jars the STOMP connector's `transformation` header (JmsFrameTranslator) needs and
# Debian's package does not bring: XStream, Jettison and the XPP3 pull parser
# (libxstream-java, libjettison-java, libxpp3-java; tests/peers/install.sh). Linked into
# WORK/lib, which the broker's launcher puts on its class path (``activemq.base``/lib).
TRANSFORMATION_JARS = tuple(
    Path("/usr/share/java") / name for name in ("xstream.jar", "jettison.jar", "xpp3.jar")
)

# The JVM's heap: enough for the benchmarks' 200k-message runs of 64 bytes (the memory limit
# below keeps the broker's own message cache well inside it).
JVM_HEAP = "512m"
# Below 70% of JVM_HEAP, else ActiveMQ warns and resets it to that.
MEMORY_LIMIT = "256 mb"
# KahaDB store and temp store (non-persistent messages spooled when the memory limit is hit);
# the default 100 GB store limit makes the broker warn when the disk has less free.
STORE_LIMIT = "2 gb"
TEMP_LIMIT = "1 gb"

# The broker starts in 2.5 to 3 s on an idle 2-CPU machine; a loaded CI machine gets slack.
START_TIMEOUT = 60.0
# SIGTERM runs the JVM's shutdown hook, which stops the broker (well under a second without
# clients; a KahaDB checkpoint may take longer); SIGKILL after this.
STOP_GRACE = 20.0
# What BrokerService logs once every connector is started: "Apache ActiveMQ 5.17.2 (NAME,
# ID:...) started".
READY_MARK = ") started"

_instances = itertools.count()


class ActiveMQ:
    """A running private ActiveMQ broker: where it listens, its process and its files."""

    def __init__(
        self,
        host: str,
        stomp_port: int,
        openwire_port: int | None,
        broker_name: str,
        persistent: bool,
        proc: subprocess.Popen[bytes],
        workdir: Path,
    ) -> None:
        self.host = host
        self.stomp_port = stomp_port
        self.openwire_port = openwire_port
        self.broker_name = broker_name
        self.persistent = persistent
        self.proc = proc
        self.workdir = workdir
        self.config_path = workdir / "conf" / "activemq.xml"
        self.log_path = workdir / "data" / "activemq.log"
        self.output_path = workdir / "activemq.out"
        self.startup_seconds = 0.0

    @property
    def pid(self) -> int:
        """The JVM's pid (``activemq.jar start`` runs the broker in the foreground)."""
        return self.proc.pid

    @property
    def stomp_url(self) -> str:
        return f"stomp://{self.host}:{self.stomp_port}"

    def log_tail(self, lines: int = 20) -> str:
        """The end of the JVM's stdout/stderr and of the broker's log file."""
        parts = [tail(self.output_path, lines), tail(self.log_path, lines)]
        return "\n".join(p for p in parts if p)

    def stop(self) -> None:
        """SIGTERM (the broker's shutdown hook stops it), SIGKILL after ``STOP_GRACE``;
        idempotent."""
        stop_process(self.proc, STOP_GRACE)

    def __repr__(self) -> str:
        return f"<ActiveMQ {self.broker_name} stomp={self.stomp_port} pid={self.pid}>"


def activemq_config(
    workdir: Path,
    broker_name: str,
    host: str,
    stomp_port: int,
    openwire_port: int | None = None,
    persistent: bool = False,
    stomp_options: str = "",
    kahadb_attributes: str = "",
) -> str:
    """The text of an activemq.xml (Spring XML, the broker's XBean schema) for one private
    broker whose connectors are all on ``host``. ``stomp_options`` is appended to the STOMP
    connector's URI as its query (e.g. ``transport.hbGracePeriodMultiplier=2``)."""
    data = workdir / "data"
    stomp_uri = f"stomp+nio://{host}:{stomp_port}"
    if stomp_options:
        stomp_uri += "?" + stomp_options
    connectors = [f'<transportConnector name="stomp" uri={quoteattr(stomp_uri)}/>']
    if openwire_port is not None:
        openwire_uri = f"tcp://{host}:{openwire_port}"
        connectors.append(f'<transportConnector name="openwire" uri={quoteattr(openwire_uri)}/>')
    connector_lines = "\n      ".join(connectors)
    store = ""
    if persistent:
        kahadb = quoteattr(str(data / "kahadb"))
        store = (
            f"<persistenceAdapter><kahaDB directory={kahadb} {kahadb_attributes}/>"
            "</persistenceAdapter>"
        )
    return f"""<beans xmlns="http://www.springframework.org/schema/beans"
       xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
       xsi:schemaLocation="http://www.springframework.org/schema/beans
         http://www.springframework.org/schema/beans/spring-beans.xsd
         http://activemq.apache.org/schema/core
         http://activemq.apache.org/schema/core/activemq-core.xsd">
  <!-- Written by tests/peers/activemq.py: a private broker, loopback only. -->
  <broker xmlns="http://activemq.apache.org/schema/core"
          brokerName={quoteattr(broker_name)}
          persistent="{str(persistent).lower()}"
          useJmx="false"
          schedulerSupport="false"
          dataDirectory={quoteattr(str(data))}
          tmpDataDirectory={quoteattr(str(data / "tmp"))}>
    <managementContext><managementContext createConnector="false"/></managementContext>
    {store}
    <systemUsage>
      <systemUsage>
        <memoryUsage><memoryUsage limit="{MEMORY_LIMIT}"/></memoryUsage>
        <storeUsage><storeUsage limit="{STORE_LIMIT}"/></storeUsage>
        <tempUsage><tempUsage limit="{TEMP_LIMIT}"/></tempUsage>
      </systemUsage>
    </systemUsage>
    <transportConnectors>
      {connector_lines}
    </transportConnectors>
  </broker>
</beans>
"""


def log4j_config(log_path: Path) -> str:
    """A log4j 1.2 configuration (Debian's ActiveMQ logs through slf4j-log4j12) that writes
    INFO and above to ``log_path``, Spring's and XBean's chatter from WARN."""
    return "\n".join(
        [
            "log4j.rootLogger=INFO, logfile",
            "log4j.logger.org.springframework=WARN",
            "log4j.logger.org.apache.xbean=WARN",
            "log4j.appender.logfile=org.apache.log4j.FileAppender",
            f"log4j.appender.logfile.file={log_path}",
            "log4j.appender.logfile.append=true",
            "log4j.appender.logfile.layout=org.apache.log4j.PatternLayout",
            "log4j.appender.logfile.layout.ConversionPattern=%d | %-5p | %m | %c | %t%n",
        ]
    ) + "\n"


def activemq_argv(workdir: Path, jvm_options: Iterable[str] = ()) -> list[str]:
    """The command line that runs the broker of ``workdir/conf/activemq.xml`` in the
    foreground; ``PeerMissing`` when java or ActiveMQ is not installed."""
    java = find_command("java")
    if not RUN_JAR.exists():
        raise PeerMissing(f"ActiveMQ is not installed ({RUN_JAR} is missing): {INSTALL_HINT}")
    conf = workdir / "conf"
    return [
        java,
        "-Xms64m",
        f"-Xmx{JVM_HEAP}",
        "-Djava.net.preferIPv4Stack=true",
        "-Djava.awt.headless=true",
        f"-Dactivemq.home={ACTIVEMQ_HOME}",
        f"-Dactivemq.base={workdir}",
        f"-Dactivemq.conf={conf}",
        f"-Dactivemq.data={workdir / 'data'}",
        f"-Djava.io.tmpdir={workdir / 'tmp'}",
        *jvm_options,
        "-jar",
        str(RUN_JAR),
        "start",
        f"xbean:file:{conf / 'activemq.xml'}",
    ]


def stomp_ping(host: str, port: int, timeout: float = 5.0, vhost: str = "127.0.0.1") -> str | None:
    """None when ``host:port`` answers a STOMP 1.2 CONNECT (``host`` header ``vhost``, no
    login) with CONNECTED, else why not. Disconnects with a receipt, so the broker has
    finished with the connection when this returns."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(
                b"CONNECT\naccept-version:1.2\nhost:%s\nheart-beat:0,0\n\n\x00" % vhost.encode()
            )
            frame = _read_frame(s)
            if not frame.startswith(b"CONNECTED\n"):
                return f"no CONNECTED on {host}:{port}: {frame[:300]!r}"
            s.sendall(b"DISCONNECT\nreceipt:ping\n\n\x00")
            _read_frame(s)
    except OSError as exc:  # TimeoutError is an OSError
        return f"no CONNECTED on {host}:{port}: {exc!r}"
    return None


def _read_frame(s: socket.socket) -> bytes:
    """The next frame up to its NUL (heart-beat EOLs before it skipped), enough for
    CONNECTED, RECEIPT and ERROR, whose bodies hold no NUL."""
    data = b""
    while b"\x00" not in data:
        chunk = s.recv(4096)
        if not chunk:
            raise ConnectionError(f"closed after {data[:300]!r}")
        data += chunk
    return data.lstrip(b"\r\n").split(b"\x00", 1)[0]


def listening_sockets(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state that process ``pid`` holds, from
    /proc/PID/fd and /proc/net/tcp{,6} (as tests/peers/test_rabbitmq_peer.py reads them)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = set()
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: TCP_LISTEN
                continue
            addr_hex, port_hex = local.split(":")
            raw = bytes.fromhex(addr_hex)
            # /proc prints each 32-bit word of the address in host (little-endian) order.
            words = b"".join(raw[i : i + 4][::-1] for i in range(0, width, 4))
            family = socket.AF_INET if width == 4 else socket.AF_INET6
            found.add((socket.inet_ntop(family, words), int(port_hex, 16)))
    return found


@contextlib.contextmanager
def start_activemq(
    workdir: Path,
    host: str = "127.0.0.1",
    persistent: bool = False,
    openwire: bool = False,
    stomp_options: str = "",
    kahadb_attributes: str = "",
    jvm_options: Iterable[str] = (),
    start_timeout: float = START_TIMEOUT,
    transformations: bool = False,
) -> Iterator[ActiveMQ]:
    """Run a private ActiveMQ broker with a STOMP connector on a free port of ``host``
    (loopback) and all its files in ``workdir``; stop it when the block ends.

    ``persistent`` chooses a KahaDB store in ``workdir`` over memory only; ``openwire`` adds
    an OpenWire connector on another free port (``ActiveMQ.openwire_port``);
    ``transformations`` puts the jars of the STOMP ``transformation`` header on the class
    path (``PeerMissing`` when they are not installed). Raises
    ``PeerMissing`` when ActiveMQ or java is not installed and ``PeerFailedToStart`` (with the
    log's tail) when the broker exits, does not listen or does not answer a STOMP CONNECT
    within ``start_timeout`` seconds. A port taken by someone else between the choice and the
    broker's bind is retried with other ports.
    """
    argv = activemq_argv(workdir, jvm_options)
    for sub in ("conf", "data", "tmp", "lib"):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    for jar in TRANSFORMATION_JARS if transformations else ():
        if not jar.exists():
            raise PeerMissing(f"{jar} is missing (ActiveMQ's STOMP transformations need it): "
                              f"{INSTALL_HINT}")
        link = workdir / "lib" / jar.name
        if not link.exists():
            link.symlink_to(jar)
    attempts = 3
    for attempt in range(attempts):
        t0 = time.monotonic()
        broker_name = f"gwtest-{os.getpid()}-{next(_instances)}"
        stomp_port = free_port(host)
        openwire_port = free_port(host) if openwire else None
        (workdir / "conf" / "activemq.xml").write_text(
            activemq_config(
                workdir,
                broker_name,
                host,
                stomp_port,
                openwire_port,
                persistent,
                stomp_options,
                kahadb_attributes,
            )
        )
        (workdir / "conf" / "log4j.properties").write_text(
            log4j_config(workdir / "data" / "activemq.log")
        )
        with (workdir / "activemq.out").open("wb") as out:
            proc = subprocess.Popen(
                argv,
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        broker = ActiveMQ(host, stomp_port, openwire_port, broker_name, persistent, proc, workdir)

        def started(broker: ActiveMQ = broker) -> bool:
            # This broker's own line: the log file is appended to across attempts.
            mark = f"({broker.broker_name}, ID:"
            return any(
                mark in line and READY_MARK in line
                for line in tail(broker.log_path, 400).splitlines()
            )

        try:
            deadline = t0 + start_timeout
            wait_listening(host, stomp_port, proc, start_timeout, ready=started)
            if openwire_port is not None:
                wait_listening(host, openwire_port, proc, max(deadline - time.monotonic(), 0.1))
            problem = stomp_ping(host, stomp_port, max(deadline - time.monotonic(), 1.0))
            if problem is not None:
                raise PeerFailedToStart(problem)
        except PeerFailedToStart as exc:
            broker.stop()
            log = broker.log_tail(30)
            if "Address already in use" in log and attempt + 1 < attempts:
                continue
            raise PeerFailedToStart(f"activemq {exc}:\n{log}") from None
        broker.startup_seconds = time.monotonic() - t0
        break
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def activemq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ActiveMQ]:
    """A private ActiveMQ broker (STOMP, memory only) on 127.0.0.1 and a free port, shared by
    the tests of a module and stopped after them. Fails (does not skip) when ActiveMQ is not
    installed, naming tests/peers/install.sh."""
    missing = ""
    try:
        activemq_argv(Path("."))
    except PeerMissing as exc:
        missing = str(exc)
    if missing:
        pytest.fail(missing, pytrace=False)
    with start_activemq(tmp_path_factory.mktemp("activemq")) as broker:
        yield broker
