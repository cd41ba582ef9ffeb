"""Both state writers against a plain-Python model of "latest state per key": upserts, deletes,
expirations, duplicates inside a batch, rollback markers with a re-read, several change-log
batches merged at once, and replays of a batch id (idempotence). The state must be readable by
Spark, DuckDB and Polars and equal in all three."""

import random

import duckdb
import polars as pl
import pytest

from dcpflow.spark.schema import schema_ddl
from dcpflow.spark.state import DeltaStateWriter, SnapshotStateWriter, open_state

NUM_VB = 4


def change(vb, seqno, key, event, version, value=None, vbuuid=77):
    ct = {"mutation": "upsert", "deletion": "delete", "expiration": "delete", "rollback": "rollback"}[event]
    return (vb, seqno, vbuuid, key, value, event, seqno * 10, 1, 0, 0, 1, seqno, seqno, ct, version, "_default",
            "_default", 0)


class Model:
    """What the state must be: the server's view, rebuilt by a vbucket-aware replay."""

    def __init__(self):
        self.state: dict[str, tuple[int, str]] = {}  # key -> (vb, value)

    def apply(self, rows):
        for vb, _seq, _uuid, key, value, event, *_rest in rows:
            if event == "rollback":
                self.state = {k: v for k, v in self.state.items() if v[0] != vb}
            elif event == "mutation":
                self.state[key] = (vb, value)
            else:
                self.state.pop(key, None)

    def expected(self):
        return {k: v[1] for k, v in self.state.items()}


def scenario(seed=7, batches=6):
    """Change-log batches as a DCP reader produces them: per vbucket, seqnos rise; a rollback
    re-read of one vbucket (marker, then its surviving keys from a low seqno) in batch 4."""
    rng = random.Random(seed)
    seq = dict.fromkeys(range(NUM_VB), 0)
    live: dict[str, int] = {}
    out = []
    for version in range(1, batches + 1):
        rows = []
        if version == 4:
            vb = 2
            rows.append(change(vb, 0, "", "rollback", version, vbuuid=99))
            survivors = sorted(k for k, v in live.items() if v == vb)[::2]
            for k in list(live):
                if live[k] == vb and k not in survivors:
                    del live[k]
            for i, k in enumerate(survivors, 1):
                rows.append(change(vb, i, k, "mutation", version, f"reread-{k}", vbuuid=99))
            seq[vb] = len(survivors)
        for _ in range(40):
            vb = rng.randrange(NUM_VB)
            seq[vb] += 1
            existing = [k for k, v in live.items() if v == vb]
            r = rng.random()
            if existing and r < 0.25:
                key = rng.choice(existing)
                event = rng.choice(["deletion", "expiration"])
                del live[key]
                rows.append(change(vb, seq[vb], key, event, version))
            else:
                key = rng.choice(existing) if existing and r < 0.6 else f"k{vb}-{seq[vb]}"
                live[key] = vb
                rows.append(change(vb, seq[vb], key, "mutation", version, f"v{version}-{seq[vb]}-{key}"))
        out.append(rows)
    return out


@pytest.fixture(params=["delta", "snapshot"])
def writer(request, tmp_path):
    return (DeltaStateWriter if request.param == "delta" else SnapshotStateWriter)(tmp_path / "state")


def read_three_ways(spark, writer):
    """The state by Spark, by DuckDB and by Polars, each the way docs/spark.md tells users: DuckDB
    scans the writer's Arrow stream (delta-rs for a Delta table: deletion vectors honoured),
    Polars reads a Delta table with `read_delta` and a snapshot's Parquet files with
    `read_parquet`."""
    df = writer.read(spark)
    by_spark = {} if df is None else {r["key"]: r["value"] for r in df.select("key", "value").collect()}
    stream = writer.scan(["key", "value"])
    by_duck = dict(duckdb.sql("select key, value from stream").fetchall()) if stream is not None else {}
    if writer.format == "delta":
        by_polars = dict(pl.read_delta(str(writer.path)).select("key", "value").iter_rows()) if df is not None else {}
    else:
        files = writer.files()
        by_polars = dict(pl.read_parquet(files).select("key", "value").iter_rows()) if files else {}
    return by_spark, by_duck, by_polars


