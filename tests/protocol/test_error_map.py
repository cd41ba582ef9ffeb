"""The error map (protocol/error_map.py) is built from status.py plus an attribute table, and must say
what the server's own map says (reference/kv_engine/etc/couchbase/kv/error_maps/error_map_v2.json,
format in docs/ErrorMap.md) for every code both know."""

import json
from pathlib import Path

import pytest

from dcpflow.protocol import error_map, kv
from dcpflow.protocol.error_map import Attr
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import decode_all
from dcpflow.protocol.status import STATUS_DESCRIPTIONS, Status

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared"
REFERENCE = SHARED / "reference/kv_engine/etc/couchbase/kv/error_maps/error_map_v2.json"


@pytest.fixture(scope="module")
def reference() -> dict:
    if not REFERENCE.is_file():
        pytest.skip(f"reference error map not found at {REFERENCE} (CI keeps ../shared beside the repo)")
    return json.loads(REFERENCE.read_text())


def test_every_code_in_both_maps_has_the_same_name_and_attributes(reference):
    ours = error_map.build_error_map(2)["errors"]
    shared = set(ours) & set(reference["errors"])
    assert len(shared) >= 80
    mismatches = {code: ((ours[code]["name"], ours[code]["attrs"]),
                         (reference["errors"][code]["name"], reference["errors"][code]["attrs"]))
                  for code in shared
                  if (ours[code]["name"], sorted(ours[code]["attrs"])) != (reference["errors"][code]["name"],
                                                                          sorted(reference["errors"][code]["attrs"]))}
    assert mismatches == {}


def test_same_codes_version_and_revision_as_the_reference(reference):
    ours = error_map.build_error_map(2)
    assert set(ours["errors"]) == set(reference["errors"])
    assert (ours["version"], ours["revision"]) == (reference["version"], reference["revision"])


def test_reference_uses_only_documented_attributes(reference):
    used = {a for entry in reference["errors"].values() for a in entry["attrs"]}
    assert used <= {str(a) for a in Attr}


def test_every_status_has_a_name_description_and_attributes():
    doc = error_map.build_error_map()
    assert doc["version"] == 2 and doc["revision"] == error_map.REVISION
    for status in Status:
        entry = doc["errors"][format(int(status), "x")]
        assert entry["name"] and entry["attrs"], status
        assert entry["desc"] == STATUS_DESCRIPTIONS[int(status)]
    assert all(key == key.lower() and not key.startswith("0x") for key in doc["errors"])


def test_attributes_that_clients_act_on():
    assert "retry-now" in error_map.attributes(Status.ETMPFAIL)
    assert "retry-later" in error_map.attributes(Status.ENOMEM)
    assert "fetch-config" in error_map.attributes(Status.NOT_MY_VBUCKET)
    assert {"auth", "conn-state-invalidated"} <= set(error_map.attributes(Status.AUTH_ERROR))
    assert "special-handling" in error_map.attributes(Status.ROLLBACK)
    assert "item-only" in error_map.attributes(Status.KEY_ENOENT)
    assert error_map.attributes(0x7777) == ()
    assert error_map.error_name(Status.DCP_STREAM_NOT_FOUND) == "STREAM_NOT_FOUND"
    assert error_map.error_name(Status.KEY_ENOENT) == "KEY_ENOENT"
    assert error_map.error_name(0x7777) == "0x7777"


def test_version_1_map_drops_the_version_2_attributes():
    v1 = error_map.build_error_map(1)
    assert v1["version"] == 1
    used = {a for entry in v1["errors"].values() for a in entry["attrs"]}
    assert not used & {"rate-limit", "system-constraint"}
    assert v1["errors"]["28"]["attrs"] == ["item-only", "no-retry"]
    assert error_map.build_error_map(7)["version"] == 2  # answered with the newest we have
    with pytest.raises(ProtocolError, match="version 0"):
        error_map.build_error_map(0)


def test_encoded_map_parses_back_for_a_client():
    data = error_map.encode_error_map(2)
    assert error_map.encode_error_map(2) is data  # built once
    parsed = error_map.parse_error_map(data)
    assert parsed.version == 2 and parsed.revision == error_map.REVISION
    info = parsed.get(0x86)
    assert info.name == "ETMPFAIL" and info.has(Attr.RETRY_NOW) and info.has("temp")
    assert parsed.get(0x7777) is None
    assert parsed.is_newer_than(None)
    older = parsed._replace(revision=parsed.revision - 1, version=3)
    assert parsed.is_newer_than(older) and not older.is_newer_than(parsed)  # revision decides, not version


def test_parse_keeps_unknown_attributes_and_rejects_non_maps():
    doc = {"version": 2, "revision": 1, "errors": {"ff01": {"name": "X", "desc": "d", "attrs": ["shiny"]}}}
    assert error_map.parse_error_map(json.dumps(doc)).get(0xFF01).has("shiny")
    for bad in (b"{", b"[]", json.dumps({"version": 2}).encode(), json.dumps(dict(doc, errors={"zz": {}}))):
        with pytest.raises(ProtocolError, match="error map is malformed"):
            error_map.parse_error_map(bad)


def test_error_map_travels_in_get_error_map_reply():
    (req,) = decode_all(kv.GetErrorMap(2, opaque=9).encode())
    asked = kv.decode_kv(req)
    assert asked == kv.GetErrorMap(2, opaque=9)
    (frame,) = decode_all(kv.ErrorMapResponse(error_map.encode_error_map(asked.version), opaque=9).encode())
    reply = kv.decode_kv(frame)
    assert frame.datatype == 0x01 and reply.json["version"] == 2
    assert error_map.parse_error_map(reply.error_map).get(0x07).has("fetch-config")
