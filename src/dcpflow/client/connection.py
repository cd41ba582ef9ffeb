"""One TCP (or TLS) connection to a node: requests matched to replies by opaque, the bootstrap the
official SDKs do, and - once DCP_OPEN made it a DCP connection - the byte path of the stream.

Reading (`buffer_updated`) only walks frame headers. Replies complete their request at once, a
DCP_NOOP is answered at once (so a busy application never looks dead to the producer), and stream
messages are left in the received bytes: the connection hands the consumer a `Segment` - the
bytes plus the offsets of its stream frames - and decodes nothing. The consumer decodes later,
as events or straight into Arrow columns (batches.py), and tells the connection how many bytes
it has consumed; the connection turns that into DCP_BUFFER_ACKNOWLEDGEMENTs (flow-control.md),
which is what makes the application's pace the producer's pace.

The receive buffer is framing.py's (the one buffered framing protocol, which the cluster manager's
relay uses too), and the Segments point into it: a received byte is copied once, by the kernel.
"""

import array
import asyncio
import contextlib
import functools
import json
import logging
import os
import ssl
import time
from collections.abc import Callable
from typing import NamedTuple

from dcpflow.protocol import kv as kvproto
from dcpflow.protocol.config import ClusterMap, parse_cluster_map
from dcpflow.protocol.dcp import STREAM_OPCODES, DcpBufferAck, DcpControl, DcpNoop, DcpOpen, OpenFlag
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import (
    HEADER_LEN,
    Frame,
    Magic,
    decode_all,
    frame_head,
    opcode_table,
    request,
    unframe_stream_id,
    walk_sid_stream,
    walk_stream,
)
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .errors import (
    AuthenticationError,
    BucketError,
    ConnectError,
    ConnectionLostError,
    ServerError,
    status_name,
)
from .framing import FramedProtocol, dial, fail_waiter
from .sasl import ScramClient, plain_payload

log = logging.getLogger("dcpflow.client")

#: The frames a Segment carries: the messages a producer sends on a stream.
_IS_STREAM = opcode_table(STREAM_OPCODES)
MAX_BODY = 64 * 1024 * 1024  # a 20 MB document plus xattrs and headroom

#: HELLO features we ask for: what a 7.x SDK DCP client negotiates that we understand.
FEATURES = (Feature.TCP_NODELAY, Feature.XERROR, Feature.SELECT_BUCKET, Feature.JSON, Feature.COLLECTIONS,
            Feature.XATTR, Feature.ALT_REQUEST_SUPPORT)

_now = time.monotonic


class Segment(NamedTuple):
    """Stream frames received together: `starts` are their offsets in `data`; `charged` is what
    the producer counted against the flow-control window for them (their wire size)."""

    conn: "Connection"
    data: bytes | bytearray  # the receive buffer (never written again below `end`)
    starts: array.array
    end: int  # offset just past the last stream frame
    charged: int


class RawRequest(NamedTuple):
    """A request with no typed class in dcpflow.protocol (e.g. GET_FAILOVER_LOG 0x96)."""

    opcode: int
    vbucket: int = 0
    extras: bytes = b""
    key: bytes = b""
    value: bytes = b""
    opaque: int = 0

    def encode(self) -> bytes:
        return request(self.opcode, key=self.key, extras=self.extras, value=self.value, vbucket=self.vbucket,
                       opaque=self.opaque)


