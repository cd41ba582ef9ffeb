"""Link: the cluster manager's connection to one node - its own requests, and the relay.

ns_server talks to every node over memcached connections of its own: management commands
(SET_VBUCKET, SET_CLUSTER_CONFIG, GET_ALL_VB_SEQNOS, STAT) and, for replication, a pair of DCP
connections per (source, destination) node pair that it proxies (rebalance.md, "Initial Stream
Handshake": the consumer's stream requests "will be sent directly back to the EBucketMigrator
process which will forward them to the Producer").

A Link is the client's buffered framing protocol (dcpflow.client.framing: the transport reads into
its receive buffer) that only walks frame headers. A response to one of the manager's own requests
(matched by opcode and opaque) completes that request; everything else is relayed, as the original
bytes, to the linked peer Link - whole runs of frames at a time, each a view of the receive buffer,
so a busy stream costs one write per read and no copy of its own. Frames that arrive before the
peer is linked are kept and sent once it is. Backpressure crosses the relay: when the peer's socket
stops draining, this side stops reading. `watch(opcodes, fn)` lets the manager see relayed requests
of some opcodes (STREAM_END, to know when a stream is gone) without taking them out of the stream.
"""

import asyncio
import json
import logging
import os
from collections.abc import Callable

from dcpflow.client.framing import FramedProtocol, dial, fail_waiter
from dcpflow.client.sasl import ScramClient
from dcpflow.protocol import kv as kvproto
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import HEADER_LEN, Frame, Magic, decode_all, frame_head, opcode_table, walk_stream
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status, status_name

log = logging.getLogger("dcpflow.replication")

_RESPONSE_MAGICS = (Magic.RESPONSE, Magic.ALT_RESPONSE)
MAX_BODY = 64 * 1024 * 1024
#: Features the manager's connections ask for: no collections, so keys travel without a prefix.
FEATURES = (Feature.TCP_NODELAY, Feature.XERROR, Feature.SELECT_BUCKET, Feature.JSON, Feature.XATTR,
            Feature.ALT_REQUEST_SUPPORT)


