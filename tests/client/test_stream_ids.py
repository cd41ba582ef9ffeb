"""DCP stream-ids in the client: with `stream_ids=True` a client's reads share one DCP connection
per node, each read under its own `sid` (stream-request-value.md), over real sockets with
dcpflow's server: filtered reads of different collections from different positions, the window
a closed read leaves behind, a lost connection, and the reads that keep their own connection."""

import asyncio

import pytest

from dcpflow.client import DcpClient, Offset
from dcpflow.client import connection as connection_mod
from dcpflow.protocol.dcp import DcpBufferAck, DcpStreamEnd, StreamEndReason
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import HEADER, stream_id_frame, unframe_stream_id
from dcpflow.server.mgmt import dcpview

from .conftest import NUM_VBUCKETS, PASSWORD, USER, run, url
from .test_collections import FEATURES, docs_by_collection, fill, put, shop


def producers(st) -> list:
    """The server's DCP producer connections: (name, {(vbucket, sid), ...} of their streams)."""
    return st.call(lambda: [(v.name, {(s.vb, s.sid) for s in v.streams})
                            for v in dcpview.views(st.server) if v.type == "producer"])


async def drain(reader, into: list) -> None:
    async for event in reader:
        into.append(event)


def test_two_filtered_reads_share_one_connection_each_under_its_own_stream_id(server):
    ids = shop(server)
    written = fill(server, ids, n=40)
    seen: dict = {}

    async def go(stream_ids: bool):
        async with await DcpClient.connect(url(server.port), USER, PASSWORD, stream_ids=stream_ids) as c:
            orders, users = [], []
            r1 = c.events(collections=["shop.orders"], end="now")
            r2 = c.events(collections=["shop.users"], end="now", start="now")  # nothing new: ends at once
            r3 = c.events(collections=["shop.users"], end="now")
            first = asyncio.create_task(drain(r1, orders))
            await asyncio.sleep(0)
            await drain(r2, [])
            await drain(r3, users)
            await first
            # every vbucket's stream of each read was open at the same time on the same producer
            seen[stream_ids] = (c.shared.opened if c.shared else None, r1.stats, r3.stats)
            return c.names, orders, users

    names, orders, users = run(go(True))
    assert docs_by_collection(orders, names) == {"shop.orders": written["shop.orders"]}
    assert docs_by_collection(users, names) == {"shop.users": written["shop.users"]}
    opened, s1, s3 = seen[True]
    assert opened == 1 and s1["shared_connections"] == 1 and s3["shared_connections"] == 1
    assert s1.get("connections", 0) == 0 and s3.get("connections", 0) == 0
    names, orders, users = run(go(False))  # the same reads without: a connection each
    assert docs_by_collection(orders, names) == {"shop.orders": written["shop.orders"]}
    _, s1, s3 = seen[False]
    assert s1["connections"] == 1 and s3["connections"] == 1 and "shared_connections" not in s1


def test_the_server_sees_one_producer_with_a_stream_per_vbucket_and_read(server):
    ids = shop(server)
    fill(server, ids, n=3)

    async def go():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD, stream_ids=True) as c:
            r1 = c.events(collections=["shop.orders"])  # unbounded: both stay open
            r2 = c.events(collections=["other.logs"])
            it1, it2 = r1.__aiter__(), r2.__aiter__()
            await it1.__anext__()
            await it2.__anext__()
            found = producers(server)
            sids = (r1.feed.sid, r2.feed.sid)
            await r1.aclose()
            await r2.aclose()
            return found, sids

    found, sids = run(go())
    assert len(found) == 1, found
    _, streams = found[0]
    assert sids[0] != sids[1]
    assert streams == {(vb, sid) for vb in range(NUM_VBUCKETS) for sid in sids}


