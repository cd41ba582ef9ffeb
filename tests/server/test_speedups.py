"""The compiled SET handler and request loop (server/_speedups.c) against their specifications,
kv._store_py and Connection._process's Python loop.

Two in-process servers, twins down to their clocks and failover UUIDs, each with one
authenticated connection with the same HELLO features, get the same requests: one through
`kv.store` (the compiled twin, which hands what it does not take to _store_py), the other through
_store_py itself. The replies (bytes, nothing for a quiet success, or the same exception with the
same status and text), the stored documents and the counters must be equal after every request."""

import asyncio
import os
import re
import tempfile
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcpflow.engine.errors import EngineError
from dcpflow.engine.vbucket import VBucket
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import Frame, RequestFrameId, encode_frame_info, request
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.opcodes import Opcode
from dcpflow.server import connection as connection_module
from dcpflow.server import kv
from dcpflow.server.app import Server, ServerConfig
from dcpflow.server.connection import Connection

compiled = kv.store if kv.store is not kv._store_py else None
needs_compiled = pytest.mark.skipif(compiled is None, reason="the compiled SET handler is not built")
VBUCKETS = 8


def test_the_compiled_handler_is_built():
    if os.environ.get("DCPFLOW_PURE_PYTHON"):
        assert compiled is None
    else:
        assert compiled is not None, "dcpflow.server._speedups did not build: pip install -e . needs gcc"


class Twins:
    """Two servers with identical clocks and failover logs, a connection on each."""

    async def start(self, features: tuple[int, ...]) -> "Twins":
        self.now = 1_700_000_000.0
        self.servers, self.conns = [], []
        for _ in range(2):
            # Free ports for both twins (KV and management): ports of one width, so their maps are as long.
            server = Server(ServerConfig(data_dir=tempfile.mkdtemp(prefix="dcpflow-twin-"), port=0, mgmt_port=0,
                                         plain_over_tcp=True, flush_interval=1000, num_vbuckets=VBUCKETS))
            await server.start()
            conn = Connection(server)
            # a transport that takes the replies and drops them (Writer asks is_closing/get_extra_info)
            conn.connection_made(mock.Mock(**{"is_closing.return_value": False, "get_extra_info.return_value": None}))
            hello = request(Opcode.HELLO, key=b"twin", value=b"".join(int(f).to_bytes(2, "big") for f in features))
            conn.data_received(hello + request(Opcode.SASL_AUTH, key=b"PLAIN", value=b"\0Administrator\0password") +
                               request(Opcode.SELECT_BUCKET, key=b"default"))
            self.servers.append(server)
            self.conns.append(conn)
        first = self.vbuckets(0)
        for side in range(2):
            for vbid, vb in self.vbuckets(side).items():
                vb.hlc._clock = self.ns
                vb._clock = self.wall
                vb.failover = first[vbid].failover  # UUIDs are random: share the log
        return self

    def wall(self) -> float:
        return self.now

    def ns(self) -> int:
        return int(self.now * 1e9)

    def vbuckets(self, side: int) -> dict[int, VBucket]:
        return self.servers[side].buckets["default"].engine.vbuckets

    async def close(self) -> None:
        for server in self.servers:
            await server.close()


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def outcome(handler, conn, frame):
    try:
        return ("ok", handler(conn, frame))
    except EngineError as e:
        return ("engine", int(e.status), str(e))
    except ProtocolError as e:
        return ("protocol", int(e.status), e.reason)


def documents(twins: Twins, side: int) -> dict:
    return {(vbid, key): item for vbid, vb in twins.vbuckets(side).items() for key, item in vb.ht.items()}


_PRESERVE_TTL = encode_frame_info(RequestFrameId.PRESERVE_TTL)
keys = st.one_of(st.sampled_from([b"a", b"doc", b"k" * 250]), st.binary(max_size=3), st.just(b"k" * 251))
values = st.one_of(
    st.sampled_from([b"", b'{"a": 1}', b"123", b"1.5e3", b"12ab", b"-", b'"s"', b"[1, 2", b" true ", b"null", b"x",
                     b"true", b"false", b"fals", b"nul", b"nulls", b"e", b"3fa2", b"e5", b"1e", b"-0.5", b"7\n",
                     b"\ttrue", b"falsey", b"db07"]),
    st.binary(max_size=20))
