"""df.write.format("dcp") and `dcpflow restore`: a bucket rebuilt from the pipeline's change log as of
a micro-batch equals the source bucket as it was then, metadata included."""

import pytest

from dcpflow.protocol.status import Status
from tests.replication.xdcr_helpers import bucket_view


def url(srv) -> str:
    return f"couchbase://127.0.0.1:{srv.port}/default"


def test_restore_as_of_a_version_equals_the_source_at_that_version(spark, make_server, tmp_path):
    from pyspark.sql import functions as F

    from dcpflow.spark.pipeline import Pipeline, PipelineConfig
    from dcpflow.spark.restore import RestoreError, restore

    source = make_server(data_dir=tmp_path / "source")
    keys = [b"doc%d" % i for i in range(120)]
    with source.login() as c:
        for i, key in enumerate(keys[:100]):
            assert c.set(key, b'{"round":1,"i":%d}' % i, flags=i % 3).status == Status.SUCCESS
        for key in keys[90:100]:
            assert c.delete(key).status == Status.SUCCESS
    lake = tmp_path / "lake"
    pipeline = Pipeline(spark, PipelineConfig(connection=url(source), username="Administrator", password="password",
                                              lake=lake, state_format="snapshot"))
    pipeline.run_available_now()
    first = pipeline.changelog().agg(F.max("_commit_version")).first()[0]
    at_first = bucket_view(source.port, keys)

    with source.login() as c:
        for key in keys[:30] + keys[100:]:
            assert c.set(key, b'{"round":2}', flags=7).status == Status.SUCCESS
        for key in keys[30:40]:
            assert c.delete(key).status == Status.SUCCESS
        assert c.set(keys[95], b'{"back":true}').status == Status.SUCCESS  # deleted in round 1
    pipeline.run_available_now()
    last = pipeline.changelog().agg(F.max("_commit_version")).first()[0]
    assert last > first
    now = bucket_view(source.port, keys)
    assert at_first != now

    old = make_server(data_dir=tmp_path / "old")
    result = restore(spark, lake, url(old), "Administrator", "password", as_of=first)
    assert result == {"version": first, "documents": 90, "tombstones": 10}
    assert bucket_view(old.port, keys) == at_first  # CAS, rev seqno, flags, values, tombstones

    new = make_server(data_dir=tmp_path / "new")
    result = restore(spark, lake, url(new), "Administrator", "password")
    assert result["version"] == last
    assert bucket_view(new.port, keys) == now

    # restoring again changes nothing: the bucket's versions equal the rows' (conflict resolution)
    restore(spark, lake, url(new), "Administrator", "password")
    assert bucket_view(new.port, keys) == now
    with pytest.raises(RestoreError, match=rf"holds versions \d+\.\.{last}"):
        restore(spark, lake, url(new), "Administrator", "password", as_of=last + 1)


def test_plain_writes_upsert_and_remove(spark, server):
    rows = [("a", '{"x":1}', "upsert"), ("b", '{"x":2}', "upsert"), ("c", None, "upsert")]
    df = spark.createDataFrame(rows, "key STRING, value STRING, _change_type STRING")
    df.write.format("dcp").mode("append").options(connection=url(server), username="Administrator",
                                                  password="password").save()
    with server.login() as c:
        assert c.get(b"a").value == b'{"x":1}' and c.get(b"c").value == b""
    removes = spark.createDataFrame([("a", None, "delete"), ("zz", None, "delete")],
                                    "key STRING, value STRING, _change_type STRING")
    removes.write.format("dcp").mode("append").options(connection=url(server), username="Administrator",
                                                       password="password").save()
    with server.login() as c:
        assert c.get(b"a").status == Status.KEY_ENOENT and c.get(b"b").value == b'{"x":2}'


def test_with_meta_needs_cas_and_rev_seqno(spark, server):
    df = spark.createDataFrame([("a", "{}")], "key STRING, value STRING")
    with pytest.raises(Exception, match="withMeta=true needs 'cas' and 'rev_seqno' columns"):
        df.write.format("dcp").mode("append").options(connection=url(server), username="Administrator",
                                                      password="password", withMeta="true").save()


def test_restore_puts_each_document_back_into_its_named_collection(spark, make_server, tmp_path):
    """A lake of a bucket with named collections: each document goes back into the collection of the
    same name in the target, metadata included; a target without that collection is refused with an
    error that names it (its documents never land in another collection)."""
    from dcpflow.protocol.keys import vbucket_for_key
    from dcpflow.spark.pipeline import Pipeline, PipelineConfig
    from dcpflow.spark.restore import restore
    from tests.client.conftest import NUM_VBUCKETS
    from tests.client.test_collections import FEATURES, change, cid_of, engine, put

    def make_orders(srv) -> int:
        change(srv, lambda m: m.add_scope("shop"))
        change(srv, lambda m: m.add_collection("shop", "orders"))
        return cid_of(srv, "shop", "orders")

    def view(srv, cid: int, keys) -> dict:
        def read():
            out = {}
            for key in keys:
                item = engine(srv).vbucket(vbucket_for_key(key, NUM_VBUCKETS)).ht.get((cid, key) if cid else key)
                if item is not None:
                    out[key] = (item.deleted, item.cas, item.rev_seqno, item.flags, item.value)
            return out
        return srv.call(read)

    source = make_server(data_dir=tmp_path / "source")
    orders = make_orders(source)
    with source.login(features=FEATURES) as w:
        for i in range(20):
            put(w, orders, b"order%d" % i, b'{"n":%d}' % i)
        put(w, 0, b"order0", b'{"plain":true}')  # the same key in the default collection
    lake = tmp_path / "lake"
    Pipeline(spark, PipelineConfig(connection=url(source), username="Administrator", password="password",
                                   lake=lake, state_format="snapshot")).run_available_now()
    keys = [b"order%d" % i for i in range(20)]

    missing = make_server(data_dir=tmp_path / "missing")
    with pytest.raises(Exception, match="no collection shop.orders"):
        restore(spark, lake, url(missing), "Administrator", "password")

    chosen = make_server(data_dir=tmp_path / "chosen")
    chosen_orders = make_orders(chosen)
    restore(spark, lake, url(chosen), "Administrator", "password", collections=["shop.orders"])
    assert view(chosen, chosen_orders, keys) == view(source, orders, keys)
    assert view(chosen, 0, keys) == {}  # the default collection's order0 was not chosen

    target = make_server(data_dir=tmp_path / "target")
    target_orders = make_orders(target)
    restore(spark, lake, url(target), "Administrator", "password")
    assert view(target, target_orders, keys) == view(source, orders, keys) and len(view(source, orders, keys)) == 20
    assert view(target, 0, keys) == view(source, 0, keys) and set(view(target, 0, keys)) == {b"order0"}
