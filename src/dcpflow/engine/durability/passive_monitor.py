"""PassiveDurabilityMonitor: what a replica acknowledges to its active (DCP_SEQNO_ACK).

After kv_engine's passive_durability_monitor.cc: the replica's *high prepared seqno* (HPS) moves
over the prepares it holds in seqno order - a Majority or MajorityAndPersistOnMaster prepare once
the snapshot holding it was received whole, a PersistToMajority prepare only once it is also
persisted - and stops at the first it cannot pass yet. The replica acknowledges each new HPS.
Commits and aborts received from the active complete prepares; the highest completed prepare seqno
is the HCS. Prepares still held become the new active's to re-drive (active_monitor.adopt) if this
replica is promoted.
"""

from .items import Prepare
from .requirements import Level


class PassiveDurabilityMonitor:
    def __init__(self, hps: int = 0, hcs: int = 0):
        self.hps = hps
        self.hcs = hcs
        self.pending: dict[int, Prepare] = {}  # prepare seqno -> prepare not passed by the HPS yet
        self.snapshot_end_received = 0
        self.persisted_seqno = 0

    def received(self, prepare: Prepare) -> None:
        self.pending[prepare.by_seqno] = prepare

    def snapshot_received(self, end: int) -> bool:
        """Every item up to `end` arrived; True if the HPS moved."""
        self.snapshot_end_received = max(self.snapshot_end_received, end)
        return self._advance()

    def persisted(self, seqno: int) -> bool:
        self.persisted_seqno = max(self.persisted_seqno, seqno)
        return self._advance()

    def completed(self, prepared_seqno: int) -> None:
        self.hcs = max(self.hcs, prepared_seqno)
        self._advance()

    def _advance(self) -> bool:
        moved = False
        received, persisted = self.snapshot_end_received, self.persisted_seqno
        for seqno in sorted(self.pending):
            p = self.pending[seqno]
            if seqno > received or (p.level == Level.PERSIST_TO_MAJORITY and seqno > persisted):
                break
            del self.pending[seqno]
            if seqno > self.hps:
                self.hps = seqno
                moved = True
        return moved
