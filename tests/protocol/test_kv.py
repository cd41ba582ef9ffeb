"""Session and KV commands (the protocol.kv package): every worked example of KV-Engine's BinaryProtocol.md,
sasl.md, Collections.md (https://github.com/couchbase/kv_engine/tree/master/docs), get_seqno.md and
persist_seqno.md (https://github.com/couchbase/kv_engine/tree/master/docs/dcp/documentation/commands)
byte-exact both ways in its corrected reading, the errata that correct them (each test named
`..._erratum_N` states its rule), the structural rules, and hypothesis round-trips of every message
type."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcpflow.protocol import dcp, kv, rules
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import (
    Frame,
    FrameDecoder,
    Magic,
    RequestFrameId,
    decode_all,
    durability_frame,
    encode_frame_info,
    request,
    response,
)
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.keys import make_key, split_key
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status, status_name


def h(*parts: str) -> bytes:
    """Bytes from hex groups written as the pages lay them out (spaces ignored)."""
    return bytes.fromhex("".join(parts).replace(" ", ""))


def one(data: bytes) -> Frame:
    (frame,) = decode_all(data)
    return frame


def both_ways(msg, data: bytes) -> None:
    """The page's bytes decode to the message, and the message encodes to the page's bytes."""
    assert msg.encode() == data
    frame = one(data)
    assert rules.problems(frame) == []
    assert type(msg).from_frame(frame) == msg
    assert kv.decode_kv(frame) == msg


def reasons(frame: Frame) -> str:
    return " | ".join(e.reason for e in rules.problems(frame))


ZERO_CAS = "0000000000000000"

# ---------------------------------------------------------------------------------------------
# BinaryProtocol.md worked examples


def test_error_response_example_not_found():
    data = h("81 00 0000 00 00 0001 00000009 00000000", ZERO_CAS, "4e6f7420666f756e64")
    msg = kv.RawResponse(Opcode.GET, Status.KEY_ENOENT, b"Not found")
    both_ways(msg, data)
    assert msg.context == "Not found" and msg.cluster_map is None


def test_get_request_example():
    both_ways(kv.Get(b"Hello"), h("80 00 0005 00 00 0000 00000005 00000000", ZERO_CAS, "48656c6c6f"))


def test_get_request_key_is_five_bytes_at_24_to_28_erratum_44():
    """The Get request example's 5-byte key "Hello" sits at 24-28 (the page says 24-29)."""
    data = kv.Get(b"Hello").encode()
    assert len(data) == 29 and data[24:29] == b"Hello"


def test_get_response_example():
    data = h("81 00 0000 04 00 0000 00000009 00000000 0000000000000001", "deadbeef", "576f726c64")
    both_ways(kv.GetResponse(flags=0xDEADBEEF, value=b"World", cas=1), data)


GETK_RESPONSE = h("81 0c 0005 04 00 0000 0000000e 00000000 0000000000000001", "deadbeef", "48656c6c6f",
                  "576f726c64")


def test_getk_response_example_corrected_erratum_44():
    """The GetK response example is 38 bytes: 4 bytes of flags, the 5-byte key and the 5-byte value make a
    total body of 0x0E, and the opcode is GetK's 0x0C (the page has total body 0x09 and opcode 0x00)."""
    msg = kv.GetResponse(flags=0xDEADBEEF, value=b"World", cas=1, key=b"Hello", opcode=Opcode.GET_K)
    both_ways(msg, GETK_RESPONSE)
    assert len(GETK_RESPONSE) == 38


def test_getk_response_upstream_bytes_decode_differently_erratum_44():
    """The GetK response bytes as printed (total body 0x09) leave bytes over that make no frame."""
    upstream = h("81 00 0005 04 00 0000 00000009 00000000 0000000000000001", "deadbeef", "48656c6c6f",
                 "576f726c64")
    with pytest.raises(ProtocolError, match="trailing"):
        decode_all(upstream)
    dec = FrameDecoder()
    dec.feed(upstream)
    (frame,) = list(dec)
    got = kv.GetResponse.from_frame(frame)
    assert got.opcode == Opcode.GET and got.key == b"Hello" and got.value == b""  # "World" is left over
    assert dec.buffered == 5


def test_getk_response_must_carry_the_key_erratum_44():
    """A GetK response must carry the key (that is what GetK adds to Get)."""
    frame = one(response(Opcode.GET_K, extras=b"\0\0\0\0", value=b"v", cas=1))
    assert "must carry the key" in reasons(frame) and "K forms" in reasons(frame)


def test_add_request_example():
    data = h("80 02 0005 08 00 0000 00000012 00000000", ZERO_CAS, "deadbeef 00000e10", "48656c6c6f576f726c64")
    both_ways(kv.Store(b"Hello", b"World", flags=0xDEADBEEF, expiry=0xE10, opcode=Opcode.ADD), data)


def test_add_response_example():
    both_ways(kv.MutationResponse(cas=1, opcode=Opcode.ADD),
              h("81 02 0000 00 00 0000 00000000 00000000 0000000000000001"))


def test_delete_request_example():
    both_ways(kv.Delete(b"Hello"), h("80 04 0005 00 00 0000 00000005 00000000", ZERO_CAS, "48656c6c6f"))


def test_increment_request_example():
    data = h("80 05 0007 14 00 0000 0000001b 00000000", ZERO_CAS,
             "0000000000000001 0000000000000000 00000e10", "636f756e746572")
    both_ways(kv.Arithmetic(b"counter", delta=1, initial=0, expiry=0xE10), data)


