"""Subject names of the RV-style bus: their syntax, their limits, and a wildcard matcher.

How this works. A subject is a string of elements separated by ``.``; a dot cannot be escaped
and no element may be empty (TIBCO Rendezvous Concepts, Fundamentals, Subject Names, "Subject
Name Syntax", Tables 10 and 11). Lengths are counted in UTF-8 bytes, as Rendezvous counts them
in C (``TIBRV_SUBJECT_MAX`` = 255): at most 255 bytes in all, at most 127 per element, and a
subject that a program *sends* has at most 196 minus its number of elements (the difference
is headroom the bus keeps for annotating subjects on the way, for example when a router
rewrites a reply subject). ``*`` as a whole element matches exactly one element and ``>`` as
the last element matches one or more trailing elements; both are for listening ("Using
Wildcards to Receive Related Subjects", Tables 13 and 14). A first element starting with ``_``
is reserved ("Distinguished Subject Names with Special Meaning", Table 15): programs may send
to ``_INBOX.`` (point-to-point) and ``_LOCAL.`` (this process only) but not to ``_RV.``
(advisories) or any other ``_`` name; they may listen to all of them. Matching is case-sensitive.

The two validators return the subject's elements, so a caller that needs them splits once.

:class:`SubjectMatcher` is the receive side's lookup: a trie with one level per element, a
dict for literal children and dedicated slots for ``*`` and ``>``, so a lookup never scans
(the same structure as the gateway core's subscription index, kept self-contained here so the
bus imports nothing of the core). A lookup returns the *multiset* of listeners: a listener
added twice, or two listeners on one subject, gives two entries, and so two deliveries
(TIBCO Rendezvous Concepts, Events, "Listener Event Semantics": two listeners on one subject
make two events per message). Results are cached per subject string in a bounded dict; every
change bumps :attr:`SubjectMatcher.genid` and clears the cache, so a hit is one dict lookup
and a caller may keep its own cache keyed by ``genid``.

Runs on the caller's thread; never blocks. A matcher is not safe to change from two threads.
"""

from __future__ import annotations

from itertools import islice

MAX_SUBJECT = 255
"""Most UTF-8 bytes in a subject, dots included (Subject Names, "Subject Name Syntax")."""
MAX_RECEIVE = 196
"""Longest subject most programs can receive (Subject Names, "Subject Name Syntax")."""
MAX_ELEMENT = 127
"""Most UTF-8 bytes in one element (Subject Names, "Subject Name Syntax")."""

STAR = "*"
GT = ">"
INBOX_PREFIX = "_INBOX."
LOCAL_PREFIX = "_LOCAL."
ADVISORY_PREFIX = "_RV."
_SENDABLE_RESERVED = ("_INBOX", "_LOCAL")

DEFAULT_CACHE_SIZE = 4096  # subjects whose match results are kept; the core's index uses the same


class SubjectError(ValueError):
    """A subject breaks a rule of TIBCO Rendezvous Concepts, Subject Names (the message says
    which)."""


def _elements(subject: str) -> list[str]:
    """The rules every subject keeps; returns its elements."""
    if not isinstance(subject, str):
        raise SubjectError(f"a subject is a string, not {type(subject).__name__}")
    if not subject:
        raise SubjectError("the empty string is not a legal subject (Subject Names, Table 11)")
    try:
        size = len(subject.encode("utf-8"))
    except UnicodeEncodeError:
        raise SubjectError("a subject must be encodable in UTF-8 (it has a lone surrogate)"
                           ) from None
    if size > MAX_SUBJECT:
        raise SubjectError(f"subject is {size} bytes; at most {MAX_SUBJECT} "
                           "(Subject Names, Subject Name Syntax)")
    if "\0" in subject:
        raise SubjectError("a subject may not contain a NUL character")
    elements = subject.split(".")
    for e in elements:
        if not e:
            raise SubjectError(f"{subject!r} has an empty element (Subject Names, Table 11)")
        if len(e) > MAX_ELEMENT // 4 and len(e.encode("utf-8")) > MAX_ELEMENT:
            raise SubjectError(f"element {e[:20]!r}... is longer than {MAX_ELEMENT} bytes "
                               "(Subject Names, Subject Name Syntax)")
        if (STAR in e or GT in e) and e != STAR and e != GT:
            raise SubjectError(f"in {subject!r}, '*' and '>' must be whole elements "
                               "(Subject Names, Table 14)")
    return elements


