"""The server: the listener, the buckets it serves, and the periodic work the engine needs.

The engine has no timers and is owned by one thread (engine/bucket.py): this event loop. So the
server runs three background tasks on it:

* the flusher - every `flush_interval`, persist each bucket in batches: the batch is collected on
  the loop, written to SQLite on a worker thread (`Flusher.write` touches no engine state), and
  completed on the loop, so clients keep being served while the disk works; with nothing to
  flush for a second it seals the store's unfinished runs (store.py), so data at rest
  backfills from them;
* the expiry pager - every `expiry_interval`, turn due documents into expirations;
* compaction - every `compaction_interval`, purge tombstones older than `purge_interval`.

A lock serialises a flush batch and compaction (compaction requires no batch in flight).

Shutdown (`close()`, SIGTERM/SIGINT in the CLI): stop listening, close client connections, let the
background tasks finish what they are doing, then close every bucket cleanly - flush everything and
write the clean-shutdown mark, so the next start creates no failover entry. A `kill -9` skips all
that: the next start finds no mark, loses only what was never flushed, and every active vbucket
gets a new failover entry (engine warm-up).

In-process use (tests, the DCP work): `async with Server(ServerConfig(data_dir=...)) as srv: srv.port`.
"""

import asyncio
import concurrent.futures
import contextlib
import gc
import logging
import os
import ssl
import sys
import threading
import time
import uuid as uuidlib
from dataclasses import dataclass
from pathlib import Path

from dcpflow.engine import Bucket, VBucketState
from dcpflow.protocol import error_map
from dcpflow.protocol.config import Node

from .auth import UserDB
from .backfill import BackfillScheduler
from .commands import COMMANDS
from .connection import Connection
from .counters import Counters
from .dcp_commands import DcpNames
from .session import SERVER_VERSION
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
    dcp_idle_timeout: float = 360.0  # a DCP producer with noops disconnects after this long without input
    # PLAIN sends the password in clear: like Couchbase Server, offer it only inside TLS unless allowed here.
    plain_over_tcp: bool = False


def _lower_thread_priority(steps: int) -> None:
    """Make the calling thread `steps` nice levels nicer than it is (Linux: a thread is a task with
    its own nice value; elsewhere setpriority would change the whole process, so nothing is done).

    The flusher runs this: a flushed row costs ~10 us of SQLite outside the GIL, on the cores that
    also run the event loop and the clients on this host. At equal priority the scheduler took turns
    between them and the loop was preempted mid-window (2 involuntary switches per 1000 SETs against
    0.1 without the flusher); a nicer flusher takes what CPU is left, and under a write storm
    checkpoint de-duplication absorbs what it has not written yet."""
    if steps <= 0 or not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + steps))
    except OSError as e:  # a sandbox may forbid it: run at the same priority
        log.warning("could not lower the flusher thread's priority: %s", e)


