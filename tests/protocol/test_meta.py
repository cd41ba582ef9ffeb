"""*WithMeta, GetMeta, ReturnMeta and MutateWithMeta (protocol/meta.py): the worked examples of
KV-Engine's set_with_meta.md, del_with_meta.md, get_meta.md and addrm/setrm/delrm.md
(https://github.com/couchbase/kv_engine/tree/master/engines/ep/docs/protocol) byte-exact both ways in
their corrected reading (each test named `..._erratum_N` states its rule), the structural rules, and
round-trips."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcpflow.protocol import kv, meta, rules
from dcpflow.protocol.datatype import Datatype, join_xattrs
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import Frame, FrameDecoder, Magic, decode_all, request
from dcpflow.protocol.meta import WithMetaOption as Opt
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status


def h(*parts: str) -> bytes:
    return bytes.fromhex("".join(parts).replace(" ", ""))


def one(data: bytes) -> Frame:
    (frame,) = decode_all(data)
    return frame


def decode(frame: Frame):
    return kv.decode_kv(frame, (meta.REQUEST_TYPES, meta.RESPONSE_TYPES))


def both_ways(msg, data: bytes) -> None:
    assert msg.encode() == data
    frame = one(data)
    assert rules.problems(frame) == []
    assert type(msg).from_frame(frame) == msg
    assert decode(frame) == msg


def reasons(frame: Frame) -> str:
    return " | ".join(e.reason for e in rules.problems(frame))


ZERO = "00000000 0000000000000000"  # opaque + CAS
META_EXTRAS_30 = "00000007 0000000a 0000000000000014 000000000000001e 00000002 0000"

# ---------------------------------------------------------------------------------------------
# set_with_meta.md

SET_WITH_META = h("80 a2 0005 1e 00 0003 0000002a", ZERO, META_EXTRAS_30, b"mykey".hex(), b"myvalue".hex())
SET_WITH_META_UPSTREAM = h("80 a2 0005 1a 00 0003 00000026", ZERO, META_EXTRAS_30, b"mykey".hex(),
                           b"myvalue".hex())


def test_set_with_meta_example_corrected_erratum_49():
    """The SetWithMeta example uses the 30-byte extras layout (flags, expiry, rev seqno, CAS, options,
    nmeta), so its extras length is 0x1E and its total body 0x2A (30 + 5-byte key + 7-byte value); the
    page's header says 0x1A and 0x26, and its last two grid rows are 60 and 64, not 50 and 54."""
    msg = meta.SetWithMeta(b"mykey", b"myvalue", flags=7, expiration=10, rev_seqno=20, meta_cas=30,
                           options=Opt.FORCE_ACCEPT_WITH_META_OPS, ext_meta=b"", vbucket=3)
    both_ways(msg, SET_WITH_META)
    assert len(SET_WITH_META) == 66 and SET_WITH_META[4] == 0x1E and SET_WITH_META[8:12] == b"\0\0\0\x2a"
    assert SET_WITH_META[54:59] == b"mykey" and SET_WITH_META[59:66] == b"myvalue"  # rows "60" and "64"
    add = msg._replace(opcode=Opcode.ADD_WITH_META)
    assert add.encode() == SET_WITH_META[:1] + b"\xa4" + SET_WITH_META[2:] and add.is_add


def test_set_with_meta_upstream_header_decodes_differently_erratum_49():
    """With the page's header (26 bytes of extras) the same bytes read differently: no options, the key
    shifted into the extras, and 4 bytes left over."""
    with pytest.raises(ProtocolError, match="trailing"):
        decode_all(SET_WITH_META_UPSTREAM)
    dec = FrameDecoder()
    dec.feed(SET_WITH_META_UPSTREAM)
    (frame,) = list(dec)
    got = meta.SetWithMeta.from_frame(frame)  # read as 26-byte extras: options vanish, key shifts
    assert got.options is None and got.ext_meta == b"" and got.key == b"\x00\x02\x00\x00m"
    assert got.value == b"ykeymyv" and dec.buffered == 4


