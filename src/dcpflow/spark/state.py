"""The latest-state table: one row per live key, built from the change log, tombstones applied.

Two writers behind one interface, `apply(batch_df, batch_id)`, made for `foreachBatch` and
idempotent per batch id (Spark re-runs a batch after a failure with the same id):

* `DeltaStateWriter` (the default) - a Delta table kept with Delta Lake's own `MERGE INTO`, run by
  Spark's executors: nothing of the batch reaches the driver but the few rollback and drop
  markers. The batch id goes into the merge's commit as a Delta app transaction
  (`spark.databricks.delta.write.txnAppId`/`txnVersion`), so Delta itself skips a replayed batch.
  Needs Delta's jars in the session (jars.py). Deletion vectors are on, so a live MERGE writes
  the batch's rows and marks the old versions deleted instead of rewriting every file that holds
  a key of the batch (DCP's keys are random: every file, O(table) per batch). Its files then hold
  rows that are no longer live, so readers without Spark read it as Delta, through delta-rs:
  `scan()` (DuckDB scans that stream), `polars.read_delta`.
* `SnapshotStateWriter` - Spark only, no jars: latest(current snapshot ∪ batch) is written to a
  new versioned directory, then a pointer is flipped. Costs O(state) per batch, so give its query
  a longer trigger interval (it is a compaction).

A key is (scope, collection, key): the same key may live in several collections. A `drop` row
(a collection dropped upstream) removes every key of its collection id (ids are never reused, so
nothing newer can share it).

Ordering per key is (_commit_version, seqno): seqnos order a vbucket's changes, and a key lives in
one vbucket; _commit_version (the source's micro-batch number) keeps that order across a rollback
re-read, which starts the vbucket's seqnos again from 0. A rollback marker row for a vbucket voids
every row of that vbucket from earlier batches: the re-read that follows it is the whole truth.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.parse
from pathlib import Path

from .schema import CHANGE_TYPE, COMMIT_VERSION, DELETE, DROP, ROLLBACK, UPSERT

STATE_COLUMNS = ("scope", "collection", "key", "value", "vbucket", "seqno", "vbuuid", "cas", "rev_seqno", "flags",
                 "expiry", "datatype", COMMIT_VERSION, "collection_id")
KEY = ("scope", "collection", "key")
APP_ID = "dcpflow-state"


def latest_changes(changes):
    """Per key, the newest change (upsert or delete) among `changes`, after voiding rows that a
    rollback marker of their vbucket supersedes and rows of dropped collections. Returns
    (latest_df, reset_vbuckets_df, dropped_collection_ids_df)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    markers = (changes.filter(F.col(CHANGE_TYPE) == ROLLBACK).groupBy("vbucket")
               .agg(F.max(COMMIT_VERSION).alias("_reset_version")))
    dropped = changes.filter(F.col(CHANGE_TYPE) == DROP).select("collection_id").distinct()
    rows = (changes.filter(~F.col(CHANGE_TYPE).isin(ROLLBACK, DROP)).join(markers, "vbucket", "left")
            .filter(F.col("_reset_version").isNull() | (F.col(COMMIT_VERSION) >= F.col("_reset_version")))
            .drop("_reset_version").join(dropped, "collection_id", "left_anti"))
    order = Window.partitionBy(*KEY).orderBy(F.col(COMMIT_VERSION).desc(), F.col("seqno").desc())
    latest = rows.withColumn("_rank", F.row_number().over(order)).filter(F.col("_rank") == 1).drop("_rank")
    return latest, markers, dropped


def batch_summary(batch_df) -> dict:
    """What a writer needs of a batch on the driver, in one small aggregate: the newest change-log
    version in it, the vbuckets a rollback marker resets and the collection ids dropped (at most
    one per vbucket and dropped collection: bounded, whatever the batch's size)."""
    from pyspark.sql import functions as F

    row = batch_df.agg(
        F.max(COMMIT_VERSION).alias("version"),
        F.collect_set(F.when(F.col(CHANGE_TYPE) == ROLLBACK, F.col("vbucket"))).alias("resets"),
        F.collect_set(F.when(F.col(CHANGE_TYPE) == DROP, F.col("collection_id"))).alias("drops")).first()
    return {"version": None if row["version"] is None else int(row["version"]),
            "resets": sorted(int(v) for v in row["resets"]), "drops": sorted(int(c) for c in row["drops"])}


