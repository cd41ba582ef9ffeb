"""`dcpflow collections list|create|drop`: scopes and collections of a bucket, for people without an
SDK. An HTTP client of the management port's scopes routes (server/mgmt/collections.py, the routes
of https://docs.couchbase.com/server/current/rest-api/scopes-and-collections-api.html), so it
works against Couchbase Server too.

    dcpflow collections list [--bucket B] [--json]
    dcpflow collections create SCOPE                      a scope
    dcpflow collections create SCOPE.COLLECTION [--max-ttl SECONDS] [--history]
    dcpflow collections drop SCOPE | SCOPE.COLLECTION

`--url` (default http://127.0.0.1:8091) and `-u`/`-p` (an admin; the password defaults to
$DCPFLOW_PASSWORD, else "password") say where. A change prints the manifest uid it made; a refusal
prints the server's message on stderr and exits 1.
"""

import argparse
import json
import sys
import urllib.parse

from .client.rest_client import RestError, admin_arguments, call, password_of

PROG = "dcpflow collections"


def _path(bucket: str, *parts: str) -> str:
    quoted = [urllib.parse.quote(p, safe="") for p in (bucket, *parts)]
    path = f"/pools/default/buckets/{quoted[0]}/scopes"
    if len(quoted) > 1:
        path += f"/{quoted[1]}"
    if len(quoted) > 2:
        path += f"/collections/{quoted[2]}"
    return path


def split_target(target: str) -> tuple[str, str | None]:
    """SCOPE or SCOPE.COLLECTION (names have no dots)."""
    parts = target.split(".")
    if len(parts) > 2 or not all(parts):
        raise ValueError(f"{target!r} is not SCOPE or SCOPE.COLLECTION")
    return parts[0], parts[1] if len(parts) == 2 else None


def format_manifest(doc: dict) -> str:
    """The manifest as a table: one line per collection, with its ids and settings."""
    lines = [f"manifest uid {doc['uid']}"]
    for scope in doc["scopes"]:
        lines.append(f"{scope['name']} (scope id 0x{scope['uid']})")
        for c in scope["collections"]:
            settings = []
            if c.get("maxTTL"):
                settings.append(f"maxTTL {c['maxTTL']} s")
            if c.get("history"):
                settings.append("history")
            extra = f", {', '.join(settings)}" if settings else ""
            lines.append(f"  {scope['name']}.{c['name']} (collection id 0x{c['uid']}{extra})")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    password = password_of(args)
    try:
        if args.action == "list":
            doc = call(args.url, args.username, password, "GET", _path(args.bucket))
            print(json.dumps(doc, indent=1) if args.json else format_manifest(doc))
            return 0
        try:
            scope, collection = split_target(args.target)
        except ValueError as e:
            print(f"{PROG} {args.action}: {e}", file=sys.stderr)
            return 2
        if args.action == "create":
            if collection is None:
                if args.max_ttl is not None or args.history:
                    print(f"{PROG} create: --max-ttl and --history are settings of a collection (SCOPE.COLLECTION)",
                          file=sys.stderr)
                    return 2
                answer = call(args.url, args.username, password, "POST", _path(args.bucket), {"name": scope})
            else:
                params = {"name": collection, "maxTTL": args.max_ttl, "history": "true" if args.history else None}
                answer = call(args.url, args.username, password, "POST",
                              _path(args.bucket, scope) + "/collections", params)
        else:
            answer = call(args.url, args.username, password, "DELETE", _path(args.bucket, scope, *(
                [collection] if collection else [])))
    except RestError as e:
        print(f"{PROG} {args.action}: {e}", file=sys.stderr)
        return 1
    print(f"{args.action} {args.target}: manifest uid {answer['uid']}")
    return 0


def add_command(sub) -> None:
    """Register `dcpflow collections` on the CLI's subparsers."""
    common = admin_arguments()
    common.add_argument("--bucket", default="default", help="the bucket (default: default)")
    p = sub.add_parser("collections", help="list, create and drop a bucket's scopes and collections",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    a = actions.add_parser("list", help="the bucket's scopes and collections", parents=[common])
    a.add_argument("--json", action="store_true", help="print the manifest as the server sends it")
    a = actions.add_parser("create", help="create a scope, or a collection in a scope", parents=[common])
    a.add_argument("target", metavar="SCOPE[.COLLECTION]")
    a.add_argument("--max-ttl", type=int, metavar="SECONDS",
                   help="a collection's maxTTL: its documents expire at the latest this long after a write "
                        "(-1: never, 0: as the bucket)")
    a.add_argument("--history", action="store_true",
                   help="the collection keeps every version for the bucket's history retention (DCP change streams)")
    a = actions.add_parser("drop", help="drop a scope (and its collections), or a collection", parents=[common])
    a.add_argument("target", metavar="SCOPE[.COLLECTION]")
    for name in ("list", "create", "drop"):
        actions.choices[name].set_defaults(func=main)
