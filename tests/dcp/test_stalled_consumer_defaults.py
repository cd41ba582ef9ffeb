"""One stalled DCP consumer cannot stop a bucket's writers, with the server's default settings
(1024 vbuckets, a 100 MiB quota, checkpoints at most 30% of it): a consumer that opens a stream on
every vbucket and then never reads has its cursors dropped before the checkpoint quota refuses a
write. A consumer that supports cursor dropping goes on from disk and misses nothing; one that does
not has its streams ended with STREAM_END(SLOW) (stream-end.md: "cannot read from the stream fast
enough"). docs/server.md promises this; engine/memory.py and engine/checkpoint.py say how.

The writer persists as it goes (it waits for the flusher after each round), so no refusal can be
the flusher's: every ETMPFAIL would be the stalled consumer's."""

import time

import pytest

from dcpflow.protocol import dcp
from dcpflow.protocol.frame import request
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .client import DcpClient
from .conftest import engine_of

VBUCKETS = 1024  # the default of a new bucket, set explicitly: the test fixture's default is 64
VALUE = b"v" * 1024
ROUNDS, PER_ROUND = 18, 2000  # 36,000 documents of 1 KiB: more than the 30 MiB checkpoint quota holds


def _write_round(w, keys: list[bytes]) -> int:
    """SET every key once (pipelined quiet SETs); returns how many were refused with ETMPFAIL."""
    frames = [request(Opcode.SET_Q, key=k, extras=bytes(8), value=VALUE, vbucket=w.vbucket_of(k), opaque=i)
              for i, k in enumerate(keys)]
    w.send(b"".join(frames) + request(Opcode.NOOP, opaque=0xFFFFFFFF))
    refused = 0
    while (reply := w.recv()).opaque != 0xFFFFFFFF:
        assert reply.status == Status.ETMPFAIL, reply
        refused += 1
    return refused


def _wait_flushed(srv) -> None:
    engine = engine_of(srv)
    deadline = time.monotonic() + 120
    while srv.call(lambda: any(vb.persisted_seqno < vb.high_seqno for vb in engine.vbuckets.values())):
        assert time.monotonic() < deadline, "the flusher did not catch up"
        time.sleep(0.02)


@pytest.mark.parametrize("cursor_dropping", [False, True], ids=["plain", "cursor-dropping"])
def test_a_consumer_that_never_reads_cannot_stop_writers_with_default_settings(make_server, cursor_dropping):
    srv = make_server(num_vbuckets=VBUCKETS)  # memory quota and checkpoint settings: the server's defaults
    engine = engine_of(srv)
    assert engine.memory.quota == 100 * 1024 * 1024 and engine.num_vbuckets == VBUCKETS
    stalled = DcpClient(srv.port)
    stalled.num_vbuckets = VBUCKETS
    stalled.connect(name="stalled")
    if cursor_dropping:
        stalled.controls(supports_cursor_dropping_vulcan="true")
    for vb in range(VBUCKETS):
        assert stalled.stream_request(vb).status == Status.SUCCESS
    # from here on the consumer reads nothing: its socket fills, then the server's buffers for it
    refused = []
    with srv.login() as w:
        for r in range(ROUNDS):
            refused.append(_write_round(w, [b"doc%02d-%05d" % (r, i) for i in range(PER_ROUND)]))
            _wait_flushed(srv)
    mem = srv.call(lambda: engine.memory.stats())
    assert sum(refused) == 0, (refused, mem)
    assert mem["ep_cursors_dropped"] > 0, mem
    assert mem["ep_checkpoint_memory"] < mem["ep_checkpoint_memory_quota"], mem

    if cursor_dropping:  # the consumer goes on from disk, and gets every document
        seen: set[bytes] = set()
        deadline = time.monotonic() + 300
        while len(seen) < ROUNDS * PER_ROUND:
            assert time.monotonic() < deadline, f"the stalled consumer got {len(seen)} documents"
            for m in stalled.messages_until(lambda m: True, ack=True, timeout=60):
                assert not isinstance(m, dcp.DcpStreamEnd), m
                if isinstance(m, dcp.DcpMutation):
                    seen.add(m.key)
    else:  # its streams end SLOW: it re-requests from where it was
        ended = stalled.messages_until(lambda m: isinstance(m, dcp.DcpStreamEnd), timeout=120)[-1]
        assert ended.reason == dcp.StreamEndReason.SLOW
    stalled.close()
