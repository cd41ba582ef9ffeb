"""Faults: what the server can be made to suffer, on demand, for people testing their DCP
consumers against it. Each fault happens the way it happens in Couchbase, so a consumer meets
what it would meet there:

* `failover` - vbuckets start a new branch of history (engine `Bucket.failover`): a new failover
  entry at the high seqno, or after losing what was not persisted (unclean). Their streams end
  with STATE_CHANGED; a consumer's next stream request is judged by the rollback rules.
* `rollback` - a vbucket loses everything above a seqno, memory and disk, and starts a new branch
  there, as an unclean restart would (engine `Bucket.rollback(new_branch=True)`, the path the
  replica consumer and warm-up use). Its streams end with ROLLBACK.
* `end_streams` - producer streams end with a chosen reason; SLOW drops the stream's checkpoint
  cursor instead, as memory pressure does (a consumer that opted into cursor dropping is moved
  to a disk backfill, any other gets STREAM_END(SLOW)). Through streams.py, the one module that
  reaches DCP connections.
* `drop_connections` - KV connections (by bucket, by DCP name, or all) are cut at once, with
  nothing queued sent, as a network failure cuts them.
* persistence pause and resume - the flusher takes no more batches of the bucket (the switch
  STOP_PERSISTENCE and START_PERSISTENCE turn): writes are acknowledged from memory, the
  persisted seqno and SEQNO_PERSISTENCE stop moving. A server that closes flushes everything
  anyway and marks the shutdown clean, paused or not: a pause never holds up `close()`.
* delays - KV requests are held before they run (delays.py).
* `fail_over_node` - on a node of `dcpflow cluster`, the cluster manager's hard failover of a node
  (replication/cluster.py), through the hook the node sets (`node_failover`).

Faults that last (a paused bucket, delay rules) are listed by `active()` and undone by `clear()`;
every fault injected is remembered in `recent` (bounded).
"""

import time
from collections import deque

from dcpflow.engine import VBucketState
from dcpflow.protocol.dcp import StreamEndReason

from . import streams
from .delays import Delays, opcode_label

#: Faults remembered for `GET /faults`.
MAX_RECENT = 100
#: Stream-end reasons a fault may send: OK and CLOSED are answers to the consumer (its end seqno
#: reached, its own CLOSE_STREAM), never something that happens to it.
END_REASONS = tuple(r for r in StreamEndReason if r not in (StreamEndReason.OK, StreamEndReason.CLOSED))


class FaultError(ValueError):
    """A fault that cannot be injected as asked; `field` names the parameter at fault."""

    def __init__(self, message: str, field: str = "_"):
        super().__init__(message)
        self.field = field


class BucketGone(Exception):
    """The bucket was dropped while the fault waited for its turn."""