class Connection(FramedProtocol):
    """A connection to one node. Create with `open_connection`."""

    error = ConnectionLostError

    def __init__(self, address: tuple[str, int], label: str = ""):
        super().__init__(label or f"{address[0]}:{address[1]}")
        self.address = address
        self._pending: dict[int, asyncio.Future | Callable[[Frame], None]] = {}
        self._opaque = 0x10000
        self._cork: list[bytes] | None = None  # sends held by corked()
        self.sink: Callable[[Segment], None] | None = None
        # With DCP stream-ids (enable_stream_id): the sink of each stream-id. Several reads then
        # share this connection, each under its own id (stream-request-value.md, "sid").
        self.sinks: dict[int, Callable[[Segment], None]] | None = None
        self._pausers: set = set()  # who asked to pause reading (a shared connection has several)
        self.on_lost: Callable[[Connection, BaseException | None], None] | None = None
        self.closed_by_us = False
        self.connected = asyncio.get_running_loop().create_future()
        self.last_rx = _now()
        self.rx_bytes = 0
        self.noops = 0
        self.features: tuple[int, ...] = ()
        self.collections = False
        # flow control
        self.buffer_size = 0
        self.ack_threshold = 0
        self._unacked = 0
        self.acked_total = 0
        self.charged_total = 0  # stream-message bytes received (what the producer counts)
        self.max_outstanding = 0  # the most ever received and not yet acknowledged
        self.paused = False
        self.retired = False  # its counters were folded into a Feed's stats

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if not self.connected.done():
            self.connected.set_result(None)

    def connection_lost(self, exc) -> None:
        if self.lost is None:
            self.lost = exc or ConnectionLostError(f"{self.label}: connection closed by the server")
        err = self._lost_error()
        pending, self._pending = self._pending, {}
        for waiter in pending.values():
            if isinstance(waiter, asyncio.Future):
                fail_waiter(waiter, err)
            else:
                try:
                    waiter(None)
                except Exception:  # a callback must not stop us from failing the others
                    log.exception("%s: reply callback failed on connection loss", self.label)
        if not self.connected.done():
            self.connected.set_exception(err)
        if self.on_lost is not None:
            self.on_lost(self, None if self.closed_by_us else err)

    def _lost_error(self) -> ConnectionLostError:
        """What a request on this lost connection fails with."""
        if isinstance(self.lost, ConnectionLostError):
            return self.lost
        return ConnectionLostError(f"{self.label}: connection lost ({self.lost})")

    def pause_reading(self, owner=None) -> None:
        """Stop reading until every `owner` that paused has resumed: a connection shared by
        several reads stays paused while any of them has too much queued."""
        self._pausers.add(owner)
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def resume_reading(self, owner=None) -> None:
        self._pausers.discard(owner)
        if self.paused and not self._pausers and self.transport is not None:
            self.paused = False
            self.last_rx = _now()
            self.transport.resume_reading()

    def buffer_updated(self, nbytes: int) -> None:
        self.last_rx = _now()
        self.rx_bytes += nbytes
        super().buffer_updated(nbytes)

    def frames_received(self, buf: bytearray, pos: int, end: int) -> tuple[int, int]:
        """Replies and noops at once; runs of stream messages as Segments to the sink (or, with
        stream-ids, to each id's sink)."""
        first = pos
        ctrl = 0
        starts = array.array("q")
        routed: dict[int, list] | None = None  # stream-id -> its runs: [classic frames, their starts, charged]
        is_stream, walk, head = _IS_STREAM, walk_stream, frame_head
        sinks = self.sinks
        limit = end - HEADER_LEN
        need = seg_end = 0
        try:
            while pos <= limit:
                if sinks is not None:  # stream-ids: the run of stream messages, in classic framing
                    at = pos
                    pos, data, run_starts, sids = walk_sid_stream(buf, pos, is_stream, end)
                    if data:
                        if routed is None:
                            routed = {}
                        self._route_run(data, run_starts, sids, routed)
                        ctrl += pos - at
                # The stream messages up to the next other frame; the one at pos now is incomplete,
                # or a reply, a noop or garbage.
                pos, run = walk(buf, pos, is_stream, end)
                if run:
                    if sinks is not None:
                        self.broken(ProtocolError("a stream message without a stream-id on a connection with "
                                                  "enable_stream_id"))
                        return pos, 0
                    starts.frombytes(run)
                    seg_end = pos
                if pos > limit:
                    break
                try:
                    fend = head(buf, pos, end, MAX_BODY)[4]
                except ProtocolError as e:
                    self.broken(e)
                    return pos, 0
                if fend > end:
                    need = fend - pos
                    break
                if sinks is not None and buf[pos] == Magic.ALT_REQUEST and is_stream[buf[pos + 1]]:
                    if routed is None:
                        routed = {}
                    if not self._route(buf, pos, fend, routed):
                        return pos, 0
                elif not self._control(buf, pos, fend):
                    return pos, 0
                ctrl += fend - pos
                pos = fend
        finally:
            if starts and self.lost is None:
                charged = pos - first - ctrl  # the walked bytes that were not replies or noops
                self.charged_total += charged
                outstanding = self.charged_total - self.acked_total
                if outstanding > self.max_outstanding:
                    self.max_outstanding = outstanding
                if self.sink is None:
                    self.abort(ConnectionLostError(f"{self.label}: DCP message before DCP_OPEN"))
                else:
                    self.sink(Segment(self, buf, starts, seg_end, charged))
            if routed and self.lost is None:
                self._deliver_routed(routed)
        return pos, need

    def _route_run(self, data: bytes, starts: bytes, sids: bytes, routed: dict[int, list]) -> None:
        """A run of stream messages from walk_sid_stream: to their stream-ids' runs. Each message
        was 3 bytes longer on the wire (its stream-id FrameInfo), which is what the producer
        charged. A run of one stream-id (one read busy at a time) stays as it is; an interleaved
        one is split per stream-id."""
        at = array.array("q")
        at.frombytes(starts)
        ids = array.array("q")
        ids.frombytes(sids)
        first = ids[0]
        if ids.count(first) == len(ids):
            routed.setdefault(first, []).append([data, at, len(data) + 3 * len(at)])
            return
        parts: dict[int, list] = {}
        ends = at[1:].tolist() + [len(data)]
        for a, b, sid in zip(at, ends, ids, strict=True):
            part = parts.get(sid)
            if part is None:
                part = parts[sid] = [bytearray(), array.array("q"), 0]
            part[1].append(len(part[0]))
            part[0] += data[a:b]
            part[2] += b - a + 3
        for sid, part in parts.items():
            routed.setdefault(sid, []).append(part)

    def _route(self, buf, pos: int, fend: int, routed: dict[int, list]) -> bool:
        """A stream message with a stream-id the run walker left (framing extras with more than
        the stream-id): to its id's runs, in classic framing."""
        try:
            sid, frame = unframe_stream_id(buf, pos, fend)
        except ProtocolError as e:
            self.abort(ConnectionLostError(f"{self.label}: malformed stream message from the server: {e}"))
            return False
        routed.setdefault(sid, []).append([frame, array.array("q", [0]), fend - pos])
        return True

    def _deliver_routed(self, routed: dict[int, list]) -> None:
        """Hand each stream-id's runs to its read. The producer counted their wire size (with
        the stream-id frame) against the window, so that is what each Segment charges; the frames
        of an id no read holds any more (it closed its streams, the server had sent these
        already) are acknowledged at once, or they would shrink the shared window for good."""
        for sid, runs in routed.items():
            sink = self.sinks.get(sid)
            for data, starts, charged in runs:
                self.charged_total += charged
                if sink is None:
                    self.consumed(charged)
                else:
                    sink(Segment(self, data, starts, len(data), charged))
        outstanding = self.charged_total - self.acked_total
        if outstanding > self.max_outstanding:
            self.max_outstanding = outstanding

    def _control(self, buf: bytes, pos: int, fend: int) -> bool:
        """Handle a reply or a connection-level request; False if it broke the connection."""
        try:
            frame = decode_all(buf[pos:fend])[0]
        except ProtocolError as e:
            self.abort(ConnectionLostError(f"{self.label}: malformed frame from the server: {e}"))
            return False
        if frame.is_response:
            waiter = self._pending.pop(frame.opaque, None)
            if waiter is None:
                log.debug("%s: reply to unknown opaque 0x%x (opcode 0x%02x)", self.label, frame.opaque, frame.opcode)
            elif isinstance(waiter, asyncio.Future):
                if not waiter.done():
                    waiter.set_result(frame)
            else:
                waiter(frame)
            return True
        if frame.magic == Magic.REQUEST and frame.opcode == Opcode.DCP_NOOP:
            self.noops += 1
            self.send(DcpNoop(frame.opaque).response())
        elif frame.magic == Magic.REQUEST and frame.opcode == Opcode.DCP_SET_VBUCKET_STATE:
            self.send(kvproto.error_response(frame.opcode, Status.SUCCESS, frame.opaque))
        else:
            log.debug("%s: ignoring server request magic 0x%02x opcode 0x%02x", self.label, frame.magic,
                      frame.opcode)
        return True

    # -- sending -----------------------------------------------------------------------------
    def next_opaque(self) -> int:
        self._opaque = (self._opaque + 1) & 0xFFFFFFFF or 0x10000
        return self._opaque

    def send(self, data: bytes) -> None:
        if self._cork is not None:
            self._cork.append(data)
        else:
            super().send(data)

    @contextlib.contextmanager
    def corked(self):
        """Sends inside the block leave as one write when it ends: a burst of pipelined requests
        (a failover log per vbucket, the DCP controls) costs one syscall, not one each, and
        reaches the server in few reads. What was sent leaves even if the block raises: its
        replies are awaited."""
        if self._cork is not None:  # nested: the outer block writes
            yield
            return
        self._cork = []
        try:
            yield
        finally:
            parts, self._cork = self._cork, None
            if parts:
                self.send(parts[0] if len(parts) == 1 else b"".join(parts))

    def request(self, message, callback: Callable[[Frame | None], None] | None = None) -> asyncio.Future | None:
        """Send a typed request (its opaque is replaced) and return a future of the reply Frame;
        with `callback`, call it with the reply inside the read path instead (None if the
        connection is lost first), so it runs before any later stream message is queued."""
        if self.lost is not None:
            raise self._lost_error()
        opaque = self.next_opaque()
        data = message._replace(opaque=opaque).encode()
        if callback is None:
            waiter = asyncio.get_running_loop().create_future()
            self._pending[opaque] = waiter
            self.send(data)
            return waiter
        self._pending[opaque] = callback
        self.send(data)
        return None

    async def call(self, message, timeout: float | None = 30.0) -> Frame:
        return await asyncio.wait_for(self.request(message), timeout)

    async def call_many(self, messages, timeout: float | None = 30.0) -> list[Frame]:
        """Pipeline requests (one write) and return their replies in order, within one timeout
        for all. Replies land through callbacks, not a future each: asking 1024 vbuckets for
        their failover logs is on the critical path of every streaming query's planning."""
        replies: list[Frame | None] = [None] * len(messages)
        left = len(messages)
        done = asyncio.get_running_loop().create_future()

        def landed(i: int, frame: Frame | None) -> None:
            nonlocal left
            if frame is None:  # the connection was lost first
                if not done.done():
                    done.set_exception(self._lost_error())
                return
            replies[i] = frame
            left -= 1
            if not left and not done.done():
                done.set_result(None)

        if not messages:
            return []
        with self.corked():
            for i, message in enumerate(messages):
                self.request(message, callback=functools.partial(landed, i))
        async with asyncio.timeout(timeout):
            await done
        return replies

    # -- flow control ------------------------------------------------------------------------
    def consumed(self, nbytes: int) -> None:
        """The application is done with `nbytes` of stream messages: ack them once enough add up."""
        if not self.buffer_size:
            return
        self._unacked += nbytes
        if self._unacked >= self.ack_threshold:
            self.flush_acks()

    def flush_acks(self) -> None:
        if self._unacked and self.lost is None:
            n, self._unacked = self._unacked, 0
            while n:
                part = min(n, 0xFFFFFFFF)
                self.send(DcpBufferAck(part).encode())
                self.acked_total += part
                n -= part

    # -- closing -----------------------------------------------------------------------------
    def close(self) -> None:
        self.closed_by_us = True
        super().close()


