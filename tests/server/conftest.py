"""Fixtures: a real dcpflow server on 127.0.0.1 (in a background thread with its own event loop, or
as a `python -m dcpflow.cli server` subprocess), storing into tmp_path, always stopped afterwards."""

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import dcpflow
from dcpflow.server import Server, ServerConfig, UserDB, make_user
from tests.processes import first_line, kill_group, popen

from .client import RawClient

NUM_VBUCKETS = 64


def keys_in(vb: int, n: int, num_vbuckets: int = NUM_VBUCKETS, prefix: str = "k") -> list[bytes]:
    """n distinct keys that hash to vbucket `vb` (tests that need writes in a chosen vbucket)."""
    from dcpflow.protocol.keys import vbucket_for_key
    out, i = [], 0
    while len(out) < n:
        key = f"{prefix}{i}".encode()
        if vbucket_for_key(key, num_vbuckets) == vb:
            out.append(key)
        i += 1
    return out


def users_db() -> UserDB:
    return UserDB([
        make_user("Administrator", password="password", roles=["admin"]),
        make_user("reader", password="readpw", roles=["data_reader[default]"]),
        make_user("writer", password="writepw", roles=["data_writer[default]"]),
        make_user("dcp", password="dcppw", roles=["dcp_reader[*]"]),
        make_user("xdcr", password="xdcrpw", roles=["replication_target[default]", "data_reader[default]"]),
        make_user("full", password="fullpw", roles=["bucket_full_access[default]"]),
    ])


class ServerThread:
    """A Server on its own event loop in a daemon thread; `call(fn)` runs fn on that loop (the
    engine's owner thread) and returns its result."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.server: Server | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="dcpflow-test-server")

    def _run(self) -> None:
        async def main():
            self.loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            try:
                self.server = await Server(self.config).start()
            except BaseException as e:
                self._error = e
                self._ready.set()
                return
            self._ready.set()
            await self.server.serve_until(self._stop)
        asyncio.run(main())

    def start(self) -> "ServerThread":
        self._thread.start()
        # warm-up reads the whole data dir (a million items in the large-backfill test): on a busy
        # machine that can take minutes; the bound only keeps a hung start from hanging the suite
        if not self._ready.wait(600):
            raise TimeoutError("the server did not start within 600 s")
        if self._error is not None:
            raise self._error
        return self

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def mgmt_port(self) -> int:
        """The management listener's port: 8091 only when it was free when the server started."""
        return self.server.mgmt.port

    def call(self, fn, *args):
        async def run():
            return fn(*args)
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(60)  # bounds a failure only

    def stop(self) -> None:
        if self.loop is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(120)  # a clean shutdown flushes what is still in memory: slow on a busy machine
        assert not self._thread.is_alive(), "server thread did not stop"

    def client(self, source: str | None = None) -> RawClient:
        c = RawClient(self.port, source=source)
        c.num_vbuckets = self.config.num_vbuckets
        return c

    def login(self, **kwargs) -> RawClient:
        return self.client().login(**kwargs)


def stop_all(things, stop) -> None:
    """stop(thing) for each of them, every one even when one fails (its error is raised after)."""
    errors = []
    for thing in things:
        try:
            stop(thing)
        except Exception as e:
            errors.append(e)
    if errors:
        raise errors[0]


@pytest.fixture
def make_server(tmp_path):
    """make_server(**config) -> a started ServerThread (64 vbuckets, test users); stopped at teardown."""
    started: list[ServerThread] = []

    def make(**overrides) -> ServerThread:
        cfg = dict(data_dir=tmp_path / "data", port=0, num_vbuckets=NUM_VBUCKETS, users=users_db(),
                   synchronous="NORMAL", flush_interval=0.02)
        cfg.update(overrides)
        st = ServerThread(ServerConfig(**cfg))
        started.append(st)
        return st.start()

    yield make
    stop_all(started, ServerThread.stop)


@pytest.fixture
def server(make_server) -> ServerThread:
    return make_server()


@pytest.fixture
def admin(server):
    """An admin client with XERROR/JSON/MutationSeqno, bucket `default` selected."""
    with server.login() as c:
        yield c


# ---------------------------------------------------------------------------------------------
# subprocess servers

READY = re.compile(r"dcpflow server ready: .* port=(\d+)")
#: seconds a server subprocess may take to say it is ready (a warm-up on a busy machine): a bound on a failure
READY_TIMEOUT = 300
MGMT_PORT = re.compile(r" mgmt_port=(\d+)")


class ServerProcess:
    """`python -m dcpflow.cli server` with the given arguments; `port` is read from its ready line."""

    def __init__(self, args: list[str]):
        env = dict(os.environ)
        src = str(Path(dcpflow.__file__).resolve().parents[1])
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
        # a session of its own: cleanup() ends whatever the server started with it, and a server
        # that never says it is ready fails the test after a deadline instead of hanging the suite
        self.proc = popen([sys.executable, "-m", "dcpflow.cli", "server", "--port", "0", *args],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        line = first_line(self.proc, READY_TIMEOUT)
        match = READY.search(line)
        if match is None:
            kill_group(self.proc)
            err = self.proc.stderr.read()
            self.proc.stdout.close()
            self.proc.stderr.close()
            raise AssertionError(f"no ready line: {line!r} {err}")
        self.port = int(match.group(1))
        mgmt = MGMT_PORT.search(line)
        self.mgmt_port = int(mgmt.group(1)) if mgmt else None
        self.ready_line = line

    def terminate(self, timeout: float = 30) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill9(self) -> int:
        self.proc.send_signal(signal.SIGKILL)
        return self.proc.wait(30)

    def cleanup(self) -> None:
        kill_group(self.proc)
        self.proc.stdout.close()
        self.proc.stderr.close()


@pytest.fixture
def spawn_server():
    """spawn_server(*args) -> ServerProcess; killed at teardown if still running."""
    procs: list[ServerProcess] = []

    def spawn(*args: str) -> ServerProcess:
        p = ServerProcess(list(args))
        procs.append(p)
        return p

    yield spawn
    stop_all(procs, ServerProcess.cleanup)

@contextlib.contextmanager
def held_flush(engine):
    """Hold the next flush batch of `engine` in its write step: yields (entered, release) events;
    `entered` is set once a batch is being written, which then waits for `release` (set on exit)."""
    entered, release = threading.Event(), threading.Event()
    write = engine.flusher.write

    def slow_write(batch):
        entered.set()
        release.wait(30)
        write(batch)

    engine.flusher.write = slow_write
    try:
        yield entered, release
    finally:
        release.set()
        engine.flusher.write = write


@pytest.fixture(scope="module")
def sdk_server(tmp_path_factory):
    """A `dcpflow server` subprocess that one module's official-SDK tests share."""
    data = tmp_path_factory.mktemp("sdk")
    proc = ServerProcess(["--data-dir", str(data), "--vbuckets", "64", "--flush-interval", "0.05"])
    try:
        yield proc
    finally:
        proc.cleanup()


@pytest.fixture(scope="module")
def sdk_cluster(sdk_server):
    """The official SDK's Cluster connected to the module's `sdk_server`."""
    from .sdk import connect
    cluster = connect(sdk_server.port)
    try:
        yield cluster
    finally:
        cluster.close()
