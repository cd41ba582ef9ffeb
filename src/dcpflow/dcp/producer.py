"""DcpProducer: the state of one DCP producer connection, without I/O.

Pages (https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/): commands/
open-connection.md, control.md, stream-request.md, close-stream.md, buffer-ack.md, no-op.md,
stream-end.md; overview pages flow-control.md, dead-connections.md, rebalance.md.

DCP_OPEN with the Producer flag makes one. It holds the connection's rules and hands the server's
shell (server/producer.py) what to do:

* DCP_CONTROL - the table of controls.py, over `settings`, `noop` (noop.py) and `window`
  (flow_control.py).
* DCP_STREAM_REQ - `stream_request` runs the checks of stream_request.py and answers a Refusal,
  a `Rollback`, or the `Started` ActiveStream (active_stream.py) with the failover log to reply
  with; the stream is registered (streams.py) and waiting for a send pass.
* DCP_CLOSE_STREAM, vbucket state changes, rollbacks, lost privileges, shutdown - streams end with
  the reason stream-end.md gives.
* Replies from the consumer (`reply`) - noop answers, acks of markers with the Ack flag and of
  SET_VBUCKET_STATE (takeover). NOT_MY_VBUCKET, STREAM_NOT_FOUND and OPAQUE_NO_MATCH (and
  KEY_EEXISTS/KEY_ENOENT unless `v7_dcp_status_codes`) are tolerated; any other error status
  means the consumer is broken and the connection is closed (kv_engine does the same).
* Sending - `send_pass` (send_pass.py) picks what to write; backfills wait in `backfills`
  (backfills.py) for the shell to read them.

Every entry point returns what the shell must do as outcome values (outcomes.py): `WAKE` (run a
send pass soon), `ARM_NOOP_TIMER`, `Send`, `SetVbucketState` (a takeover stream marks its vbucket
dead), `StopBackfill`, `Close`, `Tolerated`; a request also returns its answer. The engine's
notices reach it through the shell, which listens to the engine and hands them in: a vbucket's
state change (`vbucket_changed`), a dropped cursor (`cursor_dropped`); writes wake streams through
`registry.pending`. Nothing is injected (no callbacks) and nothing here reads a clock: the callers
pass `now`.
"""

import itertools
from typing import NamedTuple

from dcpflow.engine.failover import FailoverEntry
from dcpflow.protocol.dcp import DcpNoop, DcpStreamRequest, OpenFlag, StreamEndReason, VBucketState
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from . import stream_request as rules
from .active_stream import ActiveStream
from .backfills import BackfillQueue
from .controls import ControlContext, Effect, ProducerSettings, apply_control
from .errors import Refusal
from .filter import StreamFilter
from .flow_control import FlowControlWindow
from .noop import DEFAULT_IDLE_TIMEOUT, NoopAction, NoopPolicy
from .outcomes import ARM_NOOP_TIMER, NOTHING, WAKE_ONLY, Close, Send, StopBackfill, Tolerated
from .send_pass import SendPass, send_pass
from .stream_types import StreamOptions
from .streams import StreamRegistry

_TOLERATED = frozenset({Status.NOT_MY_VBUCKET, Status.DCP_STREAM_NOT_FOUND, Status.OPAQUE_NO_MATCH})
_TOLERATED_LEGACY = frozenset({Status.KEY_EEXISTS, Status.KEY_ENOENT})
_cursor_ids = itertools.count(1)
# The flags as plain ints: `int & IntFlag` runs enum's __rand__ in Python.
_O_INCLUDE_DELETE_TIMES = int(OpenFlag.INCLUDE_DELETE_TIMES)
_O_INCLUDE_XATTRS = int(OpenFlag.INCLUDE_XATTRS)
_O_NO_VALUE = int(OpenFlag.NO_VALUE)
_O_NO_VALUE_WITH_UNDERLYING_DATATYPE = int(OpenFlag.NO_VALUE_WITH_UNDERLYING_DATATYPE)
_O_SKIP_DELETES_IN_INITIAL_BACKFILL = int(OpenFlag.SKIP_DELETES_IN_INITIAL_BACKFILL)


