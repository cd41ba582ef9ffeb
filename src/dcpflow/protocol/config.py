"""The cluster map ("bucket config") JSON: build it as a server, parse it and route with it as a client.

The shape the official SDKs read: rev, revEpoch, name, uuid, bucketType,
nodeLocator, bucketCapabilities, collectionsManifestUid (hex string), clusterName and clusterUUID
(ns_server's bucket_info_cache puts both in every map: the SDKs label their metrics and tracing
spans with the cluster name), nodes[] index-aligned with
nodesExt[] (services kv / mgmt / kvSSL, hostname, thisNode), and vBucketServerMap {numReplicas,
serverList, vBucketMap}. `mgmt` (and `mgmtSSL` with TLS) is the node's HTTP management port, which
the SDKs use for bucket management and `ping()`. Hostnames stay the literal `$HOST`: a client
replaces it with the address it dialled, which is what lets one map serve every interface. Keep
`nodes`, `nodeLocator` and a `mgmt` service: stricter clients reject a map without them; they also
reject an empty vBucketMap.

Index i of serverList, nodes and nodesExt is the same node; vBucketMap[vb] lists node indexes,
active first, then the replicas (-1 = no node).
"""

import json
from typing import NamedTuple

from .errors import ProtocolError
from .keys import vbucket_for_key

HOST_PLACEHOLDER = "$HOST"
DEFAULT_MGMT_PORT = 8091
DEFAULT_MGMT_SSL_PORT = 18091
DEFAULT_BUCKET_CAPABILITIES = ("collections", "dcp", "cccp", "nodesExt", "xattr", "cbhello", "touch",
                               "couchapi", "subdoc.ReplicaRead", "subdoc.AccessDeleted",
                               "subdoc.ReplaceBodyWithXattr", "subdoc.DocumentMacroSupport",
                               "subdoc.ReviveDocument", "tombstonedUserXAttrs", "preserve_expiry", "rangeScan")
#: "nonDedupedHistory": collections may keep history (DCP change streams). ns_server advertises
#: it only for a magma bucket (bucket_info_cache.erl, build_bucket_capabilities), and the SDKs'
#: collection managers refuse to send `history` (FeatureUnavailable) to a bucket without it.
HISTORY_CAPABILITY = "nonDedupedHistory"
DEFAULT_CLUSTER_NAME = "dcpflow"


class Node(NamedTuple):
    """One node of the map. `this_node` marks the node that serves the map (nodesExt[].thisNode)."""

    kv_port: int
    hostname: str = HOST_PLACEHOLDER
    mgmt_port: int = DEFAULT_MGMT_PORT
    kv_ssl_port: int | None = None
    this_node: bool = False
    mgmt_ssl_port: int | None = None

    @property
    def kv_address(self) -> str:
        """`host:port` as serverList spells it (IPv6 literals bracketed)."""
        return f"{_bracket(self.hostname)}:{self.kv_port}"


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def with_this_node(nodes, index: int) -> list[Node]:
    """The node list as node `index` serves it: only that node has thisNode set."""
    return [n._replace(this_node=i == index) for i, n in enumerate(nodes)]


def balanced_vbucket_map(num_vbuckets: int, num_nodes: int, num_replicas: int = 0) -> list[list[int]]:
    """A vBucketMap with actives and replicas spread evenly over the nodes.

    Actives are contiguous ranges of (almost) equal size, as ns_server lays them out. Each node's
    replicas are dealt round-robin over the other nodes, so when a node fails its load is shared by
    all survivors rather than dumped on one. A vbucket never has two copies on one node; replicas
    beyond num_nodes - 1 have no node (-1), as in a cluster with fewer nodes than copies.
    """
    if num_vbuckets < 1 or num_nodes < 1 or num_replicas < 0:
        raise ValueError(f"need >= 1 vbucket and node and >= 0 replicas; got {num_vbuckets}, {num_nodes}, "
                         f"{num_replicas}")
    if num_replicas > 3:
        raise ValueError(f"Couchbase buckets have at most 3 replicas; got {num_replicas}")
    out: list[list[int]] = []
    seen = [0] * num_nodes  # position of the next vbucket within its active node's range
    for vb in range(num_vbuckets):
        active = vb * num_nodes // num_vbuckets
        j = seen[active]
        seen[active] += 1
        others = [(active + k) % num_nodes for k in range(1, num_nodes)]
        chain = [active]
        for r in range(num_replicas):
            chain.append(others[(j + r) % len(others)] if r < len(others) else -1)
        out.append(chain)
    return out


