"""The official Python SDK against `dcpflow server`'s management port, as its quick start uses it:
wait_until_ready() and ping() (every advertised service ok), the bucket manager (list, create,
get, flush, drop, and its exceptions) and the collection manager."""

import time
from datetime import timedelta

import pytest
from couchbase.diagnostics import PingState, ServiceType
from couchbase.exceptions import (
    BucketAlreadyExistsException,
    BucketDoesNotExistException,
    BucketNotFlushableException,
    DocumentNotFoundException,
    ScopeNotFoundException,
)
from couchbase.management.buckets import ConflictResolutionType, CreateBucketSettings

from ..test_sdk import connect


def test_wait_until_ready_returns_at_once_and_ping_reports_every_service_ok(sdk_server):
    cluster = connect(sdk_server.port)
    try:
        started = time.monotonic()
        cluster.wait_until_ready(timedelta(seconds=20))
        waited = time.monotonic() - started
        # Before the management listener it blocked for ~75 s; ready is a ping round trip or two.
        assert waited < 5, waited
        report = cluster.ping()
        services = {svc: [(ep.remote, ep.state) for ep in eps] for svc, eps in report.endpoints.items()}
        assert services[ServiceType.Management] == [(f"127.0.0.1:{sdk_server.mgmt_port}", PingState.OK)]
        assert services[ServiceType.KeyValue] and all(state == PingState.OK for _, state in
                                                      services[ServiceType.KeyValue])
        assert all(state == PingState.OK for eps in services.values() for _, state in eps), services
    finally:
        cluster.close()


def test_the_bucket_manager_lists_creates_flushes_and_drops(sdk_cluster):
    buckets = sdk_cluster.buckets()
    assert [b.name for b in buckets.get_all_buckets()] == ["default"]
    buckets.create_bucket(CreateBucketSettings(name="sdk-made", ram_quota_mb=128, flush_enabled=True, num_replicas=1,
                                               conflict_resolution_type=ConflictResolutionType.TIMESTAMP))
    with pytest.raises(BucketAlreadyExistsException):
        buckets.create_bucket(CreateBucketSettings(name="sdk-made", ram_quota_mb=100))
    got = buckets.get_bucket("sdk-made")
    assert (got.name, got.ram_quota_mb, got.flush_enabled, got.num_replicas) == ("sdk-made", 128, True, 1)
    assert got.get("conflict_resolution_type") == ConflictResolutionType.TIMESTAMP
    assert sorted(b.name for b in buckets.get_all_buckets()) == ["default", "sdk-made"]

    collection = sdk_cluster.bucket("sdk-made").default_collection()
    collection.upsert("doc", {"made": "by the sdk"})
    assert collection.get("doc").content_as[dict] == {"made": "by the sdk"}
    buckets.flush_bucket("sdk-made")
    with pytest.raises(DocumentNotFoundException):
        collection.get("doc")
    with pytest.raises(BucketNotFlushableException):
        buckets.flush_bucket("default")

    buckets.drop_bucket("sdk-made")
    with pytest.raises(BucketDoesNotExistException):
        buckets.get_bucket("sdk-made")
    with pytest.raises(BucketDoesNotExistException):
        buckets.drop_bucket("sdk-made")
    assert [b.name for b in buckets.get_all_buckets()] == ["default"]


def test_the_collection_manager_sees_the_default_scope(sdk_cluster):
    manager = sdk_cluster.bucket("default").collections()
    scopes = manager.get_all_scopes()
    assert [(s.name, [c.name for c in s.collections]) for s in scopes] == [("_default", ["_default"])]
    manager.create_scope("inventory")  # (tests/server/test_sdk_collections.py has the rest)
    assert "inventory" in [s.name for s in manager.get_all_scopes()]
    manager.drop_scope("inventory")
    with pytest.raises(ScopeNotFoundException):
        manager.drop_scope("inventory")


def test_the_sdks_metrics_label_every_operation_with_the_clusters_name_and_uuid(sdk_server):
    """The official SDK reads clusterName/clusterUUID from the KV cluster map and labels each
    operation's metrics with them (couchbase.cluster.name / couchbase.cluster.uuid), as its own
    tests check (tests/environments/metrics/base/validators.py in couchbase-python-client)."""
    import json
    import urllib.request
    from base64 import b64encode

    from couchbase.observability.metrics import Meter, ValueRecorder

    seen: list[dict] = []

    class Recorder(ValueRecorder):
        def __init__(self, tags):
            self.tags = dict(tags)

        def record_value(self, value: int) -> None:
            seen.append(self.tags)

    class Recording(Meter):
        def value_recorder(self, name, tags):
            return Recorder(tags)

    cluster = connect(sdk_server.port, meter=Recording())
    try:
        collection = cluster.bucket("default").default_collection()
        collection.upsert("labelled", {"v": 1})
        assert collection.get("labelled").content_as[dict] == {"v": 1}
    finally:
        cluster.close()
    auth = {"Authorization": "Basic " + b64encode(b"Administrator:password").decode()}
    base = f"http://127.0.0.1:{sdk_server.mgmt_port}"
    with urllib.request.urlopen(urllib.request.Request(base + "/pools/default", headers=auth), timeout=30) as r:
        name = json.load(r)["clusterName"]
    with urllib.request.urlopen(base + "/pools", timeout=30) as r:
        uuid = json.load(r)["uuid"]
    kv = [tags for tags in seen if tags.get("db.operation.name") in ("upsert", "get")]
    assert kv, seen
    assert all(tags.get("couchbase.cluster.name") == name for tags in kv), kv
    assert all(tags.get("couchbase.cluster.uuid") == uuid for tags in kv), kv
