"""`dcpflow cluster up | status | failover | rebalance | down` as a user runs them: subprocesses."""

import base64
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from couchbase.diagnostics import PingState, ServiceType

import dcpflow
from dcpflow.replication.commands import free_ports

from .helpers import sdk_connect

READY = re.compile(r"^dcpflow cluster ready: nodes=(\S+) replicas=(\d+) vbuckets=(\d+) data_dir=(\S+) "
                   r"connstr=(\S+) mgmt=(\S+)$")


def node_services(address: str) -> list[dict]:
    """nodesExt of a node's management API: the map it serves, with every node's service ports."""
    req = urllib.request.Request(f"http://{address}/pools/default/nodeServices",
                                 headers={"Authorization": "Basic " + base64.b64encode(b"Administrator:password")
                                          .decode()})
    with urllib.request.urlopen(req, timeout=30) as reply:
        return json.loads(reply.read())["nodesExt"]


def env() -> dict:
    e = dict(os.environ)
    src = str(Path(dcpflow.__file__).resolve().parents[1])
    e["PYTHONPATH"] = src + os.pathsep + e.get("PYTHONPATH", "")
    return e


def cli(*args, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "dcpflow.cli", "cluster", *args], capture_output=True, text=True,
                       env=env(), timeout=timeout)
    if check:
        assert p.returncode == 0, (p.stdout, p.stderr)
    return p


def free_range(n: int) -> int:
    """A base port with n free ports above it (probed now; nothing fixed)."""
    return free_ports(n, consecutive=True)[0]


class Up:
    def __init__(self, data_dir: Path, *args: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "dcpflow.cli", "cluster", "up", "--data-dir",
                                      str(data_dir), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env())
        self.line = self.proc.stdout.readline().strip()

    def cleanup(self, data_dir: Path) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self.proc.stdout.close()
        self.proc.stderr.close()
        # nodes follow their manager (--exit-with); make sure of it
        state = data_dir / "cluster.json"
        if state.exists():
            for pid in json.loads(state.read_text()).get("node_pids", []):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture
def up(tmp_path):
    started = []

    def start(*args: str, data_dir: Path | None = None) -> Up:
        d = data_dir or tmp_path / "cluster"
        u = Up(d, *args)
        started.append((u, d))
        return u

    yield start
    for u, d in started:
        u.cleanup(d)


