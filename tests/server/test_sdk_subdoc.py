"""Sub-document operations through the official Couchbase Python SDK (4.6.x) against a real
`dcpflow server` subprocess: lookup_in / mutate_in with every spec, their exceptions, store
semantics, expiry and preserve_expiry, xattrs and macros, and the plain calls built on them
(get with_expiry / project)."""

import json
import time
from datetime import timedelta

import couchbase.subdocument as SD
import pytest
from couchbase.exceptions import (
    CasMismatchException,
    DocumentExistsException,
    DocumentNotFoundException,
    DocumentNotJsonException,
    InvalidArgumentException,
    InvalidValueException,
    NumberTooBigException,
    PathExistsException,
    PathInvalidException,
    PathMismatchException,
    PathNotFoundException,
    PathTooBigException,
    PathTooDeepException,
    ValueTooDeepException,
)
from couchbase.options import GetOptions, LookupInOptions, MutateInOptions, UpsertOptions
from couchbase.transcoder import RawStringTranscoder

from dcpflow.protocol.meta import GetMetaResponse
from dcpflow.protocol.opcodes import Opcode

from .client import RawClient


@pytest.fixture(scope="module")
def collection(sdk_cluster):
    return sdk_cluster.bucket("default").default_collection()


@pytest.fixture(scope="module")
def named(sdk_cluster):
    """Collection `c` of scope `s`, made by the SDK's collection manager."""
    manager = sdk_cluster.bucket("default").collections()
    manager.create_scope("s")
    manager.create_collection("s", "c")
    return sdk_cluster.bucket("default").scope("s").collection("c")


def test_lookup_in_every_spec(collection):
    collection.upsert("sd-l", {"name": "dcpflow", "tags": ["a", "b"], "nested": {"n": 1}})
    result = collection.lookup_in("sd-l", [SD.get("name"), SD.exists("tags[1]"), SD.count("tags"),
                                           SD.get("nested.n"), SD.exists("missing"), SD.get_full(),
                                           SD.get("nope")])
    assert result.content_as[str](0) == "dcpflow"
    assert result.exists(1) and result.content_as[int](2) == 2 and result.content_as[int](3) == 1
    assert not result.exists(4)
    assert result.content_as[dict](5)["tags"] == ["a", "b"]
    assert result.cas == collection.get("sd-l").cas
    with pytest.raises(PathNotFoundException):
        result.content_as[str](6)
    with pytest.raises(DocumentNotFoundException):
        collection.lookup_in("sd-missing", [SD.get("a")])


def test_mutate_in_every_spec(collection):
    collection.upsert("sd-m", {"count": 1, "list": [2], "gone": True})
    result = collection.mutate_in("sd-m", [
        SD.insert("added", "x"), SD.upsert("deep.path", 5, create_parents=True), SD.replace("count", 10),
        SD.remove("gone"), SD.array_append("list", 3, 4), SD.array_prepend("list", 1),
        SD.array_insert("list[1]", 1.5), SD.array_addunique("uniq", "u", create_parents=True),
        SD.increment("counter", 5), SD.decrement("count", 3)])
    assert result.cas and result.mutation_token().sequence_number > 0
    assert result.content_as[int](8) == 5 and result.content_as[int](9) == 7
    assert collection.get("sd-m").content_as[dict] == {
        "count": 7, "list": [1, 1.5, 2, 3, 4], "added": "x", "deep": {"path": 5}, "uniq": ["u"], "counter": 5}


def test_mutate_in_errors_leave_the_document_unchanged(collection):
    collection.upsert("sd-e", {"a": 1, "arr": [1], "s": "text"})
    before = collection.get("sd-e").content_as[dict]
    with pytest.raises(PathExistsException):
        collection.mutate_in("sd-e", [SD.upsert("b", 2), SD.insert("a", 2)])
    with pytest.raises(PathNotFoundException):
        collection.mutate_in("sd-e", [SD.replace("nope", 2)])
    with pytest.raises(PathMismatchException):
        collection.mutate_in("sd-e", [SD.upsert("s.x", 2)])
    with pytest.raises(PathExistsException):
        collection.mutate_in("sd-e", [SD.array_addunique("arr", 1)])
    with pytest.raises(DocumentNotFoundException):
        collection.mutate_in("sd-missing", [SD.upsert("a", 1)])
    assert collection.get("sd-e").content_as[dict] == before
    with pytest.raises(CasMismatchException):
        collection.mutate_in("sd-e", [SD.upsert("a", 3)], MutateInOptions(cas=collection.get("sd-e").cas + 1))
    with pytest.raises(InvalidArgumentException):
        collection.mutate_in("sd-e", [SD.increment("a", 0)])


