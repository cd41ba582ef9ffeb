"""`dcpflow server` as a real process: a clean SIGTERM shutdown persists everything and adds no
failover entry; `kill -9` loses exactly the writes that were never flushed and starts a new branch
of history (a failover entry) on every active vbucket."""

import signal
import struct

import pytest

from dcpflow.protocol import dcp, kv
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .client import RawClient

VBUCKETS = 16


def connect(proc) -> RawClient:
    c = RawClient(proc.port)
    c.num_vbuckets = VBUCKETS
    return c.login()


def failover_logs(c: RawClient) -> dict[int, tuple]:
    return {vb: dcp.FailoverLogResponse.from_frame(c.call(Opcode.GET_FAILOVER_LOG, vbucket=vb)).entries
            for vb in range(VBUCKETS)}


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_sigterm_flushes_everything_and_restart_keeps_it(tmp_path, spawn_server, loop):
    args = ["--data-dir", str(tmp_path), "--vbuckets", str(VBUCKETS), "--flush-interval", "3600", "--loop", loop]
    first = spawn_server(*args)
    assert f"port={first.port}" in first.ready_line
    with connect(first) as c:
        for i in range(200):
            assert c.set(b"doc%d" % i, b"value-%d" % i, flags=i).status == Status.SUCCESS
        for i in range(0, 200, 10):
            assert c.delete(b"doc%d" % i).status == Status.SUCCESS
        assert int(c.stats()["ep_queue_size"]) == 220  # nothing flushed yet: the interval is an hour
        logs = failover_logs(c)
        seqnos = kv.GetAllVbSeqnosResponse.from_frame(c.call(Opcode.GET_ALL_VB_SEQNOS)).as_dict()
    assert first.terminate() == 0

    second = spawn_server(*args)
    with connect(second) as c:
        for i in range(200):
            reply = c.get(b"doc%d" % i)
            if i % 10 == 0:
                assert reply.status == Status.KEY_ENOENT
            else:
                assert (reply.value, struct.unpack(">I", reply.extras)[0]) == (b"value-%d" % i, i)
        assert failover_logs(c) == logs  # a clean shutdown starts no new branch
        assert kv.GetAllVbSeqnosResponse.from_frame(c.call(Opcode.GET_ALL_VB_SEQNOS)).as_dict() == seqnos
        assert c.stats()["curr_items"] == "180"
    second.proc.send_signal(signal.SIGINT)  # Ctrl-C is a clean shutdown too
    assert second.proc.wait(30) == 0


def test_kill9_loses_only_unflushed_writes_and_adds_a_failover_entry(tmp_path, spawn_server):
    args = ["--data-dir", str(tmp_path), "--vbuckets", str(VBUCKETS), "--flush-interval", "0.02"]
    first = spawn_server(*args)
    persisted: dict[int, int] = {}
    with connect(first) as c:
        for i in range(100):
            reply = c.set(b"k%d" % i, b"v1-%d" % i)
            uuid, seqno = struct.unpack(">QQ", reply.extras)
            persisted[c.vbucket_of(b"k%d" % i)] = seqno
        for vb, seqno in persisted.items():  # wait until the flusher has them all on disk
            assert c.call(Opcode.SEQNO_PERSISTENCE, extras=struct.pack(">Q", seqno), vbucket=vb).status \
                == Status.SUCCESS
        old_logs = failover_logs(c)
        assert c.call(Opcode.STOP_PERSISTENCE).status == Status.SUCCESS
        for i in range(50, 150):  # acknowledged, never flushed
            assert c.set(b"k%d" % i, b"v2-%d" % i).status == Status.SUCCESS
        assert c.delete(b"k0").status == Status.SUCCESS
    assert first.kill9() == -signal.SIGKILL

    second = spawn_server(*args)
    with connect(second) as c:
        for i in range(100):
            assert c.get(b"k%d" % i).value == b"v1-%d" % i
        for i in range(100, 150):
            assert c.get(b"k%d" % i).status == Status.KEY_ENOENT
        seqnos = kv.GetAllVbSeqnosResponse.from_frame(c.call(Opcode.GET_ALL_VB_SEQNOS)).as_dict()
        assert seqnos == {vb: persisted.get(vb, 0) for vb in range(VBUCKETS)}
        for vb, log in failover_logs(c).items():
            # a new entry at the persisted high seqno, in front of the old history
            assert log[1:] == old_logs[vb] and log[0][1] == persisted.get(vb, 0) and log[0][0] != log[1][0]
        assert c.set(b"k1", b"after").status == Status.SUCCESS
    assert second.terminate() == 0