def test_increment_response_example():
    data = h("81 05 0000 00 00 0000 00000008 00000000 0000000000000005", "0000000000000000")
    both_ways(kv.ArithmeticResponse(value=0, cas=5), data)


def test_quit_request_example():
    both_ways(kv.Quit(), h("80 07 0000 00 00 0000 00000000 00000000", ZERO_CAS))


def test_noop_request_example_and_reply():
    data = h("80 0a 0000 00 00 0000 00000000 00000000", ZERO_CAS)
    both_ways(kv.Noop(), data)
    reply = one(kv.Noop(opaque=7).response())
    assert reply.magic == Magic.RESPONSE and reply.opcode == 0x0A and reply.opaque == 7
    assert kv.decode_kv(reply) == kv.RawResponse(Opcode.NOOP, Status.SUCCESS, opaque=7)


def test_version_request_and_response_examples():
    both_ways(kv.Version(), h("80 0b 0000 00 00 0000 00000000 00000000", ZERO_CAS))
    both_ways(kv.VersionResponse("1.3.1"),
              h("81 0b 0000 00 00 0000 00000005 00000000", ZERO_CAS, "312e332e31"))


def test_append_request_example():
    both_ways(kv.Concat(b"Hello", b"!"),
              h("80 0e 0005 00 00 0000 00000006 00000000", ZERO_CAS, "48656c6c6f21"))


def test_stat_request_and_response_examples():
    both_ways(kv.Stat(), h("80 10 0000 00 00 0000 00000000 00000000", ZERO_CAS))
    both_ways(kv.StatResponse(b"pid", b"3078"), h("81 10 0003 00 00 0000 00000007 00000000", ZERO_CAS,
                                                  "706964 33303738"))


HELLO_REQUEST = h("80 1f 000c 00 00 0000 00000016 00000000", ZERO_CAS, "6d6368656c6c6f2076312e30",
                  "0001 0002 0003 0004 0005")
HELLO_RESPONSE = h("81 1f 0000 00 00 0000 00000004 00000000", ZERO_CAS, "0003 0004")


def test_hello_request_and_response_examples():
    both_ways(kv.Hello(b"mchello v1.0", (1, 2, 3, 4, 5)), HELLO_REQUEST)
    both_ways(kv.HelloResponse((Feature.TCP_NODELAY, Feature.MUTATION_SEQNO)), HELLO_RESPONSE)
    assert kv.Hello.from_frame(one(HELLO_REQUEST)).agent_name == "mchello v1.0"


def test_hello_example_asks_for_retired_features_and_gets_them_refused_erratum_46():
    """The HELLO example asks for retired features (0x0001 Datatype, 0x0005 TCP delay); a server grants
    none of them."""
    hello = kv.Hello.from_frame(one(HELLO_REQUEST))
    assert hello.retired_features == (Feature.DATATYPE_RETIRED, Feature.TLS, Feature.TCP_DELAY)
    granted = kv.negotiate(hello.features, list(Feature))  # a server implementing every live feature
    assert granted == (Feature.TCP_NODELAY, Feature.MUTATION_SEQNO)
    assert kv.HelloResponse(granted).encode() == HELLO_RESPONSE


def test_list_buckets_examples_echo_the_opaque_bytes_erratum_45():
    """The ListBuckets examples' opaque bytes are `ef be ad de` (the table calls it 0xdeadbeef): the opaque
    is four bytes echoed as they came, so the bytes are what counts."""
    req = h("80 87 0000 00 00 0000 00000000 efbeadde", ZERO_CAS)
    resp = h("81 87 0000 00 00 0000 0000001b efbeadde", ZERO_CAS, b"engineering marketing sales".hex())
    both_ways(kv.ListBuckets(opaque=0xEFBEADDE), req)
    both_ways(kv.ListBucketsResponse(("engineering", "marketing", "sales"), opaque=0xEFBEADDE), resp)
    # The response table's "0xdeadbeef" is not what the bytes say, and would not match the request.
    assert one(resp).opaque != 0xDEADBEEF
    assert kv.ListBucketsResponse(("engineering", "marketing", "sales"), opaque=0xDEADBEEF).encode() != resp


def test_select_bucket_example():
    data = h("80 89 000b 00 00 0000 0000000b efbeadde", ZERO_CAS, b"engineering".hex())
    both_ways(kv.SelectBucket(b"engineering", opaque=0xEFBEADDE), data)


# ---------------------------------------------------------------------------------------------
# sasl.md worked examples


def test_sasl_list_mechs_examples():
    both_ways(kv.SaslListMechs(), h("80 20 0000 00 00 0000 00000000 00000000", ZERO_CAS))
    resp = h("81 20 0000 00 00 0000 00000019 00000000", ZERO_CAS, b"SCRAM-SHA1 CRAM-MD5 PLAIN".hex())
    both_ways(kv.SaslListMechsResponse(("SCRAM-SHA1", "CRAM-MD5", "PLAIN")), resp)


def test_sasl_plain_session_example():
    req = h("80 21 0005 00 00 0000 00000011 00000000", ZERO_CAS, b"PLAIN\x00user\x00pencil".hex())
    both_ways(kv.SaslAuth(b"PLAIN", b"\x00user\x00pencil"), req)
    both_ways(kv.SaslResponse(), h("81 21 0000 00 00 0000 00000000 00000000", ZERO_CAS))


