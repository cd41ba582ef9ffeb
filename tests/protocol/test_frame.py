"""The frame codec: header layouts and flexible framing extras (KV-Engine's BinaryProtocol.md,
https://github.com/couchbase/kv_engine/blob/master/docs/BinaryProtocol.md), and the incremental
decoder's contract (chunking, limits, errors)."""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcpflow.protocol import frame as fr
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import (
    Frame,
    FrameDecoder,
    Magic,
    RequestFrameId,
    decode_all,
    encode_frame,
    encode_frame_info,
    stream_id_frame,
    unframe_stream_id,
)
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status


def test_request_header_layout_matches_the_table():
    data = fr.request(Opcode.SET, key=b"Hello", extras=b"\xde\xad\xbe\xef\x00\x00\x0e\x10", value=b"World",
                      vbucket=0x0203, opaque=0x11223344, cas=0x0102030405060708, datatype=1)
    assert data[0] == 0x80 and data[1] == 0x01
    assert data[2:4] == b"\x00\x05"  # key length u16
    assert data[4] == 8  # extras length
    assert data[5] == 1  # datatype
    assert data[6:8] == b"\x02\x03"  # vbucket
    assert data[8:12] == (8 + 5 + 5).to_bytes(4, "big")  # total body
    assert data[12:16] == b"\x11\x22\x33\x44"
    assert data[16:24] == bytes(range(1, 9))
    assert data[24:] == b"\xde\xad\xbe\xef\x00\x00\x0e\x10HelloWorld"


def test_response_carries_status_where_a_request_has_the_vbucket():
    data = fr.response(Opcode.GET, Status.KEY_ENOENT, opaque=9, value=b"Not found")
    (f,) = decode_all(data)
    assert f.magic == Magic.RESPONSE and f.is_response
    assert f.status == Status.KEY_ENOENT and data[6:8] == b"\x00\x01"
    assert f.value == b"Not found"


def test_alt_request_uses_byte2_for_framing_and_byte3_for_key_length():
    framing = fr.stream_id_frame(0x1234)
    data = fr.request(Opcode.DCP_MUTATION, key=b"k" * 7, extras=b"E" * 31, value=b"v", framing=framing)
    assert data[0] == Magic.ALT_REQUEST
    assert data[2] == 3 and data[3] == 7
    assert framing == b"\x22\x12\x34"  # id 2, length 2, u16 stream id
    (f,) = decode_all(data)
    assert f.framing == framing and f.key == b"k" * 7 and f.extras == b"E" * 31 and f.value == b"v"
    assert f.stream_id == 0x1234


def test_alt_response_magic_0x18_with_server_duration_frame():
    enc = fr.encode_server_duration(1000)
    framing = fr.encode_frame_info(fr.ResponseFrameId.SERVER_DURATION, enc.to_bytes(2, "big"))
    data = fr.response(Opcode.GET, framing=framing, value=b"x")
    assert data[0] == 0x18
    (f,) = decode_all(data)
    assert f.frame_infos == [(0, enc.to_bytes(2, "big"))]
    assert abs(fr.decode_server_duration(enc) - 1000) / 1000 < 0.01


def test_classic_magic_refuses_framing_extras_and_alt_refuses_long_keys():
    with pytest.raises(ValueError, match="cannot carry framing"):
        fr.encode_frame(Magic.REQUEST, 0, framing=b"\x00")
    with pytest.raises(ValueError, match="255"):
        fr.encode_frame(Magic.ALT_REQUEST, 0, key=b"k" * 256, framing=b"\x00")


@pytest.mark.parametrize("fid,payload,encoded", [
    (0, b"", b"\x00"),
    (1, b"\x01", b"\x11\x01"),
    (1, b"\x02\x00\x64", b"\x13\x02\x00\x64"),
    (5, b"", b"\x50"),
    (14, b"a" * 14, b"\xee" + b"a" * 14),
    (15, b"", b"\xf0\x00"),  # id escape: 15 + next byte (0)
    (20, b"x", b"\xf1\x05x"),  # id 15+5
    (4, b"u" * 15, b"\x4f\x00" + b"u" * 15),  # length escape: 15 + next byte
    (16, b"u" * 20, b"\xff\x01\x05" + b"u" * 20),  # both escaped: id byte first, then length byte
])
def test_frame_info_nibbles_and_escapes(fid, payload, encoded):
    assert fr.encode_frame_info(fid, payload) == encoded
    assert fr.decode_frame_infos(encoded) == [(fid, payload)]


