"""The bucket memory quota through the server: ETMPFAIL near it, values evicted once persisted and
read back from disk off the event loop (a GET waits for its background fetch), ENOMEM when keys and
metadata alone fill it, the quota of the management API, the SDK retrying through a full bucket,
and the server's resident memory under a load several times its quota."""

import base64
import json
import os
import threading
import time
import urllib.request

import pytest

from dcpflow.engine.item import NOT_RESIDENT
from dcpflow.protocol.frame import request
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from tests.resources import rss_anon, wait_for

from .client import RawClient

MiB = 1024 * 1024
VALUE = b"v" * 4096


def engine(server):
    return server.server.buckets["default"].engine


def memory(server) -> dict:
    return server.call(lambda: engine(server).memory.stats())


def set_retrying(c: RawClient, key: bytes, value: bytes, timeout: float = 60.0) -> int:
    """SET until it is not ETMPFAIL (what an SDK does); returns the refusals seen."""
    refused = 0
    deadline = time.monotonic() + timeout
    while True:
        status = c.set(key, value).status
        if status != Status.ETMPFAIL:
            assert status == Status.SUCCESS, status
            return refused
        refused += 1
        assert time.monotonic() < deadline, "the bucket never made room"
        time.sleep(0.01)


def test_a_full_bucket_answers_etmpfail_then_evicts_and_reads_back_from_disk(make_server):
    server = make_server(memory_quota=16 * MiB)
    with server.login() as c:
        # Persistence paused: every value is dirty, so nothing can be evicted and the bucket must
        # refuse before 32 MB are in (a fast flusher could otherwise keep eviction ahead).
        assert c.call(Opcode.STOP_PERSISTENCE).status == Status.SUCCESS
        refused, first = 0, 0
        while (status := c.set(b"doc%05d" % first, VALUE[:-5] + b"%05d" % first).status) == Status.SUCCESS:
            first += 1
            assert first < 8000, "a bucket of dirty values over its quota accepted every write"
        assert status == Status.ETMPFAIL and first * len(VALUE) < 16 * MiB
        refused += 1
        assert c.call(Opcode.START_PERSISTENCE).status == Status.SUCCESS
        for i in range(first, 8000):  # 32 MB of values into a 16 MiB bucket
            refused += set_retrying(c, b"doc%05d" % i, VALUE[:-5] + b"%05d" % i)
        stats = memory(server)
        assert stats["ep_tmp_oom_errors"] == refused and stats["ep_num_value_ejects"] > 0
        assert stats["mem_used"] <= 16 * MiB
        before = stats["ep_bg_fetched"]
        for i in range(0, 8000, 97):  # the early documents are on disk only by now
            reply = c.get(b"doc%05d" % i)
            assert reply.status == Status.SUCCESS and reply.value == VALUE[:-5] + b"%05d" % i
        assert memory(server)["ep_bg_fetched"] > before
        text = c.stats()
        assert int(text["ep_max_size"]) == 16 * MiB and int(text["mem_used"]) <= 16 * MiB


def test_a_background_fetch_keeps_the_connections_requests_in_order(make_server):
    server = make_server(memory_quota=16 * MiB)
    with server.login() as c:
        for i in range(6000):
            set_retrying(c, b"k%05d" % i, VALUE)
        wait_for(lambda: server.call(lambda: engine(server).vbucket(c.vbucket_of(b"k00000")).ht[b"k00000"].value
                                     is NOT_RESIDENT), what="k00000 evicted")
        vb = c.vbucket_of(b"k00000")
        c.send(request(Opcode.GET, key=b"k00000", vbucket=vb, opaque=1) + request(Opcode.NOOP, opaque=2) +
               request(Opcode.GET, key=b"nope", vbucket=c.vbucket_of(b"nope"), opaque=3))
        first, second, third = c.recv_n(3)
        assert (first.opaque, first.status, first.value) == (1, Status.SUCCESS, VALUE)
        assert (second.opaque, third.opaque, third.status) == (2, 3, Status.KEY_ENOENT)


