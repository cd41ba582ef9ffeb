"""`DcpClient`: connect with a connection string, ask for seqnos and failover logs, and read
changes as events (`events()`) or as Arrow record batches (`batches()`).

Bootstrap follows the official SDKs: the first seed that answers gets HELLO (collections, XERROR,
JSON...), SASL (SCRAM-SHA512 unless forced), SELECT_BUCKET and GET_CLUSTER_CONFIG; the map then
says which node holds each vbucket. Metadata requests go to the node that owns the vbucket, on a
KV connection kept per node; each read opens its own DCP connection per node (streams.py).
"""

import asyncio
import contextlib
import logging
import time

from dcpflow.protocol import kv as kvproto
from dcpflow.protocol.config import ClusterMap, parse_cluster_map
from dcpflow.protocol.dcp import FailoverLogResponse
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .connection import Connection, RawRequest, bootstrap, connect_once, open_connection, tls_context
from .connstr import ConnSpec, parse_connection_string
from .errors import (
    AuthenticationError,
    ConnectError,
    ConnectionLostError,
    ConnectionStringError,
    ServerError,
    status_name,
)
from .manifest import Filter, Manifest, Names
from .offsets import Offset
from .reader import BatchReader, EventStream
from .shared import SharedConnections
from .state import ClientState, StateStore
from .streams import FeedOptions

log = logging.getLogger("dcpflow.client")

DEFAULTS = {"buffer_size": 20 * 1024 * 1024, "noop_interval": 20.0, "connect_timeout": 10.0,
            "reconnect_timeout": 120.0, "dead_timeout": None, "sasl_mech_force": "SCRAM-SHA512", "tls_verify": "peer",
            "ca_file": None, "stream_ids": False, "mitigate_rollbacks": False, "persistence_poll_interval": 0.1,
            "max_held_bytes": None}


