"""The cluster map this node serves (GET_CLUSTER_CONFIG, NOT_MY_VBUCKET), one revision at a time.

Shape: the cluster map the official SDKs read, built by dcpflow.protocol.config. Hostnames stay
the literal `$HOST` so each client substitutes the address it dialled.

Designed for several nodes: `nodes` is the whole cluster and `this_node` the index of this one. A
bucket's vBucketMap is either set explicitly (`set_vbucket_map`, what a cluster manager pushes)
or derived from the local vbucket states: with one node, every active vbucket is on node 0 and
any other vbucket has no active (-1), so a client retrying a replica vbucket waits instead of
looping on NOT_MY_VBUCKET. Every change bumps `rev`; clients keep the map with the highest
(revEpoch, rev), so `rev` starts at the wall clock in seconds to stay increasing across restarts.

Every map carries the cluster's name and uuid (clusterName, clusterUUID), as ns_server's do; a
node of a `dcpflow cluster` takes them from the map its cluster manager pushes, so every node names
the same cluster. `watchers` are called after every change (the management port's streaming
config endpoints wait on them).
"""

import time
from collections.abc import Callable

from dcpflow.protocol.config import (
    DEFAULT_BUCKET_CAPABILITIES,
    DEFAULT_CLUSTER_NAME,
    HISTORY_CAPABILITY,
    Node,
    build_bucket_config,
    build_cluster_config,
    encode_config,
    with_this_node,
)


class Topology:
    def __init__(self, nodes: list[Node], this_node: int = 0, *, rev_epoch: int = 1, rev: int | None = None,
                 cluster_uuid: str = "", cluster_name: str = DEFAULT_CLUSTER_NAME):
        if not 0 <= this_node < len(nodes):
            raise ValueError(f"this_node {this_node} is not one of the {len(nodes)} nodes")
        self.nodes = with_this_node(nodes, this_node)
        self.this_node = this_node
        self.rev_epoch = rev_epoch
        self.rev = int(time.time()) if rev is None else rev
        self._maps: dict[str, list[list[int]]] = {}
        self._num_replicas: dict[str, int] = {}
        self._cache: dict[str | None, tuple[int, bytes]] = {}
        self.managed = False  # a cluster manager pushed the map: only a newer push changes it
        self.cluster_uuid = cluster_uuid
        self.cluster_name = cluster_name
        self.watchers: set[Callable[[], None]] = set()

    @property
    def version(self) -> tuple[int, int]:
        return self.rev_epoch, self.rev

    def bump(self) -> None:
        """Something a client routes by changed (vbucket state, map, nodes). Once a cluster manager
        pushes maps (`adopt`), the revision is its own: every node serves the same (epoch, rev)."""
        if not self.managed:
            self.rev += 1
        self.notify()

    def notify(self) -> None:
        for watcher in list(self.watchers):
            watcher()

    def adopt(self, bucket: str, nodes: list[Node], this_port: int, vbucket_map: list[list[int]],
              num_replicas: int, version: tuple[int, int],
              cluster: tuple[str | None, str | None] = (None, None)) -> bool:
        """A map pushed by the cluster manager (SET_CLUSTER_CONFIG): serve it with this node's entry
        (found by its KV port) marked thisNode, and the cluster's (name, uuid) when it names them.
        An older or equal version is ignored (False)."""
        if self.managed and version <= self.version:
            return False
        index = next((i for i, n in enumerate(nodes) if n.kv_port == this_port), -1)
        self.nodes = with_this_node(nodes, index)
        self.this_node = index
        self._maps[bucket] = [list(chain) for chain in vbucket_map]
        self._num_replicas[bucket] = num_replicas
        self.rev_epoch, self.rev = version
        self.managed = True
        name, uuid = cluster
        self.cluster_name = name or self.cluster_name
        self.cluster_uuid = uuid or self.cluster_uuid
        self._cache.clear()
        self.notify()
        return True

    def set_vbucket_map(self, bucket: str, vbucket_map: list[list[int]], num_replicas: int = 0) -> None:
        self._maps[bucket] = [list(chain) for chain in vbucket_map]
        self._num_replicas[bucket] = num_replicas
        self.bump()

    def bucket_config(self, name: str, uuid: str, local_states: Callable[[], list[list[int]]],
                      manifest_uid: int = 0, history: bool = False) -> bytes:
        """The bucket's map as JSON bytes; `local_states()` derives a single-node map when none was set;
        `history`: the bucket may keep history (magma storage), so it advertises nonDedupedHistory.
        Cached per revision: clients fetch it every 2.5 s and with every NOT_MY_VBUCKET (a change
        of the collections manifest or of the bucket's storage bumps the revision, so neither is
        ever stale here)."""
        cached = self._cache.get(name)
        if cached is not None and cached[0] == self.rev:
            return cached[1]
        vbucket_map = self._maps.get(name)
        if vbucket_map is None:
            vbucket_map = local_states()
        config = build_bucket_config(name, self.nodes, vbucket_map=vbucket_map,
                                     num_replicas=self._num_replicas.get(name, 0), rev=self.rev,
                                     rev_epoch=self.rev_epoch, uuid=uuid, collections_manifest_uid=manifest_uid,
                                     capabilities=(*DEFAULT_BUCKET_CAPABILITIES, HISTORY_CAPABILITY) if history
                                     else DEFAULT_BUCKET_CAPABILITIES,
                                     cluster_name=self.cluster_name, cluster_uuid=self.cluster_uuid)
        data = encode_config(config)
        self._cache[name] = (self.rev, data)
        return data

    def cluster_config(self) -> bytes:
        """The cluster-level map (no bucket selected): nodes and services, no vBucketMap."""
        cached = self._cache.get(None)
        if cached is not None and cached[0] == self.rev:
            return cached[1]
        data = encode_config(build_cluster_config(self.nodes, rev=self.rev, rev_epoch=self.rev_epoch,
                                                  cluster_name=self.cluster_name, cluster_uuid=self.cluster_uuid))
        self._cache[None] = (self.rev, data)
        return data