@given(st.lists(st.tuples(st.integers(0, 270), st.binary(max_size=270)), max_size=5))
def test_frame_infos_round_trip(infos):
    data = b"".join(fr.encode_frame_info(i, p) for i, p in infos)
    assert fr.decode_frame_infos(data) == infos


@pytest.mark.parametrize("data", [b"\x12\x01", b"\xf0", b"\x0f", b"\x2f\x05abc"])
def test_truncated_frame_infos_are_protocol_errors(data):
    with pytest.raises(ProtocolError):
        fr.decode_frame_infos(data)


@pytest.mark.parametrize("framing,status,reason", [
    (b"\x01\x00", Status.EINVAL, "BARRIER must be empty"),
    (b"\x12\x01\x02", Status.EINVAL, "1 or 3 bytes"),
    (b"\x11\x04", Status.DURABILITY_INVALID_LEVEL, "level 4"),
    (b"\x13\x01\x00\x00", Status.EINVAL, "reserved"),
    (b"\x13\x01\xff\xff", Status.EINVAL, "reserved"),
    (b"\x22\x00\x00", Status.DCP_STREAM_ID_INVALID, "stream-id 0"),
    (b"\x21\x01", Status.EINVAL, "2 bytes"),
    (b"\x30", Status.UNKNOWN_FRAME_INFO, "unknown frame info id 3"),
    (b"\x40", Status.EINVAL, "needs a name"),
    (b"\x51\x00", Status.EINVAL, "PRESERVE_TTL must be empty"),
    (b"\x81\x00", Status.UNKNOWN_FRAME_INFO, "unknown frame info id 8"),
])
def test_request_frame_info_rules(framing, status, reason):
    (problem,) = fr.check_request_frame_infos(framing)
    assert problem.status == status and reason in problem.reason


def test_valid_request_frame_infos_have_no_problems():
    framing = b"\x00" + fr.durability_frame(1, 5000) + b"\x50" + b"\x45admin" + fr.stream_id_frame(7)
    assert fr.check_request_frame_infos(framing) == []


def _sample_frames():
    return [
        fr.request(Opcode.GET, key=b"a", opaque=1),
        fr.request(Opcode.SET, key=b"bb", extras=b"\x00" * 8, value=b"v" * 300, opaque=2),
        fr.response(Opcode.GET, value=b"x" * 70000, extras=b"\x00" * 4, opaque=3),
        fr.request(Opcode.DCP_NOOP, opaque=4),
        fr.request(Opcode.DCP_MUTATION, key=b"k", extras=b"\x00" * 31, framing=fr.stream_id_frame(9), opaque=5),
    ]


def test_decoder_yields_frames_fed_one_byte_at_a_time():
    data = b"".join(_sample_frames())
    dec = FrameDecoder()
    out = []
    for i in range(len(data)):
        dec.feed(data[i:i + 1])
        out.extend(dec.frames())
    assert [f.opaque for f in out] == [1, 2, 3, 4, 5]
    assert out == decode_all(data)
    assert dec.buffered == 0


@given(st.lists(st.integers(1, 5000), max_size=60))
def test_any_chunking_gives_the_same_frames(cuts):
    data = b"".join(_sample_frames())
    expected = decode_all(data)
    dec = FrameDecoder()
    out, pos = [], 0
    for n in cuts:
        dec.feed(data[pos:pos + n])
        pos += n
        out.extend(dec)
    dec.feed(data[pos:])
    out.extend(dec)
    assert out == expected