class Faults:
    """The fault injector of one Server (`server.faults`); see the module docstring."""

    def __init__(self, server):
        self.server = server
        self.delays = Delays(self._delays_changed)
        self.recent: deque[dict] = deque(maxlen=MAX_RECENT)
        #: async fn(address) -> dict, the cluster manager's failover of a node; a dcpflow cluster
        #: node sets it (dcpflow/node.py). None on a single server.
        self.node_failover = None

    # -- bookkeeping ------------------------------------------------------------------------------
    def _note(self, fault: str, **detail) -> dict:
        entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "fault": fault, **detail}
        self.recent.append(entry)
        return entry

    def _delays_changed(self) -> None:
        for conn in list(self.server.connections):
            conn.refresh_commands()

    def active(self) -> dict:
        """Faults in force: paused buckets (with what waits to be persisted) and delay rules."""
        paused = []
        for name, bucket in self.server.buckets.items():
            if bucket.persistence_paused:
                paused.append({"bucket": name, "disk_queue_items": bucket.engine.stats()["ep_queue_size"]})
        return {"persistence_paused": paused, "delays": [r.describe() for r in self.delays.rules()],
                "recent": list(self.recent)}

    def clear(self) -> dict:
        """Undo every fault in force: resume persistence everywhere, remove every delay."""
        resumed = [self.resume_persistence(b)["bucket"] for b in list(self.server.buckets.values())
                   if b.persistence_paused]
        cleared = [opcode_label(r.opcode) for r in self.delays.clear()]
        self._note("clear", resumed=resumed, delays_cleared=cleared)
        return {"persistence_resumed": resumed, "delays_cleared": cleared}

    def close(self) -> None:
        """The server stops: release every held request (their connections are closing)."""
        self.delays.clear()

    # -- vbuckets ---------------------------------------------------------------------------------
    def _active_vbuckets(self, engine, vbids, field: str) -> None:
        for vbid in vbids:
            vb = engine.get_vbucket(vbid)
            if vb is None:
                raise FaultError(f"vbucket {vbid} is not on this node", field)
            if vb.state != VBucketState.ACTIVE:
                raise FaultError(f"vbucket {vbid} is {vb.state.name.lower()} on this node: only an active vbucket "
                                 f"fails over or rolls back here (a node failover promotes replicas)", field)

    async def failover(self, bucket, vbids: list[int], *, unclean: bool = False) -> dict:
        """Fail over active vbuckets of `bucket` (a ServerBucket); all are checked before any fails
        over. No flush batch is in flight meanwhile (an unclean failover rewinds the store)."""
        async with self.server.maintenance():
            engine = bucket.engine
            if engine.closed:
                raise BucketGone(bucket.name)
            self._active_vbuckets(engine, vbids, "vbuckets")
            ended = len(streams.open_streams(self.server, bucket, set(vbids)))
            done = []
            for vbid in vbids:
                vb = engine.vbucket(vbid)
                high = vb.high_seqno
                entry = engine.failover(vbid, unclean=unclean)
                done.append({"vbucket": vbid, "uuid": entry.uuid, "seqno": entry.seqno,
                             "high_seqno_before": high, "lost": high - vb.high_seqno})
        self._note("failover", bucket=bucket.name, unclean=unclean, vbuckets=[d["vbucket"] for d in done])
        return {"bucket": bucket.name, "unclean": unclean, "vbuckets": done, "streams_ended": ended}

    async def rollback(self, bucket, vbid: int, seqno: int) -> dict:
        """Roll an active vbucket back to `seqno` as an unclean restart would: what is above it is
        gone from memory and disk, and a new failover entry starts where it stands."""
        async with self.server.maintenance():
            engine = bucket.engine
            if engine.closed:
                raise BucketGone(bucket.name)
            self._active_vbuckets(engine, [vbid], "vbucket")
            vb = engine.vbucket(vbid)
            high = vb.high_seqno
            if seqno >= high:
                raise FaultError(f"vbucket {vbid}'s high seqno is {high}: roll back to a seqno below it", "seqno")
            ended = len(streams.open_streams(self.server, bucket, {vbid}))
            reached = engine.rollback(vbid, seqno, new_branch=True)
            entry = vb.failover.latest
        self._note("rollback", bucket=bucket.name, vbucket=vbid, seqno=seqno, reached=reached)
        return {"bucket": bucket.name, "vbucket": vbid, "seqno": seqno, "reached": reached,
                "high_seqno_before": high, "lost": high - reached, "uuid": entry.uuid, "entry_seqno": entry.seqno,
                "streams_ended": ended}

    # -- streams and connections ------------------------------------------------------------------
    def end_streams(self, bucket, reason: StreamEndReason, *, vbids: list[int] | None = None,
                    name: str | None = None) -> dict:
        """End the open producer streams of `bucket` (on `vbids`, of the DCP connection `name`, when
        given) with `reason`; SLOW drops their cursors (streams.drop_cursor)."""
        if reason not in END_REASONS:
            raise FaultError(f"{reason.name} is not something that happens to a consumer (OK ends a stream at its "
                             "end seqno, CLOSED answers its own CLOSE_STREAM)", "reason")
        refs = streams.open_streams(self.server, bucket, None if vbids is None else set(vbids), name)
        out = []
        for ref in refs:
            item = ref.describe()
            if reason == StreamEndReason.SLOW:
                item["outcome"] = {"backfill": "cursor dropped: the stream goes on from disk",
                                   "slow": "cursor dropped: STREAM_END(SLOW)",
                                   "no cursor": "no memory cursor to drop (a disk-only stream): left alone"}[
                    streams.drop_cursor(ref)]
            else:
                streams.end(ref, reason)
                item["outcome"] = f"STREAM_END({reason.name})"
            out.append(item)
        self._note("end-streams", bucket=bucket.name, reason=reason.name, streams=len(out))
        return {"bucket": bucket.name, "reason": reason.name, "streams": out}

    def drop_connections(self, *, bucket=None, name: str | None = None) -> dict:
        """Cut KV connections at once: those of `bucket`, those whose DCP connection is `name`, or,
        with neither, every one. The management listener's own connections are not KV ones."""
        dropped = []
        for conn in list(self.server.connections):
            if bucket is not None and conn.bucket is not bucket:
                continue
            dcp = streams.dcp_name(conn)
            if name is not None and dcp != name:
                continue
            dropped.append({"peer": conn.peer, "bucket": conn.bucket.name if conn.bucket is not None else None,
                            "dcp": dcp})
            conn.drop()
        self._note("drop-connections", bucket=bucket.name if bucket is not None else None, name=name,
                   connections=len(dropped))
        return {"dropped": len(dropped), "connections": dropped}

    # -- persistence ------------------------------------------------------------------------------
    async def pause_persistence(self, bucket) -> dict:
        """The flusher takes no more batches of `bucket`; answers once a batch being written is
        on disk, so nothing more reaches the disk from then on."""
        bucket.persistence_paused = True
        await self.server.flush_settled()
        self._note("pause-persistence", bucket=bucket.name)
        return self._persistence(bucket)

    def resume_persistence(self, bucket) -> dict:
        bucket.persistence_paused = False
        self.server.wake_flusher()
        self._note("resume-persistence", bucket=bucket.name)
        return self._persistence(bucket)

    @staticmethod
    def _persistence(bucket) -> dict:
        return {"bucket": bucket.name, "paused": bucket.persistence_paused,
                "disk_queue_items": bucket.engine.stats()["ep_queue_size"]}

    # -- delays -----------------------------------------------------------------------------------
    def add_delay(self, opcode, seconds: float, duration: float | None) -> dict:
        try:
            rule = self.delays.add(opcode, seconds, duration)
        except ValueError as e:
            raise FaultError(str(e)) from None
        self._note("delay", **{k: v for k, v in rule.describe().items() if k in ("opcode", "seconds")},
                   duration=duration)
        return rule.describe()

    def clear_delays(self, opcode=None) -> dict:
        removed = [opcode_label(r.opcode) for r in self.delays.clear(opcode)]
        self._note("clear-delays", delays_cleared=removed)
        return {"delays_cleared": removed}

    # -- nodes ------------------------------------------------------------------------------------
    async def fail_over_node(self, address: str | None) -> dict:
        """Hard failover of a node of the dcpflow cluster this server belongs to (this node when
        `address` is None): its active vbuckets are promoted on their replicas."""
        if self.node_failover is None:
            raise FaultError("this server is not a node of a dcpflow cluster (`dcpflow cluster up`): fail over its "
                             "vbuckets instead (POST /faults/buckets/<bucket>/failover)", "node")
        address = address or f"{self.server.config.host}:{self.server.port}"
        result = await self.node_failover(address)  # FaultError when the cluster refuses
        self._note("failover-node", node=address)
        return result
