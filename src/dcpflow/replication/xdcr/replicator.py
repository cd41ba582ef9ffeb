"""The cross-cluster replicator: every change of a source bucket, read over DCP (one stream per
source vbucket, through dcpflow's client), written to a target bucket with its metadata
(target.py), until stopped.

The loop, per batch of changes as they arrive:

1. filters (filters.py) drop what the replication does not send; their positions still advance;
2. source-side conflict resolution (conflict.py) drops large documents the target already beats;
3. the target writes the rest, pipelined per node (target.py): SUCCESS is written, KEY_EEXISTS
   means the target's version won (counted, not retried);
4. only then do the source positions advance, so a checkpoint never claims a change that the
   target has not acknowledged. Seqnos with nothing to write (system events, SEQNO_ADVANCED,
   snapshot ends) count once everything read before them was written (`_caught_up`).

Documents of a collection the target lacks are skipped, but their collection is kept in the
checkpoints as a broken mapping until the target has it and they were sent again (`_backfill`,
namespaces.py).

Checkpoints (checkpoints.py) are taken every `checkpoint_interval` seconds between batches and on
shutdown. Before a checkpoint is taken, and whenever a write reply shows a target vbucket on a new
branch, the target positions of the last checkpoint are checked against the target's failover
logs; if a target restart or failover lost some of our writes, the affected vbuckets go back to the
newest checkpoint that is still whole there and their changes are sent again ("target rewinds").
The source side follows the stream-request rules through the client: a source that lost history
answers ROLLBACK and the stream continues from the consistent point the client picks ("source
rollbacks"); a moved vbucket is followed through the source's map.

Bidirectional replication is two replicators, one each way. It converges without loops because a
document written with its metadata is replicated back with the same metadata, and conflict
resolution rejects an identical version (KEY_EEXISTS); a delete on one side and an update on the
other are ordered by the same rule on both sides.

Stats (`stats`) go to `status.json` in the state directory at every checkpoint (and to the log);
the replicator runs outside the servers, so they are its own, not the servers'.
"""

import asyncio
import contextlib
import json
import logging
import os
import time
import urllib.parse
from pathlib import Path
from typing import NamedTuple

from dcpflow.client import DcpClient
from dcpflow.client.manifest import FilterError
from dcpflow.client.offsets import Offset
from dcpflow.client.with_meta import DELETE, EXPIRE, SET, Change, ReplicationError, Target, bucket_conflict_mode
from dcpflow.engine.conflict import ConflictResolutionMode

from .checkpoints import CheckpointStore, Generation, Generations, target_survives, write_atomically
from .conflict import DEFAULT_OPTIMISTIC_THRESHOLD, source_side_losers
from .filters import Filters
from .namespaces import CollectionMapping

log = logging.getLogger("dcpflow.xdcr")

DOCUMENTS = ("mutation", "deletion", "expiration")
#: seconds between two looks at the target's manifest while a mapping is broken (at checkpoints)
RECHECK_INTERVAL = 1.0

STAT_NAMES = ("docs_received", "docs_written", "sets_written", "deletions_written", "expirations_written",
              "docs_filtered", "docs_other_collections", "failed_cr_source", "failed_cr_target", "docs_failed",
              "target_retries", "source_rollbacks", "target_rewinds", "docs_resent", "checkpoints",
              "batches", "docs_backfilled", "changes_left", "latency_ms_last", "latency_ms_max")


class Settings(NamedTuple):
    filters: Filters = Filters()
    optimistic_threshold: int = DEFAULT_OPTIMISTIC_THRESHOLD
    checkpoint_interval: float = 5.0
    batch_size: int = 512
    #: "auto" (ask both clusters, they must agree), "seqno" or "lww"
    conflict_resolution: str = "auto"


