"""The cluster map (protocol/config.py): built in the shape official clients accept (a bucket config
like Couchbase Server's, with `$HOST` for the client to replace, `nodes`, `nodesExt` with a `mgmt`
service, and a non-empty vBucketMap), balanced over several nodes and replicas, and parsed back into
something a client routes with."""

import json
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcpflow.protocol import config, kv
from dcpflow.protocol.config import HOST_PLACEHOLDER, ClusterMap, Node
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import decode_all
from dcpflow.protocol.opcodes import Opcode


def test_single_node_map_has_every_field_clients_read():
    doc = config.build_bucket_config("default", config.with_this_node([Node(11210)], 0), num_vbuckets=64,
                                     uuid="b7f0", rev=3, rev_epoch=2, collections_manifest_uid=0x1F)
    for field in ("rev", "revEpoch", "name", "uuid", "bucketType", "nodeLocator", "bucketCapabilities",
                  "collectionsManifestUid", "nodes", "nodesExt", "vBucketServerMap"):
        assert field in doc, field
    assert doc["rev"] == 3 and doc["revEpoch"] == 2 and doc["name"] == "default" and doc["uuid"] == "b7f0"
    assert doc["bucketType"] == "membase" and doc["nodeLocator"] == "vbucket"
    assert doc["collectionsManifestUid"] == "1f"  # a hex string
    assert set(config.DEFAULT_BUCKET_CAPABILITIES) <= set(doc["bucketCapabilities"])
    assert doc["nodes"] == [{"hostname": "$HOST:8091", "ports": {"direct": 11210}}]
    assert doc["nodesExt"] == [{"services": {"kv": 11210, "mgmt": 8091}, "thisNode": True,
                                "hostname": "$HOST"}]
    vbsm = doc["vBucketServerMap"]
    assert vbsm["numReplicas"] == 0 and vbsm["serverList"] == ["$HOST:11210"]
    assert vbsm["vBucketMap"] == [[0]] * 64


def test_host_placeholder_stays_literal_in_the_bytes():
    data = config.encode_config(config.build_bucket_config("b", [Node(12000)], num_vbuckets=4))
    assert b'"$HOST:12000"' in data and b'"hostname":"$HOST"' in data and b" " not in data
    assert json.loads(data)["vBucketServerMap"]["vBucketMap"] == [[0], [0], [0], [0]]


def test_three_nodes_one_replica_kv_ssl_and_this_node():
    nodes = [Node(11210 + i, kv_ssl_port=11207 + i, mgmt_port=9000 + i) for i in range(3)]
    doc = config.build_bucket_config("b", config.with_this_node(nodes, 1), num_vbuckets=1024, num_replicas=1)
    assert [e.get("thisNode", False) for e in doc["nodesExt"]] == [False, True, False]
    assert doc["nodesExt"][2]["services"] == {"kv": 11212, "mgmt": 9002, "kvSSL": 11209}
    assert doc["vBucketServerMap"]["serverList"] == ["$HOST:11210", "$HOST:11211", "$HOST:11212"]
    assert doc["nodes"][1] == {"hostname": "$HOST:9001", "ports": {"direct": 11211}}
    cmap = config.parse_cluster_map(config.encode_config(doc), host="10.0.0.5")
    assert cmap.this_node == 1 and cmap.server_list[2] == "10.0.0.5:11212"
    assert cmap.nodes[2] == Node(11212, "10.0.0.5", 9002, 11209, False)
    assert all(len(chain) == 2 and chain[0] != chain[1] for chain in cmap.vbucket_map)


def test_key_to_vbucket_to_node_routing():
    """The official SDK puts interop-key-1 in vbucket 590 of 1024 (and 14 of 64)."""
    nodes = [Node(11210), Node(11211)]
    cmap = config.parse_cluster_map(config.build_bucket_config("b", nodes, num_replicas=1))
    vb, server = cmap.route(b"interop-key-1")
    assert vb == 590 and cmap.num_vbuckets == 1024
    assert server == "$HOST:11211"  # vbuckets 512..1023 are node 1's
    assert cmap.server_for_vbucket(590, replica=1) == "$HOST:11210"
    small = config.parse_cluster_map(config.build_bucket_config("b", nodes, num_vbuckets=64))
    assert small.vbucket_for_key(b"interop-key-1") == 14
    assert cmap.vbuckets_of(0) == list(range(512)) and cmap.vbuckets_of(1, replica=1) == list(range(512))


