"""The official Couchbase Python SDK (4.6.x) against a real `dcpflow server` subprocess: bootstrap
(HELLO, SCRAM-SHA512, error map, cluster map), KV operations and their exceptions."""

import json
import time
from datetime import timedelta

import pytest
from couchbase.exceptions import (
    AuthenticationException,
    CasMismatchException,
    DocumentExistsException,
    DocumentLockedException,
    DocumentNotFoundException,
    DocumentNotLockedException,
    UnAmbiguousTimeoutException,
)
from couchbase.options import (
    DecrementOptions,
    DeltaValue,
    GetOptions,
    IncrementOptions,
    SignedInt64,
    UpsertOptions,
)
from couchbase.transcoder import RawBinaryTranscoder

from dcpflow.protocol.keys import vbucket_for_key
from dcpflow.protocol.meta import GetMetaResponse
from dcpflow.protocol.opcodes import Opcode

from .client import RawClient
from .sdk import connect  # noqa: F401 (other modules import it from here)


@pytest.fixture(scope="module")
def collection(sdk_server):
    cluster = connect(sdk_server.port)
    try:
        yield cluster.bucket("default").default_collection()
    finally:
        cluster.close()


def test_upsert_get_remove(collection):
    result = collection.upsert("sdk-1", {"name": "dcpflow", "n": 1})
    assert result.cas
    token = result.mutation_token()  # HELLO MutationSeqno: (vbucket uuid, seqno) in the reply
    assert token.partition_id == vbucket_for_key(b"sdk-1", 64) and token.sequence_number >= 1
    assert token.partition_uuid != 0
    got = collection.get("sdk-1")
    assert got.content_as[dict] == {"name": "dcpflow", "n": 1}
    assert got.cas == result.cas
    removed = collection.remove("sdk-1")
    assert removed.cas and removed.cas != result.cas
    with pytest.raises(DocumentNotFoundException):
        collection.get("sdk-1")
    with pytest.raises(DocumentNotFoundException):
        collection.remove("sdk-1")


def test_insert_existing_raises_document_exists(collection):
    collection.insert("sdk-2", {"v": 1})
    with pytest.raises(DocumentExistsException):
        collection.insert("sdk-2", {"v": 2})
    assert collection.get("sdk-2").content_as[dict] == {"v": 1}


def test_replace_with_cas(collection):
    first = collection.upsert("sdk-3", {"v": 1})
    second = collection.replace("sdk-3", {"v": 2}, cas=first.cas)
    with pytest.raises(CasMismatchException):
        collection.replace("sdk-3", {"v": 3}, cas=first.cas)
    assert collection.get("sdk-3").content_as[dict] == {"v": 2}
    collection.replace("sdk-3", {"v": 4}, cas=second.cas)
    with pytest.raises(DocumentNotFoundException):
        collection.replace("sdk-missing", {"v": 1})


def test_touch_and_expiry(collection, sdk_server):
    collection.upsert("sdk-4", "text", UpsertOptions(expiry=timedelta(hours=1)))
    touched = collection.touch("sdk-4", timedelta(hours=2))
    assert touched.cas
    assert collection.get("sdk-4").content_as[str] == "text"
    with RawClient(sdk_server.port) as c:
        c.login()
        meta = GetMetaResponse.from_frame(c.call(Opcode.GET_META, key=b"sdk-4", vbucket=c.vbucket_of(b"sdk-4")))
        assert 7000 < meta.expiry - time.time() <= 7200 and meta.cas == touched.cas
    with pytest.raises(DocumentNotFoundException):
        collection.touch("sdk-missing", timedelta(seconds=10))


def test_sdk_writes_are_visible_to_a_raw_client(collection, sdk_server):
    collection.upsert("sdk-5", {"from": "sdk"})
    with RawClient(sdk_server.port) as c:
        c.login()
        reply = c.get(b"sdk-5")
        assert json.loads(reply.value) == {"from": "sdk"} and reply.datatype == 1


def test_plain_forced_over_tcp_is_refused_unless_allowed(sdk_server, spawn_server, tmp_path):
    with pytest.raises(AuthenticationException):
        cluster = connect(sdk_server.port, "?sasl_mech_force=PLAIN")
        try:
            cluster.bucket("default").default_collection().upsert("refused", 1, timeout=timedelta(seconds=3))
        finally:
            cluster.close()
    proc = spawn_server("--data-dir", str(tmp_path), "--vbuckets", "64", "--allow-plain-over-tcp")
    cluster = connect(proc.port, "?sasl_mech_force=PLAIN")
    try:
        coll = cluster.bucket("default").default_collection()
        coll.upsert("sdk-plain", [1, 2, 3])
        assert coll.get("sdk-plain").content_as[list] == [1, 2, 3]
    finally:
        cluster.close()


