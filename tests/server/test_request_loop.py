"""The request loop (Connection._process) and the SET handler (kv.store), in process: an
authenticated connection to a real Server on a transport that records what is written.

Requests go in through data_received, as the event loop delivers them; nothing here depends on
how fast the machine is (a pass that runs out of its time budget goes on at the next pass of the
event loop, which the tests run to completion where it matters)."""

import asyncio
import tempfile
from unittest import mock

import pytest

from dcpflow.protocol.frame import Frame, request
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.opcodes import Opcode
from dcpflow.server import connection as connection_module
from dcpflow.server import kv
from dcpflow.server.app import Server, ServerConfig
from dcpflow.server.connection import Connection


def _hello(*features: int) -> bytes:
    return request(Opcode.HELLO, key=b"loop", value=b"".join(int(f).to_bytes(2, "big") for f in features))


async def _connect(features: tuple[int, ...] = ()) -> tuple[Server, Connection]:
    server = Server(ServerConfig(data_dir=tempfile.mkdtemp(prefix="dcpflow-loop-"), port=0, plain_over_tcp=True,
                                 flush_interval=1000, num_vbuckets=8))
    await server.start()
    conn = Connection(server)
    # a transport that records the replies (Writer asks is_closing, Connection get_extra_info)
    conn.connection_made(mock.Mock(**{"is_closing.return_value": False, "get_extra_info.return_value": None}))
    conn.data_received(_hello(*features) + request(Opcode.SASL_AUTH, key=b"PLAIN", value=b"\0Administrator\0password")
                       + request(Opcode.SELECT_BUCKET, key=b"default"))
    await _settled(conn)
    assert conn.bucket is not None
    return server, conn


async def _settled(conn: Connection) -> None:
    """Run the event loop until the connection has no request waiting and no pass scheduled."""
    while conn._waiting is not None or conn._pass_scheduled:
        await asyncio.sleep(0)


def _written(conn: Connection) -> bytes:
    return b"".join(c.args[0] for c in conn.transport.write.call_args_list)


def _run(body, features: tuple[int, ...] = ()) -> None:
    async def main():
        server, conn = await _connect(features)
        try:
            await body(conn)
        finally:
            await server.close()

    asyncio.run(main())


def _raw(magic: int, opcode: int, key: bytes = b"", extras: bytes = b"", value: bytes = b"", vbucket: int = 0,
         opaque: int = 0) -> bytes:
    body = extras + key + value
    return (bytes([magic, opcode]) + len(key).to_bytes(2, "big") + bytes([len(extras), 0]) + vbucket.to_bytes(2, "big")
            + len(body).to_bytes(4, "big") + opaque.to_bytes(4, "big") + bytes(8) + body)


# -- the SET handler ----------------------------------------------------------------------------

@pytest.mark.parametrize("features, size", [((), 24), ((Feature.MUTATION_SEQNO,), 40)])
def test_a_plain_set_is_answered_with_its_cas_and_with_mutation_seqno_its_seqno(features, size):
    async def body(conn):
        frame = Frame(0x80, int(Opcode.SET), 0, 3, 0xDEADBEEF, 0, b"", bytes.fromhex("0102030400000000"), b"key",
                      b"value")
        reply = kv.store(conn, frame)
        item = conn.bucket.engine.vbuckets[3].ht[b"key"]
        assert (item.value, item.flags, item.by_seqno) == (b"value", 0x01020304, 1)
        assert len(reply) == size and reply[:2] == b"\x81\x01"
        assert int.from_bytes(reply[12:16], "big") == 0xDEADBEEF
        assert int.from_bytes(reply[16:24], "big") == item.cas
        if size == 40:
            assert int.from_bytes(reply[24:32], "big") == conn.bucket.engine.vbuckets[3].uuid
            assert int.from_bytes(reply[32:40], "big") == item.by_seqno

    _run(body, features)


def test_a_hello_after_the_bucket_is_selected_changes_the_set_reply():
    """A HELLO later in the session (MutationSeqno on, then off again) changes what SET answers."""
    async def body(conn):
        frame = Frame(0x80, int(Opcode.SET), 0, 3, 7, 0, b"", bytes(8), b"key", b"value")
        for features, size in (((Feature.MUTATION_SEQNO,), 40), ((), 24)):
            conn.data_received(_hello(*features))
            await _settled(conn)
            assert len(kv.store(conn, frame)) == size

    _run(body)


# -- the request loop ---------------------------------------------------------------------------

def test_a_close_ends_the_batch_and_an_awaitable_holds_back_the_requests_after_it():
    """A handler that closes the connection ends the batch (the NOOP after it is not answered);
    one that returns an awaitable holds back the requests after it until its reply is written."""
    async def body(conn):
        gate = asyncio.get_running_loop().create_future()

        async def slow(reply):
            await gate
            return reply

        conn._ready[0xF0] = lambda c, f: slow(b"SLOW")
        conn._ready[0xF1] = lambda c, f: (c.close(), b"BYE")[1]
        written = conn.transport.write.call_args_list
        before = len(written)
        conn.data_received(_raw(0x80, 0xF0) + _raw(0x80, Opcode.NOOP, opaque=1))
        assert len(written) == before  # the NOOP waits behind the awaitable
        gate.set_result(None)
        await _settled(conn)
        out = b"".join(c.args[0] for c in written[before:])
        assert out.startswith(b"SLOW") and out[4:6] == b"\x81" + bytes([Opcode.NOOP])
        before = len(written)
        conn.data_received(_raw(0x80, 0xF1) + _raw(0x80, Opcode.NOOP, opaque=2))
        assert conn._closing
        # (this mock transport never says it is closing, so the handler's own reply is still flushed)
        assert b"".join(c.args[0] for c in written[before:]) == b"BYE"  # and nothing for the NOOP

    _run(body)


