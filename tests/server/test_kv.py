"""KV commands over a real socket: CAS rules, quiet variants, collections, mutation tokens, touch/GAT,
NOT_MY_VBUCKET with the map, SET_VBUCKET, seqno commands, the failover log and persistence."""

import json
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcpflow.protocol import dcp, kv, rules
from dcpflow.protocol.config import parse_cluster_map
from dcpflow.protocol.frame import decode_all, encode_frame_info, request
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.keys import make_key
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .client import REPLY_TIMEOUT, RawClient
from .conftest import held_flush


def token(reply) -> tuple[int, int]:
    return struct.unpack(">QQ", reply.extras)


def test_set_get_roundtrip_with_flags_datatype_and_token(admin):
    r1 = admin.set(b"k", b'{"a":1}', flags=0xCAFE)
    assert r1.status == Status.SUCCESS and r1.cas != 0 and len(r1.extras) == 16
    uuid, seqno = token(r1)
    assert seqno == 1 and uuid != 0
    got = admin.get(b"k")
    assert (got.value, got.cas, got.datatype, got.extras) == (b'{"a":1}', r1.cas, 1, struct.pack(">I", 0xCAFE))
    r2 = admin.set(b"k", b"raw bytes")
    assert token(r2) == (uuid, 2) and r2.cas > r1.cas
    assert admin.get(b"k").datatype == 0
    getk = admin.get(b"k", opcode=Opcode.GET_K)
    assert getk.key == b"k" and getk.value == b"raw bytes"


@pytest.mark.parametrize(("value", "is_json"), [
    (b'{"a":1}', True), (b' {"a":1}', True), (b'{"a":1}\n', True), (b"\t[1, 2]\r\n", True), (b" 12 ", True),
    (b"1" + b"0" * 5000, True), (b"[" + b"9" * 5000 + b"]", True), (b'"x"', True), (b"true", True),
    (b"1e999", True),
    (b"[NaN]", False), (b'{"a":Infinity}', False), (b"-Infinity", False), ("{}".encode("utf-16-le"), False),
    ("[1]".encode("utf-16-le"), False), ('["\u00e9"]'.encode("latin-1"), False), (b'{"a":1', False),
    (b"   ", False), (b"12ab", False), (b"tru", False),
])
def test_json_detection_is_strict_rfc_8259(admin, value, is_json):
    """A value stored without the JSON bit gets it exactly when it is JSON (RFC 8259, UTF-8):
    whitespace around it is allowed; NaN/Infinity, UTF-16 text and truncated documents are not
    JSON; a number of any length is."""
    assert admin.set(b"j", value).status == Status.SUCCESS
    assert admin.get(b"j").datatype == (1 if is_json else 0)


def test_without_mutation_seqno_there_are_no_extras(server):
    with server.client() as c:
        c.login(features=(Feature.XERROR,))
        reply = c.set(b"k", b"[1]")
        assert reply.status == Status.SUCCESS and reply.extras == b""
        assert c.get(b"k").datatype == 0  # JSON was not negotiated, so the bit is not sent


def test_cas_rules(admin):
    first = admin.set(b"k", b"v1")
    assert admin.set(b"k", b"v2", cas=first.cas + 1).status == Status.KEY_EEXISTS
    second = admin.set(b"k", b"v2", cas=first.cas)
    assert second.status == Status.SUCCESS
    assert admin.set(b"k", b"v3", opcode=Opcode.REPLACE, cas=first.cas).status == Status.KEY_EEXISTS
    assert admin.delete(b"k", cas=first.cas).status == Status.KEY_EEXISTS
    assert admin.delete(b"k", cas=second.cas).status == Status.SUCCESS
    assert admin.set(b"k", b"v", cas=second.cas).status == Status.KEY_ENOENT  # CAS on a missing key


def test_add_replace_delete_existence_rules(admin):
    assert admin.set(b"a", b"1", opcode=Opcode.ADD).status == Status.SUCCESS
    assert admin.set(b"a", b"2", opcode=Opcode.ADD).status == Status.KEY_EEXISTS
    assert admin.set(b"missing", b"2", opcode=Opcode.REPLACE).status == Status.KEY_ENOENT
    assert admin.delete(b"missing").status == Status.KEY_ENOENT
    assert admin.get(b"missing").status == Status.KEY_ENOENT
    assert admin.set(b"a", b"3", opcode=Opcode.REPLACE).status == Status.SUCCESS
    assert admin.delete(b"a").status == Status.SUCCESS
    assert admin.set(b"a", b"4", opcode=Opcode.ADD).status == Status.SUCCESS  # a tombstone does not count
    assert admin.set(b"a", b"5", opcode=Opcode.ADD, cas=123).status == Status.EINVAL


