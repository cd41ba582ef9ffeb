"""Fixtures for the client tests: the real server (in-process thread, or a `dcpflow server`
subprocess) from tests/server, a blocking writer, and `run(coro)` to drive the asyncio client."""

import asyncio
import time

import pytest

from tests.server.conftest import (  # noqa: F401
    NUM_VBUCKETS,
    ServerThread,
    keys_in,
    make_server,
    server,
    spawn_server,
    users_db,
)

USER, PASSWORD = "Administrator", "password"


def url(port: int, bucket: str = "default", **options) -> str:
    query = "&".join(f"{k}={v}" for k, v in options.items())
    return f"couchbase://127.0.0.1:{port}/{bucket}" + (f"?{query}" if query else "")


def run(coro, timeout: float = 60):
    """Run a coroutine to completion on a fresh loop, failing (not hanging) after `timeout`."""
    async def guarded():
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(guarded())


def write(client, n: int, prefix: str = "doc", start: int = 0, size: int = 0) -> dict[bytes, bytes]:
    """SET n JSON documents; returns {key: value}."""
    out = {}
    pad = "x" * size
    for i in range(start, start + n):
        key = f"{prefix}{i}".encode()
        value = f'{{"n":{i},"p":"{pad}"}}'.encode()
        client.set(key, value, datatype=1)
        out[key] = value
    return out


def contents(client, keys) -> dict[bytes, bytes]:
    """What the server holds for `keys`, read back with GET (missing and deleted keys left out)."""
    out = {}
    for key in keys:
        reply = client.get(key)
        if reply.status == 0:
            out[key] = reply.value
    return out


def engine_vbucket(st: ServerThread, vb: int, attr: str):
    """An attribute of the engine's vbucket, read on the server's own thread."""
    return st.call(lambda: getattr(st.server.buckets["default"].engine.vbucket(vb), attr))


def flush_to_disk(st: ServerThread, vb: int, timeout: float = 60.0) -> None:
    """Persist the vbucket and start a new checkpoint, so a stream from an earlier seqno must be
    served from disk (a Disk snapshot)."""
    def wait():
        deadline = time.monotonic() + timeout
        while engine_vbucket(st, vb, "persisted_seqno") < engine_vbucket(st, vb, "high_seqno"):
            assert time.monotonic() < deadline, "the flusher did not persist in time"
            time.sleep(0.01)
    wait()
    st.call(lambda: st.server.buckets["default"].engine.vbucket(vb).checkpoint_manager.create_checkpoint())
    wait()


@pytest.fixture
def writer(server):  # noqa: F811  (the imported fixture)
    with server.login() as c:
        yield c
