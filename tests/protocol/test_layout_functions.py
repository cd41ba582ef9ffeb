"""The byte layouts other layers used to spell by hand, now protocol functions (issue 44 point 4):
the xattr section's length prefix and pairs, the durability FrameInfo, the mutation token, whole
reply headers, the sub-document spec heads, the stream-id FrameInfo, a header field read in place
and the ${Mutation.CAS} macro's byte order. Each is checked against the codec that already
encodes the same bytes, both ways, over generated inputs."""

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from dcpflow.engine.item import retain_system_xattrs
from dcpflow.protocol import kv
from dcpflow.protocol import subdoc as sd
from dcpflow.protocol.datatype import (
    DATATYPE_JSON,
    DATATYPE_SNAPPY,
    DATATYPE_XATTR,
    Datatype,
    join_xattrs,
    pack_xattr_pair,
    pack_xattr_section,
    split_xattrs,
    xattr_body_offset,
    xattr_pair_spans,
)
from dcpflow.protocol.frame import (
    HEADER,
    HEADER_FIELDS,
    RequestFrameId,
    check_request_frame_infos,
    decode_all,
    decode_frame_infos,
    durability_frame,
    parse_durability,
    parse_stream_id,
    stream_id_frame,
)
from dcpflow.protocol.opcodes import Opcode

U16, U32, U64 = 2**16 - 1, 2**32 - 1, 2**64 - 1
_names = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="\x00"), min_size=1,
                 max_size=12)
_xattrs = st.dictionaries(_names, st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20),
                         max_size=5)


def test_the_plain_datatype_bits_are_the_enums():
    assert (DATATYPE_JSON, DATATYPE_SNAPPY, DATATYPE_XATTR) == (Datatype.JSON, Datatype.SNAPPY, Datatype.XATTR)
    assert all(type(b) is int for b in (DATATYPE_JSON, DATATYPE_SNAPPY, DATATYPE_XATTR))  # no enum __rand__


@given(_xattrs, st.binary(max_size=40))
def test_the_body_offset_is_where_split_xattrs_finds_the_body(xattrs, body):
    value = join_xattrs(xattrs, body)
    offset = xattr_body_offset(value)
    assert value[offset:] == body == split_xattrs(value)[1]
    assert split_xattrs(value)[0] == xattrs


@given(_xattrs, st.binary(max_size=40))
def test_packed_pairs_and_section_are_join_xattrs(xattrs, body):
    pairs = [pack_xattr_pair(k.encode(), v.encode()) for k, v in xattrs.items()]
    value = pack_xattr_section(b"".join(pairs)) + body
    assert value == join_xattrs(xattrs, body)
    spans = list(xattr_pair_spans(value))
    assert [value[s:e] for s, e in spans] == pairs


@given(st.binary(max_size=60))
def test_pair_spans_stay_inside_a_damaged_value(value):
    """A section claiming more than the value holds, or a truncated pair, ends the walk: the spans
    start inside the value and follow each other."""
    pos = 4
    for start, end in xattr_pair_spans(value):
        assert start == pos and start + 4 <= len(value) and end >= start + 4
        pos = end


@given(st.dictionaries(st.sampled_from(["_sys", "_txn", "user", "meta", "_x"]), st.sampled_from(['1', '"a"']),
                       max_size=5), st.binary(max_size=20))
def test_a_deletion_keeps_exactly_the_system_xattrs(xattrs, body):
    value, datatype = retain_system_xattrs(join_xattrs(xattrs, body), DATATYPE_XATTR | DATATYPE_JSON)
    system = {k: v for k, v in xattrs.items() if k.startswith("_")}
    if not system:
        assert (value, datatype) == (b"", 0)
    else:
        assert datatype == DATATYPE_XATTR and split_xattrs(value) == (system, b"")


@given(st.integers(1, 3), st.one_of(st.none(), st.integers(1, U16 - 1)))
def test_parse_durability_inverts_durability_frame(level, timeout_ms):
    framing = durability_frame(level, timeout_ms)
    assert check_request_frame_infos(framing) == []
    ((fid, payload),) = decode_frame_infos(framing)
    assert fid == RequestFrameId.DURABILITY
    assert parse_durability(payload) == (level, timeout_ms)


