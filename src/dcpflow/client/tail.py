"""`dcpflow tail`: print a bucket's changes as they arrive, resumable from saved offsets.

Output goes to stdout (JSON lines or a table), the backfill progress bar and messages to stderr.
Offsets are saved to `--state` every `--save-interval` seconds and on every exit, including
Ctrl-C and SIGTERM: the signal cancels the read at an await, where the consumed offsets are
consistent, and the saving happens after that.

JSON lines come from the client's Arrow batches (jsonlines.py): a batch of changes becomes one
buffer of lines, written to stdout at once, so printing costs about what reading does. The
system events (collections created or dropped) and rollbacks a batch saw are printed before its
documents. The table format reads event by event, and so do JSON lines where pyarrow and numpy
(the `arrow` extra) are not installed: the same objects, in stream order.
"""

import argparse
import asyncio
import base64
import importlib.util
import json
import os
import signal
import sys
import time

from .client import DcpClient
from .errors import ClientError
from .events import Deletion, Expiration, Mutation, Rollback, StreamEnd, SystemEvent
from .offsets import Offset
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


def as_json(ev, names=None) -> dict | None:
    """An event as tail's JSON object; `names` (manifest.Names) labels documents with their scope
    and collection."""
    if isinstance(ev, Mutation | Deletion | Expiration):
        scope, coll = names.of(ev.collection_id) if names is not None else ("", "")
        if isinstance(ev, Mutation):
            doc = {"event": "mutation", "vbucket": ev.vbucket, "seqno": ev.seqno, "key": _text(ev.key),
                   "value": _value(ev), "cas": ev.cas, "rev_seqno": ev.rev_seqno, "flags": ev.flags,
                   "expiry": ev.expiry, "datatype": ev.datatype}
        else:
            doc = {"event": ev.event, "vbucket": ev.vbucket, "seqno": ev.seqno, "key": _text(ev.key), "cas": ev.cas,
                   "rev_seqno": ev.rev_seqno, "delete_time": ev.delete_time}
        doc.update(collection_id=ev.collection_id, scope=scope, collection=coll)
        return doc
    if isinstance(ev, Rollback):
        return {"event": "rollback", "vbucket": ev.vbucket, "seqno": ev.seqno}
    if isinstance(ev, SystemEvent):
        doc = {"event": "system", "vbucket": ev.vbucket, "seqno": ev.seqno, "id": ev.event_id, "kind": ev.kind,
               "scope": ev.scope, "collection": ev.collection}
        if ev.collection_id is not None:
            doc["collection_id"] = ev.collection_id
        if ev.manifest_uid is not None:
            doc["manifest_uid"] = ev.manifest_uid
        return doc
    return None


_TABLE_HEAD = f"{'EVENT':<10} {'VB':>4} {'SEQNO':>10}  {'KEY':<32} VALUE"


def as_row(ev, width: int = 60, names=None) -> str | None:
    doc = as_json(ev, names)
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
        """`stream` has progress() -> (seqnos done, seqnos to reach)."""
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


class _BatchProgress:
    """progress() of a batch read: seqnos consumed toward the high seqnos seen at the start."""

    def __init__(self, reader, starts: dict[int, Offset], targets: dict[int, int]):
        self.reader, self.starts, self.targets = reader, starts, targets

    def progress(self) -> tuple[int, int]:
        done = total = 0
        positions = self.reader.positions
        for vb, target in self.targets.items():
            start = self.starts[vb].seqno
            if target > start:
                total += target - start
                done += max(0, min(positions.get(vb, self.starts[vb]).seqno, target) - start)
        return done, total


def _write(out, data) -> None:
    """Write bytes to a text stream's binary buffer (stdout), or as text where it has none."""
    buffer = getattr(out, "buffer", None)
    if buffer is not None:
        out.flush()
        buffer.write(data)
        buffer.flush()
    else:
        out.write(bytes(data).decode("utf-8"))
        out.flush()


