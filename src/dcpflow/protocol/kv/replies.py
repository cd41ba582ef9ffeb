"""Reply headers packed whole, for a server's hot paths (GET, the writes), and the mutation token.

A server answering millions of GETs and SETs packs each reply with one struct call instead of
building a typed response and encoding it; these give the same bytes as GetResponse.encode() and
MutationResponse.encode() (tests/protocol/test_layouts.py checks that), with the field order of
BinaryProtocol.md's header kept here, next to the codec, rather than spelled by position at every
call site.
"""

import struct
from typing import NamedTuple

from ..frame import HEADER, Magic

#: The extras of a mutation's reply with HELLO MutationSeqno (BinaryProtocol.md#0x01-set): the
#: vbucket's UUID, then the seqno the write took.
MUTATION_TOKEN = struct.Struct(">QQ")

#: A GetResponse's header and flags extras in one struct (key and value follow): (magic, opcode, key
#: length, 4, datatype, 0, body length, opaque, cas, flags). For a server's GET path, which packs
#: the reply without building a GetResponse; the bytes are GetResponse.encode()'s.
GET_RESPONSE_HEAD = struct.Struct(HEADER.format + "I")

#: A MutationResponse with its mutation token in one struct: (magic, opcode, 0, 16, 0, 0, 16, opaque,
#: cas, vbucket uuid, seqno). For a server's write paths, which pack the reply without building a
#: MutationResponse (without the token the reply is the bare HEADER); the bytes are encode()'s.
MUTATION_RESPONSE_WITH_TOKEN = struct.Struct(HEADER.format + "QQ")

_RESPONSE = int(Magic.RESPONSE)
_pack_header = HEADER.pack
_pack_get_head = GET_RESPONSE_HEAD.pack
_pack_token_reply = MUTATION_RESPONSE_WITH_TOKEN.pack


class MutationToken(NamedTuple):
    """The token a mutation's reply carries with HELLO MutationSeqno: where the write landed, which a
    client compares against DCP or hands to a later read (BinaryProtocol.md#0x01-set)."""

    vbucket_uuid: int
    seqno: int

    def encode(self) -> bytes:
        return MUTATION_TOKEN.pack(self.vbucket_uuid, self.seqno)

    @classmethod
    def from_extras(cls, extras: bytes) -> "MutationToken | None":
        """The token in a reply's extras, or None when the reply carries none (no extras)."""
        if len(extras) != MUTATION_TOKEN.size:
            return None
        return cls._make(MUTATION_TOKEN.unpack(extras))


def pack_response(opcode: int, opaque: int, cas: int = 0, status: int = 0) -> bytes:
    """A reply that is a header alone (classic framing, no extras, key or value): a write's success
    without a mutation token, or a bare status."""
    return _pack_header(_RESPONSE, opcode, 0, 0, 0, status, 0, opaque, cas)


def pack_mutation_response(opcode: int, opaque: int, cas: int, vbucket_uuid: int, seqno: int) -> bytes:
    """A write's success with its mutation token (HELLO MutationSeqno): MutationResponse.encode()'s bytes."""
    return _pack_token_reply(_RESPONSE, opcode, 0, 16, 0, 0, 16, opaque, cas, vbucket_uuid, seqno)


def pack_get_response_head(opcode: int, opaque: int, cas: int, flags: int, datatype: int, key_len: int,
                           value_len: int) -> bytes:
    """The header and flags extras of a GET-family success; the key (`key_len` bytes, the K forms
    only) and the value follow. GetResponse.encode()'s bytes once they are appended."""
    return _pack_get_head(_RESPONSE, opcode, key_len, 4, datatype, 0, 4 + key_len + value_len, opaque, cas, flags)