@given(st.integers(0, U64), st.integers(0, U64))
def test_a_mutation_token_round_trips_through_the_reply_extras(uuid, seqno):
    token = kv.MutationToken(uuid, seqno)
    assert kv.MutationToken.from_extras(token.encode()) == token
    (frame,) = decode_all(kv.MutationResponse(1, uuid, seqno).encode())
    assert kv.MutationToken.from_extras(frame.extras) == token
    assert kv.MutationToken.from_extras(b"") is None


@settings(max_examples=60)
@given(st.sampled_from(sorted(kv.MutationResponse.OPCODES)), st.integers(1, U64), st.integers(0, U32),
       st.one_of(st.none(), st.tuples(st.integers(0, U64), st.integers(0, U64))))
def test_reply_packers_give_mutation_response_bytes(op, cas, opaque, token):
    if token is None:
        packed = kv.pack_response(op, opaque, cas)
        expected = kv.MutationResponse(cas, None, None, opaque, opcode=op).encode()
    else:
        packed = kv.pack_mutation_response(op, opaque, cas, *token)
        expected = kv.MutationResponse(cas, *token, opaque, opcode=op).encode()
    assert packed == expected
    assert kv.decode_kv(decode_all(packed)[0]) == kv.MutationResponse(cas, *(token or (None, None)), opaque,
                                                                       opcode=op)


@settings(max_examples=60)
@given(st.sampled_from(sorted(kv.GetResponse.OPCODES)), st.integers(0, U32), st.binary(max_size=20),
       st.binary(max_size=40), st.integers(0, U64), st.integers(0, 7), st.integers(0, U32))
def test_the_get_head_packer_gives_get_response_bytes(op, flags, key, value, cas, datatype, opaque):
    head = kv.pack_get_response_head(op, opaque, cas, flags, datatype, len(key), len(value))
    assert head + key + value == kv.GetResponse(flags, value, cas, datatype, key, opaque, opcode=op).encode()


@given(st.sampled_from([0, 1, 2, 0x10]), st.integers(0, 255), st.binary(min_size=1, max_size=30),
       st.binary(max_size=30))
def test_spec_heads_read_what_a_spec_encodes(flags, opcode, path, value):
    lookup = sd.SubdocSpec(opcode, path, b"", flags).encode(False)
    assert sd.LOOKUP_SPEC_HEAD.unpack_from(lookup) == (opcode, flags, len(path))
    assert lookup[sd.LOOKUP_SPEC_HEAD.size:] == path
    mutation = sd.SubdocSpec(opcode, path, value, flags).encode(True)
    assert sd.MUTATION_SPEC_HEAD.unpack_from(mutation) == (opcode, flags, len(path), len(value))
    assert mutation[sd.MUTATION_SPEC_HEAD.size:] == path + value
    assert sd.MUTATION_SPEC_HEAD.size == struct.calcsize(">BBHI") and Opcode.SUBDOC_GET in sd.LOOKUP_OPCODES


@given(sid=st.integers(1, 0xFFFF))
def test_parse_stream_id_inverts_stream_id_frame(sid):
    ((fid, payload),) = decode_frame_infos(stream_id_frame(sid))
    assert fid == RequestFrameId.DCP_STREAM_ID and parse_stream_id(payload) == sid
    assert parse_stream_id(payload + b"\x00") is None and parse_stream_id(payload[:1]) is None


@given(fields=st.tuples(st.sampled_from([0x80, 0x81]), st.integers(0, 255), st.integers(0, 0xFFFF),
                        st.integers(0, 255), st.integers(0, 255), st.integers(0, 0xFFFF),
                        st.integers(0, 0xFFFFFFFF), st.integers(0, 0xFFFFFFFF), st.integers(0, (1 << 64) - 1)),
       lead=st.binary(max_size=9))
def test_a_field_reads_what_its_struct_packs_at_any_base(fields, lead):
    """Field.read (a reader addressing a frame in place, as client/follow.py does) against the
    struct the codec packs the header with."""
    data = lead + HEADER.pack(*fields)
    assert [f.read(data, len(lead)) for f in HEADER_FIELDS.values()] == list(fields)


@given(cas=st.integers(0, (1 << 64) - 1))
def test_the_cas_macro_is_the_cas_bytes_read_little_endian(cas):
    text = sd.cas_macro_text(cas)
    assert text[:3] == b'"0x' and text[-1:] == b'"' and len(text) == 20
    assert int(text[3:-1], 16) == struct.unpack("<Q", struct.pack(">Q", cas))[0]


def test_the_cas_macro_of_a_known_cas():
    assert sd.cas_macro_text(0x0102030405060708) == b'"0x0807060504030201"'