SCRAM_CLIENT_FIRST = b"n,,n=user,r=d40a02e348040590"
SCRAM_SERVER_FIRST = b"r=d40a02e348040590ec8ac784d46faf9d,s=fw3GRQYlFy6QEqT5y7Of4XbGaGg=,i=10"
SCRAM_CLIENT_FINAL = b"c=biws,r=d40a02e348040590ec8ac784d46faf9d,p=co6kWwNhpVYuuFHWQv5VVcWrPJM="
SCRAM_SERVER_FINAL = b"v=inZJ2d0Ms4dnENnHwPaqVfNn7DY="


def test_sasl_scram_session_example_with_auth_continue():
    auth = h("80 21 000a 00 00 0000 00000026 00000000", ZERO_CAS, (b"SCRAM-SHA1" + SCRAM_CLIENT_FIRST).hex())
    both_ways(kv.SaslAuth(b"SCRAM-SHA1", SCRAM_CLIENT_FIRST), auth)
    challenge = h("81 21 0000 00 00 0021 00000046 00000000", ZERO_CAS, SCRAM_SERVER_FIRST.hex())
    msg = kv.SaslResponse(SCRAM_SERVER_FIRST, Status.AUTH_CONTINUE)
    both_ways(msg, challenge)
    assert msg.is_continue
    step = h("80 22 000a 00 00 0000 00000052 00000000", ZERO_CAS, (b"SCRAM-SHA1" + SCRAM_CLIENT_FINAL).hex())
    both_ways(kv.sasl_step(b"SCRAM-SHA1", SCRAM_CLIENT_FINAL), step)
    final = h("81 22 0000 00 00 0000 0000001e 00000000", ZERO_CAS, SCRAM_SERVER_FINAL.hex())
    both_ways(kv.SaslResponse(SCRAM_SERVER_FINAL, opcode=Opcode.SASL_STEP), final)


def test_sasl_auth_error_decodes_as_raw_response():
    frame = one(kv.error_response(Opcode.SASL_AUTH, Status.AUTH_ERROR, opaque=3,
                                  context="Authentication failed"))
    msg = kv.decode_kv(frame)
    assert isinstance(msg, kv.RawResponse) and msg.status == Status.AUTH_ERROR
    assert msg.context == "Authentication failed"


def test_sasl_auth_without_mechanism_is_einval():
    frame = one(request(Opcode.SASL_AUTH, value=b"x"))
    assert "must have a key" in reasons(frame) and "sasl.md" in reasons(frame)


# ---------------------------------------------------------------------------------------------
# Collections.md


COLLECTIONS_ADD = h("80 02 0007 08 00 0000 00000014 00000000", ZERO_CAS, "deadbeef 00000e10", "ab04",
                    "48656c6c6f", "576f726c64")


def test_collections_add_example_corrected_erratum_47():
    """The Collections ADD example's "collection-ID 555" is decimal (0x22B, LEB128 `ab 04`), and its total
    body is 0x14 (8 of extras + the 7-byte key with its prefix + the 5-byte value), not 0x12."""
    key = make_key(b"Hello", 555)
    assert key[:2] == b"\xab\x04"  # "collection-ID 555" is decimal: 0x22b
    both_ways(kv.Store(key, b"World", 0xDEADBEEF, 0xE10, opcode=Opcode.ADD), COLLECTIONS_ADD)
    assert split_key(kv.Store.from_frame(one(COLLECTIONS_ADD)).key) == (555, b"Hello")
    assert len(COLLECTIONS_ADD) == 44


def test_collections_add_upstream_total_body_decodes_differently_erratum_47():
    """The Collections ADD example with the printed total body 0x12 leaves bytes over that make no frame."""
    upstream = COLLECTIONS_ADD[:8] + (0x12).to_bytes(4, "big") + COLLECTIONS_ADD[12:]
    with pytest.raises(ProtocolError, match="trailing"):
        decode_all(upstream)
    dec = FrameDecoder()
    dec.feed(upstream)
    (frame,) = list(dec)
    assert kv.Store.from_frame(frame).value == b"Wor" and dec.buffered == 2


# ---------------------------------------------------------------------------------------------
# get_seqno.md (GET_ALL_VB_SEQNOS 0x48) and persist_seqno.md (SEQNO_PERSISTENCE 0xb7)

DEADBEEF_HEADER = "deadbeef" + ZERO_CAS


@pytest.mark.parametrize("msg,data", [
    (kv.GetAllVbSeqnos(opaque=0xDEADBEEF), h("80 48 0000 00 00 0000 00000000", DEADBEEF_HEADER)),
    (kv.GetAllVbSeqnos(kv.VbucketStateFilter.REPLICA, opaque=0xDEADBEEF),
     h("80 48 0000 04 00 0000 00000004", DEADBEEF_HEADER, "00000002")),
    (kv.GetAllVbSeqnos(0, 0xCAFEF00D, opaque=0xDEADBEEF),
     h("80 48 0000 08 00 0000 00000008", DEADBEEF_HEADER, "00000000 cafef00d")),
    (kv.GetAllVbSeqnos(2, 0xCAFEF00D, opaque=0xDEADBEEF),
     h("80 48 0000 08 00 0000 00000008", DEADBEEF_HEADER, "00000002 cafef00d")),
], ids=["alive", "replica", "collection", "replica+collection"])
def test_get_all_vb_seqnos_request_examples(msg, data):
    both_ways(msg, data)


