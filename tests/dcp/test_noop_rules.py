"""The noop timer of a producer connection without a socket: DcpProducer.noop_timer driven
with the times a timer fires at, asserting the outcomes it returns (a DCP_NOOP to send, re-arm the
timer, close an idle connection). The rules as KV-Engine's code behaves (no-op.md and
dead-connections.md describe noops only when idle: erratum 37): with `enable_noop` a noop every
interval while none is outstanding, whatever else is sent, and the connection closed only when
nothing at all was received for dcp_idle_timeout. test_noop.py keeps two of these end to end."""

from dcpflow.dcp.outcomes import ARM_NOOP_TIMER, NOTHING, Close, Send
from dcpflow.protocol import dcp
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .sansio import decode, drain, engine_fixture, fill, producer, request, written

engine = engine_fixture(2)


def noops_in(actions: tuple) -> list[dcp.DcpNoop]:
    return [m for m in decode(a.data for a in actions if isinstance(a, Send)) if isinstance(m, dcp.DcpNoop)]


def run_timer(p, start: float, seconds: float, *, answer: bool = True, between=None) -> tuple[int, list]:
    """Fire the timer as the shell does - when armed, one interval after the last firing - from
    `start` for `seconds`; answer each noop at once when `answer`; `between(now)` runs before each
    firing. Returns (noops sent, every outcome returned)."""
    now, sent, log = start, 0, []
    while True:
        now += p.noop.interval
        if now > start + seconds:
            return sent, log
        if between is not None:
            between(now)
        actions = p.noop_timer(now)
        log.append(actions)
        for noop in noops_in(actions):
            sent += 1
            if answer:
                p.reply(Status.SUCCESS, Opcode.DCP_NOOP, noop.opaque, now)
        if ARM_NOOP_TIMER not in actions:
            return sent, log  # the shell's timer stops here


def controls(p, now: float = 100.0, **kv) -> list[tuple]:
    return [p.control(k, v, now=now, collections=False) for k, v in kv.items()]


def test_noops_at_the_interval(engine):
    p = producer(engine)
    assert controls(p, enable_noop="true", set_noop_interval="0.2") == [(ARM_NOOP_TIMER,), (ARM_NOOP_TIMER,)]
    sent, log = run_timer(p, 100.0, 1.05)
    assert sent == 5  # one per interval, each answered
    for actions in log:  # a DCP_NOOP with the policy's opaque, then the timer again
        (noop,) = noops_in(actions)
        assert actions == (Send(dcp.DcpNoop(noop.opaque).encode()), ARM_NOOP_TIMER)


def test_noops_also_while_streaming(engine):
    """Traffic does not postpone them (erratum 37)."""
    p = producer(engine)
    controls(p, enable_noop="true", set_noop_interval="0.1")
    assert p.stream_request(request(0), collections=False).__class__.__name__ == "Started"
    streamed = []

    def busy(now):
        fill(engine, 0, 1, prefix=f"busy{now:.1f}-")
        written(p, 0)
        streamed.extend(drain(p))

    sent, _ = run_timer(p, 100.0, 0.8, between=busy)
    assert sent >= 2 and len([m for m in streamed if isinstance(m, dcp.DcpMutation)]) >= 7


def test_no_second_noop_while_one_is_outstanding(engine):
    p = producer(engine)
    controls(p, enable_noop="true", set_noop_interval="0.1")
    sent, log = run_timer(p, 100.0, 0.8, answer=False)
    assert sent == 1
    assert all(actions == (ARM_NOOP_TIMER,) for actions in log[1:])  # the timer goes on, sending nothing


def test_no_noops_unless_enabled(engine):
    p = producer(engine)
    controls(p, set_noop_interval="0.1")
    assert p.noop_timer(100.5) == NOTHING  # off: nothing to send, no timer to re-arm
    controls(p, 100.5, enable_noop="true")
    sent, _ = run_timer(p, 100.5, 0.5)
    assert sent >= 1
    controls(p, 101.0, enable_noop="false")
    assert p.noop_timer(101.1) == NOTHING and p.noop_timer(200.0) == NOTHING


def test_idle_consumer_is_disconnected(engine):
    p = producer(engine, idle_timeout=0.6)
    controls(p, enable_noop="true", set_noop_interval="0.1")
    _, log = run_timer(p, 100.0, 5.0, answer=False)
    (close,) = log[-1]
    assert isinstance(close, Close) and "dcp_idle_timeout" in close.reason
    assert 0.5 <= 0.1 * len(log) < 3  # about the idle timeout after the last thing received
    assert not any(isinstance(a, Close) for actions in log[:-1] for a in actions)


def test_answering_consumer_stays_connected(engine):
    p = producer(engine, idle_timeout=0.6)
    controls(p, enable_noop="true", set_noop_interval="0.1")
    sent, log = run_timer(p, 100.0, 1.5)
    assert sent >= 10 and not any(isinstance(a, Close) for actions in log for a in actions)
    assert controls(p, 101.5, set_priority="high") == [NOTHING]  # still served


def test_no_idle_disconnect_without_noop(engine):
    p = producer(engine, idle_timeout=0.3)
    assert p.noop_timer(100.0 + 1.0) == NOTHING  # never a Close: noops are off
