"""Sub-document commands through the project's own codec against a real server: every operation
and error status, multi-path partial failures, doc flags, expiry / preserve-TTL, CAS, locks,
durability frames, xattrs (user, system by privilege, virtual) and macro expansion values."""

import json
import time

import pytest

from dcpflow.engine.crc32c import crc32c
from dcpflow.protocol import subdoc as sd
from dcpflow.protocol.datatype import split_xattrs
from dcpflow.protocol.frame import RequestFrameId, durability_frame, encode_frame_info
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.meta import GetMetaResponse
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .client import RawClient

O, S = Opcode, Status
X = sd.PathFlag.XATTR_PATH
D = sd.DocFlag
FEATURES = (Feature.XERROR, Feature.JSON, Feature.MUTATION_SEQNO, Feature.XATTR)


def send(c: RawClient, msg):
    """Send a codec message with a fresh opaque and decode its reply with the matching type."""
    msg = msg._replace(opaque=c.next_opaque(), vbucket=c.vbucket_of(msg.key))
    c.send(msg.encode())
    frame = c.recv()
    assert frame.opaque == msg.opaque and frame.opcode == msg.opcode
    return sd.RESPONSE_TYPES[frame.opcode].from_frame(frame), frame


def single(c, op, key, path, value=b"", flags=0, doc_flags=0, **kw):
    return send(c, sd.SubdocRequest(op, key, path, value, flags, doc_flags, **kw))[0]


def lookup(c, key, *specs, doc_flags=0):
    return send(c, sd.SubdocMultiLookup(key, tuple(specs), doc_flags))[0]


def mutate(c, key, *specs, doc_flags=0, **kw):
    return send(c, sd.SubdocMultiMutation(key, tuple(specs), doc_flags, **kw))[0]


def G(path, flags=0):
    return sd.SubdocSpec(O.SUBDOC_GET, path, b"", flags)


def U(path, value, flags=0, op=O.SUBDOC_DICT_UPSERT):
    return sd.SubdocSpec(op, path, value, flags)


@pytest.fixture
def c(server):
    with server.client() as client:
        client.login(features=FEATURES)
        yield client


def body(c, key) -> bytes:
    reply = c.get(key)
    assert reply.status == S.SUCCESS, reply.status
    return reply.value


def xattrs(server, key: bytes) -> dict[str, str]:
    """The stored xattrs, read from the engine (the wire never returns them whole)."""
    def read():
        vb = server.server.buckets["default"].engine.vbucket(RawClient(server.port).vbucket_of(key))
        item = vb.ht[key]
        return split_xattrs(item.value)[0] if item.datatype & 4 else {}
    return server.call(read)


def test_single_path_lookups(c):
    c.set(b"d", b'{"a": [1, 2, {"x": true}], "s": "v"}', datatype=1)
    got = single(c, O.SUBDOC_GET, b"d", b"a[2]")
    assert got.status == S.SUCCESS and got.value == b'{"x": true}' and got.datatype == 1 and got.cas
    assert single(c, O.SUBDOC_EXISTS, b"d", b"a[-1].x").value == b""
    assert single(c, O.SUBDOC_GET_COUNT, b"d", b"a").value == b"3"
    assert single(c, O.SUBDOC_GET_COUNT, b"d", b"").value == b"2"
    assert single(c, O.SUBDOC_GET, b"d", b"nope").status == S.SUBDOC_PATH_ENOENT
    assert single(c, O.SUBDOC_GET, b"d", b"s.x").status == S.SUBDOC_PATH_MISMATCH
    assert single(c, O.SUBDOC_GET, b"d", b"a[").status == S.SUBDOC_PATH_EINVAL
    assert single(c, O.SUBDOC_GET, b"d", b".".join([b"a"] * 32)).status == S.SUBDOC_PATH_E2BIG
    assert single(c, O.SUBDOC_GET, b"missing", b"a").status == S.KEY_ENOENT
    c.set(b"bin", b"\x00\x01binary")
    assert single(c, O.SUBDOC_GET, b"bin", b"a").status == S.SUBDOC_DOC_NOT_JSON
    deep = "{}"
    for n in range(32, 0, -1):
        deep = f'{{"{n}":{deep}}}'
    c.set(b"deep", deep.encode(), datatype=1)
    assert single(c, O.SUBDOC_GET, b"deep", b"1").status == S.SUBDOC_DOC_E2DEEP


