"""The byte layouts the protocol hands to readers that address fields in place: the header's and
the document messages' fields (taken from the codec's structs, checked here against what the
codec encodes), the KV reply packers a server's hot paths use (against the typed replies'
encode()), the control frames read in place (marker_fields, stream_end_reason: what they accept,
decode_dcp accepts the same), the header walker of receive loops (frame_head, with walk_stream's
tables) and the set of stream messages."""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcpflow.protocol import dcp, kv
from dcpflow.protocol import frame as fr
from dcpflow.protocol.dcp import (
    DOCUMENT_LAYOUTS,
    STREAM_OPCODES,
    DcpDeletion,
    DcpExpiration,
    DcpMutation,
    DcpSnapshotMarker,
    DcpStreamEnd,
    MarkerVersion,
    decode_dcp,
    marker_fields,
    stream_end_reason,
)
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import HEADER_FIELDS, HEADER_LEN, Field, FrameDecoder, decode_all, frame_head
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

U64, U32 = 2**64 - 1, 2**32 - 1


def read(data: bytes, field: Field) -> int:
    return int.from_bytes(data[field.offset:field.stop], "big")


# -- struct_fields ---------------------------------------------------------------------------------

def test_struct_fields_follow_the_struct_items_pads_and_strings():
    fields = fr.struct_fields(struct.Struct(">BxH3sQ2x"), ("a", "b", "c", "d"), base=10)
    assert fields == {"a": Field(10, 1), "b": Field(12, 2), "c": Field(14, 3), "d": Field(17, 8)}
    assert fr.struct_fields(struct.Struct(">2HI"), ("x", "y", "z")) == {
        "x": Field(0, 2), "y": Field(2, 2), "z": Field(4, 4)}
    assert Field(17, 8).stop == 25


@pytest.mark.parametrize("fmt, names, match", [
    ("<HI", ("a", "b"), "not big-endian"),
    ("HI", ("a", "b"), "not big-endian"),
    (">HI", ("a",), "more fields than the names"),
    (">HI", ("a", "b", "c"), "one field per name"),
])
def test_struct_fields_refuse_what_has_no_wire_layout(fmt, names, match):
    with pytest.raises(ValueError, match=match):
        fr.struct_fields(struct.Struct(fmt), names)


@given(st.sampled_from([0x80, 0x81, 0x82, 0x83]), st.integers(0, 255), st.binary(max_size=9),
       st.binary(max_size=9), st.binary(max_size=9), st.integers(0, 0xFFFF), st.integers(0, U32),
       st.integers(0, U64), st.integers(0, 255))
def test_header_fields_are_where_the_encoder_puts_them(magic, opcode, key, extras, value, vbs, opaque, cas, dt):
    data = fr.encode_frame(magic, opcode, key=key, extras=extras, value=value, vbucket_or_status=vbs,
                           opaque=opaque, cas=cas, datatype=dt)
    (frame,) = decode_all(data)
    got = {name: read(data, f) for name, f in HEADER_FIELDS.items()}
    assert got == {"magic": magic, "opcode": opcode, "key_length": len(key), "extras_length": len(extras),
                   "datatype": dt, "vbucket_or_status": vbs, "body_length": frame.body_len, "opaque": opaque,
                   "cas": cas}
    assert max(f.stop for f in HEADER_FIELDS.values()) == HEADER_LEN


@st.composite
def documents(draw):
    vb, seq, rev, cas = draw(st.integers(0, 0xFFFF)), draw(st.integers(0, U64)), draw(st.integers(0, U64)), \
        draw(st.integers(0, U64))
    key, value, dt, opaque = draw(st.binary(min_size=1, max_size=12)), draw(st.binary(max_size=12)), \
        draw(st.integers(0, 7)), draw(st.integers(0, U32))
    kind = draw(st.sampled_from(["mutation", "deletion_v1", "deletion_v2", "expiration"]))
    if kind == "mutation":
        return DcpMutation(vb, seq, rev, draw(st.integers(0, U32)), draw(st.integers(0, U32)),
                           draw(st.integers(0, U32)), key, value, cas, dt, opaque, draw(st.integers(0, 255)))
    if kind == "expiration":
        return DcpExpiration(vb, seq, rev, key, draw(st.integers(0, U32)), value, cas, dt, opaque)
    delete_time = draw(st.integers(0, U32)) if kind == "deletion_v2" else None
    return DcpDeletion(vb, seq, rev, key, value, cas, dt, opaque, delete_time)


