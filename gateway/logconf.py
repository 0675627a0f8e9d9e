"""The gateway's own log: its format (``log_format``), its level (``log_level``), and the
level changed at run time (the admin API's ``/api/v1/log``).

How this works. The standard library's :mod:`logging` carries everything; :func:`configure`
gives the root logger one handler on standard error, with a ``time level logger: message``
line (``text``) or :class:`JsonFormatter`'s one JSON object per line (``json``, for a log
collector: no multi-line record, the traceback inside the object). :func:`levels` and
:func:`set_level` read and change the root logger's level, or one named logger's (a package's,
``transports.rv``), as EMS's ``set server log_trace`` / ``show config`` do for its trace
options; a change lasts until the process ends (gateway.conf keeps the level it starts with).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The level names gateway.conf's log_level and the admin API take, lower case as there.
LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
NOTSET = "notset"  # a named logger given back to its parent's level


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: ``time`` (ISO 8601, UTC, milliseconds),
    ``level`` (lower case), ``logger``, ``message`` and, when the record carries one,
    ``exception`` (the traceback as :meth:`logging.Formatter.formatException` writes it)
    and ``stack``."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, str] = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            if not record.exc_text:
                record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False)


def formatter(log_format: str) -> logging.Formatter:
    """The formatter of ``log_format`` (``text`` or ``json``)."""
    if log_format == "json":
        return JsonFormatter()
    return logging.Formatter(TEXT_FORMAT)


def level_number(name: str) -> int:
    """The number of a level name of :data:`LEVELS` (any case); ValueError otherwise."""
    number = LEVELS.get(name.lower()) if isinstance(name, str) else None
    if number is None:
        raise ValueError(f"unknown log level {name!r} (one of {', '.join(LEVELS)})")
    return number


def level_name(number: int) -> str:
    """The lower-case name of a level number (``level 15`` for one between the names)."""
    name = logging.getLevelName(number)
    return name.lower() if isinstance(name, str) and not name.startswith("Level ") \
        else f"level {number}"


def configure(level: str, log_format: str = "text") -> None:
    """Log to standard error at ``level`` in ``log_format``, as :func:`logging.basicConfig`
    does: nothing changes if the root logger has a handler already."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(log_format))
    logging.basicConfig(level=level_number(level), handlers=[handler])


def levels() -> dict[str, object]:
    """``{"level": root's, "loggers": {name: level}}``: every logger whose own level is
    set (the others follow their parent)."""
    loggers = {}
    for name, lg in sorted(logging.root.manager.loggerDict.items()):
        if isinstance(lg, logging.Logger) and lg.level != logging.NOTSET:
            loggers[name] = level_name(lg.level)
    return {"level": level_name(logging.root.level), "loggers": loggers}


def set_level(level: str, logger: str | None = None) -> None:
    """Set the root logger's level, or ``logger``'s (``notset``: back to its parent's).

    Raises:
        ValueError: an unknown level name, or ``notset`` for the root logger.
    """
    if logger:
        number = logging.NOTSET if str(level).lower() == NOTSET else level_number(level)
        logging.getLogger(logger).setLevel(number)
    else:
        logging.root.setLevel(level_number(level))
