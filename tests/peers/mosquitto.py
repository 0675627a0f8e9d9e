"""A private mosquitto broker on loopback, for interop tests and benchmarks.

How this works: ``start_mosquitto(workdir)`` picks a free port on 127.0.0.1 (binding port 0
and reading the port back), writes a mosquitto.conf into ``workdir`` (one listener on that
address only, anonymous clients allowed, no persistence, the log in ``workdir``), starts
Debian's ``mosquitto -c CONF`` and waits until its log says it runs (every listener bound)
and the port accepts TCP connections. Leaving the
``with`` block stops it: SIGTERM, then SIGKILL after a grace period. The broker runs as the
current user (``user`` line), so root does not make it drop privileges to the ``mosquitto``
account, which could not write into pytest's private temporary directories.

The peers are installed by ``bash tests/peers/install.sh`` (the test command runs it first).
A missing binary is an error, never a skip: the ``mosquitto`` fixture fails and says what to
run. Make it visible from the conftest.py of the test directory (importing it into a test
module instead makes ruff report F811 at every test that takes it)::

    # tests/interop/conftest.py
    from peers.mosquitto import mosquitto  # noqa: F401  (the fixture)

    # tests/interop/test_mqtt_interop.py
    from peers.mosquitto import Mosquitto

    def test_something(mosquitto: Mosquitto) -> None:
        ...connect to mosquitto.host, mosquitto.port...

Code that is not a test (benchmarks) uses ``with start_mosquitto(workdir) as broker:``.

``tests/`` is on ``sys.path`` (tests/conftest.py puts it there; scripts under tests/bench/
do the same), so ``peers`` imports as a package.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest

INSTALL_HINT = "run `bash tests/peers/install.sh` (as root) to install the test peers"

# Daemons live in /usr/sbin, which is not on a normal user's PATH.
_SBIN_DIRS = ("/usr/sbin", "/usr/local/sbin", "/sbin")

# mosquitto binds and is ready within milliseconds; a loaded CI machine gets ample slack.
START_TIMEOUT = 10.0
# SIGTERM makes mosquitto close every client and exit at once; SIGKILL after this.
STOP_GRACE = 5.0


class PeerMissing(RuntimeError):
    """A peer program that tests/peers/install.sh installs is not on this machine."""


class PeerFailedToStart(RuntimeError):
    """A peer broker exited, or did not listen in time; the message holds its log's tail."""


def find_command(name: str) -> str:
    """Return the path of a peer program (looking in the sbin directories too) or raise
    ``PeerMissing`` telling how to install it."""
    found = shutil.which(name)
    if found is None:
        for d in _SBIN_DIRS:
            candidate = os.path.join(d, name)
            if os.access(candidate, os.X_OK):
                found = candidate
                break
    if found is None:
        raise PeerMissing(f"{name} is not installed: {INSTALL_HINT}")
    return found


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (the kernel's choice for port 0)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def wait_listening(host: str, port: int, proc: subprocess.Popen[bytes] | None,
                   timeout: float = START_TIMEOUT,
                   ready: Callable[[], bool] | None = None) -> None:
    """Return once ``ready()`` (when given) is true, ``host:port`` accepts a TCP connection
    and ``proc`` still runs; raise ``PeerFailedToStart`` when ``proc`` exits first or
    ``timeout`` seconds pass. ``ready`` guards against another program that holds the port:
    the connection would then succeed although our broker failed to bind."""
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise PeerFailedToStart(f"exited with status {proc.returncode}")
        if ready is None or ready():
            try:
                with socket.create_connection((host, port), timeout=0.5):
                    pass
            except OSError:
                pass
            else:
                if proc is None or proc.poll() is None:
                    return
                continue
        if time.monotonic() > deadline:
            raise PeerFailedToStart(f"not listening on {host}:{port} after {timeout:g} s")
        time.sleep(0.02)


def tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a log file ('' when it does not exist)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def stop_process(proc: subprocess.Popen[bytes], grace: float = STOP_GRACE) -> None:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL; idempotent."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Mosquitto:
    """A running private mosquitto: where it listens, its process and its files."""

    def __init__(self, host: str, port: int, proc: subprocess.Popen[bytes], workdir: Path,
                 config_path: Path, log_path: Path, output_path: Path) -> None:
        self.host = host
        self.port = port
        self.proc = proc
        self.workdir = workdir
        self.config_path = config_path
        self.log_path = log_path
        self.output_path = output_path

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"mqtt://{host}:{self.port}"

    def log_tail(self, lines: int = 20) -> str:
        """The end of mosquitto's log file and of its own stdout/stderr."""
        parts = [tail(self.output_path, lines), tail(self.log_path, lines)]
        return "\n".join(p for p in parts if p)

    def stop(self) -> None:
        stop_process(self.proc)

    def __repr__(self) -> str:
        return f"<Mosquitto {self.url} pid={self.pid}>"


def mosquitto_config(host: str, port: int, log_path: Path,
                     extra: Iterable[str] = ()) -> str:
    """The text of a mosquitto.conf for one private loopback listener (mosquitto.conf(5))."""
    lines = [
        f"listener {port} {host}",
        "allow_anonymous true",
        "persistence false",
        f"log_dest file {log_path}",
        "log_type error",
        "log_type warning",
        "log_type notice",
        "log_type information",
        "connection_messages true",
        # Run as whoever runs the tests: as root, mosquitto would otherwise switch to the
        # 'mosquitto' account and could not write its log into a private temp directory.
        f"user {pwd.getpwuid(os.getuid()).pw_name}",
        *extra,
    ]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def start_mosquitto(workdir: Path, port: int = 0, host: str = "127.0.0.1",
                    extra_config: Iterable[str] = (),
                    start_timeout: float = START_TIMEOUT) -> Iterator[Mosquitto]:
    """Run a private mosquitto on ``host`` (loopback) and ``port`` (0: a free one) with its
    config and log in ``workdir``; stop it when the block ends.

    Raises ``PeerMissing`` when mosquitto is not installed and ``PeerFailedToStart`` (with the
    log's tail) when it exits or does not listen within ``start_timeout`` seconds. With
    ``port=0`` a port taken by someone else between the choice and mosquitto's bind is
    retried with another port.
    """
    binary = find_command("mosquitto")
    workdir.mkdir(parents=True, exist_ok=True)
    extra = tuple(extra_config)
    attempts = 3 if port == 0 else 1
    for attempt in range(attempts):
        chosen = port or free_port(host)
        config_path = workdir / "mosquitto.conf"
        log_path = workdir / "mosquitto.log"
        output_path = workdir / "mosquitto.out"
        config_path.write_text(mosquitto_config(host, chosen, log_path, extra))
        with output_path.open("wb") as out:
            proc = subprocess.Popen([binary, "-c", str(config_path)], stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        broker = Mosquitto(host, chosen, proc, workdir, config_path, log_path, output_path)
        def running(log_path: Path = log_path) -> bool:
            # mosquitto logs "... running" once every listener is bound (or exits).
            return " running" in tail(log_path, 200)

        try:
            wait_listening(host, chosen, proc, start_timeout, ready=running)
        except PeerFailedToStart as exc:
            broker.stop()
            log = broker.log_tail()
            if "in use" in log and attempt + 1 < attempts:
                continue
            raise PeerFailedToStart(f"mosquitto {exc}:\n{log}") from None
        break
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Mosquitto]:
    """A private mosquitto on 127.0.0.1 and a free port, stopped after the test. Fails (does
    not skip) when mosquitto is not installed, naming tests/peers/install.sh."""
    missing = ""
    try:
        find_command("mosquitto")
    except PeerMissing as exc:
        missing = str(exc)
    if missing:
        pytest.fail(missing, pytrace=False)
    with start_mosquitto(tmp_path / "mosquitto") as broker:
        yield broker
