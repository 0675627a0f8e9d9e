"""``routers.conf`` (gateway/config/routers.py): routers between RV-style buses."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import load_config
from gateway.errors import ConfigErrors


def load(tmp_path: Path, text: str):  # type: ignore[no-untyped-def]
    (tmp_path / "routers.conf").write_text(text)
    return load_config(tmp_path)


def test_a_router_section_with_every_parameter(tmp_path):
    config = load(tmp_path, (
        "[PLANT-OFFICE]   # the router\n"
        "bus = PLANT 7500 127.0.0.1;239.192.80.1\n"
        'bus = OFFICE 7501 "127.0.0.1;239.192.80.2"\n'
        "forward = _RVCM.>, _RVFT.>   # certified delivery and fault tolerance\n"
        "forward = ALWAYS.*\n"
        "interval = 500 msec\nhop_limit = 8\nttl = 0\nrequery = 30 sec\n"
        "[SECOND]\nbus = A 7500 127.0.0.1;239.192.80.3\nbus = B 7500 127.0.0.1\n"))
    r = config.routers["PLANT-OFFICE"]
    assert r.buses == {"PLANT": ("7500", "127.0.0.1;239.192.80.1"),
                       "OFFICE": ("7501", "127.0.0.1;239.192.80.2")}
    assert r.forward == ("_RVCM.>", "_RVFT.>", "ALWAYS.*")
    assert (r.interval, r.hop_limit, r.ttl, r.requery) == (0.5, 8, 0, 30.0)
    second = config.routers["SECOND"]
    assert (second.interval, second.hop_limit, second.ttl, second.forward) == (1.0, 16, 1, ())


def test_no_file_no_routers(tmp_path):
    assert load_config(tmp_path).routers == {}


@pytest.mark.parametrize(("text", "line", "error"), [
    ("[R]\nbus = A 7500 x\n", 1, "two or more 'bus'"),
    ("[R]\nbus = A 7500 x\nbus = A 7500 y\n", 3, "given twice"),
    ("[R]\nbus = A 7500\nbus = B 7500 y\n", 2, "NETWORK-NAME SERVICE NETWORK"),
    ("[R]\nbus = A 7500 x\nbus = B 7500 y\nforward = _RV.>\n", 4, "never forwarded"),
    ("[R]\nbus = A 7500 x\nbus = B 7500 y\nforward = _INBOX.>\n", 4, "never forwarded"),
    ("[R]\nbus = A 7500 x\nbus = B 7500 y\nforward = A.>.B\n", 4, "wildcard"),
    ("[R]\nbus = A 7500 x\nbus = B 7500 y\nforward = A..B\n", 4, "not a subject"),
    ("[R]\nbus = A 7500 x\nbus = B 7500 y\nhop_limit = 0\n", 4, "too small"),
    ("[R]\nbus = A 7500 x\nbus = B 7500 y\ninterval = 0\n", 4, "more than 0"),
    ("[R]\nbus = A 7500 x\nbus = B 7500 y\ncolour = red\n", 4, "unknown router parameter"),
    ("[R]\nbus = A 7500 x\nbus = B 7500 y\nttl\n", 4, "key = value"),
    ("bus = A 7500 x\n", 1, "outside a [router] section"),
    ("[R\n", 1, "missing ']'"),
    ("[R]\nbus = A 7500 x\nbus = B 7500 y\n[R]\n", 4, "duplicate router"),
])
def test_bad_lines_name_file_and_line(tmp_path, text, line, error):
    with pytest.raises(ConfigErrors) as info:
        load(tmp_path, text)
    errors = info.value.errors
    assert all(e.file.endswith("routers.conf") for e in errors)
    assert [e.line for e in errors if error in str(e)] == [line]
