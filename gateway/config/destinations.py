"""``topics.conf`` / ``queues.conf``: destination definitions, wildcards and inheritance.

How this works. Each line defines one destination, literal or wildcard (TIBCO EMS User's Guide,
"queues.conf"; "topics.conf")::

    [jndi-name1, jndi-name2]destination-name property1, property2=value, ...
    business.inventory global, import="RV01,RV02", export="RV03", maxbytes=1MB

A :class:`DestinationTable` per kind holds the entries. :meth:`DestinationTable.resolve`
gives the effective :class:`DestinationProps` of a name by combining its own entry with
every wildcard entry that matches it (EMS User's Guide, "Inheritance"):

* flags (``secure``, ``global``, ``exclusive``, ``sender_name``, ...) add up; an inherited
  flag cannot be removed (EMS User's Guide, "Inheritance of Properties");
* value properties: the destination's own value wins (EMS User's Guide,
  "Inheritance of Properties"); otherwise, of several parents, the smallest (EMS User's Guide,
  "Inheritance of Properties"). ``0`` counts as "not set" for ``maxmsgs``, ``maxbytes``,
  ``maxRedelivery``, ``redeliveryDelay`` and ``flowControl`` (EMS User's Guide,
  "Destination Properties", maxbytes and maxmsgs); for ``expiration`` ``0`` means
  "never expires" (EMS User's Guide, "Destination Properties", expiration) and ranks as the
  largest value;
* ``prefetch``: own value; else the largest non-zero numeric parent value; else ``none`` if
  parents only say ``none``; else the default, 5 for queues and 64 for topics
  (EMS User's Guide, "Destination Properties", prefetch);
* ``overflowPolicy``: own non-default value; else ``rejectIncoming`` if any parent has it;
  else ``discardOld`` if any parent has it; else ``default`` (EMS User's Guide,
  "Destination Properties", overflowPolicy);
* ``trace``: ``body`` beats ``on``; ``import`` / ``export``: union, own names first;
* ``store`` and ``channel`` are disjoint (EMS User's Guide,
  "Overlapping Wildcards and Disjoint Properties"): two entries that can match the same name
  may not give different values. A file that does so is an error at load; a clash that still
  reaches :meth:`~DestinationTable.resolve` raises ``InvalidDestinationError``.

``resolve`` returns ``None`` when no entry matches: the destination may not be created
dynamically (EMS User's Guide, "Wildcards and Dynamically Created Destinations"); a lone ``>``
entry allows every name. Results are cached until the table changes
(:meth:`~DestinationTable.add`, :meth:`~DestinationTable.remove`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from gateway import subject
from gateway.config.files import (
    SourceLine,
    parse_bool,
    parse_duration_ms,
    parse_int,
    parse_list,
    parse_size,
    split_outside_quotes,
    unquote,
)
from gateway.errors import ConfigError, ConfigErrors, InvalidDestinationError

Kind = Literal["topic", "queue"]

# EMS User's Guide, "Destination Properties", prefetch
DEFAULT_PREFETCH: dict[str, int] = {"queue": 5, "topic": 64}
# EMS User's Guide, "Destination Properties", flowControl: without a value
DEFAULT_FLOW_CONTROL = 256 * 1024
# EMS User's Guide, "Destination Properties", redeliveryDelay: 15 seconds ...
REDELIVERY_DELAY_MIN_MS = 15_000
REDELIVERY_DELAY_MAX_MS = 8 * 3_600_000  # ... to 8 hours
# EMS User's Guide, "Destination Properties", maxRedelivery; 0 disables
MAX_REDELIVERY_RANGE = (2, 255)
MAX_CACHED_NAMES = 65_536  # resolve() cache; cleared whole when full
ADMIN_FILE = "<admin>"


class OverflowPolicy(enum.Enum):
    """``overflowPolicy`` values (EMS User's Guide, "Destination Properties", overflowPolicy);
    ``value`` is the EMS spelling."""

    DEFAULT = "default"
    DISCARD_OLD = "discardOld"
    REJECT_INCOMING = "rejectIncoming"


@dataclass(frozen=True, slots=True)
class DestinationProps:
    """Effective properties of one destination (EMS User's Guide, Table 12
    "Destination properties").

    ``prefetch`` is ``None`` for ``none`` and is already defaulted per kind;
    ``expiration_ms`` is ``None`` when not set and ``0`` for "never expires" (EMS User's Guide,
    "Destination Properties", expiration); the other numbers use ``0`` for
    "not set / unlimited". ``inherited`` names, in EMS spelling (``maxbytes``,
    ``overflowPolicy``, ...), the properties whose value came from a wildcard parent, which
    ``show`` listings mark with ``*`` (EMS User's Guide, "Command Listing", show queues).
    """

    maxmsgs: int = 0
    maxbytes: int = 0
    overflow_policy: OverflowPolicy = OverflowPolicy.DEFAULT
    prefetch: int | None = DEFAULT_PREFETCH["queue"]
    exclusive: bool = False
    expiration_ms: int | None = None
    max_redelivery: int = 0
    redelivery_delay_ms: int = 0
    flow_control_bytes: int = 0
    secure: bool = False
    sender_name: bool = False
    sender_name_enforced: bool = False
    global_: bool = False
    trace: Literal["on", "body"] | None = None
    imports: tuple[str, ...] = ()
    exports: tuple[str, ...] = ()
    store: str | None = None
    channel: str | None = None
    inherited: frozenset[str] = field(default_factory=frozenset)


# -- property syntax -------------------------------------------------------------------

_UNSET = object()  # a parser's answer for "explicitly not set" (prefetch=0, secure=false)


def _flag(v: str | None) -> object:
    if v is None:
        return True
    return True if parse_bool(v) else _UNSET


def _required(v: str | None) -> str:
    if v is None or v == "":
        raise ValueError("needs a value")
    return unquote(v)


def _maxmsgs(v: str | None) -> int:
    return parse_int(_required(v), minimum=0)


def _maxbytes(v: str | None) -> int:
    return parse_size(_required(v))


def _overflow(v: str | None) -> OverflowPolicy:
    text = _required(v).lower()
    for p in OverflowPolicy:
        if p.value.lower() == text:
            return p
    raise ValueError(f"{v!r} is not one of default, discardOld, rejectIncoming")


def _prefetch(v: str | None) -> object:
    text = _required(v)
    if text.lower() == "none":
        return None
    n = parse_int(text, minimum=0)
    return _UNSET if n == 0 else n  # 0 = inherit (EMS User's Guide, Table 13 "Prefetch")


def _expiration(v: str | None) -> int:
    return parse_duration_ms(_required(v))


def _max_redelivery(v: str | None) -> object:
    n = parse_int(_required(v), minimum=0)
    lo, hi = MAX_REDELIVERY_RANGE
    if n and not lo <= n <= hi:
        raise ValueError(f"{n} is out of range; use {lo} to {hi}, or 0 to disable")
    return n or _UNSET


def _redelivery_delay(v: str | None) -> object:
    ms = parse_duration_ms(_required(v))
    if ms and not REDELIVERY_DELAY_MIN_MS <= ms <= REDELIVERY_DELAY_MAX_MS:
        raise ValueError(f"{v} is out of range; use 15sec to 8hour, or 0 for no delay")
    return ms or _UNSET


def _flow_control(v: str | None) -> object:
    if v is None:
        return DEFAULT_FLOW_CONTROL
    return parse_size(v) or _UNSET


def _trace(v: str | None) -> str:
    if v is None:
        return "on"
    if unquote(v).lower() == "body":
        return "body"
    raise ValueError(f"{v!r} is not valid; use 'trace' or 'trace=body'")


def _transports(v: str | None) -> tuple[str, ...]:
    names = parse_list(_required(v))
    for i, n in enumerate(names):
        if n in names[:i]:
            raise ValueError(f"duplicate transport name {n!r} in the list")
    return tuple(names)


def _name_value(v: str | None) -> str:
    text = _required(v)
    if any(c.isspace() or c == "," for c in text):
        raise ValueError(f"{text!r} is not a name")
    return text


@dataclass(frozen=True, slots=True)
class _Prop:
    ems: str  # EMS spelling
    attr: str  # DestinationProps field
    parse: Callable[[str | None], Any]
    topic: bool = True
    queue: bool = True


_PROPS: tuple[_Prop, ...] = (
    _Prop("maxmsgs", "maxmsgs", _maxmsgs),
    _Prop("maxbytes", "maxbytes", _maxbytes),
    _Prop("overflowPolicy", "overflow_policy", _overflow),
    _Prop("prefetch", "prefetch", _prefetch),
    _Prop("exclusive", "exclusive", _flag, topic=False),
    _Prop("expiration", "expiration_ms", _expiration),
    _Prop("maxRedelivery", "max_redelivery", _max_redelivery, topic=False),
    _Prop("redeliveryDelay", "redelivery_delay_ms", _redelivery_delay, topic=False),
    _Prop("flowControl", "flow_control_bytes", _flow_control),
    _Prop("secure", "secure", _flag),
    _Prop("sender_name", "sender_name", _flag),
    _Prop("sender_name_enforced", "sender_name_enforced", _flag),
    _Prop("trace", "trace", _trace),
    _Prop("import", "imports", _transports),
    _Prop("export", "exports", _transports, queue=False),
    _Prop("global", "global_", _flag),
    _Prop("store", "store", _name_value),
    _Prop("channel", "channel", _name_value, queue=False),
)
_BY_NAME = {p.ems.lower(): p for p in _PROPS}
EMS_NAME = {p.attr: p.ems for p in _PROPS}
PROPERTY_NAMES = tuple(p.ems for p in _PROPS)


# -- entries ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class DestinationEntry:
    """One definition line: its name, the properties it sets itself, and where it is.

    ``own`` maps ``DestinationProps`` field names to the values this line sets.
    """

    name: str
    kind: Kind
    own: Mapping[str, Any]
    jndi_names: tuple[str, ...] = ()
    file: str = ADMIN_FILE
    line: int | None = None

    @property
    def wildcard(self) -> bool:
        return subject.is_wildcard(self.name)

    def where(self) -> str:
        return self.file if self.line is None else f"{self.file}:{self.line}"

    def props_text(self) -> str:
        """The properties in config-file syntax (``secure,maxbytes=1MB``)."""
        return ",".join(_format_prop(attr, v) for attr, v in self.own.items())

    def to_line(self) -> str:
        """The entry as a ``topics.conf`` / ``queues.conf`` line."""
        jndi = f"[{', '.join(self.jndi_names)}]" if self.jndi_names else ""
        props = self.props_text()
        return f"{jndi}{self.name} {props}" if props else f"{jndi}{self.name}"


def parse_properties(text: str, kind: Kind, *, report: Callable[[str], None]) -> dict[str, Any]:
    """Parse a property list (``secure, maxbytes=1MB, import="a,b"``) for ``kind``.

    Each problem is passed to ``report``; the properties that parsed are returned, keyed by
    ``DestinationProps`` field name.
    """
    own: dict[str, Any] = {}
    given: set[str] = set()
    text = text.strip()
    if not text:
        return own
    try:
        items = split_outside_quotes(text)
    except ValueError as e:
        report(str(e))
        return own
    for item in items:
        if not item:
            report("empty property in the list (two commas, or a comma at the end)")
            continue
        key, eq, raw = item.partition("=")
        key = key.strip()
        prop = _BY_NAME.get(key.lower())
        if prop is None:
            report(f"unknown property {key!r}")
            continue
        if not (prop.topic if kind == "topic" else prop.queue):
            report(f"property {prop.ems!r} is not allowed for a {kind}")
            continue
        if prop.attr in given:
            report(f"property {prop.ems!r} is given twice")
            continue
        given.add(prop.attr)
        try:
            value = prop.parse(raw.strip() if eq else None)
        except ValueError as e:
            report(f"{prop.ems}: {e}")
            continue
        if value is _UNSET:
            continue
        if prop.attr == "prefetch" and value is None and kind == "topic":
            # EMS User's Guide, "Destination Properties", prefetch: automatic fetch cannot be
            # disabled for topics
            report("prefetch=none is not allowed for a topic")
            continue
        own[prop.attr] = value
    if kind == "queue" and own.get("global_"):
        if own.get("exclusive"):
            report("a global queue cannot be exclusive (EMS User's Guide, 'Destination "
                   "Properties', exclusive)")
        if "prefetch" in own and own["prefetch"] is None:
            report("prefetch=none is not allowed for a global queue (EMS User's Guide, "
                   "'Destination Properties', prefetch)")
    return own


def parse_entry(sl: SourceLine, kind: Kind, errors: list[ConfigError]) -> DestinationEntry | None:
    """Parse one ``topics.conf`` / ``queues.conf`` line; ``None`` if it is unusable."""
    text = sl.text
    before = len(errors)
    jndi: tuple[str, ...] = ()
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            errors.append(sl.error("missing ']' after the JNDI names"))
            return None
        names = [n.strip() for n in text[1:end].split(",")]
        if any(not n for n in names):
            errors.append(sl.error("empty JNDI name between '[' and ']'"))
            return None
        jndi = tuple(names)
        text = text[end + 1 :].lstrip()
    parts = text.split(None, 1)
    name = parts[0] if parts else ""
    rest = parts[1] if len(parts) > 1 else ""
    if not name:
        errors.append(sl.error("missing destination name"))
        return None
    if any(c in name for c in ',="'):
        errors.append(
            sl.error(
                f"bad destination specification {name!r}: "
                "put a blank between the name and its properties"
            )
        )
        return None
    try:
        subject.validate(name, wildcards=True, system=name.startswith(("$sys.", "$TMP$.")))
    except InvalidDestinationError as e:
        errors.append(sl.error(str(e)))
        return None
    own = parse_properties(rest, kind, report=lambda m: errors.append(sl.error(m)))
    if len(errors) > before:
        return None
    return DestinationEntry(name, kind, MappingProxyType(own), jndi, sl.file, sl.line)


# -- the table -------------------------------------------------------------------------


class DestinationTable:
    """The topics (or queues) of a configuration: definitions and effective properties.

    ``transport_names``, when set (the loader sets it from ``transports.conf``), is checked
    by :meth:`add` against every ``import`` / ``export`` name.
    """

    def __init__(self, kind: Kind) -> None:
        if kind not in DEFAULT_PREFETCH:
            raise ValueError(f"kind must be 'topic' or 'queue', not {kind!r}")
        self.kind: Kind = kind
        self.transport_names: frozenset[str] | None = None
        self._entries: dict[str, DestinationEntry] = {}
        self._wild: list[DestinationEntry] = []
        self._cache: dict[str, DestinationProps | None] = {}
        self._default = DestinationProps(prefetch=DEFAULT_PREFETCH[kind])

    # -- building ------------------------------------------------------------------

    def add(
        self,
        name: str,
        props_text: str = "",
        *,
        jndi_names: Sequence[str] = (),
        replace: bool = False,
    ) -> DestinationEntry:
        """Define ``name`` at run time (admin ``create topic``/``setprop``).

        Raises:
            ConfigErrors: listing every problem (file ``<admin>``, no line).
        """
        errors: list[ConfigError] = []
        text = (
            f"[{', '.join(jndi_names)}]{name} {props_text}"
            if jndi_names
            else f"{name} {props_text}"
        )
        entry = parse_entry(SourceLine(ADMIN_FILE, 0, text.strip()), self.kind, errors)
        if entry is not None and entry.name != name:  # blanks in the name, or none
            errors.append(ConfigError(ADMIN_FILE, None, f"bad {self.kind} name {name!r}"))
            entry = None
        if entry is not None:
            entry = DestinationEntry(entry.name, entry.kind, entry.own, entry.jndi_names)
            if self.transport_names is not None:
                for msg in self.transport_problems(entry, self.transport_names):
                    errors.append(ConfigError(ADMIN_FILE, None, msg))
            if not errors:
                self.insert(entry, errors, replace=replace)
        if errors:
            raise ConfigErrors([ConfigError(e.file, None, e.detail) for e in errors])
        assert entry is not None
        return entry

    def insert(
        self, entry: DestinationEntry, errors: list[ConfigError], *, replace: bool = False
    ) -> bool:
        """Add a parsed entry, checking duplicates and disjoint properties (EMS User's Guide,
        "Overlapping Wildcards and Disjoint Properties").

        Problems go to ``errors`` (naming ``entry``'s file and line); returns whether it was
        added.
        """
        old = self._entries.get(entry.name)
        if old is not None and not replace:
            errors.append(
                ConfigError(
                    entry.file,
                    entry.line,
                    f"{self.kind} {entry.name!r} is already defined at {old.where()}",
                )
            )
            return False
        for attr in ("store", "channel"):
            mine = entry.own.get(attr)
            if mine is None:
                continue
            for other in self._entries.values():
                theirs = other.own.get(attr)
                if (
                    other is not old
                    and theirs is not None
                    and theirs != mine
                    and subject.intersects(other.name, entry.name)
                ):
                    errors.append(
                        ConfigError(
                            entry.file,
                            entry.line,
                            f"{EMS_NAME[attr]}={mine} conflicts with {EMS_NAME[attr]}={theirs} "
                            f"of overlapping {self.kind} {other.name!r} at {other.where()}: "
                            f"a {self.kind} can have only one {EMS_NAME[attr]}",
                        )
                    )
                    return False
        if old is not None:
            self._drop(old)
        self._entries[entry.name] = entry
        if entry.wildcard:
            self._wild.append(entry)
        self._cache.clear()
        return True

    def change(self, name: str, add_text: str = "", remove: Iterable[str] = ()) -> DestinationEntry:
        """Admin ``addprop`` (``add_text``: properties added or changed) and ``removeprop``
        (``remove``: property names) on the entry of exactly ``name``.

        Raises:
            KeyError: ``name`` has no entry.
            ConfigErrors: a bad property or property name.
        """
        old = self._entries[name]
        problems: list[str] = []
        added = parse_properties(add_text, self.kind, report=problems.append)
        gone: set[str] = set()
        for word in remove:
            prop = _BY_NAME.get(word.strip().lower())
            if prop is None:
                problems.append(f"unknown property {word.strip()!r}")
            else:
                gone.add(prop.attr)
        if problems:
            raise ConfigErrors([ConfigError(ADMIN_FILE, None, p) for p in problems])
        own = {a: v for a, v in old.own.items() if a not in gone} | added
        text = ",".join(_format_prop(a, v) for a, v in own.items())
        return self.add(name, text, jndi_names=old.jndi_names, replace=True)

    def remove(self, name: str) -> bool:
        """Delete the definition of ``name``; ``False`` if there was none."""
        entry = self._entries.pop(name, None)
        if entry is None:
            return False
        self._drop(entry)
        return True

    def _drop(self, entry: DestinationEntry) -> None:
        self._entries.pop(entry.name, None)
        if entry.wildcard:
            self._wild = [e for e in self._wild if e is not entry]
        self._cache.clear()

    # -- queries -------------------------------------------------------------------

    def resolve(self, name: str) -> DestinationProps | None:
        """Effective properties of ``name``, or ``None`` if no entry allows it.

        ``name`` is normally literal; a wildcard name (a subscription) combines its own
        entry with the entries that contain it.

        Raises:
            InvalidDestinationError: two matching entries give different values of a
                disjoint property (``store``, ``channel``).
        """
        try:
            return self._cache[name]
        except KeyError:
            pass
        own = self._entries.get(name)
        if subject.is_wildcard(name):
            parents = [e for e in self._wild if e is not own and subject.contains(e.name, name)]
        else:
            parents = [e for e in self._wild if subject.matches(e.name, name)]
        props = None if own is None and not parents else self._combine(name, own, parents)
        if len(self._cache) >= MAX_CACHED_NAMES:
            self._cache.clear()
        self._cache[name] = props
        return props

    def default_props(self) -> DestinationProps:
        """Properties of a destination no entry governs (temporary and system ones)."""
        return self._default

    def get(self, name: str) -> DestinationEntry | None:
        """The entry defined for exactly ``name`` (literal or wildcard), if any."""
        return self._entries.get(name)

    def is_static(self, name: str) -> bool:
        """True if ``name`` has its own literal (non-wildcard) entry."""
        e = self._entries.get(name)
        return e is not None and not e.wildcard

    def static_names(self) -> list[str]:
        """Literal names defined in the table, in definition order."""
        return [n for n, e in self._entries.items() if not e.wildcard]

    def entries(self) -> list[DestinationEntry]:
        """Every entry, in definition order."""
        return list(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def describe(self, name: str) -> str | None:
        """``show``-style property text for ``name``; inherited values end with ``*``."""
        props = self.resolve(name)
        if props is None:
            return None
        own = self._entries.get(name)
        shown = set(own.own) if own is not None else set()
        parts = []
        for p in _PROPS:
            inherited = p.ems in props.inherited
            if p.attr not in shown and not inherited:
                continue
            parts.append(_format_prop(p.attr, getattr(props, p.attr)) + ("*" if inherited else ""))
        return ",".join(parts)

    @staticmethod
    def transport_problems(entry: DestinationEntry, known: Iterable[str]) -> list[str]:
        """Messages for ``import`` / ``export`` names that are not defined transports."""
        names = set(known)
        out = []
        for attr, word in (("imports", "import"), ("exports", "export")):
            for t in entry.own.get(attr, ()):
                if t not in names:
                    out.append(
                        f"transport {t!r} in the {word} list is not defined in transports.conf"
                    )
        return out

    # -- inheritance (EMS User's Guide, "Inheritance") ---------------------------------

    def _combine(
        self, name: str, own_entry: DestinationEntry | None, parents: list[DestinationEntry]
    ) -> DestinationProps:
        own: Mapping[str, Any] = own_entry.own if own_entry is not None else {}
        pv = [p.own for p in parents]
        v: dict[str, Any] = {}
        inherited: set[str] = set()

        def take(attr: str, value: Any, from_parent: bool) -> None:
            v[attr] = value
            if from_parent:
                inherited.add(EMS_NAME[attr])

        for attr in ("exclusive", "secure", "sender_name", "sender_name_enforced", "global_"):
            if own.get(attr):
                take(attr, True, False)
            elif any(p.get(attr) for p in pv):
                take(attr, True, True)
        for attr in (
            "maxmsgs",
            "maxbytes",
            "max_redelivery",
            "redelivery_delay_ms",
            "flow_control_bytes",
        ):
            if own.get(attr):
                take(attr, own[attr], False)
            else:
                values = [p[attr] for p in pv if p.get(attr)]
                if values:
                    # smallest of the parents (EMS User's Guide, "Inheritance of Properties")
                    take(attr, min(values), True)
        if "expiration_ms" in own:
            take("expiration_ms", own["expiration_ms"], False)
        else:
            exp = [p["expiration_ms"] for p in pv if "expiration_ms" in p]
            if exp:
                finite = [x for x in exp if x]
                take("expiration_ms", min(finite) if finite else 0, True)
        if "prefetch" in own:
            take("prefetch", own["prefetch"], False)
        else:
            pf = [p["prefetch"] for p in pv if "prefetch" in p]
            numeric = [x for x in pf if x is not None]
            if numeric:
                # largest in the chain (EMS User's Guide, "Destination Properties", prefetch)
                take("prefetch", max(numeric), True)
            elif pf:
                # every parent says none (EMS User's Guide, "Destination Properties", prefetch)
                take("prefetch", None, True)
        if v.get("global_") and "prefetch" in v and v["prefetch"] is None:
            # EMS User's Guide, appendix "Error and Status Messages": none is illegal for
            # global; reset
            del v["prefetch"]
            inherited.discard("prefetch")
        mine = own.get("overflow_policy", OverflowPolicy.DEFAULT)
        if mine is not OverflowPolicy.DEFAULT:
            take("overflow_policy", mine, False)
        else:
            policies = {p.get("overflow_policy") for p in pv}
            for pol in (OverflowPolicy.REJECT_INCOMING, OverflowPolicy.DISCARD_OLD):
                if pol in policies:
                    # EMS User's Guide, "Destination Properties", overflowPolicy
                    take("overflow_policy", pol, True)
                    break
        rank = {None: 0, "on": 1, "body": 2}
        best = max((p.get("trace") for p in pv), key=lambda t: rank[t], default=None)
        own_trace = own.get("trace")
        if rank[best] > rank[own_trace]:
            take("trace", best, True)
        elif own_trace is not None:
            take("trace", own_trace, False)
        for attr in ("imports", "exports"):
            names = list(own.get(attr, ()))
            n_own = len(names)
            for p in pv:
                names.extend(t for t in p.get(attr, ()) if t not in names)
            if names:
                take(attr, tuple(names), len(names) > n_own)
        for attr in ("store", "channel"):
            sources = [(own_entry or parents[0], own[attr])] if attr in own else []
            sources += [(e, e.own[attr]) for e in parents if attr in e.own]
            if not sources:
                continue
            first_entry, first = sources[0]
            for e, value in sources[1:]:
                if value != first:
                    a = first_entry.name
                    raise InvalidDestinationError(
                        f"{self.kind} {name!r} would get {EMS_NAME[attr]}={first} from {a!r} "
                        f"and {EMS_NAME[attr]}={value} from {e.name!r}; "
                        f"{EMS_NAME[attr]} is a disjoint property",
                        reason="disjoint-property",
                    )
            take(attr, first, attr not in own)
        if not v:
            return self._default
        if "prefetch" not in v:
            v["prefetch"] = DEFAULT_PREFETCH[self.kind]
        return DestinationProps(inherited=frozenset(inherited), **v)


# -- formatting ------------------------------------------------------------------------

_GB, _MB, _KB = 1024**3, 1024**2, 1024


def format_size(n: int) -> str:
    for unit, size in (("GB", _GB), ("MB", _MB), ("KB", _KB)):
        if n and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def format_duration(ms: int) -> str:
    for unit, size in (("day", 86_400_000), ("hour", 3_600_000), ("min", 60_000), ("sec", 1000)):
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}msec" if ms else "0"


def _format_prop(attr: str, value: Any) -> str:
    ems = EMS_NAME[attr]
    if value is True:
        return ems
    if attr in ("maxbytes", "flow_control_bytes"):
        return f"{ems}={format_size(value)}"
    if attr in ("expiration_ms", "redelivery_delay_ms"):
        return f"{ems}={format_duration(value)}"
    if attr == "overflow_policy":
        return f"{ems}={value.value}"
    if attr == "prefetch":
        return f"{ems}={'none' if value is None else value}"
    if attr == "trace":
        return ems if value == "on" else f"{ems}=body"
    if attr in ("imports", "exports"):
        return f'{ems}="{",".join(value)}"'
    return f"{ems}={value}"


def load_destinations(
    lines: list[SourceLine] | None, kind: Kind, errors: list[ConfigError]
) -> DestinationTable:
    """Build the table of ``kind`` from the lines of ``topics.conf`` / ``queues.conf``."""
    table = DestinationTable(kind)
    for sl in lines or ():
        entry = parse_entry(sl, kind, errors)
        if entry is not None:
            table.insert(entry, errors)
    return table
