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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dcpflow", description="Couchbase DCP end to end: protocol tools, "
                                     "server, client and the Spark CDC pipeline.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("inspect", help="decode hex frames (stdin or a file) into JSON, one object per frame",
                       description="Decode memcached-binary/DCP frames from hex. Whitespace, 0x prefixes, "
                       "commas and # comments are ignored. Each frame prints as one JSON object with every "
                       "header field, the decoded body and a list of the rules it breaks.")
    p.add_argument("file", nargs="?", help="file with hex (default: stdin)")
    p.add_argument("--pretty", action="store_true", help="indent the JSON")
    p.add_argument("--strict", action="store_true", help="exit 1 if any frame has a problem")
    p.set_defaults(func=_cmd_inspect)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
