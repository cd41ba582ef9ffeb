"""Persistence paused and resumed through REST: writes are still acknowledged, but the persisted
seqno and SEQNO_PERSISTENCE stop moving until it resumes (the same switch as STOP_PERSISTENCE);
a server that stops while paused flushes everything and shuts down cleanly (no new failover
entry at the next start)."""

import select

from dcpflow.protocol.frame import request
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from ..conftest import keys_in
from .helpers import http_of, persisted, vb_state

VB = 9


def test_paused_persistence_holds_the_persisted_seqno_until_it_resumes(server):
    http = http_of(server)
    assert http.post("/pools/default/buckets", {"name": "other", "ramQuotaMB": "100", "numVBuckets": "4"}).status == 202
    keys = keys_in(VB, 3, prefix="p")
    with server.login() as w, server.login() as waiter, server.login(bucket="other") as other:
        other.num_vbuckets = 4
        w.set(keys[0], b"v")
        persisted(w, VB, 1)
        reply = http.post("/faults/buckets/default/persistence/pause")
        assert reply.status == 200 and reply.json == {"bucket": "default", "paused": True, "disk_queue_items": 0}
        assert w.set(keys[1], b"acknowledged").status == Status.SUCCESS
        assert w.get(keys[1]).value == b"acknowledged"  # served from memory
        opaque = waiter.next_opaque()
        waiter.send(request(Opcode.SEQNO_PERSISTENCE, extras=(2).to_bytes(8, "big"), vbucket=VB, opaque=opaque))
        # The flusher has had its turn once a later write to another bucket is persisted (it visits
        # every bucket on each pass): the paused one was skipped.
        other.set(b"elsewhere", b"v")
        persisted(other, other.vbucket_of(b"elsewhere"), 1)
        assert vb_state(server, VB)["persisted"] == 1
        assert select.select([waiter.sock], [], [], 0)[0] == []  # SEQNO_PERSISTENCE has not answered
        assert w.stats()["ep_persistence_paused"] == "1"
        active = http.get("/faults").json["persistence_paused"]
        assert active == [{"bucket": "default", "disk_queue_items": 1}]
        assert http.post("/faults/buckets/default/persistence/resume").json["paused"] is False
        answer = waiter.recv()
        assert (answer.opaque, answer.status) == (opaque, Status.SUCCESS)
        assert vb_state(server, VB)["persisted"] == 2
        assert http.get("/faults").json["persistence_paused"] == []


def test_a_server_stopped_while_paused_flushes_everything_and_shuts_down_clean(make_server):
    server = make_server()
    http = http_of(server)
    keys = keys_in(VB, 4, prefix="c")
    with server.login() as w:
        w.set(keys[0], b"v")
        persisted(w, VB, 1)
        assert http.post("/faults/buckets/default/persistence/pause").status == 200
        for k in keys[1:]:
            assert w.set(k, b"in memory").status == Status.SUCCESS
    before = vb_state(server, VB)
    assert (before["high"], before["persisted"]) == (4, 1)
    server.stop()  # returns (the fixture asserts the thread ended): the pause did not hold it up
    again = make_server()
    after = vb_state(again, VB)
    assert (after["high"], after["persisted"]) == (4, 4)
    assert after["log"] == before["log"]  # a clean shutdown: no new failover entry
    with again.login() as r:
        assert all(r.get(k).status == Status.SUCCESS for k in keys)
    assert http_of(again).get("/faults").json["persistence_paused"] == []  # a pause does not outlive the process


def test_stop_persistence_is_the_same_switch_and_clear_resumes_it(server):
    http = http_of(server)
    with server.login() as admin:
        assert admin.call(Opcode.STOP_PERSISTENCE).status == Status.SUCCESS
        assert [p["bucket"] for p in http.get("/faults").json["persistence_paused"]] == ["default"]
        assert http.request("DELETE", "/faults").json["persistence_resumed"] == ["default"]
        assert admin.stats()["ep_persistence_paused"] == "0"
    assert http.post("/faults/buckets/nope/persistence/pause").status == 404
    assert http.post("/faults/buckets/default/persistence/pause", {"now": "1"}).status == 400
