"""Cross-cluster replication (dcpflow.replication.xdcr) between real dcpflow servers over sockets."""

import signal
import urllib.request

import pytest

from dcpflow.protocol.meta import GetMeta, GetMetaResponse
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from dcpflow.replication.commands import free_ports
from dcpflow.replication.xdcr import Filters, Settings
from tests.server.client import RawClient

from .test_cluster import wait_replicated
from .xdcr_helpers import InProcess, XdcrProcess, bucket_view, wait_for


def url(srv) -> str:
    return f"couchbase://127.0.0.1:{srv.port}/default"


@pytest.fixture
def two(make_server, tmp_path):
    a = make_server(data_dir=tmp_path / "a")
    b = make_server(data_dir=tmp_path / "b")
    return a, b


def same(a, b, keys):
    va, vb = bucket_view(a.port, keys), bucket_view(b.port, keys)
    if va != vb:
        same.last_diff = {k: (va.get(k), vb.get(k)) for k in set(va) | set(vb) if va.get(k) != vb.get(k)}
    return va == vb and va


def test_one_way_copies_documents_with_their_metadata(two, tmp_path):
    a, b = two
    keys = [b"doc%d" % i for i in range(200)] + [b"empty", b"gone"]
    with a.login() as c:
        for i, key in enumerate(keys[:200]):
            assert c.set(key, b'{"i":%d}' % i, flags=i).status == Status.SUCCESS
        assert c.set(b"empty", b"").status == Status.SUCCESS
        assert c.set(b"gone", b"x").status == Status.SUCCESS
        assert c.delete(b"gone").status == Status.SUCCESS
        assert c.set(b"doc7", b"v2").status == Status.SUCCESS
    rep = InProcess(url(a), url(b), tmp_path / "state", Settings(checkpoint_interval=0.2))
    try:
        view = wait_for(lambda: same(a, b, keys), what="b to equal a")
        assert len(view) == 202 and view[b"gone"][0] and view[b"empty"][4] == b""
        assert view[b"doc7"][4] == b"v2" and view[b"doc9"][3] == 9
    finally:
        stats = rep.stop()
    assert stats["failed_cr_target"] == 0 and stats["docs_failed"] == 0
    assert stats["docs_written"] == stats["docs_received"] >= 202 and stats["deletions_written"] == 1


# ---------------------------------------------------------------------------------------------
# bidirectional, with a kill -9


def _caught_up(rep: InProcess) -> bool:
    """Every source vbucket's position has reached its high seqno (nothing left to send)."""
    r = rep.replicator
    highs = rep.run(r.source.high_seqnos())
    return all(r.positions[vb].seqno >= h for vb, h in highs.items())


def _write_round(rng, side, keys, n: int) -> None:
    """n random writes on one side: updates (most), deletions, and documents that expire in 1 s."""
    c = RawClient(side.port)
    with c.login():
        for key in rng.sample(keys, n):
            roll = rng.random()
            if roll < 0.15:
                assert c.delete(key).status in (Status.SUCCESS, Status.KEY_ENOENT)
            elif roll < 0.3:
                assert c.set(key, b'{"ttl":1}', expiry=1).status == Status.SUCCESS
            else:
                value = b'{"v":%d,"pad":"%s"}' % (rng.randrange(1 << 30), b"x" * rng.choice((0, 10, 400)))
                assert c.set(key, value, flags=rng.randrange(4)).status == Status.SUCCESS


