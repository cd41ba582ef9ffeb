"""DcpConsumer and PassiveStream: the replica side of DCP, driven by ADD_STREAM.

Pages: docs/dcp/documentation/commands/add-stream.md, stream-request.md, snapshot-marker.md,
set-vbucket-state.md, stream-end.md, no-op.md, buffer-ack.md, control.md; the overview pages
rebalance.md ("Initial Stream Handshake", "VBucket Takeover"), failure-scenarios.md, rollback.md and
flow-control.md; TABLES.md 5.2-5.5, 5.9 and 7; errata 20, 36, 37, 38 of reference/README.md.

A connection opened with DCP_OPEN *without* the Producer flag becomes a DcpConsumer (the producer
module's `consumer_factory` hook). The cluster manager (ns_server's role, dcpflow.replication)
sits between it and a producer on another node and relays everything in both directions:

* Right after the open, the consumer sends its DCP_CONTROLs (buffer size, noop, priority, expiry
  opcode, cursor dropping, v7 status codes) - they travel through the relay to the producer.
* DCP_ADD_STREAM(vb, flags) creates a PassiveStream: checks (the vbucket must be here as a
  replica or pending one, else NOT_MY_VBUCKET; one live stream per vbucket, else KEY_EEXISTS;
  malformed or the removed NoValue flag: EINVAL), then the consumer sends its own DCP_STREAM_REQ
  with the stream's new opaque: start = the replica's high seqno, its vbucket UUID and its
  current snapshot range. The ADD_STREAM reply is sent only when the producer has answered
  (rebalance.md: out of order), with the stream opaque in 4 bytes of extras, or the producer's
  error status.
* ROLLBACK (u64 seqno, erratum 36): the replica is rolled back from disk to that seqno
  (Bucket.rollback, under the server's maintenance lock so no flush batch is in flight) and the
  stream request is sent again from the new position, until the producer says OK. OK carries the
  producer's failover log, which replaces the replica's (failure-scenarios.md, "Handshake").
* Stream messages are applied to the replica vbucket with their metadata unchanged (engine
  `snapshot_marker` / `apply_*`): markers open a replica checkpoint keeping the Disk/Memory type,
  mutations, deletions and expirations keep CAS, rev seqno, flags, expiry and delete time.
  A marker with the Ack flag is answered once its end seqno has been applied (takeover).
  DCP_SET_VBUCKET_STATE (takeover: pending, then active) changes the vbucket's state - becoming
  active this way creates no failover entry - and is answered. STREAM_END closes the stream
  (SLOW, BACKFILL_FAIL and ROLLBACK re-request from where the replica stands).
* A message for a vbucket with no stream answers KEY_ENOENT (DCP_STREAM_NOT_FOUND once the
  producer accepted v7_dcp_status_codes), one with another stream's opaque KEY_EEXISTS
  (OPAQUE_NO_MATCH); a message the replica cannot take (outside its snapshot...) answers its
  status, which makes the producer drop the connection.
* Flow control (flow-control.md, erratum 38): every message but a noop is counted at its charged
  size (TABLES.md 5.9) once applied; a DCP_BUFFER_ACK goes out when a fifth of the buffer was
  consumed (dcp_consumer_flow_control_ack_ratio) or after ACK_SECONDS. Noops are answered.

The consumer never dials the producer: every request it makes goes out on its own connection.
"""

import asyncio
import contextlib
import itertools
import logging
import time
from enum import Enum
from typing import TYPE_CHECKING

from dcpflow.dcp.active_stream import MAX_SEQNO
from dcpflow.engine.errors import EngineError
from dcpflow.protocol import dcp as dcpproto
from dcpflow.protocol.dcp import SnapshotFlag, StreamEndReason, StreamFlag, VBucketState
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import Frame, response
from dcpflow.protocol.keys import split_key
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from . import producer as _producer
from .auth import Privilege
from .dispatch import COMMANDS, command

if TYPE_CHECKING:
    from .connection import Connection

log = logging.getLogger("dcpflow.server.consumer")

