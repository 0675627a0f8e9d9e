"""Writing run-time changes back to the configuration directory, as EMS saves its files.

When an administrator creates, changes or deletes a topic, queue, user, group, membership or
ACL entry, EMS writes the change to the file that defines it, so that it survives a restart
(TIBCO EMS User's Guide, "Using the Configuration Files": "the server writes changes made by
the administration tool back to the files"). EMS rewrites each file whole and drops the
operator's comments; here the file is edited instead:

* a line whose record still exists stays as it is when its text is unchanged (its trailing
  ``# comment`` too) and is replaced by the record's new line otherwise;
* a line whose record is gone is removed, a record with no line is appended at the end;
* blank lines, comment lines and lines that name no record stay where they are.

Each file is written to a temporary file beside it, flushed to disk and renamed over the old
one (:func:`os.replace`), then the directory is synced: a crash leaves the old file or the
new one, never half of one. Nothing is written for the embedded default configuration, which
is part of the installed package.

``groups.conf`` holds a group's members on the lines under its ``group:"description"`` line,
so a group is edited as a block: its header line, then its member lines (members left are
kept in place, new ones added after the last, removed ones dropped).
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
from collections.abc import Callable, Hashable, Iterable, Mapping
from pathlib import Path
from typing import Any

from gateway.config.files import strip_comment

_JNDI = re.compile(r"\[[^\]]*\]\s*")
_ACL_FIELD = re.compile(r"(TOPIC|QUEUE|USER|GROUP)\s*=\s*(\S+)", re.IGNORECASE)


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``: a temporary file in the same directory, synced, then
    renamed over it, then the directory synced (the rename itself made durable)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _raw_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []


def _text(raw: str, inline_comments: bool) -> str:
    """What a line says, without blanks and comments ('' for a blank or comment line)."""
    text = raw.strip()
    if not text or text.startswith("#"):
        return ""
    return strip_comment(text) if inline_comments else text


def rewrite(path: Path, records: Mapping[Hashable, str],
            key_of: Callable[[str], Hashable | None], *, inline_comments: bool = True) -> None:
    """Make the records of ``path`` be ``records`` (key -> line), keeping everything else.

    ``key_of`` names the record a line defines (given the line without comments), None for
    a line that defines none."""
    out: list[str] = []
    done: set[Hashable] = set()
    for raw in _raw_lines(path):
        text = _text(raw, inline_comments)
        key = key_of(text) if text else None
        if key is None:
            out.append(raw)
            continue
        if key in done or key not in records:
            continue  # deleted (or a second line of the same record)
        done.add(key)
        out.append(raw if records[key] == text else records[key])
    out.extend(line for key, line in records.items() if key not in done)
    write_atomically(path, "\n".join(out) + "\n")


# -- the files ---------------------------------------------------------------------------


def destination_key(text: str) -> str | None:
    """The name a ``topics.conf`` / ``queues.conf`` line defines."""
    rest = _JNDI.sub("", text, count=1) if text.startswith("[") else text
    name = rest.split(None, 1)[0] if rest.split() else ""
    return name or None


def user_key(text: str) -> str | None:
    """The user a ``users.conf`` line defines."""
    return text.partition(":")[0].strip() if ":" in text else None


def acl_key(text: str) -> tuple[str, str | None, str, bool] | None:
    """``(kind, name, principal, is_group)`` of an ``acl.conf`` line."""
    fields = {k.upper(): v for k, v in _ACL_FIELD.findall(text)}
    if text[:5].upper() == "ADMIN":
        kind, name = "admin", None
    elif "TOPIC" in fields:
        kind, name = "topic", fields["TOPIC"]
    elif "QUEUE" in fields:
        kind, name = "queue", fields["QUEUE"]
    else:
        return None
    if "GROUP" in fields:
        return (kind, name, fields["GROUP"], True)
    if "USER" in fields:
        return (kind, name, fields["USER"], False)
    return None


def rewrite_groups(path: Path, groups: Mapping[str, tuple[str, Iterable[str]]]) -> None:
    """Make ``groups.conf`` hold ``groups`` (name -> (header line, members))."""
    raw = _raw_lines(path)
    out: list[str] = []
    done: set[str] = set()
    i = 0
    while i < len(raw):
        text = _text(raw[i], True)
        if not text or ":" not in text:
            out.append(raw[i])  # comments, and members under no group (left as they were)
            i += 1
            continue
        name = text.partition(":")[0].strip()
        block_end = i + 1
        while block_end < len(raw) and ":" not in _text(raw[block_end], True):
            block_end += 1
        if name in groups and name not in done:
            done.add(name)
            header, members = groups[name]
            out.append(raw[i] if text == header else header)
            wanted = list(members)
            last = len(out)
            for line in raw[i + 1:block_end]:
                member = _text(line, True)
                if not member:
                    out.append(line)
                elif member in wanted:
                    wanted.remove(member)
                    out.append(line)
                    last = len(out)
            out[last:last] = wanted
        i = block_end
    for name, (header, members) in groups.items():
        if name not in done:
            out.append(header)
            out.extend(members)
    write_atomically(path, "\n".join(out) + "\n")


def save(config: Any, what: str) -> None:
    """Write one part of ``config`` back to its file: ``topic`` / ``queue`` (topics.conf,
    queues.conf), ``users``, ``groups`` or ``acl``."""
    d = Path(config.dir)
    security = config.security
    if what in ("topic", "queue"):
        entries = config.table(what).entries()
        rewrite(d / f"{what}s.conf", {e.name: e.to_line() for e in entries}, destination_key)
    elif what == "users":
        rewrite(d / "users.conf", {u.name: user_line(u) for u in security.users.values()},
                user_key, inline_comments=False)
    elif what == "groups":
        rewrite_groups(d / "groups.conf", {
            g.name: (f'{g.name}:"{g.description}"', g.members)
            for g in security.groups.values()})
    elif what == "acl":
        merged: dict[Hashable, Any] = {}
        for e in security.acl_entries():
            key = (e.kind, e.name, e.principal, e.is_group)
            old = merged.get(key)
            merged[key] = e if old is None else dataclasses.replace(old, perms=old.perms | e.perms)
        rewrite(d / "acl.conf", {k: e.to_line() for k, e in merged.items()}, acl_key)
    else:
        raise ValueError(f"nothing to save as {what!r}")


def user_line(user: Any) -> str:
    """A ``users.conf`` line: ``name:password:"description"`` (the password as stored)."""
    return f'{user.name}:{user.password}:"{user.description}"'