async def connect_once(pending: dict, key, make: Callable):
    """What `make()` returns for `key`, made by one task that concurrent callers share: reads that
    reopen their streams together after a node went away must not open a connection each."""
    task = pending.get(key)
    if task is None:
        task = asyncio.create_task(make())
        pending[key] = task
        task.add_done_callback(lambda _t: pending.pop(key, None))
    return await asyncio.shield(task)


def tls_context(ca_file: str | None, verify: str = "peer") -> ssl.SSLContext:
    try:
        ctx = ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as e:
        raise ConnectError(f"cannot load CA file {ca_file!r}: {e}") from None
    if verify == "none":
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


async def open_connection(host: str, port: int, *, tls: ssl.SSLContext | None = None,
                          timeout: float = 10.0, label: str = "") -> Connection:
    return await dial(lambda: Connection((host, port), label or f"{host}:{port}"), host, port, error=ConnectError,
                      tls=tls, timeout=timeout)


def _fail(what: str, conn: Connection, frame: Frame) -> ServerError:
    ctx = kvproto.error_context(frame)
    return ServerError(f"{conn.label}: {what} failed with {status_name(frame.status)}" + (f": {ctx}" if ctx else ""),
                       frame.status)


class BootstrapResult(NamedTuple):
    features: tuple[int, ...]
    cluster_map: ClusterMap | None
    raw_map: bytes


