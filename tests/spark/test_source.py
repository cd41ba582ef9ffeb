"""The `dcp` source against a real dcpflow server (in-process thread, or a subprocess where a test
must kill it): batch reads equal the server's contents; streams resume from their checkpoint
without loss or duplication; admission control bounds batches; bad options fail clearly; a
rollback after an unclean server restart is repaired so the state equals the server again."""

import time

import pytest
from pyspark.errors import PySparkException

from dcpflow.client.workload import Loader, Workload, churn_round, load_initial
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from dcpflow.spark.pipeline import Pipeline, PipelineConfig

from ..resources import wait_for
from ..server.client import RawClient

USER, PASSWORD = "Administrator", "password"


def conn(port: int) -> str:
    return f"couchbase://127.0.0.1:{port}/default"


def source_options(port: int, **extra) -> dict:
    return {"connection": conn(port), "username": USER, "password": PASSWORD, "valueFormat": "string",
            **{k: str(v) for k, v in extra.items()}}


def write(port: int, work: Workload, rounds: int = 0, initial: bool = True) -> dict[str, str]:
    """Load and churn through the official SDK; return the server's contents for every key touched."""
    with Loader(conn(port), USER, PASSWORD) as loader:
        if initial:
            load_initial(loader, work)
        for i in range(rounds):
            churn_round(loader, work, i)
        return {k: v.decode() for k, v in loader.get_all(list(work.versions)).items()}


def latest_per_key(rows) -> dict[str, str]:
    """Replay change rows in (_commit_version, seqno) order per vbucket, markers included."""
    state: dict[str, tuple[int, str]] = {}
    for r in sorted(rows, key=lambda r: (r["_commit_version"], r["vbucket"], r["seqno"])):
        if r["_change_type"] == "rollback":
            state = {k: v for k, v in state.items() if v[0] != r["vbucket"]}
        elif r["_change_type"] == "upsert":
            state[r["key"]] = (r["vbucket"], r["value"])
        else:
            state.pop(r["key"], None)
    return {k: v[1] for k, v in state.items()}


def test_batch_read_equals_server_contents(spark, server):
    work = Workload(docs=3000, updates=900, deletes=300, expiring=0, rounds=3, seed=1)
    truth = write(server.port, work, rounds=3)
    df = spark.read.format("dcp").options(**source_options(server.port, partitions=3)).load()
    rows = df.collect()
    assert latest_per_key(rows) == truth
    assert len({(r["vbucket"], r["seqno"]) for r in rows}) == len(rows)
    assert {r["event"] for r in rows} >= {"mutation", "deletion"}
    assert all(r["_commit_version"] == 1 and r["vbuuid"] > 0 for r in rows)  # a batch read is one "batch"

    # A subset of vbuckets, keys as binary, and values parsed as JSON (given and inferred schemas).
    sub = (spark.read.format("dcp").options(**source_options(server.port, vbuckets="0-9", keyFormat="binary",
                                                             valueFormat="json", valueSchema="type STRING, id BIGINT"))
           .load().filter("_change_type = 'upsert'").select("vbucket", "key", "value.type", "value.id").collect())
    assert sub and {r["vbucket"] for r in sub} <= set(range(10))
    for r in sub:
        key = r["key"].decode()
        assert key in truth and r["type"] == key.split("::")[0]
    inferred = spark.read.format("dcp").options(**source_options(server.port, valueFormat="json",
                                                                 inferSchemaSamples=500)).load()
    fields = set(inferred.schema["value"].dataType.fieldNames())
    assert {"type", "version", "email", "items", "sku"} <= fields
    one = inferred.filter("key = 'order::00000002' OR value.type = 'order'").select("key", "value.total").first()
    import json
    assert one["total"] == json.loads(truth[one["key"]])["total"]


