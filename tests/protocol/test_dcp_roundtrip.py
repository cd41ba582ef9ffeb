"""Round-trips of every DCP message type: encode -> FrameDecoder / DcpDecoder -> the same message.

Also pins that DcpDecoder's fast path (mutation, deletion, V1 marker decoded straight from the
buffer) and its slow path (Frame -> decode_dcp) agree on every message, however the bytes are
chunked, and on every malformed fast-path-shaped frame (both refuse it with the same error).
"""

import json
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcpflow.protocol import dcp, rules
from dcpflow.protocol.dcp import (
    CacheTransferRecord,
    DcpAbort,
    DcpAddStream,
    DcpAddStreamResponse,
    DcpBufferAck,
    DcpCacheTransfer,
    DcpCacheTransferEnd,
    DcpCloseStream,
    DcpCommit,
    DcpControl,
    DcpDecoder,
    DcpDeletion,
    DcpExpiration,
    DcpGetFailoverLog,
    DcpMutation,
    DcpNoop,
    DcpOpen,
    DcpOsoSnapshot,
    DcpPrepare,
    DcpSeqnoAcknowledged,
    DcpSeqnoAdvanced,
    DcpSetVbucketState,
    DcpSnapshotMarker,
    DcpStreamEnd,
    DcpStreamRequest,
    DcpStreamRequestResponse,
    DcpSystemEvent,
    FailoverLogResponse,
    MarkerVersion,
    OpenFlag,
    StreamFlag,
    decode_dcp,
)
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import FrameDecoder, decode_all
from dcpflow.protocol.kv import RawResponse
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

u8 = st.integers(0, 0xFF)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
u64 = st.integers(0, 0xFFFFFFFFFFFFFFFF)
vbucket = st.integers(0, 1023) | u16
opaque = u32
key = st.binary(min_size=1, max_size=250)
value = st.binary(max_size=300)
datatype = st.integers(0, 7)
stream_id = st.none() | st.integers(1, 0xFFFF)
seqno = u64


def open_flags():
    """Flag sets DCP_OPEN accepts: no 0x02, 0x10 or 0x80, not NoValue (0x08) with
    NoValueWithUnderlyingDatatype (0x40)."""
    def fix(flags):
        flags &= ~(OpenFlag.INVALID_NOTIFIER | OpenFlag.UNUSED | OpenFlag.PITR_REMOVED)
        if flags & OpenFlag.NO_VALUE and flags & OpenFlag.NO_VALUE_WITH_UNDERLYING_DATATYPE:
            flags &= ~OpenFlag.NO_VALUE
        if flags & OpenFlag.INCLUDE_DELETED_USER_XATTRS:
            flags |= OpenFlag.INCLUDE_XATTRS
        if not flags & OpenFlag.PRODUCER:
            flags &= ~OpenFlag.SKIP_DELETES_IN_INITIAL_BACKFILL
        return int(flags)
    return st.integers(0, 0x3FF).map(fix)


@st.composite
def dcp_open(draw):
    flags = draw(open_flags())
    val = b""
    if not flags & OpenFlag.PRODUCER and draw(st.booleans()):
        val = json.dumps({"consumer_name": draw(st.text(max_size=20))}).encode()
    return DcpOpen(draw(key), flags, val, draw(opaque), draw(u32))


def stream_flags():
    def fix(flags):
        flags &= ~StreamFlag.NO_VALUE_REMOVED
        if flags & StreamFlag.CACHE_TRANSFER:
            flags &= StreamFlag.CACHE_TRANSFER | StreamFlag.TAKEOVER | StreamFlag.ACTIVE_VB_ONLY
        return int(flags)
    return st.integers(0, 0x1FF).map(fix)


@st.composite
def stream_request(draw):
    doc = draw(st.fixed_dictionaries({}, optional={
        "uid": st.text(alphabet="0123456789abcdef", min_size=1, max_size=4),
        "sid": st.integers(1, 0xFFFF),
        "collections": st.lists(st.text(alphabet="0123456789abcdef", min_size=1, max_size=4), max_size=3),
        "purge_seqno": st.text(alphabet="0123456789", min_size=1, max_size=5),
    }))
    val = json.dumps(doc).encode() if doc or draw(st.booleans()) else b""
    return DcpStreamRequest(draw(vbucket), draw(seqno), draw(seqno), draw(u64), draw(seqno), draw(seqno),
                            draw(stream_flags()), val, draw(opaque), draw(u32))


