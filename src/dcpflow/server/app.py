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
import concurrent.futures
import contextlib
import errno
import functools
import gc
import json
import logging
import os
import resource
import shutil
import socket
import sqlite3
import ssl
import sys
import threading
import time
import traceback
import uuid as uuidlib
from dataclasses import dataclass
from pathlib import Path

from dcpflow.engine import Bucket, VBucketState
from dcpflow.protocol import error_map
from dcpflow.protocol.config import Node

from .audit import Audit
from .auth import Privilege, UserDB
from .backfill import BackfillScheduler
from .boundedlog import BoundedLog, RateLimiter, printable
from .commands import COMMANDS
from .connection import Connection
from .counters import Counters
from .dcp_commands import DcpNames
from .faults import Faults
from .listener import Listener, listening_sockets
from .mgmt import ManagementListener
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


def _lower_thread_priority(steps: int) -> None:
    """Make the calling thread `steps` nice levels nicer than it is (Linux: a thread is a task with
    its own nice value; elsewhere setpriority would change the whole process, so nothing is done).

    The flusher runs this: its SQLite work runs outside the GIL, on the cores that also run the
    event loop and the clients on this host. At equal priority the scheduler takes turns between
    them and preempts the loop in the middle of serving requests; a nicer flusher takes what CPU is
    left, and under a write storm checkpoint de-duplication absorbs what it has not written yet."""
    if steps <= 0 or not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + steps))
    except OSError as e:  # a sandbox may forbid it: run at the same priority
        log.warning("could not lower the flusher thread's priority: %s", e)


#: Seconds without a flush batch before the flusher seals the store's unfinished runs.
SEAL_AFTER_IDLE = 1.0
#: Vbuckets one sealing transaction covers: after a backlog the store cuts the runs it deferred
#: (store.py, "Runs") in pieces, so a flush batch never waits behind all of them.
SEAL_VBUCKETS = 16
#: The buckets created through the management API (served again after a restart).
CREATED_BUCKETS_FILE = "buckets.json"
USERS_OVERLAY_FILE = "users-managed.json"  # auth.UserDB.attach_overlay
#: Seconds between two looks at the rate-limited logs (an interval that ended writes its summary).
LOG_TICK = 1.0
#: Seconds between two looks at whether a bucket is over its high watermark (engine/memory.py).
PAGER_INTERVAL = 0.1
#: Seconds between two measures of a bucket's fragmentation (only after the flusher wrote).
FRAGMENTATION_CHECK_INTERVAL = 10.0
#: The history a compaction for fragmentation keeps, as a fraction of each vbucket's documents:
#: after it, fragmentation is at most about 20%, so the next one waits for new overwrites.
HISTORY_KEPT = 0.25
#: Descriptors kept for everything but client connections: each bucket's store (the database, its
#: WAL and shared memory, pooled backfill readers), the listening sockets, the audit file, pipes.
FD_HEADROOM = 128
#: When the descriptors do not cover every requested connection, the management port gets at
#: least this share of what FD_HEADROOM leaves (and at least MGMT_MIN_CONNECTIONS); KV the rest.
MGMT_SHARE = 1 / 8
MGMT_MIN_CONNECTIONS = 16
#: The longest a failing maintenance task waits before it tries again.
MAINTENANCE_MAX_BACKOFF = 300.0


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