def build_bucket_config(name: str, nodes, *, vbucket_map=None, num_vbuckets: int = 1024,
                        num_replicas: int = 0, rev: int = 1, rev_epoch: int = 1, uuid: str = "",
                        bucket_type: str = "membase", capabilities=DEFAULT_BUCKET_CAPABILITIES,
                        collections_manifest_uid: int = 0, cluster_name: str = DEFAULT_CLUSTER_NAME,
                        cluster_uuid: str = "") -> dict:
    """The bucket config as a JSON-ready dict. `vbucket_map` defaults to a balanced one."""
    nodes = list(nodes)
    if not nodes:
        raise ValueError("a cluster map needs at least one node")
    if vbucket_map is None:
        vbucket_map = balanced_vbucket_map(num_vbuckets, len(nodes), num_replicas)
    vbucket_map = [list(chain) for chain in vbucket_map]
    if not vbucket_map:
        raise ValueError("clients reject an empty vBucketMap")
    for vb, chain in enumerate(vbucket_map):
        if len(chain) != num_replicas + 1 or any(not -1 <= i < len(nodes) for i in chain):
            raise ValueError(f"vBucketMap[{vb}] = {chain} does not fit {len(nodes)} nodes and "
                             f"{num_replicas} replicas")
    return {
        "rev": rev,
        "revEpoch": rev_epoch,
        "name": name,
        "uuid": uuid,
        "bucketType": bucket_type,
        "nodeLocator": "vbucket",
        "bucketCapabilitiesVer": "",
        "bucketCapabilities": list(capabilities),
        "collectionsManifestUid": format(collections_manifest_uid, "x"),
        "clusterName": cluster_name,
        "clusterUUID": cluster_uuid,
        "nodes": [_node_entry(n) for n in nodes],
        "nodesExt": [_node_ext_entry(n) for n in nodes],
        "vBucketServerMap": {
            "hashAlgorithm": "CRC",
            "numReplicas": num_replicas,
            "serverList": [n.kv_address for n in nodes],
            "vBucketMap": vbucket_map,
        },
    }


def build_cluster_config(nodes, *, rev: int = 1, rev_epoch: int = 1, cluster_name: str = DEFAULT_CLUSTER_NAME,
                         cluster_uuid: str = "") -> dict:
    """The cluster-level config (GET_CLUSTER_CONFIG with no bucket selected): nodes, no vbucket map."""
    nodes = list(nodes)
    if not nodes:
        raise ValueError("a cluster map needs at least one node")
    return {"rev": rev, "revEpoch": rev_epoch, "nodesExt": [_node_ext_entry(n) for n in nodes],
            "clusterCapabilitiesVer": [1, 0], "clusterCapabilities": {}, "clusterName": cluster_name,
            "clusterUUID": cluster_uuid}


def _node_entry(n: Node) -> dict:
    return {"hostname": f"{_bracket(n.hostname)}:{n.mgmt_port}", "ports": {"direct": n.kv_port}}


def _node_ext_entry(n: Node) -> dict:
    services = {"kv": n.kv_port, "mgmt": n.mgmt_port}
    if n.kv_ssl_port is not None:
        services["kvSSL"] = n.kv_ssl_port
    if n.mgmt_ssl_port is not None:
        services["mgmtSSL"] = n.mgmt_ssl_port
    entry: dict = {"services": services}
    if n.this_node:
        entry["thisNode"] = True
    entry["hostname"] = n.hostname
    return entry


def encode_config(config: dict) -> bytes:
    """Compact JSON bytes, as they go in a GET_CLUSTER_CONFIG or NOT_MY_VBUCKET value."""
    return json.dumps(config, separators=(",", ":")).encode()


class ClusterMap(NamedTuple):
    """A parsed map: enough for a client to route key -> vbucket -> node and to pick the newest map."""

    rev: int
    rev_epoch: int
    nodes: tuple[Node, ...]
    server_list: tuple[str, ...] = ()
    vbucket_map: tuple[tuple[int, ...], ...] = ()
    num_replicas: int = 0
    name: str | None = None
    uuid: str | None = None
    bucket_type: str | None = None
    node_locator: str | None = None
    capabilities: tuple[str, ...] = ()
    collections_manifest_uid: int | None = None
    cluster_name: str | None = None
    cluster_uuid: str | None = None

    @property
    def version(self) -> tuple[int, int]:
        """(revEpoch, rev): compare these to pick the newer map (epoch first)."""
        return self.rev_epoch, self.rev

    def is_newer_than(self, other: "ClusterMap | None") -> bool:
        return other is None or self.version > other.version

    @property
    def num_vbuckets(self) -> int:
        return len(self.vbucket_map)

    @property
    def this_node(self) -> int | None:
        return next((i for i, n in enumerate(self.nodes) if n.this_node), None)

    def vbucket_for_key(self, key: bytes) -> int:
        """The vbucket of a key (without its collection prefix)."""
        if not self.vbucket_map:
            raise ProtocolError("this config has no vBucketMap (cluster-level config?)")
        return vbucket_for_key(key, len(self.vbucket_map))

    def server_for_vbucket(self, vbucket: int, replica: int = 0) -> str | None:
        """`host:port` of the vbucket's active (replica 0) or n-th replica, None if it has no node."""
        index = self.vbucket_map[vbucket][replica] if replica < len(self.vbucket_map[vbucket]) else -1
        return None if index < 0 else self.server_list[index]

    def route(self, key: bytes) -> tuple[int, str | None]:
        """(vbucket, active server) for a key."""
        vb = self.vbucket_for_key(key)
        return vb, self.server_for_vbucket(vb)

    def vbuckets_of(self, server_index: int, replica: int = 0) -> list[int]:
        """The vbuckets a node holds as active (replica 0) or as its n-th replica."""
        return [vb for vb, chain in enumerate(self.vbucket_map)
                if replica < len(chain) and chain[replica] == server_index]


