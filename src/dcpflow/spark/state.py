"""The latest-state table: one row per live key, built from the change log, tombstones applied.

Two writers behind one interface, `apply(batch_df, batch_id)`, made for `foreachBatch` and
idempotent per batch id (Spark re-runs a batch after a failure with the same id):

* `DeltaStateWriter` - a Delta table kept with delta-rs (`deltalake`) MERGE; no JVM jars needed
  (Spark would have to fetch them from Maven, and no Delta runtime for Spark 4 is on PyPI). The
  batch id goes into the commit as a Delta app transaction, so a replayed batch is skipped.
  Collects each batch's latest changes to the driver (Arrow): right for one machine, not for
  scale-out.
* `SnapshotStateWriter` - Spark only, nothing collected: latest(current snapshot ∪ batch) is
  written to a new versioned directory, then a pointer is flipped. Scales with Spark; costs
  O(state) per batch, so give its query a longer trigger interval (it is a compaction).

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


class StateWriter:
    """Keeps a latest-state table from change-log batches; `apply` is idempotent per batch id."""

    path: Path

    def apply(self, batch_df, batch_id: int) -> None:
        raise NotImplementedError

    def files(self) -> list[str]:
        """The Parquet files that make up the current state (readable by Spark, DuckDB, Polars)."""
        raise NotImplementedError

    def read(self, spark):
        """The current state as a Spark DataFrame."""
        files = self.files()
        if not files:
            return None
        return spark.read.parquet(*files)


class DeltaStateWriter(StateWriter):
    """The state as a Delta table, merged with delta-rs on the driver."""

    format = "delta"

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def _table(self):
        from deltalake import DeltaTable

        return DeltaTable(str(self.path)) if DeltaTable.is_deltatable(str(self.path)) else None

    def last_batch(self) -> int:
        table = self._table()
        if table is None:
            return -1
        version = table.transaction_version(APP_ID)
        return -1 if version is None else int(version)

    def apply(self, batch_df, batch_id: int) -> None:
        import pyarrow.compute as pc
        from deltalake import CommitProperties, Transaction, write_deltalake
        from pyspark.sql import functions as F

        if batch_id <= self.last_batch():
            return  # already merged: Spark is replaying this batch
        batch_df = batch_df.persist()  # read by two actions below; read the change log once
        try:
            latest, markers, dropped = latest_changes(batch_df)
            resets = sorted(r["vbucket"] for r in markers.collect())
            drops = sorted(r["collection_id"] for r in dropped.collect())
            source = latest.select(*STATE_COLUMNS, F.col(CHANGE_TYPE)).toArrow()
        finally:
            batch_df.unpersist()
        source = _plain_strings(source)
        commit = CommitProperties(app_transactions=[Transaction(app_id=APP_ID, version=batch_id)])
        table = self._table()
        if table is None or not table.file_uris():
            # Nothing to merge into (the first batch: the initial catch-up): the batch's upserts are
            # the state. One append, with the batch id in the same commit, instead of a MERGE that
            # would probe an empty table for every key.
            upserts = source.filter(pc.equal(source[CHANGE_TYPE], UPSERT)).select(list(STATE_COLUMNS))
            write_deltalake(str(self.path), upserts, mode="append", commit_properties=commit)
            return
        if source.num_rows == 0 and not resets and not drops:
            # Nothing to change, but record the batch so a replay is recognised.
            write_deltalake(str(self.path), source.select(list(STATE_COLUMNS)).slice(0, 0), mode="append",
                            commit_properties=commit)
            return
        newer = (f"(s.{COMMIT_VERSION} > t.{COMMIT_VERSION} OR "
                 f"(s.{COMMIT_VERSION} = t.{COMMIT_VERSION} AND s.seqno > t.seqno))")
        columns = {c: f"s.{c}" for c in STATE_COLUMNS}
        merger = (table.merge(source=source, predicate=" AND ".join(f"t.{c} = s.{c}" for c in KEY), source_alias="s",
                              target_alias="t", commit_properties=commit)
                  .when_matched_delete(predicate=f"s.{CHANGE_TYPE} = '{DELETE}' AND {newer}")
                  .when_matched_update(updates=columns, predicate=f"s.{CHANGE_TYPE} = '{UPSERT}' AND {newer}")
                  .when_not_matched_insert(updates=columns, predicate=f"s.{CHANGE_TYPE} = '{UPSERT}'"))
        gone = []
        if resets:
            gone.append(f"t.vbucket IN ({', '.join(str(v) for v in resets)})")
        if drops:
            gone.append(f"t.collection_id IN ({', '.join(str(c) for c in drops)})")
        if gone:
            merger = merger.when_not_matched_by_source_delete(predicate=" OR ".join(gone))
        merger.execute()

    def files(self) -> list[str]:
        table = self._table()
        if table is None:
            return []
        return [uri.removeprefix("file://") for uri in table.file_uris()]


def _plain_strings(table):
    """large_string/large_binary → string/binary, so the Delta schema stays the one Spark uses."""
    import pyarrow as pa

    def fix(t):
        if pa.types.is_large_string(t):
            return pa.string()
        if pa.types.is_large_binary(t):
            return pa.binary()
        if pa.types.is_struct(t):
            return pa.struct([pa.field(f.name, fix(f.type), f.nullable) for f in t])
        if pa.types.is_large_list(t) or pa.types.is_list(t):
            return pa.list_(pa.field(t.value_field.name, fix(t.value_type), t.value_field.nullable))
        return t

    schema = pa.schema([pa.field(f.name, fix(f.type), f.nullable) for f in table.schema])
    return table if schema == table.schema else table.cast(schema)


class SnapshotStateWriter(StateWriter):
    """The state as versioned Parquet snapshots, `v<batch id>/`, with `_current.json` naming the
    live one (flipped atomically by rename) and a `current` symlink for tools that want a path."""

    format = "snapshot"

    def __init__(self, path: str | Path, keep: int = 2):
        self.path = Path(path)
        self.keep = keep

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
        from pyspark.sql import functions as F

        cur = self.current()
        if cur is not None and batch_id <= cur["batch_id"]:
            return
        spark = batch_df.sparkSession
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
        self._flip(name, batch_id)
        self._prune(keep={name, cur["dir"] if cur else name})

    def _flip(self, name: str, batch_id: int) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        tmp = self.path / f"_current.json.{os.getpid()}"
        tmp.write_text(json.dumps({"batch_id": batch_id, "dir": name}))
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
