"""History needs magma, as in Couchbase: a bucket's `storageBackend` (couchstore by default, magma
accepted; dcpflow's one store serves both) decides whether its collections may keep history.

The references: ns_server's bucket_info_cache.erl (build_bucket_capabilities: `nonDedupedHistory`
only for a magma bucket), menelaus_web_buckets.erl (build_magma_bucket_info: the historyRetention*
fields only in a magma bucket's JSON; parse_validate_history_param_inner: "History Retention can
only used with Magma"; historyRetentionBytes 0 or at least 2 GiB), menelaus_web_collections.erl
(history_validator: 400 "Not allowed on this type of bucket"), ns_bucket.erl
(is_storage_mode_update_allowed, history_retention_collection_default: true unless set, for
magma) - all in https://github.com/couchbase/ns_server - and the official SDK's collection manager,
which raises FeatureUnavailableException for `history` on a bucket without nonDedupedHistory
(couchbase-cxx-client core/cluster.cxx, execute_with_bucket_capability_check; the Python SDK's
own tests, couchbase/tests/collectionmgmt_t.py, expect exactly that for couchstore, and success on
magma)."""

import json

import pytest

from dcpflow.protocol.opcodes import Opcode

from .rest_client import http_of

BUCKETS = "/pools/default/buckets"
GIB2 = 2 * 1024 ** 3


def kv_map(server, bucket: str) -> dict:
    with server.login(bucket=bucket) as c:
        return json.loads(c.call(Opcode.GET_CLUSTER_CONFIG).value)


def test_a_couchstore_bucket_has_no_history_and_refuses_it_as_ns_server_does(server):
    http = http_of(server)
    doc = http.get(BUCKETS + "/default").json
    assert doc["storageBackend"] == "couchstore"
    assert not {"historyRetentionSeconds", "historyRetentionBytes", "historyRetentionCollectionDefault"} & set(doc)
    assert "nonDedupedHistory" not in doc["bucketCapabilities"]
    assert "nonDedupedHistory" not in kv_map(server, "default")["bucketCapabilities"]
    for key, value in (("historyRetentionSeconds", "60"), ("historyRetentionBytes", str(GIB2)),
                       ("historyRetentionCollectionDefault", "true")):
        refused = http.post(BUCKETS + "/default", {key: value})
        assert refused.status == 400 and refused.json["errors"] == {key: "History Retention can only used with Magma"}
    made = http.post(BUCKETS, {"name": "plain", "ramQuotaMB": "100", "historyRetentionSeconds": "60"})
    assert made.status == 400 and "plain" not in server.server.buckets
    scopes = BUCKETS + "/default/scopes"
    assert http.post(scopes, {"name": "app"}).status == 200
    history = http.post(scopes + "/app/collections", {"name": "events", "history": "true"})
    assert (history.status, history.headers["content-type"].split(";")[0], history.text) == \
        (400, "text/plain", "Not allowed on this type of bucket")
    assert http.post(scopes + "/app/collections", {"name": "events", "history": "false"}).status == 200
    patched = http.request("PATCH", scopes + "/app/collections/events", {"history": "true"})
    assert patched.status == 400 and patched.text == "Not allowed on this type of bucket"
    engine = server.server.buckets["default"].engine
    assert server.call(lambda: engine.manifest.collection("app", "events").history) is False


def test_a_magma_bucket_keeps_history_and_reports_its_retention(server):
    http = http_of(server)
    made = http.post(BUCKETS, {"name": "lake", "ramQuotaMB": "100", "storageBackend": "magma",
                               "historyRetentionSeconds": "600"})
    assert made.status == 202, made.text
    doc = http.get(BUCKETS + "/lake").json
    assert doc["storageBackend"] == "magma" and "nonDedupedHistory" in doc["bucketCapabilities"]
    assert (doc["historyRetentionSeconds"], doc["historyRetentionBytes"], doc["historyRetentionCollectionDefault"]) \
        == (600, 0, True)
    assert "nonDedupedHistory" in kv_map(server, "lake")["bucketCapabilities"]
    small = http.post(BUCKETS + "/lake", {"historyRetentionBytes": "1000"})
    assert small.status == 400 and small.json["errors"]["historyRetentionBytes"] == \
        f"Value must be an integer between {GIB2} and {2 ** 64 - 1}, inclusive"
    assert http.post(BUCKETS + "/lake", {"historyRetentionBytes": str(GIB2)}).status == 200
    assert http.post(BUCKETS + "/lake", {"historyRetentionBytes": "0"}).status == 200
    engine = server.server.buckets["lake"].engine
    assert server.call(lambda: engine.history_retention_seconds) == 600
    scopes = BUCKETS + "/lake/scopes"
    assert http.post(scopes, {"name": "app"}).status == 200
    assert http.post(scopes + "/app/collections", {"name": "kept"}).status == 200  # the bucket's default: history
    assert http.post(scopes + "/app/collections", {"name": "plain", "history": "false"}).status == 200
    assert server.call(lambda: (engine.manifest.collection("app", "kept").history,
                                engine.manifest.collection("app", "plain").history)) == (True, False)
    assert http.post(BUCKETS + "/lake", {"historyRetentionCollectionDefault": "false"}).status == 200
    assert http.post(scopes + "/app/collections", {"name": "later"}).status == 200
    assert server.call(lambda: engine.manifest.collection("app", "later").history) is False


