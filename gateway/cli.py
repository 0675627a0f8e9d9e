"""The ``gateway`` command.

``gateway serve [--config-dir DIR]`` runs the gateway (on its embedded default when no
directory is given); ``gateway check-config DIR`` reports every bad line and exits 1 if
there is one; ``gateway passwd`` prints a hashed password for ``users.conf``;
``gateway rv listen|send|request|route ...`` are the RV-style bus's tools (``transports.rv.cli``,
loaded by name at run time: the core imports no transport); ``gateway reconcile LOGDIR...
--out DIR`` runs the reconciliation job on delivery logs (``spark.cli``, imported only when
the subcommand runs: the gateway never loads pyspark otherwise); ``gateway admin
[-server URL] [-user NAME] [-password PW] [-script FILE]`` is the administration shell
(``gateway.admintool``, EMS's ``tibemsadmin``).
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import sys
from typing import Any

from gateway.errors import ConfigError, ConfigErrors, GatewayError
from gateway.logconf import LEVELS, configure


def _build() -> str:
    """Which build runs: "compiled" when the modules of setup.py's COMPILED list are mypyc's
    extension modules (gateway.message is one), "pure Python" otherwise (README "The
    compiled build"); found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("gateway.message")
    origin = spec.origin if spec is not None else None
    return "pure Python" if origin is None or origin.endswith(".py") else "compiled"


def main(argv: list[str] | None = None) -> int:
    from gateway import __version__

    parser = argparse.ArgumentParser(
        prog="gateway",
        description="A protocol gateway between messaging systems: MQTT, AMQP 1.0 and STOMP "
                    "clients and brokers through one JMS-style core broker.")
    parser.add_argument("--version", action="version",
                        version=f"gateway {__version__} ({_build()})")
    parser.add_argument("--log-level", default=None,
                        help="DEBUG, INFO, WARNING or ERROR (serve: overrides log_level in "
                             "gateway.conf; default INFO)")
    sub = parser.add_subparsers(dest="command", required=True)
    p_serve = sub.add_parser("serve", help="run the gateway")
    p_serve.add_argument("--config-dir", default=None,
                         help="configuration directory (default: the embedded default)")
    p_check = sub.add_parser("check-config", help="validate a configuration directory")
    p_check.add_argument("config_dir")
    sub.add_parser("passwd", help="hash a password for users.conf (reads it from stdin)")
    p_rv = sub.add_parser("rv", add_help=False,
                          help="RV-style bus tools: listen, send, request, route ('rv -h')")
    p_rv.add_argument("rv_args", nargs=argparse.REMAINDER)
    p_rec = sub.add_parser("reconcile", add_help=False,
                           help="verdicts from delivery logs, with Spark ('reconcile -h'; "
                                "needs gateway[spark])")
    p_rec.add_argument("reconcile_args", nargs=argparse.REMAINDER)
    p_admin = sub.add_parser("admin", add_help=False,
                             help="the administration shell, as EMS's tibemsadmin "
                                  "('admin -help')")
    p_admin.add_argument("admin_args", nargs=argparse.REMAINDER)
    # ``rv``'s arguments belong to transports.rv.cli (its own -h too): pass on what is left
    args, rest = parser.parse_known_args(argv)
    if rest and args.command not in ("rv", "reconcile", "admin"):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "reconcile":
        # Everything after the subcommand, in its order (REMAINDER would leave an option
        # that comes first among ``rest``): spark.cli parses it, and checks for pyspark.
        # Before the logging set-up: py4j would log every connection at INFO.
        given = sys.argv[1:] if argv is None else argv
        from spark.cli import main as reconcile_main

        return int(reconcile_main(given[given.index("reconcile") + 1:]))
    if args.command == "admin":
        # its options are tibemsadmin's (-server, -user): gateway.admintool parses them
        given = sys.argv[1:] if argv is None else argv
        from gateway.admintool import main as admin_main

        return admin_main(given[given.index("admin") + 1:])
    if args.log_level is not None and str(args.log_level).lower() not in LEVELS:
        parser.error(f"--log-level: {args.log_level!r} is not one of {', '.join(LEVELS)}")
    if args.command == "serve":
        # gateway.conf's log_level and log_format, read before anything logs
        from gateway.config import load_config

        try:
            config = load_config(args.config_dir)
        except (ConfigError, ConfigErrors) as exc:
            configure(args.log_level or "info")
            print(f"gateway: configuration errors, not starting:\n{exc}", file=sys.stderr)
            return 2
        configure(args.log_level or config.gateway.log_level, config.gateway.log_format)
        return _serve(args.config_dir, config)
    configure(args.log_level or "info")
    if args.command == "rv":
        from gateway.registry import NotAvailableError, import_string

        try:
            rv_main = import_string("transports.rv.cli:main")
        except NotAvailableError as exc:
            print(f"gateway: {exc}", file=sys.stderr)
            return 2
        return int(rv_main(args.rv_args + rest))
    if args.command == "check-config":
        from gateway.config import load_config

        try:
            config = load_config(args.config_dir)
        except (ConfigError, ConfigErrors) as exc:
            print(str(exc), file=sys.stderr)
            return 1
        for w in config.warnings:
            print(f"warning: {w}", file=sys.stderr)
        print("configuration is valid")
        return 0
    if args.command == "passwd":
        from gateway.config import hash_password

        if sys.stdin.isatty():
            password = getpass.getpass("password: ")
        else:
            password = sys.stdin.readline().rstrip("\n")
        print(hash_password(password))
        return 0
    return 2  # pragma: no cover


def _serve(config_dir: str | None, config: Any) -> int:
    """``gateway serve`` on a loaded configuration; the exit status."""
    from gateway.server import serve

    runner: Any = asyncio.run
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is optional
        pass
    try:
        return int(runner(serve(config_dir, config)))
    except (ConfigError, ConfigErrors) as exc:
        print(f"gateway: configuration errors, not starting:\n{exc}", file=sys.stderr)
        return 2
    except (OSError, GatewayError) as exc:
        # a port in use, a store another gateway holds, a required transport unreachable
        print(f"gateway: cannot start: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