class LinkError(Exception):
    """A node refused a request or the connection failed; the message says which and why."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def status_text(status: int) -> str:
    return f"{status_name(status)} (0x{status:02x})"


class Link(FramedProtocol):
    """See the module docstring. Create with `Link.open(host, port, ...)`."""

    error = LinkError

    def __init__(self, label: str):
        super().__init__(label)
        self.peer: Link | None = None
        self.closed = asyncio.get_running_loop().create_future()
        self._pending: dict[tuple[int, int], tuple[asyncio.Future, kvproto.StatsCollector | None]] = {}
        self._opaque = 0xC0000000  # far from the opaques nodes pick for their own requests
        self._held: list[bytes] = []  # relayed bytes waiting for the peer
        self._watch: dict[int, Callable[[Frame], None]] = {}
        # The requests (magic 0x80) relayed without a look: every opcode nobody watches.
        self._unwatched = opcode_table(range(256))
        self.on_lost: list[Callable[[Link], None]] = []
        self.bytes_relayed = 0
        self.features: tuple[int, ...] = ()
        self._trace = log.isEnabledFor(logging.DEBUG)

    def __repr__(self) -> str:
        return f"<Link {self.label}>"

    @classmethod
    async def open(cls, host: str, port: int, *, label: str = "", timeout: float = 10.0) -> "Link":
        return await dial(lambda: cls(label or f"{host}:{port}"), host, port, error=LinkError, timeout=timeout)

    # -- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        transport.set_write_buffer_limits(high=4 * 1024 * 1024)

    def connection_lost(self, exc) -> None:
        if self.lost is None:
            self.lost = exc or LinkError(f"{self.label}: connection closed by the node")
        err = LinkError(f"{self.label}: connection lost ({self.lost})")
        pending, self._pending = self._pending, {}
        for fut, _ in pending.values():
            fail_waiter(fut, err)
        if not self.closed.done():
            self.closed.set_result(None)
        for callback in list(self.on_lost):
            try:
                callback(self)
            except Exception:
                log.exception("%s: on_lost callback failed", self.label)
        peer = self.peer
        if peer is not None:
            peer.close()  # a relay with one side gone is useless: the other side goes too

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None and not self.peer.transport.is_closing():
            self.peer.transport.resume_reading()

    def frames_received(self, buf: bytearray, pos: int, end: int) -> tuple[int, int]:
        run = pos  # [run, pos) is a run of frames to relay
        view = self._rview
        pending, watch, trace = self._pending, self._watch, self._trace
        walk, head, unwatched = walk_stream, frame_head, self._unwatched
        need = 0  # what the frame at pos needs to be whole, once its header is here
        while end - pos >= HEADER_LEN:
            if not trace:  # requests nobody watches go by in one compiled walk; the rest is looked at
                pos = walk(buf, pos, unwatched, end)[0]
                if end - pos < HEADER_LEN:
                    break
            try:
                magic, opcode, vbs, opaque, fend = head(buf, pos, end, MAX_BODY)
            except ProtocolError as e:
                self.broken(e)  # nothing of this read is relayed
                return pos, 0
            if fend > end:
                need = fend - pos
                break
            if trace:
                log.debug("%s: got magic 0x%02x opcode 0x%02x opaque %#x status/vb %d", self.label, magic, opcode,
                          opaque, vbs)
            if magic in _RESPONSE_MAGICS and pending and (opcode, opaque) in pending:
                if run < pos:
                    self._relay(view[run:pos])
                self._reply(bytes(view[pos:fend]), opcode, opaque)
                run = fend
            elif watch and opcode in watch and magic not in _RESPONSE_MAGICS:
                try:
                    watch[opcode](decode_all(bytes(view[pos:fend]))[0])
                except Exception:
                    log.exception("%s: watcher of opcode 0x%02x failed", self.label, opcode)
            pos = fend
        if run < pos:
            self._relay(view[run:pos])  # a view: the buffer is never written again below `end`
        return pos, need

    def _reply(self, raw: bytes, opcode: int, opaque: int) -> None:
        fut, collector = self._pending[(opcode, opaque)]
        frame = decode_all(raw)[0]
        if collector is not None:
            if not collector.feed(frame):
                return  # more STAT frames to come
            frame = collector
        del self._pending[(opcode, opaque)]
        if not fut.done():
            fut.set_result(frame)

    def _relay(self, data) -> None:
        peer = self.peer
        if peer is None:
            self._held.append(data)
            return
        self.bytes_relayed += len(data)
        peer.send(data)

    # -- relaying --------------------------------------------------------------------------------
    def link(self, peer: "Link") -> None:
        """Relay what this side receives (and has held) to `peer`."""
        self.peer = peer
        held, self._held = self._held, []
        for data in held:
            self._relay(data)

    def watch(self, opcode: int, fn: Callable[[Frame], None]) -> None:
        self._watch[opcode] = fn
        self._unwatched = opcode_table(op for op in range(256) if op not in self._watch)

    # -- own requests ------------------------------------------------------------------------------
    def request(self, message) -> asyncio.Future:
        """Send a typed request (its opaque replaced); the future gets the reply Frame."""
        if self.lost is not None:
            raise LinkError(f"{self.label}: connection lost ({self.lost})")
        self._opaque = (self._opaque + 1) & 0xFFFFFFFF or 0xC0000000
        opaque = self._opaque
        fut = asyncio.get_running_loop().create_future()
        collector = kvproto.StatsCollector(opaque) if message.opcode == Opcode.STAT else None
        self._pending[(int(message.opcode), opaque)] = (fut, collector)
        self.send(message._replace(opaque=opaque).encode())
        return fut

    async def call(self, message, timeout: float = 30.0, *, check: bool = False, what: str = ""):
        """The reply Frame (a StatsCollector for STAT); with `check`, a non-success status raises."""
        try:
            reply = await asyncio.wait_for(self.request(message), timeout)
        except TimeoutError:
            raise LinkError(f"{self.label}: no reply to {what or Opcode(message.opcode).name} within "
                            f"{timeout:g} s") from None
        if check and reply.status != Status.SUCCESS:
            ctx = kvproto.error_context(reply) if isinstance(reply, Frame) else ""
            raise LinkError(f"{self.label}: {what or Opcode(message.opcode).name} failed with "
                            f"{status_text(reply.status)}" + (f": {ctx}" if ctx else ""), reply.status)
        return reply

    async def login(self, user: str, password: str, bucket: str | None, *, agent: str = "dcpflow-cluster",
                    timeout: float = 10.0) -> None:
        """HELLO, SASL SCRAM-SHA512 and SELECT_BUCKET, pipelined as the official SDKs do."""
        agent_json = json.dumps({"a": agent, "i": os.urandom(8).hex()}).encode()
        hello = self.request(kvproto.Hello(agent_json, FEATURES))
        scram = ScramClient("SCRAM-SHA512", user, password)
        auth = self.request(kvproto.SaslAuth(b"SCRAM-SHA512", scram.first()))
        try:
            reply = await asyncio.wait_for(hello, timeout)
            if reply.status != Status.SUCCESS:
                raise LinkError(f"{self.label}: HELLO failed with {status_text(reply.status)}", reply.status)
            self.features = kvproto.HelloResponse.from_frame(reply).features
            reply = await asyncio.wait_for(auth, timeout)
            if reply.status == Status.AUTH_CONTINUE:
                reply = await self.call(kvproto.sasl_step(b"SCRAM-SHA512", scram.final(reply.value)), timeout)
                if reply.status == Status.SUCCESS:
                    scram.verify(reply.value)
            if reply.status != Status.SUCCESS:
                raise LinkError(f"{self.label}: authentication as {user!r} failed with {status_text(reply.status)}",
                                reply.status)
            if bucket is not None:
                await self.call(kvproto.SelectBucket(bucket.encode()), timeout, check=True,
                                what=f"SELECT_BUCKET {bucket!r}")
        except TimeoutError:
            raise LinkError(f"{self.label}: login did not finish within {timeout:g} s") from None