def test_set_with_meta_response_example():
    data = h("81 a2 0000 00 00 0000 00000000 00000000 0000000000000001")
    both_ways(kv.MutationResponse(cas=1, opcode=Opcode.SET_WITH_META), data)
    both_ways(kv.MutationResponse(cas=1, opcode=Opcode.ADD_WITH_META), data[:1] + b"\xa4" + data[2:])


# ---------------------------------------------------------------------------------------------
# del_with_meta.md

DEL_WITH_META = h("80 a8 0005 1e 00 0003 00000023", ZERO, META_EXTRAS_30, b"mykey".hex())
DEL_WITH_META_UPSTREAM = h("80 a8 0005 1a 00 0003 0000001f", ZERO, META_EXTRAS_30, b"mykey".hex())


def test_del_with_meta_example_corrected_erratum_50():
    """The DelWithMeta example also uses the 30-byte extras layout (it includes options and nmeta), so
    its extras length is 0x1E and its total body 0x23; the page says 0x1A and 0x1F."""
    msg = meta.DelWithMeta(b"mykey", flags=7, delete_time=10, rev_seqno=20, meta_cas=30,
                           options=Opt.FORCE_ACCEPT_WITH_META_OPS, ext_meta=b"", vbucket=3)
    both_ways(msg, DEL_WITH_META)
    assert len(DEL_WITH_META) == 59 and DEL_WITH_META[54:59] == b"mykey"


def test_del_with_meta_upstream_header_decodes_differently_erratum_50():
    """With the page's header (26 bytes of extras) the bytes read differently and leave 4 over."""
    with pytest.raises(ProtocolError, match="trailing"):
        decode_all(DEL_WITH_META_UPSTREAM)
    dec = FrameDecoder()
    dec.feed(DEL_WITH_META_UPSTREAM)
    (frame,) = list(dec)
    got = meta.DelWithMeta.from_frame(frame)
    assert got.options is None and got.key == b"\x00\x02\x00\x00m" and dec.buffered == 4


def test_del_with_meta_response_example():
    both_ways(kv.MutationResponse(cas=1, opcode=Opcode.DEL_WITH_META),
              h("81 a8 0000 00 00 0000 00000000 00000000 0000000000000001"))


def test_force_with_meta_op_now_only_skips_conflict_resolution_erratum_50():
    """FORCE_WITH_META_OP only skips conflict resolution now (it no longer allows writes to replica or
    pending vbuckets, as del_with_meta.md still says); FORCE_ACCEPT_WITH_META_OPS does not skip it."""
    assert meta.skips_conflict_resolution(Opt.FORCE_WITH_META_OP)
    assert meta.skips_conflict_resolution(Opt.SKIP_CONFLICT_RESOLUTION)
    assert not meta.skips_conflict_resolution(Opt.FORCE_ACCEPT_WITH_META_OPS)
    assert not meta.skips_conflict_resolution(None)


# ---------------------------------------------------------------------------------------------
# Extras layouts (24, 26, 28 or 30 bytes: with options and/or nmeta) and option rules (set_with_meta.md)


@pytest.mark.parametrize("options,ext_meta,size", [(None, None, 24), (None, b"\x01\x02", 26),
                                                   (5 | 8, None, 28), (Opt.IS_EXPIRATION, b"", 30)])
def test_the_four_extras_layouts(options, ext_meta, size):
    for msg in (meta.SetWithMeta(b"k", b"doc", 1, 2, 3, 4, options, ext_meta),
                meta.DelWithMeta(b"k", 1, 2, 3, 4, options, ext_meta)):
        data = msg.encode()
        assert data[4] == size
        frame = one(data)
        assert type(msg).from_frame(frame) == msg, reasons(frame)


def test_ext_meta_is_cut_from_the_end_of_the_value_and_kept_apart():
    blob = b"\x01\x01\x00\x04abcd"  # version 1, id 1 (adjusted time), length 4
    msg = meta.SetWithMeta(b"k", b"document", 1, 2, 3, 4, options=0, ext_meta=blob)
    frame = one(msg.encode())
    assert frame.value == b"document" + blob and frame.extras[-2:] == len(blob).to_bytes(2, "big")
    got = meta.SetWithMeta.from_frame(frame)
    assert got.value == b"document" and got.ext_meta == blob


