"""Full eviction through the server (engine/eviction.py): the `--eviction-policy` flag and ns_server's
`evictionPolicy` over REST, and documents that are only on disk served over KV and DCP."""

import asyncio

from dcpflow.client import DcpClient, Mutation
from dcpflow.protocol.frame import request
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from tests.resources import wait_for

from .mgmt.rest_client import http_of


def evict_everything(server, engine) -> int:
    """Wait until the flusher has persisted every write, then evict every document."""
    wait_for(lambda: server.call(lambda: engine.stats()["ep_queue_size"]) == 0, what="the flusher to catch up")

    def evict() -> int:
        n = 0
        for vb in engine.vbuckets.values():
            for key in list(vb.ht):
                vb.evict_key(key)
                n += 1
        return n
    return server.call(evict)


def test_non_resident_documents_over_kv_and_dcp(make_server):
    server = make_server(eviction_policy="fullEviction")
    engine = server.server.buckets["default"].engine
    assert engine.eviction_policy == "fullEviction"
    docs = {f"doc{i}".encode(): b'{"n": %d}' % i for i in range(300)}
    with server.login() as c:
        for key, value in docs.items():
            assert c.set(key, value).status == Status.SUCCESS
    assert evict_everything(server, engine) == 300
    assert server.call(lambda: sum(len(vb.ht) for vb in engine.vbuckets.values())) == 0

    async def backfill() -> dict[bytes, bytes]:
        async with await DcpClient.connect(f"couchbase://127.0.0.1:{server.port}/default", "Administrator",
                                           "password") as c:
            return {ev.key: bytes(ev.value) async for ev in c.events(end="now") if isinstance(ev, Mutation)}
    streamed = asyncio.run(asyncio.wait_for(backfill(), 60))
    assert streamed == docs  # from the store: nothing was brought back into memory for it
    assert server.call(lambda: sum(len(vb.ht) for vb in engine.vbuckets.values())) == 0

    with server.login() as c:
        assert c.get(b"doc7").value == docs[b"doc7"]
        assert c.get(b"nosuch").status == Status.KEY_ENOENT
        stats = c.stats()
        assert stats["ep_item_eviction_policy"] == "full_eviction"
        assert stats["curr_items"] == "300" and int(stats["ep_bg_fetched"]) == 1
        assert int(stats["ep_bfilter_negatives"]) >= 1 and stats["ep_bfilter_enabled"] == "1"


def test_pipelined_gets_of_documents_on_disk_are_read_in_batches(make_server):
    """kv_engine batches background fetches: a window of 64 GETs of documents only on disk is read
    by a few store jobs (bg_fetch.py), not 64 - one worker-thread hand-off each way per GET held a
    read-back of millions of documents to ~2,000 GETs/s on a busy machine. Every reply is right."""
    server = make_server(eviction_policy="fullEviction")
    bucket = server.server.buckets["default"]
    engine = bucket.engine
    docs = {f"doc{i:03d}".encode(): b'{"n": %d}' % i for i in range(64)}
    with server.login() as c:
        for key, value in docs.items():
            assert c.set(key, value).status == Status.SUCCESS
        assert evict_everything(server, engine) == 64
        before, negatives = bucket.bg_fetcher.batches, int(c.stats()["ep_bfilter_negatives"])
        keys = [*list(docs)[:32], b"nosuch", *list(docs)[32:]]  # a miss among them: answered, counted once
        c.send(b"".join(request(Opcode.GET_K, key=k, vbucket=c.vbucket_of(k), opaque=i) for i, k in enumerate(keys)))
        replies = [c.recv() for _ in keys]
        assert [r.opaque for r in replies] == list(range(len(keys)))  # in order
        assert replies[32].status == Status.KEY_ENOENT
        del replies[32]
        assert {r.key: bytes(r.value) for r in replies} == docs
        assert all(r.status == Status.SUCCESS for r in replies)
        assert bucket.bg_fetcher.keys_read == 64 and bucket.bg_fetcher.batches - before <= 8
        stats = c.stats()
        assert int(stats["ep_bg_fetched"]) == 64
        assert (int(stats["ep_bfilter_negatives"]) - negatives, int(stats["get_misses"])) == (1, 1)


def test_eviction_policy_over_rest(make_server):
    server = make_server()
    http = http_of(server)
    assert http.get("/pools/default/buckets/default").json["evictionPolicy"] == "valueOnly"
    created = http.post("/pools/default/buckets", {"name": "cold", "ramQuotaMB": "100",
                                                   "evictionPolicy": "fullEviction", "numVBuckets": "8"})
    assert created.status == 202
    assert http.get("/pools/default/buckets/cold").json["evictionPolicy"] == "fullEviction"
    engine = server.server.buckets["cold"].engine
    assert engine.eviction_policy == "fullEviction"
    with server.login(bucket="cold") as c:
        c.num_vbuckets = 8
        for i in range(50):
            c.set(b"k%d" % i, b"v")
    evict_everything(server, engine)
    assert http.post("/pools/default/buckets/cold", {"evictionPolicy": "valueOnly"}).status == 200
    assert http.get("/pools/default/buckets/cold").json["evictionPolicy"] == "valueOnly"
    assert engine.eviction_policy == "valueOnly"
    assert server.call(lambda: sum(len(vb.ht) for vb in engine.vbuckets.values())) == 50  # keys back in memory
    refused = http.post("/pools/default/buckets/cold", {"evictionPolicy": "nruEviction"})
    assert refused.status == 400 and "evictionPolicy" in refused.json["errors"]
    with server.login(bucket="cold") as c:
        c.num_vbuckets = 8
        assert c.get(b"k3").value == b"v"
