"""Bounded reads and rollbacks across a kill -9 with unpersisted writes (a real `dcpflow server`
subprocess; everything in vbucket 0 of a 4-vbucket bucket):

* a read resumed from saved offsets at or past its end still asks the server, which may answer
  ROLLBACK (the saved offset is on a lost branch): the rollback is handled like any other and the
  read continues to its end;
* a read bounded by "now" that rolls back below its end finishes at what exists after the
  rollback, instead of waiting for seqnos that no longer exist; an explicit end is kept;
* a client restarted from saved offsets rolls back to the boundary its saved offset proves, as the
  client that stayed connected does, not to 0.
"""

import asyncio
import json

import pytest

from dcpflow.client import DcpClient, JsonFileStore, Mutation, Offset, Rollback, RollbackError, StreamEnd
from dcpflow.protocol import kv as kvproto
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from tests.server.client import RawClient

from .conftest import PASSWORD, USER, run, url

VBS = 4


def raw(port: int) -> RawClient:
    c = RawClient(port)
    c.num_vbuckets = VBS
    return c.login()


def high(c: RawClient) -> int:
    return kvproto.GetAllVbSeqnosResponse.from_frame(c.call(Opcode.GET_ALL_VB_SEQNOS)).as_dict()[0]


def put(c: RawClient, prefix: str, n: int, value: bytes = b'{"a":1}') -> None:
    for i in range(n):
        assert c.set(f"{prefix}{i}".encode(), value, vbucket=0, datatype=1).status == Status.SUCCESS


def persist_then_stop(c: RawClient) -> None:
    """Wait until vbucket 0 is on disk, then stop persisting: later writes die with a kill -9."""
    reply = c.call(Opcode.SEQNO_PERSISTENCE, extras=high(c).to_bytes(8, "big"), vbucket=0)
    assert reply.status == Status.SUCCESS
    assert c.call(Opcode.STOP_PERSISTENCE).status == Status.SUCCESS


class Crashable:
    """A `dcpflow server` on one data directory and port that can be kill -9'd and restarted."""

    def __init__(self, spawn_server, tmp_path, *extra: str):
        self.spawn, self.data = spawn_server, str(tmp_path / "data")
        self.proc = spawn_server("--data-dir", self.data, "--vbuckets", str(VBS), "--flush-interval", "0.02", *extra)
        self.port = self.proc.port

    def args(self) -> list[str]:
        return ["--data-dir", self.data, "--vbuckets", str(VBS), "--port", str(self.port)]

    def kill9_and_restart(self) -> None:
        self.proc.kill9()
        self.proc = self.spawn(*self.args())

    def restart_clean(self) -> None:
        assert self.proc.terminate() == 0
        self.proc = self.spawn(*self.args())


async def read_events(port: int, **kwargs) -> list:
    async with await DcpClient.connect(url(port, reconnect_timeout=20), USER, PASSWORD) as c:
        return [ev async for ev in c.events([0], **kwargs)]


def muts(events) -> list[str]:
    return [ev.key.decode() for ev in events if isinstance(ev, Mutation)]


@pytest.mark.parametrize("new_writes", [10, 5])
def test_bounded_resume_at_or_past_its_end_still_asks_the_server(spawn_server, tmp_path, new_writes):
    """Saved offset (U1, 30). kill -9 loses 21..30; U2 branches at 20 and gets `new_writes` other
    documents at 21... A resume with end="now" (30 or 25: at or below the saved seqno) must meet
    the server's ROLLBACK(20), report it, and deliver the new documents - not end at once with
    nothing and keep the offset on the lost branch."""
    srv = Crashable(spawn_server, tmp_path)
    with raw(srv.port) as w:
        put(w, "p", 20)
        persist_then_stop(w)
        put(w, "u", 10, b'{"a":2}')
    store = JsonFileStore(str(tmp_path / "offsets.json"))
    first = run(read_events(srv.port, end="now", state=store))
    assert len(muts(first)) == 30
    saved = store.load().offsets[0]
    assert saved.seqno == 30

    srv.kill9_and_restart()
    with raw(srv.port) as w:
        put(w, "n", new_writes, b'{"a":3}')
        assert high(w) == 20 + new_writes

    events = run(read_events(srv.port, start="saved", end="now", state=store))
    rollbacks = [ev for ev in events if isinstance(ev, Rollback)]
    assert len(rollbacks) == 1 and rollbacks[0].seqno <= 20
    after = events[events.index(rollbacks[0]):]
    assert {f"n{i}" for i in range(new_writes)} <= set(muts(after))
    assert not any(k.startswith("u") for k in muts(events))
    assert isinstance(events[-1], StreamEnd) and events[-1].reason == 0
    resumed = store.load().offsets[0]
    assert resumed.vbuuid != saved.vbuuid and resumed.seqno == 20 + new_writes

    # the batch API from the same lost offset, with an explicit end at the saved seqno
    async def batches(rollback):
        async with await DcpClient.connect(url(srv.port), USER, PASSWORD) as c:
            reader = c.batches({0: saved}, {0: 30}, rollback=rollback)
            keys = [k.decode() for b in [b async for b in reader] for k in b.column("key").to_pylist()]
            return keys, reader.rollbacks, reader.offsets[0]
    with pytest.raises(RollbackError):
        run(batches("raise"))
    if new_writes == 10:
        keys, rbs, offset = run(batches("resume"))
        assert len(rbs) == 1 and {f"n{i}" for i in range(10)} <= set(keys) and offset.seqno == 30
        assert offset.vbuuid != saved.vbuuid


