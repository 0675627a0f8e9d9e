"""The STOMP frame codec: bytes in, frames out, frames to bytes. Sans-I/O, both sides.

Theory of operation. A frame is ``COMMAND EOL *(header EOL) EOL body NUL``, EOL being an
optional CR and a LF (STOMP 1.2 "Augmented BNF"; CR LF is accepted in every version).
:meth:`Parser.feed` parses *every* complete frame of the data with a moving offset and keeps
the rest in a ``bytearray``. A header block is found with one ``bytes.find(b"\\n\\n")``
bounded by the header limit, decoded as UTF-8 once and split into lines, each line at its
first colon; if the decoded block holds a CR (CR LF line ends, which may end the block
earlier) or does not decode, its lines are walked one by one instead; a CR anywhere else
in a line is an error, so a parsed header never holds a raw CR. The body is
``content-length`` octets followed by a NUL or, without that header, ends at the first NUL
("Body"). Bare EOLs between frames are heart-beats: skipped, counted in ``heartbeats``.

Incomplete frames cost O(size), not O(size^2): the parser remembers how long the buffer must
be (a ``content-length`` body) or which octet must arrive (a LF to end a header block, a NUL to
end a body without ``content-length``) and does not look at the buffer again until then.
Limits are checked as soon as the buffer proves them: a header block over ``max_header_bytes``
without waiting for its end, a declared body over ``max_frame_size`` from the header alone.

Header escaping ("Value Encoding") depends on the version the server picks at CONNECT: 1.2
has ``\\r \\n \\c \\\\``, 1.1 all but ``\\r``, 1.0 none; an undefined escape is fatal.
CONNECT, STOMP and CONNECTED frames are never escaped (1.2 says so for CONNECT and CONNECTED;
STOMP is CONNECT renamed and is also sent before a version is agreed). A parser starts at
"1.0" and, after a CONNECT/STOMP frame, moves itself to the version :func:`negotiate_version`
picks from its ``accept-version`` (after CONNECTED: to its ``version``), so that frames a
client pipelines behind its CONNECT are unescaped right; the server may still set
:attr:`Parser.version`. Repeated headers are all kept in order; the first one wins
(:meth:`Frame.get`, 1.2 "Repeated Header Entries").

Why hand-written: no maintained Python STOMP *server* codec exists; stomp.py is a client whose
frame parsing is tied to its threaded transport. A parser on ``bytes.find`` is short and fast.

Errors. A malformed frame raises :class:`StompError` (:class:`FrameTooLarge` for a limit),
whose text the server puts in its ERROR frame; ``exc.frames`` holds the good frames before it
in the same feed. After that the parser is dead. Encoding a header that the version cannot
carry raises :class:`~gateway.errors.LocalProtocolError`.
A well-formed frame the server refuses (in the wrong state, naming an unknown destination
...) raises :class:`FrameRefused`, which the server answers with an ERROR frame as well.
"""

from __future__ import annotations

from collections.abc import Iterable

from gateway.errors import LocalProtocolError, RemoteProtocolError

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE", "DEFAULT_MAX_HEADERS", "DEFAULT_MAX_HEADER_BYTES", "HEARTBEAT",
    "MAX_COMMAND_LENGTH", "SUPPORTED_VERSIONS", "Frame", "FrameRefused", "FrameTooLarge",
    "Parser", "StompError", "encode", "encode_frame", "escape", "negotiate_version",
]

HEARTBEAT = b"\n"
SUPPORTED_VERSIONS = ("1.0", "1.1", "1.2")
MAX_COMMAND_LENGTH = 64  # the longest command is UNSUBSCRIBE (11); anything long is garbage
# Default limits (the gateway's own choice; a listener may set others). The spec sets none:
# servers "MAY place maximum limits" on headers and body size (1.2 "Size Limits").
DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024  # body octets
DEFAULT_MAX_HEADER_BYTES = 64 * 1024  # command line through the blank line
DEFAULT_MAX_HEADERS = 1000
# Frames whose headers are never escaped (1.2 "Value Encoding"); STOMP is CONNECT renamed.
_RAW_COMMANDS = frozenset({"CONNECT", "STOMP", "CONNECTED"})
_COMMANDS = frozenset({
    "CONNECT", "STOMP", "CONNECTED", "SEND", "SUBSCRIBE", "UNSUBSCRIBE", "ACK", "NACK", "BEGIN",
    "COMMIT", "ABORT", "DISCONNECT", "MESSAGE", "RECEIPT", "ERROR"})
