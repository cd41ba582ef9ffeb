"""Decoder fuzzing: arbitrary bytes only ever produce frames/messages or a ProtocolError — never
another exception, never a hang (every step consumes input, and hypothesis enforces a deadline)."""

import contextlib
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcpflow.protocol import dcp, rules
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import FrameDecoder
from dcpflow.protocol.opcodes import Opcode

FUZZ = settings(max_examples=400, deadline=1000, suppress_health_check=[HealthCheck.too_slow])
OPCODES = [int(o) for o in Opcode]


def _drain(decoder_cls, data: bytes, chunk: int, typed: bool):
    """Feed data in chunks, draining after each; after a non-fatal error keep going, as a server does."""
    dec = decoder_cls(max_body_len=4096)
    out = []
    for i in range(0, len(data), chunk):
        dec.feed(data[i:i + chunk])
        for _ in range(len(data) + 2):  # bounded: each round either yields, raises, or stops
            try:
                for item in (dec.messages() if typed else dec.frames()):
                    out.append(item)
                    if not typed:
                        rules.problems(item)
                        with contextlib.suppress(ProtocolError):
                            dcp.decode_dcp(item)
                break
            except ProtocolError as e:
                if e.fatal:
                    return out
    return out


def near_valid_frames():
    """Headers that look right (real magics and opcodes) with random lengths and bodies."""
    header = st.tuples(
        st.sampled_from([0x80, 0x81, 0x08, 0x18, 0x82, 0x83]), st.sampled_from(OPCODES),
        st.integers(0, 0xFFFF), st.integers(0, 255), st.integers(0, 7), st.integers(0, 0xFFFF),
        st.integers(0, 300), st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1))
    return st.lists(
        st.tuples(header, st.binary(max_size=300)).map(
            lambda t: struct.pack(">BBHBBHIIQ", *t[0]) + t[1][: t[0][6]]), min_size=1, max_size=6
    ).map(b"".join)


@FUZZ
@given(st.binary(max_size=2000), st.integers(1, 64))
def test_random_bytes_never_escape_as_other_exceptions(data, chunk):
    _drain(FrameDecoder, data, chunk, typed=False)
    _drain(dcp.DcpDecoder, data, chunk, typed=True)


@FUZZ
@given(near_valid_frames(), st.integers(1, 97))
def test_near_valid_frames_never_escape_as_other_exceptions(data, chunk):
    _drain(FrameDecoder, data, chunk, typed=False)
    _drain(dcp.DcpDecoder, data, chunk, typed=True)


@FUZZ
@given(st.sampled_from(sorted(dcp.REQUEST_TYPES)), st.binary(max_size=60), st.binary(max_size=40),
       st.binary(max_size=80), st.integers(0, 7), st.integers(0, 2**64 - 1))
def test_every_dcp_decoder_rejects_garbage_bodies_cleanly(opcode, extras, key, value, datatype, cas):
    from dcpflow.protocol.frame import Frame
    f = Frame(0x80, opcode, datatype, 0, 0, cas, b"", extras, key, value)
    try:
        msg = dcp.decode_dcp(f)
    except ProtocolError as e:
        assert e.reason and e.status
    else:
        assert not rules.problems(f)  # a frame that decodes must break no rule
        assert msg.opcode == opcode