def test_missing_replica_has_no_server():
    doc = config.build_bucket_config("b", [Node(1)], num_vbuckets=8, num_replicas=2)
    cmap = config.parse_cluster_map(doc)
    assert cmap.vbucket_map[0] == (0, -1, -1) and cmap.server_for_vbucket(0, 1) is None
    assert cmap.server_for_vbucket(0, 5) is None


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 1024), st.integers(1, 8), st.integers(0, 3))
def test_balanced_vbucket_map_properties(num_vbuckets, num_nodes, num_replicas):
    vbmap = config.balanced_vbucket_map(num_vbuckets, num_nodes, num_replicas)
    assert len(vbmap) == num_vbuckets and all(len(c) == num_replicas + 1 for c in vbmap)
    for chain in vbmap:
        placed = [i for i in chain if i >= 0]
        # never two copies on one node
        assert len(placed) == len(set(placed)) == min(num_replicas + 1, num_nodes)
        assert chain[0] >= 0
    active = Counter(c[0] for c in vbmap)
    assert max(active.values()) - min(active.get(n, 0) for n in range(num_nodes)) <= 1
    if num_nodes > 1 and num_replicas:
        copies = min(num_replicas, num_nodes - 1)
        held = Counter(i for c in vbmap for i in c[1:] if i >= 0)
        assert sum(held.values()) == num_vbuckets * copies
        assert max(held.values()) - min(held.get(n, 0) for n in range(num_nodes)) <= num_nodes


def test_replicas_of_a_failed_node_spread_over_the_survivors():
    vbmap = config.balanced_vbucket_map(1024, 4, 1)
    takers = Counter(chain[1] for chain in vbmap if chain[0] == 0)
    assert set(takers) == {1, 2, 3} and max(takers.values()) - min(takers.values()) <= 1


def test_balanced_map_argument_errors():
    for args in ((0, 1, 0), (16, 0, 0), (16, 2, -1), (16, 2, 4)):
        with pytest.raises(ValueError):
            config.balanced_vbucket_map(*args)


def test_build_rejects_maps_clients_would_reject():
    with pytest.raises(ValueError, match="empty vBucketMap"):
        config.build_bucket_config("b", [Node(1)], vbucket_map=[])
    with pytest.raises(ValueError, match="does not fit"):
        config.build_bucket_config("b", [Node(1)], vbucket_map=[[0, 0]])
    with pytest.raises(ValueError, match="does not fit"):
        config.build_bucket_config("b", [Node(1)], vbucket_map=[[1]])
    with pytest.raises(ValueError, match="at least one node"):
        config.build_bucket_config("b", [])


def _doc(**vbsm):
    base = {"numReplicas": 0, "serverList": ["h:1"], "vBucketMap": [[0]]}
    base.update(vbsm)
    return {"rev": 1, "vBucketServerMap": base}


@pytest.mark.parametrize("doc,match", [
    (b"{", "not valid JSON"),
    (b"[" * 100_000, "not valid JSON"),
    ({"rev": 1, "nodesExt": [1]}, "AttributeError"),
    (b"[1]", "JSON object"),
    ({"revEpoch": 1}, "KeyError"),
    ({"rev": "1"}, "rev must be an integer"),
    (_doc(vBucketMap=[]), "vBucketMap is empty"),
    (_doc(vBucketMap=[[0, 0]]), "numReplicas 0 needs 1"),
    (_doc(vBucketMap=[[1]]), "outside serverList"),
    (_doc(serverList=["h:1"], vBucketMap=[[-2]]), "outside serverList"),
])
def test_parse_errors_are_protocol_errors(doc, match):
    with pytest.raises(ProtocolError, match=match):
        config.parse_cluster_map(doc)