def test_a_closed_read_gives_the_shared_window_back(server):
    """The producer stops at the buffer size of unacknowledged bytes per connection: a read closed
    with data queued and in flight must acknowledge it, or the reads left on the connection stall.
    A small buffer and a read that never consumes make that certain."""
    ids = shop(server)
    with server.login(features=FEATURES) as w:
        for i in range(300):
            put(w, ids["shop.orders"], f"o{i}".encode(), b'{"pad":"' + b"x" * 1000 + b'"}')
            put(w, ids["shop.users"], f"u{i}".encode(), b'{"pad":"' + b"y" * 1000 + b'"}')

    async def go():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD, stream_ids=True,
                                           buffer_size=32 * 1024) as c:
            stalled = c.events(collections=["shop.orders"])
            it = stalled.__aiter__()
            await it.__anext__()  # open, then never consumed again: it holds the window
            conn = next(iter(stalled.feed._conns.values()))
            while conn.charged_total - conn.acked_total < 24 * 1024:  # the window is (nearly) full
                await asyncio.sleep(0.01)
            await stalled.aclose()
            users = []
            await asyncio.wait_for(drain(c.events(collections=["shop.users"], end="now"), users), 30)
            return c.names, users

    names, users = run(go())
    assert docs_by_collection(users, names) == {"shop.users": {f"u{i}".encode() for i in range(300)}}


def test_a_lost_shared_connection_reopens_every_read_on_it(server):
    ids = shop(server)
    written = fill(server, ids, n=20)

    async def go():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD, stream_ids=True) as c:
            r1 = c.events(collections=["shop.orders"])
            r2 = c.events(collections=["shop.users"])
            got1, got2 = [], []
            it1, it2 = r1.__aiter__(), r2.__aiter__()
            got1.append(await it1.__anext__())
            got2.append(await it2.__anext__())
            dropped = server.call(lambda: server.server.faults.drop_connections(bucket=None, name=None))
            assert dropped["dropped"] >= 1
            more = fill(server, {"shop.orders": ids["shop.orders"], "shop.users": ids["shop.users"]}, n=25)
            want1 = written["shop.orders"] | more["shop.orders"]
            want2 = written["shop.users"] | more["shop.users"]

            async def until(it, got, name, want):
                while docs_by_collection(got, c.names).get(name) != want:
                    got.append(await it.__anext__())

            await asyncio.wait_for(asyncio.gather(until(it1, got1, "shop.orders", want1),
                                                  until(it2, got2, "shop.users", want2)), 30)
            stats = (r1.stats, r2.stats, c.shared.opened)
            await r1.aclose()
            await r2.aclose()
            return stats

    s1, s2, opened = run(go())
    assert s1["connections_lost"] == 1 and s2["connections_lost"] == 1
    assert opened == 2  # the first and the one both reads reopened on


def test_sync_write_reads_keep_their_own_connection(server):
    """KV-Engine does not combine stream-ids with sync writes (control.md): such a read opens its
    own connection, and a read on the shared one still gets its stream-id."""
    ids = shop(server)
    fill(server, ids, n=2)

    async def go():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD, stream_ids=True) as c:
            sync = c.events(end="now", sync_writes=True)
            plain = c.events(collections=["shop.orders"], end="now")
            await drain(sync, [])
            await drain(plain, [])
            return sync.stats, plain.stats

    sync, plain = run(go())
    assert sync["connections"] == 1 and "shared_connections" not in sync
    assert plain["shared_connections"] == 1


def test_a_server_that_refuses_stream_ids_gets_a_connection_per_read(server, monkeypatch):
    """enable_stream_id refused (a server before 6.5 answers EINVAL): each read opens its own."""
    ids = shop(server)
    written = fill(server, ids, n=5)
    real = connection_mod.DcpControl

    def refusing(key, value, opaque=0):
        return real(b"enable_stream_ids_unknown" if key == b"enable_stream_id" else key, value, opaque)

    monkeypatch.setattr(connection_mod, "DcpControl", refusing)

    async def go():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD, stream_ids=True) as c:
            a, b = [], []
            r1 = c.events(collections=["shop.orders"], end="now")
            r2 = c.events(collections=["shop.users"], end="now")
            await asyncio.gather(drain(r1, a), drain(r2, b))
            return c.names, a, b, r1.stats, r2.stats

    names, a, b, s1, s2 = run(go())
    assert docs_by_collection(a, names) == {"shop.orders": written["shop.orders"]}
    assert docs_by_collection(b, names) == {"shop.users": written["shop.users"]}
    assert s1["connections"] == 1 and s2["connections"] == 1


