"""Sync writes over DCP against the real server: DCP_PREPARE / DCP_COMMIT / DCP_ABORT to streams
that enabled sync writes, committed items only (markers ending at the max visible seqno) to the
others, DCP_SEQNO_ACKNOWLEDGED from a named consumer completing a durable SET, V2.0 markers with
the max visible and high completed seqnos, and disk backfills with completed and in-flight prepares.
The stream rules (and the EINVAL of an ack without sync writes, and a prepare completed before the
backfill that covers it was planned) are also checked without a socket in test_sync_write_rules.py."""

import json
import struct

from dcpflow.protocol import dcp
from dcpflow.protocol.dcp import DurabilityLevel, MarkerVersion, SnapshotFlag, VBucketState
from dcpflow.protocol.frame import durability_frame, request
from dcpflow.protocol.kv import SetVbucket
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from tests.resources import wait_for

from .client import markers
from .conftest import engine_of, keys_in, to_disk_only, vbucket, wait_persisted
from .test_sync_write_rules import assert_plain_stream_sees_only_committed


def set_topology(server, vb: int, chain: list) -> None:
    with server.login() as c:
        value = json.dumps({"topology": [chain]}).encode()
        c.send(SetVbucket(vb, int(VBucketState.ACTIVE), value, opaque=7).encode())
        assert c.recv().status == Status.SUCCESS


def send_durable_set(c, key: bytes, value: bytes, vb: int, level: int = DurabilityLevel.MAJORITY,
                     timeout_ms: int | None = None) -> int:
    """Send a durable SET without waiting for its reply (held until the write completes)."""
    opaque = c.next_opaque()
    c.send(request(Opcode.SET, key=key, extras=struct.pack(">II", 0, 0), value=value, vbucket=vb, opaque=opaque,
                   framing=durability_frame(level, timeout_ms)))
    return opaque


def pending(server, vb: int) -> list[bytes]:
    return server.call(lambda: list(engine_of(server).vbucket(vb).prepares))


def seqno_of(m) -> int:
    for name in ("by_seqno", "commit_seqno", "abort_seqno"):
        if hasattr(m, name):
            return getattr(m, name)
    return 0


def test_a_named_replica_acks_the_prepare_and_plain_streams_see_only_the_commit(server, clients):
    vb = 0
    key, other = keys_in(vb, 2, prefix="sw")
    set_topology(server, vb, ["self", "replica"])
    replica = clients(name="replica-conn")
    replica.controls(enable_sync_writes="true", consumer_name="replica")
    assert replica.stream_request(vb, 0).status == Status.SUCCESS
    plain = clients(name="plain-conn")
    assert plain.stream_request(vb, 0).status == Status.SUCCESS
    with server.login() as w, server.login() as w2:
        assert w.set(key, b"old", vbucket=vb).status == Status.SUCCESS  # seqno 1
        opaque = send_durable_set(w, key, b"new", vb)  # prepare at seqno 2; w waits for its reply
        msgs = replica.messages_until(lambda m: isinstance(m, dcp.DcpPrepare))
        prepare = msgs[-1]
        assert (prepare.key, prepare.value, prepare.by_seqno, prepare.durability_level) == (key, b"new", 2, 1)
        assert pending(server, vb) == [key]
        assert w2.get(key, vbucket=vb).value == b"old"
        assert w2.set(key, b"other", vbucket=vb).status == Status.SYNC_WRITE_IN_PROGRESS
        assert w2.set(other, b"x", vbucket=vb).status == Status.SUCCESS  # seqno 3: other keys go on
        replica.send(dcp.DcpSeqnoAcknowledged(vb, 2, replica_opaque(replica, msgs)).encode())
        reply = w.recv()
        assert (reply.opaque, reply.status, reply.cas) == (opaque, Status.SUCCESS, prepare.cas)
        assert w.get(key, vbucket=vb).value == b"new"
    commit = replica.messages_until(lambda m: isinstance(m, dcp.DcpCommit))[-1]
    assert (commit.key, commit.prepared_seqno, commit.commit_seqno) == (key, 2, 4)
    seen = plain.messages_until(lambda m: isinstance(m, dcp.DcpMutation) and m.by_seqno == 4)
    assert_plain_stream_sees_only_committed(seen, msgs, key, other)
    assert vbucket(server, vb).hcs == 2