def test_quiet_variants_reply_only_when_they_must(admin):
    vb = admin.vbucket_of
    admin.send(b"".join([
        request(Opcode.SET_Q, key=b"q1", extras=bytes(8), value=b"x", vbucket=vb(b"q1"), opaque=1),  # silent
        request(Opcode.ADD_Q, key=b"q1", extras=bytes(8), value=b"x", vbucket=vb(b"q1"), opaque=2),  # EEXISTS
        request(Opcode.GET_Q, key=b"nope", vbucket=vb(b"nope"), opaque=3),  # silent miss
        request(Opcode.GET_KQ, key=b"q1", vbucket=vb(b"q1"), opaque=4),  # hit
        request(Opcode.REPLACE_Q, key=b"nope", extras=bytes(8), value=b"x", vbucket=vb(b"nope"), opaque=5),
        request(Opcode.DELETE_Q, key=b"q1", vbucket=vb(b"q1"), opaque=6),  # silent
        request(Opcode.GAT_Q, key=b"q1", extras=bytes(4), vbucket=vb(b"q1"), opaque=7),  # silent miss now
        request(Opcode.NOOP, opaque=8),
    ]))
    replies = admin.recv_n(4)
    assert [(r.opaque, r.status) for r in replies] == [(2, Status.KEY_EEXISTS), (4, Status.SUCCESS),
                                                       (5, Status.KEY_ENOENT), (8, Status.SUCCESS)]
    assert replies[1].key == b"q1" and replies[1].value == b"x"
    assert admin.get(b"q1").status == Status.KEY_ENOENT


def test_touch_and_gat(admin):
    first = admin.set(b"t", b"body", flags=7)
    touched = admin.call(Opcode.TOUCH, key=b"t", extras=struct.pack(">I", 3600), vbucket=admin.vbucket_of(b"t"))
    assert touched.status == Status.SUCCESS and touched.cas not in (0, first.cas) and touched.value == b""
    gat = admin.call(Opcode.GAT, key=b"t", extras=struct.pack(">I", 7200), vbucket=admin.vbucket_of(b"t"))
    assert gat.status == Status.SUCCESS and gat.value == b"body" and gat.extras == struct.pack(">I", 7)
    assert admin.call(Opcode.TOUCH, key=b"none", extras=bytes(4), vbucket=admin.vbucket_of(b"none")).status \
        == Status.KEY_ENOENT
    meta = admin.call(Opcode.GET_META, key=b"t", vbucket=admin.vbucket_of(b"t"))
    assert meta.cas == gat.cas


def test_collections_default_collection_and_unknown_collection(server):
    with server.client() as c:
        c.login(features=(Feature.COLLECTIONS, Feature.XERROR, Feature.MUTATION_SEQNO))
        assert c.collections
        assert c.set(b"ck", b"in default").status == Status.SUCCESS  # sent as \x00ck
        assert c.get(b"ck").value == b"in default"
        other = c.call(Opcode.GET, key=make_key(b"ck", 8), vbucket=c.vbucket_of(b"ck"))
        assert other.status == Status.UNKNOWN_COLLECTION
        bad = c.call(Opcode.GET, key=b"\x80", vbucket=0)  # truncated LEB128
        assert bad.status == Status.EINVAL
        assert c.call(Opcode.GET, key=b"\x00", vbucket=0).status == Status.EINVAL  # empty key
    with server.client() as plain:
        plain.login()
        assert plain.get(b"ck").value == b"in default"  # the stored key has no prefix


def test_key_length_limit(admin):
    assert admin.set(b"k" * 250, b"v").status == Status.SUCCESS
    assert admin.set(b"k" * 251, b"v").status == Status.EINVAL


