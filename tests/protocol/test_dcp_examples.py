"""Every worked example of KV-Engine's DCP command pages
(https://github.com/couchbase/kv_engine/tree/master/docs/dcp/documentation/commands), byte-exact both
ways in its corrected reading, and one test per erratum - a place where a page's example
contradicts its own field table or KV-Engine's code - pinning the correct reading, which the
test's docstring states.

The bytes live in reference_frames.py (the CLI tests use them too).
"""

import json
import struct

import pytest

from dcpflow.protocol import rules
from dcpflow.protocol.dcp import (
    DcpAddStream,
    DcpDecoder,
    DcpDeletion,
    DcpExpiration,
    DcpMutation,
    DcpOpen,
    DcpPrepare,
    DcpSetVbucketState,
    DcpSnapshotMarker,
    DcpStreamRequest,
    DcpStreamRequestResponse,
    FailoverLogResponse,
    MarkerVersion,
    OpenFlag,
    SnapshotFlag,
    StreamFlag,
    decode_dcp,
    spell_flags,
)
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import Frame, Magic, decode_all, response
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .reference_frames import (
    FAILOVER_LOG,
    FAILOVER_LOG_AS_PRINTED,
    OVERRUN,
    REFERENCE_FRAMES,
    TRAILING,
    UPSTREAM_EXAMPLES,
    UPSTREAM_UNDETECTED,
    h,
    patch,
)


def ref(name: str) -> bytes:
    return bytes.fromhex(REFERENCE_FRAMES[name][0])


def upstream(name: str) -> bytes:
    return bytes.fromhex(UPSTREAM_EXAMPLES[name][0])


def undetected(name: str) -> bytes:
    return bytes.fromhex(UPSTREAM_UNDETECTED[name][0])


def one_frame(data: bytes) -> Frame:
    frames = decode_all(data)
    assert len(frames) == 1
    return frames[0]


def reasons(data: bytes) -> list[str]:
    """Every problem a decoder reports for these bytes: the framing error, or each rule broken."""
    try:
        frames = decode_all(data)
    except ProtocolError as e:
        return [e.reason]
    return [p.reason for f in frames for p in rules.problems(f)]


def problem_statuses(data: bytes) -> set:
    return {p.status for p in rules.problems(one_frame(data))}


# ---------------------------------------------------------------------------------------------
# The corrected examples, both ways

@pytest.mark.parametrize("name", sorted(REFERENCE_FRAMES))
def test_example_decodes_to_the_expected_message(name):
    hexstr, expected = REFERENCE_FRAMES[name]
    frame = one_frame(bytes.fromhex(hexstr))
    assert rules.problems(frame) == []
    got = decode_dcp(frame)
    assert type(got) is type(expected)
    assert got == expected
    assert got._asdict() == expected._asdict()  # field by field, names included


@pytest.mark.parametrize("name", sorted(REFERENCE_FRAMES))
def test_example_encodes_to_the_exact_bytes(name):
    hexstr, expected = REFERENCE_FRAMES[name]
    assert expected.encode().hex() == hexstr


@pytest.mark.parametrize("name", sorted(REFERENCE_FRAMES))
def test_example_header_lengths_are_consistent(name):
    """A transcription check: 24 + total body == packet length, and the parts add up."""
    data = ref(name)
    if data[0] in (Magic.ALT_REQUEST, Magic.ALT_RESPONSE):
        fr_len, key_len = data[2], data[3]
    else:
        fr_len, key_len = 0, int.from_bytes(data[2:4], "big")
    body = int.from_bytes(data[8:12], "big")
    assert len(data) == 24 + body
    assert fr_len + data[4] + key_len <= body


def test_all_examples_in_one_stream_through_the_dcp_decoder():
    """The fast path (mutation, deletion, V1 marker) and the slow path give the same messages."""
    names = sorted(REFERENCE_FRAMES)
    stream = b"".join(ref(n) for n in names)
    dec = DcpDecoder()
    dec.feed(stream)
    got = list(dec.messages())
    assert got == [REFERENCE_FRAMES[n][1] for n in names]
    assert [type(m) for m in got] == [type(REFERENCE_FRAMES[n][1]) for n in names]
    assert dec.buffered == 0


