"""The connection's extension points for DCP: the batching Writer, responses from the peer routed to
`response_handler`, and `on_close` callbacks."""

import asyncio
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcpflow.protocol.frame import Magic, encode_frame, request, response
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from dcpflow.server.connection import Writer

from .client import RawClient


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


# ---------------------------------------------------------------------------------------------
# the dispatch fast path: classic requests whose command the session may run skip `_handle`

_SESSIONS = (None, ("Administrator", "password", None), ("reader", "readpw", "default"),
             ("writer", "writepw", "default"), ("Administrator", "password", "default"))
_NO_SIDE_EFFECT_OPS = (Opcode.GET, Opcode.GET_K, Opcode.SET, Opcode.REPLACE, Opcode.ADD, Opcode.DELETE,
                       Opcode.NOOP, Opcode.GET_META, Opcode.GET_ALL_VB_SEQNOS, Opcode.VERSION,
                       0xEE)  # 0xee: no such command


@pytest.fixture
def sessions(make_server):
    """One client per session state: not authenticated, no bucket, reader, writer, admin."""
    server = make_server(plain_over_tcp=True)
    clients = []
    for session in _SESSIONS:
        client = RawClient(server.port)
        client.hello(Feature.XERROR, Feature.JSON)
        if session is not None:
            user, password, bucket = session
            assert client.auth_plain(user, password).status == Status.SUCCESS
            if bucket is not None:
                assert client.select(bucket).status == Status.SUCCESS
        clients.append(client)
    assert clients[-1].set(b"present", b'{"a":1}').status == Status.SUCCESS
    yield clients
    for client in clients:
        client.close()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(opcode=st.sampled_from(_NO_SIDE_EFFECT_OPS), key=st.sampled_from([b"", b"present", b"missing"]),
       extras=st.sampled_from([b"", bytes(4), bytes(8), bytes(12)]), value=st.binary(max_size=3),
       vbucket=st.sampled_from([None, 999]))
def test_dispatch_fast_path_answers_exactly_what_the_checked_path_answers(sessions, opcode, key, extras, value,
                                                                          vbucket):
    """A classic (0x80) request goes straight to its handler when the session may run it; an
    alternative-magic (0x08) request without framing extras takes the fully checked path. Both
    must answer byte for byte the same, in every session state (refusals included). Mutations
    carry CAS 1 against keys whose CAS is never 1, so no request changes anything."""
    vb = (sessions[-1].vbucket_of(key) if key else 0) if vbucket is None else vbucket
    cas = 1 if opcode in (Opcode.SET, Opcode.REPLACE, Opcode.DELETE, Opcode.ADD) else 0
    for client in sessions:
        fields = dict(key=key, extras=extras, value=value, vbucket_or_status=vb, cas=cas, opaque=7)
        client.send(encode_frame(Magic.REQUEST, opcode, **fields) + encode_frame(Magic.ALT_REQUEST, opcode, **fields))
        fast, checked = client.recv(), client.recv()
        assert fast.encode() == checked.encode(), (client, fast, checked)
    assert sessions[-1].get(b"present").value == b'{"a":1}'
