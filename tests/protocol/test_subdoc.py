"""The sub-document codec: single and multi-path requests and replies round-trip, and every rule of
kv_engine's request validator answers its status (SubDocument.md and kv_engine's status codes)."""

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcpflow.protocol import rules
from dcpflow.protocol import subdoc as sd
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import FrameDecoder, Magic, decode_all, durability_frame, encode_frame_info, request
from dcpflow.protocol.frame import RequestFrameId as F
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

O = Opcode
X = sd.PathFlag.XATTR_PATH


def one(data: bytes):
    (frame,) = decode_all(data)
    return frame


def problem(data: bytes) -> ProtocolError | None:
    found = rules.problems(one(data))
    return found[0] if found else None


# ---------------------------------------------------------------------------------------------
# wire layouts, byte for byte against the page


def test_single_path_request_layout_matches_the_page():
    """SubDocument.md "Single-Path Commands": extras = path length, flags (+ expiry) (+ doc flags);
    the value is the path then the operation's value. The page's example is DICT_UPSERT of
    "Comandante" at games.revolution.rank with MKDIR_P."""
    msg = sd.SubdocRequest(O.SUBDOC_DICT_UPSERT, b"user:hugo_chavez", b"games.revolution.rank", b'"Comandante"',
                           sd.PathFlag.MKDIR_P, vbucket=668, opaque=0xFEE5, cas=0xDEADBEEF)
    data = msg.encode()
    assert data[0] == Magic.REQUEST and data[1] == 0xC8
    assert struct.unpack(">H", data[2:4])[0] == 16 and data[4] == 3  # key length, extras length
    assert data[24:27] == b"\x00\x15\x01"  # path length 21, MKDIR_P
    assert data[27:43] == b"user:hugo_chavez" and data[43:64] == b"games.revolution.rank"
    assert data[64:] == b'"Comandante"'
    with_expiry = msg._replace(expiry=3600, doc_flags=sd.DocFlag.MKDOC).encode()
    assert with_expiry[4] == 8 and with_expiry[27:31] == struct.pack(">I", 3600) and with_expiry[31] == 1
    with_user_flags = msg._replace(expiry=0, user_flags=0x01020304).encode()
    assert with_user_flags[4] == 11 and with_user_flags[31:35] == b"\x01\x02\x03\x04"


def test_multi_path_request_layout_matches_the_page():
    """Lookup spec = opcode, flags, path length, path; mutation spec adds a u32 value length before
    the path. Multi extras = (expiry) (user flags) (doc flags)."""
    lookup = sd.SubdocMultiLookup(b"u:1234", (sd.SubdocSpec(O.SUBDOC_GET, b"from"),
                                              sd.SubdocSpec(O.SUBDOC_EXISTS, b"bcc")), doc_flags=4)
    data = lookup.encode()
    assert data[4] == 1 and data[24] == 4
    assert data[31:] == b"\xc5\x00\x00\x04from\xc6\x00\x00\x03bcc"
    mutation = sd.SubdocMultiMutation(b"u:1234", (sd.SubdocSpec(O.SUBDOC_COUNTER, b"login_count", b"1", 1),),
                                      expiry=10)
    data = mutation.encode()
    assert data[4] == 4 and data[24:28] == struct.pack(">I", 10)
    assert data[34:] == b"\xcf\x01\x00\x0b\x00\x00\x00\x01login_count1"


def test_multi_replies_match_the_page_examples():
    """Lookup results are (status u16, length u32, value); mutation results (index u8, status u16,
    and length u32 + value only on success)."""
    lookup = sd.SubdocMultiLookupResponse((sd.LookupResult(0, b'"mnunberg"'), sd.LookupResult(0xC0)), cas=5,
                                          status=Status.SUBDOC_MULTI_PATH_FAILURE)
    data = lookup.encode()
    assert struct.unpack(">H", data[6:8])[0] == 0xCC
    assert data[24:] == b"\x00\x00\x00\x00\x00\x0a\"mnunberg\"\x00\xc0\x00\x00\x00\x00"
    failed = sd.SubdocMultiMutationResponse((sd.MutationResult(1, Status.SUBDOC_PATH_MISMATCH),),
                                            status=Status.SUBDOC_MULTI_PATH_FAILURE)
    assert failed.encode()[24:] == b"\x01\x00\xc1"
    ok = sd.SubdocMultiMutationResponse((sd.MutationResult(1, 0, b"42"),), cas=9, vbucket_uuid=7, seqno=3)
    data = ok.encode()
    assert data[4] == 16 and data[24:40] == struct.pack(">QQ", 7, 3)
    assert data[40:] == b"\x01\x00\x00\x00\x00\x00\x0242"
    assert sd.SubdocMultiMutationResponse.from_frame(one(data)) == ok