class StateWriter:
    """Keeps a latest-state table from change-log batches; `apply` is idempotent per batch id."""

    path: Path
    merged: dict[int, int | None]

    def changelog_version(self, batch_id: int) -> int | None:
        """The newest change-log version that state batch `batch_id` merged, if known."""
        return self.merged.get(batch_id)

    def apply(self, batch_df, batch_id: int) -> None:
        raise NotImplementedError

    def files(self) -> list[str]:
        """The Parquet files that make up the current state, each read whole (Spark, DuckDB, Polars)."""
        raise NotImplementedError

    def read(self, spark):
        """The current state as a Spark DataFrame."""
        files = self.files()
        if not files:
            return None
        return spark.read.parquet(*files)

    def scan(self, columns: list[str] | None = None):
        """The current state as a stream of Arrow record batches (a `pyarrow.RecordBatchReader`,
        read once), read without Spark - what DuckDB scans (`duckdb.sql("select ... from r")`) and
        `polars.from_arrow(r)` takes; None if there is no state yet."""
        import pyarrow.dataset as ds

        files = self.files()
        return ds.dataset(files, format="parquet").scanner(columns=columns).to_reader() if files else None

    def to_arrow(self, columns: list[str] | None = None):
        """The current state as a pyarrow Table (no rows if there is no state yet)."""
        import pyarrow as pa

        reader = self.scan(columns)
        if reader is None:
            return pa.table({c: pa.array([], pa.string()) for c in (columns or STATE_COLUMNS)})
        return reader.read_all()


