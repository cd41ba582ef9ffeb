"""The DCP commands: DCP_OPEN makes a connection a producer or a consumer, and every other DCP
opcode goes to the role its connection has.

Pages: https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/commands/ (one per
opcode: open-connection.md, add-stream.md, close-stream.md, stream-request.md, failover-log.md,
buffer-ack.md, control.md, no-op.md and the stream messages).

A command for the other role closes the connection ("Disconnect" in the pages: a producer sent
ADD_STREAM, a consumer sent STREAM_REQ); one before DCP_OPEN is EINVAL. DCP_NOOP and
DCP_CLOSE_STREAM are valid on both roles and are routed by it. The handlers are wired into the
command table by commands.py.
"""

import logging
from typing import TYPE_CHECKING

from dcpflow.engine.errors import EngineError
from dcpflow.protocol import dcp as dcpproto
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import Frame, response
from dcpflow.protocol.status import Status

from .auth import Privilege
from .consumer import ConsumerShell
from .producer import ProducerShell

if TYPE_CHECKING:
    from .connection import Connection

log = logging.getLogger("dcpflow.server.dcp")


class DcpNames:
    """The names of a server's DCP connections, per bucket: a name opened again closes the
    connection that held it (open-connection.md: a reconnecting client reuses its name)."""

    def __init__(self) -> None:
        self._holders: dict[tuple[str, str], Connection] = {}

    def claim(self, bucket: str, name: str, conn: "Connection") -> "Connection | None":
        """`conn` holds the name now; the connection that held it before, if another."""
        older = self._holders.get((bucket, name))
        self._holders[(bucket, name)] = conn
        return older if older is not conn else None

    def release(self, bucket: str, name: str, conn: "Connection") -> None:
        """`conn` is gone: the name is free, unless another connection took it since."""
        if self._holders.get((bucket, name)) is conn:
            del self._holders[(bucket, name)]

    def __len__(self) -> int:
        return len(self._holders)


def _producer(conn: "Connection", frame: Frame) -> ProducerShell:
    """The connection's producer; anything else is refused (a consumer connection is closed)."""
    p = conn.dcp
    if isinstance(p, ProducerShell):
        return p
    if p is not None:
        conn.close()  # "Disconnect: if this command is sent to a consumer endpoint"
        raise ProtocolError(f"opcode 0x{frame.opcode:02x} is not valid on a DCP consumer connection")
    raise ProtocolError("not a DCP producer connection: send DCP_OPEN with the Producer flag first",
                        Status.EINVAL)


def _consumer(conn: "Connection", frame: Frame) -> ConsumerShell:
    """The connection's consumer; a producer connection is disconnected (add-stream.md, "Disconnect")."""
    c = conn.dcp
    if isinstance(c, ConsumerShell):
        return c
    if c is not None:
        conn.close()
        raise ProtocolError(f"opcode 0x{frame.opcode:02x} is only valid on a DCP consumer connection")
    raise ProtocolError("not a DCP consumer connection: send DCP_OPEN without the Producer flag first",
                        Status.EINVAL)


def dcp_open(conn: "Connection", frame: Frame) -> bytes:
    """DCP_OPEN 0x50 (open-connection.md): a producer with the Producer
    flag, else a consumer; each needs its privilege on the bucket."""
    req = dcpproto.DcpOpen.from_frame(frame)
    if conn.dcp is not None:
        return conn.error_reply(frame.opcode, frame.opaque, Status.EINVAL, "this connection is already open for DCP")
    try:
        name = req.name.decode("utf-8")
    except UnicodeDecodeError:
        return conn.error_reply(frame.opcode, frame.opaque, Status.EINVAL, "the connection name must be UTF-8")
    needed, role = (Privilege.DCP_PRODUCER, "DcpProducer") if req.is_producer else \
        (Privilege.DCP_CONSUMER, "DcpConsumer")
    if not conn.privileges & needed:
        return conn.access_refused(frame, f"user {conn.user.name!r} lacks {role} on this bucket")
    older = conn.server.dcp_names.claim(conn.bucket.name, name, conn)
    if older is not None:
        conn.server.log.log(logging.INFO, "dcp-name-reused", "DCP connection name %r reused: disconnecting the "
                            "older connection %s", name, older.peer)
        if isinstance(older.dcp, ProducerShell):
            older.dcp.shutdown()
        older.close()
    if req.is_producer:
        conn.dcp = ProducerShell(conn, name, req.flags)
    else:
        conn.dcp = ConsumerShell(conn, name, req.flags, req.consumer_name)
    conn.agent = conn.agent or name
    return response(frame.opcode, opaque=frame.opaque)


def dcp_control(conn: "Connection", frame: Frame) -> bytes:
    """DCP_CONTROL 0x5e (control.md): the keys and their rules are dcp/controls.py's table."""
    req = dcpproto.DcpControl.from_frame(frame)
    p = _producer(conn, frame)
    p.received()
    key = req.key.decode("utf-8", "replace")
    value = req.value.decode("utf-8", "replace")
    status, reason = p.control(key, value)
    if status != Status.SUCCESS:
        return conn.error_reply(frame.opcode, frame.opaque, status, reason)
    return response(frame.opcode, opaque=frame.opaque)