# ---------------------------------------------------------------------------------------------
# round trips

u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
u64 = st.integers(0, 2**64 - 1)
keys = st.binary(min_size=1, max_size=30)
body_paths = st.text(alphabet="abcxyz.[]0123", min_size=1, max_size=20).map(str.encode)
xattr_paths = st.sampled_from([b"_sys", b"user", b"_txn.id", b"meta.a[0]", b"u1"])
json_values = st.sampled_from([b"1", b'"s"', b"[1,2]", b'{"a":null}', b"true", b"-7"])
framings = st.sampled_from([b"", encode_frame_info(F.PRESERVE_TTL), durability_frame(2)])
optional_u32 = st.one_of(st.none(), u32)


@st.composite
def mutation_specs(draw, whole_doc_ok=True):
    op = draw(st.sampled_from(sd.MUTATION_OPCODES + ((O.SET, O.DELETE) if whole_doc_ok else ())))
    traits = sd.TRAITS[op]
    xattr = not traits.whole_doc and op != O.SUBDOC_REPLACE_BODY_WITH_XATTR and draw(st.booleans())
    if op == O.SUBDOC_REPLACE_BODY_WITH_XATTR:
        xattr = True
    path = b"" if traits.whole_doc else draw(xattr_paths if xattr else body_paths)
    value = draw(json_values) if traits.has_value else b""
    flags = X if xattr else 0
    if traits.path_flags & sd.PathFlag.MKDIR_P and draw(st.booleans()):
        flags |= sd.PathFlag.MKDIR_P
    return sd.SubdocSpec(op, path, value, flags)


@st.composite
def lookup_specs(draw):
    op = draw(st.sampled_from(sd.LOOKUP_OPCODES + (O.GET,)))
    xattr = op != O.GET and draw(st.booleans())
    path = b"" if op == O.GET else draw(xattr_paths if xattr else body_paths)
    return sd.SubdocSpec(op, path, b"", X if xattr else 0)


def _xattr_first(specs):
    ordered = sorted(specs, key=lambda s: not s.xattr)
    body = [s for s in ordered if not s.xattr]
    if any(s.opcode == O.DELETE for s in body):  # a whole-document DELETE is the only body spec
        ordered = [s for s in ordered if s.xattr] + [sd.SubdocSpec(O.DELETE)]
    return tuple(ordered)


@st.composite
def single_requests(draw):
    spec = draw(st.one_of(mutation_specs(whole_doc_ok=False), lookup_specs().filter(lambda s: s.opcode != O.GET)))
    traits = sd.TRAITS[spec.opcode]
    doc_flags = 0
    expiry = user_flags = None
    if traits.mutator:
        expiry = draw(optional_u32)
        user_flags = draw(optional_u32) if expiry is not None else None
        if traits.doc_flags & sd.DocFlag.MKDOC and draw(st.booleans()):
            doc_flags = sd.DocFlag.MKDOC
    elif draw(st.booleans()):
        doc_flags = sd.DocFlag.ACCESS_DELETED
    return sd.SubdocRequest(spec.opcode, draw(keys), spec.path, spec.value, spec.flags, doc_flags, expiry,
                            user_flags, draw(u64), draw(u16), draw(u32), draw(framings))


def _multi_mutation(key, specs, mkdoc, expiry, cas, vbucket, opaque, framing):
    """MKDOC only where every spec allows it (REPLACE, DELETE... refuse it)."""
    mkdoc = mkdoc and all(sd.TRAITS[s.opcode].doc_flags & sd.DocFlag.MKDOC for s in specs)
    return sd.SubdocMultiMutation(key, specs, sd.DocFlag.MKDOC if mkdoc else 0, expiry, None, cas, vbucket, opaque,
                                  framing)


