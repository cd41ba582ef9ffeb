"""The pipeline at size: N documents caught up (AvailableNow) into the change log and the Delta
state table, then live changes at a steady rate with a 1 s trigger, against the sink's own limit
measured in the same run.

1. A `dcpflow server` subprocess (quota for N documents) loaded with N documents of `dcpflow
   load`'s generator (plain SETs pipelined over dcpflow's own KV connection: `Setter`).
2. **catch-up**: `Pipeline.run_available_now()` - DCP → change log (Parquet) → Delta state
   (`MERGE INTO` in Spark; the first batch into an empty table is an append) - rows/s end to end.
   Before it, a warm-up runs the sink's path (Parquet, a Delta append and a MERGE) on 20,000
   generated rows, so neither timed run pays the JVM's first queries alone (it used to be the
   pipeline, which ran first, cold).
3. **sink limit** (the baseline): Spark writing the same rows, read from Parquet (the change log
   just written), into a second change log (Parquet) and then through the same state writer into a
   second Delta table: everything the pipeline does except reading DCP. Target: catch-up ≥ 0.5×.
4. **live**: both queries on a 1 s processing-time trigger (`Pipeline.run_live`, the product's
   live loop: a query whose Python worker missed Spark's wait is restarted from its checkpoint)
   while a writer process upserts existing documents at `--rate` writes/s for `--live` seconds
   (`Setter` again, its documents made before the clock starts: the SDK's one thread could not
   keep 5,000/s), each value carrying its write's number; then the loop drains both queries and stops.
   Freshness of a write = the end of the first state batch whose change-log version (the batch
   that brought the write: its rows' `_commit_version`) covers it - from the loop's batch reports -
   minus the time its upsert was acknowledged. p50/p99 over all writes. Target: p99 ≤ 5 s
   at 5,000 writes/s.
5. **memory**: peak RSS (VmHWM) of the Spark JVM - in local mode it is the driver and the executor
   at once - and of this driver Python process, plus the highest sampled total RSS of Spark's
   Python workers (the executors' Python side). Nothing collected on the driver grows with N.

    .venv/bin/python bench/pipeline_scale.py --docs 1000000          # 1024 vbuckets, 60 s at 5,000/s
    .venv/bin/python bench/pipeline_scale.py --smoke                 # 2,000 docs, 16 vbuckets, 5 s at 200/s
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from dcpflow.client.client import DcpClient
from dcpflow.client.workload import key_for, make_doc
from dcpflow.protocol import kv as kvproto
from dcpflow.protocol.datatype import DATATYPE_JSON
from dcpflow.protocol.keys import make_key
from dcpflow.protocol.status import Status
from dcpflow.spark.demo import EmbeddedServer


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def descendants(pid: int) -> set[int]:
    out, todo = set(), [pid]
    while todo:
        try:
            tasks = list(Path(f"/proc/{todo.pop()}/task").iterdir())
        except OSError:  # the process ended meanwhile (a Python worker, say)
            continue
        for task in tasks:
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            todo.extend(c for c in children if c not in out)
            out.update(children)
    return out


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


class MemoryWatch:
    """Samples the total RSS of Spark's Python workers every 0.5 s (they come and go); the JVM's and
    this process's peaks come from the kernel's VmHWM."""

    def __init__(self):
        self.workers_peak = 0
        # This process loaded the documents (up to 2,000 SETs in flight): its peak so far is the
        # loader's. Linux resets a process's VmHWM to its current RSS on "5"
        # written to clear_refs, so the driver's peak is the pipeline's own.
        with contextlib.suppress(OSError):
            Path("/proc/self/clear_refs").write_text("5")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def jvm(self) -> int | None:
        jvms = [p for p in descendants(os.getpid()) if b"java" in cmdline(p).split(b"\0")[0]]
        return jvms[0] if jvms else None

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            workers = [p for p in descendants(os.getpid()) if b"pyspark.daemon" in cmdline(p)
                       or b"pyspark.worker" in cmdline(p) or b"python_worker" in cmdline(p)]
            self.workers_peak = max(self.workers_peak, sum(rss_kib(p) for p in workers))

    def report(self) -> dict:
        jvm = self.jvm()
        return {"jvm_peak_mib": (rss_kib(jvm, "VmHWM") if jvm else 0) / 1024,
                "driver_python_peak_mib": rss_kib(os.getpid(), "VmHWM") / 1024,
                "python_workers_peak_mib": self.workers_peak / 1024}

    def stop(self) -> None:
        self._stop.set()


def sink_limit(spark, changelog: Path, base: Path) -> tuple[int, float]:
    """Spark writing the change log's rows from Parquet into a second change log, then through the
    state writer into a fresh Delta table: (rows, seconds)."""
    from dcpflow.spark.state import DeltaStateWriter

    copy = base / "sink-changelog"
    started = time.perf_counter()
    spark.read.parquet(str(changelog)).write.parquet(str(copy))
    rows = spark.read.parquet(str(copy))
    DeltaStateWriter(base / "sink-state").apply(rows, 0)
    seconds = time.perf_counter() - started
    return spark.read.parquet(str(copy)).count(), seconds


def warm_up(spark, base: Path, rows: int) -> float:
    """Both timed runs after the same warm-up, so neither pays the JVM's first queries (class
    loading, the JIT's early code) alone: Spark writing change-log-shaped rows to Parquet, then
    the state writer appending them to a scratch Delta table and merging a second batch into it -
    the sink's whole path, at a size where the fixed costs dominate. Seconds taken."""
    from pyspark.sql import functions as F

    from dcpflow.spark.schema import schema_ddl
    from dcpflow.spark.state import DeltaStateWriter

    started = time.perf_counter()
    schema = spark.createDataFrame([], schema_ddl("string", "STRING")).schema
    writer = DeltaStateWriter(base / "warm-state")
    for batch in range(2):
        df = spark.range(rows).select(*[
            (F.col("id") % 1024).cast("int").alias("vbucket") if f.name == "vbucket" else
            (F.col("id") + batch).alias("seqno") if f.name == "seqno" else
            F.format_string("key%08d", F.col("id")).alias("key") if f.name == "key" else
            F.lit("upsert").alias(f.name) if f.name == "_change_type" else
            F.lit(batch + 1).cast("long").alias(f.name) if f.name == "_commit_version" else
            F.lit("x" * 300).alias(f.name) if f.dataType.simpleString() == "string" else
            F.lit(0).cast(f.dataType).alias(f.name) for f in schema.fields])
        df.write.mode("overwrite").parquet(str(base / f"warm-log{batch}"))
        writer.apply(spark.read.schema(schema).parquet(str(base / f"warm-log{batch}")), batch)
    for name in ("warm-state", "warm-log0", "warm-log1"):
        shutil.rmtree(base / name, ignore_errors=True)
    return time.perf_counter() - started


