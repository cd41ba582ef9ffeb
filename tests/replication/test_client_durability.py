"""The official SDK's client-side durability (persist_to / replicate_to, "legacy durability") on a
dcpflow cluster: the SDK writes, then polls OBSERVE_SEQNO on the active and on each replica until
enough copies hold (replicate_to) or have persisted (persist_to) the write's seqno on its vbucket
UUID. It needs the cluster map's numReplicas and honest answers from every copy."""

from datetime import timedelta

import pytest
from couchbase.durability import ClientDurability, PersistTo, ReplicateTo
from couchbase.exceptions import DurabilityImpossibleException
from couchbase.options import RemoveOptions, UpsertOptions

from .helpers import RAW_JSON, sdk_connect
from .test_sync_writes import replica_contents, wait_topologies

TIMEOUT = timedelta(seconds=15)


@pytest.mark.parametrize("persist_to, replicate_to", [(PersistTo.NONE, ReplicateTo.ONE),
                                                      (PersistTo.ONE, ReplicateTo.NONE),
                                                      (PersistTo.ONE, ReplicateTo.ONE)])
def test_the_sdk_observes_its_writes_reach_and_persist_on_the_copies(make_cluster, persist_to, replicate_to):
    cluster = make_cluster(replicas=1)
    wait_topologies(cluster)
    sdk = sdk_connect(cluster.connstr, kv_timeout=10)
    durability = ClientDurability(persist_to=persist_to, replicate_to=replicate_to)
    try:
        col = sdk.bucket("default").default_collection()
        for n in range(5):
            col.upsert(f"cd-{n}", b'{"v":%d}' % n, UpsertOptions(durability=durability, transcoder=RAW_JSON,
                                                                 timeout=TIMEOUT))
            if replicate_to != ReplicateTo.NONE:  # the SDK saw the replica hold it: so does a DCP read of it
                assert replica_contents(cluster, f"cd-{n}") == [(b'{"v":%d}' % n, False)]
        col.remove("cd-0", RemoveOptions(durability=durability, timeout=TIMEOUT))
        with pytest.raises(DurabilityImpossibleException):  # one replica: two cannot hold it
            col.upsert("cd-x", b"{}", UpsertOptions(durability=ClientDurability(replicate_to=ReplicateTo.TWO),
                                                    transcoder=RAW_JSON, timeout=TIMEOUT))
    finally:
        sdk.close()
