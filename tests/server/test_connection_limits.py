"""Connection limits (server/app.py, server/listener.py): client connections up to max_connections,
a reserve beyond it kept for administrators, an immediate close beyond both; running out of file
descriptors pauses accepting, is logged once per interval (never a traceback per accept), and the
connections that waited are served once descriptors are free."""

import os
import re
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import dcpflow
from dcpflow.protocol.frame import request
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from dcpflow.server.app import FD_HEADROOM, connection_limit

from .client import Closed, RawClient


def wait_for(fn, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while not fn():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_the_limit_fits_the_descriptor_limit():
    assert connection_limit(60_000, 16, nofile=1024) == 1024 - FD_HEADROOM - 16
    assert connection_limit(100, 16, nofile=1 << 20) == 100
    assert connection_limit(100, 16, nofile=resource.RLIM_INFINITY) == 100
    assert connection_limit(100, 16, nofile=FD_HEADROOM) == 1


def test_connections_beyond_the_limit_use_the_reserve_or_are_closed(make_server):
    server = make_server(max_connections=3, system_connections=2)
    clients = [server.login(user="writer", password="writepw") for _ in range(3)]
    try:
        for c in clients:
            assert c.set(b"k", b"v").status == Status.SUCCESS
        # the 4th and 5th are admitted into the reserve: an administrator stays...
        admin = server.login()
        assert admin.set(b"k", b"admin").status == Status.SUCCESS
        # ...anyone else is told to come back later, and closed
        other = RawClient(server.port)
        other.hello()
        refused = other.auth_scram("writer", "writepw")
        assert refused.status == Status.ETMPFAIL
        assert other.is_closed()
        other.close()
        # with the limit and the reserve full, a new connection is closed before it says anything
        second_admin = server.login()
        beyond = RawClient(server.port)
        with pytest.raises((Closed, ConnectionResetError)):
            beyond.call(Opcode.NOOP)
        beyond.close()
        counts = server.call(lambda: dict(server.server.refused_connections))
        assert counts["reserve"] == 1 and counts["limit"] == 1
        # room again: an ordinary user gets in
        clients.pop().close()
        wait_for(lambda: server.call(lambda: len(server.server.connections)) == 4)
        with server.login(user="writer", password="writepw") as again:
            assert again.set(b"k", b"again").status == Status.SUCCESS
        admin.close()
        second_admin.close()
    finally:
        for c in clients:
            c.close()


def _spawn(args: list[str], nofile: int, loop: str, tmp_path: Path) -> tuple[subprocess.Popen, int, int, Path]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(dcpflow.__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    err = tmp_path / "stderr.log"

    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    proc = subprocess.Popen([sys.executable, "-m", "dcpflow.cli", "server", "--port", "0", "--mgmt-port", "0",
                             "--loop", loop, *args], stdout=subprocess.PIPE, stderr=err.open("w"), env=env,
                            preexec_fn=limit, text=True)
    line = proc.stdout.readline()
    m = re.search(r" port=(\d+).* mgmt_port=(\d+)", line)
    assert m, (line, err.read_text())
    return proc, int(m.group(1)), int(m.group(2)), err


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_running_out_of_descriptors_is_logged_once_per_interval(tmp_path, loop):
    """A server limited to 300 descriptors: 300 idle connections to its management port take them
    all, then 100 KV clients connect. Each accept that fails pauses the listener (the clients wait
    in the backlog); the log gets one line per 10 s, no traceback (asyncio's own accept loop wrote
    hundreds per second). Once the idle connections go, the waiting KV clients are served."""
    pytest.importorskip(loop) if loop == "uvloop" else None
    proc, port, mgmt_port, err = _spawn(["--data-dir", str(tmp_path / "data"), "--vbuckets", "16"], 300, loop,
                                        tmp_path)
    hogs, waiting = [], []
    try:
        for _ in range(300):
            hogs.append(socket.create_connection(("127.0.0.1", mgmt_port), timeout=10))
        for _ in range(100):
            waiting.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        # exhaustion is noticed (accepts keep failing while the hogs stay), and logged once
        wait_for(lambda: "cannot accept connections: Too many open files" in err.read_text(), timeout=20)
        time.sleep(1.0)  # the listener retries four times a second meanwhile
        for s in hogs:
            s.close()
        hogs.clear()
        for s in waiting[-3:]:
            s.settimeout(20)
            s.sendall(request(Opcode.NOOP, opaque=7))
            reply = s.recv(24)
            assert reply[:2] == bytes([0x81, Opcode.NOOP]) and int.from_bytes(reply[6:8], "big") == Status.SUCCESS
    finally:
        for s in hogs + waiting:
            s.close()
        proc.terminate()
        proc.wait(30)
        proc.stdout.close()
    text = err.read_text()
    lines = [line for line in text.splitlines() if "cannot accept connections" in line]
    assert 1 <= len(lines) <= 3, text[-3000:]  # one per 10 s: the run may straddle an interval or two
    assert "Traceback" not in text and "Invalid file descriptor" not in text, text[-3000:]
    assert len(text) < 4000, text[-3000:]


def test_connection_limits_and_refusals_are_metrics(make_server):
    import base64
    import urllib.request
    server = make_server(max_connections=1, system_connections=0)
    with server.login(), RawClient(server.port) as beyond, pytest.raises((Closed, ConnectionResetError)):
        beyond.call(Opcode.NOOP)
    req = urllib.request.Request(f"http://127.0.0.1:{server.mgmt_port}/metrics")
    req.add_header("Authorization", "Basic " + base64.b64encode(b"Administrator:password").decode())
    text = urllib.request.urlopen(req, timeout=10).read().decode()
    assert 'kv_max_connections{type="client"} 1' in text and 'kv_max_connections{type="system"} 0' in text
    assert 'kv_connections_refused_total{reason="limit"} 1' in text
    assert 'kv_log_lines_suppressed_total' not in text  # one refusal: logged, nothing left out
