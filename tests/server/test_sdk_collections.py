"""The official Python SDK on named collections against a `dcpflow server` subprocess: the
collection manager (create, update, drop, get all scopes) over the management port, then
`bucket.scope(s).collection(c)` KV operations, a collection's maxTTL, and what the SDK meets when a
collection is dropped under it. A raw client checks the collections commands and the manifest uid
that UNKNOWN_COLLECTION / UNKNOWN_SCOPE carry."""

import json
import struct
import time
from datetime import timedelta

import pytest
from couchbase.exceptions import (
    CollectionAlreadyExistsException,
    CollectionNotFoundException,
    DocumentExistsException,
    DocumentNotFoundException,
    FeatureUnavailableException,
    ScopeAlreadyExistsException,
    ScopeNotFoundException,
    UnsupportedOperation,
)
from couchbase.management.collections import CreateCollectionSettings, UpdateCollectionSettings
from couchbase.options import GetOptions, UpsertOptions

from dcpflow.protocol import kv
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.keys import encode_leb128, vbucket_for_key
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .client import RawClient
from .mgmt.rest_client import Http


@pytest.fixture(scope="module")
def app(sdk_server, sdk_cluster):
    """Scope `app` with `orders` (maxTTL 60 s) and `events` (history), made by the SDK's manager in
    `default` once it is a magma bucket (history needs magma: test_storage_backends.py)."""
    migrated = Http(sdk_server.mgmt_port).post("/pools/default/buckets/default", {
        "storageBackend": "magma", "historyRetentionCollectionDefault": "false"})
    assert migrated.status == 200, migrated.text
    manager = sdk_cluster.bucket("default").collections()
    manager.create_scope("app")
    manager.create_collection("app", "orders", CreateCollectionSettings(max_expiry=timedelta(seconds=60)))
    manager.create_collection("app", "events", CreateCollectionSettings(history=True))
    return sdk_cluster.bucket("default").scope("app")


def raw(sdk_server) -> RawClient:
    """A raw client with HELLO Collections: keys carry their collection's LEB128 prefix."""
    c = RawClient(sdk_server.port)
    c.num_vbuckets = 64
    return c.login(features=(Feature.XERROR, Feature.JSON, Feature.MUTATION_SEQNO, Feature.COLLECTIONS))


def test_the_collection_manager_creates_lists_updates_and_refuses(sdk_cluster, app):
    manager = sdk_cluster.bucket("default").collections()
    scopes = {s.name: {c.name: (c.max_expiry, c.history) for c in s.collections} for s in manager.get_all_scopes()}
    assert scopes["_default"] == {"_default": (timedelta(0), False)}
    assert scopes["app"] == {"orders": (timedelta(seconds=60), False), "events": (timedelta(0), True)}
    with pytest.raises(ScopeAlreadyExistsException):
        manager.create_scope("app")
    with pytest.raises(CollectionAlreadyExistsException):
        manager.create_collection("app", "orders")
    with pytest.raises(ScopeNotFoundException):
        manager.create_collection("nowhere", "c")
    with pytest.raises(ScopeNotFoundException):
        manager.drop_scope("nowhere")
    with pytest.raises(CollectionNotFoundException):
        manager.drop_collection("app", "nothing")
    with pytest.raises((FeatureUnavailableException, UnsupportedOperation)):
        manager.drop_collection("_default", "_default")
    manager.create_collection("app", "tmp")
    manager.update_collection("app", "tmp", UpdateCollectionSettings(max_expiry=timedelta(seconds=5)))
    spec, = [c for s in manager.get_all_scopes() if s.name == "app" for c in s.collections if c.name == "tmp"]
    assert spec.max_expiry == timedelta(seconds=5)
    manager.drop_collection("app", "tmp")
    assert "tmp" not in [c.name for s in manager.get_all_scopes() for c in s.collections]


def test_kv_on_named_collections(app, sdk_cluster, sdk_server):
    orders, events = app.collection("orders"), app.collection("events")
    default = sdk_cluster.bucket("default").default_collection()
    orders.upsert("k", {"in": "orders"})
    events.upsert("k", {"in": "events"})
    default.upsert("k", {"in": "_default"})
    assert orders.get("k").content_as[dict] == {"in": "orders"}
    assert events.get("k").content_as[dict] == {"in": "events"}
    assert default.get("k").content_as[dict] == {"in": "_default"}
    with pytest.raises(DocumentExistsException):
        orders.insert("k", {})
    events.insert("new", {"n": 1})
    replaced = events.replace("new", {"n": 2})
    assert events.get("new").cas == replaced.cas
    events.remove("new")
    with pytest.raises(DocumentNotFoundException):
        events.get("new")
    with pytest.raises(DocumentNotFoundException):
        orders.get("only-in-default") if default.upsert("only-in-default", 1) else None
    events.touch("k", timedelta(hours=1))
    assert time.time() + 3500 < expiry_of(sdk_server, "app.events", b"k") <= time.time() + 3601
    # the documents are where the SDK put them: a raw client with the collection's prefix finds them
    with raw(sdk_server) as c:
        cid = struct.unpack(">QI", c.call(Opcode.COLLECTIONS_GET_ID, value=b"app.orders").extras)[1]
        r = c.call(Opcode.GET, key=encode_leb128(cid) + b"k", vbucket=vbucket_for_key(b"k", 64))
        assert r.status == Status.SUCCESS and json.loads(r.value) == {"in": "orders"}


