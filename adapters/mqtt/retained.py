"""Retained messages: the last retained PUBLISH per topic, kept across restarts.

How this works. A PUBLISH with the retain flag replaces the topic's retained message; one
with an empty payload clears it ([MQTT-3.3.1-5], [MQTT-3.3.1-10], [MQTT-3.3.1-11]). Each
retained message is held as one ``bytes`` record, the core's binary message encoding (the
same bytes written to the store's key-value records, namespace ``mqtt.retained``), keyed by
subject: every header, property and typed value survives a restart, and a fleet's millions
of retained topics cost a few hundred bytes each instead of a whole core message with its
strings and dictionaries. The records read at start-up are taken as they are; a record is
decoded only when a subscriber is sent it (a damaged one is dropped then).

A new subscription receives every retained message its filter matches, with the retain flag
set ([MQTT-3.3.1-6], [MQTT-3.3.1-9]); filters that start with a wildcard do not match ``$``
topics ([MQTT-4.7.2-1]). It gets them through a :class:`RetainedStream`: a cursor over the
subject names in sorted order, from which the session takes a small batch at a time, as the
client's Receive Maximum and the connection's write buffer allow, so ``#`` on a million
retained topics never builds a million-element list. The names a wildcard filter can match
share the filter's literal prefix (the elements before its first wildcard) and so lie in one
range of the sorted order, found by bisection; a filter with no wildcard is one dictionary
look-up. Names added since the sorted list was last rebuilt wait in a short unsorted list,
merged in before a wildcard stream starts or when it grows past an eighth of the index
(so each name is merged a bounded number of times on average).

A topic whose retained message changes while a stream has yet to reach it is skipped by that
stream: the subscription already exists, so the new message reaches the client as a live
delivery, and sending it again from the stream would duplicate it. Expired retained messages
(Message Expiry Interval, [MQTT-3.3.2-5]) are not sent and are cleared when a stream meets
them.

Runs on the loop; never awaits.
"""

from __future__ import annotations

import weakref
from bisect import bisect_left, bisect_right
from typing import Any

from gateway import subject
from gateway.errors import MessageFormatError
from gateway.message import Message
from gateway.serial import decode_message, encode_message

NAMESPACE = "mqtt.retained"
# Unsorted names kept before they are merged into the sorted index; the merge is linear in
# the index, so the threshold also grows with it (an eighth of the index).
MERGE_MIN = 1024
# Names a stream looks at per take, matching or not: a filter such as ``+/state`` scans the
# whole index, and one take must not hold the loop for the scan of a million names.
SCAN_PER_TAKE = 4096


class RetainedStream:
    """The retained messages one new subscription has still to receive, in subject order."""

    __slots__ = ("pattern", "prefix", "stem", "cursor", "parent", "exact", "hide_dollar",
                 "skip", "done", "__weakref__")

    def __init__(self, pattern: str, parent_match: bool) -> None:
        self.pattern = pattern
        elements = pattern.split(".")
        literal: list[str] = []
        for el in elements:
            if el == subject.STAR or el == subject.GT:
                break
            literal.append(el)
        self.exact = len(literal) == len(elements)
        # Every name the pattern matches starts with ``prefix`` ("a.b." for "a.b.>").
        self.prefix = ".".join(literal) + "." if literal and not self.exact else ""
        self.stem = pattern if self.exact else self.prefix[:-1]
        self.cursor = self.prefix  # the last name taken (no subject ends with ".")
        # MQTT's "a/#" also matches "a" itself: taken first, by look-up.
        self.parent: str | None = (
            pattern[:-2] if parent_match and pattern.endswith(".>") else None)
        self.hide_dollar = not literal  # [MQTT-4.7.2-1]
        self.skip: set[str] = set()  # changed since the stream started: sent live instead
        self.done = False

    def changed(self, name: str) -> None:
        if name.startswith(self.stem) and (name > self.cursor or name == self.parent):
            self.skip.add(name)