def test_examples_cover_every_dcp_page_with_an_example():
    opcodes = {one_frame(ref(n)).opcode for n in REFERENCE_FRAMES}
    expected = set(range(Opcode.DCP_OPEN, Opcode.DCP_CACHE_TRANSFER_END + 1)) - {Opcode.DCP_FLUSH}
    assert opcodes == expected


def test_example_fields_read_from_the_tables():
    """A few fields checked against the pages' tables by offset, independent of the message types."""
    mut = ref("mutation")
    assert struct.unpack_from(">QQ", mut, 24) == (4, 1) and mut[55:60] == b"hello" and mut[60:65] == b"world"
    ev = ref("system-event begin collection")
    assert struct.unpack_from(">QIII", ev, 49) == (2, 0, 8, 0x11940)
    assert ev[37:49] == b"mycollection"
    ct = ref("cache-transfer")
    assert struct.unpack_from(">QQQIIIHBB", ct, 24) == (4, 1, 5, 5, 0, 0, 5, 0, 0x0A)
    assert ct[64:69] == b"hello" and ct[69:74] == b"world"


def test_system_event_value_decodes_per_the_version_1_struct():
    msg = REFERENCE_FRAMES["system-event begin collection"][1]
    assert msg.decode_value() == {"manifest_uid": 2, "scope_id": 0, "collection_id": 8, "max_ttl": 72000}


def test_stream_request_examples_satisfy_the_erange_rule():
    for name in ("stream-request 1", "stream-request 2"):
        assert REFERENCE_FRAMES[name][1].seqno_problem() is None


# ---------------------------------------------------------------------------------------------
# The upstream bytes: every self-inconsistent one is reported

@pytest.mark.parametrize("name", sorted(UPSTREAM_EXAMPLES))
def test_upstream_bytes_are_reported(name):
    hexstr, erratum, substring = UPSTREAM_EXAMPLES[name]
    found = reasons(bytes.fromhex(hexstr))
    assert any(substring in r for r in found), (erratum, found)


@pytest.mark.parametrize("name", sorted(UPSTREAM_EXAMPLES))
def test_upstream_bytes_do_not_decode_to_a_message(name):
    """The typed decoder refuses them too: an error, or bytes left over that never make a frame."""
    dec = DcpDecoder()
    dec.feed(upstream(name))
    try:
        list(dec.messages())
    except ProtocolError as e:
        assert e.status == Status.EINVAL
    else:
        assert dec.buffered > 0


@pytest.mark.parametrize("name", sorted(UPSTREAM_UNDETECTED))
def test_undetectable_upstream_bytes_are_well_formed(name):
    """These errata are about meaning, not shape: the frame is sound, tests below pin the reading."""
    frame = one_frame(undetected(name))
    assert rules.problems(frame) == []
    decode_dcp(frame)


# ---------------------------------------------------------------------------------------------
# One test per erratum

def test_erratum_1_v1_marker_type_0x01_is_memory_not_disk():
    """Snapshot-marker type 0x01 is Memory and 0x02 is Disk; the V1 example labels its 0x00000001 "(disk)"."""
    msg = decode_dcp(one_frame(ref("snapshot-marker V1")))
    assert msg.flags == SnapshotFlag.MEMORY == 0x01 and SnapshotFlag.DISK == 0x02
    assert spell_flags(msg.flags, SnapshotFlag) == "Memory"
    assert UPSTREAM_UNDETECTED["snapshot-marker V1 type label"][1] == 1


def test_erratum_2_v1_marker_total_body_is_0x14():
    """A V1 snapshot marker's total body is 0x14 (its 20 bytes of extras); the V1 example has 0 there."""
    assert ref("snapshot-marker V1").hex() == patch(upstream("snapshot-marker V1").hex(), 8, "00 00 00 14")
    with pytest.raises(ProtocolError, match=OVERRUN) as e:
        decode_all(upstream("snapshot-marker V1"))
    assert e.value.status == Status.EINVAL and not e.value.fatal


