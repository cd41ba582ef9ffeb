"""Consumer groups: several processes share a bucket's vbuckets and one set of offsets.

Like the Kafka connector's tasks and go-dcp's membership groups, with nothing outside the bucket:

* **Static membership** (`member=I, of=N`): member I reads an even, contiguous share of the
  vbuckets (`split`). Nothing is coordinated; running each index once is the operator's job.
* **Dynamic membership**: members coordinate through one document in the bucket,
  `_dcpflow:group:<name>:members` (the reserved key prefix below, in the default collection).
  It holds a generation number and, per member, a heartbeat counter and the generation the member
  has acknowledged. Every `lease / 5` seconds each member reads it, writes it back with CAS (a
  concurrent writer makes it read again), bumps its own counter, and drops every member whose
  counter it has not seen change for `lease` seconds of its own clock (so members' clocks need not
  agree). A join, a leave or a death bumps the generation (`Membership`).
* **Handover without overlap**: on a new generation every member stops reading, saves its offsets
  and acknowledges the generation; a member starts reading its share of the new generation only
  when every live member has acknowledged it, so the previous owner of a vbucket has stopped and
  saved first. A dead member cannot acknowledge, but it is no longer a member; and a member that
  could not renew its heartbeat for 0.75 x the lease stops reading on its own (it may have been
  declared dead), before any other member can have taken its vbuckets over.
* **Offsets** live in the bucket too, one document per vbucket
  (`_dcpflow:group:<name>:offset:<vb>`, the client's compact offset JSON): the committed offset of
  what the member's application has finished with. A new owner resumes from it, so nothing is
  skipped; changes after it that the previous owner had already handed out are handed out again
  (at least once, as a restart from saved offsets).

The group's own documents are changes of the bucket too: a group reader does not hand them to
the application (keys starting with `_dcpflow:`).
"""

import asyncio
import contextlib
import json
import logging
import os
import socket
import time

from dcpflow.protocol import kv as kvproto
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .errors import ClientError, ConnectError, ConnectionLostError, ServerError, status_name
from .events import Deletion, Expiration, Mutation
from .offsets import Offset
from .reader import Iterating

log = logging.getLogger("dcpflow.client")

#: Keys of the client's own documents; a group reader hides changes to them.
RESERVED_PREFIX = b"_dcpflow:"
JSON = 0x01
_RETRY = frozenset({Status.ETMPFAIL, Status.EBUSY, Status.NOT_MY_VBUCKET, Status.ENOMEM})


