"""A real three-node cluster (node subprocesses, the manager relaying DCP between them): the map,
official-SDK writes reaching replicas with identical metadata, kill -9 + failover under load with a
dcpflow client rolling back and converging, rebalance under load, and map publication."""

import json
import time

import pytest

from dcpflow.protocol import kv
from dcpflow.protocol.config import parse_cluster_map
from dcpflow.protocol.dcp import VBucketState
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from ..resources import wait_for
from .helpers import (
    ClientModel,
    SdkWriter,
    failover_log,
    high_seqnos,
    sdk_connect,
    sdk_contents,
    vb_contents,
)

ACTIVE, REPLICA = int(VBucketState.ACTIVE), int(VBucketState.REPLICA)


def node_map(cluster, i: int):
    with cluster.client(i) as c:
        reply = c.call(Opcode.GET_CLUSTER_CONFIG)
        assert reply.status == Status.SUCCESS
        return parse_cluster_map(reply.value)


def node_states(cluster, i: int) -> dict[int, str]:
    with cluster.client(i) as c:
        return {int(k[3:]): v for k, v in c.stats("vbucket").items()}


def wait_replicated(cluster, timeout: float = 60.0) -> None:
    cluster.run(cluster.manager.wait_replicated(timeout), timeout + 10)


def test_new_cluster_map_states_and_publication(cluster):
    mgr = cluster.manager
    vmap = mgr.map
    assert len(vmap) == 16 and all(len(chain) == 2 for chain in vmap)
    assert all(chain[0] != chain[1] and min(chain) >= 0 for chain in vmap)  # replica never with its active
    actives = [sum(1 for c in vmap if c[0] == n) for n in range(3)]
    replicas = [sum(1 for c in vmap if c[1] == n) for n in range(3)]
    assert max(actives) - min(actives) <= 1 and max(replicas) - min(replicas) <= 1
    for i in range(3):
        states = node_states(cluster, i)
        assert states == {vb: ("active" if chain[0] == i else "replica") for vb, chain in enumerate(vmap)
                          if i in chain}
        served = node_map(cluster, i)  # every node serves the manager's map, with itself as thisNode
        assert served.version == (2, mgr.rev)
        assert [list(c) for c in served.vbucket_map] == vmap
        assert served.server_list == tuple(cluster.address(n) for n in range(3))
        assert served.this_node == i and served.uuid == mgr.uuid
    st = cluster.status()
    assert st["streams"] == st["streams_wanted"] == 16
    assert [n["status"] for n in st["nodes"]] == ["up", "up", "up"]
    saved = json.loads((cluster.root / "cluster.json").read_text())
    assert saved["map"] == vmap and saved["rev"] == mgr.rev


def test_sdk_writes_reach_replicas_with_identical_metadata(cluster):
    sdk = sdk_connect(cluster.connstr)
    tokens = {}
    try:
        col = sdk.bucket("default").default_collection()
        for i in range(300):
            r = col.upsert(f"doc{i}", {"i": i, "pad": "x" * (i % 50)})
            tokens[f"doc{i}".encode()] = r.mutation_token()
        from datetime import timedelta

        from couchbase.options import UpsertOptions
        for i in range(0, 300, 7):
            col.upsert(f"doc{i}", {"i": i, "ttl": True}, UpsertOptions(expiry=timedelta(hours=1)))
            tokens[f"doc{i}".encode()] = None
        for i in range(0, 300, 11):
            col.remove(f"doc{i}")
            tokens[f"doc{i}".encode()] = None
    finally:
        sdk.close()
    wait_replicated(cluster)
    vmap = cluster.manager.map
    checked = 0
    for vb, (a, r) in enumerate(vmap):
        high = high_seqnos(cluster.ports[a], ACTIVE)[vb]
        assert high_seqnos(cluster.ports[r], REPLICA)[vb] == high
        active = vb_contents(cluster.ports[a], vb, high)
        replica = vb_contents(cluster.ports[r], vb, high)
        assert replica == active  # key, value, CAS, rev seqno, seqno, flags, expiry, datatype, deleted
        for key, meta in active.items():
            tok = tokens.get(key)
            if tok is not None:
                assert tok.sequence_number == meta[3] and tok.partition_id == vb
            checked += 1
    assert checked == 300
    expiring = vb_contents(cluster.ports[vmap[0][1]], 0, high_seqnos(cluster.ports[vmap[0][0]], ACTIVE)[0])
    assert any(m[5] for m in expiring.values()) or all(not k.startswith(b"doc") for k in expiring)


