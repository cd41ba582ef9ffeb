"""The server: the listener, the buckets it serves, and the periodic work the engine needs.

The engine has no timers and is owned by one thread (engine/bucket.py): this event loop. So the
server runs three background tasks on it:

* the flusher - every `flush_interval`, persist each bucket in batches: the batch is collected on
  the loop, written to SQLite on a worker thread (`Flusher.write` touches no engine state), and
  completed on the loop, so clients keep being served while the disk works; with nothing to
  flush for a second it seals the store's unfinished runs (store.py), so data at rest
  backfills from them; and once nothing is left to flush it purges the documents of dropped
  collections from disk (their drop events are persisted by then);
* the expiry pager - every `expiry_interval`, turn due documents into expirations;
* compaction - every `compaction_interval`, purge tombstones older than `purge_interval`; and
  whenever a bucket's store is fragmented - more than `fragmentation_threshold` of its rows are
  older versions kept for rollback (checked every FRAGMENTATION_CHECK_INTERVAL after writes, as
  ns_server's auto-compaction checks databaseFragmentationThreshold) - also trim that history to
  HISTORY_KEPT of the documents. The store's work runs on the flusher's thread;
* the item pager - whenever a bucket is over its high watermark (checked every PAGER_INTERVAL,
  after each flush batch, and at once when a write is refused for memory), evict values in passes
  of a few thousand entries, yielding to the loop between them (engine/memory.py); and when
  writes are refused because checkpoints fill their quota, recover checkpoint memory once for
  all of them (Bucket.recover_checkpoint_memory), as kv_engine's CheckpointMemRecoveryTask does.

A lock serialises a flush batch and compaction (compaction requires no batch in flight).

Connections: the KV listeners accept for the server (listener.py), which holds up to
`max_connections` + `system_connections` connections. Like kv_engine's system connections
(https://github.com/couchbase/kv_engine/blob/master/docs/Connections.md), the reserve is counted
after authentication: at most `max_connections` connections may be authenticated as users other
than administrators and the cluster manager (is_system_user); one more is told ETMPFAIL and closed
(session.py). A connection that has not authenticated holds a slot only until someone needs it:
with every slot taken, a new connection closes the oldest unauthenticated one (or, with none, is
closed itself, as memcached's "disconnect" policy does), and any unauthenticated connection is
closed `auth_timeout` seconds after it was accepted (kv_engine drops connections that do not
authenticate in time). So idle strangers can never take the reserve: while it is not full of
administrators, an administrator can always connect. The management port does the same with its
own HTTP connections (server/mgmt/app.py). Both limits are lowered at start to fit the
descriptor limit (RLIMIT_NOFILE) together, after FD_HEADROOM for the buckets' files, backfill
readers and the listening sockets (connection_limits). Running out of descriptors anyway pauses
accepting and is logged once per interval (boundedlog.py); a maintenance task that cannot open a
file backs off and says so once per interval, without a traceback.

Failed logins on either port are throttled per source address and per user (throttle.py), and
every security event goes to the audit trail (audit.py).

Beside the KV port the server runs its management listener (server/mgmt: the REST API the SDKs'
management calls use, /metrics, the /ui/ page) on the port the map advertises as `mgmt`. Through
it buckets come and go at run time (`create_bucket`, `drop_bucket`, `flush_bucket` below); the
buckets created that way are listed in `<data_dir>/buckets.json`, so a restart serves them again.

Shutdown (`close()`, SIGTERM/SIGINT in the CLI): stop listening, close client connections, let the
background tasks finish what they are doing, then close every bucket cleanly - flush everything and
write the clean-shutdown mark, so the next start creates no failover entry. A `kill -9` skips all
that: the next start finds no mark, loses only what was never flushed, and every active vbucket
gets a new failover entry (engine warm-up).

In-process use (tests, the DCP work): `async with Server(ServerConfig(data_dir=...)) as srv: srv.port`.
"""

import asyncio
import collections
import gc
import json
import logging
import os
import resource
import shutil
import socket
import ssl
import sys
import time
import uuid as uuidlib
from dataclasses import dataclass
from pathlib import Path

from dcpflow.engine import Bucket, VBucketState
from dcpflow.protocol import error_map
from dcpflow.protocol.config import Node

from .audit import Audit
from .auth import Privilege, UserDB
from .backfill import BackfillScheduler
from .background import (  # noqa: F401 - the constants are the server's settings (tests and docs name them here)
    HISTORY_KEPT,
    MAINTENANCE_MAX_BACKOFF,
    PAGER_INTERVAL,
    SEAL_AFTER_IDLE,
    SEAL_VBUCKETS,
    Background,
    out_of_files,
)
from .bg_fetch import BgFetcher
from .boundedlog import BoundedLog, RateLimiter, printable
from .commands import COMMANDS, READ_AHEAD
from .connection import Connection
from .counters import Counters
from .dcp_commands import DcpNames
from .faults import Faults
from .listener import Listener, listening_sockets
from .mgmt import ROUTERS, ManagementListener
from .session import SERVER_VERSION
from .throttle import FIRST_LOCKOUT, FREE_FAILURES, LoginThrottle
from .topology import Topology

