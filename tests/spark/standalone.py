"""A Spark standalone cluster on 127.0.0.1, started from the installed PySpark distribution: one
master and N workers, each a `bin/spark-class` JVM in its own process group, so that stopping the
cluster also ends the executors and Python workers they launched.

Readiness is a condition: the master's JSON page (`http://127.0.0.1:<webui>/json/`) lists every
worker ALIVE. The cluster processes get no PYTHONPATH of ours: what an executor imports is what the
application ships (`spark.executorEnv.PYTHONPATH`) or what its Python has installed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pyspark

from dcpflow.spark.session import log4j2_file

SPARK_HOME = Path(pyspark.__file__).resolve().parent


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


def process_groups_alive(pgids: list[int]) -> list[int]:
    """PIDs of live (not zombie) processes in these process groups."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] != "Z" and int(fields[2]) in pgids:
            alive.append(int(entry.name))
    return alive


def stop_groups(procs: list[subprocess.Popen], timeout: float = 30) -> None:
    """SIGTERM every process group, then SIGKILL what is left; wait until none of them lives."""
    pgids = [p.pid for p in procs]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pgid in pgids:
            with contextlib.suppress(ProcessLookupError):  # the group has ended already
                os.killpg(pgid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in procs:
                p.poll()  # reap our direct children
            if not process_groups_alive(pgids):
                return
            time.sleep(0.1)
    raise RuntimeError(f"processes still alive after SIGKILL: {process_groups_alive(pgids)}")


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
