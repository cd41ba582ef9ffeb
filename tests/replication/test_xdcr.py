"""Cross-cluster replication (dcpflow.replication.xdcr) between real dcpflow servers over sockets."""

import pytest

from dcpflow.protocol.status import Status
from dcpflow.replication.xdcr import Filters, Settings

from dcpflow.replication.commands import free_ports

from tests.server.client import RawClient

from .xdcr_helpers import InProcess, bucket_view, wait_for


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