def test_preserve_ttl(server):
    with server.client() as c:
        c.login(features=(Feature.XERROR, Feature.ALT_REQUEST_SUPPORT, Feature.PRESERVE_TTL))
        c.set(b"ttl", b"v1", expiry=3600)
        before = kv_meta(c, b"ttl")["expiry"]
        c.set(b"ttl", b"v2", framing=encode_frame_info(5))
        assert kv_meta(c, b"ttl")["expiry"] == before
        c.set(b"ttl", b"v3")
        assert kv_meta(c, b"ttl")["expiry"] == 0


def kv_meta(c: RawClient, key: bytes) -> dict:
    from dcpflow.protocol.meta import GetMetaResponse
    return GetMetaResponse.from_frame(c.call(Opcode.GET_META, key=key, vbucket=c.vbucket_of(key)))._asdict()


def test_durability_frames_are_refused(server):
    with server.client() as c:
        c.login(features=(Feature.XERROR, Feature.ALT_REQUEST_SUPPORT))
        reply = c.set(b"d", b"v", framing=encode_frame_info(1, b"\x01"))
        assert reply.status == Status.DURABILITY_IMPOSSIBLE
        assert c.set(b"d", b"v", framing=encode_frame_info(1, b"\x09")).status == Status.DURABILITY_INVALID_LEVEL
        assert c.get(b"d").status == Status.KEY_ENOENT


def test_not_my_vbucket_carries_the_map(server):
    with server.client() as c:
        c.login()
        assert c.call(Opcode.SET_VBUCKET, extras=b"\x02", vbucket=5).status == Status.SUCCESS  # -> replica
        reply = c.set(b"x", b"v", vbucket=5)
        assert reply.status == Status.NOT_MY_VBUCKET and reply.datatype == 1
        cmap = parse_cluster_map(reply.value, host="127.0.0.1")
        assert cmap.vbucket_map[5] == (-1,) and cmap.vbucket_map[4] == (0,)
        assert c.get(b"x", vbucket=5).status == Status.NOT_MY_VBUCKET
        assert c.get(b"x", vbucket=999).status == Status.NOT_MY_VBUCKET  # not a vbucket of this bucket
        # the bucket config shows the change with a newer revision
        assert json.loads(c.call(Opcode.GET_CLUSTER_CONFIG).value)["vBucketServerMap"]["vBucketMap"][5] == [-1]
        assert c.call(Opcode.SET_VBUCKET, extras=b"\x03", vbucket=5).status == Status.SUCCESS  # pending
        assert c.set(b"x", b"v", vbucket=5).status == Status.ETMPFAIL
        assert c.call(Opcode.SET_VBUCKET, extras=b"\x01", vbucket=5).status == Status.SUCCESS
        assert c.set(b"x", b"v", vbucket=5).status == Status.SUCCESS
        assert c.call(Opcode.SET_VBUCKET, extras=b"\x07", vbucket=5).status == Status.EINVAL
        assert c.call(Opcode.GET_VBUCKET, vbucket=5).value == b"\x00\x00\x00\x01"


def test_set_vbucket_replies_once_the_new_state_is_on_disk(server):
    """A flush batch being written carries the vbucket's older state row: SET_VBUCKET answers only
    after that batch, with its own row written (kill -9 right after the reply keeps the change)."""
    engine = server.server.buckets["default"].engine
    with held_flush(engine) as (entered, release), server.login() as c:
        c.set(b"x", b"v", vbucket=5)
        assert entered.wait(10)  # the batch holding vbucket 5's state row is being written
        c.send(request(Opcode.SET_VBUCKET, extras=b"\x02", vbucket=5, opaque=77))
        c.sock.settimeout(0.3)
        try:
            early = c.recv()
        except TimeoutError:
            early = None
        finally:
            c.sock.settimeout(REPLY_TIMEOUT)
        stored = server.call(lambda: engine.store.load_vbucket_states()[5].state)
        assert early is None, f"replied while the state on disk was {stored}"
        release.set()
        reply = c.recv()
        assert reply.status == Status.SUCCESS and reply.opaque == 77
        assert server.call(lambda: engine.store.load_vbucket_states()[5].state) == dcp.VBucketState.REPLICA


