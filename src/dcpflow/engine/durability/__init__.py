"""Synchronous replication (durable writes) in the engine, after kv_engine's durability design
(https://github.com/couchbase/kv_engine/tree/master/engines/ep/src/durability).

A write with a durability level is first queued as a *prepare* (items.py): it takes a seqno, goes
to the checkpoints, the flusher and DCP consumers that enabled sync writes, but the key's readable
value does not change and other writes to the key are refused with SYNC_WRITE_IN_PROGRESS until the
prepare completes. The active vbucket's `ActiveDurabilityMonitor` (active_monitor.py) commits a
prepare once its level's acknowledgements and persistence are in, or aborts it at its timeout; a
replica's `PassiveDurabilityMonitor` (passive_monitor.py) decides which seqno to acknowledge (its
high prepared seqno). A commit and an abort are items of their own, with seqnos after the prepare's.
What a level requires and when it cannot be met is in requirements.py.
"""

from .active_monitor import ActiveDurabilityMonitor, Outcome
from .items import Abort, Commit, Prepare, is_sync_item
from .passive_monitor import PassiveDurabilityMonitor
from .requirements import DEFAULT_TIMEOUT, Level, Topology

__all__ = ["DEFAULT_TIMEOUT", "Abort", "ActiveDurabilityMonitor", "Commit", "Level", "Outcome",
           "PassiveDurabilityMonitor", "Prepare", "Topology", "is_sync_item"]