# Checked content-length values, so that common sizes skip the check and int(): the first
# 4096 distinct values a process sees. Each parser still compares them with its own limit.
_LENGTHS: dict[str, int] = {}
_LENGTHS_CACHED = 4096
_HUGE = 1 << 63
_new_frame = object.__new__
_UNESCAPE: dict[str, dict[str, str] | None] = {
    "1.0": None,
    "1.1": {"n": "\n", "c": ":", "\\": "\\"},  # 1.1 "Value Encoding": no \r
    "1.2": {"r": "\r", "n": "\n", "c": ":", "\\": "\\"},
}


class StompError(RemoteProtocolError):
    """A malformed frame; str(exc) is the message the server puts in its ERROR frame.

    ``frames`` holds the complete, valid frames that preceded the bad one in the same feed.
    """

    reason = "malformed-frame"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.frames: list[Frame] = []
        # The bad frame's ``receipt`` header, when its header block parsed (the body did
        # not): the ERROR frame carries it as ``receipt-id`` (1.2 "ERROR").
        self.receipt: str | None = None


class FrameTooLarge(StompError):
    """The header block or body of a frame is over a limit."""

    reason = "frame-too-large"


class FrameRefused(Exception):
    """A frame the connection refuses: the ERROR frame's ``message`` and body."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail


class Frame:
    """One STOMP frame: command, headers in wire order (repeats kept), body octets."""

    __slots__ = ("command", "headers", "body")

    def __init__(self, command: str, headers: list[tuple[str, str]] | None = None,
                 body: bytes = b"") -> None:
        self.command = command
        self.headers: list[tuple[str, str]] = headers if headers is not None else []
        self.body = body

    def get(self, name: str, default: str | None = None) -> str | None:
        """The value of the first header called ``name`` (1.2 "Repeated Header Entries")."""
        for key, value in self.headers:
            if key == name:
                return value
        return default

    def first_headers(self) -> dict[str, str]:
        """The headers by name, the first of repeated ones winning (1.2 "Repeated Header
        Entries")."""
        out: dict[str, str] = {}
        for name, value in self.headers:
            if name not in out:
                out[name] = value
        return out

    def __repr__(self) -> str:
        shown = self.headers[:4]
        more = ", ..." if len(self.headers) > 4 else ""
        return f"Frame({self.command!r}, {shown!r}{more}, <{len(self.body)} octets>)"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Frame):
            return NotImplemented
        return (self.command == other.command and self.headers == other.headers
                and self.body == other.body)

    __hash__ = None  # type: ignore[assignment]  # mutable


def negotiate_version(accept_version: str | None) -> str | None:
    """The highest version in a CONNECT's ``accept-version`` that we speak, else None.

    No header means 1.0 (1.2 "Protocol Negotiation").
    """
    if accept_version is None:
        return "1.0"
    offered = {v.strip() for v in accept_version.split(",")}
    for version in reversed(SUPPORTED_VERSIONS):
        if version in offered:
            return version
    return None


def _check_command(command: str) -> None:
    if (not command or len(command) > MAX_COMMAND_LENGTH or not command.isascii()
            or not command.isprintable()):
        raise StompError(f"malformed command line: {command[:MAX_COMMAND_LENGTH]!r}")


def _bad_header(line: str) -> StompError:
    if ":" not in line:
        return StompError(f"header line has no colon: {line[:100]!r}")
    return StompError("header name is empty")


def _content_length(length: str) -> int:
    """Read a ``content-length`` value (1.2 "Header content-length": octets, decimal)."""
    if not (length.isdigit() and length.isascii()):
        raise StompError(f"content-length is not a decimal number: {length[:40]!r}")
    digits = length.lstrip("0")
    if len(digits) > 18:
        return _HUGE  # over any limit; int() would refuse past 4300 digits anyway
    size = int(digits or "0")
    if len(_LENGTHS) < _LENGTHS_CACHED:
        _LENGTHS[length] = size
    return size


def _escaped_headers(lines: list[str], table: dict[str, str],
                     version: str) -> tuple[list[tuple[str, str]], str | None]:
    """Header lines split and unescaped (1.1/1.2 "Value Encoding"); and the content-length."""
    headers = []
    length = None
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not name or not colon:
            raise _bad_header(line)
        name = _unescape(name, table, version)
        value = _unescape(value, table, version)
        if name == "content-length" and length is None:
            length = value
        headers.append((name, value))
    return headers, length


def _unescape(text: str, table: dict[str, str], version: str) -> str:
    """Undo 1.1/1.2 "Value Encoding"; an undefined escape is a fatal error."""
    if "\\" not in text:
        return text
    out = []
    start = 0
    while True:
        j = text.find("\\", start)
        if j < 0:
            out.append(text[start:])
            return "".join(out)
        out.append(text[start:j])
        code = text[j + 1:j + 2]
        char = table.get(code)
        if char is None:
            shown = "\\" + code if code else "\\ at the end"
            raise StompError(f"undefined escape sequence in header: {shown} (STOMP {version})")
        out.append(char)
        start = j + 2