MESSAGES = st.one_of(
    single_requests(),
    st.builds(sd.SubdocMultiLookup, keys, st.lists(lookup_specs(), min_size=1, max_size=16).map(_xattr_first),
              st.sampled_from([0, sd.DocFlag.ACCESS_DELETED, sd.DocFlag.REPLICA_READ]), u16, u32, framings),
    st.builds(_multi_mutation, keys, st.lists(mutation_specs(), min_size=1, max_size=16).map(_xattr_first),
              st.booleans(), optional_u32, u64, u16, u32, framings),
    st.builds(sd.SubdocResponse, st.sampled_from(sd.SINGLE_OPCODES), st.binary(max_size=30), u64,
              st.one_of(st.none(), u64), st.just(None), st.sampled_from(sorted(sd.SINGLE_BODY_STATUSES)), u32,
              st.sampled_from([0, 1])).map(lambda r: r._replace(seqno=None if r.vbucket_uuid is None else 1)),
    st.builds(sd.SubdocMultiLookupResponse,
              st.lists(st.builds(sd.LookupResult, st.sampled_from([0, 0xC0, 0xC1, 0x24]), st.binary(max_size=20)),
                       max_size=16).map(tuple), u64, st.sampled_from(sorted(sd.LOOKUP_BODY_STATUSES)), u32),
    st.builds(lambda results, cas, token, opaque: sd.SubdocMultiMutationResponse(
        results, cas, token[0], token[1], Status.SUCCESS, opaque),
        st.lists(st.builds(sd.MutationResult, st.integers(0, 15), st.just(0), st.binary(max_size=20)),
                 max_size=4).map(tuple), u64, st.tuples(st.one_of(st.none(), u64), u64).map(
            lambda t: t if t[0] is not None else (None, None)), u32),
)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(MESSAGES, st.integers(1, 64))
def test_every_subdoc_message_round_trips(msg, chunk):
    data = msg.encode()
    dec = FrameDecoder()
    frames = []
    for i in range(0, len(data), chunk):
        dec.feed(data[i:i + chunk])
        frames.extend(dec)
    (frame,) = frames
    assert rules.problems(frame) == []
    assert type(msg).from_frame(frame) == msg
    assert frame.encode() == data


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sd.SINGLE_OPCODES + sd.MULTI_OPCODES), st.booleans(), st.binary(max_size=20),
       st.binary(max_size=8), st.binary(max_size=60), st.integers(0, 255), u64)
def test_garbage_only_ever_raises_protocol_errors(opcode, is_response, extras, key, value, datatype, cas):
    magic = Magic.RESPONSE if is_response else Magic.REQUEST
    from dcpflow.protocol.frame import Frame
    frame = Frame(magic, opcode, datatype, 0, 0, cas, b"", extras, key, value)
    types = sd.RESPONSE_TYPES if is_response else sd.REQUEST_TYPES
    try:
        msg = types[opcode].from_frame(frame)
    except ProtocolError as e:
        assert e.reason and e.status
    else:
        assert rules.problems(frame) == []
        assert msg.opcode == opcode


# ---------------------------------------------------------------------------------------------
# the validator's rules, one status each


def single(op, path=b"p", value=b"", flags=0, doc_flags=0, expiry=None, cas=0, extras=None, datatype=0, key=b"k"):
    msg = sd.SubdocRequest(op, key, path, value, flags, doc_flags, expiry, None, cas)
    if extras is None and datatype == 0:
        return msg.encode()
    default = sd._single_extras(len(path), flags, expiry, None, doc_flags)
    return request(op, key=key, extras=default if extras is None else extras, value=path + value, cas=cas,
                   datatype=datatype)


