"""What the management plane sees of DCP: every DCP connection of the server with its streams.

Read from each connection's `dcp.stats()` - the `stats dcp` group, in kv_engine's names
(`eq_dcpq:<name>:<stat>` per connection, `eq_dcpq:<name>:stream_<vb>_<stat>` or
`..._stream_<vb>_sid<id>_<stat>` per stream) - and the vbucket's high seqno from the engine. This is
the one module that knows that layout: the metrics, the page and the event log use the views it
builds, so a change in how the DCP side is organised is absorbed here. Stream ends are seen
through the connection's `streams` table (each stream keeps its `end_reason`).

Items remaining of a producer stream: the vbucket's high seqno (capped at the stream's end) minus
the last seqno the stream took into its ready queue - an upper bound, since de-duplication may
send fewer. What is queued and not yet written is its ready queue's bytes (at most 256 KiB a
stream); what is written and not yet acknowledged, the connection's unacked bytes. A connection
named `replication:...` (kv_engine's and dcpflow cluster's name for a replica link) is a
replication link; its producer's items remaining is the replicas' lag behind this node's actives.
"""

import re
from dataclasses import dataclass, field

from ..conn_handler import StreamHandle

_STREAM_KEY = re.compile(r"stream_(\d+)_(?:sid(\d+)_)?(.+)")


@dataclass
class StreamView:
    vb: int
    sid: int | None
    stats: dict
    high_seqno: int = 0  # the vbucket's on this node (producer streams)
    items_remaining: int = 0

    @property
    def state(self) -> str:
        return str(self.stats.get("state", ""))

    @property
    def position(self) -> int:
        """The last seqno queued to send (producer) or received (consumer)."""
        return int(self.stats.get("last_sent_seqno", self.stats.get("last_received_seqno", 0)))

    @property
    def queue_bytes(self) -> int:
        return int(self.stats.get("ready_queue_bytes", 0))


@dataclass
class ConnectionView:
    name: str
    type: str  # "producer" or "consumer"
    bucket: str
    peer: str
    stats: dict
    streams: list[StreamView] = field(default_factory=list)

    @property
    def replication(self) -> bool:
        return self.name.startswith("replication:")

    @property
    def items_remaining(self) -> int:
        return sum(s.items_remaining for s in self.streams)

    @property
    def buffer_size(self) -> int:
        return int(self.stats.get("max_buffer_bytes", 0))

    @property
    def unacked_bytes(self) -> int:
        return int(self.stats.get("unacked_bytes", 0))

    @property
    def bytes_moved(self) -> int:
        return int(self.stats.get("total_bytes_sent", self.stats.get("total_bytes_received", 0)))

    @property
    def items_sent(self) -> int:
        return int(self.stats.get("items_sent", 0))


def dcp_connections(server) -> list:
    """The server's connections that are DCP producers or consumers, open ones only."""
    return [c for c in list(server.connections) if c.dcp is not None and not c.dcp.closed]


def view(conn) -> ConnectionView:
    dcp = conn.dcp
    prefix = f"eq_dcpq:{dcp.name}:"
    own: dict = {}
    per_stream: dict[tuple[int, int | None], dict] = {}
    for key, value in dcp.stats().items():
        if not key.startswith(prefix):
            continue
        key = key[len(prefix):]
        m = _STREAM_KEY.fullmatch(key)
        if m is None:
            own[key] = value
        else:
            vb, sid = int(m.group(1)), (int(m.group(2)) if m.group(2) else None)
            per_stream.setdefault((vb, sid), {})[m.group(3)] = value
    cview = ConnectionView(dcp.name, str(own.get("type", "")), dcp.bucket.name, conn.peer, own)
    engine = dcp.bucket.engine
    for (vb, sid), stats in sorted(per_stream.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        s = StreamView(vb, sid, stats)
        if cview.type == "producer":
            vbucket = engine.get_vbucket(vb)
            s.high_seqno = vbucket.high_seqno if vbucket is not None else 0
            end = int(stats.get("end_seqno", s.high_seqno))
            s.items_remaining = max(0, min(s.high_seqno, end) - s.position)
        cview.streams.append(s)
    return cview


def views(server, may_see=lambda bucket: True) -> list[ConnectionView]:
    return [view(c) for c in dcp_connections(server) if may_see(c.dcp.bucket.name)]


def stream_objects(conn) -> dict:
    """(vb, sid) -> the connection's stream object, to learn why a stream ended once it is gone."""
    out = {}
    for key, stream in list(conn.dcp.streams.items()):
        out[key if isinstance(key, tuple) else (key, None)] = stream
    return out


def stream_ended(stream: StreamHandle) -> bool:
    """A producer stream that is dead, a consumer stream no longer live (conn_handler.py)."""
    return stream.ended


def end_reason(stream: StreamHandle):
    """Why a stream ended (a StreamEndReason or its number); None: its connection went away."""
    return stream.end_reason


def kind(conn) -> str:
    """"producer" or "consumer" (the connection's ConnHandler says)."""
    return conn.dcp.kind


def items_remaining(conn) -> int:
    """A producer connection's items remaining (as `view` counts them), read from its streams'
    positions instead of its stats: cheap enough for the sample taken every second, where a
    connection with 1024 streams has some 15,000 stats."""
    return conn.dcp.items_remaining()