@st.composite
def snapshot_marker(draw):
    a, b = draw(seqno), draw(seqno)
    kind = draw(st.sampled_from([0, 0x01, 0x02]))
    flags = kind | draw(st.sampled_from([0, 0x04, 0x08, 0x10, 0x20, 0x3C]))
    version = draw(st.sampled_from([MarkerVersion.V1, MarkerVersion.V2_0, MarkerVersion.V2_2]))
    mvs = hcs = purge = hps = 0
    if version != MarkerVersion.V1:
        mvs, hcs = draw(seqno), draw(seqno)
    if version == MarkerVersion.V2_2:
        purge, hps = draw(seqno), draw(seqno)
    return DcpSnapshotMarker(draw(vbucket), min(a, b), max(a, b), flags, version, mvs, hcs, purge, hps,
                             draw(opaque), draw(stream_id))


def mutation():
    return st.builds(DcpMutation, vbucket, seqno, seqno, u32, u32, u32, key, value, u64, datatype, opaque, u8,
                     stream_id)


def deletion():
    return st.builds(DcpDeletion, vbucket, seqno, seqno, key, value, u64, datatype, opaque, st.none() | u32,
                     stream_id)


def prepare():
    return st.builds(DcpPrepare, vbucket, seqno, seqno, u32, u32, u32, key, value, st.integers(1, 2**64 - 1),
                     st.integers(1, 3), st.booleans(), datatype, opaque, u8, stream_id)


def cache_record():
    return st.builds(CacheTransferRecord, u64, seqno, seqno, u32, u32, datatype, u8,
                     st.binary(min_size=2, max_size=40), st.binary(max_size=60))


REQUESTS = {
    DcpOpen: dcp_open(),
    DcpAddStream: st.builds(DcpAddStream, vbucket, stream_flags(), opaque),
    DcpCloseStream: st.builds(DcpCloseStream, vbucket, opaque, stream_id),
    DcpStreamRequest: stream_request(),
    DcpGetFailoverLog: st.builds(DcpGetFailoverLog, vbucket, opaque),
    DcpStreamEnd: st.builds(DcpStreamEnd, vbucket, u32, opaque, stream_id),
    DcpSnapshotMarker: snapshot_marker(),
    DcpMutation: mutation(),
    DcpDeletion: deletion(),
    DcpExpiration: st.builds(DcpExpiration, vbucket, seqno, seqno, key, u32, value, u64, datatype, opaque,
                             stream_id),
    DcpSetVbucketState: st.builds(DcpSetVbucketState, vbucket, st.integers(1, 4), opaque),
    DcpNoop: st.builds(DcpNoop, opaque),
    DcpBufferAck: st.builds(DcpBufferAck, u32, opaque, vbucket),
    DcpControl: st.builds(DcpControl, key, st.binary(min_size=1, max_size=40), opaque),
    DcpSystemEvent: st.builds(DcpSystemEvent, vbucket, seqno, u32, u8, st.binary(max_size=250), value, opaque,
                              stream_id),
    DcpPrepare: prepare(),
    DcpSeqnoAcknowledged: st.builds(DcpSeqnoAcknowledged, vbucket, seqno, opaque),
    DcpCommit: st.builds(DcpCommit, vbucket, seqno, seqno, key, opaque, stream_id),
    DcpAbort: st.builds(DcpAbort, vbucket, seqno, seqno, key, opaque, stream_id),
    DcpSeqnoAdvanced: st.builds(DcpSeqnoAdvanced, vbucket, seqno, opaque, stream_id),
    DcpOsoSnapshot: st.builds(DcpOsoSnapshot, vbucket, st.sampled_from([1, 2]), opaque, stream_id),
    DcpCacheTransfer: st.builds(DcpCacheTransfer, vbucket, st.lists(cache_record(), min_size=1, max_size=4).map(tuple),
                                opaque, stream_id),
    DcpCacheTransferEnd: st.builds(DcpCacheTransferEnd, vbucket, opaque, stream_id),
}


