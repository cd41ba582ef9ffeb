"""Durable writes: a KV mutation carrying the durability frame info, run as a sync write.

Pages: https://github.com/couchbase/kv_engine/blob/master/docs/BinaryProtocol.md (request frame
info 0x01 "Durability Requirement": a level, and optionally a timeout in milliseconds) and the
durability design in kv_engine's engines/ep/src/durability.

The command's own handler (kv.py, subdoc.py) runs with the request's `SyncWrite` as its write
mode: the one write it makes (set / add / replace / delete / write_version) goes through
`sync.writer(vb)`, which makes it a prepare (engine/durability/); the handler's checks, its
decoding, its reads and its reply are exactly those of the plain command. The reply is held until
the prepare completes - sent as built once committed,
SYNC_WRITE_AMBIGUOUS once aborted at its timeout (the write may still surface: replicas held it).
Writes without the frame info never come here, so the plain path costs nothing more.
"""

import asyncio
import math

from dcpflow.engine.durability import DEFAULT_TIMEOUT, Outcome
from dcpflow.engine.errors import EngineError
from dcpflow.protocol import subdoc as sdproto
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import Frame, parse_durability
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

#: The commands a durability requirement may accompany (their quiet twins too, and the
#: sub-document mutations).
DURABLE_OPCODES = frozenset(int(op) for op in (
    Opcode.SET, Opcode.SET_Q, Opcode.ADD, Opcode.ADD_Q, Opcode.REPLACE, Opcode.REPLACE_Q, Opcode.DELETE,
    Opcode.DELETE_Q, Opcode.APPEND, Opcode.APPEND_Q, Opcode.PREPEND, Opcode.PREPEND_Q, Opcode.INCREMENT,
    Opcode.INCREMENT_Q, Opcode.DECREMENT, Opcode.DECREMENT_Q, Opcode.SUBDOC_MULTI_MUTATION,
    *sdproto.MUTATION_OPCODES))
#: How long past its own timeout a writer waits for the outcome before answering ambiguous anyway
#: (the vbucket moved away, or the node stopped driving it).
GRACE = 5.0
EXPIRY_RECHECK = 0.05


def requirement(payload: bytes) -> tuple[int, float]:
    """(level, timeout in seconds) of a durability frame info the frame checks already validated."""
    level, timeout_ms = parse_durability(payload)
    return level, (DEFAULT_TIMEOUT if timeout_ms is None else timeout_ms / 1000)


def run(conn, frame: Frame, handler, payload: bytes):
    """Run `handler` as a sync write; returns its reply, or an awaitable of it."""
    if frame.opcode not in DURABLE_OPCODES:
        raise ProtocolError(f"{Opcode(frame.opcode).name} does not take a durability requirement")
    sync = SyncWrite(*requirement(payload))
    reply = handler(conn, frame, sync)
    prepared = sync.prepared
    if prepared is None:  # nothing was written (a handler that refused raised instead)
        return reply
    vb, prepare = prepared
    loop = asyncio.get_running_loop()
    outcome: asyncio.Future = loop.create_future()

    def done(result: Outcome) -> None:
        if not outcome.done():
            outcome.set_result(result)

    vb.on_complete(prepare, done)
    vb.complete_sync_writes()  # a chain of one meets Majority at once
    if outcome.done():
        return _answer(outcome.result(), reply, prepare)
    loop.call_later(sync.timeout, _expire, loop, vb, prepare.by_seqno)
    return _wait(outcome, reply, prepare, sync.timeout)


def _expire(loop, vb, seqno: int) -> None:
    """At the prepare's deadline: abort it if nothing completed it. The vbucket's clock (wall time)
    and the loop's (monotonic) may disagree by a little: until the vbucket agrees the deadline
    passed, look again shortly. A prepare no longer tracked (completed, or the vbucket moved) or
    one without a deadline (adopted on promotion) needs nothing more."""
    vb.complete_sync_writes()
    sw = vb.adm.tracked.get(seqno) if vb.adm is not None else None
    if sw is not None and sw.deadline != math.inf:
        loop.call_later(EXPIRY_RECHECK, _expire, loop, vb, seqno)


async def _wait(outcome: asyncio.Future, reply, prepare, timeout: float):
    try:
        result = await asyncio.wait_for(outcome, timeout + GRACE)
    except TimeoutError:
        result = Outcome.ABORTED
    return _answer(result, reply, prepare)


def _answer(result: Outcome, reply, prepare):
    if result is Outcome.COMMITTED:
        return reply
    raise EngineError(Status.SYNC_WRITE_AMBIGUOUS, f"the sync write of {prepare.key!r} (seqno {prepare.by_seqno}) "
                      "did not meet its durability level in time; it may or may not become visible")


class SyncWrite:
    """A request's durability requirement, the write mode its handler gets: `writer(vb)` is what the
    handler writes through; `prepared` the (vbucket, prepare) once it wrote."""

    __slots__ = ("level", "timeout", "prepared")

    def __init__(self, level: int, timeout: float):
        self.level = level
        self.timeout = timeout
        self.prepared = None

    def writer(self, vb) -> "_Prepares":
        return _Prepares(vb, self)


class _Prepares:
    """The writes of a vbucket as prepares at the request's level (only the writes: the handler
    reads the vbucket itself)."""

    __slots__ = ("_vb", "_sync")

    def __init__(self, vb, sync: SyncWrite):
        self._vb = vb
        self._sync = sync

    def _one_write(self) -> SyncWrite:
        if self._sync.prepared is not None:
            raise RuntimeError("a durable request makes one write")
        return self._sync

    def _prepare(self, key, value: bytes, mode: str, **kwargs):
        sync = self._one_write()
        prepare = self._vb.prepare(key, value, level=sync.level, mode=mode, timeout=sync.timeout, **kwargs)
        sync.prepared = (self._vb, prepare)
        return prepare

    def set(self, key, value: bytes, *, flags: int = 0, expiry: int = 0, datatype: int = 0, cas: int = 0):
        return self._prepare(key, value, "set", flags=flags, expiry=expiry, datatype=datatype, cas=cas)

    def add(self, key, value: bytes, *, flags: int = 0, expiry: int = 0, datatype: int = 0, cas: int = 0):
        return self._prepare(key, value, "add", flags=flags, expiry=expiry, datatype=datatype, cas=cas)

    def replace(self, key, value: bytes, *, flags: int = 0, expiry: int = 0, datatype: int = 0, cas: int = 0):
        return self._prepare(key, value, "replace", flags=flags, expiry=expiry, datatype=datatype, cas=cas)

    def delete(self, key, *, cas: int = 0):
        return self._prepare(key, b"", "delete", cas=cas)

    def write_version(self, key, prev, value: bytes, **kwargs):  # sub-document mutations
        sync = self._one_write()
        prepare = self._vb.prepare_version(key, prev, value, level=sync.level, timeout=sync.timeout, **kwargs)
        sync.prepared = (self._vb, prepare)
        return prepare
