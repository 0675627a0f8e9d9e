"""Loading a configuration directory: every file, then the checks that span files.

How this works. :func:`load_config` reads the files of one directory (TIBCO EMS User's Guide,
"Using Other Configuration Files", adapted: ``gateway.conf`` stands for ``tibemsd.conf``)::

    gateway.conf  topics.conf  queues.conf  users.conf  groups.conf  acl.conf  transports.conf
    routers.conf

Any of them may be missing (an empty file); the directory itself must exist. With no
directory the embedded default in ``gateway/defaults/`` is used, whose relative paths
(``store = data``) resolve against the working directory rather than the package. Every
problem of every file is collected, then the cross-file checks run:

* each transport named in an ``import`` / ``export`` list exists (EMS: "ignoring transport
  '%s' in %s list, transport not found", EMS User's Guide, appendix "Error and Status Messages"
  — here an error);
* a topic and a queue of the same name do not both import (EMS User's Guide, chapter
  "Working With TIBCO Rendezvous", "Import Issues");
* JNDI names are unique across topics and queues (EMS User's Guide, appendix
  "Error and Status Messages");
* an ``http`` / ``https`` listener (the admin API) on an address other than loopback needs a
  password for the ``admin`` user in ``users.conf`` (:func:`admin_listener_problems`);
* what start would otherwise be the first to find (:mod:`gateway.config.checks`): a listener
  protocol not installed, a listener host that does not resolve, two listeners on one
  address and port, a store or delivery log directory under a file, mappings
  (``mappings/*.yaml``, compiled here and kept in :attr:`Config.mappings`) that do not
  compile, and RV-style bus parameters that name no interface of this host;

and, if anything was wrong, :class:`~gateway.errors.ConfigErrors` is raised with all of
them, in file and line order. Warnings (EMS "Configuration warning" lines) do not stop the
load; they are kept in :attr:`Config.warnings` as ``file:line: message`` strings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.config import checks
from gateway.config.destinations import DestinationEntry, DestinationTable, load_destinations
from gateway.config.files import read_lines
from gateway.config.gateway_conf import GatewaySettings, parse_gateway_conf
from gateway.config.routers import RouterDef, parse_routers
from gateway.config.security import Security, parse_acl, parse_groups, parse_users
from gateway.config.transports import TransportDef, parse_transports
from gateway.errors import ConfigError, ConfigErrors

ADMIN_SCHEMES = frozenset({"http", "https"})  # listeners that serve the admin API
DEFAULT_CONFIG_DIR = Path(__file__).resolve().parent.parent / "defaults"
CONFIG_FILES = (
    "gateway.conf",
    "topics.conf",
    "queues.conf",
    "users.conf",
    "groups.conf",
    "acl.conf",
    "transports.conf",
    "routers.conf",
)


@dataclass(slots=True)
class Config:
    """A loaded configuration. The tables and ``security`` change at run time (admin)."""

    dir: Path
    gateway: GatewaySettings
    topics: DestinationTable
    queues: DestinationTable
    security: Security
    transports: dict[str, TransportDef]
    warnings: list[str] = field(default_factory=list)
    embedded: bool = False
    routers: dict[str, RouterDef] = field(default_factory=dict)
    mappings: Any = None  # mappings.engine.MappingSet of <dir>/mappings/*.yaml, or None

    def table(self, kind: str) -> DestinationTable:
        """``topics`` or ``queues`` by kind name (``"topic"`` / ``"queue"``)."""
        return self.topics if kind == "topic" else self.queues


def load_config(config_dir: str | os.PathLike[str] | None = None) -> Config:
    """Load the configuration in ``config_dir`` (``None``: the embedded default).

    Raises:
        ConfigErrors: every problem found, each naming its file and line.
    """
    embedded = config_dir is None
    d = DEFAULT_CONFIG_DIR if config_dir is None else Path(config_dir)
    if not d.is_dir():
        what = "does not exist" if not d.exists() else "is not a directory"
        raise ConfigErrors([ConfigError(str(d), None, f"configuration directory {what}")])
    base = Path.cwd() if embedded else d
    errors: list[ConfigError] = []
    warnings: list[str] = []
    lines = {
        name: read_lines(d / name, errors, inline_comments=name != "users.conf")
        for name in CONFIG_FILES
    }
    settings = parse_gateway_conf(lines["gateway.conf"] or [], base, errors, warnings)
    topics = load_destinations(lines["topics.conf"], "topic", errors)
    queues = load_destinations(lines["queues.conf"], "queue", errors)
    for name, kind in (("topics.conf", "topic"), ("queues.conf", "queue")):
        if lines[name] is None:
            warnings.append(f"{d / name}: file not found: no {kind} can be created")
    users = parse_users(lines["users.conf"], errors)
    user_names = [u.name for u in users]
    groups = parse_groups(lines["groups.conf"], user_names, errors, warnings)
    acl = parse_acl(lines["acl.conf"], user_names, [g.name for g in groups], errors, warnings)
    section_names: set[str] = set()
    transports = parse_transports(lines["transports.conf"], base, errors, warnings, section_names)
    routers = parse_routers(lines["routers.conf"], errors)

    _check_transport_refs(topics, queues, transports, section_names, settings, errors, warnings)
    _check_import_names(topics, queues, errors)
    _check_jndi(topics, queues, errors)
    security = Security(users, groups, acl)
    conf = str(d / "gateway.conf")
    errors.extend(admin_listener_problems(settings, security, conf))
    errors.extend(checks.listener_problems(settings, conf))
    errors.extend(checks.directory_problems(settings, conf))
    errors.extend(checks.rv_problems(settings, transports.values(), routers.values(), conf))
    mappings = None if embedded else checks.load_mappings(d, errors)
    if errors:
        order = {name: i for i, name in enumerate(CONFIG_FILES)}
        last = len(CONFIG_FILES)  # mappings/*.yaml
        errors.sort(key=lambda e: (order.get(os.path.basename(e.file), last), e.line or 0))
        raise ConfigErrors(errors)
    names = frozenset(transports)
    topics.transport_names = names
    queues.transport_names = names
    return Config(
        dir=d,
        gateway=settings,
        topics=topics,
        queues=queues,
        security=security,
        transports=transports,
        warnings=warnings,
        embedded=embedded,
        routers=routers,
        mappings=mappings,
    )


def admin_listener_problems(
    settings: GatewaySettings, security: Security, conf: str
) -> list[ConfigError]:
    """The admin API may be reachable beyond this host only if ``admin`` has a password.

    The predefined ``admin`` user holds every administrator permission and has no password
    until ``users.conf`` gives it one (EMS User's Guide, "Predefined Administrative User and
    Group"); on loopback only this host can use that, on any other address anyone who
    reaches the port could purge a queue. One error per such ``listen`` line of ``conf``.
    """
    if security.admin_has_password():
        return []
    return [
        ConfigError(
            conf,
            lst.line,
            f"listen {lst.url()}: the admin API would be reachable beyond this host while "
            f"the 'admin' user has no password; give it one in users.conf "
            f"(admin:password, see 'gateway passwd') or listen on 127.0.0.1",
        )
        for lst in settings.listen
        if lst.scheme in ADMIN_SCHEMES and not lst.loopback
    ]


def _check_transport_refs(
    topics: DestinationTable,
    queues: DestinationTable,
    transports: dict[str, TransportDef],
    section_names: set[str],
    settings: GatewaySettings,
    errors: list[ConfigError],
    warnings: list[str],
) -> None:
    used: set[str] = set()
    for entry in topics.entries() + queues.entries():
        for msg in DestinationTable.transport_problems(entry, section_names):
            errors.append(ConfigError(entry.file, entry.line, msg))
        used.update(entry.own.get("imports", ()))
        used.update(entry.own.get("exports", ()))
    for t in transports.values():
        if t.name not in used:
            warnings.append(
                f"{t.where()}: transport {t.name!r} is not named in any import or export list"
            )
        elif not settings.transports_enabled(t.type):
            warnings.append(
                f"{t.where()}: transport {t.name!r} will not run: "
                f"{t.type}_transports is disabled in gateway.conf"
            )


def _check_import_names(
    topics: DestinationTable, queues: DestinationTable, errors: list[ConfigError]
) -> None:
    """EMS User's Guide, chapter "Working With TIBCO Rendezvous", "Import Issues": a topic and
    a queue of one name may not both import."""
    for q in queues.entries():
        t = topics.get(q.name)
        if t is not None and t.own.get("imports") and q.own.get("imports"):
            errors.append(
                ConfigError(
                    q.file,
                    q.line,
                    f"queue {q.name!r} and topic {q.name!r} ({t.where()}) both import; "
                    "imported destination names must be unique",
                )
            )


def _check_jndi(
    topics: DestinationTable, queues: DestinationTable, errors: list[ConfigError]
) -> None:
    seen: dict[str, DestinationEntry] = {}
    for e in topics.entries() + queues.entries():
        for j in e.jndi_names:
            first = seen.get(j)
            if first is not None:
                errors.append(
                    ConfigError(
                        e.file,
                        e.line,
                        f"JNDI name {j!r} is already used by {first.kind} {first.name!r} "
                        f"at {first.where()}",
                    )
                )
            else:
                seen[j] = e
