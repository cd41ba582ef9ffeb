"""Two dcpflow servers as one cluster: the client follows the cluster map - one DCP connection per
node that owns requested vbuckets - and when a vbucket moves, it re-maps and reopens it there."""

import asyncio
import contextlib
import socket

from dcpflow.client import DcpClient, Mutation, Rollback
from dcpflow.protocol.config import Node
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from dcpflow.server import ServerConfig
from tests.server.client import RawClient

from .conftest import NUM_VBUCKETS, PASSWORD, USER, ServerThread, keys_in, run, url, users_db


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def cluster(tmp_path):
    ports = free_ports(2)
    nodes = [Node(p) for p in ports]
    servers = []
    for i, port in enumerate(ports):
        cfg = ServerConfig(data_dir=tmp_path / f"n{i}", port=port, num_vbuckets=NUM_VBUCKETS, users=users_db(),
                           synchronous="NORMAL", flush_interval=0.02, nodes=nodes, this_node=i)
        servers.append(ServerThread(cfg).start())
    half = NUM_VBUCKETS // 2
    vbmap = [[0] if vb < half else [1] for vb in range(NUM_VBUCKETS)]
    for i, st in enumerate(servers):
        with st.login() as admin:
            for vb in range(NUM_VBUCKETS):
                if vbmap[vb][0] == i:
                    assert admin.call(Opcode.SET_VBUCKET, extras=bytes([1]), vbucket=vb).status == Status.SUCCESS
        st.call(st.server.topology.set_vbucket_map, "default", vbmap)
    return servers, vbmap


def owner_client(servers, vbmap, vb) -> RawClient:
    c = RawClient(servers[vbmap[vb][0]].port)
    c.num_vbuckets = NUM_VBUCKETS
    return c.login()


def test_one_connection_per_node_and_a_moved_vbucket_is_followed(tmp_path):
    servers, vbmap = cluster(tmp_path)
    try:
        written = {}
        for vb in (1, 2, 40, 41):
            with owner_client(servers, vbmap, vb) as w:
                for k in keys_in(vb, 3, prefix=f"v{vb}-"):
                    assert w.set(k, b"x", vbucket=vb).status == Status.SUCCESS
                    written[k] = vb

        async def go():
            # Bootstrap from node 0 only: node 1 is found through the map.
            async with await DcpClient.connect(url(servers[0].port, reconnect_timeout=20), USER, PASSWORD) as c:
                stream = c.events([1, 2, 40, 41])
                got, events = {}, []

                async def read():
                    async for ev in stream:
                        events.append(ev)
                        if isinstance(ev, Mutation):
                            got[ev.key] = ev.vbucket
                task = asyncio.ensure_future(read())
                while len(got) < len(written):
                    await asyncio.sleep(0.02)
                connections = stream.stats["connections"]
                # Move vbucket 40 from node 1 to node 0 (no data copy: node 0's copy is new and empty, so
                # the client is told to roll back to zero there), then write to it on node 0.
                loop = asyncio.get_running_loop()

                def move():
                    vbmap[40] = [0]
                    with RawClient(servers[0].port) as a0:
                        a0.login()
                        assert a0.call(Opcode.SET_VBUCKET, extras=bytes([1]), vbucket=40).status == Status.SUCCESS
                    for st in servers:
                        st.call(st.server.topology.set_vbucket_map, "default", vbmap)
                    with RawClient(servers[1].port) as a1:
                        a1.login()
                        assert a1.call(Opcode.SET_VBUCKET, extras=bytes([2]), vbucket=40).status == Status.SUCCESS
                    with owner_client(servers, vbmap, 40) as w:
                        for k in keys_in(40, 2, prefix="moved-"):
                            assert w.set(k, b"y", vbucket=40).status == Status.SUCCESS
                await loop.run_in_executor(None, move)
                while not any(k.startswith(b"moved-") for k in got) or len([k for k in got if
                                                                             k.startswith(b"moved-")]) < 2:
                    if task.done():
                        task.result()
                    await asyncio.sleep(0.02)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                await stream.aclose()
                return got, events, connections, stream.stats
        got, events, connections, stats = run(go())
        assert connections == 2  # one DCP connection per node that owns requested vbuckets
        assert {k: v for k, v in got.items() if not k.startswith(b"moved-")} == written
        assert stats["stream_end_state_changed"] >= 1
        rollbacks = [e for e in events if isinstance(e, Rollback)]
        assert [(r.vbucket, r.seqno) for r in rollbacks] == [(40, 0)]
    finally:
        for st in servers:
            st.stop()


def test_refresh_never_trades_the_map_for_an_older_one(tmp_path):
    servers, _ = cluster(tmp_path)
    try:
        for _ in range(5):  # node 0 knows a newer map than node 1
            servers[0].call(servers[0].server.topology.bump)

        async def go():
            async with await DcpClient.connect(url(servers[0].port, connect_timeout=2), USER, PASSWORD) as c:
                newest = c.cluster_map.version
                assert newest > servers[1].call(lambda: servers[1].server.topology.version)
                await asyncio.get_running_loop().run_in_executor(None, servers[0].stop)
                assert (await c.refresh_map()).version == newest  # node 1's older map is refused
                for _ in range(10):
                    servers[1].call(servers[1].server.topology.bump)
                assert (await c.refresh_map()).version > newest  # a newer one is taken
        run(go())
    finally:
        for st in servers:
            st.stop()


def test_mitigation_a_node_that_does_not_answer_holds_back_only_its_own_vbuckets(tmp_path):
    """Rollback mitigation polls every copy; node 1 stops answering OBSERVE_SEQNO (its replies are
    delayed a minute): vbucket 40, on node 1, stays held, while vbucket 1, on node 0, is released
    at the poll's pace - not after the client's connect timeout (30 s here) for node 1's answer."""
    import time

    from tests.server.mgmt.rest_client import http_of

    servers, vbmap = cluster(tmp_path)
    try:
        for vb in (1, 40):
            with owner_client(servers, vbmap, vb) as w:
                for k in keys_in(vb, 3, prefix=f"m{vb}-"):
                    assert w.set(k, b"x", vbucket=vb).status == Status.SUCCESS
        http = http_of(servers[1])
        assert http.post("/faults/delays", {"opcode": "0x91", "seconds": "60"}).status == 200

        async def go():
            async with await DcpClient.connect(url(servers[0].port, connect_timeout=30), USER, PASSWORD,
                                               mitigate_rollbacks=True, persistence_poll_interval=0.05) as c:
                stream = c.events([1, 40])
                got = []
                t0 = time.monotonic()
                async for ev in stream:
                    if isinstance(ev, Mutation):
                        got.append(ev)
                        if len(got) == 3:
                            break
                took = time.monotonic() - t0
                held = stream.gate.waiting()
                await stream.aclose()
                return got, took, held

        got, took, held = run(go(), 60)
        assert {ev.vbucket for ev in got} == {1}
        assert took < 15, took  # the poll's per-node bound (1 s here), far below the 30 s connect timeout
        assert 40 in held
    finally:
        with contextlib.suppress(Exception):
            http_of(servers[1]).delete("/faults/delays")
        for st in servers:
            st.stop()
