"""What the DCP state machines answer: outcome values the asyncio shells execute.

Every entry point of DcpProducer (producer.py), DcpConsumer (consumer.py) and their
streams returns what must happen next instead of doing it: there are no callbacks to inject and no
outbox to read. A call returns a tuple of these, in the order they must run (often `NOTHING`); a
request that is answered also returns its answer (a Refusal, a `Started`, reply bytes...).

* `WAKE` - the producer's streams have something to do: run a send pass soon (never inside the
  call: it may come from inside another connection's write).
* `ARM_NOOP_TIMER` - the noop settings changed: (re)arm the noop timer at `noop.interval`.
* `Send(data)` - write these bytes now, after what is already queued on the connection.
* `Reply(data)` - the answer to the message being handled (last in its tuple): the shell returns
  it as the handler's reply. A message may also be answered with a `Refusal` (an error reply).
* `ArmAckTimer(delay)` - a consumer's flow-control acknowledgement is due in `delay` seconds
  unless the threshold sends it first: call `ack` then (buffer-ack.md).
* `SetVbucketState(vbid, state)` - change a vbucket's state (a takeover stream marks its vbucket
  dead once the consumer took it over, rebalance.md).
* `StopBackfill(handle)` - a stream whose backfill was reading is gone: cancel the read (the handle
  is what the shell gave `BackfillQueue.started`; its owner closes the scan).
* `RollBack(stream, seqno)` - roll a replica vbucket back from disk to `seqno`, then call the
  consumer's `rolled_back(stream)` (rollback.md).
* `ChangeState(stream, msg)` - once no flush is in flight, call the consumer's
  `change_state(stream, msg)` and answer with its reply (set-vbucket-state.md).
* `Close(reason)` - close the connection once what was sent before is written.
* `Tolerated(status, opcode)` - the consumer answered with an error status the producer ignores
  (logged by the shell, nothing else happens).

Whatever starts a backfill is read from the send pass (`SendPass.backfill`), the one call that queues
them.
"""

from enum import Enum
from typing import NamedTuple


class Signal(Enum):
    WAKE = "wake"
    ARM_NOOP_TIMER = "arm-noop-timer"


WAKE = Signal.WAKE
ARM_NOOP_TIMER = Signal.ARM_NOOP_TIMER
#: The answer of a call that needs nothing done.
NOTHING: tuple = ()
WAKE_ONLY: tuple = (WAKE,)


class Send(NamedTuple):
    data: bytes


class Reply(NamedTuple):
    data: bytes


class ArmAckTimer(NamedTuple):
    delay: float


class SetVbucketState(NamedTuple):
    vbid: int
    state: int  # a VBucketState


class StopBackfill(NamedTuple):
    handle: object  # anything with cancel()


class RollBack(NamedTuple):
    """Roll the stream's replica vbucket back to `seqno` from disk, then call `rolled_back`."""

    stream: object  # a PassiveStream
    seqno: int


class ChangeState(NamedTuple):
    """Once no flush batch is in flight, call `change_state(stream, msg)` and answer with its reply."""

    stream: object  # a PassiveStream
    msg: object  # the DcpSetVbucketState received


class Close(NamedTuple):
    reason: str


class Tolerated(NamedTuple):
    status: int
    opcode: int
