"""dcpflow.replication: the cluster manager role (vbucket map, replicas over DCP ADD_STREAM,
failover, takeover) - see cluster.py and docs/cluster.md."""

from .cluster import ClusterError, ClusterManager, plan_map
from .replicator import Replicator

__all__ = ["ClusterError", "ClusterManager", "Replicator", "plan_map"]