def test_bidirectional_conflicts_and_a_kill9_converge_to_identical_buckets(spawn_server, tmp_path):
    """Two servers replicate both ways while both take conflicting writes, deletes and expiries.
    B runs without flushing, so its kill -9 loses everything it took: it comes back empty on new
    vbucket UUIDs. A->B must see that the target lost its writes and send them again; B->A's
    streams roll back. In the end both buckets hold the same documents, tombstones included, with
    the same CAS, rev seqno and flags."""
    import random
    rng = random.Random(35)
    pa, pb = free_ports(2)
    common = ("--vbuckets", "64", "--expiry-interval", "0.2")
    a = spawn_server("--port", str(pa), "--data-dir", str(tmp_path / "a"), *common)
    b = spawn_server("--port", str(pb), "--data-dir", str(tmp_path / "b"), "--flush-interval", "3600", *common)
    keys = [b"key%d" % i for i in range(80)]
    settings = Settings(checkpoint_interval=0.2, conflict_resolution="seqno", optimistic_threshold=256)
    ab = InProcess(f"couchbase://127.0.0.1:{pa}/default", f"couchbase://127.0.0.1:{pb}/default",
                   tmp_path / "ab", settings)
    ba = InProcess(f"couchbase://127.0.0.1:{pb}/default", f"couchbase://127.0.0.1:{pa}/default",
                   tmp_path / "ba", settings)
    try:
        for _ in range(6):
            _write_round(rng, a, keys, 30)
            _write_round(rng, b, keys, 30)
        wait_for(lambda: ab.stats["docs_written"] and ba.stats["docs_written"], what="writes both ways")
        b.kill9()
        for _ in range(3):
            _write_round(rng, a, keys, 30)
        b = spawn_server("--port", str(pb), "--data-dir", str(tmp_path / "b"), *common)
        for _ in range(6):
            _write_round(rng, a, keys, 30)
            _write_round(rng, b, keys, 30)

        def converged():
            view = same(a, b, keys)
            # documents that expire are gone on both sides by now (their 1 s is long past)
            return view and all(v[0] for v in view.values() if v[4] == b'{"ttl":1}') and view

        try:
            wait_for(converged, what="both buckets to be identical")
        except AssertionError:
            raise AssertionError(f"differences: {getattr(same, 'last_diff', None)}") from None
        wait_for(lambda: _caught_up(ab) and _caught_up(ba), what="both replicators to catch up")
        view = wait_for(converged, what="both buckets to stay identical")
    finally:
        stats_ab, stats_ba = ab.stop(), ba.stop()
    assert len(view) == len(keys)
    assert any(v[0] for v in view.values()) and any(not v[0] for v in view.values())
    assert stats_ab["target_rewinds"] >= 1, stats_ab  # B lost what A->B had written
    assert stats_ba["source_rollbacks"] >= 1, stats_ba  # B's history was gone
    for stats in (stats_ab, stats_ba):
        assert stats["docs_failed"] == 0 and stats["failed_cr_target"] > 0  # echoes rejected: no loop


# ---------------------------------------------------------------------------------------------
# restarts of the replicator


def _write(srv, keys, value: bytes) -> None:
    with srv.login() as c:
        for key in keys:
            assert c.set(key, value).status == Status.SUCCESS


def test_restart_resumes_from_checkpoints_and_counts_what_was_resent(two, tmp_path):
    """`dcpflow xdcr` exits 0 on SIGTERM after a last checkpoint; the next run sends only what
    changed since. After a kill -9 the next run resends at most what followed the last
    checkpoint: the target rejects those as identical versions, which is how they are counted."""
    a, b = two
    state = tmp_path / "state"
    first = [b"r%d" % i for i in range(100)]
    _write(a, first, b'{"run":1}')
    args = (url(a), url(b), state, "--checkpoint-interval", "0.2")
    p = XdcrProcess(*args, "--metrics-port", "0")
    try:
        wait_for(lambda: same(a, b, first), what="the first run to copy everything")
        wait_for(lambda: 'xdcr_docs_written_total{sourceBucketName="default",targetBucketName="default"} 100\n'
                 in urllib.request.urlopen(p.metrics_url, timeout=10).read().decode(), what="the metrics")
        rc, out = p.terminate(signal.SIGTERM)
    finally:
        p.cleanup()
    assert rc == 0 and "dcpflow xdcr stopped" in out
    assert p.status()["stats"]["docs_written"] == 100

    second = first[:30] + [b"s%d" % i for i in range(20)]
    _write(a, second, b'{"run":2}')
    p = XdcrProcess(*args)
    try:
        wait_for(lambda: same(a, b, first + second), what="the second run to copy the changes")
        rc, _ = p.terminate(signal.SIGINT)
    finally:
        p.cleanup()
    stats = p.status()["stats"]
    assert rc == 0
    assert stats["docs_written"] == 50 and stats["failed_cr_target"] == 0 and stats["docs_resent"] == 0

    third = [b"t%d" % i for i in range(40)]
    p = XdcrProcess(*args)
    try:
        _write(a, third[:20], b'{"run":3}')
        wait_for(lambda: (p.status() or {}).get("stats", {}).get("docs_written") == 20
                 and p.status()["stats"]["changes_left"] == 0, what="a checkpoint after the first 20")
        _write(a, third[20:], b'{"run":3}')
        wait_for(lambda: same(a, b, first + second + third), what="the third run to copy the changes")
        p.proc.kill()  # kill -9: no last checkpoint
        p.proc.wait(30)
    finally:
        p.cleanup()
    p = XdcrProcess(*args)
    try:
        wait_for(lambda: (p.status() or {}).get("stats", {}).get("changes_left") == 0
                 and p.status()["stats"]["checkpoints"] >= 2, what="the fourth run to catch up")
        rc, _ = p.terminate(signal.SIGTERM)
    finally:
        p.cleanup()
    stats = p.status()["stats"]
    assert rc == 0 and stats["docs_written"] == 0  # everything was on the target already
    resent = stats["failed_cr_target"]
    assert resent <= 20, stats  # at most what followed the checkpoint taken after the first 20
    print(f"re-sent after kill -9: {resent} of the 20 changes written after the last known checkpoint")