class DeltaStateWriter(StateWriter):
    """The state as a Delta table, merged by Spark (Delta Lake's `MERGE INTO`)."""

    format = "delta"

    def __init__(self, path: str | Path, deletion_vectors: bool = True):
        self.path = Path(path).resolve()
        self.deletion_vectors = deletion_vectors  # for a table this writer creates
        self.merged: dict[int, int | None] = {}  # batch id -> change-log version, merged by this process

    def changelog_version(self, batch_id: int) -> int | None:
        """The newest change-log version (`_commit_version`) that state batch `batch_id` merged: from
        this process's memory, else from the batch's commit in the Delta log (its userMetadata)
        - as when the batches ran in a Spark Connect server's Python."""
        if batch_id in self.merged:
            return self.merged[batch_id]
        return DeltaLog(self.path).changelog_version(batch_id) if self.exists() else None

    def exists(self) -> bool:
        return (self.path / "_delta_log" / f"{0:020d}.json").exists()

    def last_batch(self) -> int:
        """The newest batch id merged (the table's app transaction), -1 if none."""
        return DeltaLog(self.path).snapshot().txns.get(APP_ID, -1) if self.exists() else -1

    def apply(self, batch_df, batch_id: int) -> None:
        if batch_id <= self.last_batch():
            return  # merged already (Delta would skip the MERGE too; this spares reading the batch)
        spark = batch_df.sparkSession
        batch_df = _once(batch_df)
        try:
            self._merge(spark, batch_df, batch_id)
        finally:
            batch_df.unpersist()

    def _merge(self, spark, batch_df, batch_id: int) -> None:
        from pyspark.sql import functions as F

        # The markers only (at most one row per vbucket and per dropped collection): the one thing
        # brought to the driver, to name the rows a rollback or a drop removes from the table.
        summary = batch_summary(batch_df)
        resets, drops = summary["resets"], summary["drops"]
        self.merged[batch_id] = summary["version"]
        meta = json.dumps({"changelog_version": summary["version"]})
        latest, _, _ = latest_changes(batch_df)
        latest = latest.select(*STATE_COLUMNS, CHANGE_TYPE)
        if not self.exists():
            # Nothing to merge into (the first batch: the initial catch-up): its upserts are the
            # state. One append instead of a MERGE that would probe an empty table for every key;
            # the batch id rides in the same commit.
            (latest.filter(F.col(CHANGE_TYPE) == UPSERT).select(*STATE_COLUMNS).write.format("delta")
             .mode("append").option("txnAppId", APP_ID).option("txnVersion", batch_id).option("userMetadata", meta)
             .option("delta.enableDeletionVectors", str(self.deletion_vectors).lower()).save(str(self.path)))
            return
        view = f"dcpflow_state_batch_{os.getpid()}_{batch_id}"
        latest.createOrReplaceTempView(view)
        newer = (f"(s.{COMMIT_VERSION} > t.{COMMIT_VERSION} OR "
                 f"(s.{COMMIT_VERSION} = t.{COMMIT_VERSION} AND s.seqno > t.seqno))")
        columns = ", ".join(STATE_COLUMNS)
        gone = [f"t.vbucket IN ({', '.join(map(str, resets))})"] if resets else []
        gone += [f"t.collection_id IN ({', '.join(map(str, drops))})"] if drops else []
        sql = (f"MERGE INTO delta.`{_quoted(self.path)}` AS t USING {view} AS s "
               f"ON {' AND '.join(f't.{c} = s.{c}' for c in KEY)} "
               f"WHEN MATCHED AND s.{CHANGE_TYPE} = '{DELETE}' AND {newer} THEN DELETE "
               f"WHEN MATCHED AND s.{CHANGE_TYPE} = '{UPSERT}' AND {newer} THEN UPDATE SET "
               + ", ".join(f"t.{c} = s.{c}" for c in STATE_COLUMNS) + " "
               f"WHEN NOT MATCHED AND s.{CHANGE_TYPE} = '{UPSERT}' THEN INSERT ({columns}) VALUES "
               f"({', '.join(f's.{c}' for c in STATE_COLUMNS)})"
               + (f" WHEN NOT MATCHED BY SOURCE AND ({' OR '.join(gone)}) THEN DELETE" if gone else ""))
        # Idempotence: Delta records (txnAppId, txnVersion) in the merge's commit and skips a DML
        # whose version is not above the one recorded (a replay: nothing merged twice). autoReset
        # clears both after the statement, so no other write of this session carries them.
        conf = spark.conf
        conf.set("spark.databricks.delta.write.txnAppId", APP_ID)
        conf.set("spark.databricks.delta.write.txnVersion", str(batch_id))
        conf.set("spark.databricks.delta.write.txnVersion.autoReset.enabled", "true")
        conf.set("spark.databricks.delta.commitInfo.userMetadata", meta)  # the change-log version merged
        speed = merge_settings(spark)
        for key, value in speed.items():
            conf.set(key, value)
        try:
            spark.sql(sql)
        finally:
            conf.unset("spark.databricks.delta.write.txnAppId")
            conf.unset("spark.databricks.delta.write.txnVersion")
            conf.unset("spark.databricks.delta.commitInfo.userMetadata")
            for key in speed:
                conf.unset(key)
            spark.catalog.dropTempView(view)

    def read(self, spark):
        return spark.read.format("delta").load(str(self.path)) if self.exists() else None

    def files(self) -> list[str]:
        """The live files when none has a deletion vector (a table made with deletion_vectors=False);
        otherwise read the table through a Delta reader: `scan()`, `to_arrow()`,
        `polars.read_delta`."""
        if not self.exists():
            return []
        snapshot = DeltaLog(self.path).snapshot()
        if snapshot.masked:
            raise ValueError(f"{self.path}: {len(snapshot.masked)} of its files have rows deleted by deletion vectors, "
                             f"which a plain Parquet read would return: read it as Delta (scan(), to_arrow(), "
                             f"polars.read_delta, Spark)")
        return [str(self.path / p) for p in snapshot.files]

    def scan(self, columns: list[str] | None = None):
        """The table read as Delta by delta-rs (the `deltalake` package, its DataFusion scan): the
        live files with the rows their deletion vectors delete left out. (delta-rs's
        `to_pyarrow_dataset` refuses a table with deletion vectors: a pyarrow dataset cannot
        leave rows out.)"""
        if not self.exists():
            return None
        import pyarrow as pa
        from deltalake import DeltaTable

        return pa.RecordBatchReader.from_stream(DeltaTable(str(self.path)).scan(columns=columns))


#: Delta's setting for the tasks that rebuild a table's snapshot from its log (a shuffle; 50 by default).
SNAPSHOT_PARTITIONS = "spark.databricks.delta.snapshotPartitions"


def merge_settings(spark) -> dict[str, str]:
    """Session settings for one MERGE of a micro-batch, where the session has none of its own.

    Profiled on a live batch (bench/RESULTS.md, "pipeline_scale.py"), most of a MERGE's time was
    Delta rebuilding the table's snapshot after the previous commit: a shuffle of the log into
    `snapshotPartitions` tasks, 50 by default, each with a task's fixed cost, for a log of a few
    files. Sized like the session's shuffles instead (about the cores). (Delta's own copy of the
    source, `materializeSource`, stays: turned off, Delta refuses a source that is cached, and the
    writer caches its batch for its several reads of it.)"""
    if spark.conf.get(SNAPSHOT_PARTITIONS, None) is None:
        return {SNAPSHOT_PARTITIONS: spark.conf.get("spark.sql.shuffle.partitions", "200")}
    return {}


