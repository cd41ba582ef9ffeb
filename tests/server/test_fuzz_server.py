"""Fuzzing the server itself (not only the decoder): seeded random requests - well-formed headers
with random fields, real requests with bytes flipped, lengths that lie, garbage - from
unauthenticated, read-only, read-write, replication and DCP sessions. Whatever they send:

* the server keeps serving (a fresh connection's NOOP answers) and loses nothing it acknowledged
  before (a sentinel document reads back);
* no request fails inside a handler (EINTERNAL: a bug), and replies come in request order;
* the log stays bounded (rate-limited lines, boundedlog.py) and memory within the bucket's quota;
* every connection it was sent is gone once closed (none leaks).

CI runs FUZZ_CASES (3,000) with FUZZ_SEED (36); a longer run: `DCPFLOW_FUZZ_CASES=300000
DCPFLOW_FUZZ_SEED=7 pytest tests/server/test_fuzz_server.py`.
"""

import logging
import os
import random
import socket
import struct
import time

import pytest

from dcpflow.protocol import dcp
from dcpflow.protocol.frame import HEADER, encode_frame, encode_frame_info, request
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.keys import make_key
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from dcpflow.server.boundedlog import INTERVAL, SAMPLES

from .client import Closed, RawClient

FUZZ_CASES = int(os.environ.get("DCPFLOW_FUZZ_CASES", "3000"))
FUZZ_SEED = int(os.environ.get("DCPFLOW_FUZZ_SEED", "36"))
OPCODES = [int(o) for o in Opcode]
SYNC = 0xFFFF_FFFF  # the opaque of the NOOP that ends each chunk of cases
#: Sessions the cases run in: (user, password, bucket, HELLO features, DCP_OPEN flags or None). No
#: administrator: SET_VBUCKET or SET_CLUSTER_CONFIG would make the sentinel's vbucket another node's.
SESSIONS = [
    None,  # not authenticated
    ("reader", "readpw", "default", (Feature.XERROR,), None),
    ("full", "fullpw", "default", (Feature.XERROR, Feature.JSON, Feature.MUTATION_SEQNO, Feature.XATTR), None),
    ("full", "fullpw", "default", (Feature.XERROR, Feature.COLLECTIONS, Feature.ALT_REQUEST_SUPPORT), None),
    ("xdcr", "xdcrpw", "default", (Feature.XERROR, Feature.XATTR), None),
    ("dcp", "dcppw", "default", (Feature.XERROR,), dcp.OpenFlag.PRODUCER),
]


def _field(rng: random.Random, small: int, large: int) -> bytes:
    n = rng.choice((0, 0, rng.randrange(1, small), rng.randrange(1, small), rng.randrange(large)))
    return rng.randbytes(n)


def _seeds() -> list[bytes]:
    """Real requests to mutate."""
    return [
        request(Opcode.SET, key=b"fuzz-k", extras=bytes(8), value=b'{"a":1}', vbucket=3, datatype=1),
        request(Opcode.GET, key=b"fuzz-k", vbucket=3),
        request(Opcode.DELETE, key=b"fuzz-k", vbucket=3),
        request(Opcode.INCREMENT, key=b"fuzz-n", extras=struct.pack(">QQI", 1, 0, 0), vbucket=1),
        request(Opcode.APPEND, key=b"fuzz-k", value=b"x", vbucket=3),
        request(Opcode.GET_META, key=b"fuzz-k", vbucket=3),
        request(Opcode.STAT, key=b"vbucket-seqno 3"),
        request(Opcode.HELLO, key=b"fuzz", value=b"\x00\x07\x00\x12"),
        request(Opcode.GET_CLUSTER_CONFIG),
        request(Opcode.GET_ERROR_MAP, value=b"\x00\x02"),
        request(Opcode.GET, key=make_key(b"fuzz-k", 8), vbucket=3),
        request(Opcode.SET, key=b"fuzz-k", extras=bytes(8), value=b"v", vbucket=3,
                framing=encode_frame_info(5) + encode_frame_info(0)),
        dcp.DcpStreamRequest(3, 0, 0xFFFFFFFFFFFFFFFF, 0, 0, 0).encode(),
        dcp.DcpControl(b"connection_buffer_size", b"1024").encode(),
        dcp.DcpBufferAck(100).encode(),
        dcp.DcpGetFailoverLog(3).encode(),
        dcp.DcpCloseStream(3).encode(),
    ]


