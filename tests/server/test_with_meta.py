"""GET_META and SET/ADD/DEL_WITH_META end to end (KV-Engine's set_with_meta.md, del_with_meta.md and
get_meta.md, https://github.com/couchbase/kv_engine/tree/master/engines/ep/docs/protocol): options,
conflict resolution, bucket-mode rules, quiet variants, malformed extras."""

import struct

import pytest

from dcpflow.engine.expiry import RELATIVE_EXPIRY_LIMIT
from dcpflow.protocol.datatype import join_xattrs
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.meta import DelWithMeta, GetMeta, GetMetaResponse, SetWithMeta, WithMetaOption
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

FORCE, ACCEPT, REGEN = WithMetaOption.FORCE_WITH_META_OP, WithMetaOption.FORCE_ACCEPT_WITH_META_OPS, \
    WithMetaOption.REGENERATE_CAS
SKIP, EXPIRE = WithMetaOption.SKIP_CONFLICT_RESOLUTION, WithMetaOption.IS_EXPIRATION
REMOTE_CAS = 1_700_000_000 * 10**9 + (5 << 16)


@pytest.fixture
def xdcr(server):
    """A replication_target user (META_WRITE) with MutationSeqno, Xattr and XERROR."""
    with server.client() as c:
        c.login(user="xdcr", password="xdcrpw",
                features=(Feature.XERROR, Feature.MUTATION_SEQNO, Feature.XATTR, Feature.JSON))
        yield c


def swm(c, key: bytes, value: bytes = b"v", **kw):
    kw.setdefault("vbucket", c.vbucket_of(key))
    c.send(SetWithMeta(key, value, opaque=c.next_opaque(), **kw).encode())
    return c.recv()


def dwm(c, key: bytes, **kw):
    kw.setdefault("vbucket", c.vbucket_of(key))
    c.send(DelWithMeta(key, opaque=c.next_opaque(), **kw).encode())
    return c.recv()


def get_meta(c, key: bytes, version: int | None = 2) -> GetMetaResponse:
    c.send(GetMeta(key, version, c.vbucket_of(key), c.next_opaque()).encode())
    return GetMetaResponse.from_frame(c.recv())


def test_set_with_meta_stores_the_metadata_and_get_meta_reads_it(xdcr):
    reply = swm(xdcr, b"m", b'{"x":1}', flags=7, expiration=2_000_000_000, rev_seqno=42, meta_cas=REMOTE_CAS,
                datatype=1)
    assert reply.status == Status.SUCCESS and reply.cas == REMOTE_CAS and len(reply.extras) == 16
    meta = get_meta(xdcr, b"m")
    assert (meta.deleted, meta.flags, meta.expiry, meta.rev_seqno, meta.cas, meta.datatype) == (
        0, 7, 2_000_000_000, 42, REMOTE_CAS, 1)
    assert get_meta(xdcr, b"m", version=None).datatype is None
    assert xdcr.get(b"m").value == b'{"x":1}'


@pytest.mark.parametrize("opcode", [Opcode.SET_WITH_META, Opcode.ADD_WITH_META], ids=lambda op: op.name)
def test_with_meta_expiration_is_absolute_even_when_small(server, xdcr, opcode):
    """set_with_meta.md, Extras: "Expiration: Encoded as seconds since unix epoch. Does not support
    'relative' expiration." A plain SET reads an exptime of up to 30 days as relative to now; the
    same number in a *WithMeta write is a moment of January 1970, long past: the document is
    stored already expired, so GET misses it and GET_META finds its expiration's tombstone."""
    with server.login() as admin:
        assert admin.set(b"plain", b"v", expiry=RELATIVE_EXPIRY_LIMIT).status == Status.SUCCESS
        assert admin.get(b"plain").status == Status.SUCCESS  # relative: 30 days from now
    for i, expiration in enumerate((RELATIVE_EXPIRY_LIMIT, 86_400, 1)):
        key = b"exp%d-%x" % (i, opcode)
        reply = swm(xdcr, key, expiration=expiration, rev_seqno=1, meta_cas=REMOTE_CAS, opcode=opcode)
        assert reply.status == Status.SUCCESS, expiration
        assert xdcr.get(key).status == Status.KEY_ENOENT, expiration
        assert get_meta(xdcr, key).deleted == 1, expiration


def test_conflict_resolution_on_rev_seqno_bucket(xdcr):
    assert swm(xdcr, b"c", rev_seqno=10, meta_cas=REMOTE_CAS).status == Status.SUCCESS
    assert swm(xdcr, b"c", rev_seqno=9, meta_cas=REMOTE_CAS + 9).status == Status.KEY_EEXISTS
    assert swm(xdcr, b"c", rev_seqno=10, meta_cas=REMOTE_CAS).status == Status.KEY_EEXISTS  # identical
    assert swm(xdcr, b"c", b"win", rev_seqno=11, meta_cas=1).status == Status.SUCCESS
    assert xdcr.get(b"c").value == b"win"
    # skipping conflict resolution stores a losing version
    assert swm(xdcr, b"c", b"old", rev_seqno=1, meta_cas=5, options=SKIP).status == Status.SUCCESS
    assert swm(xdcr, b"c", b"older", rev_seqno=0, meta_cas=4, options=FORCE).status == Status.SUCCESS
    assert get_meta(xdcr, b"c").rev_seqno == 0