def replica_opaque(c, msgs) -> int:
    return next(m.opaque for m in msgs if isinstance(m, dcp.DcpSnapshotMarker))


def test_disk_backfill_markers_carry_the_hcs_and_send_in_flight_prepares_to_sync_streams(server, clients):
    vb = 1
    a, b, c_, d = keys_in(vb, 4, prefix="bf")
    set_topology(server, vb, ["self"])  # a chain of one: Majority commits at once, persist levels after the flush
    with server.login() as w:
        send_durable_set(w, a, b"a", vb)
        assert w.recv().status == Status.SUCCESS  # prepare 1, commit 2
        send_durable_set(w, b, b"b", vb, DurabilityLevel.PERSIST_TO_MAJORITY)
        assert w.recv().status == Status.SUCCESS  # prepare 3, commit 4 once persisted
        assert w.set(c_, b"c", vbucket=vb).status == Status.SUCCESS  # 5
        set_topology(server, vb, ["self", "absent"])
        held = send_durable_set(w, d, b"d", vb, timeout_ms=60_000)  # prepare 6: no replica to ack it
        # sent, not answered (it waits for the replica): the server registers it when it reads it
        wait_for(lambda: pending(server, vb) == [d], 30, "the prepare registered")
        to_disk_only(server, vb)
        assert vbucket(server, vb).persisted_hcs == 3
        sync = clients(name="bf-sync")
        sync.controls(enable_sync_writes="true", consumer_name="absent")
        assert sync.stream_request(vb, 0, 6).status == Status.SUCCESS
        got = sync.until_stream_end(vb)
        (disk,) = markers(got)
        assert disk.flags & SnapshotFlag.DISK and disk.version == MarkerVersion.V2_0
        assert (disk.end_seqno, disk.high_completed_seqno) == (6, 3)
        assert [(type(m).__name__, m.key, seqno_of(m)) for m in got if hasattr(m, "key")] == [
            ("DcpMutation", a, 2), ("DcpMutation", b, 4), ("DcpMutation", c_, 5), ("DcpPrepare", d, 6)]
        plain = clients(name="bf-plain")
        assert plain.stream_request(vb, 0, 6).status == Status.SUCCESS
        got = plain.until_stream_end(vb)
        assert [(m.key, m.by_seqno) for m in got if isinstance(m, dcp.DcpMutation)] == [(a, 2), (b, 4), (c_, 5)]
        assert not any(isinstance(m, dcp.DcpPrepare) for m in got)
        # the absent replica shows up and acknowledges: the held write commits at seqno 7
        sync.send(dcp.DcpSeqnoAcknowledged(vb, 6, 0).encode())
        reply = w.recv()
        assert (reply.opaque, reply.status) == (held, Status.SUCCESS)
        assert w.get(d, vbucket=vb).value == b"d"
    wait_persisted(server, vb)
    assert vbucket(server, vb).persisted_hcs == 6


def test_a_durable_set_nobody_acknowledges_is_aborted_at_its_timeout_as_ambiguous(server, clients):
    vb = 2
    (key,) = keys_in(vb, 1, prefix="to")
    set_topology(server, vb, ["self", "absent"])
    sync = clients(name="to-sync")
    sync.controls(enable_sync_writes="true")
    assert sync.stream_request(vb, 0).status == Status.SUCCESS
    with server.login() as w:
        assert w.set(key, b"old", vbucket=vb).status == Status.SUCCESS  # 1
        send_durable_set(w, key, b"new", vb, timeout_ms=200)  # prepare 2
        assert w.recv().status == Status.SYNC_WRITE_AMBIGUOUS  # aborted at 3 when its timeout passed
        assert w.get(key, vbucket=vb).value == b"old"
        assert w.set(key, b"later", vbucket=vb).status == Status.SUCCESS  # the key takes writes again
    got = sync.messages_until(lambda m: isinstance(m, dcp.DcpMutation) and m.by_seqno == 4)
    abort = next(m for m in got if isinstance(m, dcp.DcpAbort))
    assert (abort.key, abort.prepared_seqno, abort.abort_seqno) == (key, 2, 3)
    assert vbucket(server, vb).hcs == 2 and pending(server, vb) == []



