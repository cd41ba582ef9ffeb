"""The compiled SET handler (server/_speedups.c) against its specification, kv._store_py.

Two in-process servers, twins down to their clocks and failover UUIDs, each with one
authenticated connection with the same HELLO features, get the same requests: one through
`kv.store` (the compiled twin, which hands what it does not take to _store_py), the other through
_store_py itself. The replies (bytes, nothing for a quiet success, or the same exception with the
same status and text), the stored documents and the counters must be equal after every request."""

import asyncio
import os
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
            server = Server(ServerConfig(data_dir=tempfile.mkdtemp(prefix="dcpflow-twin-"), port=0,
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