@pytest.mark.parametrize("data, status", [
    (single(O.SUBDOC_GET, datatype=1), Status.EINVAL),  # requests are raw
    (single(O.SUBDOC_GET, key=b""), Status.EINVAL),  # a key is required
    (single(O.SUBDOC_GET, extras=b"\x00\x01"), Status.EINVAL),  # extras too short
    (single(O.SUBDOC_GET, extras=b"\x00\x01\x00\x80"), Status.EINVAL),  # unknown doc flag bit
    (single(O.SUBDOC_GET, path=b"a" * 1025), Status.EINVAL),  # path over 1024 bytes
    (single(O.SUBDOC_GET, extras=b"\x00\x09\x00"), Status.EINVAL),  # path longer than the value
    (single(O.SUBDOC_GET, value=b"1"), Status.EINVAL),  # a lookup has no value
    (single(O.SUBDOC_DICT_ADD), Status.EINVAL),  # a dictionary add needs one
    (single(O.SUBDOC_GET, flags=sd.PathFlag.MKDIR_P), Status.EINVAL),  # MKDIR_P is for mutations
    (single(O.SUBDOC_GET, doc_flags=sd.DocFlag.MKDOC), Status.EINVAL),  # so is MKDOC
    (single(O.SUBDOC_DELETE, doc_flags=sd.DocFlag.MKDOC), Status.EINVAL),
    (single(O.SUBDOC_REPLACE_BODY_WITH_XATTR, path=b"x"), Status.EINVAL),  # needs XATTR_PATH
    (single(O.SUBDOC_DICT_ADD, value=b"1", doc_flags=sd.DocFlag.CREATE_AS_DELETED, flags=X), Status.EINVAL),
    (single(O.SUBDOC_DICT_ADD, value=b"1", doc_flags=sd.DocFlag.CREATE_AS_DELETED | sd.DocFlag.ADD),
     Status.EINVAL),  # CREATE_AS_DELETED needs an xattr path
    (single(O.SUBDOC_DICT_ADD, value=b"1", doc_flags=sd.DocFlag.ADD, cas=5), Status.EINVAL),
    (single(O.SUBDOC_DICT_ADD, value=b"1", flags=sd.PathFlag.EXPAND_MACROS), Status.SUBDOC_XATTR_INVALID_FLAG_COMBO),
    (single(O.SUBDOC_DICT_ADD, value=b"1", flags=sd.PathFlag.BINARY_VALUE), Status.SUBDOC_XATTR_INVALID_FLAG_COMBO),
    (single(O.SUBDOC_DICT_ADD, b"x", b'"${Mutation.CAS}"', X | sd.PathFlag.BINARY_VALUE | sd.PathFlag.EXPAND_MACROS),
     Status.SUBDOC_XATTR_INVALID_FLAG_COMBO),
    (single(O.SUBDOC_GET, b"!bad", flags=X), Status.XATTR_EINVAL),
    (single(O.SUBDOC_GET, b"a" * 16, flags=X), Status.XATTR_EINVAL),
    (single(O.SUBDOC_GET, b"_.x", flags=X), Status.XATTR_EINVAL),
    (single(O.SUBDOC_DICT_UPSERT, b"$document.x", b"1", X), Status.SUBDOC_XATTR_CANT_MODIFY_VATTR),
    (single(O.SUBDOC_DICT_UPSERT, b"x", b'"${Mutation.bogus}"', X | sd.PathFlag.EXPAND_MACROS),
     Status.SUBDOC_XATTR_UNKNOWN_MACRO),
    (single(O.SUBDOC_GET, b""), Status.EINVAL),  # GET needs a path
    (single(O.SUBDOC_GET, expiry=5), Status.EINVAL),  # a lookup's extras are 3 or 4 bytes
    (single(O.SUBDOC_DICT_UPSERT, b"x", b'"${Mutation.seqno}"', X | sd.PathFlag.EXPAND_MACROS), None),
    (single(O.SUBDOC_DICT_UPSERT, b"x", b'"${$document.CAS}"', X | sd.PathFlag.EXPAND_MACROS), None),
    (single(O.SUBDOC_GET, b"$document.exptime", flags=X), None),
    (single(O.SUBDOC_ARRAY_PUSH_LAST, b"", b"1"), None),  # array ops may name the root
    (single(O.SUBDOC_GET_COUNT, b""), None),
])
def test_single_path_rules(data, status):
    found = problem(data)
    assert (found.status if found else None) == status, found
    if status is not None:
        with pytest.raises(ProtocolError):
            sd.SubdocRequest.from_frame(one(data))


def multi(op, specs, extras=b"", cas=0):
    mutation = op == O.SUBDOC_MULTI_MUTATION
    return request(op, key=b"k", extras=extras, cas=cas, value=b"".join(s.encode(mutation) for s in specs))


G = sd.SubdocSpec(O.SUBDOC_GET, b"a")
U = sd.SubdocSpec(O.SUBDOC_DICT_UPSERT, b"a", b"1")
XU = sd.SubdocSpec(O.SUBDOC_DICT_UPSERT, b"_x", b"1", X)
L, M = O.SUBDOC_MULTI_LOOKUP, O.SUBDOC_MULTI_MUTATION