def test_counters_and_binary_append(collection):
    binary = collection.binary()
    assert binary.increment("sdk-counter", IncrementOptions(initial=SignedInt64(10))).content == 10
    assert binary.increment("sdk-counter", IncrementOptions(delta=DeltaValue(5))).content == 15
    assert binary.decrement("sdk-counter", DecrementOptions(delta=DeltaValue(20))).content == 0
    collection.upsert("sdk-bytes", b"middle", UpsertOptions(transcoder=RawBinaryTranscoder()))
    binary.append("sdk-bytes", b"-end")
    binary.prepend("sdk-bytes", b"start-")
    got = collection.get("sdk-bytes", GetOptions(transcoder=RawBinaryTranscoder()))
    assert got.value == b"start-middle-end"


def test_named_collection_is_unknown(collection, sdk_server):
    """GET_COLLECTION_ID answers UNKNOWN_COLLECTION; the SDK retries (the manifest might be catching up)
    until the timeout, as it does against Couchbase Server."""
    cluster = connect(sdk_server.port)
    try:
        other = cluster.bucket("default").scope("_default").collection("nope")
        with pytest.raises(UnAmbiguousTimeoutException) as e:
            other.get("k", GetOptions(timeout=timedelta(seconds=1)))
        assert "collection_outdated" in str(e.value)
    finally:
        cluster.close()


def test_get_and_lock_and_unlock(collection):
    collection.upsert("sdk-lock", {"v": 1})
    locked = collection.get_and_lock("sdk-lock", timedelta(seconds=10))
    assert locked.content_as[dict] == {"v": 1}
    assert collection.get("sdk-lock").cas == 0xFFFF_FFFF_FFFF_FFFF  # a locked document's CAS is hidden
    # the SDK retries a Locked reply until its timeout, then reports the lock
    with pytest.raises(DocumentLockedException):
        collection.upsert("sdk-lock", {"v": 2}, UpsertOptions(timeout=timedelta(milliseconds=300)))
    with pytest.raises(CasMismatchException):  # Locked on UNLOCK_KEY: the SDK's name for a wrong CAS
        collection.unlock("sdk-lock", locked.cas + 1)
    collection.unlock("sdk-lock", locked.cas)
    with pytest.raises(DocumentNotLockedException):
        collection.unlock("sdk-lock", locked.cas)
    relocked = collection.get_and_lock("sdk-lock", timedelta(seconds=10))
    collection.replace("sdk-lock", {"v": 3}, cas=relocked.cas)  # the lock's CAS writes and unlocks
    collection.upsert("sdk-lock", {"v": 4})
    assert collection.get("sdk-lock").content_as[dict] == {"v": 4}


def test_a_25_mib_value_is_refused_with_e2big_and_the_connection_lives_on(collection):
    """Over the 20 MiB document limit, under the 30 MiB packet limit: the SDK hears E2BIG (its
    value_too_large, error code 104) for that request alone. A reset connection would instead
    cancel it and every request in flight beside it; here the gets running meanwhile all succeed."""
    import threading

    from couchbase.exceptions import CouchbaseException

    collection.upsert("sdk-e2big-neighbour", {"n": 1})
    failures: list[BaseException] = []
    done = threading.Event()

    def neighbour() -> None:
        while not done.is_set():
            try:
                assert collection.get("sdk-e2big-neighbour").content_as[dict] == {"n": 1}
            except BaseException as e:  # noqa: BLE001 - reported below
                failures.append(e)
                return

    t = threading.Thread(target=neighbour)
    t.start()
    try:
        with pytest.raises(CouchbaseException) as e:
            collection.upsert("sdk-e2big", b"x" * (25 * 1024 * 1024), UpsertOptions(transcoder=RawBinaryTranscoder()))
    finally:
        done.set()
        t.join(30)
    assert e.value.error_code == 104 and "'status_code': 3" in str(e.value)  # value_too_large, E2BIG
    assert failures == []
    with pytest.raises(DocumentNotFoundException):
        collection.get("sdk-e2big")
