"""One DCP connection per node for all of a client's reads, through DCP stream-ids.

KV-Engine's advice (https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/recommended-apis.md)
is one DCP connection per logical consumer and many streams on it rather than many connections.
With `enable_stream_id` (DCP_CONTROL) a producer takes several streams of the same vbucket on one
connection, each named by the `sid` of its stream request
(https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/commands/stream-request-value.md),
and tags every stream message with it. So a client made with `stream_ids=True` gives each read
(`events()`, `batches()`) a stream-id and carries all reads with the same connection settings
over one connection per node: two reads filtered on different collections, or started from
different positions, cost the server one DCP connection, not two.

What the reads then share, and what that means for an application:
* The flow-control window (the connection's buffer size): a read whose consumer stops taking
  data holds the window and its queue pauses the connection, so the other reads on it wait too.
  Reads meant to progress independently of each other belong on separate clients.
* The connection's fate: when it is lost, every read on it reopens its streams on a new one.

A server that refuses `enable_stream_id` (before 6.5, or a connection with sync writes, which
KV-Engine does not combine with stream-ids) gets one connection per read, as without the option;
reads with `sync_writes=True` always have their own.
"""

import asyncio
import logging
import os
from collections.abc import Callable

from dcpflow.protocol.status import Status

from .connection import Connection, Segment, connect_once, open_dcp
from .errors import ConnectionLostError

log = logging.getLogger("dcpflow.client")

MAX_SID = 0xFFFF


#: What a shared connection is opened with: (address, buffer size, noop interval, history,
#: include xattrs). Reads share one only if they agree on all of it: each is a DCP_OPEN flag or a
#: connection-wide DCP_CONTROL.
ConnKey = tuple


class SharedConnections:
    """The client's shared DCP connections, and the stream-ids of its reads."""

    def __init__(self, client):
        self.client = client
        self._conns: dict[ConnKey, Connection] = {}
        self._connecting: dict[ConnKey, asyncio.Task] = {}
        self._lost: dict[Connection, dict[int, Callable[[Connection, BaseException | None], None]]] = {}
        self._in_use: set[int] = set()
        self._next = 0
        self._refused: set[tuple[str, int]] = set()  # nodes that did not grant enable_stream_id
        self._closed = False
        self.opened = 0  # connections opened (tests and stats)

    def allocate(self) -> int:
        """A stream-id no live read of this client holds (1..65535)."""
        if len(self._in_use) >= MAX_SID:
            raise RuntimeError(f"more than {MAX_SID} reads open on one client: no stream-id is free")
        while True:
            self._next = self._next % MAX_SID + 1
            if self._next not in self._in_use:
                self._in_use.add(self._next)
                return self._next

    def free(self, sid: int) -> None:
        self._in_use.discard(sid)

    def granted(self, address: tuple[str, int]) -> bool:
        return address not in self._refused

    async def attach(self, key: ConnKey, sid: int, sink: Callable[[Segment], None],
                     on_lost: Callable[[Connection, BaseException | None], None]) -> Connection | None:
        """The shared connection for `key`, with `sid`'s segments going to `sink`; None if the node
        does not grant stream-ids (the read then opens its own connection)."""
        while True:
            conn = self._conns.get(key)
            if conn is None or conn.lost is not None:
                if key[0] in self._refused:
                    return None
                conn = await connect_once(self._connecting, key, lambda: self._open(key))
                if conn is None:
                    return None
            if conn.lost is None:
                conn.sinks[sid] = sink
                self._lost[conn][sid] = on_lost
                return conn

    def detach(self, conn: Connection, sid: int) -> None:
        """The read `sid` is done with `conn`: what the server still sends under its id is acked
        and dropped (Connection._deliver_routed)."""
        if conn.sinks is not None:
            conn.sinks.pop(sid, None)
        listeners = self._lost.get(conn)
        if listeners is not None:
            listeners.pop(sid, None)
        conn.resume_reading(sid)

    async def _open(self, key: ConnKey) -> Connection | None:
        address, buffer_size, noop_interval, history, include_xattrs = key
        conn = await self.client._connect(address)
        try:
            name = f"dcpflow:{self.client.agent}:{os.urandom(6).hex()}:{address[0]}:{address[1]}"
            results = await open_dcp(conn, name, buffer_size=buffer_size, noop_interval=noop_interval,
                                     history=history, stream_ids=True, include_xattrs=include_xattrs)
        except BaseException:
            conn.close()
            raise
        if results.get("enable_stream_id") != Status.SUCCESS:
            conn.close()
            self._refused.add(address)
            log.info("%s: the server did not grant DCP stream-ids (%s): each read opens its own connection",
                     conn.label, results.get("enable_stream_id"))
            return None
        if self._closed:
            conn.close()
            raise ConnectionLostError("client closed")
        conn.sinks = {}
        self._lost[conn] = {}
        conn.on_lost = self._on_lost
        self._conns[key] = conn
        self.opened += 1
        return conn

    def _on_lost(self, conn: Connection, error: BaseException | None) -> None:
        for key, c in list(self._conns.items()):
            if c is conn:
                del self._conns[key]
        listeners = self._lost.pop(conn, {})
        for callback in list(listeners.values()):
            callback(conn, error)

    def close(self) -> None:
        self._closed = True
        for task in list(self._connecting.values()):
            task.cancel()
        for conn in list(self._conns.values()):
            conn.close()
        self._conns.clear()
