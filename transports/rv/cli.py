"""``gateway rv``: command-line tools for the RV-style bus, after tibrvlisten and tibrvsend.

::

    gateway rv listen  [--service S] [--network N] [--daemon D] [--ttl T] [--json]
                       [--count N] SUBJECT...
    gateway rv send    [--service S] [--network N] [--daemon D] [--ttl T]
                       SUBJECT [FIELD=VALUE...]
    gateway rv request [--service S] [--network N] [--daemon D] [--ttl T] [--json]
                       [--timeout T] SUBJECT [FIELD=VALUE...]
    gateway rv route   --name ROUTER --bus NAME SERVICE NETWORK --bus NAME SERVICE NETWORK...
                       [--forward SUBJECT...] [--interval S] [--hop-limit N] [--requery S] [--ttl T]

``listen`` prints one line per message: ``subject=..., reply=..., message={...}`` with the
readable nested form of :meth:`~transports.rv.message.Message.to_text` (types shown), or with
``--json`` one JSON object per line (:meth:`~transports.rv.message.Message.to_json`, exact
and typed). It says on standard error when it listens, and stops after ``--count`` messages
or on Ctrl-C. ``send`` builds the message from ``PATH[:TYPE]=VALUE`` arguments
(:func:`~transports.rv.msgtext.parse_field_args`; an untyped value is a STRING) and sends it.
``request`` sends it with an inbox as reply subject and prints the first reply; exit code 1
when none comes within ``--timeout`` seconds (5). ``route`` runs a router
(:mod:`transports.rv.router`) between the buses given, each by its network name (unique in
the routed network), service and network, until Ctrl-C or SIGTERM; it says
``gateway rv: routing ROUTER: NAME, NAME`` on standard error once it runs. Bad arguments
exit 2.

The gateway's own command loads this module by name, so the gateway's core never imports the
bus.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from transports.rv.message import Message
from transports.rv.msgtext import parse_field_args


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--service", default=None, help="UDP service port or name (default: 7500)")
    p.add_argument("--network", default="",
                   help='"interface;group,...;send-address" (default: broadcast on the '
                        "interface of this host's name)")
    p.add_argument("--daemon", default=None, help="recorded only: the engine is in-process")
    p.add_argument("--ttl", type=int, default=1, help="multicast TTL (0: this host only)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gateway rv",
                                     description="Listen, send and request on the RV-style bus.")
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("route", help="run a router between buses (after rvrd)")
    p.add_argument("--name", required=True, help="the router's name, unique among routers")
    p.add_argument("--bus", action="append", nargs=3, required=True,
                   metavar=("NAME", "SERVICE", "NETWORK"),
                   help="a bus to link: its network name, service and network (twice or more)")
    p.add_argument("--forward", action="append", default=[], metavar="SUBJECT",
                   help="a subject always forwarded (e.g. '_RVCM.>'); repeatable")
    p.add_argument("--interval", type=float, default=1.0,
                   help="seconds between the router's state announcements (default 1)")
    p.add_argument("--hop-limit", type=int, default=16, help="routers a message may cross")
    p.add_argument("--requery", type=float, default=60.0,
                   help="seconds between two LISTEN.QUERY on each bus (0: only at start)")
    p.add_argument("--ttl", type=int, default=1, help="multicast TTL (0: this host only)")
    p = sub.add_parser("listen", help="print messages on subjects (wildcards allowed)")
    _common(p)
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--count", type=int, default=0, help="stop after this many messages")
    p.add_argument("subjects", nargs="+", metavar="SUBJECT")
    for name, what in (("send", "send one message"),
                       ("request", "send a request and print the first reply")):
        p = sub.add_parser(name, help=what)
        _common(p)
        if name == "request":
            p.add_argument("--json", action="store_true", help="print the reply as JSON")
            p.add_argument("--timeout", type=float, default=5.0, help="seconds (default 5)")
        p.add_argument("subject", metavar="SUBJECT")
        p.add_argument("fields", nargs="*", metavar="FIELD=VALUE")
    return parser


def format_message(msg: Message, as_json: bool) -> str:
    """One line for ``msg``: its JSON form, or tibrvlisten's subject, reply and fields."""
    if as_json:
        return msg.to_json()
    return (f"subject={msg.send_subject}, reply={msg.reply_subject or ''}, "
            f"message={msg.to_text(types=True)}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.action == "route":
        return _route(args)
    # the transport layer loads sockets, threads and asyncio: only once the arguments are good
    from transports.rv.net import ParameterError
    from transports.rv.subject import SubjectError
    from transports.rv.transport import Listener, RequestTimeout, Transport, TransportError

    msg: Message | None = None
    if args.action != "listen":
        try:
            msg = parse_field_args(args.fields, Message(args.subject))
        except ValueError as exc:
            print(f"gateway rv: {exc}", file=sys.stderr)
            return 2
    try:
        transport = Transport(args.service, args.network, args.daemon, ttl=args.ttl)
    except (ParameterError, TransportError, OSError) as exc:
        print(f"gateway rv: {exc}", file=sys.stderr)
        return 2
    try:
        if args.action == "listen":
            return _listen(transport, args, Listener)
        assert msg is not None
        if args.action == "send":
            transport.send(msg)
            return 0
        try:
            reply = transport.send_request(msg, args.timeout)
        except RequestTimeout as exc:
            print(f"gateway rv: {exc}", file=sys.stderr)
            return 1
        print(format_message(reply, args.json), flush=True)
        return 0
    except (SubjectError, ValueError) as exc:
        print(f"gateway rv: {exc}", file=sys.stderr)
        return 2
    finally:
        transport.close()


def _listen(transport: Any, args: argparse.Namespace, listener_class: Any) -> int:
    from transports.rv.queue import Queue

    queue = Queue("listen")
    seen = [0]
    as_json = bool(args.json)

    def show(msg: Message, _: object) -> None:
        print(format_message(msg, as_json), flush=True)
        seen[0] += 1

    for subject in args.subjects:
        listener_class(transport, subject, show, queue=queue)
        print(f"gateway rv: listening to {subject}", file=sys.stderr, flush=True)
    try:
        while not args.count or seen[0] < args.count:
            queue.timed_dispatch(0.5)
    except KeyboardInterrupt:
        pass
    return 0


def _route(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import signal

    from transports.rv.net import ParameterError
    from transports.rv.router import Router
    from transports.rv.transport import TransportError

    logging.basicConfig(level=logging.INFO, format="gateway rv: %(message)s")
    buses = {name: (service, network) for name, service, network in args.bus}
    if len(buses) < 2 or len(buses) != len(args.bus):
        print("gateway rv: route needs two or more --bus with different names",
              file=sys.stderr)
        return 2
    try:
        router = Router(args.name, buses, forward=args.forward, interval=args.interval,
                        hop_limit=args.hop_limit, ttl=args.ttl, requery=args.requery)
    except ValueError as exc:
        print(f"gateway rv: {exc}", file=sys.stderr)
        return 2

    async def run() -> int:
        try:
            await router.start()
        except (ParameterError, TransportError, OSError) as exc:
            print(f"gateway rv: {exc}", file=sys.stderr)
            return 2
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        print(f"gateway rv: routing {args.name}: {', '.join(buses)}", file=sys.stderr,
              flush=True)
        try:
            await stop.wait()
        finally:
            await router.close()
        return 0

    return asyncio.run(run())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