def make_case(rng: random.Random, seeds: list[bytes], opaque: int) -> tuple[bytes, bool]:
    """(bytes, framed): framed is False when the bytes may not end on a frame boundary (lying lengths,
    garbage) - nothing is sent after them on that connection."""
    roll = rng.random()
    if roll < 0.55:  # a header of sound lengths, random fields
        magic = rng.choice((0x80, 0x80, 0x80, 0x08, 0x81, 0x82, 0x18))
        opcode = rng.choice(OPCODES) if rng.random() < 0.85 else rng.randrange(256)
        framing = b""
        if magic in (0x08, 0x18):
            framing = rng.choice((b"", encode_frame_info(rng.randrange(8), rng.randbytes(rng.randrange(4))),
                                  rng.randbytes(rng.randrange(1, 6))))
        key = _field(rng, 24, 300)[: 255 if magic in (0x08, 0x18) else 65535]
        return encode_frame(magic, opcode, key=key, extras=_field(rng, 33, 64), value=_field(rng, 64, 4096),
                            vbucket_or_status=rng.choice((0, 3, 63, 64, 0xFFFF, rng.randrange(65536))), opaque=opaque,
                            cas=rng.choice((0, 0, 1, rng.getrandbits(64))), datatype=rng.randrange(256),
                            framing=framing), True
    if roll < 0.9:  # a real request, a few bytes changed
        frame = bytearray(rng.choice(seeds))
        lengths_kept = True
        for _ in range(rng.randrange(1, 4)):
            at = rng.randrange(len(frame))
            if 8 <= at < 12:
                lengths_kept = False
            frame[at] = rng.randrange(256)
        struct.pack_into(">I", frame, 12, opaque)  # the opaque stays the case's: replies are checked in order by it
        return bytes(frame), lengths_kept
    if roll < 0.97:  # a header whose body length lies
        frame = bytearray(rng.choice(seeds))
        struct.pack_into(">II", frame, 8, rng.choice((0, 1, len(frame) * 3, 0x7FFFFFFF, 40 << 20)), opaque)
        return bytes(frame), False
    return rng.randbytes(rng.randrange(1, 200)), False


class Session:
    """One fuzzed connection in one of SESSIONS; opened again whenever the server closes it."""

    def __init__(self, port: int, spec):
        self.port, self.spec = port, spec
        self.client: RawClient | None = None
        self.reconnects = 0

    def open(self) -> RawClient:
        c = RawClient(self.port)
        if self.spec is not None:
            user, password, bucket, features, dcp_flags = self.spec
            c.login(user, password, bucket, features=features)
            if dcp_flags is not None:
                assert c.call(Opcode.DCP_OPEN, key=b"fuzz", extras=struct.pack(">II", 0, dcp_flags)).status == 0
        self.client = c
        return c

    def run(self, cases: list[tuple[bytes, bool, int]]) -> list:
        """Send a chunk; returns the replies (request order checked). A closed connection ends the
        chunk; one that may be out of frame is closed by us."""
        c = self.client or self.open()
        framed = [data for data, ok, _ in cases if ok]
        unframed = next(((data, opaque) for data, ok, opaque in cases if not ok), None)
        replies = []
        try:
            if unframed is None:
                c.send(b"".join(framed) + request(Opcode.NOOP, opaque=SYNC))
                while (frame := c.recv()).opaque != SYNC or not frame.is_response:
                    if frame.is_response:
                        replies.append(frame)
            else:
                c.send(b"".join(framed) + unframed[0])
                c.sock.shutdown(socket.SHUT_WR)
                while True:
                    frame = c.recv()
                    if frame.is_response:
                        replies.append(frame)
        except (Closed, ConnectionResetError, BrokenPipeError):
            c.close()
            self.client = None
            self.reconnects += 1
        sent = {opaque for _, _, opaque in cases}  # (garbage that parses as a frame has an opaque of its own)
        order = [r.opaque for r in replies if r.opaque in sent]
        assert order == sorted(order), f"replies out of request order: {order}"
        return replies