#: Seconds without a flush batch before the flusher seals the store's unfinished runs.
SEAL_AFTER_IDLE = 1.0


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
        self.persistence_paused = False
        self.flushed_at = 0.0  # monotonic time of the last batch the flusher wrote (seal_runs waits)
        self._waiters: dict[int, list[tuple[int, asyncio.Future]]] = {}
        engine.add_persistence_listener(self._on_persisted)

    def config(self) -> bytes:
        return self.server.topology.bucket_config(self.name, self.uuid, self._local_map)

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
            self.users = users
        else:
            self.users = UserDB.load(users)
        self.buckets: dict[str, ServerBucket] = {}
        self.connections: set[Connection] = set()
        self.total_connections = 0
        self.started = time.time()
        self.topology: Topology | None = None
        self.port: int | None = None
        self.tls_port: int | None = None
        self._listener: asyncio.AbstractServer | None = None
        self._tls_listener: asyncio.AbstractServer | None = None
        self._tasks: list[asyncio.Task] = []
        self._stopping: asyncio.Event | None = None
        self._wake: asyncio.Event | None = None
        self._maintenance: asyncio.Lock | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._error_maps: dict[int, bytes] = {}
        self.commands = COMMANDS  # opcode -> Command: what every connection answers (commands.py)
        self.dcp_names = DcpNames()  # a DCP connection name opened again closes the older connection
        self.passive_streams: dict = {}  # (bucket, vbid) -> the live PassiveStream replicating it
        self.backfills = BackfillScheduler()  # DCP backfill threads and their server-wide limits
        self.closed = False

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> "Server":
        cfg = self.config
        loop = asyncio.get_running_loop()
        self._stopping, self._wake, self._maintenance = asyncio.Event(), asyncio.Event(), asyncio.Lock()
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dcpflow-flusher",
                                                               initializer=_lower_thread_priority,
                                                               initargs=(cfg.flusher_nice,))
        try:
            # Bound first (a port in use fails before any bucket is created in the data dir), serving
            # only once the buckets are open and the map (which needs the bound ports) exists.
            self._listener = await loop.create_server(lambda: Connection(self), cfg.host, cfg.port,
                                                      reuse_address=True, start_serving=False)
            if cfg.tls_cert is not None:
                self._tls_listener = await loop.create_server(lambda: Connection(self), cfg.host, cfg.tls_port,
                                                              reuse_address=True, ssl=self._tls_context(),
                                                              start_serving=False)
            for name in dict.fromkeys(cfg.buckets):
                self.buckets[name] = ServerBucket(self, self._open_bucket(name))
        except BaseException:
            for listener in (self._listener, self._tls_listener):
                if listener is not None:
                    listener.close()
            self._close_buckets(clean=True)
            self._executor.shutdown(wait=True)
            raise
        # Warm-up loaded every document as a long-lived object; a full collection walks all of
        # them (measured with 500k documents while streaming DCP: 60-230 ms loop stalls). Freeze
        # them out of the collector's generations: only objects created from now on are walked.
        # Freezing also makes the collector think the old generation is small, so consider a full
        # collection only every 100 young collections (not 10), or a stream of new documents would
        # trigger one every ~70k allocations.
        gc.freeze()
        gen0, gen1, _ = gc.get_threshold()
        gc.set_threshold(gen0, gen1, 100)
        self.port = self._listener.sockets[0].getsockname()[1]
        if self._tls_listener is not None:
            self.tls_port = self._tls_listener.sockets[0].getsockname()[1]
        nodes = cfg.nodes or [Node(self.port, kv_ssl_port=self.tls_port)]
        self.topology = Topology(nodes, cfg.this_node)
        for listener in (self._listener, self._tls_listener):
            if listener is not None:
                await listener.start_serving()
        self._tasks = [
            asyncio.create_task(self._flusher_task(), name="dcpflow-flusher"),
            asyncio.create_task(self._periodic(cfg.expiry_interval, self._run_expiry), name="dcpflow-expiry"),
            asyncio.create_task(self._periodic(cfg.compaction_interval, self._run_compaction),
                                name="dcpflow-compaction"),
        ]
        return self

    def _tls_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.config.tls_cert, self.config.tls_key)
        return ctx

    def _open_bucket(self, name: str) -> Bucket:
        cfg = self.config
        engine = Bucket(name, cfg.data_dir, cfg.num_vbuckets, cfg.conflict_resolution,
                        flush_interval=cfg.flush_interval, purge_interval=cfg.purge_interval,
                        synchronous=cfg.synchronous, checkpoint_max_items=cfg.checkpoint_max_items,
                        checkpoint_memory_quota=cfg.checkpoint_memory_quota)
        if not engine.vbuckets and (cfg.nodes is None or len(cfg.nodes) == 1):
            for vb in range(engine.num_vbuckets):  # a new single-node bucket owns every vbucket
                engine.set_vbucket_state(vb, VBucketState.ACTIVE)
        return engine

    async def close(self) -> None:
        """Stop serving and shut every bucket down cleanly (flushed, marked clean)."""
        if self.closed:
            return
        self.closed = True
        for listener in (self._listener, self._tls_listener):
            if listener is not None:
                listener.close()
        for conn in list(self.connections):
            if conn.dcp is not None and hasattr(conn.dcp, "shutdown"):
                conn.dcp.shutdown()  # STREAM_END(Disconnected) for every stream, written before the close
            conn.close()
        self._stopping.set()
        self._wake.set()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self.backfills.close()
        gc.unfreeze()  # what start() froze may be garbage now (in-process servers come and go)
        async with self._maintenance:
            self._close_buckets(clean=True)
        self._executor.shutdown(wait=True)
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._listener.wait_closed(), 1.0)

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
    def connection_made(self, conn: Connection) -> None:
        if self.closed:
            conn.transport.close()
            return
        self.connections.add(conn)
        self.total_connections += 1

    def connection_lost(self, conn: Connection) -> None:
        self.connections.discard(conn)

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
                    if time.monotonic() - bucket.flushed_at >= SEAL_AFTER_IDLE and bucket.engine.store.unsealed():
                        await self.seal_runs(bucket)
                except Exception:
                    log.exception("flushing bucket %s failed; will retry", bucket.name)

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
        """Persist one batch of `bucket`: collect here, write on the flusher thread, complete here."""
        engine = bucket.engine
        async with self._maintenance:
            if engine.closed:
                return 0
            batch = engine.flusher.collect(engine.flush_batch_items)
            if batch is None:
                return 0
            try:
                await asyncio.get_running_loop().run_in_executor(self._executor, engine.flusher.write, batch)
            except BaseException:
                engine.flusher.abort(batch)
                raise
            engine.flusher.complete(batch)
            return batch.num_items

    async def seal_runs(self, bucket: ServerBucket) -> None:
        """The flusher has been idle for SEAL_AFTER_IDLE: make runs of the rows it left unfinished
        (store.py "Runs"), on its thread, so data at rest backfills from runs. Not at once: a
        consumer that waited for persistence is likely reading right then, and a trickle of
        writes would cut its runs small."""
        engine = bucket.engine
        async with self._maintenance:
            if not engine.closed:
                await asyncio.get_running_loop().run_in_executor(self._executor, engine.store.seal_runs)

    async def _periodic(self, interval: float, fn) -> None:
        while await self._sleep(interval, self._stopping):
            try:
                await fn()
            except Exception:
                log.exception("%s failed", fn.__name__)

    async def _run_expiry(self) -> None:
        for bucket in list(self.buckets.values()):
            bucket.engine.run_expiry_pager()

    async def _run_compaction(self) -> None:
        for bucket in list(self.buckets.values()):
            async with self._maintenance:
                bucket.engine.compact()