log = logging.getLogger("dcpflow.server")


@dataclass
class ServerConfig:
    """Everything `dcpflow server` can be told. `users` None means one admin, Administrator/password."""

    data_dir: str | Path
    host: str = "127.0.0.1"
    port: int = 11210
    buckets: tuple[str, ...] = ("default",)
    num_vbuckets: int | None = None  # None: as the bucket was created (1024 for a new one)
    conflict_resolution: str | None = None  # None: as the bucket was created (seqno for a new one)
    flush_interval: float = 0.1
    flusher_nice: int = 10  # the flusher thread runs this many nice levels below the server (0: equal)
    purge_interval: float = 259_200.0  # tombstone purge age (seconds), ep-engine's 3 days
    compaction_interval: float = 3600.0
    fragmentation_threshold: float | None = 0.3  # compact once this share of stored rows is history (None: never)
    expiry_interval: float = 10.0
    users: UserDB | str | Path | None = None
    synchronous: str = "FULL"  # SQLite: FULL survives power loss, NORMAL survives kill -9
    debug: bool = False
    nodes: list[Node] | None = None  # the cluster (None: just this node); see topology.py
    this_node: int = 0
    tls_cert: str | Path | None = None  # with tls_key: also serve TLS on tls_port (kvSSL in the map)
    tls_key: str | Path | None = None
    tls_port: int = 11207
    checkpoint_max_items: int = 10_000
    checkpoint_memory_quota: int | None = None  # bytes of checkpoint memory per vbucket; over it, cursors drop
    # Each bucket's memory quota (bytes; None: unlimited), unless the management API gave it one
    # (ramQuotaMB): kv_engine's and ns_server's default of 100 MiB.
    memory_quota: int | None = 100 * 1024 * 1024
    # Each bucket's eviction policy (engine/eviction.py: "valueOnly" or "fullEviction"), unless the
    # management API gave it one; None: as the bucket was (valueOnly for a new one).
    eviction_policy: str | None = None
    dcp_idle_timeout: float = 360.0  # a DCP producer with noops disconnects after this long without input
    # Client connections, and the reserve beyond them for administrators and the cluster manager
    # (ns_server's defaults are 60000 and 5000); lowered at start to fit the descriptor limit.
    max_connections: int = 60_000
    system_connections: int = 16
    # HTTP connections the management port keeps open at once (lowered to fit the descriptor limit)
    mgmt_max_connections: int = 1_000
    # Seconds a connection has to authenticate (KV) or send its first request (HTTP) before it is closed
    auth_timeout: float = 5.0
    # Seconds an HTTP connection may stay idle between requests
    http_idle_timeout: float = 60.0
    # Failed logins per address or user before they are locked out, and the first lockout (throttle.py);
    # login_failures 0: no throttling
    login_failures: int = FREE_FAILURES
    login_lockout: float = FIRST_LOCKOUT
    # PLAIN sends the password in clear: like Couchbase Server, offer it only inside TLS unless allowed here.
    plain_over_tcp: bool = False
    # HTTP management (REST, /metrics, /ui/): None = 8091 (with TLS also 18091) when free, else a free
    # port; 0 = a free port; any other number must be free. The map advertises what was bound.
    mgmt_port: int | None = None
    mgmt_tls_port: int | None = None
    audit_log: str | Path | None = None  # also write the audit trail (audit.py) to this file, as JSON lines