def test_get_all_vb_seqnos_response_example():
    data = h("81 48 0000 00 00 0000 00000028", DEADBEEF_HEADER, "000a 0000000000005432",
             "000d 0000000001343214", "007f 0000000000000004", "02d0 0000000000006524")
    msg = kv.GetAllVbSeqnosResponse(((10, 21554), (13, 20197908), (127, 4), (720, 25892)), opaque=0xDEADBEEF)
    both_ways(msg, data)
    assert msg.as_dict()[720] == 25892


def test_get_seqno_example_4_total_body_is_8_not_0x80_erratum_33():
    """GET_ALL_VB_SEQNOS example 4's total body is 8 (its bytes and decimal note), not the table's 0x80;
    the requests may carry 4 bytes of extras (the state) or 8 (state and collection id)."""
    good = h("80 48 0000 08 00 0000 00000008", DEADBEEF_HEADER, "00000002 cafef00d")
    assert one(good).body_len == 8
    upstream_table = good[:8] + (0x80).to_bytes(4, "big") + good[12:]
    dec = FrameDecoder()
    dec.feed(upstream_table)
    assert list(dec) == [] and dec.buffered == 32  # it would wait for 120 more bytes that never come
    # Example 2's decimal note says 4735928559; 0xdeadbeef is 3735928559.
    assert kv.GetAllVbSeqnos.from_frame(one(h("80 48 0000 04 00 0000 00000004", DEADBEEF_HEADER,
                                              "00000002"))).opaque == 3735928559


def test_get_all_vb_seqnos_rules():
    assert "state filter 5" in reasons(one(kv.GetAllVbSeqnos(5).encode()))
    assert "extras must be 0 or 4 or 8" in reasons(one(request(Opcode.GET_ALL_VB_SEQNOS, extras=b"\0" * 6)))
    assert "N x 10" in reasons(one(response(Opcode.GET_ALL_VB_SEQNOS, value=b"\0" * 11)))
    assert rules.problems(one(kv.GetAllVbSeqnosResponse(()).encode())) == []  # a filter may match nothing


PERSIST_REQUEST = h("80 b7 0000 08 00 000c 00000008 00000000", ZERO_CAS, "00000000feeddeca")


def test_seqno_persistence_example_corrected_erratum_34():
    """SEQNO_PERSISTENCE's body is the 8-byte seqno alone, no key (0x000C in the example is the vbucket,
    not a key length); the response has no body."""
    both_ways(kv.SeqnoPersistence(vbucket=12, seqno=0xFEEDDECA), PERSIST_REQUEST)
    resp = h("81 b7 0000 00 00 0000 00000000 00000000", ZERO_CAS)
    assert kv.decode_kv(one(resp)) == kv.RawResponse(Opcode.SEQNO_PERSISTENCE, Status.SUCCESS)


def test_seqno_persistence_upstream_bytes_decode_differently_erratum_34():
    """The SEQNO_PERSISTENCE grid as printed holds 16 body bytes under a header that says 8: the second
    half is not part of the frame."""
    grid = h("80 b7 0000 08 00 000c 00000008 00000000", ZERO_CAS, "00000000deadbeef", "00000000feeddeca")
    dec = FrameDecoder()
    dec.feed(grid)
    (frame,) = list(dec)
    assert kv.SeqnoPersistence.from_frame(frame).seqno == 0xDEADBEEF and dec.buffered == 8
    table_key_len = h("80 b7 000c 08 00 000c 00000008 00000000", ZERO_CAS, "00000000feeddeca")
    with pytest.raises(ProtocolError, match="exceed the total body"):
        decode_all(table_key_len)


# ---------------------------------------------------------------------------------------------
# Commands without a worked example: layouts from their field tables


def test_mutation_seqno_extras_on_set_and_delete_responses():
    for op in (Opcode.SET, Opcode.DELETE, Opcode.APPEND):
        msg = kv.MutationResponse(cas=0x1122, vbucket_uuid=0xABCD, seqno=42, opaque=9, opcode=op)
        data = msg.encode()
        assert data[4] == 16 and data[24:40] == (0xABCD).to_bytes(8, "big") + (42).to_bytes(8, "big")
        assert kv.decode_kv(one(data)) == msg and msg.mutation_token == (0xABCD, 42)
    plain = kv.MutationResponse.from_frame(one(kv.MutationResponse(cas=1).encode()))
    assert plain.mutation_token is None
    assert "extras must be 0 or 16" in reasons(one(response(Opcode.SET, extras=b"\0" * 8, cas=1)))
    assert "non-zero CAS" in reasons(one(response(Opcode.SET)))


def test_not_my_vbucket_carries_the_cluster_map():
    config = {"rev": 7, "vBucketServerMap": {"numReplicas": 0, "serverList": ["$HOST:11210"],
                                             "vBucketMap": [[0]]}}
    data = kv.not_my_vbucket(Opcode.GET, opaque=5, config=json.dumps(config).encode())
    msg = kv.decode_kv(one(data))
    assert isinstance(msg, kv.RawResponse) and msg.status == Status.NOT_MY_VBUCKET
    assert msg.cluster_map == config and msg.datatype == 0x01
    deduplicated = kv.decode_kv(one(kv.not_my_vbucket(Opcode.GET, opaque=5)))
    assert deduplicated.cluster_map is None