def _once(batch_df):
    """The batch, cached on the executors' local disks for the several reads a writer makes of it.
    Besides sparing re-reads of the change log: `foreachBatch` hands over a DataFrame over the
    batch's own plan, and every computation of it adds to the query's `numInputRows`, so uncached,
    a plan reading it three times reported three times the batch's rows.

    On disk, not in memory: a catch-up batch is the whole bucket, and Spark builds a partition's
    in-memory cache in the heap before it can spill it. A 10,000,000-row first batch killed a 2 GB
    JVM that way (OutOfMemoryError, bench/RESULTS.md), as did 3,000,000 rows in 1 GB; on disk the
    same batches went through, the heap holding one cached chunk at a time whatever the batch's
    size. A live batch is small, so its cost on disk is little more than a write to the page cache."""
    from pyspark import StorageLevel

    return batch_df.persist(StorageLevel.DISK_ONLY)


def _file_id(action: dict) -> tuple[str, str | None]:
    """A live file's identity in a Delta log: its path and its deletion vector's id (the Delta
    protocol's reconciliation key). A MERGE that deletes rows of a file removes (path, old vector)
    and adds (path, new vector) in one commit, in either order: the path alone would lose the file."""
    dv = action.get("deletionVector")
    if not dv:
        return urllib.parse.unquote(action["path"]), None
    return urllib.parse.unquote(action["path"]), f"{dv['storageType']}{dv['pathOrInlineDv']}@{dv.get('offset')}"


def _quoted(path: Path) -> str:
    return str(path).replace("`", "``")


class DeltaSnapshot:
    """`files`: the live files read whole; `masked`: those a deletion vector hides rows of (only a
    Delta reader reads them right)."""

    def __init__(self, version: int, files: list[str], txns: dict[str, int], masked: list[str] = ()):
        self.version, self.files, self.txns, self.masked = version, files, txns, list(masked)