class RetainedStore:
    def __init__(self, store: Any, recovered: dict[str, bytes] | None = None,
                 share: Any = None) -> None:
        self.store = store
        # ``share(name, blob or None)``: on a cluster node, what tells the other nodes
        # (Core.share_record); they apply it with :meth:`apply`.
        self.share = share
        # subject → its retained message, encoded (the start-up records are kept as read).
        self.records: dict[str, bytes] = recovered if recovered is not None else {}
        self.nbytes = sum(len(blob) for blob in self.records.values())  # encoded bytes held
        self._sorted: list[str] = sorted(self.records)  # may hold cleared names (_stale)
        self._recent: list[str] = []  # added since the last merge, unsorted
        self._stale = 0
        self.streams: weakref.WeakSet[RetainedStream] = weakref.WeakSet()

    def __len__(self) -> int:
        return len(self.records)

    def set(self, name: str, msg: Message | None) -> None:
        """Retain ``msg`` for subject ``name``; ``None`` clears it."""
        blob = None if msg is None else encode_message(msg)
        if self.apply(name, blob) and self.share is not None:
            self.share(name, blob)

    def apply(self, name: str, blob: bytes | None) -> bool:
        """Retain the encoded message ``blob`` for ``name`` (``None`` clears it), as
        :meth:`set` does or as another node of a cluster did; False if nothing changed."""
        records = self.records
        if blob is None:
            old = records.pop(name, None)
            if old is None:
                return False
            self.nbytes -= len(old)
            self.store.delete_kv(NAMESPACE, name)
            self.store.commit(None)
            self._stale += 1
            if self._stale > MERGE_MIN and self._stale > len(self._sorted) >> 1:
                self._merge()
            return True
        old = records.get(name)
        new = old is None
        self.nbytes += len(blob) - (0 if old is None else len(old))
        records[name] = blob
        if new:  # after the record: a merge keeps only names that have one
            self._add_name(name)
        if self.streams:
            for stream in self.streams:
                stream.changed(name)
        self.store.put_kv(NAMESPACE, name, blob)
        self.store.commit(None)
        return True

    def get(self, name: str, now: int) -> Message | None:
        """The live retained message of ``name``, if any."""
        blob = self.records.get(name)
        return None if blob is None else self._decode(name, blob, now)

    def _decode(self, name: str, blob: bytes, now: int) -> Message | None:
        try:
            msg = decode_message(blob)
        except MessageFormatError:  # a damaged record must not stop the gateway
            self.set(name, None)
            return None
        exp = msg.expires_at or msg.expiration
        if exp and exp <= now:  # [MQTT-3.3.2-5]
            self.set(name, None)
            return None
        return msg

    # -- the name index ---------------------------------------------------------------------

    def _add_name(self, name: str) -> None:
        names = self._sorted
        if self._stale:  # cleared earlier and still in the index: in place again
            i = bisect_left(names, name)
            if i < len(names) and names[i] == name:
                self._stale -= 1
                return
        self._recent.append(name)
        if len(self._recent) > max(MERGE_MIN, len(names) >> 3):
            self._merge()

    def _merge(self) -> None:
        """Rebuild the sorted index: merge the recent names, drop cleared and repeated ones."""
        records = self.records
        merged = sorted(self._sorted + self._recent)  # two sorted runs: a linear merge
        out: list[str] = []
        prev = None
        for name in merged:
            if name != prev and name in records:
                out.append(name)
            prev = name
        self._sorted = out
        self._recent = []
        self._stale = 0

    # -- streams to new subscriptions -------------------------------------------------------

    def stream(self, pattern: str, parent_match: bool) -> RetainedStream:
        """A cursor over the retained messages the subscription pattern matches."""
        s = RetainedStream(pattern, parent_match)
        if not s.exact and self._recent:
            self._merge()
        self.streams.add(s)
        return s

    def take(self, s: RetainedStream, limit: int, now: int) -> list[Message]:
        """Up to ``limit`` more live retained messages for ``s``, in subject order.

        Fewer (even none) with ``s.done`` still false when the scan limit was reached first.
        """
        out: list[Message] = []
        if s.done:
            return out
        records = self.records
        skip = s.skip
        if s.exact or s.parent is not None:
            name = s.pattern if s.exact else s.parent
            s.parent = None
            assert name is not None
            blob = records.get(name)
            if blob is not None and name not in skip:
                msg = self._decode(name, blob, now)
                if msg is not None:
                    out.append(msg)
            if s.exact:
                self.close(s)
                return out
        names = self._sorted
        prefix, pattern, hide_dollar = s.prefix, s.pattern, s.hide_dollar
        i = bisect_right(names, s.cursor)
        end = min(len(names), i + SCAN_PER_TAKE)
        # "a.b.>" and ">" match every name in the range: no need to ask name by name.
        matches = None if pattern == prefix + subject.GT else subject.matches
        while i < end and len(out) < limit:
            name = names[i]
            i += 1
            if not name.startswith(prefix):
                self.close(s)
                break
            s.cursor = name
            blob = records.get(name)
            if blob is None or name in skip or (hide_dollar and name.startswith("$")):
                continue
            if matches is not None and not matches(pattern, name):
                continue
            msg = self._decode(name, blob, now)
            if msg is not None:
                out.append(msg)
        else:
            if i >= len(names):
                self.close(s)
        return out

    def close(self, s: RetainedStream) -> None:
        """``s`` is over (finished, or its subscription went)."""
        s.done = True
        s.skip.clear()
        self.streams.discard(s)
