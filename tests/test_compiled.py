"""The compiled build (``setup.py``, README "The compiled build"): the unit and MQTT
conformance suites, and the MQTT interop tests (paho clients, the mqtt transport against
mosquitto), again on a copy of the tree whose hot modules mypyc compiled."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import compiled_tree
import pytest

# Every compiled module is in one of these (setup.py's COMPILED).
SUITES = ["tests/unit", "tests/conformance", "tests/interop/test_mqtt_paho.py",
          "tests/interop/test_mqtt_crossproto.py", "tests/interop/test_transport_mqtt.py"]


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_the_suites_pass_on_the_compiled_build(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    files = compiled_tree.build(tree)
    assert len(files) >= 7
    env = {**os.environ, "PYTHONPATH": str(tree)}
    # The suites in worker processes (pytest-xdist), one a CPU up to 4: this run waits for
    # nothing else, and the suites' tests are independent (free ports, their own temporary
    # directories and gateways).
    workers = str(min(4, os.cpu_count() or 1))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-n", workers, *SUITES], cwd=tree, env=env,
                       capture_output=True, text=True, check=False)  # fmt: skip
    out = (r.stdout[-4000:] + "\n" + r.stderr[-4000:]).strip()
    assert r.returncode == 0, out
    assert " passed" in r.stdout and " failed" not in r.stdout, out
