"""A copy of the project tree with the modules of ``setup.py``'s COMPILED list built by mypyc
in place, for the compiled suites (tests/test_compiled.py) and benchmarks::

    .venv/bin/python tests/compiled_tree.py /tmp/gw-compiled
    cd /tmp/gw-compiled && /path/to/.venv/bin/python tests/bench/bench_core.py

The copy leaves out what is not source (.git, .venv, caches, node_modules, stores). Run from
inside the copy, the benchmarks and ``python -m gateway`` import its compiled modules: a
compiled module next to its source is imported instead of it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_SKIP_ANYWHERE = shutil.ignore_patterns(".git", ".venv", ".bench-venv", "build", "__pycache__",
                                       "*.so", "*.egg-info", ".*_cache", "node_modules")


def SKIP(directory: str, names: list[str]) -> set[str]:
    """What the copy leaves out: the patterns above anywhere, and the store of a gateway run
    from the top of the tree (``./data``, the embedded default's); test data stays."""
    skipped = set(_SKIP_ANYWHERE(directory, names))
    if Path(directory) == ROOT and "data" in names:
        skipped.add("data")
    return skipped


class BuildFailed(Exception):
    pass


def build(dest: Path) -> list[str]:
    """Copy the tree to ``dest`` (which must not exist) and compile it there; returns the
    compiled modules' files, each checked to import as an extension module."""
    shutil.copytree(ROOT, dest, ignore=SKIP)
    env = {**os.environ, "GATEWAY_COMPILE": "1", "PYTHONPATH": str(dest)}
    r = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=dest,
                       env=env, capture_output=True, text=True, check=False)  # fmt: skip
    if r.returncode != 0:
        raise BuildFailed((r.stdout[-3000:] + "\n" + r.stderr[-3000:]).strip())
    check = ("import importlib, setup\n"
             "for path in setup.COMPILED:\n"
             "    print(importlib.import_module(path[:-3].replace('/', '.')).__file__)\n")  # fmt: skip
    r = subprocess.run([sys.executable, "-c", check], cwd=dest, env=env, capture_output=True,
                       text=True, check=False)  # fmt: skip
    files = r.stdout.split()
    if r.returncode != 0 or not files or any(f.endswith(".py") for f in files):
        raise BuildFailed(f"not every compiled module imports compiled: {files} {r.stderr}")
    return files


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    files = build(Path(sys.argv[1]))
    print(f"{len(files)} compiled modules in {sys.argv[1]}")


if __name__ == "__main__":
    main()
