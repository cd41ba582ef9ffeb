"""kill -9 of an active node while durable writes flow, failover, and the promise of a sync write:
every write the SDK saw succeed (durability Majority) is readable on the new active and in a DCP
stream from it, and a write whose outcome the SDK did not learn resolved the same way on every copy.

Each repetition kills a random node at a random point of the write stream (so some prepares are
in flight: prepared, not yet committed), fails it over, checks, then starts the node again and
rebalances so the next repetition has a whole cluster. DCPFLOW_SYNC_KILL_REPS sets the count
(default 20, about a minute and a half; more for a soak), DCPFLOW_SYNC_KILL_SEED the random seed."""

import os
import random
import threading
import time
from datetime import timedelta

import pytest
from couchbase.durability import DurabilityLevel, ServerDurability
from couchbase.exceptions import CouchbaseException
from couchbase.options import UpsertOptions

from dcpflow.protocol.dcp import VBucketState

from .helpers import RAW_JSON, failover_log, high_seqnos, sdk_connect, sdk_contents, vb_contents
from .test_sync_writes import wait_topologies

REPS = int(os.environ.get("DCPFLOW_SYNC_KILL_REPS", "20"))
ACTIVE, REPLICA = int(VBucketState.ACTIVE), int(VBucketState.REPLICA)


class DurableWriter(threading.Thread):
    """Durable (Majority) upserts of distinct values over `keys` until stopped: what succeeded,
    and what failed (ambiguous or not, the value may or may not have been committed)."""

    def __init__(self, connstr: str, keys: list[str]):
        super().__init__(daemon=True)
        self.connstr, self.keys = connstr, keys
        self.acked: dict[str, tuple[int, bytes]] = {}  # key -> (index, value) of its last success
        self.failed: dict[str, list[tuple[int, bytes]]] = {}  # key -> attempts after it that failed
        self.count = 0
        self._halt = threading.Event()

    def run(self) -> None:
        sdk = sdk_connect(self.connstr, kv_timeout=5)
        try:
            col = sdk.bucket("default").default_collection()
            opts = UpsertOptions(durability=ServerDurability(DurabilityLevel.MAJORITY), transcoder=RAW_JSON,
                                 timeout=timedelta(seconds=3))
            i = 0
            while not self._halt.is_set():
                key = self.keys[i % len(self.keys)]
                value = b'{"n":%d}' % i
                try:
                    col.upsert(key, value, opts)
                except CouchbaseException:
                    self.failed.setdefault(key, []).append((i, value))
                else:
                    self.acked[key] = (i, value)
                    self.failed.pop(key, None)  # a later success supersedes earlier failures
                    self.count += 1
                i += 1
        finally:
            sdk.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(60)


def active_contents(cluster) -> dict[bytes, bytes]:
    """key -> value of every live document, read over DCP from each vbucket's active."""
    out = {}
    for vb, chain in enumerate(cluster.manager.map):
        high = high_seqnos(cluster.ports[chain[0]], ACTIVE)[vb]
        for key, meta in vb_contents(cluster.ports[chain[0]], vb, high).items():
            if not meta[7]:
                out[key] = meta[0]
    return out


def copies_agree(cluster, rep: int, dead: int) -> None:
    """Every replica copy holds what its active holds (values and deletions), read over DCP."""
    for vb, chain in enumerate(cluster.manager.map):
        high = high_seqnos(cluster.ports[chain[0]], ACTIVE)[vb]
        want = {k: (m[0], m[7]) for k, m in vb_contents(cluster.ports[chain[0]], vb, high).items()}
        for i in chain[1:]:
            if i >= 0:
                full = vb_contents(cluster.ports[i], vb, high)
                got = {k: (m[0], m[7]) for k, m in full.items()}
                if got != want:
                    active = vb_contents(cluster.ports[chain[0]], vb, high)
                    differ = {k: (active.get(k), full.get(k)) for k in set(active) | set(full)
                              if (active.get(k) or (0,) * 8)[::7] != (full.get(k) or (0,) * 8)[::7]}
                    pytest.fail(f"rep {rep}: vb {vb}: the copy on node {i} differs from its active {chain[0]} "
                                f"(chain {chain}; node {dead} was killed and failed over; high {high}): "
                                f"key -> (active, copy) {differ}; failover logs: active "
                                f"{failover_log(cluster.ports[chain[0]], vb)}, "
                                f"copy {failover_log(cluster.ports[i], vb)}")


@pytest.mark.slow
def test_kill9_between_prepare_and_commit_loses_no_acknowledged_durable_write(make_cluster):
    rng = random.Random(int(os.environ.get("DCPFLOW_SYNC_KILL_SEED", "0")) or None)
    cluster = make_cluster(replicas=2, vbuckets=8)
    mgr = cluster.manager
    keys = [f"sw{i}" for i in range(64)]
    for rep in range(REPS):
        wait_topologies(cluster)
        writer = DurableWriter(cluster.connstr, keys)
        writer.start()
        deadline = time.monotonic() + 30
        target = rng.randint(5, 60)  # the kill point: after this many acknowledged writes
        while writer.count < target:
            assert time.monotonic() < deadline and writer.is_alive(), f"rep {rep}: no durable writes succeed"
            time.sleep(0.001)
        dead = rng.randrange(len(cluster.procs))
        cluster.procs[dead].kill()
        result = cluster.run(mgr.failover(cluster.address(dead)))
        assert result["without_copy"] == 0
        wait_topologies(cluster)
        seen = writer.count
        deadline = time.monotonic() + 30  # the SDK follows the new map and writes go on durably
        while writer.count < seen + 10:
            assert time.monotonic() < deadline, f"rep {rep}: durable writes did not resume after failover"
            time.sleep(0.01)
        writer.stop()
        cluster.run(mgr.wait_replicated(60), 70)
        by_sdk = sdk_contents(cluster.connstr, keys)
        by_dcp = active_contents(cluster)
        for key, (_, value) in writer.acked.items():
            maybe = {v for _, v in writer.failed.get(key, [])}  # failed later: their outcome is unknown
            assert by_sdk[key][0] in {value} | maybe, f"rep {rep}: {key} lost its acknowledged write"
            assert by_dcp[key.encode()] == by_sdk[key][0], f"rep {rep}: {key} differs between GET and DCP"
        copies_agree(cluster, rep, dead)  # ambiguous writes resolved the same way on every copy
        cluster.run(mgr.rebalance(), 120)  # the killed node comes back, for the next repetition