#: The flow-control window the consumer asks for (kv_engine sizes it from the bucket quota).
DEFAULT_BUFFER_SIZE = 10 * 1024 * 1024
#: Ack once this fraction of the buffer is consumed (dcp_consumer_flow_control_ack_ratio).
ACK_RATIO = 0.2
#: ...or once this long has passed with something unacknowledged (dcp_consumer_flow_control_ack_seconds).
ACK_SECONDS = 5.0
#: The noop interval the consumer asks the producer for.
NOOP_INTERVAL = 1.0
#: Give up on a stream after this many ROLLBACK answers in a row (the producer keeps refusing).
MAX_ROLLBACKS = 16
_STREAM_ENDS_TO_RETRY = frozenset({StreamEndReason.SLOW, StreamEndReason.BACKFILL_FAIL, StreamEndReason.ROLLBACK})


class PassiveState(Enum):
    PENDING = "pending"  # STREAM_REQ sent, waiting for the producer's answer
    ROLLING_BACK = "rolling-back"
    READING = "reading"
    DEAD = "dead"


class PassiveStream:
    """One replicated vbucket of a consumer connection."""

    def __init__(self, consumer: "DcpConsumer", vbid: int, flags: int, add_opaque: int | None, opaque: int):
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
        self.end_reason: int | None = None
        self.requested: dcpproto.DcpStreamRequest | None = None

    def __repr__(self) -> str:
        return f"<PassiveStream vb={self.vbid} {self.state.value} opaque={self.opaque:#x} last={self.last_seqno}>"

    @property
    def live(self) -> bool:
        return self.state is not PassiveState.DEAD

    @property
    def takeover(self) -> bool:
        return bool(self.flags & StreamFlag.TAKEOVER)

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