def validate_listen_subject(subject: str) -> list[str]:
    """Check a subject a program listens to and return its elements.

    ``*`` and ``>`` must be whole elements, ``>`` only the last one (TIBCO Rendezvous Concepts,
    Subject Names, "Using Wildcards to Receive Related Subjects", Table 14); an inbox name
    takes no wildcard ("Distinguished Subject Names with Special Meaning", Table 15). Reserved
    ``_`` subjects may be listened to.

    Raises:
        SubjectError: naming the rule broken.
    """
    elements = _elements(subject)
    for e in elements[:-1]:
        if e == GT:
            raise SubjectError(f"in {subject!r}, '>' may only be the last element "
                               "(Subject Names, Table 14)")
    if elements[0] == "_INBOX" and (STAR in elements or GT in elements):
        raise SubjectError(f"{subject!r}: an inbox name cannot contain wildcards "
                           "(Subject Names, Table 15)")
    return elements


def validate_send_subject(subject: str, *, allow_internal: bool = False,
                          allow_wildcard: bool = True) -> list[str]:
    """Check a subject a program sends to and return its elements.

    Beyond the common rules: at most 196 minus the number of elements bytes (TIBCO Rendezvous
    Concepts, Subject Names, "Subject Name Syntax"); a reserved first element (``_``) only
    ``_INBOX`` or ``_LOCAL`` followed by more elements, unless ``allow_internal`` (the bus's
    own advisories and administrative subjects, "Distinguished Subject Names with Special
    Meaning", Table 15).
    Sending to a wildcard subject is legal but not recommended; certified and
    distributed-queue sends forbid it (Subject Names, "Wildcard Sending"): pass
    ``allow_wildcard=False`` for those. ``>`` may only be the last element even when sent.

    Raises:
        SubjectError: naming the rule broken.
    """
    elements = validate_listen_subject(subject) if allow_wildcard else _elements(subject)
    n = len(elements)
    limit = MAX_RECEIVE - n
    if len(subject) > limit // 4 and len(subject.encode("utf-8")) > limit:
        raise SubjectError(f"a sent subject of {n} elements has at most {limit} bytes "
                           "(196 minus the number of elements; Subject Names, Subject Name "
                           "Syntax)")
    if not allow_wildcard and (STAR in elements or GT in elements):
        raise SubjectError(f"{subject!r}: wildcards are not allowed in this send "
                           "(Subject Names, Using Wildcards to Receive Related Subjects)")
    first = elements[0]
    if first[0] == "_" and not allow_internal:
        if first not in _SENDABLE_RESERVED:
            raise SubjectError(f"{subject!r}: programs may not send to reserved subjects "
                               "other than _INBOX. and _LOCAL. (Subject Names, "
                               "Table 15)")
        if n == 1:
            raise SubjectError(f"{subject!r}: {first} must be followed by more elements "
                               "(Subject Names, Table 15)")
    return elements


def is_wildcard(subject: str) -> bool:
    """True if ``subject`` has a ``*`` or ``>`` element."""
    for e in subject.split("."):
        if e == STAR or e == GT:
            return True
    return False


def matches(pattern: str, subject: str) -> bool:
    """Does listen subject ``pattern`` (``*`` and ``>`` as in :class:`SubjectMatcher`) match
    the received ``subject``? For one pattern; many listeners use a matcher."""
    want, have = pattern.split("."), subject.split(".")
    for i, element in enumerate(want):
        if element == GT:
            return len(have) > i
        if i >= len(have) or (element != STAR and element != have[i]):
            return False
    return len(have) == len(want)


_EMPTY: tuple[object, ...] = ()


class _Node:
    """One trie level: the listeners whose subject ends here, and the next level."""

    __slots__ = ("children", "star", "gt", "listeners", "result")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.star: _Node | None = None
        self.gt: _Node | None = None
        self.listeners: list[object] = []
        self.result: tuple[object, ...] = _EMPTY

    def is_empty(self) -> bool:
        return not (self.listeners or self.children or self.star or self.gt)


