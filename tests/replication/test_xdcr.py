"""Cross-cluster replication (dcpflow.replication.xdcr) between real dcpflow servers over sockets."""

import pytest

from dcpflow.protocol.status import Status
from dcpflow.replication.xdcr import Filters, Settings

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