@pytest.mark.parametrize("size", [0, 8, 23, 25, 27, 29, 31, 32])
def test_other_extras_lengths_are_einval(size):
    for op in (Opcode.SET_WITH_META, Opcode.DEL_WITH_META, Opcode.ADDQ_WITH_META, Opcode.DELQ_WITH_META):
        problems = rules.problems(one(request(op, key=b"k", extras=b"\0" * size, value=b"v")))
        assert problems and problems[0].status == Status.EINVAL
        assert "extras must be 24 or 26 or 28 or 30" in problems[0].reason


def test_set_with_meta_must_have_a_key_and_may_have_an_empty_value():
    """An empty document is valid: kv_engine validates a *WithMeta value of any length."""
    extras = meta.SetWithMeta(b"k", b"v").encode()[24:48]
    for op in meta.SetWithMeta.OPCODES:
        assert rules.problems(one(request(op, key=b"k", extras=extras))) == []
    assert "must have a key" in reasons(one(request(Opcode.SET_WITH_META, extras=extras, value=b"v")))
    assert "set_with_meta.md" in reasons(one(request(Opcode.SET_WITH_META, extras=extras, value=b"v")))


def test_regenerate_cas_requires_skipping_conflict_resolution():
    bad = one(meta.SetWithMeta(b"k", b"v", options=Opt.REGENERATE_CAS).encode())
    assert "REGENERATE_CAS requires SKIP_CONFLICT_RESOLUTION" in reasons(bad)
    for skip in (Opt.SKIP_CONFLICT_RESOLUTION, Opt.FORCE_WITH_META_OP):
        ok = meta.SetWithMeta(b"k", b"v", options=Opt.REGENERATE_CAS | skip)
        assert rules.problems(one(ok.encode())) == []
    assert "REGENERATE_CAS" in reasons(one(meta.DelWithMeta(b"k", options=Opt.REGENERATE_CAS).encode()))


def test_force_accept_is_0x02_and_0x20_is_unknown_erratum_55():
    """FORCE_ACCEPT_WITH_META_OPS is option 0x02 (mutate-with-meta.md lists it as 0x20, which is no
    option at all and is reported as unknown)."""
    assert Opt.FORCE_ACCEPT_WITH_META_OPS == 0x02
    upstream = one(meta.SetWithMeta(b"k", b"v", options=0x20).encode())
    assert "unknown option bits 0x20" in reasons(upstream) and "FORCE_ACCEPT_WITH_META_OPS is 0x02" in reasons(upstream)
    assert rules.problems(one(meta.SetWithMeta(b"k", b"v", options=0x02).encode())) == []


def test_nmeta_longer_than_the_value_is_einval():
    data = bytearray(meta.SetWithMeta(b"k", b"ab", options=0, ext_meta=b"").encode())
    data[52:54] = (9).to_bytes(2, "big")
    assert "nmeta 9 is longer" in reasons(one(bytes(data)))


def test_del_with_meta_value_may_only_carry_xattrs():
    xattrs = join_xattrs({"_sync": '{"rev":"1"}'}, b"")
    ok = meta.DelWithMeta(b"k", value=xattrs, datatype=Datatype.XATTR)
    assert rules.problems(one(ok.encode())) == [] and meta.DelWithMeta.from_frame(one(ok.encode())) == ok
    with_ext = meta.DelWithMeta(b"k", options=0, ext_meta=b"\x01", value=xattrs, datatype=Datatype.XATTR)
    assert meta.DelWithMeta.from_frame(one(with_ext.encode())) == with_ext
    assert "no XATTR bit" in reasons(one(meta.DelWithMeta(b"k", value=b"body").encode()))
    body_after = meta.DelWithMeta(b"k", value=join_xattrs({"a": "b"}, b"body"), datatype=Datatype.XATTR)
    assert "4 bytes of document body" in reasons(one(body_after.encode()))
    broken = meta.DelWithMeta(b"k", value=b"\0\0\0\x09ab", datatype=Datatype.XATTR)
    assert "malformed" in reasons(one(broken.encode()))
    snappy = meta.DelWithMeta(b"k", value=b"\x05compressed", datatype=Datatype.XATTR | Datatype.SNAPPY)
    assert rules.problems(one(snappy.encode())) == []  # checked after decompression, not here