def test_the_server_survives_seeded_random_requests(make_server, caplog):
    server = make_server(memory_quota=64 * 1024 * 1024, plain_over_tcp=True)
    with server.login() as admin:
        assert admin.set(b"sentinel", b"kept through the fuzz").status == Status.SUCCESS
        assert admin.call(Opcode.SEQNO_PERSISTENCE, vbucket=admin.vbucket_of(b"sentinel"),
                          extras=struct.pack(">Q", 1)).status == Status.SUCCESS
    rng = random.Random(FUZZ_SEED)
    seeds = _seeds()
    sessions = [Session(server.port, spec) for spec in SESSIONS]
    internal_errors = []
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="dcpflow"):
        done = 0
        while done < FUZZ_CASES:
            session = rng.choice(sessions)
            chunk = []
            for _ in range(min(rng.randrange(1, 40), FUZZ_CASES - done)):
                data, framed = make_case(rng, seeds, done)
                chunk.append((data, framed, done))
                done += 1
                if not framed:
                    break
            for reply in session.run(chunk):
                if reply.status == Status.EINTERNAL:
                    internal_errors.append((reply.opcode, reply.value))
        elapsed = time.monotonic() - started
        for session in sessions:
            if session.client is not None:
                session.client.close()
    assert internal_errors == []
    assert server.call(lambda: server.server.log.limiter.seen["handler-failure"]) == 0
    with server.login() as admin:
        reply = admin.get(b"sentinel")
        assert (reply.status, reply.value) == (Status.SUCCESS, b"kept through the fuzz")
        assert int(admin.stats()["mem_used"]) <= 64 * 1024 * 1024
    deadline = time.monotonic() + 30
    while server.call(lambda: len(server.server.connections)) > 0:
        assert time.monotonic() < deadline, "connections the fuzz closed are still open on the server"
        time.sleep(0.05)
    lines = [r for r in caplog.records if r.name.startswith("dcpflow")]
    intervals = elapsed / INTERVAL + 2
    assert len(lines) <= 12 * (SAMPLES + 1) * intervals, len(lines)  # a dozen kinds at most, each rate-limited
    assert all("Traceback" not in r.getMessage() for r in lines)


@pytest.mark.parametrize("seed", [1, 2])
def test_a_fuzzed_connection_never_disturbs_another(make_server, seed):
    """One connection fuzzed while another pipelines SETs and GETs: the second sees every reply,
    in order, with the values it wrote."""
    server = make_server(plain_over_tcp=True)
    rng = random.Random(seed)
    seeds = _seeds()
    fuzzed = Session(server.port, SESSIONS[2])
    with server.login() as bystander:
        for i in range(min(FUZZ_CASES // 10, 400)):
            data, framed = make_case(rng, seeds, i)
            fuzzed.run([(data, framed, i)])
            key = b"bystander%d" % (i % 17)
            assert bystander.set(key, b"%d" % i).status == Status.SUCCESS
            assert bystander.get(key).value == b"%d" % i
    if fuzzed.client is not None:
        fuzzed.client.close()


def test_the_generator_is_deterministic_and_covers_every_kind_of_case():
    seeds = _seeds()
    runs = []
    for _ in range(2):
        rng = random.Random(FUZZ_SEED)
        runs.append([make_case(rng, seeds, i) for i in range(500)])
    assert runs[0] == runs[1]
    cases = runs[0]
    assert {data[0] for data, framed in cases if framed and len(data) >= HEADER.size} >= {0x80, 0x08, 0x81}
    # mostly frames (the server's parsing is what is probed), some raw garbage too
    assert sum(not framed for _, framed in cases) > 20 and sum(framed for _, framed in cases) > 350