requests = st.tuples(
    st.sampled_from([Opcode.SET, Opcode.SET, Opcode.SET_Q, Opcode.ADD, Opcode.REPLACE]),
    st.sampled_from([0, 0, 1, 2, 4, 9]),  # datatype
    keys, values,
    st.one_of(st.binary(min_size=8, max_size=8), st.just(bytes(8)), st.binary(max_size=9)),  # extras
    st.sampled_from([0, 1, VBUCKETS - 1, VBUCKETS]),  # the last one is not on this node
    st.sampled_from(["none", "none", "current", "wrong"]),
    st.sampled_from([b"", b"", _PRESERVE_TTL]),
    st.integers(0, 0xFFFFFFFF))


@needs_compiled
@pytest.mark.parametrize("features", [
    (), (Feature.JSON, Feature.MUTATION_SEQNO), (Feature.COLLECTIONS,), (Feature.XATTR, Feature.JSON)])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(run=st.lists(requests, min_size=1, max_size=25))
def test_compiled_store_equals_its_specification(loop, features, run):
    loop.run_until_complete(_compare(features, run))


async def _compare(features, run):
    twins = await Twins().start(features)
    try:
        for opcode, datatype, key, value, extras, vbid, cas_kind, framing, opaque in run:
            current = twins.vbuckets(0).get(vbid) and twins.vbuckets(0)[vbid].ht.get(key)
            cas = 0 if cas_kind == "none" or current is None else current.cas + (cas_kind == "wrong")
            frame = Frame(0x08 if framing else 0x80, int(opcode), datatype, vbid, opaque, cas, framing, extras,
                          key, value)
            got = outcome(kv.store, twins.conns[0], frame)
            want = outcome(kv._store_py, twins.conns[1], frame)
            assert got == want, frame
            assert documents(twins, 0) == documents(twins, 1)
            counters = [s.buckets["default"].counters.as_dict() for s in twins.servers]
            assert counters[0] == counters[1]
            twins.now += 0.25
    finally:
        await twins.close()


@needs_compiled
def test_a_plain_set_is_answered_with_the_pythons_bytes(loop):
    """The reply of the common case, packed in C, byte for byte (with and without MutationSeqno)."""
    loop.run_until_complete(_plain_set())


async def _plain_set():
    for features in ((), (Feature.MUTATION_SEQNO,)):
        twins = await Twins().start(features)
        try:
            frame = Frame(0x80, int(Opcode.SET), 0, 3, 0xDEADBEEF, 0, b"", bytes.fromhex("0102030400000000"),
                          b"key", b"value")
            reply = kv.store(twins.conns[0], frame)
            assert reply == kv._store_py(twins.conns[1], frame)
            assert len(reply) == (40 if features else 24) and reply[:2] == b"\x81\x01"
        finally:
            await twins.close()


@needs_compiled
def test_a_hello_after_the_bucket_is_selected_reaches_the_compiled_handler(loop):
    """The compiled handler reads the session from conn.set_context: a HELLO later in the session
    (MutationSeqno on, then off again) must change its replies as it changes the Python's."""
    loop.run_until_complete(_late_hello())


async def _late_hello():
    twins = await Twins().start(())
    try:
        frame = Frame(0x80, int(Opcode.SET), 0, 3, 7, 0, b"", bytes(8), b"key", b"value")
        for features, size in (((Feature.MUTATION_SEQNO,), 40), ((), 24)):
            hello = request(Opcode.HELLO, key=b"twin", value=b"".join(int(f).to_bytes(2, "big") for f in features))
            for conn in twins.conns:
                conn.data_received(hello)
            reply = kv.store(twins.conns[0], frame)
            assert reply == kv._store_py(twins.conns[1], frame)
            assert len(reply) == size
    finally:
        await twins.close()


@needs_compiled
def test_the_compiled_handler_calls_a_python_vbucket_set_too(loop, monkeypatch):
    """The handler calls VBucket.set's function with the vbucket first (no bound method): the
    compiled engine twin is an instancemethod, the Python one a plain function; both must work."""
    monkeypatch.setattr(VBucket, "set", VBucket._set_py)
    loop.run_until_complete(_plain_set())
    loop.run_until_complete(_compare((), [(Opcode.SET, 0, b"doc", b"123", bytes(8), 1, "none", b"", 7),
                                          (Opcode.SET, 0, b"doc", b"x", bytes(8), 1, "current", b"", 8)]))


# -- the compiled request loop (dispatch) against the Python loop ----------------------------------