class SubjectMatcher:
    """Listeners by subject, with ``*``/``>`` wildcards, returning every match's listeners.

    Args:
        cache_size: most subjects whose results are cached; 0 turns the cache off.
    """

    def __init__(self, cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        self._root = _Node()
        self._cache: dict[str, tuple[object, ...]] = {}
        self._cache_size = cache_size
        self._count = 0
        self.genid = 0
        """Bumped by every add and remove."""

    def add(self, subject: str, listener: object) -> None:
        """Add ``listener`` on ``subject`` (a listen subject; wildcards allowed).

        Adding the same listener again on the same subject adds a second entry: it is then
        matched twice.

        Raises:
            SubjectError: the subject breaks the listen rules (:func:`validate_listen_subject`).
        """
        node = self._root
        for e in validate_listen_subject(subject):
            if e == STAR:
                nxt = node.star
                if nxt is None:
                    nxt = node.star = _Node()
            elif e == GT:
                nxt = node.gt
                if nxt is None:
                    nxt = node.gt = _Node()
            else:
                nxt = node.children.get(e)
                if nxt is None:
                    nxt = node.children[e] = _Node()
            node = nxt
        node.listeners.append(listener)
        node.result = tuple(node.listeners)
        self._count += 1
        self._changed()

    def remove(self, subject: str, listener: object) -> bool:
        """Remove one entry of ``listener`` (found by identity) on ``subject``.

        Returns False if there was none. Emptied trie nodes are pruned.
        """
        node = self._root
        path: list[tuple[_Node, str]] = []
        for e in subject.split("."):
            if e == STAR:
                nxt = node.star
            elif e == GT:
                nxt = node.gt
            else:
                nxt = node.children.get(e)
            if nxt is None:
                return False
            path.append((node, e))
            node = nxt
        for i, x in enumerate(node.listeners):
            if x is listener:
                del node.listeners[i]
                break
        else:
            return False
        node.result = tuple(node.listeners)
        for parent, e in reversed(path):
            if not node.is_empty():
                break
            if e == STAR:
                parent.star = None
            elif e == GT:
                parent.gt = None
            else:
                del parent.children[e]
            node = parent
        self._count -= 1
        self._changed()
        return True

    def _changed(self) -> None:
        self.genid += 1
        if self._cache:
            self._cache.clear()

    def match(self, subject: str) -> tuple[object, ...]:
        """Every listener whose subject matches the literal ``subject``, with repeats.

        ``subject`` is taken as received: an element ``*`` in it is an ordinary element (it
        matches listeners on ``*`` and ``>`` only). The result is shared; do not change it.
        Order: the trie walk's (``>`` listeners of a level, then ``*`` branch, then literal).
        """
        r = self._cache.get(subject)
        if r is not None:
            return r
        out: list[tuple[object, ...]] = []
        _match(self._root, subject.split("."), 0, out)
        if not out:
            r = _EMPTY
        elif len(out) == 1:
            r = out[0]
        else:
            r = tuple(x for t in out for x in t)
        if self._cache_size:
            cache = self._cache
            if len(cache) >= self._cache_size:
                for key in list(islice(cache, (len(cache) + 1) // 2)):
                    del cache[key]
            cache[subject] = r
        return r

    def __len__(self) -> int:
        """The number of (subject, listener) entries."""
        return self._count

    def cache_len(self) -> int:
        """Subjects whose results are cached now."""
        return len(self._cache)


def _match(node: _Node, elements: list[str], i: int, out: list[tuple[object, ...]]) -> None:
    """Collect into ``out`` the results of every node matching ``elements[i:]`` below ``node``."""
    n = len(elements)
    while True:
        gt = node.gt
        if gt is not None and gt.result:
            out.append(gt.result)  # '>' takes the rest: at least elements[i], which exists
        star = node.star
        if star is not None:
            if i + 1 == n:
                if star.result:
                    out.append(star.result)
            else:
                _match(star, elements, i + 1, out)
        nxt = node.children.get(elements[i])
        if nxt is None:
            return
        i += 1
        if i == n:
            if nxt.result:
                out.append(nxt.result)
            return
        node = nxt