def test_cluster_lifecycle(up, tmp_path):
    data = tmp_path / "cluster"
    base = free_range(3)
    u = up("--nodes", "3", "--replicas", "1", "--vbuckets", "16", "--base-port", str(base))
    m = READY.match(u.line)
    assert m, (u.line, u.proc.stderr.read() if u.proc.poll() is not None else "")
    nodes = m.group(1).split(",")
    assert nodes == [f"127.0.0.1:{base + i}" for i in range(3)]
    assert (m.group(2), m.group(3), m.group(4)) == ("1", "16", str(data))
    assert oct((data / "cluster.json").stat().st_mode & 0o777) == "0o600"

    st = json.loads(cli("status", "--json", "--data-dir", str(data)).stdout)
    assert [n["node"] for n in st["nodes"]] == nodes and st["streams"] == 16
    assert sum(n["active_vbuckets"] for n in st["nodes"]) == 16
    table = cli("status", "--data-dir", str(data)).stdout
    assert "replica seqnos" in table and nodes[0] in table

    # Every node has its own management listener, and every node's map advertises all of them.
    mgmt = m.group(6).split(",")
    mgmt_ports = [int(a.rsplit(":", 1)[1]) for a in mgmt]
    assert len(set(mgmt_ports)) == 3
    for i, address in enumerate(mgmt):
        ext = node_services(address)
        assert [n["services"]["mgmt"] for n in ext] == mgmt_ports and ext[i].get("thisNode") is True

    sdk = sdk_connect(m.group(5))
    try:
        col = sdk.bucket("default").default_collection()
        for i in range(100):
            col.upsert(f"cli{i}", {"i": i})
        report = sdk.ping()
        management = report.endpoints[ServiceType.Management]
        assert sorted(ep.remote for ep in management) == sorted(mgmt)
        assert all(ep.state == PingState.OK for ep in management)
    finally:
        sdk.close()
    deadline = time.monotonic() + 60
    while True:
        st = json.loads(cli("status", "--json", "--data-dir", str(data)).stdout)
        if sum(n["replication_lag_items"] for n in st["nodes"]) == 0 and \
                sum(n["replica_high_seqno_total"] for n in st["nodes"]) == 100:
            break
        assert time.monotonic() < deadline
        time.sleep(0.1)

    os.kill(st["nodes"][1]["pid"], signal.SIGKILL)
    out = cli("failover", nodes[1], "--data-dir", str(data)).stdout
    assert f"failed over {nodes[1]}" in out
    st = json.loads(cli("status", "--json", "--data-dir", str(data)).stdout)
    assert st["nodes"][1]["status"] == "failed over" and st["vbuckets_without_active"] == 0
    bad = cli("failover", "127.0.0.1:1", "--data-dir", str(data), check=False)
    assert bad.returncode == 1 and "not a node of this cluster" in bad.stderr

    out = cli("rebalance", "--data-dir", str(data)).stdout
    assert out.startswith("rebalanced over 3 node(s)")
    # node 1 was restarted by the rebalance: on the management port it had, in every map
    assert [n["services"]["mgmt"] for n in node_services(mgmt[1])] == mgmt_ports
    assert oct((data / "cluster.json").stat().st_mode & 0o777) == "0o600"  # it holds the control token
    st = json.loads(cli("status", "--json", "--data-dir", str(data)).stdout)
    assert [n["status"] for n in st["nodes"]] == ["up", "up", "up"]
    assert sorted(n["active_vbuckets"] for n in st["nodes"]) == [5, 5, 6]

    sdk = sdk_connect(m.group(5))
    try:
        col = sdk.bucket("default").default_collection()
        assert [col.get(f"cli{i}").content_as[dict]["i"] for i in range(100)] == list(range(100))
    finally:
        sdk.close()

    again = Up(data, "--base-port", "0")  # a second manager on the same data dir refuses
    assert again.proc.wait(30) == 1 and "already up" in again.proc.stderr.read()
    again.cleanup(tmp_path / "nowhere")

    assert cli("down", "--data-dir", str(data)).stdout.strip() == "cluster stopped"
    assert u.proc.wait(30) == 0
    for n in st["nodes"]:
        deadline = time.monotonic() + 60
        while True:
            try:
                os.kill(n["pid"], 0)
            except ProcessLookupError:
                break
            assert time.monotonic() < deadline, f"node {n['node']} still running"
            time.sleep(0.05)
    gone = cli("status", "--data-dir", str(data), check=False)
    assert gone.returncode == 1 and "not running" in gone.stderr


def test_up_restarts_a_stopped_cluster_with_its_data(up, tmp_path):
    data = tmp_path / "cluster"
    u = up("--nodes", "2", "--replicas", "1", "--vbuckets", "8", "--base-port", "0")
    m = READY.match(u.line)
    assert m, u.line
    sdk = sdk_connect(m.group(5))
    try:
        sdk.bucket("default").default_collection().upsert("kept", {"v": 1})
    finally:
        sdk.close()
    rev = json.loads((data / "cluster.json").read_text())["rev"]
    cli("down", "--data-dir", str(data))
    assert u.proc.wait(30) == 0
    u2 = up("--nodes", "5", data_dir=data)  # the stored cluster wins over new sizing flags
    m2 = READY.match(u2.line)
    assert m2 and m2.group(1) == m.group(1)
    assert "starting it as it was" in u2.proc.stderr.readline()
    st = json.loads(cli("status", "--json", "--data-dir", str(data)).stdout)
    assert st["rev"] > rev and len(st["nodes"]) == 2
    sdk = sdk_connect(m2.group(5))
    try:
        assert sdk.bucket("default").default_collection().get("kept").content_as[dict] == {"v": 1}
    finally:
        sdk.close()


def test_commands_without_a_cluster(tmp_path):
    for cmd in (["status"], ["rebalance"], ["failover", "127.0.0.1:1"], ["down"]):
        p = cli(*cmd, "--data-dir", str(tmp_path / "none"), check=False)
        assert p.returncode == 1 and "no cluster in" in p.stderr, (cmd, p.stderr)


