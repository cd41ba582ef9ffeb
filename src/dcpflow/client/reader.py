"""The two ways to read a Feed: `EventStream` (one object per change) and `BatchReader` (Arrow
record batches). Both count data as consumed only when the application asks for the next item,
so the offsets they report never include something the application has not finished with.

Flow control: an EventStream acknowledges a segment's bytes once all its events were taken, so
at most the connection buffer (plus one message) is ever held. A BatchReader acknowledges bytes
as it decodes them into the batch it is building, because one batch (`max_rows`) may need more
bytes than the window: it holds at most the buffer plus one batch.
"""

import asyncio
import contextlib
import time

from dcpflow.protocol.dcp import (
    DcpAbort,
    DcpCommit,
    DcpDecoder,
    DcpDeletion,
    DcpExpiration,
    DcpMutation,
    DcpPrepare,
    DcpSeqnoAdvanced,
    DcpSnapshotMarker,
    DcpStreamEnd,
    DcpSystemEvent,
    sync_seqno,
)
from dcpflow.protocol.keys import decode_leb128

from .connection import Segment
from .events import Abort, Commit, Deletion, Expiration, Mutation, Prepare, SnapshotMarker, system_event
from .hold import HoldGate
from .offsets import Offset
from .streams import TIMEOUT, ConnLost, Feed, NewEnd, replay

_tn = tuple.__new__
#: A batch reader decodes what it holds once nothing has arrived for this long (seconds).
IDLE_DECODE = 0.02


def _split_key(key: bytes) -> tuple[int, bytes]:
    b = key[0]
    if b < 0x80:
        return b, key[1:]
    cid, used = decode_leb128(key)
    return cid, key[used:]


class Iterating:
    """What every read object shares (these, mitigation.MitigatedStream, groups.GroupReader): it
    is iterated through its async generator `_agen`, and `async with` closes it (`aclose`)."""

    _agen = None

    def __aiter__(self):
        return self._agen  # `async for` drives the generator directly: one frame less per item

    async def __anext__(self):
        return await self._agen.__anext__()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


class _Reader(Iterating):
    def __init__(self, client):
        self.client = client
        self.feed: Feed | None = None
        self.starts: dict[int, Offset] = {}
        self.ends: dict[int, int] = {}
        self._agen = self._run()
        client._readers.add(self)

    async def aclose(self) -> None:
        """Close the read's connections (also from another task while it waits for data)."""
        if self.feed is not None:
            await self.feed.close()
        with contextlib.suppress(RuntimeError):  # "already running": it ends by itself, the feed is closed
            await self._agen.aclose()
        self.client._readers.discard(self)

    @property
    def positions(self) -> dict[int, Offset]:
        """Exactly what has been consumed per vbucket (may be inside a snapshot)."""
        if self.feed is None:
            return dict(self.starts)
        return {vb: vs.consumed.position for vb, vs in self.feed.streams.items()}

    @property
    def stats(self) -> dict:
        return dict(self.feed.stats) if self.feed is not None else {}

    async def _open(self, vbuckets, start, end, state, rollback, ignore_purged, purge_seqnos=None, **feed_extra):
        """Resolve the read's starts and ends and start its Feed; `feed_extra` are FeedOptions
        (filter, history...)."""
        starts, ends, purge, loaded = await self.client._resolve(vbuckets, start, end, state)
        purge.update(purge_seqnos or {})
        self.starts, self.ends = starts, ends
        options = self.client._feed_options(rollback, ignore_purged, **feed_extra)
        self.feed = Feed(self.client, starts, ends, options, purge, end_now=isinstance(end, str) and end == "now")
        await self.feed.start()
        return loaded