def test_with_meta_datatype_bits():
    assert "unknown bits" in reasons(one(meta.SetWithMeta(b"k", b"v", datatype=0x10).encode()))


def test_quiet_and_expiration_properties():
    assert meta.SetWithMeta(b"k", b"v", opcode=Opcode.SETQ_WITH_META).quiet
    assert meta.DelWithMeta(b"k", options=Opt.IS_EXPIRATION, opcode=Opcode.DELQ_WITH_META).is_expiration
    assert not meta.DelWithMeta(b"k").is_expiration


# ---------------------------------------------------------------------------------------------
# get_meta.md

GET_META_REQUEST = h("80 a0 0005 01 00 0003 00000006", ZERO, "02", b"mykey".hex())
GET_META_RESPONSE = h("81 a0 0000 15 00 0000 00000015 00000000 0000000000000001",
                      "00000000 00000001 00000007 0000000000000009 03")


def test_get_meta_examples_corrected_erratum_52():
    """The GetMeta request asks for the datatype with version byte 0x02 (the example has 0x01), and the
    response's datatype byte is 0x03, JSON|Snappy (the example has 0x01)."""
    req = meta.GetMeta(b"mykey", version=2, vbucket=3)
    both_ways(req, GET_META_REQUEST)
    assert req.wants_datatype
    resp = meta.GetMetaResponse(deleted=0, flags=1, expiry=7, rev_seqno=9, cas=1,
                                datatype=Datatype.JSON | Datatype.SNAPPY)
    both_ways(resp, GET_META_RESPONSE)
    assert not resp.is_deleted


def test_get_meta_upstream_bytes_decode_differently_erratum_52():
    """As printed, the request's version 1 asks for no datatype, and the response's datatype reads as
    JSON alone."""
    upstream_req = GET_META_REQUEST[:24] + b"\x01" + GET_META_REQUEST[25:]
    got = meta.GetMeta.from_frame(one(upstream_req))
    assert got.version == 1 and not got.wants_datatype  # version 1 is ignored: no datatype comes back
    upstream_resp = GET_META_RESPONSE[:-1] + b"\x01"
    assert meta.GetMetaResponse.from_frame(one(upstream_resp)).datatype == Datatype.JSON  # not JSON|Snappy


def test_get_meta_rules_and_20_byte_response():
    assert "version byte must be 1 or 2" in reasons(one(meta.GetMeta(b"k", version=3).encode()))
    assert "must have a key" in reasons(one(request(Opcode.GET_META)))
    short = meta.GetMetaResponse(1, 2, 3, 4, cas=5, opcode=Opcode.GETQ_META)
    assert short.encode()[4] == 20 and decode(one(short.encode())) == short and short.is_deleted
    assert meta.GetMeta.from_frame(one(meta.GetMeta(b"k").encode())).version is None


# ---------------------------------------------------------------------------------------------
# addrm.md / setrm.md / delrm.md (RETURN_META 0xb2)

RM_RESPONSE = h("81 b2 0000 10 00 0000 00000010 00000000 00000000000000a7",
                "00000007 4e82a97a 000000000000000e")
RM_RESPONSE_UPSTREAM = RM_RESPONSE[:6] + b"\x00\x03" + RM_RESPONSE[8:]


@pytest.mark.parametrize("op_type", [meta.ReturnMetaType.ADD, meta.ReturnMetaType.SET])
def test_addrm_setrm_examples_corrected_erratum_53(op_type):
    """The ReturnMeta add/set examples' total body is 0x18 (12 of extras + 5-byte key + 7-byte value); the
    pages say 0x14, which cuts the value and leaves 4 bytes over."""
    data = h("80 b2 0005 0c 00 0003 00000018", ZERO, f"0000000{int(op_type)} 00000007 0000000a",
             b"mykey".hex(), b"myvalue".hex())
    both_ways(meta.ReturnMeta(op_type, b"mykey", b"myvalue", flags=7, expiration=10, vbucket=3), data)
    upstream = data[:8] + (0x14).to_bytes(4, "big") + data[12:]
    dec = FrameDecoder()
    dec.feed(upstream)
    (frame,) = list(dec)
    assert meta.ReturnMeta.from_frame(frame).value == b"myv" and dec.buffered == 4


