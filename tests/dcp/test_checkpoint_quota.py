"""A stalled DCP consumer cannot grow the server: checkpoints hold at most their share of the bucket
quota (engine/memory.py). Its cursors are dropped - the streams go on from disk for a consumer that
supports cursor dropping, and end with STREAM_END(SLOW) for one that does not, once dropping the
others is not enough (before writers are told ETMPFAIL). The storm of issue 36 at a small scale: a
consumer with a 1 MiB window on every vbucket that never acknowledges, while the same keys are
overwritten round after round."""

import os
import time

import pytest

from dcpflow.protocol import dcp
from dcpflow.protocol.frame import request
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from tests.resources import rss_anon

from .client import DcpClient

MiB = 1024 * 1024
VALUE = b"s" * 4096
VBUCKETS = 64


def _storm_round(w, keys: list[bytes], r: int) -> int:
    """Overwrite every key once (pipelined quiet SETs, ETMPFAIL retried); returns the refusals."""
    refused_total = 0
    pending = [(k, request(Opcode.SET_Q, key=k, extras=bytes(8), value=VALUE[:-6] + b"%06d" % r,
                           vbucket=w.vbucket_of(k), opaque=i)) for i, k in enumerate(keys)]
    while pending:
        w.send(b"".join(f for _, f in pending) + request(Opcode.NOOP, opaque=0xFFFFFFFF))
        refused = set()
        while (reply := w.recv()).opaque != 0xFFFFFFFF:
            assert reply.status == Status.ETMPFAIL, reply
            refused.add(reply.opaque)
        refused_total += len(refused)
        pending = [(k, f) for k, f in pending if int.from_bytes(f[12:16], "big") in refused]
        if pending:
            time.sleep(0.05)
    return refused_total


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads RssAnon from /proc")
def test_a_stalled_consumer_that_supports_cursor_dropping_cannot_grow_the_server(make_server):
    """Checkpoints close every 10 keys (so a stalled cursor pins closed ones, as the 5 s age does
    in a long storm); 12 rounds of 2000 keys x 4 KB. Checkpoint memory never passes its quota (30%
    of 64 MiB), the cursors are dropped, and this process's anonymous memory (the server runs in it)
    grows by at most that quota, SQLite's writer cache (64 MiB) and a margin for the allocator: without the quota the
    checkpoints alone would hold the whole storm (96 MB)."""
    srv = make_server(memory_quota=64 * MiB, checkpoint_max_items=10, num_vbuckets=VBUCKETS)
    quota = 64 * MiB * 0.3
    stalled = DcpClient(srv.port)
    stalled.num_vbuckets = VBUCKETS
    stalled.connect(name="stalled")
    stalled.controls(supports_cursor_dropping_vulcan="true", connection_buffer_size=MiB)
    for vb in range(VBUCKETS):
        assert stalled.stream_request(vb).status == Status.SUCCESS
    memory = srv.server.buckets["default"].engine.memory
    keys = [b"storm%05d" % i for i in range(2000)]
    base = rss_anon(os.getpid())
    ckpt = []
    with srv.login() as w:
        for r in range(12):  # 96 MB of mutations, a consumer reading none of them
            _storm_round(w, keys, r)
            ckpt.append(srv.call(lambda: memory.checkpoint))
    grown = rss_anon(os.getpid()) - base
    assert max(ckpt) <= quota + len(VALUE) + 200, ckpt  # (the last write accepted may take it over by itself)
    assert srv.call(lambda: memory.num_cursors_dropped) > 0
    # RSS of a whole process moves by tens of MiB with the allocator's timing (100-114 MiB grown in
    # runs with the quota); without the quota the checkpoints alone add 91 MiB to SQLite's 64 MiB,
    # so a 48 MiB margin still tells the two apart
    assert grown <= quota + 64 * MiB + 48 * MiB, grown // MiB
    # the consumer was not cut off: it reads on, from disk then memory, to the last round's values
    seen: dict[bytes, bytes] = {}
    ends = []
    deadline = time.monotonic() + 120
    while len(seen) < len(keys) or any(v[-6:] != b"%06d" % 11 for v in seen.values()):
        assert time.monotonic() < deadline, "the stalled consumer never caught up"
        for m in stalled.messages_until(lambda m: True, ack=True, timeout=30):
            if isinstance(m, dcp.DcpMutation):
                seen[m.key] = m.value
            elif isinstance(m, dcp.DcpStreamEnd):
                ends.append(m)
    assert ends == []
    stalled.close()


def test_a_stalled_consumer_without_cursor_dropping_ends_slow(make_server):
    """Its cursors go once dropping the others' is not enough, at the checkpoint upper mark (before the
    quota refuses writes, test_stalled_consumer_defaults.py); refusals here can only be the flusher's."""
    srv = make_server(memory_quota=32 * MiB)
    plain = DcpClient(srv.port)
    plain.num_vbuckets = 64
    plain.connect(name="plain")
    plain.controls(connection_buffer_size=MiB)
    for vb in range(64):
        assert plain.stream_request(vb).status == Status.SUCCESS
    keys = [b"plain%05d" % i for i in range(1000)]
    with srv.login() as w:
        r = 0
        while srv.call(lambda: srv.server.buckets["default"].engine.memory.num_cursors_dropped) == 0:
            _storm_round(w, keys, r)
            r += 1
            assert r < 40, "no cursor was dropped"
        engine = srv.server.buckets["default"].engine
        assert srv.call(lambda: engine.memory.checkpoint) <= 32 * MiB * 0.3
        _storm_round(w, keys[:50], r)  # and writers get in again
    ended = plain.messages_until(lambda m: isinstance(m, dcp.DcpStreamEnd), ack=True, timeout=60)[-1]
    assert ended.reason == dcp.StreamEndReason.SLOW
    plain.close()
