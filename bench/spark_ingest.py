"""Spark ingest: documents from a `dcpflow server` into the Parquet change log, against two baselines
measured in the same run, on the same Spark session:

* native    - `spark.range` rows of the same shape (keys, ~0.5 KB JSON values from the same
              generator via a broadcast join to a pool, the same 15 columns) written to Parquet;
* synthetic - the `dcp_synthetic` Python data source: the same Arrow batches the `dcp` source
              yields, built in memory (no socket, no server), written to Parquet by a batch
              query ("synthetic batch") and, like the change log, by a streaming query with
              Trigger.AvailableNow into the file sink ("synthetic changelog");
* dcp       - the real thing: `readStream.format("dcp")` with Trigger.AvailableNow into the file
              sink (the pipeline's change log), from a server loaded by `dcpflow load`'s generator.
              The batch read (`spark.read.format("dcp")` → Parquet) is printed too.

Like for like, "dcp changelog / synthetic changelog" is the cost of the client and the server:
both queries pay Spark's streaming costs (a Python reader process per query, offset and commit
logs, ~1.3 s here). "dcp changelog / synthetic batch" is printed too. The server runs on the same
cores as Spark, so its CPU per row (printed) counts against every ratio.

Then the collections figure: a server whose bucket holds the documents in four collections of one
scope (created through the official SDK's collection manager), read into a change log filtered to
two of them (`collections=bench.c0,bench.c1`, half the rows), against two unfiltered reads: of the
same rows (a second server whose bucket holds only those two collections, loaded alike) - the
figure the target is for: the filtered read ≥ 0.9 × its rows/s, a server-side filter must not cost
rows/s - and of all four collections of the first bucket (twice the rows: at small sizes a query's
fixed cost makes this ratio look like the share of rows read).

Each case runs once to warm up, then `--runs` timed times; the median counts (the first run after
the JVM starts is 20-50% slower). Targets: dcp ≥ 0.9 × synthetic and ≥ 0.33 × native. The ratios
of medians are printed, and the ratio run by run (a case against its baseline measured next to
it), whose median is the steadier figure: on a busy 2-core machine a single query's time spreads
±10%, mostly with the JVM's CPU.

    .venv/bin/python bench/spark_ingest.py                 # 1,000,000 docs, 1024 vbuckets
    .venv/bin/python bench/spark_ingest.py --docs 200000 --runs 2
    .venv/bin/python bench/spark_ingest.py --smoke         # 2,000 docs, 16 vbuckets, one run, no warm-up
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dcpflow.client.workload import Loader, key_for, make_doc
from dcpflow.spark.demo import EmbeddedServer
from serverproc import cpu_seconds


def load(connection: str, docs: int, seed: int, threads: int = 4, collection: str | None = None) -> float:
    started = time.monotonic()
    scope, _, name = collection.partition(".") if collection else (None, "", None)
    loader = Loader(connection, "Administrator", "password", scope=scope, collection=name)
    step = 20_000

    def part(lo: int) -> None:
        keys = [key_for(i, seed) for i in range(lo, min(lo + step, docs))]
        loader.upsert({k: make_doc(k, 0, seed) for k in keys})

    with ThreadPoolExecutor(threads) as pool:
        for i, _ in enumerate(pool.map(part, range(0, docs, step)), 1):
            if i % 10 == 0:
                print(f"  loaded {min(i * step, docs):,}/{docs:,}", flush=True)
    loader.close()
    return time.monotonic() - started


def native_df(spark, rows: int, vbuckets: int, seed: int):
    """spark.range rows shaped like the dcp source's (values from the same generator, via a pool)."""
    from pyspark.sql import functions as F

    pool_keys = [key_for(i, seed) for i in range(4096)]
    pool = spark.createDataFrame([(i, k.partition("::")[0] + "::", make_doc(k, 0, seed).decode())
                                  for i, k in enumerate(pool_keys)], "pool_id INT, kind STRING, value STRING")
    ids = spark.range(rows).withColumn("pool_id", (F.col("id") % 4096).cast("int"))
    return (ids.join(F.broadcast(pool), "pool_id")
            .select((F.col("id") % vbuckets).cast("int").alias("vbucket"),
                    (F.col("id") / vbuckets + 1).cast("long").alias("seqno"),
                    F.lit(0xABCDEF).cast("long").alias("vbuuid"),
                    F.concat(F.col("kind"), F.lpad(F.col("id").cast("string"), 8, "0")).alias("key"),
                    F.col("value"), F.lit("mutation").alias("event"), (F.col("id") * 65536).alias("cas"),
                    F.lit(1).cast("long").alias("rev_seqno"), F.lit(0).cast("long").alias("flags"),
                    F.lit(0).cast("long").alias("expiry"), F.lit(1).alias("datatype"),
                    (F.col("id") / vbuckets + 1).cast("long").alias("snapshot_start"),
                    (F.col("id") / vbuckets + 1).cast("long").alias("snapshot_end"),
                    F.lit("upsert").alias("_change_type"), F.lit(0).cast("long").alias("_commit_version")))


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