class EventStream(_Reader):
    """`async for event in client.events(...)`; see DcpClient.events."""

    def __init__(self, client, vbuckets, start, end, state, rollback, markers, save_interval, ignore_purged,
                 feed_extra: dict | None = None):
        self._args = (vbuckets, start, end, state, rollback, ignore_purged)
        self._feed_extra = feed_extra or {}
        self.state = state
        self.markers = markers
        self.save_interval = save_interval
        self.targets: dict[int, int] = {}
        self._loaded = None
        self._last_save = time.monotonic()
        #: with rollback mitigation (mitigation.py): (max held bytes, markers asked for) and the
        #: HoldGate made once the starts are known; the offsets saved are then the gate's
        self.gate_args: tuple | None = None
        self.gate = None
        super().__init__(client)

    @property
    def offsets(self) -> dict[int, Offset]:
        """The committed offset of each vbucket: a safe point at or before what was consumed."""
        if self.gate is not None:
            return self.gate.offsets()
        if self.feed is None:
            return dict(self.starts)
        return {vb: vs.held if vs.held is not None else vs.consumed.committed for vb, vs in self.feed.streams.items()}

    def progress(self) -> tuple[int, int]:
        """(seqnos consumed, seqnos to reach) toward the high seqnos seen at the start."""
        done = total = 0
        positions = self.positions
        for vb, target in self.targets.items():
            start = self.starts.get(vb, Offset()).seqno
            if target > start:
                total += target - start
                done += max(0, min(positions.get(vb, Offset()).seqno, target) - start)
        return done, total

    async def save(self) -> None:
        """Save the committed offsets to the state store (atomically)."""
        if self.state is None:
            raise ValueError("this stream has no state store (events(state=...))")
        purge = {vb: vs.consumed.purge_seqno for vb, vs in self.feed.streams.items()} if self.feed else {}
        snapshot = self.client.state_for(self.offsets, purge, self._loaded)
        await asyncio.to_thread(self.state.save, snapshot)
        self._last_save = time.monotonic()

    async def _start(self) -> Feed:
        """Open the read: its feed, the mitigation gate, and the seqnos that progress counts to."""
        vbuckets, start, end, state, rollback, ignore_purged = self._args
        self._loaded = await self._open(vbuckets, start, end, state, rollback, ignore_purged, **self._feed_extra)
        if self.gate_args is not None:
            self.gate = HoldGate(dict(self.starts), *self.gate_args)
        # the ends themselves when bounded: a read bounded by "now" may lower them (streams.NewEnd)
        self.targets = self.ends if self.ends else await self.client.high_seqnos(list(self.starts))
        return self.feed

    async def _run(self):
        """The events, in order. Mutations and deletions (the bulk) are made here; the other
        messages by `_other`. Each tracker pair moves around the yield: `decoded` before the
        application sees the event, `consumed` once it asks for the next."""
        feed = await self._start()
        streams = feed.streams
        interval = self.save_interval
        timed = interval is not None and self.state is not None
        flags: dict[int, int] = {}  # the flags of each vbucket's current snapshot
        try:
            while True:
                if timed:  # an idle stream saves on time too: what was consumed must not wait for new data
                    item = await feed.next(max(0.0, self._last_save + interval - time.monotonic()))
                    if item is TIMEOUT:
                        await self.save()
                        continue
                else:
                    item = await feed.next()
                if item is None:
                    break
                if type(item) is not Segment:
                    steps: list = []
                    event = feed.handle_notice(item, steps)
                    if event is not None:
                        yield event
                    replay(streams, steps)
                    continue
                coll = item.conn.collections
                dec = DcpDecoder()
                dec.feed(item.data[item.starts[0]:item.end])
                for msg in dec.messages():
                    t = type(msg)
                    if t is DcpMutation:
                        vb, seq = msg.vbucket, msg.by_seqno
                        vs = streams[vb]
                        tr = vs.decoded
                        m = tr.marker
                        cid, key = _split_key(msg.key) if coll else (0, msg.key)
                        event = _tn(Mutation, (vb, seq, key, msg.value, msg.cas, msg.rev_seqno, msg.flags,
                                               msg.expiration, msg.datatype, tr.vbuuid, m[0] if m else seq,
                                               m[1] if m else seq, cid, flags.get(vb, 0)))
                        tr.item(seq)
                        yield event
                        vs.consumed.item(seq)
                    elif t is DcpDeletion or t is DcpExpiration:
                        vb, seq = msg.vbucket, msg.by_seqno
                        vs = streams[vb]
                        tr = vs.decoded
                        m = tr.marker
                        cid, key = _split_key(msg.key) if coll else (0, msg.key)
                        cls = Deletion if t is DcpDeletion else Expiration
                        event = _tn(cls, (vb, seq, key, msg.cas, msg.rev_seqno, msg.datatype, tr.vbuuid,
                                          m[0] if m else seq, m[1] if m else seq, cid, msg.delete_time or 0,
                                          msg.value, flags.get(vb, 0)))
                        tr.item(seq)
                        yield event
                        vs.consumed.item(seq)
                    else:
                        for event in self._other(msg, t, coll, flags):
                            yield event
                feed.done_with(item)
                if timed and time.monotonic() - self._last_save >= interval:
                    await self.save()
            if self.state is not None:
                await self.save()
        finally:
            await feed.close()

    def _other(self, msg, t, coll: bool, flags: dict[int, int]):
        """The events of a message that is not a mutation, deletion or expiration (a generator:
        what follows a yield runs when the application asks for the next event). Anything else in
        the bytes (noops, replies) was handled by the connection."""
        feed = self.feed
        streams = feed.streams
        if t is DcpPrepare or t is DcpCommit or t is DcpAbort:
            yield from self._sync_write(msg, t, coll)
        elif t is DcpSnapshotMarker:
            vs = streams[msg.vbucket]
            vs.decoded.snapshot(msg.start_seqno, msg.end_seqno)
            flags[msg.vbucket] = msg.flags
            if msg.purge_seqno:
                vs.decoded.purge_seqno = vs.consumed.purge_seqno = msg.purge_seqno
            if self.markers:
                yield SnapshotMarker(msg.vbucket, msg.start_seqno, msg.end_seqno, msg.flags)
            vs.consumed.snapshot(msg.start_seqno, msg.end_seqno)
        elif t is DcpStreamEnd:
            steps: list = []
            event = feed.stream_end(msg.vbucket, msg.reason, steps)
            if event is not None:
                yield event
            replay(streams, steps)
        elif t is DcpSeqnoAdvanced:
            vs = streams[msg.vbucket]
            vs.decoded.seqno_advanced(msg.by_seqno)
            vs.consumed.seqno_advanced(msg.by_seqno)
        elif t is DcpSystemEvent:
            vs = streams[msg.vbucket]
            event = system_event(msg.vbucket, msg.by_seqno, msg.event, msg.version, msg.key, msg.value,
                                 vs.decoded.vbuuid, self.client.names)
            uid = event.manifest_uid
            if uid is not None:
                vs.decoded.saw_manifest(uid)
            vs.decoded.item(msg.by_seqno)
            yield event
            if uid is not None:
                vs.consumed.saw_manifest(uid)
            vs.consumed.item(msg.by_seqno)

    def _sync_write(self, msg, t, coll: bool):
        """A DCP_PREPARE, COMMIT or ABORT (a read with sync_writes). While prepares are open the
        offset saved is the committed one from before the first of them (VbStream.held)."""
        vs = self.feed.streams[msg.vbucket]
        tr = vs.decoded
        cid, key = _split_key(msg.key) if coll else (0, msg.key)
        seq = sync_seqno(msg)
        if t is DcpPrepare:
            event = Prepare(msg.vbucket, seq, key, msg.value, msg.cas, msg.rev_seqno, msg.flags, msg.expiration,
                            msg.datatype, msg.durability_level, msg.deleted, tr.vbuuid, cid)
        else:
            event = (Commit if t is DcpCommit else Abort)(msg.vbucket, seq, key, msg.prepared_seqno, tr.vbuuid, cid)
        tr.item(seq)
        yield event
        if t is DcpPrepare:
            if not vs.open_prepares:
                vs.held = vs.consumed.committed
            vs.open_prepares.add(seq)
        else:
            vs.open_prepares.discard(msg.prepared_seqno)
            if not vs.open_prepares:
                vs.held = None
        vs.consumed.item(seq)