def test_delrm_example_corrected_erratum_53():
    """The ReturnMeta delete example's total body is 0x11 (12 of extras + 5-byte key); the page says 0x05,
    less than its extras and key."""
    data = h("80 b2 0005 0c 00 0003 00000011", ZERO, "00000003 00000000 00000000", b"mykey".hex())
    both_ways(meta.ReturnMeta(meta.ReturnMetaType.DEL, b"mykey", vbucket=3), data)
    upstream = data[:8] + (0x05).to_bytes(4, "big") + data[12:]
    with pytest.raises(ProtocolError, match="exceed the total body"):
        decode_all(upstream)


def test_return_meta_response_example_status_is_success_erratum_53():
    """Bytes 6-7 of a response are its status, so the ReturnMeta response examples must have 0 there; the
    pages label them "VBucket 0x0003", which would be status E2BIG."""
    msg = meta.ReturnMetaResponse(flags=7, expiration=0x4E82A97A, seqno=14, cas=0xA7)
    both_ways(msg, RM_RESPONSE)
    got = decode(one(RM_RESPONSE_UPSTREAM))  # bytes 6-7 are the status in a response: 3 is E2BIG
    assert isinstance(got, kv.RawResponse) and got.status == Status.E2BIG


def test_return_meta_rules():
    assert "op type 4" in reasons(one(meta.ReturnMeta(4, b"k").encode()))
    assert "extras must be 12" in reasons(one(request(Opcode.RETURN_META, key=b"k", extras=b"\0" * 8)))
    assert "no XATTR bit" in reasons(one(meta.ReturnMeta(3, b"k", b"body").encode()))


# ---------------------------------------------------------------------------------------------
# mutate-with-meta.md (MUTATE_WITH_META 0x4b)


def test_mutate_with_meta_layout():
    segment = json.dumps({"command": "set", "flags": "0xdeadbeef", "expiration": 3600}).encode()
    msg = meta.MutateWithMeta(b"k", b'{"body":"Hello World"}', segment, vbucket=2)
    data = msg.encode()
    assert data[4] == 4 and data[24:28] == len(segment).to_bytes(4, "big") and data.endswith(segment)
    both_ways(msg, data)
    assert msg.meta_json["command"] == "set" and msg.options == 0


def test_mutate_with_meta_rules_erratum_55():
    """MutateWithMeta's JSON options use the *WithMeta option bits (FORCE_ACCEPT_WITH_META_OPS is 0x02;
    0x20 is unknown), and its other rules: a known command, cas_offsets only with REGENERATE_CAS, no
    'cas' with it, IS_EXPIRATION only on delete, numeric options, a meta size within the value, JSON
    meta."""
    def frame(doc, doc_bytes=b"x"):
        seg = json.dumps(doc).encode()
        return one(meta.MutateWithMeta(b"k", doc_bytes, seg).encode())

    assert rules.problems(frame({"command": "add", "options": "0x04", "cas_offsets": [15]})) == []
    assert "unknown option bits 0x20" in reasons(frame({"command": "set", "options": "0x20"}))
    assert rules.problems(frame({"command": "set", "options": 2})) == []
    assert "'command' must be" in reasons(frame({"command": "upsert"}))
    assert "requires option REGENERATE_CAS" in reasons(frame({"command": "add", "cas_offsets": [1]}))
    assert "must not send 'cas'" in reasons(frame({"command": "add", "options": 4, "cas": "0x1"}))
    assert "only valid for delete" in reasons(frame({"command": "set", "options": "0x10"}))
    assert rules.problems(frame({"command": "delete", "options": "0x10"})) == []
    assert "not a number" in reasons(frame({"command": "set", "options": "fast"}))
    bad_size = one(request(Opcode.MUTATE_WITH_META, key=b"k", extras=(99).to_bytes(4, "big"), value=b"{}"))
    assert "meta size 99" in reasons(bad_size)
    not_json = one(request(Opcode.MUTATE_WITH_META, key=b"k", extras=(2).to_bytes(4, "big"), value=b"ab{x"))
    assert "not valid JSON" in reasons(not_json)


