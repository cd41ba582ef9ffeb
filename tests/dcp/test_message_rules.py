"""What the stream messages carry, without a socket: the rules tests/dcp/test_messages.py checks
over a server, asserted on the messages a DcpProducer's send passes return (decoded), over
the real engine. MUTATION fields, DELETION V1/V2, EXPIRATION (only with the expiry opcode *and*
delete times: `enable_expiry_opcode` alone is accepted and does nothing, erratum 13), xattrs kept
or stripped, the NoValue variants, SkipDeletesInInitialBackfill and SEQNO_ADVANCED."""

import time

import pytest

from dcpflow.dcp.producer import Started
from dcpflow.protocol import dcp
from dcpflow.protocol.datatype import Datatype, join_xattrs
from dcpflow.protocol.dcp import OpenFlag

from .sansio import drain, engine_fixture, fill, items, markers, producer, request, to_disk_only

P = OpenFlag.PRODUCER


engine = engine_fixture(4)


def stream(engine, flags=P, *, start=0, end=1, uuid=0, collections=False, opaque=1, name="t", **controls):
    """Everything one stream of a new connection sends, decoded."""
    p = producer(engine, flags, name=name)
    for key, value in controls.items():
        p.control(key, value, now=100.0, collections=collections)
    out = p.stream_request(request(0, start, end, uuid, opaque=opaque), collections=collections)
    assert isinstance(out, Started), out
    return drain(p)


def test_mutation_fields(engine):
    engine.vbucket(0).set(b"key", b'{"a":1}', flags=0xCAFE, expiry=3600, datatype=int(Datatype.JSON))
    doc = engine.vbucket(0).ht[b"key"]
    (m,) = items(stream(engine))
    assert isinstance(m, dcp.DcpMutation)
    assert (m.key, m.value, m.flags, m.expiration, m.cas, m.rev_seqno, m.by_seqno, m.datatype) == \
        (b"key", b'{"a":1}', 0xCAFE, doc.expiry, doc.cas, doc.rev_seqno, 1, Datatype.JSON)
    assert m.lock_time == 0 and m.nru == 0


@pytest.mark.parametrize("collections", [False, True])
def test_backfill_sends_what_memory_sends(engine, collections):
    """Mutations backfilled from disk (pages SQLite encodes, engine/store.py) carry exactly the
    fields, key layout and opaque that the same mutations carry when memory serves them."""
    keys = fill(engine, 0, 40)
    engine.vbucket(0).set(keys[3], b'{"v":2}', flags=7, expiry=4000, datatype=int(Datatype.JSON))
    ctl = {"enable_noop": "true"}

    def fields(msgs):
        assert [type(m) for m in msgs[:1]] == [dcp.DcpSnapshotMarker]
        return [(m.key, m.value, m.by_seqno, m.rev_seqno, m.cas, m.flags, m.expiration, m.datatype, m.opaque)
                for m in items(msgs)]

    from_memory = fields(stream(engine, end=41, collections=collections, opaque=0x1234, name="memory", **ctl))
    to_disk_only(engine, 0)
    from_disk = fields(stream(engine, end=41, collections=collections, opaque=0xABCDEF01, name="disk", **ctl))
    assert len(from_disk) == 40  # de-duplicated: the first version of keys[3] is gone on disk
    prefix = b"\x00" if collections else b""
    assert [m[0] for m in from_disk] == [prefix + k for k in keys if k != keys[3]] + [prefix + keys[3]]
    assert {m[8] for m in from_disk} == {0xABCDEF01}
    assert [m[:8] for m in from_disk] == [m[:8] for m in from_memory if m[2] != 4]


def deleted_doc(engine):
    engine.vbucket(0).set(b"del", b"v")
    engine.vbucket(0).delete(b"del")
    return engine.vbucket(0).ht[b"del"]


def test_deletion_v1_without_delete_times(engine):
    tomb = deleted_doc(engine)
    (m,) = items(stream(engine, end=2))
    assert isinstance(m, dcp.DcpDeletion) and m.delete_time is None  # 18-byte extras
    assert (m.key, m.by_seqno, m.cas, m.rev_seqno, m.value) == (b"del", 2, tomb.cas, tomb.rev_seqno, b"")


@pytest.mark.parametrize("disk", [False, True])
def test_deletion_v2_with_delete_times(engine, disk):
    tomb = deleted_doc(engine)
    if disk:
        to_disk_only(engine, 0)
    (m,) = items(stream(engine, P | OpenFlag.INCLUDE_DELETE_TIMES, end=2))
    assert isinstance(m, dcp.DcpDeletion) and m.delete_time == tomb.delete_time > 0


