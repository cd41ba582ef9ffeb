"""Datatype bits (header byte 5) and the XATTR blob that may prefix a value.

Layout per https://github.com/couchbase/kv_engine/blob/master/docs/Document.md: u32 total length of
the xattr section, then pairs of (u32 pair length, key NUL, value NUL), then the document body.
"""

import json
import struct
from enum import IntFlag

from .errors import ProtocolError


class Datatype(IntFlag):
    RAW = 0x00
    JSON = 0x01
    SNAPPY = 0x02
    XATTR = 0x04


KNOWN_DATATYPE_BITS = 0x07
#: The bits as plain ints, for hot paths: `int & IntFlag` runs enum's Python __rand__ per call.
DATATYPE_JSON = int(Datatype.JSON)
DATATYPE_SNAPPY = int(Datatype.SNAPPY)
DATATYPE_XATTR = int(Datatype.XATTR)
_U32 = struct.Struct(">I")


def xattr_body_offset(value: bytes) -> int:
    """Where the body starts in a value with the XATTR bit (uncompressed): after the u32 length of
    the xattr section and the section (Document.md). Reads the length only: the value was checked
    when it was stored."""
    return 4 + int.from_bytes(value[:4], "big")


def pack_xattr_pair(key: bytes, value: bytes) -> bytes:
    """One pair of an xattr section: u32 pair length, then `key NUL value NUL` (Document.md)."""
    pair = key + b"\x00" + value + b"\x00"
    return _U32.pack(len(pair)) + pair


def pack_xattr_section(pairs: bytes) -> bytes:
    """An xattr section from its packed pairs: their u32 total length, then the pairs."""
    return _U32.pack(len(pairs)) + pairs


def xattr_pair_spans(value: bytes):
    """(start, end) of each packed pair (its u32 length included) of the xattr section at the start
    of `value`, leniently: a section longer than the value ends with it, a truncated pair ends the
    walk. For readers of stored values that keep or drop whole pairs (a deletion's system xattrs)."""
    end = min(xattr_body_offset(value), len(value))
    pos = 4
    while pos + 4 <= end:
        pair_end = pos + 4 + int.from_bytes(value[pos:pos + 4], "big")
        yield pos, pair_end
        pos = pair_end


def _xattr_pairs(value: bytes) -> tuple[list[tuple[bytes, bytes]], int]:
    """The raw (key, value) pairs of the xattr section and where the body starts."""
    if len(value) < 4:
        raise ProtocolError(f"xattr value is {len(value)} bytes; it needs at least the 4-byte length")
    (total,) = _U32.unpack_from(value, 0)
    if total > len(value) - 4:
        raise ProtocolError(f"xattr section claims {total} bytes but only {len(value) - 4} follow")
    pairs = []
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
        pairs.append((k, v))
        pos += pair_len
    return pairs, end


def split_xattrs(value: bytes) -> tuple[dict[str, str], bytes]:
    """Return (xattrs, body) of a value whose datatype has the XATTR bit (uncompressed)."""
    pairs, end = _xattr_pairs(value)
    return {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in pairs}, value[end:]


def _not_json(constant: str):
    raise ValueError(f"{constant} is not JSON")


def is_json(value: bytes) -> bool:
    """Strict RFC 8259 over UTF-8: json.loads alone would also take UTF-16/32 bytes and NaN or
    Infinity, and would refuse integers of more than 4300 digits (numbers are not converted here)."""
    try:
        json.loads(value.decode("utf-8"), parse_constant=_not_json, parse_int=len, parse_float=len)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return False
    return True


#: ExtendedAttributes.md: a key may not start with these (ispunct() except '_' and '$').
_RESERVED_FIRST = frozenset(b"!\"#%&'()*+,-./:;<=>?@[\\]^`{|}~")
MAX_XATTR_KEY_LEN = 15


def xattr_key_problem(key: bytes, *, allow_virtual: bool = False) -> str | None:
    """What is wrong with an xattr key per ExtendedAttributes.md, or None: 1 to 15 bytes of UTF-8,
    not starting with a reserved character (punctuation other than '_' and '$', control
    characters), '_' and '$' not alone, no '.' or '[' (they begin a path). '$' keys are virtual
    xattrs: a sub-document lookup may name one (`allow_virtual`), a stored value may not."""
    if not 0 < len(key) <= MAX_XATTR_KEY_LEN:
        return f"a key is 1 to {MAX_XATTR_KEY_LEN} bytes"
    first = key[0]
    if first < 0x20 or first == 0x7F or first in _RESERVED_FIRST:
        return "a key may not start with punctuation other than '_' and '$', or a control character"
    if first == 0x24 and not allow_virtual:
        return "'$' keys are virtual xattrs, which are read-only"
    if key in (b"_", b"$"):
        return "a system or virtual xattr key needs at least 2 bytes"
    if b"." in key or b"[" in key:
        return "'.' and '[' begin a path and cannot be part of a key"
    try:
        key.decode("utf-8")
    except UnicodeDecodeError:
        return "a key is UTF-8"
    return None


def check_xattrs(value: bytes) -> None:
    """The rules of ExtendedAttributes.md for xattrs a client stores, beyond the layout: every key
    passes `xattr_key_problem` (no virtual keys), each key once; values are JSON."""
    pairs, _ = _xattr_pairs(value)
    seen = set()
    for key, val in pairs:
        where = f"xattr key {key[:32]!r}"
        problem = xattr_key_problem(key)
        if problem is not None:
            raise ProtocolError(f"{where}: {problem} (ExtendedAttributes.md)")
        if key in seen:
            raise ProtocolError(f"{where}: appears twice")
        seen.add(key)
        if not is_json(val):
            raise ProtocolError(f"{where}: the value is not JSON (ExtendedAttributes.md)")


def join_xattrs(xattrs: dict[str, str], body: bytes) -> bytes:
    """Build a value with an xattr section (the inverse of `split_xattrs`)."""
    return pack_xattr_section(b"".join(pack_xattr_pair(k.encode(), v.encode()) for k, v in xattrs.items())) + body