@st.composite
def failover_log(draw, min_size=0):
    seqnos = sorted(draw(st.lists(seqno, min_size=min_size, max_size=6)), reverse=True)
    return tuple((draw(u64), s) for s in seqnos)


error_status = st.sampled_from([s for s in Status if s not in (Status.SUCCESS, Status.ROLLBACK)])

RESPONSES = {
    "stream-request OK": st.builds(DcpStreamRequestResponse, st.just(Status.SUCCESS), failover_log(), st.none(),
                                   opaque, st.just(b"")),
    "stream-request ROLLBACK": st.builds(DcpStreamRequestResponse, st.just(Status.ROLLBACK), st.just(()), seqno,
                                         opaque, st.just(b"")),
    "stream-request error": st.builds(DcpStreamRequestResponse, error_status, st.just(()), st.none(), opaque,
                                      value),
    "failover-log OK": st.builds(FailoverLogResponse, failover_log(min_size=1), opaque, st.just(Status.SUCCESS),
                                 st.sampled_from([Opcode.DCP_GET_FAILOVER_LOG, Opcode.GET_FAILOVER_LOG])),
    "failover-log error": st.builds(FailoverLogResponse, st.just(()), opaque, error_status,
                                    st.sampled_from([Opcode.DCP_GET_FAILOVER_LOG, Opcode.GET_FAILOVER_LOG])),
    "add-stream OK": st.builds(DcpAddStreamResponse, u32, opaque, st.just(Status.SUCCESS)),
    "add-stream error": st.builds(DcpAddStreamResponse, st.just(0), opaque, error_status),
    "generic OK": st.builds(RawResponse, st.sampled_from([
        Opcode.DCP_OPEN, Opcode.DCP_NOOP, Opcode.DCP_CONTROL, Opcode.DCP_SET_VBUCKET_STATE,
        Opcode.DCP_SNAPSHOT_MARKER, Opcode.DCP_CLOSE_STREAM, Opcode.DCP_BUFFER_ACKNOWLEDGEMENT]),
        st.just(Status.SUCCESS), st.just(b""), opaque, st.just(0), u64),
    "generic error": st.builds(RawResponse, st.sampled_from([
        Opcode.DCP_MUTATION, Opcode.DCP_DELETION, Opcode.DCP_SNAPSHOT_MARKER, Opcode.DCP_CONTROL,
        Opcode.DCP_STREAM_END]), error_status, value, opaque, datatype, u64),
}


def test_strategies_cover_every_request_type():
    assert set(REQUESTS) == set(dcp.REQUEST_TYPES.values())
    assert set(dcp.RESPONSE_TYPES.values()) <= {DcpStreamRequestResponse, FailoverLogResponse, DcpAddStreamResponse}


any_request = st.one_of(*REQUESTS.values())
any_response = st.one_of(*RESPONSES.values())
any_message = any_request | any_response


def check_round_trip(msg):
    data = msg.encode()
    (frame,) = decode_all(data)
    assert rules.problems(frame) == []
    got = decode_dcp(frame)
    assert type(got) is type(msg) and got == msg
    assert got.encode() == data
    dec = DcpDecoder()
    dec.feed(data)
    (typed,) = list(dec.messages())
    assert type(typed) is type(msg) and typed == msg


