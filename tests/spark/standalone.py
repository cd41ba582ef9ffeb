"""Spark as users run it beyond local mode, started from the installed PySpark distribution on
127.0.0.1: a standalone cluster (one master and N workers, each a `bin/spark-class` JVM in its own
process group, so that stopping the cluster also ends the executors and Python workers they
launched) and a Spark Connect server.

Readiness is a condition: the master's JSON page (`http://127.0.0.1:<webui>/json/`) lists every
worker ALIVE. The cluster processes get no PYTHONPATH of ours: what an executor imports is what the
application ships (`spark.executorEnv.PYTHONPATH`) or what its Python has installed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyspark

import dcpflow
from dcpflow.spark.session import log4j2_file
from tests.processes import stop_groups

SPARK_HOME = Path(pyspark.__file__).resolve().parent


def delta_args() -> list[str]:
    """spark-submit's arguments for Delta Lake from the installed jars (docs/spark.md, Spark Connect)."""
    from dcpflow.spark.jars import DELTA_CONF, require_delta_jars

    args = ["--jars", ",".join(str(j) for j in require_delta_jars())]
    for key, value in DELTA_CONF.items():
        args += ["--conf", f"{key}={value}"]
    return args


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster_env(conf_dir: Path) -> dict[str, str]:
    """The environment of the master, the workers and so of the executors."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith(("PYSPARK_", "SPARK_"))}
    env.update(SPARK_HOME=str(SPARK_HOME), SPARK_CONF_DIR=str(conf_dir), SPARK_LOCAL_IP="127.0.0.1",
               SPARK_DAEMON_MEMORY="256m",
               SPARK_DAEMON_JAVA_OPTS=f"-Dlog4j2.configurationFile=file:{log4j2_file()} -XX:TieredStopAtLevel=1")
    return env


class StandaloneCluster:
    def __init__(self, workdir: Path, workers: int = 2, cores: int = 1, memory: str = "1g"):
        self.workdir = workdir
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.procs: list[subprocess.Popen] = []
        self.webui_port = 0
        self.url = ""

    def _spawn(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - closed right after the fork
        try:
            proc = subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), *args], stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, env=cluster_env(self.workdir),
                                    start_new_session=True)
        finally:
            log.close()
        self.procs.append(proc)
        return proc

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                         for p in sorted(self.workdir.glob("*.log")))

    def status(self) -> dict | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.webui_port}/json/", timeout=5) as r:
                return json.load(r)
        except OSError:
            return None

    def _wait(self, what: str, ready, timeout: float = 90) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"a cluster process exited ({p.returncode}) before {what}\n{self.logs()}")
            status = self.status()
            if status is not None and ready(status):
                return status
            time.sleep(0.2)
        raise RuntimeError(f"timed out waiting for {what}: {self.status()}\n{self.logs()}")

    def start(self) -> StandaloneCluster:
        self.webui_port = free_port()
        try:
            self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "0",
                        "--webui-port", str(self.webui_port))
            self.url = self._wait("the master", lambda s: s.get("status") == "ALIVE")["url"]
            for i in range(self.workers):
                work = self.workdir / f"worker{i}"
                work.mkdir(parents=True, exist_ok=True)
                self._spawn(f"worker{i}", "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
                            "--cores", str(self.cores), "--memory", self.memory, "--webui-port", "0",
                            "--work-dir", str(work))
            self._wait(f"{self.workers} workers ALIVE",
                       lambda s: sum(w["state"] == "ALIVE" for w in s["workers"]) == self.workers)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        stop_groups(self.procs)

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class ConnectServer:
    """A Spark Connect server (`SparkConnectServer` through `bin/spark-submit`, as
    `sbin/start-connect-server.sh` runs it) on 127.0.0.1, in its own process group.

    It is the driver of the clients' queries, so the Python it runs - for data sources and
    `foreachBatch` functions - must import dcpflow: its PYTHONPATH holds the directory `dcpflow`
    is imported from here. Ready when its gRPC port accepts connections."""

    def __init__(self, workdir: Path, master: str = "local[2]"):
        self.workdir = workdir
        self.master = master
        self.port = 0
        self.proc: subprocess.Popen | None = None

    def start(self) -> ConnectServer:
        self.port = free_port()
        java_opts = f"-Dlog4j2.configurationFile=file:{log4j2_file()} -XX:TieredStopAtLevel=1"
        env = cluster_env(self.workdir)
        # the launcher sizes a Connect server like a daemon: 256m is too small for a driver
        del env["SPARK_DAEMON_MEMORY"], env["SPARK_DAEMON_JAVA_OPTS"]
        env.update(SPARK_CONNECT_MODE="0", PYSPARK_PYTHON=sys.executable,
                   PYTHONPATH=str(Path(dcpflow.__file__).resolve().parents[1]))
        log_path = self.workdir / "connect.log"
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [str(SPARK_HOME / "bin" / "spark-submit"), "--class",
                 "org.apache.spark.sql.connect.service.SparkConnectServer", "--master", self.master,
                 "--driver-memory", "1g", "--conf", f"spark.connect.grpc.binding.port={self.port}",
                 "--conf", "spark.connect.grpc.binding.address=127.0.0.1", "--conf", "spark.ui.enabled=false",
                 "--conf", "spark.sql.shuffle.partitions=2", "--conf", f"spark.driver.extraJavaOptions={java_opts}",
                 *delta_args()],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            deadline = time.monotonic() + 90
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the Connect server exited ({self.proc.returncode})\n"
                                       f"{log_path.read_text(errors='replace')[-3000:]}")
                with socket.socket() as s:
                    if s.connect_ex(("127.0.0.1", self.port)) == 0:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the Connect server did not listen in 90s\n"
                                       f"{log_path.read_text(errors='replace')[-3000:]}")
                time.sleep(0.2)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_groups([self.proc])

    def __enter__(self) -> ConnectServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def state_of(lake: Path) -> dict:
    """(scope, collection, key) -> value of a pipeline's state table (delta), read without Spark;
    one row per key."""
    from dcpflow.spark.state import open_state

    table = open_state(lake / "state").to_arrow(["scope", "collection", "key", "value"])
    state = {(r["scope"], r["collection"], r["key"]): r["value"] for r in table.to_pylist()}
    assert len(state) == table.num_rows
    return state