def test_single_path_mutations_and_their_errors(c):
    first = c.set(b"m", b'{"n": 1, "l": [1]}', datatype=1)
    r = single(c, O.SUBDOC_DICT_ADD, b"m", b"new", b'"v"')
    assert r.status == S.SUCCESS and r.cas != first.cas and r.vbucket_uuid and r.seqno
    assert single(c, O.SUBDOC_DICT_ADD, b"m", b"new", b"1").status == S.SUBDOC_PATH_EEXISTS
    assert single(c, O.SUBDOC_DICT_UPSERT, b"m", b"new", b"[1, 2]").status == S.SUCCESS
    assert single(c, O.SUBDOC_REPLACE, b"m", b"absent", b"1").status == S.SUBDOC_PATH_ENOENT
    assert single(c, O.SUBDOC_ARRAY_PUSH_LAST, b"m", b"l", b"2,3").status == S.SUCCESS
    assert single(c, O.SUBDOC_ARRAY_PUSH_FIRST, b"m", b"l", b"0").status == S.SUCCESS
    assert single(c, O.SUBDOC_ARRAY_INSERT, b"m", b"l[1]", b'"i"').status == S.SUCCESS
    assert single(c, O.SUBDOC_ARRAY_ADD_UNIQUE, b"m", b"l", b"3").status == S.SUBDOC_PATH_EEXISTS
    assert single(c, O.SUBDOC_ARRAY_ADD_UNIQUE, b"m", b"l", b"[3]").status == S.SUBDOC_VALUE_CANTINSERT
    counted = single(c, O.SUBDOC_COUNTER, b"m", b"n", b"41")
    assert counted.status == S.SUCCESS and counted.value == b"42" and counted.datatype == 1
    assert single(c, O.SUBDOC_COUNTER, b"m", b"n", b"0").status == S.SUBDOC_DELTA_EINVAL
    assert single(c, O.SUBDOC_COUNTER, b"m", b"l", b"1").status == S.SUBDOC_PATH_MISMATCH
    assert single(c, O.SUBDOC_DELETE, b"m", b"new").status == S.SUCCESS
    assert single(c, O.SUBDOC_DELETE, b"m", b"new").status == S.SUBDOC_PATH_ENOENT
    assert single(c, O.SUBDOC_DICT_UPSERT, b"m", b"bad", b"{").status == S.SUBDOC_VALUE_CANTINSERT
    assert json.loads(body(c, b"m")) == {"n": 42, "l": [0, "i", 1, 2, 3]}
    assert single(c, O.SUBDOC_DICT_UPSERT, b"absent", b"a", b"1").status == S.KEY_ENOENT
    assert single(c, O.SUBDOC_DICT_UPSERT, b"m", b"a", b"1", cas=first.cas).status == S.KEY_EEXISTS
    now = c.get(b"m").cas
    assert single(c, O.SUBDOC_DICT_UPSERT, b"m", b"a", b"1", cas=now).status == S.SUCCESS


def test_mutations_keep_the_rest_of_the_document_byte_for_byte(c):
    c.set(b"fmt", b'{ "big": 12345678901234567890.50 ,\n "n": 1 }', datatype=1)
    single(c, O.SUBDOC_COUNTER, b"fmt", b"n", b"1")
    assert body(c, b"fmt") == b'{ "big": 12345678901234567890.50 ,\n "n": 2 }'


def test_multi_lookup_reports_each_spec(c):
    """SubDocument.md's example: (SUCCESS, "mnunberg"), (SUCCESS, "couchbase"), (PATH_ENOENT),
    (PATH_ENOENT), (SUCCESS, "Subdoc Commands"); the header says SUBDOC_MULTI_PATH_FAILURE."""
    c.set(b"u:1234", json.dumps({"date": "22/16/2015", "from": "mnunberg", "to": "couchbase",
                                 "subject": "Subdoc Commands"}).encode(), datatype=1)
    reply = lookup(c, b"u:1234", G(b"from"), G(b"to"), G(b"cc"), G(b"bcc"), G(b"subject"))
    assert reply.status == S.SUBDOC_MULTI_PATH_FAILURE
    assert [(r.status, r.value) for r in reply.results] == [
        (S.SUCCESS, b'"mnunberg"'), (S.SUCCESS, b'"couchbase"'), (S.SUBDOC_PATH_ENOENT, b""),
        (S.SUBDOC_PATH_ENOENT, b""), (S.SUCCESS, b'"Subdoc Commands"')]
    whole = lookup(c, b"u:1234", sd.SubdocSpec(O.SUBDOC_EXISTS, b"to"), sd.SubdocSpec(O.GET))
    assert whole.status == S.SUCCESS and whole.results[0] == (S.SUCCESS, b"")
    assert json.loads(whole.results[1].value)["from"] == "mnunberg"
    assert lookup(c, b"nobody", G(b"a")).status == S.KEY_ENOENT
    assert lookup(c, b"u:1234", *([G(b"to")] * 17)).status == S.SUBDOC_INVALID_COMBO


