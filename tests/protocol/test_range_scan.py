"""The range-scan codec: the pages' examples byte for byte, round trips, and the CREATE value's rules."""

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcpflow.protocol import range_scan as rs
from dcpflow.protocol import rules
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import decode_all, request
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status


def one(data: bytes):
    (frame,) = decode_all(data)
    return frame


def test_keys_only_value_matches_the_page():
    """range_scan_continue.md: key0, key11 and a 128-byte key (LEB128 length 0x80 0x01)."""
    long_key = b"key2" + b"2" * 123 + b"3"
    data = rs.encode_keys([b"key0", b"key11", long_key])
    assert data[:12] == b"\x04key0\x05key11\x80" and data[12] == 0x01 and len(data) == 141
    assert rs.decode_keys(data) == [b"key0", b"key11", long_key]


def test_document_value_matches_the_page():
    """25 bytes of metadata (flags, expiry, seqno, cas, datatype), then LEB128 key and value. The
    page's grid ends "Total 36bytes", but its own offsets (value0 at 31-36) and "a second document
    would begin at offset 37" make it 37 bytes: the grid's total is the slip."""
    doc = rs.ScanDocument(b"key0", b"value0", flags=1, expiry=2, seqno=3, cas=4, datatype=0)
    data = rs.encode_documents([doc])
    assert data[:25] == struct.pack(">IIQQB", 1, 2, 3, 4, 0)
    assert data[25:] == b"\x04key0\x06value0" and len(data) == 37
    assert rs.decode_documents(data) == [doc]


def test_create_reply_is_the_16_byte_id():
    data = rs.RangeScanCreateResponse(bytes.fromhex("00112233445566778899aabbccddeeff"), 0x1210).encode()
    assert data[8:12] == b"\x00\x00\x00\x10" and data[24:] == bytes.fromhex("00112233445566778899aabbccddeeff")
    frame = one(rs.RangeScanCreateResponse(b"short").encode())
    assert rules.problems(frame)[0].status == Status.EINVAL


def test_continue_extras_layout():
    data = rs.RangeScanContinue(7, b"\x01" * 16, 500, 0, 0, opaque=3).encode()
    assert data[4] == 28 and data[24:40] == b"\x01" * 16 and data[40:44] == struct.pack(">I", 500)
    assert rs.RangeScanContinue.from_frame(one(data)) == rs.RangeScanContinue(7, b"\x01" * 16, 500, 0, 0, 3)


keys = st.binary(max_size=30)
docs = st.builds(rs.ScanDocument, st.binary(min_size=1, max_size=40), st.binary(max_size=300),
                 st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1),
                 st.integers(0, 2**64 - 1), st.integers(0, 7))


@settings(max_examples=200, deadline=None)
@given(st.booleans(), st.lists(keys, max_size=10), st.lists(docs, max_size=5),
       st.sampled_from(sorted(rs.CONTINUE_DATA_STATUSES)), st.integers(0, 2**32 - 1))
def test_continue_replies_round_trip(keys_only, key_list, doc_list, status, opaque):
    msg = rs.RangeScanContinueResponse(keys_only, tuple(key_list) if keys_only else (),
                                       () if keys_only else tuple(doc_list), status, opaque)
    frame = one(msg.encode())
    assert rules.problems(frame) == []
    assert rs.RangeScanContinueResponse.from_frame(frame) == msg


configs = st.one_of(
    st.builds(lambda cid, key_only, start, end, xs, xe: rs.ScanConfig(cid, key_only, start=start, end=end,
                                                                      excl_start=xs, excl_end=xe),
              st.integers(0, 2**32 - 1), st.booleans(), st.binary(max_size=250), st.binary(max_size=250),
              st.booleans(), st.booleans()),
    st.builds(lambda samples, seed, snap: rs.ScanConfig(samples=samples, seed=seed, snapshot=snap),
              st.integers(1, 2**64 - 1), st.integers(0, 2**64 - 1),
              st.builds(rs.SnapshotRequirements, st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1),
                        st.booleans(), st.one_of(st.none(), st.integers(0, 2**32 - 1)))),
)


@settings(max_examples=200, deadline=None)
@given(configs, st.integers(0, 1023))
def test_create_round_trips(config, vb):
    msg = rs.RangeScanCreate(vb, config, 9)
    assert rs.RangeScanCreate.from_frame(one(msg.encode())) == msg


def create(doc, datatype=1) -> bytes:
    return request(Opcode.RANGE_SCAN_CREATE, value=json.dumps(doc).encode(), datatype=datatype)


R = {"start": "YQ==", "end": "Yg=="}


@pytest.mark.parametrize("doc", [
    {},  # neither range nor sampling
    {"range": R, "sampling": {"samples": 1}},  # both
    {"range": {"start": "YQ=="}},  # no end
    {"range": {**R, "excl_start": "YQ=="}},  # start and excl_start
    {"range": {"start": "not base64!", "end": "Yg=="}},
    {"range": {"start": "YQ==", "end": "eA==" * 100}},  # a 300-byte key
    {"sampling": {"seed": 1}},  # no samples
    {"sampling": {"samples": 0}},
    {"sampling": {"samples": -1}},
    {"range": R, "key_only": True, "include_xattrs": True},
    {"range": R, "collection": "xyz"},
    {"range": R, "name": "n" * 51},
    {"range": R, "snapshot_requirements": {"seqno": 1}},  # no vb_uuid
    {"range": R, "snapshot_requirements": {"vb_uuid": 5, "seqno": 1}},  # uuid must be a string
    [1, 2],
])
def test_create_value_rules(doc):
    with pytest.raises(ProtocolError) as e:
        rs.RangeScanCreate.from_frame(one(create(doc)))
    assert e.value.status == Status.EINVAL


def test_create_value_needs_datatype_json():
    assert rules.problems(one(create({"range": R}, datatype=0)))[0].status == Status.EINVAL
    config = rs.RangeScanCreate.from_frame(one(create({"range": {"excl_start": "YQ==", "end": "Yg=="},
                                                       "collection": "abc", "name": "mine"}))).config
    assert config == rs.ScanConfig(0xABC, start=b"a", end=b"b", excl_start=True, name="mine")
