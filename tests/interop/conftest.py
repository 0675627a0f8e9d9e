"""Fixtures shared by the interop tests of the RV-style bus."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_rv_bus import Bus


@pytest.fixture
def bus() -> Iterator[Bus]:
    """A unique service and network for one test (test_rv_bus.py's :class:`Bus`), closed at
    the end. The transport tests' modules have a ``bus`` of their own."""
    b = Bus()
    try:
        yield b
    finally:
        b.close()
