"""System event values (protocol/system_events.py, protocol/flatbuffers.py): the legacy structs of
system_event.md and the FlatBuffers tables of KV-Engine's events.fbs, read back by the protocol's
decoder; a buffer written by the official flatbuffers builder (back to front) is read as KV-Engine
would write it."""

import pytest

from dcpflow.protocol.dcp import DcpSystemEvent, SystemEventId
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.flatbuffers import decode_table, encode_table
from dcpflow.protocol.system_events import decode_event_value, event_body

#: Collection{uid 5, scopeId 8, collectionId 10, ttlValid, maxTtl 99, name "beers", history}, as
#: flatbuffers 25.12's Python Builder lays it out (Prepend*Slot, back to front).
OFFICIAL = bytes.fromhex(
    "1c000000000000000000120028001c001800140013000c000800070012000000000000012000000063000000000000010a"
    "00000008000000050000000000000000000000050000006265657273000000")
COLLECTION = ["u64", "u32", "u32", "bool", "u32", "string", "bool"]


def test_a_buffer_of_the_official_builder_decodes():
    assert decode_table(OFFICIAL, COLLECTION) == [5, 8, 10, True, 99, b"beers", True]
    assert decode_event_value(SystemEventId.BEGIN_COLLECTION, 2, OFFICIAL) == {
        "manifest_uid": 5, "scope_id": 8, "collection_id": 10, "ttl_valid": True, "max_ttl": 99, "name": "beers",
        "history": True}


@pytest.mark.parametrize("fields", [
    [("u64", 2**64 - 1), ("u32", 8), ("u32", 9), None, None, ("string", "a" * 251), ("bool", False)],
    [("u64", 1), ("u32", 0), None],
    [None, None],
    [("string", ""), ("bool", True), ("u64", 3)],
])
def test_tables_read_back(fields):
    data = encode_table(fields)
    assert len(data) % 4 == 0
    want = [None if f is None else (f[1].encode() if f[0] == "string" else f[1]) for f in fields]
    assert decode_table(data, [f[0] if f else "u32" for f in fields]) == want


def test_legacy_values_are_the_pages_structs():
    assert event_body(SystemEventId.BEGIN_COLLECTION, flatbuffers=False, manifest_uid=2, scope_id=0,
                      collection_id=8, name="mycollection", max_ttl=72000) == (
        1, b"mycollection", bytes.fromhex("0000000000000002" "00000000" "00000008" "00011940"))  # erratum 31
    assert event_body(SystemEventId.BEGIN_COLLECTION, flatbuffers=False, manifest_uid=2, scope_id=0,
                      collection_id=8, name="c") == (0, b"c", bytes.fromhex("0000000000000002" "00000000" "00000008"))
    assert event_body(SystemEventId.END_COLLECTION, flatbuffers=False, manifest_uid=3, scope_id=8,
                      collection_id=9, name="c")[:2] == (0, b"")
    assert event_body(SystemEventId.DROP_SCOPE, flatbuffers=False, manifest_uid=3, scope_id=8) == (
        0, b"", bytes.fromhex("0000000000000003" "00000008"))
    assert event_body(SystemEventId.MODIFY_COLLECTION, flatbuffers=False, manifest_uid=3, scope_id=8) is None


@pytest.mark.parametrize("event", list(SystemEventId))
def test_every_event_in_flatbuffers_reads_back(event):
    version, key, value = event_body(event, flatbuffers=True, manifest_uid=7, scope_id=8, collection_id=9,
                                     name="n", max_ttl=0, history=False)
    msg = DcpSystemEvent(0, 12, int(event), version, key, value)
    got = msg.decode_value()
    assert version == 2 and got["manifest_uid"] == 7 and got["scope_id"] == 8
    assert ("ttl_valid" in got) is False  # absent: no maxTTL
    if event in (SystemEventId.BEGIN_COLLECTION, SystemEventId.MODIFY_COLLECTION, SystemEventId.CREATE_SCOPE):
        assert got["name"] == "n" and key == b"n"


def test_a_damaged_table_is_a_protocol_error():
    with pytest.raises(ProtocolError):
        decode_event_value(SystemEventId.BEGIN_COLLECTION, 2, b"\xff\xff\x00\x00")
    with pytest.raises(ProtocolError):
        decode_event_value(SystemEventId.DROP_SCOPE, 0, b"\x00" * 5)
