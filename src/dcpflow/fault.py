"""`dcpflow fault <kind> ...`: inject a fault into a running dcpflow server (or a node of
`dcpflow cluster`) through its management port's `/faults` endpoints, for testing DCP consumers.

It is an HTTP client of the REST API (server/mgmt/faults.py; docs/server.md "Fault injection"
says what each fault does and what a correct consumer sees), with the standard library only:
`--url` (default http://127.0.0.1:8091) and `-u`/`-p` (an admin). It prints the server's JSON
answer; a refusal prints the server's message on stderr and exits 1.
"""

import argparse
import json
import sys
import urllib.parse

from .client.rest_client import RestError, admin_arguments, call, password_of

PROG = "dcpflow fault"


#: The REST client's error (client/rest_client.py): the server refused, or could not be reached.
FaultCommandError = RestError


def _bucket_path(args, what: str) -> str:
    return f"/faults/buckets/{urllib.parse.quote(args.bucket, safe='')}/{what}"


def _request(args) -> tuple[str, str, dict | None]:
    """(method, path, parameters) of the kind asked for."""
    kind = args.kind
    if kind == "list":
        return "GET", "/faults", None
    if kind == "clear":
        return "DELETE", "/faults", None
    if kind == "failover":
        return "POST", _bucket_path(args, "failover"), {"vbuckets": args.vbuckets,
                                                         "unclean": "true" if args.unclean else None}
    if kind == "failover-node":
        return "POST", "/faults/nodes/failover", {"node": args.node}
    if kind == "rollback":
        return "POST", _bucket_path(args, "rollback"), {"vbucket": args.vbucket, "seqno": args.seqno}
    if kind == "end-streams":
        return "POST", _bucket_path(args, "streams/end"), {"reason": args.reason, "vbuckets": args.vbuckets,
                                                            "name": args.name}
    if kind == "drop-connections":
        return "POST", "/faults/connections/drop", {"bucket": args.bucket, "name": args.name,
                                                    "all": "true" if args.all else None}
    if kind in ("pause-persistence", "resume-persistence"):
        return "POST", _bucket_path(args, "persistence/" + kind.split("-")[0]), None
    if kind == "delay":
        return "POST", "/faults/delays", {"opcode": args.opcode, "seconds": args.seconds, "duration": args.duration}
    if kind == "clear-delays":
        path = "/faults/delays" + (f"/{urllib.parse.quote(args.opcode, safe='')}" if args.opcode else "")
        return "DELETE", path, None
    raise AssertionError(kind)


def main(args: argparse.Namespace) -> int:
    if args.kind == "drop-connections" and args.all == bool(args.bucket or args.name):
        print(f"{PROG} drop-connections: say which: --bucket, --name, or --all alone", file=sys.stderr)
        return 2
    password = password_of(args)
    method, path, params = _request(args)
    try:
        answer = call(args.url, args.username, password, method, path, params)
    except FaultCommandError as e:
        print(f"{PROG} {args.kind}: {e}", file=sys.stderr)
        return 1
    print(json.dumps(answer, indent=1))
    return 0


def add_command(sub) -> None:
    """Register `dcpflow fault` on the CLI's subparsers."""
    common = admin_arguments()
    bucket = argparse.ArgumentParser(add_help=False)
    bucket.add_argument("--bucket", default="default", help="the bucket (default: default)")

    p = sub.add_parser("fault", help="inject a fault into a running server (failover, rollback, stream ends, "
                       "dropped connections, paused persistence, delays) to test DCP consumers",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    kinds = p.add_subparsers(dest="kind", required=True, metavar="KIND")

    def kind(name: str, helptext: str, *parents) -> argparse.ArgumentParser:
        k = kinds.add_parser(name, help=helptext, description=helptext, parents=[common, *parents])
        k.set_defaults(func=main)
        return k

    kind("list", "the faults in force (paused buckets, delays) and the recent ones")
    kind("clear", "undo the faults in force: resume persistence everywhere, remove every delay")
    k = kind("failover", "fail vbuckets over: a new failover entry each; their streams end STATE_CHANGED", bucket)
    k.add_argument("--vbuckets", required=True, metavar="LIST", help="e.g. 0,4-7, or all (the active ones)")
    k.add_argument("--unclean", action="store_true",
                   help="as after a crash: what was not persisted is lost first, consumers that saw it roll back")
    k = kind("failover-node", "on a node of `dcpflow cluster`: hard failover of a node (its replicas promoted)")
    k.add_argument("node", nargs="?", help="the node as HOST:PORT (its KV port; default: the node --url is)")
    k = kind("rollback", "roll a vbucket back to a seqno as an unclean restart would; its streams end ROLLBACK",
             bucket)
    k.add_argument("--vbucket", required=True, type=int)
    k.add_argument("--seqno", required=True, type=int, help="everything above it is lost (memory and disk)")
    k = kind("end-streams", "end DCP streams with a reason (SLOW drops their cursors instead)", bucket)
    k.add_argument("--reason", required=True, help="STATE_CHANGED, DISCONNECTED, SLOW, BACKFILL_FAIL, ROLLBACK, "
                   "FILTER_EMPTY or LOST_PRIVILEGES")
    k.add_argument("--vbuckets", metavar="LIST", help="only these vbuckets (e.g. 0,4-7; default all)")
    k.add_argument("--name", help="only the streams of this DCP connection")
    k = kind("drop-connections", "cut KV connections at once, as a network failure does")
    k.add_argument("--bucket", help="those of this bucket")
    k.add_argument("--name", help="the DCP connection of this name")
    k.add_argument("--all", action="store_true", help="every KV connection")
    kind("pause-persistence", "stop persisting the bucket (writes stay acknowledged in memory)", bucket)
    kind("resume-persistence", "persist the bucket again", bucket)
    k = kind("delay", "hold KV requests before they run")
    k.add_argument("--seconds", required=True, type=float, help="how long each request is held (at most 60)")
    k.add_argument("--opcode", default="all", help="GET, DCP_STREAM_REQ, 0x53... or all (the default)")
    k.add_argument("--duration", type=float, help="seconds the rule lasts (default: until cleared)")
    k = kind("clear-delays", "remove delay rules")
    k.add_argument("--opcode", help="only this opcode's rule (all: the rule for every opcode)")
