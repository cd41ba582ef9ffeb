"""`dcpflow tail`: print a bucket's changes as they arrive, resumable from saved offsets.

Output goes to stdout (JSON lines or a table), the backfill progress bar and messages to stderr.
Offsets are saved to `--state` every `--save-interval` seconds and on every exit, including
Ctrl-C and SIGTERM: the signal cancels the read at an await, where the consumed offsets are
consistent, and the saving happens after that.
"""

import argparse
import asyncio
import base64
import json
import os
import signal
import sys
import time

from .client import DcpClient
from .errors import ClientError
from .events import Deletion, Expiration, Mutation, Rollback, StreamEnd, SystemEvent
from .state import JsonFileStore


def parse_vbuckets(text: str | None) -> list[int] | None:
    """"0-63,100" -> [0..63, 100]; raises ValueError with the bad part."""
    if text is None:
        return None
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        try:
            a = int(lo)
            b = int(hi) if sep else a
        except ValueError:
            raise ValueError(f"--vbuckets: {part!r} is not N or N-M") from None
        if a < 0 or b < a:
            raise ValueError(f"--vbuckets: {part!r} is not a valid range")
        out.update(range(a, b + 1))
    return sorted(out)


def _text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode()


def _value(ev) -> object:
    if ev.datatype & 0x01:
        try:
            return json.loads(ev.value)
        except ValueError:
            pass
    return _text(ev.value)


def as_json(ev) -> dict | None:
    if isinstance(ev, Mutation):
        return {"event": "mutation", "vbucket": ev.vbucket, "seqno": ev.seqno, "key": _text(ev.key),
                "value": _value(ev), "cas": ev.cas, "rev_seqno": ev.rev_seqno, "flags": ev.flags,
                "expiry": ev.expiry, "datatype": ev.datatype, "collection_id": ev.collection_id}
    if isinstance(ev, Deletion | Expiration):
        return {"event": ev.event, "vbucket": ev.vbucket, "seqno": ev.seqno, "key": _text(ev.key), "cas": ev.cas,
                "rev_seqno": ev.rev_seqno, "delete_time": ev.delete_time, "collection_id": ev.collection_id}
    if isinstance(ev, Rollback):
        return {"event": "rollback", "vbucket": ev.vbucket, "seqno": ev.seqno}
    if isinstance(ev, SystemEvent):
        return {"event": "system", "vbucket": ev.vbucket, "seqno": ev.seqno, "id": ev.event_id}
    return None


_TABLE_HEAD = f"{'EVENT':<10} {'VB':>4} {'SEQNO':>10}  {'KEY':<32} VALUE"


def as_row(ev, width: int = 60) -> str | None:
    doc = as_json(ev)
    if doc is None:
        return None
    value = doc.get("value", "")
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    if len(text) > width:
        text = text[:width - 1] + "…"
    return f"{doc['event']:<10} {doc['vbucket']:>4} {doc['seqno']:>10}  {doc.get('key', ''):<32} {text}"


class Progress:
    """A one-line bar on stderr: seqnos read vs the high seqnos seen at start."""

    def __init__(self, stream, out=sys.stderr, enabled: bool = True):
        self.stream = stream
        self.out = out
        self.enabled = enabled
        self.last = 0.0
        self.finished = False
        self.started = time.monotonic()

    def update(self, force: bool = False) -> None:
        if not self.enabled or self.finished:
            return
        now = time.monotonic()
        if not force and now - self.last < 0.2:
            return
        self.last = now
        done, total = self.stream.progress()
        if total == 0:
            return
        frac = done / total
        bar = "#" * int(frac * 30)
        rate = done / max(now - self.started, 1e-9)
        self.out.write(f"\rbackfill [{bar:<30}] {done}/{total} ({frac * 100:5.1f}%) {rate:,.0f} items/s")
        if done >= total:
            self.out.write("\n")
            self.finished = True
        self.out.flush()


