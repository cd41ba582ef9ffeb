"""The server around the connections: users files and roles, background tasks (expiry pager,
compaction), several buckets, CLI start-up errors and debug logging."""

import json
import os
import sqlite3
import sys
import time
from pathlib import Path

import pytest

from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from dcpflow.server import Server, ServerConfig, UserDB
from dcpflow.server.auth import Privilege, ScramCredential, make_user, parse_role

from .client import RawClient
from .conftest import ServerProcess, keys_in


def wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def test_users_file_with_plain_and_hashed_passwords(tmp_path, make_server):
    hashed = {alg: ScramCredential.derive(alg, "s3cret", iterations=1000).to_json()
              for alg in ("sha512", "sha256", "sha1")}
    doc = {"users": {
        "Administrator": {"password": "password", "roles": ["admin"]},
        "hashed": {"scram-sha-512": hashed["sha512"], "scram-sha-256": hashed["sha256"],
                   "scram-sha-1": hashed["sha1"], "roles": ["bucket_full_access[*]"]},
    }}
    path = tmp_path / "users.json"
    path.write_text(json.dumps(doc))
    server = make_server(users=str(path))
    for mech in ("SCRAM-SHA512", "SCRAM-SHA256", "SCRAM-SHA1"):
        with server.client() as c:
            assert c.auth_scram("hashed", "s3cret", mech).status == Status.SUCCESS
            assert c.select("default").status == Status.SUCCESS
            assert c.set(b"k", b"v").status == Status.SUCCESS
        with server.client() as c:
            assert c.auth_scram("hashed", "nope", mech).status == Status.AUTH_ERROR
    server = make_server(users=str(path), plain_over_tcp=True)
    with server.client() as c:
        assert c.auth_plain("hashed", "s3cret").status == Status.SUCCESS  # PLAIN checks the SCRAM keys
    with server.client() as c:
        assert c.auth_plain("hashed", "s3cre").status == Status.AUTH_ERROR


def test_roles_grammar():
    assert parse_role("admin") == ("admin", None)
    assert parse_role("data_reader[default]") == ("data_reader", "default")
    user = make_user("u", password="p", roles=["data_reader[a]", "data_writer[a]", "dcp_reader[*]"])
    assert user.privileges("a") & Privilege.WRITE and user.privileges("a") & Privilege.READ
    assert user.privileges("b") == Privilege.READ | Privilege.META_READ | Privilege.DCP_PRODUCER | Privilege.STATS
    assert not user.privileges("b") & Privilege.WRITE
    assert make_user("a", password="p", roles=["admin"]).privileges(None) & Privilege.NODE_MANAGEMENT
    for bad in (["superuser"], ["data_reader"], ["data_reader[]"], ["admin[x]"]):
        with pytest.raises(ValueError):
            make_user("u", password="p", roles=bad)
    with pytest.raises(ValueError):
        make_user("u", roles=["admin"])  # no password, no hashes
    with pytest.raises(ValueError):
        UserDB.from_json({"Administrator": {}})


def test_expiry_pager_expires_without_access(make_server):
    server = make_server(expiry_interval=0.05)
    with server.login() as c:
        c.set(b"short", b"v", expiry=1)
        c.set(b"long", b"v", expiry=3600)
        assert c.stats()["curr_items"] == "2"
        wait_for(lambda: c.stats()["curr_items"] == "1")
        assert c.get(b"long").status == Status.SUCCESS


def test_compaction_purges_old_tombstones(make_server):
    server = make_server(purge_interval=0, compaction_interval=0.05)
    with server.login() as c:
        c.set(b"gone", b"v")
        c.delete(b"gone")
        vb = c.vbucket_of(b"gone")
        wait_for(lambda: int(c.stats(f"vbucket-seqno {vb}")[f"vb_{vb}:purge_seqno"]) == 2)
        assert c.call(Opcode.GET_META, key=b"gone", vbucket=vb).status == Status.KEY_ENOENT


def test_an_idle_flusher_seals_runs(make_server):
    """Writes that leave a vbucket's last run unfinished (over run_min_bytes, under run_bytes)
    become a run once the flusher has nothing to do, so data at rest backfills from runs."""
    server = make_server()
    store = server.server.buckets["default"].engine.store
    keys = keys_in(3, 150)
    with server.login() as c:
        for key in keys:
            c.set(key, b"x" * 100, vbucket=3)
        wait_for(lambda: server.call(store.run_count, 3) == 1)
        assert not server.call(store.unsealed)
        db = sqlite3.connect(store.path)
        assert [(i & (1 << 48) - 1, hi, n) for i, hi, n in db.execute("SELECT id, hi, count FROM runs")] == [
            (0, 150, 150)]
        db.close()
        c.set(keys[0], b"y" * 100, vbucket=3)  # a newer version drops the run around the old one
        wait_for(lambda: server.call(store.run_count, 3) == 0)


def test_several_buckets_are_separate(make_server):
    server = make_server(buckets=("default", "second"))
    with server.login() as a, server.login(bucket="second") as b:
        a.set(b"k", b"in default")
        assert b.get(b"k").status == Status.KEY_ENOENT
        b.set(b"k", b"in second")
        assert a.get(b"k").value == b"in default"
        assert json.loads(b.call(Opcode.GET_CLUSTER_CONFIG).value)["name"] == "second"