def _split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class DcpClient:
    """A client of one bucket. Use `await DcpClient.connect(...)`, or `async with` it."""

    def __init__(self, spec: ConnSpec, username: str, password: str, bucket: str, options: dict,
                 agent: str = "dcpflow", features: tuple[int, ...] | None = None):
        self.spec = spec
        self.username = username
        self.password = password
        self.bucket = bucket
        self.options = {**DEFAULTS, **options}
        self.agent = agent
        self.features = None if features is None else tuple(features)  # None: connection.FEATURES
        self.cluster_map: ClusterMap | None = None
        self._tls = tls_context(self.options["ca_file"], self.options["tls_verify"]) if spec.tls else None
        self._kv: dict[tuple[str, int], Connection] = {}
        self._kv_pending: dict[tuple[str, int], asyncio.Task] = {}
        self._map_lock = asyncio.Lock()
        self._map_time = 0.0
        self._readers: set = set()
        self._closed = False
        #: the names of every collection and scope id this client has seen (manifest.Names)
        self.names = Names()
        #: with `stream_ids`: one DCP connection per node for all reads, a stream-id each (shared.py)
        self.shared = SharedConnections(self) if self.options["stream_ids"] else None

    # -- connecting --------------------------------------------------------------------------
    @classmethod
    async def connect(cls, connstr: str, username: str | None = None, password: str | None = None, *,
                      bucket: str | None = None, agent: str = "dcpflow", features: tuple[int, ...] | None = None,
                      **options) -> "DcpClient":
        """Connect and bootstrap. Keyword `options` override the connection string's (buffer_size,
        noop_interval, connect_timeout, reconnect_timeout, sasl_mech_force, ca_file, tls_verify,
        stream_ids, mitigate_rollbacks, persistence_poll_interval, max_held_bytes). With
        `stream_ids=True` the client's reads share one DCP connection per node, each under its own
        DCP stream-id, where the server grants them (shared.py). With `mitigate_rollbacks=True`
        events() hands out only changes persisted on the active and every replica the cluster map
        lists, polled with OBSERVE_SEQNO every `persistence_poll_interval` seconds (default 0.1),
        holding at most `max_held_bytes` (default: the buffer size) meanwhile (mitigation.py).
        `features` are the HELLO features every connection asks for."""
        spec = parse_connection_string(connstr)
        bucket = bucket or spec.bucket
        if not bucket:
            raise ConnectionStringError(f"no bucket in {connstr!r}: add it as the path, e.g. "
                                        f"{spec.scheme}://{spec.hosts[0][0]}/default")
        if not username or password is None:
            raise AuthenticationError("username and password are required (the server allows no anonymous access)")
        unknown = set(options) - set(DEFAULTS)
        if unknown:
            raise TypeError(f"unknown option(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(DEFAULTS))}")
        merged = {**spec.options, **{k: v for k, v in options.items() if v is not None}}
        client = cls(spec, username, password, bucket, merged, agent, features)
        try:
            await client._bootstrap()
        except BaseException:
            await client.close()
            raise
        return client

    async def __aenter__(self) -> "DcpClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _connect(self, address: tuple[str, int], fetch_map: bool = False):
        """A new connection to `address`, authenticated, with the bucket selected."""
        timeout = self.options["connect_timeout"]
        conn = await open_connection(address[0], address[1], tls=self._tls, timeout=timeout)
        try:
            result = await bootstrap(conn, username=self.username, password=self.password, bucket=self.bucket,
                                     mechanism=self.options["sasl_mech_force"], agent=self.agent, timeout=timeout,
                                     fetch_map=fetch_map, features=self.features)
        except BaseException:
            conn.close()
            raise
        if fetch_map:
            return conn, result.cluster_map
        return conn

    async def _bootstrap(self) -> None:
        errors = []
        for host, port in self.spec.hosts:
            try:
                conn, cmap = await self._connect((host, port), fetch_map=True)
            except (ConnectError, ConnectionLostError, ServerError) as e:
                errors.append(str(e))
                continue
            if cmap is None or not cmap.vbucket_map:
                conn.close()
                errors.append(f"{host}:{port}: no vbucket map for bucket {self.bucket!r}")
                continue
            self._kv[(host, port)] = conn
            self.cluster_map = cmap
            self._map_time = time.monotonic()
            return
        raise ConnectError(f"could not bootstrap from {self.spec}: " + "; ".join(errors))

    # -- the cluster map ---------------------------------------------------------------------
    @property
    def num_vbuckets(self) -> int:
        return len(self.cluster_map.vbucket_map)

    @property
    def bucket_uuid(self) -> str | None:
        return self.cluster_map.uuid if self.cluster_map else None

    def node_for_vbucket(self, vbucket: int) -> tuple[str, int] | None:
        """(host, port) of the node with the vbucket's active copy, on the port we connect to."""
        cmap = self.cluster_map
        if not 0 <= vbucket < len(cmap.vbucket_map):
            raise ValueError(f"vbucket {vbucket} out of range: bucket {self.bucket!r} has {len(cmap.vbucket_map)}")
        index = cmap.vbucket_map[vbucket][0]
        return None if index < 0 else self._node_address(index)

    async def refresh_map(self) -> ClusterMap:
        """Fetch the cluster map again (from any reachable node, else the seeds). Callers that
        ask while a refresh is running share its result."""
        requested = time.monotonic()
        async with self._map_lock:
            if self._map_time >= requested:
                return self.cluster_map
            errors = []
            candidates = [a for a, c in self._kv.items() if c.lost is None]
            if self.cluster_map is not None:
                for i in range(len(self.cluster_map.server_list)):
                    with contextlib.suppress(ValueError, ConnectError):
                        addr = self._node_address(i)
                        if addr not in candidates:
                            candidates.append(addr)
            candidates += [h for h in self.spec.hosts if h not in candidates]
            for address in candidates:
                try:
                    conn = await self._kv_conn(address)
                    reply = await conn.call(kvproto.GetClusterConfig(), self.options["connect_timeout"])
                    if reply.status != Status.SUCCESS or not reply.value:
                        errors.append(f"{conn.label}: GET_CLUSTER_CONFIG {status_name(reply.status)}")
                        continue
                    cmap = parse_cluster_map(reply.value, host=address[0])
                except (ConnectError, ConnectionLostError, ServerError, ProtocolError, TimeoutError) as e:
                    errors.append(str(e))
                    continue
                if not cmap.vbucket_map:
                    continue
                if self.cluster_map is not None and cmap.version < self.cluster_map.version:
                    # like the SDKs: never trade a map for an older one (a node restarting during a
                    # failover serves its own stale map until the cluster manager pushes the current)
                    errors.append(f"{conn.label}: map {cmap.version} is older than {self.cluster_map.version}")
                    continue
                self.cluster_map = cmap
                self._map_time = time.monotonic()
                return cmap
            if any("is older than" in e for e in errors):
                return self.cluster_map  # reachable nodes only had older maps: ours is still the newest
            raise ConnectError("no node answered with a cluster map: " + "; ".join(errors[-4:]))

    def _node_address(self, index: int) -> tuple[str, int]:
        """Where to reach serverList[index]: its KV address, or with TLS the kvSSL port of the same
        node in nodesExt (matched by host and KV port: the two lists need not be in the same order
        on a real cluster; index order is the fallback)."""
        cmap = self.cluster_map
        host, port = _split_address(cmap.server_list[index])
        if not self.spec.tls:
            return host, port
        node = next((n for n in cmap.nodes if n.kv_port == port and n.hostname.strip("[]") == host), None)
        if node is None and index < len(cmap.nodes):
            node = cmap.nodes[index]
        if node is None or node.kv_ssl_port is None:
            raise ConnectError(f"node {cmap.server_list[index]} has no TLS KV port (kvSSL) in the cluster map")
        return host, node.kv_ssl_port

    async def kv_connection(self, address: tuple[str, int]) -> Connection:
        """The KV connection kept to a node (made on first use), for requests of the caller's own."""
        return await self._kv_conn(address)

    async def _kv_conn(self, address: tuple[str, int]) -> Connection:
        conn = self._kv.get(address)
        if conn is not None and conn.lost is None:
            return conn
        conn = await connect_once(self._kv_pending, address, lambda: self._connect(address))
        self._kv[address] = conn
        return conn

    # -- metadata ----------------------------------------------------------------------------
    def _vbucket_list(self, vbuckets) -> list[int]:
        n = self.num_vbuckets
        vbs = list(range(n)) if vbuckets is None else sorted(set(int(v) for v in vbuckets))
        bad = [v for v in vbs if not 0 <= v < n]
        if bad:
            raise ValueError(f"vbuckets {bad[:5]} out of range: bucket {self.bucket!r} has vbuckets 0..{n - 1}")
        return vbs

    async def _by_node(self, vbs: list[int]) -> dict[tuple[str, int], list[int]]:
        for attempt in range(2):
            groups: dict[tuple[str, int], list[int]] = {}
            missing = []
            for vb in vbs:
                address = self.node_for_vbucket(vb)
                if address is None:
                    missing.append(vb)
                else:
                    groups.setdefault(address, []).append(vb)
            if not missing:
                return groups
            if attempt == 0:
                await self.refresh_map()
        raise ServerError(f"vbuckets {missing[:8]} have no active copy in the cluster map (failover in progress?)")

    async def high_seqnos(self, vbuckets=None) -> dict[int, int]:
        """{vbucket: high seqno} of the active copies (GET_ALL_VB_SEQNOS, get_seqno.md)."""
        vbs = self._vbucket_list(vbuckets)
        for attempt in range(2):
            groups = await self._by_node(vbs)

            async def ask(address, group):
                conn = await self._kv_conn(address)
                reply = await conn.call(kvproto.GetAllVbSeqnos(state=kvproto.VbucketStateFilter.ACTIVE))
                if reply.status != Status.SUCCESS:
                    raise ServerError(f"{conn.label}: GET_ALL_VB_SEQNOS failed with {status_name(reply.status)}",
                                      reply.status)
                found = kvproto.GetAllVbSeqnosResponse.from_frame(reply).as_dict()
                return {vb: found[vb] for vb in group if vb in found}

            parts = await asyncio.gather(*(ask(a, g) for a, g in groups.items()))
            result = {vb: s for part in parts for vb, s in part.items()}
            missing = [vb for vb in vbs if vb not in result]
            if not missing:
                return dict(sorted(result.items()))
            if attempt == 0:
                await self.refresh_map()
        raise ServerError(f"vbuckets {missing[:8]} are not active where the cluster map says (rebalance?)")

    async def persisted_seqnos(self, vbuckets=None, uuids: dict[int, int] | None = None) -> dict[int, int]:
        """{vbucket: how far the active and every replica the cluster map lists have all persisted}
        (OBSERVE_SEQNO to each copy; mitigation.py): what a failover to any of them cannot take
        back. `uuids` {vbucket: vbucket UUID} name the branch (default: the newest failover entry);
        a vbucket a copy of which does not answer gets 0 (nothing of it is known to be safe)."""
        from .mitigation import observe_persisted
        vbs = self._vbucket_list(vbuckets)
        if uuids is None:
            logs = await self.failover_logs(vbs)
            uuids = {vb: logs[vb][0][0] if logs[vb] else 0 for vb in vbs}
        found = await observe_persisted(self, {vb: uuids[vb] for vb in vbs}, float(self.options["connect_timeout"]))
        return {vb: found.get(vb, 0) for vb in vbs}

    async def failover_logs(self, vbuckets) -> dict[int, list[tuple[int, int]]]:
        """{vbucket: [(vbuuid, seqno), ...]} newest entry first (GET_FAILOVER_LOG 0x96)."""
        vbs = self._vbucket_list(vbuckets)
        result: dict[int, list[tuple[int, int]]] = {}
        retry: list[int] = []
        for attempt in range(2):
            groups = await self._by_node([vb for vb in vbs if vb not in result])
            retry.clear()

            async def ask(address, group):
                conn = await self._kv_conn(address)
                replies = await conn.call_many([RawRequest(Opcode.GET_FAILOVER_LOG, vbucket=vb) for vb in group],
                                               self.options["connect_timeout"] * 3)
                for vb, reply in zip(group, replies, strict=True):
                    if reply.status == Status.SUCCESS:
                        result[vb] = list(FailoverLogResponse.from_frame(reply).entries)
                    elif reply.status == Status.NOT_MY_VBUCKET:
                        retry.append(vb)
                    else:
                        ctx = kvproto.error_context(reply)
                        raise ServerError(f"{conn.label}: GET_FAILOVER_LOG of vbucket {vb} failed with "
                                          f"{status_name(reply.status)}" + (f": {ctx}" if ctx else ""), reply.status)

            await asyncio.gather(*(ask(a, g) for a, g in groups.items()))
            if not retry:
                return {vb: result[vb] for vb in vbs}
            if attempt == 0:
                await self.refresh_map()
        raise ServerError(f"vbuckets {retry[:8]} answered NOT_MY_VBUCKET after a map refresh")

    async def offsets_now(self, vbuckets=None) -> dict[int, Offset]:
        """An offset at the current high seqno of each vbucket (a snapshot boundary on the
        newest branch): reading from it yields only changes made from now on."""
        vbs = self._vbucket_list(vbuckets)
        logs, highs = await asyncio.gather(self.failover_logs(vbs), self.high_seqnos(vbs))
        return {vb: Offset.at(logs[vb][0][0] if logs[vb] else 0, highs[vb]) for vb in vbs}

    @property
    def collections_enabled(self) -> bool:
        """The server negotiated HELLO Collections (7.x; dcpflow server)."""
        return any(c.collections for c in self._kv.values())

    async def manifest(self) -> Manifest:
        """The bucket's collections manifest now (GET_COLLECTIONS_MANIFEST 0xba); a server without
        collections has only `_default._default`. Its names are remembered in `names`."""
        conn = None
        for address in list(self._kv) + [self._node_address(i) for i in range(len(self.cluster_map.server_list))]:
            with contextlib.suppress(ConnectError, ConnectionLostError):
                conn = await self._kv_conn(address)
                break
        if conn is None:
            raise ConnectError("no node reachable to ask for the collections manifest")
        if not conn.collections:
            return Manifest.default()
        reply = await conn.call(RawRequest(Opcode.COLLECTIONS_GET_MANIFEST), self.options["connect_timeout"])
        if reply.status != Status.SUCCESS:
            ctx = kvproto.error_context(reply)
            raise ServerError(f"{conn.label}: GET_COLLECTIONS_MANIFEST failed with {status_name(reply.status)}"
                              + (f": {ctx}" if ctx else ""), reply.status)
        try:
            manifest = Manifest.from_json(reply.value)
        except ValueError as e:
            raise ServerError(f"{conn.label}: {e}") from None
        self.names.learn(manifest)
        return manifest

    @staticmethod
    def _filter_options(scope, collections, history, collection_ids=None) -> dict:
        flt = Filter.build(scope, collections, collection_ids)
        return {"filter": flt if flt.active else None, "history": bool(history)}

    # -- reading -----------------------------------------------------------------------------
    def _feed_options(self, rollback: str, ignore_purged_tombstones: bool, **extra) -> FeedOptions:
        return FeedOptions(rollback=rollback, ignore_purged_tombstones=ignore_purged_tombstones,
                           buffer_size=int(self.options["buffer_size"]),
                           noop_interval=float(self.options["noop_interval"]),
                           reconnect_timeout=float(self.options["reconnect_timeout"]),
                           dead_timeout=self.options["dead_timeout"], **extra)

    async def _resolve(self, vbuckets, start, end, state: StateStore | None):
        """(starts, ends, purge seqnos, loaded state) for a read."""
        vbs = self._vbucket_list(vbuckets if vbuckets is not None or not isinstance(start, dict) else start.keys())
        loaded = None
        purge: dict[int, int] = {}
        if state is not None:
            loaded = await asyncio.to_thread(state.load)
            if loaded is not None:
                loaded.check_bucket(self.bucket, self.bucket_uuid, getattr(state, "path", "state"))
                purge = dict(loaded.purge_seqnos)
        if isinstance(start, str):
            if start == "beginning":
                starts = {vb: Offset() for vb in vbs}
            elif start == "now":
                starts = await self.offsets_now(vbs)
            elif start == "saved":
                if state is None:
                    raise ValueError("start='saved' needs a state store (state=...)")
                saved = loaded.offsets if loaded is not None else {}
                starts = {vb: saved.get(vb, Offset()) for vb in vbs}
            else:
                raise ValueError(f"start must be 'beginning', 'now', 'saved' or a dict of Offsets, not {start!r}")
        elif isinstance(start, dict):
            starts = {vb: Offset.from_json(start[vb]) if vb in start else Offset() for vb in vbs}
        else:
            raise ValueError(f"start must be 'beginning', 'now', 'saved' or a dict of Offsets, not {start!r}")
        for vb, o in starts.items():
            try:
                o.check()
            except ValueError as e:
                raise ValueError(f"vbucket {vb}: {e}") from None
        if end is None:
            ends = {}
        elif end == "now":
            ends = await self.high_seqnos(vbs)
        elif isinstance(end, dict):
            ends = {int(vb): int(s) for vb, s in end.items() if int(vb) in starts}
            missing = [vb for vb in vbs if vb not in ends]
            if missing:
                raise ValueError(f"end has no seqno for vbuckets {missing[:8]}")
        else:
            raise ValueError(f"end must be None (unbounded), 'now' or a dict of seqnos, not {end!r}")
        return starts, ends, purge, loaded

    def events(self, vbuckets=None, *, start="beginning", end=None, state: StateStore | None = None,
               rollback: str = "resume", markers: bool = False, save_interval: float | None = None,
               ignore_purged_tombstones: bool = False, scope: str | None = None, collections=None,
               history: bool = False, include_xattrs: bool = False, sync_writes: bool = False) -> EventStream:
        """Changes one by one (events.py): `async for event in client.events(...)`.

        start: "beginning", "now", "saved" (from `state`), or {vbucket: Offset}; end: None
        (unbounded), "now" (the high seqnos at start) or {vbucket: seqno}. A bounded stream ends
        after the snapshot containing its end seqno, so seqnos up to that snapshot's end arrive.
        A start at or past the end still asks the server (which may answer ROLLBACK). If the
        server's history changes under the read, an end from "now" is lowered to the high seqno
        that then exists (the seqnos it named may never come back), while an explicit end is
        kept and the read waits until the new history reaches it: it is a position the caller
        chose (a planned range), and silently ending short would return less than was asked for.
        rollback: "resume" (yield a Rollback event, then continue from the rollback point) or
        "raise" (RollbackError). With `state`, offsets are saved every `save_interval` seconds
        (if given) and when the stream ends; `await stream.save()` saves on demand.

        scope / collections: stream one scope (by name), or collections by name ("scope.collection",
        a list or a comma-separated string); resolved to ids through the bucket's manifest when the
        read starts (every name must exist then; FilterError). A read by collection names follows
        them: a filtered collection dropped and made again under its name while the read runs is
        read under its new id (follow.py; the vbuckets that saw the drop then stream the names'
        scope, or everything, and the client keeps the names' collections). history: change streams
        - collections with history=true send every retained version (document events say so in
        `history` and `may_duplicate_keys`); needs a 7.2+ server.
        include_xattrs: values carry their xattrs (datatype XATTR), as a replicator needs them.

        The events are the committed versions only (what a GET can read): a sync write's value
        arrives once committed, as a Mutation or Deletion. `sync_writes=True` (for tools that
        watch sync replication) adds its Prepare, Commit and Abort events (events.py); the saved
        offsets then stay at the last safe point before an open prepare, so a resumed read gets
        the prepare again rather than a commit of a value it never saw."""
        extra = self._filter_options(scope, collections, history)
        extra["sync_writes"] = bool(sync_writes)
        extra["include_xattrs"] = bool(include_xattrs)
        if not self.options["mitigate_rollbacks"]:
            return EventStream(self, vbuckets, start, end, state, rollback, markers, save_interval,
                               ignore_purged_tombstones, extra)
        if sync_writes:
            raise ValueError("mitigate_rollbacks does not combine with sync_writes: a prepare is not a change that "
                             "persistence makes safe (read the committed versions instead)")
        if rollback != "resume":
            raise ValueError("mitigate_rollbacks needs rollback='resume': the held events above a rollback point are "
                             "dropped and the read goes on")
        from .mitigation import MitigatedStream
        inner = EventStream(self, vbuckets, start, end, state, rollback, True, save_interval,
                            ignore_purged_tombstones, extra)
        max_held = self.options["max_held_bytes"] or int(self.options["buffer_size"]) or 20 * 1024 * 1024
        inner.gate_args = (int(max_held), bool(markers))
        return MitigatedStream(inner, self, float(self.options["persistence_poll_interval"]))

    def batches(self, ranges: dict | None = None, end=None, max_rows: int = 65536, *, vbuckets=None,
                start=None, rollback: str = "raise", flush_interval: float | None = None,
                ignore_purged_tombstones: bool = False, max_bytes: int = 64 * 1024 * 1024, scope: str | None = None,
                collections=None, history: bool = False, purge_seqnos: dict[int, int] | None = None,
                sync_writes: bool = False, collection_ids=None) -> BatchReader:
        """Changes as Arrow RecordBatches of batches.SCHEMA: `async for batch in client.batches(...)`.

        `ranges` {vbucket: Offset} are the exclusive starts and `end` {vbucket: seqno} the inclusive
        ends: only rows with start < seqno <= end are returned, so a range reads the same rows each
        time (as far as de-duplication allows: a version replaced by a later one in the same
        snapshot is gone). `end` may also be "now", or None to stream without end (batches are then
        flushed after `flush_interval`, default 0.5 s). `reader.offsets` gives where each vbucket
        stands; after a complete bounded read, the offset at its end seqno. A batch also stops
        growing at about `max_bytes` of DCP messages (64 MiB). `scope`, `collections` and `history`
        as for events(), or `collection_ids` (ids resolved earlier, say by a planner: ids are never
        reused, so a collection made again under a name is not followed; ids dropped meanwhile are
        simply not read); the read's system events are in `reader.system_events`. `purge_seqnos`
        {vbucket: seqno} saved by an earlier read are sent on resume (reader.purge_seqnos has the
        current ones). `sync_writes=True` (for tools that audit durability) adds a row per
        prepare (event "prepare": its value, null for a durable delete), commit and abort ("commit",
        "abort": key and seqno; each completes the latest prepare of its key), and a committed sync
        write then arrives as its commit only, not also as a mutation."""
        if ranges is None and start is None:
            raise ValueError("batches() needs ranges={vbucket: Offset} (or start=...)")
        extra = self._filter_options(scope, collections, history, collection_ids)
        if sync_writes:
            extra["sync_writes"] = True
        return BatchReader(self, ranges if ranges is not None else start, end, max_rows, vbuckets, rollback,
                           flush_interval, ignore_purged_tombstones, max_bytes, extra, purge_seqnos)

    def group(self, name: str, *, member: int | None = None, of: int | None = None, lease: float = 10.0,
              start: str = "beginning", save_interval: float = 5.0, member_id: str | None = None, on_change=None,
              **read_options):
        """Read as one member of the consumer group `name` (groups.py): `async for event in
        client.group("indexer")`. The members share the bucket's vbuckets evenly and keep one set
        of offsets in the bucket (documents under the reserved prefix `_dcpflow:`, whose changes
        are not handed out).

        Static membership: `member=I, of=N` reads share I of N (and may be bounded, `end="now"`:
        the iteration then ends once the share is read). Dynamic (the default): members
        heartbeat through a document in the bucket; one that stops for `lease` seconds is dropped,
        and on every join, leave or death the vbuckets are rebalanced - every member stops, saves
        and acknowledges, then each reads its new share from the group's saved offsets, so no
        vbucket is read by two members and nothing is skipped. `start` ("beginning" or "now") is
        where a vbucket without a saved offset starts. `read_options` go to events() (scope,
        collections, history, include_xattrs...); `mitigate_rollbacks` applies as for events()."""
        from .groups import GroupReader
        return GroupReader(self, name, member=member, of=of, lease=lease, start=start, save_interval=save_interval,
                           member_id=member_id, on_change=on_change, read_options=read_options)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for reader in list(self._readers):
            with contextlib.suppress(Exception):
                await reader.aclose()
        if self.shared is not None:
            self.shared.close()
        for task in list(self._kv_pending.values()):
            task.cancel()
        for conn in self._kv.values():
            conn.close()
        self._kv.clear()

    def state_for(self, offsets: dict[int, Offset], purge_seqnos: dict[int, int] | None = None,
                  base: ClientState | None = None) -> ClientState:
        """The ClientState to save for these offsets (merged over `base`, e.g. what was loaded)."""
        merged = dict(base.offsets) if base is not None else {}
        merged.update(offsets)
        purge = dict(base.purge_seqnos) if base is not None else {}
        purge.update(purge_seqnos or {})
        return ClientState(self.bucket, self.bucket_uuid, self.num_vbuckets, merged, purge)

