"""Sync writes on a real `dcpflow cluster` (node processes, the cluster manager, the official SDK):
every durability level succeeds with one and two replicas for upsert, replace, insert, remove,
increment, decrement, append, prepend and mutate_in, the replicas hold the committed versions, a write its
replica cannot acknowledge ends ambiguous, and a single node without a replication chain answers
DurabilityImpossible."""

import json
from datetime import timedelta

import couchbase.subdocument as SD
import pytest
from couchbase.durability import DurabilityLevel, ServerDurability
from couchbase.exceptions import (
    DocumentNotFoundException,
    DurabilityImpossibleException,
    DurabilitySyncWriteAmbiguousException,
)
from couchbase.options import (
    AppendOptions,
    DecrementOptions,
    DeltaValue,
    IncrementOptions,
    InsertOptions,
    MutateInOptions,
    PrependOptions,
    RemoveOptions,
    ReplaceOptions,
    UpsertOptions,
)

from dcpflow.protocol.dcp import DcpSnapshotMarker, DcpStreamEnd, MarkerVersion, VBucketState
from dcpflow.protocol.keys import vbucket_for_key
from dcpflow.protocol.status import Status
from tests.dcp.client import DcpClient as RawDcpClient

from .helpers import RAW_JSON, high_seqnos, sdk_connect, vb_contents

LEVELS = [DurabilityLevel.MAJORITY, DurabilityLevel.MAJORITY_AND_PERSIST_TO_ACTIVE, DurabilityLevel.PERSIST_TO_MAJORITY]
TIMEOUT = timedelta(seconds=10)


def wait_topologies(cluster, timeout: float = 60.0) -> None:
    """Until the manager has told every active copy its replication chain."""
    async def wait():
        import asyncio
        mgr = cluster.manager
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while sum(1 for vb, chain in enumerate(mgr.map) if mgr._topologies.get((chain[0], vb))) < cluster.vbuckets:
            assert loop.time() < deadline, "topologies not pushed"
            await asyncio.sleep(0.05)
    cluster.run(wait(), timeout + 10)


def replica_contents(cluster, key: str) -> list[tuple]:
    """(value, deleted) of `key` on each replica copy of its vbucket, read over DCP."""
    vb = vbucket_for_key(key.encode(), cluster.vbuckets)
    out = []
    for i in cluster.manager.map[vb][1:]:
        if i < 0:
            continue
        end = high_seqnos(cluster.ports[i], int(VBucketState.REPLICA)).get(vb, 0)
        got = vb_contents(cluster.ports[i], vb, end).get(key.encode())
        out.append(None if got is None else (got[0], got[7]))
    return out


@pytest.mark.parametrize("replicas", [1, 2])
def test_every_level_succeeds_with_the_sdk_and_replicas_hold_the_commits(make_cluster, replicas):
    cluster = make_cluster(replicas=replicas)
    wait_topologies(cluster)
    sdk = sdk_connect(cluster.connstr, kv_timeout=10)
    try:
        col = sdk.bucket("default").default_collection()
        for n, level in enumerate(LEVELS):
            d = ServerDurability(level)
            key = f"doc-{n}"
            col.upsert(key, b'{"v":1}', UpsertOptions(durability=d, transcoder=RAW_JSON, timeout=TIMEOUT))
            r = col.replace(key, b'{"v":2}', ReplaceOptions(durability=d, transcoder=RAW_JSON, timeout=TIMEOUT))
            assert r.cas
            assert col.get(key).content_as[dict] == {"v": 2}
            col.mutate_in(key, [SD.upsert("sub", n), SD.increment("v", 1)],
                          MutateInOptions(durability=d, timeout=TIMEOUT))
            assert col.get(key).content_as[dict] == {"v": 3, "sub": n}
            col.insert(f"new-{n}", {"x": n}, InsertOptions(durability=d, timeout=TIMEOUT))
            col.remove(f"new-{n}", RemoveOptions(durability=d, timeout=TIMEOUT))
            counter = col.binary()
            counter.increment(f"count-{n}", IncrementOptions(durability=d, timeout=TIMEOUT))
            got = counter.increment(f"count-{n}", IncrementOptions(durability=d, timeout=TIMEOUT, delta=DeltaValue(5)))
            assert got.content == 5
            assert counter.decrement(f"count-{n}", DecrementOptions(durability=d, timeout=TIMEOUT)).content == 4
            counter.append(f"count-{n}", b"0", AppendOptions(durability=d, timeout=TIMEOUT))  # "40"
            counter.prepend(f"count-{n}", b"1", PrependOptions(durability=d, timeout=TIMEOUT))  # "140"
            assert counter.increment(f"count-{n}", IncrementOptions(durability=d, timeout=TIMEOUT)).content == 141
    finally:
        sdk.close()
    cluster.run(cluster.manager.wait_replicated(60), 70)
    for n in range(len(LEVELS)):
        held = replica_contents(cluster, f"doc-{n}")
        assert [(json.loads(v), deleted) for v, deleted in held] == [({"v": 3, "sub": n}, False)] * replicas
        assert set(replica_contents(cluster, f"new-{n}")) == {(b"", True)}