def test_multi_mutation_is_all_or_nothing(c):
    c.set(b"mm", b'{"count": 1, "queue": ["x"]}', datatype=1)
    before = body(c, b"mm")
    failed = mutate(c, b"mm", U(b"a", b"1"), U(b"count.sub", b"1"), U(b"b", b"2"))
    assert failed.status == S.SUBDOC_MULTI_PATH_FAILURE
    assert failed.results == (sd.MutationResult(1, S.SUBDOC_PATH_MISMATCH),)
    assert body(c, b"mm") == before  # nothing applied
    ok = mutate(c, b"mm", U(b"login_locations", b'"192.168.3.4"', sd.PathFlag.MKDIR_P, O.SUBDOC_ARRAY_ADD_UNIQUE),
                U(b"count", b"41", op=O.SUBDOC_COUNTER), U(b"state", b'"logged_in"'),
                sd.SubdocSpec(O.SUBDOC_DELETE, b"queue"))
    assert ok.status == S.SUCCESS and ok.results == (sd.MutationResult(1, S.SUCCESS, b"42"),)
    assert ok.vbucket_uuid and ok.seqno
    assert json.loads(body(c, b"mm")) == {"count": 42, "login_locations": ["192.168.3.4"], "state": "logged_in"}
    replaced = mutate(c, b"mm", sd.SubdocSpec(O.SET, b"", b'{"whole": 1}'))
    assert replaced.status == S.SUCCESS and json.loads(body(c, b"mm")) == {"whole": 1}
    assert mutate(c, b"mm", sd.SubdocSpec(O.DELETE)).status == S.SUCCESS
    assert c.get(b"mm").status == S.KEY_ENOENT


def test_doc_flags_mkdoc_add_and_their_errors(c):
    assert single(c, O.SUBDOC_DICT_UPSERT, b"mk", b"a.b", b"1", doc_flags=D.MKDOC).status == S.SUCCESS
    assert json.loads(body(c, b"mk")) == {"a": {"b": 1}}
    assert single(c, O.SUBDOC_DICT_UPSERT, b"mk", b"c", b"2", doc_flags=D.MKDOC).status == S.SUCCESS
    assert json.loads(body(c, b"mk")) == {"a": {"b": 1}, "c": 2}
    assert single(c, O.SUBDOC_ARRAY_PUSH_LAST, b"arr", b"", b"1", doc_flags=D.MKDOC).status == S.SUCCESS
    assert body(c, b"arr") == b"[1]" and c.get(b"arr").datatype == 1
    assert single(c, O.SUBDOC_DICT_ADD, b"mk", b"z", b"1", doc_flags=D.ADD).status == S.KEY_EEXISTS
    assert single(c, O.SUBDOC_DICT_ADD, b"new", b"z", b"1", doc_flags=D.ADD).status == S.SUCCESS
    assert mutate(c, b"m2", sd.SubdocSpec(O.SET, b"", b"plain text"), doc_flags=D.ADD).status == S.SUCCESS
    reply = c.get(b"m2")
    assert reply.value == b"plain text" and reply.datatype == 0