def test_the_storage_backend_migrates_as_ns_server_allows_and_survives_a_restart(make_server):
    server = make_server()
    http = http_of(server)
    rev = kv_map(server, "default")["rev"]
    assert http.post(BUCKETS + "/default", {"storageBackend": "magma"}).status == 200
    moved = kv_map(server, "default")
    assert moved["rev"] > rev and "nonDedupedHistory" in moved["bucketCapabilities"]  # clients see it at once
    scopes = BUCKETS + "/default/scopes"
    assert http.post(scopes, {"name": "app"}).status == 200
    assert http.post(scopes + "/app/collections", {"name": "events", "history": "true"}).status == 200
    back = http.post(BUCKETS + "/default", {"storageBackend": "couchstore"})
    assert (back.status, back.text) == (400, "Cannot migrate storage mode. history_retention enabled on collections.")
    assert http.request("PATCH", scopes + "/app/collections/events", {"history": "false"}).status == 200
    assert http.post(BUCKETS + "/default", {"historyRetentionCollectionDefault": "true"}).status == 200
    back = http.post(BUCKETS + "/default", {"storageBackend": "couchstore"})
    assert (back.status, back.text) == (400, "Cannot migrate storage mode. history_retention enabled on bucket.")
    assert http.post(BUCKETS + "/default", {"historyRetentionCollectionDefault": "false"}).status == 200
    assert http.post(BUCKETS + "/default", {"storageBackend": "magma"}).status == 200
    server.stop()
    again = make_server()
    assert http_of(again).get(BUCKETS + "/default").json["storageBackend"] == "magma"
    assert "nonDedupedHistory" in kv_map(again, "default")["bucketCapabilities"]
    assert http_of(again).post(BUCKETS + "/default", {"historyRetentionSeconds": "60"}).status == 200
    engine = again.server.buckets["default"].engine
    assert again.call(lambda: engine.history_retention_seconds) == 60
    assert http_of(again).post(BUCKETS + "/default", {"storageBackend": "couchstore"}).status == 200
    assert "nonDedupedHistory" not in kv_map(again, "default")["bucketCapabilities"]
    assert again.call(lambda: engine.history_retention_seconds) == 0  # couchstore keeps no history


def test_the_official_sdks_collection_manager_gets_feature_unavailable_on_couchstore_and_history_on_magma(
        sdk_server, sdk_cluster):
    from couchbase.exceptions import FeatureUnavailableException
    from couchbase.management.buckets import CreateBucketSettings, StorageBackend
    from couchbase.management.collections import CreateCollectionSettings, UpdateCollectionSettings

    buckets = sdk_cluster.buckets()
    buckets.create_bucket(CreateBucketSettings(name="couch", ram_quota_mb=100,
                                               storage_backend=StorageBackend.COUCHSTORE))
    buckets.create_bucket(CreateBucketSettings(name="mag", ram_quota_mb=100, storage_backend=StorageBackend.MAGMA))
    assert buckets.get_bucket("couch").storage_backend == StorageBackend.COUCHSTORE
    assert buckets.get_bucket("mag").storage_backend == StorageBackend.MAGMA
    couch = sdk_cluster.bucket("couch").collections()
    for history in (True, False):  # as the SDK's own test_create_collection_history_retention_unsupported
        with pytest.raises(FeatureUnavailableException):
            couch.create_collection("_default", "kept", CreateCollectionSettings(history=history))
    couch.create_collection("_default", "plain")
    with pytest.raises(FeatureUnavailableException):
        couch.update_collection("_default", "plain", UpdateCollectionSettings(history=True))
    mag = sdk_cluster.bucket("mag").collections()
    mag.create_collection("_default", "kept", CreateCollectionSettings(history=True))
    mag.create_collection("_default", "later", CreateCollectionSettings(history=False))
    specs = {c.name: c.history for s in mag.get_all_scopes() for c in s.collections}
    assert specs["kept"] is True and specs["later"] is False
    mag.update_collection("_default", "later", UpdateCollectionSettings(history=True))
    assert {c.name: c.history for s in mag.get_all_scopes() for c in s.collections}["later"] is True
    buckets.drop_bucket("couch")
    buckets.drop_bucket("mag")


def test_a_bucket_that_kept_history_before_storage_backends_is_magma_after_an_upgrade(make_server):
    """A data directory from before `storageBackend` existed, whose bucket keeps history, comes back
    as a magma bucket: its history and what it says stay in agreement, nothing is dropped."""
    server = make_server()
    engine = server.server.buckets["default"].engine
    server.call(lambda: engine.change_manifest(lambda m: m.add_scope("app").add_collection("app", "events",
                                                                                           history=True)))
    server.call(lambda: engine.store.set_meta("mgmt_settings", "{}"))  # as an older server left it
    server.stop()
    again = make_server()
    doc = http_of(again).get(BUCKETS + "/default").json
    assert doc["storageBackend"] == "magma" and "nonDedupedHistory" in doc["bucketCapabilities"]
    assert again.call(lambda: again.server.buckets["default"].engine.manifest.collection("app", "events").history)
