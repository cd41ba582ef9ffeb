"""The driver of test_standalone_cluster.py, in its own process (a process has one SparkContext,
and the other Spark tests' local session lives in pytest's).

    python -m tests.spark.cluster_driver MASTER CONNECTION LAKE

Runs the dcpflow pipeline (AvailableNow) on the cluster, prints one JSON line (application id,
its own PID, the executors as Spark's REST API reports them) and keeps the session - so its
executors and their Python workers - alive until a line arrives on stdin.
"""

import json
import os
import sys
import time
import urllib.request
from pathlib import Path

from pyspark.sql import SparkSession

import dcpflow
from dcpflow.spark.pipeline import Pipeline, PipelineConfig
from dcpflow.spark.session import log4j2_file, register, with_delta


def session(master: str, executors: int) -> SparkSession:
    # What a user sets for a cluster: executors run the same Python as the driver and import
    # dcpflow from where the driver does (on a real cluster: installed into that Python).
    # PySpark takes the workers' Python from PYSPARK_PYTHON when it pickles the data source (the
    # `spark.pyspark.python` setting is read only by spark-submit).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    java_opts = f"-Dlog4j2.configurationFile=file:{log4j2_file()} -XX:TieredStopAtLevel=1"
    # Delta Lake (the default state format) as dcpflow's sessions add it: the installed jars in
    # spark.jars, which the driver serves to the executors - nothing installed on the workers.
    builder = with_delta(SparkSession.builder)
    spark = (builder.master(master).appName("dcpflow-standalone-test")
             .config("spark.executorEnv.PYTHONPATH", str(Path(dcpflow.__file__).resolve().parents[1]))
             .config("spark.executor.cores", "1").config("spark.cores.max", str(executors))
             .config("spark.executor.memory", "512m").config("spark.driver.memory", "512m")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.port", "0").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", str(executors))
             .config("spark.driver.extraJavaOptions", java_opts).config("spark.executor.extraJavaOptions", java_opts)
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def wait_for_executors(spark: SparkSession, n: int, timeout: float = 90) -> None:
    """Both executors registered before the first job, so its tasks spread over both."""
    deadline = time.monotonic() + timeout
    while spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() < n + 1:  # + the driver's block manager
        if time.monotonic() > deadline:
            raise RuntimeError(f"fewer than {n} executors registered in {timeout}s")
        time.sleep(0.2)


def main(master: str, connection: str, lake: str) -> None:
    spark = session(master, executors=2)
    try:
        wait_for_executors(spark, 2)
        config = PipelineConfig(connection=connection, username="Administrator", password="password", lake=lake,
                                partitions=2, max_seqnos_per_trigger=2000)
        reports = Pipeline(spark, config).run_available_now()
        sc = spark.sparkContext
        with urllib.request.urlopen(f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}/allexecutors") as r:
            executors = [{k: e[k] for k in ("id", "hostPort", "totalTasks", "failedTasks")} for e in json.load(r)]
        print(json.dumps({"app": sc.applicationId, "pid": os.getpid(), "executors": executors,
                          "batches": [(r.query, r.batch_id, r.rows) for r in reports]}), flush=True)
        sys.stdin.readline()
    finally:
        spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:4])
