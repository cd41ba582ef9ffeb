"""The `dcpflow` command line. Each subcommand lives in the module that owns its job; this file
only parses arguments and wires them up."""

import argparse
import json
import sys


def _cmd_inspect(args: argparse.Namespace) -> int:
    from .inspect import inspect_bytes, parse_hex

    if args.file in (None, "-"):
        text = sys.stdin.read()
    else:
        with open(args.file, encoding="utf-8") as fh:
            text = fh.read()
    try:
        data = parse_hex(text)
    except ValueError as e:
        print(f"dcpflow inspect: {e}", file=sys.stderr)
        return 2
    if not data:
        print("dcpflow inspect: no hex bytes in the input", file=sys.stderr)
        return 2
    frames = inspect_bytes(data)
    for item in frames:
        print(json.dumps(item, indent=2 if args.pretty else None, sort_keys=False))
    return 1 if args.strict and any(f["problems"] for f in frames) else 0


def _cmd_server(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import signal
    import ssl

    from .server import Server, ServerConfig

    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = ServerConfig(data_dir=args.data_dir, host=args.host, port=args.port,
                          buckets=tuple(args.bucket or ("default",)), num_vbuckets=args.vbuckets,
                          conflict_resolution=args.conflict_resolution, flush_interval=args.flush_interval,
                          flusher_nice=args.flusher_nice,
                          purge_interval=args.purge_interval, compaction_interval=args.compaction_interval,
                          expiry_interval=args.expiry_interval, users=args.users, debug=args.debug,
                          tls_cert=args.tls_cert, tls_key=args.tls_key, tls_port=args.tls_port,
                          plain_over_tcp=args.allow_plain_over_tcp, mgmt_port=args.mgmt_port,
                          mgmt_tls_port=args.mgmt_tls_port, audit_log=args.audit_log,
                          max_connections=args.max_connections, system_connections=args.system_connections,
                          mgmt_max_connections=args.mgmt_max_connections, auth_timeout=args.auth_timeout,
                          http_idle_timeout=args.http_idle_timeout, login_failures=args.login_failures,
                          login_lockout=args.login_lockout, memory_quota=args.memory_quota,
                          eviction_policy=args.eviction_policy,
                          fragmentation_threshold=args.fragmentation_threshold / 100 or None)
    if (args.tls_cert is None) != (args.tls_key is None):
        print("dcpflow server: --tls-cert and --tls-key go together", file=sys.stderr)
        return 2
    _raise_descriptor_limit()

    async def serve() -> int:
        server = Server(config)
        try:
            await server.start()
        except (OSError, ValueError, ssl.SSLError) as e:
            print(f"dcpflow server: cannot start: {e}", file=sys.stderr)
            return 1
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        tls = f" tls_port={server.tls_port}" if server.tls_port is not None else ""
        mgmt_tls = f" mgmt_tls_port={server.mgmt.tls_port}" if server.mgmt.tls_port is not None else ""
        print(f"dcpflow server ready: host={config.host} port={server.port}{tls} mgmt_port={server.mgmt.port}"
              f"{mgmt_tls} buckets={','.join(server.buckets)} data_dir={config.data_dir}", flush=True)
        await stop.wait()
        await server.close()
        return 0

    if args.loop != "asyncio":
        try:
            import uvloop
        except ImportError:
            if args.loop == "uvloop":
                print("dcpflow server: --loop uvloop needs `pip install uvloop` (the `fast` extra)", file=sys.stderr)
                return 2
        else:
            return uvloop.run(serve())
    return asyncio.run(serve())


def _raise_descriptor_limit() -> None:
    """Use the hard limit on open files, as memcached does at start: every connection is one, and
    the connection limit is derived from it (server/app.py connection_limit)."""
    import contextlib
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        with contextlib.suppress(OSError, ValueError):  # else kept: the connection limit follows the soft one
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))