class Setter:
    """Plain SETs pipelined over dcpflow's own KV connection, at most `window` in flight: what
    the bench writes with (the SDK's one thread topped out at 700-1,700 acknowledged writes/s on
    this machine, and loading 10,000,000 documents through it took 34 minutes). What is timed is
    the server's acknowledgement either way. `on_ack(n)` runs when write n is acknowledged; a
    refused or lost write fails the run."""

    def __init__(self, client, window: int):
        self.client = client
        self.window = window
        self.pending: set = set()
        self.failed: list[str] = []

    @classmethod
    async def connect(cls, connection: str, window: int = 1000) -> Setter:
        return cls(await DcpClient.connect(connection, "Administrator", "password", agent="dcpflow-bench"), window)

    async def set(self, n: int, key: str, value: bytes, on_ack=None) -> None:
        raw = key.encode()
        vb = self.client.cluster_map.vbucket_for_key(raw)
        conn = await self.client.kv_connection(self.client.node_for_vbucket(vb))
        future = conn.request(kvproto.Store(make_key(raw, 0) if conn.collections else raw, value, vbucket=vb,
                                            datatype=DATATYPE_JSON))
        future.add_done_callback(lambda f: self._done(f, n, on_ack))
        self.pending.add(future)
        while len(self.pending) >= self.window:
            await asyncio.wait(self.pending, return_when=asyncio.FIRST_COMPLETED)

    def _done(self, future, n: int, on_ack) -> None:
        self.pending.discard(future)
        frame = None if future.cancelled() or future.exception() is not None else future.result()
        if frame is not None and frame.status == Status.SUCCESS:
            if on_ack is not None:
                on_ack(n)
        else:
            why = "connection lost" if frame is None else f"status 0x{frame.status:02x}"
            self.failed.append(f"write {n}: {why}")

    async def close(self, written: int) -> None:
        try:
            if self.pending:
                await asyncio.wait(self.pending, timeout=120)
        finally:
            await self.client.close()
        if self.failed or self.pending:
            raise RuntimeError(f"{len(self.failed) + len(self.pending):,} of {written:,} writes failed or were not "
                               f"acknowledged (first: {(self.failed or ['no reply'])[0]})")


def load(connection: str, docs: int, seed: int) -> float:
    """The documents of `dcpflow load`'s generator, version 0, keys 0..docs-1; seconds taken."""
    async def run() -> None:
        setter = await Setter.connect(connection, window=2000)
        for i in range(docs):
            key = key_for(i, seed)
            await setter.set(i, key, make_doc(key, 0, seed))
            if (i + 1) % 1_000_000 == 0:
                print(f"  loaded {i + 1:,}/{docs:,}", flush=True)
        await setter.close(docs)

    started = time.monotonic()
    asyncio.run(run())
    return time.monotonic() - started


