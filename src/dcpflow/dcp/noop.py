"""The producer's noop and idle rules: when to send a DCP_NOOP, when to give up on a consumer.

Pages: https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/commands/no-op.md,
dead-connections.md, commands/control.md (`enable_noop`, `set_noop_interval`).

With `enable_noop` the producer sends a noop every noop interval while none is outstanding,
whatever else it sends (kv_engine sends one only when it has been idle; a consumer cannot tell the
difference, and a noop that travels behind a full window still proves the connection alive). The
connection is closed when nothing at all has been received from the consumer for the idle timeout
(`dcp_idle_timeout`, 360 s). Without `enable_noop` neither happens. The caller runs a timer every
`interval` while `enabled` and asks `tick(now)` what to do.
"""

import itertools
from enum import Enum

#: Producer noop period until the consumer sets one (dcp_noop_tx_interval).
DEFAULT_NOOP_INTERVAL = 0.1
#: Lower bound of set_noop_interval (connection_manager_interval).
MIN_NOOP_INTERVAL = 0.1
#: Disconnect after this long without receiving anything (dcp_idle_timeout), when noop is enabled.
DEFAULT_IDLE_TIMEOUT = 360.0


class NoopAction(Enum):
    NONE = "none"
    SEND = "send"  # send DcpNoop(policy.opaque)
    DISCONNECT = "disconnect"  # idle for longer than the idle timeout


class NoopPolicy:
    """See the module docstring. Times are the caller's monotonic clock, in seconds."""

    __slots__ = ("enabled", "interval", "pending", "last_sent", "last_received", "idle_timeout", "opaque",
                 "_opaques")

    def __init__(self, now: float, idle_timeout: float = DEFAULT_IDLE_TIMEOUT) -> None:
        self.enabled = False
        self.interval = DEFAULT_NOOP_INTERVAL
        self.pending = False  # a noop was sent and not answered yet
        self.last_sent = 0.0
        self.last_received = now
        self.idle_timeout = idle_timeout
        self.opaque = 0  # the opaque of the noop `tick` last asked to send
        self._opaques = itertools.count(0x10000000)

    def enable(self, on: bool, now: float) -> None:
        """`enable_noop`: the first noop is due one interval from now."""
        self.enabled = on
        self.last_sent = now

    def received(self, now: float) -> None:
        """Anything arrived from the consumer."""
        self.last_received = now

    def answered(self) -> None:
        """The consumer answered the outstanding noop."""
        self.pending = False

    def idle(self, now: float) -> float:
        return now - self.last_received

    def tick(self, now: float) -> NoopAction:
        """The timer fired: disconnect an idle consumer, or send a noop when one is due and none is
        outstanding (a timer a little early still counts: intervals are measured by the loop)."""
        if now - self.last_received > self.idle_timeout:
            return NoopAction.DISCONNECT
        if not self.pending and now - self.last_sent >= self.interval * 0.999:
            self.pending = True
            self.last_sent = now
            self.opaque = next(self._opaques)
            return NoopAction.SEND
        return NoopAction.NONE
