"""The byte layouts every DCP message module shares: extras structs, whole-header structs for the hot
paths, DOCUMENT_LAYOUTS (where each document field lies in a frame) and the frame encoders.
"""

import struct

from ..frame import (
    HEADER_FIELDS,
    HEADER_LEN,
    Field,
    Magic,
    RequestFrameId,
    encode_frame,
    stream_id_frame,
    struct_fields,
)
from ..opcodes import Opcode
from ..status import Status
from .flags import MarkerVersion

# ---------------------------------------------------------------------------------------------
# Encoding helpers

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_OPEN_EXTRAS = struct.Struct(">II")
_STREAM_REQ_EXTRAS = struct.Struct(">IIQQQQQ")
_MARKER_V1 = struct.Struct(">QQI")
_MARKER_V20 = struct.Struct(">QQIQQ")
_MARKER_V22 = struct.Struct(">QQIQQQQ")
#: V2.2 without the high prepared seqno: the layout snapshot-marker.md first gave (purge seqno last).
_MARKER_V22_44 = struct.Struct(">QQIQQQ")
#: The value size of each V2.x snapshot marker, by its version byte (snapshot-marker.md):
#: what an encoder writes. A V2.2 value of MARKER_V22_SHORT bytes is accepted too.
MARKER_V2_VALUE_BYTES = {MarkerVersion.V2_0: _MARKER_V20.size, MarkerVersion.V2_2: _MARKER_V22.size}
MARKER_V22_SHORT = _MARKER_V22_44.size
_MUTATION_EXTRAS = struct.Struct(">QQIIIHB")
_DELETION_V1_EXTRAS = struct.Struct(">QQH")
_DELETION_V2_EXTRAS = struct.Struct(">QQIB")
_EXPIRATION_EXTRAS = struct.Struct(">QQI")
_PREPARE_EXTRAS = struct.Struct(">QQIIIBBB")
_TWO_SEQNOS = struct.Struct(">QQ")
_SYSTEM_EVENT_EXTRAS = struct.Struct(">QIB")
_FAILOVER_ENTRY = struct.Struct(">QQ")
_CACHE_RECORD = struct.Struct(">QQQIIIHBB")

# Header + extras in one struct each: the hot path of the decoder here and of the producer
# (the packers below, which dcp/active_stream.py calls per item).
MUTATION_HEAD = struct.Struct(">BBHBBHIIQQQIIIHB")
_MUTATION_HEAD_SID = struct.Struct(">BBBBBBHIIQ3sQQIIIHB")
DELETION_V2_HEAD = struct.Struct(">BBHBBHIIQQQIB")
DELETION_V1_HEAD = struct.Struct(">BBHBBHIIQQQH")
# The same layouts for the producer's packers: magic and opcode as one u16 and the fields that are
# always 0 (lock time, nmeta, nru; the deletion's nmeta / collection length) as pad bytes, because
# struct converts every argument it is given and a producer packs millions of these.
_pack_mutation_head = struct.Struct(">HHBBHIIQQQII7x").pack
_pack_deletion_v1 = struct.Struct(">HHBBHIIQQQ2x").pack
_pack_deletion_v2 = struct.Struct(">HHBBHIIQQQIx").pack
_pack_mutation_head_sid = struct.Struct(">HBBBBHIIQBHQQII7x").pack  # the same with the stream-id FrameInfo
_MUTATION_OP = int(Magic.REQUEST) << 8 | int(Opcode.DCP_MUTATION)
_MUTATION_OP_SID = int(Magic.ALT_REQUEST) << 8 | int(Opcode.DCP_MUTATION)
_SID_TAG = int(RequestFrameId.DCP_STREAM_ID) << 4 | 2  # id 2, 2 bytes
_DELETION_OP = int(Magic.REQUEST) << 8 | int(Opcode.DCP_DELETION)
_body_length = struct.Struct(">I").unpack_from
_MARKER_V1_HEAD = struct.Struct(">BBHBBHIIQQQI")
_MUT_FAST = struct.Struct(">xxHxBHIIQQQIIIxxB").unpack_from
_DEL2_FAST = struct.Struct(">xxHxBHIIQQQIx").unpack_from
_DEL1_FAST = struct.Struct(">xxHxBHIIQQQxx").unpack_from
_MARKER_FAST = struct.Struct(">xxxxxxHIIxxxxxxxxQQI").unpack_from

#: Where each field of the document messages lies in classic framing, from the frame's start, by
#: (opcode, extras length): the header's fields and the extras' under the names of the message
#: types (DcpMutation.expiration, DcpDeletion.delete_time...). Taken from the structs that encode
#: and decode them (mutation.md, deletion.md, expiration.md): a reader that addresses fields in
#: place, many frames at once (the client's Arrow decoder), reads them where the codec put them.
DOCUMENT_LAYOUTS: dict[tuple[int, int], dict[str, Field]] = {
    (Opcode.DCP_MUTATION, _MUTATION_EXTRAS.size): {**HEADER_FIELDS, **struct_fields(
        _MUTATION_EXTRAS, ("by_seqno", "rev_seqno", "flags", "expiration", "lock_time", "nmeta", "nru"), HEADER_LEN)},
    (Opcode.DCP_DELETION, _DELETION_V1_EXTRAS.size): {**HEADER_FIELDS, **struct_fields(
        _DELETION_V1_EXTRAS, ("by_seqno", "rev_seqno", "nmeta"), HEADER_LEN)},
    (Opcode.DCP_DELETION, _DELETION_V2_EXTRAS.size): {**HEADER_FIELDS, **struct_fields(
        _DELETION_V2_EXTRAS, ("by_seqno", "rev_seqno", "delete_time", "unused"), HEADER_LEN)},
    (Opcode.DCP_EXPIRATION, _EXPIRATION_EXTRAS.size): {**HEADER_FIELDS, **struct_fields(
        _EXPIRATION_EXTRAS, ("by_seqno", "rev_seqno", "delete_time"), HEADER_LEN)},
}


def _encode(opcode: int, vbucket: int = 0, opaque: int = 0, *, extras: bytes = b"", key: bytes = b"",
            value: bytes = b"", cas: int = 0, datatype: int = 0, stream_id: int | None = None) -> bytes:
    if stream_id is None:
        return encode_frame(Magic.REQUEST, opcode, key=key, extras=extras, value=value,
                            vbucket_or_status=vbucket, opaque=opaque, cas=cas, datatype=datatype)
    return encode_frame(Magic.ALT_REQUEST, opcode, key=key, extras=extras, value=value,
                        vbucket_or_status=vbucket, opaque=opaque, cas=cas, datatype=datatype,
                        framing=stream_id_frame(stream_id))


def _ok_response(opcode: int, opaque: int, status: int = Status.SUCCESS) -> bytes:
    return encode_frame(Magic.RESPONSE, opcode, vbucket_or_status=status, opaque=opaque)


_PAGES = "docs/dcp/documentation/commands/"