def test_options_and_bucket_mode_rules(xdcr):
    assert swm(xdcr, b"o", rev_seqno=1, meta_cas=REMOTE_CAS, options=ACCEPT).status == Status.EINVAL
    assert swm(xdcr, b"o", rev_seqno=1, meta_cas=REMOTE_CAS, options=REGEN).status == Status.EINVAL
    assert swm(xdcr, b"o", rev_seqno=1, meta_cas=REMOTE_CAS, options=0x40).status == Status.EINVAL
    assert swm(xdcr, b"o", rev_seqno=1, meta_cas=0).status == Status.EINVAL  # the source CAS is required
    assert swm(xdcr, b"o", rev_seqno=1, meta_cas=REMOTE_CAS, options=EXPIRE).status == Status.EINVAL
    regen = swm(xdcr, b"o", rev_seqno=1, meta_cas=REMOTE_CAS, options=REGEN | SKIP)
    assert regen.status == Status.SUCCESS and regen.cas not in (0, REMOTE_CAS)


def test_lww_bucket_requires_force_accept(make_server):
    server = make_server(conflict_resolution="lww")
    with server.client() as c:
        c.login(user="xdcr", password="xdcrpw", features=(Feature.XERROR,))
        reply = swm(c, b"l", rev_seqno=1, meta_cas=REMOTE_CAS)
        assert reply.status == Status.EINVAL and b"FORCE_ACCEPT" in reply.value
        assert swm(c, b"l", rev_seqno=1, meta_cas=REMOTE_CAS, options=ACCEPT).status == Status.SUCCESS
        # LWW: the CAS decides first
        assert swm(c, b"l", rev_seqno=99, meta_cas=REMOTE_CAS - 1, options=ACCEPT).status == Status.KEY_EEXISTS
        assert swm(c, b"l", rev_seqno=0, meta_cas=REMOTE_CAS + 1, options=ACCEPT).status == Status.SUCCESS


def test_add_with_meta_and_header_cas(xdcr):
    assert swm(xdcr, b"a", rev_seqno=1, meta_cas=REMOTE_CAS, opcode=Opcode.ADD_WITH_META).status == Status.SUCCESS
    assert swm(xdcr, b"a", rev_seqno=5, meta_cas=REMOTE_CAS + 1, opcode=Opcode.ADD_WITH_META).status \
        == Status.KEY_EEXISTS
    # a non-zero header CAS must match the stored document
    assert swm(xdcr, b"a", rev_seqno=5, meta_cas=REMOTE_CAS + 1, cas=123).status == Status.KEY_EEXISTS
    assert swm(xdcr, b"a", rev_seqno=5, meta_cas=REMOTE_CAS + 1, cas=REMOTE_CAS).status == Status.SUCCESS
    assert swm(xdcr, b"nope", rev_seqno=5, meta_cas=REMOTE_CAS, cas=1).status == Status.KEY_ENOENT


def test_del_with_meta_tombstone_expiration_and_xattrs(xdcr):
    swm(xdcr, b"d", rev_seqno=3, meta_cas=REMOTE_CAS)
    assert dwm(xdcr, b"d", rev_seqno=2, meta_cas=REMOTE_CAS + 1).status == Status.KEY_EEXISTS
    reply = dwm(xdcr, b"d", rev_seqno=4, meta_cas=REMOTE_CAS + 2, delete_time=1_700_000_123)
    assert reply.status == Status.SUCCESS and reply.cas == REMOTE_CAS + 2
    meta = get_meta(xdcr, b"d")
    assert (meta.deleted, meta.rev_seqno, meta.cas, meta.expiry) == (1, 4, REMOTE_CAS + 2, 1_700_000_123)
    assert xdcr.get(b"d").status == Status.KEY_ENOENT
    # a deletion of a key never seen here is stored too (so it replicates on)
    assert dwm(xdcr, b"unseen", rev_seqno=1, meta_cas=REMOTE_CAS, options=EXPIRE).status == Status.SUCCESS
    assert get_meta(xdcr, b"unseen").deleted == 1
    # the value of a deletion may only hold xattrs
    sys_xattrs = join_xattrs({"_txn": '{"id":1}'}, b"")
    assert dwm(xdcr, b"x", rev_seqno=1, meta_cas=REMOTE_CAS, value=sys_xattrs, datatype=0x04).status \
        == Status.SUCCESS
    assert dwm(xdcr, b"y", rev_seqno=1, meta_cas=REMOTE_CAS, value=b"body").status == Status.EINVAL


