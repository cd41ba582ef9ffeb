"""The management plane's memory: the last minutes of ops/s and DCP backlog (the page's charts),
the recent events (the page's event log), and counters of rollbacks and failovers (/metrics).

Events come from two places:

* the engine's vbucket listeners, at the moment they happen: a rollback (a replica or consumer
  vbucket rolled back, or an active by fault injection), a failover (a vbucket that became
  active with a new failover entry - a new branch of history - or an active given one by fault
  injection), a takeover (it became active without one: handed over by DCP);
* a sample every SAMPLE_SECONDS of the DCP connections (dcpview.py): connections opened and
  closed, and streams that ended, with their reason (STATE_CHANGED, ROLLBACK, CLOSED, OK...).
  Sampled, so a stream that starts and ends between two samples is not reported; the management
  API itself records what it does (bucket created, dropped, flushed).

Everything is bounded: HISTORY samples, MAX_EVENTS events.
"""

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from typing import NamedTuple

from dcpflow.engine import VBucketState

from . import dcpview

log = logging.getLogger("dcpflow.server.mgmt")

SAMPLE_SECONDS = 1.0
HISTORY = 300  # samples: five minutes of charts
MAX_EVENTS = 200


class Event(NamedTuple):
    time: float
    kind: str  # failover, takeover, rollback, stream-end, dcp, bucket, flush, fault, user
    bucket: str
    text: str


class Sample(NamedTuple):
    time: float
    ops_per_second: dict[str, float]  # bucket -> KV ops/s since the previous sample
    backlog: dict[str, int]  # bucket -> DCP items remaining over its producer streams


def reason_name(reason) -> str:
    if reason is None:
        return "connection closed"
    return getattr(reason, "name", None) or _stream_end_name(reason)


def _stream_end_name(reason: int) -> str:
    from dcpflow.protocol.dcp import StreamEndReason

    try:
        return StreamEndReason(reason).name
    except ValueError:
        return str(reason)