# ---------------------------------------------------------------------------------------------
# a source cluster fails over


def _cluster_write(cluster, keys, value: bytes) -> None:
    from dcpflow.protocol.keys import vbucket_for_key
    by_node: dict[int, list[bytes]] = {}
    for key in keys:
        by_node.setdefault(cluster.manager.map[vbucket_for_key(key, cluster.vbuckets)][0], []).append(key)
    for node, group in by_node.items():
        with cluster.client(node) as c:
            for key in group:
                assert c.set(key, value).status == Status.SUCCESS


def _cluster_view(cluster, keys) -> dict:
    from dcpflow.protocol.keys import vbucket_for_key
    by_node: dict[int, list[bytes]] = {}
    for key in keys:
        by_node.setdefault(cluster.manager.map[vbucket_for_key(key, cluster.vbuckets)][0], []).append(key)
    out = {}
    for node, group in by_node.items():
        out.update(bucket_view(cluster.ports[node], group, cluster.vbuckets))
    return out


def test_source_failover_in_a_three_node_cluster_mid_replication_converges(make_cluster, make_server, tmp_path):
    """A 3-node source cluster (16 vbuckets, one replica) replicates into a 64-vbucket server; a
    node is killed -9 and failed over while the replicator streams from it. The replicator follows
    the new map to the promoted replicas, and the target ends equal to the cluster."""
    cluster = make_cluster()
    target = make_server(data_dir=tmp_path / "target")
    before = [b"f%d" % i for i in range(300)]
    _cluster_write(cluster, before, b'{"phase":1}')
    rep = InProcess(cluster.connstr + "/default", url(target), tmp_path / "state",
                    Settings(checkpoint_interval=0.2, conflict_resolution="seqno"))
    try:
        wait_for(lambda: rep.stats["docs_written"] >= 50, what="replication under way")
        wait_replicated(cluster)  # the replicas hold what the replicator may have read from node 0
        cluster.procs[0].kill()
        result = cluster.run(cluster.manager.failover(cluster.address(0)))
        assert result["promoted"] > 0 and result["without_copy"] == 0
        after = before[:100] + [b"g%d" % i for i in range(100)]
        _cluster_write(cluster, after, b'{"phase":2}')
        keys = before + after[100:]

        def equal():
            source, copy = _cluster_view(cluster, keys), bucket_view(target.port, keys)
            return source == copy and source

        view = wait_for(equal, what="the target to equal the cluster")
    finally:
        stats = rep.stop()
    assert len(view) == 400 and stats["docs_failed"] == 0
    assert sum(1 for v in view.values() if v[4] == b'{"phase":2}') == 200


# ---------------------------------------------------------------------------------------------
# filters, conflict resolution at the source, LWW buckets


