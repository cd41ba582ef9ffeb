"""DCP flow control, both ends: the producer's window and the consumer's acknowledgements.

Pages: https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/flow-control.md,
commands/buffer-ack.md and commands/control.md (`connection_buffer_size`).

The producer charges every message but a noop its wire size as it is written and writes while
the unacknowledged bytes are below the buffer size the consumer set, so at most the buffer plus
one message is ever outstanding; a DCP_BUFFER_ACKNOWLEDGEMENT subtracts (whatever its opaque) and
gets no reply. A buffer size of 0 turns flow control off. The consumer counts each message it has
processed at the size the producer charged for it (protocol `charged_size`) and acknowledges once a
fifth of its buffer is consumed (`dcp_consumer_flow_control_ack_ratio`), or after a few seconds
with anything unacknowledged (`dcp_consumer_flow_control_ack_seconds`).
"""

#: Ack once this fraction of the buffer is consumed (dcp_consumer_flow_control_ack_ratio).
ACK_RATIO = 0.2
#: ...or once this long has passed with something unacknowledged (dcp_consumer_flow_control_ack_seconds).
ACK_SECONDS = 5.0


class FlowControlWindow:
    """The producer's window. `buffer_size` 0: flow control is off and nothing counts as
    outstanding. The send pass (send_pass.py) charges in bulk through `unacked` directly."""

    __slots__ = ("buffer_size", "unacked", "total_acked", "pauses")

    def __init__(self) -> None:
        self.buffer_size = 0
        self.unacked = 0  # bytes written and not acknowledged
        self.total_acked = 0
        self.pauses = 0  # send passes that stopped at the window (stat flow_control_pauses)

    @property
    def blocked(self) -> bool:
        """May nothing more be written until an acknowledgement?"""
        return bool(self.buffer_size) and self.unacked >= self.buffer_size

    def charge(self, nbytes: int) -> None:
        """A message of `nbytes` was written (noops are free: do not charge them)."""
        if self.buffer_size:
            self.unacked += nbytes

    def ack(self, nbytes: int) -> None:
        """DCP_BUFFER_ACKNOWLEDGEMENT: more than is outstanding clears it, no more."""
        self.total_acked += nbytes
        self.unacked = max(0, self.unacked - nbytes)


class BufferAcker:
    """The consumer's side: `consumed` counts what was processed and says when to acknowledge;
    `take` is the acknowledgement to send. `deadline` is when unacknowledged bytes must be
    acknowledged anyway (the caller's timer), None when there are none or a timer was asked for."""

    __slots__ = ("buffer_size", "threshold", "unacked", "total_acked", "bytes_received", "deadline")

    def __init__(self, buffer_size: int) -> None:
        self.buffer_size = buffer_size
        self.threshold = max(1, int(buffer_size * ACK_RATIO))
        self.unacked = 0
        self.total_acked = 0
        self.bytes_received = 0
        self.deadline: float | None = None

    def consumed(self, nbytes: int, now: float) -> bool:
        """`nbytes` of the producer's window were processed at `now`: True if an acknowledgement
        is due at once (the threshold is reached); otherwise the first unacknowledged bytes set
        `deadline` to ACK_SECONDS from now."""
        self.bytes_received += nbytes
        self.unacked += nbytes
        if self.unacked >= self.threshold:
            return True
        if self.deadline is None and self.unacked:
            self.deadline = now + ACK_SECONDS
        return False

    def take(self) -> int:
        """The bytes to acknowledge now (0: nothing), counted as acknowledged."""
        nbytes, self.unacked, self.deadline = self.unacked, 0, None
        self.total_acked += nbytes
        return nbytes
