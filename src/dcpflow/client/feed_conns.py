"""The DCP connections of one read: one per node, opened with the read's controls, watched for death.

A Feed (streams.py) streams each vbucket from the node holding its active copy, over one DCP
connection per node: its own (DCP_OPEN and the read's controls, connection.py `open_dcp`), or the
client's shared connection to that node under the read's stream-id (shared.py). Concurrent asks for
the same node wait for one connection (`connect_once`).

Dead-connection detection (dead-connections.md): the producer sends a noop every interval whatever
else it sends (as KV-Engine's code does; the page says only when idle), so a connection that
delivers nothing for the dead timeout (default 2 x the noop interval + 5 s) is aborted, and the
Feed treats it as lost. A connection paused by the read's own back-pressure is not judged.
"""

import asyncio
import time

from .connection import Connection, connect_once, open_dcp
from .errors import ClientError, ConnectionLostError, DeadConnectionError


class FeedConnections:
    """`conns` maps a node's address to the read's live connection there. `feed` is the Feed they
    serve: its options, filter, stream-id, stats and callbacks (segments, a lost connection)."""

    __slots__ = ("feed", "conns", "connecting", "dead_timeout")

    def __init__(self, feed):
        self.feed = feed
        self.conns: dict[tuple[str, int], Connection] = {}
        self.connecting: dict[tuple[str, int], asyncio.Task] = {}
        options = feed.options
        self.dead_timeout = options.dead_timeout or 2 * options.noop_interval + 5.0

    async def get(self, address: tuple[str, int]) -> Connection:
        """The read's connection to the node at `address`, opened if there is none."""
        conn = self.conns.get(address)
        if conn is not None and conn.lost is None:
            return conn
        return await connect_once(self.connecting, address, lambda: self._open(address))

    async def _open(self, address: tuple[str, int]) -> Connection:
        feed = self.feed
        opts = feed.options
        shared = feed.shared
        if shared is not None and shared.granted(address):
            key = (address, opts.buffer_size, opts.noop_interval, opts.history, opts.include_xattrs)
            conn = await shared.attach(key, feed.sid, feed.on_segment, feed.on_conn_lost)
            if conn is not None:
                self._check_collections(conn)
                if feed.closed:
                    shared.detach(conn, feed.sid)
                    raise ConnectionLostError("feed closed")
                self.conns[address] = conn
                feed.stats["shared_connections"] += 1
                return conn
        conn = await feed.client._connect(address, fetch_map=False)
        try:
            conn.sink = feed.on_segment
            conn.on_lost = feed.on_conn_lost
            self._check_collections(conn)
            await open_dcp(conn, f"{feed.name}:{address[0]}:{address[1]}", buffer_size=opts.buffer_size,
                           noop_interval=opts.noop_interval, history=opts.history,
                           sync_writes=opts.sync_writes, include_xattrs=opts.include_xattrs)
        except BaseException:
            conn.close()
            raise
        if feed.closed:
            conn.close()
            raise ConnectionLostError("feed closed")
        self.conns[address] = conn
        feed.stats["connections"] += 1
        return conn

    def _check_collections(self, conn: Connection) -> None:
        cannot = self.feed.filter.check(conn, self.feed.options.history)
        if cannot is not None:
            raise ClientError(f"{conn.label}: the server does not support collections (HELLO Collections), so "
                              f"it cannot {cannot}")

    def retire(self, conn: Connection) -> None:
        """Fold a connection's counters into the feed's stats (once; not a shared connection's,
        whose counters are every read's on it)."""
        if conn.retired or conn.sinks is not None:
            return
        conn.retired = True
        stats = self.feed.stats
        stats["max_outstanding_bytes"] = max(stats["max_outstanding_bytes"], conn.max_outstanding)
        stats["stream_bytes"] += conn.charged_total
        stats["noops"] += conn.noops

    def forget(self, conn: Connection) -> None:
        """A lost connection is no longer the read's connection to its node."""
        if self.conns.get(conn.address) is conn:
            del self.conns[conn.address]

    async def watch(self) -> None:
        """Abort every connection that has delivered nothing for the dead timeout, until the read closes."""
        period = max(0.05, min(1.0, self.dead_timeout / 4))
        feed = self.feed
        while not feed.closed:
            await asyncio.sleep(period)
            now = time.monotonic()
            for conn in list(self.conns.values()):
                if not conn.paused and conn.lost is None and now - conn.last_rx > self.dead_timeout:
                    feed.stats["dead_connections"] += 1
                    conn.abort(DeadConnectionError(f"{conn.label}: nothing received for "
                                                   f"{now - conn.last_rx:.1f}s (noops stopped): connection dead"))
