"""XDCR of named collections: every document reaches the target collection of its name, whatever
the order in which collections appear on either side, and an idle replication has nothing left.

goxdcr is the reference for a collection the target lacks: it records a broken mapping and, once
the target has the collection, backfills it
(https://github.com/couchbase/goxdcr/blob/master/parts/router.go,
https://github.com/couchbase/goxdcr/blob/master/backfill_manager/backfill_manager.go); it never
moves its checkpoint past a document it could not route and forgets it."""

import asyncio
import json
import urllib.request

from dcpflow.client import DcpClient
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.keys import make_key
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from dcpflow.replication.xdcr import Settings
from dcpflow.replication.xdcr.namespaces import CollectionMapping
from tests.server.client import RawClient

from .test_xdcr import _collection_view, _make_collections, two, url  # noqa: F401 (two: a fixture)
from .xdcr_helpers import InProcess, XdcrProcess, wait_for


def _write(srv, cid: int, keys, value: bytes = b'{"v":1}') -> None:
    c = RawClient(srv.port)
    with c.login(features=(Feature.XERROR, Feature.JSON, Feature.COLLECTIONS)):
        for key in keys:
            reply = c.call(Opcode.SET, key=make_key(key, cid), extras=b"\0" * 8, value=value,
                           vbucket=c.vbucket_of(key))
            assert reply.status == Status.SUCCESS, reply.status


def _items(srv, scope: str, collection: str) -> int:
    """Live documents of a collection (the engine's `stats collections`)."""
    engine = srv.server.buckets["default"].engine

    def count():
        m = engine.manifest
        s, c = next(s for s in m.scopes if s.name == scope), m.collection(scope, collection)
        return engine.collection_stats().get(f"0x{s.uid:x}:0x{c.uid:x}:items", 0)

    return srv.call(count)


def test_concurrent_first_batches_both_get_the_target_id(two):  # noqa: F811
    """Two batches in flight at start-up ask for the same new collection together: both must get
    the target's id from one manifest read (the second used to see only `_default` and skip)."""
    a, b = two
    src = _make_collections(a, "shop.orders")
    dst = _make_collections(b, "shop.padding", "shop.orders")  # the target's id differs
    cid = src["shop.orders"]

    async def main():
        source = await DcpClient.connect(url(a), "Administrator", "password")
        target = await DcpClient.connect(url(b), "Administrator", "password")
        try:
            mapping = CollectionMapping(source, target)
            answers = await asyncio.gather(*(mapping.target_ids({cid}) for _ in range(3)))
            return answers, getattr(mapping, "reads", None)
        finally:
            await source.close()
            await target.close()

    answers, reads = asyncio.run(main())
    assert answers == [{cid: dst["shop.orders"]}] * 3
    assert reads == 1  # shared, not one read per caller


def test_collections_made_before_and_during_replication_all_arrive(two, tmp_path):  # noqa: F811
    """`dcpflow xdcr` with small batches (many in flight) over collections made on both sides before
    it starts, one made on both sides while it runs, and one made on the target only after the
    source's documents of it were skipped: every document reaches the target."""
    a, b = two
    _make_collections(b, "app.padding")  # the ids differ between the buckets
    before = ("app.c1", "app.c2")
    src = _make_collections(a, *before)
    _make_collections(b, *before)
    keys = {p: [f"{p}-{i}".encode() for i in range(300)] for p in before}
    for p in before:
        _write(a, src[p], keys[p])
    p = XdcrProcess(url(a), url(b), tmp_path / "state", "--batch-size", "8", "--checkpoint-interval", "0.2",
                    "--conflict-resolution", "seqno")
    try:
        more = {q: [f"{q}-more-{i}".encode() for i in range(100)] for q in before}
        for q in before:
            _write(a, src[q], more[q])
            keys[q] += more[q]
        src.update(_make_collections(a, "app.during"))
        _make_collections(b, "app.during")
        keys["app.during"] = [b"during-%d" % i for i in range(100)]
        _write(a, src["app.during"], keys["app.during"])
        src.update(_make_collections(a, "app.late"))  # the target gets it only later
        keys["app.late"] = [b"late-%d" % i for i in range(50)]
        _write(a, src["app.late"], keys["app.late"])
        wait_for(lambda: (p.status() or {}).get("stats", {}).get("docs_other_collections", 0) >= 50,
                 what="the late collection's documents to be skipped")
        _make_collections(b, "app.late")

        def arrived():
            return all(_items(b, *q.split(".")) == len(keys[q]) for q in keys)

        wait_for(arrived, what="every document on the target")
        stats = wait_for(lambda: (lambda s: s if s.get("docs_backfilled", 0) >= 50 else None)(
            (p.status() or {}).get("stats", {})), what="the backfill in status.json")
    finally:
        p.terminate()
        p.cleanup()
    dst = {q: b.call(lambda q=q: b.server.buckets["default"].engine.manifest.collection(*q.split(".")).uid)
           for q in keys}
    for q in keys:  # the documents themselves, with their metadata
        assert _collection_view(a, src[q], keys[q]) == _collection_view(b, dst[q], keys[q]), q
    assert stats["docs_failed"] == 0