def test_dedupe_not_my_vbucket_clustermap(server):
    with server.client() as c:
        c.login(features=(Feature.XERROR, Feature.DEDUPE_NOT_MY_VBUCKET_CLUSTERMAP))
        c.call(Opcode.SET_VBUCKET, extras=b"\x02", vbucket=6)
        assert c.set(b"x", b"v", vbucket=6).value != b""  # the client has never seen a map
        deduped = c.set(b"x", b"v", vbucket=6)
        assert deduped.status == Status.NOT_MY_VBUCKET and deduped.value == b""
        c.call(Opcode.SET_VBUCKET, extras=b"\x04", vbucket=7)  # a newer map exists now
        assert c.set(b"x", b"v", vbucket=6).value != b""


def test_dedupe_knows_only_the_selected_buckets_map(make_server):
    """The known configuration is the selected bucket's map (BinaryProtocol.md #0xb5): the
    cluster-level map (no vbuckets) and another bucket's map do not count, and GET_CLUSTER_CONFIG
    naming the current version records it."""
    srv = make_server(buckets=("default", "other"))
    features = (Feature.XERROR, Feature.DEDUPE_NOT_MY_VBUCKET_CLUSTERMAP)
    with srv.client() as c:
        c.login(features=features, bucket=None)
        assert b"vBucketMap" not in c.call(Opcode.GET_CLUSTER_CONFIG).value  # the cluster-level map
        assert c.select("default").status == Status.SUCCESS
        c.call(Opcode.SET_VBUCKET, extras=b"\x02", vbucket=6)
        assert b"vBucketMap" in c.set(b"x", b"v", vbucket=6).value  # never had this bucket's map
        assert c.set(b"x", b"v", vbucket=6).value == b""
        assert c.select("other").status == Status.SUCCESS
        c.call(Opcode.SET_VBUCKET, extras=b"\x02", vbucket=6)
        config = c.call(Opcode.GET_CLUSTER_CONFIG).value  # other's map, so the client knows its version
        rev = json.loads(config)["rev"]
        epoch = json.loads(config).get("revEpoch", 0)
        assert c.select("default").status == Status.SUCCESS  # back: the map it holds is other's
        assert b"vBucketMap" in c.set(b"x", b"v", vbucket=6).value
        c.select("other")
        known = c.call(Opcode.GET_CLUSTER_CONFIG, extras=struct.pack(">qq", epoch, rev))
        assert known.status == Status.SUCCESS and known.value == b""  # current: recorded, nothing sent
        assert c.set(b"x", b"v", vbucket=6).value == b""


def test_get_meta_of_a_locked_document_hides_its_cas(admin):
    """Document.md: a locked document's CAS is -1 to everyone but the locker, GET_META included (the
    SDK's exists()); the lock's CAS would let any client replace the document."""
    admin.set(b"locked", b"v")
    lock = admin.call(Opcode.GET_LOCKED, key=b"locked", extras=struct.pack(">I", 10),
                      vbucket=admin.vbucket_of(b"locked"))
    assert lock.status == Status.SUCCESS
    meta = admin.call(Opcode.GET_META, key=b"locked", extras=b"\x02", vbucket=admin.vbucket_of(b"locked"))
    assert meta.status == Status.SUCCESS and meta.cas == 0xFFFF_FFFF_FFFF_FFFF
    assert admin.call(Opcode.UNLOCK_KEY, key=b"locked", cas=lock.cas, vbucket=admin.vbucket_of(b"locked")).status \
        == Status.SUCCESS
    meta = admin.call(Opcode.GET_META, key=b"locked", extras=b"\x02", vbucket=admin.vbucket_of(b"locked"))
    assert meta.cas == lock.cas  # unlocked: the real CAS again


