"""The subscription index: which subscriptions want a message published on a name.

How this works. This is the NATS server's sublist (``server/sublist.go``) in Python: a trie
with one level per name element (TIBCO EMS User's Guide, "Destination Name Syntax"). A node
holds the literal children of the next level in a dict, and the two wildcards in dedicated
slots, so a lookup never scans: ``pwc`` is the node for ``*`` (exactly one element) and ``fwc``
the node for ``>`` (one or more trailing elements, EMS User's Guide, "Wildcards"). A
subscription sits on the node where its pattern ends. Matching a name walks the trie element by
element; at each level it takes every sub of the ``>`` node, descends into ``*`` (recursively)
and into the literal child (iteratively).

Each node keeps its subscriptions as a ready-made tuple, rebuilt on insert and remove, so the
common case -- exactly one node matched -- returns that tuple itself and allocates nothing for
the result. Only when several nodes match are the tuples merged, dropping repeats of a sub
object (first occurrence wins, order is the trie walk's). "No match" is the shared
:data:`EMPTY` tuple.

Results are cached per name in a bounded dict (as the NATS server's ``slCacheMax``). A hit is one
dict lookup. Every change to the index bumps :attr:`SubIndex.genid` and clears the cache;
a client may keep its own L1 cache keyed by name and drop it when ``genid`` moves (nats
``client.go`` ``processInboundClientMsg``). When the cache is full the older half is dropped
(insertion order; nats sweeps at random).

MQTT's ``a/#`` also matches ``a`` [MQTT-4.7.1-2]. Rather than two subscriptions (as nats does
with ``a`` and ``a.>``) a pattern ending in ``.>`` may be inserted with ``parent_match=True``:
the sub goes into a second list on the ``>`` node, which matches both the names below the
parent and the parent itself.

A pattern whose first element is a wildcard does not match a name whose first element starts
with ``$`` [MQTT-4.7.2-1]; this also keeps ``>`` and ``*.*`` subscribers off the server's
``$sys.*`` monitor topics (EMS User's Guide, "Monitoring Server Events").

Runs on the event loop; never awaits, takes no locks. Not safe to mutate from another thread.
"""

from __future__ import annotations

from itertools import islice

from gateway.subject import GT, STAR, validate

EMPTY: tuple[object, ...] = ()
"""The shared result for "nothing matched"."""

DEFAULT_CACHE_SIZE = 4096  # nats slCacheMax is 1024 per account; one index serves all of ours


class _Node:
    """One trie node: the subs whose pattern ends here and the next level.

    ``subs`` is keyed by ``id(sub)`` so a sub is found by identity, never by ``__eq__``,
    and removal is O(1) even with thousands of subs on one node. ``pm`` is used only on a
    ``>`` node: subs inserted with ``parent_match``. ``subs_t`` / ``pm_t`` / ``all_t`` are
    the matching results, rebuilt on each change.
    """

    __slots__ = ("children", "pwc", "fwc", "subs", "pm", "subs_t", "pm_t", "all_t")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.pwc: _Node | None = None
        self.fwc: _Node | None = None
        self.subs: dict[int, object] = {}
        self.pm: dict[int, object] = {}
        self.subs_t: tuple[object, ...] = EMPTY
        self.pm_t: tuple[object, ...] = EMPTY
        self.all_t: tuple[object, ...] = EMPTY

    def rebuild(self) -> None:
        self.subs_t = tuple(self.subs.values()) if self.subs else EMPTY
        self.pm_t = tuple(self.pm.values()) if self.pm else EMPTY
        if not self.pm:
            self.all_t = self.subs_t
        elif not self.subs:
            self.all_t = self.pm_t
        else:
            merged = dict(self.subs)
            merged.update(self.pm)
            self.all_t = tuple(merged.values())

    def is_empty(self) -> bool:
        return not (self.subs or self.pm or self.children or self.pwc or self.fwc)