def test_skipped_documents_are_sent_after_a_restart_once_the_target_has_the_collection(two, tmp_path):  # noqa: F811
    """The broken mapping is kept in the checkpoint: a replicator stopped while the target lacked
    the collection sends its documents in a later run, though its positions are past them."""
    a, b = two
    src = _make_collections(a, "app.late")
    keys = [b"k%d" % i for i in range(40)]
    _write(a, src["app.late"], keys)
    settings = Settings(checkpoint_interval=0.2, conflict_resolution="seqno")
    rep = InProcess(url(a), url(b), tmp_path / "state", settings)
    try:
        wait_for(lambda: rep.stats["docs_other_collections"] == 40 and rep.stats["checkpoints"] >= 2,
                 what="the documents to be skipped and checkpointed")
    finally:
        rep.stop()
    saved = json.loads((tmp_path / "state" / "checkpoints.json").read_text())
    assert saved["generations"][0]["broken"] == [["app", "late"]]
    dst = _make_collections(b, "app.late")
    rep = InProcess(url(a), url(b), tmp_path / "state", settings)
    try:
        wait_for(lambda: _items(b, "app", "late") == 40, what="the skipped documents to arrive")
        wait_for(lambda: rep.stats["checkpoints"] >= 2, what="a checkpoint after the backfill")
    finally:
        stats = rep.stop()
    assert stats["docs_backfilled"] == 40 and stats["docs_received"] == 0  # nothing new: only the backfill
    assert _collection_view(a, src["app.late"], keys) == _collection_view(b, dst["app.late"], keys)
    saved = json.loads((tmp_path / "state" / "checkpoints.json").read_text())
    assert "broken" not in saved["generations"][0]


def test_an_idle_replication_of_named_collections_has_no_changes_left(two, tmp_path):  # noqa: F811
    """Collection system events take seqnos and carry nothing to write: once everything was
    replicated, changes_left is 0 in status.json and in /metrics (xdcr_changes_left_total)."""
    a, b = two
    paths = ("app.c1", "app.c2", "other.c3")
    src = _make_collections(a, *paths)
    _make_collections(b, *paths)
    for path in paths:
        _write(a, src[path], [f"{path}-{i}".encode() for i in range(5)])
    _write(a, 0, [b"plain"])
    p = XdcrProcess(url(a), url(b), tmp_path / "state", "--checkpoint-interval", "0.2", "--metrics-port", "0",
                    "--conflict-resolution", "seqno")
    try:
        wait_for(lambda: (p.status() or {}).get("stats", {}).get("docs_written") == 16, what="all 16 written")

        def left():
            with urllib.request.urlopen(p.metrics_url, timeout=30) as r:
                text = r.read().decode()
            metric = next(line for line in text.splitlines() if line.startswith("xdcr_changes_left_total{"))
            status = p.status()["stats"]["changes_left"]
            return (status, float(metric.rsplit(" ", 1)[1])) == (0, 0) or None

        wait_for(left, timeout=60, what="changes_left 0 in status.json and /metrics")
    finally:
        p.terminate()
        p.cleanup()


def _rest_collection(proc, scope: str, collection: str) -> int:
    """Make scope.collection on a `dcpflow server` process through its REST API; its id."""
    from dcpflow.client import rest_client
    mgmt = f"http://127.0.0.1:{proc.mgmt_port}"
    base = "/pools/default/buckets/default/scopes"
    rest_client.call(mgmt, "Administrator", "password", "POST", base, {"name": scope})
    rest_client.call(mgmt, "Administrator", "password", "POST", f"{base}/{scope}/collections", {"name": collection})
    manifest = rest_client.call(mgmt, "Administrator", "password", "GET", base)
    s = next(s for s in manifest["scopes"] if s["name"] == scope)
    return int(next(c for c in s["collections"] if c["name"] == collection)["uid"], 16)


def test_a_target_away_when_a_new_collection_shows_up_is_waited_for(make_server, spawn_server, tmp_path):
    """The target's manifest cannot be read while it is down: the batch waits for it (as writes
    to a target that is down do) instead of ending the replicator, and goes on once it is back."""
    from dcpflow.replication.commands import free_ports
    a = make_server(data_dir=tmp_path / "a")
    (pb,) = free_ports(1)
    target_args = ("--port", str(pb), "--data-dir", str(tmp_path / "b"), "--vbuckets", "64")
    b = spawn_server(*target_args)
    src = _make_collections(a, "app.x")
    dst = _rest_collection(b, "app", "x")
    rep = InProcess(url(a), f"couchbase://127.0.0.1:{pb}/default", tmp_path / "state",
                    Settings(checkpoint_interval=0.2, conflict_resolution="seqno"))
    try:
        wait_for(lambda: rep.stats["checkpoints"] >= 1, what="a first checkpoint")
        b.terminate()
        keys = [b"x%d" % i for i in range(20)]
        _write(a, src["app.x"], keys)
        wait_for(lambda: rep.stats["docs_received"], what="a document read, its batch waiting for the manifest")
        b = spawn_server(*target_args)
        wait_for(lambda: len(_collection_view(b, dst, keys)) == 20, what="the documents on the target")
    finally:
        stats = rep.stop()  # raises what ended the replicator, if anything did
    assert stats["docs_other_collections"] == 0 and stats["docs_written"] == 20
