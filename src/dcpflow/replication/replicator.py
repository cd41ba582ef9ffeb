"""Replicator: one relayed DCP connection pair from a source node to a destination node.

rebalance.md ("Initial Stream Handshake"): the cluster manager opens a producer connection on the
node with the active vbuckets and a consumer connection on the node with the replicas, under the
same connection name, and proxies between them. It then sends ADD_STREAM(vb) to the consumer for
each vbucket; the consumer's STREAM_REQ travels back through the proxy to the producer, and the
stream flows the other way. One pair carries every vbucket replicated from that source to that
destination ("it is considered bad practice to have a connection per stream"); a takeover uses a
pair of its own.
"""

import asyncio
import json
import logging
from collections.abc import Callable

from dcpflow.dcp.position import RESUMABLE_ENDS
from dcpflow.protocol import dcp as dcpproto
from dcpflow.protocol.dcp import OpenFlag, StreamEndReason
from dcpflow.protocol.frame import Frame
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .link import Link, LinkError

log = logging.getLogger("dcpflow.replication")

#: The producer side: xattrs travel with the documents, deletions carry their delete time and
#: expirations their own opcode (the consumer asks `enable_expiry_opcode`, which needs it).
PRODUCER_FLAGS = OpenFlag.PRODUCER | OpenFlag.INCLUDE_XATTRS | OpenFlag.INCLUDE_DELETE_TIMES
#: Stream ends after which the consumer requests the stream again by itself (dcp/consumer.py,
#: as kv_engine's PassiveStream does): the stream stays this replicator's. Counting it as ended
#: made the cluster's reconcile send ADD_STREAM again, which the consumer refused (KEY_EEXISTS)
#: every second, and left the vbucket out of `streams`, so a later map change did not close it.
#: If the consumer's own request then fails, it closes its connection (dcp/consumer.py), and
#: `on_lost` makes the manager add every stream again.
CONSUMER_RETRIES = RESUMABLE_ENDS


def node_name(host: str, port: int) -> str:
    """A node's name in replication chains (SET_VBUCKET topology) and as a DCP consumer_name."""
    return f"{host}:{port}"


class Replicator:
    """See the module docstring. `src`/`dst` are (host, port); `on_stream_end(vb, reason)` hears
    of every STREAM_END the producer sends; `on_lost(self)` of either connection dropping."""

    def __init__(self, name: str, src: tuple[str, int], dst: tuple[str, int], *, bucket: str, user: str,
                 password: str, on_stream_end: Callable[[int, int], None] | None = None,
                 on_lost: Callable[["Replicator"], None] | None = None):
        self.name = name
        self.src, self.dst = src, dst
        self.bucket = bucket
        self._user, self._password = user, password
        self.producer: Link | None = None
        self.consumer: Link | None = None
        self.streams: set[int] = set()  # vbuckets whose ADD_STREAM succeeded and that have not ended
        self.adding: set[int] = set()
        self._on_stream_end = on_stream_end
        self._on_lost = on_lost
        self._ends: dict[int, asyncio.Future] = {}
        self.closed = False

    def __repr__(self) -> str:
        return f"<Replicator {self.name} streams={len(self.streams)}>"

    async def start(self, timeout: float = 10.0) -> "Replicator":
        try:
            self.producer = await self._open(self.src, PRODUCER_FLAGS, "producer", timeout)
            # The consumer's DCP_CONTROLs follow its DCP_OPEN reply at once: the consumer Link holds
            # them until it is linked to the producer, just below.
            # Its consumer_name is the destination's node name, the one the vbuckets' chains list:
            # the consumer enables sync writes and acknowledges prepares under it.
            self.consumer = await self._open(self.dst, 0, "consumer", timeout,
                                             json.dumps({"consumer_name": node_name(*self.dst)}).encode())
        except BaseException:
            self.close()
            raise
        self.consumer.link(self.producer)
        self.producer.link(self.consumer)
        self.producer.watch(Opcode.DCP_STREAM_END, self._stream_end)
        for link in (self.producer, self.consumer):
            link.on_lost.append(self._lost)
        return self

    async def _open(self, where: tuple[str, int], flags: int, role: str, timeout: float, value: bytes = b"") -> Link:
        link = await Link.open(where[0], where[1], label=f"{self.name} ({role} {where[0]}:{where[1]})",
                               timeout=timeout)
        try:
            await link.login(self._user, self._password, self.bucket, timeout=timeout)
            await link.call(dcpproto.DcpOpen(self.name.encode(), flags, value), timeout, check=True, what="DCP_OPEN")
        except BaseException:
            link.close()
            raise
        return link

    @property
    def alive(self) -> bool:
        return not self.closed and self.producer is not None and self.producer.alive and \
            self.consumer is not None and self.consumer.alive

    def _stream_end(self, frame: Frame) -> None:
        end = dcpproto.DcpStreamEnd.from_frame(frame)
        if end.reason not in CONSUMER_RETRIES:
            self.streams.discard(end.vbucket)
        fut = self._ends.pop(end.vbucket, None)
        if fut is not None and not fut.done():
            fut.set_result(end.reason)
        if self._on_stream_end is not None:
            self._on_stream_end(end.vbucket, end.reason)

    def _lost(self, link: Link) -> None:
        if self.closed:
            return
        self.close()
        for fut in self._ends.values():
            if not fut.done():
                fut.set_result(StreamEndReason.DISCONNECTED)
        self._ends.clear()
        if self._on_lost is not None:
            self._on_lost(self)

    async def add_stream(self, vb: int, flags: int = 0, timeout: float = 60.0) -> None:
        """ADD_STREAM to the consumer; returns once the producer accepted the consumer's request."""
        if not self.alive:
            raise LinkError(f"{self.name}: not connected")
        self.adding.add(vb)
        if flags & dcpproto.StreamFlag.TAKEOVER:
            self._ends[vb] = asyncio.get_running_loop().create_future()
        try:
            await self.consumer.call(dcpproto.DcpAddStream(vb, flags), timeout, check=True,
                                     what=f"ADD_STREAM vb {vb}")
        except BaseException:
            self._ends.pop(vb, None)
            raise
        finally:
            self.adding.discard(vb)
        self.streams.add(vb)

    async def wait_stream_end(self, vb: int, timeout: float) -> int:
        """The reason of the STREAM_END of a takeover stream added with add_stream."""
        fut = self._ends.get(vb)
        if fut is None:
            raise LinkError(f"{self.name}: no takeover stream for vbucket {vb}")
        return await asyncio.wait_for(fut, timeout)

    async def close_stream(self, vb: int, timeout: float = 10.0) -> None:
        """Close the vbucket's stream on both sides (rebalance.md, "Closing Streams")."""
        self.streams.discard(vb)
        if not self.alive:
            return
        for link in (self.producer, self.consumer):
            try:
                reply = await link.call(dcpproto.DcpCloseStream(vb), timeout)
            except LinkError:
                if self.alive:
                    raise
                return  # a connection went meanwhile, and every stream of this replicator with it
            if reply.status not in (Status.SUCCESS, Status.KEY_ENOENT):
                raise LinkError(f"{link.label}: CLOSE_STREAM vb {vb} failed with status 0x{reply.status:x}",
                                reply.status)

    def close(self) -> None:
        self.closed = True
        for link in (self.producer, self.consumer):
            if link is not None:
                link.close()