@pytest.mark.parametrize(("key", "call", "error"), [
    # status 0xc6 SUBDOC_DOC_NOT_JSON, lookups and mutations
    ("sd-text", lambda c: c.lookup_in("sd-text", [SD.get("a")]).content_as[int](0), DocumentNotJsonException),
    ("sd-text", lambda c: c.mutate_in("sd-text", [SD.upsert("a", 1)]), DocumentNotJsonException),
    # 0xc2 SUBDOC_PATH_EINVAL
    ("sd-err", lambda c: c.lookup_in("sd-err", [SD.get("a[")]).content_as[int](0), PathInvalidException),
    ("sd-err", lambda c: c.mutate_in("sd-err", [SD.upsert("a.`b", 1)]), PathInvalidException),
    # 0xc3 SUBDOC_PATH_E2BIG: more than 32 components
    ("sd-err", lambda c: c.lookup_in("sd-err", [SD.get(".".join(["a"] * 33))]).content_as[int](0),
     PathTooBigException),
    # 0xc4 SUBDOC_DOC_E2DEEP: the stored document nests deeper than 32 levels
    ("sd-deep", lambda c: c.lookup_in("sd-deep", [SD.get("d")]).content_as[int](0), PathTooDeepException),
    ("sd-deep", lambda c: c.mutate_in("sd-deep", [SD.upsert("x", 1)]), PathTooDeepException),
    # 0xc5 SUBDOC_VALUE_CANTINSERT: add-unique of a non-primitive; a counter that would overflow int64
    ("sd-err", lambda c: c.mutate_in("sd-err", [SD.array_addunique("arr", {"o": 1})]), InvalidValueException),
    ("sd-err", lambda c: c.mutate_in("sd-err", [SD.increment("max", 1)]), InvalidValueException),
    # 0xc7 SUBDOC_NUM_ERANGE: the existing number is not a signed 64-bit integer
    ("sd-err", lambda c: c.mutate_in("sd-err", [SD.increment("huge", 1)]), NumberTooBigException),
    # 0xca SUBDOC_VALUE_ETOODEEP: the value would nest the document deeper than 32 levels
    ("sd-err", lambda c: c.mutate_in("sd-err", [SD.upsert("v", json.loads("[" * 40 + "]" * 40))]),
     ValueTooDeepException),
])
def test_path_and_document_errors_raise_the_sdks_exceptions(collection, key, call, error):
    raw = RawStringTranscoder()
    collection.upsert("sd-text", "plain text", UpsertOptions(transcoder=raw))
    collection.upsert("sd-deep", '{"d": ' + "[" * 40 + "]" * 40 + "}", UpsertOptions(transcoder=raw))
    collection.upsert("sd-err", '{"arr": [1], "max": 9223372036854775807, "huge": 99999999999999999999}',
                      UpsertOptions(transcoder=raw))
    before = collection.get(key, GetOptions(transcoder=raw)).content_as[str]
    with pytest.raises(error):
        call(collection)
    assert collection.get(key, GetOptions(transcoder=raw)).content_as[str] == before


def test_store_semantics(collection):
    collection.mutate_in("sd-s", [SD.upsert("a.b", 1)], MutateInOptions(store_semantics=SD.StoreSemantics.UPSERT))
    assert collection.get("sd-s").content_as[dict] == {"a": {"b": 1}}
    with pytest.raises(DocumentExistsException):
        collection.mutate_in("sd-s", [SD.upsert("c", 1)], MutateInOptions(store_semantics=SD.StoreSemantics.INSERT))
    collection.mutate_in("sd-s2", [SD.upsert("c", 1)], MutateInOptions(store_semantics=SD.StoreSemantics.INSERT))
    assert collection.get("sd-s2").content_as[dict] == {"c": 1}


def _expiry(sdk_server, key: bytes) -> int:
    with RawClient(sdk_server.port) as c:
        c.login()
        return GetMetaResponse.from_frame(c.call(Opcode.GET_META, key=key, vbucket=c.vbucket_of(key))).expiry


def test_expiry_and_preserve_expiry(collection, sdk_server):
    collection.upsert("sd-x", {"a": 1}, UpsertOptions(expiry=timedelta(hours=1)))
    collection.mutate_in("sd-x", [SD.upsert("b", 1)], MutateInOptions(preserve_expiry=True))
    assert 3500 < _expiry(sdk_server, b"sd-x") - time.time() <= 3600
    collection.mutate_in("sd-x", [SD.upsert("b", 2)], MutateInOptions(expiry=timedelta(hours=2)))
    assert 7100 < _expiry(sdk_server, b"sd-x") - time.time() <= 7200
    collection.mutate_in("sd-x", [SD.upsert("b", 3)])
    assert _expiry(sdk_server, b"sd-x") == 0
    collection.upsert("sd-x", {"a": 2}, UpsertOptions(expiry=timedelta(hours=1)))
    collection.upsert("sd-x", {"a": 3}, UpsertOptions(preserve_expiry=True))
    assert 3500 < _expiry(sdk_server, b"sd-x") - time.time() <= 3600


