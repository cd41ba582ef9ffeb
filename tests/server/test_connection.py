"""The connection's extension points for DCP: the batching Writer, responses from the peer routed to
`response_handler`, and `on_close` callbacks."""

import asyncio
import time

from dcpflow.protocol.frame import request, response
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from dcpflow.server.connection import Writer


class RecordingTransport:
    def __init__(self):
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return False


def test_writer_sends_one_write_per_event_loop_pass():
    async def main():
        transport = RecordingTransport()
        writer = Writer(transport, asyncio.get_running_loop())
        for i in range(5):
            writer.send(b"m%d" % i)
        assert transport.writes == [] and writer.pending == 10
        await asyncio.sleep(0)
        assert transport.writes == [b"m0m1m2m3m4"] and writer.pending == 0
        writer.write(b"x")
        writer.flush()
        writer.flush()
        assert transport.writes[-1] == b"x" and len(transport.writes) == 2 and writer.bytes_sent == 11
    asyncio.run(main())


def test_responses_from_the_peer_go_to_the_response_handler(server):
    seen = []
    with server.login() as c:
        def install():
            (conn,) = [x for x in server.server.connections if x.user is not None]
            conn.response_handler = lambda frame: seen.append(frame.opcode) or None
            conn.on_close.append(lambda: seen.append("closed"))
        server.call(install)
        c.send(response(Opcode.DCP_NOOP, opaque=9) + request(Opcode.NOOP, opaque=10))
        reply = c.recv()
        assert (reply.opaque, reply.status) == (10, Status.SUCCESS)
        assert seen == [Opcode.DCP_NOOP]
    for _ in range(200):  # the server notices the close on its own loop
        if "closed" in seen:
            break
        time.sleep(0.01)
    assert seen == [Opcode.DCP_NOOP, "closed"]
