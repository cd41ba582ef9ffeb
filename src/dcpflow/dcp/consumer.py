"""DcpConsumer: the replica side of DCP, driven by ADD_STREAM, without I/O.

Pages (https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/): commands/
add-stream.md, stream-request.md, snapshot-marker.md, set-vbucket-state.md, stream-end.md,
no-op.md, buffer-ack.md, control.md; overview pages rebalance.md ("Initial Stream Handshake",
"VBucket Takeover"), failure-scenarios.md, rollback.md, flow-control.md.

A connection opened with DCP_OPEN *without* the Producer flag is a consumer. The cluster manager
(ns_server's role, dcpflow.replication) sits between it and a producer on another node and relays
everything both ways; the consumer never dials anyone, every request it makes goes out on its own
connection:

* Right after the open it sends its DCP_CONTROLs (`open`: buffer size, noop, priority, expiry
  opcode, cursor dropping, v7 status codes).
* DCP_ADD_STREAM(vb, flags) creates a PassiveStream (passive_stream.py) after its checks (the
  vbucket must be here as a replica or pending one, else NOT_MY_VBUCKET; one live stream per
  vbucket on this connection and on the whole server, else KEY_EEXISTS; CacheTransfer is not
  supported), then the consumer sends its own DCP_STREAM_REQ with the stream's new opaque: start =
  the replica's high seqno, its vbucket UUID and its current snapshot range. The ADD_STREAM reply
  goes out only when the producer has answered (rebalance.md: out of order), with the stream
  opaque, or the producer's error status.
* ROLLBACK (a u64 seqno only, no failover log): the replica must be rolled back from disk to that seqno - the
  caller does it (`RollBack`) and asks again from the new position, until the producer says OK,
  giving up after MAX_ROLLBACKS answers in a row. OK carries the producer's failover log, which
  replaces the replica's (failure-scenarios.md, "Handshake").
* Stream messages are applied to the replica vbucket with their metadata unchanged (engine
  `snapshot_marker` / `apply_*`). A marker with the Ack flag is answered once its end seqno has
  been applied (takeover). DCP_SET_VBUCKET_STATE (takeover: pending, then active) changes the
  vbucket's state once no flush is in flight (`ChangeState`: the caller waits) and is answered.
  STREAM_END closes the stream; SLOW, BACKFILL_FAIL and ROLLBACK re-request from where the replica
  stands.
* A message for a vbucket with no stream answers KEY_ENOENT (DCP_STREAM_NOT_FOUND once the
  producer accepted v7_dcp_status_codes), one with another stream's opaque KEY_EEXISTS
  (OPAQUE_NO_MATCH); a message the replica cannot take answers its status, which makes the
  producer drop the connection.
* Flow control (`flow`, flow_control.py BufferAcker): the caller counts each message at its
  charged size once processed (`consumed`); the DCP_BUFFER_ACK goes out when a fifth of the buffer
  is consumed, or ACK_SECONDS after the first unacknowledged byte (`ArmAckTimer`, then `ack`).

Every entry point returns what the caller must do, in order, as outcome values (outcomes.py):
`Send` what the consumer sends, `Close` the connection once that is written, `RollBack`,
`ChangeState`, `ArmAckTimer`; a stream message is answered last, with a `Reply` or a `Refusal`.
"""

import itertools
import logging

from dcpflow.engine.errors import EngineError
from dcpflow.protocol import dcp as dcpproto
from dcpflow.protocol import snappy
from dcpflow.protocol.datatype import Datatype
from dcpflow.protocol.dcp import SnapshotFlag, StreamEndReason, StreamFlag, VBucketState
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import Frame, response
from dcpflow.protocol.keys import split_key
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from . import position
from .errors import Refusal
from .flow_control import BufferAcker
from .outcomes import NOTHING, ArmAckTimer, ChangeState, Close, Reply, RollBack, Send
from .passive_stream import PassiveState, PassiveStream
from .stream_types import MAX_SEQNO

log = logging.getLogger("dcpflow.server.consumer")  # the name operators filter the consumer's logs by