def test_get_with_expiry_and_projections(collection):
    collection.upsert("sd-g", {"name": "n", "address": {"city": "c", "zip": "z"}, "tags": [1, 2]},
                      UpsertOptions(expiry=timedelta(hours=1)))
    got = collection.get("sd-g", GetOptions(with_expiry=True))
    assert got.content_as[dict]["name"] == "n"
    assert 3500 < got.expiry_time.timestamp() - time.time() <= 3600
    projected = collection.get("sd-g", GetOptions(project=["name", "address.city"]))
    assert projected.content_as[dict] == {"name": "n", "address": {"city": "c"}}


def test_xattrs_and_macros_through_the_sdk(collection):
    result = collection.mutate_in("sd-xa", [SD.upsert("txn.id", "t1", xattr=True, create_parents=True),
                                            SD.upsert("txn.cas", SD.MutationMacro.cas(), xattr=True),
                                            SD.upsert("body", 1)],
                                  MutateInOptions(store_semantics=SD.StoreSemantics.UPSERT))
    got = collection.lookup_in("sd-xa", [SD.get("txn", xattr=True), SD.get("$document.CAS", xattr=True),
                                         SD.get("$document.revid", xattr=True), SD.get("body")])
    txn = got.content_as[dict](0)
    assert txn["id"] == "t1"
    assert SD.convert_macro_cas_to_cas(txn["cas"]) == result.cas
    assert int(got.content_as[str](1), 16) == result.cas == got.cas
    assert got.content_as[str](2) == "1" and got.content_as[int](3) == 1
    assert collection.get("sd-xa").content_as[dict] == {"body": 1}
    exptime = collection.lookup_in("sd-xa", [SD.get(SD.LookupInMacro.expiry_time(), xattr=True)],
                                   LookupInOptions())
    assert exptime.content_as[int](0) == 0
    assert json.loads(json.dumps(collection.get("sd-xa").content_as[dict])) == {"body": 1}


def test_the_sdks_data_structures_built_on_sub_document(collection):
    """couchbase_list / map / set / queue are sub-document lookups and mutations on one document."""
    items = collection.couchbase_list("sd-list")
    items.append("b")
    items.prepend("a")
    items.set_at(1, "c")
    assert items.get_all() == ["a", "c"] and items.size() == 2 and items.index_of("c") == 1
    assert collection.get("sd-list").content_as[list] == ["a", "c"]
    mapping = collection.couchbase_map("sd-map")
    mapping.add("k", 1)
    mapping.add("j", {"n": 2})
    assert mapping.get("j") == {"n": 2} and mapping.exists("k") and not mapping.exists("x")
    mapping.remove("k")
    assert collection.get("sd-map").content_as[dict] == {"j": {"n": 2}}
    members = collection.couchbase_set("sd-set")
    assert members.add(1) and members.add(2) and not members.add(1)  # add-unique: PATH_EEXISTS
    assert members.contains(2) and members.size() == 2
    queue = collection.couchbase_queue("sd-queue")
    queue.push(1)
    queue.push(2)
    assert queue.pop() == 1 and queue.size() == 1


def test_exists_and_get_and_touch(collection, sdk_server):
    collection.upsert("sd-t", {"a": 1})
    assert collection.exists("sd-t").exists and not collection.exists("sd-none").exists
    assert collection.get_and_touch("sd-t", timedelta(hours=1)).content_as[dict] == {"a": 1}
    assert 3500 < _expiry(sdk_server, b"sd-t") - time.time() <= 3600