class _Stop(BaseException):
    """Not an Exception: no handler error reply catches it."""


def test_a_base_exception_propagates_with_the_replies_before_it_counted():
    async def body(conn):
        def stop(c, f):
            raise _Stop()

        conn._ready[0xF2] = stop
        with pytest.raises(_Stop):
            conn.data_received(_raw(0x80, Opcode.NOOP, opaque=1) + _raw(0x80, 0xF2) +
                               _raw(0x80, Opcode.NOOP, opaque=3))
        writer = conn.writer
        assert writer._size == sum(len(b) for b in writer._buf) == 24  # the first NOOP's reply, queued
        conn._ready[0xF2] = lambda c, f: b"F2"
        conn.data_received(b"")  # the next pass: the frame that raised was consumed, not run again
        await _settled(conn)
        assert b"".join(writer._buf) == b"" and writer._size == 0
        out = b"".join(c.args[0] for c in conn.transport.write.call_args_list[-1:])
        # the first NOOP's reply (kept from before) and the third's, and nothing from the F2 frame
        assert len(out) == 48 and [out[k:k + 2] for k in (0, 24)] == [b"\x81" + bytes([Opcode.NOOP])] * 2
        assert [int.from_bytes(out[k + 12:k + 16], "big") for k in (0, 24)] == [1, 3]

    _run(body)


def test_a_handler_that_writes_or_flushes_itself_keeps_the_writers_count():
    """writer._size is what is queued, also when a handler queued bytes of its own (a DCP
    consumer's sends) or flushed (a close) before returning its reply."""
    async def body(conn):
        writer = conn.writer
        seen = []

        def sends(c, f):
            c.writer.write(b"0123456789")
            return b"R" * 24

        def flushes(c, f):
            c.writer.flush()
            seen.append((c.writer._size, len(c.writer._buf)))
            return None

        conn._ready[0xF4] = sends
        conn._ready[0xF5] = flushes
        conn.transport.write.reset_mock()
        conn.data_received(_raw(0x80, Opcode.NOOP, opaque=1) + _raw(0x80, 0xF5) + _raw(0x80, 0xF4) +
                           _raw(0x80, 0xF4) + _raw(0x80, 0xF5))
        await _settled(conn)
        assert seen == [(0, 0), (0, 0)]
        sent = [c.args[0] for c in conn.transport.write.call_args_list]
        assert len(sent[0]) == 24 and sent[1] == (b"0123456789" + b"R" * 24) * 2
        assert writer._size == 0 and writer._buf == []

    _run(body)


def test_a_transport_that_pauses_mid_batch_gets_the_rest_on_resume_none_lost_or_repeated(monkeypatch):
    """Replies are handed to the transport mid-batch past MAX_BATCH_OUTPUT; when that makes the
    transport pause writing, the requests after the one just run stay buffered until it resumes."""
    monkeypatch.setattr(connection_module, "MAX_BATCH_OUTPUT", 24 * 3)

    async def body(conn):
        conn.transport.write.reset_mock()
        conn.transport.write.side_effect = lambda data: conn.pause_writing()
        conn.data_received(b"".join(_raw(0x80, Opcode.NOOP, opaque=i) for i in range(10)))
        assert conn.writer.paused and len(_written(conn)) == 4 * 24  # the flush after the 4th reply
        conn.transport.write.side_effect = None
        conn.resume_writing()
        await _settled(conn)
        out = _written(conn)
        assert [int.from_bytes(out[k + 12:k + 16], "big") for k in range(0, len(out), 24)] == list(range(10))

    _run(body)


def test_a_pass_out_of_time_with_nothing_left_schedules_no_next_pass(monkeypatch):
    """A pass that used up its time (MAX_PASS_SECONDS) leaves the requests after it to the next
    event-loop pass; when it ran every buffered request there is nothing to leave, and the next
    bytes to arrive run as they come rather than wait for a pass scheduled for nothing."""
    monkeypatch.setattr(connection_module, "MAX_PASS_SECONDS", 0.0)  # every pass is out of time

    async def body(conn):
        conn.transport.write.reset_mock()
        conn.data_received(b"".join(_raw(0x80, Opcode.NOOP, opaque=i) for i in range(3)))
        assert not conn._pass_scheduled
        conn.data_received(_raw(0x80, Opcode.NOOP, opaque=3))  # runs now: no event-loop pass in between
        out = _written(conn)
        assert [int.from_bytes(out[k + 12:k + 16], "big") for k in range(0, len(out), 24)] == [0, 1, 2, 3]
        # 64 requests make a slice: the pass ends after it, out of time, and the rest waits for the next
        conn.transport.write.reset_mock()
        conn.data_received(b"".join(_raw(0x80, Opcode.NOOP, opaque=i) for i in range(100)))
        assert conn._pass_scheduled and len(_written(conn)) == 64 * 24
        await _settled(conn)
        out = _written(conn)
        assert [int.from_bytes(out[k + 12:k + 16], "big") for k in range(0, len(out), 24)] == list(range(100))

    _run(body)