def test_error_response_with_json_context():
    data = kv.error_response(Opcode.SET, Status.EINVAL, opaque=1, context="bad extras", ref="abc")
    msg = kv.decode_kv(one(data))
    assert msg.context == "bad extras" and json.loads(msg.value) == {"error": {"context": "bad extras",
                                                                                "ref": "abc"}}
    assert kv.decode_kv(one(kv.error_response(Opcode.SET, Status.ETMPFAIL))).value == b""


def test_get_cluster_config_with_and_without_known_version():
    plain = kv.GetClusterConfig()
    assert plain.encode() == h("80 b5 0000 00 00 0000 00000000 00000000", ZERO_CAS)
    known = kv.GetClusterConfig(epoch=-1, revision=5)
    data = known.encode()
    assert data[4] == 16 and data[24:40] == (-1).to_bytes(8, "big", signed=True) + (5).to_bytes(8, "big")
    assert kv.GetClusterConfig.from_frame(one(data)) == known and known.known_version == (-1, 5)
    with pytest.raises(ValueError):
        kv.GetClusterConfig(epoch=1).encode()
    assert "CAS 0" in reasons(one(request(Opcode.GET_CLUSTER_CONFIG, cas=3)))
    assert "extras must be 0 or 16" in reasons(one(request(Opcode.GET_CLUSTER_CONFIG, extras=b"\0" * 4)))


def test_set_cluster_config_carries_the_version_as_get_cluster_config_does():
    msg = kv.SetClusterConfig(b"default", b'{"rev":7}', epoch=-1, revision=7, opaque=9)
    data = msg.encode()
    frame = one(data)
    assert (frame.opcode, frame.key, frame.value, frame.datatype) == (Opcode.SET_CLUSTER_CONFIG, b"default",
                                                                     b'{"rev":7}', 1)
    assert frame.extras == kv.GetClusterConfig(epoch=-1, revision=7).encode()[24:40]
    assert kv.SetClusterConfig.from_frame(frame) == msg
    with pytest.raises(ProtocolError, match="needs 16 bytes of extras"):
        kv.SetClusterConfig.from_frame(one(request(Opcode.SET_CLUSTER_CONFIG, key=b"b", extras=b"\0" * 8)))


def test_cluster_config_response_is_json():
    doc = {"rev": 1}
    msg = kv.ClusterConfigResponse(json.dumps(doc).encode(), opaque=2)
    frame = one(msg.encode())
    assert frame.datatype == 0x01 and kv.decode_kv(frame) == msg and msg.json == doc
    assert "not valid JSON" in reasons(one(response(Opcode.GET_CLUSTER_CONFIG, value=b"{", datatype=1)))
    assert kv.ClusterConfigResponse().json is None  # the client's version was current
    deep = one(response(Opcode.GET_CLUSTER_CONFIG, value=b"[" * 100_000, datatype=1))
    assert "not valid JSON" in reasons(deep)  # RecursionError is reported, not raised


def test_get_error_map_request():
    msg = kv.GetErrorMap(2, opaque=4)
    assert msg.encode() == h("80 fe 0000 00 00 0000 00000002 00000004", ZERO_CAS, "0002")
    assert "version 0" in reasons(one(kv.GetErrorMap(0).encode()))
    assert "u16 version" in reasons(one(request(Opcode.GET_ERROR_MAP, value=b"\x00\x02\x00")))
    assert "must have a value" in reasons(one(request(Opcode.GET_ERROR_MAP)))


def test_set_vbucket_takes_the_json_value_erratum_30():
    """The JSON value (`topology`, `use_snapshot`, `next_expected_state`) belongs to SET_VBUCKET (0x3D),
    not to DCP_SET_VBUCKET_STATE (0x5B), which rejects any value."""
    value = json.dumps({"topology": [["n0", "n1"]]}).encode()
    msg = kv.SetVbucket(3, 1, value, opaque=1)
    data = msg.encode()
    assert data[4] == 1 and data[24] == 1 and data[5] == 0x01 and data[6:8] == b"\x00\x03"
    assert kv.SetVbucket.from_frame(one(data)) == msg and msg.json["topology"] == [["n0", "n1"]]
    assert "datatype JSON" in reasons(one(request(Opcode.SET_VBUCKET, extras=b"\x01", value=value)))
    assert "state 7" in reasons(one(kv.SetVbucket(0, 7).encode()))
    # ...whereas the DCP opcode that page names rejects any value (its rule lives in protocol/dcp/).
    assert dcp.DcpSetVbucketState.opcode == Opcode.DCP_SET_VBUCKET_STATE
    dcp_with_value = one(request(Opcode.DCP_SET_VBUCKET_STATE, extras=b"\x01", value=value, datatype=1))
    assert "must not have a value" in reasons(dcp_with_value)


def test_get_vbucket_response_value_is_u32_state():
    msg = kv.GetVbucketResponse(2, opaque=8)
    assert msg.encode()[24:] == b"\x00\x00\x00\x02"
    assert kv.decode_kv(one(msg.encode())) == msg
    assert "u32 state" in reasons(one(response(Opcode.GET_VBUCKET, value=b"\x02")))