async def bootstrap(conn: Connection, *, username: str, password: str, bucket: str | None,
                    mechanism: str = "SCRAM-SHA512", agent: str = "dcpflow", timeout: float = 10.0,
                    fetch_map: bool = True, features: tuple[int, ...] | None = None) -> BootstrapResult:
    """HELLO, SASL, SELECT_BUCKET and GET_CLUSTER_CONFIG, pipelined as the official SDKs do.
    `features` are what HELLO asks for (default FEATURES, read at call time; a writer adds
    MUTATION_SEQNO to learn where its writes landed)."""
    agent_json = json.dumps({"a": f"{agent}/dcpflow-client", "i": os.urandom(8).hex()}).encode()
    hello = conn.request(kvproto.Hello(agent_json, tuple(FEATURES if features is None else features)))
    if mechanism == "PLAIN":
        auth = conn.request(kvproto.SaslAuth(b"PLAIN", plain_payload(username, password)))
        scram = None
    else:
        scram = ScramClient(mechanism, username, password)
        auth = conn.request(kvproto.SaslAuth(mechanism.encode(), scram.first()))
    try:
        reply = await asyncio.wait_for(hello, timeout)
        if reply.status != Status.SUCCESS:
            raise _fail("HELLO", conn, reply)
        conn.features = kvproto.HelloResponse.from_frame(reply).features
        conn.collections = Feature.COLLECTIONS in conn.features
        reply = await asyncio.wait_for(auth, timeout)
        if scram is not None and reply.status == Status.AUTH_CONTINUE:
            reply = await conn.call(kvproto.sasl_step(mechanism.encode(), scram.final(reply.value)), timeout)
            if reply.status == Status.SUCCESS:
                scram.verify(reply.value)
        if reply.status != Status.SUCCESS:
            ctx = kvproto.error_context(reply)
            if reply.status == Status.AUTH_ERROR:
                hint = ctx if ctx and ctx != "Authentication failed" else "wrong username or password"
                raise AuthenticationError(f"{conn.label}: authentication as {username!r} with {mechanism} failed: "
                                          f"{hint}")
            raise AuthenticationError(f"{conn.label}: SASL {mechanism} failed with {status_name(reply.status)}"
                                      + (f": {ctx}" if ctx else ""))
        selected = config = None
        if bucket is not None:
            selected = conn.request(kvproto.SelectBucket(bucket.encode()))
        if fetch_map:
            config = conn.request(kvproto.GetClusterConfig())
        if selected is not None:
            reply = await asyncio.wait_for(selected, timeout)
            if reply.status in (Status.KEY_ENOENT, Status.NO_BUCKET):
                raise BucketError(f"{conn.label}: bucket {bucket!r} does not exist")
            if reply.status == Status.EACCESS:
                raise BucketError(f"{conn.label}: user {username!r} may not access bucket {bucket!r} (or it does "
                                  f"not exist)")
            if reply.status != Status.SUCCESS:
                raise _fail(f"SELECT_BUCKET {bucket!r}", conn, reply)
        cmap, raw = None, b""
        if config is not None:
            reply = await asyncio.wait_for(config, timeout)
            if reply.status == Status.SUCCESS and reply.value:
                raw = reply.value
                try:
                    cmap = parse_cluster_map(raw, host=conn.address[0])
                except ProtocolError as e:
                    raise ServerError(f"{conn.label}: unusable cluster map: {e}") from None
            elif bucket is not None and reply.status not in (Status.SUCCESS, Status.NO_BUCKET):
                raise _fail("GET_CLUSTER_CONFIG", conn, reply)
        return BootstrapResult(conn.features, cmap, raw)
    except TimeoutError:
        raise ConnectError(f"{conn.label}: bootstrap did not finish within {timeout:g}s") from None


