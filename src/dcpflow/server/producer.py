"""ProducerShell: the asyncio shell of one DCP producer connection.

The rules live in dcpflow.dcp (DcpProducer and the modules it names); this shell moves
bytes and time, and executes the outcomes they return (`_do`, dcp/outcomes.py):

* Scheduling - a send pass (`_step`, dcp/send_pass.py) runs from the event loop (`call_soon`)
  whenever a stream may have work: a write to its vbucket (the bucket's seqno listener), a backfill
  page, a BUFFER_ACK, a drained socket (the Writer's `on_resume`), a takeover reply. What a pass
  takes is written in one batch - after the replies already queued in the connection's Writer, so
  order is kept - as one buffer, or with one `writelines` when large values travel uncopied
  (dcp/active_stream.py, LARGE_VALUE) or the pass is mostly backfill pages; then the loop serves
  reads (acks, new requests) and other connections before the next pass.
* The noop timer - every noop interval while `enable_noop` is on, dcp/noop.py says whether to send
  a DCP_NOOP or to close an idle connection.
* Backfills - server/backfill.py reads them on the server's backfill threads.
* Engine notifications - writes wake the streams of their vbucket; vbucket state changes and
  rollbacks end streams.

Pages: https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/commands/open-connection.md
and the pages listed in dcp/producer.py.
"""

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from dcpflow.dcp.active_stream import ActiveStream
from dcpflow.dcp.errors import Refusal
from dcpflow.dcp.outcomes import ARM_NOOP_TIMER, WAKE, Close, Send, SetVbucketState, StopBackfill, Tolerated
from dcpflow.dcp.producer import DcpProducer, Rollback
from dcpflow.engine.errors import EngineError
from dcpflow.protocol import dcp as dcpproto
from dcpflow.protocol.dcp import StreamEndReason
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import Frame
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .auth import Privilege
from .backfill import ConnectionBackfills

if TYPE_CHECKING:
    from .connection import Connection

log = logging.getLogger("dcpflow.server.dcp")

#: Transport write-buffer high-water mark for producer connections (asyncio's default is 64 KiB).
WRITE_BUFFER_HIGH = 1024 * 1024
_monotonic = time.monotonic