def test_erratum_3_v2_0_marker_extras_length_is_1():
    """A V2.x snapshot marker's extras are the version byte alone (extras length 1, the rest is the value);
    the V2.0 example says 0x14, which makes the marker a 20-byte-extras marker with a value: invalid."""
    data = upstream("snapshot-marker V2.0 [erratum 3 only]")
    frame = one_frame(data)
    assert len(frame.extras) == 20 and len(frame.value) == 17
    assert any("must not have a value" in r for r in reasons(data))
    with pytest.raises(ProtocolError, match="must not have a value") as e:
        decode_dcp(frame)
    assert e.value.status == Status.EINVAL
    assert one_frame(ref("snapshot-marker V2.0")).extras == b"\x00"


def test_erratum_4_v2_0_marker_total_body_is_0x25():
    """A V2.0 snapshot marker's total body is 0x25 (the version byte plus a 36-byte value); the V2.0
    example has 0 there."""
    assert ref("snapshot-marker V2.0")[8:12] == b"\x00\x00\x00\x25"
    for name in ("snapshot-marker V2.0", "snapshot-marker V2.0 [erratum 4 only]"):
        with pytest.raises(ProtocolError, match=OVERRUN):
            decode_all(upstream(name))
    # The full upstream packet is exactly the corrected one with errata 3, 4 and 5 undone.
    undone = patch(patch(patch(ref("snapshot-marker V2.0").hex(), 4, "14"), 8, "00 00 00 00"), 24, "01")
    assert undone == upstream("snapshot-marker V2.0").hex()


def test_erratum_5_marker_version_0x01_is_einval_and_0x02_is_v2_2():
    """The marker version byte is 0x00 for V2.0 and 0x02 for V2.2; 0x01 ("V2.1") is rejected with EINVAL.
    The V2.0 example shows 0x01 where its own table says 0x00."""
    frame = one_frame(upstream("snapshot-marker V2.0 [erratum 5 only]"))
    (problem,) = rules.problems(frame)
    assert problem.status == Status.EINVAL and "0x01" in problem.reason
    with pytest.raises(ProtocolError, match="version 0x01 is invalid"):
        decode_dcp(frame)
    assert decode_dcp(one_frame(ref("snapshot-marker V2.0"))).version == MarkerVersion.V2_0 == 0x00
    assert decode_dcp(one_frame(ref("snapshot-marker V2.2"))).version == MarkerVersion.V2_2 == 0x02
    with pytest.raises(ValueError):
        DcpSnapshotMarker(0, 1, 2, version=1).encode()


def test_erratum_6_control_key_length_is_0x000b():
    """DCP_CONTROL carries the control name as its key: key length 0x000B for "enable_noop"; the example
    has a key length of 0."""
    data = ref("control request")
    assert data[2:4] == b"\x00\x0b" and one_frame(data).key == b"enable_noop"
    bad = upstream("control request [erratum 6 only]")
    assert problem_statuses(bad) == {Status.EINVAL}
    assert any("must have a key" in r for r in reasons(bad))


def test_erratum_7_control_has_no_extras():
    """DCP_CONTROL has no extras; the example's extras length is 4."""
    assert ref("control request")[4] == 0
    bad = upstream("control request [erratum 7 only]")
    assert any("must not have extras" in r for r in reasons(bad))


def test_erratum_8_control_total_body_is_0x0f_and_upstream_leaves_trailing_bytes():
    """DCP_CONTROL's total body is key + value, 0x0F for "enable_noop" = "true"; the example says 4 while
    its grid holds 15 body bytes, so the printed bytes leave 11 over."""
    assert ref("control request")[8:12] == b"\x00\x00\x00\x0f" and len(ref("control request")) == 24 + 15
    with pytest.raises(ProtocolError, match=OVERRUN):
        decode_all(upstream("control request [erratum 8 only]"))
    with pytest.raises(ProtocolError, match="11 " + TRAILING):
        decode_all(upstream("control request"))
    undone = patch(patch(patch(ref("control request").hex(), 2, "00 00"), 4, "04 00 00 05"), 8, "00 00 00 04")
    assert undone == upstream("control request").hex()


