"""Dropped connections through REST: by DCP connection name, by bucket, or all, cut at once; the
others keep being served, and so does the management listener. dcpflow's client reconnects and
ends with the server's contents, nothing delivered twice."""

import asyncio

from dcpflow.client import DcpClient as AppClient
from dcpflow.protocol import dcp
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from tests.client.conftest import contents, run, url, write
from tests.dcp.client import DcpClient, items
from tests.server.client import RawClient

from ..conftest import keys_in
from .helpers import PASSWORD, USER, Follower, Mirror, caught_up, high_seqnos, http_of, raw


def alive(c: RawClient) -> bool:
    return c.call(Opcode.NOOP).status == Status.SUCCESS


def test_drop_by_dcp_name_cuts_that_connection_only(server):
    http = http_of(server)
    with DcpClient(server.port) as a, DcpClient(server.port) as b:
        for c, name in ((a, "victim"), (b, "bystander")):
            c.num_vbuckets = 64
            c.connect(name=name)
            assert c.stream_request(4).status == Status.SUCCESS
        reply = http.post("/faults/connections/drop", {"name": "victim"})
        assert reply.status == 200, reply
        assert reply.json["dropped"] == 1
        assert [(x["bucket"], x["dcp"]) for x in reply.json["connections"]] == [("default", "victim")]
        assert a.is_closed()
        key = keys_in(4, 1, prefix="drop")[0]
        with server.login() as w:
            w.set(key, b"v")
        assert items(b.messages_until(lambda m: isinstance(m, dcp.DcpMutation)))[0].key == key


def test_drop_by_bucket_leaves_other_buckets_and_unselected_connections(server):
    http = http_of(server)
    assert http.post("/pools/default/buckets", {"name": "other", "ramQuotaMB": "100", "numVBuckets": "4"}).status == 202
    with server.login() as mine, server.login(bucket="other") as theirs, server.client() as lobby:
        lobby.hello()
        reply = http.post("/faults/connections/drop", b'{"bucket": "default"}',
                          headers={"Content-Type": "application/json"})
        assert reply.json["dropped"] == 1 and reply.json["connections"][0]["bucket"] == "default"
        assert mine.is_closed()
        assert alive(theirs) and alive(lobby)
    assert http.post("/faults/connections/drop", {"bucket": "nope"}).status == 404


def test_drop_all_and_what_is_refused(server):
    http = http_of(server)
    for form in ({}, {"all": "true", "bucket": "default"}, {"all": "false"}, {"all": "maybe"}, {"name": ""},
                 {"who": "everyone"}):
        reply = http.post("/faults/connections/drop", form)
        assert reply.status == 400 and "errors" in reply.json, (form, reply)
    with server.login() as a, server.client() as b:
        assert alive(a) and alive(b)
        reply = http.post("/faults/connections/drop", {"all": "1"})
        assert reply.json["dropped"] == 2
        assert a.is_closed() and b.is_closed()
    assert http.get("/faults").status == 200  # the management listener is not the KV port
    with server.login() as again:
        assert again.set(b"after", b"v").status == Status.SUCCESS
    assert [r["fault"] for r in http.get("/faults").json["recent"]] == ["drop-connections"]


def test_the_client_reconnects_and_ends_with_the_servers_contents(server):
    http = http_of(server)
    universe = [f"doc{i}".encode() for i in range(100)] + [f"after{i}".encode() for i in range(40)]
    with raw(server.port) as w:
        write(w, 100)

    async def go():
        loop = asyncio.get_running_loop()
        async with await AppClient.connect(url(server.port, reconnect_timeout=30), USER, PASSWORD) as c:
            stream = c.events()
            mirror = Mirror()
            f = Follower(stream, mirror)
            await f.until(lambda: len(mirror.ids) >= 100)
            reply = await loop.run_in_executor(None, http.post, "/faults/connections/drop", {"bucket": "default"})
            assert reply.json["dropped"] >= 1
            with raw(server.port) as w:
                await loop.run_in_executor(None, write, w, 40, "after")
                highs = high_seqnos(w)
            await f.until(caught_up(stream, highs))
            return mirror, await f.stop()

    mirror, stats = run(go(), timeout=90)
    with raw(server.port) as r:
        truth = contents(r, universe)
    assert mirror.state() == truth and len(truth) == 140
    assert len(mirror.ids) == len(set(mirror.ids)) == 140 and not mirror.rollbacks
    assert stats["connections_lost"] >= 1 and stats["reopens"] >= 1