def _positive(text: str) -> float:
    """Seconds as the timeouts take them: a number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be above 0")
    return value


_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int | None:
    """A size as `--memory-quota` takes it: bytes, or with a k/m/g/t suffix (powers of 1024, an
    optional trailing "b" or "ib"); `unlimited` for none."""
    t = text.strip().lower()
    if t in ("unlimited", "none"):
        return None
    for suffix in ("ib", "b"):
        if t.endswith(suffix) and t[:-len(suffix)][-1:].isalpha():
            t = t[:-len(suffix)]
            break
    unit = t[-1:] if t[-1:].isalpha() else ""
    try:
        value = float(t[:-1] if unit else t) * _SIZE_UNITS[unit]
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (bytes, or with k, m, g, t: e.g. 100m, 1g)") from None
    if value < 1 << 20:
        raise argparse.ArgumentTypeError(f"{text!r} is less than 1 MiB")
    return int(value)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dcpflow", description="Couchbase DCP end to end: protocol tools, "
                                     "server, client and the Spark CDC pipeline.")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_inspect_command(sub)
    _add_server_command(sub)

    from .load import add_command as add_load_command
    from .spark.commands import add_commands as add_spark_commands
    add_load_command(sub)
    add_spark_commands(sub)

    from .client.tail import add_command as add_tail_command
    add_tail_command(sub)

    from .replication.commands import add_command as add_cluster_command
    add_cluster_command(sub)

    from .replication.xdcr.command import add_command as add_xdcr_command
    add_xdcr_command(sub)

    from .fault import add_command as add_fault_command
    add_fault_command(sub)

    from .collections_cli import add_command as add_collections_command
    add_collections_command(sub)
    return parser


def _add_inspect_command(sub) -> None:
    p = sub.add_parser("inspect", help="decode hex frames (stdin or a file) into JSON, one object per frame",
                       description="Decode memcached-binary/DCP frames from hex. Whitespace, 0x prefixes, "
                       "commas and # comments are ignored; packet tables pasted from KV-Engine's docs (Byte/ "
                       "header, +---+ rules, offset| rows) are read as printed. Each frame prints as one JSON "
                       "object with every header field, the decoded body and a list of the rules it breaks.")
    p.add_argument("file", nargs="?", help="file with hex (default: stdin)")
    p.add_argument("--pretty", action="store_true", help="indent the JSON")
    p.add_argument("--strict", action="store_true", help="exit 1 if any frame has a problem")
    p.set_defaults(func=_cmd_inspect)


def _add_server_command(sub) -> None:
    p = sub.add_parser("server", help="run a KV server (Couchbase binary protocol) in the foreground",
                       description="Serve buckets over the memcached binary protocol with Couchbase's extensions "
                       "(HELLO, SASL SCRAM/PLAIN, cluster map, KV, *WithMeta, stats), and beside it the HTTP "
                       "management API (buckets, /metrics, the /ui/ page). Prints one line when ready (with the "
                       "ports; use --port 0 for a free one) and shuts down cleanly on SIGTERM/SIGINT.")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=11210, help="KV port (default 11210; 0 picks a free port)")
    p.add_argument("--data-dir", default="./data", help="where buckets are stored (default ./data)")
    p.add_argument("--bucket", action="append", metavar="NAME",
                   help="a bucket to serve (repeatable; default: default)")
    p.add_argument("--vbuckets", type=int, default=None,
                   help="vbuckets of a new bucket (default 1024); an existing bucket keeps its count, and a "
                        "different number given here is an error")
    p.add_argument("--conflict-resolution", choices=("seqno", "lww"), default=None,
                   help="conflict resolution of a new bucket for *WithMeta (default seqno); an existing bucket "
                        "keeps its mode, and a different one given here is an error")
    p.add_argument("--flush-interval", type=float, default=0.1, metavar="SECONDS",
                   help="how often writes are persisted (default 0.1)")
    p.add_argument("--flusher-nice", type=int, default=10, choices=range(0, 20), metavar="0-19",
                   help="nice levels the flusher thread runs below the server (Linux; default 10): requests "
                        "come first, persistence takes the CPU left over; 0 runs it at the same priority")
    p.add_argument("--purge-interval", type=float, default=259_200.0, metavar="SECONDS",
                   help="age after which compaction purges tombstones (default 3 days)")
    p.add_argument("--compaction-interval", type=float, default=3600.0, metavar="SECONDS",
                   help="how often compaction runs (default 3600)")
    p.add_argument("--fragmentation-threshold", type=float, default=30.0, metavar="PERCENT",
                   help="compact a bucket's store once this percentage of its rows are older versions kept for "
                        "rollback, trimming them to a quarter of the documents (default 30, ns_server's "
                        "auto-compaction threshold; 0: only --compaction-interval)")
    p.add_argument("--expiry-interval", type=float, default=10.0, metavar="SECONDS",
                   help="how often the expiry pager runs (default 10)")
    p.add_argument("--users", metavar="FILE", help="users file (JSON; default: Administrator/password, admin)")
    p.add_argument("--tls-cert", metavar="PEM", help="certificate chain: also serve TLS (kvSSL) on --tls-port")
    p.add_argument("--tls-key", metavar="PEM", help="private key of --tls-cert")
    p.add_argument("--tls-port", type=int, default=11207, help="TLS port (default 11207; 0 picks a free one)")
    p.add_argument("--mgmt-port", type=int, default=None,
                   help="HTTP management port: REST API, /metrics and the /ui/ status page (default 8091 when "
                        "free, else a free port; 0 picks a free one); the cluster map advertises it as mgmt")
    p.add_argument("--mgmt-tls-port", type=int, default=None,
                   help="HTTPS management port with --tls-cert (default 18091 when free, else a free port)")
    p.add_argument("--allow-plain-over-tcp", action="store_true",
                   help="also offer SASL PLAIN on the plain-TCP port (by default only over TLS: it sends the "
                   "password in clear)")
    p.add_argument("--memory-quota", type=parse_size, default=100 << 20, metavar="SIZE",
                   help="each bucket's memory quota, as 100m or 2g (default 100m, Couchbase's; `unlimited` for "
                        "none): near it values are evicted and writes get ETMPFAIL; a bucket created through the "
                        "management API has its own ramQuotaMB")
    p.add_argument("--eviction-policy", choices=("valueOnly", "fullEviction"), default=None,
                   help="each bucket's eviction policy, unless the management API gave it one (evictionPolicy): "
                        "valueOnly evicts values and keeps every key in memory, fullEviction evicts whole "
                        "documents so a bucket can hold more keys than its quota fits (default: as the bucket was, "
                        "valueOnly for a new one)")
    _add_server_limits(p)
    p.add_argument("--loop", choices=("auto", "asyncio", "uvloop"), default="auto",
                   help="event loop: uvloop if installed (auto, the default: faster socket I/O), or asyncio")
    p.add_argument("--debug", action="store_true", help="log to stderr, including unknown opcodes")
    p.set_defaults(func=_cmd_server)


def _add_server_limits(p) -> None:
    """`dcpflow server`'s limits on connections and logins, and its audit trail."""
    p.add_argument("--max-connections", type=int, default=60_000, metavar="N",
                   help="connections that may be authenticated as ordinary users (default 60000, ns_server's; "
                        "lowered to fit the open-files limit with --mgmt-max-connections)")
    p.add_argument("--system-connections", type=int, default=16, metavar="N",
                   help="connections kept beyond --max-connections for administrators and the cluster manager, "
                        "counted after authentication (default 16)")
    p.add_argument("--mgmt-max-connections", type=int, default=1_000, metavar="N",
                   help="HTTP connections the management port keeps open at once (default 1000; lowered to fit the "
                        "open-files limit with the KV connections); beyond, the oldest without a request in "
                        "progress is closed for a new one")
    p.add_argument("--auth-timeout", type=_positive, default=5.0, metavar="SECONDS",
                   help="close a KV connection that has not authenticated, or an HTTP connection that has not sent "
                        "a request, this long after it was accepted (default 5)")
    p.add_argument("--http-idle-timeout", type=_positive, default=60.0, metavar="SECONDS",
                   help="close an HTTP connection idle this long between requests (default 60)")
    p.add_argument("--login-failures", type=int, default=5, metavar="N",
                   help="failed logins an address or a user may have before further attempts are refused for a "
                        "while (default 5; 0: no throttling); see --login-lockout")
    p.add_argument("--login-lockout", type=_positive, default=1.0, metavar="SECONDS",
                   help="the first lockout after --login-failures failures; it doubles with each further "
                        "failure, up to 64 times this (default 1)")
    p.add_argument("--audit-log", metavar="FILE",
                   help="also write the audit trail (failed logins on both ports, 401/403/EACCESS refusals, invalid "
                        "packets, bucket, scope, collection and user changes) to FILE as JSON lines in Couchbase's "
                        "audit event format: every event, never rate-limited (the copy logged at WARNING is)")


def main(argv: list[str] | None = None) -> int:
    """Run one command. A command that needs an optional extra (its `extra` default) is refused
    at once when the extra is not installed, and a missing package imported anywhere below names
    the extra that brings it: one line on stderr and exit 1, no traceback (extras.py)."""
    from . import extras

    args = build_parser().parse_args(argv)
    extra = getattr(args, "extra", None)
    problem = extras.missing(extra) if extra else None
    if problem is None:
        try:
            return args.func(args)
        except ModuleNotFoundError as e:
            problem = extras.explain(e, extra)
            if problem is None:
                raise
    print(f"dcpflow {args.command}: {problem}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
