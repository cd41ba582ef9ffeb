"""Rollback mitigation end to end on a 3-node cluster (real node processes): writes that never
reached a replica, the active killed with kill -9, failover. A plain reader hands its application
changes that the failover then took back; a reader with mitigate_rollbacks hands out none - every
change it delivered is in the final state or was replaced by a later change it delivered."""

import time

from dcpflow.client import Mutation, Rollback
from dcpflow.protocol.dcp import VBucketState
from dcpflow.protocol.keys import vbucket_for_key
from dcpflow.protocol.status import Status
from tests.server.mgmt.rest_client import Http

from .helpers import ClientModel, high_seqnos, vb_contents

ACTIVE = int(VBucketState.ACTIVE)
VBUCKETS = 8


def put(cluster, key: bytes, value: bytes) -> int:
    vb = vbucket_for_key(key, VBUCKETS)
    with cluster.client(cluster.manager.map[vb][0]) as c:
        assert c.set(key, value, vbucket=vb).status == Status.SUCCESS
    return vb


def not_kept(model: ClientModel, truth: dict[bytes, int]) -> list:
    """Delivered mutations that are neither in the final state (key and CAS) nor replaced by a
    later delivered change of the same key: what the application acted on that never happened."""
    bad = []
    events = list(model.delivered)
    for i, ev in enumerate(events):
        if type(ev) is not Mutation or truth.get(ev.key) == ev.cas:
            continue
        if any(getattr(later, "key", None) == ev.key for later in events[i + 1:]):
            continue
        bad.append((ev.vbucket, ev.seqno, ev.key))
    return bad


def wait_for(what, check, timeout: float = 60.0, models=()) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        for m in models:
            assert m.error is None, m.error
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_mitigation_hides_the_changes_a_failover_takes_back(make_cluster):
    cluster = make_cluster(nodes=3, replicas=1, vbuckets=VBUCKETS)
    mgr = cluster.manager
    connstr = cluster.connstr + "/default"
    plain = ClientModel(connstr)
    safe = ClientModel(connstr, mitigate_rollbacks=True, persistence_poll_interval=0.05)
    try:
        for i in range(40):
            put(cluster, b"doc%d" % i, b"replicated")
        cluster.run(mgr.wait_replicated(60), 70)
        for m in (plain, safe):
            m.start()
            assert m.started.wait(30) and m.error is None
        first = high_seqnos(cluster.ports[0], ACTIVE)
        for i in (1, 2):  # all of node 0's actives, and the others' too
            first.update(high_seqnos(cluster.ports[i], ACTIVE))
        safe.wait_caught_up(first)  # what every copy persisted is released

        node0_vbs = {vb for vb, chain in enumerate(mgr.map) if chain[0] == 0}
        cluster.run(mgr.hold_replication(cluster.address(0)))  # node 0's writes stop reaching its replicas
        paused = Http(mgr.nodes[0].mgmt_port).post("/faults/buckets/default/persistence/pause")
        assert paused.status == 200, paused  # ... and its own disk
        doomed = [k for k in (b"doomed%d" % i for i in range(80)) if vbucket_for_key(k, VBUCKETS) in node0_vbs]
        for key in doomed:
            put(cluster, key, b"never replicated")
        overwritten = [b"doc%d" % i for i in range(40) if vbucket_for_key(b"doc%d" % i, VBUCKETS) in node0_vbs]
        for key in overwritten:
            put(cluster, key, b"overwritten, never replicated")
        plain.wait_caught_up(high_seqnos(cluster.ports[0], ACTIVE))
        assert any(ev.key.startswith(b"doomed") for ev in list(plain.delivered) if type(ev) is Mutation)
        before = len(safe.delivered)

        cluster.procs[0].kill()  # kill -9: node 0 dies with writes no disk and no other copy has
        result = cluster.run(mgr.failover(cluster.address(0)))
        assert result, result
        assert all(chain[0] != 0 for chain in mgr.map)
        for i in range(30):
            put(cluster, b"after%d" % i, b"new branch")
        highs: dict[int, int] = {}
        for i in (1, 2):
            highs.update(high_seqnos(cluster.ports[i], ACTIVE))
        assert sorted(highs) == list(range(VBUCKETS))
        for m in (plain, safe):
            m.wait_caught_up(highs, timeout=60)
        # the plain reader is told to roll back the vbuckets whose lost writes it saw
        wait_for("the plain reader's rollbacks", lambda: {rb.vbucket for rb in list(plain.rollbacks)} >= node0_vbs,
                 models=(plain, safe))

        truth: dict[bytes, int] = {}
        for vb in range(VBUCKETS):
            owner = mgr.map[vb][0]
            for key, meta in vb_contents(cluster.ports[owner], vb, highs[vb]).items():
                if not meta[7]:
                    truth[key] = meta[1]
        assert not any(k.startswith(b"doomed") for k in truth)
        assert all(truth.get(b"after%d" % i) for i in range(30))

        lost = not_kept(plain, truth)
        assert lost and {key for _, _, key in lost} >= set(doomed)  # without mitigation: acted on, then gone
        assert not_kept(safe, truth) == []  # with it: nothing the failover took back
        delivered = [ev for ev in list(safe.delivered) if type(ev) is Mutation]
        assert not [ev for ev in delivered if ev.key.startswith(b"doomed")]
        assert not [ev for ev in list(safe.delivered) if type(ev) is Rollback]  # nothing to undo, so none shown
        assert len(safe.delivered) > before  # the new branch's writes did arrive
        assert {ev.key for ev in delivered} >= set(truth)  # and everything that exists arrived
    finally:
        plain.stop()
        safe.stop()
    assert plain.error is None, plain.error
    assert safe.error is None, safe.error