def test_kill9_failover_under_load_loses_no_replicated_write_and_the_client_rolls_back(cluster):
    mgr = cluster.manager
    dead = 0
    dead_vbs = {vb for vb, chain in enumerate(mgr.map) if chain[0] == dead}
    keys = [f"key{i}" for i in range(400)]
    model = ClientModel(cluster.connstr + "/default")
    model.start()
    assert model.started.wait(30) and model.error is None
    writer = SdkWriter(cluster.connstr, keys)
    writer.start()
    assert writer.ready.wait(30)
    wait_for(lambda: len(writer.acked) > 100, 60, "100 acknowledged writes before the hold")
    # Node 0's replication falls behind (its links are cut); writes and the client go on.
    cluster.run(mgr.hold_replication(cluster.address(dead)))
    held_at = len(writer.acked)
    # writes node 0 takes and never replicates: the failover must lose some of them (below)
    wait_for(lambda: sum(a.vb in dead_vbs for a in writer.acked[held_at:]) >= 30, 60,
             "writes acknowledged by node 0 while its replication is held")
    cluster.procs[dead].kill()  # kill -9 under load
    time.sleep(0.3)
    result = cluster.run(mgr.failover(cluster.address(dead)))
    assert result["promoted"] == len(dead_vbs) and result["without_copy"] == 0
    failed_over_at = len(writer.acked)
    deadline = time.monotonic() + 60  # the SDK learns the new map (config polling, NOT_MY_VBUCKET)
    while len([a for a in writer.acked[failed_over_at:] if a.vb in dead_vbs]) < 30:
        assert time.monotonic() < deadline, "the SDK did not follow the new map"
        time.sleep(0.05)
    writer.stop()
    assert held_at > 100
    wait_replicated(cluster)

    # Where each promoted vbucket's new history began, and the UUID of the history it left.
    vmap = mgr.map
    branch, old_uuid = {}, {}
    for vb in dead_vbs:
        assert vmap[vb][0] != dead
        log = failover_log(cluster.ports[vmap[vb][0]], vb)
        (_, branch[vb]), (old_uuid[vb], _) = log[0], log[1]
    final = sdk_contents(cluster.connstr, keys)
    lost = 0
    by_key: dict[str, list] = {}
    for ack in writer.acked:
        by_key.setdefault(ack.key, []).append(ack)
    for key, acks in by_key.items():
        # A write must survive unless node 0 took it on its old history after the last point the
        # promoted replica had (acknowledged but never replicated: failure-scenarios.md).
        def may_be_lost(a):
            return a.vb in dead_vbs and a.uuid == old_uuid[a.vb] and a.seqno > branch[a.vb]
        must = [a for a in acks if not may_be_lost(a)]
        if not must:
            lost += 1
            continue
        last_must = must[-1]
        later = [a for a in acks if a.index >= last_must.index]
        assert key in final, f"{key}: acknowledged and replicated write {last_must} is gone"
        value, cas = final[key]
        assert any(value == a.value and cas == a.cas for a in later), \
            f"{key}: holds {value!r}, not its last surviving write {last_must} or a later one"
        lost += value != acks[-1].value
    assert lost > 0  # writes node 0 never replicated are gone: that is the point

    # The dcpflow client saw some of those writes on node 0; it rolled back and now holds exactly
    # what the new actives hold.
    highs = {}
    for vb, chain in enumerate(vmap):
        highs[vb] = high_seqnos(cluster.ports[chain[0]], ACTIVE)[vb]
    model.wait_caught_up(highs)
    model.stop()
    assert model.error is None, model.error
    assert {rb.vbucket for rb in model.rollbacks} <= dead_vbs and model.rollbacks
    view = model.view()
    truth = {}
    for vb, chain in enumerate(vmap):
        for key, meta in vb_contents(cluster.ports[chain[0]], vb, highs[vb]).items():
            if not meta[7]:
                truth[key] = (meta[0], meta[1])
    assert view == truth