def test_stream_admission_control_and_resume_from_checkpoint(spark, server, tmp_path):
    work = Workload(docs=2000, updates=500, deletes=200, expiring=0, rounds=2, seed=2)
    write(server.port, work)
    out, ckpt = str(tmp_path / "changelog"), str(tmp_path / "ckpt")

    def run(limit):
        q = (spark.readStream.format("dcp").options(**source_options(server.port, maxSeqnosPerTrigger=limit)).load()
             .writeStream.format("parquet").option("path", out).option("checkpointLocation", ckpt)
             .trigger(availableNow=True).start())
        q.awaitTermination()
        return [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]

    first = run(700)
    assert sum(first) == 2000 and max(first) <= 700 and len(first) >= 3  # bounded micro-batches
    truth = write(server.port, work, rounds=2, initial=False)
    second = run(100_000)
    assert 0 < sum(second) <= 700  # only the new changes: nothing read twice
    rows = spark.read.parquet(out).collect()
    assert len({(r["vbucket"], r["seqno"]) for r in rows}) == len(rows)  # no duplicates
    assert latest_per_key(rows) == truth  # no loss
    versions = sorted({r["_commit_version"] for r in rows})
    assert versions == list(range(1, len(first) + len(second) + 1))


def test_latest_start_is_fixed_once_planned_even_across_a_driver_restart(server):
    """startingOffsets=latest: Spark asks initialOffset() again to run (or, after a driver restart,
    re-run) the first batch. Neither a second answer nor a new reader's newer one may skip the
    changes the first batch was planned to read."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from dcpflow.spark.source import DcpDataSource

    def reader():
        source = DcpDataSource(source_options(server.port, startingOffsets="latest"))
        r = source.streamReader(source.schema())
        r.STATE_REUSE_SECONDS = 0  # every call looks at the server again
        return r

    write(server.port, Workload(docs=100, updates=0, deletes=0, expiring=0, rounds=0, seed=11))
    first = reader()
    initial = first.initialOffset()
    write(server.port, Workload(docs=50, updates=0, deletes=0, expiring=0, rounds=0, seed=12))
    assert first.initialOffset() == initial  # the same answer, though the server moved on
    end = first.latestOffset(initial, ReadAllAvailable())

    def planned(r, start):
        return sum(rng.weight for p in r.partitions(start, end) for rng in p.ranges)

    assert planned(first, initial) == 50
    write(server.port, Workload(docs=30, updates=0, deletes=0, expiring=0, rounds=0, seed=13))
    second = reader()  # the restarted driver's reader: "latest" is 30 seqnos further now
    assert second.initialOffset() != initial
    assert planned(second, second.initialOffset()) == 50  # the logged batch still reads its 50
    for r in (first, second):
        r.stop()


def test_available_now_ends_without_asking_the_server_again(server, monkeypatch):
    """Once a run has read up to the high seqnos it started with, Spark's closing latestOffset is
    answered from the run's own view: the offset it holds, unchanged, and no server round trip."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from dcpflow.spark import source as source_mod

    write(server.port, Workload(docs=60, updates=0, deletes=0, expiring=0, rounds=0, seed=21))
    src = source_mod.DcpDataSource(source_options(server.port))
    r = src.streamReader(src.schema())
    r.STATE_REUSE_SECONDS = 0  # every _state() call would look at the server
    looks = []
    real = source_mod.server_state
    monkeypatch.setattr(source_mod, "server_state", lambda *a: looks.append(1) or real(*a))
    try:
        r.prepareForTriggerAvailableNow()
        start = r.initialOffset()
        end = r.latestOffset(start, ReadAllAvailable())
        assert end != start
        write(server.port, Workload(docs=10, updates=0, deletes=0, expiring=0, rounds=0, seed=22))
        before = len(looks)
        assert r.latestOffset(end, ReadAllAvailable()) == end  # done: the 10 new ones are the next run's
        assert len(looks) == before
        assert r.latestOffset(start, ReadAllAvailable()) == end  # short of the target: it still looks
        assert len(looks) == before + 1
    finally:
        r.stop()


