"""Scopes and collections over REST: the engine's manifest (only _default._default exists yet), and
ns_server's answers for what does not exist, already exists, or cannot be done yet."""

import json

from dcpflow.engine.collections import Manifest
from dcpflow.protocol.opcodes import Opcode

from .rest_client import http_of

BASE = "/pools/default/buckets/default/scopes"
NOT_YET = "Not allowed on this version of cluster"


def test_the_manifest_is_the_engines_in_ns_servers_shape(server):
    got = http_of(server).get(BASE)
    assert got.status == 200
    assert got.json == {"uid": "0", "scopes": [{"name": "_default", "uid": "0", "collections": [
        {"name": "_default", "uid": "0", "maxTTL": 0, "history": False}]}]}
    with server.login() as c:
        kv = json.loads(c.call(Opcode.COLLECTIONS_GET_MANIFEST).value)
    assert kv == Manifest.default().to_json()  # the same manifest, in kv_engine's shape (no settings)
    assert [s["name"] for s in kv["scopes"]] == [s["name"] for s in got.json["scopes"]]


def test_changes_answer_what_ns_server_answers(server):
    http = http_of(server)
    new_scope = http.post(BASE, {"name": "inventory"})
    assert new_scope.status == 400 and new_scope.json["errors"]["_"].startswith(NOT_YET)
    assert "does not support user scopes and collections yet" in new_scope.json["errors"]["_"]
    exists = http.post(BASE, {"name": "_default"})
    assert exists.status == 400 and exists.json["errors"]["_"] == "Scope with name '_default' already exists"
    assert http.post(BASE, {}).status == 400
    gone = http.delete(BASE + "/inventory")
    assert gone.status == 404 and gone.json["errors"]["_"] == "Scope with name 'inventory' is not found"
    assert http.delete(BASE + "/_default").json["errors"]["_"].startswith(NOT_YET)
    new_coll = http.post(BASE + "/_default/collections", {"name": "beers", "maxTTL": "60", "history": "false"})
    assert new_coll.status == 400 and new_coll.json["errors"]["_"].startswith(NOT_YET)
    assert "already exists" in http.post(BASE + "/_default/collections", {"name": "_default"}).json["errors"]["_"]
    assert http.post(BASE + "/inventory/collections", {"name": "x"}).status == 404
    assert http.post(BASE + "/_default/collections", {"name": "x", "maxTTL": "soon"}).status == 400
    assert http.request("PATCH", BASE + "/_default/collections/_default", {"maxTTL": "5"}).status == 400
    missing = http.delete(BASE + "/_default/collections/beers")
    assert missing.status == 404 and "is not found" in missing.json["errors"]["_"]
    same = {"scopes": [{"name": "_default", "collections": [{"name": "_default"}]}]}
    hdr = {"Content-Type": "application/json"}
    assert http.request("PUT", BASE, json.dumps(same), headers=hdr).json == {"uid": "0"}
    more = {"scopes": [{"name": "_default", "collections": [{"name": "_default"}, {"name": "beers"}]}]}
    assert http.request("PUT", BASE, json.dumps(more), headers=hdr).json["errors"]["_"].startswith(NOT_YET)
    assert http.request("PUT", BASE, json.dumps({"scopes": [{"collections": []}]}), headers=hdr).status == 400
    assert http.request("PUT", BASE, "[1, 2]", headers=hdr).status == 400
    assert http.get(BASE).json["uid"] == "0"