def test_keys_alone_over_the_quota_is_enomem(make_server):
    """Keys and metadata past the quota: ENOMEM, which no eviction can cure. An ENOMEM met while
    the flusher's backlog (checkpoint memory, counted with the metadata) is part of the excess can
    pass once the backlog is written, so the load waits for the flusher and retries before it
    takes an ENOMEM as the bucket's state."""
    server = make_server(memory_quota=2 * MiB)
    with server.login() as c:
        statuses = set()
        for i in range(60_000):  # 200-byte keys and ~80 bytes of metadata each: 2 MiB holds ~7k
            key = b"tiny%06d" % i + b"k" * 190
            status = c.set(key, b"").status
            if status == Status.ENOMEM:
                wait_for(lambda: c.stats().get("ep_queue_size") == "0", timeout=60, what="the backlog written")
                status = c.set(key, b"").status
            statuses.add(status)
            if status == Status.ENOMEM:
                break
            if status == Status.ETMPFAIL:
                time.sleep(0.01)
        assert Status.ENOMEM in statuses
        reply = c.set(b"one-more", b"")
        assert reply.status == Status.ENOMEM and b"raise the quota" in reply.value
        assert c.delete(b"tiny000000" + b"k" * 190).status == Status.SUCCESS  # deletions still work


def test_the_management_apis_ram_quota_is_the_buckets(server):
    auth = "Basic " + base64.b64encode(b"Administrator:password").decode()

    def call(method: str, path: str, form: dict | None = None):
        data = "&".join(f"{k}={v}" for k, v in (form or {}).items()).encode() if form else None
        req = urllib.request.Request(f"http://127.0.0.1:{server.mgmt_port}{path}", data=data, method=method)
        req.add_header("Authorization", auth)
        if data:
            req.add_header("Content-Type", "application/x-www-form-urlencoded")
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()

    assert server.call(lambda: engine(server).memory.quota) == 100 * MiB  # the default
    assert call("POST", "/pools/default/buckets", {"name": "orders", "ramQuotaMB": "128"})[0] == 202
    orders = server.server.buckets["orders"].engine
    assert server.call(lambda: orders.memory.quota) == 128 * MiB
    assert call("POST", "/pools/default/buckets/orders", {"ramQuotaMB": "200"})[0] == 200
    assert server.call(lambda: orders.memory.quota) == 200 * MiB
    doc = json.loads(call("GET", "/pools/default/buckets/orders")[1])
    assert doc["quota"]["rawRAM"] == 200 * MiB and doc["basicStats"]["memUsed"] == server.call(
        lambda: orders.memory.used)
    text = call("GET", "/metrics")[1].decode()
    assert f'kv_ep_max_size_bytes{{bucket="orders"}} {200 * MiB}' in text
    assert 'kv_mem_used_bytes{bucket="orders"}' in text and 'kv_ep_tmp_oom_errors_total{bucket="orders"} 0' in text


def test_the_sdk_retries_through_a_full_bucket_and_reads_everything_back(spawn_server, tmp_path):
    """The official SDK treats ETMPFAIL as retryable: a load four times the quota completes, and
    every document reads back (most of them from disk). Persistence is paused at first, so the
    bucket is certainly full of dirty values (nothing evictable) and refuses; a watcher resumes
    persistence at the first refusal and the SDK's retries then go through. Without the pause a
    fast flusher can keep eviction ahead of the load and no write is ever refused."""
    from couchbase.options import UpsertOptions
    from couchbase.transcoder import RawBinaryTranscoder

    from .test_sdk import connect
    proc = spawn_server("--data-dir", str(tmp_path / "data"), "--vbuckets", "16", "--memory-quota", "8m",
                        "--mgmt-port", "0")
    admin = RawClient(proc.port)
    admin.login()
    assert admin.call(Opcode.STOP_PERSISTENCE).status == Status.SUCCESS
    resumed = threading.Event()

    def resume_at_first_refusal():
        with RawClient(proc.port) as watcher:
            watcher.login()
            while int(watcher.stats()["ep_tmp_oom_errors"]) == 0:
                time.sleep(0.005)
            assert watcher.call(Opcode.START_PERSISTENCE).status == Status.SUCCESS
            resumed.set()

    watcher = threading.Thread(target=resume_at_first_refusal, daemon=True)
    watcher.start()
    cluster = connect(proc.port)
    try:
        coll = cluster.bucket("default").default_collection()
        raw = UpsertOptions(transcoder=RawBinaryTranscoder())
        for i in range(8000):
            coll.upsert(f"sdk{i}", VALUE[:-4] + b"%04d" % (i % 10_000), raw)
        assert resumed.is_set()
        from couchbase.options import GetOptions
        for i in range(0, 8000, 41):
            got = coll.get(f"sdk{i}", GetOptions(transcoder=RawBinaryTranscoder()))
            assert got.value == VALUE[:-4] + b"%04d" % (i % 10_000)
    finally:
        cluster.close()
        admin.close()
    with RawClient(proc.port) as c:
        c.login()
        stats = c.stats()
        assert int(stats["ep_tmp_oom_errors"]) > 0 and int(stats["ep_bg_fetched"]) > 0
        assert int(stats["mem_used"]) <= 8 * MiB


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads RssAnon from /proc")
def test_resident_memory_stays_within_the_quota_plus_a_stated_overhead(spawn_server, tmp_path):
    """50k documents of 4 KB (200 MB of values) into a bucket of 32 MiB: the server's anonymous
    resident memory grows by at most the quota plus SQLite's writer cache (64 MiB) plus 64 MiB for
    the allocator and the interpreter - generous on purpose, so a busy machine cannot fail it.
    Without the quota it grows by more than the values (tested here by the values' size alone)."""
    proc = spawn_server("--data-dir", str(tmp_path / "data"), "--vbuckets", "64", "--memory-quota", "32m",
                        "--mgmt-port", "0")
    base = rss_anon(proc.proc.pid)
    with RawClient(proc.port) as c:
        c.login()
        window = []
        for i in range(50_000):
            key = b"rss%06d" % i
            window.append((key, request(Opcode.SET_Q, key=key, extras=bytes(8), value=VALUE,
                                        vbucket=c.vbucket_of(key), opaque=i)))
            if len(window) == 64:
                _send_retrying(c, window)
                window = []
        _send_retrying(c, window)
        stats = c.stats()
    grown = rss_anon(proc.proc.pid) - base
    assert int(stats["curr_items"]) == 50_000 and int(stats["mem_used"]) <= 32 * MiB
    assert grown <= 32 * MiB + 64 * MiB + 64 * MiB, grown
    assert grown < 50_000 * len(VALUE)  # what the values alone would take, resident