class Parser:
    """Bytes in, :class:`Frame` objects out (see the module docstring).

    ``heartbeats`` counts the bare EOLs seen between frames (1.2 "Heart-beating": any octet
    proves the peer alive). ``version`` decides the unescaping of the frames parsed after it
    is set.
    """

    def __init__(self, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                 max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
                 max_headers: int = DEFAULT_MAX_HEADERS) -> None:
        self.max_frame_size = max_frame_size
        self.max_header_bytes = max_header_bytes
        self.max_headers = max_headers
        self.heartbeats = 0
        self._version = "1.0"
        self._table: dict[str, str] | None = None
        self._buf = bytearray()
        # Do not parse the buffer again until it is ``_need`` long and, if ``_wait`` is set,
        # new data holds that byte or the buffer reached ``_limit`` (which proves an error).
        self._need = 0
        self._wait: bytes | None = None
        self._limit = 0
        self._failed: tuple[type[StompError], str] | None = None
        self._crlf = False  # the last header block ended with CR LF: walk the next one

    @property
    def version(self) -> str:
        """The STOMP version that decides how headers of the next frames are unescaped."""
        return self._version

    @version.setter
    def version(self, version: str) -> None:
        if version not in _UNESCAPE:
            raise ValueError(f"unknown STOMP version {version!r}")
        self._version = version
        self._table = _UNESCAPE[version]

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Add ``data``; return every frame now complete, in order. Raises StompError."""
        if self._failed is not None:
            raise self._failed[0](self._failed[1])
        if type(data) is not bytes:
            data = bytes(data)
        buf = self._buf
        if buf:
            buf += data
            size = len(buf)
            if size < self._need or (self._wait is not None and self._wait not in data
                                     and size < self._limit):
                return []
            data = bytes(buf)
        elif not data:
            return []
        frames: list[Frame] = []
        try:
            consumed = self._parse(data, frames)
        except StompError as exc:
            self._failed = (type(exc), str(exc))
            self._buf = bytearray()
            exc.frames = frames
            raise
        if buf:
            del buf[:consumed]
        elif consumed < len(data):
            buf += memoryview(data)[consumed:]
        return frames

    def _parse(self, data: bytes, frames: list[Frame]) -> int:
        """Parse frames from ``data`` into ``frames``; return how many octets were used."""
        n = len(data)
        find = data.find
        append = frames.append
        max_header = self.max_header_bytes
        max_body = self.max_frame_size
        max_lines = self.max_headers + 1
        table = self._table
        lengths = _LENGTHS
        crlf = self._crlf
        beats = 0
        p = 0
        while p < n:
            c = data[p]
            if c < 14 and (c == 10 or (c == 13 and data[p + 1:p + 2] == b"\n")):  # heart-beat
                beats += 1
                p += 1 if c == 10 else 2
                continue
            # The header block: command line through the blank line, at most max_header.
            text = None
            if not crlf:
                i = find(b"\n\n", p, p + max_header)
                if i >= 0:
                    try:
                        text = data[p:i].decode()
                    except UnicodeDecodeError:
                        pass  # bad UTF-8, or a CR LF block that ended before ``i``
                    else:
                        end = i + 2
                        if "\r" in text:  # CR LF: the block may end before ``i``
                            text = None
            if text is None:
                end, text = self._crlf_headers(data, p)
                if end < 0:
                    self._need, self._wait, self._limit = n - p + 1, b"\n", max_header
                    break
                # A peer that ends lines with CR LF does so in every frame: walk its next
                # frames at once rather than search its bodies for a LF LF first.
                crlf = data[end - 2] == 13
            lines = text.split("\n")
            command = lines[0]
            if command not in _COMMANDS:
                _check_command(command)
            if len(lines) > max_lines:
                raise FrameTooLarge(f"more than {max_lines - 1} headers")
            if table is not None and "\\" in text and command not in _RAW_COMMANDS:
                headers, length = _escaped_headers(lines, table, self._version)
            else:
                headers = []
                length = None
                for line in lines[1:]:
                    name, colon, value = line.partition(":")
                    if not name or not colon:
                        raise _bad_header(line)
                    if name == "content-length" and length is None:
                        length = value
                    headers.append((name, value))
            try:
                if length is None:
                    z = find(b"\0", end, end + max_body + 1)
                    if z < 0:
                        if n - end > max_body:
                            raise FrameTooLarge(
                                f"frame body over the limit of {max_body} octets")
                        self._need, self._wait = n - p + 1, b"\0"
                        self._limit = end - p + max_body + 1
                        break
                else:
                    size = lengths.get(length)
                    if size is None:
                        size = _content_length(length)
                    if size > max_body:
                        raise FrameTooLarge(
                            f"content-length {length[:40]} over the limit of {max_body} octets")
                    z = end + size
                    if z >= n:
                        self._need, self._wait = z - p + 1, None
                        break
                    if data[z]:
                        raise StompError(
                            "frame body longer than content-length (no NUL after it)")
            except StompError as exc:  # the headers parsed: the ERROR can name the receipt
                exc.receipt = next((v for k, v in headers if k == "receipt"), None)
                raise
            frame = _new_frame(Frame)
            frame.command = command
            frame.headers = headers
            frame.body = data[end:z]
            append(frame)
            p = z + 1
            if command in _RAW_COMMANDS:
                table = self._negotiated(frame)
        else:
            self._need, self._wait = 0, None
        self.heartbeats += beats
        self._crlf = crlf
        return p

    def _crlf_headers(self, data: bytes, p: int) -> tuple[int, str]:
        """The header block at ``p`` walked line by line (CR LF ends): (end, text) or (-1, "")."""
        limit = p + self.max_header_bytes
        lines = []
        q = p
        while True:
            nl = data.find(b"\n", q, limit)
            if nl < 0:
                if len(data) - p >= self.max_header_bytes:
                    raise FrameTooLarge(
                        f"header block longer than {self.max_header_bytes} octets")
                return -1, ""
            line = data[q:nl]
            q = nl + 1
            if line[-1:] == b"\r":
                line = line[:-1]
            if not line:
                break
            if b"\r" in line:  # 1.2 "Augmented BNF": no CR in a command or header
                raise StompError("CR not followed by LF in a header line")
            lines.append(line)
            if len(lines) > self.max_headers + 1:
                raise FrameTooLarge(f"more than {self.max_headers} headers")
        try:
            return q, b"\n".join(lines).decode()
        except UnicodeDecodeError:
            raise StompError("header is not valid UTF-8") from None

    def _negotiated(self, frame: Frame) -> dict[str, str] | None:
        """Follow the version a CONNECT/STOMP offers or a CONNECTED names; return its table."""
        if frame.command == "CONNECTED":
            version: str | None = frame.get("version", "1.0")
        else:
            version = negotiate_version(frame.get("accept-version"))
        if version is not None and version in _UNESCAPE:
            self.version = version
        return self._table


def escape(value: str, version: str) -> str:
    """Escape a header name or value for ``version`` (1.2/1.1 "Value Encoding").

    1.0 returns it as is; 1.1 has no escape for CR, so a CR raises LocalProtocolError.
    """
    if version == "1.0":
        return value
    value = value.replace("\\", "\\\\").replace("\n", "\\n").replace(":", "\\c")
    if "\r" in value:
        if version == "1.1":
            raise LocalProtocolError("STOMP 1.1 cannot carry a CR in a header")
        value = value.replace("\r", "\\r")
    return value


def _check_raw(name: str, value: str, command: str, version: str) -> None:
    """An unescaped header (1.0, or CONNECT/CONNECTED) must not break the frame's lines."""
    if "\n" in name or "\r" in name or ":" in name or "\n" in value or "\r" in value:
        raise LocalProtocolError(
            f"header {name[:40]!r} of {command} cannot be sent unescaped (STOMP {version})")