def test_filters_choose_keys_and_skip_deletions_and_ttls(two, tmp_path):
    a, b = two
    with a.login() as c:
        for i in range(20):
            assert c.set(b"user::%d" % i, b"{}", expiry=3600).status == Status.SUCCESS
            assert c.set(b"temp::%d" % i, b"{}").status == Status.SUCCESS
        assert c.set(b"user::gone", b"{}").status == Status.SUCCESS
    settings = Settings(checkpoint_interval=0.2, filters=Filters(key_regex="^user::", skip_deletions=True,
                                                                  strip_ttl=True))
    rep = InProcess(url(a), url(b), tmp_path / "state", settings)
    try:
        users = [b"user::%d" % i for i in range(20)] + [b"user::gone"]
        wait_for(lambda: len(bucket_view(b.port, users)) == 21, what="the users to arrive")
        with a.login() as c:
            assert c.delete(b"user::gone").status == Status.SUCCESS
            assert c.set(b"user::last", b"{}").status == Status.SUCCESS
        wait_for(lambda: bucket_view(b.port, [b"user::last"]), what="a later change to arrive")
        view = bucket_view(b.port, users + [b"temp::%d" % i for i in range(20)])
    finally:
        stats = rep.stop()
    assert set(view) == set(users) and not view[b"user::gone"][0]  # the deletion was not sent
    with b.login() as c:
        c.send(GetMeta(b"user::3", 2, c.vbucket_of(b"user::3"), c.next_opaque()).encode())
        assert GetMetaResponse.from_frame(c.recv()).expiry == 0  # the TTL was stripped
    assert stats["docs_filtered"] == 21 and stats["docs_written"] == 22


def test_large_documents_the_target_beats_are_not_sent(two, tmp_path):
    """Above the optimistic threshold the replicator asks the target (GET_META) first: a document
    whose version loses there is counted as failed at the source and never sent; a small one is
    sent and refused by the target (failed at the target)."""
    a, b = two
    big, small = b"x" * 1000, b"y" * 10
    with b.login() as c:  # the target's versions have higher rev seqnos
        for _ in range(3):
            assert c.set(b"big", big).status == Status.SUCCESS
            assert c.set(b"small", small).status == Status.SUCCESS
    with a.login() as c:
        assert c.set(b"big", b"a" * 1000).status == Status.SUCCESS
        assert c.set(b"small", b"a").status == Status.SUCCESS
        assert c.set(b"new", b"a" * 1000).status == Status.SUCCESS
    rep = InProcess(url(a), url(b), tmp_path / "state", Settings(checkpoint_interval=0.2, optimistic_threshold=256))
    try:
        wait_for(lambda: bucket_view(b.port, [b"new"]), what="the new document")
        wait_for(lambda: rep.stats["failed_cr_target"] == 1, what="the small loser")
    finally:
        stats = rep.stop()
    assert stats["failed_cr_source"] == 1 and stats["failed_cr_target"] == 1 and stats["docs_written"] == 1
    view = bucket_view(b.port, [b"big", b"small"])
    assert view[b"big"][4] == big and view[b"small"][4] == small


def test_lww_buckets_replicate_both_ways_with_force_accept(make_server, tmp_path):
    """LWW buckets need FORCE_ACCEPT_WITH_META_OPS on every *WithMeta write; the mode is read from
    both clusters' REST API. The newest write (highest CAS) wins on both sides."""
    a = make_server(data_dir=tmp_path / "a", conflict_resolution="lww")
    b = make_server(data_dir=tmp_path / "b", conflict_resolution="lww")
    keys = [b"k%d" % i for i in range(30)]
    with b.login() as c:
        for key in keys:
            assert c.set(key, b"b" * 5).status == Status.SUCCESS  # more revisions, older CAS
            assert c.set(key, b"b").status == Status.SUCCESS
    with a.login() as c:
        for key in keys:
            assert c.set(key, b"a").status == Status.SUCCESS
    ab = InProcess(url(a), url(b), tmp_path / "ab", Settings(checkpoint_interval=0.2))
    ba = InProcess(url(b), url(a), tmp_path / "ba", Settings(checkpoint_interval=0.2))
    try:
        assert ab.replicator.mode == "lww"
        view = wait_for(lambda: same(a, b, keys), what="convergence")
    finally:
        ab.stop()
        ba.stop()
    assert all(v[4] == b"a" for v in view.values())


