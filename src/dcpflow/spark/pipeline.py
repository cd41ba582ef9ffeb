"""The CDC pipeline: DCP → change log (Parquet, exactly-once) → latest-state table per key.

Two streaming queries, each with its own checkpoint under `<lake>/_checkpoints/`:

1. `changelog`: `readStream.format("dcp")` into Spark's Parquet file sink at `<lake>/changelog`.
   The file sink is exactly-once (its `_spark_metadata` log names the committed files), so this
   is the append-only source of truth; read it with `spark.read.parquet(path)`, never by globbing.
2. `state`: the change log read back as a file stream (through that same log, so only committed
   batches) into `foreachBatch(StateWriter.apply)`, idempotent per batch id (state.py).

Splitting them keeps the change log exactly-once whatever the state writer does, and lets the
state run on another trigger (a snapshot compaction every few minutes, say) or be rebuilt from
the change log alone (delete its checkpoint and table).

One batch numbering: a change-log batch is known by its *version*, the `_commit_version` its rows
carry (the source's micro-batch number, from 1), which is what `dcpflow restore --as-of` takes.
Spark's own batch ids (from 0, and the state query's apart from the change log's) stay internal:
the reports carry the version, and a state batch the newest change-log version it merged.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .offsets import SourceOffset
from .state import StateWriter, make_writer

log = logging.getLogger(__name__)


@dataclass
class PipelineConfig:
    connection: str
    username: str
    password: str
    lake: Path
    bucket: str | None = None
    state_format: str = "delta"  # delta | snapshot
    value_format: str = "string"
    max_seqnos_per_trigger: int | None = None
    partitions: int | None = None
    options: dict = field(default_factory=dict)  # any other `dcp` source option

    def source_options(self) -> dict[str, str]:
        opts = {"connection": self.connection, "username": self.username, "password": self.password,
                "valueFormat": self.value_format}
        if self.bucket:
            opts["bucket"] = self.bucket
        if self.max_seqnos_per_trigger:
            opts["maxSeqnosPerTrigger"] = str(self.max_seqnos_per_trigger)
        if self.partitions:
            opts["partitions"] = str(self.partitions)
        opts.update({k: str(v) for k, v in self.options.items()})
        if any(k.lower() == "syncwrites" and str(v).strip().lower() == "true" for k, v in opts.items()):
            # a committed sync write is then a commit row without its value: no state from that
            raise ValueError("the pipeline's state table needs committed versions: leave the source option "
                             "syncWrites out (read with syncWrites=true on its own to audit sync writes)")
        return opts


@dataclass
class BatchReport:
    query: str
    batch_id: int  # Spark's id of the batch in its query (internal: not what users see)
    rows: int
    seconds: float
    lag: int | None
    #: the change-log version (`_commit_version`, `restore --as-of`) the batch wrote, or for a
    #: state batch the newest one it merged; None when unknown
    version: int | None = None
    #: when the batch ended (epoch seconds: its report's start plus its duration), None if unknown
    ended: float | None = None

    def describe(self) -> str:
        """`changelog batch 3` / `state through batch 3`: the numbering restore --as-of takes."""
        if self.version is None:
            return f"{self.query} batch ?"
        return f"state through batch {self.version}" if self.query.startswith("state") \
            else f"{self.query} batch {self.version}"


def lag_of(progress: dict) -> int | None:
    """Seqnos the change log is behind the server after this batch (sum over vbuckets)."""
    try:
        source = progress["sources"][0]
        end, latest = source.get("endOffset"), source.get("latestOffset")
        if not end or not latest:
            return None
        read, now = SourceOffset.from_json(end).vbuckets, SourceOffset.from_json(latest).vbuckets
    except (KeyError, IndexError, TypeError, ValueError):  # OffsetError and bad JSON are ValueErrors
        return None
    return sum(max(0, v.seqno - (read[vb].seqno if vb in read else 0)) for vb, v in now.items())


def batch_end(progress: dict) -> float | None:
    """When a progress report's batch ended, in epoch seconds: the trigger's start (the report's
    `timestamp`, UTC) plus the trigger's whole duration."""
    from datetime import datetime

    try:
        start = datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()
        return start + progress["durationMs"]["triggerExecution"] / 1000
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def source_version(progress: dict) -> int | None:
    """The change-log version a `dcp` batch's progress report wrote: its end offset's `batch`."""
    try:
        end = progress["sources"][0]["endOffset"]
        return int((json.loads(end) if isinstance(end, str) else end)["batch"])
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def input_rows(progress: dict) -> int:
    """Rows a progress report's batch read. A report that came through Spark Connect carries the
    count only per source (its top-level `numInputRows` is None), as PySpark's own
    `StreamingQueryProgress.numInputRows` property knows; plain dicts and classic reports have it."""
    rows = progress.get("numInputRows")
    if rows is None:
        rows = sum(source.get("numInputRows") or 0 for source in progress.get("sources") or ())
    return rows