def test_a_single_node_answers_durability_impossible(spawn_server, tmp_path):
    """A node no cluster manager gave a replication chain (kv_engine's vbucket before ns_server
    sets a topology) cannot count a majority for any level."""
    server = spawn_server("--data-dir", str(tmp_path), "--vbuckets", "8")
    sdk = sdk_connect(f"couchbase://127.0.0.1:{server.port}")
    try:
        col = sdk.bucket("default").default_collection()
        for level in LEVELS:
            with pytest.raises(DurabilityImpossibleException):
                col.upsert("k", {"a": 1}, UpsertOptions(durability=ServerDurability(level)))
        with pytest.raises(DocumentNotFoundException):
            col.get("k")  # nothing was written
    finally:
        sdk.close()


def stream(port: int, vb: int, end: int, *, sync: bool) -> list:
    """Every message of a DCP stream of `vb` on a node up to `end`, with or without sync writes."""
    with RawDcpClient(port) as c:
        c.connect(user="Administrator", password="password", name=f"sw-check:{vb}:{sync}")
        if sync:
            c.controls(enable_sync_writes="true", consumer_name="checker")
        assert c.stream_request(vb, 0, end).status == Status.SUCCESS
        return [m for m in c.until_stream_end(vb) if not isinstance(m, DcpStreamEnd)]


def test_a_write_waits_for_its_replica_and_times_out_ambiguous_when_it_cannot_get_there(make_cluster):
    """With replication from the active's node held, a Majority write of a 1-replica vbucket cannot
    commit: SyncWriteAmbiguous at its timeout, the old value stays, and the key takes other writes
    again. Streams show the prepare and its abort to a sync-write consumer, nothing to the others."""
    cluster = make_cluster(replicas=1)
    wait_topologies(cluster)
    sdk = sdk_connect(cluster.connstr, kv_timeout=10)
    try:
        col = sdk.bucket("default").default_collection()
        col.upsert("held", {"v": "old"}, UpsertOptions(durability=ServerDurability(DurabilityLevel.MAJORITY)))
        vb = vbucket_for_key(b"held", cluster.vbuckets)
        active = cluster.manager.map[vb][0]
        cluster.run(cluster.manager.hold_replication(cluster.address(active)))
        with pytest.raises(DurabilitySyncWriteAmbiguousException):
            col.upsert("held", {"v": "new"}, UpsertOptions(durability=ServerDurability(DurabilityLevel.MAJORITY),
                                                           timeout=timedelta(seconds=2)))
        assert col.get("held").content_as[dict] == {"v": "old"}
        col.upsert("held", {"v": "plain"})  # the abort unblocked the key
        end = high_seqnos(cluster.ports[active], int(VBucketState.ACTIVE))[vb]
        sync_msgs = stream(cluster.ports[active], vb, end, sync=True)
        # prepare@1, its commit@2 (de-duplicated by the plain write of the key, like any version),
        # prepare@3, abort@4, the plain write@5
        got = [(type(m).__name__, getattr(m, "by_seqno", None) or getattr(m, "abort_seqno", None))
               for m in sync_msgs if not isinstance(m, DcpSnapshotMarker)]
        assert got == [("DcpPrepare", 1), ("DcpPrepare", 3), ("DcpAbort", 4), ("DcpMutation", 5)]
        assert sync_msgs[-2].prepared_seqno == 3
        plain = stream(cluster.ports[active], vb, end, sync=False)
        assert [(type(m).__name__, m.by_seqno) for m in plain if not isinstance(m, DcpSnapshotMarker)] == \
            [("DcpMutation", 5)]
        assert all(m.version == MarkerVersion.V2_0 for m in sync_msgs if isinstance(m, DcpSnapshotMarker))
    finally:
        sdk.close()
        cluster.run(cluster.manager.hold_replication(cluster.address(active), False))
