"""Scopes and collections over REST: the engine's manifest in ns_server's shape, the changes the
SDKs' collection managers make (each answered with the next manifest uid, which the KV port and
the cluster map show at once), what ns_server refuses and how, and a dropped collection's
documents purged from disk once the drop is persisted."""

import json
import time

from dcpflow.engine.collections import Manifest
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.keys import encode_leb128
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .rest_client import http_of

BASE = "/pools/default/buckets/default/scopes"
NOT_YET = "Not allowed on this version of cluster"
HDR = {"Content-Type": "application/json"}


def test_the_manifest_is_the_engines_in_ns_servers_shape(server):
    got = http_of(server).get(BASE)
    assert got.status == 200
    assert got.json == {"uid": "0", "scopes": [{"name": "_default", "uid": "0", "collections": [
        {"name": "_default", "uid": "0", "maxTTL": 0, "history": False}]}]}
    with server.login() as c:
        kv = json.loads(c.call(Opcode.COLLECTIONS_GET_MANIFEST).value)
    assert kv == Manifest.default().to_json()  # the same manifest, in kv_engine's shape (no settings)
    assert [s["name"] for s in kv["scopes"]] == [s["name"] for s in got.json["scopes"]]


def magma(http) -> None:
    """Make `default` a magma bucket (history needs it) whose new collections keep no history unless told."""
    made = http.post("/pools/default/buckets/default", {"storageBackend": "magma",
                                                         "historyRetentionCollectionDefault": "false"})
    assert made.status == 200, made.text


def test_changes_make_the_next_manifest_everywhere(server):
    http = http_of(server)
    magma(http)
    assert http.post(BASE, {"name": "inventory"}).json == {"uid": "1"}
    made = http.post(BASE + "/inventory/collections", {"name": "beers", "maxTTL": "60", "history": "true"})
    assert made.status == 200 and made.json == {"uid": "2"}
    assert http.post(BASE + "/inventory/collections", {"name": "wines"}).json == {"uid": "3"}
    scopes = {s["name"]: s for s in http.get(BASE).json["scopes"]}
    assert scopes["inventory"] == {"name": "inventory", "uid": "8", "collections": [
        {"name": "beers", "uid": "8", "maxTTL": 60, "history": True},
        {"name": "wines", "uid": "9", "maxTTL": 0, "history": False}]}
    patched = http.request("PATCH", BASE + "/inventory/collections/wines", {"maxTTL": "5"})
    assert patched.json == {"uid": "4"}
    with server.login() as c:
        kv = json.loads(c.call(Opcode.COLLECTIONS_GET_MANIFEST).value)
        assert kv["uid"] == "4" and kv["scopes"][1]["collections"] == [
            {"name": "beers", "uid": "8", "maxTTL": 60, "history": True}, {"name": "wines", "uid": "9", "maxTTL": 5}]
        config = json.loads(c.call(Opcode.GET_CLUSTER_CONFIG).value)
        assert config["collectionsManifestUid"] == "4"
    assert http.delete(BASE + "/inventory/collections/wines").json == {"uid": "5"}
    assert http.delete(BASE + "/inventory").json == {"uid": "6"}
    assert [s["name"] for s in http.get(BASE).json["scopes"]] == ["_default"]
    assert http.post(BASE, {"name": "inventory"}).json == {"uid": "7"}
    assert http.get(BASE).json["scopes"][1]["uid"] == "9"  # ids are never reused


def test_refusals_answer_what_ns_server_answers(server):
    http = http_of(server)
    magma(http)
    exists = http.post(BASE, {"name": "_default"})
    assert exists.status == 400 and exists.json["errors"]["_"] == "Scope with name '_default' already exists"
    assert http.post(BASE, {}).status == 400
    bad = http.post(BASE, {"name": "_mine"})
    assert bad.status == 400 and "cannot start with _ or %" in bad.json["errors"]["_"]
    gone = http.delete(BASE + "/inventory")
    assert gone.status == 404 and gone.json["errors"]["_"] == "Scope with name 'inventory' is not found"
    assert http.delete(BASE + "/_default").status == 400
    assert "already exists" in http.post(BASE + "/_default/collections", {"name": "_default"}).json["errors"]["_"]
    assert http.post(BASE + "/inventory/collections", {"name": "x"}).status == 404
    assert http.post(BASE + "/_default/collections", {"name": "x", "maxTTL": "soon"}).status == 400
    assert http.post(BASE + "/_default/collections", {"name": "x", "history": "maybe"}).status == 400
    history_on_default = http.request("PATCH", BASE + "/_default/collections/_default", {"history": "true"})
    assert history_on_default.status == 400 and history_on_default.json["errors"]["_"].startswith(NOT_YET)
    no_default = http.delete(BASE + "/_default/collections/_default")
    assert no_default.status == 400 and no_default.json["errors"]["_"].startswith(NOT_YET)
    missing = http.delete(BASE + "/_default/collections/beers")
    assert missing.status == 404 and "is not found" in missing.json["errors"]["_"]
    assert http.request("PUT", BASE, json.dumps({"scopes": [{"collections": []}]}), headers=HDR).status == 400
    assert http.request("PUT", BASE, "[1, 2]", headers=HDR).status == 400
    assert http.get(BASE).json["uid"] == "0"


def test_set_manifest_by_name(server):
    http = http_of(server)
    same = {"scopes": [{"name": "_default", "collections": [{"name": "_default"}]}]}
    assert http.request("PUT", BASE, json.dumps(same), headers=HDR).json == {"uid": "0"}
    more = {"scopes": [{"name": "_default", "collections": [{"name": "_default"}, {"name": "beers"}]},
                       {"name": "app", "collections": [{"name": "a"}, {"name": "b"}]}]}
    assert http.request("PUT", BASE, json.dumps(more), headers=HDR).json == {"uid": "1"}
    less = {"scopes": [{"name": "_default", "collections": [{"name": "_default"}]},
                       {"name": "app", "collections": [{"name": "b"}]}]}
    assert http.request("PUT", BASE, json.dumps(less), headers=HDR).json == {"uid": "2"}
    got = {s["name"]: [c["name"] for c in s["collections"]] for s in http.get(BASE).json["scopes"]}
    assert got == {"_default": ["_default"], "app": ["b"]}


def test_a_dropped_collections_documents_are_purged_from_disk(server):
    http = http_of(server)
    http.post(BASE, {"name": "app"})
    http.post(BASE + "/app/collections", {"name": "gone"})
    engine = server.server.buckets["default"].engine
    with server.login(features=(Feature.XERROR, Feature.JSON, Feature.COLLECTIONS)) as c:
        for i in range(20):
            key = b"d%d" % i
            assert c.call(Opcode.SET, key=encode_leb128(8) + key, value=b"x", extras=b"\0" * 8,
                          vbucket=c.vbucket_of(key)).status == Status.SUCCESS

    def rows() -> int:
        return server.call(lambda: sum(engine.store.count(vb)[0] for vb in engine.vbuckets))

    deadline = time.monotonic() + 30
    while rows() < 20 and time.monotonic() < deadline:  # wait for the flusher
        time.sleep(0.02)
    assert rows() == 20
    assert http.delete(BASE + "/app/collections/gone").status == 200
    assert server.call(lambda: sum(vb.num_items for vb in engine.vbuckets.values())) == 0  # at once
    while rows() and time.monotonic() < deadline:  # then from disk, by the flusher's loop
        time.sleep(0.02)
    assert rows() == 0 and server.call(lambda: engine.dropped_collections) == set()