def test_newest_map_wins_by_epoch_then_rev():
    def cmap(epoch, rev):
        return ClusterMap(rev=rev, rev_epoch=epoch, nodes=())

    assert cmap(1, 5).is_newer_than(cmap(1, 4)) and cmap(1, 5).is_newer_than(None)
    assert cmap(2, 1).is_newer_than(cmap(1, 99)) and not cmap(1, 4).is_newer_than(cmap(1, 4))


def test_cluster_level_config_has_nodes_but_no_vbucket_map():
    nodes = config.with_this_node([Node(11210), Node(11211)], 0)
    doc = config.build_cluster_config(nodes, rev=4, rev_epoch=1)
    assert "vBucketServerMap" not in doc and doc["nodesExt"][0]["thisNode"] is True
    cmap = config.parse_cluster_map(doc)
    assert cmap.num_vbuckets == 0 and cmap.version == (1, 4) and len(cmap.nodes) == 2 and cmap.name is None
    with pytest.raises(ProtocolError, match="no vBucketMap"):
        cmap.vbucket_for_key(b"k")


def test_parse_legacy_nodes_only_and_ipv6_hosts():
    doc = _doc(serverList=["[::1]:11210"])
    doc["nodes"] = [{"hostname": "[::1]:8091", "ports": {"direct": 11210}}]
    cmap = config.parse_cluster_map(doc)
    assert cmap.nodes == (Node(11210, "::1", 8091),) and cmap.server_for_vbucket(0) == "[::1]:11210"
    assert Node(11210, "::1").kv_address == "[::1]:11210"
    built = config.build_bucket_config("b", [Node(11210)], num_vbuckets=2)
    v6 = config.parse_cluster_map(built, host="::1")
    assert v6.server_list == ("[::1]:11210",)


def test_parse_accepts_bytes_str_and_dict_with_host_substitution():
    doc = config.build_bucket_config("b", [Node(11210)], num_vbuckets=2, collections_manifest_uid=0xA2)
    data = config.encode_config(doc)
    maps = [config.parse_cluster_map(x, host="example.com") for x in (data, data.decode(), doc)]
    assert maps[0] == maps[1] == maps[2]
    assert maps[0].server_list == ("example.com:11210",) and maps[0].collections_manifest_uid == 0xA2
    assert config.parse_cluster_map(doc).server_list == (f"{HOST_PLACEHOLDER}:11210",)
    assert doc["nodes"][0]["hostname"] == "$HOST:8091"  # the dict passed in is not modified


def test_map_travels_in_get_cluster_config_and_not_my_vbucket_replies():
    data = config.encode_config(config.build_bucket_config("b", [Node(11210)], num_vbuckets=16))
    (frame,) = decode_all(kv.ClusterConfigResponse(data, opaque=1).encode())
    assert config.parse_cluster_map(kv.decode_kv(frame).config).num_vbuckets == 16
    (nmvb,) = decode_all(kv.not_my_vbucket(Opcode.SET, 2, data))
    assert config.parse_cluster_map(kv.decode_kv(nmvb).cluster_map).num_vbuckets == 16


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 256), st.integers(1, 5), st.integers(0, 3), st.integers(0, 2**31),
       st.integers(0, 2**31), st.binary(min_size=1, max_size=20))
def test_build_parse_round_trip(num_vbuckets, num_nodes, num_replicas, rev, epoch, key):
    nodes = config.with_this_node([Node(11210 + i, kv_ssl_port=None if i % 2 else 11300 + i)
                                   for i in range(num_nodes)], num_nodes - 1)
    doc = config.build_bucket_config("bkt", nodes, num_vbuckets=num_vbuckets, num_replicas=num_replicas,
                                     rev=rev, rev_epoch=epoch)
    cmap = config.parse_cluster_map(config.encode_config(doc))
    assert cmap.nodes == tuple(nodes) and cmap.version == (epoch, rev) and cmap.name == "bkt"
    assert [list(c) for c in cmap.vbucket_map] == doc["vBucketServerMap"]["vBucketMap"]
    vb, server = cmap.route(key)
    assert server == nodes[cmap.vbucket_map[vb][0]].kv_address
