"""KV range scans of documents that are not in memory (server/range_scan.py, engine/range_scan.py):
after every document was evicted - its value (value eviction) or the whole entry (full
eviction) - a scan returns exactly the live documents with their values and metadata, through the
project's codec and the official SDK's collection.scan; a key-only scan reads no value; a
document changed or deleted between the create and the continue is sent as the module docstring
says; `seqno_exists` finds a version that is only on disk; nothing scanned comes back into memory."""

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dcpflow.engine.item import NOT_RESIDENT
from dcpflow.protocol import range_scan as rs
from dcpflow.protocol.status import Status
from tests.resources import wait_for

from .conftest import NUM_VBUCKETS, keys_in
from .test_full_eviction import evict_everything
from .test_range_scan import continue_all, continue_to_end, create, login, scan_all, struct_token

REPO = Path(__file__).resolve().parents[2]
POLICIES = ("valueOnly", "fullEviction")
ALL = rs.ScanConfig(start=b"\x00", end=b"\xff")
VB = 9


def loaded(make_server, policy: str, n: int = 300):
    """A server of `policy` with n JSON documents (flags 3), every one evicted: (server, engine,
    {key: (value, cas, seqno)})."""
    server = make_server(eviction_policy=policy)
    engine = server.server.buckets["default"].engine
    docs = {}
    with login(server) as c:
        for i in range(n):
            key, value = f"doc{i:03}".encode(), json.dumps({"n": i, "pad": "x" * (i % 50)}).encode()
            reply = c.set(key, value, flags=3, datatype=1)
            assert reply.status == Status.SUCCESS
            docs[key] = (value, reply.cas, struct_token(reply)[1])
    assert evict_everything(server, engine) == n
    return server, engine, docs


def resident(server, engine) -> int:
    """Entries in memory with their value (none after evict_everything, under either policy)."""
    return server.call(lambda: sum(1 for vb in engine.vbuckets.values() for item in vb.ht.values()
                                   if item.value is not NOT_RESIDENT))


def scan_every_vbucket(c, config: rs.ScanConfig, **limits) -> list:
    return [entry for vb in range(NUM_VBUCKETS) for entry in scan_all(c, config, vb, empty_ok=True, **limits)]


@pytest.mark.parametrize("policy", POLICIES)
def test_a_scan_returns_every_evicted_document_with_its_value(make_server, policy):
    server, engine, docs = loaded(make_server, policy)
    with login(server) as c:
        for limits in ({}, {"item_limit": 7}):
            got = scan_every_vbucket(c, ALL, **limits)
            assert {d.key: (d.value, d.cas, d.seqno) for d in got} == docs and len(got) == len(docs)
            assert all(d.flags == 3 and d.datatype == 1 for d in got)
        reply = create(c, ALL, VB)
        scan_id = rs.RangeScanCreateResponse.from_frame(reply).scan_id
        got, frames = continue_all(c, scan_id, VB, byte_limit=1)  # at least one document, and only one
        assert len(got) == 1 and frames[-1].status == Status.RANGE_SCAN_MORE and got[0].value == docs[got[0].key][0]
        sampled = scan_every_vbucket(c, rs.ScanConfig(samples=1000, seed=5))
        assert {d.key: d.value for d in sampled} == {k: v[0] for k, v in docs.items()}
    assert resident(server, engine) == 0  # a scan pages nothing back in
    if policy == "fullEviction":
        assert server.call(lambda: sum(len(vb.ht) for vb in engine.vbuckets.values())) == 0


@pytest.mark.parametrize("policy", POLICIES)
def test_a_key_only_scan_reads_no_value(make_server, policy):
    server, engine, docs = loaded(make_server, policy, n=120)
    fetcher = server.server.buckets["default"].bg_fetcher
    before = (fetcher.batches, fetcher.keys_read, fetcher.versions_read)
    with login(server) as c:
        assert sorted(scan_every_vbucket(c, ALL._replace(key_only=True))) == sorted(docs)
        assert sorted(scan_every_vbucket(c, rs.ScanConfig(key_only=True, samples=500, seed=1))) == sorted(docs)
    assert (fetcher.batches, fetcher.keys_read, fetcher.versions_read) == before
    with login(server) as c:
        scan_every_vbucket(c, ALL)
    assert fetcher.versions_read == len(docs)  # (what the counters would have shown)


