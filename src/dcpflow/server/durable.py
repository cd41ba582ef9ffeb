"""Durable writes: a KV mutation carrying the durability frame info, run as a sync write.

Pages: https://github.com/couchbase/kv_engine/blob/master/docs/BinaryProtocol.md (request frame
info 0x01 "Durability Requirement": a level, and optionally a timeout in milliseconds) and the
durability design in kv_engine's engines/ep/src/durability.

The command's own handler (kv.py, subdoc.py) runs unchanged against a view of the connection whose
vbuckets turn the one write the handler makes (set / add / replace / delete / write_version) into a
prepare
(engine/durability/): the handler's checks, its decoding and its reply are exactly those of the
plain command. The reply is held until the prepare completes - sent as built once committed,
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
    level, timeout = requirement(payload)
    view = _DurableConnection(conn, level, timeout)
    reply = handler(view, frame)
    prepared = view.prepared
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
    loop.call_later(timeout, _expire, loop, vb, prepare.by_seqno)
    return _wait(outcome, reply, prepare, timeout)


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


class _DurableConnection:
    """The connection as a durable write's handler sees it: its vbuckets prepare instead of writing."""

    def __init__(self, conn, level: int, timeout: float):
        self._conn = conn
        self._level = level
        self._timeout = timeout
        self.prepared = None  # (vbucket, prepare) once the handler wrote

    def __getattr__(self, name):
        return getattr(self._conn, name)

    def get_vbucket(self, vbid: int):
        vb = self._conn.get_vbucket(vbid)
        return None if vb is None else _DurableVBucket(vb, self)


class _DurableVBucket:
    """A vbucket whose writes are prepares at the request's level; reads pass through."""

    def __init__(self, vb, owner: _DurableConnection):
        self._vb = vb
        self._owner = owner

    def __getattr__(self, name):
        return getattr(self._vb, name)

    def _prepare(self, key, value: bytes, mode: str, **kwargs):
        owner = self._owner
        if owner.prepared is not None:
            raise RuntimeError("a durable request makes one write")
        prepare = self._vb.prepare(key, value, level=owner._level, mode=mode, timeout=owner._timeout, **kwargs)
        owner.prepared = (self._vb, prepare)
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
        owner = self._owner
        if owner.prepared is not None:
            raise RuntimeError("a durable request makes one write")
        prepare = self._vb.prepare_version(key, prev, value, level=owner._level, timeout=owner._timeout, **kwargs)
        owner.prepared = (self._vb, prepare)
        return prepare
