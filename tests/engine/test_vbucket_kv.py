"""Client KV operations on a VBucket: results, metadata rules and error statuses."""

import dataclasses

import pytest

from dcpflow.engine import DeleteSource, EngineError, VBucketState, vbucket_for_key
from dcpflow.engine.item import NOT_RESIDENT
from dcpflow.protocol.kv import GetResponse
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status


def status_of(fn, *args, **kwargs) -> Status:
    with pytest.raises(EngineError) as exc:
        fn(*args, **kwargs)
    return exc.value.status


def xattr_blob(*pairs: tuple[bytes, bytes]) -> bytes:
    body = b"".join((len(k) + len(v) + 2).to_bytes(4, "big") + k + b"\0" + v + b"\0" for k, v in pairs)
    return len(body).to_bytes(4, "big") + body


def test_vbucket_for_key_matches_the_interop_vector():
    assert vbucket_for_key(b"interop-key-1", 1024) == 590
    assert vbucket_for_key(b"interop-key-1", 64) == 14


def test_set_then_get(bucket):
    vb = bucket.vbucket(0)
    item = vb.set(b"k", b"value", flags=5, datatype=1)
    got = vb.get(b"k")
    assert got == item
    assert (got.value, got.flags, got.datatype, got.by_seqno, got.rev_seqno) == (b"value", 5, 1, 1, 1)
    assert vb.high_seqno == 1 and vb.num_items == 1


def test_every_mutation_gets_next_seqno_higher_cas_and_next_rev(bucket):
    vb = bucket.vbucket(0)
    items = [vb.set(b"k", b"%d" % i) for i in range(5)]
    assert [i.by_seqno for i in items] == [1, 2, 3, 4, 5]
    assert [i.rev_seqno for i in items] == [1, 2, 3, 4, 5]
    assert all(a.cas < b.cas for a, b in zip(items, items[1:], strict=False))
    other = vb.set(b"other", b"v")
    assert other.rev_seqno == 1 and other.by_seqno == 6


def test_get_missing_is_enoent(bucket):
    assert status_of(bucket.vbucket(0).get, b"nope") == Status.KEY_ENOENT


def test_set_with_cas(bucket):
    vb = bucket.vbucket(0)
    first = vb.set(b"k", b"1")
    second = vb.set(b"k", b"2", cas=first.cas)
    assert vb.get(b"k").value == b"2"
    assert status_of(vb.set, b"k", b"3", cas=first.cas) == Status.KEY_EEXISTS
    assert status_of(vb.set, b"missing", b"3", cas=second.cas) == Status.KEY_ENOENT
    assert vb.get(b"k").value == b"2"


def test_add(bucket):
    vb = bucket.vbucket(0)
    vb.add(b"k", b"1")
    assert status_of(vb.add, b"k", b"2") == Status.KEY_EEXISTS
    assert status_of(vb.add, b"new", b"2", cas=5) == Status.EINVAL
    tomb = vb.delete(b"k")
    again = vb.add(b"k", b"3")
    assert again.rev_seqno == tomb.rev_seqno + 1  # rev continues through the tombstone


def test_replace(bucket):
    vb = bucket.vbucket(0)
    assert status_of(vb.replace, b"k", b"1") == Status.KEY_ENOENT
    first = vb.set(b"k", b"1")
    vb.replace(b"k", b"2", cas=first.cas)
    assert status_of(vb.replace, b"k", b"3", cas=first.cas) == Status.KEY_EEXISTS
    vb.delete(b"k")
    assert status_of(vb.replace, b"k", b"4") == Status.KEY_ENOENT