@settings(max_examples=300)
@given(documents())
def test_document_layouts_are_where_the_codec_puts_each_field(msg):
    """Every field of a layout holds, in the encoded message, the message's value of that name."""
    data = msg.encode()
    layout = DOCUMENT_LAYOUTS[(data[1], data[4])]
    header = {"magic": 0x80, "opcode": msg.opcode, "key_length": len(msg.key), "extras_length": data[4],
              "datatype": msg.datatype, "vbucket_or_status": msg.vbucket, "body_length": len(data) - HEADER_LEN,
              "opaque": msg.opaque, "cas": msg.cas, "nmeta": 0, "unused": 0}
    for name, field in layout.items():
        want = header[name] if name in header else getattr(msg, name)
        assert read(data, field) == want, name
    assert max(f.stop for f in layout.values()) == HEADER_LEN + data[4]  # the extras, all of them
    assert type(decode_dcp(decode_all(data)[0])) is type(msg)


def test_document_layouts_cover_the_document_messages_and_their_extras():
    assert set(DOCUMENT_LAYOUTS) == {(Opcode.DCP_MUTATION, 31), (Opcode.DCP_DELETION, 18),
                                     (Opcode.DCP_DELETION, 21), (Opcode.DCP_EXPIRATION, 20)}


def test_the_fused_producer_structs_are_the_header_and_the_extras():
    """The producer packs header and extras in one struct: the same layout as the two apart."""
    assert dcp.MUTATION_HEAD.format == fr.HEADER.format + dcp._MUTATION_EXTRAS.format[1:]
    assert dcp.DELETION_V1_HEAD.format == fr.HEADER.format + dcp._DELETION_V1_EXTRAS.format[1:]
    assert dcp.DELETION_V2_HEAD.format == fr.HEADER.format + dcp._DELETION_V2_EXTRAS.format[1:]


def test_stream_opcodes_are_the_messages_a_producer_sends_on_a_stream():
    assert sorted(STREAM_OPCODES) == [0x55, 0x56, 0x57, 0x58, 0x59, 0x5a, 0x5f, 0x60, 0x62, 0x63, 0x64, 0x65,
                                      0x66, 0x67]
    for connection_level in (Opcode.DCP_NOOP, Opcode.DCP_BUFFER_ACKNOWLEDGEMENT, Opcode.DCP_CONTROL,
                             Opcode.DCP_SEQNO_ACKNOWLEDGED, Opcode.DCP_SET_VBUCKET_STATE, Opcode.DCP_OPEN):
        assert connection_level not in STREAM_OPCODES


# -- the control frames read in place --------------------------------------------------------------

@st.composite
def control_frames(draw):
    """A snapshot marker or a stream end as producers send it, then maybe a byte or two changed
    (any header or body byte: version, lengths, flags, seqnos, datatype, magic)."""
    vb = draw(st.integers(0, 1023))
    if draw(st.booleans()):
        start = draw(st.integers(0, 2**64 - 1))
        end = draw(st.one_of(st.integers(start, 2**64 - 1), st.integers(0, 2**64 - 1)))
        flags = draw(st.sampled_from([1, 2, 5, 0x12, 0x25, 3, 0x40, 0]))
        version = draw(st.sampled_from([MarkerVersion.V1, MarkerVersion.V2_0, MarkerVersion.V2_2]))
        frame = DcpSnapshotMarker(vb, start, end, flags, version, draw(st.integers(0, 99)), 0,
                                  draw(st.integers(0, 2**64 - 1)), 0, opaque=7).encode()
    else:
        frame = DcpStreamEnd(vb, draw(st.integers(0, 2**32 - 1)), opaque=7).encode()
    data = bytearray(frame)
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(data) - 1))
        data[at] = draw(st.integers(0, 255))
    body = int.from_bytes(data[8:12], "big")
    return bytes(data[:24 + body]) if 24 + body <= len(data) else bytes(data)


@settings(max_examples=500, deadline=None)
@given(control_frames(), st.binary(max_size=3))
def test_control_frame_fast_paths_agree_with_the_full_decode(frame, before):
    """What the batch decoder reads in place (marker_fields, stream_end_reason) is what the
    protocol's decoder makes of the frame; where they answer None the full decode decides."""
    data = before + frame
    p = len(before)
    fields, reason = marker_fields(data, p), stream_end_reason(data, p)
    if fields is None and reason is None:
        return
    msg = decode_dcp(decode_all(frame)[0])  # must not raise: the fast path took it as valid
    if fields is not None:
        assert isinstance(msg, DcpSnapshotMarker) and reason is None
        assert fields == (msg.start_seqno, msg.end_seqno, msg.purge_seqno)
    else:
        assert isinstance(msg, DcpStreamEnd) and reason == msg.reason


