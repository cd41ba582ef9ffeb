"""A node failover injected through a node's REST fault endpoint: the node asks the cluster
manager (its control channel, as `dcpflow cluster failover` does), the replicas of the node's
actives are promoted with new failover entries, writes the node never replicated are gone, and a
dcpflow client that saw them rolls back and ends with exactly what the new actives hold."""

import asyncio
import os
import time

from dcpflow.protocol.dcp import VBucketState
from dcpflow.protocol.keys import vbucket_for_key
from dcpflow.protocol.status import Status
from dcpflow.replication.control import ControlServer
from tests.server.mgmt.rest_client import Http

from .helpers import ClientModel, high_seqnos, vb_contents

ACTIVE = int(VBucketState.ACTIVE)
VBUCKETS = 8


def serve_control(cluster) -> ControlServer:
    """The manager's control channel that `dcpflow cluster up` serves, named in cluster.json."""
    mgr = cluster.manager

    async def start():
        control = await ControlServer(mgr, "test-token", asyncio.Event()).start()
        mgr.extra_state["manager"] = {"pid": os.getpid(), "control_port": control.port, "token": "test-token"}
        mgr.save()
        return control

    return cluster.run(start())


def put(cluster, key: bytes, value: bytes) -> int:
    vb = vbucket_for_key(key, VBUCKETS)
    with cluster.client(cluster.manager.map[vb][0]) as c:
        assert c.set(key, value, vbucket=vb).status == Status.SUCCESS
    return vb


def test_node_failover_through_rest_and_the_client_rolls_back_to_the_new_actives(make_cluster):
    cluster = make_cluster(nodes=2, replicas=1, vbuckets=VBUCKETS)
    mgr = cluster.manager
    control = serve_control(cluster)
    model = ClientModel(cluster.connstr + "/default")
    try:
        for i in range(40):
            put(cluster, b"doc%d" % i, b"replicated")
        cluster.run(mgr.wait_replicated(60), 70)
        model.start()
        assert model.started.wait(30) and model.error is None
        node0_vbs = {vb for vb, chain in enumerate(mgr.map) if chain[0] == 0}
        cluster.run(mgr.hold_replication(cluster.address(0)))  # node 0's writes stop reaching its replicas
        doomed = [b"doomed%d" % i for i in range(60)]
        for key in doomed:
            if vbucket_for_key(key, VBUCKETS) in node0_vbs:
                put(cluster, key, b"never replicated")
        model.wait_caught_up(high_seqnos(cluster.ports[0], ACTIVE))
        seen = model.view()
        assert any(k.startswith(b"doomed") for k in seen)

        reply = Http(mgr.nodes[0].mgmt_port).post("/faults/nodes/failover")  # node 0 fails itself over
        assert reply.status == 200, reply
        assert reply.json["failed_over"] == cluster.address(0) and reply.json["promoted"] == len(node0_vbs)
        again = Http(mgr.nodes[1].mgmt_port).post("/faults/nodes/failover", {"node": cluster.address(0)})
        assert again.status == 400 and "already failed over" in again.json["errors"]["node"]
        assert all(chain[0] == 1 for chain in mgr.map)

        for i in range(20):
            put(cluster, b"after%d" % i, b"new branch")
        highs = high_seqnos(cluster.ports[1], ACTIVE)
        # Every vbucket whose unreplicated writes the client saw must be rolled back.
        expected = node0_vbs & {vbucket_for_key(k, VBUCKETS) for k in doomed}
        deadline = time.monotonic() + 30
        while not {rb.vbucket for rb in list(model.rollbacks)} >= expected:
            assert model.error is None and time.monotonic() < deadline, (expected, model.rollbacks)
            time.sleep(0.05)
        model.wait_caught_up(highs)
        truth = {}
        for vb in range(VBUCKETS):
            for key, meta in vb_contents(cluster.ports[1], vb, highs[vb]).items():
                if not meta[7]:
                    truth[key] = (meta[0], meta[1])
        assert not any(k.startswith(b"doomed") for k in truth)  # never replicated: gone
        assert model.view() == truth and len(truth) == 60
        assert model.rollbacks and {rb.vbucket for rb in model.rollbacks} <= node0_vbs
    finally:
        model.stop()
        cluster.lt.loop.call_soon_threadsafe(control.close)
    assert model.error is None, model.error
