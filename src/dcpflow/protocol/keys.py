"""Document keys on the wire: the LEB128 collection-id prefix
(https://github.com/couchbase/kv_engine/blob/master/docs/Collections.md) and the key → vbucket
mapping the official SDKs use (CRC32 of the key)."""

import zlib

from .errors import ProtocolError

DEFAULT_COLLECTION = 0
#: A collection id is a u32; its canonical unsigned LEB128 form takes at most 5 bytes.
MAX_LEB128_LEN = 5


def encode_leb128(value: int) -> bytes:
    if not 0 <= value <= 0xFFFFFFFF:
        raise ValueError(f"collection id {value} is not a u32")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def decode_leb128(data: bytes, offset: int = 0) -> tuple[int, int]:
    """Return (value, bytes used). Rejects non-canonical forms, as the server does."""
    value = shift = 0
    for i in range(MAX_LEB128_LEN):
        if offset + i >= len(data):
            raise ProtocolError("key ends inside its LEB128 collection-id prefix")
        byte = data[offset + i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if i and byte == 0:
                raise ProtocolError("collection-id prefix is not canonical LEB128 (trailing zero byte)")
            if value > 0xFFFFFFFF:
                raise ProtocolError("collection id does not fit in a u32")
            return value, i + 1
        shift += 7
    raise ProtocolError(f"collection-id prefix is longer than {MAX_LEB128_LEN} bytes")


def make_key(key: bytes, collection_id: int | None = DEFAULT_COLLECTION) -> bytes:
    """The key as sent on a collections-enabled connection (`None`: no prefix)."""
    return key if collection_id is None else encode_leb128(collection_id) + key


def split_key(wire_key: bytes) -> tuple[int, bytes]:
    """(collection id, key) of a key from a collections-enabled connection."""
    cid, used = decode_leb128(wire_key)
    return cid, wire_key[used:]


def vbucket_for_key(key: bytes, num_vbuckets: int) -> int:
    """The vbucket a key belongs to, computed as every Couchbase client does (key without prefix)."""
    return ((zlib.crc32(key) >> 16) & 0x7FFF) % num_vbuckets