@pytest.mark.parametrize("data, status", [
    (multi(L, [G], extras=b"\x00\x00\x00\x05"), Status.EINVAL),  # a lookup takes no expiry
    (multi(M, [U], extras=b"\x00\x00"), Status.EINVAL),
    (multi(M, [U], extras=b"\x02", cas=1), Status.EINVAL),  # ADD with a CAS
    (multi(M, [U], extras=b"\x03"), Status.EINVAL),  # ADD | MKDOC
    (multi(M, [U], extras=b"\x10"), Status.EINVAL),  # REVIVE without ACCESS_DELETED
    (multi(M, [U], extras=b"\x1c"), Status.EINVAL),  # REVIVE with CREATE_AS_DELETED
    (multi(L, []), Status.SUBDOC_INVALID_COMBO),  # no spec
    (multi(L, [G] * 17), Status.SUBDOC_INVALID_COMBO),  # more than 16
    (multi(L, [U]), Status.SUBDOC_INVALID_COMBO),  # a mutation in a lookup
    (multi(M, [G]), Status.SUBDOC_INVALID_COMBO),  # a lookup in a mutation
    (multi(L, [sd.SubdocSpec(O.SUBDOC_MULTI_LOOKUP, b"a")]), Status.SUBDOC_INVALID_COMBO),
    (multi(M, [U, XU]), Status.SUBDOC_INVALID_XATTR_ORDER),  # xattrs first
    (multi(M, [U, sd.SubdocSpec(O.DELETE)]), Status.SUBDOC_INVALID_COMBO),  # DELETE stands alone on the body
    (multi(M, [sd.SubdocSpec(O.DELETE), U]), Status.SUBDOC_INVALID_COMBO),
    (multi(M, [sd.SubdocSpec(O.SET, b"a", b"{}")]), Status.EINVAL),  # whole-document ops have no path
    (multi(M, [sd.SubdocSpec(O.SET, b"", b"")]), Status.EINVAL),  # SET needs a value
    (multi(M, [sd.SubdocSpec(O.SUBDOC_DELETE, b"a", b"1")]), Status.EINVAL),  # DELETE takes none
    (multi(M, [U], extras=b"\x20"), Status.EINVAL),  # REPLICA_READ is for lookups
    (multi(L, [G], extras=b"\x01"), Status.EINVAL),  # MKDOC is for mutations
    (request(M, key=b"k", value=b"\xc8\x00\x00\x05\x00\x00\x00\x01ab"), Status.EINVAL),  # truncated spec
    (multi(L, [sd.SubdocSpec(O.SUBDOC_GET, b"$bad.x", b"", X | sd.PathFlag.MKDIR_P)]), Status.EINVAL),
    (multi(M, [XU, sd.SubdocSpec(O.DELETE)]), None),
    (multi(L, [sd.SubdocSpec(O.SUBDOC_GET, b"$document", b"", X), sd.SubdocSpec(O.GET)], extras=b"\x24"), None),
    (multi(L, [G] * 16), None),
])
def test_multi_path_rules(data, status):
    found = problem(data)
    assert (found.status if found else None) == status, found


def test_xattr_keys_follow_extended_attributes_md():
    assert sd.xattr_key_of(b"_txn.id[0]") == b"_txn" and sd.xattr_key_of(b"meta[2].x") == b"meta"
    assert sd.xattr_key_of(b"a]b.c") == b"a]b"  # ']' has no meaning while scanning the key
    for key in (b"$", b"_", b"", b"k" * 16, b"#x", b"\x01x"):
        assert problem(single(O.SUBDOC_GET, key, flags=X)).status == Status.XATTR_EINVAL


def test_decode_message_types_sub_document_and_range_scan_frames():
    from dcpflow.protocol import range_scan as rs
    from dcpflow.protocol.messages import decode_message
    partial = sd.SubdocMultiLookupResponse((sd.LookupResult(0, b"1"), sd.LookupResult(0xC0)), 5,
                                           Status.SUBDOC_MULTI_PATH_FAILURE, 3)
    assert decode_message(one(partial.encode())) == partial
    more = rs.RangeScanContinueResponse(True, (b"a", b"b"), (), Status.RANGE_SCAN_MORE, 4)
    assert decode_message(one(more.encode())) == more
    req = sd.SubdocMultiMutation(b"k", (sd.SubdocSpec(O.SUBDOC_COUNTER, b"n", b"1"),))
    assert decode_message(one(req.encode())) == req
    assert decode_message(one(rs.RangeScanCancel(1, b"\x00" * 16).encode())) == rs.RangeScanCancel(1, b"\x00" * 16)