def test_target_cluster_failover_mid_replication_is_followed_and_revalidated(make_cluster, make_server, tmp_path):
    """The target is a 3-node cluster (16 vbuckets, one replica); one of its nodes is killed -9
    and failed over while the replicator writes to it, without waiting for its replicas to catch
    up. The replicator follows NOT_MY_VBUCKET to the promoted replicas, checks their failover logs
    against its checkpoints, sends again whatever the promotion lost, and the target cluster ends
    equal to the source."""
    source = make_server(data_dir=tmp_path / "source")
    cluster = make_cluster()
    keys = [b"t%d" % i for i in range(400)]
    _write(source, keys[:200], b'{"phase":1}')
    rep = InProcess(url(source), cluster.connstr + "/default", tmp_path / "state",
                    Settings(checkpoint_interval=0.2, conflict_resolution="seqno"))
    try:
        wait_for(lambda: rep.stats["docs_written"] >= 100, what="replication under way")
        _write(source, keys[200:], b'{"phase":2}')
        cluster.procs[0].kill()
        result = cluster.run(cluster.manager.failover(cluster.address(0)))
        assert result["promoted"] > 0
        _write(source, keys[:50], b'{"phase":3}')

        def equal():
            wanted, copy = bucket_view(source.port, keys), _cluster_view(cluster, keys)
            return wanted == copy and wanted

        view = wait_for(equal, what="the target cluster to equal the source")
    finally:
        stats = rep.stop()
    assert len(view) == 400 and stats["docs_failed"] == 0
    assert stats["target_retries"] > 0  # writes to the dead node were sent again to the new owners


# ---------------------------------------------------------------------------------------------
# collections


def _make_collections(srv, *paths: str) -> dict[str, int]:
    from dcpflow.client import rest_client
    mgmt = f"http://127.0.0.1:{srv.mgmt_port}"
    engine = srv.server.buckets["default"].engine
    scopes = set(srv.call(lambda: [x.name for x in engine.manifest.scopes]))
    for path in paths:
        scope, coll = path.split(".")
        if scope not in scopes:
            rest_client.call(mgmt, "Administrator", "password", "POST", "/pools/default/buckets/default/scopes",
                             {"name": scope})
        scopes.add(scope)
        rest_client.call(mgmt, "Administrator", "password", "POST",
                         f"/pools/default/buckets/default/scopes/{scope}/collections", {"name": coll})
    return {p: srv.call(lambda p=p: engine.manifest.collection(*p.split(".")).uid) for p in paths}


def _collection_view(srv, cid: int, keys) -> dict:
    from dcpflow.protocol.hello import Feature
    from dcpflow.protocol.keys import make_key
    out = {}
    c = RawClient(srv.port)
    with c.login(features=(Feature.XERROR, Feature.JSON, Feature.COLLECTIONS)):
        for key in keys:
            c.send(GetMeta(make_key(key, cid), 2, c.vbucket_of(key), c.next_opaque()).encode())
            meta = GetMetaResponse.from_frame(c.recv())
            if meta.status == Status.SUCCESS:
                got = c.call(Opcode.GET, key=make_key(key, cid), vbucket=c.vbucket_of(key))
                out[key] = (meta.is_deleted, meta.cas, meta.rev_seqno, got.value if got.status == 0 else None)
    return out