def _send_retrying(c: RawClient, window: list[tuple[bytes, bytes]]) -> None:
    """Pipelined quiet SETs; the refused ones (ETMPFAIL replies) are sent again after a pause."""
    while window:
        c.send(b"".join(frame for _, frame in window) + request(Opcode.NOOP, opaque=0xFFFFFFFF))
        refused = set()
        while True:
            reply = c.recv()
            if reply.opaque == 0xFFFFFFFF:
                break
            assert reply.status == Status.ETMPFAIL, reply
            refused.add(reply.opaque)
        window = [(k, f) for k, f in window if int.from_bytes(f[12:16], "big") in refused]
        if window:
            time.sleep(0.02)


def test_batches_that_writers_wait_for_are_written_at_the_servers_priority(make_server):
    """The flusher thread is niced below the server (flusher_nice): beside a write storm the loop
    keeps the CPU. Once writes are refused for memory, only the flusher can make room, so the
    batches then go to a thread at the server's own priority; without pressure they stay niced."""
    server = make_server(memory_quota=16 * MiB, flusher_nice=5)
    flusher = engine(server).flusher
    writers: list[tuple[str, int]] = []
    write = flusher.write

    def recording_write(batch):
        writers.append((threading.current_thread().name, os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
        write(batch)

    server.call(setattr, flusher, "write", recording_write)
    own = os.getpriority(os.PRIO_PROCESS, 0)
    with server.login() as c:
        assert c.set(b"calm", VALUE).status == Status.SUCCESS
        wait_for(lambda: server.call(lambda: engine(server).vbucket(engine(server).vbucket_for_key(b"calm"))
                                     .persisted_seqno) > 0, what="the first write persisted")
        assert writers and writers[-1][0].startswith("dcpflow-flusher_")
        if os.name == "posix" and writers[-1][1] == own:
            pytest.skip("this platform does not nice a thread apart from its process")
        assert c.call(Opcode.STOP_PERSISTENCE).status == Status.SUCCESS
        i = 0
        while c.set(b"doc%05d" % i, VALUE).status == Status.SUCCESS:
            i += 1
            assert i < 8000, "a bucket of dirty values over its quota accepted every write"
        seen = len(writers)
        assert c.call(Opcode.START_PERSISTENCE).status == Status.SUCCESS
        set_retrying(c, b"doc%05d" % i, VALUE)
        wait_for(lambda: len(writers) > seen, what="a flush batch after the refusal")
    assert writers[seen][0].startswith("dcpflow-flusher-urgent") and writers[seen][1] == own, writers[seen:]
