"""The producer's noop and idle decisions without a socket or a clock (dcp/noop.py): a noop every
interval while none is outstanding, a disconnect after the idle timeout without input."""

from dcpflow.dcp.noop import DEFAULT_IDLE_TIMEOUT, DEFAULT_NOOP_INTERVAL, NoopAction, NoopPolicy


def enabled(now: float = 0.0, **kw) -> NoopPolicy:
    policy = NoopPolicy(now, **kw)
    policy.enable(True, now)
    return policy


def test_defaults():
    policy = NoopPolicy(5.0)
    assert not policy.enabled and not policy.pending
    assert policy.interval == DEFAULT_NOOP_INTERVAL == 0.1
    assert policy.idle_timeout == DEFAULT_IDLE_TIMEOUT == 360.0
    assert policy.last_received == 5.0 and policy.idle(7.5) == 2.5


def test_a_noop_is_due_one_interval_after_enabling():
    policy = enabled(10.0)
    assert policy.tick(10.05) is NoopAction.NONE
    assert policy.tick(10.1) is NoopAction.SEND
    assert policy.pending and policy.last_sent == 10.1


def test_a_timer_firing_a_little_early_still_sends():
    policy = enabled(0.0)
    policy.interval = 1.0
    assert policy.tick(0.9995) is NoopAction.SEND  # within 0.1% of the interval
    policy.answered()
    assert policy.tick(0.9995 + 0.998) is NoopAction.NONE  # earlier than that: not yet


def test_one_noop_outstanding_at_most_then_the_next_after_the_answer():
    policy = enabled(0.0)
    assert policy.tick(0.1) is NoopAction.SEND
    first = policy.opaque
    assert policy.tick(0.2) is NoopAction.NONE and policy.tick(5.0) is NoopAction.NONE  # unanswered
    policy.received(5.0)
    policy.answered()
    assert not policy.pending
    assert policy.tick(5.0) is NoopAction.SEND  # last sent at 0.1: long overdue
    assert policy.opaque == first + 1  # each noop its own opaque


def test_opaques_start_apart_from_stream_opaques():
    policy = enabled(0.0)
    policy.tick(1.0)
    assert policy.opaque == 0x10000000


def test_idle_for_longer_than_the_timeout_disconnects():
    policy = enabled(0.0, idle_timeout=30.0)
    assert policy.tick(30.0) is not NoopAction.DISCONNECT  # exactly the timeout: not yet
    assert policy.tick(30.01) is NoopAction.DISCONNECT
    policy.received(30.01)  # anything received resets the idle time
    assert policy.tick(60.0) is not NoopAction.DISCONNECT
    assert policy.tick(60.02) is NoopAction.DISCONNECT


def test_disconnect_wins_over_a_due_noop():
    policy = enabled(0.0, idle_timeout=1.0)
    assert policy.tick(2.0) is NoopAction.DISCONNECT
    assert not policy.pending  # nothing was sent


def test_re_enabling_restarts_the_interval():
    policy = enabled(0.0)
    policy.enable(True, 50.0)
    assert policy.tick(50.05) is NoopAction.NONE
    assert policy.tick(50.1) is NoopAction.SEND
