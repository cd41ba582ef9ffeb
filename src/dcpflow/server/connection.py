"""One client connection: framing, in-order pipelined replies, dispatch, and the session state.

Clients pipeline: they write many requests before reading a reply (the official SDKs do), and the
protocol promises replies in request order (BinaryProtocol.md, "Client Commands"). Each
`data_received` feeds a FrameDecoder and runs every complete request through the dispatch table
(dispatch.py) in order; replies go into the Writer, which sends everything produced in one
event-loop pass with a single `writelines`. A handler that must wait (returns an awaitable) stops
processing until it is done, so nothing overtakes it.

Malformed input: a non-fatal ProtocolError concerns one frame the decoder already consumed, so
the reply is its status with that frame's opaque and the connection goes on - E2BIG for a request
over the 20 MiB document limit but within memcached's 30 MiB packet limit (its body is skipped,
never buffered). A fatal one (bad magic, a frame over the packet limit, extras and key that run
past the body) means the stream cannot be trusted: the connection is closed, as kv_engine closes
it. Other connections never notice.

Backpressure: when the transport's write buffer passes its high-water mark the connection stops
reading (a client that does not read its replies cannot make the server buffer without bound);
likewise when more than MAX_PENDING_INPUT of requests wait for a later pass (a client pipelining
faster than its requests run), until that backlog has run;
the Writer tells `on_resume` listeners when it drains, which is where a DCP producer will resume
sending.

Fault injection (server/faults): a delay rule holds the requests of its opcodes in `_handle`
before they run (those opcodes are kept off the fast path while the rule lasts), and `drop()`
cuts the connection as a network failure would.

DCP: DCP_OPEN (dcp_commands.py) sets `self.dcp` (the producer or consumer shell), which routes
responses from the peer via `response_handler` and sends messages with `self.writer.send()`,
batched per event-loop pass as well. The command table is the server's (`server.commands`,
built in commands.py).
"""

import asyncio
import logging
import socket
import time
import traceback

from dcpflow.engine.errors import EngineError
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import (
    MAX_PACKET_LEN,
    Frame,
    FrameDecoder,
    Magic,
    RequestFrameId,
    check_request_frame_infos,
    decode_frame_infos,
)
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.keys import check_document_key
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.rules import opcode_name
from dcpflow.protocol.status import Status

from . import durable
from .audit import COMMAND_ACCESS_FAILURE, INVALID_PACKET, PRIVILEGES_CHANGED
from .auth import Privilege, User
from .conn_handler import ConnHandler
from .replies import Replies

log = logging.getLogger("dcpflow.server")

#: Stop reading from a client whose unprocessed input passes this while a handler waits.
MAX_PENDING_INPUT = 4 * 1024 * 1024
#: Hand replies to the transport mid-batch once this many bytes are queued, so that a pipeline of
#: large GETs meets the transport's backpressure instead of building one huge buffer.
MAX_BATCH_OUTPUT = 1024 * 1024
#: A connection's pipelined requests are run for at most about this long per event-loop pass (the
#: clock is read every 64 requests); the rest wait for the next pass, so that one client's burst
#: (a STREAM_REQ for each of 1024 vbuckets, say) does not stall everyone else (memcached's
#: reqs_per_event idea).
MAX_PASS_SECONDS = 0.004
_monotonic = time.monotonic
_ALT_REQUEST = Magic.ALT_REQUEST
_REQUEST = Magic.REQUEST
#: Unordered execution (HELLO 0x0e, BinaryProtocol.md): the commands that may overtake a durable
#: write still waiting for its durability - the document commands (not their quiet forms, whose
#: NOOP must follow their replies). Any other command, or one on a waiting write's key, waits for
#: every waiting write first, as KV-Engine's non-reorderable commands do.
_REORDERABLE = frozenset(int(op) for op in (
    Opcode.GET, Opcode.GET_K, Opcode.SET, Opcode.ADD, Opcode.REPLACE, Opcode.DELETE, Opcode.APPEND, Opcode.PREPEND,
    Opcode.INCREMENT, Opcode.DECREMENT, Opcode.TOUCH, Opcode.GAT, Opcode.GET_META, Opcode.SUBDOC_MULTI_LOOKUP,
    Opcode.SUBDOC_MULTI_MUTATION))
#: Durable writes one connection may have waiting at once; more wait in order.
MAX_DETACHED = 256