def test_up_refuses_bad_sizes(tmp_path):
    p = cli("up", "--nodes", "1", "--data-dir", str(tmp_path / "one"), "--base-port", "0", check=False)
    assert p.returncode == 2 and "at least 2 nodes" in p.stderr
    p = cli("up", "--replicas", "4", "--data-dir", str(tmp_path / "four"), "--base-port", "0", check=False)
    assert p.returncode == 2 and "0..3" in p.stderr


def _plain_auth(address: str) -> tuple[int, bytes, bytes]:
    """(status of SASL PLAIN, the mechanisms listed, the reply's value) on a node's plain-TCP port:
    what a DCP client that speaks only PLAIN does."""
    from dcpflow.protocol.opcodes import Opcode
    from tests.server.client import RawClient
    with RawClient(int(address.rsplit(":", 1)[1])) as c:
        mechs = c.call(Opcode.SASL_LIST_MECHS).value
        reply = c.auth_plain("Administrator", "password")
        return reply.status, mechs, reply.value


def test_up_with_plain_over_tcp_and_a_chosen_control_port(up, tmp_path):
    """--allow-plain-over-tcp reaches every node (PLAIN authenticates; refused without it, as
    Couchbase Server refuses PLAIN outside TLS), and --control-port is the port the manager listens
    on and records in cluster.json; a taken one fails at once with a clear error."""
    from dcpflow.protocol.status import Status
    data = tmp_path / "cluster"
    control = free_range(1)
    u = up("--nodes", "2", "--replicas", "1", "--vbuckets", "8", "--base-port", "0", "--allow-plain-over-tcp",
           "--control-port", str(control))
    m = READY.match(u.line)
    assert m, (u.line, u.proc.stderr.read() if u.proc.poll() is not None else "")
    nodes = m.group(1).split(",")
    for node in nodes:
        status, mechs, _ = _plain_auth(node)
        assert status == Status.SUCCESS and b"PLAIN" in mechs.split(), (node, status, mechs)
    assert json.loads((data / "cluster.json").read_text())["manager"]["control_port"] == control
    with socket.create_connection(("127.0.0.1", control), timeout=30) as sock:  # the manager answers there
        sock.sendall(b'{"cmd": "status", "token": "wrong"}\n')
        assert "bad token" in json.loads(sock.makefile().readline())["error"]
    assert len(json.loads(cli("status", "--json", "--data-dir", str(data)).stdout)["nodes"]) == 2

    taken = cli("up", "--nodes", "2", "--base-port", "0", "--data-dir", str(tmp_path / "other"), "--control-port",
                str(control), check=False, timeout=60)
    assert taken.returncode == 1 and f"cannot listen on control port {control}" in taken.stderr, taken.stderr

    cli("down", "--data-dir", str(data))
    assert u.proc.wait(30) == 0
    u2 = up(data_dir=data)  # the same cluster, started without the flags: PLAIN refused, a free control port
    assert READY.match(u2.line), u2.line
    status, mechs, _ = _plain_auth(nodes[0])
    assert status == Status.AUTH_ERROR and b"PLAIN" not in mechs.split()
    assert json.loads(cli("status", "--json", "--data-dir", str(data)).stdout)["nodes"]


def test_free_ports_are_below_the_ports_the_kernel_hands_out():
    """`--base-port 0` and the test clusters restart nodes on the ports they had: a port of the
    ephemeral range may be taken by then as the local end of any outgoing connection (or by a
    listener on port 0), and the node could not come back."""
    from dcpflow.replication.commands import EPHEMERAL_RANGE_FILE
    low = int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    for ports in (free_ports(5), free_ports(4, consecutive=True)):
        assert len(set(ports)) == len(ports) and all(1024 <= p < low for p in ports), (ports, low)
        socks = [socket.create_server(("127.0.0.1", p)) for p in ports]  # free indeed
        for s in socks:
            s.close()
    row = free_ports(4, consecutive=True)
    assert row == list(range(row[0], row[0] + 4))
