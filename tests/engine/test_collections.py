"""The collections manifest (engine/collections.py): lookups and the changes it refuses until the
collections work lands."""

import pytest

from dcpflow.engine.collections import Manifest, ManifestError


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
    (lambda m: m.add_scope("app"), "unsupported"),
    (lambda m: m.drop_scope("app"), "unknown_scope"),
    (lambda m: m.drop_scope("_default"), "unsupported"),
    (lambda m: m.add_collection("_default", "_default"), "exists"),
    (lambda m: m.add_collection("app", "x"), "unknown_scope"),
    (lambda m: m.add_collection("_default", "x"), "unsupported"),
    (lambda m: m.drop_collection("_default", "x"), "unknown_collection"),
    (lambda m: m.update_collection("_default", "_default", max_ttl=5), "unsupported"),
    (lambda m: m.with_scopes({"_default": ["_default", "x"]}), "unsupported"),
])
def test_changes_are_refused_with_their_kind(change, kind):
    with pytest.raises(ManifestError) as e:
        change(Manifest.default())
    assert e.value.kind == kind


def test_setting_the_same_manifest_is_no_change():
    m = Manifest.default()
    assert m.with_scopes({"_default": ["_default"]}) is m