#: DCP_OPEN flags: a producer for us, with delete times so that expirations arrive as their own
#: opcode (`enable_expiry_opcode` has no effect without IncludeDeleteTimes).
OPEN_FLAGS = OpenFlag.PRODUCER | OpenFlag.INCLUDE_DELETE_TIMES


async def open_dcp(conn: Connection, name: str, *, buffer_size: int, noop_interval: float,
                   include_xattrs: bool = False, timeout: float = 10.0, history: bool = False,
                   sync_writes: bool = False, stream_ids: bool = False) -> dict[str, int]:
    """DCP_OPEN and the controls a production client sends (https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/recommended-apis.md).
    Required controls failing is fatal; optional ones are reported in the returned dict. With
    collections, system events are asked for as FlatBuffers (they then include modify-collection
    and the history setting; a server that refuses sends the legacy structs), and `history` asks
    for change streams (`change_streams`, 7.2+), which is then required. `stream_ids` asks for
    `enable_stream_id` (optional: the caller reads the result). `include_xattrs` opens with
    IncludeXattrs: values arrive with their xattrs."""
    flags = OPEN_FLAGS | OpenFlag.INCLUDE_XATTRS if include_xattrs else OPEN_FLAGS
    reply = await conn.call(DcpOpen(name.encode(), flags), timeout)
    if reply.status != Status.SUCCESS:
        if reply.status == Status.EACCESS:
            raise BucketError(f"{conn.label}: this user may not open a DCP stream (needs the DcpStream / "
                              f"dcp_reader role)")
        raise _fail("DCP_OPEN", conn, reply)
    required = [(b"connection_buffer_size", str(buffer_size).encode()), (b"enable_noop", b"true"),
                (b"set_noop_interval", f"{noop_interval:g}".encode()),
                (b"send_stream_end_on_client_close_stream", b"true"),
                (b"enable_expiry_opcode", b"true")]
    if sync_writes:  # prepares, commits and aborts too (a tool's choice: readers see committed data by default)
        required.append((b"enable_sync_writes", b"true"))
    # A slow reader may have its checkpoint cursor dropped (its stream goes back to disk, which the
    # client handles like any disk snapshot) rather than pin the server's checkpoint memory.
    optional = [(b"set_priority", b"medium"), (b"supports_cursor_dropping_vulcan", b"true")]
    if stream_ids:  # several streams per vbucket, each named by its sid (shared.py); refused by old servers
        optional.insert(0, (b"enable_stream_id", b"true"))
    if conn.collections:
        optional.append((b"max_marker_version", b"2.2"))
        optional.append((b"flatbuffers_system_events", b"true"))
        if history:
            required.append((b"change_streams", b"true"))
    with conn.corked():
        futures = [(k, v, conn.request(DcpControl(k, v))) for k, v in required + optional]
    results = {}
    for key, value, fut in futures:
        reply = await asyncio.wait_for(fut, timeout)
        results[key.decode()] = reply.status
        if reply.status != Status.SUCCESS and (key, value) in required:
            raise _fail(f"DCP_CONTROL {key.decode()}={value.decode()}", conn, reply)
    conn.buffer_size = buffer_size
    conn.ack_threshold = max(1, int(buffer_size * 0.2))  # kv_engine's consumers ack at 20% of their buffer
    return results