def test_expiry_user_flags_and_preserve_ttl(c, server):
    c.set(b"ttl", b'{"a": 1}', datatype=1, expiry=3600, flags=0xCAFE)
    assert single(c, O.SUBDOC_DICT_UPSERT, b"ttl", b"b", b"2").status == S.SUCCESS

    def meta():
        frame = c.call(O.GET_META, key=b"ttl", vbucket=c.vbucket_of(b"ttl"))
        return GetMetaResponse.from_frame(frame)
    assert meta().expiry == 0 and meta().flags == 0xCAFE  # no expiry in the request clears it
    assert single(c, O.SUBDOC_DICT_UPSERT, b"ttl", b"b", b"3", expiry=7200, user_flags=7).status == S.SUCCESS
    assert 7000 < meta().expiry - time.time() <= 7200 and meta().flags == 7
    keep = encode_frame_info(RequestFrameId.PRESERVE_TTL)
    assert single(c, O.SUBDOC_DICT_UPSERT, b"ttl", b"b", b"4", framing=keep).status == S.SUCCESS
    assert 7000 < meta().expiry - time.time() <= 7200
    assert mutate(c, b"ttl", U(b"c", b"1"), framing=keep).status == S.SUCCESS
    assert 7000 < meta().expiry - time.time() <= 7200
    assert mutate(c, b"ttl", U(b"c", b"2"), expiry=60).status == S.SUCCESS
    assert 0 < meta().expiry - time.time() <= 60


def test_durability_and_locks_as_on_plain_mutations(c):
    c.set(b"dl", b"{}", datatype=1)
    reply = single(c, O.SUBDOC_DICT_UPSERT, b"dl", b"a", b"1", framing=durability_frame(1))
    assert reply.status == S.DURABILITY_IMPOSSIBLE
    locked = c.call(O.GET_LOCKED, key=b"dl", vbucket=c.vbucket_of(b"dl"))
    assert single(c, O.SUBDOC_DICT_UPSERT, b"dl", b"a", b"1").status == S.LOCKED
    assert single(c, O.SUBDOC_GET_COUNT, b"dl", b"").cas == 0xFFFFFFFFFFFFFFFF  # a locked document hides its CAS
    assert single(c, O.SUBDOC_DICT_UPSERT, b"dl", b"a", b"1", cas=locked.cas).status == S.SUCCESS
    assert single(c, O.SUBDOC_DICT_UPSERT, b"dl", b"a", b"2").status == S.SUCCESS  # the write released the lock


def test_xattrs_user_system_and_virtual(c, server):
    c.set(b"x", b'{"body": 1}', datatype=1, flags=0xCAFFEE)
    assert mutate(c, b"x", U(b"meta.tags", b'["a"]', X | sd.PathFlag.MKDIR_P), U(b"_sync.rev", b"5", X | 1),
                  U(b"body", b"2")).status == S.SUCCESS
    assert json.loads(body(c, b"x")) == {"body": 2}  # GET returns the body without xattrs
    assert xattrs(server, b"x") == {"meta": '{"tags":["a"]}', "_sync": '{"rev":5}'}
    reply = lookup(c, b"x", G(b"meta.tags[0]", X), G(b"_sync", X), G(b"$document", X), G(b"$document.exptime", X),
                   G(b"$vbucket.HLC", X), G(b"$XTOC", X), G(b"$nope", X), G(b"body"))
    assert reply.status == S.SUBDOC_MULTI_PATH_FAILURE
    r = reply.results
    assert r[0] == (S.SUCCESS, b'"a"') and r[1] == (S.SUCCESS, b'{"rev":5}')
    document = json.loads(r[2].value)
    item_cas = c.get(b"x").cas
    assert document["CAS"] == f"0x{item_cas:016x}" and document["flags"] == 0xCAFFEE
    assert document["exptime"] == 0 and document["value_bytes"] == len(body(c, b"x"))
    assert document["datatype"] == ["json", "xattr"] and document["deleted"] is False
    assert document["revid"] == "2" and int(document["seqno"], 16) > 0
    assert document["value_crc32c"] == f"0x{crc32c(body(c, b'x')):08x}"
    assert r[3] == (S.SUCCESS, b"0")
    hlc = json.loads(r[4].value)
    assert hlc["mode"] in ("real", "logical") and abs(int(hlc["now"]) - time.time()) < 60
    assert json.loads(r[5].value) == ["meta", "_sync"]
    assert r[6].status == S.SUBDOC_XATTR_UNKNOWN_VATTR
    assert r[7] == (S.SUCCESS, b"2")
    assert single(c, O.SUBDOC_DICT_UPSERT, b"x", b"$document.x", b"1", X).status == \
        S.SUBDOC_XATTR_CANT_MODIFY_VATTR


