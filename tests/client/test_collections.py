"""The client on named collections, over real sockets with dcpflow's server: filters by scope and
by collection name, typed system events, the manifest uid in offsets and on resume, a quiet
filtered collection kept current by SEQNO_ADVANCED (no rollback to zero after a purge), change
streams (every version, History / May Duplicate Keys), and a connection without collections."""

import asyncio
import time

import pytest

from dcpflow.client import DcpClient, FilterError, MemoryStore, Offset, Rollback, StreamEnd, SystemEvent
from dcpflow.client import connection as connection_mod
from dcpflow.client.manifest import Filter, Manifest
from dcpflow.protocol.dcp import SnapshotFlag
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.keys import encode_leb128, vbucket_for_key
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .conftest import NUM_VBUCKETS, PASSWORD, USER, engine_vbucket, flush_to_disk, keys_in, run, url

FEATURES = (Feature.XERROR, Feature.JSON, Feature.COLLECTIONS)


def engine(st):
    return st.server.buckets["default"].engine


def change(st, fn) -> int:
    """Apply a manifest change on the server's thread; the new uid."""
    return st.call(lambda: engine(st).change_manifest(fn).uid)


def cid_of(st, scope: str, name: str) -> int:
    return st.call(lambda: engine(st).manifest.collection(scope, name).uid)


def put(w, cid: int, key: bytes, value: bytes = b'{"v":1}') -> None:
    vb = vbucket_for_key(key, NUM_VBUCKETS)
    r = w.call(Opcode.SET, key=encode_leb128(cid) + key, value=value, extras=b"\0" * 8, vbucket=vb, datatype=1)
    assert r.status == Status.SUCCESS, r


def shop(st, history: bool = False) -> dict[str, int]:
    change(st, lambda m: m.add_scope("shop"))
    change(st, lambda m: m.add_collection("shop", "users"))
    change(st, lambda m: m.add_collection("shop", "orders", history=history))
    change(st, lambda m: m.add_scope("other"))
    change(st, lambda m: m.add_collection("other", "logs"))
    return {n: cid_of(st, *n.split(".")) for n in ("shop.users", "shop.orders", "other.logs")}


def fill(st, ids: dict[str, int], n: int = 5) -> dict[str, set]:
    written: dict[str, set] = {name: set() for name in ids}
    with st.login(features=FEATURES) as w:
        for name, cid in ids.items():
            for i in range(n):
                key = f"{name}-{i}".encode()
                put(w, cid, key)
                written[name].add(key)
        put(w, 0, b"plain")
    return written


async def read_all(c, **kw):
    return [e async for e in c.events(end="now", **kw)]


def docs_by_collection(events, names) -> dict[str, set]:
    out: dict[str, set] = {}
    for e in events:
        if e.event == "mutation":
            out.setdefault(".".join(names.of(e.collection_id)), set()).add(e.key)
    return out


def test_filters_by_collection_and_scope_name_with_typed_system_events(server):
    ids = shop(server)
    written = fill(server, ids)

    async def go():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
            orders = await read_all(c, collections=["shop.orders"])
            two = await read_all(c, collections="shop.orders,other.logs")
            scope = await read_all(c, scope="shop")
            bare = await read_all(c, scope="shop", collections=["users"])
            with pytest.raises(FilterError, match="shop.nope"):
                await read_all(c, collections=["shop.nope", "shop.users"])
            with pytest.raises(FilterError, match="nowhere"):
                await read_all(c, scope="nowhere")
            return c.names, orders, two, scope, bare
    names, orders, two, scope, bare = run(go())
    assert docs_by_collection(orders, names) == {"shop.orders": written["shop.orders"]}
    assert docs_by_collection(two, names) == {"shop.orders": written["shop.orders"],
                                              "other.logs": written["other.logs"]}
    assert docs_by_collection(scope, names) == {"shop.orders": written["shop.orders"],
                                                "shop.users": written["shop.users"]}
    assert docs_by_collection(bare, names) == {"shop.users": written["shop.users"]}
    # system events, typed: the orders stream sees its own create event in every vbucket
    created = [e for e in orders if isinstance(e, SystemEvent)]
    assert len(created) == NUM_VBUCKETS
    assert {(e.kind, e.scope, e.collection, e.collection_id, e.manifest_uid) for e in created} == {
        ("collection_created", "shop", "orders", ids["shop.orders"], 3)}
    kinds = {(e.kind, e.scope, e.collection) for e in scope if isinstance(e, SystemEvent)}
    assert kinds == {("scope_created", "shop", ""), ("collection_created", "shop", "users"),
                     ("collection_created", "shop", "orders")}


