"""The end-to-end path: DCP_OPEN producer -> STREAM_REQ -> backfill Disk snapshot -> memory
snapshots -> STREAM_END(OK) at the end seqno, with flow control and noops on."""

from dcpflow.protocol.dcp import SnapshotFlag, StreamEndReason
from dcpflow.protocol.status import Status

from .client import items, markers
from .conftest import fill, keys_in, to_disk_only


def test_backfill_then_memory_then_end(server, clients, writer):
    keys = fill(writer, 0, 10)
    to_disk_only(server, 0)
    c = clients()
    c.controls(connection_buffer_size=4096, enable_noop="true", set_noop_interval="0.2")
    resp = c.stream_request(0, start=0, end=15)
    assert resp.status == Status.SUCCESS and resp.failover_log
    for k in keys_in(0, 6, prefix="m"):
        writer.set(k, b"v", vbucket=0)
    msgs = c.until_stream_end(0, ack=True)
    assert [m.by_seqno for m in items(msgs)] == list(range(1, 16))
    disk, *mem = markers(msgs)
    assert (disk.start_seqno, disk.end_seqno, disk.flags) == (0, 10, SnapshotFlag.DISK | SnapshotFlag.CHECKPOINT)
    assert mem and all(m.flags & SnapshotFlag.MEMORY and m.end_seqno <= 15 for m in mem)  # clamped to the end
    assert msgs[-1].reason == StreamEndReason.OK and msgs[-1].opaque == disk.opaque
    assert [m.key for m in items(msgs)][:10] == keys