def test_collections_go_to_the_target_collection_of_the_same_name(two, tmp_path):
    """Collection ids differ between buckets: a document goes to the target's collection of the
    same scope and collection name; one of a collection the target lacks is skipped and counted."""
    from dcpflow.protocol.hello import Feature
    from dcpflow.protocol.keys import make_key
    a, b = two
    _make_collections(b, "app.padding")  # the target's ids are not the source's
    src = _make_collections(a, "app.orders", "app.only_here")
    dst = _make_collections(b, "app.orders")
    assert src["app.orders"] != dst["app.orders"]
    keys = [b"o%d" % i for i in range(30)]
    c = RawClient(a.port)
    with c.login(features=(Feature.XERROR, Feature.JSON, Feature.COLLECTIONS)):
        for key in keys:
            for cid in (src["app.orders"], src["app.only_here"]):
                reply = c.call(Opcode.SET, key=make_key(key, cid), extras=b"\0" * 8, value=b'{"o":1}',
                               vbucket=c.vbucket_of(key))
                assert reply.status == Status.SUCCESS
    rep = InProcess(url(a), url(b), tmp_path / "state", Settings(checkpoint_interval=0.2))
    try:
        view = wait_for(lambda: (lambda s, t: s == t and t)(_collection_view(a, src["app.orders"], keys),
                                                            _collection_view(b, dst["app.orders"], keys)),
                        what="the collection to arrive")
    finally:
        stats = rep.stop()
    assert len(view) == 30 and stats["docs_other_collections"] == 30
    assert _collection_view(b, src["app.orders"], keys) == {}  # nothing under the source's id


def test_sigterm_while_the_target_is_down_exits_0_and_keeps_the_last_checkpoint(make_server, spawn_server,
                                                                                tmp_path):
    """Writes to a target that is down are retried without end; SIGTERM still stops the
    replicator at once (exit 0), and the next run, once the target is back, sends what was left."""
    a = make_server(data_dir=tmp_path / "a")
    (pb,) = free_ports(1)
    b = spawn_server("--port", str(pb), "--data-dir", str(tmp_path / "b"), "--vbuckets", "64")
    first = [b"d%d" % i for i in range(50)]
    _write(a, first, b"{}")
    args = (url(a), f"couchbase://127.0.0.1:{pb}/default", tmp_path / "state", "--checkpoint-interval", "0.2",
            "--conflict-resolution", "seqno")
    p = XdcrProcess(*args)
    try:
        wait_for(lambda: same(a, b, first) and (p.status() or {}).get("stats", {}).get("docs_written") == 50,
                 what="a checkpoint of the first 50")
        b.terminate()
        later = [b"e%d" % i for i in range(50)]
        _write(a, later, b"{}")
        wait_for(lambda: p.proc.poll() is None and (tmp_path / "state.log").read_text().count("sending") > 0,
                 what="writes retried against the stopped target")
        rc, out = p.terminate(signal.SIGTERM)
    finally:
        p.cleanup()
    assert rc == 0 and "dcpflow xdcr stopped" in out
    b = spawn_server("--port", str(pb), "--data-dir", str(tmp_path / "b"), "--vbuckets", "64")
    p = XdcrProcess(*args)
    try:
        wait_for(lambda: same(a, b, first + later), what="the next run to send the rest")
    finally:
        p.terminate(signal.SIGTERM)
        p.cleanup()


def test_writes_lost_by_a_target_restart_between_checkpoints_are_sent_again(make_server, spawn_server, tmp_path):
    """No checkpoint is taken during this run, so only the replies tell: the target, killed -9
    with nothing persisted, answers on new vbucket UUIDs, and what the replicator wrote on the old
    ones (its own record since the last checkpoint) is gone, so it is sent again."""
    from tests.server.conftest import keys_in
    a = make_server(data_dir=tmp_path / "a")
    (pb,) = free_ports(1)
    target_args = ("--port", str(pb), "--data-dir", str(tmp_path / "b"), "--vbuckets", "64")
    b = spawn_server(*target_args, "--flush-interval", "3600")
    first = [b"x%d" % i for i in range(100)]
    _write(a, first, b'{"n":1}')
    rep = InProcess(url(a), f"couchbase://127.0.0.1:{pb}/default", tmp_path / "state",
                    Settings(checkpoint_interval=3600, conflict_resolution="seqno"))
    try:
        wait_for(lambda: same(a, b, first), what="the first writes")
        b.kill9()
        b = spawn_server(*target_args)
        second = [keys_in(vb, 1, prefix="y")[0] for vb in range(64)]  # a write to every vbucket
        _write(a, second, b'{"n":2}')
        view = wait_for(lambda: same(a, b, first + second), what="the lost writes to be sent again")
    finally:
        stats = rep.stop()
    assert len(view) == 164 and stats["target_rewinds"] >= 1 and stats["docs_resent"] >= 100, stats
