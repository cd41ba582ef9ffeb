"""Datatype bits (header byte 5) and the XATTR blob that may prefix a value.

Layout per reference/kv_engine/docs/Document.md: u32 total length of the xattr section, then
pairs of (u32 pair length, key NUL, value NUL), then the document body.
"""

import struct
from enum import IntFlag

from .errors import ProtocolError


class Datatype(IntFlag):
    RAW = 0x00
    JSON = 0x01
    SNAPPY = 0x02
    XATTR = 0x04


KNOWN_DATATYPE_BITS = 0x07
_U32 = struct.Struct(">I")


def split_xattrs(value: bytes) -> tuple[dict[str, str], bytes]:
    """Return (xattrs, body) of a value whose datatype has the XATTR bit (uncompressed)."""
    if len(value) < 4:
        raise ProtocolError(f"xattr value is {len(value)} bytes; it needs at least the 4-byte length")
    (total,) = _U32.unpack_from(value, 0)
    if total > len(value) - 4:
        raise ProtocolError(f"xattr section claims {total} bytes but only {len(value) - 4} follow")
    xattrs: dict[str, str] = {}
    pos, end = 4, 4 + total
    while pos < end:
        if end - pos < 4:
            raise ProtocolError("xattr pair length is truncated")
        (pair_len,) = _U32.unpack_from(value, pos)
        pos += 4
        pair = value[pos:pos + pair_len]
        if len(pair) != pair_len or pair.count(b"\x00") != 2 or not pair.endswith(b"\x00"):
            raise ProtocolError("xattr pair must be 'key\\0value\\0' within its declared length")
        k, v, _ = pair.split(b"\x00")
        xattrs[k.decode("utf-8", "replace")] = v.decode("utf-8", "replace")
        pos += pair_len
    return xattrs, value[end:]


def join_xattrs(xattrs: dict[str, str], body: bytes) -> bytes:
    """Build a value with an xattr section (the inverse of `split_xattrs`)."""
    parts = []
    for k, v in xattrs.items():
        pair = k.encode() + b"\x00" + v.encode() + b"\x00"
        parts.append(_U32.pack(len(pair)) + pair)
    section = b"".join(parts)
    return _U32.pack(len(section)) + section + body
