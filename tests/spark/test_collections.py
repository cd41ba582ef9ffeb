"""The `dcp` source on named collections (real server, real Spark): the scope / collections
options, the scope, collection and collection_id columns, `drop` rows for a collection dropped
upstream, and a state table keyed by (scope, collection, key) that a drop empties."""

from dcpflow.spark.state import DeltaStateWriter
from tests.client.test_collections import FEATURES, change, cid_of, put


def options(server, **extra):
    return {"connection": f"couchbase://127.0.0.1:{server.port}/default", "username": "Administrator",
            "password": "password", "valueFormat": "string", "partitions": "2", **extra}


def setup(server) -> dict[str, int]:
    change(server, lambda m: m.add_scope("shop"))
    for name in ("users", "orders"):
        change(server, lambda m, n=name: m.add_collection("shop", n))
    change(server, lambda m: m.add_scope("other"))
    change(server, lambda m: m.add_collection("other", "logs"))
    ids = {n: cid_of(server, *n.split(".")) for n in ("shop.users", "shop.orders", "other.logs")}
    with server.login(features=FEATURES) as w:
        for name, cid in ids.items():
            for i in range(6):
                put(w, cid, f"k{i}".encode(), b'{"in":"%s"}' % name.encode())  # the same keys in each collection
        put(w, 0, b"k0")
    return ids


def rows_of(df):
    return sorted((r["scope"], r["collection"], r["collection_id"], r["key"], r["_change_type"])
                  for r in df.select("scope", "collection", "collection_id", "key", "_change_type").collect())


def test_collections_filter_and_columns(spark, server):
    ids = setup(server)
    df = spark.read.format("dcp").options(**options(server, collections="shop.orders, other.logs")).load()
    assert rows_of(df) == sorted([("shop", "orders", ids["shop.orders"], f"k{i}", "upsert") for i in range(6)]
                                 + [("other", "logs", ids["other.logs"], f"k{i}", "upsert") for i in range(6)])
    values = {(r["collection"], r["value"]) for r in df.select("collection", "value").collect()}
    assert values == {("orders", '{"in":"shop.orders"}'), ("logs", '{"in":"other.logs"}')}
    everything = rows_of(spark.read.format("dcp").options(**options(server)).load())
    assert ("_default", "_default", 0, "k0", "upsert") in everything and len(everything) == 19


def test_a_dropped_collection_leaves_the_state_through_drop_rows(spark, server, tmp_path):
    ids = setup(server)
    writer = DeltaStateWriter(tmp_path / "state")
    first = spark.read.format("dcp").options(**options(server, scope="shop")).load()
    writer.apply(first, 0)
    state = {(r["collection"], r["key"]) for r in writer.read(spark).collect()}
    assert state == {(c, f"k{i}") for c in ("users", "orders") for i in range(6)}  # keyed by collection too
    change(server, lambda m: m.drop_collection("shop", "orders"))
    again = spark.read.format("dcp").options(**options(server, scope="shop")).load()
    drops = [r for r in rows_of(again) if r[4] == "drop"]
    # this read started after the drop: the manifest no longer names the collection; the name is
    # known only where the vbucket still sent the create event (from memory; on disk the drop
    # event replaced it), else empty. The id is always there, and the state has the names.
    assert drops and {r[2] for r in drops} == {ids["shop.orders"]}
    assert {r[:2] for r in drops} <= {("shop", "orders"), ("", "")}
    assert {r[3] for r in drops} == {""}
    writer.apply(again, 1)
    assert {(r["collection"], r["key"]) for r in writer.read(spark).collect()} == {
        ("users", f"k{i}") for i in range(6)}


def test_a_collection_made_again_under_a_filtered_name_replaces_the_old_one_in_the_state(spark, server, tmp_path):
    """`collections=shop.orders` between two micro-batches: shop.orders is dropped and made again
    (a new id) with new documents. The next batch drops the old id's keys from the state (a
    `drop` row, though the old id's drop event is not in the new id's stream) and follows the new
    one from where the stream stood."""
    ids = setup(server)
    writer = DeltaStateWriter(tmp_path / "state")

    def run_once():
        q = (spark.readStream.format("dcp").options(**options(server, collections="shop.orders,shop.users")).load()
             .writeStream.foreachBatch(writer.apply).option("checkpointLocation", str(tmp_path / "chk"))
             .trigger(availableNow=True).start())
        q.awaitTermination(120)
        assert q.exception() is None
        return {(r["collection"], r["collection_id"], r["key"]) for r in writer.read(spark).collect()}

    assert run_once() == {(c, ids[f"shop.{c}"], f"k{i}") for c in ("users", "orders") for i in range(6)}
    change(server, lambda m: m.drop_collection("shop", "orders"))
    change(server, lambda m: m.add_collection("shop", "orders"))
    new = cid_of(server, "shop", "orders")
    with server.login(features=FEATURES) as w:
        for i in range(3):
            put(w, new, f"n{i}".encode())
    assert new != ids["shop.orders"]
    assert run_once() == ({("users", ids["shop.users"], f"k{i}") for i in range(6)} |
                          {("orders", new, f"n{i}") for i in range(3)})


def test_history_on_puts_every_version_of_a_history_collection_in_the_change_log(spark, server, tmp_path):
    """`history=true` end to end: the change log of a collection with history=true holds every
    version of a key, in seqno order; without the option (or in a collection without history) the
    stream de-duplicates a snapshot's versions of a key; the state table keeps the last one."""
    from tests.client.test_collections import shop

    ids = shop(server, history=True)
    with server.login(features=FEATURES) as w:
        for i in range(4):
            put(w, ids["shop.orders"], b"order-1", b'{"v":%d}' % i)
            put(w, ids["shop.users"], b"user-1", b'{"v":%d}' % i)

    def versions(**extra):
        df = spark.read.format("dcp").options(**options(server, scope="shop", **extra)).load()
        rows = df.filter("_change_type = 'upsert'").select("collection", "key", "seqno", "value").collect()
        return {c: [r["value"] for r in sorted((r for r in rows if r["collection"] == c), key=lambda r: r["seqno"])]
                for c in ("orders", "users")}

    every = versions(history="true")
    assert every["orders"] == [f'{{"v":{i}}}' for i in range(4)] and every["users"] == ['{"v":3}']
    assert versions() == {"orders": ['{"v":3}'], "users": ['{"v":3}']}
    writer = DeltaStateWriter(tmp_path / "state")
    writer.apply(spark.read.format("dcp").options(**options(server, scope="shop", history="true")).load(), 0)
    assert {(r["collection"], r["key"], r["value"]) for r in writer.read(spark).collect()} == {
        ("orders", "order-1", '{"v":3}'), ("users", "user-1", '{"v":3}')}
