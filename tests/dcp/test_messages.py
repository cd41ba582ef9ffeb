"""What the stream messages carry: MUTATION fields, DELETION V1/V2, EXPIRATION (only with the
expiry opcode *and* delete times: `enable_expiry_opcode` alone is accepted and does nothing, erratum
13), xattrs kept or stripped, NoValue variants, SEQNO_ADVANCED, and official-SDK writes arriving in
seqno order. End to end here: one case of each path (a mutation written over KV, backfill pages
read on the server's threads, xattrs with their DCP_OPEN flag, writes during streaming, an
official SDK); every message rule is checked without a socket in test_message_rules.py."""


import pytest

from dcpflow.protocol import dcp
from dcpflow.protocol.datatype import Datatype, join_xattrs
from dcpflow.protocol.dcp import OpenFlag, StreamFlag
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.status import Status

from .client import items
from .conftest import engine_of, fill, keys_in, to_disk_only

MAX = 0xFFFFFFFFFFFFFFFF
P = OpenFlag.PRODUCER


def test_mutation_fields(server, clients, writer):
    key = keys_in(0, 1)[0]
    reply = writer.set(key, b'{"a":1}', vbucket=0, flags=0xCAFE, expiry=3600, datatype=Datatype.JSON)
    assert reply.status == Status.SUCCESS
    doc = server.call(lambda: engine_of(server).vbucket(0).ht[key])
    c = clients()
    c.stream_request(0, 0, 1)
    (m,) = items(c.until_stream_end(0))
    assert isinstance(m, dcp.DcpMutation)
    assert (m.key, m.value, m.flags, m.expiration, m.cas, m.rev_seqno, m.by_seqno, m.datatype) == \
        (key, b'{"a":1}', 0xCAFE, doc.expiry, doc.cas, doc.rev_seqno, 1, Datatype.JSON)
    assert m.lock_time == 0 and m.nru == 0


@pytest.mark.parametrize("collections", [True])  # both: test_message_rules.py
def test_backfill_sends_what_memory_sends(server, clients, writer, collections):
    """Mutations backfilled from disk (pages SQLite encodes, engine/store.py) carry exactly the
    fields, key layout and opaque that the same mutations carry when memory serves them."""
    keys = fill(writer, 0, 40)
    writer.set(keys[3], b'{"v":2}', vbucket=0, flags=7, expiry=4000, datatype=Datatype.JSON)
    features = (Feature.XERROR, Feature.COLLECTIONS) if collections else (Feature.XERROR,)

    def stream(name: str, opaque: int) -> list:
        c = clients(name=name, features=features)
        c.controls(enable_noop="true")  # mandatory with collections
        assert c.stream_request(0, 0, 41, opaque=opaque).status == Status.SUCCESS
        msgs = c.until_stream_end(0)
        assert [type(m) for m in msgs[:1]] == [dcp.DcpSnapshotMarker]
        return [(m.key, m.value, m.by_seqno, m.rev_seqno, m.cas, m.flags, m.expiration, m.datatype, m.opaque)
                for m in items(msgs)]

    from_memory = stream("memory", 0x1234)
    to_disk_only(server, 0)
    from_disk = stream("disk", 0xABCDEF01)
    assert len(from_disk) == 40  # de-duplicated: the first version of keys[3] is gone on disk
    assert [m[0] for m in from_disk] == [b"\x00" + k if collections else k for k in keys if k != keys[3]] + \
        [b"\x00" + keys[3] if collections else keys[3]]
    assert {m[8] for m in from_disk} == {0xABCDEF01}
    assert [m[:8] for m in from_disk] == [m[:8] for m in from_memory if m[2] != 4]


def xattr_doc(server, vb: int = 0):
    key = keys_in(vb, 1, prefix="x")[0]
    body = b'{"b":2}'
    value = join_xattrs({"_sys": '{"s":1}', "user": '"u"'}, body)

    def write():
        engine_of(server).vbucket(vb).set(key, value, datatype=int(Datatype.XATTR | Datatype.JSON))
    server.call(write)
    return key, value, body


def test_xattrs_are_kept_with_include_xattrs(server, clients):
    key, value, body = xattr_doc(server)
    c = clients(flags=P | OpenFlag.INCLUDE_XATTRS)
    c.controls(enable_noop="true")
    c.stream_request(0, 0, 1)
    (m,) = items(c.until_stream_end(0))
    assert (m.value, m.datatype) == (value, Datatype.XATTR | Datatype.JSON)


def test_writes_during_streaming_arrive_in_seqno_order(server, clients, writer):
    c = clients()
    for vb in range(4):
        assert c.stream_request(vb, 0, MAX).status == Status.SUCCESS
    for i, key in enumerate(keys_in(0, 30) + keys_in(1, 30) + keys_in(2, 30) + keys_in(3, 30)):
        writer.set(key, b"%d" % i, vbucket=int(i // 30))
    msgs = c.quiet(1.5)
    for vb in range(4):
        assert [m.by_seqno for m in items(msgs) if m.vbucket == vb] == list(range(1, 31))


def test_official_sdk_writes_show_up_in_order(server, clients):
    couchbase = pytest.importorskip("couchbase")
    from datetime import timedelta

    from couchbase.auth import PasswordAuthenticator
    from couchbase.cluster import Cluster
    from couchbase.options import ClusterOptions, ClusterTimeoutOptions

    del couchbase
    c = clients()
    for vb in range(64):
        assert c.stream_request(vb, 0, MAX, flags=StreamFlag.ACTIVE_VB_ONLY).status == Status.SUCCESS
    opts = ClusterOptions(PasswordAuthenticator("Administrator", "password"),
                          timeout_options=ClusterTimeoutOptions(kv_timeout=timedelta(seconds=10),
                                                                connect_timeout=timedelta(seconds=10)))
    cluster = Cluster(f"couchbase://127.0.0.1:{server.port}?network=default", opts)
    try:
        coll = cluster.bucket("default").default_collection()
        for i in range(50):
            coll.upsert(f"sdk-{i}", {"i": i})
        coll.remove("sdk-7")
    finally:
        cluster.close()
    msgs = c.quiet(2.0)
    got = items(msgs)
    assert len(got) == 51
    by_vb: dict[int, list[int]] = {}
    for m in got:
        by_vb.setdefault(m.vbucket, []).append(m.by_seqno)
    assert all(s == sorted(s) for s in by_vb.values())
    assert [m.key for m in got if isinstance(m, dcp.DcpDeletion)] == [b"sdk-7"]
    assert {m.key for m in got if isinstance(m, dcp.DcpMutation)} == {f"sdk-{i}".encode() for i in range(50)}