def test_bad_options_fail_at_load_naming_the_option(spark, server):
    with pytest.raises(PySparkException, match="Did you mean 'maxSeqnosPerTrigger'"):
        spark.readStream.format("dcp").options(**source_options(server.port, maxSeqnoPerTrigger=5)).load()
    with pytest.raises(PySparkException, match="bucket 'default' has 64 vbuckets"):
        spark.read.format("dcp").options(**source_options(server.port, vbuckets="60-70")).load().collect()
    with pytest.raises(PySparkException, match="(?i)auth"):
        opts = {**source_options(server.port), "password": "wrong"}
        spark.read.format("dcp").options(**opts).load().collect()
    # an offset for a vbucket the bucket does not have is not dropped without a word
    with pytest.raises(PySparkException, match="option 'startingOffsets': bucket 'default' has 64 vbuckets"):
        spark.read.format("dcp").options(**source_options(
            server.port, startingOffsets='{"70": {"vbuuid": 1, "seqno": 5}}')).load().collect()
    # endingOffsets means nothing to a stream: refused when the query starts, not ignored
    with pytest.raises(PySparkException, match="'endingOffsets' applies to batch reads"):
        q = (spark.readStream.format("dcp").options(**source_options(server.port, endingOffsets="latest")).load()
             .writeStream.format("noop").trigger(availableNow=True).start())
        q.awaitTermination(120)


def test_vbuckets_added_on_restart_are_read_from_the_beginning(spark, server, tmp_path):
    """A query restarted from its checkpoint with a wider `vbuckets` option reads the new vbuckets
    from seqno 0 (as a Kafka source does with new partitions) instead of never reading them."""
    work = Workload(docs=600, updates=0, deletes=0, expiring=0, rounds=0, seed=5)
    truth = write(server.port, work)
    out, ckpt = str(tmp_path / "changelog"), str(tmp_path / "ckpt")

    def run(**extra):
        q = (spark.readStream.format("dcp").options(**source_options(server.port, **extra)).load()
             .writeStream.format("parquet").option("path", out).option("checkpointLocation", ckpt)
             .trigger(availableNow=True).start())
        q.awaitTermination()

    run(vbuckets="0-31")
    first = {r["vbucket"] for r in spark.read.parquet(out).select("vbucket").distinct().collect()}
    assert first and first <= set(range(32))
    run()  # every vbucket now
    rows = spark.read.parquet(out).collect()
    assert {r["vbucket"] for r in rows} - first  # the added vbuckets were read
    assert len({(r["vbucket"], r["seqno"]) for r in rows}) == len(rows)  # and nothing twice
    assert latest_per_key(rows) == truth


def test_rollback_after_unclean_restart_repairs_the_state(spark, spawn_server, tmp_path):
    data = tmp_path / "data"
    args = ["--data-dir", str(data), "--vbuckets", "16", "--flush-interval", "0.05"]
    srv = spawn_server(*args)
    work = Workload(docs=800, updates=300, deletes=100, expiring=0, rounds=3, seed=3)
    write(srv.port, work)
    with RawClient(srv.port) as c:
        c.login()
        wait_for(lambda: int(c.stats()["ep_queue_size"]) == 0, what="the loaded rounds persisted")
        assert c.call(Opcode.STOP_PERSISTENCE).status == Status.SUCCESS
    lost = write(srv.port, work, rounds=1, initial=False)  # acknowledged, in memory only
    config = PipelineConfig(connection=conn(srv.port), username=USER, password=PASSWORD, lake=tmp_path / "lake",
                            state_format="delta")
    pipeline = Pipeline(spark, config)
    pipeline.run_available_now()
    assert _state(pipeline) == lost  # the pipeline saw the writes that are about to be lost

    before = _offsets_now(spark, srv.port)
    srv.kill9()
    srv = spawn_server(*args)  # unclean restart: the unflushed round is gone, new failover entries
    config.connection = conn(srv.port)
    _check_worker_repair(srv.port, before)
    with Loader(conn(srv.port), USER, PASSWORD) as loader:
        after_restart = {k: v.decode() for k, v in loader.get_all(list(work.versions)).items()}
    assert after_restart != lost
    truth = write(srv.port, work, rounds=3, initial=False)  # and life goes on on the new branch
    pipeline = Pipeline(spark, config)
    pipeline.run_available_now()
    assert _state(pipeline) == truth
    markers = pipeline.changelog().filter("_change_type = 'rollback'").select("vbucket").distinct().count()
    assert markers > 0
    # The driver saw the new failover entries and planned the re-reads (not only the readers' fallback).
    logs = [p.read_text() for p in (tmp_path / "lake" / "_checkpoints" / "changelog" / "offsets").glob("[0-9]*")]
    assert any('"resets"' in text for text in logs)


