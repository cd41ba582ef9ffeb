"""The management listener of `dcpflow cluster` nodes: each node's own port in every map, and the
replication lag of each replica link on /metrics and the page."""

import html
import os
import signal
import time

from couchbase.diagnostics import PingState, ServiceType
from prometheus_client.parser import text_string_to_metric_families

from dcpflow.protocol.status import Status
from tests.server.mgmt.rest_client import Http

from .helpers import sdk_connect


def lag_by_link(http: Http) -> dict[str, float]:
    text = http.get("/metrics").text
    return {s.labels["link"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "kv_dcp_replication_lag_items"}


def test_every_node_serves_its_own_listener_and_every_map_advertises_them(make_cluster):
    cluster = make_cluster(nodes=2, replicas=1, vbuckets=8)
    ports = [n.mgmt_port for n in cluster.manager.nodes]
    assert all(ports) and len(set(ports)) == 2 and ports == [p.mgmt_port for p in cluster.procs]
    for i, port in enumerate(ports):
        ext = Http(port).get("/pools/default/nodeServices").json["nodesExt"]
        assert [e["services"]["mgmt"] for e in ext] == ports and ext[i]["thisNode"] is True
        bucket = Http(port).get("/pools/default/buckets/default").json
        assert [n["hostname"] for n in bucket["nodes"]] == [f"127.0.0.1:{p}" for p in ports]
    # one cluster, one identity: every node's map names the cluster its cluster manager pushed
    identities = {(Http(p).get("/pools/default/b/default").json["clusterUUID"], Http(p).get("/pools").json["uuid"])
                  for p in ports}
    assert len(identities) == 1 and len({*identities.pop()}) == 1
    sdk = sdk_connect(cluster.connstr)
    try:
        sdk.bucket("default")
        management = sdk.ping().endpoints[ServiceType.Management]
        assert sorted(ep.remote for ep in management) == sorted(f"127.0.0.1:{p}" for p in ports)
        assert all(ep.state == PingState.OK for ep in management)
    finally:
        sdk.close()


def test_replication_lag_per_link_on_metrics_and_the_page(make_cluster):
    cluster = make_cluster(nodes=2, replicas=1, vbuckets=4)
    mgr = cluster.manager
    node0 = Http(mgr.nodes[0].mgmt_port)
    link = f"replication:{cluster.address(0)}->{cluster.address(1)}:default"
    deadline = time.monotonic() + 30
    while lag_by_link(node0).get(link) != 0:  # the link to node 1 streams, caught up
        assert time.monotonic() < deadline, lag_by_link(node0)
        time.sleep(0.1)
    vbs = [vb for vb, chain in enumerate(mgr.map) if chain[0] == 0]
    value = b"x" * 10_000
    replica = cluster.procs[1].pid
    os.kill(replica, signal.SIGSTOP)  # the replica stops reading: flow control and the queues fill up
    try:
        written = 0
        with cluster.client(0) as c:
            while not lag_by_link(node0).get(link):
                assert written < 12_000, "no lag after 120 MB written"  # ~25 MB fill the window and queues
                for i in range(500):
                    key = b"lag-%d" % (written + i)
                    assert c.set(key, value, vbucket=vbs[(written + i) % len(vbs)]).status == Status.SUCCESS
                written += 500
        lag = lag_by_link(node0)[link]
        assert 0 < lag <= written
        page = node0.get("/ui/main").text
        assert f'data-name="{html.escape(link)}"' in page and "outgoing (actives here)" in page
    finally:
        os.kill(replica, signal.SIGCONT)
    deadline = time.monotonic() + 120
    while lag_by_link(node0)[link] != 0:
        assert time.monotonic() < deadline, "the replica never caught up"
        time.sleep(0.2)
