"""HLC: CAS values are strictly increasing, close to physical time, and resume above max CAS."""

import pytest

from dcpflow.engine import HLC, EngineError, VBucketState
from dcpflow.engine.hlc import MAX_CAS
from dcpflow.protocol.status import Status

T0 = 1_700_000_000 * 10**9


class NsClock:
    def __init__(self, now=T0):
        self.now = now

    def __call__(self):
        return self.now


def test_cas_is_physical_time_with_low_16_bits_masked():
    clock = NsClock(T0 + 0x1234)
    hlc = HLC(clock=clock)
    assert hlc.next() == (T0 + 0x1234) & ~0xFFFF


def test_logical_counter_keeps_cas_increasing_when_clock_stalls_or_goes_back():
    clock = NsClock()
    hlc = HLC(clock=clock)
    a, b, c = hlc.next(), hlc.next(), hlc.next()
    assert a < b < c and c - a == 2
    assert hlc.logical_ticks == 2
    clock.now -= 10**9  # wall clock steps back a second
    assert hlc.next() == c + 1


def test_clock_moving_ahead_resets_to_physical_time():
    clock = NsClock()
    hlc = HLC(clock=clock)
    hlc.next()
    clock.now += 10**6
    assert hlc.next() == (T0 + 10**6) & ~0xFFFF


def test_observe_raises_the_max_and_counts_drift():
    clock = NsClock()
    hlc = HLC(clock=clock)
    remote = T0 + 10 * 10**9  # ten seconds ahead of us
    hlc.observe(remote)
    assert hlc.max_cas == remote and hlc.next() == remote + 1
    assert hlc.drift_ahead_exceeded == 1
    hlc.observe(T0 - 10 * 10**9)
    assert hlc.drift_behind_exceeded == 1
    assert hlc.max_cas == remote + 1


def test_an_exhausted_clock_refuses_instead_of_passing_64_bits():
    hlc = HLC(MAX_CAS - 1, clock=NsClock())
    assert hlc.next() == MAX_CAS
    with pytest.raises(EngineError) as exc:
        hlc.next()
    assert exc.value.status == Status.ERANGE and hlc.max_cas == MAX_CAS


def test_initial_max_cas_is_respected():
    hlc = HLC(T0 * 2, clock=NsClock())
    assert hlc.next() == T0 * 2 + 1


def test_max_cas_survives_restart_even_if_the_clock_went_back(make_bucket):
    clock = NsClock()
    b = make_bucket(hlc_clock=clock)
    vb = b.set_vbucket_state(0, VBucketState.ACTIVE)
    last = [vb.set(b"k%d" % i, b"v").cas for i in range(5)][-1]
    b.close()
    clock.now = T0 - 3600 * 10**9  # restarted on a machine whose clock is an hour behind
    again = make_bucket(hlc_clock=clock)
    assert again.vbucket(0).hlc.max_cas == last
    assert again.vbucket(0).set(b"k", b"v").cas == last + 1