def test_system_xattrs_need_the_privilege(c, server):
    c.set(b"priv", b'{"a": 1}', datatype=1)
    assert mutate(c, b"priv", U(b"_sys", b"1", X), U(b"user", b"2", X)).status == S.SUCCESS
    with server.client() as full, server.client() as writer:
        full.login("full", "fullpw", features=FEATURES)
        writer.login("writer", "writepw", features=FEATURES)
        assert lookup(full, b"priv", G(b"_sys", X)).results[0] == (S.SUCCESS, b"1")
        with server.client() as reader:
            reader.login("reader", "readpw", features=FEATURES)
            assert single(reader, O.SUBDOC_GET, b"priv", b"_sys", flags=X).status == S.EACCESS
            got = lookup(reader, b"priv", G(b"user", X), G(b"_sys", X), G(b"a"))
            assert got.status == S.SUBDOC_MULTI_PATH_FAILURE
            assert [x.status for x in got.results] == [S.EACCESS, S.EACCESS, S.SUCCESS]  # the whole xattr phase
            assert lookup(reader, b"priv", G(b"user", X), G(b"$XTOC", X)).results[1].value == b'["user"]'
            assert single(reader, O.SUBDOC_DICT_UPSERT, b"priv", b"a", b"1").status == S.EACCESS  # no WRITE
        assert single(writer, O.SUBDOC_DICT_UPSERT, b"priv", b"_sys", b"2", X).status == S.EACCESS
        failed = mutate(writer, b"priv", U(b"user", b"3", X), U(b"_sys", b"3", X))
        assert failed.results == (sd.MutationResult(0, S.EACCESS),)
        assert single(writer, O.SUBDOC_DICT_UPSERT, b"priv", b"user", b"3", X).status == S.SUCCESS
    assert xattrs(server, b"priv") == {"_sys": "1", "user": "3"}


def test_xattr_paths_need_hello_xattr(server):
    with server.client() as c:
        c.login()  # no Xattr
        c.set(b"nx", b"{}", datatype=1)
        assert single(c, O.SUBDOC_GET, b"nx", b"a", flags=X).status == S.NOT_SUPPORTED


def test_macro_expansion_values(c, server):
    c.set(b"mac", b'{"v": 1}', datatype=1)
    reply = mutate(c, b"mac", U(b"_t.cas", sd.MACRO_CAS, X | 1 | sd.PathFlag.EXPAND_MACROS),
                   U(b"_t.seqno", sd.MACRO_SEQNO, X | sd.PathFlag.EXPAND_MACROS),
                   U(b"_t.crc", sd.MACRO_VALUE_CRC32C, X | sd.PathFlag.EXPAND_MACROS),
                   U(b"_t.prev", b'"${$document.CAS}"', X | sd.PathFlag.EXPAND_MACROS),
                   U(b"_t.literal", sd.MACRO_CAS, X))
    assert reply.status == S.SUCCESS
    previous = c.get(b"mac")
    stored = json.loads(xattrs(server, b"mac")["_t"])
    # ${Mutation.CAS}: the CAS's network-order bytes read as a little-endian number (kv_engine's)
    assert stored["cas"] == f"0x{int.from_bytes(reply.cas.to_bytes(8, 'big'), 'little'):016x}"
    assert int(stored["seqno"], 16) == reply.seqno
    assert stored["crc"] == f"0x{crc32c(previous.value):08x}"
    assert stored["literal"] == "${Mutation.CAS}"  # without EXPAND_MACROS it is a plain string
    assert stored["prev"].startswith("0x") and stored["prev"] != stored["cas"]
    assert single(c, O.SUBDOC_DICT_UPSERT, b"mac", b"_t.x", b'"${$document.nope}"',
                  X | sd.PathFlag.EXPAND_MACROS).status == S.SUBDOC_XATTR_UNKNOWN_VATTR_MACRO


def test_binary_xattr_values(c, server):
    c.set(b"b64", b"{}", datatype=1)
    assert single(c, O.SUBDOC_DICT_UPSERT, b"b64", b"blob", b"\x00\xffraw", X | sd.PathFlag.BINARY_VALUE).status \
        == S.SUCCESS
    assert xattrs(server, b"b64")["blob"] == '"cb-content-base64-encoded:AP9yYXc="'
    assert single(c, O.SUBDOC_GET, b"b64", b"blob", flags=X | sd.PathFlag.BINARY_VALUE).value == b"\x00\xffraw"
    c.set(b"b64", b"{}", datatype=1)
    single(c, O.SUBDOC_DICT_UPSERT, b"b64", b"plain", b'"x"', X)
    assert single(c, O.SUBDOC_GET, b"b64", b"plain", flags=X | sd.PathFlag.BINARY_VALUE).status == \
        S.SUBDOC_FIELD_NOT_BINARY_VALUE