def _ran(frames: list[Frame], frame: Frame) -> int:
    """How many of `frames` have run when `frame` (one of them, by identity) is the last."""
    for i, f in enumerate(frames):
        if f is frame:
            return i + 1
    raise ValueError("the frame is not in the batch")


class Writer:
    """Batches a connection's output: one `writelines` per event-loop pass.

    `write` queues bytes that the current pass will flush (request processing flushes at the end
    of `data_received`); `send` queues and makes sure a flush is scheduled (for output produced
    outside request processing, such as DCP messages).
    """

    __slots__ = ("_transport", "_loop", "_buf", "_size", "_scheduled", "paused", "on_resume", "bytes_sent")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        self._transport = transport
        self._loop = loop
        self._buf: list[bytes] = []
        self._size = 0  # bytes in _buf
        self._scheduled = False
        self.paused = False
        self.on_resume: list = []
        self.bytes_sent = 0

    def write(self, data: bytes) -> None:
        self._buf.append(data)
        self._size += len(data)

    def send(self, data: bytes) -> None:
        self._buf.append(data)
        self._size += len(data)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False
        buf = self._buf
        if not buf:
            return
        data = buf[0] if len(buf) == 1 else b"".join(buf)
        buf.clear()  # in place: the list lives as long as the Writer (Connection._process appends to it)
        self._size = 0
        self.bytes_sent += len(data)
        if not self._transport.is_closing():
            self._transport.write(data)

    @property
    def pending(self) -> int:
        """Bytes queued and not yet handed to the transport."""
        return self._size


