"""The Spark Connect client of test_spark_connect.py, in its own process: PySpark refuses a classic
session and a Connect session in one process (a Connect session marks the process as Connect mode),
and the other Spark tests' classic session lives in pytest's.

    python -m tests.spark.connect_client sc://HOST:PORT CONNECTION LAKE

Registers the `dcp` source over the Connect session, runs the pipeline (AvailableNow) and prints
one JSON line: the session's class, the batches reported, the change log's row count and the state
table as read through Spark Connect.
"""

import json
import sys

from pyspark.sql import SparkSession

from dcpflow.spark.pipeline import Pipeline, PipelineConfig
from dcpflow.spark.session import register


def main(remote: str, connection: str, lake: str) -> None:
    spark = SparkSession.builder.remote(remote).create()
    try:
        register(spark)  # spark.dataSource.register over Connect
        config = PipelineConfig(connection=connection, username="Administrator", password="password", lake=lake,
                                partitions=2, max_seqnos_per_trigger=700)
        pipeline = Pipeline(spark, config)
        reports = pipeline.run_available_now()
        state = pipeline.state().select("scope", "collection", "key", "value").collect()
        print(json.dumps({"session": type(spark).__module__,
                          "batches": [(r.query, r.batch_id, r.rows) for r in reports],
                          "changelog_rows": pipeline.changelog().count(),
                          "state": [[r["scope"], r["collection"], r["key"], r["value"]] for r in state]}), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:4])