def test_large_frame_is_assembled_without_quadratic_copies():
    value = bytes(range(256)) * (4 * 1024 * 1024 // 256)
    data = fr.request(Opcode.SET, key=b"big", extras=b"\x00" * 8, value=value)
    dec = FrameDecoder()
    dec.feed(data[:1000])
    assert list(dec) == []
    for i in range(1000, len(data), 65536):
        dec.feed(data[i:i + 65536])
        assert dec._chunks is None or len(dec._chunks) <= (len(data) // 65536) + 2
    (f,) = list(dec)
    assert f.value == value and f.key == b"big"


def test_oversize_body_is_fatal_e2big_and_poisons_the_decoder():
    dec = FrameDecoder(max_body_len=100)
    dec.feed(fr.request(Opcode.SET, key=b"k", value=b"v" * 200))
    with pytest.raises(ProtocolError) as e:
        list(dec)
    assert e.value.fatal and e.value.status == Status.E2BIG and "limit of 100" in e.value.reason
    dec.feed(fr.request(Opcode.NOOP))
    with pytest.raises(ProtocolError):
        list(dec)


def test_default_limit_is_20_mib_plus_headers():
    header = struct.pack(">BBHBBHIIQ", 0x80, 1, 0, 0, 0, 0, fr.DEFAULT_MAX_BODY_LEN + 1, 0, 0)
    dec = FrameDecoder()
    dec.feed(header)
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        list(dec)
    assert fr.DEFAULT_MAX_BODY_LEN >= 20 * 1024 * 1024


def test_a_server_decoder_refuses_an_oversize_request_under_the_packet_limit_and_goes_on():
    """kv_engine's rule (DocumentSizeLimits.md): a frame up to max_packet_size is read and refused,
    only a bigger one ends the connection. The refused body is skipped as it arrives, never held."""
    dec = FrameDecoder(max_body_len=100, max_packet_len=10_000)
    big = fr.request(Opcode.SET, key=b"k", extras=bytes(8), value=b"v" * 5000, opaque=41)
    dec.feed(fr.request(Opcode.NOOP, opaque=40) + big[:300])
    frames = dec.frames()
    assert next(frames).opaque == 40
    with pytest.raises(ProtocolError) as e:
        next(frames)
    assert not e.value.fatal and e.value.status == Status.E2BIG and e.value.opaque == 41
    assert e.value.opcode == Opcode.SET and "limit of 100" in e.value.reason
    for i in range(300, len(big), 700):  # the rest of the body trickles in and is dropped
        dec.feed(big[i:i + 700])
        assert dec.buffered == 0 and list(dec) == []
    dec.feed(fr.request(Opcode.NOOP, opaque=42))
    assert [f.opaque for f in dec] == [42]


def test_a_whole_oversize_request_in_the_buffer_is_passed_over():
    dec = FrameDecoder(max_body_len=100, max_packet_len=10_000)
    dec.feed(fr.request(Opcode.SET, value=b"v" * 500, opaque=1) + fr.request(Opcode.NOOP, opaque=2))
    with pytest.raises(ProtocolError) as e:
        list(dec)
    assert e.value.status == Status.E2BIG and not e.value.fatal
    assert [f.opaque for f in dec] == [2]


def test_a_frame_over_the_packet_limit_or_an_oversize_response_is_fatal():
    dec = FrameDecoder(max_body_len=100, max_packet_len=1000)
    dec.feed(fr.request(Opcode.SET, value=b"v" * 1000))
    with pytest.raises(ProtocolError) as e:
        list(dec)
    assert e.value.fatal and e.value.status == Status.E2BIG and "maximum packet size of 1000" in e.value.reason
    dec = FrameDecoder(max_body_len=100, max_packet_len=1000)
    dec.feed(fr.response(Opcode.GET, value=b"v" * 500))  # a reply cannot be answered: no refusal for it
    with pytest.raises(ProtocolError) as e:
        list(dec)
    assert e.value.fatal


def test_a_strict_decoder_makes_inconsistent_lengths_fatal():
    """kv_engine disconnects a client whose extras and key run past the body (a server decoder is
    strict); a plain decoder reports the frame and goes on (below)."""
    bad = struct.pack(">BBHBBHIIQ", 0x80, 0x01, 10, 8, 0, 0, 12, 77, 0) + b"\x00" * 12
    dec = FrameDecoder(strict=True)
    dec.feed(bad + fr.request(Opcode.NOOP, opaque=78))
    with pytest.raises(ProtocolError) as e:
        list(dec)
    assert e.value.fatal and e.value.opaque == 77 and "exceed the total body length 12" in e.value.reason
    with pytest.raises(ProtocolError):
        list(dec)  # poisoned: the NOOP behind it is never decoded


def test_bad_magic_is_fatal():
    dec = FrameDecoder()
    dec.feed(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    with pytest.raises(ProtocolError) as e:
        list(dec)
    assert e.value.fatal and "invalid magic 0x47" in e.value.reason


def test_inconsistent_lengths_are_not_fatal_and_decoding_continues():
    bad = struct.pack(">BBHBBHIIQ", 0x80, 0x01, 10, 8, 0, 0, 12, 77, 0) + b"\x00" * 12
    good = fr.request(Opcode.NOOP, opaque=78)
    dec = FrameDecoder()
    dec.feed(bad + good)
    with pytest.raises(ProtocolError) as e:
        list(dec)
    assert not e.value.fatal and e.value.opaque == 77 and e.value.status == Status.EINVAL
    assert "exceed the total body length 12" in e.value.reason
    assert [f.opaque for f in dec] == [78]


def test_feeding_while_a_frames_iterator_is_suspended_keeps_order():
    a, b, c = (fr.request(Opcode.NOOP, opaque=i) for i in (1, 2, 3))
    dec = FrameDecoder()
    dec.feed(a + b)
    it = dec.frames()
    assert next(it).opaque == 1
    dec.feed(c)
    assert [f.opaque for f in it] == [2, 3]  # the suspended iterator takes in what was fed meanwhile
    assert list(dec) == []


def test_a_backlog_is_not_copied_on_every_feed():
    """Bytes fed behind unread frames wait in a list: a client pipelining faster than the server
    runs its requests must not make each feed copy the whole backlog (quadratic)."""
    frame = fr.request(Opcode.NOOP)
    dec = FrameDecoder()
    dec.feed(frame * 2)
    it = dec.frames()
    next(it)
    buf = dec._buf
    for _ in range(1000):
        dec.feed(frame)
    assert dec._buf is buf and dec.buffered == len(frame) * 1001
    assert sum(1 for _ in it) == 1001 and dec.buffered == 0


def test_peek_leaves_the_frames_buffered_until_consume_says_they_are_done():
    """The request loop's way in: the next frames in a list (up to the limit; one at a time
    without the compiled splitter), consumed only as far as it ran them."""
    frames = [fr.request(Opcode.NOOP, opaque=i) for i in range(5)]
    dec = FrameDecoder()
    dec.feed(b"".join(frames))
    first = dec.peek(3)
    assert 1 <= len(first) <= 3 and [f.opaque for f in first] == list(range(len(first)))
    if fr._split is not None:
        assert len(first) == 3
        assert dec.peek(3) == first and dec.buffered == 5 * 24  # nothing consumed yet
    dec.consume(1)
    assert dec.buffered == 4 * 24
    dec.feed(fr.request(Opcode.NOOP, opaque=5))  # fed while frames wait: they keep their place
    seen = []
    while batch := dec.peek(64):
        seen += [f.opaque for f in batch]
        dec.consume(len(batch))
    assert seen == [1, 2, 3, 4, 5] and dec.buffered == 0


def test_decode_all_rejects_trailing_bytes():
    with pytest.raises(ProtocolError, match="trailing"):
        decode_all(fr.request(Opcode.NOOP) + b"\x80")


@given(st.builds(Frame, st.sampled_from([0x80, 0x81]), st.integers(0, 255), st.integers(0, 255),
                 st.integers(0, 0xFFFF), st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1), st.just(b""),
                 st.binary(max_size=40), st.binary(max_size=300), st.binary(max_size=300)))
def test_classic_frames_round_trip(f):
    assert decode_all(f.encode()) == [f]


@given(st.builds(Frame, st.sampled_from([0x08, 0x18]), st.integers(0, 255), st.integers(0, 255),
                 st.integers(0, 0xFFFF), st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1),
                 st.binary(max_size=255), st.binary(max_size=40), st.binary(max_size=255),
                 st.binary(max_size=300)))
def test_alt_frames_round_trip(f):
    assert decode_all(f.encode()) == [f]


@settings(max_examples=300, deadline=None)
@given(opcode=st.integers(0, 255), key=st.binary(max_size=255), extras=st.binary(max_size=40),
       value=st.binary(max_size=300), vbucket=st.integers(0, 0xFFFF), opaque=st.integers(0, 0xFFFFFFFF),
       cas=st.integers(0, 2**64 - 1), datatype=st.integers(0, 7), sid=st.integers(1, 0xFFFF),
       other=st.sampled_from([b"", encode_frame_info(RequestFrameId.BARRIER)]), pad=st.binary(max_size=8))
def test_unframe_stream_id_restores_the_classic_frame(opcode, key, extras, value, vbucket, opaque, cas, datatype,
                                                      sid, other, pad):
    """A stream message a producer framed with a stream-id (magic 0x08) unframes to the message
    it would have sent without the feature, wherever it lies in a buffer and whatever other frame
    infos ride along."""
    classic = encode_frame(Magic.REQUEST, opcode, key=key, extras=extras, value=value, vbucket_or_status=vbucket,
                           opaque=opaque, cas=cas, datatype=datatype)
    alt = encode_frame(Magic.ALT_REQUEST, opcode, key=key, extras=extras, value=value, vbucket_or_status=vbucket,
                       opaque=opaque, cas=cas, datatype=datatype, framing=other + stream_id_frame(sid))
    buf = pad + alt + pad
    assert unframe_stream_id(buf, len(pad), len(pad) + len(alt)) == (sid, classic)
    assert unframe_stream_id(classic, 0, len(classic)) == (None, classic)