def test_reads_of_a_prepare_a_promoted_vbucket_took_over_answer_recommit_in_progress(server, clients):
    """A replica promoted with a prepare in flight re-commits it (the old active may have committed
    it already): until then a read answers SYNC_WRITE_RE_COMMIT_IN_PROGRESS - a retryable status,
    ETMPFAIL for a client without XError - rather than the value from before the write."""
    from dcpflow.protocol.hello import Feature

    vb = 4
    (key,) = keys_in(vb, 1, prefix="rc")
    engine = engine_of(server)

    def as_replica_with_a_prepare():
        rep = engine.set_vbucket_state(vb, VBucketState.REPLICA)
        rep.snapshot_marker(1, 2)
        rep.apply_mutation(key, b"old", by_seqno=1, cas=10, rev_seqno=1)
        rep.apply_prepare(key, b"new", by_seqno=2, cas=11, rev_seqno=2)
    server.call(as_replica_with_a_prepare)
    set_topology(server, vb, ["self", "peer"])  # promoted: the prepare is adopted
    with server.login() as c, server.login(features=(Feature.JSON,)) as plain:
        assert c.get(key, vbucket=vb).status == Status.SYNC_WRITE_RE_COMMIT_IN_PROGRESS
        assert plain.get(key, vbucket=vb).status == Status.ETMPFAIL
        peer = clients(name="rc-peer")
        peer.controls(enable_sync_writes="true", consumer_name="peer")
        peer.send(dcp.DcpSeqnoAcknowledged(vb, 2, 0).encode())
        wait_for(lambda: c.get(key, vbucket=vb).status == Status.SUCCESS, what="the re-commit")
        assert c.get(key, vbucket=vb).value == b"new"


def test_unordered_execution_lets_other_keys_overtake_a_waiting_durable_write(server, clients):
    """HELLO UnorderedExecution (BinaryProtocol.md), which the official SDKs ask for: requests on
    other keys run while a durable write waits for its replica, and their replies come first; a
    request on the waiting key, or one that may not be reordered (NOOP), waits for it. Without the
    feature every reply stays in request order."""
    from dcpflow.protocol.hello import Feature

    vb = 7
    key, other = keys_in(vb, 2, prefix="uo")
    set_topology(server, vb, ["self", "uo-peer"])
    features = (Feature.XERROR, Feature.JSON, Feature.UNORDERED_EXECUTION)
    with server.login(features=features) as c, server.login() as ordered:
        held = send_durable_set(c, key, b"durable", vb, timeout_ms=60_000)  # prepare 1: nobody acks yet
        assert c.set(other, b"x", vbucket=vb).status == Status.SUCCESS  # overtakes it
        assert c.get(other, vbucket=vb).value == b"x"
        same = c.next_opaque()
        c.send(request(Opcode.GET, key=c.key(key), vbucket=vb, opaque=same))  # its key: waits
        noop = c.next_opaque()
        c.send(request(Opcode.NOOP, opaque=noop))  # not reorderable: waits too
        held2 = send_durable_set(ordered, other, b"y", vb, timeout_ms=60_000)  # prepare 3
        later = ordered.next_opaque()
        ordered.send(request(Opcode.GET, key=ordered.key(key), vbucket=vb, opaque=later))
        peer = clients(name="uo-peer")
        peer.controls(enable_sync_writes="true", consumer_name="uo-peer")
        peer.send(dcp.DcpSeqnoAcknowledged(vb, 3, 0).encode())
        replies = c.recv_n(3)
        assert [(r.opaque, r.status) for r in replies] == [(held, Status.SUCCESS), (same, Status.SUCCESS),
                                                           (noop, Status.SUCCESS)]
        assert replies[1].value == b"durable"
        first, second = ordered.recv_n(2)  # in order: the durable write's reply, then the GET after it
        assert (first.opaque, first.status, second.opaque) == (held2, Status.SUCCESS, later)
