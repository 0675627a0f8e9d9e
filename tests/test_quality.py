"""The checks CI runs on the code itself: lint, strict typing, and the import layering."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def run(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    exe = BIN / tool
    if not exe.exists():
        found = shutil.which(tool)
        if found is None:
            pytest.fail(f"{tool} is not installed (pip install -e '.[dev]')")
        exe = Path(found)
    return subprocess.run([str(exe), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def test_ruff_lint_is_clean():
    r = run("ruff", "check", "gateway", "adapters", "mappings", "transports", "spark", "tests")
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_strict_is_clean_on_the_packages():
    r = run("mypy")  # packages listed in pyproject.toml
    assert r.returncode == 0, r.stdout + r.stderr


def test_import_layering_contracts_are_kept():
    r = run("lint-imports")
    assert r.returncode == 0, r.stdout + r.stderr


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [line.strip() for line in ci.splitlines()
                if line.strip() and not line.lstrip().startswith("#")
                and not line.startswith(("set ", "cd "))]
    assert commands, "no command in .ci/run"
    assert commands[-1] in readme, ".ci/run must run the README's test command"