class Connection(Replies, asyncio.Protocol):
    """See the module docstring. Session state: `user`, `bucket`, `features`, and the per-bucket
    `privileges` of the user, recomputed whenever either changes."""

    def __init__(self, server):
        # `server` is the app.Server this connection belongs to, and `bucket` below one of its
        # app.ServerBuckets: app imports this module, so neither is named here
        self.server = server
        self.system = False  # authenticated as an administrator (counted in the server's reserve)
        self.commands = server.commands  # opcode -> Command (commands.py)
        # (conn, frames): the requests buffered behind one this in-order connection waits for (commands.py)
        self.read_ahead = server.read_ahead
        self.debug = server.config.debug
        self.transport: asyncio.Transport | None = None
        self.writer: Writer | None = None
        self.peer = "?"
        self.peer_ip = "?"  # the client's address without its port (throttle.py counts failed logins by it)
        self.sockname = "?"
        self.tls = False
        self._decoder = FrameDecoder(max_packet_len=MAX_PACKET_LEN, strict=True)
        self._waiting: asyncio.Future | None = None
        self._detached: dict[asyncio.Future, tuple[int, bytes]] = {}  # overtaken durable writes -> key
        self._pass_scheduled = False
        self._closing = False
        self._reading_paused = False
        # session
        self.user: User | None = None
        self.bucket = None
        self.get_vbucket = None  # the selected bucket's engine.get_vbucket
        self.privileges = 0  # Privilege bits as a plain int (tested on every request)
        self.features: frozenset[int] = frozenset()
        self.collections = False
        self.mutation_seqno = False
        self.xerror = False
        self.json = False
        self.xattr = False
        self.dedupe_nmvb = False
        self.unordered = False
        self.agent = ""
        self.client_id: str | None = None
        self.known_config: tuple[int, int] | None = None  # the map version this client last received
        self.sasl = None  # an exchange in progress (auth.ScramServer)
        self.response_handler = None  # DCP: callable(frame) for responses from the peer
        self.dcp: ConnHandler | None = None  # DCP: the producer/consumer of this connection, once DCP_OPEN made one
        self.on_close: list = []  # callables run once the connection is gone (close streams, drop cursors)
        # opcode -> handler of every command this session may run as it stands (see _refresh_ready)
        self._ready: dict[int, object] = {}
        self._refresh_ready()

    # -- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.writer = Writer(transport, asyncio.get_running_loop())
        self.tls = transport.get_extra_info("sslcontext") is not None
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.peer_ip = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        sockname = transport.get_extra_info("sockname")
        self.sockname = f"{sockname[0]}:{sockname[1]}" if isinstance(sockname, tuple) else str(sockname)
        self.server.connection_made(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        if self._waiting is not None:
            self._waiting.cancel()
            self._waiting = None
        for task in list(self._detached):
            task.cancel()
        self._detached.clear()
        for callback in self.on_close:
            try:
                callback()
            except Exception:
                log.exception("on_close callback of %s failed", self.peer)
        self.on_close.clear()
        self.server.connection_lost(self)

    def data_received(self, data: bytes) -> None:
        self._decoder.feed(data)
        if self._waiting is None and not self._pass_scheduled:
            self._process()
            self.writer.flush()
        # Requests left for later (a handler waits, or the pass ran out of time: the next pass is
        # scheduled and takes these bytes too): a client sending faster than its requests run stops
        # being read, so its backlog stays bounded and it gets no more than its turn of the loop.
        if (self._waiting is not None or self._pass_scheduled) and self._decoder.buffered > MAX_PENDING_INPUT:
            self._pause_reading()

    def pause_writing(self) -> None:
        self.writer.paused = True
        self._pause_reading()

    def resume_writing(self) -> None:
        self.writer.paused = False
        for callback in list(self.writer.on_resume):
            callback()
        if self._waiting is None and not self._closing:
            self._process()  # requests left unprocessed while the client was not reading
            self.writer.flush()
            if self._waiting is None and not self.writer.paused:
                self._resume_reading()

    def _pause_reading(self) -> None:
        if not self._reading_paused and not self._closing:
            self._reading_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._reading_paused and not self._closing:
            self._reading_paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        """Send what is queued, then close."""
        if self._closing:
            return
        self._closing = True
        self.writer.flush()
        self.transport.close()

    def drop(self) -> None:
        """Cut the connection at once, sending nothing more (fault injection: what a network
        failure does to a client)."""
        if self._closing:
            return
        self._closing = True
        self.transport.abort()

    # -- request processing --------------------------------------------------------------------
    def _process(self) -> None:
        """Run the buffered requests, in order, until one has to wait, the connection closes or
        the pass has run MAX_PASS_SECONDS (the rest go on at the next pass of the loop)."""
        writer = self.writer
        if writer.paused:
            return  # resume_writing() picks up from here
        decoder, write = self._decoder, writer.write
        ready = self._ready  # updated in place when the session changes, so this stays current
        out = writer._buf  # Writer.write inlined below: one call less per request
        started = _monotonic()
        taken = 0  # requests run since the clock was last read
        detached = self._detached
        while not self._closing:
            try:
                while True:
                    # The frames come in lists, consumed once they have run (on the way out when
                    # the loop stops early: a request that waits, raises, or ends the connection).
                    frames = decoder.peek(64)
                    if not frames:
                        return  # every buffered request has run
                    overtaken = False
                    try:
                        for frame in frames:
                            if detached and self._must_wait(frame):
                                decoder.consume(_ran(frames, frame))
                                self._wait_for(frame, self._after_detached(frame))
                                return
                            # A classic request (no framing extras) whose command this session may run
                            # goes straight to its handler: the checks of _handle were done when the
                            # session last changed (tests/server/test_connection.py pins the equivalence).
                            handler = ready.get(frame.opcode) if frame.magic == _REQUEST else None
                            if handler is not None:
                                try:
                                    reply = handler(self, frame)
                                except Exception as e:
                                    reply = self._handler_failed(frame, e)
                            else:
                                reply = self._handle(frame)
                            if reply is None:
                                pass
                            elif reply.__class__ is bytes:
                                out.append(reply)
                                writer._size += len(reply)
                                if writer._size > MAX_BATCH_OUTPUT:
                                    writer.flush()
                                    if writer.paused:
                                        decoder.consume(_ran(frames, frame))
                                        return
                            else:
                                decoder.consume(_ran(frames, frame))
                                if self._park(frames, frame, reply):
                                    overtaken = True  # the next requests go on meanwhile
                                    break
                                return
                            if self._closing:
                                decoder.consume(_ran(frames, frame))
                                return
                    except BaseException:
                        if not overtaken:
                            decoder.consume(_ran(frames, frame))
                        raise
                    if overtaken:
                        continue  # the frames after the detached one: peek again
                    decoder.consume(len(frames))
                    taken += len(frames)
                    if taken >= 64:  # the clock is read every 64 requests or so, not per request
                        taken = 0
                        if _monotonic() - started > MAX_PASS_SECONDS:
                            if decoder.buffered:  # (none left: the next bytes may run as soon as they come)
                                self._next_pass()
                            return
            except ProtocolError as e:
                if e.fatal:
                    self._log_bad_input(e)
                    self.close()
                    return
                write(self.error_reply(e.opcode or 0, e.opaque or 0, e.status, e.reason))

    def _park(self, frames: list, frame, reply) -> bool:
        """A request whose reply must wait: detached when the session allows it (True: the requests
        after it go on), else waited for in order - with the reads of the GETs buffered behind it
        started meanwhile (bg_fetch.py), so a pipelined read-back of documents on disk is batched."""
        if self.unordered and frame.opcode in _REORDERABLE and len(self._detached) < MAX_DETACHED:
            self._detach(frame, reply)
            return True
        if self.read_ahead is not None and self.bucket is not None:
            ready = self._ready
            self.read_ahead(self, [f for f in frames[_ran(frames, frame):] if f.magic == _REQUEST
                                   and ready.get(f.opcode) is not None])
        self._wait_for(frame, reply)
        return False

    def _next_pass(self) -> None:
        """Run the rest of the buffered requests on the next event-loop pass."""
        if not self._pass_scheduled:
            self._pass_scheduled = True
            asyncio.get_running_loop().call_soon(self._resume_pass)

    def _resume_pass(self) -> None:
        self._pass_scheduled = False
        if self._closing or self._waiting is not None:
            return  # closed, or a waiting request resumes processing when it completes
        self._process()
        self.writer.flush()
        if self._waiting is None and not self._pass_scheduled and not self.writer.paused:
            self._resume_reading()  # the backlog has run: read again (a no-op unless paused above)

    def _refusal(self, frame: Frame, needs_auth: bool, needs_bucket: bool, privilege: int) -> bytes | None:
        """The session checks of a command: the error reply if this session may not run it."""
        if needs_auth and self.user is None:
            return self.access_refused(frame, "authenticate first (SASL)")
        if needs_bucket and self.bucket is None:
            return self.error_reply(frame.opcode, frame.opaque, Status.NO_BUCKET, "select a bucket first")
        if privilege and (self.privileges & privilege) != privilege:
            missing = "|".join(p.name for p in Privilege if p & privilege and not p & self.privileges)
            return self.access_refused(frame, f"user {self.user.name!r} lacks {missing} on this bucket")
        return None

    def access_refused(self, frame: Frame, reason: str, bucket: str | None = None) -> bytes:
        """EACCESS for `frame`, recorded in the audit trail (command access failure)."""
        if bucket is None and self.bucket is not None:
            bucket = self.bucket.name
        self.audit(COMMAND_ACCESS_FAILURE, command=opcode_name(frame.opcode), bucket=bucket or "", reason=reason)
        return self.error_reply(frame.opcode, frame.opaque, Status.EACCESS, reason)

    def audit(self, event, **fields) -> None:
        """An audit event about this connection (audit.py): its peer, its address and its user."""
        user = fields.pop("user", None)
        if user is None:
            user = self.user.name if self.user is not None else ""
        self.server.audit.record(event, remote=self.peer, local=self.sockname, user=user, **fields)

    def refresh_commands(self) -> None:
        """The server's delay rules changed (server/faults/delays.py): recompute the fast path."""
        self._refresh_ready()

    def _refresh_ready(self) -> None:
        """Recompute the commands that pass `_refusal` in the current session (user, bucket and
        privileges only change through set_user/select_bucket, which call this). Opcodes that
        delay rules hold are left to `_handle`, which holds them."""
        held = self.server.faults.delays.held
        ready = {op: cmd[0] for op, cmd in self.commands.items()
                 if (not cmd[1] or self.user is not None) and (not cmd[2] or self.bucket is not None)
                 and (self.privileges & cmd[3]) == cmd[3] and op not in held}
        self._ready.clear()
        self._ready.update(ready)

    def _handle(self, frame: Frame):
        magic = frame.magic
        if magic != _REQUEST and magic != _ALT_REQUEST:
            return self._handle_other_magic(frame)
        delays = self.server.faults.delays
        if delays.active and (rule := delays.rule_for(frame.opcode)) is not None:
            return self._delayed(frame, rule)
        return self._run(frame)

    async def _delayed(self, frame: Frame, rule):
        """A request a delay rule holds: wait it out, then run it (answered in order like any
        request that waits; the requests behind it wait in the input buffer)."""
        await self.server.faults.delays.hold(rule)
        reply = self._run(frame)
        if reply is not None and reply.__class__ is not bytes:
            reply = await reply
        return reply

    def _run(self, frame: Frame):
        """A request through the session checks to its handler."""
        cmd = self.commands.get(frame.opcode)
        if cmd is None:
            return self._unknown_command(frame)
        handler, needs_auth, needs_bucket, privilege, document_key = cmd  # unpacking: cheaper than attribute reads
        refused = self._refusal(frame, needs_auth, needs_bucket, privilege)
        if refused is not None:
            if document_key:  # kv_engine validates the request before it looks at who sent it
                try:
                    check_document_key(frame.key, self.collections)
                except ProtocolError as e:
                    return self.error_reply(frame.opcode, frame.opaque, e.status, e.reason)
            return refused
        if frame.framing:
            refused = self._framing_refusal(frame)
            if refused is not None:
                if refused.__class__ is not bytes:  # a durability requirement: a sync write (durable.py)
                    try:
                        return durable.run(self, frame, handler, refused.payload)
                    except Exception as e:
                        return self._handler_failed(frame, e)
                return refused
        try:
            return handler(self, frame)
        except Exception as e:
            return self._handler_failed(frame, e)

    def _handler_failed(self, frame: Frame, e: Exception) -> bytes:
        """The reply to a handler that raised: its status, or EINTERNAL for a bug (which must not
        take the server, or this client, down)."""
        if isinstance(e, EngineError):
            return self.engine_error(frame, e)
        if isinstance(e, ProtocolError):
            return self.error_reply(frame.opcode, frame.opaque, e.status, e.reason)
        self.server.log.error("handler-failure", "handler for %s failed:\n%s", opcode_name(frame.opcode),
                              traceback.format_exc(), keep_newlines=True)
        return self.error_reply(frame.opcode, frame.opaque, Status.EINTERNAL, "internal error")

    def _unknown_command(self, frame: Frame) -> bytes:
        if self.debug:
            self.server.debug_print("unknown-opcode", f"unknown opcode 0x{frame.opcode:02x} "
                                    f"({opcode_name(frame.opcode)}) from {self.peer} ({self.agent})")
        return self.error_reply(frame.opcode, frame.opaque, Status.UNKNOWN_COMMAND,
                                f"{opcode_name(frame.opcode)} is not implemented")

    def _handle_other_magic(self, frame: Frame):
        if frame.magic in (Magic.RESPONSE, Magic.ALT_RESPONSE) and self.response_handler is not None:
            return self.response_handler(frame)
        self._log_bad_input(ProtocolError(f"unexpected {Magic(frame.magic).name} frame (magic 0x{frame.magic:02x}) "
                                          f"from a client"))
        self.close()
        return None

    def _framing_refusal(self, frame: Frame) -> "bytes | _Durability | None":
        """Framing extras we cannot honour get an error rather than being silently ignored; a
        durability requirement is returned for `_run` to make the request a sync write."""
        problems = check_request_frame_infos(frame.framing)
        if problems:
            return self.error_reply(frame.opcode, frame.opaque, problems[0].status, problems[0].reason)
        durability = None
        for fid, payload in decode_frame_infos(frame.framing):
            if fid == RequestFrameId.DURABILITY:
                durability = _Durability(bytes(payload))
            if fid in (RequestFrameId.IMPERSONATE, RequestFrameId.IMPERSONATE_EXTRA_PRIVILEGE,
                       RequestFrameId.IMPERSONATE_TOKEN):
                return self.error_reply(frame.opcode, frame.opaque, Status.NOT_SUPPORTED,
                                        "impersonation is not supported")
        return durability

    def _must_wait(self, frame: Frame) -> bool:
        """With durable writes waiting (unordered execution): may `frame` not overtake them?"""
        if frame.opcode not in _REORDERABLE or frame.magic not in (_REQUEST, _ALT_REQUEST):
            return True
        return (frame.vbucket, bytes(frame.key)) in self._detached.values()

    def _detach(self, frame: Frame, awaitable) -> None:
        """Unordered execution: the reply goes out when the write completes, after the replies of
        requests that overtook it."""
        task = asyncio.ensure_future(self._run_async(frame, awaitable))
        self._detached[task] = (frame.vbucket, bytes(frame.key))
        task.add_done_callback(self._detached_done)

    def _detached_done(self, task: asyncio.Future) -> None:
        self._detached.pop(task, None)
        if self._closing or task.cancelled():
            return
        reply = task.result()
        if reply is not None:
            self.writer.write(reply)
            self.writer.flush()

    async def _after_detached(self, frame: Frame):
        """A request that may not overtake them runs once every detached durable write is done."""
        while self._detached:
            await asyncio.wait(list(self._detached))
        reply = self._handle(frame)
        if reply is not None and reply.__class__ is not bytes:
            reply = await reply
        return reply

    def _wait_for(self, frame: Frame, awaitable) -> None:
        self._waiting = asyncio.ensure_future(self._run_async(frame, awaitable))
        self._waiting.add_done_callback(self._async_done)
        if self._decoder.buffered > MAX_PENDING_INPUT:
            self._pause_reading()

    async def _run_async(self, frame: Frame, awaitable) -> bytes | None:
        try:
            return await awaitable
        except EngineError as e:
            return self.engine_error(frame, e)
        except ProtocolError as e:
            return self.error_reply(frame.opcode, frame.opaque, e.status, e.reason)
        except asyncio.CancelledError:
            raise
        except Exception:
            self.server.log.error("handler-failure", "handler for %s failed:\n%s", opcode_name(frame.opcode),
                                  traceback.format_exc(), keep_newlines=True)
            return self.error_reply(frame.opcode, frame.opaque, Status.EINTERNAL, "internal error")

    def _async_done(self, fut: asyncio.Future) -> None:
        self._waiting = None
        if self._closing or fut.cancelled():
            return
        reply = fut.result()
        if reply is not None:
            self.writer.write(reply)
        self._process()
        self.writer.flush()
        if self._waiting is None and not self.writer.paused:
            self._resume_reading()

    def _log_bad_input(self, e: ProtocolError) -> None:
        """The connection closes for input that cannot be trusted: an audit event (invalid packet,
        rate-limited like every per-request line)."""
        self.audit(INVALID_PACKET, bucket=self.bucket.name if self.bucket is not None else "",
                   reason=f"closing the connection: {e}")
        if self.debug:
            self.server.debug_print("bad-input", f"closing {self.peer}: {e}")

    # -- session -------------------------------------------------------------------------------
    def set_features(self, granted) -> None:
        self.features = frozenset(int(f) for f in granted)
        self.collections = Feature.COLLECTIONS in self.features
        self.mutation_seqno = Feature.MUTATION_SEQNO in self.features
        self.xerror = Feature.XERROR in self.features
        self.json = Feature.JSON in self.features
        self.xattr = Feature.XATTR in self.features
        self.dedupe_nmvb = Feature.DEDUPE_NOT_MY_VBUCKET_CLUSTERMAP in self.features
        self.unordered = Feature.UNORDERED_EXECUTION in self.features

    def set_user(self, user: "User | None") -> None:
        """A (re-)authentication starts a new privilege context with no bucket (rbac.md). Another
        user on a connection that was authenticated is audited (privileges changed)."""
        if user is not None and self.user is not None and user.name != self.user.name:
            self.audit(PRIVILEGES_CHANGED, user=user.name, previous_user=self.user.name,
                       dcp=self.dcp is not None)
        self.user = user
        self.server.set_system(self, user is not None and self.server.is_system_user(user))
        self.server.set_authenticated(self, user is not None)
        self.select_bucket(None)

    def reload_user(self, user: "User | None") -> None:
        """The definition of this connection's user changed (user management, server.user_changed):
        a new privilege context at once, on the bucket selected, as kv_engine rebuilds a stale one
        (https://github.com/couchbase/kv_engine/blob/master/daemon/connection.cc,
        getPrivilegeContext). A user no longer defined keeps the connection but no privilege: every
        command that needs one answers EACCESS; DCP streams without DcpProducer end (LostPrivileges)."""
        if self.user is None:
            return
        self.user = user if user is not None else User(self.user.name)  # no roles: no privileges
        self.server.set_system(self, user is not None and self.server.is_system_user(user))
        self.privileges = int(self.user.privileges(self.bucket.name if self.bucket is not None else None))
        self._refresh_ready()
        if self.dcp is not None:
            self.dcp.privileges_changed()

    def select_bucket(self, bucket) -> None:
        self.bucket = bucket
        self.known_config = None  # the map the client holds was another bucket's (or none)
        self.get_vbucket = bucket.engine.get_vbucket if bucket is not None else None  # hot-path shortcut
        if self.user is None:
            self.privileges = 0
        else:
            self.privileges = int(self.user.privileges(bucket.name if bucket is not None else None))
        self._refresh_ready()
        if self.dcp is not None:
            self.dcp.privileges_changed()


class _Durability:
    """A request's durability frame info (durable.py makes the request a sync write)."""

    __slots__ = ("payload",)

    def __init__(self, payload: bytes):
        self.payload = payload