def test_erratum_9_control_vbucket_5_is_harmless_but_encoded_as_0():
    """DCP_CONTROL's vbucket field means nothing: the example's 5 decodes fine, and we send 0."""
    data = undetected("control request vbucket 5")
    frame = one_frame(data)
    assert frame.vbucket == 5 and rules.problems(frame) == []
    msg = decode_dcp(frame)
    assert msg == REFERENCE_FRAMES["control request"][1]
    assert msg.encode()[6:8] == b"\x00\x00"


def test_erratum_10_control_response_opcode_is_0x5e():
    """A DCP_CONTROL response carries opcode 0x5E like its request; the example response has 0x51
    (ADD_STREAM)."""
    frame = one_frame(ref("control response"))
    assert frame.opcode == Opcode.DCP_CONTROL == 0x5E
    # With opcode 0x51 the response reads as an ADD_STREAM response without its 4-byte extras.
    bad = one_frame(upstream("control response [erratum 10 only]"))
    assert bad.opcode == Opcode.DCP_ADD_STREAM
    with pytest.raises(ProtocolError, match="extras must be 4 bytes"):
        decode_dcp(bad)


def test_erratum_11_control_response_has_no_extras_and_no_body():
    """A DCP_CONTROL response has no extras and no body (extras length 0, total body 0); the example says
    4 and 4."""
    data = ref("control response")
    assert data[4] == 0 and data[8:12] == b"\x00\x00\x00\x00" and len(data) == 24
    bad = one_frame(upstream("control response [erratum 11 only]"))
    with pytest.raises(ProtocolError, match="must not have extras") as e:
        decode_dcp(bad)
    assert e.value.status == Status.EINVAL
    # As printed: 24 bytes whose header promises 4 more.
    with pytest.raises(ProtocolError, match="24 " + TRAILING + ": the header says 4 body bytes, only 0 present"):
        decode_all(upstream("control response"))


def test_erratum_14_stream_request_snapshot_start_both_readings_are_valid():
    """The first stream-request example gives snapshot start 0 in its table and 0xFFEEDD in its grid; both
    satisfy snapshot start <= start <= snapshot end, so both decode, and the table's reading is ours."""
    table = decode_dcp(one_frame(ref("stream-request 1")))
    grid = decode_dcp(one_frame(undetected("stream-request 1 grid snapshot start")))
    assert table.snap_start_seqno == 0 and grid.snap_start_seqno == 0xFFEEDD
    assert table.start_seqno == grid.start_seqno == 0xFFEEDD
    assert table.seqno_problem() is None and grid.seqno_problem() is None
    assert table._replace(snap_start_seqno=0xFFEEDD) == grid


def test_erratum_15_second_stream_request_needs_72_bytes():
    """A stream request is 72 bytes (24 of header, 48 of extras); the second example's grid stops at 64,
    dropping the snapshot end, while its header still says 48 bytes of extras."""
    assert len(upstream("stream-request 2")) == 64
    with pytest.raises(ProtocolError, match="64 " + TRAILING + ": the header says 48 body bytes, only 40 present"):
        decode_all(upstream("stream-request 2"))
    full = ref("stream-request 2")
    assert len(full) == 72 and full[:64] == upstream("stream-request 2") and full[64:] == bytes(8)
    assert decode_dcp(one_frame(full)).snap_end_seqno == 0