def _offsets_now(spark, port):
    from dcpflow.spark.options import parse_options
    from dcpflow.spark.source import ClientSession, server_state

    session = ClientSession(parse_options(source_options(port)))
    try:
        return session.run(lambda c: server_state(c, range(c.num_vbuckets)))
    finally:
        session.close()


def _check_worker_repair(port, before):
    """A range planned before the restart and read after it: the reader notices the history changed
    and yields a rollback marker, then the vbucket's whole current contents (read from 0)."""
    from pyspark.sql.types import StringType

    from dcpflow.spark import offsets as off
    from dcpflow.spark.options import parse_options
    from dcpflow.spark.source import DcpPartition, read_partition

    from .test_schema import spark_schema

    high, logs = before
    vb = max(high, key=lambda v: high[v])
    uuid = logs[vb][0][0]
    planned = off.VbRange(vb, off.Offset.at(uuid, high[vb] // 2), high[vb], uuid)
    opts = parse_options(source_options(port))
    batches = list(read_partition(opts, spark_schema(StringType()), DcpPartition([planned], 9)))
    rows = [r for b in batches for r in b.to_pylist()]
    assert rows[0]["_change_type"] == "rollback" and rows[0]["vbucket"] == vb
    with Loader(conn(port), USER, PASSWORD) as loader:
        keys = [r["key"] for r in rows[1:]]
        current = {k: v.decode() for k, v in loader.get_all(keys).items()}
    assert latest_per_key(rows) == current and current


def _state(pipeline: Pipeline) -> dict[str, str]:
    df = pipeline.state()
    return {} if df is None else {r["key"]: r["value"] for r in df.select("key", "value").collect()}


DRIVER = """
import sys
from dcpflow.spark.pipeline import Pipeline, PipelineConfig
from dcpflow.spark.session import local_session
spark = local_session("killed-driver", cores=2, driver_memory="1g", fast_start=True)
config = PipelineConfig(connection=sys.argv[1], username="Administrator", password="password", lake=sys.argv[2],
                        max_seqnos_per_trigger=int(sys.argv[3]))
changelog, state = Pipeline(spark, config).start_live("0 seconds")
changelog.awaitTermination()
"""


def test_kill_driver_mid_batch_then_resume_state_exact(spark, server, tmp_path):
    import os
    import signal
    import subprocess
    import sys

    work = Workload(docs=3000, updates=600, deletes=300, expiring=0, rounds=2, seed=4)
    write(server.port, work)
    lake = tmp_path / "lake"
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, conn(server.port), str(lake), "150"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    offsets, commits = lake / "_checkpoints" / "changelog" / "offsets", lake / "_checkpoints" / "changelog" / "commits"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # wait until a batch is planned but not committed, a few batches in
            n_off = len(list(offsets.glob("[0-9]*"))) if offsets.exists() else 0
            n_com = len(list(commits.glob("[0-9]*"))) if commits.exists() else 0
            if n_com >= 3 and n_off > n_com:
                break
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            time.sleep(0.01)
        else:
            pytest.fail("the driver never got a few batches in")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        proc.stderr.close()
    assert len(list(commits.glob("[0-9]*"))) < 20  # killed mid-way, not after the end
    truth = write(server.port, work, rounds=2, initial=False)  # changes keep coming while it is down
    # The resume replays the planned batch as its offsets say (150 seqnos), then takes the rest
    # without a limit: how later batches are cut is not the point here (the admission-control test
    # pins it), and each batch would cost a MERGE into the state table.
    pipeline = Pipeline(spark, PipelineConfig(connection=conn(server.port), username=USER, password=PASSWORD,
                                              lake=lake))
    pipeline.run_available_now()
    assert _state(pipeline) == truth
    rows = pipeline.changelog().select("vbucket", "seqno").collect()
    assert len(set(rows)) == len(rows)  # the replayed batch did not duplicate rows in the change log


def test_synthetic_source_reads_its_rows_once_as_a_batch_and_as_a_stream(spark, tmp_path):
    """The benchmark's baseline (bench/spark_ingest.py): the dcp schema, every row once."""
    opts = {"rows": "3000", "vbuckets": "64", "partitions": "2", "valueFormat": "string"}
    batch = spark.read.format("dcp_synthetic").options(**opts).load()
    assert batch.count() == 3000
    assert batch.select("key").distinct().count() == 3000

    def run():
        q = (spark.readStream.format("dcp_synthetic").options(**opts).load().writeStream.format("parquet")
             .option("path", str(tmp_path / "log")).option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
        q.awaitTermination()
        return sum(p["numInputRows"] for p in q.recentProgress)

    assert run() == 3000 and run() == 0  # restarted from its checkpoint: nothing new
    rows = spark.read.parquet(str(tmp_path / "log"))
    assert rows.count() == 3000 and rows.columns == batch.columns


def test_mitigate_rollbacks_plans_only_what_every_copy_persisted(server):
    """mitigateRollbacks=true: a micro-batch (and a batch read) ends at what is on disk; changes
    only in memory (persistence paused) wait for the next batch after they are persisted."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from dcpflow.spark import offsets as off
    from dcpflow.spark.source import DcpDataSource
    from tests.server.faults.helpers import http_of

    def planned(r, start, end):
        return sum(rng.weight for p in r.partitions(start, end) for rng in p.ranges)

    def moved(a, b) -> int:  # seqnos between two offsets (one per new document)
        a, b = off.SourceOffset.from_json(a), off.SourceOffset.from_json(b)
        return sum(o.seqno - a.vbuckets[vb].seqno for vb, o in b.vbuckets.items())

    write(server.port, Workload(docs=40, updates=0, deletes=0, expiring=0, rounds=0, seed=31))
    http = http_of(server)
    src = DcpDataSource(source_options(server.port, mitigateRollbacks="true"))
    plain = DcpDataSource(source_options(server.port))
    r, p = src.streamReader(src.schema()), plain.streamReader(plain.schema())
    r.STATE_REUSE_SECONDS = p.STATE_REUSE_SECONDS = 0
    try:
        start = r.initialOffset()
        deadline = time.monotonic() + 30
        while planned(r, start, end := r.latestOffset(start, ReadAllAvailable())) < 40:  # the flusher's turn
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert http.post("/faults/buckets/default/persistence/pause").status == 200
        try:
            write(server.port, Workload(docs=25, updates=0, deletes=0, expiring=0, rounds=0, seed=32))
            assert r.latestOffset(end, ReadAllAvailable()) == end  # nothing new is on disk
            assert moved(end, p.latestOffset(end, ReadAllAvailable())) == 25  # without the option: planned
            batch = src.reader(src.schema()).partitions()
            assert sum(rng.weight for part in batch for rng in part.ranges) == 40
        finally:
            assert http.post("/faults/buckets/default/persistence/resume").status == 200
        deadline = time.monotonic() + 30
        while moved(end, r.latestOffset(end, ReadAllAvailable())) < 25:  # on disk now: planned
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        r.stop()
        p.stop()