def test_rebalance_under_load_loses_nothing_and_clients_follow(cluster):
    mgr = cluster.manager
    keys = [f"rk{i}" for i in range(300)]
    # A node fails over cleanly (nothing written meanwhile), so the rebalance has work: it takes the
    # node back and moves actives to it with takeover streams while the SDK keeps writing.
    writer0 = SdkWriter(cluster.connstr, keys)
    writer0.start()
    assert writer0.ready.wait(30)
    time.sleep(0.3)
    writer0.stop()
    wait_replicated(cluster)
    cluster.run(mgr.failover(cluster.address(2)))
    rev_after_failover = mgr.rev
    assert node_map(cluster, 0).version == (2, rev_after_failover)
    model = ClientModel(cluster.connstr + "/default")
    model.start()
    assert model.started.wait(30)
    writer = SdkWriter(cluster.connstr, keys)
    writer.start()
    assert writer.ready.wait(30)
    time.sleep(0.3)
    result = cluster.run(mgr.rebalance(), 180)
    assert result["moved"] > 0 and result["nodes"] == 3
    before_stop = len(writer.acked)
    wait_for(lambda: len(writer.acked) > before_stop + 20, 60, "writes after the rebalance")
    writer.stop()
    assert len(writer.acked) > before_stop + 20, "the SDK stopped writing after the rebalance"
    wait_replicated(cluster)
    vmap = mgr.map
    actives = [sum(1 for c in vmap if c[0] == n) for n in range(3)]
    assert max(actives) - min(actives) <= 1 and all(min(c) >= 0 for c in vmap)
    assert mgr.rev > rev_after_failover and node_map(cluster, 2).version == (2, mgr.rev)
    final = sdk_contents(cluster.connstr, keys)
    last = {}
    for ack in writer0.acked + writer.acked:
        last[ack.key] = ack
    for key, ack in last.items():
        assert final.get(key) == (ack.value, ack.cas), f"{key}: lost {ack}"
    # Takeovers keep the failover log: the client never had to roll back, and it followed the moves.
    highs = {vb: high_seqnos(cluster.ports[chain[0]], ACTIVE)[vb] for vb, chain in enumerate(vmap)}
    model.wait_caught_up(highs)
    model.stop()
    assert model.error is None and model.rollbacks == []
    assert {k: v for k, v in model.view().items() if k.startswith(b"rk")} == \
        {k.encode(): v for k, v in final.items()}
    for vb, chain in enumerate(vmap):  # and every replica matches its active
        a, r = chain
        assert vb_contents(cluster.ports[r], vb, highs[vb]) == vb_contents(cluster.ports[a], vb, highs[vb])


def test_a_takeover_whose_destination_dies_gives_the_vbucket_back_to_its_source(cluster, monkeypatch):
    """docs/cluster.md: a takeover that fails puts both vbuckets back as they were. Here the
    destination dies right after the takeover stream ended (the source is dead by then): the
    source must take writes again even though the destination cannot be asked anything."""
    from dcpflow.replication import cluster as cluster_mod

    mgr = cluster.manager
    wait_replicated(cluster)
    cluster.run(mgr.failover(cluster.address(2)))  # node 2's actives move away: the rebalance moves some back
    killed = []
    wait_stream_end = cluster_mod.Replicator.wait_stream_end

    async def end_then_kill(self, vb, timeout):
        reason = await wait_stream_end(self, vb, timeout)
        if not killed:
            killed.append(vb)
            cluster.procs[2].kill()  # the destination, active now, dies before the manager records it
        return reason

    monkeypatch.setattr(cluster_mod.Replicator, "wait_stream_end", end_then_kill)
    with pytest.raises((cluster_mod.ClusterError, cluster_mod.LinkError)):  # the takeover could not finish
        cluster.run(mgr.rebalance(), 180)
    (vb,) = killed
    src = mgr.map[vb][0]
    assert src != 2
    with cluster.client(src) as c:
        assert c.stats("vbucket")[f"vb_{vb}"] == "active"  # not left dead
        key = next(f"after{i}".encode() for i in range(10**5) if c.vbucket_of(f"after{i}".encode()) == vb)
        assert c.set(key, b"v").status == Status.SUCCESS


