"""`dcpflow pipeline` and `dcpflow demo` as users run them, in real subprocesses: the batch numbers
printed are the ones `restore --as-of` takes (one numbering); a failure ends the run within seconds
with one line naming what failed and a non-zero exit, never a hang; a demo stopped by SIGTERM
leaves no server, no JVM and no temporary directory behind."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dcpflow.protocol.status import Status
from tests.processes import run_group, stop_groups

REPO = Path(__file__).resolve().parents[2]
BATCH = re.compile(r"\] changelog batch (\d+): ([\d,]+) rows")


def url(srv) -> str:
    return f"couchbase://127.0.0.1:{srv.port}/default"


def fill(srv, n: int, round_: int = 1) -> None:
    with srv.login() as c:
        for i in range(n):
            assert c.set(b"doc%d" % i, b'{"round":%d,"i":%d}' % (round_, i)).status == Status.SUCCESS


def quick_jvm(env: dict | None = None) -> dict:
    """The environment for a command under test, its JVMs compiling with C1 only (what the suite's
    own session does with fast_start): Spark's JVM in a seconds-long run spends more of two busy
    cores in C2's compiler threads than it ever gets back. Every JVM reads JAVA_TOOL_OPTIONS (and
    says so on stderr, first)."""
    env = dict(os.environ if env is None else env)
    env["JAVA_TOOL_OPTIONS"] = (env.get("JAVA_TOOL_OPTIONS", "") + " -XX:TieredStopAtLevel=1").strip()
    return env


def start(args: list[str], env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "dcpflow.cli", *args], cwd=REPO, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=quick_jvm(env))


def wait_for_line(proc: subprocess.Popen, pattern: re.Pattern, timeout: float = 300) -> list[str]:
    """stdout lines up to the first matching `pattern` (a deadline that only bounds a failure)."""
    deadline = time.monotonic() + timeout
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            pytest.fail(f"exited ({proc.wait()}) before {pattern.pattern!r}: {''.join(lines)[-2000:]}"
                        f"{proc.stderr.read()[-3000:]}")
        lines.append(line)
        if pattern.search(line):
            return lines
    pytest.fail(f"no {pattern.pattern!r} in {timeout}s: {''.join(lines)[-2000:]}")


def descendants(pid: int) -> set[int]:
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for c in map(int, children):
                if c not in out:
                    out.add(c)
                    todo.append(c)
    return out


def cmdline(pid: int) -> bytes:
    """A process's command line, or b"" once it has exited: Spark and its workers start and reap
    short-lived children, so one listed by descendants() may be gone when it is read."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def alive(pids: set[int]) -> set[int]:
    live = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            live.add(pid)
    return live


def test_printed_batches_are_what_restore_as_of_takes(spark, make_server, tmp_path):
    """Issue 42 item 11: `changelog batch N` as printed == the rows' _commit_version == what
    restore --as-of accepts, and `--as-of` outside them is refused naming the range."""
    from pyspark.sql import functions as F

    from dcpflow.spark.restore import RestoreError, restore

    source = make_server(data_dir=tmp_path / "source")
    fill(source, 300)
    lake = tmp_path / "lake"
    run = run_group([sys.executable, "-m", "dcpflow.cli", "pipeline", "--connection", url(source), "--lake",
                     str(lake), "--max-seqnos-per-trigger", "120", "--partitions", "2"], cwd=REPO,
                    stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600, env=quick_jvm())
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    printed = {int(n): int(rows.replace(",", "")) for n, rows in BATCH.findall(run.stdout)}
    assert len(printed) >= 3, run.stdout
    changelog = spark.read.parquet(str(lake / "changelog"))
    per_version = {r[0]: r[1] for r in changelog.groupBy("_commit_version").count().collect()}
    assert printed == per_version  # the same numbers, each with its rows
    state_lines = re.findall(r"\] state through batch (\d+): ([\d,]+) rows", run.stdout)
    assert state_lines and int(state_lines[-1][0]) == max(printed), run.stdout
    # each change-log row counted once by the state's reports too (not once per read of the batch)
    assert sum(int(rows.replace(",", "")) for _, rows in state_lines) == sum(printed.values()), run.stdout
    first = min(printed)
    target = make_server(data_dir=tmp_path / "target")
    assert restore(spark, lake, url(target), "Administrator", "password", as_of=first)["version"] == first
    with target.login() as c:  # as of the first printed batch: only what it brought
        restored = sum(c.get(b"doc%d" % i).status == Status.SUCCESS for i in range(300))
    assert restored == changelog.filter(F.col("_commit_version") == first).count() < 300
    with pytest.raises(RestoreError, match=rf"holds versions {first}\.\.{max(printed)}"):
        restore(spark, lake, url(target), "Administrator", "password", as_of=first - 1)


