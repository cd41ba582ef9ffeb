"""Rollback mitigation: hand the application only changes that a failover cannot take back.

A DCP stream sends a change as soon as the active vbucket has it in memory. If the active then
dies before the change reached disk on it and on its replicas, the promoted replica does not have
it: the stream is rolled back, and an application that already acted on the change (indexed it,
sent it on) now holds something that never happened. Couchbase's own Java DCP client and the Kafka
connector ("persistence polling") and go-dcp avoid this the same way, and so does this module:

* Per vbucket, events are **held** in arrival order (`HoldGate`, sans-I/O).
* A poller asks every node that holds the vbucket - the active and each replica the cluster map
  lists (a replica slot of -1 is no copy) - how far it has persisted, with OBSERVE_SEQNO
  (kv_engine docs/BinaryProtocol.md, "Observe seqno"; the reply carries the vbucket UUID, the last
  persisted seqno and the current seqno, and in its failover format 1 also the UUID asked about and
  the last seqno received on that branch). The smallest persisted seqno among them is how far
  nothing can be rolled back by a failover to any of those copies.
* Held events at or below it are **released** to the application, in order per vbucket.
* A rollback drops the held events above the rollback point: they are never delivered. The
  Rollback event itself reaches the application only if it goes below what was already released
  (which mitigation makes unlikely, but a failover to a copy the map did not list can still do).
* Offsets (what the state store saves) are those of released events only: a `VbTracker` per
  vbucket replays the released events, markers and rollbacks the way the stream's own trackers do.

A node that does not answer (killed, not yet failed over) keeps its vbuckets' events held until
the cluster fails it over and the map no longer lists it: that is the point of waiting.

Memory: the held events, and the released ones the application has not taken yet, are bounded
by `max_held_bytes`. When the gate is full the reader stops
taking data from the feed, so the feed stops acknowledging bytes, and the producer stops at its
flow-control window: at most `max_held_bytes` held plus the connection buffer in flight. When
persistence stalls (a paused flusher, a dead replica the map still lists), delivery stops; nothing
is dropped and the read continues when persistence does.
"""

import asyncio
import contextlib
import logging
from collections import deque

from dcpflow.protocol import kv as kvproto
from dcpflow.protocol.status import Status

from .errors import ConnectError, ConnectionLostError, ServerError
from .hold import HoldGate
from .offsets import Offset
from .reader import Iterating

log = logging.getLogger("dcpflow.client")

def persisted_from(reply: kvproto.ObserveSeqnoResponse, uuid: int) -> int:
    """How far a copy has persisted what is on the branch `uuid`: the persisted seqno when the
    copy is on that branch; after a failover (format 1) only the part of the branch the new one
    kept (up to the last seqno received under `uuid`)."""
    if reply.failed_over:
        return min(reply.last_persisted_seqno, reply.last_received_seqno or 0)
    return reply.last_persisted_seqno if reply.vbucket_uuid == uuid else 0


async def observe_persisted(client, wanted: dict[int, int], timeout: float) -> dict[int, int]:
    """{vbucket: the smallest persisted seqno among the active and every replica the cluster map
    lists} for `wanted` {vbucket: UUID}; a vbucket some copy of which did not answer within
    `timeout` is absent (its events stay held), so a hung node holds back only the vbuckets it has
    a copy of. Refreshes the map when a copy says NOT_MY_VBUCKET."""
    cmap = client.cluster_map
    by_node: dict[int, list[int]] = {}
    for vb in wanted:
        for index in cmap.vbucket_map[vb]:
            if index >= 0:
                by_node.setdefault(index, []).append(vb)
    result = {vb: None for vb in wanted}
    remap = False

    async def ask(index: int, vbs: list[int]) -> None:
        nonlocal remap
        try:
            conn = await client.kv_connection(client._node_address(index))
            replies = await conn.call_many([kvproto.ObserveSeqno(vb, wanted[vb]) for vb in vbs], timeout)
        except (ConnectError, ConnectionLostError, ServerError, TimeoutError, OSError) as e:
            log.debug("OBSERVE_SEQNO to node %d: %s", index, e)
            for vb in vbs:
                result.pop(vb, None)
            return
        for vb, frame in zip(vbs, replies, strict=True):
            if frame.status != Status.SUCCESS:
                remap |= frame.status == Status.NOT_MY_VBUCKET
                result.pop(vb, None)
                continue
            seqno = persisted_from(kvproto.ObserveSeqnoResponse.from_frame(frame), wanted[vb])
            if vb in result:
                result[vb] = seqno if result[vb] is None else min(result[vb], seqno)

    async def ask_within(index: int, vbs: list[int]) -> None:
        try:
            await asyncio.wait_for(ask(index, vbs), timeout)  # a connect in progress goes on (shielded)
        except TimeoutError:
            log.debug("OBSERVE_SEQNO to node %d: no answer within %.1fs", index, timeout)
            for vb in vbs:
                result.pop(vb, None)

    await asyncio.gather(*(ask_within(i, vbs) for i, vbs in by_node.items()))
    if remap:
        with contextlib.suppress(ConnectError):
            await client.refresh_map()
    return {vb: s for vb, s in result.items() if s is not None}