def encode(command: str, headers: Iterable[tuple[str, str]], body: bytes = b"", *,
           version: str = "1.2") -> bytes:
    """One frame as bytes: LF line ends, headers escaped per ``version``, body and NUL.

    Adds no ``content-length``: callers add it where they want it (1.2 "Header
    content-length": SHOULD). CONNECT, STOMP and CONNECTED are not escaped.
    """
    if version not in _UNESCAPE:
        raise ValueError(f"unknown STOMP version {version!r}")
    headers = headers if isinstance(headers, list) else list(headers)
    lines = [command]
    for name, value in headers:
        lines.append(name + ":" + value)
    text = "\n".join(lines)
    count = len(lines) - 1
    if ("\\" in text or "\r" in text or text.count(":") != count
            or text.count("\n") != count):
        lines = [command]
        raw = version == "1.0" or command in _RAW_COMMANDS
        for name, value in headers:
            if raw:
                _check_raw(name, value, command, version)
            else:
                name, value = escape(name, version), escape(value, version)
            lines.append(name + ":" + value)
        text = "\n".join(lines)
    try:
        head = (text + "\n\n").encode()
    except UnicodeEncodeError:
        raise LocalProtocolError(f"a header of {command} is not valid Unicode") from None
    return b"".join((head, body, b"\0"))


def encode_frame(frame: Frame, *, version: str = "1.2") -> bytes:
    """:func:`encode` for a :class:`Frame`."""
    return encode(frame.command, frame.headers, frame.body, version=version)
