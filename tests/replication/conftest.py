"""Fixtures for the replication tests: the real server of tests/server plus a consumer peer."""

import asyncio
import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dcpflow.protocol import kv
from dcpflow.protocol.dcp import VBucketState
from dcpflow.protocol.status import Status
from dcpflow.replication.cluster import ClusterManager
from dcpflow.replication.commands import free_ports
from dcpflow.replication.node import NodeProcess
from tests.server import conftest as _server_fixtures
from tests.server.client import RawClient
from tests.server.conftest import stop_all

from . import xdcr_helpers
from .driver import ConsumerPeer

# The real server fixtures of tests/server, reused here.
make_server = _server_fixtures.make_server
server = _server_fixtures.server
spawn_server = _server_fixtures.spawn_server


def engine_of(srv):
    return srv.server.buckets["default"].engine


def set_state(srv, vb: int, state: VBucketState) -> None:
    """SET_VBUCKET over the wire, as the cluster manager does."""
    with srv.login() as c:
        opaque = c.next_opaque()
        c.send(kv.SetVbucket(vb, int(state), opaque=opaque).encode())
        assert c.recv().status == Status.SUCCESS


@pytest.fixture(autouse=True)
def _no_replicator_outlives_its_test():
    """A test that left a replicator running (a second one that failed to start, a stop skipped
    when the first stop raised) fails, and the replicator is stopped."""
    yield
    left = list(xdcr_helpers.RUNNING)
    for rep in left:
        with contextlib.suppress(BaseException):
            rep.stop()
    assert not left, f"{len(left)} replicator(s) left running by the test, stopped now"


@pytest.fixture
def peers(server):
    """peers(**open_kw) -> a ConsumerPeer with an open consumer connection to `server`."""
    made: list[ConsumerPeer] = []

    def make(srv=None, **kw) -> ConsumerPeer:
        srv = srv or server
        p = ConsumerPeer(srv.port)
        p.num_vbuckets = srv.config.num_vbuckets
        made.append(p)
        return p.open_consumer(**kw)

    yield make
    for p in made:
        p.close()


@pytest.fixture
def replica(server):
    """vbuckets 0-3 of `server` turned into replicas (the rest stay active)."""
    for vb in range(4):
        set_state(server, vb, VBucketState.REPLICA)
    return server


# ---------------------------------------------------------------------------------------------
# a real cluster: node subprocesses + the manager on its own event loop in a thread


class LoopThread:
    """An asyncio loop in a daemon thread; `run(coro)` runs a coroutine there and returns its result."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="dcpflow-test-loop")
        self.thread.start()

    def run(self, coro, timeout: float = 120.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


#: seconds a node process may take to say it is ready: three start at once, and on two busy cores a
#: Python process that imports the server can take far longer than the 30 s the CLI allows
NODE_START_TIMEOUT = 180


class ClusterHarness:
    def __init__(self, root: Path, nodes: int = 3, replicas: int = 1, vbuckets: int = 16):
        self.root = root
        self.ports = free_ports(nodes)
        self.procs = [NodeProcess(root / f"node{i}", p, self.ports, vbuckets=vbuckets, flush_interval=0.02,
                                  cluster_dir=root) for i, p in enumerate(self.ports)]
        self.vbuckets = vbuckets
        self.lt = LoopThread()
        self.manager: ClusterManager | None = None
        self.replicas = replicas

    def start(self) -> "ClusterHarness":
        with ThreadPoolExecutor(len(self.procs)) as ex:
            list(ex.map(lambda p: p.start(NODE_START_TIMEOUT), self.procs))

        async def make():
            mgr = ClusterManager([("127.0.0.1", p) for p in self.ports], num_vbuckets=self.vbuckets,
                                 num_replicas=self.replicas, state_path=self.root / "cluster.json",
                                 reconcile_interval=0.2, takeover_timeout=60)
            for node, proc in zip(mgr.nodes, self.procs, strict=True):
                node.process = proc

            async def restart(node):
                await asyncio.to_thread(node.process.start, NODE_START_TIMEOUT)

            mgr.restart_node = restart
            return await mgr.start()

        self.manager = self.lt.run(make())
        return self

    def run(self, coro, timeout: float = 120.0):
        return self.lt.run(coro, timeout)

    def address(self, i: int) -> str:
        return f"127.0.0.1:{self.ports[i]}"

    @property
    def connstr(self) -> str:
        return "couchbase://" + ",".join(self.address(i) for i in range(len(self.ports)))

    def status(self) -> dict:
        return self.run(self.manager.status())

    def client(self, i: int) -> RawClient:
        c = RawClient(self.ports[i])
        c.num_vbuckets = self.vbuckets
        return c.login()

    def close(self) -> None:
        try:
            if self.manager is not None:
                self.run(self.manager.stop(), 30)
        finally:
            for p in self.procs:
                p.stop(10)
            self.lt.close()


@pytest.fixture
def make_cluster(tmp_path):
    made: list[ClusterHarness] = []

    def make(**kw) -> ClusterHarness:
        h = ClusterHarness(tmp_path / f"cluster{len(made)}", **kw)
        made.append(h)
        return h.start()

    yield make
    stop_all(made, ClusterHarness.close)


@pytest.fixture
def cluster(make_cluster) -> ClusterHarness:
    return make_cluster()
