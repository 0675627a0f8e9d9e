"""Administrator changes on a cluster's node, made on every node.

On a node of a cluster, what the admin API changes in the configuration (a topic's or a
queue's definition, a user, a group and its members, a principal's permissions on a
destination) is a change of the cluster: the node that made it writes the changed record's
new state to the shared records (``Core.share_record``, namespace :data:`CONFIG_NS`, kept by
JetStream), and every node applies it to its own configuration and writes it back to its own
files, as the node that made it did (:mod:`gateway.config.writeback`). A node that was down
meanwhile applies what changed when it joins (it reads every record at start), and so does
a node that joins later, so the nodes' configurations stay the same (EMQX's cluster
configuration works this way: a change is replicated, and a node that comes back catches
up).

A record is the state a change left, not the change: applying it twice changes nothing,
and a node applies it whatever its files said before. Its key names what it holds; its
value is JSON, ``null`` fields meaning "not defined (any more)":

================================  ========================================================
``queue:<name>``, ``topic:<name>``  ``{"props": "maxmsgs=100,secure"}``; ``{"props": null}``:
                                  deleted
``user:<name>``                   ``{"password": <as stored: a hash>, "description": ...}``;
                                  ``null``: deleted
``group:<name>``                  ``{"description": ..., "members": [...]}``; ``null``:
                                  deleted
``acl:<kind>:<u|g>:<principal>:<name>``  ``{"perms": [...]}``: the permissions granted
                                  directly to the user (``u``) or group (``g``) on the
                                  destination (``admin``: none), all of them (``[]``:
                                  none)
================================  ========================================================

What stays the node's own: bearer tokens (each node issues its own), the log levels,
transports started or stopped (a transport runs on one node at a time, see
``cluster/leases.py``), and a durable subscription's purge or deletion.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from gateway import subject
from gateway.config import writeback
from gateway.errors import GatewayError
from gateway.message import Destination
from gateway.routing import is_simple

log = logging.getLogger("gateway.admin")

CONFIG_NS = "admin.config"  # the shared records' namespace of the configuration's changes


def share(broker: Any, kind: str, name: str, principal: str = "", is_group: bool = False,
          ) -> None:
    """On a cluster's node, share the state ``kind`` record ``name`` is in after an
    administrator's change here (``kind``: queue, topic, user, group, or acl with the
    ``principal`` it is for); alone, nothing."""
    if broker.cluster is None:
        return
    config = broker.config
    security = config.security
    value: Any
    if kind in ("queue", "topic"):
        key = f"{kind}:{name}"
        entry = config.table(kind).get(name)
        value = {"props": entry.props_text() if entry is not None else None}
    elif kind == "user":
        key = f"user:{name}"
        user = security.users.get(name)
        value = None if user is None else {"password": user.password,
                                           "description": user.description}
    elif kind == "group":
        key = f"group:{name}"
        group = security.groups.get(name)
        value = None if group is None else {"description": group.description,
                                            "members": list(group.members)}
    else:
        acl_kind, _, dest = name.partition(":")
        key = f"acl:{acl_kind}:{'g' if is_group else 'u'}:{principal}:{dest}"
        value = {"perms": sorted(_direct(security, acl_kind, dest or None, principal,
                                         is_group))}
    broker.share_record(CONFIG_NS, key, json.dumps(value).encode())


def install(broker: Any) -> None:
    """On a cluster's node: apply every change the cluster's records hold, then each one
    another node makes."""
    for key, value in sorted(broker.shared_records(CONFIG_NS).items()):
        apply(broker, key, value)
    broker.watch_shared(CONFIG_NS, lambda key, value: apply(broker, key, value))


def apply(broker: Any, key: str, raw: bytes | None) -> None:
    """Bring this node's configuration to the state record ``key`` holds (see the module
    docstring); a record this node cannot apply is logged and left."""
    if raw is None:  # records are not deleted, only set to "not defined"
        return
    kind, _, name = key.partition(":")
    try:
        value = json.loads(raw)
        if kind in ("queue", "topic"):
            changed = _destination(broker, kind, name, value["props"])
            what = [kind]
        elif kind == "user":
            changed = _user(broker.config.security, name, value)
            what = ["users", "groups"]
        elif kind == "group":
            changed = _group(broker.config.security, name, value)
            what = ["groups"]
        elif kind == "acl":
            acl_kind, who, rest = name.split(":", 2)
            principal, _, dest = rest.partition(":")
            changed = _acl(broker.config.security, acl_kind, dest or None, principal,
                           who == "g", value["perms"])
            what = ["acl"]
        else:
            raise ValueError(f"no such kind of record: {kind!r}")
    except (ValueError, KeyError, TypeError, AttributeError, GatewayError) as exc:
        log.error("admin: cannot apply the cluster's change %s: %s", key, exc)
        return
    if changed:
        log.warning("admin: applied another node's change of %s", key)
        for part in what:
            save(broker, part)


def save(broker: Any, what: str) -> None:
    """Write ``what`` back to the configuration directory (see gateway.config.writeback);
    a failure is logged: the change holds until the gateway stops."""
    config = broker.config
    if config.embedded:
        return
    try:
        writeback.save(config, what)
    except OSError as exc:
        log.error("admin: cannot write %s back to %s: %s", what, config.dir, exc)


# -- applying one record ---------------------------------------------------------------------


def _destination(broker: Any, kind: str, name: str, props: str | None) -> bool:
    table = broker.config.table(kind)
    entry = table.get(name)
    if props is None:
        live = broker.topics if kind == "topic" else broker.queues
        dest = live.get(name)
        if entry is None and (dest is None or getattr(dest, "consumers", None)):
            return False  # a queue with consumers here stays (as the admin API refuses)
        drop_destination(broker, kind, name)
        return entry is not None
    if entry is not None and entry.props_text() == props:
        return False
    entry = table.add(name, props, replace=True)
    bound(broker, kind, name)
    return True


def bound(broker: Any, kind: str, name: str) -> None:
    """Give what ``kind`` entry ``name`` governs its changed definition: the transports'
    bindings and the live destinations' properties."""
    entry = broker.config.table(kind).get(name)
    m = broker.transports
    if entry is not None and m is not None:
        m.bind_entry(kind, entry)
    refresh(broker, kind, name)
    if kind == "queue" and broker.cluster is not None:  # the queues' streams' limits
        broker.cluster.queue_changed(name)


