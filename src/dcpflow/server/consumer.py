"""ConsumerShell: the asyncio shell of one DCP consumer connection (the replica side).

The rules live in dcpflow.dcp.consumer (DcpConsumer) and dcp/passive_stream.py; this shell
executes the outcomes they return (`_do`, dcp/outcomes.py): sends what they answer, runs the
flow-control acknowledgement timer, rolls a replica back under
the server's maintenance lock (no flush batch in flight while the store rewinds), and changes a
vbucket's state for a takeover once no flush is in flight (the reply tells the old active it may
go dead, so the new state must be on disk first - Server.when_no_flush).

Pages: https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/commands/add-stream.md
and the pages listed in dcp/consumer.py.
"""

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from dcpflow.dcp.consumer import DEFAULT_BUFFER_SIZE, DcpConsumer
from dcpflow.dcp.errors import Refusal
from dcpflow.dcp.outcomes import ArmAckTimer, ChangeState, Close, Reply, RollBack, Send
from dcpflow.dcp.passive_stream import PassiveStream
from dcpflow.engine.errors import EngineError
from dcpflow.protocol import dcp as dcpproto
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import Frame, response
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

if TYPE_CHECKING:
    from .connection import Connection

log = logging.getLogger("dcpflow.server.consumer")
_monotonic = time.monotonic


