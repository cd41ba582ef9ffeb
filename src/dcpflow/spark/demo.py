"""`dcpflow demo`: the whole product in one command, on this machine.

1. start a `dcpflow server` subprocess on a free port (data in a temporary directory);
2. create scope `shop` with `users`, `products`, `orders` (history: every version kept) and
   `sessions` (a maxTTL) through the official SDK's collection manager, and load a realistic
   dataset into them through the SDK;
3. run the pipeline over the scope with change streams (history) and Trigger.AvailableNow:
   DCP → change log → state table keyed by (scope, collection, key);
4. keep it running with live micro-batches while updates, bursts of successive versions,
   deletions and expiring sessions arrive;
5. drain, then check the state table against the server key by key in every collection, check
   that the change log of `orders` holds every version written, and print a report.

The server is a subprocess, not imported: dcpflow.spark uses the client, never the server.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from base64 import b64encode
from dataclasses import dataclass, field
from pathlib import Path

from .pipeline import (
    RESTARTS,
    BatchReport,
    Pipeline,
    PipelineConfig,
    PipelineFailed,
    ProgressReader,
    failure_line,
    transient,
)
from .session import local_session, stop_spark

READY = re.compile(r"dcpflow server ready: .* port=(\d+)")  # the KV port (mgmt_port= follows)
MGMT = re.compile(r"mgmt_port=(\d+)")
SCOPE = "shop"
HISTORY = ("orders",)  # collections that keep every version (DCP change streams)
MAX_TTL = {"sessions": 3600}  # seconds; sessions written without an expiry get it
RETENTION_SECONDS = 86_400  # the bucket's history retention: longer than any demo


#: Memory quota bytes an embedded server gives each document it is told to expect, and the least
#: quota it gets: several times what a generated document costs in memory (its value, key and
#: metadata, a checkpoint entry), so the data, its churn and the checkpoints fit below the low
#: watermark - no value is evicted and no write meets ETMPFAIL, and what the demo or a bench
#: measures is not the item pager.
QUOTA_PER_DOC = 4096
QUOTA_FLOOR = 256 << 20


def quota_for(docs: int) -> int:
    """The memory quota an embedded server expecting `docs` documents runs with."""
    return max(QUOTA_FLOOR, docs * QUOTA_PER_DOC)


class EmbeddedServer:
    """`python -m dcpflow.cli server` on a free port; stopped with SIGTERM (clean shutdown). Its
    bucket's memory quota is `quota_for(docs)` (the server's default, 100 MiB, would evict and refuse
    writes under the larger loads the demo and the benches make)."""

    def __init__(self, data_dir: Path, vbuckets: int, expiry_interval: float = 1.0, *, docs: int):
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dcpflow.cli", "server", "--port", "0", "--data-dir", str(data_dir),
             "--vbuckets", str(vbuckets), "--expiry-interval", str(expiry_interval), "--flush-interval", "0.05",
             "--memory-quota", str(quota_for(docs))],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
        line = self.proc.stdout.readline()
        match = READY.search(line)
        if match is None:
            self.stop()
            raise RuntimeError(f"dcpflow server did not start: {line!r} {self.proc.stderr.read()[-2000:]}")
        self.port = int(match.group(1))
        mgmt = MGMT.search(line)
        self.mgmt_port = int(mgmt.group(1)) if mgmt else None

    def set_bucket(self, bucket: str, username: str, password: str, **settings) -> None:
        """Edit a bucket's settings through the management REST API (as ns_server's)."""
        if self.mgmt_port is None:
            raise RuntimeError("dcpflow server did not say its management port")
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.mgmt_port}/pools/default/buckets/{bucket}",
            data=urllib.parse.urlencode(settings).encode(), method="POST",
            headers={"Authorization": "Basic " + b64encode(f"{username}:{password}".encode()).decode(),
                     "Content-Type": "application/x-www-form-urlencoded"})
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream:
                stream.close()


@dataclass
class DemoResult:
    docs: int
    changes: dict
    initial_rows: int
    initial_seconds: float
    batches: list[BatchReport] = field(default_factory=list)
    live_batches: int = 0
    max_lag: int = 0
    keys_checked: int = 0
    live_keys: int = 0
    mismatches: list = field(default_factory=list)
    events: dict = field(default_factory=dict)
    removed: bool = False
    seconds: float = 0.0
    collections: dict = field(default_factory=dict)  # name -> keys, live, mismatches
    versions: dict = field(default_factory=dict)  # name -> what the change log holds (_versions)
    restarts: int = 0  # live queries started again after Spark failed to start a Python worker in time

    @property
    def ok(self) -> bool:
        return not self.mismatches


def run_demo(docs: int = 100_000, workdir: str | Path | None = None, vbuckets: int = 64, state_format: str = "delta",
             rounds: int = 5, keep: bool = False, out=None) -> DemoResult:
    """The module docstring's five steps, each a function below; the server, Spark and (unless
    kept) the working directory go whatever happens."""
    out = out or sys.stdout
    started = time.monotonic()

    def say(text: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {text}", file=out, flush=True)

    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="dcpflow-demo-"))
    base.mkdir(parents=True, exist_ok=True)
    server = None
    spark = None
    try:
        say(f"starting dcpflow server ({vbuckets} vbuckets, memory quota {quota_for(docs) >> 20} MiB) "
            f"with its data in {base / 'server'}")
        server = EmbeddedServer(base / "server", vbuckets, docs=docs)
        connection = f"couchbase://127.0.0.1:{server.port}/default"
        client, loader, work = _load(server, connection, docs, rounds, say)

        say("starting Spark (local, quiet)")
        spark = local_session("dcpflow-demo")
        config = PipelineConfig(connection=connection, username="Administrator", password="password",
                                lake=base / "lake", state_format=state_format,
                                max_seqnos_per_trigger=max(-(-docs // 3), 1000),
                                options={"scope": SCOPE, "history": "true"})
        pipeline = Pipeline(spark, config)
        result = DemoResult(docs=docs, changes={}, initial_rows=0, initial_seconds=0.0)

        def on_batch(r: BatchReport) -> None:
            result.batches.append(r)
            lag = "" if r.lag is None else f", lag {r.lag:,} seqnos"
            rate = f", {r.rows / r.seconds:,.0f} rows/s" if r.seconds > 0 else ""
            say(f"{r.describe()}: {r.rows:,} rows in {r.seconds:.2f}s{rate}{lag}")

        _catch_up(pipeline, result, on_batch, say)
        result.changes = _live(pipeline, loader, work, result, say)
        say("draining what is left (AvailableNow)")
        pipeline.run_available_now(on_batch)
        _verify(pipeline, client, loader, work, result, say)
        result.removed = not keep and workdir is None
        result.seconds = time.monotonic() - started
        _print_report(result, pipeline, out)
        return result
    finally:
        if spark is not None:
            stop_spark(spark)
        if server is not None:
            server.stop()
        if not keep and workdir is None:
            shutil.rmtree(base, ignore_errors=True)


def _load(server: EmbeddedServer, connection: str, docs: int, rounds: int, say):
    """Step 2: the bucket made magma with history, scope `shop` and its collections made through
    the SDK, and the initial documents loaded. Returns (SDK client, loader by kind, workload)."""
    from dcpflow.client.workload import ByKind, Loader, Workload, create_collections, load_initial

    work = Workload(docs=docs, updates=max(docs // 10, 10), deletes=max(docs // 50, 5),
                    expiring=max(docs // 100, 5), ttl=2, rounds=rounds)
    # `orders` keeps every version: history needs a magma bucket, as in Couchbase
    server.set_bucket("default", "Administrator", "password", storageBackend="magma",
                      historyRetentionSeconds=RETENTION_SECONDS)
    client = Loader(connection, "Administrator", "password")
    create_collections(client, SCOPE, history=HISTORY, max_ttl=MAX_TTL)
    made = next(sc for sc in client.bucket.collections().get_all_scopes() if sc.name == SCOPE).collections
    say(f"created scope {SCOPE} through the SDK's collection manager: " + ", ".join(
        c.name + (" (history)" if c.history else "")
        + (f" (maxTTL {c.max_expiry.total_seconds():.0f}s)" if c.max_expiry else "") for c in made))
    loader = ByKind(client, SCOPE)
    t0 = time.monotonic()
    load_initial(loader, work, lambda n, total: say(f"loaded {n:,}/{total:,} documents"))
    say(f"loaded {docs:,} documents in {time.monotonic() - t0:.1f}s through the Couchbase SDK")
    return client, loader, work


def _catch_up(pipeline: Pipeline, result: DemoResult, on_batch, say) -> None:
    """Step 3: the pipeline over the scope with change streams, AvailableNow."""
    say(f"pipeline over scope {SCOPE} with change streams: AvailableNow → change log "
        f"{pipeline.changelog_path} → {pipeline.config.state_format} state {pipeline.state_path}")
    t0 = time.monotonic()
    reports = pipeline.run_available_now(on_batch)
    result.initial_seconds = time.monotonic() - t0
    result.initial_rows = sum(r.rows for r in reports if r.query == "changelog")
    say(f"initial catch-up: {result.initial_rows:,} changes in {result.initial_seconds:.1f}s "
        f"({result.initial_rows / max(result.initial_seconds, 1e-9):,.0f} changes/s end to end)")


def _live(pipeline: Pipeline, loader, work, result: DemoResult, say) -> dict:
    """Step 4: one-second micro-batches while the workload's rounds of updates, bursts,
    deletions and expiring sessions arrive, then until the sessions have expired. Returns what
    the rounds did, by kind."""
    from dcpflow.client.workload import burst_round, churn_round

    rounds = work.rounds
    say(f"live: micro-batches every second while {rounds} rounds of updates, bursts of versions, deletes "
        "and expiring sessions arrive")
    queries = list(pipeline.start_live("1 second"))
    live = ProgressReader(queries[0], "changelog-live", pipeline.changelog_version)
    totals = {"updates": 0, "deletes": 0, "expiring": 0, "bursts": 0}
    burst_keys = max(work.docs // 1000, 3)
    try:
        for i in range(rounds):
            did = churn_round(loader, work, i)
            did["bursts"] = burst_round(loader, work, i, keys=burst_keys, versions=3)
            for k, v in did.items():
                totals[k] += v
            say(f"round {i + 1}/{rounds}: {did['updates']:,} updates, {did['bursts']:,} more in bursts "
                f"(3 versions in a row of {burst_keys} users and {burst_keys} orders), {did['deletes']:,} "
                f"deletes, {did['expiring']:,} sessions expiring in {work.ttl}s")
            live = _report_live(live, result, say, pipeline, queries)
            time.sleep(1.0)
        deadline = time.monotonic() + work.ttl + 4
        while time.monotonic() < deadline:  # let the expiry pager turn sessions into expirations
            time.sleep(1.0)
            live = _report_live(live, result, say, pipeline, queries)
    finally:
        pipeline.stop_live(*queries)
    return totals


def _verify(pipeline: Pipeline, client, loader, work, result: DemoResult, say) -> None:
    """Step 5: the state table against the server key by key in every collection (mismatches and
    keys the state has that the workload never wrote), and the change log's versions."""
    say(f"verifying: the state table against the server, key by key in every collection of {SCOPE}")
    keys = list(work.versions)
    server_docs = loader.get_all(keys)
    client.close()
    state = _state_dict(pipeline)
    result.keys_checked = len(keys)
    result.live_keys = len(server_docs)
    names = sorted(loader.loaders)
    result.collections = {name: {"keys": 0, "live": 0, "mismatches": 0} for name in names}
    for key in keys:
        name = loader.collection_of(key)
        stats = result.collections[name]
        stats["keys"] += 1
        want = server_docs.get(key)
        stats["live"] += want is not None
        got = state.get((SCOPE, name, key))
        if (want.decode() if want is not None else None) != got:
            stats["mismatches"] += 1
            result.mismatches.append((f"{SCOPE}.{name}:{key}", want, got))
    expected = {(SCOPE, loader.collection_of(k), k) for k in keys}
    for extra in sorted(set(state) - expected):
        result.mismatches.append((".".join(extra[:2]) + ":" + extra[2], None, state[extra]))
        if extra[0] == SCOPE and extra[1] in result.collections:
            result.collections[extra[1]]["mismatches"] += 1
    changelog = pipeline.changelog()
    result.events = {r["event"]: r["count"] for r in changelog.groupBy("event").count().collect()}
    result.versions = _versions(changelog, loader)
    result.mismatches.extend(version_mismatches(result.versions))