@pytest.mark.parametrize("name", ["stream-request OK response", "failover-log response"])
def test_erratum_16_failover_log_must_be_newest_first(name):
    """A failover log goes newest entry first, so its seqnos never increase; the example log (seqnos
    0x5432, 0x1343214, 0x4, 0x6524) breaks that and is reported, and the corrected reading orders the
    same four entries."""
    data = upstream(name)
    problems = rules.problems(one_frame(data))
    assert [p.status for p in problems] == [Status.EINVAL]
    assert "not newest-first" in problems[0].reason
    with pytest.raises(ProtocolError, match="newest-first"):
        decode_dcp(one_frame(data))
    # The corrected reading: the same four entries, seqnos never increasing.
    assert sorted(FAILOVER_LOG) == sorted(FAILOVER_LOG_AS_PRINTED)
    seqnos = [s for _, s in FAILOVER_LOG]
    assert seqnos == sorted(seqnos, reverse=True)
    msg = decode_dcp(one_frame(ref(name)))
    assert (msg.failover_log if isinstance(msg, DcpStreamRequestResponse) else msg.entries) == FAILOVER_LOG


@pytest.mark.parametrize("name", ["stream-request OK response", "failover-log response"])
def test_a_lenient_decode_reads_the_printed_failover_log_and_strictness_returns_after(name):
    """For a dissector (dcpflow inspect): inside rules.lenient() a decoder reads a body that breaks
    a rule, here the log as printed; outside it the rule refuses it again."""
    frame = one_frame(upstream(name))
    with rules.lenient():
        msg = decode_dcp(frame)
    assert (msg.failover_log if isinstance(msg, DcpStreamRequestResponse) else msg.entries) == \
        FAILOVER_LOG_AS_PRINTED
    with pytest.raises(ProtocolError, match="newest-first"):
        decode_dcp(frame)
    with pytest.raises(ProtocolError, match="multiple of 16"), rules.lenient():
        decode_dcp(one_frame(response(frame.opcode, value=upstream(name)[24:44])))  # no layout to read


def test_erratum_16_equal_seqnos_are_still_newest_first():
    """Newest-first allows equal seqnos: a log whose seqnos never increase is sound."""
    msg = FailoverLogResponse(((3, 10), (2, 10), (1, 0)), opaque=1)
    assert rules.problems(one_frame(msg.encode())) == []


def test_erratum_17_start_equal_to_end_is_accepted_greater_is_erange():
    """A stream request is ERANGE only when start > end: start == end is accepted (the stream ends at once
    with STREAM_END OK), although the page says start must be less than end."""
    assert DcpStreamRequest(0, start_seqno=5, end_seqno=5, snap_start_seqno=5, snap_end_seqno=5).seqno_problem() \
        is None
    err = DcpStreamRequest(0, start_seqno=6, end_seqno=5, snap_start_seqno=6, snap_end_seqno=6).seqno_problem()
    assert err is not None and err.status == Status.ERANGE


def test_erratum_18_sid_is_a_u16_and_uid_is_optional():
    """A stream request's JSON `sid` is a u16 from 1 to 65535 (the page says up to 65536), and `uid` is
    optional (only used for debugging)."""
    def req(value: dict) -> bytes:
        return DcpStreamRequest(0, 0, value=json.dumps(value).encode()).encode()

    assert rules.problems(one_frame(req({"sid": 65535}))) == []
    assert rules.problems(one_frame(req({"collections": ["8"]}))) == []  # no uid: fine
    for sid in (65536, 0):
        (p,) = rules.problems(one_frame(req({"sid": sid})))
        assert p.status == Status.DCP_STREAM_ID_INVALID