def test_get_all_vb_seqnos_with_filters(admin):
    for i in range(20):
        admin.set(b"s%d" % i, b"v")
    admin.call(Opcode.SET_VBUCKET, extras=b"\x02", vbucket=1)
    admin.call(Opcode.SET_VBUCKET, extras=b"\x04", vbucket=2)
    every = kv.GetAllVbSeqnosResponse.from_frame(admin.call(Opcode.GET_ALL_VB_SEQNOS)).as_dict()
    assert sorted(every) == [v for v in range(64) if v != 2]  # alive: not the dead one
    assert sum(every.values()) == 20
    expected = {}
    for i in range(20):
        vb = admin.vbucket_of(b"s%d" % i)
        expected[vb] = expected.get(vb, 0) + 1
    assert {vb: s for vb, s in every.items() if s} == expected
    active = kv.GetAllVbSeqnosResponse.from_frame(admin.call(Opcode.GET_ALL_VB_SEQNOS, extras=b"\x00\x00\x00\x01"))
    assert 1 not in active.as_dict() and 2 not in active.as_dict() and len(active.seqnos) == 62
    replica = admin.call(Opcode.GET_ALL_VB_SEQNOS, extras=struct.pack(">I", 2))
    assert kv.GetAllVbSeqnosResponse.from_frame(replica).seqnos == ((1, every[1]),)
    with_cid = admin.call(Opcode.GET_ALL_VB_SEQNOS, extras=struct.pack(">II", 1, 0))
    assert kv.GetAllVbSeqnosResponse.from_frame(with_cid).as_dict() == active.as_dict()
    assert admin.call(Opcode.GET_ALL_VB_SEQNOS, extras=struct.pack(">II", 1, 9)).status == Status.UNKNOWN_COLLECTION
    assert admin.call(Opcode.GET_ALL_VB_SEQNOS, extras=struct.pack(">I", 9)).status == Status.EINVAL


def test_failover_log_and_observe_seqno(admin):
    vb = admin.vbucket_of(b"f")
    r = admin.set(b"f", b"v")
    uuid, seqno = token(r)
    log = dcp.FailoverLogResponse.from_frame(admin.call(Opcode.GET_FAILOVER_LOG, vbucket=vb))
    assert log.entries == ((uuid, 0),)
    observed = kv.ObserveSeqnoResponse.from_frame(admin.call(Opcode.OBSERVE_SEQNO, vbucket=vb,
                                                             value=struct.pack(">Q", uuid)))
    assert (observed.vbucket, observed.vbucket_uuid, observed.current_seqno) == (vb, uuid, seqno)
    assert not observed.failed_over
    # replica -> active: a new branch of history; the old uuid is reported with format 1
    admin.call(Opcode.SET_VBUCKET, extras=b"\x02", vbucket=vb)
    admin.call(Opcode.SET_VBUCKET, extras=b"\x01", vbucket=vb)
    log = dcp.FailoverLogResponse.from_frame(admin.call(Opcode.GET_FAILOVER_LOG, vbucket=vb))
    assert [s for _, s in log.entries] == [seqno, 0] and log.entries[1][0] == uuid
    old = kv.ObserveSeqnoResponse.from_frame(admin.call(Opcode.OBSERVE_SEQNO, vbucket=vb,
                                                        value=struct.pack(">Q", uuid)))
    assert old.failed_over and (old.old_vbucket_uuid, old.last_received_seqno) == (uuid, seqno)
    assert old.vbucket_uuid == log.entries[0][0]
    unknown = admin.call(Opcode.OBSERVE_SEQNO, vbucket=vb, value=struct.pack(">Q", 12345))
    assert unknown.status == Status.KEY_ENOENT
    assert admin.call(Opcode.GET_FAILOVER_LOG, vbucket=4000).status == Status.NOT_MY_VBUCKET


def test_seqno_persistence_waits_for_the_flusher(admin):
    reply = admin.set(b"p", b"v")
    vb = admin.vbucket_of(b"p")
    _, seqno = token(reply)
    assert admin.call(Opcode.SEQNO_PERSISTENCE, extras=struct.pack(">Q", seqno), vbucket=vb).status \
        == Status.SUCCESS
    observed = kv.ObserveSeqnoResponse.from_frame(admin.call(Opcode.OBSERVE_SEQNO, vbucket=vb,
                                                             value=struct.pack(">Q", token(reply)[0])))
    assert observed.last_persisted_seqno >= seqno
    assert admin.call(Opcode.SEQNO_PERSISTENCE, extras=struct.pack(">Q", seqno + 5), vbucket=vb).status \
        == Status.ERANGE


def test_seqno_persistence_keeps_replies_in_order(admin):
    """A waiting SEQNO_PERSISTENCE holds back the replies of the requests pipelined behind it."""
    admin.call(Opcode.STOP_PERSISTENCE)
    reply = admin.set(b"held", b"v")
    vb = admin.vbucket_of(b"held")
    admin.send(request(Opcode.SEQNO_PERSISTENCE, extras=struct.pack(">Q", token(reply)[1]), vbucket=vb, opaque=1)
               + request(Opcode.NOOP, opaque=2))
    with RawClient(admin.sock.getpeername()[1]) as other:
        other.login()
        assert other.call(Opcode.START_PERSISTENCE).status == Status.SUCCESS
    assert [(r.opaque, r.status) for r in admin.recv_n(2)] == [(1, Status.SUCCESS), (2, Status.SUCCESS)]


