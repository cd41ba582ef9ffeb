"""A quiet, fast local SparkSession for dcpflow.

Why each setting: the UI and the console progress bar cost start-up time and print over our own
progress; log4j at ERROR removes the INFO/WARN flood; Python workers must run *this* interpreter
(`PYSPARK_PYTHON`), else they start the system `python3` without pyarrow; and workers import the
data source by module name, so the directory that holds the `dcpflow` package goes on their
`PYTHONPATH` (changing `sys.path` in the driver does not reach them). Delta Lake's jars, when
installed (jars.py), are listed in `spark.jars` from local files: a session never downloads.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from pathlib import Path

LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
# A failed query is reported by dcpflow in one line (pipeline.failure_line); Spark's own report of
# it is a multi-page stack trace.
logger.streaming.name = org.apache.spark.sql.execution.streaming
logger.streaming.level = off
"""


def log4j2_file() -> Path:
    """Write the quiet log4j2 configuration once per user and return its absolute path."""
    path = Path(tempfile.gettempdir()) / f"dcpflow-log4j2-{os.getuid() if hasattr(os, 'getuid') else 0}.properties"
    if not path.exists() or path.read_text() != LOG4J2:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(LOG4J2)
        os.replace(tmp, path)
    return path


#: A worker's interpreter, for sessions on this machine: Spark puts its own `pyspark.zip` (and
#: py4j's) first on every Python worker's PYTHONPATH, so workers import PySpark from the zip, where
#: Python keeps no compiled bytecode and compiles every module it imports at each start. A worker
#: Spark starts without its daemon (a streaming source's runner, a data source's planner) must
#: connect back within Spark's fixed 10 s; on a loaded machine the zip's compiling alone made it
#: miss that (measured: 6-10 s to import the streaming runner from the zip against 4 s from the
#: installed package, load 23). This wrapper drops that installation's zips from PYTHONPATH and
#: runs the interpreter, which then imports the same PySpark from its installed, compiled package.
WORKER_PYTHON = """\
#!/bin/sh
# dcpflow: run {python} with PySpark imported from its installed package, not {lib}*.zip
set -f
kept=
IFS=:
for entry in $PYTHONPATH; do
  case "$entry" in
    {lib}*.zip) ;;
    *) kept="${{kept:+$kept:}}$entry" ;;
  esac
done
unset IFS
PYTHONPATH=$kept
export PYTHONPATH
exec '{python}' "$@"
"""


def worker_python() -> str:
    """The interpreter local sessions' workers run: WORKER_PYTHON's wrapper around this one when
    PySpark is installed as a package (its zip then duplicates it), else this interpreter."""
    import pyspark

    package = Path(pyspark.__file__).resolve().parent
    lib = package / "python" / "lib"
    if "'" in sys.executable or not (lib / "pyspark.zip").exists() or os.name != "posix":
        return sys.executable
    text = WORKER_PYTHON.format(python=sys.executable, lib=f"{lib}{os.sep}")
    uid = os.getuid() if hasattr(os, "getuid") else 0
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"dcpflow-python-{uid}-{digest}.sh"
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.chmod(0o755)
        os.replace(tmp, path)
    return str(path)


def prepare_environment(python: str | None = None) -> None:
    """Make Python workers use this interpreter (or `python`, a wrapper of it) and find the
    `dcpflow` package."""
    os.environ["PYSPARK_PYTHON"] = python or sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    package_root = str(Path(__file__).resolve().parents[2])  # the directory containing dcpflow/
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if package_root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([package_root, *paths])


