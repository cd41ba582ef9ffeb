"""Helpers for the socket-free DCP tests: drive the state machines of dcpflow.dcp with messages and
read back what they return, in the manner of h11 (bytes or events in, actions or bytes out).

The engine is the real one (`Bucket` with its store in tmp_path, see conftest's `engine`): it is
not a socket, and it gives the failover logs, checkpoints, purges and persisted seqnos the rules
read. A backfill is run here the way server/backfill.py runs it, on the calling thread: open the
scan, apply `dcp.backfills.opened` to its purge seqno, hand the pages to the stream."""

import pytest

from dcpflow.dcp.backfills import opened
from dcpflow.dcp.producer import DcpProducer
from dcpflow.engine import Bucket, VBucketState
from dcpflow.engine.store import EncodedPage
from dcpflow.protocol import dcp
from dcpflow.protocol.dcp import OpenFlag, StreamEndReason, SystemEventId
from dcpflow.protocol.frame import Frame, FrameDecoder
from dcpflow.protocol.keys import split_key

MAX = 0xFFFFFFFFFFFFFFFF


def make_engine(path, num_vbuckets: int = 4, state: VBucketState = VBucketState.ACTIVE) -> Bucket:
    bucket = Bucket("default", path, num_vbuckets, synchronous="OFF")
    for vb in range(num_vbuckets):
        bucket.set_vbucket_state(vb, state)
    return bucket


def engine_fixture(num_vbuckets: int):
    """A module's `engine` fixture: a bucket of `num_vbuckets` active vbuckets in tmp_path."""
    @pytest.fixture
    def engine(tmp_path):
        bucket = make_engine(tmp_path, num_vbuckets)
        yield bucket
        bucket.close(clean=False)
    return engine


def producer(engine, flags: int = OpenFlag.PRODUCER, name: str = "t", **kw) -> DcpProducer:
    """A producer connection; the engine's cursor drops reach it as they reach the server's shell,
    through the bucket's cursor listeners (`cursor_dropped`; the WAKE it answers is what `drain`'s
    send passes do anyway)."""
    p = DcpProducer(name, flags, engine, now=100.0, created=0.0, **kw)
    engine.add_cursor_listener(p.cursor_dropped)
    return p


def fill(engine, vb: int, n: int, prefix: str = "k", value: bytes = b'{"v":1}') -> list[bytes]:
    """Write `n` documents to vbucket `vb` (seqnos high+1 .. high+n)."""
    keys = [f"{prefix}{i}".encode() for i in range(n)]
    v = engine.vbucket(vb)
    for k in keys:
        v.set(k, value)
    return keys


def to_disk_only(engine, vb: int) -> None:
    """Persist everything and close the open checkpoint: a stream from an earlier seqno then needs
    a backfill (the closed checkpoints are released once no cursor holds them)."""
    engine.flush_all()
    engine.vbucket(vb).checkpoint_manager.create_checkpoint()
    engine.flush_all()


def written(p: DcpProducer, vb: int) -> None:
    """The engine told of a write to `vb`: its streams may have work (the shell's seqno listener)."""
    for stream in p.registry.by_vb.get(vb, ()):
        p.wake(stream)


def request(vb: int, start: int = 0, end: int = MAX, uuid: int = 0, snap_start: int | None = None,
            snap_end: int | None = None, flags: int = 0, value: bytes = b"", opaque: int = 1
            ) -> dcp.DcpStreamRequest:
    """A DCP_STREAM_REQ as the producer receives it: encoded and decoded again, so the protocol's
    checks of the frame (extras, flags, JSON value) run as they do on a socket."""
    snap_start = start if snap_start is None else snap_start
    snap_end = start if snap_end is None else snap_end
    raw = dcp.DcpStreamRequest(vb, start, end, uuid, snap_start, snap_end, flags, opaque=opaque,
                               value=value).encode()
    return dcp.DcpStreamRequest.from_frame(frame(raw))


def frame(raw: bytes) -> Frame:
    d = FrameDecoder()
    d.feed(raw)
    f = d.next_frame()
    assert f is not None and d.next_frame() is None
    return f


def decode(chunks) -> list:
    d = dcp.DcpDecoder()
    d.feed(b"".join(bytes(c) for c in chunks))
    return list(d.messages())


def run_backfills(p: DcpProducer) -> int:
    """Run the connection's queued backfills to their end, as server/backfill.py does (one scan per
    stream, its pages handed in whole); how many ran."""
    store = p.engine.store
    ran = 0
    while p.backfills.waiting:
        stream = p.backfills.waiting.popitem(last=False)[0]
        if stream.dead or stream.backfill is None:
            continue
        rng = stream.backfill
        ran += 1
        scan = store.scan(stream.vbid, rng.start - 1, min(rng.end, stream.end_seqno), history=rng.history)
        try:
            outcome = opened(stream, scan.purge_seqno)
            if outcome is not None:
                p.end_stream(stream, outcome)
                continue
            stream.backfill_begin(scan.purge_seqno)
            encoded = stream.takes_encoded_pages  # pages SQLite encodes, as the shell asks for them
            while chunk := (scan.next_chunk(stream.opaque, stream.opts.collections) if encoded
                            else scan.next_rows()):
                if chunk.__class__ is EncodedPage:
                    stream.backfill_encoded(chunk)
                else:
                    stream.backfill_rows(chunk)
                if scan.closed:
                    break
            stream.backfill_complete()
        finally:
            if not scan.closed:
                scan.close()
            p.wake(stream)
    return ran


def drain(p: DcpProducer, *, backfill: bool = True, rounds: int = 1000) -> list:
    """Everything the connection sends now (send passes until none has anything), decoded; queued
    backfills run in between when `backfill`."""
    out: list = []
    for _ in range(rounds):
        sp = p.send_pass()
        out += sp.out
        ran = run_backfills(p) if backfill else 0
        if not sp.out and not sp.more and not ran:
            break
    return decode(out)


def items(messages) -> list:
    return [m for m in messages if isinstance(m, (dcp.DcpMutation, dcp.DcpDeletion, dcp.DcpExpiration))]


def markers(messages) -> list:
    return [m for m in messages if isinstance(m, dcp.DcpSnapshotMarker)]


def summary(messages) -> list[tuple]:
    """What a stream sent, in order: ("event", seqno, id, key), ("doc", seqno, cid, key), ("adv", seqno),
    ("end", reason); markers as ("marker", start, end)."""
    out = []
    for m in messages:
        if isinstance(m, dcp.DcpSystemEvent):
            out.append(("event", m.by_seqno, SystemEventId(m.event), m.key))
        elif isinstance(m, (dcp.DcpMutation, dcp.DcpDeletion)):
            cid, key = split_key(m.key)
            out.append(("doc", m.by_seqno, cid, key))
        elif isinstance(m, dcp.DcpSeqnoAdvanced):
            out.append(("adv", m.by_seqno))
        elif isinstance(m, dcp.DcpStreamEnd):
            out.append(("end", StreamEndReason(m.reason)))
        elif isinstance(m, dcp.DcpSnapshotMarker):
            out.append(("marker", m.start_seqno, m.end_seqno))
    return out


def no_markers(rows):
    return [r for r in rows if r[0] != "marker"]


def ends(messages) -> list[tuple[int, int]]:
    return [(m.vbucket, m.reason) for m in messages if isinstance(m, dcp.DcpStreamEnd)]