#: The flow-control window the consumer asks for (kv_engine sizes it from the bucket quota).
DEFAULT_BUFFER_SIZE = 10 * 1024 * 1024
#: The noop interval the consumer asks the producer for.
NOOP_INTERVAL = 1.0
#: Give up on a stream after this many ROLLBACK answers in a row (the producer keeps refusing).
MAX_ROLLBACKS = 16
#: The ends after which the consumer asks for the stream again by itself (position.stream_end).
STREAM_ENDS_TO_RETRY = position.RESUMABLE_ENDS
_REPLICA_STATES = (VBucketState.REPLICA, VBucketState.PENDING)
_STRICT_VBUUID = int(StreamFlag.STRICT_VBUUID)
_SNAPPY = int(Datatype.SNAPPY)


def _reason_name(reason: int) -> str:
    try:
        return StreamEndReason(reason).name
    except ValueError:
        return str(reason)


class DcpConsumer:
    """See the module docstring. `registry` is the server's (bucket, vbid) -> live PassiveStream,
    shared by every consumer connection: one vbucket is replicated by one stream at a time."""

    def __init__(self, name: str, open_flags: int, engine, bucket_name: str, registry: dict, *, now: float,
                 created: float, consumer_name: str | None = None, buffer_size: int = DEFAULT_BUFFER_SIZE):
        self.name = name
        self.open_flags = open_flags
        self.engine = engine
        self.bucket_name = bucket_name
        self.registry = registry
        self.consumer_name = consumer_name
        self.created = created
        self.streams: dict[int, PassiveStream] = {}  # vbid -> the connection's stream of that vbucket
        self._by_opaque: dict[int, PassiveStream] = {}
        self._opaques = itertools.count(0x10000)
        self._waiting: dict[int, object] = {}  # opaque of a request we sent -> a control key or a PassiveStream
        self.controls: dict[str, int] = {}  # DCP_CONTROL key -> the producer's status
        self.v7_status = False
        self.flow = BufferAcker(buffer_size)
        self.noops = 0
        self.last_received = now
        self.changing_state = False  # vbucket changes the consumer makes itself (takeover, rollback)
        self.closed = False

    def __repr__(self) -> str:
        return f"<DcpConsumer {self.name!r} streams={len(self.streams)}>"

    def _request(self, message, tag: object) -> Send:
        """A request with a fresh opaque; its response goes to `tag`'s handling."""
        opaque = next(self._opaques)
        self._waiting[opaque] = tag
        return Send(message._replace(opaque=opaque).encode())

    # -- controls ---------------------------------------------------------------------------------
    def open(self) -> tuple:
        """What kv_engine's consumer negotiates before its first stream request (control.md)."""
        wanted = [("connection_buffer_size", str(self.flow.buffer_size)), ("enable_noop", "true"),
                  ("set_noop_interval", f"{NOOP_INTERVAL:g}"), ("set_priority", "high"),
                  ("enable_expiry_opcode", "true"), ("supports_cursor_dropping_vulcan", "true"),
                  ("v7_dcp_status_codes", "true")]
        if self.consumer_name:  # sync replication: prepares, commits and aborts, acknowledged by name
            wanted += [("enable_sync_writes", "true"), ("consumer_name", self.consumer_name)]
        return tuple(self._request(dcpproto.DcpControl(key.encode(), value.encode()), key) for key, value in wanted)

    def _control_reply(self, key: str, frame: Frame) -> None:
        self.controls[key] = frame.status
        if frame.status != Status.SUCCESS:
            log.info("DCP consumer %s: the producer refused %s (status 0x%x)", self.name, key, frame.status)
        elif key == "v7_dcp_status_codes":
            self.v7_status = True

    # -- ADD_STREAM -----------------------------------------------------------------------------
    def add_stream(self, req: dcpproto.DcpAddStream, add_opaque: int) -> Refusal | tuple:
        """add-stream.md: the checks, then our STREAM_REQ; the reply waits for the producer's answer."""
        vbid = req.vbucket
        if req.flags & StreamFlag.CACHE_TRANSFER:
            return Refusal(Status.NOT_SUPPORTED, "CacheTransfer streams are not supported by this consumer (it "
                           "cannot apply DCP_CACHE_TRANSFER messages)")
        vb = self.engine.get_vbucket(vbid)
        if vb is None:
            return Refusal(Status.NOT_MY_VBUCKET, f"vbucket {vbid} does not exist on this node")
        if vb.state not in _REPLICA_STATES:
            return Refusal(Status.NOT_MY_VBUCKET, f"vbucket {vbid} is {vb.state.name.lower()} here; a consumer "
                           "streams into a replica or pending vbucket")
        existing = self.streams.get(vbid)
        if existing is not None and existing.live:
            return Refusal(Status.KEY_EEXISTS, f"a stream for vbucket {vbid} already exists on this connection")
        other = self.registry.get((self.bucket_name, vbid))
        if other is not None and other.live and other.consumer is not self:
            return Refusal(Status.KEY_EEXISTS, f"vbucket {vbid} is already replicated by consumer connection "
                           f"{other.consumer.name!r}; close that stream first")
        stream = PassiveStream(self, vbid, req.flags, add_opaque, next(self._opaques))
        self._register(stream)
        return self.stream_request(stream)

    def _register(self, stream: PassiveStream) -> None:
        old = self.streams.get(stream.vbid)
        if old is not None:
            self._by_opaque.pop(old.opaque, None)
        self.streams[stream.vbid] = stream
        self._by_opaque[stream.opaque] = stream
        self.registry[(self.bucket_name, stream.vbid)] = stream

    def is_current(self, stream: PassiveStream) -> bool:
        """Is the stream still this connection's live stream of its vbucket?"""
        return not self.closed and self.streams.get(stream.vbid) is stream and stream.live

    def stream_request(self, stream: PassiveStream) -> tuple:
        """Ask for the vbucket from where the replica stands: its high seqno, UUID and snapshot."""
        vb = self.engine.get_vbucket(stream.vbid)
        if vb is None:
            return self._finish(stream, Status.NOT_MY_VBUCKET)
        pos = position.stored_position(vb.uuid, vb.high_seqno, vb.snapshot_start, vb.snapshot_end)
        if stream.rollbacks and stream.flags & _STRICT_VBUUID:
            pos = position.after_rollback_to_zero(pos)
        stream.state = PassiveState.PENDING
        stream.snap_start, stream.snap_end = pos.snapshot_start, pos.snapshot_end
        req = position.stream_request(stream.vbid, pos, MAX_SEQNO, stream.flags, opaque=stream.opaque)
        stream.requested = req
        self._waiting[stream.opaque] = stream
        return (Send(req.encode()),)

    def _stream_req_reply(self, stream: PassiveStream, frame: Frame) -> tuple:
        if stream.state is not PassiveState.PENDING or self.streams.get(stream.vbid) is not stream:
            return NOTHING  # closed meanwhile
        try:
            reply = dcpproto.DcpStreamRequestResponse.from_frame(frame)
        except ProtocolError as e:
            log.warning("DCP consumer %s: malformed STREAM_REQ reply for vbucket %d: %s", self.name, stream.vbid, e)
            return self.request_failed(stream, Status.EINVAL)
        if reply.status == Status.ROLLBACK:
            stream.rollbacks += 1
            if stream.rollbacks > MAX_ROLLBACKS:
                log.warning("DCP consumer %s: vbucket %d: %d rollbacks in a row; giving up", self.name,
                            stream.vbid, stream.rollbacks)
                return self.request_failed(stream, Status.ROLLBACK)
            stream.state = PassiveState.ROLLING_BACK
            return (RollBack(stream, reply.rollback_seqno),)
        if reply.status != Status.SUCCESS:
            return self.request_failed(stream, reply.status)
        vb = self.engine.get_vbucket(stream.vbid)
        if vb is None or vb.state not in _REPLICA_STATES:
            return self.request_failed(stream, Status.NOT_MY_VBUCKET)
        if reply.failover_log:
            vb.failover.replace(reply.failover_log)  # the replica's history is the producer's
            self.engine.flusher.persist_state(vb)
        stream.rollbacks = 0
        stream.state = PassiveState.READING
        stream.last_seqno = vb.high_seqno
        answer = self._answer_add_stream(stream, Status.SUCCESS)
        # A new active (a promoted replica) waits for acks of prepares this replica already holds.
        stream.acked_hps = 0
        return answer + self._ack_prepared(stream, vb)

    @property
    def sync_replication(self) -> bool:
        """The producer accepted sync writes for this consumer's name: prepares arrive and are acked."""
        return bool(self.consumer_name) and self.controls.get("consumer_name") == Status.SUCCESS \
            and self.controls.get("enable_sync_writes") == Status.SUCCESS

    def _ack_prepared(self, stream: PassiveStream, vb) -> tuple:
        """DCP_SEQNO_ACKNOWLEDGED when the replica's high prepared seqno moved (passive_monitor.py)."""
        if vb.hps > stream.acked_hps and stream.state is PassiveState.READING and self.sync_replication:
            stream.acked_hps = vb.hps
            return (Send(dcpproto.DcpSeqnoAcknowledged(stream.vbid, vb.hps, stream.opaque).encode()),)
        return NOTHING

    def persisted(self, vbid: int) -> tuple:
        """The flusher persisted some of the vbucket: PersistToMajority prepares may be acked now."""
        stream = self.streams.get(vbid)
        vb = self.engine.get_vbucket(vbid)
        if stream is not None and vb is not None:
            return self._ack_prepared(stream, vb)
        return NOTHING

    def rolled_back(self, stream: PassiveStream) -> tuple:
        """The caller rolled the replica back (RollBack): ask again from there, if still wanted."""
        if self.is_current(stream):
            return self.stream_request(stream)
        return NOTHING

    def _answer_add_stream(self, stream: PassiveStream, status: int) -> tuple:
        if stream.add_opaque is None:
            return NOTHING
        add_opaque, stream.add_opaque = stream.add_opaque, None
        return (Send(dcpproto.DcpAddStreamResponse(stream.opaque, add_opaque, status).encode()),)

    def _finish(self, stream: PassiveStream, status: int) -> tuple:
        """The stream could not be established: answer the ADD_STREAM with `status`, forget it."""
        answer = self._answer_add_stream(stream, status)
        self._kill(stream, None)
        return answer

    def request_failed(self, stream: PassiveStream, status: int) -> tuple:
        """A stream request failed for good. If this consumer had asked again by itself (after a
        STREAM_END SLOW, BACKFILL_FAIL or ROLLBACK) there is no ADD_STREAM to answer, and whoever
        added the stream still counts it as running (replication/replicator.py): the connection is
        closed, so the cluster manager reconnects and adds its streams again, each from where its
        replica stands, instead of the vbucket silently no longer being replicated."""
        asked_again = stream.add_opaque is None
        answer = self._finish(stream, status)
        if asked_again and not self.closed:
            log.warning("DCP consumer %s: vbucket %d could not be streamed again (status 0x%x): closing the "
                        "connection so that its streams are added again", self.name, stream.vbid, status)
            return answer + (Close(f"vbucket {stream.vbid} could not be streamed again (status 0x{status:x})"),)
        return answer

    def _kill(self, stream: PassiveStream, reason: int | None) -> None:
        stream.state = PassiveState.DEAD
        stream.end_reason = reason
        self._waiting.pop(stream.opaque, None)
        if self.streams.get(stream.vbid) is stream:
            del self.streams[stream.vbid]
        self._by_opaque.pop(stream.opaque, None)
        if self.registry.get((self.bucket_name, stream.vbid)) is stream:
            del self.registry[(self.bucket_name, stream.vbid)]

    # -- CLOSE_STREAM ---------------------------------------------------------------------------
    def close_stream(self, vbid: int) -> Refusal | tuple:
        """close-stream.md: the consumer drops the stream at once; later messages for it answer
        STREAM_NOT_FOUND / KEY_ENOENT (tolerated by the producer)."""
        stream = self.streams.get(vbid)
        if stream is None or not stream.live:
            return Refusal(Status.KEY_ENOENT, f"no stream for vbucket {vbid} on this connection")
        answer = self._finish(stream, Status.KEY_ENOENT)  # an ADD_STREAM still waiting learns it is gone
        stream.end_reason = StreamEndReason.CLOSED
        return answer

    # -- stream messages ------------------------------------------------------------------------
    def consumed(self, nbytes: int, now: float) -> tuple:
        """Flow control: `nbytes` of the producer's window were processed (buffer-ack.md): the
        acknowledgement now, or the timer for it if these are the first unacknowledged bytes."""
        flow = self.flow
        if flow.consumed(nbytes, now):
            return self.ack()
        if flow.deadline is not None:
            return (ArmAckTimer(flow.deadline - now),)
        return NOTHING

    def ack(self) -> tuple:
        """Acknowledge what was processed (the threshold was reached, or the deadline passed)."""
        if self.flow.unacked and not self.closed:
            return (Send(dcpproto.DcpBufferAck(self.flow.take()).encode()),)
        return NOTHING

    def _stream_for(self, vbid: int, opaque: int) -> PassiveStream | int:
        """The reading stream the message belongs to, or the status to answer."""
        stream = self.streams.get(vbid)
        if stream is None or stream.state is PassiveState.DEAD:
            return Status.DCP_STREAM_NOT_FOUND if self.v7_status else Status.KEY_ENOENT
        if stream.opaque != opaque:
            return Status.OPAQUE_NO_MATCH if self.v7_status else Status.KEY_EEXISTS
        return stream

    def message(self, msg, opaque: int, collections: bool) -> tuple:
        """A decoded stream message from the producer (already counted by `consumed`): what to
        send, then its answer if it has one: a Reply, a Refusal (logged), or a ChangeState to run."""
        op = msg.opcode
        found = self._stream_for(msg.vbucket, opaque)
        if found.__class__ is not PassiveStream:
            return (Reply(response(op, found, opaque=opaque)),)
        stream = found
        try:
            if op == Opcode.DCP_MUTATION or op == Opcode.DCP_DELETION or op == Opcode.DCP_EXPIRATION:
                return self._apply(stream, msg, collections)
            if op == Opcode.DCP_SNAPSHOT_MARKER:
                return self._marker(stream, msg)
            if op == Opcode.DCP_PREPARE or op == Opcode.DCP_COMMIT or op == Opcode.DCP_ABORT:
                return self._apply_sync(stream, msg, collections)
            if op == Opcode.DCP_STREAM_END:
                return self._stream_end(stream, msg)
            if op == Opcode.DCP_SET_VBUCKET_STATE:
                return (ChangeState(stream, msg),)
            if op == Opcode.DCP_SEQNO_ADVANCED:
                stream.last_seqno = max(stream.last_seqno, msg.by_seqno)
                return self._snapshot_progress(stream, msg.by_seqno)
            if op == Opcode.DCP_SYSTEM_EVENT:
                # Items are applied under their collection ids whatever the events say; the node's
                # manifest is its own bucket's, not changed from the stream (kv_engine's replica
                # makes and drops collections from these events).
                return NOTHING
        except EngineError as e:
            log.warning("DCP consumer %s: vbucket %d refused %s: %s", self.name, stream.vbid, Opcode(op).name, e)
            return (Refusal(e.status, e.reason),)
        return (Refusal(Status.NOT_SUPPORTED, f"{Opcode(op).name} is not supported by this consumer"),)

    def _key(self, key: bytes, collections: bool) -> bytes:
        if not collections:
            return key
        cid, doc = split_key(key)
        if cid != 0:
            raise EngineError(Status.UNKNOWN_COLLECTION, f"collection 0x{cid:x} does not exist here")
        return doc

    def _apply(self, stream: PassiveStream, msg, collections: bool) -> tuple:
        vb = self.engine.get_vbucket(stream.vbid)
        if vb is None:
            raise EngineError(Status.NOT_MY_VBUCKET, f"vbucket {stream.vbid} is gone")
        key = self._key(msg.key, collections)
        if msg.datatype & _SNAPPY:  # a producer that compresses: the engine keeps values inflated
            msg = msg._replace(value=snappy.decompress(msg.value), datatype=msg.datatype & ~_SNAPPY)
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
        acks = self._ack_prepared(stream, vb) if vb.hps > stream.acked_hps else NOTHING
        if stream.ack_pending:
            return acks + self._snapshot_progress(stream, msg.by_seqno)
        return acks

    def _apply_sync(self, stream: PassiveStream, msg, collections: bool) -> tuple:
        """DCP_PREPARE / DCP_COMMIT / DCP_ABORT into the replica (engine apply_prepare / _commit / _abort)."""
        vb = self.engine.get_vbucket(stream.vbid)
        if vb is None:
            raise EngineError(Status.NOT_MY_VBUCKET, f"vbucket {stream.vbid} is gone")
        key = self._key(msg.key, collections)
        if msg.opcode == Opcode.DCP_PREPARE:
            if msg.datatype & _SNAPPY:  # as for mutations: the engine keeps values inflated
                msg = msg._replace(value=snappy.decompress(msg.value), datatype=msg.datatype & ~_SNAPPY)
            vb.apply_prepare(key, msg.value, by_seqno=msg.by_seqno, cas=msg.cas, rev_seqno=msg.rev_seqno,
                             flags=msg.flags, expiry=msg.expiration, datatype=msg.datatype, deleted=msg.deleted,
                             level=msg.durability_level)
            seqno = msg.by_seqno
        elif msg.opcode == Opcode.DCP_COMMIT:
            vb.apply_commit(key, prepared_seqno=msg.prepared_seqno, commit_seqno=msg.commit_seqno)
            seqno = msg.commit_seqno
        else:
            vb.apply_abort(key, prepared_seqno=msg.prepared_seqno, abort_seqno=msg.abort_seqno)
            seqno = msg.abort_seqno
        stream.items += 1
        stream.last_seqno = seqno
        acks = self._ack_prepared(stream, vb)
        if stream.ack_pending:
            return acks + self._snapshot_progress(stream, seqno)
        return acks

    def _marker(self, stream: PassiveStream, msg: dcpproto.DcpSnapshotMarker) -> tuple:
        vb = self.engine.get_vbucket(stream.vbid)
        if vb is None:
            raise EngineError(Status.NOT_MY_VBUCKET, f"vbucket {stream.vbid} is gone")
        vb.snapshot_marker(msg.start_seqno, msg.end_seqno, disk=bool(msg.flags & SnapshotFlag.DISK))
        stream.snap_start, stream.snap_end = msg.start_seqno, msg.end_seqno
        stream.markers += 1
        acks = self._ack_prepared(stream, vb)  # the marker closed the previous snapshot (passive_monitor.py)
        stream.ack_pending = bool(msg.flags & SnapshotFlag.ACK)
        if stream.ack_pending and vb.high_seqno >= msg.end_seqno:
            return acks + self._snapshot_progress(stream, vb.high_seqno)
        return acks

    def _snapshot_progress(self, stream: PassiveStream, seqno: int) -> tuple:
        """snapshot-marker.md: a marker with the Ack flag is answered once the whole snapshot is in."""
        if stream.ack_pending and seqno >= stream.snap_end:
            stream.ack_pending = False
            stream.acks_sent += 1
            return (Reply(response(Opcode.DCP_SNAPSHOT_MARKER, opaque=stream.opaque)),)
        return NOTHING

    def _stream_end(self, stream: PassiveStream, msg: dcpproto.DcpStreamEnd) -> tuple:
        reason = msg.reason
        if position.stream_end(reason, follows_map=False, takeover=stream.takeover).action == position.REOPEN:
            log.info("DCP consumer %s: vbucket %d stream ended (%s): requesting it again", self.name, stream.vbid,
                     _reason_name(reason))
            self._by_opaque.pop(stream.opaque, None)
            stream.opaque = next(self._opaques)
            self._by_opaque[stream.opaque] = stream
            return self.stream_request(stream)
        self._kill(stream, reason)
        return NOTHING  # STREAM_END gets no reply

    def change_state(self, stream: PassiveStream, msg: dcpproto.DcpSetVbucketState) -> bytes:
        """set-vbucket-state.md: takeover moves this vbucket to pending, then to active; becoming
        active by takeover keeps the failover log received from the old active (no new entry).
        The caller runs this once no flush batch is in flight (ChangeState): the reply tells the old
        active it may go dead, so the new state must be on disk first."""
        state = VBucketState(msg.state)
        self.changing_state = True
        try:
            self.engine.set_vbucket_state(stream.vbid, state, by_takeover=True)
        finally:
            self.changing_state = False
        return dcpproto.DcpSetVbucketState(stream.vbid, int(state), msg.opaque).response()

    def noop(self, frame: Frame, now: float) -> bytes:
        """no-op.md: answer the producer's keep-alive (it travels back through the relay)."""
        dcpproto.DcpNoop.from_frame(frame)
        self.last_received = now
        self.noops += 1
        return dcpproto.DcpNoop(frame.opaque).response()

    # -- replies from the producer ----------------------------------------------------------------
    def response(self, frame: Frame, now: float) -> tuple:
        """A response on this connection: to one of our requests (controls, stream requests)."""
        self.last_received = now
        tag = self._waiting.pop(frame.opaque, None)
        if tag is None:
            log.info("DCP consumer %s: unexpected reply to opcode 0x%02x (opaque %#x, status 0x%x)", self.name,
                     frame.opcode, frame.opaque, frame.status)
            return NOTHING
        if tag.__class__ is PassiveStream:
            return self._stream_req_reply(tag, frame)
        self._control_reply(tag, frame)
        return NOTHING

    # -- engine notifications -------------------------------------------------------------------
    def vbucket_changed(self, vbid: int, event: str) -> tuple:
        """The vbucket changed under a stream (the cluster manager made it active, deleted it...):
        the stream is over. Changes this consumer makes itself (takeover, rollback) do not count."""
        if self.changing_state:
            return NOTHING
        stream = self.streams.get(vbid)
        if stream is None:
            return NOTHING
        vb = self.engine.get_vbucket(vbid)
        if event == "deleted" or vb is None or vb.state not in _REPLICA_STATES:
            log.info("DCP consumer %s: vbucket %d %s: closing its stream", self.name, vbid,
                     "deleted" if vb is None else f"is now {vb.state.name.lower()}")
            answer = self._finish(stream, Status.NOT_MY_VBUCKET)
            stream.end_reason = StreamEndReason.STATE_CHANGED
            return answer
        return NOTHING

    # -- life cycle -----------------------------------------------------------------------------
    def release(self) -> None:
        """The connection is gone: every stream ends (DISCONNECTED), nothing more is sent."""
        if self.closed:
            return
        self.closed = True
        for stream in list(self.streams.values()):
            self._kill(stream, StreamEndReason.DISCONNECTED)
        self._waiting.clear()

    def stats(self) -> dict:
        p = f"eq_dcpq:{self.name}:"
        out: dict = {
            p + "type": "consumer",
            p + "created": int(self.created),
            p + "flags": self.open_flags,
            p + "max_buffer_bytes": self.flow.buffer_size,
            p + "unacked_bytes": self.flow.unacked,
            p + "total_acked_bytes": self.flow.total_acked,
            p + "total_bytes_received": self.flow.bytes_received,
            p + "num_streams": sum(1 for s in self.streams.values() if s.live),
            p + "noops_answered": self.noops,
            p + "v7_dcp_status_codes": int(self.v7_status),
        }
        for vbid, stream in sorted(self.streams.items()):
            out.update({f"{p}stream_{vbid}_{k}": v for k, v in stream.stats().items()})
        return out
