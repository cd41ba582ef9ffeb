"""A maintenance task that cannot open a file - the process is out of descriptors - backs off
(its wait doubles with each failure in a row) and says so in one line per interval, without a
traceback; it runs again as usual once it succeeds (server/app.py, _periodic)."""

import logging
import os
import re
import resource
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import dcpflow
from dcpflow.server.app import out_of_files
from tests.processes import first_line, kill_group, popen, stop

from .test_connection_limits import wait_for


def test_what_counts_as_out_of_descriptors():
    import errno
    assert out_of_files(OSError(errno.EMFILE, "Too many open files"))
    assert out_of_files(sqlite3.OperationalError("unable to open database file"))
    assert not out_of_files(OSError(errno.ENOENT, "No such file"))
    assert not out_of_files(sqlite3.OperationalError("database is locked"))
    assert not out_of_files(ValueError("bug"))


def test_compaction_out_of_descriptors_backs_off_and_logs_once(make_server, caplog):
    server = make_server(compaction_interval=0.1, fragmentation_threshold=None)
    calls: list[float] = []
    engine = server.call(lambda: server.server.buckets["default"].engine)
    real_compact = engine.store.compact

    def failing(plan):
        calls.append(time.monotonic())
        raise sqlite3.OperationalError("unable to open database file")

    with caplog.at_level(logging.WARNING):
        engine.store.compact = failing
        wait_for(lambda: len(calls) >= 4)
        engine.store.compact = real_compact
        before = server.call(lambda: server.server.buckets["default"].compactions)
        wait_for(lambda: server.call(lambda: server.server.buckets["default"].compactions) > before)
    # waits of 0.2, 0.4 and 0.8 s between the four failures (not 0.1 each)
    assert calls[3] - calls[0] >= 0.2 + 0.4 + 0.8
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("dcpflow")]
    said = [line for line in lines if "cannot open a file" in line]
    assert len(said) == 1 and "unable to open database file" in said[0] and "retrying in" in said[0]
    assert not any("Traceback" in line for line in lines)
    assert server.call(lambda: server.server.maintenance_failures) >= 4


def test_a_server_out_of_descriptors_keeps_its_log_short(tmp_path):
    """A real server whose descriptor limit drops below what it holds: its compaction every 0.2 s
    fails to open files; over a few seconds the log says so once, with no traceback."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(dcpflow.__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    err = tmp_path / "stderr.log"
    proc = popen([sys.executable, "-m", "dcpflow.cli", "server", "--port", "0", "--mgmt-port", "0",
                  "--data-dir", str(tmp_path / "data"), "--vbuckets", "16", "--compaction-interval", "0.2"],
                 stdout=subprocess.PIPE, stderr=err.open("w"), env=env, text=True)
    try:
        line = first_line(proc)
        assert re.search(r" port=(\d+)", line), (line, err.read_text())
        held = len(os.listdir(f"/proc/{proc.pid}/fd"))
        resource.prlimit(proc.pid, resource.RLIMIT_NOFILE, (held, held))
        wait_for(lambda: "cannot open a file" in err.read_text())
        logged = time.monotonic()
        time.sleep(3)  # fifteen compaction intervals: backed off, and one line per 10 s
    finally:
        try:
            stop(proc)
        finally:
            kill_group(proc)
            proc.stdout.close()
    since = time.monotonic() - logged  # three seconds, unless the machine is busy
    text = err.read_text()
    assert "Traceback" not in text, text[-3000:]
    assert 1 <= text.count("cannot open a file") <= 1 + since // 10, (since, text[-3000:])