def _report_live(progress, result: DemoResult, say, pipeline: Pipeline, queries: list) -> ProgressReader:
    """Report the live change log's new batches (`progress`: its ProgressReader). A live query that
    stopped ends the demo with its reason, unless Spark only failed to start a Python worker in time
    (pipeline.transient): that query starts again from its checkpoint, a few times at most.
    Returns the change log's reader (a new one after a restart)."""
    for i, name in enumerate(("changelog", "state")):
        query = queries[i]
        try:
            active = query.isActive
            error = None if active else query.exception()
        except Exception as e:
            raise PipelineFailed(f"the {name} query failed: {failure_line(e)}") from e
        if active:
            continue
        reason = failure_line(error) if error else None
        if reason and transient(reason) and result.restarts < RESTARTS:
            result.restarts += 1
            say(f"the {name} query failed: {reason}; restarting it from its checkpoint")
            queries[:] = pipeline.restart(name, tuple(queries), "1 second")
            if name == "changelog":
                progress = ProgressReader(queries[0], "changelog-live", pipeline.changelog_version)
            continue
        raise PipelineFailed(f"the {name} query " + (f"failed: {reason}" if reason else "stopped"))
    for report in progress.batches():
        if report.lag is not None:
            result.max_lag = max(result.max_lag, report.lag)
        result.batches.append(report)
        result.live_batches += 1
        say(f"live {report.describe()}: {report.rows:,} changes in {report.seconds:.2f}s, "
            f"lag {report.lag if report.lag is not None else '?'} seqnos")
    return progress


