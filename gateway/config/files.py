"""Reading config files line by line, and the value syntaxes every file shares.

How this works. :func:`read_lines` turns a file into :class:`SourceLine` records (file name,
1-based line number, text with comments and surrounding blanks removed); blank and comment
lines are dropped, so every later error can name the line it came from. Errors are never
raised one at a time: each parser appends :class:`~gateway.errors.ConfigError` objects to a
list, and the loader raises them together as :class:`~gateway.errors.ConfigErrors`, so the
operator sees every bad line of a load at once.

Shared syntax (TIBCO EMS User's Guide, "Mechanics of Configuration"):

* ``#`` starts a comment: a line whose first non-blank character is ``#``, and (where the
  file allows it) the rest of a line after a blank followed by ``#`` outside double quotes.
* Lines may be at most 256,000 characters long (EMS User's Guide, "Mechanics of Configuration").
* Booleans: ``enable, enabled, true, yes, on`` / ``disable, disabled, false, no, off``
  (EMS User's Guide, "Mechanics of Configuration"), case-insensitive.
* Sizes: a non-negative integer with an optional ``KB``, ``MB`` or ``GB`` suffix
  (1 KB = 1024 bytes; EMS User's Guide, "Destination Properties", maxbytes).
* Durations: a non-negative integer with an optional ``msec``, ``sec``, ``min``, ``hour`` or
  ``day`` suffix (EMS User's Guide, "Destination Properties", expiration); a bare number is in
  the unit the parameter names (seconds for every EMS parameter).
* Multi-element values are comma-separated; a value holding blanks or commas may be
  enclosed in double quotes (EMS User's Guide, "Mechanics of Configuration").

The value parsers raise :class:`ValueError` with a message meant for the operator; the
callers add file and line.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from gateway.errors import ConfigError

MAX_LINE_LENGTH = 256_000  # EMS User's Guide, "Mechanics of Configuration"

# EMS User's Guide, "Mechanics of Configuration"
TRUE_WORDS = frozenset({"enable", "enabled", "true", "yes", "on"})
# EMS User's Guide, "Mechanics of Configuration"
FALSE_WORDS = frozenset({"disable", "disabled", "false", "no", "off"})

_SIZE_UNITS = {"": 1, "kb": 1024, "mb": 1024**2, "gb": 1024**3}
_DURATION_MS = {
    "msec": 1,
    "msecs": 1,
    "ms": 1,
    "sec": 1000,
    "secs": 1000,
    "min": 60_000,
    "mins": 60_000,
    "hour": 3_600_000,
    "hours": 3_600_000,
    "day": 86_400_000,
    "days": 86_400_000,
}
_NUMBER_UNIT = re.compile(r"(\d+)\s*([A-Za-z]*)")


@dataclass(frozen=True, slots=True)
class SourceLine:
    """One meaningful line of a config file: where it is and what it says."""

    file: str
    line: int
    text: str

    def error(self, message: str) -> ConfigError:
        return ConfigError(self.file, self.line, message)

    def where(self) -> str:
        return f"{self.file}:{self.line}"


def read_lines(
    path: str | os.PathLike[str],
    errors: list[ConfigError],
    *,
    inline_comments: bool = True,
) -> list[SourceLine] | None:
    """Read ``path`` into meaningful lines; ``None`` if the file does not exist.

    Lines that are too long or not UTF-8 become errors in ``errors`` and are skipped.
    ``inline_comments=False`` keeps ``#`` after the first character (``users.conf``,
    whose passwords may contain it).
    """
    name = os.fspath(path)
    try:
        with open(name, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        errors.append(ConfigError(name, None, f"cannot read file: {e.strerror or e}"))
        return []
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    out: list[SourceLine] = []
    for number, raw in enumerate(data.splitlines(), start=1):
        if len(raw) > MAX_LINE_LENGTH:
            errors.append(
                ConfigError(
                    name,
                    number,
                    f"line is {len(raw)} characters long; the limit is {MAX_LINE_LENGTH}",
                )
            )
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            errors.append(ConfigError(name, number, f"line is not valid UTF-8 ({e.reason})"))
            continue
        text = text.strip()
        if not text or text[0] == "#":
            continue
        if inline_comments:
            text = strip_comment(text)
            if not text:
                continue
        out.append(SourceLine(name, number, text))
    return out


def strip_comment(text: str) -> str:
    """Remove a trailing ``# comment`` that follows a blank, outside double quotes."""
    if "#" not in text:
        return text
    quoted = False
    prev = ""
    for i, ch in enumerate(text):
        if ch == '"':
            quoted = not quoted
        elif ch == "#" and not quoted and prev in (" ", "\t"):
            return text[:i].rstrip()
        prev = ch
    return text