def expired_doc(engine):
    engine.vbucket(0).set(b"exp", b"v", expiry=1)  # relative: one second
    engine.run_expiry_pager(now=time.time() + 5)
    return engine.vbucket(0).ht[b"exp"]


def test_expiration_with_expiry_opcode_and_delete_times(engine):
    tomb = expired_doc(engine)
    (m,) = items(stream(engine, P | OpenFlag.INCLUDE_DELETE_TIMES, end=2, enable_expiry_opcode="true"))
    assert isinstance(m, dcp.DcpExpiration)
    assert (m.key, m.by_seqno, m.delete_time) == (b"exp", 2, tomb.delete_time)


def test_expiry_opcode_without_delete_times_sends_a_deletion(engine):
    expired_doc(engine)
    (m,) = items(stream(engine, end=2, enable_expiry_opcode="true"))  # accepted, stays off (erratum 13)
    assert isinstance(m, dcp.DcpDeletion) and m.delete_time is None


def test_expiration_without_the_control_is_a_deletion(engine):
    expired_doc(engine)
    (m,) = items(stream(engine, P | OpenFlag.INCLUDE_DELETE_TIMES, end=2))
    assert isinstance(m, dcp.DcpDeletion) and m.delete_time is not None


BODY = b'{"b":2}'
XVALUE = join_xattrs({"_sys": '{"s":1}', "user": '"u"'}, BODY)


@pytest.fixture
def xattr_doc(engine):
    engine.vbucket(0).set(b"x", XVALUE, datatype=int(Datatype.XATTR | Datatype.JSON))


@pytest.mark.parametrize("flags,value,datatype", [
    (P, BODY, Datatype.JSON),  # stripped without IncludeXattrs
    (P | OpenFlag.INCLUDE_XATTRS, XVALUE, Datatype.XATTR | Datatype.JSON),  # kept with it
    (P | OpenFlag.NO_VALUE, b"", 0),  # the datatype describes what is sent
    (P | OpenFlag.NO_VALUE | OpenFlag.INCLUDE_XATTRS, XVALUE[:len(XVALUE) - len(BODY)], Datatype.XATTR),
    (P | OpenFlag.NO_VALUE_WITH_UNDERLYING_DATATYPE, b"", Datatype.JSON),  # the document's, xattrs not sent
])
def test_value_shapes(engine, xattr_doc, flags, value, datatype):
    (m,) = items(stream(engine, flags, enable_noop="true"))
    assert (m.value, m.datatype) == (value, datatype)


def test_deletion_keeps_system_xattrs_only_with_include_xattrs(engine, xattr_doc):
    engine.vbucket(0).delete(b"x")
    (m,) = items(stream(engine, P | OpenFlag.INCLUDE_XATTRS, end=2, enable_noop="true"))
    assert isinstance(m, dcp.DcpDeletion) and m.datatype == Datatype.XATTR
    assert m.value == join_xattrs({"_sys": '{"s":1}'}, b"")
    (m,) = items(stream(engine, end=2, name="plain"))
    assert (m.value, m.datatype) == (b"", 0)


def test_skip_deletes_in_initial_backfill_with_seqno_advanced(engine):
    keys = fill(engine, 0, 3)
    engine.vbucket(0).delete(keys[2])  # 4: the last item of the disk snapshot is a tombstone
    to_disk_only(engine, 0)
    msgs = stream(engine, P | OpenFlag.SKIP_DELETES_IN_INITIAL_BACKFILL, end=4, collections=True,
                  enable_noop="true")
    assert [m.by_seqno for m in items(msgs)] == [1, 2]
    adv = [m for m in msgs if isinstance(m, dcp.DcpSeqnoAdvanced)]
    assert [a.by_seqno for a in adv] == [4]  # the consumer learns it reached the snapshot end
    # a backfill that does not start at 0 sends the tombstone
    msgs = stream(engine, P | OpenFlag.SKIP_DELETES_IN_INITIAL_BACKFILL, start=2, end=4,
                  uuid=engine.vbucket(0).uuid, name="d")
    assert [m.by_seqno for m in items(msgs)] == [4]


def test_seqno_advanced_only_for_collection_aware_consumers(engine):
    keys = fill(engine, 0, 3)
    engine.vbucket(0).delete(keys[2])
    to_disk_only(engine, 0)
    msgs = stream(engine, P | OpenFlag.SKIP_DELETES_IN_INITIAL_BACKFILL, end=4)
    assert not [m for m in msgs if isinstance(m, dcp.DcpSeqnoAdvanced)]
    assert markers(msgs)[0].end_seqno == 4
