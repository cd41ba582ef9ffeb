"""ActiveDurabilityMonitor: the prepares an active vbucket waits on, and when each completes.

After kv_engine's active_durability_monitor.cc: every prepare is tracked with its level and
deadline; a replica's DCP_SEQNO_ACK(seqno) acknowledges every prepare up to that seqno (a replica
acknowledges a PersistToMajority prepare only once it persisted it, see passive_monitor.py); the
flusher tells how far the active persisted. A prepare is *satisfied* when, counting the active and
the replicas of the current chain that acknowledged it, a majority of the chain has it - in memory
for Majority, with the active's copy persisted for MajorityAndPersistOnMaster, persisted on each
counted node for PersistToMajority. A satisfied prepare is committed; one whose deadline passes
first is aborted, and its writer is told the outcome is ambiguous (replicas may hold it).

Prepares taken over from a replica that became active (`adopt`) have no deadline: the old active
may have committed them, so the new one may only drive them to commit, never abort them.

The monitor decides; the vbucket (vb_sync_writes.py) queues the commits and aborts. Completion callbacks
run after the vbucket queued the commit or abort.
"""

import enum
import math
from collections.abc import Callable

from .items import Prepare
from .requirements import Level, Topology

_MAJ, _MAJ_PERSIST, _PERSIST = Level.MAJORITY, Level.MAJORITY_AND_PERSIST_ON_MASTER, Level.PERSIST_TO_MAJORITY


class Outcome(enum.Enum):
    COMMITTED = "committed"
    ABORTED = "aborted"  # its deadline passed: the writer gets SYNC_WRITE_AMBIGUOUS


class SyncWrite:
    __slots__ = ("prepare", "level", "deadline", "waiters")

    def __init__(self, prepare: Prepare, level: int, deadline: float):
        self.prepare = prepare
        self.level = level
        self.deadline = deadline
        self.waiters: list[Callable[[Outcome], None]] = []

    def __repr__(self) -> str:
        return f"<SyncWrite {self.prepare.key!r} seqno={self.prepare.by_seqno} level={Level(self.level).name}>"


class ActiveDurabilityMonitor:
    """One per active vbucket; see the module docstring."""

    def __init__(self, topology: Topology | None = None, persisted_seqno: int = 0):
        self.topology = topology
        self.tracked: dict[int, SyncWrite] = {}  # prepare seqno -> write, in seqno order
        self.acks: dict[str, int] = {}  # replica name -> highest seqno it acknowledged
        self.persisted_seqno = persisted_seqno

    def __len__(self) -> int:
        return len(self.tracked)

    @property
    def possible(self) -> bool:
        return self.topology is not None and self.topology.possible

    def track(self, prepare: Prepare, level: int, deadline: float) -> SyncWrite:
        sw = self.tracked[prepare.by_seqno] = SyncWrite(prepare, level, deadline)
        return sw

    def adopt(self, prepares) -> None:
        """Prepares a replica held when it became active: tracked without a deadline."""
        for p in prepares:
            self.tracked[p.by_seqno] = SyncWrite(p, p.level, math.inf)

    def forget(self, seqno: int) -> SyncWrite | None:
        return self.tracked.pop(seqno, None)

    def set_topology(self, topology: Topology | None) -> None:
        self.topology = topology
        if topology is not None:  # acks of nodes no longer in the chain count no more
            self.acks = {n: s for n, s in self.acks.items() if n in topology.replicas}

    def seqno_ack(self, node: str, seqno: int) -> None:
        if seqno > self.acks.get(node, 0):
            self.acks[node] = seqno

    def persisted(self, seqno: int) -> None:
        if seqno > self.persisted_seqno:
            self.persisted_seqno = seqno

    def satisfied(self, sw: SyncWrite) -> bool:
        topo = self.topology
        if topo is None:
            return False
        seqno = sw.prepare.by_seqno
        local_persisted = self.persisted_seqno >= seqno
        if sw.level == _MAJ_PERSIST and not local_persisted:
            return False
        count = 1 if sw.level != _PERSIST or local_persisted else 0
        acks = self.acks
        for node in topo.replicas:
            if acks.get(node, 0) >= seqno:
                count += 1
        return count >= topo.majority

    def ready(self) -> list[SyncWrite]:
        """The tracked writes whose requirements are met, in seqno order."""
        return [sw for sw in self.tracked.values() if self.satisfied(sw)]

    def expired(self, now: float) -> list[SyncWrite]:
        return [sw for sw in self.tracked.values() if sw.deadline <= now and not self.satisfied(sw)]

    def next_deadline(self) -> float:
        return min((sw.deadline for sw in self.tracked.values()), default=math.inf)
