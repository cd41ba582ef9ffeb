"""The connection's receive path (a BufferedProtocol): whatever the reads' sizes, every stream frame
reaches the sink once, in order, whole, and never changes after it was handed over; replies and
noops are taken out; a frame larger than the receive buffer arrives whole without being copied
piece by piece; garbage breaks the connection."""

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from dcpflow.client import connection as cmod
from dcpflow.client import framing
from dcpflow.client.connection import Connection
from dcpflow.protocol.dcp import DcpMutation, DcpNoop, DcpStreamEnd
from dcpflow.protocol.frame import HEADER_LEN, MAGIC_OPCODE_BODY
from dcpflow.protocol.kv import error_response
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from tests.fakes import FakeTransport


def _connection():
    conn = Connection(("127.0.0.1", 0))
    conn.connection_made(FakeTransport())
    got = []

    def sink(seg):
        # What a segment says now is what it must still say when the consumer decodes it.
        frames = []
        for start in seg.starts:
            _, _, body = MAGIC_OPCODE_BODY(seg.data, start)
            frames.append(bytes(seg.data[start:start + HEADER_LEN + body]))
        got.append((seg, frames))
    conn.sink = sink
    return conn, got


def _deliver(conn: Connection, data: bytes, sizes) -> None:
    """What the transport does: ask for a buffer, read at most that much into it, report it."""
    pos = 0
    sizes = iter(sizes)
    while pos < len(data):
        buf = conn.get_buffer(-1)
        n = min(len(buf), len(data) - pos, max(1, next(sizes, 1 << 30)))
        buf[:n] = data[pos:pos + n]
        conn.buffer_updated(n)
        pos += n


def _stream_frame(draw_value: bytes, seqno: int) -> bytes:
    return DcpMutation(key=b"k%d" % seqno, value=draw_value, by_seqno=seqno, rev_seqno=1, flags=0, expiration=0,
                       lock_time=0, vbucket=seqno % 4, opaque=7).encode()


@st.composite
def _traffic(draw):
    """Stream messages with replies and noops among them: (bytes, the stream frames in order)."""
    out, stream = [], []
    for seqno in range(1, draw(st.integers(1, 40)) + 1):
        kind = draw(st.sampled_from(["m", "m", "m", "big", "end", "noop", "reply"]))
        if kind in ("m", "big"):
            size = draw(st.integers(0, 300)) if kind == "m" else draw(st.integers(70_000, 200_000))
            frame = _stream_frame(bytes([seqno % 251]) * size, seqno)
            stream.append(frame)
        elif kind == "end":
            frame = DcpStreamEnd(vbucket=seqno % 4, opaque=7).encode()
            stream.append(frame)
        elif kind == "noop":
            frame = DcpNoop(opaque=seqno).encode()
        else:
            frame = error_response(Opcode.GET, Status.SUCCESS, 0xDEAD0000 + seqno)
        out.append(frame)
    return b"".join(out), stream


def _run(fn):
    async def main():
        return fn()
    return asyncio.run(main())


@settings(max_examples=60, deadline=None)
@given(_traffic(), st.lists(st.integers(1, 200_000), max_size=60))
def test_every_stream_frame_reaches_the_sink_once_in_order_and_stays_as_it_was(traffic, sizes):
    data, expected = traffic

    def check():
        conn, got = _connection()
        _deliver(conn, data, sizes)
        assert conn.lost is None
        assert [f for _, frames in got for f in frames] == expected
        for seg, frames in got:  # later reads never wrote over bytes already handed over
            assert [bytes(seg.data[s:s + len(f)]) for s, f in zip(seg.starts, frames, strict=True)] == frames
            assert seg.end == seg.starts[-1] + len(frames[-1])
        assert sum(seg.charged for seg, _ in got) == conn.charged_total == sum(map(len, expected))
        noops = sum(1 for w in conn.transport.written if w[1] == Opcode.DCP_NOOP)
        assert noops == conn.noops  # each noop answered, none left among the stream frames
        assert conn._wpos == conn._rpos and conn._need == 0  # nothing half-walked at the end
    _run(check)


def test_a_frame_larger_than_the_buffer_arrives_whole_in_one_buffer():
    big = _stream_frame(b"v" * (3 * framing.RECV_BUFFER), 1)
    data = _stream_frame(b"a", 2) + big + _stream_frame(b"b", 3)

    def check():
        conn, got = _connection()
        grown = []
        real = conn._grow
        conn._grow = lambda: (grown.append(conn._need), real())[1]
        _deliver(conn, data, [1000] + [4096] * 100000)
        assert [f for _, frames in got for f in frames] == [_stream_frame(b"a", 2), big, _stream_frame(b"b", 3)]
        # Once the header said how large it is, one buffer that holds it: not a copy per read.
        assert len(grown) <= 8
        assert any(need == len(big) for need in grown)
    _run(check)


def test_small_reads_keep_a_small_buffer():
    """A KV connection that sees only short replies never allocates a DCP-sized buffer."""
    def check():
        conn, _ = _connection()
        for i in range(100):
            _deliver(conn, error_response(Opcode.GET, Status.SUCCESS, 0xDEAD0000 + i), [7])
        assert len(conn._rbuf) <= 2 * framing.RECV_FIRST
    _run(check)


def test_garbage_breaks_the_connection():
    def check():
        conn, got = _connection()
        _deliver(conn, _stream_frame(b"x", 1) + b"\x42" + b"\x00" * 40, [10_000])
        assert conn.lost is not None and "invalid magic 0x42" in str(conn.lost)
        assert conn.transport.aborted
        assert got == []  # nothing of a read that broke the connection is handed on: it reconnects
    _run(check)


def test_an_oversized_body_breaks_the_connection_before_it_is_buffered():
    header = bytearray(_stream_frame(b"", 1)[:HEADER_LEN])
    header[8:12] = (cmod.MAX_BODY + 1).to_bytes(4, "big")

    def check():
        conn, _ = _connection()
        _deliver(conn, bytes(header), [HEADER_LEN])
        assert conn.lost is not None and "exceeds" in str(conn.lost)
        assert len(conn._rbuf) < cmod.MAX_BODY
    _run(check)
