"""The cluster's identity and its nodes as ns_server serves them: `/pools/nodes` in the shape the
official Python SDK's own test harness reads (tests/consistency.py `fetch_hostnames` in
https://github.com/couchbase/couchbase-python-client: `[n["configuredHostname"] for n in
GET /pools/nodes ["nodes"]]`, then `http://<configuredHostname>/<path>` for every check), and the
cluster's name and uuid in every KV cluster map, as ns_server's bucket_info_cache.erl
(build_cluster_capabilities) puts `clusterName` and `clusterUUID` in them - the same as
/pools/default's `clusterName` and /pools' `uuid`."""

import json

from dcpflow.protocol.opcodes import Opcode

from .rest_client import Http, http_of


def test_pools_nodes_is_pools_default_with_configured_hostnames_the_sdk_harness_reaches(server):
    http = http_of(server)
    nodes = http.get("/pools/nodes")
    assert nodes.status == 200, nodes.text
    doc = nodes.json
    assert doc == http.get("/pools/default").json  # ns_server serves it as an alias (menelaus_web.erl)
    mgmt = server.server.mgmt.port
    node = doc["nodes"][0]
    assert node["configuredHostname"] == node["hostname"] == f"127.0.0.1:{mgmt}"
    assert node["ports"]["direct"] == server.port and node["services"] == ["kv"]
    # what the harness does next with each hostname (_resource_is_present / _resource_is_dropped)
    for hostname in [n["configuredHostname"] for n in doc["nodes"]]:
        host, _, port = hostname.rpartition(":")
        at_node = Http(int(port), host=host)
        assert at_node.get("/pools/default/buckets/default").status == 200
        assert at_node.get("/pools/default/buckets/nothere").status == 404
        assert at_node.get("/settings/rbac/users/local/Administrator").status in (200, 404)
    assert http.as_user(None).get("/pools/nodes").status == 401


def test_the_kv_cluster_maps_carry_the_clusters_name_and_uuid_as_pools_default_says(server):
    http = http_of(server)
    name = http.get("/pools/default").json["clusterName"]
    uuid = http.get("/pools").json["uuid"]
    assert name == "dcpflow" and len(uuid) == 32
    with server.login(bucket="default") as c:
        bucket_map = json.loads(c.call(Opcode.GET_CLUSTER_CONFIG).value)
    with server.login() as c:  # no bucket selected: the cluster-level map
        cluster_map = json.loads(c.call(Opcode.GET_CLUSTER_CONFIG).value)
    for cmap in (bucket_map, cluster_map, http.get("/pools/default/b/default").json,
                 http.get("/pools/default/nodeServices").json):
        assert (cmap["clusterName"], cmap["clusterUUID"]) == (name, uuid), cmap


def test_the_cluster_uuid_survives_a_restart(make_server, tmp_path):
    first = make_server()
    uuid = http_of(first).get("/pools").json["uuid"]
    first.stop()
    again = make_server()
    assert http_of(again).get("/pools").json["uuid"] == uuid
    assert json.loads(again.call(lambda: again.server.buckets["default"].config()))["clusterUUID"] == uuid


def test_a_cluster_node_serves_the_identity_its_cluster_manager_pushes():
    """Every node of a `dcpflow cluster` names the one cluster: the map the cluster manager pushes
    (SET_CLUSTER_CONFIG) carries clusterName/clusterUUID, and the node serves them from then on."""
    from dcpflow.protocol.config import Node, build_bucket_config, parse_cluster_map
    from dcpflow.server.topology import Topology

    topology = Topology([Node(11210)], cluster_uuid="own-uuid")
    pushed = parse_cluster_map(build_bucket_config("b", [Node(11210), Node(11211)], num_vbuckets=4, rev=7,
                                                   rev_epoch=2, cluster_uuid="the-clusters-uuid"))
    assert (pushed.cluster_name, pushed.cluster_uuid) == ("dcpflow", "the-clusters-uuid")
    assert topology.adopt("b", list(pushed.nodes), 11211, pushed.vbucket_map, 0, pushed.version,
                          (pushed.cluster_name, pushed.cluster_uuid))
    served = json.loads(topology.bucket_config("b", "u", lambda: [[0]] * 4))
    assert served["clusterUUID"] == "the-clusters-uuid" and served["nodesExt"][1]["thisNode"] is True
    assert json.loads(topology.cluster_config())["clusterUUID"] == "the-clusters-uuid"