def test_tombstones_access_deleted_create_as_deleted_and_revive(c, server):
    c.set(b"t", b'{"a": 1}', datatype=1)
    assert mutate(c, b"t", U(b"_keep", b"1", X), U(b"user", b"1", X)).status == S.SUCCESS
    assert mutate(c, b"t", sd.SubdocSpec(O.DELETE)).status == S.SUCCESS
    assert c.get(b"t").status == S.KEY_ENOENT
    assert lookup(c, b"t", G(b"_keep", X)).status == S.KEY_ENOENT  # a tombstone needs ACCESS_DELETED
    seen = lookup(c, b"t", G(b"_keep", X), G(b"user", X), G(b"$document.deleted", X), doc_flags=D.ACCESS_DELETED)
    assert seen.status == S.SUBDOC_MULTI_PATH_FAILURE_DELETED  # the user xattr went with the body
    assert [r.status for r in seen.results] == [S.SUCCESS, S.SUBDOC_PATH_ENOENT, S.SUCCESS]
    assert seen.results[2].value == b"true"
    stays = single(c, O.SUBDOC_DICT_UPSERT, b"t", b"_keep", b"2", X, doc_flags=D.ACCESS_DELETED)
    assert stays.status == S.SUBDOC_SUCCESS_DELETED and c.get(b"t").status == S.KEY_ENOENT
    assert mutate(c, b"t", U(b"a", b"1"), doc_flags=D.ACCESS_DELETED).status == S.SUBDOC_MULTI_PATH_FAILURE
    assert single(c, O.SUBDOC_DICT_UPSERT, b"x-live", b"_a", b"1", X,
                  doc_flags=D.ACCESS_DELETED | D.REVIVE_DOCUMENT).status == S.KEY_ENOENT
    c.set(b"live", b"{}", datatype=1)
    assert mutate(c, b"live", U(b"_a", b"1", X),
                  doc_flags=D.ACCESS_DELETED | D.REVIVE_DOCUMENT).status == S.SUBDOC_CAN_ONLY_REVIVE_DELETED_DOCUMENTS
    assert mutate(c, b"t", sd.SubdocSpec(O.SET, b"", b"{}"), doc_flags=D.ACCESS_DELETED | D.REVIVE_DOCUMENT).status \
        == S.EINVAL  # a whole-document SET takes only MKDOC / ADD
    revived = mutate(c, b"t", U(b"_keep", b'{"back": true}', X),
                     sd.SubdocSpec(O.SUBDOC_REPLACE_BODY_WITH_XATTR, b"_keep", b"", X),
                     doc_flags=D.ACCESS_DELETED | D.REVIVE_DOCUMENT)
    assert revived.status == S.SUCCESS and json.loads(body(c, b"t")) == {"back": True}
    created = single(c, O.SUBDOC_DICT_UPSERT, b"cad", b"_txn", b'{"id":1}', X,
                     doc_flags=D.MKDOC | D.CREATE_AS_DELETED | D.ACCESS_DELETED)
    assert created.status == S.SUBDOC_SUCCESS_DELETED and c.get(b"cad").status == S.KEY_ENOENT
    assert single(c, O.SUBDOC_DICT_ADD, b"cad", b"_txn", b"1", X,
                  doc_flags=D.ADD | D.CREATE_AS_DELETED).status == S.KEY_EEXISTS  # a tombstone counts
    no_body = mutate(c, b"cad2", U(b"_a", b"1", X), U(b"b", b"1"), doc_flags=D.MKDOC | D.CREATE_AS_DELETED)
    assert no_body.results == (sd.MutationResult(1, S.SUBDOC_DOC_NOT_JSON),)  # a tombstone has no body to edit
    body_on_tombstone = single(c, O.SUBDOC_REPLACE_BODY_WITH_XATTR, b"cad", b"_txn", flags=X,
                               doc_flags=D.ACCESS_DELETED)
    assert body_on_tombstone.status == S.SUBDOC_DELETED_DOCUMENT_CANT_HAVE_VALUE