async def until_signal(coro) -> bool:
    """Run `coro` to its end, or until SIGINT/SIGTERM cancels it; whether a signal stopped it (the
    caller then saves its offsets and exits 130, as a shell expects of an interrupted command)."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(coro)
    interrupted = False

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
    return interrupted


async def _starts(client: DcpClient, start: str, store, vbs: list[int]) -> tuple[dict[int, Offset], object]:
    """Where a tail starts (`saved`: the store's offsets, else the beginning; `now`; `beginning`),
    and the state it loaded (checked to be this bucket's), if any."""
    loaded = await asyncio.to_thread(store.load) if store is not None else None
    if loaded is not None:
        loaded.check_bucket(client.bucket, client.bucket_uuid, store.path)
    if start == "saved":
        saved = loaded.offsets if loaded is not None else {}
        return {vb: saved.get(vb, Offset()) for vb in vbs}, loaded
    if start == "now":
        return await client.offsets_now(vbs), loaded
    return {vb: Offset() for vb in vbs}, loaded


async def tail_jsonl(client: DcpClient, *, start: str, store, vbuckets, until: str | None, progress: bool | None,
                     save_interval: float, filters: dict, out, err) -> tuple[bool, object]:
    """JSON lines from Arrow batches; returns (interrupted, a function that saves the offsets)."""
    from .jsonlines import format_batch
    vbs = client._vbucket_list(vbuckets)
    starts, loaded = await _starts(client, start, store, vbs)
    purge = dict(loaded.purge_seqnos) if loaded is not None else {}
    reader = client.batches(starts, end="now" if until == "now" else None, max_rows=65536, rollback="resume",
                            purge_seqnos=purge, **filters)
    names = client.names.of
    loop = asyncio.get_running_loop()

    async def save():
        if store is not None and reader.feed is not None:
            state = client.state_for(reader.offsets, reader.purge_seqnos, loaded)
            await asyncio.to_thread(store.save, state)

    def side_lines() -> bytes:
        """The rollbacks and system events seen up to the batch just yielded, as lines."""
        docs = [as_json(r) for r in reader.rollbacks] + [as_json(e) for e in reader.system_events]
        reader.rollbacks.clear()
        reader.system_events.clear()
        return "".join(json.dumps(d, separators=(",", ":")) + "\n" for d in docs).encode()

    async def make_bar() -> Progress:
        enabled = err.isatty() if progress is None else progress
        # the targets are the high seqnos at the start: asked for only when there is a bar to draw
        targets = (reader.ends or await client.high_seqnos(vbs)) if enabled else {}
        return Progress(_BatchProgress(reader, starts, targets), err, enabled)

    async def consume():
        # A batch is formatted in a thread (Arrow's kernels release the GIL) while the next one is
        # read and decoded; it is written before anything after it, and before the offsets are saved.
        bar = None
        last_save = time.monotonic()
        written = None  # the task writing the last batch (each waits for the one before it)

        async def write(before: bytes, fut, previous) -> None:
            if previous is not None:
                await previous
            if before:
                _write(out, before)
            _write(out, await fut)

        async def flushed() -> None:
            if written is not None:
                await asyncio.shield(written)

        try:
            async for batch in reader:
                if bar is None:
                    bar = await make_bar()
                fut = loop.run_in_executor(None, format_batch, batch, names)
                written = asyncio.ensure_future(write(side_lines(), fut, written))
                bar.update()
                if store is not None and time.monotonic() - last_save >= save_interval:
                    await flushed()
                    await save()
                    last_save = time.monotonic()
        finally:
            await flushed()
        rest = side_lines()
        if rest:
            _write(out, rest)
        if bar is None:
            bar = await make_bar()
        bar.update(force=True)

    try:
        interrupted = await until_signal(consume())
    finally:
        await reader.aclose()
    return interrupted, save


async def write_events(stream, fmt: str, names, out, bar: Progress | None = None) -> None:
    """Each event of `stream` as a JSON line or a table row (the event-by-event path: rollback
    mitigation and groups hand events out one by one), flushed at most every 0.1 s."""
    loop = asyncio.get_running_loop()
    dirty = False

    def flush():
        nonlocal dirty
        dirty = False
        out.flush()

    if fmt == "table":
        out.write(_TABLE_HEAD + "\n")
    async for ev in stream:
        if isinstance(ev, StreamEnd):
            continue
        if fmt == "jsonl":
            doc = as_json(ev, names)
            line = None if doc is None else json.dumps(doc, separators=(",", ":"))
        else:
            line = as_row(ev, names=names)
        if line is not None:
            out.write(line + "\n")
            if not dirty:
                dirty = True
                loop.call_later(0.1, flush)
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.update(force=True)


async def tail(url: str, *, username: str, password: str, start: str, state_path: str | None,
               vbuckets: list[int] | None, fmt: str, until: str | None, progress: bool | None,
               save_interval: float, out=sys.stdout, err=sys.stderr, scope: str | None = None,
               collections=None, history: bool = False, mitigate_rollbacks: bool = False,
               persistence_poll_interval: float | None = None, group: str | None = None,
               member: int | None = None, of: int | None = None, lease: float = 10.0) -> int:
    store = JsonFileStore(state_path) if state_path else None
    if group is not None:
        if store is not None or start == "saved":
            raise ValueError("--group keeps its offsets in the bucket: no --state or --from saved")
        if until is not None and member is None:
            raise ValueError("--until needs static membership (--member I --of N): a dynamic group's shares change")
    elif member is not None or of is not None:
        raise ValueError("--member and --of need --group NAME")
    if start == "saved" and store is None:
        raise ValueError("--from saved needs --state FILE")
    filters = {"scope": scope, "collections": collections, "history": history}
    options = {"mitigate_rollbacks": True, "persistence_poll_interval": persistence_poll_interval} \
        if mitigate_rollbacks else {}
    client = await DcpClient.connect(url, username, password, **options)
    if group is not None:
        try:
            return await tail_group(client, group, member=member, of=of, lease=lease, start=start, fmt=fmt, until=until,
                                    save_interval=save_interval, filters=filters, out=out, err=err)
        finally:
            await client.close()
    if fmt == "jsonl" and not mitigate_rollbacks and columnar():  # mitigation holds events one by one: the event path
        try:
            interrupted, save = await tail_jsonl(client, start=start, store=store, vbuckets=vbuckets, until=until,
                                                 progress=progress, save_interval=save_interval, filters=filters,
                                                 out=out, err=err)
            if store is not None:
                await save()
                err.write(f"offsets saved to {state_path}\n")
        finally:
            await client.close()
        return 130 if interrupted else 0
    stream = None
    interrupted = False
    try:
        stream = client.events(vbuckets, start=start, end="now" if until == "now" else None, state=store,
                               save_interval=save_interval if store else None, **filters)
        bar = Progress(stream, err, err.isatty() if progress is None else progress)
        try:
            interrupted = await until_signal(write_events(stream, fmt, client.names, out, bar))
        finally:
            out.flush()
    finally:
        if stream is not None:
            await stream.aclose()
            if store is not None and stream.feed is not None:
                await stream.save()
                err.write(f"offsets saved to {state_path}\n")
        await client.close()
    return 130 if interrupted else 0


def columnar() -> bool:
    """Whether JSON lines can come from Arrow batches: pyarrow and numpy (the `arrow` extra) are
    installed. Without them `tail` prints the same objects from the event API, one at a time."""
    return all(importlib.util.find_spec(name) is not None for name in ("pyarrow", "numpy"))


async def tail_group(client: DcpClient, group: str, *, member, of, lease: float, start: str, fmt: str,
                     until: str | None, save_interval: float, filters: dict, out, err) -> int:
    """One member of a consumer group (groups.py): its share of the vbuckets, as JSON lines or a
    table; each time its share changes, a `group {...}` line on stderr says which vbuckets it now
    reads and the seqno each starts after."""

    def changed(generation, vbuckets, starts):
        doc = {"group": group, "member": reader.member_id, "generation": generation,
               "vbuckets": [int(vb) for vb in vbuckets], "starts": {str(vb): o.seqno for vb, o in starts.items()}}
        err.write("group " + json.dumps(doc, separators=(",", ":")) + "\n")
        err.flush()

    reader = client.group(group, member=member, of=of, lease=lease, start=start, save_interval=save_interval,
                          on_change=changed, **{k: v for k, v in filters.items() if v},
                          **({"end": "now"} if until == "now" else {}))
    try:
        interrupted = await until_signal(write_events(reader, fmt, client.names, out))
    finally:
        out.flush()
        await reader.aclose()
    err.write(f"group {group}: offsets saved in the bucket\n")
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
                                progress=args.progress, save_interval=args.save_interval, scope=args.scope,
                                collections=args.collection, history=args.history,
                                mitigate_rollbacks=args.mitigate_rollbacks,
                                persistence_poll_interval=args.persistence_poll_interval, group=args.group,
                                member=args.member, of=args.of, lease=args.lease))
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
    p.add_argument("--scope", metavar="NAME", help="only this scope's collections (those created later too)")
    p.add_argument("--collection", action="append", metavar="SCOPE.COLLECTION",
                   help="only this collection (repeatable); a bare name is in --scope, else _default")
    p.add_argument("--history", action="store_true",
                   help="change streams: every retained version of collections with history (7.2+)")
    p.add_argument("--mitigate-rollbacks", action="store_true",
                   help="print a change only once the active and every replica in the cluster map persisted it, "
                   "so a failover cannot take back what was printed (adds the persistence delay)")
    p.add_argument("--group", metavar="NAME",
                   help="read as a member of this consumer group: the members share the vbuckets and keep their "
                   "offsets in the bucket (dynamic membership unless --member/--of)")
    p.add_argument("--member", type=int, metavar="I", help="static membership: this is member I (0-based) ...")
    p.add_argument("--of", type=int, metavar="N", help="... of N members")
    p.add_argument("--lease", type=float, default=10.0, metavar="SECONDS",
                   help="dynamic membership: a member without a heartbeat this long is dropped (default 10)")
    p.add_argument("--persistence-poll-interval", type=float, default=None, metavar="SECONDS",
                   help="with --mitigate-rollbacks: how often to ask the nodes how far they persisted (default 0.1)")



def add_command(sub) -> None:
    """Register `dcpflow tail` on the CLI's subparsers."""
    p = sub.add_parser("tail", help="print a bucket's changes as they arrive (DCP), resumable from saved offsets",
                       description="Stream changes from a dcpflow server or Couchbase cluster over DCP and print "
                       "them (JSON lines or a table). A progress bar on stderr shows the backfill of what existed at "
                       "start; offsets are saved to --state on exit (Ctrl-C safe) so the next run resumes.")
    add_arguments(p)
    p.set_defaults(func=main)