def test_an_active_moved_by_an_unfinished_rebalance_keeps_its_old_copy_for_failover(cluster, monkeypatch):
    """A rebalance moves vbucket A to node 2, then node 2 dies during the next takeover. A's old
    active (dead after the takeover, same history) stays in the chain as a copy until the final
    map, so failing node 2 over promotes it instead of leaving A without any copy."""
    from dcpflow.replication import cluster as cluster_mod

    mgr = cluster.manager
    clients = [cluster.client(n) for n in range(3)]
    for i in range(200):
        key = f"keep{i}".encode()
        active = mgr.map[clients[0].vbucket_of(key)][0]
        assert clients[active].set(key, b"v").status == Status.SUCCESS
    for c in clients:
        c.close()
    wait_replicated(cluster)
    cluster.run(mgr.failover(cluster.address(2)))
    ended = []
    wait_stream_end = cluster_mod.Replicator.wait_stream_end

    async def second_end_kills(self, vb, timeout):
        reason = await wait_stream_end(self, vb, timeout)
        ended.append(vb)
        if len(ended) == 2:
            cluster.procs[2].kill()
        return reason

    monkeypatch.setattr(cluster_mod.Replicator, "wait_stream_end", second_end_kills)
    with pytest.raises((cluster_mod.ClusterError, cluster_mod.LinkError)):
        cluster.run(mgr.rebalance(), 180)
    moved = ended[0]
    assert mgr.map[moved][0] == 2 and mgr.map[moved][1] >= 0  # the old active is still a copy
    result = cluster.run(mgr.failover(cluster.address(2)))
    assert result["without_copy"] == 0
    active = mgr.map[moved][0]
    with cluster.client(active) as c:
        assert c.stats("vbucket")[f"vb_{moved}"] == "active"
        keys = [f"keep{i}".encode() for i in range(200) if c.vbucket_of(f"keep{i}".encode()) == moved]
        assert keys and all(c.get(k).status == Status.SUCCESS for k in keys)


def test_set_cluster_config_pushes_only_newer_maps(cluster):
    mgr = cluster.manager
    with cluster.client(1) as c:
        stale = mgr.config_json().replace(b'"rev":%d' % mgr.rev, b'"rev":1')
        version = (2).to_bytes(8, "big") + (1).to_bytes(8, "big")
        reply = c.call(Opcode.SET_CLUSTER_CONFIG, key=b"default", extras=version, value=stale, datatype=1)
        assert reply.status == Status.SUCCESS
    assert node_map(cluster, 1).version == (2, mgr.rev)  # an older map is ignored


def test_status_reports_lag_and_down_nodes(cluster):
    mgr = cluster.manager
    cluster.run(mgr.hold_replication(cluster.address(1)))
    vb = next(vb for vb, chain in enumerate(mgr.map) if chain[0] == 1)
    with cluster.client(1) as c:
        for i in range(5):
            assert c.set(b"lag%d" % i, b"v", vbucket=vb).status == Status.SUCCESS
    st = cluster.status()
    replica_node = mgr.map[vb][1]
    assert st["nodes"][replica_node]["replication_lag_items"] == 5
    cluster.run(mgr.hold_replication(cluster.address(1), hold=False))
    wait_replicated(cluster)
    cluster.procs[2].kill()
    deadline = time.monotonic() + 60
    while cluster.status()["nodes"][2]["status"] != "down":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with pytest.raises(Exception, match="down: fail them over first"):
        cluster.run(mgr.rebalance())


def test_failover_refusals(cluster):
    mgr = cluster.manager
    from dcpflow.replication import ClusterError
    with pytest.raises(ClusterError, match="not a node of this cluster"):
        cluster.run(mgr.failover("127.0.0.1:1"))
    on2 = {vb for vb, chain in enumerate(mgr.map) if 2 in chain}
    cluster.run(mgr.failover(cluster.address(0)))
    with pytest.raises(ClusterError, match="already failed over"):
        cluster.run(mgr.failover(cluster.address(0)))
    second = cluster.run(mgr.failover(cluster.address(1)))
    # vbuckets that lived only on nodes 0 and 1 have no copy left; the rest are active on node 2
    assert second["without_copy"] == 16 - len(on2) > 0
    assert [vb for vb, chain in enumerate(mgr.map) if chain[0] == 2] == sorted(on2)
    assert all(chain == [-1, -1] for vb, chain in enumerate(mgr.map) if vb not in on2)
    assert cluster.status()["vbuckets_without_active"] == 16 - len(on2)
    with pytest.raises(ClusterError, match="last node"):
        cluster.run(mgr.failover(cluster.address(2)))
    # Node 0 was alive when failed over: it stopped taking writes (its vbuckets are dead)
    with cluster.client(0) as c:
        assert all(v == "dead" for v in c.stats("vbucket").values())
        reply = c.set(b"x", b"v", vbucket=0)
        assert reply.status == Status.NOT_MY_VBUCKET
        assert parse_cluster_map(reply.value).version == (2, mgr.rev)  # and the reply carries the new map


def test_get_all_vb_seqnos_filters_are_what_status_uses(cluster):
    with cluster.client(0) as c:
        reply = c.call(Opcode.GET_ALL_VB_SEQNOS, extras=ACTIVE.to_bytes(4, "big"))
        got = kv.GetAllVbSeqnosResponse.from_frame(reply).as_dict()
    assert set(got) == {vb for vb, chain in enumerate(cluster.manager.map) if chain[0] == 0}
