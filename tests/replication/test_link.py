"""The cluster manager's Link walks frame headers only: whatever the reads' sizes, everything but
the replies to its own requests is relayed to the peer as the original bytes, in order; those
replies complete their requests; watched requests are seen and still relayed; a header that
cannot start a frame breaks the link."""

import asyncio
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcpflow.protocol import kv
from dcpflow.protocol.dcp import DcpMutation, DcpNoop, DcpSnapshotMarker, DcpStreamEnd
from dcpflow.protocol.frame import HEADER_LEN, decode_all, response
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from dcpflow.replication.link import MAX_BODY, Link
from tests.fakes import FakeTransport


def _pair() -> tuple[Link, Link]:
    link, peer = Link("node"), Link("peer")
    link.connection_made(FakeTransport())
    peer.connection_made(FakeTransport())
    link.link(peer)
    return link, peer


def _deliver(link: Link, data: bytes, sizes) -> None:
    pos, sizes = 0, iter(sizes)
    while pos < len(data):
        n = max(1, next(sizes, 1 << 30))
        link.data_received(data[pos:pos + n])
        pos += n


@st.composite
def _traffic(draw):
    """What a node sends the manager: stream messages (some with a stream-id frame), replies to
    others, noops, a large value - and, somewhere, the replies to the manager's own requests."""
    frames = []
    for seqno in range(1, draw(st.integers(1, 30)) + 1):
        kind = draw(st.sampled_from(["m", "m", "sid", "big", "end", "marker", "noop", "reply"]))
        if kind in ("m", "sid", "big"):
            size = draw(st.integers(0, 200)) if kind != "big" else draw(st.integers(70_000, 150_000))
            frames.append(DcpMutation(seqno % 4, seqno, 1, 0, 0, 0, b"k%d" % seqno, b"v" * size, opaque=7,
                                      stream_id=5 if kind == "sid" else None).encode())
        elif kind == "end":
            frames.append(DcpStreamEnd(seqno % 4, opaque=7).encode())
        elif kind == "marker":
            frames.append(DcpSnapshotMarker(seqno % 4, seqno, seqno, opaque=7).encode())
        elif kind == "noop":
            frames.append(DcpNoop(opaque=seqno).encode())
        else:  # a reply to someone else's request: relayed like the rest
            frames.append(response(Opcode.DCP_STREAM_REQ, opaque=0x100 + seqno))
    own = [draw(st.integers(0, len(frames))) for _ in range(2)]
    return frames, own


@pytest.mark.parametrize("trace", [False, True], ids=["walked", "traced"])
@settings(max_examples=60, deadline=None)
@given(_traffic(), st.lists(st.integers(1, 100_000), max_size=40))
def test_everything_but_own_replies_is_relayed_in_order_whatever_the_reads(trace, traffic, sizes):
    frames, own = traffic

    async def check():
        link, peer = _pair()
        link._trace = trace  # the debug log looks at every frame: the same result, frame by frame
        ended = []
        link.watch(Opcode.DCP_STREAM_END, lambda frame: ended.append(frame.vbucket))
        requests = [link.request(kv.SelectBucket(b"b%d" % i)) for i in range(len(own))]
        opaques = [decode_all(w)[0].opaque for w in link.transport.written]
        data = list(frames)
        for at, opaque in sorted(zip(own, opaques, strict=True), reverse=True):
            data.insert(at, response(Opcode.SELECT_BUCKET, Status.KEY_ENOENT, opaque=opaque))
        _deliver(link, b"".join(data), sizes)
        assert link.lost is None and not link.transport.aborted
        assert b"".join(peer.transport.written) == b"".join(frames)
        assert link.bytes_relayed == sum(map(len, frames))
        assert [r.done() and r.result().status for r in requests] == [Status.KEY_ENOENT] * len(own)
        assert ended == [decode_all(f)[0].vbucket for f in frames if f[1] == Opcode.DCP_STREAM_END]
        assert link._wpos == link._rpos and link._need == 0  # nothing half-walked at the end
    asyncio.run(check())


def test_a_frame_with_an_unknown_magic_breaks_the_link():
    async def check():
        link, peer = _pair()
        good = DcpNoop(opaque=1).encode()
        _deliver(link, good + b"\x42" + b"\x00" * 40, [10_000])
        assert link.transport.aborted and "invalid magic 0x42" in str(link.lost)
        assert b"".join(peer.transport.written) == b""  # nothing of a read that broke the link is relayed
    asyncio.run(check())


def test_an_oversized_body_breaks_the_link_before_it_is_buffered():
    async def check():
        link, _ = _pair()
        header = bytearray(DcpNoop(opaque=1).encode())
        header[8:12] = (MAX_BODY + 1).to_bytes(4, "big")
        _deliver(link, bytes(header[:HEADER_LEN]), [HEADER_LEN])
        assert link.transport.aborted and "exceeds" in str(link.lost)
        assert len(link._rbuf) < MAX_BODY  # nothing buffered for the body
    asyncio.run(check())


def test_a_link_relays_between_real_sockets(caplog):
    """Over 127.0.0.1: a node streams to the manager's Link, which relays to a peer node and
    answers its own request from the stream."""
    frames = [DcpMutation(1, s, 1, 0, 0, 0, b"k%d" % s, b"v" * (s * 97 % 3000), opaque=7).encode()
              for s in range(1, 400)]

    async def check():
        got = bytearray()
        done = asyncio.get_running_loop().create_future()
        expect = sum(map(len, frames))

        async def node(reader, writer):
            request = await reader.readexactly(HEADER_LEN)
            body = int.from_bytes(request[8:12], "big")
            opaque = decode_all(request + await reader.readexactly(body))[0].opaque
            half = len(frames) // 2
            writer.write(b"".join(frames[:half]) + response(Opcode.SELECT_BUCKET, opaque=opaque)
                         + b"".join(frames[half:]))
            await writer.drain()
            await done
            writer.close()

        async def sink(reader, writer):
            while len(got) < expect:
                got.extend(await reader.read(65536))
            done.set_result(None)
            writer.close()

        node_srv = await asyncio.start_server(node, "127.0.0.1", 0)
        sink_srv = await asyncio.start_server(sink, "127.0.0.1", 0)
        async with node_srv, sink_srv:
            link = await Link.open("127.0.0.1", node_srv.sockets[0].getsockname()[1])
            peer = await Link.open("127.0.0.1", sink_srv.sockets[0].getsockname()[1])
            link.link(peer)
            reply = await link.call(kv.SelectBucket(b"default"), timeout=30)
            await asyncio.wait_for(done, 30)
            link.close()
            peer.close()
        assert reply.status == Status.SUCCESS and reply.opcode == Opcode.SELECT_BUCKET
        assert bytes(got) == b"".join(frames)
    with caplog.at_level(logging.INFO, logger="dcpflow.replication"):
        asyncio.run(check())
