"""One send pass of a producer connection: which queued messages go out now, under the window.

Pages: https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/flow-control.md
and commands/control.md (`set_priority`). kv_engine's producer takes messages from its streams in
turn, a batch per run of its worker, while flow control allows; this is that run.

The streams that may have work (`pending`) are visited round-robin, up to 256 messages each per
turn, until the pass has its batch (`set_priority`: PRIORITY_BATCH messages) or MAX_PASS_BYTES, the
window is full, or nobody has anything. A stream with nothing queued first refills from its cursor
(`fill`, below STREAM_QUEUE_BYTES); one that planned a backfill is queued for it, and while the
window is full the backfills still read ahead. A backfill page queued as one entry of whole
messages is split at the window; a message's uncopied value (a memoryview after its header) always
goes with it. Every message is charged its wire size as it is taken, so at most the window plus
one message is outstanding.

The caller writes `out` in order, after the replies it already queued, runs another pass later
if `more` (it stopped at its budget, not at the window), stops the backfill reads in `stop` (of
streams that ended by themselves) and starts the queued backfills if `backfill`. Nothing here
writes or schedules.
"""

from collections.abc import Callable
from typing import NamedTuple

from .active_stream import ActiveStream
from .backfills import BackfillQueue
from .flow_control import FlowControlWindow
from .stream_types import Frames
from .streams import StreamRegistry

#: Bytes taken per pass at most, whatever the priority (other connections get their turn).
MAX_PASS_BYTES = 1 << 20
#: A stream's ready queue is refilled from its cursor below this many bytes.
STREAM_QUEUE_BYTES = 256 * 1024
#: Messages one stream sends per turn before the next stream's turn.
TURN_MESSAGES = 256
_memoryview = memoryview


class SendPass(NamedTuple):
    out: list  # bytes and memoryviews, in order
    sent: int  # their bytes
    messages: int
    views: bool  # large values travel uncopied among them (write them with writelines)
    blocked: bool  # stopped at the flow-control window: a BUFFER_ACK resumes
    more: bool  # stopped at the pass's budget: run another pass
    backfill: bool  # backfills wait in the queue: start what dcp/backfills.py allows
    stop: tuple  # outcomes.StopBackfill of streams forgotten in this pass


def send_pass(registry: StreamRegistry, window: FlowControlWindow, backfills: BackfillQueue, batch: int,
              forget: Callable[[ActiveStream], tuple]) -> SendPass:
    """Take what the streams of a connection may send now, at most `batch` messages; `forget(stream)`
    is told of each dead stream that has written everything (and answers what to stop). See the
    module docstring."""
    pending = registry.pending
    fc = window.buffer_size
    unacked = window.unacked
    out: list = []
    views = False
    budget_msgs, budget_bytes = batch, MAX_PASS_BYTES
    msgs = sent = 0
    blocked = more = False
    stop: tuple = ()
    while pending and not blocked and not more:
        progress = False
        for stream in list(pending):
            if stream.dead and not stream.ready:
                stop += forget(stream)
                continue
            if blocked:  # flow control: send nothing more, but let the backfills read ahead
                if stream.backfill is not None and not stream.backfill_running:
                    backfills.want(stream)
                continue
            if not stream.ready and not stream.fill(STREAM_QUEUE_BYTES) and not stream.ready:
                del pending[stream]  # idle until woken
                if stream.backfill is not None and not stream.backfill_running:
                    backfills.want(stream)
                continue
            if stream.backfill is not None and not stream.backfill_running:
                # fill() just planned a backfill (a dropped cursor): queue it now, or the stream
                # waits in `pending` with nothing to wake it and stalls
                backfills.want(stream)
            if fc and unacked >= fc:
                blocked = True
                continue
            ready = stream.ready
            turn = 0
            while ready:
                data = ready.popleft()
                n = 1
                if data.__class__ is Frames:  # a backfill page: whole messages, up to the window
                    if fc and unacked + len(data) > fc:
                        data, rest = data.split(fc - unacked)
                        if rest is not None:
                            ready.appendleft(rest)
                    n, data = data.count, data.data
                size = len(data)
                stream.ready_bytes -= size
                out.append(data)
                sent += size
                unacked += size
                if ready and ready[0].__class__ is _memoryview:
                    views = True
                    continue  # the value of this message: never split a message
                msgs += n
                turn += n
                if fc and unacked >= fc:
                    blocked = True
                    break
                if turn >= TURN_MESSAGES:
                    break
            if turn:
                progress = True
            if stream.dead and not stream.ready:
                stop += forget(stream)
            if blocked:
                continue
            if msgs >= budget_msgs or sent >= budget_bytes:
                more = True
                break
        if not progress:
            break
    if blocked:
        window.pauses += 1
    window.unacked = unacked if fc else 0  # flow control off: nothing is outstanding
    return SendPass(out, sent, msgs, views, blocked, more, bool(backfills.waiting), stop)