def test_erratum_19_open_reserved_is_a_u32_and_the_unlisted_flag_rules_hold():
    """DCP_OPEN's first extras word is a reserved u32 (send 0). Flags 0x02, 0x10 and 0x80 are EINVAL, as
    are 0x08 with 0x40 (NoValue and NoValueWithUnderlyingDatatype), 0x100 without 0x04 (deleted user
    xattrs need IncludeXattrs) and 0x200 on a consumer (SkipDeletesInInitialBackfill is producer-only);
    a value must have datatype JSON. The page states none of these rules."""
    frame = one_frame(ref("open-connection request"))
    assert frame.extras[:4] == b"\x00\x00\x00\x00"
    assert decode_dcp(frame).reserved == 0 and not decode_dcp(frame).is_producer
    for flags in (0x02, 0x10, 0x80, 0x08 | 0x40, 0x100, 0x200):
        data = DcpOpen(b"n", flags).encode()
        assert problem_statuses(data) == {Status.EINVAL}, hex(flags)
    bad_value = DcpOpen(b"n", 0, b'{"consumer_name":"r"}').encode()
    bad_value = bad_value[:5] + b"\x00" + bad_value[6:]  # datatype raw
    assert any("datatype JSON" in r for r in reasons(bad_value))


def test_erratum_20_add_stream_novalue_flag_and_cache_transfer_combinations():
    """DCP_ADD_STREAM's removed NoValue flag (0x08) is EINVAL, and CacheTransfer (0x100) combines only with
    TakeOver and ActiveVbOnly."""
    (p,) = rules.problems(one_frame(DcpAddStream(0, StreamFlag.NO_VALUE_REMOVED).encode()))
    assert p.status == Status.EINVAL and "no longer used" in p.reason
    ok = StreamFlag.CACHE_TRANSFER | StreamFlag.TAKEOVER | StreamFlag.ACTIVE_VB_ONLY
    assert rules.problems(one_frame(DcpAddStream(0, ok).encode())) == []
    (p,) = rules.problems(one_frame(DcpAddStream(0, StreamFlag.CACHE_TRANSFER | StreamFlag.DISK_ONLY).encode()))
    assert "CacheTransfer" in p.reason


def test_erratum_21_mutation_extras_are_31_bytes_without_clen_and_nmeta_must_be_0():
    """DCP_MUTATION's extras are 31 bytes, ending in nmeta (u16) and nru (u8): there is no `clen` byte
    (the page's diagram adds one and makes 32), and nmeta must be 0."""
    frame = one_frame(ref("mutation"))
    assert len(frame.extras) == 31 and frame.extras[28:30] == b"\x00\x00" and frame.extras[30] == 0
    clen = upstream("mutation [erratum 21: extras with clen]")
    assert problem_statuses(clen) == {Status.EINVAL}
    nmeta = patch(ref("mutation").hex(), 52, "00 01")
    with pytest.raises(ProtocolError, match="nmeta must be 0"):
        decode_dcp(one_frame(bytes.fromhex(nmeta)))


def test_erratum_22_deletion_key_at_42_to_46_total_body_0x17():
    """In the DCP_DELETION V1 example the key "hello" sits at 42-46 and the total body is 0x17; the grid
    puts 4 more bytes before the key, which the header's body length does not cover."""
    data = ref("deletion V1")
    assert data[42:47] == b"hello" and len(data) == 47 and data[8:12] == b"\x00\x00\x00\x17"
    with pytest.raises(ProtocolError, match=r"4 " + TRAILING + r": fewer than a 24-byte header \(is the total "
                       r"body length 23 of the frame before them too small\?\)"):
        decode_all(upstream("deletion V1"))
    # As printed, the 23-byte body makes the key b"\x01c::h" and leaves "ello" over.
    assert one_frame(upstream("deletion V1")[:47]).key == b"\x01c::h"


def test_erratum_23_deletion_may_carry_an_xattr_value():
    """A DCP_DELETION may carry a value (its xattrs, with IncludeXattrs), although the page says it must
    not have one."""
    msg = DcpDeletion(1, 5, 1, b"k", value=b"\x00\x00\x00\x00", datatype=0x04, delete_time=0)
    frame = one_frame(msg.encode())
    assert rules.problems(frame) == []
    assert decode_dcp(frame) == msg