def test_writer_matches_model_with_rollback_and_replays(spark, writer):
    schema = schema_ddl("string", "STRING")
    model = Model()
    batches = scenario()
    # Change-log batches 1-2 go to the state as state batch 0, 3 as 1, 4-6 as 2: a state batch may
    # hold several change-log batches, including one with a rollback marker.
    groups = [batches[0] + batches[1], batches[2], batches[3] + batches[4] + batches[5]]
    for state_batch, rows in enumerate(groups):
        df = spark.createDataFrame(rows, schema)
        writer.apply(df, state_batch)
        model.apply(rows)
        if state_batch == 1:
            before = read_three_ways(spark, writer)[0]
            writer.apply(df, state_batch)  # a replay: must change nothing
            writer.apply(spark.createDataFrame(groups[0], schema), 0)  # an older batch id: ignored
            assert read_three_ways(spark, writer)[0] == before
    assert writer.last_batch() == 2
    spark_view, duck_view, polars_view = read_three_ways(spark, writer)
    assert spark_view == model.expected()
    assert duck_view == spark_view and polars_view == spark_view
    naive = Model()  # ignoring rollback markers would give a different state: the scenario tests them
    naive.apply([r for rows in groups for r in rows if r[5] != "rollback"])
    assert naive.expected() != spark_view
    assert type(open_state(writer.path)) is type(writer)


def test_delta_replay_leaves_table_version_alone(spark, tmp_path):
    """A replayed batch id (Spark re-runs a batch after a failure) is skipped by Delta itself: no
    new commit, whether the batch was the table's first (an append) or a MERGE."""
    from dcpflow.spark.state import DeltaLog

    writer = DeltaStateWriter(tmp_path / "state")
    schema = schema_ddl("string", "STRING")
    df = spark.createDataFrame([change(0, 1, "a", "mutation", 1, "x"), change(0, 2, "a", "mutation", 1, "y")], schema)
    writer.apply(df, 5)
    version = DeltaLog(writer.path).snapshot().version
    writer.apply(df, 5)
    writer.apply(df, 3)
    assert DeltaLog(writer.path).snapshot().version == version
    assert writer.last_batch() == 5
    later = spark.createDataFrame([change(0, 3, "a", "mutation", 2, "z"), change(0, 4, "b", "mutation", 2, "w")],
                                  schema)
    writer.apply(later, 6)
    merged = DeltaLog(writer.path).snapshot().version
    assert merged == version + 1 and writer.last_batch() == 6
    # the same MERGE again under its batch id, and under an older one: Delta skips both
    again = spark.createDataFrame([change(0, 5, "a", "mutation", 3, "replayed")], schema)
    writer.apply(again, 6)
    writer.apply(again, 4)
    writer._merge(spark, again, 6)  # past the writer's own check: Delta's app transaction skips it
    assert DeltaLog(writer.path).snapshot().version == merged
    assert pl.read_delta(str(writer.path)).select("key", "value").sort("key").rows() == [("a", "z"), ("b", "w")]
    # no leftover transaction settings on the session: a later write carries no batch id
    assert spark.conf.get("spark.databricks.delta.write.txnVersion", None) is None


def test_marker_alone_empties_its_vbucket(spark, writer):
    # After a rollback to an empty vbucket the re-read has no rows: the marker alone must clear it.
    schema = schema_ddl("string", "STRING")
    writer.apply(spark.createDataFrame([change(0, 1, "a", "mutation", 1, "x"), change(1, 1, "b", "mutation", 1, "y")],
                                       schema), 0)
    writer.apply(spark.createDataFrame([change(1, 0, "", "rollback", 2, vbuuid=5)], schema), 1)
    assert read_three_ways(spark, writer)[0] == {"a": "x"}