def test_sub_document_operations_in_a_named_collection(collection, named):
    """The same key in `s.c` and in the default collection are two documents; lookup_in, mutate_in
    and the calls built on them reach the named one."""
    collection.upsert("sd-n", {"where": "default"})
    named.upsert("sd-n", {"where": "s.c", "n": 1, "list": []}, UpsertOptions(expiry=timedelta(hours=1)))
    result = named.mutate_in("sd-n", [SD.increment("n", 2), SD.array_append("list", "x"),
                                      SD.upsert("meta.by", "sdk", xattr=True, create_parents=True)],
                             MutateInOptions(preserve_expiry=True))
    assert result.content_as[int](0) == 3
    got = named.lookup_in("sd-n", [SD.get("where"), SD.count("list"), SD.get("meta.by", xattr=True),
                                   SD.get("$document.exptime", xattr=True)])
    assert got.content_as[str](0) == "s.c" and got.content_as[int](1) == 1 and got.content_as[str](2) == "sdk"
    assert 3500 < got.content_as[int](3) - time.time() <= 3600
    assert got.cas == result.cas == named.get("sd-n").cas
    assert 3500 < named.get("sd-n", GetOptions(with_expiry=True)).expiry_time.timestamp() - time.time() <= 3600
    assert named.get("sd-n", GetOptions(project=["n"])).content_as[dict] == {"n": 3}
    assert named.get("sd-n").content_as[dict] == {"where": "s.c", "n": 3, "list": ["x"]}
    assert collection.get("sd-n").content_as[dict] == {"where": "default"}
    assert collection.lookup_in("sd-n", [SD.get("where")]).content_as[str](0) == "default"
    named.mutate_in("sd-n2", [SD.upsert("a", 1)], MutateInOptions(store_semantics=SD.StoreSemantics.INSERT))
    assert named.get("sd-n2").content_as[dict] == {"a": 1}
    with pytest.raises(DocumentNotFoundException):
        collection.get("sd-n2")


def test_the_sdks_own_index_paths(collection):
    """The paths the SDK's own tests use (couchbase-python-client couchbase/tests/subdoc_t.py:
    test_array_insert, test_array_insert_multi_insert, test_array_insert_mutate_in_macros,
    test_array_as_document) and the rest of subjson's path grammar (subjson subdoc/path.cc): an
    index after a '.', nested and last-element indexes, backtick quoting, a trailing '.'."""
    collection.upsert("sd-p", {"array": [1, 2, 3, 4, 5]})
    collection.mutate_in("sd-p", (SD.array_insert("array.[2]", 10),))
    assert collection.get("sd-p").content_as[dict]["array"] == [1, 2, 10, 3, 4, 5]
    collection.mutate_in("sd-p", (SD.array_insert("array.[3]", 6, 7, 8),))
    assert collection.get("sd-p").content_as[dict]["array"] == [1, 2, 10, 6, 7, 8, 3, 4, 5]
    result = collection.mutate_in("sd-p", [
        SD.upsert("xattr_array", [], xattr=True),
        SD.array_insert("xattr_array.[0]", SD.MutationMacro.cas()),
        SD.array_insert("xattr_array.[0]", SD.MutationMacro.seq_no()),
        SD.array_insert("xattr_array.[0]", SD.MutationMacro.value_crc32c())])
    res_value, res_seqno, res_cas = collection.lookup_in("sd-p", (SD.get("xattr_array", xattr=True),)).content_as[
        list](0)
    assert SD.convert_macro_cas_to_cas(res_cas) == result.cas
    assert res_seqno.startswith("0x") and res_value.startswith("0x")

    collection.upsert("sd-p-root", [])
    collection.mutate_in("sd-p-root", (SD.array_append("", 2), SD.array_prepend("", 0), SD.array_insert("[1]", 1)))
    assert collection.get("sd-p-root").content_as[list] == [0, 1, 2]

    collection.upsert("sd-p2", {"m": [[0, 1], [2, [3, 4]]], "a.b": {"c`d": "q"}, "e": {"f": 5}})
    got = collection.lookup_in("sd-p2", [
        SD.get("m.[1].[1].[0]"), SD.get("m[1][1][-1]"), SD.get("m[-1].[0]"), SD.get("`a.b`.`c``d`"),
        SD.get("e."), SD.get("e.f."), SD.exists("m.[5]"), SD.count("m.[0]")])
    assert [got.content_as[int](0), got.content_as[int](1), got.content_as[int](2)] == [3, 4, 2]
    assert got.content_as[str](3) == "q" and got.content_as[dict](4) == {"f": 5} and got.content_as[int](5) == 5
    assert not got.exists(6) and got.content_as[int](7) == 2
    collection.mutate_in("sd-p2", [SD.replace("m.[0].[1]", "one"), SD.upsert("`x.y`", True)])
    assert collection.get("sd-p2").content_as[dict]["m"][0] == [0, "one"]
    assert collection.get("sd-p2").content_as[dict]["x.y"] is True

    for bad in ("m.[-2]", "m..[0]", "m[0]x", "m[x]", ".m", "m[0", "`m"):
        with pytest.raises(PathInvalidException):
            collection.lookup_in("sd-p2", [SD.get(bad)]).content_as[int](0)
    with pytest.raises(PathTooBigException):
        collection.lookup_in("sd-p2", [SD.get("m" + ".[0]" * 31)]).content_as[int](0)