def live_writes(connection: str, docs: int, seed: int, rate: int, seconds: float, acks: dict) -> float:
    """Upsert existing documents at `rate` per second in 20 ticks a second, each value carrying its
    write's number ("w"); acks[i] = the time write i was acknowledged. Returns the seconds spent
    writing, from the first write to the last acknowledgement."""
    def acked(n: int) -> None:
        acks[n] = time.time()

    # The documents are made before the clock starts: generating one costs the writer about as
    # much as sending it, and on two cores shared with Spark and the server the writer then held
    # ~1,800 writes/s whatever it asked.
    total = int(rate * seconds) + rate
    keys = [key_for((n * 7919) % docs, seed) for n in range(total)]
    values = [make_doc(key, 1, seed)[:-1] + b',"w":%d}' % n for n, key in enumerate(keys)]

    async def run() -> float:
        setter = await Setter.connect(connection, window=5000)
        ticks, n, tick = 20, 0, 0
        per_tick = max(1, rate // ticks)
        start = time.monotonic()
        try:
            while time.monotonic() - start < seconds and n + per_tick <= total:
                for _ in range(per_tick):
                    await setter.set(n, keys[n], values[n], acked)
                    n += 1
                tick += 1
                delay = start + tick / ticks - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
        finally:
            await setter.close(n)
        return time.monotonic() - start

    return asyncio.run(run())


def _writer_process(connection: str, docs: int, seed: int, rate: int, seconds: float, out) -> None:
    """live_writes in a process of its own (not a thread beside the Spark driver's: at 10M it got
    1,792 writes/s of the 5,000 asked, sharing the driver's interpreter lock); sends back
    (acks, seconds spent writing, error or None)."""
    acks: dict[int, float] = {}
    try:
        out.send((acks, live_writes(connection, docs, seed, rate, seconds, acks), None))
    except BaseException as e:  # noqa: BLE001 - reported by the parent
        out.send((acks, 0.0, f"{type(e).__name__}: {e}"))
    finally:
        out.close()


def freshness(pipeline, reports: list, acks: dict) -> list[float]:
    """Seconds from each acknowledged write to the end of the first state batch covering it (the
    live loop's BatchReports: a state batch's `version` is the newest change-log version it merged)."""
    from pyspark.sql import functions as F

    ends = sorted((r.version, r.ended) for r in reports
                  if r.query == "state" and r.version is not None and r.ended is not None)
    brought = (pipeline.changelog().filter(F.col("_change_type") == "upsert")
               .select(F.get_json_object("value", "$.w").cast("long").alias("w"), "_commit_version")
               .filter(F.col("w").isNotNull()).groupBy("w").agg(F.min("_commit_version").alias("v")).collect())
    out = []
    for row in brought:
        ack = acks.get(row["w"])
        seen = next((t for v, t in ends if v >= row["v"]), None)
        if ack is not None and seen is not None:
            out.append(max(0.0, seen - ack))
    return out


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--vbuckets", type=int, default=1024)
    ap.add_argument("--rate", type=int, default=5000, help="live writes per second")
    ap.add_argument("--live", type=float, default=60.0, help="seconds of live writes")
    ap.add_argument("--driver-memory", default="2g")
    ap.add_argument("--event-log", metavar="DIR", help="keep Spark's event log there (where a batch's time goes: "
                    "every job and stage with its duration)")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    if args.smoke:
        args.docs, args.vbuckets, args.rate, args.live = 2000, 16, 200, 5.0
    seed = 47
    base = Path(tempfile.mkdtemp(prefix="dcpflow-scale-"))
    server = spark = watch = None
    try:
        server = EmbeddedServer(base / "server", args.vbuckets, docs=args.docs)
        connection = f"couchbase://127.0.0.1:{server.port}/default"
        print(f"loading {args.docs:,} documents ({args.vbuckets} vbuckets)...", flush=True)
        loaded = load(connection, args.docs, seed)
        print(f"loaded in {loaded:.1f}s", flush=True)

        from dcpflow.spark.pipeline import Pipeline, PipelineConfig
        from dcpflow.spark.session import local_session, stop_spark

        started = time.perf_counter()
        # --smoke: the JIT's C1 only (as the test suite's session), its figures being meaningless anyway
        spark = local_session("dcpflow-scale", driver_memory=args.driver_memory, fast_start=args.smoke,
                              conf={"spark.sql.streaming.numRecentProgressUpdates": "2000",
                                    **({"spark.eventLog.enabled": "true",
                                        "spark.eventLog.dir": Path(args.event_log).resolve().as_uri()}
                                       if args.event_log else {})})
        print(f"Spark session started in {time.perf_counter() - started:.1f}s", flush=True)
        warm = min(20_000, args.docs)
        print(f"warm-up (the sink's path on {warm:,} rows, before either run is timed): "
              f"{warm_up(spark, base, warm):.1f}s", flush=True)
        watch = MemoryWatch()
        pipeline = Pipeline(spark, PipelineConfig(connection=connection, username="Administrator",
                                                  password="password", lake=base / "lake"))
        started = time.perf_counter()
        reports = pipeline.run_available_now(lambda r: print(f"  {r.describe()}: {r.rows:,} rows in "
                                                             f"{r.seconds:.1f}s", flush=True))
        catchup = time.perf_counter() - started
        rows = sum(r.rows for r in reports if r.query == "changelog")
        state_rows = pipeline.state().count()
        print(f"catch-up: {rows:,} changes in {catchup:.1f}s = {rows / catchup:,.0f} rows/s end to end "
              f"(state: {state_rows:,} keys)", flush=True)
        if state_rows != args.docs:
            print(f"ERROR: the state holds {state_rows:,} keys, not {args.docs:,}", file=sys.stderr)
            return 1

        sink_rows, sink_seconds = sink_limit(spark, pipeline.changelog_path, base)
        print(f"sink limit: Spark Parquet → change log → Delta state, {sink_rows:,} rows in {sink_seconds:.1f}s "
              f"= {sink_rows / sink_seconds:,.0f} rows/s", flush=True)
        ratio = (rows / catchup) / (sink_rows / sink_seconds)
        print(f"catch-up / sink limit: {ratio:.2f}x (target >= 0.5)", flush=True)

        print(f"live: {args.rate:,} writes/s for {args.live:.0f}s, 1 s trigger...", flush=True)
        live_reports: list = []
        done = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            # the product's own live loop: a query whose Python worker missed Spark's 10 s to
            # connect back is restarted from its checkpoint; `done` drains both queries, then stops
            try:
                pipeline.run_live("1 second", live_reports.append, stop=done)
            except BaseException as e:  # noqa: BLE001 - reported by the main thread
                failed.append(e)

        live = threading.Thread(target=run, daemon=True)
        live.start()
        context = multiprocessing.get_context("spawn")  # no fork of a process holding a JVM gateway
        receive, send = context.Pipe(duplex=False)
        writer = context.Process(target=_writer_process, args=(connection, args.docs, seed, args.rate, args.live,
                                                               send), daemon=True)
        writer.start()
        send.close()
        try:
            acks, written_in, error = receive.recv()
        except EOFError:
            writer.join()
            acks, written_in, error = {}, 0.0, f"the writer process ended with exit code {writer.exitcode}"
        writer.join()
        if error:
            failed.append(RuntimeError(f"live writes: {error}"))
        done.set()  # drain: every write acknowledged so far reaches the state, then both queries stop
        live.join()
        if failed:
            raise failed[0]
        for name in ("changelog", "state"):
            busy = [r.seconds for r in live_reports if r.query == name]
            rows_in = sum(r.rows for r in live_reports if r.query == name)
            print(f"live {name} batches: {len(busy)}, {rows_in:,} rows, duration median {pct(busy, 0.5):.2f}s "
                  f"p99 {pct(busy, 0.99):.2f}s (where the freshness goes)", flush=True)
        fresh = freshness(pipeline, live_reports, acks)
        print(f"live: {len(acks):,} writes in {written_in:.1f}s ({len(acks) / written_in:,.0f}/s acknowledged), "
              f"{len(fresh):,} seen in the state", flush=True)
        print(f"freshness p50 {pct(fresh, 0.5):.2f}s p99 {pct(fresh, 0.99):.2f}s max {max(fresh, default=0):.2f}s "
              f"(target p99 <= 5 s)", flush=True)
        mem = watch.report()
        print(f"peak RSS: Spark JVM (driver + executor, local mode) {mem['jvm_peak_mib']:,.0f} MiB, driver Python "
              f"{mem['driver_python_peak_mib']:,.0f} MiB, Python workers {mem['python_workers_peak_mib']:,.0f} MiB "
              f"(docs {args.docs:,})", flush=True)
        if len(fresh) < len(acks) * 0.99:
            print(f"ERROR: only {len(fresh):,} of {len(acks):,} writes reached the state", file=sys.stderr)
            return 1
        return 0
    finally:
        if watch is not None:
            watch.stop()
        if spark is not None:
            stop_spark(spark)
        if server is not None:
            server.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