def test_pipeline_stops_with_one_line_when_the_server_goes(make_server, tmp_path):
    """The live pipeline loses its server: within seconds it exits non-zero with one line naming
    the query that failed (not a hang, not a traceback)."""
    source = make_server(data_dir=tmp_path / "source")
    fill(source, 200)
    proc = start(["pipeline", "--connection", url(source), "--lake", str(tmp_path / "lake"), "--trigger",
                  "1 second", "--state-format", "snapshot", "--partitions", "2", "--option", "timeout=5"])
    try:
        wait_for_line(proc, re.compile(r"changelog batch \d+"))
        source.stop()
        gone = time.monotonic()
        out, err = proc.communicate(timeout=120)
        took = time.monotonic() - gone
    finally:
        stop_groups([proc])
    assert proc.returncode == 1, out[-2000:] + err[-3000:]
    last = err.strip().splitlines()[-1]
    assert re.match(r"dcpflow pipeline: the changelog query failed: .*connect", last, re.I), err[-3000:]
    assert "terminated with error" not in err  # Spark's page-long report of it stays out
    assert took < 60, took


def test_pipeline_stops_with_one_line_when_the_jvm_dies(make_server, tmp_path):
    """Spark's JVM killed under a live pipeline (as an out-of-memory exit or a lost driver is):
    the command exits non-zero at once, saying so."""
    source = make_server(data_dir=tmp_path / "source")
    fill(source, 200)
    proc = start(["pipeline", "--connection", url(source), "--lake", str(tmp_path / "lake"), "--trigger",
                  "1 second", "--state-format", "snapshot", "--partitions", "2"])
    try:
        wait_for_line(proc, re.compile(r"changelog batch \d+"))
        jvms = [p for p in descendants(proc.pid) if b"java" in cmdline(p)]
        assert jvms
        for p in jvms:
            os.kill(p, signal.SIGKILL)
        gone = time.monotonic()
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - gone
    finally:
        stop_groups([proc])
    assert proc.returncode == 1, out[-2000:] + err[-3000:]
    assert re.match(r"dcpflow pipeline: the (changelog|state) query failed: Spark's JVM is gone",
                    err.strip().splitlines()[-1]), err[-3000:]
    assert "Exception while sending command" not in err  # py4j's page of traceback on the root logger
    assert took < 30, took


def test_demo_stopped_by_sigterm_leaves_nothing_behind(tmp_path):
    """SIGTERM while the demo's pipeline runs: its embedded server and Spark stop with it and its
    temporary directory is removed."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = start(["demo", "--docs", "2000", "--vbuckets", "16", "--rounds", "30", "--state-format", "snapshot"],
                 env={**os.environ, "TMPDIR": str(tmp)})
    try:
        wait_for_line(proc, re.compile(r"live: micro-batches"))
        children = descendants(proc.pid)
        assert len(children) >= 2  # the embedded server and Spark's JVM (with its Python workers)
        assert list(tmp.glob("dcpflow-demo-*"))
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        stop_groups([proc])
    assert proc.returncode == 130, out[-2000:] + err[-3000:]
    assert "dcpflow demo: stopped" in err
    deadline = time.monotonic() + 30
    while alive(children) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(children), [cmdline(p)[:200] for p in alive(children)]
    assert not list(tmp.glob("dcpflow-demo-*"))