def _raw(magic: int, opcode: int, key: bytes = b"", extras: bytes = b"", value: bytes = b"", vbucket: int = 0,
         opaque: int = 0, key_len: int | None = None, framing: bytes = b"") -> bytes:
    """A frame's bytes, with a key length that may lie (malformed on purpose)."""
    kl = len(key) if key_len is None else key_len
    body = framing + extras + key + value
    key_field = (len(framing) << 8 | kl) if magic in (0x08, 0x18) else kl
    return (bytes([magic, opcode]) + key_field.to_bytes(2, "big") + bytes([len(extras), 0]) +
            vbucket.to_bytes(2, "big") + len(body).to_bytes(4, "big") + opaque.to_bytes(4, "big") + bytes(8) + body)


_SET_EXTRAS = bytes(8)
wire_requests = st.one_of(
    st.builds(lambda k, v, vb, o: _raw(0x80, Opcode.SET, k, _SET_EXTRAS, v, vb, o),
              st.sampled_from([b"a", b"doc"]), st.binary(max_size=12), st.sampled_from([0, 1, VBUCKETS]),
              st.integers(0, 0xFFFF)),
    st.builds(lambda k, v, o: _raw(0x80, Opcode.SET_Q, k, _SET_EXTRAS, v, 1, o),
              st.sampled_from([b"a", b"doc"]), st.binary(max_size=12), st.integers(0, 0xFFFF)),
    st.builds(lambda k, o: _raw(0x80, Opcode.GET, k, opaque=o), st.sampled_from([b"a", b"doc", b"zz"]),
              st.integers(0, 0xFFFF)),
    st.builds(lambda k, o: _raw(0x80, Opcode.GET_Q, k, opaque=o), st.sampled_from([b"a", b"zz"]),
              st.integers(0, 0xFFFF)),
    st.builds(lambda k, o: _raw(0x80, Opcode.DELETE, k, opaque=o), st.sampled_from([b"a", b"doc"]),
              st.integers(0, 0xFFFF)),
    st.just(_raw(0x80, Opcode.NOOP, opaque=5)),
    st.just(_raw(0x80, 0xF3, opaque=6)),  # an unknown opcode
    st.just(_raw(0x80, Opcode.SET, b"abc", _SET_EXTRAS, b"v", 1, 7, key_len=40)),  # key beyond the body: EINVAL
    st.just(_raw(0x08, Opcode.SET, b"doc", _SET_EXTRAS, b"flex", 1, 8,
                 framing=encode_frame_info(RequestFrameId.PRESERVE_TTL))),  # framing extras: the checked path
    st.just(_raw(0x80, Opcode.SASL_AUTH, b"PLAIN", value=b"\0Administrator\0wrong", opaque=9)),
    st.just(_raw(0x81, Opcode.NOOP, opaque=10)),  # a response from a client: closes the connection
    st.just(b"\x42" + bytes(23)),  # bad magic: fatal
)


@needs_compiled
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(run=st.lists(wire_requests, min_size=1, max_size=40), cuts=st.lists(st.integers(0, 2000), max_size=6))
def test_compiled_dispatch_answers_exactly_what_the_python_loop_answers(loop, monkeypatch, run, cuts):
    """The same bytes, cut at the same places, fed to a connection running the compiled loop and to
    its twin running the Python loop: the same output, the same state, the same close."""
    loop.run_until_complete(_compare_dispatch(monkeypatch, b"".join(run), cuts))


async def _compare_dispatch(monkeypatch, data: bytes, cuts: list[int]):
    # The loop is not running between the cuts: a pass that ran out of its time budget (a garbage
    # collection on a busy machine) would leave its rest to a pass that never comes, on one twin only.
    monkeypatch.setattr(connection_module, "MAX_PASS_SECONDS", 3600.0)
    twins = await Twins().start((Feature.MUTATION_SEQNO,))
    try:
        bounds = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
        compiled_dispatch = connection_module._dispatch
        for lo, hi in zip(bounds, bounds[1:], strict=False):
            for side, loop_impl in ((0, compiled_dispatch), (1, None)):
                monkeypatch.setattr(connection_module, "_dispatch", loop_impl)
                conn = twins.conns[side]
                if not conn._closing:
                    conn.data_received(data[lo:hi])
            monkeypatch.setattr(connection_module, "_dispatch", compiled_dispatch)
            # NOT_MY_VBUCKET carries the cluster map, where each twin has its own ports (KV and
            # management), bucket UUID and revision (the second the map was made: ten digits either way)
            sent = [re.sub(rb'"rev":\d{10}', b'"rev":0000000000', b"".join(
                        c.args[0] for c in conn.transport.write.call_args_list)
                    .replace(str(server.port).encode(), b"PORT")
                    .replace(str(server.mgmt.port).encode(), b"MGMT")
                    .replace(server.buckets["default"].uuid.encode(), b"UUID".ljust(32)))
                    for conn, server in zip(twins.conns, twins.servers, strict=True)]
            assert sent[0] == sent[1]
            assert twins.conns[0]._closing == twins.conns[1]._closing
            assert documents(twins, 0) == documents(twins, 1)
            twins.now += 0.25
    finally:
        await twins.close()