class DeltaLog:
    """Just enough of a Delta log reader to list a table's live files and its app transactions
    without a JVM (the Delta protocol's "Action Reconciliation": a checkpoint, then the JSON
    commits after it, in order), for readers that take Parquet files: DuckDB, Polars, pyarrow.
    Refuses what a plain Parquet read would get wrong (deletion vectors) or what it does not read
    (V2 checkpoints): use a Delta reader then (Spark, delta-rs)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.log = self.path / "_delta_log"

    def snapshot(self) -> DeltaSnapshot:
        files: dict[tuple, None] = {}  # live (path, deletion vector id or None), in log order
        txns: dict[str, int] = {}
        start = 0
        try:
            last = json.loads((self.log / "_last_checkpoint").read_text())
        except FileNotFoundError:
            last = None
        if last is not None:
            start = int(last["version"]) + 1
            self._checkpoint(int(last["version"]), int(last.get("parts") or 0), files, txns)
        versions = sorted(int(p.name[:20]) for p in self.log.glob("*.json") if p.name[:20].isdigit())
        version = start - 1
        for v in versions:
            if v < start:
                continue
            with open(self.log / f"{v:020d}.json") as f:
                for line in f:
                    if line.strip():
                        self._action(json.loads(line), files, txns)
            version = v
        return DeltaSnapshot(version, [f for f, dv in files if not dv], txns, [f for f, dv in files if dv])

    def changelog_version(self, batch_id: int, look: int = 20) -> int | None:
        """The change-log version recorded by the commit of state batch `batch_id` (searched among
        the newest `look` commits: the batch asked about is a recent one)."""
        versions = sorted((int(p.name[:20]) for p in self.log.glob("*.json") if p.name[:20].isdigit()),
                          reverse=True)[:look]
        for v in versions:
            txn = meta = None
            with open(self.log / f"{v:020d}.json") as f:
                for line in f:
                    action = json.loads(line) if line.strip() else {}
                    if action.get("txn", {}).get("appId") == APP_ID:
                        txn = int(action["txn"]["version"])
                    if "commitInfo" in action:
                        meta = action["commitInfo"].get("userMetadata")
            if txn == batch_id and meta:
                try:
                    return int(json.loads(meta)["changelog_version"])
                except (ValueError, KeyError, TypeError):
                    return None
        return None

    def _action(self, action: dict, files: dict, txns: dict) -> None:
        if "add" in action:
            add = action["add"]
            files[_file_id(add)] = None
        elif "remove" in action:
            files.pop(_file_id(action["remove"]), None)
        elif "txn" in action:
            txns[action["txn"]["appId"]] = int(action["txn"]["version"])

    def _checkpoint(self, version: int, parts: int, files: dict, txns: dict) -> None:
        import pyarrow.parquet as pq

        names = ([f"{version:020d}.checkpoint.parquet"] if not parts else
                 [f"{version:020d}.checkpoint.{i:010d}.{parts:010d}.parquet" for i in range(1, parts + 1)])
        for name in names:
            if not (self.log / name).exists():
                raise ValueError(f"{self.path}: checkpoint {name} not found (a V2 checkpoint? read it with a "
                                 f"Delta reader)")
            table = pq.read_table(self.log / name, columns=["add", "txn"])
            for add in table.column("add").to_pylist():
                if add is not None:
                    self._action({"add": add}, files, txns)
            for txn in table.column("txn").to_pylist():
                if txn is not None:
                    txns[txn["appId"]] = int(txn["version"])


class SnapshotStateWriter(StateWriter):
    """The state as versioned Parquet snapshots, `v<batch id>/`, with `_current.json` naming the
    live one (flipped atomically by rename) and a `current` symlink for tools that want a path."""

    format = "snapshot"

    def __init__(self, path: str | Path, keep: int = 2):
        self.path = Path(path)
        self.keep = keep
        self.merged: dict[int, int | None] = {}

    def changelog_version(self, batch_id: int) -> int | None:
        if batch_id in self.merged:
            return self.merged[batch_id]
        cur = self.current()
        return cur.get("changelog_version") if cur and cur["batch_id"] == batch_id else None

    @property
    def pointer(self) -> Path:
        return self.path / "_current.json"

    def current(self) -> dict | None:
        try:
            return json.loads(self.pointer.read_text())
        except FileNotFoundError:
            return None

    def last_batch(self) -> int:
        cur = self.current()
        return -1 if cur is None else int(cur["batch_id"])

    def apply(self, batch_df, batch_id: int) -> None:
        cur = self.current()
        if cur is not None and batch_id <= cur["batch_id"]:
            return
        spark = batch_df.sparkSession
        batch_df = _once(batch_df)
        try:
            self._compact(spark, cur, batch_df, batch_id)
        finally:
            batch_df.unpersist()

    def _compact(self, spark, cur: dict | None, batch_df, batch_id: int) -> None:
        from pyspark.sql import functions as F

        changes = batch_df.select(*STATE_COLUMNS, CHANGE_TYPE)
        if cur is not None:
            base = (spark.read.parquet(str(self.path / cur["dir"])).select(*STATE_COLUMNS)
                    .withColumn(CHANGE_TYPE, F.lit(UPSERT)))
            changes = base.unionByName(changes)
        latest, _, _ = latest_changes(changes)
        name = f"v{batch_id:012d}"
        target = self.path / name
        if target.exists():  # left by a crash before the pointer flip: not live, safe to redo
            shutil.rmtree(target)
        latest.filter(F.col(CHANGE_TYPE) == UPSERT).select(*STATE_COLUMNS).write.parquet(str(target))
        version = batch_summary(batch_df)["version"]
        self.merged[batch_id] = version
        self._flip(name, batch_id, version)
        self._prune(keep={name, cur["dir"] if cur else name})

    def _flip(self, name: str, batch_id: int, version: int | None = None) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        tmp = self.path / f"_current.json.{os.getpid()}"
        tmp.write_text(json.dumps({"batch_id": batch_id, "dir": name, "changelog_version": version}))
        os.replace(tmp, self.pointer)
        link = self.path / f".current.{os.getpid()}"
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(name)
        os.replace(link, self.path / "current")

    def _prune(self, keep: set[str]) -> None:
        versions = sorted(p.name for p in self.path.glob("v*") if p.is_dir())
        for name in versions[:-self.keep]:
            if name not in keep:
                shutil.rmtree(self.path / name, ignore_errors=True)

    def files(self) -> list[str]:
        cur = self.current()
        if cur is None:
            return []
        return sorted(str(p) for p in (self.path / cur["dir"]).glob("*.parquet"))


def make_writer(kind: str, path: str | Path) -> StateWriter:
    if kind == "delta":
        return DeltaStateWriter(path)
    if kind == "snapshot":
        return SnapshotStateWriter(path)
    raise ValueError(f"state format {kind!r}: use delta or snapshot")


def open_state(path: str | Path) -> StateWriter:
    """The writer of an existing state table, whichever format it is in."""
    path = Path(path)
    if (path / "_delta_log").exists():
        return DeltaStateWriter(path)
    if (path / "_current.json").exists():
        return SnapshotStateWriter(path)
    raise FileNotFoundError(f"{path} holds no dcpflow state table (no _delta_log/ or _current.json)")
