"""Delayed KV replies through REST: a rule holds the requests of an opcode (or all) before they run,
on connections opened before or after it; replies stay in order; other opcodes and connections
are served; clearing a rule, or its duration running out, releases what it holds; a connection
flooding requests behind a held one stops being read (bounded memory); bad rules get 400s.
dcpflow's client reads through delayed stream requests."""

import contextlib
import select
import socket
import threading
import time

import pytest

from dcpflow.client import DcpClient as AppClient
from dcpflow.client import Mutation
from dcpflow.protocol.frame import request
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from dcpflow.server.connection import MAX_PENDING_INPUT
from tests.client.conftest import run, url

from ..conftest import keys_in
from .helpers import PASSWORD, USER, http_of


def held_now(http, opcode: str) -> int:
    return sum(r["held_now"] for r in http.get("/faults").json["delays"] if r["opcode"] == opcode)


def wait_for(condition, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} not met within {timeout} s"
        time.sleep(0.01)


def test_a_rule_holds_its_opcode_in_order_until_cleared(server):
    http = http_of(server)
    with server.login() as before, server.login() as other:
        reply = http.post("/faults/delays", {"opcode": "get", "seconds": "30"})
        assert reply.status == 200, reply
        assert reply.json == {"opcode": "GET", "seconds": 30.0, "remaining_seconds": None, "held_now": 0,
                              "held_total": 0}
        with server.login() as after:
            for c in (before, after):  # a connection from before the rule, and one opened after it
                assert c.set(b"k", b"v").status == Status.SUCCESS  # SET is not held
                get, noop = c.next_opaque(), c.next_opaque()
                c.send(request(Opcode.GET, key=c.key(b"k"), vbucket=c.vbucket_of(b"k"), opaque=get) +
                       request(Opcode.NOOP, opaque=noop))
            wait_for(lambda: held_now(http, "GET") == 2, what="both GETs held")
            assert other.call(Opcode.NOOP).status == Status.SUCCESS  # others go on meanwhile
            assert other.set(b"k2", b"v").status == Status.SUCCESS
            assert select.select([before.sock, after.sock], [], [], 0)[0] == []  # nothing answered yet
            assert http.delete("/faults/delays/GET").json == {"delays_cleared": ["GET"]}
            for c in (before, after):
                first, second = c.recv_n(2)
                assert (first.opcode, first.status, first.value) == (Opcode.GET, Status.SUCCESS, b"v")
                assert second.opcode == Opcode.NOOP  # in order: the NOOP waited behind the GET
            assert before.get(b"k").value == b"v"  # and the fast path is back
    assert http.get("/faults").json["delays"] == []


def test_a_delay_lasts_its_seconds_and_a_rule_its_duration(server):
    http = http_of(server)
    with server.login() as c:
        assert http.post("/faults/delays", {"opcode": "0x0a", "seconds": "0.3"}).json["opcode"] == "NOOP"
        started = time.monotonic()
        assert c.call(Opcode.NOOP).status == Status.SUCCESS
        assert time.monotonic() - started >= 0.29
        held = http.post("/faults/delays", b'{"opcode": "all", "seconds": 30, "duration": 0.5}',
                         headers={"Content-Type": "application/json"}).json
        assert held["opcode"] == "all" and 0 < held["remaining_seconds"] <= 0.5
        started = time.monotonic()
        assert c.call(Opcode.VERSION).status == Status.SUCCESS  # held by the rule for all until it ended
        assert time.monotonic() - started < 30
        assert [r["opcode"] for r in http.get("/faults").json["delays"]] == ["NOOP"]
        assert [r["fault"] for r in http.get("/faults").json["recent"]] == ["delay", "delay"]
        assert http.request("DELETE", "/faults").json["delays_cleared"] == ["NOOP"]


def test_a_flood_behind_a_held_request_stops_being_read(server):
    http = http_of(server)
    assert http.post("/faults/delays", {"opcode": "GET", "seconds": "60"}).status == 200
    c = server.login()
    c.send(request(Opcode.GET, key=c.key(b"k"), vbucket=c.vbucket_of(b"k")))
    wait_for(lambda: held_now(http, "GET") == 1)
    flood = request(Opcode.NOOP) * (24 * 1024 * 1024 // 24)

    def send():
        with contextlib.suppress(OSError):  # the socket is shut down under it at the end
            c.sock.sendall(flood)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()

    def paused():
        return server.call(lambda: [conn._decoder.buffered for conn in server.server.connections
                                    if conn._reading_paused])

    wait_for(lambda: paused(), what="the flooding connection paused")
    [buffered] = paused()
    assert buffered <= MAX_PENDING_INPUT + (1 << 20)  # at most one more read than the limit
    c.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked sender
    sender.join(10)
    assert not sender.is_alive()
    c.sock.close()
    assert http.delete("/faults/delays").json == {"delays_cleared": ["GET"]}
    with server.login() as again:
        assert again.call(Opcode.NOOP).status == Status.SUCCESS


@pytest.mark.parametrize("form, field", [
    ({"seconds": "0"}, "seconds"), ({"seconds": "-1"}, "seconds"), ({"seconds": "61"}, "seconds"),
    ({"seconds": "nan"}, "seconds"), ({"seconds": "inf"}, "seconds"), ({"seconds": "soon"}, "seconds"),
    ({}, "seconds"), ({"seconds": "1", "duration": "0"}, "duration"),
    ({"seconds": "1", "duration": "86401"}, "duration"), ({"seconds": "1", "opcode": "FROB"}, "opcode"),
    ({"seconds": "1", "opcode": "256"}, "opcode"), ({"seconds": "1", "opcode": "0x1ff"}, "opcode"),
    ({"seconds": "1", "opcodes": "GET"}, "opcodes"),
])
def test_bad_rules_are_refused(server, form, field):
    reply = http_of(server).post("/faults/delays", form)
    assert reply.status == 400 and field in reply.json["errors"], reply
    assert http_of(server).get("/faults").json["delays"] == []


def test_clearing_what_is_not_there(server):
    http = http_of(server)
    assert http.delete("/faults/delays/GET").status == 404
    assert http.delete("/faults/delays/FROB").status == 400
    assert http.delete("/faults/delays").json == {"delays_cleared": []}


def test_the_client_reads_through_delayed_stream_requests(server):
    http = http_of(server)
    vbs = [1, 2, 3]
    written = {}
    with server.login() as w:
        for vb in vbs:
            for k in keys_in(vb, 5, prefix="slowreq"):
                w.set(k, b"v%d" % vb)
                written[k] = b"v%d" % vb
    for opcode in ("DCP_STREAM_REQ", "GET_ALL_VB_SEQNOS"):
        assert http.post("/faults/delays", {"opcode": opcode, "seconds": "0.2"}).status == 200

    async def go():
        async with await AppClient.connect(url(server.port), USER, PASSWORD) as c:
            got = {}
            async for ev in c.events(vbs, end="now"):
                if isinstance(ev, Mutation):
                    got[ev.key] = ev.value
            return got

    assert run(go(), timeout=60) == written
    totals = {r["opcode"]: r["held_total"] for r in http.get("/faults").json["delays"]}
    assert totals["DCP_STREAM_REQ"] >= len(vbs) and totals["GET_ALL_VB_SEQNOS"] >= 1