class ProducerShell:
    """See the module docstring. One per DCP producer connection; `state` holds its rules. A
    conn_handler.ConnHandler."""

    kind = "producer"

    def __init__(self, conn: "Connection", name: str, flags: int):
        self.conn = conn
        self.server = conn.server
        self.name = name
        self.bucket = conn.bucket
        self.engine = conn.bucket.engine
        self.loop = asyncio.get_running_loop()
        self.state = DcpProducer(
            name, flags, self.engine, now=_monotonic(), created=time.time(),
            idle_timeout=float(self.server.config.dcp_idle_timeout))
        self.backfills = ConnectionBackfills(self, self.server.backfills, self.state.backfills)
        # the seqno listener runs inside every write to the bucket: it reads these directly
        self._by_vb = self.state.registry.by_vb
        self._pending = self.state.registry.pending
        self._window = self.state.window
        self._scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self.closed = False
        self.engine.add_seqno_listener(self._on_seqno)
        self.engine.add_vbucket_listener(self._on_vbucket_event)
        self.engine.add_cursor_listener(self._on_cursor_dropped)
        # A DCP stream is a bulk transfer: let the transport buffer more before pausing us, so a
        # pass of MAX_PASS_BYTES does not pause/resume the connection every time.
        conn.transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
        conn.response_handler = self.on_response
        conn.writer.on_resume.append(self.schedule)
        conn.on_close.append(self.disconnect)

    def __repr__(self) -> str:
        return f"<ProducerShell {self.name!r} streams={len(self.streams)}>"

    @property
    def streams(self) -> dict[tuple[int, int | None], ActiveStream]:
        return self.state.streams

    @property
    def open_flags(self) -> int:
        return self.state.open_flags

    def received(self) -> None:
        """Something arrived from the consumer (dead-connections.md)."""
        self.state.received(_monotonic())

    def _do(self, actions: tuple) -> None:
        """Execute what the state answered (dcp/outcomes.py), in order."""
        for action in actions:
            if action is WAKE:
                self.schedule()
            elif action is ARM_NOOP_TIMER:
                self._arm_timer()
            else:
                cls = action.__class__
                if cls is Send:
                    self.conn.writer.send(action.data)
                elif cls is StopBackfill:
                    action.handle.cancel()
                elif cls is SetVbucketState:
                    self.engine.set_vbucket_state(action.vbid, action.state)
                    self.server.topology.bump()
                elif cls is Tolerated:
                    opcode = action.opcode
                    self.server.log.log(logging.INFO, "dcp-reply", "DCP %s: consumer answered %s with status 0x%x "
                                        "(tolerated)", self.name, Opcode(opcode).name
                                        if opcode in Opcode._value2member_map_ else hex(opcode), action.status)
                elif cls is Close:
                    self.server.log.warning("dcp-protocol", "DCP %s: %s: disconnecting", self.name, action.reason)
                    self.conn.close()
                else:
                    raise TypeError(f"a producer cannot execute {action!r}")

    # -- requests (server/dcp_commands.py) ------------------------------------------------------
    def control(self, key: str, value: str) -> tuple[int, str]:
        """One DCP_CONTROL; (status, reason)."""
        outcome = self.state.control(key, value, now=_monotonic(), collections=self.conn.collections,
                                     snappy=Feature.SNAPPY in self.conn.features)
        if outcome.__class__ is Refusal:
            return outcome.status, outcome.reason
        self._do(outcome)
        return Status.SUCCESS, ""

    def stream_request(self, req: dcpproto.DcpStreamRequest, frame: Frame) -> bytes:
        outcome = self.state.stream_request(req, collections=self.conn.collections)
        if outcome.__class__ is Refusal:
            if outcome.status == Status.NOT_MY_VBUCKET:
                return self.conn.not_my_vbucket(frame)
            if outcome.status in (Status.UNKNOWN_COLLECTION, Status.UNKNOWN_SCOPE):
                return self.conn.engine_error(frame, EngineError(outcome.status, outcome.reason))  # + manifest uid
            return self.conn.error_reply(frame.opcode, frame.opaque, outcome.status, outcome.reason)
        if outcome.__class__ is Rollback:
            return dcpproto.DcpStreamRequestResponse(Status.ROLLBACK, rollback_seqno=outcome.seqno,
                                                     opaque=frame.opaque).encode()
        self._do(outcome.then)  # a send pass: runs after this reply is written
        return dcpproto.DcpStreamRequestResponse(Status.SUCCESS, outcome.failover_log, opaque=frame.opaque).encode()

    def close_stream(self, req: dcpproto.DcpCloseStream, frame: Frame) -> bytes | None:
        """None on success (the caller answers), else the error reply."""
        outcome = self.state.close_stream(req.vbucket, req.stream_id)
        if outcome.__class__ is Refusal:
            return self.conn.error_reply(frame.opcode, frame.opaque, outcome.status, outcome.reason)
        self._do(outcome)
        return None

    def buffer_ack(self, nbytes: int) -> None:
        self._do(self.state.buffer_ack(nbytes, _monotonic()))

    def seqno_ack(self, vbid: int, seqno: int) -> None:
        """A replica's DCP_SEQNO_ACKNOWLEDGED (DcpProducer.seqno_ack decides)."""
        outcome = self.state.seqno_ack(vbid, seqno, _monotonic())
        if outcome.__class__ is Refusal:
            raise ProtocolError(outcome.reason, outcome.status)
        self._do(outcome)

    def backfill_failed(self, stream: ActiveStream) -> None:
        """The backfill's read failed (DcpProducer.backfill_failed decides)."""
        self._do(self.state.backfill_failed(stream))

    def end_stream(self, stream: ActiveStream, reason: StreamEndReason) -> None:
        """End a stream from outside (whatever sends what is left goes in the next pass)."""
        self._do(self.state.end_stream(stream, reason))

    # -- engine notifications -------------------------------------------------------------------
    def _on_seqno(self, vbid: int, seqno: int) -> None:
        """Called inside every write to the bucket: keep it to a dict lookup when idle."""
        streams = self._by_vb.get(vbid)
        if streams:
            pending = self._pending
            for s in streams:
                pending[s] = None
            window = self._window
            if window.buffer_size and window.unacked >= window.buffer_size:
                return  # blocked by flow control: the next BUFFER_ACK schedules us
            if not self._scheduled:
                self._scheduled = True
                self.loop.call_soon(self._step)

    def _on_vbucket_event(self, vbid: int, event: str) -> None:
        self._do(self.state.vbucket_changed(vbid, event))

    def _on_cursor_dropped(self, vbid: int, cursor_name: str) -> None:
        """The engine dropped a cursor (memory): a stream of ours reading with it goes on from disk
        at the next pass."""
        self._do(self.state.cursor_dropped(vbid, cursor_name))

    def privileges_changed(self) -> None:
        """Re-authentication or another bucket: streams without DcpProducer on this bucket end."""
        conn = self.conn
        if conn.bucket is self.bucket and conn.privileges & Privilege.DCP_PRODUCER:
            return
        self._do(self.state.lost_privileges())

    def wake(self, stream: ActiveStream) -> None:
        """The stream has something new (a backfill page): a send pass soon."""
        self._do(self.state.wake(stream))

    def schedule(self) -> None:
        if not self._scheduled and not self.closed:
            self._scheduled = True
            self.loop.call_soon(self._step)

    # -- the send loop --------------------------------------------------------------------------
    def _step(self) -> None:
        self._scheduled = False
        if self.closed:
            return
        writer = self.conn.writer
        if writer.paused:
            return  # on_resume schedules us again
        state = self.state
        p = state.send_pass()
        if p.sent:
            writer.flush()  # replies queued before this pass go first
            transport = self.conn.transport
            if not transport.is_closing():
                if p.views or p.sent >= len(p.out) << 11:
                    # uvloop: one writev, nothing copied - large values, and backfill pages (runs of
                    # ~256 KiB, which joining would copy again on the loop)
                    transport.writelines(p.out)
                else:
                    transport.write(b"".join(p.out))  # small messages: one buffer beats many iovecs
            writer.bytes_sent += p.sent
            self.backfills.space_freed()
        if p.stop:
            self._do(p.stop)
        if p.backfill:
            self.backfills.start()  # what this pass queued, in groups
        if p.more and not p.blocked and not writer.paused:
            self.schedule()

    # -- noop, replies --------------------------------------------------------------------------
    def _arm_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        noop = self.state.noop
        if noop.enabled and not self.closed:
            self._timer = self.loop.call_later(noop.interval, self._tick)

    def _tick(self) -> None:
        self._timer = None
        if not self.closed:
            self._do(self.state.noop_timer(_monotonic()))

    def on_response(self, frame: Frame) -> None:
        """A reply from the consumer (connection.response_handler)."""
        self._do(self.state.reply(frame.status, frame.opcode, frame.opaque, _monotonic()))
        return None

    # -- shutdown -------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Server going away: every stream ends with DISCONNECTED, written before the close."""
        if self.closed:
            return
        self._do(self.state.shutdown())

    def disconnect(self) -> None:
        """The connection is gone: release cursors, stop backfills and timers."""
        if self.closed:
            return
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        self.backfills.cancel()
        self.state.release()
        try:
            self.engine.remove_seqno_listener(self._on_seqno)
            self.engine.remove_vbucket_listener(self._on_vbucket_event)
            self.engine.remove_cursor_listener(self._on_cursor_dropped)
        except ValueError:
            pass
        self.server.dcp_names.release(self.bucket.name, self.name, self.conn)

    def stats(self) -> dict:
        return self.state.stats()

    def items_remaining(self) -> int:
        """Up to each stream's end seqno or its vbucket's high seqno, from the last one sent."""
        engine = self.engine
        total = 0
        for stream in list(self.streams.values()):
            vb = engine.get_vbucket(stream.vbid)
            if vb is not None:
                total += max(0, min(vb.high_seqno, stream.end_seqno) - stream.last_sent_seqno)
        return total