@pytest.mark.parametrize("version", list(MarkerVersion))
def test_every_marker_version_in_the_canonical_shape_is_read_in_place(version):
    """V1, V2.0 and V2.2 all take the fast path (only V2.2 carries a purge seqno)."""
    data = b"\x80" * 5 + DcpSnapshotMarker(3, 10, 20, 1, version, 20, 9, 7, 8, opaque=5).encode()
    assert marker_fields(data, 5) == (10, 20, 7 if version == MarkerVersion.V2_2 else 0)
    assert stream_end_reason(data, 5) is None
    assert stream_end_reason(DcpStreamEnd(3, 4, opaque=5).encode(), 0) == 4
    assert marker_fields(DcpStreamEnd(3, 4, opaque=5).encode(), 0) is None


# -- the header walker ------------------------------------------------------------------------------

def test_frame_head_reads_what_a_receive_loop_needs():
    data = fr.response(Opcode.GET, 0x86, opaque=0xABCD, value=b"xyz") + b"\x00" * 5
    assert frame_head(data, 0, len(data)) == (0x81, Opcode.GET, 0x86, 0xABCD, HEADER_LEN + 3)
    # Not whole yet: the end lies past the bytes there are, and says how many to wait for.
    assert frame_head(data, 0, HEADER_LEN + 1) == (0x81, Opcode.GET, 0x86, 0xABCD, HEADER_LEN + 3)
    cut = bytearray(data)
    with pytest.raises(ValueError, match="no whole header"):
        frame_head(cut, 0, HEADER_LEN - 1)
    with pytest.raises(ValueError, match="no whole header"):
        frame_head(cut, 10, len(cut))
    with pytest.raises(ValueError, match="no whole header"):
        frame_head(cut, 0, len(cut) + 1)


@pytest.mark.parametrize("header, max_body", [
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 1000),  # an unknown magic
    (struct.pack(">BBHBBHIIQ", 0x80, 0x57, 0, 0, 0, 0, 1001, 0, 0), 1000),  # a body over the limit
    (struct.pack(">BBHBBHIIQ", 0x42, 0x57, 0, 0, 0, 0, 1001, 0, 0), 1000),  # both: the magic is named
])
def test_frame_head_raises_the_fatal_error_the_decoder_raises(header, max_body):
    with pytest.raises(ProtocolError) as walked:
        frame_head(header, 0, len(header), max_body)
    dec = FrameDecoder(max_body)
    dec.feed(header)
    with pytest.raises(ProtocolError) as decoded:
        list(dec)
    assert walked.value.fatal and decoded.value.fatal
    assert (walked.value.reason, walked.value.status) == (decoded.value.reason, decoded.value.status)


@given(st.lists(st.integers(0, 255), max_size=20))
def test_opcode_table_marks_exactly_the_opcodes(opcodes):
    table = fr.opcode_table(opcodes)
    assert len(table) == 256 and {op for op in range(256) if table[op]} == set(opcodes)
    assert set(table) <= {0, 1}


def test_walk_stream_and_frame_head_walk_a_receive_buffer_together():
    """The receive loop's pattern: runs of stream messages at once, each other frame on its own."""
    frames = [DcpMutation(1, 1, 1, 0, 0, 0, b"a", b"v").encode(), DcpStreamEnd(1).encode(),
              fr.response(Opcode.DCP_STREAM_REQ, opaque=9), DcpMutation(2, 5, 1, 0, 0, 0, b"b", b"w").encode(),
              fr.request(Opcode.DCP_NOOP, opaque=3)]
    data = b"".join(frames)
    table = fr.opcode_table(STREAM_OPCODES)
    pos, seen = 0, []
    while len(data) - pos >= HEADER_LEN:
        pos, run = fr.walk_stream(data, pos, table, len(data))
        seen += [("run", o) for o in struct.unpack(f"={len(run) // 8}q", run)]
        if len(data) - pos < HEADER_LEN:
            break
        magic, opcode, _, opaque, end = frame_head(data, pos, len(data))
        seen.append(("other", pos, magic, opcode, opaque))
        pos = end
    offsets = [sum(map(len, frames[:i])) for i in range(len(frames))]
    assert pos == len(data)
    assert seen == [("run", offsets[0]), ("run", offsets[1]), ("other", offsets[2], 0x81, Opcode.DCP_STREAM_REQ, 9),
                    ("run", offsets[3]), ("other", offsets[4], 0x80, Opcode.DCP_NOOP, 3)]