#: The buckets created through the management API (served again after a restart).
CREATED_BUCKETS_FILE = "buckets.json"
USERS_OVERLAY_FILE = "users-managed.json"  # auth.UserDB.attach_overlay
#: Seconds between two looks at the rate-limited logs (an interval that ended writes its summary).
LOG_TICK = 1.0
#: Seconds between two measures of a bucket's fragmentation (only after the flusher wrote; and no
#: sooner than FRAGMENTATION_COST_PACE times the CPU the last one took: background.py).
FRAGMENTATION_CHECK_INTERVAL = 10.0
#: Descriptors kept for everything but client connections: each bucket's store (the database, its
#: WAL and shared memory, pooled backfill readers), the listening sockets, the audit file, pipes.
FD_HEADROOM = 128
#: When the descriptors do not cover every requested connection, the management port gets at
#: least this share of what FD_HEADROOM leaves (and at least MGMT_MIN_CONNECTIONS); KV the rest.
MGMT_SHARE = 1 / 8
MGMT_MIN_CONNECTIONS = 16
def connection_limits(kv: int, reserve: int, mgmt: int, nofile: int | None = None) -> tuple[int, int]:
    """(KV client connections, HTTP connections) a server may hold: as requested, lowered so that
    with the KV reserve and FD_HEADROOM both fit the soft descriptor limit together (each at least 1)."""
    if nofile is None:
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if nofile == resource.RLIM_INFINITY:
        return kv, mgmt
    budget = nofile - FD_HEADROOM
    if kv + reserve + mgmt <= budget:
        return kv, mgmt
    mgmt = max(1, min(mgmt, max(MGMT_MIN_CONNECTIONS, int(budget * MGMT_SHARE), budget - reserve - kv)))
    return max(1, min(kv, budget - reserve - mgmt)), mgmt


class ServerBucket:
    """A bucket as the server serves it: the engine Bucket plus its cluster-map identity, counters,
    the persistence switch and the waiters of SEQNO_PERSISTENCE."""

    def __init__(self, server: "Server", engine: Bucket):
        self.server = server
        self.engine = engine
        self.name = engine.name
        self.uuid = engine.store.get_meta("bucket_uuid")
        if self.uuid is None:
            self.uuid = uuidlib.uuid4().hex
            engine.store.set_meta("bucket_uuid", self.uuid)
        self.counters = Counters()
        self.bg_fetcher = BgFetcher(engine.store)  # reads of documents not in memory (bg_fetch.py)
        # Settings the management API keeps for this bucket (server/mgmt/buckets.py owns their meaning);
        # its RAM quota is the engine's memory quota.
        self.settings: dict = json.loads(engine.store.get_meta("mgmt_settings") or "{}")
        if "storageBackend" not in self.settings and self._kept_history():
            # made before buckets had a storage backend, and keeping history: it is a magma bucket
            self.settings["storageBackend"] = "magma"
            engine.store.set_meta("mgmt_settings", json.dumps(self.settings, sort_keys=True))
        if "ramQuotaMB" in self.settings:
            engine.set_memory_quota(int(self.settings["ramQuotaMB"]) * 1024 * 1024)
        engine.memory.on_high = server.wake_pager
        self._apply_settings()
        self.persistence_paused = False
        self.compactions = self.fragmentation_compactions = self.fragmentation_checks = 0
        self.checked_at_items = -1  # the flusher's count when fragmentation was last measured
        self.fragmentation = None  # the last Store.fragmentation() measured
        self.fragmentation_measures = 0  # Store.fragmentation() calls of the check
        self.fragmentation_due = 0.0  # monotonic time the next measure may run (background.py)
        self.flushed_at = 0.0  # monotonic time of the last batch the flusher wrote (seal_runs waits)
        self.recovered_at = 0.0  # monotonic time the pager task last recovered checkpoint memory
        self.tmp_oom_seen = 0  # the engine's ETMPFAIL count when the flusher last collected a batch
        self._waiters: dict[int, list[tuple[int, asyncio.Future]]] = {}
        engine.add_persistence_listener(self._on_persisted)

    def config(self) -> bytes:
        return self.server.topology.bucket_config(self.name, self.uuid, self._local_map, self.engine.manifest.uid,
                                                  history=self.keeps_history)

    def _kept_history(self) -> bool:
        return bool(self.settings.get("historyRetentionSeconds") or self.settings.get("historyRetentionBytes")
                    or any(c.history for scope in self.engine.manifest.scopes for c in scope.collections))

    @property
    def keeps_history(self) -> bool:
        """Collections of this bucket may keep history: its storage is magma, as Couchbase requires
        (server/mgmt/buckets.py; dcpflow's one store serves both backends)."""
        return self.settings.get("storageBackend") == "magma"

    def save_settings(self, settings: dict) -> None:
        self.engine.store.set_meta("mgmt_settings", json.dumps(settings, sort_keys=True))
        self.settings = dict(settings)
        if "ramQuotaMB" in settings:
            self.engine.set_memory_quota(int(settings["ramQuotaMB"]) * 1024 * 1024)
            self.server.wake_pager()
        self._apply_settings()
        # the map's capabilities follow the storage backend; the streaming endpoints send the change
        self.server.topology.bump()

    def _apply_settings(self) -> None:
        """The management settings the engine acts on: history retention and the eviction policy
        (server/mgmt/buckets.py)."""
        policy = self.settings.get("evictionPolicy")
        if policy is not None and policy != self.engine.eviction_policy:
            self.engine.set_eviction_policy(policy)
        history = self.keeps_history  # only a magma bucket keeps history (mgmt/buckets.py)
        self.engine.history_retention_seconds = self.settings.get("historyRetentionSeconds", 0) if history else 0
        self.engine.history_retention_bytes = self.settings.get("historyRetentionBytes", 0) if history else 0

    def _local_map(self) -> list[list[int]]:
        """Single-node map from local states: active vbuckets here, every other one without an active."""
        me = self.server.topology.this_node
        vbs = self.engine.vbuckets
        return [[me] if (vb := vbs.get(i)) is not None and vb.state == VBucketState.ACTIVE else [-1]
                for i in range(self.engine.num_vbuckets)]

    def wait_persisted(self, vbid: int, seqno: int) -> asyncio.Future:
        """A future done once the vbucket has persisted `seqno`: done already when it has. A caller
        checks the persisted seqno when a request arrives and asks for this future later, from a
        task; a flush that completed in between has told its listeners already, so a future kept
        only for the next flush would wait for one that may never come (SEQNO_PERSISTENCE then
        timed out on a seqno persisted long before)."""
        fut = asyncio.get_running_loop().create_future()
        vb = self.engine.vbuckets.get(vbid)
        if vb is not None and vb.persisted_seqno >= seqno:
            fut.set_result(vb.persisted_seqno)
        else:
            self._waiters.setdefault(vbid, []).append((seqno, fut))
        return fut

    def _on_persisted(self, vbid: int, persisted: int) -> None:
        waiters = self._waiters.get(vbid)
        if not waiters:
            return
        keep = []
        for seqno, fut in waiters:
            if fut.done():
                continue
            if seqno <= persisted:
                fut.set_result(persisted)
            else:
                keep.append((seqno, fut))
        self._waiters[vbid] = keep


