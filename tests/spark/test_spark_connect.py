"""The pipeline through Spark Connect: the client holds no JVM, registers the `dcp` data source
over its Connect session (`spark.dataSource.register`) and drives both streaming queries, whose
source reads and `foreachBatch` state writer run in the Connect server's Python. The state table
must equal the server key by key, and the progress reports - whose shape differs over Connect -
must still count every batch. The client runs in a subprocess (connect_client.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dcpflow.client.workload import Workload
from tests.processes import run_group, stop_groups

from .standalone import ConnectServer, state_of
from .test_source import conn, write

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_pipeline_through_spark_connect_equals_the_server(server, tmp_path):
    work = Workload(docs=1500, updates=300, deletes=150, expiring=0, rounds=2, seed=12)
    truth = write(server.port, work, rounds=2)
    with ConnectServer(tmp_path, master="local[2]") as connect, open(tmp_path / "client.log", "w") as log:
        client = subprocess.Popen([sys.executable, "-m", "tests.spark.connect_client",
                                   f"sc://127.0.0.1:{connect.port}", conn(server.port), str(tmp_path / "lake")],
                                  cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, text=True,
                                  start_new_session=True)
        try:
            out, _ = client.communicate(timeout=180)
        finally:
            stop_groups([client])
        assert client.returncode == 0, (tmp_path / "client.log").read_text()[-4000:]
        # the same through the command line: `dcpflow pipeline --remote`
        cli = run_group([sys.executable, "-m", "dcpflow.cli", "pipeline", "--connection", conn(server.port),
                         "--lake", str(tmp_path / "cli-lake"), "--remote", f"sc://127.0.0.1:{connect.port}",
                         "--partitions", "2"], cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True,
                        text=True, timeout=180)
        assert cli.returncode == 0 and "caught up" in cli.stdout, cli.stderr[-4000:]
    assert state_of(tmp_path / "cli-lake") == {("_default", "_default", k): v for k, v in truth.items()}
    result = json.loads(out)
    assert result["session"] == "pyspark.sql.connect.session"
    changelog = [rows for query, _batch, rows in result["batches"] if query == "changelog"]
    assert len(changelog) >= 3  # bounded batches, each reported once with its rows
    assert sum(changelog) == result["changelog_rows"] >= len(work.versions)
    state = {(scope, collection, key): value for scope, collection, key, value in result["state"]}
    assert len(state) == len(result["state"])  # one row per key
    assert state == {("_default", "_default", k): v for k, v in truth.items()}