class Observer:
    def __init__(self, server):
        self.server = server
        self.events: deque[Event] = deque(maxlen=MAX_EVENTS)
        self.samples: deque[Sample] = deque(maxlen=HISTORY)
        self.rollbacks: Counter[str] = Counter()  # bucket -> vbucket rollbacks applied on this node
        self.failovers: Counter[str] = Counter()  # bucket -> vbuckets that became active with a new entry
        self._listeners: dict[str, tuple[object, object]] = {}  # bucket -> (engine, listener)
        self._vbuckets: dict[tuple[str, int], tuple[VBucketState, int]] = {}  # (bucket, vb) -> (state, uuid)
        self._ops: dict[str, tuple[float, int]] = {}  # bucket -> (time, ops counted) at the last sample
        self._streams: dict[tuple[int, int, int | None], tuple[object, str, str]] = {}
        # id(dcp) -> (dcp, name, type, bucket): the object is held until the next sample, so its id is not reused
        self._connections: dict[int, tuple[object, str, str, str]] = {}
        self._task: asyncio.Task | None = None

    # -- life cycle -------------------------------------------------------------------------------
    def start(self) -> None:
        self._attach()
        self.sample()
        self._task = asyncio.create_task(self._run(), name="dcpflow-mgmt-sampler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for engine, listener in self._listeners.values():
            with contextlib.suppress(ValueError):
                engine.remove_vbucket_listener(listener)
        self._listeners.clear()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_SECONDS)
            try:
                self.sample()
            except Exception:  # a sampling bug must not end the charts for good
                log.exception("management sampler failed")

    # -- events -----------------------------------------------------------------------------------
    def record(self, kind: str, bucket: str, text: str) -> None:
        self.events.append(Event(time.time(), kind, bucket, text))

    def _attach(self) -> None:
        """Listen to every served bucket's vbucket changes (buckets come and go at run time)."""
        for name, bucket in list(self.server.buckets.items()):
            engine = bucket.engine
            known = self._listeners.get(name)
            if known is not None and known[0] is engine:
                continue
            listener = self._vbucket_listener(name, engine)
            engine.add_vbucket_listener(listener)
            self._listeners[name] = (engine, listener)
            for vbid, vb in engine.vbuckets.items():
                self._vbuckets[(name, vbid)] = (vb.state, vb.uuid)
        for name in [n for n in self._listeners if n not in self.server.buckets]:
            del self._listeners[name]
            for key in [k for k in self._vbuckets if k[0] == name]:
                del self._vbuckets[key]

    def _vbucket_listener(self, bucket: str, engine):
        def on_event(vbid: int, event: str) -> None:
            vb = engine.get_vbucket(vbid)
            if event == "rollback" and vb is not None:
                self.rollbacks[bucket] += 1
                self.record("rollback", bucket, f"vb {vbid} rolled back to seqno {vb.high_seqno}")
            elif event == "failover" and vb is not None:
                self.failovers[bucket] += 1
                entry = vb.failover.entries[0]
                self.record("failover", bucket, f"vb {vbid} failed over in place: a new failover entry, uuid "
                            f"{entry.uuid} at seqno {entry.seqno}")
            elif event == "state" and vb is not None:
                before = self._vbuckets.get((bucket, vbid))
                if before is not None and vb.state == VBucketState.ACTIVE and before[0] != VBucketState.ACTIVE:
                    if vb.uuid != before[1]:
                        self.failovers[bucket] += 1
                        entry = vb.failover.entries[0]
                        self.record("failover", bucket, f"vb {vbid} became active ({before[0].name.lower()} "
                                    f"before) with a new failover entry: uuid {entry.uuid} at seqno {entry.seqno}")
                    else:
                        self.record("takeover", bucket, f"vb {vbid} became active by takeover (no new "
                                    f"failover entry)")
            if event == "deleted":
                # Deleted, or emptied by a flush and created again right after: see it once settled.
                self._vbuckets.pop((bucket, vbid), None)
                asyncio.get_running_loop().call_soon(self._remember, bucket, engine, vbid)
            else:
                self._remember(bucket, engine, vbid)

        return on_event

    def _remember(self, bucket: str, engine, vbid: int) -> None:
        vb = engine.get_vbucket(vbid)
        if vb is not None:
            self._vbuckets[(bucket, vbid)] = (vb.state, vb.uuid)

    # -- samples ----------------------------------------------------------------------------------
    def sample(self) -> Sample:
        """One sample: ops/s and DCP backlog per bucket, and the DCP connections' and streams'
        comings and goings (events)."""
        self._attach()
        now = time.monotonic()
        ops: dict[str, float] = {}
        for name, bucket in list(self.server.buckets.items()):
            c = bucket.counters
            count = c.cmd_get + c.cmd_set + c.cmd_delete
            last = self._ops.get(name)
            ops[name] = 0.0 if last is None or now <= last[0] else max(0, count - last[1]) / (now - last[0])
            self._ops[name] = (now, count)
        for name in [n for n in self._ops if n not in self.server.buckets]:
            del self._ops[name]
        backlog = dict.fromkeys(self.server.buckets, 0)
        conns = dcpview.dcp_connections(self.server)
        kinds = {id(c.dcp): self._connections[id(c.dcp)][2] if id(c.dcp) in self._connections else dcpview.kind(c)
                 for c in conns}
        for conn in conns:
            if kinds[id(conn.dcp)] == "producer" and conn.dcp.bucket.name in backlog:
                backlog[conn.dcp.bucket.name] += dcpview.items_remaining(conn)
        self._watch_streams(conns, kinds)
        s = Sample(time.time(), ops, backlog)
        self.samples.append(s)
        return s

    def _watch_streams(self, conns, kinds: dict[int, str]) -> None:
        current_conns: dict[int, tuple[object, str, str, str]] = {}
        current: dict[tuple[int, int, int | None], tuple[object, str, str]] = {}
        for conn in conns:
            dcp, kind = conn.dcp, kinds[id(conn.dcp)]
            current_conns[id(dcp)] = (dcp, dcp.name, kind, dcp.bucket.name)
            if id(dcp) not in self._connections:
                self.record("dcp", dcp.bucket.name, f"DCP {kind} {dcp.name!r} opened by {conn.peer}")
            for (vb, sid), stream in dcpview.stream_objects(conn).items():
                if not dcpview.stream_ended(stream):
                    current[(id(dcp), vb, sid)] = (stream, dcp.name, dcp.bucket.name)
        for key, (stream, name, bucket) in self._streams.items():
            if current.get(key, (None,))[0] is not stream:
                vb, sid = key[1], key[2]
                where = f"vb {vb}" + (f" sid {sid}" if sid is not None else "")
                self.record("stream-end", bucket, f"{name!r} {where}: stream ended "
                            f"({reason_name(dcpview.end_reason(stream))})")
        for key, (_, name, kind, bucket) in self._connections.items():
            if key not in current_conns:
                self.record("dcp", bucket, f"DCP {kind} {name!r} closed")
        self._streams = current
        self._connections = current_conns

    def ops_per_second(self, bucket: str) -> float:
        return self.samples[-1].ops_per_second.get(bucket, 0.0) if self.samples else 0.0
