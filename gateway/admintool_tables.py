"""``gateway admin``'s output: the admin API's JSON answers as the tables and detail views
of EMS's administration tool (TIBCO EMS User's Guide, "Using the EMS Administration Tool":
``show queues`` Table 24, ``show queue`` Table 23, ``show topics``, ``show connections``).

:func:`render` is pure: a view name (:class:`gateway.admintool_commands.Request`'s ``view``)
and the decoded answers in, text out. Tables align their columns (numbers to the right),
sizes read as ``1.2 KB``, and a temporary or dynamic destination's name has EMS's leading
``*``. The flag columns are EMS's: ``+`` where the property is set, ``-`` where it is not;
letters for properties the gateway does not have (failsafe, global, bridge, multicast) are
always ``-``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

UNITS = ("KB", "MB", "GB", "TB")
# EMS's flag columns: each letter and the property it shows (None: not in the gateway)
QUEUE_FLAGS = (("S", "secure"), ("N", "sender_name"), ("F", None), ("G", None),
               ("X", "exclusive"), ("I", "imports"), ("B", None),
               ("C", "flow_control_bytes"), ("T", "trace"))
TOPIC_FLAGS = (("S", "secure"), ("N", "sender_name"), ("F", None), ("G", None),
               ("E", "exports"), ("I", "imports"), ("B", None),
               ("C", "flow_control_bytes"), ("T", "trace"), ("M", None))
SIZE_KEYS = ("bytes", "memory", "max_msg_memory", "maxbytes", "flow_control_bytes",
             "buffered")


def human_size(n: Any) -> str:
    """``512 B``, ``1.2 KB``, ``10.0 MB`` (powers of 1024, as EMS's sizes)."""
    if not isinstance(n, int | float):
        return "" if n is None else str(n)
    if abs(n) < 1024:
        return f"{int(n)} B"
    value = float(n)
    for unit in UNITS:
        value /= 1024
        if abs(value) < 1024 or unit == UNITS[-1]:
            break
    return f"{value:.1f} {unit}"


def text(value: Any) -> str:
    """A cell: ``True`` is ``yes``, a list is comma-separated, ``None`` is blank."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return ", ".join(text(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={text(v)}" for k, v in value.items())
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]],
          right: Sequence[int] = ()) -> str:
    """Columns two blanks apart, each as wide as its widest cell; ``right``: the indexes of
    the columns aligned to the right (numbers)."""
    cells = [[text(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(row: Sequence[str]) -> str:
        parts = [c.rjust(w) if i in right else c.ljust(w)
                 for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers)] + [line(r) for r in cells])


def details(pairs: Sequence[tuple[str, Any]]) -> str:
    """``Label:  value`` lines, the values aligned."""
    width = max((len(label) for label, _ in pairs), default=0) + 1
    return "\n".join(f"{label + ':':{width}}  {text(value)}".rstrip() for label, value in pairs)


def flags(props: dict[str, Any], letters: Sequence[tuple[str, str | None]]) -> str:
    return "".join("+" if key is not None and props.get(key) else "-" for _, key in letters)


def props_text(props: dict[str, Any]) -> str:
    """A destination's properties as EMS writes them: ``maxbytes=10.0 MB,secure``."""
    out = []
    for key, value in props.items():
        if value is True:
            out.append(key)
        elif isinstance(value, list):
            out.append(f'{key}="{",".join(map(str, value))}"')
        else:
            out.append(f"{key}={human_size(value) if key in SIZE_KEYS else value}")
    return ",".join(out)


def label(key: str) -> str:
    """``max_msg_memory`` -> ``Max msg memory``; ``gc.threshold`` -> ``Gc threshold``."""
    return key.replace("_", " ").replace(".", " ").capitalize()


def flatten(row: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """A row's fields as (key, value), nested objects' keys joined with a dot."""
    out: list[tuple[str, Any]] = []
    for key, value in row.items():
        if isinstance(value, dict) and value and key != "properties":
            out.extend(flatten(value, f"{prefix}{key}."))
        else:
            out.append((prefix + key, value))
    return out


def show_fields(row: dict[str, Any], first: Sequence[tuple[str, str]],
                skip: Sequence[str] = ()) -> str:
    """A detail view: the ``first`` fields (label, key) in that order, then every other
    field but ``skip``; sizes human-readable, properties as EMS writes them."""
    shown = {key for _, key in first} | set(skip)
    pairs = [(lab, row.get(key)) for lab, key in first if key in row]
    pairs += [(label(k), v) for k, v in flatten(row) if k.split(".")[0] not in shown]
    return details([(lab, _field(lab, v)) for lab, v in pairs])


def _field(lab: str, value: Any) -> Any:
    if isinstance(value, dict) and lab == "Properties":
        return props_text(value)
    if lab.lower().replace(" ", "_").endswith(SIZE_KEYS) or "size" in lab.lower():
        return human_size(value)
    return value


def _name(row: dict[str, Any], dynamic: bool) -> str:
    return ("*" if dynamic else "") + str(row.get("name", ""))


def queues(rows: list[dict[str, Any]]) -> str:
    """``show queues``: EMS's name and flags, then counts (Table 24), with the gateway's
    in-flight (delivered, not yet acknowledged) and totals beside them."""
    return table(
        ["Queue Name", "SNFGXIBCT", "Pre", "Rcvrs", "Pend Msgs", "Pend Size", "In Flight",
         "Total In", "Total Out"],
        [[_name(r, bool(r.get("temporary"))), flags(r.get("properties") or {}, QUEUE_FLAGS),
          (r.get("properties") or {}).get("prefetch"), r.get("consumers"), r.get("pending"),
          human_size(r.get("bytes", 0)), r.get("in_flight"), r.get("total_in"),
          r.get("total_out")] for r in rows],
        right=(2, 3, 4, 5, 6, 7, 8))


def topics(rows: list[dict[str, Any]]) -> str:
    return table(
        ["Topic Name", "SNFGEIBCTM", "Subs", "Total In"],
        [[_name(r, bool(r.get("temporary")) or not r.get("static", True)),
          flags(r.get("properties") or {}, TOPIC_FLAGS), r.get("subscriptions"),
          r.get("total_in")] for r in rows],
        right=(2, 3))


def durables(rows: list[dict[str, Any]]) -> str:
    return table(
        ["Durable Name", "Client ID", "Topic", "Rcvrs", "Pend Msgs", "Pend Size", "In Flight",
         "Total Out"],
        [[r.get("name"), r.get("client_id"), _topic(r.get("destination")), r.get("consumers"),
          r.get("pending"), human_size(r.get("bytes", 0)), r.get("in_flight"),
          r.get("total_out")] for r in rows],
        right=(3, 4, 5, 6, 7))


def _topic(destination: Any) -> str:
    """``topic:live.x`` -> ``live.x`` (a durable's destination)."""
    name = str(destination or "")
    return name.split(":", 1)[1] if name.startswith("topic:") else name


def connections(rows: list[dict[str, Any]]) -> str:
    return table(
        ["ID", "Type", "Protocol", "Client ID", "User", "Address", "Sess", "Buffered", "Slow"],
        [[r.get("id"), r.get("kind"), r.get("protocol"), r.get("client_id"),
          r.get("user") or "anonymous", r.get("address"), r.get("sessions"),
          human_size(r["buffered"]) if "buffered" in r else "",
          "slow" if r.get("slow") else ""] for r in rows],
        right=(6, 7))


def users(rows: list[dict[str, Any]]) -> str:
    return table(["User Name", "Password", "Groups", "Description"],
                 [[r.get("name"), "set" if r.get("has_password") else "none", r.get("groups"),
                   r.get("description")] for r in rows])


def groups(rows: list[dict[str, Any]]) -> str:
    return table(["Group Name", "Members", "Description"],
                 [[r.get("name"), r.get("members"), r.get("description")] for r in rows])


def acl(rows: list[dict[str, Any]]) -> str:
    return table(["Type", "Name", "Principal", "Permissions"],
                 [[r.get("kind"), r.get("name", ""),
                   f"user={r['user']}" if "user" in r else f"group={r.get('group')}",
                   ",".join(r.get("permissions") or ())] for r in rows])


def transports(rows: list[dict[str, Any]]) -> str:
    return table(["Transport", "Type", "State", "Imports", "Exports", "Spooled", "Last Error"],
                 [[r.get("name"), r.get("type"), r.get("state"), len(r.get("imports") or ()),
                   len(r.get("exports") or ()), r.get("spooled"), r.get("last_error")]
                  for r in rows],
                 right=(3, 4, 5))


def server(row: dict[str, Any]) -> str:
    return show_fields(row, [("Server", "name"), ("Id", "id"), ("Connections", "connections"),
                             ("Queues", "queues"), ("Topics", "topics"),
                             ("Durables", "durables"), ("Subscriptions", "subscriptions"),
                             ("Messages in", "published"), ("Messages out", "delivered"),
                             ("Message memory", "memory"),
                             ("Max msg memory", "max_msg_memory")])


def queue(row: dict[str, Any]) -> str:
    """``show queue NAME`` (Table 23): name, type, properties, receivers, pending."""
    kind = "temporary" if row.get("temporary") else "static"
    return show_fields({"type": kind, **row},
                       [("Queue", "name"), ("Type", "type"), ("Properties", "properties"),
                        ("Receivers", "consumers"), ("Pending msgs", "pending"),
                        ("Pending msgs size", "bytes"), ("In flight", "in_flight"),
                        ("Total in", "total_in"), ("Total out", "total_out")],
                       skip=("key", "destination", "temporary", "durable"))


def topic(row: dict[str, Any]) -> str:
    kind = ("temporary" if row.get("temporary")
            else "static" if row.get("static", True) else "dynamic")
    return show_fields({"type": kind, **row},
                       [("Topic", "name"), ("Type", "type"), ("Properties", "properties"),
                        ("Subscriptions", "subscriptions"), ("Total in", "total_in")],
                       skip=("static", "temporary"))


def transport(row: dict[str, Any]) -> str:
    imports = row.get("imports") or {}
    return show_fields({**row, "imports": [f"{p} <- {', '.join(r)}" if r else p
                                           for p, r in imports.items()]},
                       [("Transport", "name"), ("Type", "type"), ("State", "state"),
                        ("Since", "since"), ("Last error", "last_error"),
                        ("Imports", "imports"), ("Exports", "exports")])


def config(answer: dict[str, Any]) -> str:
    """``show config``: where the configuration is, then gateway.conf's parameters."""
    params = answer.get("parameters") or {}
    where = answer.get("directory") or "(the embedded default)"
    return details([("Directory", where), ("Transports", answer.get("transports") or [])]
                   + [(str(k), v) for k, v in sorted(params.items())])


def done(message: str, answers: Sequence[Any]) -> str:
    """A change's message; a purge's says how many messages went."""
    counts = [a["purged"] for a in answers
              if isinstance(a, dict) and isinstance(a.get("purged"), int)]
    if not counts:
        return message
    n = sum(counts)
    return f"{message.rstrip('.')} ({n} message{'' if n == 1 else 's'})."


VIEWS: dict[str, Callable[[Any], str]] = {
    "server": server, "queues": queues, "queue": queue, "topics": topics, "topic": topic,
    "durables": durables, "connections": connections, "users": users, "groups": groups,
    "acl": acl, "transports": transports, "transport": transport, "config": config,
}


def render(view: str, answers: Sequence[Any], message: str = "") -> str:
    """The text of a command's answers: one view of the first answer, or ``message``."""
    if view == "done":
        return done(message, answers)
    return VIEWS[view](answers[0])