def test_dropping_the_collections_of_a_read_by_ids_ends_each_vbucket_filter_empty(server):
    """A read by collection ids (a planner's) ends a vbucket whose ids are all dropped; a read by
    names follows them instead (test_follow_names.py)."""
    ids = shop(server)
    fill(server, ids, n=3)

    async def go():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
            starts = {vb: Offset() for vb in range(NUM_VBUCKETS)}
            reader = c.batches(starts, collection_ids=[ids["shop.users"]], flush_interval=0.05)
            rows, dropped = [], False
            # unbounded: the read ends because the filter empties in every vbucket
            async for batch in reader:
                rows += batch.to_pylist()
                if not dropped and len(rows) == 3:
                    dropped = True
                    await asyncio.to_thread(change, server, lambda m: m.drop_collection("shop", "users"))
            return rows, reader.system_events, reader.stats
    rows, events, stats = run(go())
    assert len(rows) == 3
    drops = [e for e in events if e.kind == "collection_dropped"]
    assert len(drops) == NUM_VBUCKETS
    assert {(e.scope, e.collection, e.collection_id) for e in drops} == {("shop", "users", ids["shop.users"])}
    assert stats["stream_end_filter_empty"] == NUM_VBUCKETS


def test_the_manifest_uid_is_kept_in_offsets_and_a_resume_is_not_sent_seen_events(server):
    ids = shop(server)
    fill(server, ids, n=2)

    async def go():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
            store = MemoryStore()
            first = [e async for e in c.events(end="now", state=store, scope="shop")]
            saved = store.load()
            uid = await asyncio.to_thread(change, server,
                                                          lambda m: m.add_collection("shop", "carts"))
            with server.login(features=FEATURES) as w:
                put(w, cid_of(server, "shop", "carts"), b"cart-1")
            second = [e async for e in c.events(start="saved", end="now", state=store, scope="shop")]
            return first, saved, uid, second, store.load()
    first, saved, uid, second, after = run(go())
    # every vbucket saw the shop scope's events (uids 1..3), and its offset says so
    assert {o.manifest_uid for o in saved.offsets.values()} == {3}
    assert all(len(o.to_json()) == 5 for o in saved.offsets.values())
    events = [e for e in second if isinstance(e, SystemEvent)]
    assert {(e.kind, e.collection, e.manifest_uid) for e in events} == {("collection_created", "carts", uid)}
    assert len(events) == NUM_VBUCKETS  # one per vbucket: none of the events seen before came again
    assert [e.key for e in second if e.event == "mutation"] == [b"cart-1"]
    assert {o.manifest_uid for o in after.offsets.values()} == {uid}
    assert len([e for e in first if isinstance(e, SystemEvent)]) == 3 * NUM_VBUCKETS


def test_a_quiet_filtered_collection_follows_the_vbucket_and_is_not_rolled_back_after_a_purge(make_server):
    server = make_server(purge_interval=0.0, compaction_interval=0.1)
    change(server, lambda m: m.add_scope("app"))
    change(server, lambda m: m.add_collection("app", "quiet"))
    change(server, lambda m: m.add_collection("app", "busy"))
    busy = cid_of(server, "app", "busy")
    vb = 0
    keys = keys_in(vb, 8, prefix="b")

    async def go():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
            store = MemoryStore()
            [e async for e in c.events([vb], end="now", state=store, collections=["app.quiet"])]
            with server.login(features=FEATURES) as w:
                for k in keys:
                    put(w, busy, k)
                for k in keys[:4]:
                    r = w.call(Opcode.DELETE, key=encode_leb128(busy) + k, vbucket=vb)
                    assert r.status == Status.SUCCESS
            high = engine_vbucket(server, vb, "high_seqno")
            # the quiet stream reads nothing but SEQNO_ADVANCED, and its offset reaches the high seqno
            quiet = [e async for e in c.events([vb], start="saved", end="now", state=store,
                                               collections=["app.quiet"])]
            mid = store.load().offsets[vb]
            deadline = time.monotonic() + 60
            while engine_vbucket(server, vb, "purge_seqno") < high:
                assert time.monotonic() < deadline, "compaction did not purge the tombstones"
                await asyncio.sleep(0.05)
            flush_to_disk(server, vb)
            again = [e async for e in c.events([vb], start="saved", end="now", state=store,
                                               collections=["app.quiet"])]
            return high, quiet, mid, again
    high, quiet, mid, again = run(go())
    assert not [e for e in quiet if e.event in ("mutation", "deletion")]
    assert mid.seqno == high and mid.is_boundary
    assert not [e for e in again if isinstance(e, Rollback)]


def test_change_streams_send_every_version_of_a_history_collection(server):
    ids = shop(server, history=True)
    key = b"order-1"
    with server.login(features=FEATURES) as w:
        for i in range(4):
            put(w, ids["shop.orders"], key, b'{"v":%d}' % i)
            put(w, ids["shop.users"], b"user-1", b'{"v":%d}' % i)

    async def go():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
            vb = vbucket_for_key(key, NUM_VBUCKETS)
            hist = [e async for e in c.events([vb], end="now", history=True, collections=["shop.orders"])]
            plain = [e async for e in c.events([vb], end="now", collections=["shop.orders"])]
            uvb = vbucket_for_key(b"user-1", NUM_VBUCKETS)
            users = [e async for e in c.events([uvb], end="now", history=True, collections=["shop.users"])]
            return hist, plain, users
    hist, plain, users = run(go())
    versions = [e for e in hist if e.event == "mutation"]
    assert [e.value for e in versions] == [b'{"v":%d}' % i for i in range(4)]
    assert all(e.history and e.may_duplicate_keys for e in versions)
    assert all(e.snapshot_flags & SnapshotFlag.HISTORY for e in versions)
    assert [e.value for e in plain if e.event == "mutation"] == [b'{"v":3}']  # no change_streams: de-duplicated
    assert [e.value for e in users if e.event == "mutation"] == [b'{"v":3}']  # users keeps no history
    assert not any(e.history for e in users if e.event == "mutation")