COLLECTIONS = ("bench.c0", "bench.c1", "bench.c2", "bench.c3")


def _bucket_of(base: Path, args, seed: int, names, per: int):
    """A server whose bucket holds `per` documents (the same keys and values for the same seed) in
    each of the collections `names` of scope bench, made through the official SDK; (server, url)."""
    server = EmbeddedServer(base, args.vbuckets, docs=args.docs)  # a quota that holds them all
    connection = f"couchbase://127.0.0.1:{server.port}/default"
    manager = Loader(connection, "Administrator", "password")
    collections = manager.bucket.collections()
    collections.create_scope("bench")
    for name in names:
        collections.create_collection("bench", name.split(".")[1])
    manager.close()
    print(f"\nloading {per:,} documents into each of {', '.join(names)}...", flush=True)
    for name in names:
        load(connection, per, seed, collection=name)
    return server, connection


def collections_figure(spark, base: Path, args, seed: int, changelog) -> None:
    """The two-collection filter over a bucket of four collections, against the unfiltered read of
    the same rows (a bucket holding only those two collections) and of all four."""
    per = args.docs // len(COLLECTIONS)
    server4, four = _bucket_of(base / "server4", args, seed, COLLECTIONS, per)
    server2 = None
    try:
        server2, same = _bucket_of(base / "server2", args, seed, COLLECTIONS[:2], per)
        opts = {"username": "Administrator", "password": "password", "valueFormat": "string",
                "partitions": str(args.partitions)}
        two = {**opts, "connection": four, "collections": ",".join(COLLECTIONS[:2])}
        only = {**opts, "connection": same}
        every = {**opts, "connection": four}
        if not args.smoke:
            timed(lambda: changelog("dcp", two, 2 * per, "f"))
        filtered, baseline, unfiltered = [], [], []
        for _ in range(args.runs):  # interleaved
            filtered.append(timed(lambda: changelog("dcp", two, 2 * per, "f")))
            baseline.append(timed(lambda: changelog("dcp", only, 2 * per, "s")))
            unfiltered.append(timed(lambda: changelog("dcp", every, len(COLLECTIONS) * per, "u")))
        f_rate = 2 * per / statistics.median(filtered)
        s_rate = 2 * per / statistics.median(baseline)
        u_rate = len(COLLECTIONS) * per / statistics.median(unfiltered)
        for label, rate, runs in (("two of four collections", f_rate, filtered),
                                  ("the same rows, no filter", s_rate, baseline),
                                  ("all four (unfiltered)", u_rate, unfiltered)):
            print(f"  {label:24s} {rate:>12,.0f} rows/s   (runs: {', '.join(f'{t:.2f}' for t in runs)} s)")
        print(f"  filtered / the same rows unfiltered, rows/s = {f_rate / s_rate:.2f}   (target >= 0.9)")
        print(f"  filtered / all four unfiltered, rows/s      = {f_rate / u_rate:.2f}   (a query's fixed cost is "
              f"spread over half the rows)")
    finally:
        server4.stop()
        if server2 is not None:
            server2.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--vbuckets", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--partitions", type=int, default=2, help="Spark tasks per read (default 2 = cores here)")
    ap.add_argument("--dir", help="work directory (default: a temporary one, removed at the end)")
    ap.add_argument("--smoke", action="store_true",
                    help="a short run that checks the bench works: 2,000 docs, 16 vbuckets, one run, no warm-up, "
                         "the JVM started for a short life")
    args = ap.parse_args()
    if args.smoke:
        args.docs, args.vbuckets, args.runs = 2_000, 16, 1
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="dcpflow-bench-"))
    seed = 42
    server = EmbeddedServer(base / "server", args.vbuckets, docs=args.docs)  # a quota that holds them all
    spark = None
    try:
        connection = f"couchbase://127.0.0.1:{server.port}/default"
        print(f"loading {args.docs:,} documents into dcpflow server ({args.vbuckets} vbuckets)...", flush=True)
        took = load(connection, args.docs, seed)
        print(f"  {took:.1f}s ({args.docs / took:,.0f} docs/s through the SDK)", flush=True)

        from dcpflow.spark.session import local_session
        # The smoke takes the JVM flag that trims start-up at the price of peak JIT speed.
        spark = local_session("bench-spark-ingest", driver_memory="1g" if args.smoke else "4g", fast_start=args.smoke)
        opts = {"connection": connection, "username": "Administrator", "password": "password",
                "valueFormat": "string", "partitions": str(args.partitions)}
        out = base / "out"

        def native(rows):
            return lambda: native_df(spark, rows, args.vbuckets, seed).write.mode("overwrite").parquet(str(out / "n"))

        def synthetic_options(rows):
            return {"rows": str(rows), "vbuckets": str(args.vbuckets), "valueFormat": "string",
                    "partitions": str(args.partitions)}

        def synthetic(rows):
            return lambda: (spark.read.format("dcp_synthetic").options(**synthetic_options(rows)).load()
                            .write.mode("overwrite").parquet(str(out / "s")))

        def changelog(fmt, options, rows, name):
            shutil.rmtree(out / name, ignore_errors=True)
            q = (spark.readStream.format(fmt).options(**options).load().writeStream.format("parquet")
                 .option("path", str(out / name / "changelog")).option("checkpointLocation", str(out / name / "ckpt"))
                 .trigger(availableNow=True).start())
            q.awaitTermination()
            # Row counts through the JVM's getters, not q.recentProgress: that ships each report's
            # JSON through py4j, which stalls ~44 ms on any answer over ~8 KB (the dcp source's
            # offsets of 1024 vbuckets; docs/spark.md, "Offsets") and would time py4j, not ingest.
            got = sum(p.numInputRows() for p in q._jsq.recentProgress())
            assert got == rows, f"{fmt} change log got {got:,} rows, expected {rows:,}"

        def synthetic_changelog(rows):
            return lambda: changelog("dcp_synthetic", synthetic_options(rows), rows, "sc")

        def dcp_batch():
            spark.read.format("dcp").options(**opts).load().write.mode("overwrite").parquet(str(out / "b"))

        def dcp_changelog():
            changelog("dcp", opts, args.docs, "c")

        cases = {"native": native(args.docs), "synthetic batch": synthetic(args.docs),
                 "synthetic changelog": synthetic_changelog(args.docs), "dcp changelog": dcp_changelog,
                 "dcp batch": dcp_batch}
        if not args.smoke:
            print("warming up...", flush=True)
            timed(native(50_000))
            timed(synthetic(50_000))
            timed(synthetic_changelog(50_000))
            timed(dcp_changelog)
        results: dict[str, list[float]] = {name: [] for name in cases}
        server_cpu: list[float] = []
        for run in range(args.runs):
            for name, fn in cases.items():  # interleaved, so drift hits every case alike
                before = cpu_seconds(server.proc.pid)
                results[name].append(timed(fn))
                if name == "dcp changelog":
                    server_cpu.append(cpu_seconds(server.proc.pid) - before)
                print(f"  run {run + 1} {name:19s} {results[name][-1]:6.2f}s", flush=True)

        rate = {name: args.docs / statistics.median(t) for name, t in results.items()}
        print(f"\n{args.docs:,} rows, {args.vbuckets} vbuckets, {args.partitions} partitions, median of {args.runs}:")
        for name, times in results.items():
            print(f"  {name:19s} {rate[name]:>12,.0f} rows/s   (runs: {', '.join(f'{t:.2f}' for t in times)} s)")
        per_row = statistics.median(server_cpu) / args.docs * 1e6
        print(f"  dcpflow server CPU during the change log: {per_row:.2f} us/row")
        print()
        for a, b, target in (("dcp changelog", "synthetic changelog", "target >= 0.9, like for like"),
                             ("dcp changelog", "synthetic batch", ""),
                             ("dcp changelog", "native", "target >= 0.33"),
                             ("dcp batch", "synthetic batch", ""), ("dcp batch", "native", ""),
                             ("synthetic batch", "native", "")):
            print(f"  {a + ' / ' + b:35s} = {rate[a] / rate[b]:.2f}" + (f"   ({target})" if target else ""))
        print("\n  paired, run by run (each case beside its baseline in the same run):")
        for a, b in (("dcp changelog", "synthetic changelog"), ("dcp changelog", "native")):
            pairs = [tb / ta for ta, tb in zip(results[a], results[b], strict=True)]
            print(f"  {a + ' / ' + b:35s} = {statistics.median(pairs):.2f} median"
                  f"   (runs: {', '.join(f'{r:.2f}' for r in pairs)})")
        collections_figure(spark, base, args, seed, changelog)
        return 0
    finally:
        if spark is not None:
            spark.stop()
        server.stop()
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