def _changed_between_create_and_continue(server, engine, trim_history: bool):
    """A scan of vbucket VB's evicted documents; after its first page, one document of the rest is
    updated and one deleted, and persisted (then with `trim_history`, compaction keeps no older
    version). Returns (documents as they were, the updated key, its new version's seqno, the deleted
    key, what the scan returned)."""
    keys = sorted(keys_in(VB, 10, prefix="chg"))
    with login(server) as c:
        before = {}
        for k in keys:
            reply = c.set(k, b'{"v": "%s"}' % k, vbucket=VB, datatype=1)
            before[k] = (b'{"v": "%s"}' % k, reply.cas, struct_token(reply)[1])
        evict_everything(server, engine)
        reply = create(c, ALL, VB)
        assert reply.status == Status.SUCCESS, reply
        scan_id = rs.RangeScanCreateResponse.from_frame(reply).scan_id
        got, frames = continue_all(c, scan_id, VB, item_limit=2)
        assert frames[-1].status == Status.RANGE_SCAN_MORE, frames[-1]
        updated, deleted = keys[5], keys[7]
        new_seqno = struct_token(c.set(updated, b'{"v": "new"}', vbucket=VB, datatype=1))[1]
        assert c.delete(deleted, vbucket=VB).status == Status.SUCCESS
        wait_for(lambda: server.call(lambda: engine.stats()["ep_queue_size"] == 0
                                     and engine.flusher.in_flight is None), what="the flusher to catch up")
        if trim_history:
            server.call(lambda: engine.compact(VB, keep_history=0.0))
        got.extend(continue_to_end(c, scan_id, VB, item_limit=3))
        return before, updated, new_seqno, deleted, {d.key: (d.value, d.cas, d.seqno) for d in got}


@pytest.mark.parametrize("policy", POLICIES)
def test_a_document_changed_after_the_create_is_sent_as_the_snapshot_had_it(make_server, policy):
    """The store still has the snapshot's versions (the latest, or history's copy of a superseded
    one): the scan returns exactly the documents as they were at the create."""
    server = make_server(eviction_policy=policy)
    engine = server.server.buckets["default"].engine
    before, _, _, _, got = _changed_between_create_and_continue(server, engine, trim_history=False)
    assert got == before


@pytest.mark.parametrize("policy", POLICIES)
def test_once_the_snapshot_version_is_gone_an_update_is_sent_new_and_a_delete_not_at_all(make_server, policy):
    """Compaction dropped the superseded versions: the updated document comes with its new version
    (value and metadata agree), the deleted one is left out - never an empty value."""
    server = make_server(eviction_policy=policy)
    engine = server.server.buckets["default"].engine
    before, updated, new_seqno, deleted, got = _changed_between_create_and_continue(server, engine, True)
    assert set(got) == set(before) - {deleted}
    assert got[updated][0] == b'{"v": "new"}' and got[updated][2] == new_seqno
    assert {k: v for k, v in got.items() if k != updated} == {k: v for k, v in before.items()
                                                             if k not in (updated, deleted)}


def test_seqno_exists_finds_a_version_only_on_disk(make_server):
    server = make_server(eviction_policy="fullEviction")
    engine = server.server.buckets["default"].engine
    key = keys_in(VB, 1, prefix="se")[0]
    with login(server) as c:
        written = c.set(key, b"1", vbucket=VB)
        uuid, seqno = struct_token(written)
        evict_everything(server, engine)
        required = rs.SnapshotRequirements(uuid, seqno, timeout_ms=5000, seqno_exists=True)
        assert scan_all(c, ALL._replace(snapshot=required), VB) == [
            rs.ScanDocument(key, b"1", 0, 0, seqno, written.cas, 1)]
        c.set(key, b"2", vbucket=VB)  # memory's newer version supersedes it at once
        assert create(c, ALL._replace(snapshot=required), VB).status == Status.NOT_STORED


