"""What happens to a running read when the server goes away: a clean restart (reconnect, nothing
lost or repeated), kill -9 with unpersisted writes (rollback: the application ends with exactly the
server's contents), a frozen server (dead-connection detection), a vbucket changing state
(STREAM_END STATE_CHANGED, NOT_MY_VBUCKET, reopen), and the stream-end decision table."""

import asyncio
import contextlib
import os
import signal
import time

import pytest

from dcpflow.client import DcpClient, Deletion, Expiration, Mutation, Rollback
from dcpflow.dcp.position import FINISH, REOPEN
from dcpflow.dcp.position import stream_end as end_action
from dcpflow.protocol import kv as kvproto
from dcpflow.protocol.dcp import StreamEndReason
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from tests.server.client import RawClient

from .conftest import PASSWORD, USER, contents, keys_in, run, url, write


class Mirror:
    """An application that keeps every version it was sent, so it can honour a rollback exactly:
    per vbucket, the history of (seqno, key, value or None)."""

    def __init__(self):
        self.history: dict[int, list[tuple[int, bytes, bytes | None]]] = {}
        self.rollbacks: list[Rollback] = []
        self.ids: list[tuple[int, int]] = []

    def apply(self, ev) -> None:
        if isinstance(ev, Mutation):
            self.history.setdefault(ev.vbucket, []).append((ev.seqno, ev.key, ev.value))
            self.ids.append((ev.vbucket, ev.seqno))
        elif isinstance(ev, Deletion | Expiration):
            self.history.setdefault(ev.vbucket, []).append((ev.seqno, ev.key, None))
            self.ids.append((ev.vbucket, ev.seqno))
        elif isinstance(ev, Rollback):
            self.rollbacks.append(ev)
            self.history[ev.vbucket] = [h for h in self.history.get(ev.vbucket, []) if h[0] <= ev.seqno]

    def state(self) -> dict[bytes, bytes]:
        out: dict[bytes, bytes] = {}
        for hist in self.history.values():
            for _, key, value in hist:
                if value is None:
                    out.pop(key, None)
                else:
                    out[key] = value
        return out