def _sizes(seg: Segment):
    """Wire size of each stream frame of a segment (numpy)."""
    import numpy as np

    from dcpflow.protocol.columns import frame_sizes
    return frame_sizes(seg.data, np.frombuffer(seg.starts, dtype=np.int64))


def _split(seg: Segment, max_frames: int, max_bytes: int) -> tuple[Segment, Segment | None]:
    """The first frames of a segment within both limits (at least one frame), and the rest."""
    import numpy as np
    sizes = _sizes(seg)
    k = min(len(sizes), max_frames, max(1, int(np.searchsorted(np.cumsum(sizes), max_bytes, side="right"))))
    if k == len(sizes):
        return seg, None
    charged = int(sizes[:k].sum())
    head = Segment(seg.conn, seg.data, seg.starts[:k], seg.starts[k - 1] + int(sizes[k - 1]), charged)
    return head, Segment(seg.conn, seg.data, seg.starts[k:], seg.end, seg.charged - charged)


class BatchReader(_Reader):
    """`async for batch in client.batches(...)`; see DcpClient.batches."""

    def __init__(self, client, ranges, end, max_rows, vbuckets, rollback, flush_interval, ignore_purged,
                 max_bytes: int = 64 * 1024 * 1024, feed_extra: dict | None = None, purge_seqnos=None):
        if not isinstance(max_rows, int) or max_rows < 1:
            raise ValueError(f"max_rows must be a positive integer, not {max_rows!r}")
        if not isinstance(max_bytes, int) or not 0 < max_bytes < 1 << 31:
            raise ValueError(f"max_bytes must be a positive integer below 2 GiB, not {max_bytes!r}")
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self._args = (vbuckets, ranges, end, rollback, ignore_purged)
        self.bounded = end is not None
        self.flush_interval = flush_interval
        self.rollbacks: list = []  # Rollback events, with rollback="resume"
        #: typed SystemEvents (collections created, dropped...) in stream order, as of the batches
        #: yielded so far plus the one being built; the caller takes them (and may clear the list)
        self.system_events: list = []
        self._feed_extra = feed_extra or {}
        self._purge_seqnos = purge_seqnos
        super().__init__(client)

    @property
    def purge_seqnos(self) -> dict[int, int]:
        """The purge seqno each vbucket's stream last reported (V2.2 markers): save it with the
        offsets, so a resume below it is not sent back to zero."""
        if self.feed is None:
            return dict(self._purge_seqnos or {})
        return {vb: vs.consumed.purge_seqno for vb, vs in self.feed.streams.items() if vs.consumed.purge_seqno}

    @property
    def schema(self):
        from .batches import SCHEMA
        return SCHEMA

    @property
    def offsets(self) -> dict[int, Offset]:
        """Per vbucket: with an end, the offset at the end seqno once it was reached (a snapshot
        boundary if the end closed a snapshot, else inside it, with the snapshot range the server
        needs to decide a rollback); before that, and without an end, the committed offset. A
        vbucket that started at or past its end stays at its start, or at its rollback point."""
        if self.feed is None:
            return dict(self.starts)
        out = {}
        for vb, vs in self.feed.streams.items():
            end = self.ends.get(vb)
            out[vb] = vs.consumed.committed if end is None else vs.consumed.range_end(end)
        return out

    async def _run(self):
        import pyarrow as pa

        from .batches import BatchBuilder
        vbuckets, ranges, end, rollback, ignore_purged = self._args
        await self._open(vbuckets, ranges, end, None, rollback, ignore_purged, self._purge_seqnos, **self._feed_extra)
        feed = self.feed
        builder = BatchBuilder(feed, self.ends if self.bounded else None, self.client.names, self.system_events)
        flush = self.flush_interval if self.flush_interval is not None else (None if self.bounded else 0.5)
        max_rows, max_bytes = self.max_rows, self.max_bytes
        pool = pa.default_memory_pool()
        carry = None
        try:
            done = False
            while not done:
                parts: list = []  # batches decoded while waiting for more data; joined when yielded
                rows = 0
                segs: list[Segment] = []
                steps: list = []
                events: list = []
                frames = size = 0
                deadline = None
                while rows + frames < max_rows and size < max_bytes:
                    if carry is not None:
                        item, carry = carry, None
                    else:
                        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                        idle = bool(segs) and not feed.peek_ready()
                        if idle:
                            timeout = IDLE_DECODE if timeout is None else min(timeout, IDLE_DECODE)
                        item = await feed.next(timeout)
                        if item is TIMEOUT:
                            if deadline is not None and time.monotonic() >= deadline:
                                break
                            # Nothing arrived for a moment: decode what we have, so stream ends are
                            # seen (a bounded read finishes only then).
                            part = builder.decode(segs, steps, events)
                            segs, frames = [], 0
                            if part is not None and part.num_rows:
                                parts.append(part)
                                rows += part.num_rows
                            continue
                    if item is None:
                        done = True
                        break
                    if type(item) is Segment:
                        room = max_rows - rows - frames
                        if len(item.starts) > room or size + item.charged > max_bytes:
                            item, carry = _split(item, room, max_bytes - size)
                        segs.append(item)
                        frames += len(item.starts)
                        size += item.charged
                        feed.done_with(item)
                        if deadline is None and flush is not None:
                            deadline = time.monotonic() + flush
                    elif type(item) is ConnLost and segs:
                        carry = item  # decode what came before it first: streams reopen from there
                        break
                    else:
                        event = feed.handle_notice(item, steps)
                        if event is not None and event.event == "rollback":
                            self.rollbacks.append(event)
                        elif type(item) is NewEnd and builder.end is not None:
                            builder.end[item.vbucket] = item.end
                if segs:
                    part = builder.decode(segs, steps, events)
                    if part is not None and part.num_rows:
                        parts.append(part)
                if parts:
                    batch = parts[0] if len(parts) == 1 else pa.concat_batches(parts)
                    del parts
                    yield batch
                    del batch
                    pool.release_unused()  # hand the decoding scratch back: RSS stays flat
                replay(feed.streams, steps)
        finally:
            await feed.close()
