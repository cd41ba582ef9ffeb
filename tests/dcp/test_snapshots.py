"""Snapshot markers: the start-seqno rules of KV-Engine's snapshot-marker.md implementation notes
(as its code behaves: the first marker starts at min(requested snapshot start, real start)), flags,
de-duplication, and marker versions: V1 by default, V2.0 with sync writes, V2.2 for Disk snapshots
after `max_marker_version=2.2`."""

from dcpflow.protocol import dcp
from dcpflow.protocol.dcp import MarkerVersion, SnapshotFlag
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .client import items, markers
from .conftest import engine_of, fill, keys_in, to_disk_only, vbucket

MAX = 0xFFFFFFFFFFFFFFFF
MEM, DISK, CHK = SnapshotFlag.MEMORY, SnapshotFlag.DISK, SnapshotFlag.CHECKPOINT


def new_checkpoint(server, vb: int) -> None:
    server.call(lambda: engine_of(server).vbucket(vb).checkpoint_manager.create_checkpoint())


def until_seqno(c, seqno: int) -> list:
    return c.messages_until(lambda m: isinstance(m, (dcp.DcpMutation, dcp.DcpDeletion)) and m.by_seqno >= seqno)


# -- memory -----------------------------------------------------------------------------------

def test_memory_first_marker_starts_at_the_requested_start(server, clients, writer):
    fill(writer, 0, 6)
    uuid = vbucket(server, 0).uuid
    c = clients()
    assert c.stream_request(0, 3, MAX, uuid, 3, 3).status == Status.SUCCESS
    first = markers(until_seqno(c, 6))[0]
    assert first.flags == MEM and (first.start_seqno, first.end_seqno) == (3, 6)  # not 4: rule 1


def test_first_marker_takes_the_requested_snapshot_start(server, clients, writer):
    """Resuming inside a partial snapshot [2, 8] at 4: the first marker starts at min(snap_start, start)."""
    fill(writer, 0, 8)
    uuid = vbucket(server, 0).uuid
    c = clients()
    assert c.stream_request(0, 4, MAX, uuid, 2, 8).status == Status.SUCCESS
    msgs = until_seqno(c, 8)
    assert markers(msgs)[0].start_seqno == 2
    assert [m.by_seqno for m in items(msgs)] == [5, 6, 7, 8]


def test_memory_marker_without_checkpoint_flag_starts_at_its_first_item(server, clients, writer):
    fill(writer, 0, 2)
    c = clients()
    assert c.stream_request(0).status == Status.SUCCESS
    until_seqno(c, 2)
    x, y = keys_in(0, 2, prefix="d")
    # x(3), y(4), x(5) written in one go while the stream is idle: x(3) is de-duplicated away
    writer.send(b"".join(writer_set(writer, k, 0) for k in (x, y, x)))
    for _ in range(3):
        writer.recv()
    msgs = until_seqno(c, 5)
    later = [m for m in markers(msgs) if m.end_seqno >= 5][0]
    assert later.flags == MEM and later.start_seqno == 4  # rule 3: the first item that follows
    assert [(m.key, m.by_seqno) for m in items(msgs) if m.by_seqno > 2] == [(y, 4), (x, 5)]


def writer_set(writer, key: bytes, vb: int) -> bytes:
    from dcpflow.protocol.frame import request
    from dcpflow.protocol.opcodes import Opcode
    return request(Opcode.SET, key=key, extras=bytes(8), value=b"v", vbucket=vb, opaque=writer.next_opaque())


def test_checkpoint_marker_starts_at_the_checkpoint_snapshot_start(server, clients, writer):
    fill(writer, 0, 2)
    c = clients()
    c.controls(connection_buffer_size=1)  # the stream stalls after one message until acked
    assert c.stream_request(0).status == Status.SUCCESS
    new_checkpoint(server, 0)  # the next checkpoint starts at 3
    x, y = keys_in(0, 2, prefix="c")
    writer.set(x, b"1", vbucket=0)  # 3
    writer.set(y, b"1", vbucket=0)  # 4
    writer.set(x, b"2", vbucket=0)  # 5: x(3) de-duplicated
    msgs = c.messages_until(lambda m: isinstance(m, dcp.DcpMutation) and m.by_seqno == 5, ack=True)
    chk = [m for m in markers(msgs) if m.flags & CHK]
    assert chk and chk[-1].flags == MEM | CHK and chk[-1].start_seqno == 3  # rule 2: seqno 3 is never seen
    assert [m.by_seqno for m in items(msgs)] == [1, 2, 4, 5]


def test_memory_dedup_and_history_across_checkpoints(server, clients, writer):
    """Within a checkpoint a key appears once (latest version); across checkpoints a memory stream
    shows each checkpoint's version."""
    x, y = keys_in(0, 2, prefix="h")
    # unpersisted checkpoints stay in memory: the stream below is served from memory, not disk
    assert writer.call(Opcode.STOP_PERSISTENCE).status == Status.SUCCESS
    for k in (x, y, x, x):
        writer.set(k, b"a", vbucket=0)  # 1..4 in one checkpoint
    new_checkpoint(server, 0)
    writer.set(x, b"b", vbucket=0)  # 5 in the next checkpoint
    c = clients()
    assert c.stream_request(0, 0, 5).status == Status.SUCCESS
    msgs = c.until_stream_end(0)
    assert [(m.key, m.by_seqno) for m in items(msgs)] == [(y, 2), (x, 4), (x, 5)]
    first, second = markers(msgs)
    assert (first.start_seqno, first.end_seqno, first.flags) == (0, 4, MEM | CHK)
    assert (second.start_seqno, second.end_seqno, second.flags) == (5, 5, MEM | CHK)