def test_persistence_control_is_admin_only(server):
    with server.client() as c:
        c.login(user="full", password="fullpw")
        assert c.call(Opcode.STOP_PERSISTENCE).status == Status.EACCESS
        assert c.call(Opcode.SET_VBUCKET, extras=b"\x02", vbucket=1).status == Status.EACCESS


@pytest.mark.parametrize("opcode", [Opcode.SET, Opcode.DELETE, Opcode.GET])
def test_big_values_and_bad_datatypes(admin, opcode):
    if opcode == Opcode.SET:
        assert admin.set(b"dt", b"v", datatype=0x02).status == Status.EINVAL  # Snappy not negotiated
        assert admin.set(b"dt", b"v", datatype=0x04).status == Status.EINVAL  # Xattr not negotiated
        assert admin.set(b"dt", b"v", datatype=0x80).status == Status.EINVAL  # unknown bit
    elif opcode == Opcode.DELETE:
        assert admin.call(Opcode.DELETE, key=b"dt", extras=b"1234", vbucket=0).status == Status.EINVAL
    else:
        assert admin.call(Opcode.GET, key=b"", vbucket=0).status == Status.EINVAL


def test_xattr_values_are_stripped_on_get(server):
    from dcpflow.protocol.datatype import join_xattrs
    with server.client() as c:
        c.login(features=(Feature.XERROR, Feature.XATTR, Feature.JSON))
        value = join_xattrs({"_sys": '{"a":1}'}, b'{"body":true}')
        assert c.set(b"xa", value, datatype=0x05).status == Status.SUCCESS
        got = c.get(b"xa")
        assert got.value == b'{"body":true}' and got.datatype == 0x01
        assert c.set(b"xb", b"\x00\x00\x00\x09abc", datatype=0x04).status == Status.XATTR_EINVAL


def _raw_xattrs(*pairs: tuple[bytes, bytes]) -> bytes:
    section = b"".join(struct.pack(">I", len(k) + len(v) + 2) + k + b"\x00" + v + b"\x00" for k, v in pairs)
    return struct.pack(">I", len(section)) + section + b"{}"


@pytest.mark.parametrize(("pairs", "ok"), [
    (((b"user", b'{"a":1}'), (b"_sync", b'"x"'), (b"x]y", b"1"), (b"k" * 15, b"null")), True),
    (((b"user", b"not json"),), False),
    (((b"user", b"NaN"),), False),
    (((b"#tag", b"1"),), False),
    (((b"\x01ctl", b"1"),), False),
    (((b"a.b", b"1"),), False),
    (((b"a[0", b"1"),), False),
    (((b"", b"1"),), False),
    (((b"k" * 16, b"1"),), False),
    (((b"_", b"1"),), False),
    (((b"$document", b"{}"),), False),
    (((b"\xff\xfe", b"1"),), False),
    (((b"dup", b"1"), (b"dup", b"2")), False),
])
def test_stored_xattrs_follow_the_key_and_value_rules(server, pairs, ok):
    """ExtendedAttributes.md: keys of 1-15 bytes, no reserved first character, not '_' alone, no '$'
    (virtual, read-only), no '.' or '[', each once; values are JSON. Anything else is XATTR_EINVAL."""
    with server.client() as c:
        c.login(features=(Feature.XERROR, Feature.XATTR, Feature.JSON))
        reply = c.set(b"xv", _raw_xattrs(*pairs), datatype=0x05)
        assert reply.status == (Status.SUCCESS if ok else Status.XATTR_EINVAL)


def incr(c: RawClient, key: bytes, delta: int = 1, initial: int = 0, expiry: int = 0, opcode=Opcode.INCREMENT,
         cas: int = 0):
    return c.call(opcode, key=key, extras=struct.pack(">QQI", delta, initial, expiry), vbucket=c.vbucket_of(key),
                  cas=cas)


