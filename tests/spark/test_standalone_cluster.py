"""The pipeline on a real Spark standalone cluster started from the installed PySpark distribution:
a master and two workers on 127.0.0.1, so the source's reads and the file sink's writes run in
executor JVMs of their own, each with its own Python workers, while planning and the state writer
stay on the driver. The state table must still equal the server key by key.

The driver runs in a subprocess (cluster_driver.py): a process holds one SparkContext, and the
other Spark tests' local session lives in pytest's. Every process started here is in a process
group of its own and is killed, even when the test fails.
"""

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import dcpflow
from dcpflow.client.workload import Workload
from tests.processes import run_group, stop_groups

from .standalone import StandaloneCluster, state_of
from .test_source import conn, write

PACKAGE_ROOT = str(Path(dcpflow.__file__).resolve().parents[1])
REPO = Path(__file__).resolve().parents[2]


def processes() -> dict[int, tuple[int, list[str]]]:
    """pid -> (parent pid, command line) of every process we can read."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmd = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            out[int(entry.name)] = (int(stat[stat.rindex(")") + 2:].split()[1]), [c.decode() for c in cmd if c])
    return out


def descendants(procs: dict, pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        for child, (ppid, _cmd) in procs.items():
            if ppid == parent and child not in found:
                found.add(child)
                todo.append(child)
    return found


@pytest.mark.slow
def test_pipeline_on_a_standalone_cluster_equals_the_server(server, tmp_path):
    work = Workload(docs=3000, updates=600, deletes=300, expiring=0, rounds=2, seed=11)
    truth = write(server.port, work, rounds=2)
    lake = tmp_path / "lake"
    (tmp_path / "cluster").mkdir()
    with StandaloneCluster(tmp_path / "cluster", workers=2, cores=1, memory="1g") as cluster:
        with open(tmp_path / "driver.log", "w") as log:  # a file: a full stderr pipe would block the driver
            driver = subprocess.Popen([sys.executable, "-m", "tests.spark.cluster_driver", cluster.url,
                                       conn(server.port), str(lake)], cwd=REPO, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
        try:
            pool = ThreadPoolExecutor(1)  # the line says the pipeline has run; its executors are still up
            try:
                line = pool.submit(driver.stdout.readline).result(timeout=300)
            finally:
                pool.shutdown(wait=False)  # a hung driver is killed below, which ends the read
            assert line, (tmp_path / "driver.log").read_text()[-4000:] + cluster.logs()
            report = json.loads(line)
            procs = processes()
            on_driver = {driver.pid} | descendants(procs, driver.pid)
            on_workers = set().union(*(descendants(procs, p.pid) for p in cluster.procs[1:]))
            executors = [e for e in report["executors"] if e["id"] != "driver"]
            assert len(executors) == 2
            assert all(e["id"] == "driver" and e["totalTasks"] == 0 for e in report["executors"] if e not in executors)
            for e in executors:
                assert e["totalTasks"] > 0 and e["failedTasks"] == 0, report  # each executor ran tasks
                jvm = [pid for pid, (_pp, cmd) in procs.items()
                       if "org.apache.spark.executor.CoarseGrainedExecutorBackend" in cmd
                       and cmd[cmd.index("--app-id") + 1] == report["app"]
                       and cmd[cmd.index("--executor-id") + 1] == e["id"]]
                assert len(jvm) == 1 and jvm[0] in on_workers and jvm[0] not in on_driver
                # its own Python workers (PySpark's daemon, forked from the executor JVM), which
                # imported dcpflow from what the application shipped on PYTHONPATH
                daemons = [pid for pid, (pp, cmd) in procs.items() if pp == jvm[0] and "pyspark.daemon" in cmd]
                assert daemons, f"no Python worker under executor {e['id']}"
                environ = Path(f"/proc/{daemons[0]}/environ").read_text().split("\0")
                env = dict(v.split("=", 1) for v in environ if "=" in v)
                assert PACKAGE_ROOT in env["PYTHONPATH"].split(":")
            assert sum(rows for query, _b, rows in report["batches"] if query == "changelog") >= len(work.versions)
            driver.stdin.write("\n")
            driver.stdin.flush()
            assert driver.wait(60) == 0, (tmp_path / "driver.log").read_text()[-4000:]
        finally:
            stop_groups([driver])
            for stream in (driver.stdin, driver.stdout):
                stream.close()
        # the same through the command line: `dcpflow pipeline --master` with the settings a user gives
        conf = {"spark.executorEnv.PYTHONPATH": PACKAGE_ROOT, "spark.executor.cores": "1", "spark.cores.max": "2",
                "spark.executor.memory": "512m", "spark.driver.memory": "512m", "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1", "spark.ui.port": "0"}
        cli = run_group([sys.executable, "-m", "dcpflow.cli", "pipeline", "--connection", conn(server.port),
                         "--lake", str(tmp_path / "cli-lake"), "--master", cluster.url, "--partitions", "2",
                         *(a for k, v in conf.items() for a in ("--conf", f"{k}={v}"))],
                        cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
        assert cli.returncode == 0 and "caught up" in cli.stdout, cli.stderr[-4000:] + cluster.logs()

    truth_state = {("_default", "_default", k): v for k, v in truth.items()}
    assert state_of(lake) == truth_state and state_of(tmp_path / "cli-lake") == truth_state
    assert len(truth) > 2000  # deletes happened, most keys live