@pytest.mark.parametrize("cls", sorted(REQUESTS, key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_request_round_trip(cls):
    @SETTINGS
    @given(REQUESTS[cls])
    def run(msg):
        check_round_trip(msg)
        if getattr(msg, "stream_id", None) is not None:
            data = msg.encode()
            assert data[0] == 0x08 and data[2] == 3 and data[24:27] == b"\x22" + msg.stream_id.to_bytes(2, "big")
    run()


@pytest.mark.parametrize("name", sorted(RESPONSES))
def test_response_round_trip(name):
    @SETTINGS
    @given(RESPONSES[name])
    def run(msg):
        check_round_trip(msg)
    run()


@pytest.mark.parametrize("cls", [c for c in REQUESTS if "stream_id" in c._fields], ids=lambda c: c.__name__)
def test_stream_id_is_carried_in_a_frame_info_and_costs_three_bytes(cls):
    @SETTINGS
    @given(REQUESTS[cls].filter(lambda m: m.stream_id is not None))
    def run(msg):
        with_sid = msg.encode()
        without = msg._replace(stream_id=None).encode()
        assert len(with_sid) == len(without) + 3
        assert with_sid[0] == 0x08 and without[0] == 0x80
        (frame,) = decode_all(with_sid)
        assert frame.stream_id == msg.stream_id
        assert decode_dcp(frame).stream_id == msg.stream_id
    run()


# ---------------------------------------------------------------------------------------------
# Fast path == slow path

def slow_path(data: bytes) -> list:
    return [decode_dcp(f) for f in decode_all(data)]


def typed_in_chunks(data: bytes, cuts) -> list:
    dec = DcpDecoder()
    out = []
    prev = 0
    for cut in sorted(set(cuts)) + [len(data)]:
        dec.feed(data[prev:cut])
        out.extend(dec.messages())
        prev = cut
    assert dec.buffered == 0
    return out


fast_messages = st.one_of(
    mutation().map(lambda m: m._replace(stream_id=None)),
    deletion().map(lambda m: m._replace(stream_id=None)),
    snapshot_marker().map(lambda m: m._replace(stream_id=None, version=MarkerVersion.V1, max_visible_seqno=0,
                                               high_completed_seqno=0, purge_seqno=0, high_prepared_seqno=0)),
)
mixed_messages = st.lists(fast_messages | any_message, min_size=1, max_size=12)


@SETTINGS
@given(mixed_messages)
def test_fast_and_slow_paths_agree_on_a_stream(msgs):
    data = b"".join(m.encode() for m in msgs)
    dec = DcpDecoder()
    dec.feed(data)
    typed = list(dec.messages())
    assert typed == slow_path(data) == msgs
    assert [type(m) for m in typed] == [type(m) for m in msgs]


@SETTINGS
@given(mixed_messages, st.data())
def test_any_chunking_gives_the_same_messages(msgs, data):
    stream = b"".join(m.encode() for m in msgs)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=20))
    got = typed_in_chunks(stream, cuts)
    assert got == msgs and [type(m) for m in got] == [type(m) for m in msgs]


@settings(max_examples=40, deadline=None)
@given(st.lists(fast_messages | any_request, min_size=1, max_size=5))
def test_one_byte_at_a_time(msgs):
    stream = b"".join(m.encode() for m in msgs)
    got = typed_in_chunks(stream, range(len(stream)))
    assert got == msgs and [type(m) for m in got] == [type(m) for m in msgs]


@pytest.mark.parametrize("msg", [
    DcpDeletion(1, 5, 1, b"k", delete_time=7),
    DcpDeletion(1, 5, 1, b"k"),
    DcpMutation(1, 4, 1, 0, 0, 0, b"k", b"v"),
    DcpSnapshotMarker(1, 0, 8),
], ids=["deletion-v2", "deletion-v1", "mutation", "marker-v1"])
def test_each_fast_path_message_fed_one_byte_at_a_time(msg):
    """Exercises every buffered length, including the 44 bytes where the V2 deletion's fused
    header+extras (45 bytes) is not yet whole."""
    data = msg.encode()
    for n in range(len(data) + 1):
        dec = DcpDecoder()
        dec.feed(data[:n])
        assert list(dec.messages()) == ([msg] if n == len(data) else [])
        dec.feed(data[n:])
        assert list(dec.messages()) == ([] if n == len(data) else [msg])


def test_interleaved_fast_and_slow_messages_in_one_buffer():
    msgs = [
        DcpSnapshotMarker(3, 1, 4, 0x05, opaque=9),
        DcpMutation(3, 1, 1, 0, 0, 0, b"a", b"1", opaque=9),
        DcpSystemEvent(3, 2, 0, 1, b"c", bytes(20), opaque=9),
        DcpDeletion(3, 3, 2, b"a", opaque=9, delete_time=5),
        DcpNoop(opaque=1),
        DcpDeletion(3, 4, 2, b"b", opaque=9),
        DcpSnapshotMarker(3, 5, 5, 0x02, MarkerVersion.V2_0, 5, 4, opaque=9),
        DcpMutation(3, 5, 1, 0, 0, 0, b"c", b"", opaque=9, stream_id=4),
        DcpStreamEnd(3, 0, opaque=9),
    ]
    data = b"".join(m.encode() for m in msgs)
    dec = DcpDecoder()
    dec.feed(data)
    assert list(dec.messages()) == msgs == slow_path(data)


