"""Snappy, the compression of datatype bit 0x02 (HELLO Snappy): raw Snappy blocks, the whole value
(xattrs included) compressed as one (https://github.com/couchbase/kv_engine/blob/master/docs/BinaryProtocol.md
"Data Types"; the format: https://github.com/google/snappy/blob/main/format_description.txt).

The codec is cramjam's (a maintained binding of the reference Rust/C implementations with wheels
for every platform; python-snappy itself now wraps it). A block starts with its uncompressed
length as a varint, which is checked against the document size limit before anything is inflated,
so a small bad request cannot make the server allocate gigabytes.
"""

import cramjam

from .errors import ProtocolError
from .frame import MAX_VALUE_LEN


def uncompressed_length(data: bytes) -> int:
    """The length a Snappy block declares (its leading varint)."""
    value = shift = 0
    for i, byte in enumerate(data[:5]):
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value
        shift += 7
        if i == 4:
            break
    raise ProtocolError("the Snappy-compressed value does not start with a valid length")


def decompress(data: bytes, limit: int = MAX_VALUE_LEN) -> bytes:
    """The value a Snappy block holds; EINVAL if it is not valid Snappy, E2BIG over `limit`."""
    from .status import Status
    size = uncompressed_length(data)
    if size > limit:
        raise ProtocolError(f"the Snappy-compressed value inflates to {size} bytes; the limit is {limit}",
                            Status.E2BIG)
    try:
        out = bytes(cramjam.snappy.decompress_raw(data))
    except cramjam.DecompressionError as e:
        raise ProtocolError(f"the value is not valid Snappy: {e}") from None
    if len(out) != size:
        raise ProtocolError("the Snappy-compressed value does not inflate to the length it declares")
    return out


def compress(data: bytes) -> bytes:
    return bytes(cramjam.snappy.compress_raw(data))