def test_delete_leaves_a_tombstone_with_metadata_and_delete_time(bucket, clock):
    vb = bucket.vbucket(0)
    live = vb.set(b"k", b"body", flags=9)
    tomb = vb.delete(b"k")
    assert tomb.deleted and tomb.delete_source == DeleteSource.EXPLICIT
    assert tomb.delete_time == int(clock.now) and tomb.value == b""
    assert (tomb.by_seqno, tomb.rev_seqno, tomb.flags) == (2, 2, 9) and tomb.cas > live.cas
    assert status_of(vb.get, b"k") == Status.KEY_ENOENT
    assert vb.get_meta(b"k") == tomb and tomb.meta_expiry == tomb.delete_time
    assert vb.num_items == 0 and vb.num_deleted == 1
    assert status_of(vb.delete, b"k") == Status.KEY_ENOENT


def test_delete_with_cas(bucket):
    vb = bucket.vbucket(0)
    first = vb.set(b"k", b"1")
    vb.set(b"k", b"2")
    assert status_of(vb.delete, b"k", cas=first.cas) == Status.KEY_EEXISTS
    assert vb.delete(b"k", cas=vb.get(b"k").cas).deleted


def test_delete_keeps_only_system_xattrs(bucket):
    vb = bucket.vbucket(0)
    value = xattr_blob((b"_sys", b'{"a":1}'), (b"user", b'"u"')) + b'{"doc":1}'
    vb.set(b"k", value, datatype=0x05)
    tomb = vb.delete(b"k")
    assert tomb.value == xattr_blob((b"_sys", b'{"a":1}')) and tomb.datatype == 0x04


def test_touch_and_get_and_touch(bucket, clock):
    vb = bucket.vbucket(0)
    first = vb.set(b"k", b"v", flags=3)
    touched = vb.touch(b"k", 100)
    assert touched.expiry == int(clock.now) + 100 and touched.value == b"v" and touched.flags == 3
    assert touched.by_seqno == 2 and touched.rev_seqno == 2 and touched.cas > first.cas
    gat = vb.get_and_touch(b"k", 0)
    assert gat.value == b"v" and gat.expiry == 0
    assert status_of(vb.touch, b"missing", 1) == Status.KEY_ENOENT
    assert status_of(vb.get_and_touch, b"missing", 1) == Status.KEY_ENOENT


def test_get_meta_missing_is_enoent(bucket):
    assert status_of(bucket.vbucket(0).get_meta, b"nope") == Status.KEY_ENOENT


@pytest.mark.parametrize(("state", "status"), [(VBucketState.REPLICA, Status.NOT_MY_VBUCKET),
                                               (VBucketState.DEAD, Status.NOT_MY_VBUCKET),
                                               (VBucketState.PENDING, Status.ETMPFAIL)])
def test_client_operations_need_an_active_vbucket(bucket, state, status):
    vb = bucket.vbucket(0)
    vb.set(b"k", b"v")
    bucket.set_vbucket_state(0, state)
    for op, args in [(vb.get, (b"k",)), (vb.get_meta, (b"k",)), (vb.set, (b"k", b"v")),
                     (vb.add, (b"n", b"v")), (vb.replace, (b"k", b"v")), (vb.delete, (b"k",)),
                     (vb.touch, (b"k", 1)), (vb.get_and_touch, (b"k", 1))]:
        assert status_of(op, *args) == status, op.__name__
    assert vb.high_seqno == 1


def test_missing_vbucket_is_not_my_vbucket(bucket):
    assert status_of(bucket.vbucket, 3) == Status.NOT_MY_VBUCKET
    assert bucket.get_vbucket(3) is None


def test_set_vbucket_state_out_of_range_is_einval(bucket):
    assert status_of(bucket.set_vbucket_state, 4, VBucketState.ACTIVE) == Status.EINVAL


def test_seqno_listener_is_told_of_every_advance(bucket):
    seen = []
    bucket.add_seqno_listener(lambda vb, seqno: seen.append((vb, seqno)))
    vb = bucket.vbucket(0)
    vb.set(b"a", b"v")
    vb.delete(b"a")
    assert seen == [(0, 1), (0, 2)]
    with pytest.raises(EngineError):
        vb.delete(b"a")
    assert seen == [(0, 1), (0, 2)]