def split(num_vbuckets: int, members: int, index: int) -> list[int]:
    """Member `index` of `members`: an even, contiguous share of the vbuckets (sizes differ by at
    most one)."""
    if not 0 <= index < members:
        raise ValueError(f"member {index} of {members}: the index must be 0..{members - 1}")
    return list(range(index * num_vbuckets // members, (index + 1) * num_vbuckets // members))


def key_of(group: str, *parts) -> bytes:
    return b":".join([RESERVED_PREFIX + b"group", group.encode(), *(str(p).encode() for p in parts)])


class BucketDocs:
    """GET and CAS-conditional stores of small JSON documents in the bucket's default collection,
    through the client's KV connections (routed by the cluster map, retried on NOT_MY_VBUCKET and
    TMPFAIL)."""

    def __init__(self, client, timeout: float = 10.0):
        self.client = client
        self.timeout = timeout

    async def _call(self, key: bytes, make) -> tuple:
        deadline = time.monotonic() + self.timeout
        while True:
            vb = self.client.cluster_map.vbucket_for_key(key)
            address = self.client.node_for_vbucket(vb)
            try:
                if address is None:
                    raise ConnectError(f"vbucket {vb} has no active copy in the cluster map")
                conn = await self.client.kv_connection(address)
                wire = (b"\x00" + key) if conn.collections else key  # the default collection's id
                frame = await conn.call(make(wire, vb), self.timeout)
                if frame.status not in _RETRY:
                    return frame, conn
                reason = status_name(frame.status)
            except (ConnectError, ConnectionLostError, TimeoutError, OSError) as e:
                reason = str(e)
            if time.monotonic() > deadline:
                raise ServerError(f"{key.decode(errors='replace')}: {reason} for {self.timeout:g}s")
            await asyncio.sleep(0.05)
            with contextlib.suppress(ConnectError):
                await self.client.refresh_map()

    async def get(self, key: bytes) -> tuple[object, int] | None:
        """(the JSON value, CAS), or None if there is no such document."""
        frame, _ = await self._call(key, lambda k, vb: kvproto.Get(k, vb))
        if frame.status == Status.KEY_ENOENT:
            return None
        if frame.status != Status.SUCCESS:
            raise ServerError(f"GET {key.decode(errors='replace')}: {status_name(frame.status)}", frame.status)
        return json.loads(frame.value), frame.cas

    async def store(self, key: bytes, value, cas: int | None = 0) -> int | None:
        """Store a JSON value: unconditionally (cas 0), only if absent (cas None: ADD) or only if
        unchanged (cas): the new CAS, or None when the condition failed."""
        body = json.dumps(value, separators=(",", ":")).encode()
        opcode = Opcode.ADD if cas is None else Opcode.SET

        def make(k, vb):
            return kvproto.Store(k, body, cas=cas or 0, vbucket=vb, datatype=JSON, opcode=opcode)
        frame, _ = await self._call(key, make)
        if frame.status == Status.SUCCESS:
            return frame.cas
        if frame.status in (Status.KEY_EEXISTS, Status.KEY_ENOENT):
            return None
        raise ServerError(f"store {key.decode(errors='replace')}: {status_name(frame.status)}", frame.status)

    async def delete(self, key: bytes) -> None:
        frame, _ = await self._call(key, lambda k, vb: kvproto.Delete(k, vbucket=vb))
        if frame.status not in (Status.SUCCESS, Status.KEY_ENOENT):
            raise ServerError(f"delete {key.decode(errors='replace')}: {status_name(frame.status)}", frame.status)


class GroupOffsets:
    """The group's offsets in the bucket, one document per vbucket."""

    def __init__(self, docs: BucketDocs, group: str):
        self.docs = docs
        self.group = group
        self._saved: dict[int, Offset] = {}

    async def load(self, vbuckets) -> dict[int, Offset]:
        found = await asyncio.gather(*(self.docs.get(key_of(self.group, "offset", vb)) for vb in vbuckets))
        out = {}
        for vb, doc in zip(vbuckets, found, strict=True):
            if doc is not None:
                out[vb] = self._saved[vb] = Offset.from_json(doc[0], f"group {self.group} vbucket {vb}")
        return out

    def known(self, offsets: dict[int, Offset]) -> None:
        """These offsets need no document (a start from the beginning is what a missing one means)."""
        for vb, o in offsets.items():
            self._saved.setdefault(vb, o)

    async def save(self, offsets: dict[int, Offset]) -> int:
        """Store the offsets that changed since this process last saved or loaded them."""
        changed = {vb: o for vb, o in offsets.items() if self._saved.get(vb) != o}
        await asyncio.gather(*(self.docs.store(key_of(self.group, "offset", vb), o.to_json())
                               for vb, o in changed.items()))
        self._saved.update(changed)
        return len(changed)


class Membership:
    """The membership rule, without I/O: what this member writes back into the members document
    it read, and what the document says."""

    def __init__(self, me: str, lease: float):
        self.me = me
        self.lease = lease
        self.beat = 0
        self.acked = -1  # the newest generation this member stopped reading for
        self.seen: dict[str, tuple[int, float]] = {}  # member -> (counter, when it last changed, our clock)

    def next_doc(self, doc: dict | None, now: float, leaving: bool = False) -> dict:
        doc = doc or {"generation": 0, "members": {}}
        members = dict(doc["members"])
        changed = False
        for member, entry in list(members.items()):
            if member == self.me:
                continue
            prev = self.seen.get(member)
            if prev is None or prev[0] != entry["beat"]:
                self.seen[member] = (entry["beat"], now)
            elif now - prev[1] > self.lease:
                del members[member]
                del self.seen[member]
                log.warning("group member %s: no heartbeat for %.1fs; taking its vbuckets over", member, now - prev[1])
                changed = True
        for member in list(self.seen):
            if member not in members:
                del self.seen[member]
        if leaving:
            changed |= members.pop(self.me, None) is not None
        else:
            changed |= self.me not in members
            self.beat += 1
            members[self.me] = {"beat": self.beat, "acked": self.acked}
        return {"generation": doc["generation"] + (1 if changed else 0), "members": members}

    @staticmethod
    def settled(doc: dict) -> bool:
        """Every member has stopped for the document's generation: its shares may be read."""
        return all(e["acked"] == doc["generation"] for e in doc["members"].values())

    def share(self, doc: dict, num_vbuckets: int) -> list[int]:
        names = sorted(doc["members"])
        return split(num_vbuckets, len(names), names.index(self.me))


def _vbs_text(vbs: list[int]) -> str:
    """[0,1,2,5] -> "0-2,5" (what `--vbuckets` takes)."""
    parts, i = [], 0
    while i < len(vbs):
        j = i
        while j + 1 < len(vbs) and vbs[j + 1] == vbs[j] + 1:
            j += 1
        parts.append(str(vbs[i]) if i == j else f"{vbs[i]}-{vbs[j]}")
        i = j + 1
    return ",".join(parts)


class GroupReader(Iterating):
    """`async for event in client.group(...)`: the events of this member's vbuckets; see
    DcpClient.group. `on_change(generation, vbuckets, starts)` is called (if given) each time the
    member starts reading a generation's share."""

    def __init__(self, client, group: str, *, member: int | None, of: int | None, lease: float, start: str,
                 save_interval: float, member_id: str | None, on_change=None, read_options: dict | None = None):
        if (member is None) != (of is None):
            raise ValueError("static membership needs both member and of (member I of N)")
        if of is not None:
            split(client.num_vbuckets, of, member)  # checks the index
        if start not in ("beginning", "now"):
            raise ValueError(f"a group starts vbuckets without saved offsets from 'beginning' or 'now', not {start!r}")
        if of is None and read_options and read_options.get("end") is not None:
            raise ValueError("a bounded read (end=...) needs static membership: a dynamic group's shares change")
        if lease <= 0 or save_interval <= 0:
            raise ValueError("lease and save_interval must be positive")
        self.client = client
        self.group = group
        self.static = None if of is None else (member, of)
        self.lease = lease
        self.start = start
        self.save_interval = save_interval
        self.member_id = member_id or f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"
        self.on_change = on_change
        self.read_options = read_options or {}
        self.docs = BucketDocs(client, timeout=max(5.0, lease))
        self.beats = BucketDocs(client, timeout=max(0.5, lease / 4))  # a heartbeat retries within its lease
        self.offsets_store = GroupOffsets(self.docs, group)
        self.membership = Membership(self.member_id, lease)
        self.generation: int | None = None
        self.vbuckets: list[int] = []
        self.stream = None
        self.stats = {"generations": 0, "handovers": 0, "saves": 0, "fenced": 0}
        self._last_ok = time.monotonic()  # when the last heartbeat that was written began
        self._ready: asyncio.Queue = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        self._error: BaseException | None = None
        self._closed = False
        self._agen = self._run()

    @property
    def members_key(self) -> bytes:
        return key_of(self.group, "members")

    # -- reading ---------------------------------------------------------------------------------
    async def _begin(self, generation: int, vbuckets: list[int]) -> None:
        """Start reading `vbuckets` from the group's saved offsets."""
        saved = await self.offsets_store.load(vbuckets)
        missing = [vb for vb in vbuckets if vb not in saved]
        starts = dict(saved)
        if missing:
            fresh = await self.client.offsets_now(missing) if self.start == "now" else {vb: Offset() for vb in missing}
            starts.update(fresh)
            if self.start == "now":  # a later owner must resume from here, not from "now" again
                await self.offsets_store.save(fresh)
            else:
                self.offsets_store.known(fresh)
        self.generation, self.vbuckets = generation, vbuckets
        self.stats["generations"] += 1
        stream = self.client.events(vbuckets, start=starts, **self.read_options) if vbuckets else None
        self.stream = stream
        if self.on_change is not None:
            self.on_change(generation, vbuckets, starts)
        log.info("group %s member %s: generation %d, reading vbuckets %s", self.group, self.member_id, generation,
                 _vbs_text(vbuckets) or "none")
        await self._ready.put(stream)

    async def _end(self, save: bool = True) -> None:
        """Stop reading and save where the application stands."""
        stream, self.stream = self.stream, None
        if stream is None:
            return
        await stream.aclose()
        if save and stream.feed is not None:
            await self.offsets_store.save(stream.offsets)
            self.stats["saves"] += 1

    async def save(self) -> None:
        """Save the offsets of what the application has finished with."""
        stream = self.stream
        if stream is not None and stream.feed is not None:
            await self.offsets_store.save(stream.offsets)
            self.stats["saves"] += 1

    # -- membership ------------------------------------------------------------------------------
    async def _fence(self) -> None:
        """Stop reading once no heartbeat was written for 0.75 x the lease: the others may be about
        to declare this member dead and take its vbuckets over (they wait a whole lease from the
        last heartbeat they saw). A task of its own, so a store that hangs cannot delay it. No
        offsets are saved then (the bucket is not taking this member's writes, and a late one
        could land after the new owner's); the periodic saves stand."""
        while not self._closed:
            await asyncio.sleep(self.lease / 20)
            since = time.monotonic() - self._last_ok
            if self.stream is not None and since > 0.75 * self.lease:
                log.warning("group %s member %s: no heartbeat written for %.1fs; stopping (the group may take "
                            "its vbuckets over)", self.group, self.member_id, since)
                self.stats["fenced"] += 1
                await self._end(save=False)
                self.generation = None

    async def _heartbeat(self) -> None:
        interval = self.lease / 5
        last_save = time.monotonic()
        while not self._closed:
            began = time.monotonic()
            try:
                got = await self.beats.get(self.members_key)
                doc, cas = (got if got is not None else (None, None))
                new = self.membership.next_doc(doc, began)
                written = await self.beats.store(self.members_key, new, cas)
            except ServerError as e:
                log.warning("group %s: heartbeat failed: %s", self.group, e)
                written = None
                new = None
            if written is None:  # (the fence task stops the reading if this lasts)
                await asyncio.sleep(0.02 if new is not None else interval)  # lost a CAS race: at once
                continue
            self._last_ok = began
            gen = new["generation"]
            try:
                if self.generation is not None and gen != self.generation:
                    self.stats["handovers"] += 1
                    self.generation = None
                    await self._end()
                if self.generation is None:
                    if self.membership.acked != gen:
                        self.membership.acked = gen
                        continue  # write the acknowledgement now
                    if Membership.settled(new):
                        await self._begin(gen, self.membership.share(new, self.client.num_vbuckets))
                elif time.monotonic() - last_save >= self.save_interval:
                    await self.save()
                    last_save = time.monotonic()
            except ServerError as e:  # offsets not saved or loaded now: the next heartbeat tries again
                log.warning("group %s: %s", self.group, e)
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - began)) if self.generation is not None
                                else min(interval, 0.2))

    async def _static(self) -> None:
        member, of = self.static
        await self._begin(0, split(self.client.num_vbuckets, of, member))
        while not self._closed:
            await asyncio.sleep(self.save_interval)
            await self.save()

    async def _leave(self) -> None:
        """Take this member out of the members document (the others rebalance at once)."""
        for _ in range(20):
            got = await self.docs.get(self.members_key)
            if got is None or self.member_id not in got[0]["members"]:
                return
            new = self.membership.next_doc(got[0], time.monotonic(), leaving=True)
            if await self.docs.store(self.members_key, new, got[1]) is not None:
                return

    def _task_done(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None and not self._closed:
            self._error = task.exception()
            self._ready.put_nowait(None)

    async def _run(self):
        coros = [self._static()] if self.static else [self._heartbeat(), self._fence()]
        for coro in coros:
            task = asyncio.ensure_future(coro)
            task.add_done_callback(self._task_done)
            self._tasks.append(task)
        try:
            while True:
                stream = await self._ready.get()
                if self._error is not None:
                    raise self._error
                if stream is None:
                    continue
                async for ev in stream:
                    t = type(ev)
                    if (t is Mutation or t is Deletion or t is Expiration) and ev.key.startswith(RESERVED_PREFIX):
                        continue
                    yield ev
                if stream is self.stream and self.static:
                    return  # a bounded static read ended
        finally:
            await self._shutdown()

    async def _shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        try:
            await self._end()
            if not self.static:
                await self._leave()
        except (ClientError, OSError) as e:
            log.warning("group %s: could not save or leave cleanly: %s", self.group, e)

    async def aclose(self) -> None:
        await self._shutdown()
        with contextlib.suppress(RuntimeError):
            await self._agen.aclose()
