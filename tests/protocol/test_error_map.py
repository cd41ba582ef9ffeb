"""The error map (protocol/error_map.py) is built from status.py plus an attribute table, and must say
what the server's own map says for every code both know.

The server's map is KV-Engine's `error_map_v2.json`,
https://github.com/couchbase/kv_engine/blob/master/etc/couchbase/kv/error_maps/error_map_v2.json
(format: https://github.com/couchbase/kv_engine/blob/master/docs/ErrorMap.md). UPSTREAM_V2 below
pins its version, revision and every entry's name and attributes as of commit eba4298 (revision 9);
descriptions are left out, since ours come from status.py. When KV-Engine publishes a new
revision, update the table from that file and the map to match.
"""

import json

import pytest

from dcpflow.protocol import error_map, kv
from dcpflow.protocol.error_map import Attr
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import decode_all
from dcpflow.protocol.status import STATUS_DESCRIPTIONS, Status

#: KV-Engine's error map v2: (version, revision) and code (lower-case hex) -> (name, attributes).
UPSTREAM_V2_VERSION = (2, 9)
UPSTREAM_V2 = {
    "0": ("SUCCESS", ("success",)),
    "1": ("KEY_ENOENT", ("item-only",)),
    "2": ("KEY_EEXISTS", ("item-only",)),
    "3": ("E2BIG", ("item-only", "invalid-input")),
    "4": ("EINVAL", ("internal", "invalid-input")),
    "5": ("NOT_STORED", ("internal", "item-only")),
    "6": ("DELTA_BADVAL", ("item-only", "invalid-input")),
    "7": ("NOT_MY_VBUCKET", ("fetch-config", "invalid-input")),
    "8": ("NO_BUCKET", ("conn-state-invalidated",)),
    "9": ("LOCKED", ("item-locked", "item-only", "retry-now")),
    "a": ("STREAM_NOT_FOUND", ("conn-state-invalidated",)),
    "b": ("OPAQUE_NO_MATCH", ("conn-state-invalidated",)),
    "c": ("EWOULD_THROTTLE", ("temp", "retry-later", "rate-limit")),
    "d": ("ECONFIG_ONLY", ("fetch-config", "retry-now")),
    "e": ("NOT_LOCKED", ("item-only",)),
    "f": ("CAS_VALUE_INVALID", ("item-only",)),
    "1f": ("AUTH_STALE", ("conn-state-invalidated", "auth")),
    "20": ("AUTH_ERROR", ("conn-state-invalidated", "auth")),
    "21": ("AUTH_CONTINUE", ("special-handling",)),
    "22": ("ERANGE", ("invalid-input",)),
    "23": ("ROLLBACK", ("dcp", "special-handling")),
    "24": ("EACCESS", ("support",)),
    "25": ("NOT_INITIALIZED", ("conn-state-invalidated",)),
    "26": ("ENCRYPTION_KEY_NOT_AVAILABLE", ("special-handling",)),
    "27": ("CHECKSUM_MISMATCH", ("special-handling",)),
    "28": ("EXPIRY_OVERFLOW", ("item-only", "system-constraint", "no-retry")),
    "29": ("LOCK_EXPIRY_OVERFLOW", ("item-only", "system-constraint", "no-retry")),
    "30": ("RATE_LIMITED_NETWORK_INGRESS", ("temp", "retry-later", "rate-limit")),
    "31": ("RATE_LIMITED_NETWORK_EGRESS", ("temp", "retry-later", "rate-limit")),
    "32": ("RATE_LIMITED_MAX_CONNECTIONS", ("conn-state-invalidated", "rate-limit")),
    "33": ("RATE_LIMITED_MAX_COMMANDS", ("temp", "retry-later", "rate-limit")),
    "35": ("BUCKET_SIZE_LIMIT_EXCEEDED", ("item-only", "system-constraint", "no-retry")),
    "36": ("BUCKET_RESIDENT_RATIO_TOO_LOW", ("item-only", "system-constraint", "no-retry")),
    "37": ("BUCKET_DATA_SIZE_TOO_BIG", ("item-only", "system-constraint", "no-retry")),
    "38": ("BUCKET_DISK_SPACE_TOO_LOW", ("item-only", "system-constraint", "no-retry")),
    "50": ("BUCKET_PAUSED", ("support",)),
    "51": ("CANCELLED", ("item-only", "retry-now")),
    "80": ("UNKNOWN_FRAME_INFO", ("support",)),
    "81": ("UNKNOWN_COMMAND", ("support",)),
    "82": ("ENOMEM", ("temp", "retry-later")),
    "83": ("NOT_SUPPORTED", ("support",)),
    "84": ("EINTERNAL", ("internal", "conn-state-invalidated")),
    "85": ("EBUSY", ("temp", "retry-now")),
    "86": ("ETMPFAIL", ("temp", "retry-now")),
    "87": ("XATTR_EINVAL", ("invalid-input",)),
    "88": ("UNKNOWN_COLLECTION", ("invalid-input",)),
    "8a": ("CANNOT_APPLY_COLLECTIONS_MANIFEST", ("invalid-input",)),
    "8c": ("UNKNOWN_SCOPE", ("invalid-input",)),
    "8d": ("DCP stream-ID invalid", ("invalid-input",)),
    "a0": ("DurabilityInvalidLevel", ("invalid-input",)),
    "a1": ("DurabilityImpossible", ("item-only", "invalid-input")),
    "a2": ("SyncWriteInProgress", ("item-only", "retry-later")),
    "a3": ("SyncWriteAmbiguous", ("item-only",)),
    "a4": ("SyncWriteReCommitInProgress", ("item-only", "retry-later")),
    "a5": ("RangeScanCancelled", ("success",)),
    "a6": ("RangeScanMore", ("success",)),
    "a7": ("RangeScanComplete", ("success",)),
    "a8": ("VbUuidNotEqual", ("invalid-input",)),
    "c0": ("SUBDOC_PATH_ENOENT", ("subdoc", "item-only")),
    "c1": ("SUBDOC_PATH_MISMATCH", ("subdoc", "item-only")),
    "c2": ("SUBDOC_PATH_EINVAL", ("subdoc", "invalid-input")),
    "c3": ("SUBDOC_PATH_E2BIG", ("subdoc", "invalid-input")),
    "c4": ("SUBDOC_PATH_E2DEEP", ("subdoc", "invalid-input")),
    "c5": ("SUBDOC_VALUE_CANTINSERT", ("subdoc", "invalid-input")),
    "c6": ("SUBDOC_DOC_NOTJSON", ("subdoc", "item-only")),
    "c7": ("SUBDOC_NUM_ERANGE", ("subdoc", "item-only")),
    "c8": ("SUBDOC_DELTA_EINVAL", ("subdoc", "item-only")),
    "c9": ("SUBDOC_PATH_EEXISTS", ("subdoc", "item-only")),
    "ca": ("SUBDOC_VALUE_ETOODEEP", ("subdoc", "invalid-input", "item-only")),
    "cb": ("SUBDOC_INVALID_COMBO", ("subdoc", "invalid-input")),
    "cc": ("SUBDOC_MULTI_PATH_FAILURE", ("subdoc", "special-handling")),
    "cd": ("SUBDOC_SUCCESS_DELETED", ("item-deleted", "success", "subdoc")),
    "ce": ("SUBDOC_XATTR_INVALID_FLAG_COMBO", ("subdoc", "invalid-input")),
    "cf": ("SUBDOC_XATTR_INVALID_KEY_COMBO", ("subdoc", "invalid-input")),
    "d0": ("SUBDOC_XATTR_UNKNOWN_MACRO", ("subdoc", "invalid-input")),
    "d1": ("SUBDOC_XATTR_UNKNOWN_VATTR", ("subdoc", "invalid-input")),
    "d2": ("SUBDOC_XATTR_CANT_MODIFY_VATTR", ("subdoc", "invalid-input")),
    "d3": ("SUBDOC_MULTI_PATH_FAILURE_DELETED", ("item-deleted", "subdoc", "special-handling")),
    "d4": ("SUBDOC_INVALID_XATTR_ORDER", ("subdoc", "invalid-input")),
    "d5": ("SUBDOC_XATTR_UNKNOWN_VATTR_MACRO", ("subdoc", "invalid-input")),
    "d6": ("SUBDOC_CAN_ONLY_REVIVE_DELETED_DOCUMENTS", ("subdoc", "item-only")),
    "d7": ("SUBDOC_DELETED_DOCUMENT_CANT_HAVE_VALUE", ("subdoc", "item-only")),
    "d8": ("SUBDOC_FIELD_NOT_BINARY_VALUE", ("subdoc", "item-only")),
}


def test_every_code_in_both_maps_has_the_same_name_and_attributes():
    ours = error_map.build_error_map(2)["errors"]
    common = set(ours) & set(UPSTREAM_V2)
    assert len(common) >= 80
    mismatches = {code: ((ours[code]["name"], ours[code]["attrs"]), UPSTREAM_V2[code])
                  for code in common
                  if (ours[code]["name"], sorted(ours[code]["attrs"])) != (UPSTREAM_V2[code][0],
                                                                          sorted(UPSTREAM_V2[code][1]))}
    assert mismatches == {}


def test_same_codes_version_and_revision_as_upstream():
    ours = error_map.build_error_map(2)
    assert set(ours["errors"]) == set(UPSTREAM_V2)
    assert (ours["version"], ours["revision"]) == UPSTREAM_V2_VERSION


def test_upstream_uses_only_documented_attributes():
    used = {a for _, attrs in UPSTREAM_V2.values() for a in attrs}
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
