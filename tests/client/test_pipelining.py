"""Pipelined requests: `corked()` sends a burst as one write, in order, even when the block raises;
`call_many` returns the replies in request order within one timeout, and fails (never hangs) when
the connection is lost or the server stays silent. Against the real server, the failover logs
of every vbucket, asked in one burst, are the engine's own."""

import asyncio

import pytest

from dcpflow.client import DcpClient
from dcpflow.client.connection import Connection, RawRequest
from dcpflow.client.errors import ConnectionLostError
from dcpflow.protocol.frame import decode_all
from dcpflow.protocol.kv import error_response
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from tests.fakes import FakeTransport

from .conftest import NUM_VBUCKETS, PASSWORD, USER, run, url


def _opaques(data: bytes) -> list[int]:
    return [f.opaque for f in decode_all(data)]


def test_corked_sends_leave_as_one_write_in_order():
    async def main():
        conn = Connection(("127.0.0.1", 0))
        conn.connection_made(t := FakeTransport())
        with conn.corked():
            for vb in range(5):
                conn.request(RawRequest(Opcode.GET_FAILOVER_LOG, vbucket=vb), callback=lambda f: None)
            with conn.corked():  # nested: still the outer block's write
                conn.request(RawRequest(Opcode.GET_FAILOVER_LOG, vbucket=5), callback=lambda f: None)
            assert t.written == []
        assert len(t.written) == 1
        assert [f.vbucket for f in decode_all(t.written[0])] == [0, 1, 2, 3, 4, 5]
        conn.send(b"\x80")  # uncorked again: written at once
        assert len(t.written) == 2
    run(main())


def test_corked_writes_what_was_sent_when_the_block_raises():
    async def main():
        conn = Connection(("127.0.0.1", 0))
        conn.connection_made(t := FakeTransport())
        with pytest.raises(RuntimeError), conn.corked():
            conn.request(RawRequest(Opcode.GET_FAILOVER_LOG, vbucket=3), callback=lambda f: None)
            raise RuntimeError("boom")
        assert [f.vbucket for f in decode_all(t.written[0])] == [3]  # its reply is still awaited
    run(main())


async def _call_many(n: int):
    """A connection with `n` failover-log requests in flight through call_many: (the connection,
    its transport, the call's task, the requests' opaques in order)."""
    conn = Connection(("127.0.0.1", 0))
    conn.connection_made(t := FakeTransport())
    task = asyncio.ensure_future(conn.call_many(
        [RawRequest(Opcode.GET_FAILOVER_LOG, vbucket=vb) for vb in range(n)], timeout=5))
    await asyncio.sleep(0)
    return conn, t, task, _opaques(t.written[0])


def _answer(conn: Connection, opaque: int) -> None:
    reply = error_response(Opcode.GET_FAILOVER_LOG, Status.SUCCESS, opaque)
    conn._control(reply, 0, len(reply))


def test_call_many_returns_replies_in_request_order():
    async def main():
        conn, t, task, opaques = await _call_many(4)
        assert len(t.written) == 1
        # the server answers out of order; each reply goes to its own request
        for i in (2, 0, 3, 1):
            _answer(conn, opaques[i])
        replies = await task
        assert [r.opaque for r in replies] == opaques
        assert await conn.call_many([], timeout=1) == []
    run(main())


def test_call_many_fails_when_the_connection_is_lost():
    async def main():
        conn, _, task, opaques = await _call_many(3)
        _answer(conn, opaques[0])
        conn.connection_lost(None)
        with pytest.raises(ConnectionLostError):
            await task
    run(main())


def test_call_many_times_out_when_the_server_is_silent():
    async def main():
        conn = Connection(("127.0.0.1", 0))
        conn.connection_made(FakeTransport())
        with pytest.raises(TimeoutError):
            await conn.call_many([RawRequest(Opcode.GET_FAILOVER_LOG, vbucket=0)], timeout=0.05)
    run(main())


def test_failover_logs_of_every_vbucket_are_the_engines(server, writer):
    for i in range(200):
        writer.set(f"k{i}".encode(), b"{}", datatype=1)

    def engine_logs():
        bucket = server.server.buckets["default"].engine
        return {vb: [(e.uuid, e.seqno) for e in bucket.vbucket(vb).failover.entries] for vb in range(NUM_VBUCKETS)}
    expected = server.call(engine_logs)

    async def main():
        async with await DcpClient.connect(url(server.port), username=USER, password=PASSWORD) as client:
            return await client.failover_logs(range(NUM_VBUCKETS)), await client.failover_logs([7, 3])
    logs, two = run(main())
    assert logs == expected
    assert two == {7: expected[7], 3: expected[3]}