class Rollback(NamedTuple):
    """The consumer must roll back to `seqno` first (a ROLLBACK reply carrying only that u64)."""

    seqno: int


class Started(NamedTuple):
    """The stream was accepted and started; the reply carries the vbucket's failover log, and
    `then` runs after it (a send pass; the backfill of a stream it replaced stops)."""

    stream: ActiveStream
    failover_log: tuple[FailoverEntry, ...]
    then: tuple = WAKE_ONLY


_EFFECTS = {Effect.NONE: NOTHING, Effect.NOOP_TIMER: (ARM_NOOP_TIMER,), Effect.SEND: WAKE_ONLY}


class DcpProducer:
    """See the module docstring."""

    def __init__(self, name: str, open_flags: int, engine, *, now: float, created: float,
                 idle_timeout: float = DEFAULT_IDLE_TIMEOUT):
        self.name = name
        self.open_flags = int(open_flags)
        self.engine = engine
        self.created = created  # wall-clock time of the DCP_OPEN (stat `created`)
        self.settings = ProducerSettings()
        self.noop = NoopPolicy(now, idle_timeout)
        self.window = FlowControlWindow()
        self.registry = StreamRegistry()
        self.backfills = BackfillQueue()
        self.bytes_sent = 0
        self.items_sent = 0

    @property
    def streams(self) -> dict[tuple[int, int | None], ActiveStream]:
        """(vbucket, stream-id or None) -> the live stream."""
        return self.registry.streams

    def received(self, now: float) -> None:
        """Anything arrived from the consumer (dead-connections.md: it is alive)."""
        self.noop.last_received = now

    def wake(self, stream: ActiveStream) -> tuple:
        """The stream may have something to send (a write to its vbucket, a backfill page)."""
        self.registry.pending[stream] = None
        return WAKE_ONLY

    def cursor_dropped(self, vbid: int, cursor_name: str) -> tuple:
        """The engine dropped a checkpoint cursor of vbucket `vbid` (Bucket.add_cursor_listener):
        if one of this connection's streams read with it, a send pass for it (its next `fill`
        backfills from where it is, or ends it with SLOW); another connection's cursor: nothing."""
        for stream in self.registry.by_vb.get(vbid, ()):
            if stream.name == cursor_name:
                return self.wake(stream)
        return NOTHING

    # -- DCP_CONTROL ----------------------------------------------------------------------------
    def control(self, key: str, value: str, *, now: float, collections: bool, snappy: bool = False
                ) -> Refusal | tuple:
        """One DCP_CONTROL (controls.py): the Refusal to answer, or what the caller must do now
        (re-arm the noop timer, or run a send pass for a larger window)."""
        effect = apply_control(self, key, value, ControlContext(now, collections, snappy))
        if effect.__class__ is Refusal:
            return effect
        return _EFFECTS[effect]

    def stream_options(self, collections: bool) -> StreamOptions:
        """What the connection's settings make of a stream requested now."""
        f, s = self.open_flags, self.settings
        return StreamOptions(
            include_xattrs=bool(f & _O_INCLUDE_XATTRS),
            no_value=bool(f & _O_NO_VALUE),
            no_value_underlying_datatype=bool(f & _O_NO_VALUE_WITH_UNDERLYING_DATATYPE),
            delete_times=bool(f & _O_INCLUDE_DELETE_TIMES),
            expiry_opcode=s.expiry_opcode and bool(f & _O_INCLUDE_DELETE_TIMES),
            collections=collections,
            sync_replication=s.sync_replication,
            sync_writes=s.sync_writes,
            marker_v22=s.marker_v22,
            skip_deletes_in_initial_backfill=bool(f & _O_SKIP_DELETES_IN_INITIAL_BACKFILL),
            supports_cursor_dropping=s.cursor_dropping,
            send_stream_end_on_close=s.send_stream_end_on_close,
            compress_values=s.force_compression,
            flatbuffers_events=s.flatbuffers_events,
            change_streams=s.change_streams,
        )

    # -- DCP_STREAM_REQ -------------------------------------------------------------------------
    def stream_request(self, req: DcpStreamRequest, *, collections: bool) -> Refusal | Rollback | Started:
        """stream-request.md: the checks of stream_request.py in order, then the stream. A
        Refusal with NOT_MY_VBUCKET is answered with the cluster map by the caller."""
        vbid, opaque = req.vbucket, req.opaque
        doc = {}
        if req.value:
            if not collections:
                return Refusal(Status.EINVAL, "a stream-request value needs HELLO Collections")
            doc = req.json
        sid = doc.get("sid")
        if self.settings.stream_ids and sid is None:
            return Refusal(Status.DCP_STREAM_ID_INVALID, "enable_stream_id is on: the value must carry 'sid'")
        if sid is not None and not self.settings.stream_ids:
            return Refusal(Status.DCP_STREAM_ID_INVALID, "'sid' needs DCP_CONTROL enable_stream_id first")
        problem = rules.check_value(doc)
        if problem is not None:
            return problem
        flags = int(req.flags)
        vb = self.engine.get_vbucket(vbid)
        problem = rules.vbucket_refusal(vb, flags)
        if problem is not None:
            return problem
        stream_filter = StreamFilter.build(doc if collections else None, vb.collections)
        if stream_filter.__class__ is Refusal:
            return stream_filter
        if (self.open_flags & _O_INCLUDE_XATTRS or collections) and not self.noop.enabled:
            return Refusal(Status.NOT_SUPPORTED, "enable_noop is mandatory for streams with xattrs or collections")
        existing = self.registry.streams.get((vbid, sid))
        if existing is not None and not existing.dead:
            return Refusal(Status.KEY_EEXISTS, f"a stream for vbucket {vbid} already exists on this connection"
                           + (f" with sid {sid}" if sid is not None else ""))
        rng = rules.resolve_range(vb, flags, req.start_seqno, req.end_seqno, req.vbucket_uuid,
                                  req.snap_start_seqno, req.snap_end_seqno, stream_filter)
        client_purge = int(doc["purge_seqno"]) if "purge_seqno" in doc else None
        decision = rules.rollback_decision(vb, flags, client_purge, rng, vb.purge_seqno)
        if decision.status == Status.ROLLBACK:
            return Rollback(decision.rollback_seqno)
        if decision.status != Status.SUCCESS:
            return Refusal(decision.status, decision.reason)
        then = self.retire(existing) + WAKE_ONLY if existing is not None else WAKE_ONLY
        stream = ActiveStream(vb, name=f"dcp:{self.name}:{vbid}:{sid}:{next(_cursor_ids)}", opaque=opaque,
                              start_seqno=rng.start, end_seqno=rng.end, snap_start_seqno=rng.snap_start, flags=flags,
                              stream_id=sid, options=self.stream_options(collections),
                              client_purge_seqno=client_purge, filter=stream_filter)
        self.registry.add(stream)
        stream.start()
        self.registry.pending[stream] = None
        return Started(stream, tuple(vb.failover.entries), then)

    # -- ending streams -------------------------------------------------------------------------
    def close_stream(self, vbid: int, sid: int | None) -> Refusal | tuple:
        """close-stream.md: the stream ends with CLOSED (a STREAM_END only with
        `send_stream_end_on_client_close_stream`); the Refusal to answer, or what to do."""
        if self.settings.stream_ids and sid is None:
            return Refusal(Status.DCP_STREAM_ID_INVALID,
                           "enable_stream_id is on: CLOSE_STREAM must carry a stream-id frame")
        if sid is not None and not self.settings.stream_ids:
            return Refusal(Status.DCP_STREAM_ID_INVALID, "a stream-id frame needs DCP_CONTROL enable_stream_id first")
        stream = self.registry.streams.get((vbid, sid))
        if stream is None or stream.dead:
            return Refusal(Status.KEY_ENOENT, f"no stream for vbucket {vbid}"
                           + (f" with sid {sid}" if sid is not None else "") + " on this connection")
        return self.end_stream(stream, StreamEndReason.CLOSED)

    def end_stream(self, stream: ActiveStream, reason: StreamEndReason) -> tuple:
        """End a stream from outside (stream-end.md gives the reasons); it sends what is left."""
        stream.set_dead(reason)
        stopped = self.retire(stream)
        self.registry.pending[stream] = None
        return stopped + WAKE_ONLY if stopped else WAKE_ONLY

    def backfill_failed(self, stream: ActiveStream) -> tuple:
        """The store could not be read for the stream's backfill: it ends with BACKFILL_FAIL
        (stream-end.md; the consumer may re-request from where it stands); a stream already
        ended stays as it is."""
        return NOTHING if stream.dead else self.end_stream(stream, StreamEndReason.BACKFILL_FAIL)

    def retire(self, stream: ActiveStream) -> tuple:
        """Forget a dead stream and unqueue its backfill; keep it until its STREAM_END is written.
        Returns the StopBackfill of a read still running, if any."""
        self.registry.remove(stream)
        handle = self.backfills.retire(stream)
        return NOTHING if handle is None else (StopBackfill(handle),)

    def forget(self, stream: ActiveStream) -> tuple:
        """A dead stream wrote everything it had (send_pass.py)."""
        self.registry.drained(stream)
        if self.registry.is_registered(stream):
            return self.retire(stream)
        return NOTHING

    def vbucket_changed(self, vbid: int, event: str) -> tuple:
        """The engine says the vbucket changed state ("state") or rolled back ("rollback"): its
        streams end (STATE_CHANGED / ROLLBACK), except a takeover stream in its handshake, which
        causes the change itself."""
        streams = self.registry.by_vb.get(vbid)
        if not streams:
            return NOTHING
        reason = StreamEndReason.ROLLBACK if event == "rollback" else StreamEndReason.STATE_CHANGED
        return self._end_all([s for s in streams if not (event == "state" and s.takeover_active)], reason)

    def _end_all(self, streams: list[ActiveStream], reason: StreamEndReason) -> tuple:
        actions: tuple = NOTHING
        for stream in streams:
            actions += self.end_stream(stream, reason)[:-1]  # all but the WAKE
        return actions + WAKE_ONLY if streams else NOTHING

    def lost_privileges(self) -> tuple:
        """Re-authentication or another bucket took DcpProducer away: every stream ends."""
        return self._end_all(list(self.registry.streams.values()), StreamEndReason.LOST_PRIVILEGES)

    def shutdown(self) -> tuple:
        """The server is going away: every stream ends with DISCONNECTED. Returns what to write
        before the connection closes (each stream's STREAM_END) and the backfills to stop."""
        out: list = []
        actions: tuple = NOTHING
        for stream in list(self.registry.streams.values()):
            stream.set_dead(StreamEndReason.DISCONNECTED)
            data = stream.pop()
            while data is not None:
                out.append(data)
                data = stream.pop()
            actions += self.retire(stream)
        return ((Send(b"".join(out)),) if out else NOTHING) + actions

    def release(self) -> None:
        """The connection is gone: release every cursor and forget every stream (nothing here may
        keep one: the shell and its connection refer to each other, and streams they still held
        would wait for the cyclic collector with them)."""
        for stream in list(self.registry.streams.values()) + self.registry.draining:
            stream.release()
        self.registry.clear()
        self.backfills.clear()

    # -- replies from the consumer --------------------------------------------------------------
    def reply(self, status: int, opcode: int, opaque: int, now: float) -> tuple:
        """A response the consumer sent (to a noop, a marker with the Ack flag, or a takeover's
        SET_VBUCKET_STATE): `Tolerated`, `Close` for an error status that is not tolerated, or
        what the takeover stream it answers needs done."""
        self.noop.last_received = now
        if status != Status.SUCCESS:
            if status in _TOLERATED or (not self.settings.v7_status and status in _TOLERATED_LEGACY):
                return (Tolerated(status, opcode),)
            return (Close(f"consumer answered opcode 0x{opcode:02x} with status 0x{status:x}"),)
        if opcode == Opcode.DCP_NOOP:
            self.noop.answered()
        elif opcode == Opcode.DCP_SNAPSHOT_MARKER or opcode == Opcode.DCP_SET_VBUCKET_STATE:
            for stream in list(self.registry.streams.values()):
                if stream.opaque == opaque and stream.takeover:
                    if opcode == Opcode.DCP_SNAPSHOT_MARKER:
                        actions = stream.snapshot_acked()
                    else:
                        actions = stream.vbucket_state_acked()
                    if actions:
                        self.registry.pending[stream] = None
                    return actions
        return NOTHING

    def seqno_ack(self, vbid: int, seqno: int, now: float) -> Refusal | tuple:
        """DCP_SEQNO_ACKNOWLEDGED (seqno-acknowledged.md): a replica's ack completes the sync
        writes it satisfies on an active vbucket; one for a vbucket no longer active here is
        dropped (its prepares moved with it). Only a connection with sync writes and a consumer
        name may send it (EINVAL)."""
        settings = self.settings
        if not settings.sync_replication:
            return Refusal(Status.EINVAL, "DCP_SEQNO_ACKNOWLEDGED needs enable_sync_writes and consumer_name first")
        self.noop.last_received = now
        vb = self.engine.get_vbucket(vbid)
        if vb is not None and vb.state == VBucketState.ACTIVE:
            vb.seqno_ack(settings.consumer_name, seqno)
        return NOTHING

    # -- the noop timer -------------------------------------------------------------------------
    def noop_timer(self, now: float) -> tuple:
        """The noop timer fired (no-op.md, dead-connections.md, noop.py): `Close` a consumer idle for
        longer than the idle timeout, else `Send` a DCP_NOOP when one is due and none is
        outstanding, and re-arm the timer; nothing once noops are off."""
        noop = self.noop
        if not noop.enabled:
            return NOTHING
        action = noop.tick(now)
        if action is NoopAction.DISCONNECT:
            return (Close(f"nothing received for {noop.idle(now):.1f} s (dcp_idle_timeout)"),)
        if action is NoopAction.SEND:
            return (Send(DcpNoop(noop.opaque).encode()), ARM_NOOP_TIMER)
        return (ARM_NOOP_TIMER,)

    # -- sending --------------------------------------------------------------------------------
    def buffer_ack(self, nbytes: int, now: float) -> tuple:
        """DCP_BUFFER_ACKNOWLEDGEMENT (buffer-ack.md): more room in the window: a send pass."""
        self.noop.last_received = now
        self.window.ack(nbytes)
        return WAKE_ONLY

    def send_pass(self) -> SendPass:
        """What to write now (send_pass.py); also which backfills to stop and whether to start
        the queued ones."""
        p = send_pass(self.registry, self.window, self.backfills, self.settings.batch, self.forget)
        if p.sent:
            self.bytes_sent += p.sent
            self.items_sent += p.messages
        return p

    # -- stats ----------------------------------------------------------------------------------
    def stats(self) -> dict:
        """`stats dcp` for this connection (kv_engine's eq_dcpq:<name>:* keys)."""
        p = f"eq_dcpq:{self.name}:"
        s = self.settings
        out = {
            p + "type": "producer",
            p + "created": int(self.created),
            p + "flags": self.open_flags,
            p + "max_buffer_bytes": self.window.buffer_size,
            p + "unacked_bytes": self.window.unacked,
            p + "total_acked_bytes": self.window.total_acked,
            p + "total_bytes_sent": self.bytes_sent,
            p + "items_sent": self.items_sent,
            p + "num_streams": len(self.registry.streams),
            p + "noop_enabled": int(self.noop.enabled),
            p + "noop_interval": self.noop.interval,
            p + "noop_wait": int(self.noop.pending),
            p + "priority": s.priority,
            p + "backfill_order": s.backfill_order,
            p + "cursor_dropping": int(s.cursor_dropping),
            p + "num_backfills_running": len(self.backfills.running),
            p + "backfill_open_trips": self.backfills.trips,
            p + "flow_control_pauses": self.window.pauses,
            p + "enable_stream_id": int(s.stream_ids),
            p + "sync_replication": int(s.sync_replication),
            p + "max_marker_version": "2.2" if s.marker_v22 else ("2.0" if s.sync_replication else "1.0"),
        }
        for (vbid, sid), stream in sorted(self.registry.streams.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
            sp = f"{p}stream_{vbid}_" if sid is None else f"{p}stream_{vbid}_sid{sid}_"
            out.update({sp + k: v for k, v in stream.stats().items()})
        return out