def parse_cluster_map(data, host: str | None = None) -> ClusterMap:
    """Parse a map (bytes, str or dict), replacing `$HOST` with `host` when given.

    Raises ProtocolError on anything a client could not route with (bad JSON, empty or ragged
    vBucketMap, node indexes outside serverList)."""
    if isinstance(data, bytes | bytearray | memoryview):
        data = bytes(data).decode("utf-8", "replace")
    elif isinstance(data, dict) and host is not None:
        data = json.dumps(data)
    if isinstance(data, str):
        if host is not None:
            data = data.replace(HOST_PLACEHOLDER, _bracket(host))
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError) as e:
            raise ProtocolError(f"cluster map is not valid JSON: {type(e).__name__}: {e}") from None
    else:
        doc = data
    if not isinstance(doc, dict):
        raise ProtocolError("cluster map must be a JSON object")
    try:
        return _parse(doc)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ProtocolError(f"cluster map is malformed: {type(e).__name__}: {e}") from None


def _split_host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _parse(doc: dict) -> ClusterMap:
    rev = doc["rev"]
    if not isinstance(rev, int):
        raise ValueError(f"rev must be an integer, got {rev!r}")
    rev_epoch = doc.get("revEpoch", 0)
    nodes_ext = doc.get("nodesExt")
    legacy = doc.get("nodes") or []
    nodes: list[Node] = []
    if nodes_ext:
        for i, ext in enumerate(nodes_ext):
            services = ext.get("services", {})
            hostname = ext.get("hostname")
            if hostname is None and i < len(legacy):
                hostname = _split_host_port(legacy[i]["hostname"])[0]
            nodes.append(Node(services.get("kv", 0), hostname if hostname is not None else HOST_PLACEHOLDER,
                              services.get("mgmt", DEFAULT_MGMT_PORT), services.get("kvSSL"),
                              bool(ext.get("thisNode", False)), services.get("mgmtSSL")))
    else:
        for entry in legacy:
            host, mgmt = _split_host_port(entry["hostname"])
            nodes.append(Node(entry.get("ports", {}).get("direct", 0), host, mgmt))
    server_list: tuple[str, ...] = ()
    vbucket_map: tuple[tuple[int, ...], ...] = ()
    num_replicas = 0
    vbsm = doc.get("vBucketServerMap")
    if vbsm is not None:
        num_replicas = int(vbsm["numReplicas"])
        server_list = tuple(str(s) for s in vbsm["serverList"])
        vbucket_map = tuple(tuple(int(i) for i in chain) for chain in vbsm["vBucketMap"])
        if not vbucket_map:
            raise ValueError("vBucketMap is empty")
        for vb, chain in enumerate(vbucket_map):
            if len(chain) != num_replicas + 1:
                raise ValueError(f"vBucketMap[{vb}] has {len(chain)} entries; numReplicas {num_replicas} "
                                 f"needs {num_replicas + 1}")
            if any(not -1 <= i < len(server_list) for i in chain):
                raise ValueError(f"vBucketMap[{vb}] = {list(chain)} names a node outside serverList "
                                 f"({len(server_list)} servers)")
    uid = doc.get("collectionsManifestUid")
    return ClusterMap(
        rev=rev, rev_epoch=int(rev_epoch), nodes=tuple(nodes), server_list=server_list,
        vbucket_map=vbucket_map, num_replicas=num_replicas, name=doc.get("name"), uuid=doc.get("uuid"),
        bucket_type=doc.get("bucketType"), node_locator=doc.get("nodeLocator"),
        capabilities=tuple(doc.get("bucketCapabilities", ())),
        collections_manifest_uid=None if uid is None else int(str(uid), 16),
        cluster_name=doc.get("clusterName"), cluster_uuid=doc.get("clusterUUID"))