# -- disk -------------------------------------------------------------------------------------

def test_disk_snapshot_has_each_key_once(server, clients, writer):
    x, y = keys_in(0, 2, prefix="h")
    for k in (x, y, x):
        writer.set(k, b"a", vbucket=0)
    new_checkpoint(server, 0)
    writer.set(x, b"b", vbucket=0)  # 4
    to_disk_only(server, 0)
    c = clients()
    assert c.stream_request(0, 0, 4).status == Status.SUCCESS
    msgs = c.until_stream_end(0)
    (m,) = markers(msgs)
    assert (m.start_seqno, m.end_seqno, m.flags) == (0, 4, DISK | CHK)
    assert [(i.key, i.by_seqno, i.value) for i in items(msgs)] == [(y, 2, b"a"), (x, 4, b"b")]


def test_disk_first_marker_starts_at_the_requested_start(server, clients, writer):
    fill(writer, 0, 6)
    to_disk_only(server, 0)
    uuid = vbucket(server, 0).uuid
    c = clients()
    assert c.stream_request(0, 2, 6, uuid, 2, 2).status == Status.SUCCESS
    msgs = c.until_stream_end(0)
    (m,) = markers(msgs)
    assert (m.start_seqno, m.end_seqno, m.flags) == (2, 6, DISK | CHK)  # rule 1 (disk): not 3
    assert [i.by_seqno for i in items(msgs)] == [3, 4, 5, 6]


def test_disk_checkpoint_of_a_replica_starts_at_its_snapshot_start(server, clients, writer):
    """A replica's checkpoint created from a disk snapshot streams as Disk; its marker starts at
    the checkpoint's snapshot start even when the stream begins inside it (disk rule 3)."""
    assert writer.call(0x3d, vbucket=9, extras=bytes([2])).status == Status.SUCCESS  # SET_VBUCKET replica

    def replicate():
        vb = engine_of(server).vbucket(9)
        vb.snapshot_marker(1, 4, disk=True)
        for s in range(1, 5):
            vb.apply_mutation(b"r%d" % s, b"v", by_seqno=s, cas=s, rev_seqno=1)
        return vb.uuid
    uuid = server.call(replicate)
    c = clients()
    assert c.stream_request(9, 2, 4, uuid, 1, 4).status == Status.SUCCESS
    msgs = c.until_stream_end(9)
    (m,) = markers(msgs)
    assert m.flags & DISK and not m.flags & MEM and (m.start_seqno, m.end_seqno) == (1, 4)
    assert [i.by_seqno for i in items(msgs)] == [3, 4]


# -- versions ---------------------------------------------------------------------------------

def test_v1_by_default(server, clients, writer):
    fill(writer, 0, 2)
    c = clients()
    c.stream_request(0, 0, 2)
    (m,) = markers(c.until_stream_end(0))
    assert m.version == MarkerVersion.V1


def test_v2_0_with_sync_replication(server, clients, writer):
    fill(writer, 0, 3)
    to_disk_only(server, 0)
    fill(writer, 0, 2, prefix="m")
    c = clients()
    c.controls(enable_sync_writes="true", consumer_name="replica")
    c.stream_request(0, 0, 5)
    disk, mem = markers(c.until_stream_end(0))
    assert disk.version == mem.version == MarkerVersion.V2_0
    assert (disk.max_visible_seqno, disk.high_completed_seqno) == (3, 0)  # no SyncWrite ever completed
    assert mem.max_visible_seqno == 5


def test_sync_writes_without_consumer_name_stays_v1(server, clients, writer):
    fill(writer, 0, 1)
    c = clients()
    c.controls(enable_sync_writes="true")
    c.stream_request(0, 0, 1)
    (m,) = markers(c.until_stream_end(0))
    assert m.version == MarkerVersion.V1


def test_v2_2_for_disk_snapshots_only(server, clients, writer):
    fill(writer, 0, 3)
    to_disk_only(server, 0)
    fill(writer, 0, 2, prefix="m")
    c = clients(features=(Feature.XERROR, Feature.COLLECTIONS))
    c.controls(enable_noop="true", max_marker_version="2.2")
    c.stream_request(0, 0, 5)
    disk, mem = markers(c.until_stream_end(0))
    assert disk.version == MarkerVersion.V2_2 and disk.purge_seqno == vbucket(server, 0).purge_seqno
    assert (disk.start_seqno, disk.end_seqno, disk.max_visible_seqno) == (0, 3, 3)
    assert mem.version == MarkerVersion.V1


def test_v2_2_with_sync_replication_memory_is_v2_0(server, clients, writer):
    fill(writer, 0, 3)
    to_disk_only(server, 0)
    fill(writer, 0, 1, prefix="m")
    c = clients(features=(Feature.XERROR, Feature.COLLECTIONS))
    c.controls(enable_noop="true", max_marker_version="2.2", enable_sync_writes="true", consumer_name="r")
    c.stream_request(0, 0, 4)
    disk, mem = markers(c.until_stream_end(0))
    assert (disk.version, mem.version) == (MarkerVersion.V2_2, MarkerVersion.V2_0)
