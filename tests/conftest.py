"""Test configuration: coroutine tests run in a fresh event loop each (no plugin needed), and
Hypothesis runs the same examples every time."""

from __future__ import annotations

import asyncio
import inspect
import sys
from pathlib import Path

import pytest
from hypothesis import settings

sys.path.insert(0, str(Path(__file__).parent))

# Hypothesis's built-in "ci" profile (examples derived from each test, not drawn at random;
# no example database; no deadline) for every run, on CI or not: a failure is reproduced by
# running the test again, and a run never fails where the one before it passed by chance.
settings.load_profile("ci")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if inspect.iscoroutinefunction(pyfuncitem.obj):
        # The test's own parameters (fixtures and parametrized values); funcargs may also
        # hold autouse fixtures the test does not take.
        params = inspect.signature(pyfuncitem.obj).parameters
        args = {a: pyfuncitem.funcargs[a] for a in params if a in pyfuncitem.funcargs}
        asyncio.run(pyfuncitem.obj(**args))
        return True
    return None
