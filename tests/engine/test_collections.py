"""The collections manifest (engine/collections.py): lookups, changes (each a new manifest with the
next uid and ids that are never reused), what it refuses, and the system events between two."""

import pytest

from dcpflow.engine.collections import (
    SYSTEM_CID,
    Manifest,
    ManifestError,
    SystemEvent,
    changes,
    event_item,
    event_key,
)
from dcpflow.protocol.dcp import SystemEventId


def test_default_manifest_lookups():
    m = Manifest.default()
    assert m.uid == 0 and m.scope("_default").uid == 0 and m.collection("_default", "_default").uid == 0
    assert m.to_json() == {"uid": "0", "scopes": [{"name": "_default", "uid": "0",
                                                   "collections": [{"name": "_default", "uid": "0"}]}]}
    with pytest.raises(ManifestError) as e:
        m.scope("app")
    assert e.value.kind == "unknown_scope"
    with pytest.raises(ManifestError) as e:
        m.collection("_default", "beers")
    assert e.value.kind == "unknown_collection"


@pytest.mark.parametrize("change, kind", [
    (lambda m: m.add_scope("_default"), "exists"),
    (lambda m: m.drop_scope("app"), "unknown_scope"),
    (lambda m: m.drop_scope("_default"), "invalid"),
    (lambda m: m.add_collection("_default", "_default"), "exists"),
    (lambda m: m.add_collection("app", "x"), "unknown_scope"),
    (lambda m: m.drop_collection("_default", "x"), "unknown_collection"),
    (lambda m: m.drop_collection("_default", "_default"), "unsupported"),
    (lambda m: m.update_collection("_default", "_default", history=True), "unsupported"),
    (lambda m: m.update_collection("_default", "_default", max_ttl=5), "unsupported"),
    (lambda m: m.with_scopes({"app": []}), "invalid"),
    (lambda m: m.add_scope("_system"), "invalid"),
    (lambda m: m.add_scope("%x"), "invalid"),
    (lambda m: m.add_scope("a b"), "invalid"),
    (lambda m: m.add_scope("x" * 252), "invalid"),
    (lambda m: m.add_collection("_default", ""), "invalid"),
    (lambda m: m.add_collection("_default", "c", max_ttl=-2), "invalid"),
    (lambda m: m.add_collection("_default", "c", max_ttl=2**31), "invalid"),
])
def test_changes_are_refused_with_their_kind(change, kind):
    with pytest.raises(ManifestError) as e:
        change(Manifest.default())
    assert e.value.kind == kind


def test_setting_the_same_manifest_is_no_change():
    m = Manifest.default()
    assert m.with_scopes({"_default": ["_default"]}) is m


def test_each_change_is_the_next_uid_and_ids_are_never_reused():
    m = Manifest.default().add_scope("app")
    assert (m.uid, m.scope("app").uid) == (1, 8)
    m = m.add_collection("app", "orders", max_ttl=60)
    m = m.add_collection("app", "events", history=True)
    assert (m.uid, m.collection("app", "orders").uid, m.collection("app", "events").uid) == (3, 8, 9)
    assert m.by_id(9)[1].history and m.history_collections == {9}
    m = m.drop_collection("app", "orders")
    assert m.by_id(8) is None and m.uid == 4
    m = m.add_collection("app", "orders")
    assert m.collection("app", "orders").uid == 0xa  # a new id: the dropped one's documents stay apart
    m = m.update_collection("app", "orders", max_ttl=5)
    assert m.collection("app", "orders").max_ttl == 5 and m.uid == 6
    assert m.update_collection("app", "orders", max_ttl=5) is m  # no change, no new uid
    m = m.drop_scope("app")
    assert m.uid == 7 and [s.name for s in m.scopes] == ["_default"]
    assert m.add_scope("app").scope("app").uid == 9


def test_the_manifest_json_and_its_persistence():
    m = Manifest.default().add_scope("app").add_collection("app", "c", max_ttl=30, history=True)
    assert m.to_json() == {"uid": "2", "scopes": [
        {"name": "_default", "uid": "0", "collections": [{"name": "_default", "uid": "0"}]},
        {"name": "app", "uid": "8", "collections": [{"name": "c", "uid": "8", "maxTTL": 30, "history": True}]}]}
    assert m.to_json(rest=True)["scopes"][0]["collections"] == [
        {"name": "_default", "uid": "0", "maxTTL": 0, "history": False}]
    again = Manifest.loads(m.dumps())
    assert again == m and again.by_id(8)[0].name == "app"
    assert again.add_collection("app", "d").collection("app", "d").uid == 9  # the counters survive too


def test_set_manifest_creates_and_drops_by_name_keeping_ids():
    m = Manifest.default().add_scope("a").add_collection("a", "x").add_collection("a", "y")
    n = m.with_scopes({"_default": ["_default"], "a": ["y", "z"], "b": ["w"]})
    assert n.uid == m.uid + 1
    assert n.collection("a", "y").uid == m.collection("a", "y").uid
    assert n.by_id(m.collection("a", "x").uid) is None
    assert {c.name for c in n.scope("b").collections} == {"w"}


def test_changes_between_manifests_come_in_kv_engines_order():
    old = Manifest.default().add_scope("a").add_collection("a", "x").add_collection("_default", "keep")
    new = old.drop_scope("a").add_scope("b").add_collection("b", "y").update_collection("_default", "keep",
                                                                                         max_ttl=9)
    got = [(c.event, c.scope.name, c.collection.name if c.collection else None) for c in changes(old, new)]
    assert got == [(SystemEventId.END_COLLECTION, "a", "x"), (SystemEventId.DROP_SCOPE, "a", None),
                   (SystemEventId.CREATE_SCOPE, "b", None), (SystemEventId.BEGIN_COLLECTION, "b", "y"),
                   (SystemEventId.MODIFY_COLLECTION, "_default", "keep")]
    assert changes(new, new) == []


def test_a_system_event_item_and_back():
    m = Manifest.default().add_scope("a").add_collection("a", "x", max_ttl=7, history=True)
    create, = changes(Manifest.default().add_scope("a"), m)
    item = event_item(create, m.uid, seqno=5, cas=99, now=1000)
    assert (item.cid, item.key, item.by_seqno, item.deleted, item.flags) == (SYSTEM_CID, b"\x00\x08", 5, False, 0)
    ev = SystemEvent.of(item)
    assert (ev.event, ev.manifest_uid, ev.scope_id, ev.collection.uid, ev.collection.max_ttl, ev.collection.history) \
        == (SystemEventId.BEGIN_COLLECTION, 2, 8, 8, 7, True)
    drop, = changes(m, m.drop_collection("a", "x"))
    dropped = event_item(drop, 3, seqno=6, cas=100, now=1000)
    assert dropped.deleted and dropped.key == item.key == event_key(drop)  # the drop replaces the create
    scope_drop = changes(m.drop_collection("a", "x"), m.drop_scope("a"))
    assert event_key(scope_drop[0]) == b"\x01\x08"