class MitigatedStream(Iterating):
    """`client.events(...)` with rollback mitigation: an EventStream whose events pass a HoldGate.

    Two tasks feed it: the pump takes events from the stream into the gate, the poller asks for
    persisted seqnos every `interval` seconds; the application's iteration takes what they
    released. The pump stops while the events held and those released but not yet taken reach
    `max_held_bytes` (it resumes once the application has taken every released event), so the
    stream stops acknowledging bytes and the producer stops at its window."""

    def __init__(self, inner, client, interval: float):
        self.inner = inner  # an EventStream with gate_args set: it makes the gate once its starts are known
        self.client = client
        self.interval = interval
        self._ready: deque = deque()
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._error: BaseException | None = None
        self._pumped = False
        self._closed = False
        self._agen = self._run()

    @property
    def gate(self) -> HoldGate | None:
        return self.inner.gate

    @property
    def feed(self):
        return self.inner.feed

    @property
    def state(self):
        return self.inner.state

    @property
    def offsets(self) -> dict[int, Offset]:
        return self.inner.offsets

    @property
    def positions(self) -> dict[int, Offset]:
        return self.offsets

    @property
    def targets(self) -> dict[int, int]:
        return self.inner.targets

    @property
    def stats(self) -> dict:
        out = self.inner.stats
        if self.gate is not None:
            out.update(self.gate.stats, held_bytes=self.gate.bytes)
        return out

    def progress(self) -> tuple[int, int]:
        return self.inner.progress()

    async def save(self) -> None:
        await self.inner.save()

    async def aclose(self) -> None:
        """Close the read (also from another task while the application waits): held events are
        never delivered, and the offsets stay those of what was released."""
        self._closed = True
        self._wake.set()
        await self.inner.aclose()
        with contextlib.suppress(RuntimeError):
            await self._agen.aclose()

    def _deliver(self, events: list) -> None:
        if events:
            self._ready.extend(events)
            self._wake.set()

    def _full(self) -> bool:
        """Held events and released ones the application has not taken yet count together: the
        bound covers everything the reader keeps."""
        gate = self.gate
        return gate.bytes + gate.out_bytes >= gate.max_bytes

    async def _pump(self) -> None:
        try:
            inner = self.inner
            async for ev in inner:
                self._deliver(inner.gate.add(ev))  # the gate exists once the stream has started
                while self._full():
                    self._room.clear()
                    await self._room.wait()
        except BaseException as e:  # noqa: BLE001 - handed to the application's iteration
            if not isinstance(e, asyncio.CancelledError):
                self._error = e
            raise
        finally:
            self._pumped = True
            self._wake.set()

    async def _poll(self) -> None:
        # A node that does not answer within this holds back only its vbuckets, and the next poll
        # asks it again: the others go on at the poll's pace.
        timeout = min(float(self.client.options["connect_timeout"]), max(1.0, 10 * self.interval))
        while True:
            await asyncio.sleep(self.interval)
            gate = self.gate
            if gate is None:
                continue
            gate.stats["polls"] += 1  # poll periods passed (a clock for tests and stats)
            wanted = gate.waiting()
            if not wanted:
                continue
            found = await observe_persisted(self.client, wanted, timeout)
            for vb, seqno in found.items():
                self._deliver(gate.persisted(vb, seqno))

    async def _run(self):
        pump = asyncio.ensure_future(self._pump())
        poll = asyncio.ensure_future(self._poll())
        poll.add_done_callback(lambda _: self._wake.set())
        try:
            ready = self._ready
            while not self._closed:
                if ready:
                    yield ready.popleft()
                    continue
                if self.gate is not None:
                    self.gate.out_bytes = 0  # the application has taken every released event
                self._room.set()
                if self._error is not None:
                    raise self._error
                if poll.done() and poll.exception() is not None:
                    raise poll.exception()
                if self._pumped and (self.gate is None or self.gate.empty):
                    break
                self._wake.clear()
                await self._wake.wait()
            if self.inner.state is not None and self.inner.feed is not None:
                await self.inner.save()
        finally:
            pump.cancel()
            poll.cancel()
            for task in (pump, poll):
                with contextlib.suppress(BaseException):
                    await task