async def tail(url: str, *, username: str, password: str, start: str, state_path: str | None,
               vbuckets: list[int] | None, fmt: str, until: str | None, progress: bool | None,
               save_interval: float, out=sys.stdout, err=sys.stderr) -> int:
    store = JsonFileStore(state_path) if state_path else None
    if start == "saved" and store is None:
        raise ValueError("--from saved needs --state FILE")
    client = await DcpClient.connect(url, username, password)
    loop = asyncio.get_running_loop()
    stream = None
    interrupted = False
    try:
        stream = client.events(vbuckets, start=start, end="now" if until == "now" else None, state=store,
                               save_interval=save_interval if store else None)
        bar = Progress(stream, err, err.isatty() if progress is None else progress)
        dirty = False

        def flush():
            nonlocal dirty
            dirty = False
            out.flush()

        async def consume():
            nonlocal dirty
            if fmt == "table":
                out.write(_TABLE_HEAD + "\n")
            async for ev in stream:
                if isinstance(ev, StreamEnd):
                    continue
                line = json.dumps(as_json(ev), separators=(",", ":")) if fmt == "jsonl" else as_row(ev)
                if line is not None:
                    out.write(line + "\n")
                    if not dirty:
                        dirty = True
                        loop.call_later(0.1, flush)
                bar.update()
            bar.update(force=True)

        task = asyncio.ensure_future(consume())

        def stop():
            nonlocal interrupted
            interrupted = True
            task.cancel()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop)
        try:
            await task
        except asyncio.CancelledError:
            if not interrupted:
                raise
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            out.flush()
    finally:
        if stream is not None:
            await stream.aclose()
            if store is not None and stream.feed is not None:
                await stream.save()
                err.write(f"offsets saved to {state_path}\n")
        await client.close()
    return 130 if interrupted else 0


def main(args) -> int:
    """Entry point for `dcpflow tail` (args from cli.py's parser)."""
    try:
        vbuckets = parse_vbuckets(args.vbuckets)
    except ValueError as e:
        print(f"dcpflow tail: {e}", file=sys.stderr)
        return 2
    password = args.password if args.password is not None else os.environ.get("DCPFLOW_PASSWORD", "password")
    start = args.start or ("saved" if args.state else "beginning")
    try:
        return asyncio.run(tail(args.url, username=args.username, password=password, start=start,
                                state_path=args.state, vbuckets=vbuckets, fmt=args.format, until=args.until,
                                progress=args.progress, save_interval=args.save_interval))
    except (ClientError, ValueError) as e:
        print(f"dcpflow tail: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0


def add_arguments(p) -> None:
    p.add_argument("url", help="connection string, e.g. couchbase://127.0.0.1:11210/default")
    p.add_argument("-u", "--username", default="Administrator", help="default Administrator")
    p.add_argument("-p", "--password", help="default: $DCPFLOW_PASSWORD, else 'password'")
    p.add_argument("--from", dest="start", choices=("beginning", "now", "saved"),
                   help="where to start (default: saved if --state is given, else beginning)")
    p.add_argument("--state", metavar="FILE", help="offsets file (JSON), read with --from saved and written on exit")
    p.add_argument("--vbuckets", metavar="LIST", help="vbuckets to read, e.g. 0-63,100 (default: all)")
    p.add_argument("--format", choices=("jsonl", "table"), default="jsonl", help="output format (default jsonl)")
    p.add_argument("--until", choices=("now",), help="stop once the changes that existed at start are read")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="backfill progress bar on stderr (default: when stderr is a terminal)")
    p.add_argument("--save-interval", type=float, default=5.0, metavar="SECONDS",
                   help="save offsets this often (default 5)")



def add_command(sub) -> None:
    """Register `dcpflow tail` on the CLI's subparsers."""
    p = sub.add_parser("tail", help="print a bucket's changes as they arrive (DCP), resumable from saved offsets",
                       description="Stream changes from a dcpflow server or Couchbase cluster over DCP and print "
                       "them (JSON lines or a table). A progress bar on stderr shows the backfill of what existed at "
                       "start; offsets are saved to --state on exit (Ctrl-C safe) so the next run resumes.")
    add_arguments(p)
    p.set_defaults(func=main)
