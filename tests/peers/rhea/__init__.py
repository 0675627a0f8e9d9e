"""rhea, an independent AMQP 1.0 client (npm), driven from Python for interop tests and
benchmarks.

How this works: the scripts next to this file (send.js, receive.js, request.js; their
headers and common.js document every spec key and output line) take one JSON spec on the
command line and print one JSON object per line. ``run_rhea("send", spec)`` runs one to the
end and returns its parsed lines; ``start_rhea`` starts one in the background (a receiver
that must be attached before something is sent); ``untyped`` turns receive.js's typed values
(``{"type": "ubyte", "value": 5}``) into plain Python values when the types do not matter.
rhea itself is installed into ``node_modules/`` here, at the version package-lock.json pins,
by ``bash tests/peers/install.sh`` (``npm ci``); a missing node or rhea raises
``PeerMissing``, never a skip::

    from peers.rhea import run_rhea, untyped

    sent = run_rhea("send", {"port": port, "address": "queue://q",
                             "messages": [{"body": "hi"}]})
    assert sent.outcomes() == ["accepted"]
    got = run_rhea("receive", {"port": port, "address": "queue://q", "count": 1})
    assert untyped(got.messages()[0]["body"]["value"]) == "hi"
"""

from __future__ import annotations

import base64
import json
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peers.mosquitto import INSTALL_HINT, PeerMissing, find_command

RHEA_DIR = Path(__file__).resolve().parent
SCRIPTS = ("send", "receive", "request")


def rhea_argv(script: str, spec: dict[str, Any]) -> list[str]:
    """The command that runs ``script`` (send, receive or request) with ``spec``; raises
    ``PeerMissing`` when node or rhea is not installed."""
    if script not in SCRIPTS:
        raise ValueError(f"unknown rhea script {script!r}; one of {', '.join(SCRIPTS)}")
    node = find_command("node")
    if not (RHEA_DIR / "node_modules" / "rhea" / "package.json").exists():
        raise PeerMissing(f"rhea is not installed in {RHEA_DIR / 'node_modules'}: {INSTALL_HINT}")
    return [node, str(RHEA_DIR / f"{script}.js"), json.dumps(spec)]


@dataclass
class RheaRun:
    """What a finished script printed: its JSON lines, exit status and stderr."""

    events: list[dict[str, Any]]
    returncode: int
    stderr: str

    def of(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == event]

    def messages(self) -> list[dict[str, Any]]:
        """The "message" objects (sections with typed values) of receive.js/request.js."""
        return [e["message"] for e in self.of("message")]

    def outcomes(self) -> list[str]:
        """The state of each "outcome" line (send.js, request.js), in order."""
        return [e["state"] for e in self.of("outcome")]

    def done(self) -> dict[str, Any]:
        found = self.of("done")
        if not found:
            raise AssertionError(f"no 'done' line: {self}")
        return found[-1]

    def __str__(self) -> str:
        lines = "\n".join(json.dumps(e) for e in self.events[-20:])
        return f"exit status {self.returncode}; last lines:\n{lines}\nstderr: {self.stderr[-2000:]}"


def parse_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects of a script's stdout, one per line."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def run_rhea(script: str, spec: dict[str, Any], timeout: float = 60.0) -> RheaRun:
    """Run a rhea script to its end. ``spec["timeout"]`` (default 30 s) is the script's own
    limit; ``timeout`` is this call's, a little above it."""
    done = subprocess.run(
        rhea_argv(script, spec),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=RHEA_DIR,
    )
    return RheaRun(parse_lines(done.stdout), done.returncode, done.stderr)


def start_rhea(script: str, spec: dict[str, Any]) -> subprocess.Popen[str]:
    """Start a rhea script in the background, its stdout a text pipe of JSON lines (read the
    "attached" line before sending to it); ``finish_rhea`` collects the rest."""
    return subprocess.Popen(
        rhea_argv(script, spec),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=RHEA_DIR,
    )


def read_event(proc: subprocess.Popen[str], event: str) -> dict[str, Any]:
    """Read lines of a started script until one has ``event`` (e.g. "attached"); raise
    ``AssertionError`` with its output when it ends first or reports an error."""
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        if not line.strip():
            continue
        obj: dict[str, Any] = json.loads(line)
        seen.append(obj)
        if obj.get("event") == event:
            return obj
        if obj.get("event") == "error":
            break
    err = proc.stderr.read() if proc.stderr else ""
    raise AssertionError(f"no {event!r} line; got {seen} (exit {proc.wait()}, stderr {err!r})")


def finish_rhea(proc: subprocess.Popen[str], timeout: float = 60.0) -> RheaRun:
    """Wait for a started script (its own ``timeout`` ends it) and return the lines it
    printed since the last ``read_event``. (Not ``communicate()``: it reads the pipes' file
    descriptors and would lose what ``read_event`` left in the text buffer.)"""
    assert proc.stdout is not None and proc.stderr is not None
    out = proc.stdout.read()
    err = proc.stderr.read()
    proc.wait(timeout)
    proc.stdout.close()
    proc.stderr.close()
    return RheaRun(parse_lines(out), proc.returncode, err)


def typed(type_: str, value: Any, **extra: Any) -> dict[str, Any]:
    """A typed value for a spec: ``typed("ubyte", 5)``, ``typed("array", [1, 2],
    element_type="int")``, ``typed("described", "v", descriptor=typed("ulong", 7))``.
    Integers beyond 2^53 become decimal strings, which JavaScript's JSON.parse keeps exact."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**53:
        value = str(value)
    return {"type": type_, "value": value, **extra}


def untyped(desc: Any) -> Any:
    """A plain Python value from a typed one: integers, floats (NaN and the infinities
    included), str for string, symbol and char, bytes for binary, uuid.UUID, int
    milliseconds for timestamp, bytes for the decimals, list for list and array, dict for
    map (a list of pairs when a key is not hashable), and (descriptor, value) for described."""
    if not isinstance(desc, dict) or "type" not in desc:
        raise ValueError(f"not a typed value: {desc!r}")
    t: str = desc["type"]
    v: Any = desc["value"]
    if t in ("float", "double") and isinstance(v, str):
        return float(v)
    if t == "binary":
        return base64.b64decode(v)
    if t == "uuid":
        return uuid.UUID(v)
    if t.startswith("decimal"):
        return bytes.fromhex(v)
    if t in ("list", "array"):
        return [untyped(x) for x in v]
    if t == "map":
        pairs = [(untyped(k), untyped(x)) for k, x in v]
        try:
            return dict(pairs)
        except TypeError:
            return pairs
    if t == "described":
        return (untyped(desc["descriptor"]), untyped(v))
    return v
