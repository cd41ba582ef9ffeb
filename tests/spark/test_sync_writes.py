"""The `dcp` source and sync writes: committed versions only by default (a committed durable write
is an upsert, an open or aborted prepare makes no row); with syncWrites=true a row per prepare,
commit and abort too, whose _change_type is the event; the pipeline refuses that option."""

import pytest
from pyspark.errors import PySparkException

from dcpflow.spark.pipeline import PipelineConfig

from ..client.test_sync_writes import one_committed_one_open
from ..dcp.conftest import keys_in
from .test_source import source_options


def test_committed_rows_by_default_and_sync_write_rows_with_the_option(spark, server):
    vb = 9
    done, open_ = keys_in(vb, 2, prefix="sp")
    with server.login() as w:
        one_committed_one_open(server, w, vb, done, open_)  # prepare 1, commit 2; prepare 3 open

        def read(**extra):
            df = spark.read.format("dcp").options(**source_options(server.port, vbuckets=str(vb), **extra)).load()
            return [(r["_change_type"], r["event"], r["key"], r["seqno"], r["value"])
                    for r in df.orderBy("seqno").collect()]

        assert read() == [("upsert", "mutation", done.decode(), 2, '{"v":1}')]
        assert read(syncWrites="true") == [
            ("prepare", "prepare", done.decode(), 1, '{"v":1}'), ("commit", "commit", done.decode(), 2, None),
            ("prepare", "prepare", open_.decode(), 3, '{"v":2}')]
        with pytest.raises(PySparkException, match="option 'syncWrites' is 'yes'; use true or false"):
            read(syncWrites="yes")


def test_the_pipeline_refuses_a_source_with_sync_write_rows():
    config = PipelineConfig("couchbase://127.0.0.1/default", "u", "p", lake=None, options={"syncWrites": "true"})
    with pytest.raises(ValueError, match="leave the source option syncWrites out"):
        config.source_options()
    assert PipelineConfig("couchbase://127.0.0.1/default", "u", "p", lake=None,
                          options={"syncWrites": "false"}).source_options()["syncWrites"] == "false"
