"""The CDC pipeline under an injected fault: while the live queries run, every vbucket fails over
uncleanly (the writes never persisted are lost, with the pipeline having already taken them into
its state) and one vbucket is rolled back below what it had persisted; the pipeline rolls back
what the server lost and its state table ends equal to the server's contents."""

import time

from dcpflow.client.workload import Workload
from dcpflow.protocol import kv as kvproto
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from dcpflow.spark.pipeline import Pipeline, PipelineConfig
from tests.server.mgmt.rest_client import http_of

from .test_source import PASSWORD, USER, _state, conn, write


def persist_everything(server) -> dict[int, int]:
    """Wait until every vbucket has its high seqno on disk; returns the high seqnos."""
    with server.login() as c:
        highs = kvproto.GetAllVbSeqnosResponse.from_frame(c.call(Opcode.GET_ALL_VB_SEQNOS)).as_dict()
        for vb, seqno in highs.items():
            if seqno:
                reply = c.call(Opcode.SEQNO_PERSISTENCE, extras=seqno.to_bytes(8, "big"), vbucket=vb)
                assert reply.status == Status.SUCCESS
    return highs


def converge(pipeline, queries, expected: dict, timeout: float = 180.0) -> None:
    """Until the state table equals `expected`. (processAllAvailable alone is not enough: a trigger
    that began before the server changed may report "no new data" and end the wait early.)"""
    deadline = time.monotonic() + timeout
    while True:
        for query in queries:
            query.processAllAvailable()
        got = _state(pipeline)
        if got == expected:
            return
        for query in queries:
            assert query.exception() is None, query.exception()
        differ = sorted(k for k in set(got) | set(expected) if got.get(k) != expected.get(k))
        assert time.monotonic() < deadline, f"{len(differ)} keys differ from the server, e.g. {differ[:5]}"
        time.sleep(0.5)


def test_a_rollback_forced_mid_pipeline_leaves_the_state_equal_to_the_server(spark, make_server, tmp_path):
    server = make_server(num_vbuckets=16)
    http = http_of(server)
    work = Workload(docs=600, updates=200, deletes=60, expiring=0, rounds=3, seed=11)
    write(server.port, work)
    persisted = persist_everything(server)
    assert http.post("/faults/buckets/default/persistence/pause").status == 200
    doomed = write(server.port, work, rounds=1, initial=False)  # acknowledged, in memory only
    pipeline = Pipeline(spark, PipelineConfig(connection=conn(server.port), username=USER, password=PASSWORD,
                                              lake=tmp_path / "lake", state_format="delta"))
    changelog, state = pipeline.start_live("0 seconds")
    try:
        converge(pipeline, (changelog, state), doomed)  # the pipeline holds writes the server is about to lose

        failover = http.post("/faults/buckets/default/failover", {"vbuckets": "all", "unclean": "true"})
        assert failover.status == 200 and sum(v["lost"] for v in failover.json["vbuckets"]) > 0
        vb = max(persisted, key=lambda v: persisted[v])
        rollback = http.post("/faults/buckets/default/rollback", {"vbucket": vb, "seqno": persisted[vb] // 2})
        assert rollback.status == 200 and rollback.json["lost"] > 0
        assert http.post("/faults/buckets/default/persistence/resume").status == 200
        truth = write(server.port, work, rounds=2, initial=False)  # and the writes go on, on the new branches

        converge(pipeline, (changelog, state), truth)
    finally:
        Pipeline.stop_live(changelog, state)
    markers = pipeline.changelog().filter("_change_type = 'rollback'").select("vbucket").distinct().collect()
    lost = {v["vbucket"] for v in failover.json["vbuckets"] if v["lost"]}
    assert {r["vbucket"] for r in markers} == lost | {vb}  # rolled back where the server lost something


def test_the_live_run_restarts_a_query_whose_python_worker_missed_sparks_wait(spark, make_server, tmp_path):
    """On a loaded machine Spark's wait for a new Python worker to connect back (a fixed 10 s) can
    expire and fail a live query; `run_live` starts that query again from its checkpoint instead of
    ending the run, and nothing is lost or merged twice (the failed batch runs again under its id)."""
    import threading

    server = make_server(num_vbuckets=8)
    truth = write(server.port, Workload(docs=300, updates=60, deletes=20, expiring=0, rounds=1, seed=13), rounds=1)
    pipeline = Pipeline(spark, PipelineConfig(connection=conn(server.port), username=USER, password=PASSWORD,
                                              lake=tmp_path / "lake", state_format="delta"))
    apply, failed = pipeline.writer.apply, []

    def missed_once(df, batch_id):
        if not failed:
            failed.append(batch_id)
            raise RuntimeError("Python worker failed to connect back.")  # Spark's words when its 10 s expire
        apply(df, batch_id)

    pipeline.writer.apply = missed_once
    reports, errors, stop = [], [], threading.Event()

    def run():
        try:
            pipeline.run_live("0 seconds", reports.append, poll=0.2, stop=stop)
        except BaseException as e:  # noqa: BLE001 - asserted below
            errors.append(e)

    live = threading.Thread(target=run, daemon=True)
    live.start()
    deadline = time.monotonic() + 240
    while _state(pipeline) != truth and live.is_alive():
        assert time.monotonic() < deadline, "the state never reached the server's contents"
        time.sleep(0.5)
    stop.set()
    live.join(120)
    assert not live.is_alive() and not errors, errors
    assert failed == [0] and _state(pipeline) == truth
    assert any(r.query == "state" and r.ended for r in reports)