def test_observe_seqno_formats():
    req = kv.ObserveSeqno(vbucket=5, vbucket_uuid=0x1234, opaque=1)
    assert req.encode()[6:8] == b"\x00\x05" and req.encode()[24:] == (0x1234).to_bytes(8, "big")
    assert kv.ObserveSeqno.from_frame(one(req.encode())) == req
    plain = kv.ObserveSeqnoResponse(5, 0x1234, 10, 12)
    assert len(plain.encode()) == 24 + 27 and plain.encode()[24] == 0
    failed_over = kv.ObserveSeqnoResponse(5, 0x9999, 10, 12, old_vbucket_uuid=0x1234, last_received_seqno=11)
    assert len(failed_over.encode()) == 24 + 43 and failed_over.encode()[24] == 1 and failed_over.failed_over
    for msg in (plain, failed_over):
        assert kv.decode_kv(one(msg.encode())) == msg
    assert "format byte 2" in reasons(one(response(Opcode.OBSERVE_SEQNO, value=b"\x02" + b"\0" * 26)))
    assert "must be 27 bytes" in reasons(one(response(Opcode.OBSERVE_SEQNO, value=b"\x00" + b"\0" * 30)))
    assert "u64 vbucket UUID" in reasons(one(request(Opcode.OBSERVE_SEQNO, value=b"\0" * 4)))


def test_touch_and_gat():
    touch = kv.Touch(b"k", 100, vbucket=3)
    assert touch.encode()[4] == 4 and touch.encode()[24:28] == (100).to_bytes(4, "big")
    assert kv.Touch.from_frame(one(touch.encode())) == touch
    gat = kv.Gat(b"k", 5, opcode=Opcode.GAT_Q)
    assert kv.Gat.from_frame(one(gat.encode())) == gat and gat.quiet
    reply = kv.GetResponse(1, b"v", 9, opcode=Opcode.GAT)
    assert kv.decode_kv(one(reply.encode())) == reply
    assert "extras must be 4" in reasons(one(request(Opcode.TOUCH, key=b"k")))


def test_document_command_rules_cite_the_page():
    cases = [
        (request(Opcode.GET), "GET must have a key (docs/BinaryProtocol.md#0x00-get)"),
        (request(Opcode.GET, key=b"k", value=b"v"), "must not have a value"),
        (request(Opcode.SET, key=b"k"), "extras must be 8 bytes"),
        (request(Opcode.DELETE, key=b"k", extras=b"\0" * 4), "must not have extras"),
        (request(Opcode.INCREMENT, key=b"k", extras=b"\0" * 8), "extras must be 20 bytes"),
        (request(Opcode.APPEND, key=b"k"), "must have a value"),
        (request(Opcode.SET, key=b"k", extras=b"\0" * 8, datatype=0x08), "unknown bits"),
        (response(Opcode.INCREMENT, value=b"\0" * 4), "u64 counter"),
        (request(Opcode.HELLO, value=b"\x00"), "list of u16"),
        (request(Opcode.STAT, key=b"dcp", value=b"{}"), "datatype JSON"),
        (request(Opcode.SELECT_BUCKET), "must have a key"),
    ]
    for data, expected in cases:
        assert expected in reasons(one(data)), (data.hex(), reasons(one(data)))


def test_quiet_variants_keep_their_opcode():
    for msg in (kv.Get(b"k", opcode=Opcode.GET_KQ), kv.Store(b"k", b"v", opcode=Opcode.REPLACE_Q),
                kv.Delete(b"k", opcode=Opcode.DELETE_Q), kv.Arithmetic(b"k", opcode=Opcode.DECREMENT_Q),
                kv.Concat(b"k", b"v", opcode=Opcode.PREPEND_Q), kv.Quit(opcode=Opcode.QUIT_Q)):
        got = kv.decode_kv(one(msg.encode()))
        assert got == msg and got.opcode == msg.opcode
    assert kv.Get(b"k", opcode=Opcode.GET_Q) != kv.Get(b"k")
    assert kv.Store(b"k", opcode=Opcode.SET_Q).quiet and not kv.Store(b"k").quiet


def test_decoder_refuses_a_frame_of_another_command():
    with pytest.raises(ProtocolError, match="cannot decode"):
        kv.Get.from_frame(one(kv.Delete(b"k").encode()))
    with pytest.raises(ProtocolError, match="cannot decode"):
        kv.HelloResponse.from_frame(one(kv.Hello(b"a").encode()))
    with pytest.raises(ProtocolError) as e:
        kv.decode_kv(one(request(Opcode.DCP_OPEN, key=b"x", extras=b"\0" * 8)))
    assert e.value.status == Status.UNKNOWN_COMMAND


def test_durability_framing_rides_on_document_commands():
    msg = kv.Store(b"k", b"v", framing=durability_frame(1, 5000))
    data = msg.encode()
    assert data[0] == Magic.ALT_REQUEST
    assert kv.decode_kv(one(data)) == msg
    bad = kv.Store(b"k", b"v", framing=durability_frame(9)).encode()
    assert rules.problems(one(bad))[0].status == Status.DURABILITY_INVALID_LEVEL


# ---------------------------------------------------------------------------------------------
# HELLO negotiation and STAT sequences


def test_negotiate_keeps_request_order_drops_unsupported_duplicates_and_retired():
    asked = [Feature.XERROR, 0x9999, Feature.DATATYPE_RETIRED, Feature.COLLECTIONS, Feature.XERROR,
             Feature.SELECT_BUCKET]
    assert kv.negotiate(asked, [Feature.SELECT_BUCKET, Feature.COLLECTIONS, Feature.XERROR,
                                Feature.DATATYPE_RETIRED]) == (Feature.XERROR, Feature.COLLECTIONS,
                                                               Feature.SELECT_BUCKET)