def query_name(query) -> str:
    """`changelog` or `state` for the pipeline's queries (named dcpflow_changelog, dcpflow_state)."""
    try:
        return (query.name or "streaming").removeprefix("dcpflow_")
    except Exception:
        return "streaming"


def _state_dict(pipeline: Pipeline) -> dict[tuple[str, str, str], str]:
    """The state table read without Spark (as Delta by delta-rs, deletion vectors honoured; a
    snapshot as its Parquet files), by its key (scope, collection, key)."""
    table = pipeline.writer.to_arrow(["scope", "collection", "key", "value"])
    keys = zip(*(table.column(c).to_pylist() for c in ("scope", "collection", "key")), strict=True)
    return dict(zip(keys, table.column("value").to_pylist(), strict=True))


def _versions(changelog, loader) -> dict[str, dict]:
    """Per collection, what the change log holds against what was written: `upserts` (versions)
    of `keys` distinct keys, `written` (upserts through the SDK), `deletes`, and the most versions
    of one key in one micro-batch (`per_batch`) and in one DCP snapshot (`per_snapshot`). A
    collection without history is de-duplicated: at most one version of a key per snapshot."""
    from pyspark.sql import functions as F

    from .schema import CHANGE_TYPE, COMMIT_VERSION, DELETE, UPSERT

    ups = changelog.filter(F.col(CHANGE_TYPE) == UPSERT)
    out: dict[str, dict] = {}

    def of(name: str) -> dict:  # a collection the workload never wrote to has 0 written
        return out.setdefault(name, {"upserts": 0, "keys": 0, "written": loader.written[name], "deletes": 0,
                                     "per_batch": 0, "per_snapshot": 0})

    for name in loader.loaders:
        of(name)
    for r in ups.groupBy("collection").agg(F.count("*").alias("n"), F.countDistinct("key").alias("k")).collect():
        of(r["collection"]).update(upserts=r["n"], keys=r["k"])
    for r in changelog.filter(F.col(CHANGE_TYPE) == DELETE).groupBy("collection").count().collect():
        of(r["collection"])["deletes"] = r["count"]
    for name, cols in (("per_batch", [COMMIT_VERSION]),
                       ("per_snapshot", [COMMIT_VERSION, "vbucket", "snapshot_start", "snapshot_end"])):
        counts = ups.groupBy("collection", "key", *cols).count()
        for r in counts.groupBy("collection").agg(F.max("count").alias("m")).collect():
            of(r["collection"])[name] = r["m"]
    return out