def split_outside_quotes(text: str, sep: str = ",") -> list[str]:
    """Split ``text`` on ``sep`` where it is not inside double quotes; items are stripped.

    Raises:
        ValueError: on an unterminated quote.
    """
    items: list[str] = []
    quoted = False
    start = 0
    for i, ch in enumerate(text):
        if ch == '"':
            quoted = not quoted
        elif ch == sep and not quoted:
            items.append(text[start:i].strip())
            start = i + 1
    if quoted:
        raise ValueError(f"unterminated double quote in {text!r}")
    items.append(text[start:].strip())
    return items


def unquote(value: str) -> str:
    """Remove one pair of enclosing double quotes.

    Raises:
        ValueError: if a quote is opened and not closed, or quotes appear inside.
    """
    if value.startswith('"'):
        if len(value) < 2 or not value.endswith('"'):
            raise ValueError(f"unterminated double quote in {value!r}")
        value = value[1:-1]
    if '"' in value:
        raise ValueError(f"unexpected double quote in {value!r}")
    return value


def parse_list(value: str) -> list[str]:
    """A comma-separated list, optionally quoted as a whole: ``a,b`` or ``"a, b"``."""
    text = unquote(value.strip())
    items = [s.strip() for s in text.split(",")]
    if any(not s for s in items):
        raise ValueError(f"empty element in list {value!r}")
    return items


def parse_bool(value: str) -> bool:
    """EMS booleans (EMS User's Guide, "Mechanics of Configuration")."""
    word = value.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(
        f"{value!r} is not a boolean (use enabled/true/yes/on or disabled/false/no/off)"
    )


def parse_int(value: str, *, minimum: int = 0, maximum: int | None = None) -> int:
    """A decimal integer in ``[minimum, maximum]``."""
    text = value.strip()
    if not re.fullmatch(r"[+-]?\d+", text):
        raise ValueError(f"{value!r} is not an integer")
    n = int(text)
    if n < minimum:
        raise ValueError(f"{n} is too small; the minimum is {minimum}")
    if maximum is not None and n > maximum:
        raise ValueError(f"{n} is too large; the maximum is {maximum}")
    return n


def parse_size(value: str) -> int:
    """Bytes from ``N``, ``NKB``, ``NMB`` or ``NGB`` (case-insensitive; EMS User's Guide,
    "Destination Properties", maxbytes)."""
    m = _NUMBER_UNIT.fullmatch(value.strip())
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _SIZE_UNITS:
        raise ValueError(f"{value!r} is not a size (a number with optional KB, MB or GB)")
    return int(m.group(1)) * _SIZE_UNITS[unit]


def parse_duration_ms(value: str, *, bare_unit_ms: int = 1000) -> int:
    """Milliseconds from ``N[msec|sec|min|hour|day]`` (EMS User's Guide,
    "Destination Properties", expiration).

    A bare number is multiplied by ``bare_unit_ms`` (seconds unless the parameter says
    otherwise).
    """
    m = _NUMBER_UNIT.fullmatch(value.strip())
    if m is None:
        raise ValueError(
            f"{value!r} is not a duration (a number with optional msec, sec, min, hour or day)"
        )
    unit = m.group(2).lower()
    if not unit:
        return int(m.group(1)) * bare_unit_ms
    factor = _DURATION_MS.get(unit)
    if factor is None:
        raise ValueError(f"unknown time unit {m.group(2)!r} in {value!r} (msec|sec|min|hour|day)")
    return int(m.group(1)) * factor


def resolve_path(value: str, base: str | os.PathLike[str]) -> str:
    """``value`` if absolute (after ``~`` expansion), else joined to ``base``."""
    p = os.path.expanduser(value)
    if os.path.isabs(p):
        return os.path.normpath(p)
    return os.path.normpath(os.path.join(os.fspath(base), p))
