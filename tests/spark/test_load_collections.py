"""The demo's workload in named collections: made by the SDK's collection manager, each kind of
document in its own collection, bursts of successive versions reproducible from the seed."""

from datetime import timedelta

import pytest

from dcpflow.client.workload import (
    COLLECTION_OF,
    ByKind,
    Loader,
    Workload,
    burst_round,
    churn_round,
    create_collections,
    load_initial,
    make_doc,
)
from tests.server.conftest import sdk_server  # noqa: F401  (fixture reused)
from tests.server.mgmt.rest_client import Http


@pytest.fixture(scope="module")
def shop(sdk_server):  # noqa: F811
    magma = Http(sdk_server.mgmt_port).post("/pools/default/buckets/default", {"storageBackend": "magma"})
    assert magma.status == 200, magma.text  # `orders` keeps history: the bucket must be magma
    loader = Loader(f"couchbase://127.0.0.1:{sdk_server.port}/default", "Administrator", "password")
    try:
        create_collections(loader, "shop", history=("orders",), max_ttl={"sessions": 3600})
        yield loader
    finally:
        loader.close()


def test_the_collection_manager_makes_one_collection_per_kind_with_its_settings(shop):
    scopes = {s.name: {c.name: (c.max_expiry, c.history) for c in s.collections}
              for s in shop.bucket.collections().get_all_scopes()}
    assert scopes["shop"] == {"users": (timedelta(0), False), "products": (timedelta(0), False),
                              "orders": (timedelta(0), True), "sessions": (timedelta(seconds=3600), False)}
    with pytest.raises(ValueError, match="carts"):
        create_collections(shop, "other", history=("carts",))
    assert "other" not in {s.name for s in shop.bucket.collections().get_all_scopes()}  # nothing made


def test_each_kind_lands_in_its_collection_and_is_counted(shop):
    work = Workload(docs=300, updates=30, deletes=10, expiring=5, ttl=3600, rounds=1)
    loader = ByKind(shop, "shop")
    keys = load_initial(loader, work)
    did = churn_round(loader, work, 0)
    burst = burst_round(loader, work, 0, keys=4, versions=3)
    assert burst == 2 * 4 * 3
    live = [k for k, v in work.versions.items() if v >= 0]
    assert set(loader.get_all(live)) == set(live)
    for kind, name in COLLECTION_OF.items():
        mine = {k for k in live if k.startswith(kind + "::")}
        assert set(shop.in_collection("shop", name).get_all(live)) == mine  # here, and only here
    assert not shop.get_all(live)  # nothing in the default collection
    assert sum(loader.written.values()) == len(keys) + did["updates"] + did["expiring"] + burst
    assert sum(loader.removed.values()) == did["deletes"]


def test_a_burst_writes_successive_versions_of_the_same_keys_for_a_seed(shop):
    loader = ByKind(shop, "shop")

    def run(seed):
        work = Workload(docs=200, seed=seed)
        load_initial(loader, work)
        before = dict(loader.written)
        burst_round(loader, work, 2, keys=5, versions=3)
        bumped = sorted(k for k, v in work.versions.items() if v)
        wrote = {n: loader.written[n] - before.get(n, 0) for n in loader.written}
        return bumped, [work.versions[k] for k in bumped], wrote

    bumped, versions, wrote = run(42)
    assert len(bumped) == 10 and versions == [3] * 10  # 5 users and 5 orders, 3 versions each
    assert {k.partition("::")[0] for k in bumped} == {"user", "order"}
    assert wrote == {"users": 15, "orders": 15, "products": 0, "sessions": 0}
    assert loader.get_all(bumped) == {k: make_doc(k, 3, 42) for k in bumped}
    assert run(42) == (bumped, versions, wrote) and run(7)[0] != bumped