class Pipeline:
    def __init__(self, spark, config: PipelineConfig):
        self.spark = spark
        self.config = config
        lake = Path(config.lake).resolve()
        self.changelog_path = lake / "changelog"
        self.state_path = lake / "state"
        self.checkpoints = lake / "_checkpoints"
        self.writer: StateWriter = make_writer(config.state_format, self.state_path)
        self._schema = None
        if config.state_format == "delta":
            require_delta(spark)

    # -- versions (one numbering: module docstring) ------------------------------------------
    def changelog_version(self, progress: dict) -> int | None:
        return source_version(progress)

    def state_version(self, progress: dict) -> int | None:
        """The newest change-log version a state batch merged, as its writer recorded it."""
        try:
            return self.writer.changelog_version(int(progress["batchId"]))
        except (KeyError, TypeError, ValueError, OSError):
            return None

    # -- queries ----------------------------------------------------------------------------
    def source(self):
        df = self.spark.readStream.format("dcp").options(**self.config.source_options()).load()
        self._schema = df.schema
        return df

    def start_changelog(self, **trigger):
        return (self.source().writeStream.queryName("dcpflow_changelog").format("parquet")
                .option("path", str(self.changelog_path))
                .option("checkpointLocation", str(self.checkpoints / "changelog"))
                .trigger(**trigger).start())

    def start_state(self, **trigger):
        if self._schema is None:
            if (self.changelog_path / "_spark_metadata").exists():  # what the change log really holds
                self._schema = self.spark.read.parquet(str(self.changelog_path)).schema
            else:
                self._schema = self.spark.read.format("dcp").options(**self.config.source_options()).load().schema
        changes = self.spark.readStream.schema(self._schema).parquet(str(self.changelog_path))
        return (changes.writeStream.queryName("dcpflow_state").foreachBatch(self.writer.apply)
                .option("checkpointLocation", str(self.checkpoints / "state"))
                .trigger(**trigger).start())

    # -- running ----------------------------------------------------------------------------
    def run_available_now(self, on_batch: Callable[[BatchReport], None] | None = None) -> list[BatchReport]:
        """Everything the server has now: the change log first, then the state from it."""
        self.changelog_path.mkdir(parents=True, exist_ok=True)
        reports = []
        for name, start, version in (("changelog", self.start_changelog, self.changelog_version),
                                     ("state", self.start_state, self.state_version)):
            for attempt in range(RESTARTS + 1):
                try:
                    reports += follow(start(availableNow=True), name, on_batch, version)
                    break
                except PipelineFailed as e:
                    if attempt == RESTARTS or not transient(str(e)):
                        raise
                    log.warning("%s; restarting the query from its checkpoint", e)
        return reports

    def run_live(self, interval: str, on_batch: Callable[[BatchReport], None] | None = None,
                 poll: float = 0.5, stop: threading.Event | None = None) -> None:
        """Both queries on a processing-time trigger until one of them stops: a failed query (or a
        JVM gone) raises PipelineFailed at once, after the other is stopped; Ctrl-C stops both
        between batches. `stop` set: both finish what the change log's source has now (so every
        change made before is in the state), report it and stop."""
        queries = self.start_live(interval)
        restarts = 0
        readers = [ProgressReader(queries[0], "changelog", self.changelog_version),
                   ProgressReader(queries[1], "state", self.state_version)]
        try:
            while True:
                draining = stop is not None and stop.is_set()
                if draining:
                    with contextlib.suppress(Exception):  # a query that failed: looked at below
                        self.stop_live(*queries)
                for name, query, reader in zip(("changelog", "state"), queries, readers, strict=True):
                    try:
                        active = query.isActive
                        reports = reader.batches()
                    except Exception as e:
                        raise PipelineFailed(f"the {name} query failed: {failure_line(e)}") from e
                    for report in reports:
                        restarts = 0  # a query that moves on again: only failures in a row end the run
                        if on_batch:
                            on_batch(report)
                    if not active:
                        error = _query_error(query)
                        if draining and not error:
                            continue
                        if error and transient(error) and restarts < RESTARTS:
                            restarts += 1
                            log.warning("the %s query failed: %s; restarting it from its checkpoint", name, error)
                            queries = self.restart(name, queries, interval)
                            i = 0 if name == "changelog" else 1  # the other query's reader goes on
                            readers[i] = ProgressReader(queries[i], name, readers[i].version)
                            break
                        raise PipelineFailed(f"the {name} query " + (f"failed: {error}" if error else "stopped"))
                else:
                    if draining:
                        return
                    time.sleep(poll)
        except KeyboardInterrupt:
            self.stop_live(*queries)
            raise
        finally:
            for query in queries:
                stop_between_batches(query)

    def restart(self, name: str, queries: tuple, interval: str) -> tuple:
        """`queries` (changelog, state) with the one named started again from its checkpoint."""
        if name == "changelog":
            return self.start_changelog(processingTime=interval), queries[1]
        return queries[0], self.start_state(processingTime=interval)

    def start_live(self, interval: str = "1 second"):
        self.changelog_path.mkdir(parents=True, exist_ok=True)
        return self.start_changelog(processingTime=interval), self.start_state(processingTime=interval)

    @staticmethod
    def stop_live(changelog_query, state_query) -> None:
        """Stop the live queries between batches, upstream first. Stopping a query in the middle of
        a `foreachBatch` interrupts the Python writer, and Spark 4.2 then overflows its stack while
        classifying the (huge) error message: a thousand lines of regex frames on stderr. The
        writers are idempotent, so nothing would be lost, but a clean stop is what users expect."""
        for query in (changelog_query, state_query):
            try:
                if query.isActive and query.exception() is None:
                    query.processAllAvailable()
            finally:
                query.stop()

    def changelog(self):
        """The change log as a batch DataFrame (through the sink's log: committed batches only)."""
        return self.spark.read.schema(self._schema).parquet(str(self.changelog_path)) if self._schema \
            else self.spark.read.parquet(str(self.changelog_path))

    def state(self):
        return self.writer.read(self.spark)


