"""What a durability level requires, and whether the replication chain can meet it.

Levels (https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/commands/prepare.md):
Majority - a majority of the chain holds the prepare in memory; MajorityAndPersistOnMaster - that,
and the active persisted it; PersistToMajority - a majority persisted it. The majority is of the
chain as configured, nodes not assigned yet included (kv_engine's ReplicationChain), so a bucket
with one replica and no node for it cannot meet any level: DURABILITY_IMPOSSIBLE, not a wait.
"""

from dataclasses import dataclass

from dcpflow.protocol.dcp import DurabilityLevel as Level

__all__ = ["DEFAULT_TIMEOUT", "Level", "Topology"]

#: The timeout of a sync write whose request gives none (kv_engine's durability_timeout default).
DEFAULT_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True)
class Topology:
    """The first replication chain of a vbucket: the active's name first, then its replicas (None:
    a replica slot with no node)."""

    chain: tuple[str | None, ...]

    @classmethod
    def of(cls, chain) -> "Topology":
        chain = tuple(chain)
        if not chain or chain[0] is None:
            raise ValueError("a replication chain starts with its active node")
        return cls(chain)

    @property
    def majority(self) -> int:
        return len(self.chain) // 2 + 1

    @property
    def replicas(self) -> tuple[str, ...]:
        return tuple(n for n in self.chain[1:] if n is not None)

    @property
    def possible(self) -> bool:
        """Enough nodes are assigned for a majority."""
        return 1 + len(self.replicas) >= self.majority