def test_messages_fed_while_suspended_keep_their_order():
    a, b, c = (DcpMutation(0, i, 1, 0, 0, 0, b"k", b"v") for i in (1, 2, 3))
    dec = DcpDecoder()
    dec.feed(a.encode() + b.encode())
    it = dec.messages()
    assert next(it) == a
    dec.feed(c.encode())
    assert list(it) + list(dec.messages()) == [b, c]


# ---------------------------------------------------------------------------------------------
# Malformed fast-path-shaped frames: both paths refuse them alike

def _corrupt(data: bytes, field: str, n: int) -> bytes:
    b = bytearray(data)
    op = b[1]
    if field == "nmeta" and op == 0x57:
        b[52:54] = n.to_bytes(2, "big")
    elif field == "nmeta" and op == 0x58 and b[4] == 18:
        b[40:42] = n.to_bytes(2, "big")
    elif field == "keylen" and op in (0x57, 0x58):
        body = struct.unpack_from(">I", b, 8)[0] - struct.unpack_from(">H", b, 2)[0]
        b[2:4] = b"\x00\x00"
        b[8:12] = body.to_bytes(4, "big")
        del b[24 + b[4]:24 + b[4] + struct.unpack_from(">H", data, 2)[0]]
    elif field == "keylen" and op == 0x56:
        b[2:4] = b"\x00\x01"
        b[8:12] = b"\x00\x00\x00\x15"
        b.append(0x6B)
    elif field == "flags" and op == 0x56:
        b[40:44] = (n | 0x03 if n & 1 else n << 6).to_bytes(4, "big")[-4:]
    elif field == "order" and op == 0x56:
        b[24:32], b[32:40] = (2).to_bytes(8, "big"), (1).to_bytes(8, "big")
    elif field == "overrun":
        b[8:12] = (b[4] - 1).to_bytes(4, "big")
        del b[24 + b[4] - 1:]
    return bytes(b)


@SETTINGS
@given(fast_messages, st.sampled_from(["nmeta", "keylen", "flags", "order", "overrun"]), st.integers(1, 0xFFFF),
       st.lists(fast_messages, max_size=3))
def test_fast_and_slow_paths_refuse_the_same_malformed_frames(msg, field, n, after):
    bad = _corrupt(msg.encode(), field, n)
    stream = bad + b"".join(m.encode() for m in after)

    def outcome(run):
        try:
            return ("ok", run())
        except ProtocolError as e:
            return ("error", e.status, e.reason, e.fatal)

    def slow():
        dec = FrameDecoder()
        dec.feed(stream)
        return [decode_dcp(f) for f in dec.frames()]

    def fast():
        dec = DcpDecoder()
        dec.feed(stream)
        return list(dec.messages())

    assert outcome(fast) == outcome(slow)
    if bad != msg.encode():
        assert outcome(fast)[0] == "error"


def test_non_fatal_error_then_decoding_goes_on():
    good = DcpMutation(0, 9, 1, 0, 0, 0, b"k", b"v")
    bad = _corrupt(DcpMutation(0, 1, 1, 0, 0, 0, b"k", b"v").encode(), "nmeta", 1)
    dec = DcpDecoder()
    dec.feed(bad + good.encode())
    with pytest.raises(ProtocolError, match="nmeta") as e:
        list(dec.messages())
    assert not e.value.fatal
    assert list(dec.messages()) == [good]


def test_fatal_error_poisons_the_typed_decoder():
    dec = DcpDecoder(max_body_len=100)
    dec.feed(DcpMutation(0, 1, 1, 0, 0, 0, b"k", b"v" * 200).encode())
    for _ in range(2):
        with pytest.raises(ProtocolError) as e:
            list(dec.messages())
        assert e.value.fatal and e.value.status == Status.E2BIG