class XdcrReplicator:
    """One direction of a replication. `await run(stop)` replicates until `stop` is set, then
    checkpoints and returns."""

    def __init__(self, source_url: str, target_url: str, *, username: str, password: str, state_dir,
                 target_username: str | None = None, target_password: str | None = None,
                 settings: Settings | None = None):
        self.source_url, self.target_url = source_url, target_url
        self._src_auth = (username, password)
        self._dst_auth = (target_username or username, target_password if target_password is not None else password)
        self.state_dir = Path(state_dir)
        self.settings = settings = settings or Settings()
        self._filters = settings.filters.compile()
        self.stats = dict.fromkeys(STAT_NAMES, 0)
        self.source: DcpClient | None = None
        self.target: Target | None = None
        self.mode: ConflictResolutionMode | None = None
        self.positions: dict[int, Offset] = {}
        #: per target vbucket: (vbuuid, highest seqno) of our writes since the last checkpoint
        self._written: dict[int, tuple[int, int]] = {}
        self._target_uuids: dict[int, int] = {}  # the branch each target vbucket was last seen on
        self._sent_high: dict[int, int] = {}  # per source vbucket: the highest seqno sent this run
        #: (scope, collection) of source documents skipped because the target lacked the collection
        self._broken: set[tuple[str, str]] = set()
        self._next_recheck = 0.0
        self._generations: Generations | None = None
        self._store = CheckpointStore(self.state_dir)
        self._next_checkpoint = 0.0
        self.ready = asyncio.Event()  # set once connected and resumed (tests and the CLI wait on it)

    # -- setup -----------------------------------------------------------------------------
    async def _connect(self) -> None:
        self.source = await DcpClient.connect(self.source_url, *self._src_auth, agent="dcpflow-xdcr",
                                              reconnect_timeout=0)
        self.target = await Target.connect(self.target_url, *self._dst_auth)
        self._collections = CollectionMapping(self.source, self.target.client)
        self.mode = await self._conflict_mode()
        self.target.lww = self.mode == ConflictResolutionMode.LWW
        identity = {"source_bucket": self.source.bucket, "source_uuid": self.source.bucket_uuid,
                    "target_bucket": self.target.client.bucket, "target_uuid": self.target.client.bucket_uuid}
        self._generations = await asyncio.to_thread(self._store.load, identity)
        newest = self._generations.newest
        self.positions = {vb: newest.source.get(vb, Offset()) for vb in range(self.source.num_vbuckets)}
        self._broken = set(newest.broken)
        self._target_uuids = {vb: u for vb, (u, _) in newest.target.items()}
        lost = await self._lost_target_vbuckets(range(self.target.client.num_vbuckets))
        if lost:
            self._rewind(lost)

    async def _conflict_mode(self) -> ConflictResolutionMode:
        wanted = self.settings.conflict_resolution
        if wanted != "auto":
            return ConflictResolutionMode(wanted)
        modes = []
        for client, auth in ((self.source, self._src_auth), (self.target.client, self._dst_auth)):
            modes.append(await bucket_conflict_mode(client, *auth))
        if modes[0] != modes[1]:
            raise ReplicationError(f"the source bucket resolves conflicts by {modes[0]} and the target by "
                                   f"{modes[1]}: replication needs both buckets of the same type")
        return ConflictResolutionMode(modes[0])

    # -- running ---------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        try:
            await self._connect()
            self.ready.set()
            self._next_checkpoint = time.monotonic() + self.settings.checkpoint_interval
            while not stop.is_set():
                await self._stream(stop)
            await self._checkpoint(final=True)
        finally:
            for side in (self.source, self.target):
                if side is not None:
                    with contextlib.suppress(Exception):
                        await side.close()

    async def _stream(self, stop: asyncio.Event) -> None:
        """Read and write until `stop`, or until a target rewind needs the streams reopened."""
        if self._broken and (await self._backfill(stop) or stop.is_set()):
            return
        start = dict(self.positions)
        stream = self.source.events(start=start, rollback="resume", include_xattrs=True)
        queue: asyncio.Queue = asyncio.Queue(maxsize=self.settings.batch_size * 4)
        waiting = [False]  # the reader waits for the stream: all it has read is in the queue, or taken

        async def read():
            events = aiter(stream)
            while True:
                waiting[0] = True
                try:
                    event = await anext(events)
                except StopAsyncIteration:
                    return
                finally:
                    waiting[0] = False
                await queue.put(event)

        def caught_up() -> None:
            if inflight is None and queue.empty() and waiting[0]:
                self._caught_up(stream.positions)

        reader = asyncio.create_task(read())
        inflight: asyncio.Task | None = None
        try:
            while not stop.is_set():
                if reader.done():
                    reader.result()  # raises what stopped it
                    return
                wait = min(0.1, max(0.0, self._next_checkpoint - time.monotonic()))
                try:
                    first = await asyncio.wait_for(queue.get(), wait)
                except TimeoutError:
                    first = None
                batch = [] if first is None else [first]
                while len(batch) < self.settings.batch_size and not queue.empty():
                    batch.append(queue.get_nowait())
                if batch:
                    # Two batches in flight: the next is written while the previous one's replies
                    # come back. Positions still advance in batch order (after each one's writes),
                    # and a change of a key that overtakes an older one is harmless: conflict
                    # resolution keeps the newer version whichever arrives last.
                    sending = asyncio.create_task(self._write_batch(batch))
                    if inflight is not None and await self._apply(await _until(inflight, stop, sending)):
                        inflight = None
                        await asyncio.gather(sending, return_exceptions=True)
                        return  # rewound: reopen the streams from the new positions
                    inflight = sending
                if time.monotonic() >= self._next_checkpoint or (inflight is not None and queue.empty()):
                    if inflight is not None:
                        done, inflight = inflight, None
                        if await self._apply(await _until(done, stop)):
                            return
                    if time.monotonic() >= self._next_checkpoint:
                        if self._broken and time.monotonic() >= self._next_recheck and await self._backfill(stop):
                            return
                        caught_up()
                        if await self._checkpoint():
                            return
            if inflight is not None:
                done, inflight = inflight, None
                await self._apply(await _until(done, stop))
            caught_up()
        except _Stopped:
            return  # writes still waiting for the target are dropped: their changes were not checkpointed
        finally:
            if inflight is not None:
                inflight.cancel()
                with contextlib.suppress(BaseException):
                    await inflight
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
            await stream.aclose()

    def _caught_up(self, positions: dict[int, Offset]) -> None:
        """The stream's own positions, once every change it read was written: they also move on
        what carries nothing to write (system events, SEQNO_ADVANCED, the end of a snapshot whose
        last seqnos the stream does not send), so an idle replication stands at the source's high
        seqnos and `changes_left` is 0."""
        mine = self.positions
        for vb, offset in positions.items():
            if offset.seqno > mine[vb].seqno:
                mine[vb] = offset

    async def _backfill(self, stop: asyncio.Event) -> bool:
        """Send the documents of each broken mapping whose collection the target has now: the
        source's documents of that collection up to its high seqnos now, read by a stream of that
        collection alone (goxdcr backfills a fixed mapping from seqno 0 likewise; what the target
        already has is refused as the same version). The main stream waits meanwhile. True if the
        target lost writes meanwhile (rewound: the streams reopen)."""
        self._next_recheck = time.monotonic() + RECHECK_INTERVAL
        for names in await self._collections.recheck(sorted(self._broken)):
            ends = await self.source.high_seqnos()
            sent = 0
            stream = self.source.events(start="beginning", end=ends, collections=".".join(names), include_xattrs=True)
            batch: list[Change] = []
            try:
                async for ev in stream:
                    if stop.is_set():
                        return False  # the names stay broken: the next run sends them
                    if ev.event in DOCUMENTS and (change := self._filters.apply(self._change(ev))) is not None:
                        batch.append(change)
                    if len(batch) >= self.settings.batch_size:
                        sent += len(batch)
                        if await self._apply((*await _until(asyncio.ensure_future(self._send(batch)), stop), ())):
                            return True
                        batch = []
                if batch:
                    sent += len(batch)
                    if await self._apply((*await _until(asyncio.ensure_future(self._send(batch)), stop), ())):
                        return True
            except FilterError:
                log.info("collection %s.%s is gone from the source: nothing to backfill", *names)
            except _Stopped:
                return False
            finally:
                await stream.aclose()
            self._broken.discard(names)
            self.stats["docs_backfilled"] += sent
            log.info("backfilled %d documents of %s.%s, which the target has now", sent, *names)
        return False

    def _change(self, ev) -> Change:
        if ev.event == "mutation":
            return Change(SET, ev.key, ev.value, ev.cas, ev.rev_seqno, ev.flags, ev.expiry, ev.datatype,
                          ev.collection_id)
        return Change(DELETE if ev.event == "deletion" else EXPIRE, ev.key, ev.value, ev.cas, ev.rev_seqno, 0,
                      ev.delete_time, ev.datatype, ev.collection_id)

    async def _write_batch(self, batch: list):
        """Write one batch; what `_apply` needs to count it and advance the positions."""
        stats = self.stats
        changes: list[Change] = []
        after: list[tuple[int, Offset]] = []
        for ev in batch:
            kind = ev.event
            if kind == "rollback":
                stats["source_rollbacks"] += 1
                after.append((ev.vbucket, ev.offset))
                continue
            if kind not in DOCUMENTS:
                continue  # system events, stream ends: nothing to write (see _caught_up for their seqnos)
            stats["docs_received"] += 1
            after.append((ev.vbucket, Offset(ev.vbuuid, ev.seqno, ev.snapshot_start, ev.snapshot_end)))
            change = self._filters.apply(self._change(ev))
            if change is None:
                stats["docs_filtered"] += 1
                continue
            if ev.seqno <= self._sent_high.get(ev.vbucket, 0):
                stats["docs_resent"] += 1
            else:
                self._sent_high[ev.vbucket] = ev.seqno
            changes.append(change)
        changes, outcomes = await self._send(changes)
        return changes, outcomes, after

    async def _send(self, changes: list[Change]) -> tuple[list[Change], list]:
        """Route the changes to their target collections, resolve conflicts at the source for large
        ones, and write the rest: (the changes written, their outcomes)."""
        stats = self.stats
        if any(c.collection for c in changes):
            ids = await self._collections.target_ids({c.collection for c in changes})
            mapped = []
            for c in changes:
                target_id = ids[c.collection]
                if target_id is not None:
                    mapped.append(c._replace(collection=target_id))
                    continue
                stats["docs_other_collections"] += 1
                names = self._collections.names_of(c.collection)
                if names is not None and names not in self._broken:
                    # Skipped, but not forgotten: the checkpoints carry the names until the target
                    # has the collection and the source's documents of it were sent (_backfill).
                    log.warning("the target has no collection %s.%s: its documents wait until it does", *names)
                    self._broken.add(names)
            changes = mapped
        if not changes:
            return [], []
        began = time.monotonic()
        losers = await source_side_losers(self.target, changes, self.mode, self.settings.optimistic_threshold)
        if losers:
            stats["failed_cr_source"] += len(losers)
            changes = [c for i, c in enumerate(changes) if i not in losers]
        retries = self.target.retries
        outcomes = await self.target.write(changes)
        stats["target_retries"] += self.target.retries - retries
        stats["batches"] += 1
        latency = (time.monotonic() - began) * 1000
        stats["latency_ms_last"] = round(latency, 3)
        stats["latency_ms_max"] = max(stats["latency_ms_max"], round(latency, 3))
        return changes, outcomes

    async def _apply(self, written) -> bool:
        """Count a written batch and advance the positions; True if the target lost writes (rewound)."""
        changes, outcomes, after = written
        stats = self.stats
        # A reply from another branch than we knew: the target failed over or restarted, and may
        # have lost what we wrote before. Checked before this batch's writes are recorded, which
        # are on the new branch.
        moved = {o.vbucket for o in outcomes if o.vbuuid is not None
                 and self._target_uuids.setdefault(o.vbucket, o.vbuuid) != o.vbuuid}
        lost = await self._lost_target_vbuckets(moved) if moved else {}
        for change, o in zip(changes, outcomes, strict=True):
            if o.status == 0:
                stats["docs_written"] += 1
                stats[{SET: "sets_written", DELETE: "deletions_written", EXPIRE: "expirations_written"}[change.kind]] \
                    += 1
                old = self._written.get(o.vbucket)
                if o.vbuuid is not None and (old is None or old[0] != o.vbuuid or old[1] < o.seqno):
                    self._written[o.vbucket] = (o.vbuuid, o.seqno)
            elif o.status == 0x02:  # KEY_EEXISTS: the target's version won (or is this very one)
                stats["failed_cr_target"] += 1
            else:
                stats["docs_failed"] += 1
                log.warning("target refused %s of %r with status 0x%x; not retried", change.kind, change.key,
                            o.status)
        for vb, offset in after:
            self.positions[vb] = offset
        if lost:
            self._rewind(lost)
            return True
        return False

    # -- the target's history ----------------------------------------------------------------
    async def _lost_target_vbuckets(self, vbuckets, logs=None) -> dict[int, list[tuple[int, int]]]:
        """{target vbucket: failover log} of those that no longer hold what the newest checkpoint
        recorded there, or what we wrote since (target_survives)."""
        vbuckets = list(vbuckets)
        if not vbuckets:
            return {}
        if logs is None:
            logs = await self.target.failover_logs(vbuckets)
        newest = self._generations.newest.target
        lost = {}
        for vb in vbuckets:
            log_ = logs[vb]
            if (vb in newest and not target_survives(newest[vb], log_)) or \
                    (vb in self._written and not target_survives(self._written[vb], log_)):
                lost[vb] = log_
            if log_:
                self._target_uuids[vb] = log_[0][0]
        return lost

    def _rewind(self, lost: dict[int, list[tuple[int, int]]]) -> None:
        """Send again, from the newest checkpoint still whole on the target, what the target lost."""
        gens = self._generations
        safe = gens.safe_for(lost)
        same_layout = self.source.num_vbuckets == self.target.client.num_vbuckets
        affected = set(lost) if same_layout else set(self.positions)
        for vb in sorted(affected):
            back = safe.source.get(vb, Offset())
            if back.seqno < self.positions[vb].seqno:
                log.warning("target vbucket %d lost writes (failover log %s): source vbucket %d goes back from "
                            "seqno %d to %d", vb if same_layout else -1, lost.get(vb, "?"), vb,
                            self.positions[vb].seqno, back.seqno)
            self.positions[vb] = back
        self._broken |= set(safe.broken)  # backfills done after `safe` may have been lost as well
        for tvb in lost:
            self._written.pop(tvb, None)
        gens.forget(safe, affected, lost)  # the checkpoints keep what they say of the other vbuckets
        self.stats["target_rewinds"] += 1

    # -- checkpoints and status ---------------------------------------------------------------
    async def _checkpoint(self, final: bool = False) -> bool:
        """Check the target kept what we wrote, then save a generation (the source positions, and
        each target vbucket's branch and high seqno now) and the status; True if the target lost
        writes (the caller reopens the streams from the rewound positions)."""
        self._next_checkpoint = time.monotonic() + self.settings.checkpoint_interval
        if self.source is None or self._generations is None:
            return False
        vbuckets = list(range(self.target.client.num_vbuckets))
        try:
            logs, highs = await asyncio.gather(self.target.failover_logs(vbuckets),
                                               self.target.client.high_seqnos(vbuckets))
        except Exception as e:  # the target is away: no checkpoint now (the previous one stays valid)
            log.log(logging.WARNING if final else logging.INFO, "no checkpoint: the target did not answer (%s)", e)
            return False
        lost = await self._lost_target_vbuckets(vbuckets, logs)
        if lost:
            self._rewind(lost)
            if not final:
                return True
        target = {vb: (logs[vb][0][0], highs[vb]) for vb in vbuckets if logs[vb]}
        self._generations.add(Generation(dict(self.positions), target, tuple(sorted(self._broken))))
        self._written.clear()
        await asyncio.to_thread(self._store.save, self._generations)
        self.stats["checkpoints"] += 1
        with contextlib.suppress(Exception):  # the source may be down: "changes left" waits for it
            highs = await asyncio.wait_for(self.source.high_seqnos(), 10)
            self.stats["changes_left"] = sum(max(0, h - self.positions[vb].seqno) for vb, h in highs.items()
                                             if vb in self.positions)
        await asyncio.to_thread(self.write_status)
        log.info("checkpoint: %s", " ".join(f"{k}={v}" for k, v in self.stats.items() if v))
        return False

    def status(self) -> dict:
        return {"source": _redact(self.source_url), "target": _redact(self.target_url),
                "conflict_resolution": self.mode.value if self.mode else None, "pid": os.getpid(),
                "time": time.time(), "stats": dict(self.stats)}

    def write_status(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        write_atomically(self.state_dir / "status.json", json.dumps(self.status(), indent=1))


class _Stopped(Exception):
    """Stop was asked while writes waited for a target that does not answer."""


async def _until(task: asyncio.Task, stop: asyncio.Event, *also: asyncio.Task):
    """The task's result, unless `stop` is set first (a target that is down retries forever): then
    the task and `also` are cancelled and _Stopped raised."""
    stopper = asyncio.ensure_future(stop.wait())
    try:
        done, _ = await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if task in done:
        return task.result()
    for t in (task, *also):
        t.cancel()
        with contextlib.suppress(BaseException):
            await t
    raise _Stopped


def _redact(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return url if "@" not in parts.netloc else url.replace(parts.netloc, parts.netloc.rpartition("@")[2])