def test_erratum_24_expiration_extras_0x14_total_body_0x19():
    """DCP_EXPIRATION's extras are 20 bytes (length 0x14) and the example's total body is 0x19 (20 + the
    5-byte key); the example says 0x12 and 0x17."""
    data = ref("expiration")
    assert data[4] == 0x14 and data[8:12] == b"\x00\x00\x00\x19" and data[44:49] == b"hello"
    assert isinstance(decode_dcp(one_frame(data)), DcpExpiration)
    with pytest.raises(ProtocolError, match="2 " + TRAILING):
        decode_all(upstream("expiration"))
    assert any("extras must be 20 bytes" in r for r in reasons(upstream("expiration [erratum 24: extras 0x12]")))


def test_erratum_25_prepare_opcode_0x60_and_cas_non_zero():
    """DCP_PREPARE is opcode 0x60 (the example has 0x57, a mutation), its value "world" sits at 60-64, and
    its CAS must be non-zero (the example has 0)."""
    printed = decode_dcp(one_frame(undetected("prepare as printed (opcode 0x57)")))
    assert isinstance(printed, DcpMutation)  # opcode 0x57 silently makes it a mutation (nru 1)
    msg = decode_dcp(one_frame(ref("prepare")))
    assert isinstance(msg, DcpPrepare) and msg.cas != 0 and msg.value == b"world" and msg.durability_level == 1
    assert ref("prepare")[60:65] == b"world" and len(ref("prepare")) == 65
    frame = one_frame(upstream("prepare [erratum 25: CAS 0]"))
    assert frame.opcode == 0x60
    with pytest.raises(ProtocolError, match="non-zero CAS") as e:
        decode_dcp(frame)
    assert e.value.status == Status.EINVAL


def test_erratum_26_seqno_advanced_opcode_0x64_extras_8_body_8():
    """DCP_SEQNO_ADVANCED is opcode 0x64 with 8 bytes of extras and a total body of 8; the example has
    opcode 0x65 (OSO snapshot), extras length 4 and total body 0."""
    data = ref("seqno-advanced")
    assert data[1] == 0x64 and data[4] == 8 and data[8:12] == b"\x00\x00\x00\x08"
    with pytest.raises(ProtocolError, match=OVERRUN):
        decode_all(upstream("seqno-advanced"))
    # Even with the body length fixed, opcode 0x65 reads it as an OSO marker with bad flags.
    fixed_len = bytes.fromhex(patch(upstream("seqno-advanced").hex(), 8, "00 00 00 04"))
    assert one_frame(fixed_len[:28]).opcode == Opcode.DCP_OSO_SNAPSHOT


def test_erratum_27_oso_total_body_is_4():
    """DCP_OSO_SNAPSHOT's total body is 4 (its flags); the example has 0."""
    assert ref("oso-snapshot start")[8:12] == b"\x00\x00\x00\x04"
    with pytest.raises(ProtocolError, match=OVERRUN):
        decode_all(upstream("oso-snapshot"))
    assert patch(upstream("oso-snapshot").hex(), 8, "00 00 00 04") == REFERENCE_FRAMES["oso-snapshot start"][0]


def test_erratum_28_buffer_ack_extras_length_is_4():
    """DCP_BUFFER_ACKNOWLEDGEMENT carries the acknowledged bytes as 4 bytes of extras (extras length 4);
    the example's extras length is 0."""
    assert ref("buffer-ack request")[4] == 4
    problems = rules.problems(one_frame(upstream("buffer-ack request")))
    assert {p.status for p in problems} == {Status.EINVAL}
    assert any("extras must be 4 bytes" in p.reason for p in problems)
    assert decode_dcp(one_frame(ref("buffer-ack request"))).bytes_acked == 4096


def test_erratum_29_noop_is_24_bytes_with_opaque_5():
    """A DCP_NOOP request is a bare 24-byte header (the example's grid has 28 bytes, an extra zero row),
    and the example's opaque is 5 as its table says (the grid shows 0)."""
    data = ref("no-op request")
    assert len(data) == 24 and data[12:16] == b"\x00\x00\x00\x05"
    assert len(upstream("no-op request")) == 28
    with pytest.raises(ProtocolError, match="4 " + TRAILING):
        decode_all(upstream("no-op request"))
    assert REFERENCE_FRAMES["no-op request"][1].response() == ref("no-op response")