#: Restarts (from the checkpoint) of a query that failed for a transient reason, per run.
RESTARTS = 3


def transient(reason: str) -> bool:
    """Whether a query's failure is Spark not getting a Python worker started in time: its wait for
    a new worker to connect back is a fixed 10 s (PythonWorkerFactory), which a machine busy enough
    exceeds. The query's checkpoint makes starting it again exact; any other failure ends the run."""
    return "failed to connect back" in reason or "CANNOT_OPEN_SOCKET" in reason


class PipelineFailed(RuntimeError):
    """A query of the pipeline failed, or Spark itself went away; the message is one line naming
    which and why."""


def failure_line(error: BaseException) -> str:
    """One line saying why: the innermost reason of a query's error (Spark's message names the
    query, then "terminated with exception:", then the cause and a stack trace), or that the JVM
    is gone (killed, or out of memory: sessions run it with -XX:+ExitOnOutOfMemoryError)."""
    name = type(error).__name__
    text = str(error)
    chain, seen = [], error
    while seen is not None and len(chain) < 10:  # py4j wraps the socket's error in its own
        chain.append(type(seen).__name__)
        seen = seen.__cause__ or seen.__context__
    if set(chain) & {"Py4JNetworkError", "ConnectionRefusedError", "ConnectionResetError", "BrokenPipeError",
                     "EOFError"} or (name == "Py4JError" and text.startswith("An error occurred while calling")):
        return "Spark's JVM is gone (killed, or it ran out of memory)"
    marker = "terminated with exception:"
    if marker in text:
        text = text.split(marker, 1)[1]
    text = text.split("=== Streaming Query ===", 1)[0]  # the query's ids and offsets: not the reason
    head, _, trace = text.strip().partition("Traceback (most recent call last):")
    head = " ".join(head.split())
    if trace:  # a Python error inside Spark: its last exception line is the reason
        causes = [ln for ln in trace.splitlines() if ln and not ln[0].isspace()
                  and ": " in ln and not ln.startswith(("Traceback", "During handling", "The above"))]
        if causes:
            name, _, message = causes[-1].partition(": ")
            head = f"{head} {name.rsplit('.', 1)[-1]}: {message.strip()}".strip()
    lines = [ln.strip() for ln in head.splitlines() if ln.strip() and not ln.strip().startswith("at ")]
    line = lines[0] if lines else name
    for noise in ("org.apache.spark.SparkException: ", "java.lang.", "pyspark.errors.exceptions.base."):
        line = line.replace(noise, "")
    return line if len(line) <= 400 else line[:397] + "..."