def _on_one_connection(loop, monkeypatch, compiled_loop: bool, body) -> None:
    """Run `body(conn)` on an authenticated connection, with the compiled loop or the Python one."""
    if not compiled_loop:
        monkeypatch.setattr(connection_module, "_dispatch", None)

    async def run():
        twins = await Twins().start(())
        try:
            await body(twins.conns[0])
        finally:
            await twins.close()

    loop.run_until_complete(run())


@pytest.mark.parametrize("compiled_loop", [pytest.param(True, marks=needs_compiled), False])
def test_both_loops_stop_at_a_close_and_wait_for_an_awaitable(loop, monkeypatch, compiled_loop):
    """A handler that closes the connection ends the batch (the NOOP after it is not answered);
    one that returns an awaitable holds back the requests after it until its reply is written."""
    _on_one_connection(loop, monkeypatch, compiled_loop, _close_and_wait)


async def _close_and_wait(conn):
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
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    out = b"".join(c.args[0] for c in written[before:])
    assert out.startswith(b"SLOW") and out[4:6] == b"\x81" + bytes([Opcode.NOOP])
    before = len(written)
    conn.data_received(_raw(0x80, 0xF1) + _raw(0x80, Opcode.NOOP, opaque=2))
    assert conn._closing
    # (this mock transport never says it is closing, so the handler's own reply is still flushed)
    assert b"".join(c.args[0] for c in written[before:]) == b"BYE"  # and nothing for the NOOP


class _Stop(BaseException):
    """Not an Exception: no handler error reply catches it."""


@pytest.mark.parametrize("compiled_loop", [pytest.param(True, marks=needs_compiled), False])
def test_a_base_exception_propagates_with_the_replies_before_it_counted(loop, monkeypatch, compiled_loop):
    _on_one_connection(loop, monkeypatch, compiled_loop, _base_exception)


async def _base_exception(conn):

    def stop(c, f):
        raise _Stop()

    conn._ready[0xF2] = stop
    with pytest.raises(_Stop):
        conn.data_received(_raw(0x80, Opcode.NOOP, opaque=1) + _raw(0x80, 0xF2) + _raw(0x80, Opcode.NOOP, opaque=3))
    writer = conn.writer
    assert writer._size == sum(len(b) for b in writer._buf) == 24  # the first NOOP's reply, queued
    conn._ready[0xF2] = lambda c, f: b"F2"
    conn.data_received(b"")  # the next pass: the frame that raised was consumed, not run again
    assert b"".join(writer._buf) == b"" and writer._size == 0
    out = b"".join(c.args[0] for c in conn.transport.write.call_args_list[-1:])
    # the first NOOP's reply (kept from before) and the third's, and nothing from the F2 frame
    assert len(out) == 48 and [out[k:k + 2] for k in (0, 24)] == [b"\x81" + bytes([Opcode.NOOP])] * 2
    assert [int.from_bytes(out[k + 12:k + 16], "big") for k in (0, 24)] == [1, 3]


@pytest.mark.parametrize("compiled_loop", [pytest.param(True, marks=needs_compiled), False])
def test_a_handler_that_writes_or_flushes_itself_keeps_the_writers_count(loop, monkeypatch, compiled_loop):
    """writer._size is what is queued, also when a handler queued bytes of its own (a DCP
    consumer's sends) or flushed (a close) before returning its reply."""
    _on_one_connection(loop, monkeypatch, compiled_loop, _self_writing)


async def _self_writing(conn):
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
    assert seen == [(0, 0), (0, 0)]
    sent = [c.args[0] for c in conn.transport.write.call_args_list]
    assert len(sent[0]) == 24 and sent[1] == (b"0123456789" + b"R" * 24) * 2
    assert writer._size == 0 and writer._buf == []
