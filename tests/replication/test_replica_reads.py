"""Replica reads on a real three-node cluster (one replica): GET_REPLICA and sub-document lookups
with the REPLICA_READ doc flag answer from the replica copy once a write has replicated, through
the project's codec and the official SDK (get_any_replica, get_all_replicas,
lookup_in_any_replica, lookup_in_all_replicas); the published map advertises subdoc.ReplicaRead."""

import json

import couchbase.subdocument as SD
from couchbase.options import MutateInOptions

from dcpflow.protocol import kv
from dcpflow.protocol import subdoc as sdproto
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.keys import vbucket_for_key
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .helpers import sdk_connect
from .test_cluster import node_map, wait_replicated

X = sdproto.PathFlag.XATTR_PATH


def test_replica_reads_after_replication(cluster):
    assert "subdoc.ReplicaRead" in node_map(cluster, 0).capabilities
    sdk = sdk_connect(cluster.connstr, kv_timeout=10)
    try:
        col = sdk.bucket("default").default_collection()
        for i in range(20):
            col.mutate_in(f"rr{i}", [SD.upsert("meta.writer", "sdk", xattr=True, create_parents=True),
                                     SD.upsert("i", i)],
                          MutateInOptions(store_semantics=SD.StoreSemantics.UPSERT))
        wait_replicated(cluster)
        for i in range(20):
            key = f"rr{i}"
            assert col.get_any_replica(key).content_as[dict] == {"i": i}
            copies = list(col.get_all_replicas(key))
            assert len(copies) == 2 and sorted(r.is_replica for r in copies) == [False, True]
            assert all(r.content_as[dict] == {"i": i} for r in copies)
            found = col.lookup_in_any_replica(key, [SD.get("meta.writer", xattr=True), SD.get("i")])
            assert found.content_as[str](0) == "sdk" and found.content_as[int](1) == i
            everywhere = list(col.lookup_in_all_replicas(key, [SD.get("i")]))
            assert len(everywhere) == 2 and all(r.content_as[int](0) == i for r in everywhere)
            assert any(r.is_replica for r in everywhere)
    finally:
        sdk.close()

    key = b"rr3"
    vb = vbucket_for_key(key, cluster.vbuckets)
    active, replica = cluster.manager.map[vb]
    with cluster.client(replica) as c:
        c.hello(Feature.XERROR, Feature.JSON, Feature.XATTR)
        c.send(kv.GetReplica(key, vb, opaque=5).encode())
        got = kv.GetResponse.from_frame(c.recv())
        assert got.status == Status.SUCCESS and json.loads(got.value) == {"i": 3}
        c.send(kv.GetReplica(b"absent", vbucket_for_key(b"absent", cluster.vbuckets), opaque=6).encode())
        assert c.recv().status in (Status.KEY_ENOENT, Status.NOT_MY_VBUCKET)
        lookup = sdproto.SubdocMultiLookup(key, (sdproto.SubdocSpec(Opcode.SUBDOC_GET, b"meta", b"", X),),
                                           sdproto.DocFlag.REPLICA_READ, vb, 7)
        c.send(lookup.encode())
        reply = sdproto.SubdocMultiLookupResponse.from_frame(c.recv())
        assert reply.status == Status.SUCCESS and json.loads(reply.results[0].value) == {"writer": "sdk"}
    with cluster.client(active) as c:
        c.hello(Feature.XERROR, Feature.JSON, Feature.XATTR)
        c.send(kv.GetReplica(key, vb, opaque=8).encode())
        assert c.recv().status == Status.NOT_MY_VBUCKET  # the active copy is not a replica
        c.send(lookup._replace(opaque=9).encode())
        assert c.recv().status == Status.NOT_MY_VBUCKET

