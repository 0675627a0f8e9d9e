"""Retained messages: the last retained PUBLISH per topic, kept across restarts.

How this works. A PUBLISH with the retain flag replaces the topic's retained message; one
with an empty payload clears it ([MQTT-3.3.1-5], [MQTT-3.3.1-10], [MQTT-3.3.1-11]). The
messages live in memory keyed by subject and are written to the store's key-value records
(namespace ``mqtt.retained``) with the core's binary message encoding, so every header,
property and typed value survives a restart. A new subscription receives every retained
message its filter matches, with the retain flag set ([MQTT-3.3.1-6], [MQTT-3.3.1-9]);
filters that start with a wildcard do not match ``$`` topics ([MQTT-4.7.2-1]).

Runs on the loop; never awaits.
"""

from __future__ import annotations

import time
from typing import Any

from gateway import subject
from gateway.message import Message
from gateway.serial import decode_message, encode_message

NAMESPACE = "mqtt.retained"


class RetainedStore:
    def __init__(self, store: Any, recovered: dict[str, bytes] | None = None) -> None:
        self.store = store
        self.messages: dict[str, Message] = {}
        for key, blob in (recovered or {}).items():
            try:
                self.messages[key] = decode_message(blob)
            except Exception:  # a damaged record must not stop the gateway
                store.delete_kv(NAMESPACE, key)

    def __len__(self) -> int:
        return len(self.messages)

    def set(self, name: str, msg: Message | None) -> None:
        """Retain ``msg`` for subject ``name``; ``None`` clears it."""
        if msg is None:
            if self.messages.pop(name, None) is not None:
                self.store.delete_kv(NAMESPACE, name)
                self.store.commit(None)
            return
        self.messages[name] = msg
        self.store.put_kv(NAMESPACE, name, encode_message(msg))
        self.store.commit(None)

    def matching(self, pattern: str, parent_match: bool) -> list[Message]:
        """Live retained messages whose subject the subscription pattern matches."""
        now = int(time.time() * 1000)
        out = []
        wild_first = pattern.split(".", 1)[0] in (subject.STAR, subject.GT)
        expired = []
        for name, msg in self.messages.items():
            if wild_first and name.startswith("$"):
                continue
            if subject.matches(pattern, name) or (
                parent_match and pattern.endswith(".>") and name == pattern[:-2]
            ):
                exp = msg.expires_at or msg.expiration
                if exp and exp <= now:
                    expired.append(name)
                    continue
                out.append(msg)
        for name in expired:
            self.set(name, None)
        return out