def out_of_files(error: BaseException) -> bool:
    """Whether `error` is the process running out of descriptors (or kernel memory for them), as
    the OS or SQLite ("unable to open database file") reports it."""
    if isinstance(error, OSError):
        return error.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS)
    if isinstance(error, sqlite3.OperationalError):
        text = str(error).lower()
        return "unable to open" in text or "too many open files" in text
    return False


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
        """The management settings the engine acts on: history retention (server/mgmt/buckets.py)."""
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
        fut = asyncio.get_running_loop().create_future()
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
        self.maintenance_failures = 0  # runs of maintenance tasks that failed (see _periodic)
        self._opening: set[asyncio.Task] = set()  # accepted sockets whose Connection is being made (TLS)
        self.started = time.time()
        self.topology: Topology | None = None
        self.port: int | None = None
        self.tls_port: int | None = None
        self.mgmt = ManagementListener(self)  # its ports: mgmt.port, mgmt.tls_port
        self.faults = Faults(self)  # fault injection (server/faults), served by the management listener
        self._listener: Listener | None = None
        self._tls_listener: Listener | None = None
        self._tasks: list[asyncio.Task] = []
        self._stopping: asyncio.Event | None = None
        self._wake: asyncio.Event | None = None
        self._wake_pager: asyncio.Event | None = None
        self._maintenance: asyncio.Lock | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._urgent_executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._error_maps: dict[int, bytes] = {}
        self.commands = COMMANDS  # opcode -> Command: what every connection answers (commands.py)
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
        self._stopping, self._wake, self._maintenance = asyncio.Event(), asyncio.Event(), asyncio.Lock()
        self._wake_pager = asyncio.Event()
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dcpflow-flusher",
                                                               initializer=_lower_thread_priority,
                                                               initargs=(cfg.flusher_nice,))
        # the same work at the server's own priority, for batches that writers wait for (flush_batch)
        self._urgent_executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dcpflow-flusher-urgent")
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
            self._executor.shutdown(wait=True)
            self._urgent_executor.shutdown(wait=True)
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
            asyncio.create_task(self._flusher_task(), name="dcpflow-flusher"),
            asyncio.create_task(self._periodic(cfg.expiry_interval, self._run_expiry), name="dcpflow-expiry"),
            asyncio.create_task(self._periodic(cfg.compaction_interval, self._run_compaction),
                                name="dcpflow-compaction"),
            asyncio.create_task(self._periodic(LOG_TICK, self._tick_logs), name="dcpflow-log-summaries"),
            asyncio.create_task(self._pager_task(), name="dcpflow-item-pager"),
        ]
        if cfg.fragmentation_threshold is not None:
            self._tasks.append(asyncio.create_task(
                self._periodic(FRAGMENTATION_CHECK_INTERVAL, self._check_fragmentation), name="dcpflow-fragmentation"))
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
                        checkpoint_memory_quota=cfg.checkpoint_memory_quota, memory_quota=cfg.memory_quota)
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
        for task in list(self._opening):
            task.cancel()
        await self.mgmt.close()
        self.faults.close()
        for conn in list(self.connections):
            if conn.dcp is not None:
                conn.dcp.shutdown()  # STREAM_END(Disconnected) for every stream, written before the close
            conn.close()
        self._stopping.set()
        self._wake.set()
        self._wake_pager.set()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self.backfills.close()
        gc.unfreeze()  # what start() froze may be garbage now (in-process servers come and go)
        async with self._maintenance:
            self._close_buckets(clean=True)
        self._executor.shutdown(wait=True)
        self._urgent_executor.shutdown(wait=True)
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
        task = asyncio.get_running_loop().create_task(self._open(sock, tls))
        self._opening.add(task)
        task.add_done_callback(self._opening.discard)
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

    async def _open(self, sock: socket.socket, tls: ssl.SSLContext | None) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.connect_accepted_socket(lambda: Connection(self), sock, ssl=tls,
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

    # -- background work -------------------------------------------------------------------------
    def wake_flusher(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _sleep(self, seconds: float, event: asyncio.Event) -> bool:
        """Sleep up to `seconds` or until `event`; False once the server is stopping."""
        if self._stopping.is_set():
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), seconds)
        return not self._stopping.is_set()

    async def _flusher_task(self) -> None:
        while await self._sleep(self.config.flush_interval, self._wake):
            self._wake.clear()
            for bucket in list(self.buckets.values()):
                if bucket.persistence_paused:
                    continue
                try:
                    while not bucket.persistence_paused and await self.flush_batch(bucket) \
                            and not self._stopping.is_set():
                        bucket.flushed_at = time.monotonic()
                        if bucket.engine.pager.wanted():
                            self._wake_pager.set()
                    if bucket.engine.dropped_collections and not bucket.persistence_paused:
                        await self.purge_collections(bucket)
                    if time.monotonic() - bucket.flushed_at >= SEAL_AFTER_IDLE and bucket.engine.store.unsealed():
                        await self.seal_runs(bucket)
                except Exception as e:
                    self._maintenance_failed(f"flushing bucket {bucket.name}", e, self.config.flush_interval)

    @contextlib.asynccontextmanager
    async def maintenance(self):
        """Hold off flush batches, compaction and run sealing while the body rewrites a vbucket
        (a rollback, a failover): one of those already running finishes first."""
        async with self._maintenance:
            yield

    async def flush_settled(self) -> None:
        """Return once no flush batch is in flight (one already writing completes first)."""
        async with self._maintenance:
            pass

    def when_no_flush(self, engine: Bucket, fn):
        """fn() at once if no flush batch of `engine` is in flight, else an awaitable of fn() run
        once none is. For changes acknowledged as durable (SET_VBUCKET, a takeover's state): a
        batch being written carries the older state row, so the engine could only queue the new
        one behind it. No await between the wait and fn(): no batch can start before its writes."""
        if engine.flusher.in_flight is None:
            return fn()

        async def after_batch():
            await self.flush_settled()
            return fn()

        return after_batch()

    async def flush_batch(self, bucket: ServerBucket) -> int:
        """Persist one batch of `bucket`: collect here, write on the flusher thread, complete here.

        The flusher thread is nicer than the server (`flusher_nice`): beside a write storm the
        loop keeps the CPU and checkpoint de-duplication absorbs what is not written yet. Under
        memory pressure that is backwards - writes are refused until the flusher has written what
        the pager may evict, the loop has nothing better to do, and on a busy host a niced thread
        gets a sliver of a core - so then the batch is written by a thread at the server's own
        priority (an unprivileged thread cannot take back the nice levels it gave up)."""
        engine = bucket.engine
        async with self._maintenance:
            if engine.closed:
                return 0
            batch = engine.flusher.collect(engine.flush_batch_items)
            if batch is None:
                return 0
            mem = engine.memory
            urgent = mem.num_tmp_oom != bucket.tmp_oom_seen or mem.writes_wait_for_flusher()
            bucket.tmp_oom_seen = mem.num_tmp_oom  # writes refused since the last batch: urgent too
            executor = self._urgent_executor if urgent else self._executor
            try:
                await asyncio.get_running_loop().run_in_executor(executor, engine.flusher.write, batch)
            except BaseException:
                engine.flusher.abort(batch)
                raise
            engine.flusher.complete(batch)
            return batch.num_items

    async def purge_collections(self, bucket: ServerBucket) -> None:
        """Nothing is left to flush: delete dropped collections' documents from disk
        (Bucket.purge_dropped_collections), between flush batches."""
        engine = bucket.engine
        async with self._maintenance:
            if not engine.closed and engine.flusher.in_flight is None:
                engine.purge_dropped_collections()

    async def seal_runs(self, bucket: ServerBucket) -> None:
        """The flusher has been idle for SEAL_AFTER_IDLE: make runs of the rows it left unfinished
        (store.py "Runs"), on its thread, so data at rest backfills from runs. Not at once: a
        consumer that waited for persistence is likely reading right then, and a trickle of
        writes would cut its runs small."""
        engine = bucket.engine
        async with self._maintenance:
            if not engine.closed:
                await asyncio.get_running_loop().run_in_executor(
                    self._executor, functools.partial(engine.store.seal_runs, max_vbuckets=SEAL_VBUCKETS))

    def wake_pager(self) -> None:
        if self._wake_pager is not None:
            self._wake_pager.set()

    async def _pager_task(self) -> None:
        """Evict values of every bucket over its high watermark, a pass at a time (module docstring)."""
        while await self._sleep(PAGER_INTERVAL, self._wake_pager):
            self._wake_pager.clear()
            for bucket in list(self.buckets.values()):
                engine = bucket.engine
                try:
                    mem, now = engine.memory, time.monotonic()
                    if not engine.closed and mem.checkpoint >= mem.checkpoint_quota \
                            and now - bucket.recovered_at >= PAGER_INTERVAL:
                        # writes are refused (BucketMemory.refusal): a recovery walks every vbucket's
                        # checkpoints, so once an interval, not once a wake; after each flush batch
                        # the bucket recovers anyway (Bucket._after_flush)
                        bucket.recovered_at = now
                        engine.recover_checkpoint_memory()
                    while not engine.closed and engine.pager.wanted() and not self._stopping.is_set():
                        _, done = engine.evict()
                        if done:
                            break
                        await asyncio.sleep(0)  # let requests run between passes
                except Exception:
                    self.log.error("pager-failure", "evicting values of bucket %s failed:\n%s", bucket.name,
                                   traceback.format_exc(), keep_newlines=True)

    async def _periodic(self, interval: float, fn) -> None:
        """fn() every `interval`; after a failure, the wait doubles with each one in a row (up to
        MAINTENANCE_MAX_BACKOFF, never below `interval`) and resets after a success."""
        failures = 0
        while await self._sleep(interval if not failures else
                                max(interval, min(interval * 2 ** failures, MAINTENANCE_MAX_BACKOFF)), self._stopping):
            try:
                await fn()
                failures = 0
            except Exception as e:
                failures += 1
                self._maintenance_failed(fn.__name__.strip("_"), e,
                                         max(interval, min(interval * 2 ** failures, MAINTENANCE_MAX_BACKOFF)))

    def _maintenance_failed(self, what: str, error: Exception, retry_in: float) -> None:
        """A background task failed: out of descriptors is said in one line (once per interval, no
        traceback: it is the node's state, not a bug); anything else with its traceback, rate-limited too."""
        self.maintenance_failures += 1
        if out_of_files(error):
            self.log.warning("maintenance-descriptors", "%s cannot open a file (%s; the descriptor limit is %d): "
                             "retrying in %.0f s", what, error, resource.getrlimit(resource.RLIMIT_NOFILE)[0],
                             retry_in)
        else:
            self.log.error("maintenance-failure", "%s failed; retrying in %.0f s:\n%s", what, retry_in,
                           traceback.format_exc(), keep_newlines=True)

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

    async def _run_expiry(self) -> None:
        for bucket in list(self.buckets.values()):
            bucket.engine.run_expiry_pager()

    async def _run_compaction(self) -> None:
        for bucket in list(self.buckets.values()):
            await self.compact(bucket)

    async def compact(self, bucket: "ServerBucket", keep_history: float | None = None) -> None:
        """One compaction of `bucket` (Bucket.compact's steps): planned here, the store's part on
        the flusher's thread (no flush batch meanwhile), the engine's part here again."""
        engine = bucket.engine
        async with self._maintenance:
            if engine.closed:  # dropped meanwhile
                return
            plan = engine.compaction_plan(keep_history=keep_history)
            results = await asyncio.get_running_loop().run_in_executor(self._executor, engine.store.compact, plan)
            engine.finish_compaction(results)
        bucket.compactions += 1

    async def _check_fragmentation(self) -> None:
        """Measure each bucket the flusher wrote to since the last look; compact a fragmented one."""
        threshold = self.config.fragmentation_threshold
        for bucket in list(self.buckets.values()):
            engine = bucket.engine
            bucket.fragmentation_checks += 1  # looks, measured or not (one at a time: tests wait for two)
            if engine.closed or engine.flusher.items_flushed == bucket.checked_at_items:
                continue
            bucket.checked_at_items = engine.flusher.items_flushed
            bucket.fragmentation = await asyncio.get_running_loop().run_in_executor(None, engine.store.fragmentation)
            if bucket.fragmentation.fraction > threshold:
                await self.compact(bucket, keep_history=HISTORY_KEPT)
                bucket.fragmentation_compactions += 1
                bucket.fragmentation = await asyncio.get_running_loop().run_in_executor(
                    None, engine.store.fragmentation)

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
        async with self._maintenance:  # no flush batch of it in flight
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
        async with self._maintenance:  # no flush batch in flight while the store is emptied
            if engine.closed:
                raise KeyError(name)
            await asyncio.get_running_loop().run_in_executor(self._executor, engine.store.clear)
            return engine.reset(store_cleared=True)


def _peer(sock: socket.socket) -> str:
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return "?"
    return f"{host}:{port}"