class Follower:
    """Reads a stream into a Mirror in the background; `until(pred)` waits for a condition."""

    def __init__(self, stream, mirror: Mirror):
        self.stream, self.mirror = stream, mirror

        async def read():
            async for ev in stream:
                mirror.apply(ev)
        self.task = asyncio.ensure_future(read())

    async def until(self, pred, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            if self.task.done():
                self.task.result()
                raise AssertionError("stream ended early")
            if time.monotonic() > deadline:
                raise AssertionError(f"not caught up within {timeout}s; stats {self.stream.stats}")
            await asyncio.sleep(0.02)

    async def stop(self) -> dict:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        await self.stream.aclose()
        return self.stream.stats


def caught_up(stream, highs: dict[int, int]):
    return lambda: all(stream.positions.get(vb) and stream.positions[vb].seqno >= h for vb, h in highs.items())


def raw(port: int) -> RawClient:
    c = RawClient(port)
    c.num_vbuckets = 64
    return c.login()


def wait_persisted(c: RawClient, keys) -> None:
    """SEQNO_PERSISTENCE for the last write of each vbucket touched (persist_seqno.md)."""
    highs = kvproto.GetAllVbSeqnosResponse.from_frame(c.call(Opcode.GET_ALL_VB_SEQNOS)).as_dict()
    for vb in {c.vbucket_of(k) for k in keys}:
        reply = c.call(Opcode.SEQNO_PERSISTENCE, extras=highs[vb].to_bytes(8, "big"), vbucket=vb)
        assert reply.status == Status.SUCCESS


def test_clean_restart_reconnects_without_loss_or_repeats(spawn_server, tmp_path):
    data = str(tmp_path / "data")
    proc = spawn_server("--data-dir", data, "--vbuckets", "64")
    port = proc.port
    with raw(port) as w:
        first = write(w, 200)

    async def go():
        async with await DcpClient.connect(url(port, reconnect_timeout=30), USER, PASSWORD) as c:
            stream = c.events()
            mirror = Mirror()
            f = Follower(stream, mirror)
            await f.until(lambda: len(mirror.ids) >= 200)
            loop = asyncio.get_running_loop()
            assert await loop.run_in_executor(None, proc_restart) == 0
            with raw(port) as w2:
                more = await loop.run_in_executor(None, write, w2, 50, "after")
                highs = {vb: s for vb, s in kvproto.GetAllVbSeqnosResponse.from_frame(
                    w2.call(Opcode.GET_ALL_VB_SEQNOS)).seqnos}
            await f.until(caught_up(stream, highs))
            return mirror, more, await f.stop()

    def proc_restart():
        nonlocal proc
        code = proc.terminate()
        proc = spawn_server("--data-dir", data, "--vbuckets", "64", "--port", str(port))
        return code

    mirror, more, stats = run(go(), timeout=90)
    assert mirror.state() == {**first, **more}
    assert len(mirror.ids) == len(set(mirror.ids)) == 250  # clean restart: same history, exact resume
    assert not mirror.rollbacks
    assert stats["connections_lost"] + stats.get("stream_end_disconnected", 0) >= 1 and stats["reopens"] >= 1


def test_kill_9_with_unpersisted_writes_rolls_back_to_the_servers_contents(spawn_server, tmp_path):
    data = str(tmp_path / "data")
    proc = spawn_server("--data-dir", data, "--vbuckets", "64", "--flush-interval", "0.02")
    port = proc.port
    universe = [f"doc{i}".encode() for i in range(150)] + [f"late{i}".encode() for i in range(40)]
    with raw(port) as w:
        write(w, 100)
        wait_persisted(w, universe[:100])
        assert w.call(Opcode.STOP_PERSISTENCE).status == Status.SUCCESS
        write(w, 50, start=100)  # new keys, never persisted
        write(w, 10, start=0, size=5)  # updates of persisted keys, never persisted
        for i in range(10, 15):
            w.delete(f"doc{i}".encode())
        highs_before = kvproto.GetAllVbSeqnosResponse.from_frame(w.call(Opcode.GET_ALL_VB_SEQNOS)).as_dict()

    async def go():
        nonlocal proc
        async with await DcpClient.connect(url(port, reconnect_timeout=30), USER, PASSWORD) as c:
            stream = c.events()
            mirror = Mirror()
            f = Follower(stream, mirror)
            await f.until(caught_up(stream, highs_before))
            assert mirror.state() != {}
            loop = asyncio.get_running_loop()

            def crash_and_restart():
                nonlocal proc
                proc.kill9()
                proc = spawn_server("--data-dir", data, "--vbuckets", "64", "--port", str(port))
                with raw(port) as w2:
                    write(w2, 40, prefix="late")
                    return kvproto.GetAllVbSeqnosResponse.from_frame(w2.call(Opcode.GET_ALL_VB_SEQNOS)).as_dict()
            highs_after = await loop.run_in_executor(None, crash_and_restart)
            await f.until(caught_up(stream, highs_after))
            return mirror, await f.stop()

    mirror, stats = run(go(), timeout=90)
    with raw(port) as r:
        truth = contents(r, universe)
    assert mirror.rollbacks and stats["rollbacks"] >= 1
    assert all(rb.seqno < rb.offset.seqno + 1 and rb.offset.seqno == rb.seqno for rb in mirror.rollbacks)
    assert mirror.state() == truth
    assert b"doc120" not in truth and b"late5" in truth  # the unpersisted writes really were lost


def test_frozen_server_is_detected_as_dead_and_the_read_recovers(spawn_server, tmp_path):
    proc = spawn_server("--data-dir", str(tmp_path / "data"), "--vbuckets", "64")
    port = proc.port
    with raw(port) as w:
        write(w, 30)

    async def go():
        async with await DcpClient.connect(url(port, noop_interval=0.2, dead_timeout=1.0, connect_timeout=1,
                                               reconnect_timeout=30), USER, PASSWORD) as c:
            stream = c.events()
            mirror = Mirror()
            f = Follower(stream, mirror)
            await f.until(lambda: len(mirror.ids) >= 30)
            os.kill(proc.proc.pid, signal.SIGSTOP)
            try:
                deadline = time.monotonic() + 60
                while not stream.stats.get("dead_connections"):
                    assert time.monotonic() < deadline, "the frozen connection was not declared dead"
                    await asyncio.sleep(0.1)
            finally:
                os.kill(proc.proc.pid, signal.SIGCONT)
            loop = asyncio.get_running_loop()
            with raw(port) as w2:
                await loop.run_in_executor(None, write, w2, 10, "again")
            await f.until(lambda: len(mirror.ids) >= 40)
            await f.stop()
            return mirror
    mirror = run(go(), timeout=60)
    assert len(set(mirror.ids)) == 40


def test_state_change_ends_the_stream_and_it_reopens(server, writer):
    vb = 5
    keys = keys_in(vb, 4, prefix="sc")

    async def go():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
            start = await c.offsets_now([vb])
            stream = c.events([vb], start=start)
            mirror = Mirror()
            f = Follower(stream, mirror)
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, writer.set, keys[0], b"1")
            await f.until(lambda: len(mirror.ids) >= 1)

            def flip():
                admin = writer
                assert admin.call(Opcode.SET_VBUCKET, extras=bytes([2]), vbucket=vb).status == Status.SUCCESS
                time.sleep(0.3)  # the client meets NOT_MY_VBUCKET meanwhile, and keeps trying
                assert admin.call(Opcode.SET_VBUCKET, extras=bytes([1]), vbucket=vb).status == Status.SUCCESS
                for k in keys[1:]:
                    admin.set(k, b"2", vbucket=vb)
            await loop.run_in_executor(None, flip)
            await f.until(lambda: len(mirror.ids) >= 4)
            return mirror, await f.stop()
    mirror, stats = run(go())
    assert [k for _, k, _ in mirror.history[vb]] == keys
    assert stats["stream_end_state_changed"] == 1 and stats["reopens"] >= 1


@pytest.mark.parametrize("reason", list(StreamEndReason))
def test_stream_end_decision_table(reason):
    """Reopen unless OK, or Closed by us (stream-end.md); map refresh when the vbucket may have
    moved; a short pause when the server says it is overloaded."""
    action, remap, delay = end_action(reason, closed_by_us=False)
    if reason == StreamEndReason.OK:
        assert (action, remap, delay) == (FINISH, False, 0.0)
    else:
        assert action == REOPEN
        assert remap == (reason in (StreamEndReason.STATE_CHANGED, StreamEndReason.DISCONNECTED))
        assert (delay > 0) == (reason in (StreamEndReason.SLOW, StreamEndReason.BACKFILL_FAIL))
    assert end_action(reason, closed_by_us=True)[0] == (FINISH if reason in (StreamEndReason.OK,
                                                                             StreamEndReason.CLOSED) else REOPEN)
    assert end_action(99, closed_by_us=False)[0] == REOPEN  # an unknown reason: reopen and let the server say
