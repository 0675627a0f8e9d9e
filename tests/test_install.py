"""The README's run command as a new user runs it: its install part (``python3 -m venv .venv``
and ``.venv/bin/pip install .``, read from README "The two commands") in a fresh venv made
from a copy of the tree, with pip's build isolation and its default index.

It installs the compiled build (setup.py, README "The compiled build"): the modules of
setup.py's COMPILED list import as extension modules. With a C compiler that fails, the same
command installs pure Python and the build says why in one warning line. The two installs
use pip's own cache, as a user's installs do: the dependencies the test command's install
downloaded (and python-qpid-proton, which pip builds from source) are taken from it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

import compiled_tree
import pytest

ROOT = Path(__file__).resolve().parent.parent
WARNING = "WARNING: gateway installs pure Python, not compiled"


def compiled_modules() -> list[str]:
    spec = importlib.util.spec_from_file_location("gateway_setup", ROOT / "setup.py")
    assert spec is not None and spec.loader is not None
    setup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup)  # setup() runs only as __main__
    return [path[:-3].replace("/", ".") for path in setup.COMPILED]


def readme_setup_steps() -> list[str]:
    """The run command of README "The two commands" (its first sh block) without the last
    step, which runs the gateway."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## The two commands", 1)[1]
    block = re.search(r"```sh\n(.*?)\n```", section, re.S)
    assert block is not None, "no sh block in README 'The two commands'"
    steps = [s.strip() for s in block.group(1).replace("\\\n", " ").split("&&")]
    assert steps[-1] == ".venv/bin/gateway serve", steps
    return steps[:-1]


def install(tmp_path: Path, steps: list[str] | None = None,
            **env: str) -> tuple[Path, str]:
    """Runs the README's setup steps (or ``steps``) in a copy of the tree; returns the venv
    and the output (pip at -v, so the build's own lines are in it)."""
    tree = tmp_path / "tree"
    shutil.copytree(ROOT, tree, ignore=compiled_tree.SKIP)
    run_env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PIP_NO_CACHE", "GATEWAY_", "VIRTUAL_ENV"))}
    run_env.update(PIP_VERBOSE="1", **env)
    r = subprocess.run(" && ".join(steps or readme_setup_steps()), shell=True, cwd=tree, env=run_env,
                       capture_output=True, text=True, timeout=1500, check=False)  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    return tree / ".venv", out


def imported_files(venv: Path, cwd: Path) -> dict[str, str]:
    """Where each compiled-list module is imported from in the venv (run outside the tree,
    whose sources would come first on sys.path)."""
    code = ("import importlib, sys\n"
            "for name in sys.argv[1:]:\n"
            "    print(name, importlib.import_module(name).__file__)\n")  # fmt: skip
    r = subprocess.run([str(venv / "bin" / "python"), "-c", code, *compiled_modules()],
                       cwd=cwd, capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return dict(line.split(" ", 1) for line in r.stdout.splitlines())


def gateway_command(venv: Path, cwd: Path, *args: str) -> str:
    r = subprocess.run([str(venv / "bin" / "gateway"), *args], cwd=cwd, capture_output=True,
                       text=True, timeout=120, check=False)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@pytest.fixture(scope="session")
def compiled_install(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The README's install as it is; run first by both tests, so that the second finds the
    dependencies in pip's cache (python-qpid-proton built already, not by a failing CC)."""
    return install(tmp_path_factory.mktemp("compiled"))


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_readme_run_command_installs_the_compiled_build(
        tmp_path: Path, compiled_install: tuple[Path, str]) -> None:
    venv, out = compiled_install
    files = imported_files(venv, tmp_path)
    assert sorted(files) == sorted(compiled_modules())
    site = str(venv / "lib")
    assert all(f.startswith(site) and f.endswith(".so") for f in files.values()), files
    assert WARNING not in out and "__mypyc" in out  # pip at -v shows the compile
    assert gateway_command(venv, tmp_path, "--version").strip().endswith("(compiled)")
    assert "serve" in gateway_command(venv, tmp_path, "--help")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_failing_compiler_installs_pure_python_with_one_warning(
        tmp_path: Path, compiled_install: tuple[Path, str]) -> None:
    venv, out = install(tmp_path, CC="false")  # the C compiler fails
    warnings = [line for line in out.splitlines() if WARNING in line]
    assert len(warnings) == 1, out[-6000:]
    assert "the C build failed" in warnings[0] and "GATEWAY_COMPILE=0" in warnings[0]
    files = imported_files(venv, tmp_path)
    assert all(f.endswith(".py") for f in files.values()), files
    assert not list((venv / "lib").rglob("*__mypyc*")), "a compiled part was installed"
    assert gateway_command(venv, tmp_path, "--version").strip().endswith("(pure Python)")
    assert "serve" in gateway_command(venv, tmp_path, "--help")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_editable_and_GATEWAY_COMPILE_0_install_pure_python_without_a_warning(
        tmp_path: Path) -> None:
    # The test command's install (editable) and the explicit pure one: no compile, no word.
    for name, env, args in [("editable", {}, ["-e", "."]),
                            ("pure", {"GATEWAY_COMPILE": "0"}, ["."])]:  # fmt: skip
        steps = ["python3 -m venv .venv", ".venv/bin/pip install " + " ".join(args)]
        venv, out = install(tmp_path / name, steps=steps, **env)
        assert WARNING not in out and "__mypyc" not in out, out[-6000:]
        files = imported_files(venv, tmp_path)
        assert all(f.endswith(".py") for f in files.values()), files
        assert gateway_command(venv, tmp_path, "--version").strip().endswith("(pure Python)")