class DcpConsumer:
    """See the module docstring. One per DCP consumer connection."""

    def __init__(self, conn: "Connection", name: str, flags: int, consumer_name: str | None = None, *,
                 buffer_size: int = DEFAULT_BUFFER_SIZE):
        self.conn = conn
        self.server = conn.server
        self.name = name
        self.consumer_name = consumer_name
        self.open_flags = flags
        self.bucket = conn.bucket
        self.engine = conn.bucket.engine
        self.loop = asyncio.get_running_loop()
        self.created = time.time()
        self.streams: dict[int, PassiveStream] = {}  # vbid -> the connection's stream of that vbucket
        self._by_opaque: dict[int, PassiveStream] = {}
        self._opaques = itertools.count(0x10000)
        self._waiting: dict[int, object] = {}  # opaque of a request we sent -> what to do with its reply
        self.controls: dict[str, int] = {}  # DCP_CONTROL key -> the producer's status
        self.v7_status = False
        self.buffer_size = buffer_size
        self.ack_threshold = max(1, int(buffer_size * ACK_RATIO))
        self.unacked = 0
        self.total_acked = 0
        self.bytes_received = 0
        self.noops = 0
        self.last_received = time.monotonic()
        self._ack_timer: asyncio.TimerHandle | None = None
        self._changing_state = False
        self.closed = False
        self.engine.add_vbucket_listener(self._on_vbucket_event)
        conn.response_handler = self.on_response
        conn.on_close.append(self.disconnect)
        # After the DCP_OPEN reply (written when the handler returns), not before it.
        self.loop.call_soon(self._send_controls)

    def __repr__(self) -> str:
        return f"<DcpConsumer {self.name!r} streams={len(self.streams)}>"

    # -- output ---------------------------------------------------------------------------------
    def _send(self, data: bytes) -> None:
        if not self.closed:
            self.conn.writer.send(data)

    def _request(self, message, on_reply) -> int:
        """Send a request with a fresh opaque; `on_reply(frame)` gets its response."""
        opaque = next(self._opaques)
        self._waiting[opaque] = on_reply
        self._send(message._replace(opaque=opaque).encode())
        return opaque

    def _send_controls(self) -> None:
        """What kv_engine's consumer negotiates before its first stream request (control.md)."""
        wanted = [("connection_buffer_size", str(self.buffer_size)), ("enable_noop", "true"),
                  ("set_noop_interval", f"{NOOP_INTERVAL:g}"), ("set_priority", "high"),
                  ("enable_expiry_opcode", "true"), ("supports_cursor_dropping_vulcan", "true"),
                  ("v7_dcp_status_codes", "true")]
        for key, value in wanted:
            self._request(dcpproto.DcpControl(key.encode(), value.encode()),
                          lambda frame, key=key: self._control_reply(key, frame))

    def _control_reply(self, key: str, frame: Frame) -> None:
        self.controls[key] = frame.status
        if frame.status != Status.SUCCESS:
            log.info("DCP consumer %s: the producer refused %s (status 0x%x)", self.name, key, frame.status)
        elif key == "v7_dcp_status_codes":
            self.v7_status = True

    # -- ADD_STREAM -----------------------------------------------------------------------------
    def add_stream(self, req: dcpproto.DcpAddStream, frame: Frame) -> bytes | None:
        """add-stream.md: checks, then our STREAM_REQ; the reply waits for the producer's answer."""
        err = self.conn.error_reply
        op, vbid = frame.opcode, req.vbucket
        if req.flags & StreamFlag.CACHE_TRANSFER:
            return err(op, frame.opaque, Status.NOT_SUPPORTED, "CacheTransfer streams are not supported by "
                       "this consumer (it cannot apply DCP_CACHE_TRANSFER messages)")
        vb = self.engine.get_vbucket(vbid)
        if vb is None:
            return err(op, frame.opaque, Status.NOT_MY_VBUCKET, f"vbucket {vbid} does not exist on this node")
        if vb.state not in (VBucketState.REPLICA, VBucketState.PENDING):
            return err(op, frame.opaque, Status.NOT_MY_VBUCKET, f"vbucket {vbid} is {vb.state.name.lower()} "
                       "here; a consumer streams into a replica or pending vbucket")
        existing = self.streams.get(vbid)
        if existing is not None and existing.live:
            return err(op, frame.opaque, Status.KEY_EEXISTS, f"a stream for vbucket {vbid} already exists on this "
                       "connection")
        other = passive_streams(self.server).get((self.bucket.name, vbid))
        if other is not None and other.live and other.consumer is not self:
            return err(op, frame.opaque, Status.KEY_EEXISTS, f"vbucket {vbid} is already replicated by consumer "
                       f"connection {other.consumer.name!r}; close that stream first")
        stream = PassiveStream(self, vbid, req.flags, frame.opaque, next(self._opaques))
        self._register(stream)
        self._stream_request(stream)
        return None

    def _register(self, stream: PassiveStream) -> None:
        old = self.streams.get(stream.vbid)
        if old is not None:
            self._by_opaque.pop(old.opaque, None)
        self.streams[stream.vbid] = stream
        self._by_opaque[stream.opaque] = stream
        passive_streams(self.server)[(self.bucket.name, stream.vbid)] = stream

    def _stream_request(self, stream: PassiveStream) -> None:
        """Ask for the vbucket from where the replica stands: its high seqno, UUID and snapshot."""
        vb = self.engine.get_vbucket(stream.vbid)
        if vb is None:
            self._finish(stream, Status.NOT_MY_VBUCKET)
            return
        start = vb.high_seqno
        snap_start, snap_end = vb.snapshot_start, vb.snapshot_end
        if snap_start > start:  # a marker arrived but none of its items: resume at the previous end
            snap_start = snap_end = start
        snap_end = max(snap_end, start)
        # After a rollback to 0 that the producer answered with another rollback to 0, ask with no
        # history (uuid 0): a StrictVbUuid request with an unknown uuid would loop otherwise.
        uuid = 0 if start == 0 and stream.rollbacks and stream.flags & StreamFlag.STRICT_VBUUID else vb.uuid
        stream.state = PassiveState.PENDING
        stream.snap_start, stream.snap_end = snap_start, snap_end
        req = dcpproto.DcpStreamRequest(stream.vbid, start, MAX_SEQNO, uuid, snap_start, snap_end, stream.flags,
                                        opaque=stream.opaque)
        stream.requested = req
        self._waiting[stream.opaque] = lambda frame, s=stream: self._stream_req_reply(s, frame)
        self._send(req.encode())

    def _stream_req_reply(self, stream: PassiveStream, frame: Frame) -> None:
        if stream.state is not PassiveState.PENDING or self.streams.get(stream.vbid) is not stream:
            return  # closed meanwhile
        try:
            reply = dcpproto.DcpStreamRequestResponse.from_frame(frame)
        except ProtocolError as e:
            log.warning("DCP consumer %s: malformed STREAM_REQ reply for vbucket %d: %s", self.name, stream.vbid, e)
            self._request_failed(stream, Status.EINVAL)
            return
        if reply.status == Status.ROLLBACK:
            stream.rollbacks += 1
            if stream.rollbacks > MAX_ROLLBACKS:
                log.warning("DCP consumer %s: vbucket %d: %d rollbacks in a row; giving up", self.name,
                            stream.vbid, stream.rollbacks)
                self._request_failed(stream, Status.ROLLBACK)
                return
            stream.state = PassiveState.ROLLING_BACK
            self.loop.create_task(self._rollback(stream, reply.rollback_seqno))
            return
        if reply.status != Status.SUCCESS:
            self._request_failed(stream, reply.status)
            return
        vb = self.engine.get_vbucket(stream.vbid)
        if vb is None or vb.state not in (VBucketState.REPLICA, VBucketState.PENDING):
            self._request_failed(stream, Status.NOT_MY_VBUCKET)
            return
        if reply.failover_log:
            vb.failover.replace(reply.failover_log)  # the replica's history is the producer's
            self.engine.flusher.persist_state(vb)
        stream.rollbacks = 0
        stream.state = PassiveState.READING
        stream.last_seqno = vb.high_seqno
        self._answer_add_stream(stream, Status.SUCCESS)

    async def _rollback(self, stream: PassiveStream, seqno: int) -> None:
        """Roll the replica back to `seqno` from disk, then ask again (rebalance.md steps 4-5)."""
        try:
            async with self.server._maintenance:  # no flush batch in flight while the store rewinds
                if self.closed or self.streams.get(stream.vbid) is not stream or not stream.live:
                    return
                self._changing_state = True
                try:
                    reached = self.engine.rollback(stream.vbid, seqno)
                finally:
                    self._changing_state = False
            log.info("DCP consumer %s: vbucket %d rolled back to %d (asked %d)", self.name, stream.vbid,
                     reached, seqno)
        except Exception:
            log.exception("DCP consumer %s: rollback of vbucket %d to %d failed", self.name, stream.vbid, seqno)
            self._request_failed(stream, Status.EINTERNAL)
            return
        if not self.closed and self.streams.get(stream.vbid) is stream and stream.live:
            self._stream_request(stream)

    def _answer_add_stream(self, stream: PassiveStream, status: int) -> None:
        if stream.add_opaque is None:
            return
        add_opaque, stream.add_opaque = stream.add_opaque, None
        self._send(dcpproto.DcpAddStreamResponse(stream.opaque, add_opaque, status).encode())

    def _finish(self, stream: PassiveStream, status: int) -> None:
        """The stream could not be established: answer the ADD_STREAM with `status`, forget it."""
        self._answer_add_stream(stream, status)
        self._kill(stream, None)

    def _request_failed(self, stream: PassiveStream, status: int) -> None:
        """A stream request failed for good. If this consumer had asked again by itself (after a
        STREAM_END SLOW, BACKFILL_FAIL or ROLLBACK) there is no ADD_STREAM to answer, and whoever
        added the stream still counts it as running (replication/replicator.py): the connection is
        closed, so the cluster manager reconnects and adds its streams again, each from where its
        replica stands, instead of the vbucket silently no longer being replicated."""
        asked_again = stream.add_opaque is None
        self._finish(stream, status)
        if asked_again and not self.closed:
            log.warning("DCP consumer %s: vbucket %d could not be streamed again (status 0x%x): closing the "
                        "connection so that its streams are added again", self.name, stream.vbid, status)
            self.conn.close()

    def _kill(self, stream: PassiveStream, reason: int | None) -> None:
        stream.state = PassiveState.DEAD
        stream.end_reason = reason
        self._waiting.pop(stream.opaque, None)
        if self.streams.get(stream.vbid) is stream:
            del self.streams[stream.vbid]
        self._by_opaque.pop(stream.opaque, None)
        registry = passive_streams(self.server)
        if registry.get((self.bucket.name, stream.vbid)) is stream:
            del registry[(self.bucket.name, stream.vbid)]

    # -- CLOSE_STREAM ---------------------------------------------------------------------------
    def close_stream(self, frame: Frame) -> bytes:
        """close-stream.md: the consumer drops the stream at once; later messages for it answer
        STREAM_NOT_FOUND / KEY_ENOENT (tolerated by the producer)."""
        req = dcpproto.DcpCloseStream.from_frame(frame)
        stream = self.streams.get(req.vbucket)
        if stream is None or not stream.live:
            return self.conn.error_reply(frame.opcode, frame.opaque, Status.KEY_ENOENT,
                                         f"no stream for vbucket {req.vbucket} on this connection")
        self._finish(stream, Status.KEY_ENOENT)  # an ADD_STREAM still waiting learns it is gone
        stream.end_reason = StreamEndReason.CLOSED
        return response(frame.opcode, opaque=frame.opaque)

    # -- stream messages ------------------------------------------------------------------------
    def _stream_for(self, vbid: int, opaque: int) -> PassiveStream | int:
        """The reading stream the message belongs to, or the status to answer."""
        stream = self.streams.get(vbid)
        if stream is None or stream.state is PassiveState.DEAD:
            return Status.DCP_STREAM_NOT_FOUND if self.v7_status else Status.KEY_ENOENT
        if stream.opaque != opaque:
            return Status.OPAQUE_NO_MATCH if self.v7_status else Status.KEY_EEXISTS
        return stream

    def _consumed(self, nbytes: int) -> None:
        """Flow control: `nbytes` of the producer's window were processed (buffer-ack.md)."""
        self.bytes_received += nbytes
        self.unacked += nbytes
        if self.unacked >= self.ack_threshold:
            self._ack()
        elif self._ack_timer is None and self.unacked:
            self._ack_timer = self.loop.call_later(ACK_SECONDS, self._ack)

    def _ack(self) -> None:
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        if self.unacked and not self.closed:
            self._send(dcpproto.DcpBufferAck(self.unacked).encode())
            self.total_acked += self.unacked
            self.unacked = 0

    def on_message(self, frame: Frame) -> bytes | None:
        """A stream message from the producer (dispatched by opcode); returns a reply or None."""
        self.last_received = time.monotonic()
        op = frame.opcode
        try:
            msg = dcpproto.decode_dcp(frame)
        except ProtocolError as e:
            self._consumed(24 + frame.body_len)
            return self.conn.error_reply(op, frame.opaque, e.status, e.reason)
        self._consumed(dcpproto.charged_size(msg))
        found = self._stream_for(msg.vbucket, frame.opaque)
        if not isinstance(found, PassiveStream):
            return response(op, found, opaque=frame.opaque)
        stream = found
        try:
            if op == Opcode.DCP_MUTATION or op == Opcode.DCP_DELETION or op == Opcode.DCP_EXPIRATION:
                return self._apply(stream, msg)
            if op == Opcode.DCP_SNAPSHOT_MARKER:
                return self._marker(stream, msg)
            if op == Opcode.DCP_STREAM_END:
                return self._stream_end(stream, msg)
            if op == Opcode.DCP_SET_VBUCKET_STATE:
                return self._set_vbucket_state(stream, msg)
            if op == Opcode.DCP_SEQNO_ADVANCED:
                stream.last_seqno = max(stream.last_seqno, msg.by_seqno)
                return self._snapshot_progress(stream, msg.by_seqno)
            if op == Opcode.DCP_SYSTEM_EVENT:
                return None  # only the default collection exists here: nothing to create or drop
        except EngineError as e:
            log.warning("DCP consumer %s: vbucket %d refused %s: %s", self.name, stream.vbid,
                        Opcode(op).name, e)
            return self.conn.error_reply(op, frame.opaque, e.status, e.reason)
        return self.conn.error_reply(op, frame.opaque, Status.NOT_SUPPORTED,
                                     f"{Opcode(op).name} is not supported by this consumer")

    def _key(self, key: bytes) -> bytes:
        if not self.conn.collections:
            return key
        cid, doc = split_key(key)
        if cid != 0:
            raise EngineError(Status.UNKNOWN_COLLECTION, f"collection 0x{cid:x} does not exist here")
        return doc

    def _apply(self, stream: PassiveStream, msg) -> bytes | None:
        vb = self.engine.get_vbucket(stream.vbid)
        if vb is None:
            raise EngineError(Status.NOT_MY_VBUCKET, f"vbucket {stream.vbid} is gone")
        key = self._key(msg.key)
        if msg.opcode == Opcode.DCP_MUTATION:
            vb.apply_mutation(key, msg.value, by_seqno=msg.by_seqno, cas=msg.cas, rev_seqno=msg.rev_seqno,
                              flags=msg.flags, expiry=msg.expiration, datatype=msg.datatype)
        elif msg.opcode == Opcode.DCP_DELETION:
            vb.apply_deletion(key, by_seqno=msg.by_seqno, cas=msg.cas, rev_seqno=msg.rev_seqno,
                              delete_time=msg.delete_time or 0, value=msg.value, datatype=msg.datatype)
        else:
            vb.apply_expiration(key, by_seqno=msg.by_seqno, cas=msg.cas, rev_seqno=msg.rev_seqno,
                                delete_time=msg.delete_time, value=msg.value, datatype=msg.datatype)
        stream.items += 1
        stream.last_seqno = msg.by_seqno
        if stream.ack_pending:
            return self._snapshot_progress(stream, msg.by_seqno)
        return None

    def _marker(self, stream: PassiveStream, msg: dcpproto.DcpSnapshotMarker) -> bytes | None:
        vb = self.engine.get_vbucket(stream.vbid)
        if vb is None:
            raise EngineError(Status.NOT_MY_VBUCKET, f"vbucket {stream.vbid} is gone")
        vb.snapshot_marker(msg.start_seqno, msg.end_seqno, disk=bool(msg.flags & SnapshotFlag.DISK))
        stream.snap_start, stream.snap_end = msg.start_seqno, msg.end_seqno
        stream.markers += 1
        stream.ack_pending = bool(msg.flags & SnapshotFlag.ACK)
        if stream.ack_pending and vb.high_seqno >= msg.end_seqno:
            return self._snapshot_progress(stream, vb.high_seqno)
        return None

    def _snapshot_progress(self, stream: PassiveStream, seqno: int) -> bytes | None:
        """snapshot-marker.md: a marker with the Ack flag is answered once the whole snapshot is in."""
        if stream.ack_pending and seqno >= stream.snap_end:
            stream.ack_pending = False
            stream.acks_sent += 1
            return response(Opcode.DCP_SNAPSHOT_MARKER, opaque=stream.opaque)
        return None

    def _stream_end(self, stream: PassiveStream, msg: dcpproto.DcpStreamEnd) -> None:
        reason = msg.reason
        if reason in _STREAM_ENDS_TO_RETRY and not stream.takeover:
            log.info("DCP consumer %s: vbucket %d stream ended (%s): requesting it again", self.name, stream.vbid,
                     _reason_name(reason))
            self._by_opaque.pop(stream.opaque, None)
            stream.opaque = next(self._opaques)
            self._by_opaque[stream.opaque] = stream
            self._stream_request(stream)
            return None
        self._kill(stream, reason)
        return None  # STREAM_END gets no reply

    def _set_vbucket_state(self, stream: PassiveStream, msg: dcpproto.DcpSetVbucketState):
        """set-vbucket-state.md: takeover moves this vbucket to pending, then to active; becoming
        active by takeover keeps the failover log received from the old active (no new entry).

        The reply tells the old active it may go dead, so the new state must be on disk first:
        with a flush batch in flight (it carries the older state row) the change waits for it,
        as SET_VBUCKET does (Server.when_no_flush)."""
        return self.server.when_no_flush(self.engine, lambda: self._change_state(stream, msg))

    def _change_state(self, stream: PassiveStream, msg: dcpproto.DcpSetVbucketState) -> bytes:
        state = VBucketState(msg.state)
        self._changing_state = True
        try:
            self.engine.set_vbucket_state(stream.vbid, state, by_takeover=True)
        finally:
            self._changing_state = False
        topology = getattr(self.server, "topology", None)
        if topology is not None:
            topology.bump()
        log.info("DCP consumer %s: vbucket %d is now %s (takeover)", self.name, stream.vbid, state.name.lower())
        return dcpproto.DcpSetVbucketState(stream.vbid, int(state), msg.opaque).response()

    def noop(self, frame: Frame) -> bytes:
        """no-op.md: answer the producer's keep-alive (it travels back through the relay)."""
        dcpproto.DcpNoop.from_frame(frame)
        self.last_received = time.monotonic()
        self.noops += 1
        return dcpproto.DcpNoop(frame.opaque).response()

    # -- replies from the producer ----------------------------------------------------------------
    def on_response(self, frame: Frame) -> None:
        """A response on this connection: to one of our requests (controls, stream requests)."""
        self.last_received = time.monotonic()
        handler = self._waiting.pop(frame.opaque, None)
        if handler is None:
            log.info("DCP consumer %s: unexpected reply to opcode 0x%02x (opaque %#x, status 0x%x)", self.name,
                     frame.opcode, frame.opaque, frame.status)
            return None
        handler(frame)
        return None

    # -- engine notifications -------------------------------------------------------------------
    def _on_vbucket_event(self, vbid: int, event: str) -> None:
        """The vbucket changed under a stream (the cluster manager made it active, deleted it...):
        the stream is over. Changes this consumer makes itself (takeover, rollback) do not count."""
        if self._changing_state:
            return
        stream = self.streams.get(vbid)
        if stream is None:
            return
        vb = self.engine.get_vbucket(vbid)
        if event == "deleted" or vb is None or vb.state not in (VBucketState.REPLICA, VBucketState.PENDING):
            log.info("DCP consumer %s: vbucket %d %s: closing its stream", self.name, vbid,
                     "deleted" if vb is None else f"is now {vb.state.name.lower()}")
            self._finish(stream, Status.NOT_MY_VBUCKET)
            stream.end_reason = StreamEndReason.STATE_CHANGED

    # -- life cycle -----------------------------------------------------------------------------
    def disconnect(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._ack_timer is not None:
            self._ack_timer.cancel()
        for stream in list(self.streams.values()):
            self._kill(stream, StreamEndReason.DISCONNECTED)
        self._waiting.clear()
        with contextlib.suppress(ValueError):
            self.engine.remove_vbucket_listener(self._on_vbucket_event)
        names = getattr(self.server, "dcp_names", None)
        if names is not None and names.get((self.bucket.name, self.name)) is self.conn:
            del names[(self.bucket.name, self.name)]

    def shutdown(self) -> None:
        """Server going away: nothing to send (a consumer owes the producer no goodbye)."""
        self._ack()

    def stats(self) -> dict:
        p = f"eq_dcpq:{self.name}:"
        out: dict = {
            p + "type": "consumer",
            p + "created": int(self.created),
            p + "flags": self.open_flags,
            p + "max_buffer_bytes": self.buffer_size,
            p + "unacked_bytes": self.unacked,
            p + "total_acked_bytes": self.total_acked,
            p + "total_bytes_received": self.bytes_received,
            p + "num_streams": sum(1 for s in self.streams.values() if s.live),
            p + "noops_answered": self.noops,
            p + "v7_dcp_status_codes": int(self.v7_status),
        }
        for vbid, stream in sorted(self.streams.items()):
            out.update({f"{p}stream_{vbid}_{k}": v for k, v in stream.stats().items()})
        return out


def _reason_name(reason: int) -> str:
    try:
        return StreamEndReason(reason).name
    except ValueError:
        return str(reason)


def passive_streams(server) -> dict:
    """(bucket, vbid) -> the live PassiveStream replicating that vbucket on this server."""
    registry = getattr(server, "passive_streams", None)
    if registry is None:
        registry = server.passive_streams = {}
    return registry


def open_consumer(conn: "Connection", req: dcpproto.DcpOpen) -> DcpConsumer:
    """producer.consumer_factory: DCP_OPEN without the Producer flag."""
    return DcpConsumer(conn, req.name.decode("utf-8"), req.flags, req.consumer_name)


_producer.consumer_factory = open_consumer


# ---------------------------------------------------------------------------------------------
# command handlers


def _consumer(conn: "Connection", frame: Frame) -> DcpConsumer:
    """The connection's consumer; a producer connection is disconnected (add-stream.md, "Disconnect")."""
    c = conn.dcp
    if isinstance(c, DcpConsumer):
        return c
    if c is not None:
        conn.close()
        raise ProtocolError(f"opcode 0x{frame.opcode:02x} is only valid on a DCP consumer connection")
    raise ProtocolError("not a DCP consumer connection: send DCP_OPEN without the Producer flag first",
                        Status.EINVAL)


@command(Opcode.DCP_ADD_STREAM, privilege=Privilege.DCP_CONSUMER)
def dcp_add_stream(conn: "Connection", frame: Frame) -> bytes | None:
    """DCP_ADD_STREAM 0x51 (add-stream.md, erratum 20)."""
    consumer = _consumer(conn, frame)
    req = dcpproto.DcpAddStream.from_frame(frame)  # EINVAL: malformed, unknown or removed (NoValue) flags
    return consumer.add_stream(req, frame)


@command(Opcode.DCP_SNAPSHOT_MARKER, Opcode.DCP_MUTATION, Opcode.DCP_DELETION, Opcode.DCP_EXPIRATION,
         Opcode.DCP_STREAM_END, Opcode.DCP_SET_VBUCKET_STATE, Opcode.DCP_SEQNO_ADVANCED, Opcode.DCP_SYSTEM_EVENT,
         privilege=Privilege.DCP_CONSUMER)
def dcp_stream_message(conn: "Connection", frame: Frame) -> bytes | None:
    """Messages a producer sends down a stream, applied by the consumer's PassiveStream."""
    return _consumer(conn, frame).on_message(frame)


def _shared(opcode: int, consumer_handler) -> None:
    """An opcode both roles receive (DCP_NOOP, DCP_CLOSE_STREAM): the producer module registered
    it; a consumer connection is routed here instead, anything else to the producer's handler."""
    original = COMMANDS[opcode]

    def route(conn: "Connection", frame: Frame):
        if isinstance(conn.dcp, DcpConsumer):
            return consumer_handler(conn.dcp, frame)
        return original.handler(conn, frame)

    COMMANDS[opcode] = original._replace(handler=route)


_shared(Opcode.DCP_NOOP, DcpConsumer.noop)
_shared(Opcode.DCP_CLOSE_STREAM, DcpConsumer.close_stream)


def _consumer_stats(conn: "Connection", vbid: int | None) -> dict:
    out: dict = {}
    for other in list(conn.server.connections):
        c = other.dcp
        if isinstance(c, DcpConsumer) and c.bucket is conn.bucket and not c.closed:
            out.update(c.stats())
    return out


def _register_stats() -> None:
    from .stats import GROUPS
    producers = GROUPS.get("dcp")

    def dcp_stats(conn: "Connection", vbid: int | None) -> dict:
        out = producers(conn, vbid) if producers is not None else {}
        out.update(_consumer_stats(conn, vbid))
        return out

    GROUPS["dcp"] = dcp_stats


_register_stats()