# -- the KV reply packers a server's hot paths use ------------------------------------------------

@settings(max_examples=60)
@given(st.sampled_from(sorted(kv.GetResponse.OPCODES)), st.integers(0, U32), st.binary(max_size=20),
       st.binary(max_size=40), st.integers(0, U64), st.integers(0, 7), st.integers(0, U32))
def test_get_response_head_packs_what_get_response_encodes(op, flags, key, value, cas, datatype, opaque):
    expected = kv.GetResponse(flags, value, cas, datatype, key, opaque, opcode=op).encode()
    head = kv.GET_RESPONSE_HEAD.pack(0x81, op, len(key), 4, datatype, 0, 4 + len(key) + len(value), opaque,
                                     cas, flags)
    assert head + key + value == expected
    assert kv.GET_RESPONSE_HEAD.size == HEADER_LEN + 4


@settings(max_examples=60)
@given(st.sampled_from(sorted(kv.MutationResponse.OPCODES)), st.integers(1, U64), st.integers(0, U64),
       st.integers(0, U64), st.integers(0, U32))
def test_mutation_response_with_token_packs_what_mutation_response_encodes(op, cas, uuid, seqno, opaque):
    expected = kv.MutationResponse(cas, uuid, seqno, opaque, opcode=op).encode()
    assert kv.MUTATION_RESPONSE_WITH_TOKEN.pack(0x81, op, 0, 16, 0, 0, 16, opaque, cas, uuid, seqno) == expected
    assert kv.MutationResponse.from_frame(decode_all(expected)[0]).mutation_token == (uuid, seqno)


@given(st.integers(0, U32), st.integers(0, U32))
def test_store_extras_are_what_store_encodes(flags, expiry):
    (frame,) = decode_all(kv.Store(b"k", b"v", flags, expiry).encode())
    assert frame.extras == kv.STORE_EXTRAS.pack(flags, expiry)
    assert kv.STORE_EXTRAS.unpack(frame.extras) == (flags, expiry)


def test_collection_id_response_is_manifest_uid_then_id():
    """Collections.md, 0xbb: extras u64 manifest id at offset 0, u32 collection id at 8; no key or value."""
    data = kv.CollectionIdResponse(0x1234, 8, 7, opcode=Opcode.COLLECTIONS_GET_ID).encode()
    assert data == bytes.fromhex("81bb0000 0c000000 0000000c 00000007 0000000000000000"
                                 "0000000000001234 00000008")
    (frame,) = decode_all(data)
    assert kv.CollectionIdResponse.from_frame(frame) == kv.CollectionIdResponse(0x1234, 8, 7)
    scope = kv.CollectionIdResponse(1, 0, opcode=Opcode.COLLECTIONS_GET_SCOPE_ID)
    assert kv.CollectionIdResponse.from_frame(decode_all(scope.encode())[0]) == scope
    error = kv.CollectionIdResponse(opaque=3, status=Status.UNKNOWN_COLLECTION)
    assert kv.CollectionIdResponse.from_frame(decode_all(error.encode())[0]) == error


def test_collection_id_response_refuses_another_shape():
    short = fr.response(Opcode.COLLECTIONS_GET_ID, extras=b"\0" * 8)
    with pytest.raises(ProtocolError, match="12 bytes of extras"):
        kv.CollectionIdResponse.from_frame(decode_all(short)[0])
    with pytest.raises(ProtocolError):
        kv.CollectionIdResponse.from_frame(decode_all(kv.GetResponse(1, b"v").encode())[0])


@given(st.sampled_from([0x80, 0x81, 0x08]), st.binary(max_size=9), st.binary(max_size=30), st.binary(max_size=50))
def test_wire_len_is_the_encoded_size(magic, extras, key, value):
    framing = fr.stream_id_frame(5) if magic == 0x08 else b""
    data = fr.encode_frame(magic, Opcode.DCP_MUTATION, key=key, extras=extras, value=value, framing=framing)
    (frame,) = decode_all(data)
    assert frame.wire_len == len(data) == HEADER_LEN + frame.body_len