def test_erratum_30_dcp_set_vbucket_state_rejects_any_value():
    """DCP_SET_VBUCKET_STATE (0x5B) takes no value: any value is rejected. The JSON value the page points
    to (`topology`, ...) belongs to SET_VBUCKET (0x3D)."""
    frame = one_frame(upstream("set-vbucket-state [erratum 30: with a value]"))
    assert frame.value.startswith(b'{"topology"')
    with pytest.raises(ProtocolError, match="must not have a value"):
        decode_dcp(frame)
    assert decode_dcp(one_frame(ref("set-vbucket-state"))) == DcpSetVbucketState(0, 4, 0xDEADBEEF)


def test_erratum_31_system_event_value_orders_scope_before_collection():
    """A version-1 collection system event's value is manifest uid, scope id, collection id, max_ttl; the
    example swaps scope and collection."""
    printed = decode_dcp(one_frame(undetected("system-event scope/collection swapped")))
    assert printed.decode_value()["scope_id"] == 8 and printed.decode_value()["collection_id"] == 0
    fixed = decode_dcp(one_frame(ref("system-event begin collection"))).decode_value()
    # The manifest on the page: scope uid 0 (_default), collection uid 8, max_ttl 72000.
    assert (fixed["scope_id"], fixed["collection_id"], fixed["max_ttl"]) == (0, 8, 72000)


def test_erratum_32_cache_transfer_is_74_bytes_with_the_40_byte_record():
    """The DCP_CACHE_TRANSFER example is 74 bytes (a 40-byte record + 5-byte key + 5-byte value); its grid
    shows 70, having lost 4 bytes between offsets 40 and 60."""
    data = ref("cache-transfer")
    assert len(data) == 74 and data[60:62] == b"\x00\x05" and data[63] == 0x0A and data[64:69] == b"hello"
    with pytest.raises(ProtocolError, match="70 " + TRAILING):
        decode_all(upstream("cache-transfer"))
    # The grid is the corrected packet with 4 bytes lost between offsets 40 and 60.
    printed = upstream("cache-transfer")
    assert printed[:40] == data[:40] and printed[40:44] == data[44:48] and printed[56:] == data[60:]


def test_erratum_36_rollback_response_is_only_a_u64_seqno():
    """A ROLLBACK answer to a stream request carries only the u64 rollback seqno, not a failover log."""
    ok = DcpStreamRequestResponse(Status.ROLLBACK, rollback_seqno=0x1234, opaque=7).encode()
    assert len(ok) == 32 and rules.problems(one_frame(ok)) == []
    log_and_seqno = response(Opcode.DCP_STREAM_REQ, Status.ROLLBACK, value=bytes(24), opaque=7)
    (p,) = rules.problems(one_frame(log_and_seqno))
    assert "u64 rollback seqno" in p.reason


def test_erratum_41_failover_log_oldest_first_is_reported():
    """A failover log listed oldest-first (as failure-scenarios.md prints it) breaks the wire rule of
    newest first, and is reported."""
    oldest_first = FailoverLogResponse(tuple(reversed(FAILOVER_LOG)), opaque=1).encode()
    assert any("newest-first" in r for r in reasons(oldest_first))


def test_upstream_examples_list_their_errata():
    """Every upstream example kept as printed names the erratum it illustrates."""
    assert {n for _, n, _ in UPSTREAM_EXAMPLES.values()} == {
        2, 3, 4, 5, 6, 7, 8, 10, 11, 15, 16, 21, 22, 24, 25, 26, 27, 28, 29, 30, 32}
    assert {n for _, n, _ in UPSTREAM_UNDETECTED.values()} == {1, 9, 14, 25, 31}
    assert h("80 'a' | 0A") == "80610a"


def test_open_example_is_a_consumer_open():
    msg = REFERENCE_FRAMES["open-connection request"][1]
    assert msg.flags == 0 and not msg.flags & OpenFlag.PRODUCER and msg.consumer_name is None
