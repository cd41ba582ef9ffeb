"""`dcpflow demo`: the whole product in one command, on this machine.

1. start a `dcpflow server` subprocess on a free port (data in a temporary directory);
2. load a realistic dataset through the official SDK (users, products, orders, sessions);
3. run the pipeline with Trigger.AvailableNow: DCP → change log → state table;
4. keep it running with live micro-batches while updates, deletions and expiring sessions arrive;
5. drain, then check the state table against the server key by key, and print a report.

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
from dataclasses import dataclass, field
from pathlib import Path

from .pipeline import BatchReport, Pipeline, PipelineConfig, ProgressReader

READY = re.compile(r"dcpflow server ready: .* port=(\d+)")  # the KV port (mgmt_port= follows)


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

    @property
    def ok(self) -> bool:
        return not self.mismatches


def run_demo(docs: int = 100_000, workdir: str | Path | None = None, vbuckets: int = 64, state_format: str = "delta",
             rounds: int = 5, keep: bool = False, out=None) -> DemoResult:
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
        from dcpflow.load import Loader, Workload, churn_round, load_initial

        work = Workload(docs=docs, updates=max(docs // 10, 10), deletes=max(docs // 50, 5),
                        expiring=max(docs // 100, 5), ttl=2, rounds=rounds)
        loader = Loader(connection, "Administrator", "password")
        t0 = time.monotonic()
        load_initial(loader, work, lambda n, total: say(f"loaded {n:,}/{total:,} documents"))
        say(f"loaded {docs:,} documents in {time.monotonic() - t0:.1f}s through the Couchbase SDK")

        say("starting Spark (local, quiet)")
        from .session import local_session
        spark = local_session("dcpflow-demo")
        config = PipelineConfig(connection=connection, username="Administrator", password="password",
                                lake=base / "lake", state_format=state_format,
                                max_seqnos_per_trigger=max(-(-docs // 3), 1000))
        pipeline = Pipeline(spark, config)
        result = DemoResult(docs=docs, changes={}, initial_rows=0, initial_seconds=0.0)

        def on_batch(r: BatchReport) -> None:
            result.batches.append(r)
            lag = "" if r.lag is None else f", lag {r.lag:,} seqnos"
            rate = f", {r.rows / r.seconds:,.0f} rows/s" if r.seconds > 0 else ""
            say(f"{r.query} batch {r.batch_id}: {r.rows:,} rows in {r.seconds:.2f}s{rate}{lag}")

        say(f"pipeline: AvailableNow → change log {pipeline.changelog_path} → {state_format} state "
            f"{pipeline.state_path}")
        t0 = time.monotonic()
        reports = pipeline.run_available_now(on_batch)
        result.initial_seconds = time.monotonic() - t0
        result.initial_rows = sum(r.rows for r in reports if r.query == "changelog")
        say(f"initial catch-up: {result.initial_rows:,} changes in {result.initial_seconds:.1f}s "
            f"({result.initial_rows / max(result.initial_seconds, 1e-9):,.0f} changes/s end to end)")

        say(f"live: micro-batches every second while {rounds} rounds of updates, deletes and expiring "
            "sessions arrive")
        changelog_q, state_q = pipeline.start_live("1 second")
        live = ProgressReader(changelog_q, "changelog-live")
        totals = {"updates": 0, "deletes": 0, "expiring": 0}
        try:
            for i in range(rounds):
                did = churn_round(loader, work, i)
                for k, v in did.items():
                    totals[k] += v
                say(f"round {i + 1}/{rounds}: {did['updates']:,} updates, {did['deletes']:,} deletes, "
                    f"{did['expiring']:,} sessions expiring in {work.ttl}s")
                _report_live(live, result, say)
                time.sleep(1.0)
            deadline = time.monotonic() + work.ttl + 4
            while time.monotonic() < deadline:  # let the expiry pager turn sessions into expirations
                time.sleep(1.0)
                _report_live(live, result, say)
        finally:
            pipeline.stop_live(changelog_q, state_q)
        result.changes = totals
        say("draining what is left (AvailableNow)")
        pipeline.run_available_now(on_batch)

        say("verifying: the state table against the server, key by key")
        keys = list(work.versions)
        server_docs = loader.get_all(keys)
        loader.close()
        state = _state_dict(pipeline)
        result.keys_checked = len(keys)
        result.live_keys = len(server_docs)
        for key in keys:
            want = server_docs.get(key)
            got = state.get(key)
            if (want.decode() if want is not None else None) != got:
                result.mismatches.append((key, want, got))
        extra = set(state) - set(keys)
        result.mismatches.extend((k, None, state[k]) for k in sorted(extra))
        result.events = {r["event"]: r["count"] for r in pipeline.changelog().groupBy("event").count().collect()}
        result.removed = not keep and workdir is None
        result.seconds = time.monotonic() - started
        _print_report(result, pipeline, out)
        return result
    finally:
        if spark is not None:
            spark.stop()
        if server is not None:
            server.stop()
        if not keep and workdir is None:
            shutil.rmtree(base, ignore_errors=True)


def _report_live(progress, result: DemoResult, say) -> None:
    """Report the live change log's new batches (`progress`: the query's ProgressReader)."""
    for report in progress.batches():
        if report.lag is not None:
            result.max_lag = max(result.max_lag, report.lag)
        result.batches.append(report)
        result.live_batches += 1
        say(f"live batch {report.batch_id}: {report.rows:,} changes in {report.seconds:.2f}s, "
            f"lag {report.lag if report.lag is not None else '?'} seqnos")


def _state_dict(pipeline: Pipeline) -> dict[str, str]:
    """The state table read without Spark (pyarrow over its live Parquet files)."""
    import pyarrow.dataset as ds

    files = pipeline.writer.files()
    if not files:
        return {}
    table = ds.dataset(files, format="parquet").to_table(columns=["key", "value"])
    return dict(zip(table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True))


def _print_report(r: DemoResult, pipeline: Pipeline, out) -> None:
    cl = [b for b in r.batches if b.query == "changelog"]
    st = [b for b in r.batches if b.query == "state"]
    lines = [
        "",
        "dcpflow demo report",
        f"  documents loaded      {r.docs:,}",
        f"  changes while live    {r.changes.get('updates', 0):,} updates, {r.changes.get('deletes', 0):,} deletes, "
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
        "  result                " + ("OK: state table == server contents" if r.ok
                                     else f"MISMATCH on {len(r.mismatches)} keys"),
        f"  total time            {r.seconds:.1f}s",
    ]
    if r.mismatches:
        lines += [f"    {k}: server={w!r:.80} state={g!r:.80}" for k, w, g in r.mismatches[:10]]
    print("\n".join(lines), file=out, flush=True)
