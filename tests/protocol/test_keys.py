"""Keys on the wire (protocol/keys.py): the LEB128 collection-id prefix with the test vectors of
KV-Engine's Collections.md (https://github.com/couchbase/kv_engine/blob/master/docs/Collections.md),
its canonical-form and 5-byte rules, and the key -> vbucket hash every Couchbase client uses:
((crc32(key) >> 16) & 0x7fff) % vbuckets over the key without its collection prefix."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dcpflow.protocol import keys
from dcpflow.protocol.errors import ProtocolError

# Collections.md, "LEB128 Encoded Examples"
VECTORS = [
    (0x00, "00"),
    (0x01, "01"),
    (0x7F, "7f"),
    (0x80, "80 01"),
    (0x555, "d5 0a"),
    (0x7FFF, "ff ff 01"),
    (0xBFFF, "ff ff 02"),
    (0xFFFF, "ff ff 03"),
    (0x8000, "80 80 02"),
    (0x5555, "d5 aa 01"),
    (0xCAFEF00, "80 de bf 65"),
    (0xCAFEF00D, "8d e0 fb d7 0c"),
    (0xFFFFFFFF, "ff ff ff ff 0f"),
]


@pytest.mark.parametrize("cid,encoded", VECTORS, ids=[hex(c) for c, _ in VECTORS])
def test_collections_md_leb128_vectors(cid, encoded):
    data = bytes.fromhex(encoded.replace(" ", ""))
    assert keys.encode_leb128(cid) == data
    assert keys.decode_leb128(data) == (cid, len(data))
    assert keys.split_key(data + b"key") == (cid, b"key")


def test_the_page_example_puts_0x5555_in_the_first_key_bytes():
    assert keys.make_key(b"Hello", 0x5555)[:3] == b"\xd5\xaa\x01"


def test_collections_add_example_cid_555_is_decimal_erratum_47():
    """Collections.md's ADD example's "collection-ID 555" is decimal: 0x22B, LEB128 `ab 04`."""
    assert keys.make_key(b"Hello", 555) == b"\xab\x04Hello"
    assert keys.make_key(b"Hello", 0x555) != b"\xab\x04Hello"


@pytest.mark.parametrize("encoded", ["81 00", "81 80 00", "81 80 80 00", "81 80 80 80 00"])
def test_non_canonical_encodings_of_1_are_rejected(encoded):
    with pytest.raises(ProtocolError, match="canonical"):
        keys.decode_leb128(bytes.fromhex(encoded.replace(" ", "")) + b"key")


def test_no_stop_byte_within_five_bytes_is_invalid():
    with pytest.raises(ProtocolError, match="longer than 5"):
        keys.decode_leb128(bytes.fromhex("808080808000"))  # 0 spelled in six bytes


def test_values_beyond_u32_and_truncated_prefixes_are_rejected():
    with pytest.raises(ProtocolError, match="u32"):
        keys.decode_leb128(bytes.fromhex("ffffffff1f"))
    with pytest.raises(ProtocolError, match="ends inside"):
        keys.split_key(b"\x80")
    with pytest.raises(ValueError):
        keys.encode_leb128(2**32)
    with pytest.raises(ValueError):
        keys.encode_leb128(-1)


def test_default_collection_prefix_and_no_prefix():
    assert keys.make_key(b"doc") == b"\x00doc"
    assert keys.make_key(b"doc", None) == b"doc"


def test_vbucket_check_values_from_sdk_bootstrap():
    """The values the official SDK computes for the same key: interop-key-1 is vbucket 590 of 1024
    and 14 of 64."""
    assert keys.vbucket_for_key(b"interop-key-1", 1024) == 590
    assert keys.vbucket_for_key(b"interop-key-1", 64) == 14


@given(st.integers(0, 2**32 - 1), st.binary(max_size=20))
def test_leb128_round_trip(cid, key):
    encoded = keys.encode_leb128(cid)
    assert 1 <= len(encoded) <= keys.MAX_LEB128_LEN
    assert keys.split_key(keys.make_key(key, cid)) == (cid, key)
