"""The one module through which fault injection reaches DCP connections.

Which connections a fault applies to (by bucket, by DCP connection name), the open streams of
producer connections, ending a stream with a chosen reason, and dropping a stream's checkpoint
cursor. It reads `conn.dcp` of `server.connections` and uses only the producer's public `streams`
table and `end_stream(stream, reason)`, and the stream's `cursor`, `vb` and `opts`: when the DCP
state machines move (server/producer.py into their own package), this module is what follows.
"""

from typing import NamedTuple

from dcpflow.protocol.dcp import StreamEndReason

from ..producer import ProducerShell


class StreamRef(NamedTuple):
    """An open producer stream: its connection and what identifies it there."""

    producer: ProducerShell
    stream: object  # dcp/active_stream.py ActiveStream
    vbucket: int
    sid: int | None

    def describe(self) -> dict:
        out = {"connection": self.producer.name, "vbucket": self.vbucket}
        if self.sid is not None:
            out["sid"] = self.sid
        return out


def dcp_name(conn) -> str | None:
    """The DCP connection name of a KV connection (producer or consumer), None for a plain one."""
    dcp = conn.dcp
    return None if dcp is None else dcp.name


def producers(server, bucket=None, name: str | None = None) -> list[ProducerShell]:
    """Open producer connections, of `bucket` (a ServerBucket) and named `name` when given."""
    out = []
    for conn in list(server.connections):
        p = conn.dcp
        if isinstance(p, ProducerShell) and not p.closed and (bucket is None or p.bucket is bucket) \
                and (name is None or p.name == name):
            out.append(p)
    return out


def open_streams(server, bucket=None, vbuckets=None, name: str | None = None) -> list[StreamRef]:
    """The streams not ended yet of those producers, on `vbuckets` (a set) when given."""
    out = []
    for p in producers(server, bucket, name):
        for (vb, sid), stream in list(p.streams.items()):
            if not stream.dead and (vbuckets is None or vb in vbuckets):
                out.append(StreamRef(p, stream, vb, sid))
    return out


def end(ref: StreamRef, reason: StreamEndReason) -> None:
    """End the stream as the producer ends it for that reason: its queue is dropped and
    STREAM_END(reason) is the last message the consumer gets on it."""
    ref.producer.end_stream(ref.stream, reason)


def drop_cursor(ref: StreamRef) -> str:
    """Drop the stream's checkpoint cursor as the memory quota does (engine/checkpoint.py): a
    stream of a connection that sent `supports_cursor_dropping` goes back to disk from where it
    was ("backfill"), any other ends with STREAM_END(SLOW) ("slow"). A stream without a memory
    cursor (DiskOnly, or ending) has nothing to drop ("no cursor")."""
    stream = ref.stream
    cursor = stream.cursor
    if cursor is None or cursor.dropped:
        return "no cursor"
    try:
        stream.vb.checkpoint_manager.drop_cursor(cursor)
    except ValueError:  # dropped or replaced meanwhile
        return "no cursor"
    return "backfill" if stream.opts.supports_cursor_dropping else "slow"
