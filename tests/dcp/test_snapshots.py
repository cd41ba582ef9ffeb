"""Snapshot markers: the start-seqno rules of KV-Engine's snapshot-marker.md implementation notes
(as its code behaves: the first marker starts at min(requested snapshot start, real start)), flags,
de-duplication, and marker versions: V1 by default, V2.0 with sync writes, V2.2 for Disk snapshots
after `max_marker_version=2.2`. End to end over a real server: one case of each kind (a memory
checkpoint marker under flow control, a disk marker, V2.0 and V2.2); every marker rule is checked
without a socket in test_stream_rules.py."""

from dcpflow.protocol import dcp
from dcpflow.protocol.dcp import MarkerVersion, SnapshotFlag
from dcpflow.protocol.hello import Feature
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


# -- disk -------------------------------------------------------------------------------------

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


# -- versions ---------------------------------------------------------------------------------

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