def local_session(app_name: str = "dcpflow", *, cores: int | None = None, driver_memory: str = "2g",
                  warehouse: str | Path | None = None, fast_start: bool = False, conf: dict | None = None):
    """Return (or create) a local SparkSession with dcpflow's data sources registered.

    `cores` defaults to every core (`local[*]`); shuffle partitions follow it, since the default
    200 would mean 200 tiny tasks per micro-batch, each with a Python worker's fixed cost.
    `fast_start` adds the JVM flag (-XX:TieredStopAtLevel=1) that shortens start-up at the price of
    peak JIT speed: for tests, not for benchmarks.
    """
    prepare_environment(worker_python())
    from pyspark.sql import SparkSession

    n = cores or os.cpu_count() or 2
    # A JVM out of memory exits at once instead of limping on with dead threads (a driver thread that
    # died of it leaves its query waiting forever): the command then fails with a clear error.
    java_opts = f"-Dlog4j2.configurationFile=file:{log4j2_file()} -XX:+ExitOnOutOfMemoryError"
    if fast_start:
        java_opts += " -XX:TieredStopAtLevel=1"
    # local[n,3]: a failed task is retried (local mode retries none by default), e.g. a read that
    # met a rollback halfway re-runs and then repairs the vbucket up front.
    builder = (SparkSession.builder.master(f"local[{n},3]").appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", str(n))
               # Delta rebuilds a table's snapshot from its log in 50 tasks by default (state.py,
               # merge_settings): as many as the cores, for the state table's reads too.
               .config("spark.databricks.delta.snapshotPartitions", str(n))
               .config("spark.default.parallelism", str(n))
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.memory", driver_memory)
               .config("spark.driver.extraJavaOptions", java_opts)
               .config("spark.executor.extraJavaOptions", java_opts)
               .config("spark.sql.streaming.stopActiveRunOnRestart", "true"))
    if warehouse is not None:
        builder = builder.config("spark.sql.warehouse.dir", str(warehouse))
    return _start(with_delta(builder, conf), conf)


def with_delta(builder, conf: dict | None = None):
    """`builder` with Delta Lake's installed jars in `spark.jars` (shipped by the driver to a
    cluster's executors) and its SQL extension and catalog, unless `conf` sets `spark.jars`,
    `spark.jars.packages` or `spark.sql.extensions` itself (a user who brings Delta their way).
    Without installed jars the session has no Delta: the snapshot state format still works."""
    from .jars import DELTA_CONF, delta_jars

    conf = conf or {}
    if any(k in conf for k in ("spark.jars", "spark.jars.packages", "spark.sql.extensions")):
        return builder
    jars = delta_jars()
    if not jars:
        return builder
    builder = builder.config("spark.jars", ",".join(str(j) for j in jars))
    for key, value in DELTA_CONF.items():
        builder = builder.config(key, value)
    return builder


def _start(builder, conf: dict | None):
    """The session of `builder` with the user's settings, quiet, with dcpflow's sources registered."""
    for key, value in (conf or {}).items():
        builder = builder.config(key, str(value))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    quiet_py4j()
    register(spark)
    return spark


def cluster_session(app_name: str = "dcpflow", *, master: str | None = None, remote: str | None = None,
                    conf: dict | None = None):
    """A SparkSession with dcpflow's data sources registered, on a cluster: `master` (spark://host:7077,
    yarn, k8s://..., local[...]) or a Spark Connect server `remote` (sc://host:15002).

    With a master, executors run the Python named by PYSPARK_PYTHON (this interpreter's path unless
    it is set: the same path must hold that Python, with dcpflow, on every node; docs/spark.md),
    and `conf` is any Spark settings (executor memory, spark.executorEnv.PYTHONPATH...). Over
    Spark Connect the server's Python reads and writes; `conf` does not apply."""
    from pyspark.sql import SparkSession

    if (master is None) == (remote is None):
        raise ValueError("give a master or a Spark Connect remote, not both")
    if remote is not None:
        spark = SparkSession.builder.remote(remote).getOrCreate()
        register(spark)
        return spark
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    java_opts = f"-Dlog4j2.configurationFile=file:{log4j2_file()} -XX:+ExitOnOutOfMemoryError"
    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.extraJavaOptions", java_opts))
    return _start(with_delta(builder, conf), conf)


def register(spark) -> None:
    """Register the `dcp` data source (and the synthetic one used by tests and the benchmark)."""
    from .source import DcpDataSource
    from .synthetic import SyntheticDcpDataSource

    spark.dataSource.register(DcpDataSource)
    spark.dataSource.register(SyntheticDcpDataSource)


class _Py4JNoise:
    """A filter for the root logger: py4j logs each failed call to a JVM that is gone as a page of
    traceback on the root logger (`logging.exception("Exception while sending command.")`); the
    commands report that in one line of their own."""

    @staticmethod
    def filter(record) -> bool:
        return record.getMessage() != "Exception while sending command."


def quiet_py4j() -> None:
    import logging

    root = logging.getLogger()
    if not any(isinstance(f, _Py4JNoise) for f in root.filters):
        root.addFilter(_Py4JNoise())


def stop_spark(spark) -> None:
    """Stop the session; a JVM already gone (killed, out of memory) has nothing left to stop."""
    try:
        spark.stop()
    except Exception:  # noqa: SIM105 - py4j's errors when the JVM is gone; nothing to do
        return