def drop_destination(broker: Any, kind: str, name: str) -> None:
    """Admin ``delete topic|queue``: the definition goes, and the live destination of
    that name (a queue with its messages) unless a client made it (a temporary one)."""
    table = broker.config.table(kind)
    live = broker.topics if kind == "topic" else broker.queues
    if table.get(name) is not None:
        table.remove(name)
        save(broker, kind)
        if kind == "queue" and broker.cluster is not None:
            broker.cluster.queue_changed(name)
    dest = live.get(name)
    if dest is not None and dest.owner is None:
        if kind == "queue" and dest.consumers:
            pass  # the admin API refuses it there; another node's change leaves it
        elif kind == "queue":
            broker.delete_queue(name)
        elif table.resolve(name) is None:
            broker.topics.pop(name, None)
        else:
            refresh(broker, kind, name)
    if broker.monitor.watchers:
        broker.monitor.destination_event(
            Destination.queue(name) if kind == "queue" else Destination.topic(name),
            "delete", "admin")


def refresh(broker: Any, kind: str, pattern: str) -> None:
    """Give the live destinations a changed entry governs their new properties."""
    table = broker.config.table(kind)
    live = broker.topics if kind == "topic" else broker.queues
    for name, dest in list(live.items()):
        if name != pattern and not subject.matches(pattern, name):
            continue
        props = table.resolve(name)
        if props is None:
            continue
        dest.props = props
        if kind == "queue":
            dest.exclusive = bool(props.exclusive)
            dest.flow_limit = props.flow_control_bytes if broker.flow_control else 0
        dest.simple = is_simple(props)


def _deleted(table: dict[str, Any], name: str, remove: Any) -> bool:
    """``remove(name)`` if ``table`` has ``name``; whether it had."""
    if name not in table:
        return False
    remove(name)
    return True


def _user(security: Any, name: str, value: dict[str, Any] | None) -> bool:
    if value is None:
        return _deleted(security.users, name, security.remove_user)
    user = security.users.get(name)
    password, description = str(value["password"]), str(value["description"])
    if user is not None and (user.password, user.description) == (password, description):
        return False
    security.put_user(name, password, description)
    return True


def _group(security: Any, name: str, value: dict[str, Any] | None) -> bool:
    if value is None:
        return _deleted(security.groups, name, security.remove_group)
    group = security.groups.get(name)
    members = [str(m) for m in value["members"]]
    if group is not None and list(group.members) == members:
        return False
    if group is None:
        security.add_group(name, str(value["description"]))
    security.set_members(name, members)
    return True


def _direct(security: Any, kind: str, name: str | None, principal: str,
            is_group: bool) -> set[str]:
    """The permissions granted directly to ``principal`` on exactly ``name``."""
    perms: set[str] = set()
    for e in security.acl_entries():
        if (e.kind, e.name, e.principal, e.is_group) == (kind, name, principal, is_group):
            perms |= e.perms
    return perms


def _acl(security: Any, kind: str, name: str | None, principal: str, is_group: bool,
         perms: list[str]) -> bool:
    have = _direct(security, kind, name, principal, is_group)
    want = {str(p) for p in perms}
    if have == want:
        return False
    who = {"group": principal} if is_group else {"user": principal}
    if have - want:
        security.revoke(kind, name, sorted(have - want), **who)
    if want - have:
        security.grant(kind, name, sorted(want - have), **who)
    return True
