"""The compiled build: ``pip install .`` compiles the hot modules with mypyc.

mypyc (part of mypy) compiles type-annotated Python modules to C extensions without
rewriting them: the per-message path through the core and the MQTT adapter runs faster
compiled (README "The compiled build" has the figures). The modules are the same source;
tests/test_compiled.py runs the unit, conformance and MQTT interop suites again on a compiled
copy of the tree, and gateway/README.md lists what compiled code must keep to.

What each install builds (``GATEWAY_COMPILE`` in the environment decides, unset by default)::

    .venv/bin/pip install .                           # compiled; pure with one warning if not
    GATEWAY_COMPILE=0 .venv/bin/pip install .         # pure Python, no compile
    GATEWAY_COMPILE=1 .venv/bin/pip install .         # compiled, or the install fails
    .venv/bin/pip install -e .                        # pure Python (development, tests)
    GATEWAY_COMPILE=1 .venv/bin/python setup.py build_ext --inplace   # a copy of the tree

pip builds in an isolated environment holding only ``[build-system] requires`` (setuptools
and mypy), not the gateway's dependencies, so mypy runs with ``MYPY_FLAGS``: it reads no
installed package (``--no-site-packages``; the standard library and mypy_extensions come with
mypy) and reports errors only in the compiled modules (``--follow-imports=silent``; a module
they import that uses aiohttp or yaml sees it as ``Any``). The compile therefore sees the
same types wherever it runs, the dev venv's ``compiled_tree`` and pip's isolated build alike.

When the compile cannot be done (no C compiler, no Python headers, a compiler or mypyc
error), the default install goes on pure and says so in one line on stderr, which pip shows
with ``-v`` (``gateway --version`` says which build is installed). An editable install stays
pure without a word: a compiled module next to its source is imported instead of it, so an
edit of the source would be silently ignored (``GATEWAY_COMPILE=1`` with ``-e`` is refused).
"""

from __future__ import annotations

import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

# The per-message path: what one publish, delivery and acknowledgement runs through.
COMPILED = [
    "gateway/message.py",
    "gateway/broker.py",
    "gateway/memory.py",
    "gateway/routing.py",
    "gateway/endpoint.py",
    "gateway/backlog.py",
    "gateway/consumer.py",
    "gateway/client.py",
    "gateway/dlog.py",
    "gateway/dlog_files.py",
    "gateway/dlog_format.py",
    "gateway/serial.py",
    "gateway/subindex.py",
    "gateway/store/sqlite.py",
    "gateway/store/sqlite_batch.py",
    "adapters/mqtt/codec.py",
    "adapters/mqtt/connection.py",
    "adapters/mqtt/encoding.py",
    "adapters/mqtt/overlap.py",
    "adapters/mqtt/properties.py",
    "adapters/mqtt/session.py",
    "adapters/mqtt/server.py",
    "adapters/mqtt/topics.py",
    "mappings/mqtt.py",
    "mappings/typedtext.py",
    "transports/mqtt_session.py",
]


# mypy as mypyc runs it: the same types whatever is installed where the build runs (above).
MYPY_FLAGS = ["--no-site-packages", "--follow-imports=silent"]

# The commands that build extension modules; metadata (egg_info, dist_info) and sdist do not.
_BUILDS = {"build", "build_ext", "bdist_wheel", "bdist", "install"}
_EDITABLE = {"editable_wheel", "develop"}

HOW_TO_COMPILE = ("for the compiled build install gcc and the Python headers (Debian: "
                  "apt-get install gcc python3-dev) and reinstall; GATEWAY_COMPILE=0 skips "
                  "the compile")


def _fall_back(why: str) -> None:
    """The one line a default install that could not compile writes (pip shows it with -v)."""
    print(f"WARNING: gateway installs pure Python, not compiled ({why}); {HOW_TO_COMPILE}",
          file=sys.stderr, flush=True)


def _ext_modules(mode: str, commands: set[str]) -> list[object]:
    """The compiled modules for ``mode`` ("" by default, "0" or "1": GATEWAY_COMPILE)."""
    if commands & _EDITABLE:
        if mode == "1":
            sys.exit("GATEWAY_COMPILE=1: not for an editable install (a compiled module would "
                     "hide later edits of its source); use 'pip install .' or "
                     "'setup.py build_ext --inplace' on a copy of the tree")
        return []
    if mode == "0" or not commands & _BUILDS:
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        if mode == "1":
            sys.exit("GATEWAY_COMPILE=1 needs mypy where the build runs (pip install . "
                     "brings it; setup.py run by hand needs it installed)")
        _fall_back("mypy is not installed where the build runs")
        return []
    try:
        return list(mypycify([*MYPY_FLAGS, *COMPILED], opt_level="3"))
    except SystemExit as e:  # mypyc prints mypy's errors, then exits
        if mode == "1":
            raise
        _fall_back("mypyc stopped" + (f": {e.code}" if isinstance(e.code, str) else ""))
        return []


class BuildExt(build_ext):
    """build_ext that, for a default install, leaves the compiled modules out when the C
    compiler fails or is missing rather than failing the install."""

    fallback = True

    def run(self) -> None:
        if not self.fallback:
            super().run()
            return
        try:
            super().run()
        except Exception as e:  # CompileError, LinkError, a missing compiler: any of them
            for ext in self.extensions:  # what was built before the failure would not import
                built = self.get_ext_fullpath(ext.name)
                if os.path.exists(built):
                    os.remove(built)
            self.extensions = []
            self.distribution.ext_modules = []
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            _fall_back(f"the C build failed: {why}")


def main() -> None:
    mode = os.environ.get("GATEWAY_COMPILE", "")
    if mode not in ("", "0", "1"):
        sys.exit(f"GATEWAY_COMPILE={mode!r}: 0 (pure Python), 1 (compiled or fail) or unset")
    BuildExt.fallback = mode != "1"
    setup(ext_modules=_ext_modules(mode, set(sys.argv[1:])), cmdclass={"build_ext": BuildExt})


if __name__ == "__main__":  # setuptools runs this file as __main__; compiled_tree imports COMPILED
    main()