def test_replace_body_with_xattr(c):
    c.set(b"rb", b'{"old": 1}', datatype=1)
    single(c, O.SUBDOC_DICT_UPSERT, b"rb", b"_staged", b'{"new": 2}', X)
    assert single(c, O.SUBDOC_REPLACE_BODY_WITH_XATTR, b"rb", b"_staged", flags=X).status == S.SUCCESS
    assert json.loads(body(c, b"rb")) == {"new": 2} and c.get(b"rb").datatype == 1


def test_subdoc_writes_reach_dcp_consumers_that_asked_for_xattrs(c, server):
    """ExtendedAttributes.md: with DCP_OPEN IncludeXattrs a mutation carries the xattrs and the
    body; without, the body alone."""
    from dcpflow.protocol import dcp as dcpproto
    c.set(b"dcpx", b'{"v": 1}', datatype=1)
    assert single(c, O.SUBDOC_DICT_UPSERT, b"dcpx", b"_meta", b'{"by":"sd"}', X).status == S.SUCCESS
    vb = c.vbucket_of(b"dcpx")
    for flags, want_xattrs in ((dcpproto.OpenFlag.PRODUCER | dcpproto.OpenFlag.INCLUDE_XATTRS, True),
                               (dcpproto.OpenFlag.PRODUCER, False)):
        with server.client() as d:
            d.login(features=(Feature.XERROR, Feature.XATTR, Feature.JSON))
            d.send(dcpproto.DcpOpen(b"sd-test", flags, opaque=1).encode())
            assert d.recv().status == S.SUCCESS
            d.send(dcpproto.DcpControl(b"enable_noop", b"true", opaque=2).encode())
            assert d.recv().status == S.SUCCESS
            d.send(dcpproto.DcpStreamRequest(vb, 0, opaque=77).encode())
            mutation = None
            while mutation is None:
                frame = d.recv()
                if frame.opcode == O.DCP_MUTATION and frame.key == b"dcpx":
                    mutation = frame
                elif frame.opcode == O.DCP_NOOP:
                    d.send(dcpproto.DcpNoop(frame.opaque).response())
            if want_xattrs:
                assert mutation.datatype & 4
                found, rest = split_xattrs(mutation.value)
                assert found == {"_meta": '{"by":"sd"}'} and json.loads(rest) == {"v": 1}
            else:
                assert not mutation.datatype & 4 and json.loads(mutation.value) == {"v": 1}


def test_the_one_spec_shortcuts_answer_as_the_general_path(c):
    """One body lookup / mutation of a plain JSON document skips the decoder and the executor
    (subdoc.multi_lookup / multi_mutation); a doc-flags byte of 0 in the extras sends the same
    request down the general path: the replies and the documents must agree."""
    doc = b'{"a":{"b":[1,2]},"n":5,"s":"x"}'
    c.set(b"fast", doc, datatype=1)
    vb = c.vbucket_of(b"fast")
    for op in (O.SUBDOC_GET, O.SUBDOC_EXISTS):
        for path in (b"a.b[1]", b"n", b"zz", b"a.b.c", b"a", b"s.x", b"a[0]"):
            body = sd.SubdocSpec(op, path).encode(False)
            fast = c.call(O.SUBDOC_MULTI_LOOKUP, key=b"fast", value=body, vbucket=vb)
            slow = c.call(O.SUBDOC_MULTI_LOOKUP, key=b"fast", value=body, vbucket=vb, extras=b"\x00")
            assert (fast.status, fast.value, fast.cas, fast.extras) == (slow.status, slow.value, slow.cas, slow.extras)
    for op, path, value in ((O.SUBDOC_COUNTER, b"n", b"3"), (O.SUBDOC_DICT_UPSERT, b"a.c", b"[true]"),
                            (O.SUBDOC_DICT_ADD, b"n", b"1"), (O.SUBDOC_ARRAY_PUSH_LAST, b"a.b", b"3"),
                            (O.SUBDOC_REPLACE, b"zz", b"1"), (O.SUBDOC_DICT_UPSERT, b"x.y", b"1")):
        replies = []
        for key, extras in ((b"fast1", b""), (b"fast2", b"\x00")):
            c.set(key, doc, datatype=1)
            body = sd.SubdocSpec(op, path, value).encode(True)
            reply = c.call(O.SUBDOC_MULTI_MUTATION, key=key, value=body, vbucket=c.vbucket_of(key), extras=extras)
            replies.append((reply.status, reply.value, len(reply.extras), c.get(key).value))
        assert replies[0] == replies[1], (op, path)