def test_quiet_with_meta_variants(xdcr):
    vb = xdcr.vbucket_of(b"q")
    xdcr.send(b"".join([
        SetWithMeta(b"q", b"v", rev_seqno=2, meta_cas=REMOTE_CAS, vbucket=vb, opaque=1,
                    opcode=Opcode.SETQ_WITH_META).encode(),  # silent
        SetWithMeta(b"q", b"v", rev_seqno=1, meta_cas=REMOTE_CAS, vbucket=vb, opaque=2,
                    opcode=Opcode.ADDQ_WITH_META).encode(),  # EEXISTS
        DelWithMeta(b"q", rev_seqno=3, meta_cas=REMOTE_CAS + 1, vbucket=vb, opaque=3,
                    opcode=Opcode.DELQ_WITH_META).encode(),  # silent
        GetMeta(b"zz", None, xdcr.vbucket_of(b"zz"), 4, Opcode.GETQ_META).encode(),  # silent miss
        GetMeta(b"q", None, vb, 5, Opcode.GETQ_META).encode(),  # a hit replies
    ]))
    replies = xdcr.recv_n(2)
    assert [(r.opaque, r.status) for r in replies] == [(2, Status.KEY_EEXISTS), (5, Status.SUCCESS)]
    assert GetMetaResponse.from_frame(replies[1]).deleted == 1


def test_malformed_with_meta_requests_are_einval(xdcr):
    vb = xdcr.vbucket_of(b"k")
    for extras in (b"", bytes(25), bytes(31)):
        reply = xdcr.call(Opcode.SET_WITH_META, key=b"k", extras=extras, value=b"v", vbucket=vb)
        assert reply.status == Status.EINVAL, extras
    nmeta_too_long = struct.pack(">IIQQIH", 0, 0, 1, REMOTE_CAS, 0, 50)
    assert xdcr.call(Opcode.SET_WITH_META, key=b"k", extras=nmeta_too_long, value=b"v", vbucket=vb).status \
        == Status.EINVAL
    assert xdcr.call(Opcode.GET_META, key=b"k", extras=b"\x07", vbucket=vb).status == Status.EINVAL


def test_metadata_that_would_overflow_is_einval_and_persistence_goes_on(xdcr):
    """A meta CAS of 2^64-1 (a locked document's CAS) or a rev seqno of 2^64-1 once made the key's
    next write overflow 64 bits, which stopped the flusher for every vbucket; now it is refused."""
    vb = xdcr.vbucket_of(b"x")
    assert swm(xdcr, b"x", rev_seqno=1, meta_cas=(1 << 64) - 1).status == Status.EINVAL
    assert swm(xdcr, b"x", rev_seqno=(1 << 64) - 1, meta_cas=REMOTE_CAS).status == Status.EINVAL
    assert dwm(xdcr, b"x", rev_seqno=1, meta_cas=(1 << 64) - 2).status == Status.EINVAL
    reply = xdcr.set(b"x", b"local")
    assert reply.status == Status.SUCCESS
    seqno = struct.unpack(">QQ", reply.extras)[1]
    assert xdcr.call(Opcode.SEQNO_PERSISTENCE, extras=struct.pack(">Q", seqno), vbucket=vb).status \
        == Status.SUCCESS
    assert get_meta(xdcr, b"x").rev_seqno == 1


def test_with_meta_privileges(server):
    with server.client() as c:
        c.login(user="writer", password="writepw")
        assert swm(c, b"p", rev_seqno=1, meta_cas=REMOTE_CAS).status == Status.EACCESS
    with server.client() as c:
        c.login(user="reader", password="readpw")
        assert get_meta(c, b"p").status == Status.KEY_ENOENT  # META_READ is part of data_reader
        assert dwm(c, b"p", rev_seqno=1, meta_cas=REMOTE_CAS).status == Status.EACCESS


def test_with_meta_on_a_replica_vbucket_is_not_my_vbucket(server, xdcr):
    with server.login() as admin:
        admin.call(Opcode.SET_VBUCKET, extras=b"\x02", vbucket=xdcr.vbucket_of(b"r"))
    reply = swm(xdcr, b"r", rev_seqno=1, meta_cas=REMOTE_CAS, options=FORCE)
    assert reply.status == Status.NOT_MY_VBUCKET and reply.value.startswith(b"{")


def test_set_with_meta_of_an_empty_value_stores_an_empty_document(xdcr):
    """An empty value is a valid document, and kv_engine validates *WithMeta values of any length
    (set_with_meta.md gives no lower bound), so a replicator can copy an empty document with its
    metadata; GET then reads the empty body and GET_META the metadata that was sent."""
    reply = swm(xdcr, b"empty", b"", flags=3, rev_seqno=5, meta_cas=REMOTE_CAS)
    assert reply.status == Status.SUCCESS and reply.cas == REMOTE_CAS
    got = xdcr.get(b"empty")
    assert got.status == Status.SUCCESS and got.value == b""
    meta = get_meta(xdcr, b"empty")
    assert (meta.deleted, meta.flags, meta.rev_seqno, meta.cas) == (0, 3, 5, REMOTE_CAS)
    add = swm(xdcr, b"empty-add", b"", rev_seqno=1, meta_cas=REMOTE_CAS, opcode=Opcode.ADD_WITH_META)
    assert add.status == Status.SUCCESS and xdcr.get(b"empty-add").value == b""