# ---------------------------------------------------------------------------------------------
# Hypothesis round-trips

u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
u64 = st.integers(0, 2**64 - 1)
keys = st.binary(min_size=1, max_size=30)
options = st.one_of(st.none(), st.sampled_from([0, 1, 2, 8, 10, 12, 13, 0x1A, 0x1F]))
ext_metas = st.one_of(st.none(), st.binary(max_size=12))
xattr_values = st.one_of(
    st.tuples(st.just(b""), st.just(0)),
    st.dictionaries(st.text("abc_", min_size=1, max_size=5), st.text("xyz", max_size=5), min_size=1,
                    max_size=3).map(lambda d: (join_xattrs(d, b""), int(Datatype.XATTR))))
segments = st.fixed_dictionaries({"command": st.sampled_from(["add", "set"])},
                                 optional={"flags": u32, "rev_seqno": st.just("0x10")}).map(
    lambda d: json.dumps(d).encode())


def _del(key, flags, dtime, rev, mcas, opts, ext, xv, cas, vb, opaque, op):
    return meta.DelWithMeta(key, flags, dtime, rev, mcas, opts, ext, xv[0], cas, vb, opaque, xv[1], op)


def _ok(msg):
    return msg._replace(status=Status.SUCCESS) if "status" in msg._fields else msg


MESSAGES = st.one_of(
    st.builds(meta.SetWithMeta, keys, st.binary(min_size=1, max_size=30), u32, u32, u64, u64, options,
              ext_metas, u64, u16, u32, st.integers(0, 7), st.sampled_from(meta.SetWithMeta.OPCODES)),
    st.builds(_del, keys, u32, u32, u64, u64, options, ext_metas, xattr_values, u64, u16, u32,
              st.sampled_from(meta.DelWithMeta.OPCODES)),
    st.builds(meta.GetMeta, keys, st.sampled_from([None, 1, 2]), u16, u32,
              st.sampled_from(meta.GetMeta.OPCODES)),
    st.builds(meta.GetMetaResponse, u32, u32, u32, u64, u64, st.one_of(st.none(), st.integers(0, 7)), u32,
              st.just(Status.SUCCESS), st.sampled_from(meta.GetMeta.OPCODES)),
    st.builds(meta.ReturnMeta, st.sampled_from([1, 2]), keys, st.binary(max_size=30), u32, u32, u64, u16, u32,
              st.integers(0, 7)),
    st.builds(meta.ReturnMeta, st.just(3), keys, st.just(b""), u32, u32, u64, u16, u32, st.just(0)),
    st.builds(meta.ReturnMetaResponse, u32, u32, u64, u64, u32),
    st.builds(meta.MutateWithMeta, keys, st.binary(max_size=30), segments, u64, u16, u32, st.integers(0, 7)),
).map(_ok)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(MESSAGES)
def test_every_meta_message_round_trips(msg):
    data = msg.encode()
    dec = FrameDecoder()
    dec.feed(data)
    (frame,) = list(dec)
    assert rules.problems(frame) == [], reasons(frame)
    assert type(msg).from_frame(frame) == msg
    assert decode(frame) == msg and frame.encode() == data


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(meta.REQUEST_TYPES) + sorted(meta.RESPONSE_TYPES)),
       st.sampled_from(list(Magic)), st.binary(max_size=34), st.binary(max_size=20), st.binary(max_size=50),
       st.integers(0, 255), u64)
def test_garbage_bodies_only_ever_raise_protocol_errors(opcode, magic, extras, key, value, datatype, cas):
    frame = Frame(magic, opcode, datatype, 0, 0, cas, b"", extras, key, value)
    try:
        msg = decode(frame)
    except ProtocolError as e:
        assert e.reason and e.status
    else:
        assert rules.problems(frame) == []
        assert msg.opcode == opcode
