"""The compiled build: ``GATEWAY_COMPILE=1`` compiles the hot modules with mypyc.

The gateway is pure Python, and that is what ``pip install -e .`` installs and the test
suite runs. mypyc (part of mypy) compiles type-annotated Python modules to C extensions
without rewriting them: the per-message path through the core and the MQTT adapter runs
faster compiled (README "The compiled build" has the figures). The modules are the same
source; tests/test_compiled.py runs the unit, conformance and MQTT interop suites again on a
compiled copy of the tree, and gateway/README.md lists what compiled code must keep to.

    GATEWAY_COMPILE=1 .venv/bin/pip install --no-build-isolation .      # needs mypy (dev)
    GATEWAY_COMPILE=1 .venv/bin/python setup.py build_ext --inplace      # a copy of the tree

Not for an editable install: a compiled module next to its source is imported instead of
it, so an edit of the source would be silently ignored (this file refuses).
"""

from __future__ import annotations

import os
import sys

from setuptools import setup

# The per-message path: what one publish, delivery and acknowledgement runs through.
COMPILED = [
    "gateway/message.py",
    "gateway/broker.py",
    "gateway/endpoint.py",
    "gateway/client.py",
    "gateway/dlog.py",
    "gateway/serial.py",
    "gateway/subindex.py",
    "gateway/store/sqlite.py",
    "adapters/mqtt/codec.py",
    "adapters/mqtt/connection.py",
    "adapters/mqtt/encoding.py",
    "adapters/mqtt/properties.py",
    "adapters/mqtt/session.py",
    "adapters/mqtt/topics.py",
    "mappings/mqtt.py",
    "mappings/typedtext.py",
]


def _ext_modules() -> list[object]:
    if os.environ.get("GATEWAY_COMPILE") != "1":
        return []
    if any(arg.startswith("editable") or arg == "develop" for arg in sys.argv[1:]):
        sys.exit("GATEWAY_COMPILE=1: not for an editable install (a compiled module would "
                 "hide later edits of its source); use 'pip install --no-build-isolation .' "
                 "or 'setup.py build_ext --inplace' on a copy of the tree")
    try:
        from mypyc.build import mypycify
    except ImportError:
        sys.exit("GATEWAY_COMPILE=1 needs mypy installed where the build runs "
                 "(pip install --no-build-isolation, in a venv with '.[dev]')")
    return list(mypycify(COMPILED, opt_level="3"))


if __name__ == "__main__":  # setuptools runs this file as __main__; compiled_tree imports COMPILED
    setup(ext_modules=_ext_modules())