def test_now_bounded_read_finishes_at_what_exists_after_a_rollback(spawn_server, tmp_path):
    """end="now" = 30; kill -9 while the read is at 22 (21..30 unpersisted). After the rollback the
    read must finish at the new high seqno (20) on an idle bucket, not wait for seqno 30."""
    srv = Crashable(spawn_server, tmp_path)
    with raw(srv.port) as w:
        put(w, "p", 20)
        persist_then_stop(w)
        put(w, "u", 10, b'{"a":2}')

    async def go(end):
        async with await DcpClient.connect(url(srv.port, buffer_size=400, reconnect_timeout=30), USER,
                                           PASSWORD) as c:
            stream = c.events([0], end=end)
            events, crashed = [], False
            loop = asyncio.get_running_loop()

            async def read():
                nonlocal crashed
                async for ev in stream:
                    events.append(ev)
                    if isinstance(ev, Mutation):
                        await asyncio.sleep(0.02)  # a slow application: the server is ahead of it
                        if ev.seqno == 22 and not crashed:
                            crashed = True
                            await loop.run_in_executor(None, srv.kill9_and_restart)
            task = asyncio.ensure_future(read())
            done, _ = await asyncio.wait([task], timeout=15)
            finished_idle = bool(done)
            if not done:  # the explicit end: it waits for the new branch to reach seqno 30
                assert stream.stats.get("rollbacks") and not task.done()
                with raw(srv.port) as w:
                    await loop.run_in_executor(None, put, w, "n", 10)
                await asyncio.wait_for(task, 15)
            task.result()
            return events, finished_idle, dict(stream.ends)

    events, finished_idle, ends = run(go("now"), timeout=60)
    assert finished_idle, "the read waited for seqnos that no longer exist"
    rb = [ev for ev in events if isinstance(ev, Rollback)]
    assert len(rb) == 1 and ends == {0: 20}
    assert muts(events[events.index(rb[0]):]) == [f"p{i}" for i in range(20)][rb[0].seqno:]
    assert isinstance(events[-1], StreamEnd) and events[-1].offset.seqno == 20

    # An explicit end is the caller's: documented to wait until the new history reaches it.
    with raw(srv.port) as w:
        persist_then_stop(w)
        put(w, "v", 10, b'{"a":4}')  # 21..30 again, unpersisted
    events, finished_idle, ends = run(go({0: 30}), timeout=90)
    assert not finished_idle and ends == {0: 30}
    assert [k for k in muts(events) if k.startswith("n")] == [f"n{i}" for i in range(10)]
    assert isinstance(events[-1], StreamEnd) and events[-1].offset.seqno == 30


def test_restarted_client_rolls_back_to_the_boundary_its_saved_offset_proves(spawn_server, tmp_path):
    """Disk snapshot 0..20 then memory snapshot 21..30 (unpersisted); the client saves (U1, 30, 21,
    30) and exits; kill -9; the server answers ROLLBACK(20). 20 = snapshot_start - 1 is a boundary
    the saved offset proves, so the restarted client resumes from 20 (as one that stayed connected
    does) and receives nothing of 1..20 again."""
    srv = Crashable(spawn_server, tmp_path)
    with raw(srv.port) as w:
        put(w, "p", 20)
        reply = w.call(Opcode.SEQNO_PERSISTENCE, extras=high(w).to_bytes(8, "big"), vbucket=0)
        assert reply.status == Status.SUCCESS
    srv.restart_clean()  # a read from 0 now gets 1..20 as one disk snapshot
    with raw(srv.port) as w:
        assert w.call(Opcode.STOP_PERSISTENCE).status == Status.SUCCESS
        put(w, "u", 10, b'{"a":2}')
    path = tmp_path / "offsets.json"
    store = JsonFileStore(str(path))
    run(read_events(srv.port, end="now", state=store, markers=True))
    saved = json.loads(path.read_text())["offsets"]["0"]
    assert saved[1:] == [30, 21, 30]  # [vbuuid, seqno, snapshot_start, snapshot_end]

    srv.kill9_and_restart()
    with raw(srv.port) as w:
        put(w, "after", 1, b'{"a":3}')
    events = run(read_events(srv.port, start="saved", end="now", state=store))
    rb = [ev for ev in events if isinstance(ev, Rollback)]
    assert len(rb) == 1 and rb[0].seqno == 20 and rb[0].offset.seqno == 20
    assert muts(events) == ["after0"]
    # the offset saved after the rollback still proves 20
    assert Offset.from_json(json.loads(path.read_text())["offsets"]["0"]).snapshot_start == 21
