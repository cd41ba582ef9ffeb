"""Document keys on the wire: the LEB128 collection-id prefix
(https://github.com/couchbase/kv_engine/blob/master/docs/Collections.md) and the key → vbucket
mapping the official SDKs use (CRC32 of the key)."""

import zlib

from .errors import ProtocolError

DEFAULT_COLLECTION = 0
#: The first id of a collection made by a user (Collections.md: 1-7 are reserved).
FIRST_USER_COLLECTION = 8
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


#: kv_engine's document-key limits (is_document_key_valid and verify_header in mcbp_validators.cc,
#: https://github.com/couchbase/kv_engine/blob/master/daemon/mcbp_validators.cc): a key is 1 to 250
#: bytes; on a collections connection the key with its prefix is at most 251 bytes, the logical key
#: is 250 bytes in the default collection and 246 in any other (room for a 5-byte prefix), and the
#: collection ids 1-7 are reserved (never valid on the wire).
MAX_KEY_LEN = 250
MAX_COLLECTIONS_KEY_LEN = 251
MAX_COLLECTIONS_LOGICAL_KEY_LEN = 246
RESERVED_COLLECTION_IDS = range(1, 8)


def check_document_key(wire_key: bytes, collections: bool) -> tuple[int, bytes]:
    """(collection id, logical key) of a request's document key, checked as kv_engine checks it
    before anything else looks at the request (privileges, the collection's existence); a key
    that breaks a rule raises ProtocolError (EINVAL) naming the rule."""
    n = len(wire_key)
    if not collections:
        if not 0 < n <= MAX_KEY_LEN:
            raise ProtocolError(f"key is {n} bytes: a key is 1 to {MAX_KEY_LEN} bytes")
        return DEFAULT_COLLECTION, wire_key
    if n > MAX_COLLECTIONS_KEY_LEN:
        raise ProtocolError(f"key is {n} bytes: with collections a key and its prefix are at most "
                            f"{MAX_COLLECTIONS_KEY_LEN} bytes")
    if n < 2:
        raise ProtocolError("with collections a key is at least 2 bytes (its collection-id prefix and one byte)")
    cid, used = decode_leb128(wire_key)
    if used == n:
        raise ProtocolError("the key is empty after its collection-id prefix (Collections.md)")
    if cid in RESERVED_COLLECTION_IDS:
        raise ProtocolError(f"collection id {cid} is reserved (ids 1-7 are never valid on the wire)")
    limit = MAX_KEY_LEN if cid == DEFAULT_COLLECTION else MAX_COLLECTIONS_LOGICAL_KEY_LEN
    if n - used > limit:
        raise ProtocolError(f"the key is {n - used} bytes after its collection-id prefix; the limit in collection "
                            f"0x{cid:x} is {limit}")
    return cid, wire_key[used:]


def vbucket_for_key(key: bytes, num_vbuckets: int) -> int:
    """The vbucket a key belongs to, computed as every Couchbase client does (key without prefix)."""
    return ((zlib.crc32(key) >> 16) & 0x7FFF) % num_vbuckets