def test_unknown_opcodes_are_logged_in_debug_mode(make_server, capfd):
    server = make_server(debug=True)
    with server.client() as c:
        assert c.call(0xE7).status == Status.UNKNOWN_COMMAND
    wait_for(lambda: "unknown opcode 0xe7" in capfd.readouterr().err, timeout=60)


def test_in_process_api(tmp_path):
    import asyncio

    async def main():
        async with Server(ServerConfig(data_dir=tmp_path, port=0, num_vbuckets=8)) as srv:
            port = srv.port
            assert port and set(srv.buckets) == {"default"}
            reply = await asyncio.get_running_loop().run_in_executor(None, roundtrip, port)
            assert reply == b"hello"
        assert srv.closed
        return port

    def roundtrip(port: int) -> bytes:
        with RawClient(port) as c:
            c.num_vbuckets = 8
            c.login()
            c.set(b"k", b"hello")
            return c.get(b"k").value

    asyncio.run(main())


def test_cli_refuses_a_bucket_created_with_other_settings(tmp_path, spawn_server):
    first = spawn_server("--data-dir", str(tmp_path), "--vbuckets", "8")
    assert first.terminate() == 0
    with pytest.raises(AssertionError, match="cannot start"):
        ServerProcess(["--data-dir", str(tmp_path), "--vbuckets", "16"])
    # without the flags an existing bucket opens as it was created (docs/cli.md)
    again = spawn_server("--data-dir", str(tmp_path))
    with RawClient(again.port) as c:
        c.num_vbuckets = 8
        c.login()
        assert c.get(b"k", vbucket=7).status == Status.KEY_ENOENT  # vbucket 7 exists
        assert c.get(b"k", vbucket=8).status == Status.NOT_MY_VBUCKET
    assert again.terminate() == 0


def test_cli_refuses_a_store_of_a_newer_schema_version(tmp_path, spawn_server):
    """A bucket's store written by a newer dcpflow (store.py, "Schema version"): the server does
    not start, says which versions, and leaves the file as it was."""
    first = spawn_server("--data-dir", str(tmp_path), "--vbuckets", "8")
    assert first.terminate() == 0
    path = tmp_path / "default" / "store.sqlite3"
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 4")
    db.close()
    with pytest.raises(AssertionError, match=r"cannot start: store .*store.sqlite3 has schema version 4; "
                                             r"this dcpflow reads schema versions 1 to 3"):
        ServerProcess(["--data-dir", str(tmp_path)])
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone() == (4,)
    db.close()


def test_cli_port_in_use_fails_before_creating_buckets(tmp_path):
    """A start that cannot bind exits 1 without leaving a bucket behind, which would otherwise fix
    its settings (e.g. 1024 vbuckets) before the start that was meant to create it."""
    import socket
    import subprocess
    import sys

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "dcpflow.cli", "server", "--port", str(port),
                               "--data-dir", str(tmp_path / "data")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "cannot start" in done.stderr
    assert not (tmp_path / "data" / "default").exists()


def test_cli_users_file_and_buckets(tmp_path, spawn_server):
    users = tmp_path / "users.json"
    users.write_text(json.dumps({"users": {"app": {"password": "pw", "roles": ["data_writer[orders]"]}}}))
    proc = spawn_server("--data-dir", str(tmp_path / "d"), "--vbuckets", "8", "--bucket", "orders",
                        "--bucket", "audit", "--users", str(users), "--conflict-resolution", "lww")
    assert "buckets=orders,audit" in proc.ready_line
    with RawClient(proc.port) as c:
        c.num_vbuckets = 8
        c.login(user="app", password="pw", bucket="orders")
        assert c.set(b"o1", b"{}").status == Status.SUCCESS
        assert c.get(b"o1").status == Status.EACCESS
        assert c.select("audit").status == Status.EACCESS
    with RawClient(proc.port) as c:
        assert c.auth_scram("Administrator", "password").status == Status.AUTH_ERROR  # only the file's users
    assert proc.terminate() == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
@pytest.mark.parametrize("nice", [7, 0])
def test_the_flusher_thread_runs_nicer_than_the_server(tmp_path, spawn_server, nice):
    """`--flusher-nice N`: the thread that writes flush batches runs N nice levels below every
    other thread of the server (requests come first); 0 leaves it equal."""
    server = spawn_server("--data-dir", str(tmp_path), "--vbuckets", "8", "--flush-interval", "0.01",
                          "--flusher-nice", str(nice))
    with RawClient(server.port) as c:
        c.num_vbuckets = 8
        c.login()
        assert c.set(b"k", b"v").status == Status.SUCCESS
        wait_for(lambda: c.stats()["ep_total_persisted"] != "0")

    def nice_values() -> list[int]:
        task = Path(f"/proc/{server.proc.pid}/task")
        # field 19 of stat, counted after the command name (which may hold spaces) ends with ")"
        return [int((t / "stat").read_text().rsplit(")", 1)[1].split()[16]) for t in task.iterdir()]

    values = nice_values()
    base = os.getpriority(os.PRIO_PROCESS, server.proc.pid)
    assert sorted(values) == sorted([base] * (len(values) - 1) + [min(19, base + nice)])
    if nice:
        assert values.count(base + nice) == 1