def expiry_of(sdk_server, path: str, key: bytes) -> int:
    """A document's absolute expiry, by GET_META (the SDK's with_expiry needs sub-document lookups)."""
    with raw(sdk_server) as c:
        cid = struct.unpack(">QI", c.call(Opcode.COLLECTIONS_GET_ID, value=path.encode()).extras)[1]
        r = c.call(Opcode.GET_META, key=encode_leb128(cid) + key, extras=b"\x02", vbucket=vbucket_for_key(key, 64))
        assert r.status == Status.SUCCESS
        return struct.unpack_from(">IIIQ", r.extras)[2]


def test_a_collections_max_ttl_applies_to_sdk_writes(app, sdk_server):
    orders = app.collection("orders")
    before = time.time()
    orders.upsert("ttl", {"v": 1})
    orders.upsert("long", {"v": 1}, UpsertOptions(expiry=timedelta(days=2)))
    for key in (b"ttl", b"long"):
        assert before + 59 <= expiry_of(sdk_server, "app.orders", key) <= time.time() + 61, key
    app.collection("events").upsert("free", {"v": 1})
    assert expiry_of(sdk_server, "app.events", b"free") == 0


def test_collections_commands_and_the_manifest_uid_of_unknown(app, sdk_server):
    with raw(sdk_server) as c:
        manifest = json.loads(c.call(Opcode.COLLECTIONS_GET_MANIFEST).value)
        uid = int(manifest["uid"], 16)
        app_scope, = [s for s in manifest["scopes"] if s["name"] == "app"]
        assert {x["name"]: x.get("maxTTL") for x in app_scope["collections"]} == {"orders": 60, "events": None}
        got = c.call(Opcode.COLLECTIONS_GET_ID, value=b"app.events")
        assert struct.unpack(">QI", got.extras) == (uid, int(next(x["uid"] for x in app_scope["collections"]
                                                                 if x["name"] == "events"), 16))
        assert struct.unpack(">QI", c.call(Opcode.COLLECTIONS_GET_SCOPE_ID, value=b"app").extras) == \
            (uid, int(app_scope["uid"], 16))
        for opcode, path, status in ((Opcode.COLLECTIONS_GET_ID, b"app.nothing", Status.UNKNOWN_COLLECTION),
                                     (Opcode.COLLECTIONS_GET_ID, b"none.x", Status.UNKNOWN_SCOPE),
                                     (Opcode.COLLECTIONS_GET_SCOPE_ID, b"none", Status.UNKNOWN_SCOPE)):
            r = c.call(opcode, value=path)
            assert r.status == status and json.loads(r.value)["manifest_uid"] == format(uid, "x")
        r = c.call(Opcode.GET, key=encode_leb128(0x77) + b"k", vbucket=0)
        assert r.status == Status.UNKNOWN_COLLECTION and json.loads(r.value)["manifest_uid"] == format(uid, "x")


def test_get_all_vb_seqnos_per_collection(app, sdk_server):
    events = app.collection("events")
    keys = [f"seq{i}" for i in range(6)]
    for k in keys:
        events.upsert(k, {"k": k})
    with raw(sdk_server) as c:
        cid = struct.unpack(">QI", c.call(Opcode.COLLECTIONS_GET_ID, value=b"app.events").extras)[1]
        per = kv.GetAllVbSeqnosResponse.from_frame(
            c.call(Opcode.GET_ALL_VB_SEQNOS, extras=struct.pack(">II", 1, cid))).as_dict()
        every = kv.GetAllVbSeqnosResponse.from_frame(c.call(Opcode.GET_ALL_VB_SEQNOS)).as_dict()
        for k in keys:
            vb = vbucket_for_key(k.encode(), 64)
            assert 0 < per[vb] <= every[vb]
            # the collection's high seqno is its last document's here
            meta = c.call(Opcode.GET_META, key=encode_leb128(cid) + k.encode(), extras=b"\x02", vbucket=vb)
            assert meta.status == Status.SUCCESS
        default = kv.GetAllVbSeqnosResponse.from_frame(
            c.call(Opcode.GET_ALL_VB_SEQNOS, extras=struct.pack(">II", 1, 0))).as_dict()
        assert all(default[vb] <= every[vb] for vb in every)
        assert c.call(Opcode.GET_ALL_VB_SEQNOS, extras=struct.pack(">II", 1, 0x77)).status == \
            Status.UNKNOWN_COLLECTION
        stats = c.stats("collections")
        p = f"0x8:0x{cid:x}:"
        assert int(stats[p + "items"]) >= len(keys) and int(stats[p + "high_seqno"]) == max(per.values())
        assert stats["manifest_uid"] == str(int(json.loads(c.call(Opcode.COLLECTIONS_GET_MANIFEST).value)["uid"], 16))


def test_a_dropped_collection_is_gone_for_the_sdk(sdk_cluster, app):
    manager = sdk_cluster.bucket("default").collections()
    manager.create_collection("app", "doomed")
    doomed = sdk_cluster.bucket("default").scope("app").collection("doomed")
    doomed.upsert("x", {"v": 1})
    manager.drop_collection("app", "doomed")
    # the SDK's cached id answers UNKNOWN_COLLECTION; it looks the id up again and learns the name is gone
    with pytest.raises(CollectionNotFoundException):
        doomed.get("x", GetOptions(timeout=timedelta(seconds=5)))
