"""PassiveStream: one vbucket a DCP consumer connection replicates into.

Pages: https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/commands/add-stream.md,
stream-request.md, snapshot-marker.md; rebalance.md ("Initial Stream Handshake").

Its life: PENDING while its stream request waits for the producer's answer, ROLLING_BACK while the
replica rewinds to where a ROLLBACK answer said, READING once the producer accepted, DEAD once it
ended, failed or was closed. The consumer connection (consumer.py) drives it; this class only keeps
its position and counts.
"""

from enum import Enum

from dcpflow.protocol.dcp import DcpStreamRequest, StreamFlag

_TAKEOVER = int(StreamFlag.TAKEOVER)


class PassiveState(Enum):
    PENDING = "pending"  # STREAM_REQ sent, waiting for the producer's answer
    ROLLING_BACK = "rolling-back"
    READING = "reading"
    DEAD = "dead"


class PassiveStream:
    """One replicated vbucket of a consumer connection. `consumer` is its DcpConsumer (the
    server-wide registry of passive streams names the connection holding a vbucket by it)."""

    def __init__(self, consumer, vbid: int, flags: int, add_opaque: int | None, opaque: int):
        self.consumer = consumer
        self.vbid = vbid
        self.flags = flags
        self.add_opaque = add_opaque  # the ADD_STREAM to answer once the producer accepted (None: answered)
        self.opaque = opaque  # the stream's opaque: the STREAM_REQ's, stamped on every stream message
        self.state = PassiveState.PENDING
        self.snap_start = self.snap_end = 0
        self.ack_pending = False  # the current marker had the Ack flag: answer when its end is applied
        self.rollbacks = 0
        self.last_seqno = 0
        self.items = self.markers = self.acks_sent = 0
        self.acked_hps = 0  # the high prepared seqno last acknowledged (DCP_SEQNO_ACKNOWLEDGED)
        self.end_reason: int | None = None
        self.requested: DcpStreamRequest | None = None

    def __repr__(self) -> str:
        return f"<PassiveStream vb={self.vbid} {self.state.value} opaque={self.opaque:#x} last={self.last_seqno}>"

    @property
    def live(self) -> bool:
        return self.state is not PassiveState.DEAD

    @property
    def ended(self) -> bool:
        return self.state is PassiveState.DEAD

    @property
    def takeover(self) -> bool:
        return bool(self.flags & _TAKEOVER)

    def stats(self) -> dict[str, int | str]:
        req = self.requested
        return {
            "state": self.state.value,
            "opaque": self.opaque,
            "flags": self.flags,
            "last_received_seqno": self.last_seqno,
            "cur_snapshot_start": self.snap_start,
            "cur_snapshot_end": self.snap_end,
            "items": self.items,
            "snapshot_markers": self.markers,
            "snapshot_acks_sent": self.acks_sent,
            "rollbacks": self.rollbacks,
            "start_seqno": req.start_seqno if req is not None else 0,
        }