def test_batches_filter_by_name_and_keep_the_system_events(server):
    ids = shop(server)
    written = fill(server, ids, n=4)

    async def go():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
            starts = {vb: Offset() for vb in range(NUM_VBUCKETS)}
            reader = c.batches(starts, end="now", collections=["shop.users", "other.logs"])
            rows = [r for b in [b async for b in reader] for r in b.to_pylist()]
            return rows, reader.system_events, reader.offsets
    rows, events, offsets = run(go())
    got = {(r["collection_id"], r["key"]) for r in rows}
    assert got == {(ids[n], k) for n in ("shop.users", "other.logs") for k in written[n]}
    assert {(e.kind, e.collection) for e in events} == {("collection_created", "users"),
                                                        ("collection_created", "logs")}
    assert {o.manifest_uid for o in offsets.values()} == {5}


def test_batches_filter_by_collection_ids_and_a_name_made_again_is_not_followed(server):
    """Ids resolved earlier (the Spark planner's): the read streams those collections; one dropped
    since is simply not read, and a collection made again under its name is a new id, not read."""
    ids = shop(server)
    written = fill(server, ids, n=3)

    async def go(collection_ids):
        async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
            starts = {vb: Offset() for vb in range(NUM_VBUCKETS)}
            reader = c.batches(starts, end="now", collection_ids=collection_ids)
            return {(r["collection_id"], r["key"]) for b in [b async for b in reader] for r in b.to_pylist()}
    assert run(go([ids["shop.users"], ids["other.logs"]])) == {
        (ids[n], k) for n in ("shop.users", "other.logs") for k in written[n]}
    change(server, lambda m: m.drop_collection("shop", "users"))
    change(server, lambda m: m.add_collection("shop", "users"))
    again = fill(server, {"shop.users": cid_of(server, "shop", "users")}, n=2)
    assert run(go([ids["shop.users"], ids["other.logs"]])) == {(ids["other.logs"], k) for k in written["other.logs"]}
    assert run(go([ids["shop.users"]])) == set()  # every id gone: nothing to read, and the read ends
    assert again and run(go([cid_of(server, "shop", "users")])) == {
        (cid_of(server, "shop", "users"), k) for k in again["shop.users"]}
    with pytest.raises(FilterError, match="ids go alone"):
        Filter.build("shop", None, [8])


def test_without_collections_the_client_reads_the_default_collection_as_before(server, monkeypatch):
    ids = shop(server)
    fill(server, ids, n=2)
    monkeypatch.setattr(connection_mod, "FEATURES", tuple(f for f in connection_mod.FEATURES
                                                          if f != Feature.COLLECTIONS))

    async def go():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
            manifest = await c.manifest()
            plain = await read_all(c)
            with pytest.raises(Exception, match="does not support collections"):
                await read_all(c, collections=["shop.users"])
            return manifest, plain
    manifest, plain = run(go())
    assert manifest.uid == 0 and list(manifest.collections) == [0]
    assert [(e.collection_id, e.key) for e in plain if e.event == "mutation"] == [(0, b"plain")]
    assert not [e for e in plain if isinstance(e, SystemEvent)]
    assert all(e.offset.manifest_uid is None for e in plain if isinstance(e, StreamEnd))


def test_filter_names_and_manifest_json():
    assert Filter.build("shop", None) == Filter("shop", ())
    assert Filter.build(None, "shop.a, b") == Filter(None, (("shop", "a"), ("_default", "b")))
    assert Filter.build("shop", ["a"]) == Filter(None, (("shop", "a"),))
    for bad in (["a.b.c"], [".a"], ["shop."]):
        with pytest.raises(FilterError):
            Filter.build(None, bad)
    with pytest.raises(FilterError, match="not in scope"):
        Filter.build("shop", ["other.a"])
    m = Manifest.from_json({"uid": "1f", "scopes": [{"name": "_default", "uid": "0", "collections": [
        {"name": "_default", "uid": "0"}]}, {"name": "s", "uid": "8", "collections": [
            {"name": "c", "uid": "a", "maxTTL": 5, "history": True}]}]})
    assert m.uid == 0x1f and m.collection("s", "c").cid == 10 and m.collection("s", "c").history
    r = m.resolve(Filter.build(None, ["s.c", "s.gone"]))
    assert r.cids == {10} and r.missing == ("s.gone",) and r.value() == {"collections": ["a"]}
    assert m.resolve(Filter("s")).value() == {"scope": "8"}
    with pytest.raises(ValueError, match="unusable"):
        Manifest.from_json({"uid": "x"})
