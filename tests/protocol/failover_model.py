"""A reference model of a vbucket's history, to check the divergence rule against (Hypothesis).

The model knows what the rule can only infer from a failover log: which branch wrote each seqno.
A producer writes seqnos on its newest branch; a failover (an unclean restart, a promoted replica)
loses the seqnos above some point and starts a new branch there, dropping the log entries that
began above it. A consumer reads a prefix of the history at some moment, ending inside (or at the
end of) a snapshot; later the producer's history may have moved on. Truth is a comparison of the
two histories, seqno by seqno.
"""

from dataclasses import dataclass, field

from hypothesis import strategies as st


@dataclass
class Producer:
    log: list[tuple[int, int]] = field(default_factory=lambda: [(1, 0)])  # newest first
    written: list[int] = field(default_factory=list)  # written[s - 1]: the branch that wrote seqno s

    @property
    def high(self) -> int:
        return len(self.written)

    def write(self, n: int) -> None:
        self.written += [self.log[0][0]] * n

    def failover(self, lost: int) -> None:
        """Lose the newest `lost` seqnos; a new branch begins where the history now ends."""
        at = self.high - lost
        del self.written[at:]
        uuid = max(u for u, _ in self.log) + 1  # uuids are never reused (logs drop entries)
        self.log = [(uuid, at)] + [e for e in self.log if e[1] <= at]


@dataclass(frozen=True)
class Consumer:
    """What a consumer read: up to seqno of snapshot snapshot_start..snapshot_end, taken from the
    producer's newest branch then; `source` is the history that snapshot came from."""

    vbuuid: int
    seqno: int
    snapshot_start: int
    snapshot_end: int
    source: tuple[int, ...]

    @property
    def needed(self) -> int:
        """The seqno up to which the producer must share the consumer's history for it to go on:
        the snapshot end (what it holds is consistent only there), or the seqno itself when it has
        nothing of the snapshot yet (it stands at the snapshot start)."""
        return self.seqno if self.seqno == self.snapshot_start else self.snapshot_end

    def common(self, producer: Producer) -> int:
        """How far the consumer's history and the producer's agree, seqno by seqno from 1."""
        n = 0
        for mine, theirs in zip(self.source, producer.written, strict=False):
            if mine != theirs:
                break
            n += 1
        return n


@st.composite
def histories(draw, max_events: int = 12):
    """(producer now, consumers that read from it along the way)."""
    p = Producer()
    consumers = []
    for _ in range(draw(st.integers(1, max_events))):
        kind = draw(st.sampled_from(("write", "write", "failover", "read")))
        if kind == "write":
            p.write(draw(st.integers(1, 6)))
        elif kind == "failover":
            p.failover(draw(st.integers(0, p.high)))
        else:
            end = draw(st.integers(0, p.high))
            seqno = draw(st.integers(0, end))
            start = draw(st.integers(0, seqno))
            consumers.append(Consumer(p.log[0][0], seqno, start, end, tuple(p.written[:end])))
    if not consumers:
        end = draw(st.integers(0, p.high))
        consumers.append(Consumer(p.log[0][0], end, end, end, tuple(p.written)))
    return p, consumers
