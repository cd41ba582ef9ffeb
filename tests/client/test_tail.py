"""`dcpflow tail` as a user runs it: a subprocess against a real server."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dcpflow
from dcpflow.client.tail import parse_vbuckets

from .conftest import url, write


def tail(*args: str, timeout: float = 60, **popen) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dcpflow.cli", "tail", *args], capture_output=True, text=True,
                          timeout=timeout, env=_env(), **popen)


def _env() -> dict:
    env = dict(os.environ)
    src = str(Path(dcpflow.__file__).resolve().parents[1])
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return env


def lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_until_now_then_resume_from_saved_offsets(server, writer, tmp_path):
    state = tmp_path / "offsets.json"
    docs = write(writer, 120)
    writer.delete(b"doc5")
    first = tail(url(server.port), "--until", "now", "--state", str(state), "--progress")
    assert first.returncode == 0, first.stderr
    got = lines(first.stdout)
    assert {d["key"] for d in got if d["event"] == "mutation"} == {k.decode() for k in docs} - {"doc5"}
    assert [d["key"] for d in got if d["event"] == "deletion"] == ["doc5"]
    assert all(d["value"] == json.loads(docs[d["key"].encode()]) for d in got if d["event"] == "mutation")
    assert "backfill [" in first.stderr and "100.0%" in first.stderr and "offsets saved" in first.stderr
    saved = json.loads(state.read_text())
    assert saved["bucket"] == "default" and len(saved["offsets"]) == 64
    # The next run (default --from saved) sees only what changed since.
    write(writer, 3, prefix="new")
    second = tail(url(server.port), "--until", "now", "--state", str(state))
    assert second.returncode == 0, second.stderr
    assert sorted(d["key"] for d in lines(second.stdout)) == ["new0", "new1", "new2"]
    assert "backfill [" not in second.stderr  # stderr is not a terminal: no bar unless asked


def test_table_format_and_vbucket_selection(server, writer):
    write(writer, 60)
    result = tail(url(server.port), "--until", "now", "--format", "table", "--vbuckets", "0-3,10")
    assert result.returncode == 0, result.stderr
    rows = result.stdout.splitlines()
    assert rows[0].split()[:4] == ["EVENT", "VB", "SEQNO", "KEY"]
    assert rows[1:] and {int(r.split()[1]) for r in rows[1:]} <= {0, 1, 2, 3, 10}


def test_ctrl_c_saves_offsets(server, writer, tmp_path):
    state = tmp_path / "offsets.json"
    write(writer, 50)
    proc = subprocess.Popen([sys.executable, "-m", "dcpflow.cli", "tail", url(server.port), "--state", str(state),
                             "--from", "beginning"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env())
    try:
        received = []
        deadline = time.monotonic() + 30
        while len(received) < 50 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line:
                received.append(json.loads(line))
        assert len(received) == 50
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "offsets saved" in err
    saved = json.loads(state.read_text())
    # Every stream was idle at its high seqno (whole snapshots consumed): all 50 changes are committed.
    assert sum(o[1] for o in saved["offsets"].values()) == 50  # [vbuuid, seqno, ...]


def test_errors_exit_with_a_message(server):
    bad = tail("couchbase://127.0.0.1:1/default", "--until", "now")
    assert bad.returncode == 1 and "dcpflow tail: could not bootstrap" in bad.stderr and "refused" in bad.stderr
    wrong = tail(url(server.port), "-p", "nope", "--until", "now")
    assert wrong.returncode == 1 and "wrong username or password" in wrong.stderr
    syntax = tail("couchbase://h:x/b")
    assert syntax.returncode == 1 and "port 'x'" in syntax.stderr
    vbs = tail(url(server.port), "--vbuckets", "7-3")
    assert vbs.returncode == 2 and "not a valid range" in vbs.stderr
    saved = tail(url(server.port), "--from", "saved", "--until", "now")
    assert saved.returncode == 1 and "--from saved needs --state" in saved.stderr


def test_parse_vbuckets():
    assert parse_vbuckets("0-3,10,2") == [0, 1, 2, 3, 10]
    assert parse_vbuckets(None) is None