def test_increment_and_decrement(admin):
    assert incr(admin, b"n", expiry=0xFFFFFFFF).status == Status.KEY_ENOENT  # no create
    first = incr(admin, b"n", delta=5, initial=10)
    assert first.status == Status.SUCCESS and struct.unpack(">Q", first.value)[0] == 10 and len(first.extras) == 16
    assert struct.unpack(">Q", incr(admin, b"n", delta=5).value)[0] == 15
    assert struct.unpack(">Q", incr(admin, b"n", delta=100, opcode=Opcode.DECREMENT).value)[0] == 0  # floors at 0
    admin.set(b"n", b"18446744073709551615")
    assert struct.unpack(">Q", incr(admin, b"n", delta=2).value)[0] == 1  # wraps
    got = admin.get(b"n")
    assert got.value == b"1" and got.datatype == 1
    assert incr(admin, b"n", cas=got.cas + 1).status == Status.KEY_EEXISTS
    admin.set(b"text", b"abc")
    assert incr(admin, b"text").status == Status.DELTA_BADVAL
    admin.send(request(Opcode.INCREMENT_Q, key=b"n", extras=struct.pack(">QQI", 1, 0, 0),
                       vbucket=admin.vbucket_of(b"n"), opaque=1) + request(Opcode.NOOP, opaque=2))
    assert admin.recv().opaque == 2
    assert admin.get(b"n").value == b"2"


def test_append_and_prepend(admin):
    def concat(opcode, key, value, cas=0):
        return admin.call(opcode, key=key, value=value, vbucket=admin.vbucket_of(key), cas=cas)
    assert concat(Opcode.APPEND, b"missing", b"x").status == Status.NOT_STORED
    first = admin.set(b"s", b"middle", flags=3)
    assert concat(Opcode.APPEND, b"s", b"-end").status == Status.SUCCESS
    assert concat(Opcode.PREPEND, b"s", b"start-").status == Status.SUCCESS
    got = admin.get(b"s")
    assert got.value == b"start-middle-end" and got.extras == struct.pack(">I", 3)
    assert concat(Opcode.APPEND, b"s", b"!", cas=first.cas).status == Status.KEY_EEXISTS


def test_collection_lookups(admin):
    manifest = json.loads(admin.call(Opcode.COLLECTIONS_GET_MANIFEST).value)
    assert manifest["scopes"][0]["collections"] == [{"name": "_default", "uid": "0"}]
    for path in (b"_default._default", b".", b"._default", b"_default."):
        reply = admin.call(Opcode.COLLECTIONS_GET_ID, value=path)
        assert reply.status == Status.SUCCESS and reply.extras == struct.pack(">QI", 0, 0), path
    unknown = admin.call(Opcode.COLLECTIONS_GET_ID, value=b"_default.beers")
    assert unknown.status == Status.UNKNOWN_COLLECTION and json.loads(unknown.value)["manifest_uid"] == "0"
    assert admin.call(Opcode.COLLECTIONS_GET_ID, value=b"app.beers").status == Status.UNKNOWN_SCOPE
    assert admin.call(Opcode.COLLECTIONS_GET_ID, value=b"no-dot").status == Status.EINVAL
    assert admin.call(Opcode.COLLECTIONS_GET_SCOPE_ID, value=b"_default").extras == struct.pack(">QI", 0, 0)
    assert admin.call(Opcode.COLLECTIONS_GET_SCOPE_ID, value=b"app").status == Status.UNKNOWN_SCOPE


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(opcode=st.sampled_from([Opcode.GET, Opcode.GET_K, Opcode.SET, Opcode.ADD, Opcode.REPLACE_Q]),
       extras=st.binary(max_size=10), key=st.binary(max_size=4), value=st.binary(max_size=4),
       datatype=st.sampled_from([0, 1]))
def test_fast_paths_accept_exactly_what_the_rules_accept(admin, opcode, extras, key, value, datatype):
    """GET and SET skip the typed decoder for the common shape: the server must still answer EINVAL
    for exactly the frames the protocol's rules reject."""
    frame_bytes = request(opcode, key=key, extras=extras, value=value, datatype=datatype, opaque=5)
    frame = decode_all(frame_bytes)[0]
    admin.send(frame_bytes + request(Opcode.NOOP, opaque=6))
    reply = admin.recv()
    if reply.opaque == 6:  # a quiet success: nothing but the NOOP came back
        assert not rules.problems(frame)
        return
    admin.recv()
    assert (reply.status == Status.EINVAL) == bool(rules.problems(frame)), (frame, reply)