def require_delta(spark) -> None:
    """Refuse, before any query starts, a session without Delta Lake (its SQL extension or
    catalog), naming what to do: the state's MERGE would otherwise fail in its first batch."""
    from .jars import DELTA_PACKAGE, JarsMissing, jar_dir

    try:
        extensions = spark.conf.get("spark.sql.extensions", "") or ""
        catalog = spark.conf.get("spark.sql.catalog.spark_catalog", "") or ""
    except Exception:  # a Connect server that refuses to show its settings: let the first batch tell
        return
    if "delta" not in (extensions + catalog).lower():
        raise JarsMissing(f"this Spark session has no Delta Lake, which the delta state format needs: run "
                          f"`python -m dcpflow.spark.jars` (it installs {DELTA_PACKAGE} into {jar_dir()}), or on "
                          f"your own cluster add --packages {DELTA_PACKAGE} with spark.sql.extensions="
                          f"io.delta.sql.DeltaSparkSessionExtension; or use --state-format snapshot")


class ProgressReader:
    """The progress reports of a query not read yet, in order.

    Reads `lastProgress` when it is the next batch's report, and every recent report only after a
    gap (several batches between two reads, a batch reported twice): each report is one py4j
    answer, which stalls once it is over a few KB (docs/spark.md, "Offsets") - as a dcp report of
    1024 vbuckets is - so reading all of them at every poll would cost N stalls by the N-th batch.
    After an idle trigger's report (no rows, under the id of the batch to come) the next batch's
    report is no proof of no gap: the batch that ran under the idle report's id may lie between."""

    def __init__(self, query, name: str = "", version: Callable[[dict], int | None] | None = None):
        self.query = query
        self.name = name  # the query's name in the BatchReports of `batches`
        self.version = version or source_version  # a report's change-log version
        self._last: tuple | None = None  # (batchId, timestamp) of the newest report returned
        self._last_ran = False  # whether that report is of a batch that read rows
        self._reported: set[int] = set()  # batch ids `batches` has reported

    def new(self) -> list[dict]:
        latest = self.query.lastProgress
        if latest is None:
            return []
        key = (latest["batchId"], latest["timestamp"])
        if key == self._last:
            return []
        if self._last_ran and latest["batchId"] == self._last[0] + 1:
            out = [latest]
        else:
            recent = self.query.recentProgress
            keys = [(p["batchId"], p["timestamp"]) for p in recent]
            out = recent[keys.index(self._last) + 1:] if self._last in keys else recent
        self._last = key
        self._last_ran = bool(input_rows(latest))
        return out

    def batches(self) -> list[BatchReport]:
        """The batches with rows among the new reports, each batch once (a live query may report
        an idle trigger under the next batch's id first)."""
        out = []
        for p in self.new():
            if not input_rows(p) or p["batchId"] in self._reported:
                continue
            self._reported.add(p["batchId"])
            out.append(BatchReport(self.name, p["batchId"], input_rows(p),
                                   p.get("durationMs", {}).get("triggerExecution", 0) / 1000, lag_of(p),
                                   self.version(p), batch_end(p)))
        return out


def follow(query, name: str, on_batch: Callable[[BatchReport], None] | None = None,
           version: Callable[[dict], int | None] | None = None, poll: float = 0.2) -> list[BatchReport]:
    """Wait for a query to finish (AvailableNow), reporting each batch with rows as it completes."""
    progress = ProgressReader(query, name, version)
    reports: list[BatchReport] = []

    def drain() -> None:
        for report in progress.batches():
            reports.append(report)
            if on_batch:
                on_batch(report)

    try:
        while query.isActive:
            drain()
            time.sleep(poll)
    except PipelineFailed:
        raise
    except Exception as e:  # the JVM went away under the query (killed, out of memory)
        raise PipelineFailed(f"the {name} query failed: {failure_line(e)}") from e
    error = _query_error(query)
    if error:
        raise PipelineFailed(f"the {name} query failed: {error}")
    drain()
    return reports


def stop_between_batches(query, timeout: float = 30.0) -> None:
    """Stop a query once no batch of it runs (within `timeout`): interrupting a `foreachBatch`
    makes Spark overflow its stack on the error (Pipeline.stop_live); a JVM gone is no error."""
    deadline = time.monotonic() + timeout
    with contextlib.suppress(Exception):
        while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
            time.sleep(0.1)
    with contextlib.suppress(Exception):
        query.stop()


def _query_error(query) -> str | None:
    """Why a stopped query stopped (one line), or None if it ended well."""
    try:
        error = query.exception()
    except Exception as e:
        return failure_line(e)
    return None if error is None else failure_line(error)