def test_first_batch_into_an_empty_state(spark, writer):
    """The first batch (the Delta writer appends it instead of merging): deletes of keys it also
    wrote, and a rollback marker voiding its vbucket's earlier rows, leave only what survives."""
    schema = schema_ddl("string", "STRING")
    rows = [change(0, 1, "a", "mutation", 1, "x"), change(1, 1, "b", "mutation", 1, "y"),
            change(0, 2, "a", "deletion", 1), change(0, 3, "d", "mutation", 1, "w"),
            change(0, 4, "d", "expiration", 1), change(1, 0, "", "rollback", 2, vbuuid=5),
            change(1, 1, "c", "mutation", 2, "z", vbuuid=5)]
    writer.apply(spark.createDataFrame(rows, schema), 0)
    assert read_three_ways(spark, writer) == ({"c": "z"},) * 3
    writer.apply(spark.createDataFrame([change(1, 2, "c", "deletion", 3, vbuuid=5)], schema), 1)
    assert read_three_ways(spark, writer)[0] == {}


def test_a_state_batch_reports_its_rows_once(spark, writer, tmp_path):
    """The state query's progress counts each change-log row once (the snapshot writer's plan read
    its batch three times, and a 1M-row batch was reported as 3,000,000 rows)."""
    schema = schema_ddl("string", "STRING")
    rows = [r for batch in scenario(seed=3, batches=4) for r in batch]
    spark.createDataFrame(rows, schema).write.parquet(str(tmp_path / "log"))
    query = (spark.readStream.schema(schema).parquet(str(tmp_path / "log")).writeStream
             .foreachBatch(writer.apply).option("checkpointLocation", str(tmp_path / "chk"))
             .trigger(availableNow=True).start())
    query.awaitTermination(300)
    assert query.exception() is None
    assert sum(p["numInputRows"] for p in query.recentProgress) == len(rows)


def test_a_batch_is_cached_on_disk_not_in_the_heap(spark):
    """A writer caches its batch for its several reads of it; a catch-up batch is the whole bucket,
    and cached in memory it killed a 2 GB JVM at 10,000,000 rows (Spark builds a partition's
    in-memory cache in the heap before spilling it). Spark's own storage accounting: the batch
    adds bytes on disk and none in memory."""
    from dcpflow.spark.state import _once

    def stored():
        infos = spark.sparkContext._jsc.sc().getRDDStorageInfo()
        return sum(i.memSize() for i in infos), sum(i.diskSize() for i in infos)

    memory, disk = stored()
    schema = schema_ddl("string", "STRING")
    batch = _once(spark.createDataFrame([change(v, s, f"k{v}-{s}", "mutation", 1, "x" * 200) for v in range(NUM_VB)
                                         for s in range(1, 500)], schema))
    try:
        assert batch.count() == NUM_VB * 499
        now_memory, now_disk = stored()
        assert now_memory == memory and now_disk > disk, (memory, disk, now_memory, now_disk)
    finally:
        batch.unpersist(blocking=True)


def test_a_merge_runs_no_stage_wider_than_the_cores(spark, tmp_path):
    """A live batch's MERGE was mostly Delta rebuilding the table's snapshot in its default 50
    tasks (a task's fixed cost each, for a log of a few files): every stage of a merge is now as
    wide as the session's shuffles at most, with the session's own setting left alone after it."""
    from dcpflow.spark.state import SNAPSHOT_PARTITIONS

    writer = DeltaStateWriter(tmp_path / "state")
    schema = schema_ddl("string", "STRING")
    writer.apply(spark.createDataFrame([change(v, s, f"k{v}-{s}", "mutation", 1, "x") for v in range(NUM_VB)
                                        for s in range(1, 30)], schema), 0)
    spark.conf.unset(SNAPSHOT_PARTITIONS)  # as a user's session without dcpflow's setting: Delta's 50
    group = f"merge-width-{tmp_path.name}"
    spark.sparkContext.setJobGroup(group, "a merge")
    try:
        writer.apply(spark.createDataFrame([change(0, 40, "k0-1", "mutation", 2, "y"),
                                            change(1, 40, "new", "mutation", 2, "z")], schema), 1)
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
        spark.conf.set(SNAPSHOT_PARTITIONS, spark.conf.get("spark.sql.shuffle.partitions"))
    tracker = spark.sparkContext.statusTracker()
    widths = [tracker.getStageInfo(s).numTasks for j in tracker.getJobIdsForGroup(group)
              for s in tracker.getJobInfo(j).stageIds if tracker.getStageInfo(s) is not None]
    assert widths and max(widths) <= int(spark.conf.get("spark.sql.shuffle.partitions")), widths
    state = dict(writer.read(spark).select("key", "value").collect())
    assert state["k0-1"] == "y" and state["new"] == "z" and len(state) == NUM_VB * 29 + 1