class SubIndex:
    """A token trie of subscription patterns with a bounded match cache and a generation id.

    Args:
        cache_size: most names whose match results are cached; 0 disables the cache.
    """

    def __init__(self, cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        self._root = _Node()
        self._cache: dict[str, tuple[object, ...]] = {}
        self._cache_size = cache_size
        self._count = 0
        self._patterns: dict[str, int] = {}
        self.genid = 0

    # -- changes ------------------------------------------------------------------------

    def insert(self, pattern: str, sub: object, *, parent_match: bool = False) -> None:
        """Add ``sub`` under ``pattern``.

        Inserting the same (pattern, sub, parent_match) again changes nothing (and does not
        bump ``genid``). ``parent_match`` applies to a pattern ending in ``.>``: it then also
        matches the name without that element, as MQTT ``a/#`` matches ``a`` [MQTT-4.7.1-2].

        Raises:
            InvalidDestinationError: the pattern breaks the EMS name syntax (EMS User's Guide,
            "Destination Name Syntax").
        """
        tokens = validate(pattern, wildcards=True, system=True)
        node = self._root
        for tok in tokens:
            if tok == STAR:
                nxt = node.pwc
                if nxt is None:
                    nxt = node.pwc = _Node()
            elif tok == GT:
                nxt = node.fwc
                if nxt is None:
                    nxt = node.fwc = _Node()
            else:
                nxt = node.children.get(tok)
                if nxt is None:
                    nxt = node.children[tok] = _Node()
            node = nxt
        table = node.pm if parent_match and tokens[-1] == GT else node.subs
        key = id(sub)
        if key in table:
            return
        table[key] = sub
        node.rebuild()
        self._count += 1
        self._patterns[pattern] = self._patterns.get(pattern, 0) + 1
        self._changed()

    def remove(self, pattern: str, sub: object, *, parent_match: bool = False) -> bool:
        """Remove ``sub`` from ``pattern``; False if it was not there. Empty nodes are pruned."""
        tokens = pattern.split(".")
        node = self._root
        path: list[tuple[_Node, str]] = []
        for tok in tokens:
            if tok == STAR:
                nxt = node.pwc
            elif tok == GT:
                nxt = node.fwc
            else:
                nxt = node.children.get(tok)
            if nxt is None:
                return False
            path.append((node, tok))
            node = nxt
        table = node.pm if parent_match and tokens[-1] == GT else node.subs
        if table.pop(id(sub), None) is None:
            return False
        node.rebuild()
        for parent, tok in reversed(path):
            if not node.is_empty():
                break
            if tok == STAR:
                parent.pwc = None
            elif tok == GT:
                parent.fwc = None
            else:
                del parent.children[tok]
            node = parent
        self._count -= 1
        left = self._patterns[pattern] - 1
        if left:
            self._patterns[pattern] = left
        else:
            del self._patterns[pattern]
        self._changed()
        return True

    def _changed(self) -> None:
        self.genid += 1
        if self._cache:
            self._cache.clear()

    # -- queries ------------------------------------------------------------------------

    def match(self, subject: str) -> tuple[object, ...]:
        """Every sub whose pattern matches the literal name ``subject``, each object once.

        ``subject`` must be a valid literal name (the publish path has checked it); a
        wildcard element in it is taken literally. The result is shared: do not mutate it.
        Runs on the loop; never awaits.
        """
        r = self._cache.get(subject)
        if r is not None:
            return r
        toks = subject.split(".")
        n = len(toks)
        out: list[tuple[object, ...]] = []
        if subject[:1] == "$":
            # [MQTT-4.7.2-1]: skip the root's wildcards; only literal '$...' patterns apply.
            node = self._root.children.get(toks[0])
            if node is not None:
                if n == 1:
                    _terminal(node, out)
                else:
                    _match_level(node, toks, 1, n, out)
        else:
            _match_level(self._root, toks, 0, n, out)
        if not out:
            r = EMPTY
        elif len(out) == 1:
            r = out[0]
        else:
            merged: dict[int, object] = {}
            for t in out:
                for s in t:
                    merged[id(s)] = s
            r = tuple(merged.values())
        if self._cache_size:
            cache = self._cache
            if len(cache) >= self._cache_size:
                for key in list(islice(cache, (len(cache) + 1) // 2)):
                    del cache[key]
            cache[subject] = r
        return r

    def has_interest(self, subject_or_pattern: str) -> bool:
        """True if some sub's pattern matches a name that ``subject_or_pattern`` matches.

        For a literal name this is ``match(name) != ()``. For a pattern it is "the two
        patterns intersect" (EMS User's Guide, "Implications of Wildcards on Permissions"),
        with the ``$`` rule applied to both sides. Transports use it to import a topic only
        while it has subscribers (EMS User's Guide, chapter "Working With TIBCO Rendezvous",
        "Import Only when Subscribers Exist").
        """
        toks = subject_or_pattern.split(".")
        if STAR not in toks and GT not in toks:
            return len(self.match(subject_or_pattern)) > 0
        return _interest(self._root, toks, 0, len(toks), True)

    def __len__(self) -> int:
        """The number of (pattern, sub) insertions held."""
        return self._count

    def patterns(self) -> list[str]:
        """The distinct patterns that have at least one sub, in first-insertion order."""
        return list(self._patterns)

    def cache_len(self) -> int:
        """Names currently cached (for tests and metrics)."""
        return len(self._cache)


def _terminal(node: _Node, out: list[tuple[object, ...]]) -> None:
    """Collect what matches a name that ends at ``node``."""
    if node.subs_t:
        out.append(node.subs_t)
    fwc = node.fwc
    if fwc is not None and fwc.pm_t:
        out.append(fwc.pm_t)


def _match_level(
    node: _Node, toks: list[str], i: int, n: int, out: list[tuple[object, ...]]
) -> None:
    """Collect the matches of ``toks[i:]`` below ``node`` (``i < n``); nats ``matchLevel``."""
    while True:
        fwc = node.fwc
        if fwc is not None:
            out.append(fwc.all_t)  # '>' takes the one or more elements left
        pwc = node.pwc
        tok = toks[i]
        i += 1
        if i == n:  # the name ends on the next level: _terminal(), inlined
            if pwc is not None:
                if pwc.subs_t:
                    out.append(pwc.subs_t)
                fwc = pwc.fwc
                if fwc is not None and fwc.pm_t:
                    out.append(fwc.pm_t)
            nxt = node.children.get(tok)
            if nxt is not None:
                if nxt.subs_t:
                    out.append(nxt.subs_t)
                fwc = nxt.fwc
                if fwc is not None and fwc.pm_t:
                    out.append(fwc.pm_t)
            return
        if pwc is not None:
            _match_level(pwc, toks, i, n, out)
        nxt = node.children.get(tok)
        if nxt is None:
            return
        node = nxt


def _has_terminal(node: _Node) -> bool:
    fwc = node.fwc
    return bool(node.subs_t) or (fwc is not None and bool(fwc.pm_t))


def _interest(node: _Node, toks: list[str], i: int, n: int, root: bool) -> bool:
    """True if some pattern stored below ``node`` intersects ``toks[i:]`` (``i < n``).

    Relies on pruning: every node in the trie leads to at least one sub.
    """
    tok = toks[i]
    i += 1
    last = i == n
    wild = tok == STAR or tok == GT
    if root and not wild and tok[:1] == "$":
        # A literal '$...' first element: the root's '*' and '>' do not apply.
        nxt = node.children.get(tok)
        if nxt is None:
            return False
        return _has_terminal(nxt) if last else _interest(nxt, toks, i, n, False)
    if node.fwc is not None:
        return True  # '>' meets the one or more elements this side still needs
    if tok == GT:
        if node.pwc is not None:
            return True
        if root:
            return any(k[:1] != "$" for k in node.children)
        return bool(node.children)
    if tok == STAR:
        candidates: list[_Node] = [
            c for k, c in node.children.items() if not (root and k[:1] == "$")
        ]
    else:
        lit = node.children.get(tok)
        candidates = [lit] if lit is not None else []
    if node.pwc is not None:
        candidates.append(node.pwc)
    for c in candidates:
        if _has_terminal(c) if last else _interest(c, toks, i, n, False):
            return True
    return False