#: The official SDK's scans, in a process of their own: the SDK waits for a scan's start holding the
#: GIL, so a server on a thread of the test's process could not answer it.
SDK_SCANS = """
import json, sys
from tests.server.sdk import connect
from couchbase.kv_range_scan import PrefixScan, RangeScan, SamplingScan, ScanTerm
from couchbase.options import ScanOptions
cluster = connect(int(sys.argv[1]))
try:
    col = cluster.bucket("default").default_collection()
    docs = lambda scan: {r.id: r.content_as[dict] for r in col.scan(scan)}
    print(json.dumps({
        "all": docs(RangeScan()),
        "some": docs(RangeScan(ScanTerm("doc010"), ScanTerm("doc019"))),
        "prefix": docs(PrefixScan("doc1")),
        "sample": docs(SamplingScan(1000, seed=3)),
        "ids": sorted(r.id for r in col.scan(RangeScan(), ScanOptions(ids_only=True))),
    }))
finally:
    cluster.close()
"""


@pytest.mark.parametrize("policy", POLICIES)
def test_the_sdk_scans_evicted_documents(make_server, policy):
    server, engine, docs = loaded(make_server, policy, n=200)
    done = subprocess.run([sys.executable, "-c", SDK_SCANS, str(server.port)], capture_output=True, text=True,
                          timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    expected = {k.decode(): json.loads(v[0]) for k, v in docs.items()}
    assert got["all"] == expected and got["sample"] == expected and got["ids"] == sorted(expected)
    assert got["some"] == {f"doc{i:03}": expected[f"doc{i:03}"] for i in range(10, 20)}
    assert got["prefix"] == {k: v for k, v in expected.items() if k.startswith("doc1")}
    assert resident(server, engine) == 0


class HeldReads:
    """The bucket's store as its BgFetcher sees it, whose reads by version wait for `release`
    (`entered` is set once one is waiting): a continue held in the middle of its reads."""

    def __init__(self, store):
        self._store = store
        self.entered, self.release = threading.Event(), threading.Event()

    def read_versions(self, wanted):
        self.entered.set()
        assert self.release.wait(60), "the test never released the held read"
        return self._store.read_versions(wanted)

    def __getattr__(self, name):
        return getattr(self._store, name)


def test_a_continue_that_is_reading_holds_the_scan(make_server):
    """While a continue waits for its values, another continue of the scan answers EBUSY and a
    cancel ends the scan: the held continue then answers KEY_ENOENT (the scan is gone), and sends
    nothing of it."""
    server = make_server(eviction_policy="valueOnly")
    engine = server.server.buckets["default"].engine
    keys = sorted(keys_in(VB, 6, prefix="held"))
    with login(server) as c, login(server) as other:
        for k in keys:
            assert c.set(k, b"v" + k, vbucket=VB).status == Status.SUCCESS
        evict_everything(server, engine)
        fetcher = server.server.buckets["default"].bg_fetcher
        held = fetcher._store = HeldReads(fetcher._store)
        for cancel in (False, True):
            held.entered.clear()
            held.release.clear()
            scan_id = rs.RangeScanCreateResponse.from_frame(create(c, ALL, VB)).scan_id
            opaque = c.next_opaque()
            c.send(rs.RangeScanContinue(VB, scan_id, opaque=opaque, item_limit=2).encode())
            assert held.entered.wait(60)
            assert continue_all(other, scan_id, VB)[1][-1].status == Status.EBUSY
            if cancel:
                other.send(rs.RangeScanCancel(VB, scan_id, other.next_opaque()).encode())
                assert other.recv().status == Status.SUCCESS
            held.release.set()
            reply = c.recv()
            assert reply.opaque == opaque
            if cancel:
                assert reply.status == Status.KEY_ENOENT
            else:
                assert reply.status == Status.RANGE_SCAN_MORE
                page = rs.RangeScanContinueResponse.from_frame(reply).documents
                assert [(d.key, d.value) for d in page] == [(k, b"v" + k) for k in keys[:2]]
                assert [d.key for d in continue_to_end(c, scan_id)] == keys[2:]
