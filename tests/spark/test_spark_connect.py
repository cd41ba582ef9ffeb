"""The pipeline through Spark Connect: the client holds no JVM, registers the `dcp` data source
over its Connect session (`spark.dataSource.register`) and drives both streaming queries, whose
source reads and `foreachBatch` state writer run in the Connect server's Python. The state table
must equal the server key by key, and the progress reports - whose shape differs over Connect -
must still count every batch."""

from pyspark.sql import SparkSession

from dcpflow.load import Workload
from dcpflow.spark.pipeline import Pipeline, PipelineConfig
from dcpflow.spark.session import register

from .standalone import ConnectServer
from .test_source import PASSWORD, USER, conn, write


def test_pipeline_through_spark_connect_equals_the_server(server, tmp_path):
    work = Workload(docs=1500, updates=300, deletes=150, expiring=0, rounds=2, seed=12)
    truth = write(server.port, work, rounds=2)
    with ConnectServer(tmp_path, master="local[2]") as connect:
        spark = SparkSession.builder.remote(f"sc://127.0.0.1:{connect.port}").create()
        try:
            assert type(spark).__module__ == "pyspark.sql.connect.session"
            register(spark)
            config = PipelineConfig(connection=conn(server.port), username=USER, password=PASSWORD,
                                    lake=tmp_path / "lake", partitions=2, max_seqnos_per_trigger=700)
            pipeline = Pipeline(spark, config)
            reports = pipeline.run_available_now()
            changelog = [r for r in reports if r.query == "changelog"]
            assert len(changelog) >= 3  # bounded batches, each reported once with its rows
            assert sum(r.rows for r in changelog) == pipeline.changelog().count() >= len(work.versions)
            by_spark = {(r["scope"], r["collection"], r["key"]): r["value"]
                        for r in pipeline.state().select("scope", "collection", "key", "value").collect()}
        finally:
            spark.stop()
    assert by_spark == {("_default", "_default", k): v for k, v in truth.items()}
