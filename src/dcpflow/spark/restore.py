"""`dcpflow restore`: rebuild a bucket from the pipeline's change log as it stood at a micro-batch
(point-in-time recovery from the lake).

The change log (`<lake>/changelog`, read through Spark's sink log: committed batches only) holds
every change with its metadata and the micro-batch that brought it (`_commit_version`). As of
version V, a key's document is its newest change among the batches up to V, after the rows that
a rollback marker voids (state.latest_changes, the same rule as the state table). Those rows are
written with `format("dcp")` and `withMeta=true`, by Spark tasks in parallel: the bucket then
holds each document with the CAS, rev seqno, flags and expiry it had at the source, and deleted
ones as tombstones with theirs.
"""

from __future__ import annotations

from pathlib import Path

from .schema import COMMIT_VERSION


class RestoreError(ValueError):
    """The lake or the version asked for cannot be restored (the message says why)."""


def versions(spark, lake: Path) -> tuple[int, int]:
    """(first, last) micro-batch version in the change log."""
    from pyspark.sql import functions as F

    changes = _changelog(spark, lake)
    row = changes.agg(F.min(COMMIT_VERSION).alias("lo"), F.max(COMMIT_VERSION).alias("hi")).first()
    if row is None or row["hi"] is None:
        raise RestoreError(f"the change log at {lake / 'changelog'} is empty")
    return int(row["lo"]), int(row["hi"])


def _changelog(spark, lake: Path):
    path = Path(lake) / "changelog"
    if not (path / "_spark_metadata").exists():
        raise RestoreError(f"{path} is not a change log written by `dcpflow pipeline` (no _spark_metadata)")
    return spark.read.parquet(str(path))


def restore(spark, lake, to: str, username: str, password: str, as_of: int | None = None,
            partitions: int | None = None, collections: list[str] | None = None) -> dict:
    """Write the bucket's documents as of micro-batch `as_of` (default: the newest) to `to` (a
    connection string with the bucket), each into the collection of its name there; with
    `collections` ("scope.collection" names) only theirs. Returns {"version", "documents",
    "tombstones"}."""
    from pyspark.sql import functions as F

    from .state import latest_changes

    lake = Path(lake)
    lo, hi = versions(spark, lake)
    version = hi if as_of is None else as_of
    if not lo <= version <= hi:
        raise RestoreError(f"--as-of {version}: the change log holds versions {lo}..{hi}")
    changes = _changelog(spark, lake).filter(F.col(COMMIT_VERSION) <= version)
    latest, _, _ = latest_changes(changes)
    if collections:
        chosen = []
        for name in collections:
            scope, dot, coll = name.partition(".")
            if not dot or not scope or not coll:
                raise RestoreError(f"--collection {name!r}: give it as SCOPE.COLLECTION")
            chosen.append((F.col("scope") == scope) & (F.col("collection") == coll))
        if "collection" not in latest.columns:
            raise RestoreError("this change log has no collection columns (a lake written before collections)")
        wanted = chosen[0]
        for c in chosen[1:]:
            wanted = wanted | c
        latest = latest.filter(wanted)
    latest = latest.repartition(partitions or spark.sparkContext.defaultParallelism, "vbucket").cache()
    counts = latest.groupBy((F.col("_change_type") == "delete").alias("d")).count().collect()
    (latest.write.format("dcp").mode("append")
     .options(connection=to, username=username, password=password, withMeta="true").save())
    latest.unpersist()
    by = {bool(r["d"]): int(r["count"]) for r in counts}
    return {"version": version, "documents": by.get(False, 0), "tombstones": by.get(True, 0)}
