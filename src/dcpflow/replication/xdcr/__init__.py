"""Cross-cluster replication (XDCR) with *WithMeta: see replicator.py and docs/xdcr.md."""

from dcpflow.client.with_meta import Change, Target

from .checkpoints import CheckpointError, CheckpointStore, Generation, target_survives
from .filters import Filters
from .replicator import ReplicationError, Settings, XdcrReplicator

__all__ = ["Change", "CheckpointError", "CheckpointStore", "Filters", "Generation", "ReplicationError", "Settings",
           "Target", "XdcrReplicator", "target_survives"]