class ConsumerShell:
    """See the module docstring. One per DCP consumer connection; `state` holds its rules. A
    conn_handler.ConnHandler."""

    kind = "consumer"

    def __init__(self, conn: "Connection", name: str, flags: int, consumer_name: str | None = None, *,
                 buffer_size: int = DEFAULT_BUFFER_SIZE):
        self.conn = conn
        self.server = conn.server
        self.name = name
        self.bucket = conn.bucket
        self.engine = conn.bucket.engine
        self.loop = asyncio.get_running_loop()
        self.state = DcpConsumer(name, flags, self.engine, self.bucket.name, self.server.passive_streams,
                                        now=_monotonic(), created=time.time(), consumer_name=consumer_name,
                                        buffer_size=buffer_size)
        self._ack_timer: asyncio.TimerHandle | None = None
        self.engine.add_vbucket_listener(self._on_vbucket_event)
        self.engine.add_persistence_listener(self._on_persisted)
        conn.response_handler = self.on_response
        conn.on_close.append(self.disconnect)
        # After the DCP_OPEN reply (written when the handler returns), not before it.
        self.loop.call_soon(self._open)

    def __repr__(self) -> str:
        return f"<ConsumerShell {self.name!r} streams={len(self.streams)}>"

    @property
    def streams(self) -> dict[int, PassiveStream]:
        return self.state.streams

    @property
    def closed(self) -> bool:
        return self.state.closed

    def _do(self, actions: tuple) -> None:
        """Execute what the state answered (dcp/outcomes.py), in order."""
        for action in actions:
            cls = action.__class__
            if cls is Send:
                self.conn.writer.send(action.data)
            elif cls is ArmAckTimer:
                if self._ack_timer is None:
                    self._ack_timer = self.loop.call_later(action.delay, self._ack)
            elif cls is RollBack:
                self.loop.create_task(self._rollback(action))
            elif cls is Close:
                self.conn.close()
            else:
                raise TypeError(f"a consumer cannot execute {action!r} here")

    def _open(self) -> None:
        if not self.closed:
            self._do(self.state.open())

    # -- requests (server/dcp_commands.py) ------------------------------------------------------
    def add_stream(self, req: dcpproto.DcpAddStream, frame: Frame) -> bytes | None:
        """add-stream.md: None (the reply follows the producer's answer), or the refusal."""
        outcome = self.state.add_stream(req, frame.opaque)
        if outcome.__class__ is Refusal:
            return self.conn.error_reply(frame.opcode, frame.opaque, outcome.status, outcome.reason)
        self._do(outcome)
        return None

    def close_stream(self, frame: Frame) -> bytes:
        req = dcpproto.DcpCloseStream.from_frame(frame)
        outcome = self.state.close_stream(req.vbucket)
        if outcome.__class__ is Refusal:
            return self.conn.error_reply(frame.opcode, frame.opaque, outcome.status, outcome.reason)
        self._do(outcome)
        return response(frame.opcode, opaque=frame.opaque)

    def noop(self, frame: Frame) -> bytes:
        return self.state.noop(frame, _monotonic())

    def on_message(self, frame: Frame) -> bytes | None:
        """A stream message from the producer (dispatched by opcode); returns a reply or None."""
        state = self.state
        now = _monotonic()
        state.last_received = now
        try:
            msg = dcpproto.decode_dcp(frame)
        except ProtocolError as e:
            self._do(state.consumed(frame.wire_len, now))
            return self.conn.error_reply(frame.opcode, frame.opaque, e.status, e.reason)
        self._do(state.consumed(dcpproto.charged_size(msg), now))
        actions = state.message(msg, frame.opaque, self.conn.collections)
        if not actions:
            return None
        outcome = actions[-1]  # the answer to this message, if it has one, comes last
        if outcome.__class__ is Send:
            self._do(actions)
            return None
        self._do(actions[:-1])
        if outcome.__class__ is Reply:
            return outcome.data
        if outcome.__class__ is Refusal:
            return self.conn.error_reply(frame.opcode, frame.opaque, outcome.status, outcome.reason)
        try:
            return self.server.when_no_flush(self.engine, lambda: self._change_state(outcome))
        except EngineError as e:  # changed at once, and refused (after a flush, the connection answers)
            self.server.log.warning("dcp-consumer", "DCP consumer %s: vbucket %d refused %s: %s", self.name,
                                    outcome.stream.vbid, Opcode(frame.opcode).name, e)
            return self.conn.error_reply(frame.opcode, frame.opaque, e.status, e.reason)

    def _change_state(self, change: ChangeState) -> bytes:
        reply = self.state.change_state(change.stream, change.msg)
        if self.server.topology is not None:
            self.server.topology.bump()
        log.info("DCP consumer %s: vbucket %d is now %s (takeover)", self.name, change.stream.vbid,
                 dcpproto.VBucketState(change.msg.state).name.lower())
        return reply

    # -- flow control -----------------------------------------------------------------------------
    def _cancel_ack_timer(self) -> None:
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None

    def _ack(self) -> None:
        self._cancel_ack_timer()
        self._do(self.state.ack())

    # -- replies from the producer ----------------------------------------------------------------
    def on_response(self, frame: Frame) -> None:
        """A response on this connection: to one of our requests (controls, stream requests)."""
        self._do(self.state.response(frame, _monotonic()))
        return None

    async def _rollback(self, order: RollBack) -> None:
        """Roll the replica back to `seqno` from disk, then ask again (rebalance.md steps 4-5)."""
        state, stream, seqno = self.state, order.stream, order.seqno
        try:
            async with self.server._maintenance:  # no flush batch in flight while the store rewinds
                if not state.is_current(stream):
                    return
                state.changing_state = True
                try:
                    reached = self.engine.rollback(stream.vbid, seqno)
                finally:
                    state.changing_state = False
            log.info("DCP consumer %s: vbucket %d rolled back to %d (asked %d)", self.name, stream.vbid,
                     reached, seqno)
        except Exception:
            log.exception("DCP consumer %s: rollback of vbucket %d to %d failed", self.name, stream.vbid, seqno)
            self._do(state.request_failed(stream, Status.EINTERNAL))
            return
        self._do(state.rolled_back(stream))

    # -- engine notifications -------------------------------------------------------------------
    def _on_vbucket_event(self, vbid: int, event: str) -> None:
        self._do(self.state.vbucket_changed(vbid, event))

    def _on_persisted(self, vbid: int, seqno: int) -> None:
        if vbid in self.state.streams and not self.closed:
            self._do(self.state.persisted(vbid))  # PersistToMajority prepares are acknowledged once on disk

    # -- life cycle -----------------------------------------------------------------------------
    def disconnect(self) -> None:
        if self.closed:
            return
        self._cancel_ack_timer()
        self.state.release()
        with contextlib.suppress(ValueError):
            self.engine.remove_vbucket_listener(self._on_vbucket_event)
        with contextlib.suppress(ValueError):
            self.engine.remove_persistence_listener(self._on_persisted)
        self.server.dcp_names.release(self.bucket.name, self.name, self.conn)

    def shutdown(self) -> None:
        """Server going away: nothing to send (a consumer owes the producer no goodbye) but the
        acknowledgement of what it processed."""
        self._ack()

    def stats(self) -> dict:
        return self.state.stats()

    def items_remaining(self) -> int:
        """A consumer sends no items."""
        return 0

    def privileges_changed(self) -> None:
        """Nothing to end here: the consumer's streams are the producer's to end."""