class Server:
    """See the module docstring."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.version = SERVER_VERSION
        users = config.users
        if users is None:
            self.users = UserDB.default()
        elif isinstance(users, UserDB):
            self.users = UserDB(users.users.values())  # this server's own: its changes are its own
        else:
            self.users = UserDB.load(users)
        # users made, changed or dropped through the management API, kept across restarts
        self.users.attach_overlay(Path(config.data_dir) / USERS_OVERLAY_FILE)
        self.buckets: dict[str, ServerBucket] = {}
        self.connections: set[Connection] = set()
        self.total_connections = 0
        self.max_connections = config.max_connections  # what start() admits (connection_limits)
        self.mgmt_max_connections = config.mgmt_max_connections
        self.system_count = 0  # connections authenticated as administrators (they use the reserve first)
        # connections not (or no longer) authenticated -> when they became so, oldest first
        self.unauthenticated: collections.OrderedDict[Connection, float] = collections.OrderedDict()
        self.refused_connections: dict[str, int] = {
            "limit": 0, "reserve": 0, "descriptors": 0, "unauthenticated_evicted": 0, "auth_timeout": 0,
            "http_limit": 0, "http_evicted": 0, "http_timeout": 0}
        self.throttle = LoginThrottle(config.login_failures, config.login_lockout)  # failed logins (throttle.py)
        self.work = Background(self)  # the flusher, the item pager, expiry, compaction (background.py)
        # accepted sockets whose Connection is not made yet (a TLS handshake, or the loop's next pass)
        # -> the task making it: each counts against the limit until connection_made counts it instead
        self._opening: dict[Connection, asyncio.Task] = {}
        self.started = time.time()
        self.topology: Topology | None = None
        self.port: int | None = None
        self.tls_port: int | None = None
        self.mgmt = ManagementListener(self, ROUTERS)  # its ports: mgmt.port, mgmt.tls_port
        self.faults = Faults(self)  # fault injection (server/faults), served by the management listener
        self._listener: Listener | None = None
        self._tls_listener: Listener | None = None
        self._tasks: list[asyncio.Task] = []
        self._error_maps: dict[int, bytes] = {}
        self.commands = COMMANDS  # opcode -> Command: what every connection answers (commands.py)
        self.read_ahead = READ_AHEAD  # what runs on the requests behind one that waits (commands.py)
        self.dcp_names = DcpNames()  # a DCP connection name opened again closes the older connection
        self.passive_streams: dict = {}  # (bucket, vbid) -> the live PassiveStream replicating it
        self.backfills = BackfillScheduler()  # DCP backfill threads and their server-wide limits
        # Per-request warnings and the audit trail of refusals, each rate-limited (boundedlog.py, audit.py)
        # running out of descriptors (accepting, maintenance): once per interval
        self.log = BoundedLog(log, kind_samples={"descriptors": 1, "maintenance-descriptors": 1})
        self.audit = Audit(config.audit_log)
        self._debug_limiter = None
        self.closed = False

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> "Server":
        cfg = self.config
        work = self.work
        work.open(cfg.flusher_nice)
        try:
            # Bound first (a port in use fails before any bucket is created in the data dir), serving
            # only once the buckets are open and the map (which needs the bound ports) exists.
            self._listener = Listener(listening_sockets(cfg.host, cfg.port), None, self._admit, self._exhausted)
            if cfg.tls_cert is not None:
                self._tls_listener = Listener(listening_sockets(cfg.host, cfg.tls_port), self._tls_context(),
                                              self._admit, self._exhausted)
            self.mgmt.bind(cfg.host, cfg.mgmt_port, cfg.mgmt_tls_port,
                           self._tls_context() if cfg.tls_cert is not None else None)
            for name in dict.fromkeys([*cfg.buckets, *self._created_buckets()]):
                self.buckets[name] = ServerBucket(self, self._open_bucket(name))
        except BaseException:
            for listener in (self._listener, self._tls_listener):
                if listener is not None:
                    listener.close()
            self.mgmt.unbind()
            self._close_buckets(clean=True)
            work.shutdown()
            raise
        # Warm-up loaded every document as a long-lived object; a full collection walks all of
        # them and stalls the loop for as long. Freeze them out of the collector's generations:
        # only objects created from now on are walked. Freezing also makes the collector think the
        # old generation is small, so consider a full collection only every 100 young collections
        # (not 10), or a stream of new documents would trigger one every few tens of thousands of
        # allocations.
        gc.freeze()
        gen0, gen1, _ = gc.get_threshold()
        gc.set_threshold(gen0, gen1, 100)
        self.audit.open()
        self.port = self._listener.port
        if self._tls_listener is not None:
            self.tls_port = self._tls_listener.port
        self.max_connections, self.mgmt_max_connections = connection_limits(
            cfg.max_connections, cfg.system_connections, cfg.mgmt_max_connections)
        if self.max_connections < cfg.max_connections or self.mgmt_max_connections < cfg.mgmt_max_connections:
            log.info("admitting at most %d client connections (and %d reserved) and %d HTTP connections: the "
                     "descriptor limit is %d", self.max_connections, cfg.system_connections,
                     self.mgmt_max_connections, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        me = Node(self.port, kv_ssl_port=self.tls_port, mgmt_port=self.mgmt.port, mgmt_ssl_port=self.mgmt.tls_port)
        if cfg.nodes:  # this node's entry carries the management ports it bound (the others' come with the map)
            nodes = list(cfg.nodes)
            nodes[cfg.this_node] = nodes[cfg.this_node]._replace(mgmt_port=me.mgmt_port, mgmt_ssl_port=me.mgmt_ssl_port)
        else:
            nodes = [me]
        # Stable for a data directory, so a restarted server is the same cluster to a client
        cluster_uuid = uuidlib.uuid5(uuidlib.NAMESPACE_URL, "dcpflow:" + str(Path(cfg.data_dir).resolve())).hex
        self.topology = Topology(nodes, cfg.this_node, cluster_uuid=cluster_uuid)
        for listener in (self._listener, self._tls_listener):
            if listener is not None:
                listener.start()
        await self.mgmt.start()
        self._tasks = [
            asyncio.create_task(work.flusher_task(), name="dcpflow-flusher"),
            asyncio.create_task(work.periodic(cfg.expiry_interval, work.run_expiry), name="dcpflow-expiry"),
            asyncio.create_task(work.periodic(cfg.compaction_interval, work.run_compaction),
                                name="dcpflow-compaction"),
            asyncio.create_task(work.periodic(LOG_TICK, self._tick_logs), name="dcpflow-log-summaries"),
            asyncio.create_task(work.pager_task(), name="dcpflow-item-pager"),
        ]
        if cfg.fragmentation_threshold is not None:
            self._tasks.append(asyncio.create_task(
                work.periodic(FRAGMENTATION_CHECK_INTERVAL, work.check_fragmentation), name="dcpflow-fragmentation"))
        return self

    def _tls_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.config.tls_cert, self.config.tls_key)
        return ctx

    def _open_bucket(self, name: str, *, num_vbuckets: int | None = None,
                     conflict_resolution: str | None = None) -> Bucket:
        cfg = self.config
        engine = Bucket(name, cfg.data_dir, num_vbuckets or cfg.num_vbuckets,
                        conflict_resolution or cfg.conflict_resolution,
                        flush_interval=cfg.flush_interval, purge_interval=cfg.purge_interval,
                        synchronous=cfg.synchronous, checkpoint_max_items=cfg.checkpoint_max_items,
                        checkpoint_memory_quota=cfg.checkpoint_memory_quota, memory_quota=cfg.memory_quota,
                        eviction_policy=cfg.eviction_policy)
        if not engine.vbuckets and (cfg.nodes is None or len(cfg.nodes) == 1):
            engine.create_vbuckets(range(engine.num_vbuckets), VBucketState.ACTIVE)  # a new single node owns all
        return engine

    async def close(self) -> None:
        """Stop serving and shut every bucket down cleanly (flushed, marked clean). A bucket whose
        persistence is paused (STOP_PERSISTENCE, fault injection) is flushed all the same: a pause
        holds back the flusher task, never a shutdown. Requests held by delay rules are released
        (their connections close)."""
        if self.closed:
            return
        self.closed = True
        for listener in (self._listener, self._tls_listener):
            if listener is not None:
                listener.close()
        for task in list(self._opening.values()):
            task.cancel()
        await self.mgmt.close()
        self.faults.close()
        for conn in list(self.connections):
            if conn.dcp is not None:
                conn.dcp.shutdown()  # STREAM_END(Disconnected) for every stream, written before the close
            conn.close()
        self.work.stop()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self.backfills.close()
        gc.unfreeze()  # what start() froze may be garbage now (in-process servers come and go)
        async with self.work.lock:
            self._close_buckets(clean=True)
        self.work.shutdown()
        self.log.tick()
        self.audit.tick()
        self.audit.close()

    def _close_buckets(self, clean: bool) -> None:
        for bucket in self.buckets.values():
            try:
                bucket.engine.close(clean=clean)
            except Exception:
                log.exception("closing bucket %s failed", bucket.name)

    async def __aenter__(self) -> "Server":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def serve_until(self, stop: asyncio.Event) -> None:
        await stop.wait()
        await self.close()

    # -- connections ---------------------------------------------------------------------------
    def _admit(self, sock: socket.socket, tls: ssl.SSLContext | None) -> bool:
        """A listener accepted `sock`: make it a Connection. With every slot (max_connections and
        the reserve) taken, the oldest unauthenticated connection makes room; with none, `sock` is
        closed at once. Connections still being made are unauthenticated too, but cannot be closed
        yet: `sock` is admitted beyond the limit, the oldest unauthenticated connection is closed
        once it is made (connection_made), and the listener stops for this pass (returns False)."""
        if self.closed:
            sock.close()
            return True
        n = len(self.connections) + len(self._opening)
        keep_accepting = True
        if n >= self.max_connections + self.config.system_connections and not self._evict_unauthenticated():
            if not self._opening:
                self.refused_connections["limit"] += 1
                self.log.warning("connection-limit", "refused a connection from %s: %d connections are open, all "
                                 "authenticated, and the limit (%d and %d reserved for administrators) is reached",
                                 _peer(sock), n, self.max_connections, self.config.system_connections)
                sock.close()
                return True
            keep_accepting = False
        conn = Connection(self)
        task = asyncio.get_running_loop().create_task(self._open(conn, sock, tls))
        self._opening[conn] = task
        task.add_done_callback(lambda _: self._opening.pop(conn, None))  # it failed before it was made
        return keep_accepting

    def _evict_unauthenticated(self) -> bool:
        """Close the oldest connection that has not authenticated, to make room; False if none."""
        if not self.unauthenticated:
            return False
        conn, since = self.unauthenticated.popitem(last=False)
        self.refused_connections["unauthenticated_evicted"] += 1
        self.log.warning("connection-limit", "closed the unauthenticated connection from %s (%.1f s old) to admit "
                         "a new one: all %d connections (%d of them reserved for administrators) are in use",
                         conn.peer, time.monotonic() - since, self.max_connections + self.config.system_connections,
                         self.config.system_connections)
        self.connection_lost(conn)  # its slot is free now; the transport's own callback finds it gone
        conn.drop()
        return True

    def _expire_unauthenticated(self) -> None:
        """Close the connections that have not authenticated within auth_timeout."""
        deadline = time.monotonic() - self.config.auth_timeout
        while self.unauthenticated:
            conn, since = next(iter(self.unauthenticated.items()))
            if since > deadline:
                break
            del self.unauthenticated[conn]
            self.refused_connections["auth_timeout"] += 1
            self.log.warning("auth-timeout", "closing the connection from %s: it did not authenticate within "
                             "%g s", conn.peer, self.config.auth_timeout)
            conn.close()

    async def _open(self, conn: Connection, sock: socket.socket, tls: ssl.SSLContext | None) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.connect_accepted_socket(lambda: conn, sock, ssl=tls,
                                               ssl_handshake_timeout=self.config.auth_timeout if tls else None)
        except (OSError, ssl.SSLError, TimeoutError) as e:  # a TLS handshake that failed, a peer that left
            self.log.warning("connection-setup", "a connection from %s failed before it was made: %s", _peer(sock), e)
            sock.close()

    def _exhausted(self, error: OSError) -> None:
        """A listener could not accept for lack of descriptors (or memory): it pauses, we count."""
        self.refused_connections["descriptors"] += 1
        self.log.warning("descriptors", "cannot accept connections: %s (%d connections open; the descriptor "
                         "limit is %d): accepting pauses and resumes when descriptors are free", error.strerror,
                         len(self.connections), resource.getrlimit(resource.RLIMIT_NOFILE)[0])

    @staticmethod
    def is_system_user(user) -> bool:
        """Administrators and the cluster manager (node management on some bucket) may use the reserve."""
        return user.is_admin or any(p & Privilege.NODE_MANAGEMENT for p in user.bucket_privileges.values())

    def may_stay(self, conn: Connection, user) -> bool:
        """Whether `conn` may stay authenticated as `user`: an administrator may (into the reserve);
        anyone else while fewer than max_connections other connections are authenticated as users
        that are not (kv_engine counts its system connections after authentication too)."""
        if self.is_system_user(user):
            return True
        users = len(self.connections) - self.system_count - len(self.unauthenticated)
        if conn in self.connections and not conn.system and conn not in self.unauthenticated:
            users -= 1
        return users < self.max_connections

    def set_authenticated(self, conn: Connection, authenticated: bool) -> None:
        """`conn` authenticated, or (a failed re-authentication) is no longer: the timeout of
        unauthenticated connections starts again."""
        if authenticated:
            self.unauthenticated.pop(conn, None)
        elif conn in self.connections:
            self.unauthenticated.pop(conn, None)
            self.unauthenticated[conn] = time.monotonic()

    def set_system(self, conn: Connection, system: bool) -> None:
        """`conn` is (no longer) an administrator's: the count of the reserve follows."""
        if system != conn.system and conn in self.connections:
            self.system_count += 1 if system else -1
        conn.system = system

    def connection_made(self, conn: Connection) -> None:
        # counted as opening until now, as a connection from now: its task ends a pass or two later,
        # and a socket accepted meanwhile must not see it twice (a stranger would be closed for a
        # slot that was free)
        self._opening.pop(conn, None)
        if self.closed:
            conn.transport.close()
            return
        self.connections.add(conn)
        self.unauthenticated[conn] = time.monotonic()
        self.total_connections += 1
        while len(self.connections) > self.max_connections + self.config.system_connections \
                and self._evict_unauthenticated():
            pass

    def connection_lost(self, conn: Connection) -> None:
        self.unauthenticated.pop(conn, None)
        if conn in self.connections:
            self.connections.discard(conn)
            if conn.system:
                self.system_count -= 1

    def refuse_reserved(self, conn: Connection) -> None:
        """`conn` authenticated as a user the reserve is not kept for, with the other slots taken by
        authenticated users: counted, logged."""
        self.refused_connections["reserve"] += 1
        self.log.warning("connection-limit", "closing a connection from %s: user %r is not an administrator and "
                         "the %d client connections are in use (the rest are reserved)", conn.peer,
                         conn.user.name if conn.user is not None else "", self.max_connections)

    def error_map(self, version: int) -> bytes:
        data = self._error_maps.get(version)
        if data is None:
            data = self._error_maps[version] = error_map.encode_error_map(version)
        return data

    # -- background work (background.py) -------------------------------------------------------
    @property
    def maintenance_failures(self) -> int:
        """Runs of maintenance tasks that failed."""
        return self.work.failures

    @property
    def _maintenance(self):
        """The maintenance lock (Background.lock): no flush batch, compaction or sealing in its body."""
        return self.work.lock

    def wake_flusher(self) -> None:
        if self.work.flusher_wake is not None:
            self.work.flusher_wake.set()

    def wake_pager(self) -> None:
        if self.work.pager_wake is not None:
            self.work.pager_wake.set()

    def maintenance(self):
        """Hold off flush batches, compaction and run sealing while the body rewrites a vbucket
        (a rollback, a failover): one of those already running finishes first."""
        return self.work.maintenance()

    async def flush_settled(self) -> None:
        await self.work.flush_settled()

    def when_no_flush(self, engine: Bucket, fn):
        return self.work.when_no_flush(engine, fn)

    async def seal_runs(self, bucket: "ServerBucket") -> None:
        await self.work.seal_runs(bucket)

    async def compact(self, bucket: "ServerBucket", keep_history: float | None = None) -> None:
        await self.work.compact(bucket, keep_history)


    async def _tick_logs(self) -> None:
        self.log.tick()
        self.audit.tick()
        self._expire_unauthenticated()
        self.mgmt.expire_idle()

    def debug_print(self, kind: str, text: str) -> None:
        """With `debug`: `text` on stderr, rate-limited per kind like every per-request line."""
        if not self.config.debug:
            return
        if self._debug_limiter is None:
            self._debug_limiter = RateLimiter(
                lambda k, n, s: print(f"dcpflow server: {n} more {k} lines in the last {s:.0f} s were not printed",
                                      file=sys.stderr, flush=True))
        if self._debug_limiter.allow(kind):
            print(f"dcpflow server: {printable(text)}", file=sys.stderr, flush=True)

    # -- users at run time (the management API) ------------------------------------------------
    def user_changed(self, name: str) -> None:
        """`name` was made, changed or dropped (server/mgmt/users.py): every open connection of
        that user gets a new privilege context at once (Connection.reload_user), as kv_engine
        rebuilds a stale one, and the management port forgets its logins."""
        user = self.users.get(name)
        for conn in list(self.connections):
            if conn.user is not None and conn.user.name == name:
                conn.reload_user(user)
        self.mgmt.logins.forget(name)

    # -- buckets at run time (the management API) ----------------------------------------------
    @property
    def manages_buckets(self) -> bool:
        """A node of a `dcpflow cluster` serves the bucket its cluster manager gave it; buckets
        are created, dropped and flushed at run time only on a single server."""
        return not self.config.nodes or len(self.config.nodes) == 1

    def _created_buckets(self) -> list[str]:
        path = Path(self.config.data_dir) / CREATED_BUCKETS_FILE
        try:
            return list(json.loads(path.read_text())["buckets"])
        except FileNotFoundError:
            return []
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path} is damaged ({e}): fix or remove it (it lists the buckets created "
                             f"through the management API)") from None

    def _save_created_buckets(self, names: list[str]) -> None:
        path = Path(self.config.data_dir) / CREATED_BUCKETS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"buckets": names}))
        os.replace(tmp, path)

    def create_bucket(self, name: str, *, num_vbuckets: int | None = None, conflict_resolution: str | None = None,
                      settings: dict | None = None) -> ServerBucket:
        """A new, empty bucket, served at once (the map of a single server: every vbucket active).
        ValueError if the name is taken, or its directory holds data from an earlier run that this
        server does not serve (that data is never overwritten)."""
        if not self.manages_buckets:
            raise ValueError("buckets of a dcpflow cluster are managed by its cluster manager")
        if any(n.lower() == name.lower() for n in self.buckets):
            raise ValueError("Bucket with given name already exists")
        path = Path(self.config.data_dir) / name
        if path.exists():
            raise ValueError(f"{path} holds a bucket {name!r} from an earlier run that this server does not "
                             f"serve: start the server with --bucket {name} to serve it, or remove the directory")
        engine = self._open_bucket(name, num_vbuckets=num_vbuckets, conflict_resolution=conflict_resolution)
        bucket = self.buckets[name] = ServerBucket(self, engine)
        if settings:
            bucket.save_settings(settings)
        if name not in self.config.buckets:
            self._save_created_buckets([*self._created_buckets(), name])
        self.topology.bump()
        return bucket

    async def drop_bucket(self, name: str) -> None:
        """Stop serving the bucket and delete its data. Its connections are closed, as kv_engine
        closes the connections of a deleted bucket (DCP streams end with them)."""
        if not self.manages_buckets:
            raise ValueError("buckets of a dcpflow cluster are managed by its cluster manager")
        bucket = self.buckets.pop(name)
        for conn in list(self.connections):
            if conn.bucket is bucket:
                conn.close()
        async with self.work.lock:  # no flush batch of it in flight
            bucket.engine.close(clean=False)
        created = self._created_buckets()
        if name in created:
            self._save_created_buckets([n for n in created if n != name])
        await asyncio.get_running_loop().run_in_executor(
            None, shutil.rmtree, Path(self.config.data_dir) / name)
        self.topology.bump()

    async def flush_bucket(self, name: str) -> int:
        """Empty every vbucket, as Couchbase's flush does (engine `Bucket.reset`): each gets a new
        failover log (a new vbucket UUID at seqno 0), its DCP streams end (STATE_CHANGED) and a
        consumer that resumes from where it was is told to roll back to 0. The store is emptied on
        the flusher's thread, so KV requests are served meanwhile. Returns the documents removed."""
        if not self.manages_buckets:
            raise ValueError("buckets of a dcpflow cluster are managed by its cluster manager")
        engine = self.buckets[name].engine
        async with self.work.lock:  # no flush batch in flight while the store is emptied
            if engine.closed:
                raise KeyError(name)
            await asyncio.get_running_loop().run_in_executor(self.work.executor, engine.store.clear)
            return engine.reset(store_cleared=True)


def _peer(sock: socket.socket) -> str:
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return "?"
    return f"{host}:{port}"