def test_negotiate_grants_clustermap_notifications_only_with_duplex():
    asked = [Feature.CLUSTERMAP_CHANGE_NOTIFICATION, Feature.DUPLEX]
    assert kv.negotiate(asked, list(Feature)) == tuple(asked)
    assert kv.negotiate(asked[:1], list(Feature)) == ()


def test_hello_agent_json_key():
    hello = kv.Hello(b'{"a":"python/4.6.3","i":"abc/def"}', (Feature.XERROR,))
    assert hello.agent_name == "python/4.6.3" and hello.connection_id == "abc/def"
    assert kv.Hello(b"{not json").agent_name == "{not json"


def test_stat_sequence_encoder_and_collector():
    data = kv.encode_stats({"pid": 3078, b"uptime": "17", "ep_dcp": b"x"}, opaque=0x42)
    frames = decode_all(data)
    assert len(frames) == 4 and frames[-1].key == b"" and frames[-1].value == b""
    assert frames[0].encode() == h("81 10 0003 00 00 0000 00000007 00000042", ZERO_CAS, "706964 33303738")
    collector = kv.StatsCollector(opaque=0x42)
    done = [collector.feed(f) for f in frames]
    assert done == [False, False, False, True]
    assert collector.stats == {"pid": "3078", "uptime": "17", "ep_dcp": "x"} and collector.status == 0
    with pytest.raises(ProtocolError, match="already ended"):
        collector.feed(frames[0])


def test_stat_collector_stops_on_error_and_checks_opaque():
    collector = kv.StatsCollector(opaque=1)
    assert collector.feed(one(kv.StatResponse(status=Status.KEY_ENOENT, opaque=1).encode()))
    assert collector.status == Status.KEY_ENOENT and collector.stats == {}
    with pytest.raises(ProtocolError, match="opaque"):
        kv.StatsCollector(opaque=1).feed(one(kv.StatResponse(b"a", b"b", opaque=2).encode()))


def test_stat_request_json_value():
    msg = kv.Stat(b"dcp", b'{"stream_format":"json"}')
    frame = one(msg.encode())
    assert frame.datatype == 0x01 and kv.Stat.from_frame(frame) == msg


# ---------------------------------------------------------------------------------------------
# Hypothesis: every message type round-trips through the decoder

u8 = st.integers(0, 0xFF)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
u64 = st.integers(0, 2**64 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
keys = st.binary(min_size=1, max_size=40)
blobs = st.binary(max_size=60)
datatypes = st.integers(0, 7)
framings = st.sampled_from([b"", durability_frame(1), durability_frame(3, 1000),
                            encode_frame_info(RequestFrameId.PRESERVE_TTL),
                            encode_frame_info(RequestFrameId.BARRIER)])
words = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_", min_size=1,
                max_size=16)
tokens = st.one_of(st.tuples(st.none(), st.none()), st.tuples(u64, u64))
ok_opcodes = st.sampled_from


def _json_objects():
    return st.dictionaries(st.text(max_size=6), st.integers(-5, 5), max_size=3).map(
        lambda d: json.dumps(d).encode())


def _getk_response(op, key, flags, value, cas, dt, opaque):
    return kv.GetResponse(flags, value, cas, dt, key if op in (Opcode.GET_K, Opcode.GET_KQ) else b"", opaque,
                          opcode=op)


def _seqnos_request(choice, state, cid, opaque):
    if choice == 0:
        return kv.GetAllVbSeqnos(opaque=opaque)
    return kv.GetAllVbSeqnos(state, cid if choice == 2 else None, opaque)


def _ok(msg):
    """Success replies only: builds() may fill defaulted fields such as `status` too."""
    if isinstance(msg, kv.SaslResponse) or "status" not in msg._fields:
        return msg
    return msg._replace(status=Status.SUCCESS)