def version_mismatches(versions: dict[str, dict], history: tuple[str, ...] = HISTORY) -> list[tuple]:
    """What the change log got wrong, from `_versions`' counts: a collection with history must hold
    every version written to it, one without never two versions of a key in one DCP snapshot."""
    out = []
    for name, v in sorted(versions.items()):
        if name in history and v["upserts"] != v["written"]:
            out.append((f"{SCOPE}.{name} change log", f"{v['written']} versions written", f"{v['upserts']} versions"))
        if name not in history and v["per_snapshot"] > 1:
            out.append((f"{SCOPE}.{name} change log", "one version of a key per snapshot",
                        f"{v['per_snapshot']} versions of a key in one snapshot"))
    return out


def _print_report(r: DemoResult, pipeline: Pipeline, out) -> None:
    cl = [b for b in r.batches if b.query == "changelog"]
    st = [b for b in r.batches if b.query == "state"]
    lines = [
        "",
        "dcpflow demo report",
        f"  documents loaded      {r.docs:,} into scope {SCOPE} (" + ", ".join(r.collections) + ")",
        f"  changes while live    {r.changes.get('updates', 0):,} updates, {r.changes.get('bursts', 0):,} in bursts, "
        f"{r.changes.get('deletes', 0):,} deletes, "
        f"{r.changes.get('expiring', 0):,} expiring sessions",
        f"  initial catch-up      {r.initial_rows:,} changes in {r.initial_seconds:.1f}s "
        f"({r.initial_rows / max(r.initial_seconds, 1e-9):,.0f}/s, DCP → change log → state)",
        f"  micro-batches         {len(cl)} change log (AvailableNow), {r.live_batches} live, {len(st)} state",
        f"  max lag while live    {r.max_lag:,} seqnos (after each live batch)",
        "  change log events     " + ", ".join(f"{n:,} {e}" for e, n in sorted(r.events.items(), key=lambda x: -x[1])),
        f"  change log            {pipeline.changelog_path}" + (" (removed at exit: --keep or --dir keeps it)"
                                                                 if r.removed else ""),
        f"  state table           {pipeline.state_path} ({pipeline.writer.format})",
        f"  verified              {r.keys_checked:,} keys against the server: {r.live_keys:,} live, "
        f"{r.keys_checked - r.live_keys:,} deleted or expired",
    ]
    for name, c in r.collections.items():
        v = r.versions.get(name, {})
        lines.append(f"    {SCOPE}.{name:<9}    {c['keys']:>7,} keys: {c['live']:>7,} live, "
                     f"{c['keys'] - c['live']:>5,} gone, "
                     + ("state == server" if not c["mismatches"] else f"{c['mismatches']:,} MISMATCHED")
                     + f"; change log {v.get('upserts', 0):,} versions of {v.get('keys', 0):,} keys")
    for name in HISTORY:
        v = r.versions.get(name, {})
        lines.append(f"  history ({name})      every version: {v.get('upserts', 0):,} in the change log = "
                     f"{v.get('written', 0):,} written, of {v.get('keys', 0):,} keys "
                     f"(up to {v.get('per_batch', 0)} of one key in a micro-batch)")
    v = r.versions.get("users", {})
    lines.append(f"  de-duplicated (users) {v.get('upserts', 0):,} in the change log of {v.get('written', 0):,} "
                 f"written (at most {v.get('per_batch', 0)} of one key in a micro-batch, "
                 f"{v.get('per_snapshot', 0)} in a DCP snapshot)")
    lines += [
        "  result                " + ("OK: state table == server contents" if r.ok
                                     else f"MISMATCH on {len(r.mismatches)} keys or change logs"),
        f"  total time            {r.seconds:.1f}s",
    ]
    if r.mismatches:
        lines += [f"    {k}: server={w!r:.80} state={g!r:.80}" for k, w, g in r.mismatches[:10]]
    print("\n".join(lines), file=out, flush=True)
