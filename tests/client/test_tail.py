"""`dcpflow tail` as a user runs it: a subprocess against a real server."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import dcpflow
from dcpflow.client.tail import parse_vbuckets
from tests.processes import kill_group, popen

from .conftest import url, write


def tail(*args: str, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dcpflow.cli", "tail", *args], capture_output=True, text=True,
                          timeout=timeout, env=_env(), **kwargs)


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
    proc = popen([sys.executable, "-m", "dcpflow.cli", "tail", url(server.port), "--state", str(state),
                  "--from", "beginning"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
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
        kill_group(proc)
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


def test_collection_filters_and_history_label_each_line(server, writer):
    from .test_collections import FEATURES, change, cid_of, put
    change(server, lambda m: m.add_scope("shop"))
    change(server, lambda m: m.add_collection("shop", "orders", history=True))
    change(server, lambda m: m.add_collection("shop", "users"))
    orders, users = cid_of(server, "shop", "orders"), cid_of(server, "shop", "users")
    write(writer, 5)  # the default collection
    with server.login(features=FEATURES) as w:
        for i in range(3):
            put(w, orders, b"o1", b'{"v":%d}' % i)
        put(w, users, b"u1")
    hist = tail(url(server.port), "--until", "now", "--collection", "shop.orders", "--history")
    assert hist.returncode == 0, hist.stderr
    got = lines(hist.stdout)
    docs = [d for d in got if d["event"] == "mutation"]
    assert [(d["scope"], d["collection"], d["key"], d["value"]) for d in docs] == [
        ("shop", "orders", "o1", {"v": i}) for i in range(3)]
    assert {(d["kind"], d["collection"]) for d in got if d["event"] == "system"} == {("collection_created", "orders")}
    scope = tail(url(server.port), "--until", "now", "--scope", "shop")
    assert scope.returncode == 0, scope.stderr
    assert sorted((d["collection"], d["key"]) for d in lines(scope.stdout) if d["event"] == "mutation") == [
        ("orders", "o1"), ("users", "u1")]  # without --history: one version of o1
    bare = tail(url(server.port), "--until", "now", "--scope", "shop", "--collection", "users", "--format", "table")
    assert bare.returncode == 0 and [r.split()[3] for r in bare.stdout.splitlines()[1:] if r.startswith("mutation")] \
        == ["u1"]
    everything = lines(tail(url(server.port), "--until", "now").stdout)
    assert {(d["scope"], d["collection"]) for d in everything if d["event"] == "mutation"} == {
        ("_default", "_default"), ("shop", "orders"), ("shop", "users")}
    missing = tail(url(server.port), "--until", "now", "--collection", "shop.nope")
    assert missing.returncode == 1 and "shop.nope" in missing.stderr


def test_json_lines_from_batches_match_the_per_row_format():
    """The column-wise lines parse to what row_json (the format's definition) gives, for rows that
    take the fast way and rows that do not (binary values, keys to escape, multi-line JSON)."""
    import pyarrow as pa

    from dcpflow.client.batches import SCHEMA
    from dcpflow.client.jsonlines import format_batch, row_json

    def row(**kw):
        base = dict(vbucket=3, seqno=9, vbuuid=-5, key=b"k", value=b'{"a":1}', event="mutation", cas=-2,
                    rev_seqno=4, flags=7, expiry=11, datatype=1, snapshot_start=1, snapshot_end=9, collection_id=8,
                    delete_time=0)
        base.update(kw)
        return base
    rows = [row(), row(key="é".encode()), row(key=b'q"uote\\'), row(key=b"\xff\xfe"),
            row(value=b"\x00\x01", datatype=0), row(value=b"plain text", datatype=0),
            row(value=b'{\n "a": [1, 2]\n}'), row(value=b"", datatype=0),
            row(event="deletion", value=None, datatype=0, delete_time=77, flags=0, expiry=0),
            row(event="expiration", value=None, datatype=0, delete_time=78, collection_id=0, flags=0, expiry=0)]
    batch = pa.RecordBatch.from_pylist(rows, schema=SCHEMA)
    names = {8: ("shop", "orders"), 0: ("_default", "_default")}.get
    out = bytes(format_batch(batch, names)).decode()
    assert out.endswith("\n") and out.count("\n") == len(rows)
    expected = [row_json(r["event"], r["vbucket"], r["seqno"], r["key"], r["value"], r["cas"] & (2**64 - 1),
                         r["rev_seqno"], r["flags"], r["expiry"], r["datatype"], r["collection_id"], r["delete_time"],
                         *names(r["collection_id"])) for r in rows]
    assert [json.loads(line) for line in out.splitlines()] == expected
    assert expected[0]["cas"] == 2**64 - 2 and expected[3]["key"].startswith("base64:")


@pytest.mark.parametrize("odd", [None, {"key": b'q"uote'}, {"key": b"tab\there"}, {"key": "é".encode()},
                                 {"value": b'{\n"a":1}'}, {"value": b'{"a":\r1}'}, {"flags": 9, "expiry": 5}])
def test_json_lines_of_a_clean_batch_and_of_one_odd_row_match_the_per_row_format(odd):
    """The whole-batch checks (no key or value byte that needs a closer look; a number the same in
    every row goes as one constant) and each way out of them give what row_json gives."""
    import pyarrow as pa

    from dcpflow.client.batches import SCHEMA
    from dcpflow.client.jsonlines import format_batch, row_json

    rows = [dict(vbucket=i % 4, seqno=10 + i, vbuuid=-5, key=b"key-%d" % i, value=b'{"n":%d}' % i, event="mutation",
                 cas=1000 + i, rev_seqno=1, flags=0, expiry=0, datatype=1, snapshot_start=1, snapshot_end=99,
                 collection_id=8, delete_time=0) for i in range(50)]
    if odd is not None:
        rows[17].update(odd)
    batch = pa.RecordBatch.from_pylist(rows, schema=SCHEMA)
    names = {8: ("shop", "orders")}.get
    out = bytes(format_batch(batch, names)).decode()
    expected = [row_json(r["event"], r["vbucket"], r["seqno"], r["key"], r["value"], r["cas"], r["rev_seqno"],
                         r["flags"], r["expiry"], r["datatype"], r["collection_id"], r["delete_time"],
                         *names(r["collection_id"])) for r in rows]
    assert [json.loads(line) for line in out.splitlines()] == expected


def test_json_lines_without_arrow_are_the_same_objects(server, writer, monkeypatch):
    """Where pyarrow and numpy (the `arrow` extra) are missing, `tail` prints JSON lines from the
    event API: the objects the Arrow batches give, mutations, deletions and system events alike."""
    import io

    from dcpflow.client import tail as tail_module

    from .conftest import run
    from .test_collections import change
    docs = write(writer, 40)
    writer.delete(b"doc7")
    change(server, lambda m: m.add_scope("shop"))

    def objects(columnar: bool) -> list[dict]:
        monkeypatch.setattr(tail_module, "columnar", lambda: columnar)
        out, err = io.StringIO(), io.StringIO()
        rc = run(tail_module.tail(url(server.port), username="Administrator", password="password",
                                  start="beginning", state_path=None, vbuckets=None, fmt="jsonl", until="now",
                                  progress=False, save_interval=5.0, out=out, err=err))
        assert rc == 0, err.getvalue()
        return sorted(lines(out.getvalue()), key=lambda d: (d["vbucket"], d["seqno"], d["event"]))

    events = objects(False)
    assert events == objects(True)
    assert {d["key"] for d in events if d["event"] == "mutation"} == {k.decode() for k in docs} - {"doc7"}
    assert [d["key"] for d in events if d["event"] == "deletion"] == ["doc7"]
    assert {d["kind"] for d in events if d["event"] == "system"} == {"scope_created"}


def test_mitigate_rollbacks_prints_a_change_only_once_it_is_persisted(server, writer, tmp_path):
    """--mitigate-rollbacks: with the server's persistence paused, what is only in memory is held
    (a plain tail prints it at once); it is printed when persistence resumes, and the saved
    offsets are those of what was printed."""
    from tests.server.faults.helpers import high_seqnos, http_of
    from tests.server.faults.helpers import persisted as wait_persisted
    http = http_of(server)
    state = tmp_path / "offsets.json"
    docs = write(writer, 20)
    for vb, high in high_seqnos(writer).items():  # every document on disk
        if high:
            wait_persisted(writer, vb, high)
    assert http.post("/faults/buckets/default/persistence/pause").status == 200
    try:
        held = write(writer, 10, prefix="held")
        plain = tail(url(server.port), "--until", "now")
        assert {d["key"] for d in lines(plain.stdout)} >= {k.decode() for k in held}  # streamed at once
        proc = popen([sys.executable, "-m", "dcpflow.cli", "tail", url(server.port), "--until", "now",
                      "--mitigate-rollbacks", "--persistence-poll-interval", "0.02", "--state", str(state)],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
        try:
            printed = []
            deadline = time.monotonic() + 60
            while {d["key"] for d in printed} < {k.decode() for k in docs}:
                line = proc.stdout.readline()
                assert line and time.monotonic() < deadline, proc.stderr.read() if proc.poll() is not None else printed
                printed.append(json.loads(line))
            assert proc.poll() is None  # still waiting for the held changes
            assert not [d for d in printed if d["key"].startswith("held")]
        except BaseException:
            kill_group(proc)  # not left reconnecting to this port once the server is gone
            raise
    finally:
        assert http.post("/faults/buckets/default/persistence/resume").status == 200
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        kill_group(proc)
    assert proc.returncode == 0, err
    printed += lines(out)
    assert {d["key"] for d in printed} == {k.decode() for k in docs} | {k.decode() for k in held}
    saved = json.loads(state.read_text())["offsets"]
    assert sum(off[1] for off in saved.values()) == len(docs) + len(held)  # one seqno per document written