MESSAGES = st.one_of(
    st.builds(kv.Hello, st.binary(max_size=50), st.lists(u16, max_size=8).map(tuple), u32),
    st.builds(kv.HelloResponse, st.lists(u16, max_size=8).map(tuple), u32),
    st.builds(kv.SaslListMechs, u32),
    st.builds(kv.SaslListMechsResponse, st.lists(words, max_size=4).map(tuple), u32),
    st.builds(kv.SaslAuth, keys, blobs, u32, ok_opcodes(kv.SaslAuth.OPCODES)),
    st.builds(kv.SaslResponse, blobs, st.sampled_from([Status.SUCCESS, Status.AUTH_CONTINUE]), u32,
              ok_opcodes(kv.SaslAuth.OPCODES)),
    st.builds(kv.SelectBucket, keys, u32),
    st.builds(kv.ListBuckets, u32),
    st.builds(kv.ListBucketsResponse, st.lists(words, max_size=4).map(tuple), u32),
    st.one_of(st.builds(kv.GetClusterConfig, st.none(), st.none(), u32),
              st.builds(kv.GetClusterConfig, i64, i64, u32)),
    st.builds(kv.ClusterConfigResponse, st.one_of(st.just(b""), _json_objects()), u32),
    st.builds(kv.GetErrorMap, st.integers(1, 0xFFFF), u32),
    st.builds(kv.ErrorMapResponse, _json_objects(), u32),
    st.builds(kv.Version, u32),
    st.builds(kv.VersionResponse, st.text(st.characters(blacklist_categories=("Cs",)), min_size=1,
                                          max_size=20), u32),
    st.builds(kv.Noop, u32),
    st.builds(kv.Quit, u32, ok_opcodes(kv.Quit.OPCODES)),
    st.builds(kv.Stat, st.binary(max_size=20), st.one_of(st.just(b""), _json_objects()), u32),
    st.builds(kv.StatResponse, keys, blobs, u32),
    st.builds(kv.Get, keys, u16, u32, ok_opcodes(kv.Get.OPCODES), framings),
    st.builds(_getk_response, ok_opcodes(kv.GetResponse.OPCODES), keys, u32, blobs, u64, datatypes, u32),
    st.builds(kv.Store, keys, blobs, u32, u32, u64, u16, u32, datatypes, ok_opcodes(kv.Store.OPCODES),
              framings),
    st.builds(lambda c, t, o, op: kv.MutationResponse(c, t[0], t[1], o, opcode=op), st.integers(1, 2**64 - 1),
              tokens, u32, ok_opcodes(kv.MutationResponse.OPCODES)),
    st.builds(kv.Delete, keys, u64, u16, u32, ok_opcodes(kv.Delete.OPCODES), framings),
    st.builds(kv.Arithmetic, keys, u64, u64, u32, u64, u16, u32, ok_opcodes(kv.Arithmetic.OPCODES), framings),
    st.builds(lambda v, c, t, o, op: kv.ArithmeticResponse(v, c, t[0], t[1], o, opcode=op), u64, u64, tokens,
              u32, ok_opcodes(kv.Arithmetic.OPCODES)),
    st.builds(kv.Concat, keys, st.binary(min_size=1, max_size=40), u64, u16, u32, datatypes,
              ok_opcodes(kv.Concat.OPCODES), framings),
    st.builds(kv.Touch, keys, u32, u16, u32, framings),
    st.builds(kv.Gat, keys, u32, u16, u32, ok_opcodes(kv.Gat.OPCODES), framings),
    st.builds(kv.SetVbucket, u16, st.integers(1, 4), st.one_of(st.just(b""), _json_objects()), u32),
    st.builds(kv.GetVbucket, u16, u32),
    st.builds(kv.GetVbucketResponse, u32, u32),
    st.builds(_seqnos_request, st.integers(0, 2), st.integers(0, 4), u32, u32),
    st.builds(kv.GetAllVbSeqnosResponse, st.lists(st.tuples(u16, u64), max_size=6).map(tuple), u32),
    st.builds(kv.ObserveSeqno, u16, u64, u32),
    st.one_of(st.builds(kv.ObserveSeqnoResponse, u16, u64, u64, u64, st.none(), st.none(), u32),
              st.builds(kv.ObserveSeqnoResponse, u16, u64, u64, u64, u64, u64, u32)),
    st.builds(kv.SeqnoPersistence, u16, u64, u32),
).map(_ok)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(MESSAGES, st.integers(1, 64))
def test_every_message_round_trips_through_the_decoder(msg, chunk):
    data = msg.encode()
    dec = FrameDecoder()
    frames = []
    for i in range(0, len(data), chunk):
        dec.feed(data[i:i + chunk])
        frames.extend(dec)
    (frame,) = frames
    assert rules.problems(frame) == []
    assert type(msg).from_frame(frame) == msg
    assert kv.decode_kv(frame) == msg
    assert frame.encode() == data


ERROR_STATUSES = [s for s in Status if s not in (Status.SUCCESS, Status.AUTH_CONTINUE)]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(kv.RESPONSE_TYPES)), st.sampled_from(ERROR_STATUSES), blobs, u32, datatypes,
       u64)
def test_error_responses_round_trip_as_raw_responses(opcode, status, value, opaque, datatype, cas):
    msg = kv.RawResponse(opcode, status, value, opaque, datatype, cas)
    frame = one(msg.encode())
    assert kv.decode_kv(frame) == msg
    typed = kv.RESPONSE_TYPES[opcode].from_frame(frame)  # a typed decoder keeps only the status
    assert typed.status == status and typed.opaque == opaque


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(kv.REQUEST_TYPES) + sorted(kv.RESPONSE_TYPES)), st.sampled_from(list(Magic)),
       st.binary(max_size=30), st.binary(max_size=20), st.binary(max_size=50), st.integers(0, 255), u64)
def test_garbage_bodies_only_ever_raise_protocol_errors(opcode, magic, extras, key, value, datatype, cas):
    """Including duplex magics 0x82/0x83, whose frames rules.problems() does not validate."""
    frame = Frame(magic, opcode, datatype, 0, 0, cas, b"", extras, key, value)
    try:
        msg = kv.decode_kv(frame)
    except ProtocolError as e:
        assert e.reason and e.status
    else:
        assert rules.problems(frame) == []
        assert msg.opcode == opcode


def test_error_context_reads_xerror_json_or_plain_text():
    def frame(data: bytes) -> Frame:
        return decode_all(data)[0]
    xerror = kv.error_response(Opcode.GET, Status.KEY_ENOENT, 7, context="no such key")
    assert kv.error_context(frame(xerror)) == "no such key"
    assert kv.error_context(frame(response(Opcode.GET, Status.EINVAL, value=b"bad extras"))) == "bad extras"
    assert kv.error_context(frame(response(Opcode.GET, Status.EINVAL))) == ""
    assert status_name(Status.KEY_ENOENT) == "KEY_ENOENT" and status_name(0x7777) == "0x7777"