def test_a_live_merge_writes_its_rows_not_the_table(spark, tmp_path):
    """With deletion vectors a MERGE writes the batch's changed and new rows and marks the old
    versions deleted in the files that held them, instead of rewriting every file holding a key
    of the batch (with DCP's random keys: every file of the table, O(table) per live batch). The
    table's readers leave the marked rows out: Spark, DuckDB over delta-rs's scan, Polars'
    read_delta; a plain Parquet listing of its files is refused."""
    import json

    writer = DeltaStateWriter(tmp_path / "state")
    schema = schema_ddl("string", "STRING")
    writer.apply(spark.createDataFrame([change(v, s, f"k{v}-{s}", "mutation", 1, "x") for v in range(NUM_VB)
                                        for s in range(1, 30)], schema), 0)
    writer.apply(spark.createDataFrame([change(0, 40, "k0-1", "mutation", 2, "y"), change(1, 40, "k1-2", "deletion", 2),
                                        change(1, 41, "new", "mutation", 2, "z")], schema), 1)
    log = sorted((writer.path / "_delta_log").glob("*.json"))[-1]
    actions = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    written = sum(json.loads(a["add"]["stats"])["numRecords"] for a in actions
                  if "add" in a and not a["add"].get("deletionVector"))
    assert written == 2, actions  # k0-1's new version and "new"; the 115 untouched rows stay where they were
    assert any("add" in a and a["add"].get("deletionVector") for a in actions)
    want = {f"k{v}-{s}": "x" for v in range(NUM_VB) for s in range(1, 30)} | {"k0-1": "y", "new": "z"}
    del want["k1-2"]
    assert read_three_ways(spark, writer) == (want,) * 3
    with pytest.raises(ValueError, match="deletion vectors"):
        writer.files()


@pytest.mark.parametrize("remove_first", [True, False])
def test_the_log_reader_keeps_a_file_whose_deletion_vector_changed(tmp_path, remove_first):
    """A MERGE that deletes rows of a file removes (path, old vector) and adds (path, new vector) in
    one commit, in either order (the Delta protocol reconciles files by path and vector id): the
    file stays live, listed as masked. Keyed by path alone, the remove after the add dropped it."""
    import json

    from dcpflow.spark.state import DeltaLog

    log = tmp_path / "_delta_log"
    log.mkdir()
    dv = {"storageType": "u", "pathOrInlineDv": "vector0", "offset": 1, "sizeInBytes": 34, "cardinality": 2}
    commits = [[{"add": {"path": "a.parquet"}}, {"add": {"path": "b.parquet"}}],
               [{"remove": {"path": "a.parquet"}}, {"add": {"path": "a.parquet", "deletionVector": dv}},
                {"txn": {"appId": "dcpflow-state", "version": 1}}]]
    if not remove_first:
        commits[1][:2] = commits[1][1::-1]
    for version, actions in enumerate(commits):
        (log / f"{version:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))
    snapshot = DeltaLog(tmp_path).snapshot()
    assert snapshot.files == ["b.parquet"] and snapshot.masked == ["a.parquet"]
    assert snapshot.txns == {"dcpflow-state": 1}