def dcp_stream_req(conn: "Connection", frame: Frame) -> bytes:
    """DCP_STREAM_REQ 0x53 (stream-request.md, stream-request-value.md, rollback.md)."""
    p = _producer(conn, frame)
    p.received()
    req = dcpproto.DcpStreamRequest.from_frame(frame)
    return p.stream_request(req, frame)


def dcp_close_stream(conn: "Connection", frame: Frame) -> bytes:
    """DCP_CLOSE_STREAM 0x52 (close-stream.md), on either role. In the table without a privilege
    because both roles receive it; a producer needs DcpProducer."""
    if isinstance(conn.dcp, ConsumerShell):
        return conn.dcp.close_stream(frame)
    p = _producer(conn, frame)
    if not conn.privileges & Privilege.DCP_PRODUCER:
        return conn.access_refused(frame, f"user {conn.user.name!r} lacks DcpProducer on this bucket")
    p.received()
    req = dcpproto.DcpCloseStream.from_frame(frame)
    return p.close_stream(req, frame) or response(frame.opcode, opaque=frame.opaque)


def dcp_get_failover_log(conn: "Connection", frame: Frame) -> bytes:
    """DCP_GET_FAILOVER_LOG 0x54 (failover-log.md): entries newest first, on a DCP connection only."""
    req = dcpproto.DcpGetFailoverLog.from_frame(frame)
    if conn.dcp is None:  # kv_engine's verify_common_dcp_restrictions: GET_FAILOVER_LOG 0x96 is the command for that
        raise ProtocolError("DCP_GET_FAILOVER_LOG can only be sent on a DCP connection (send DCP_OPEN first, or use "
                            "GET_FAILOVER_LOG 0x96)")
    if not conn.privileges & (Privilege.DCP_PRODUCER | Privilege.META_READ):
        return conn.access_refused(frame, "the failover log needs DcpProducer or MetaRead on this bucket")
    if isinstance(conn.dcp, ProducerShell):
        conn.dcp.received()
    vb = conn.get_vbucket(req.vbucket)
    if vb is None:
        raise EngineError(Status.NOT_MY_VBUCKET, f"vbucket {req.vbucket} is not on this node")
    return dcpproto.FailoverLogResponse(tuple(vb.failover.entries), frame.opaque).encode()


def dcp_buffer_ack(conn: "Connection", frame: Frame) -> None:
    """DCP_BUFFER_ACKNOWLEDGEMENT 0x5d (buffer-ack.md): no reply on success, and any opaque
    is accepted (the page's "opaque 0 = connection" convention is not checked)."""
    req = dcpproto.DcpBufferAck.from_frame(frame)
    _producer(conn, frame).buffer_ack(req.bytes_acked)
    return None


def dcp_seqno_ack(conn: "Connection", frame: Frame) -> None:
    """DCP_SEQNO_ACKNOWLEDGED 0x61 (seqno-acknowledged.md): a replica holds every prepare up to the
    seqno (persisted, for PersistToMajority ones). No reply on success; the connection must have
    enabled sync writes and named its consumer, whose name is what the vbucket's chain lists."""
    req = dcpproto.DcpSeqnoAcknowledged.from_frame(frame)
    _producer(conn, frame).seqno_ack(req.vbucket, req.prepared_seqno)
    return None


def dcp_noop(conn: "Connection", frame: Frame) -> bytes | None:
    """DCP_NOOP 0x5c: a consumer answers the producer's keep-alive; a producer that receives a
    noop *request* disconnects (no-op.md)."""
    if isinstance(conn.dcp, ConsumerShell):
        return conn.dcp.noop(frame)
    _producer(conn, frame)
    conn.server.log.warning("dcp-protocol", "DCP %s: the consumer sent a DCP_NOOP request (a producer only "
                            "answers replies): disconnecting", conn.dcp.name)
    conn.close()
    return None


def dcp_add_stream(conn: "Connection", frame: Frame) -> bytes | None:
    """DCP_ADD_STREAM 0x51 (add-stream.md; the removed NoValue flag 0x08 is EINVAL)."""
    consumer = _consumer(conn, frame)
    req = dcpproto.DcpAddStream.from_frame(frame)  # EINVAL: malformed, unknown or removed (NoValue) flags
    return consumer.add_stream(req, frame)


def dcp_stream_message(conn: "Connection", frame: Frame) -> bytes | None:
    """Messages a producer sends down a stream, applied by the consumer's PassiveStream."""
    return _consumer(conn, frame).on_message(frame)


def dcp_stats(conn: "Connection", vbid: int | None) -> dict:
    """`stats dcp`: every DCP connection of the selected bucket (producers, then consumers)."""
    out: dict = {}
    for other in list(conn.server.connections):
        p = other.dcp
        if isinstance(p, ProducerShell) and p.bucket is conn.bucket and not p.closed:
            out.update(p.stats())
    out["ep_dcp_count"] = sum(1 for c in conn.server.connections if isinstance(c.dcp, ProducerShell))
    for other in list(conn.server.connections):
        c = other.dcp
        if isinstance(c, ConsumerShell) and c.bucket is conn.bucket and not c.closed:
            out.update(c.stats())
    return out

