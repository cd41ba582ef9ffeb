"""Fixtures for the DCP producer tests: the real server of tests/server (in-process thread on its
own loop, or a subprocess) plus `clients` (DCP producer connections) and a writer."""

# ruff: noqa: F811  (the fixtures imported below are pytest fixtures, re-used by name as parameters)

import pytest

from dcpflow.engine import Bucket, VBucketState
from tests.server.conftest import (  # noqa: F401
    ServerThread,
    keys_in,
    make_server,
    server,
    spawn_server,
    users_db,
)

from .client import DcpClient


@pytest.fixture
def clients(server):
    """clients(**connect_kw) -> a DcpClient connected as a producer to `server`; closed afterwards."""
    made: list[DcpClient] = []

    def make(srv=None, **kw) -> DcpClient:
        srv = srv or server
        c = DcpClient(srv.port)
        c.num_vbuckets = srv.config.num_vbuckets
        made.append(c)
        return c.connect(**kw)

    yield make
    for c in made:
        c.close()


@pytest.fixture
def writer(server):
    with server.login() as c:
        yield c


def engine_of(server):
    return server.server.buckets["default"].engine


def vbucket(server, vb: int):
    return server.call(lambda: engine_of(server).vbucket(vb))


def wait_persisted(server, vb: int, seqno: int | None = None, timeout: float = 10.0) -> None:
    """Until the flusher persisted `seqno` (default: the high seqno) of vbucket `vb`."""
    import time
    deadline = time.monotonic() + timeout
    while True:
        high, persisted = server.call(lambda: (engine_of(server).vbucket(vb).high_seqno,
                                               engine_of(server).vbucket(vb).persisted_seqno))
        if persisted >= (high if seqno is None else seqno):
            return
        assert time.monotonic() < deadline, "the flusher did not persist in time"
        time.sleep(0.01)


def to_disk_only(server, vb: int) -> None:
    """Persist everything and close the open checkpoint, so memory no longer holds the history:
    a stream from an earlier seqno then needs a backfill."""
    wait_persisted(server, vb)
    server.call(lambda: engine_of(server).vbucket(vb).checkpoint_manager.create_checkpoint())
    wait_persisted(server, vb)


def fill(writer, vb: int, n: int, prefix: str = "k", value: bytes = b'{"v":1}') -> list[bytes]:
    keys = keys_in(vb, n, prefix=prefix)
    for k in keys:
        assert writer.set(k, value, vbucket=vb, datatype=0).status == 0
    return keys


def overfill(srv, vb: int, prefix: str = "slow") -> None:
    """Write 420 documents of 500 bytes to `vb` so that its checkpoints go over a small
    `checkpoint_memory_quota`, with a lagging stream cursor the only thing pinning them."""
    w = srv.login()
    keys = keys_in(vb, 420, prefix=prefix)
    for i, key in enumerate(keys[:400]):
        w.set(key, b"x" * 500, vbucket=vb)
        if i % 100 == 99:  # close checkpoints so that old ones can be dropped
            srv.call(lambda: engine_of(srv).vbucket(vb).checkpoint_manager.create_checkpoint())
    wait_persisted(srv, vb)  # only checkpoints the flusher is done with may be released
    for key in keys[400:]:  # over quota again: now the stalled cursor is the one to drop
        w.set(key, b"x" * 500, vbucket=vb)
    w.close()


def stalled_stream(srv, c, vb: int) -> None:
    """A stream held by flow control (nothing acked) while the vbucket keeps changing."""
    c.controls(connection_buffer_size=200)
    assert c.stream_request(vb).status == 0
    overfill(srv, vb)


def dropped_cursors(srv, vb: int) -> int:
    return srv.call(lambda: engine_of(srv).vbucket(vb).checkpoint_manager.num_dropped_cursors)


def server_dropped(srv, vb: int, timeout: float = 5.0) -> bool:
    """Until the checkpoint manager of `vb` dropped a cursor (False after `timeout`)."""
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if dropped_cursors(srv, vb):
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def engine(tmp_path):
    """A bucket of four active vbuckets without a server, for the sans-I/O state machines."""
    bucket = Bucket("default", tmp_path, 4, synchronous="OFF")
    for vb in range(4):
        bucket.set_vbucket_state(vb, VBucketState.ACTIVE)
    yield bucket
    bucket.close(clean=False)