def test_resume_from_saved_offsets_of_a_shared_read(server):
    ids = shop(server)
    saved_offsets: list = []
    first = fill(server, ids, n=10)

    async def go():
        async with await DcpClient.connect(url(server.port, stream_ids="true"), USER, PASSWORD) as c:
            assert c.shared is not None  # the connection-string option
            r = c.events(collections=["shop.orders"], end="now")
            await drain(r, [])
            saved = r.offsets
            saved_offsets.extend(saved.values())
        more = fill(server, {"shop.orders": ids["shop.orders"]}, n=15)
        async with await DcpClient.connect(url(server.port), USER, PASSWORD, stream_ids=True) as c:
            got = []
            await drain(c.events(collections=["shop.orders"], start=saved, end="now"), got)
            return c.names, got, more

    names, got, more = run(go())
    assert first["shop.orders"] < more["shop.orders"]
    assert docs_by_collection(got, names) == {"shop.orders": more["shop.orders"]}  # all written again after
    assert all(isinstance(o, Offset) and o.seqno > 0 for o in saved_offsets)


def test_unframe_stream_id_gives_the_classic_frame():
    classic = HEADER.pack(0x80, 0x57, 3, 4, 1, 7, 3 + 4 + 5, 0x1234, 99) + b"eeee" + b"key" + b"value"
    head = HEADER.unpack(classic[:24])
    framing = stream_id_frame(513)
    alt = bytes([0x08, head[1], len(framing), 3, 4, 1]) + (7).to_bytes(2, "big") + \
        (len(framing) + 12).to_bytes(4, "big") + (0x1234).to_bytes(4, "big") + (99).to_bytes(8, "big") + \
        framing + b"eeeekeyvalue"
    buf = b"junk" + alt
    assert unframe_stream_id(buf, 4, len(buf)) == (513, classic)
    assert unframe_stream_id(classic, 0, len(classic)) == (None, classic)
    no_sid = bytes([0x08, 0x57, 0, 3, 4, 1]) + alt[6:8] + (12).to_bytes(4, "big") + alt[12:24] + b"eeeekeyvalue"
    with pytest.raises(ProtocolError, match="no DCP stream-id"):
        unframe_stream_id(no_sid, 0, len(no_sid))
    with pytest.raises(ProtocolError, match="do not fit"):
        unframe_stream_id(alt[:-1], 0, len(alt) - 1)


def test_the_connection_routes_by_stream_id_and_acks_what_no_read_holds():
    """Each stream-id's messages reach its read's sink in classic framing, charged their wire
    size; the messages of an id no read holds are acknowledged at once (the shared window)."""
    async def go():
        conn = connection_mod.Connection(("127.0.0.1", 1))
        sent: list[bytes] = []

        class Transport:
            def write(self, data):
                sent.append(data)

            def is_closing(self):
                return False

            def get_extra_info(self, name):
                return None

        conn.connection_made(Transport())
        conn.buffer_size, conn.ack_threshold = 1 << 20, 1
        got = []
        conn.sinks = {5: got.append}
        mine = [DcpStreamEnd(vb, StreamEndReason.OK, opaque=vb, stream_id=5).encode() for vb in (1, 2)]
        other = DcpStreamEnd(3, StreamEndReason.CLOSED, opaque=3, stream_id=9).encode()
        wire = mine[0] + other + mine[1]
        view = conn.get_buffer(len(wire))
        view[:len(wire)] = wire
        conn.buffer_updated(len(wire))
        return got, sent, conn, len(mine[0]) + len(mine[1]), len(other)

    got, sent, conn, mine_len, other_len = asyncio.run(go())
    assert len(got) == 1 and got[0].charged == mine_len
    seg = got[0]
    classic = [bytes(seg.data[a:b]) for a, b in zip(seg.starts, list(seg.starts[1:]) + [seg.end], strict=True)]
    assert classic == [DcpStreamEnd(vb, StreamEndReason.OK, opaque=vb).encode() for vb in (1, 2)]
    assert sent == [DcpBufferAck(other_len).encode()]
    assert conn.charged_total == mine_len + other_len
