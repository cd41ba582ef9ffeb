"""Hybrid logical clock (HLC): where CAS values come from.

Couchbase CAS values are HLC timestamps. The high 48 bits are wall-clock nanoseconds with the low
16 bits masked off; the low 16 bits act as a logical counter whenever the wall clock has not moved
past the last CAS handed out (same tick, or the clock stepped back). So CAS is strictly
increasing per vbucket, stays close to real time (which LWW conflict resolution relies on across
clusters), and survives restart because the vbucket's max CAS is persisted and fed back in.
"""

import time
from collections.abc import Callable

from dcpflow.protocol.status import Status

from .errors import EngineError

_LOGICAL_BITS = 0xFFFF
_PHYSICAL_MASK = ~_LOGICAL_BITS  # next() runs on every write: not recomputed there
_NS_PER_US = 1000
#: The largest CAS a vbucket hands out: 2^64 - 1 is the CAS a locked document reports
#: (Document.md), and nothing above it fits the protocol's u64 or the store.
MAX_CAS = 0xFFFF_FFFF_FFFF_FFFE


class HLC:
    """Per-vbucket CAS generator; `next()` for local writes, `observe()` for remote CAS values."""

    __slots__ = ("_max", "_clock", "_ahead_ns", "_behind_ns", "logical_ticks",
                 "drift_ahead_exceeded", "drift_behind_exceeded")

    def __init__(self, max_cas: int = 0, *, clock: Callable[[], int] = time.time_ns,
                 drift_ahead_threshold_us: int = 5_000_000, drift_behind_threshold_us: int = 5_000_000):
        self._max = max_cas
        self._clock = clock
        self._ahead_ns = drift_ahead_threshold_us * _NS_PER_US
        self._behind_ns = drift_behind_threshold_us * _NS_PER_US
        self.logical_ticks = 0  # how often the counter, not the clock, produced the CAS
        self.drift_ahead_exceeded = 0
        self.drift_behind_exceeded = 0

    @property
    def max_cas(self) -> int:
        return self._max

    def next(self) -> int:
        """A CAS greater than every CAS this vbucket has generated or observed."""
        now = self._clock() & _PHYSICAL_MASK
        if now > self._max:
            self._max = now
            return now
        if self._max >= MAX_CAS:  # only reachable after taking in a CAS at the very top of the range
            raise EngineError(Status.ERANGE, "this vbucket's CAS clock is exhausted: a CAS of "
                              f"0x{self._max:x} was taken in from elsewhere and no larger one fits 64 bits")
        self._max += 1
        self.logical_ticks += 1
        return self._max

    def observe(self, cas: int) -> None:
        """Take in a CAS made elsewhere (WithMeta, replication) so local CAS stays above it.

        Also counts drift beyond the thresholds (`hlc_drift_*_threshold_us`, 5 s by default),
        which is how an operator spots a peer cluster whose clock is off.
        """
        drift = (cas & ~_LOGICAL_BITS) - self._clock()
        if drift > self._ahead_ns:
            self.drift_ahead_exceeded += 1
        elif -drift > self._behind_ns:
            self.drift_behind_exceeded += 1
        if cas > self._max:
            self._max = cas