def test_error_carries_status_and_reason(bucket):
    with pytest.raises(EngineError) as exc:
        bucket.vbucket(0).get(b"missing")
    assert exc.value.status == Status.KEY_ENOENT and "missing" in str(exc.value)


def test_op_counters_and_item_counts(bucket):
    vb = bucket.vbucket(0)
    vb.set(b"a", b"1")
    vb.set(b"a", b"2")
    vb.set(b"b", b"1")
    vb.delete(b"b")
    vb.add(b"b", b"again")
    assert (vb.ops_create, vb.ops_update, vb.ops_delete) == (3, 1, 1)
    assert (vb.num_items, vb.num_deleted) == (2, 0)


def general_reply(vb, key, opcode: int, opaque: int, reply_key: bytes, json: bool) -> bytes:
    """The GET reply the general path gives (server/kv.py's _get_reply on VBucket.get's Item), for
    a document with no xattrs and no lock."""
    item = vb.get(key)
    return GetResponse(item.flags, item.value, item.cas, item.datatype if json else 0, reply_key, opaque,
                       opcode=opcode).encode()


def test_get_reply_is_the_general_get_s_reply_or_leaves_the_case_to_it(bucket, clock):
    """VBucket.get_reply packs a GET's reply from the table's record: the same bytes as the general
    path for a live, resident document without expiry, lock or xattrs (JSON or not, GET or GETK,
    with and without the JSON feature, a value inline or referenced), and None - the general path
    answers - for a miss, a tombstone, an expiry, a lock, xattrs, an evicted value and a vbucket
    that is not active."""
    vb = bucket.vbucket(0)
    docs = {b"j": (b'{"a":1}', 1, 0xCAFE), b"raw": (b"\x00bytes", 0, 0), b"big": (b"[" + b"1," * 3000 + b"1]", 1, 7),
            b"empty": (b"", 0, 1), b"k" * 250: (b"v", 0, 0xFFFFFFFF)}
    for key, (value, datatype, flags) in docs.items():
        vb.set(key, value, flags=flags, datatype=datatype)
        for opcode, reply_key in ((Opcode.GET, b""), (Opcode.GET_K, key), (Opcode.GET_KQ, key)):
            for json in (True, False):
                got = vb.get_reply(key, int(opcode), 0xDEADBEEF, reply_key, json)
                assert got == general_reply(vb, key, int(opcode), 0xDEADBEEF, reply_key, json), (key, opcode, json)
    vb.set((8, b"c"), b"in a collection", flags=3)  # the table's collection keys too
    assert vb.get_reply((8, b"c"), 0, 1, b"", True) == general_reply(vb, (8, b"c"), 0, 1, b"", True)

    assert vb.get_reply(b"missing", 0, 1, b"", True) is None
    vb.set(b"ttl", b"v", expiry=100)
    assert vb.get_reply(b"ttl", 0, 1, b"", True) is None  # the clock decides: the general path reads it
    vb.set(b"x", b"\x00\x00\x00\x00body", datatype=0x04)
    assert vb.get_reply(b"x", 0, 1, b"", True) is None  # xattrs are stripped by the general path
    vb.set(b"gone", b"v")
    vb.delete(b"gone")
    assert vb.get_reply(b"gone", 0, 1, b"", True) is None
    vb.get_locked(b"j", 15)
    assert vb.get_reply(b"j", 0, 1, b"", True) is None and vb.get_reply(b"raw", 0, 1, b"", True) is None  # hidden CAS
    vb.unlock(b"j", vb.lock_cas(b"j"))
    assert vb.get_reply(b"j", 0, 1, b"", True) is not None
    vb.ht[b"raw"] = dataclasses.replace(vb.ht[b"raw"], value=NOT_RESIDENT)  # as the item pager leaves it
    assert vb.get_reply(b"raw", 0, 1, b"", True) is None
    bucket.set_vbucket_state(0, VBucketState.REPLICA)
    assert vb.get_reply(b"j", 0, 1, b"", True) is None
