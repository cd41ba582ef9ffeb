"""SET_CLUSTER_CONFIG 0xb4 on one node: the cluster manager's map push, what the node then serves
(GET_CLUSTER_CONFIG, NOT_MY_VBUCKET bodies), its refusals, and the map planner."""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcpflow.protocol.config import Node, balanced_vbucket_map, build_bucket_config, encode_config, parse_cluster_map
from dcpflow.protocol.dcp import VBucketState
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from dcpflow.replication import plan_map

from .conftest import set_state

VERSION = struct.Struct(">qq")


def push(c, config: bytes, epoch: int, rev: int, bucket: bytes = b"default"):
    return c.call(Opcode.SET_CLUSTER_CONFIG, key=bucket, extras=VERSION.pack(epoch, rev), value=config, datatype=1)


def cluster_config(port: int, rev: int, epoch: int = 2, uuid: str = "cafe", vbuckets: int = 64) -> bytes:
    nodes = [Node(port, hostname="127.0.0.1"), Node(port + 1, hostname="127.0.0.1")]
    vmap = balanced_vbucket_map(vbuckets, 2, 1)
    return encode_config(build_bucket_config("default", nodes, vbucket_map=vmap, num_replicas=1, rev=rev,
                                             rev_epoch=epoch, uuid=uuid))


def served(c) -> object:
    reply = c.call(Opcode.GET_CLUSTER_CONFIG)
    assert reply.status == Status.SUCCESS
    return parse_cluster_map(reply.value)


def test_pushed_map_is_served_with_this_node_marked(server):
    with server.login() as c:
        assert served(c).version[0] == 1  # the node's own map until a manager pushes one
        assert push(c, cluster_config(server.port, 7), 2, 7).status == Status.SUCCESS
        cmap = served(c)
        assert cmap.version == (2, 7) and cmap.uuid == "cafe" and cmap.this_node == 0
        assert [list(x) for x in cmap.vbucket_map] == balanced_vbucket_map(64, 2, 1)
        assert cmap.server_list == (f"127.0.0.1:{server.port}", f"127.0.0.1:{server.port + 1}")
        # NOT_MY_VBUCKET replies carry the pushed map too
        vb = next(vb for vb, chain in enumerate(cmap.vbucket_map) if chain[0] == 1)
        set_state(server, vb, VBucketState.REPLICA)
        reply = c.set(b"k", b"v", vbucket=vb)
        assert reply.status == Status.NOT_MY_VBUCKET and parse_cluster_map(reply.value).version == (2, 7)
        # A vbucket state change on a managed node does not bump the revision: the manager's is the one
        assert served(c).version == (2, 7)


def test_only_a_newer_version_replaces_the_map(server):
    with server.login() as c:
        assert push(c, cluster_config(server.port, 7, uuid="a"), 2, 7).status == Status.SUCCESS
        assert push(c, cluster_config(server.port, 6, uuid="b"), 2, 6).status == Status.SUCCESS
        assert push(c, cluster_config(server.port, 7, uuid="c"), 2, 7).status == Status.SUCCESS
        assert served(c).uuid == "a"
        assert push(c, cluster_config(server.port, 1, epoch=3, uuid="d"), 3, 1).status == Status.SUCCESS
        assert served(c).version == (3, 1) and served(c).uuid == "d"  # a newer epoch wins whatever the rev


@pytest.mark.parametrize("case", ["no extras", "short extras", "no key", "no value", "bad json", "version mismatch",
                                  "wrong vbucket count", "name mismatch"])
def test_malformed_push_is_einval(server, case):
    good = cluster_config(server.port, 5)
    kw = dict(key=b"default", extras=VERSION.pack(2, 5), value=good, datatype=1)
    if case == "no extras":
        kw["extras"] = b""
    elif case == "short extras":
        kw["extras"] = b"\0" * 8
    elif case == "no key":
        kw["key"] = b""
    elif case == "no value":
        kw["value"] = b""
    elif case == "bad json":
        kw["value"] = b"{nope"
    elif case == "version mismatch":
        kw["extras"] = VERSION.pack(2, 6)
    elif case == "wrong vbucket count":
        kw["value"] = cluster_config(server.port, 5, vbuckets=32)
    elif case == "name mismatch":
        kw["value"] = good.replace(b'"name":"default"', b'"name":"other"')
    with server.login() as c:
        reply = c.call(Opcode.SET_CLUSTER_CONFIG, **kw)
        assert reply.status == Status.EINVAL
        assert served(c).version[0] == 1


def test_push_needs_the_manager_privilege_and_a_bucket(server):
    with server.client() as c:
        c.login("full", "fullpw")
        assert push(c, cluster_config(server.port, 5), 2, 5).status == Status.EACCESS
    with server.login() as c:
        assert push(c, cluster_config(server.port, 5), 2, 5, bucket=b"nosuch").status == Status.KEY_ENOENT


# -- the planner -------------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(nv=st.integers(1, 80), n=st.integers(1, 5), replicas=st.integers(0, 3), data=st.data())
def test_plan_map_is_balanced_and_valid(nv, n, replicas, data):
    current = [[data.draw(st.integers(-1, n)) for _ in range(replicas + 1)] for _ in range(nv)]
    live = sorted(data.draw(st.sets(st.integers(0, n), min_size=1, max_size=n + 1)))
    target = plan_map(current, live, replicas)
    assert len(target) == nv and all(len(chain) == replicas + 1 for chain in target)
    copies = min(replicas, len(live) - 1)
    for chain in target:
        used = [x for x in chain if x >= 0]
        assert chain[0] in live and set(used) <= set(live) and len(used) == len(set(used)) == copies + 1
    actives = [sum(1 for c in target if c[0] == x) for x in live]
    assert max(actives) - min(actives) <= 1
    replica_counts = [sum(1 for c in target if x in c[1:]) for x in live]
    assert max(replica_counts) - min(replica_counts) <= 1
    # an active whose node stays live is kept while its node is within its share
    kept = sum(1 for c, t in zip(current, target, strict=True) if c[0] in live and c[0] == t[0])
    stay = {x: sum(1 for c in current if c[0] == x) for x in live}
    assert kept >= sum(min(v, nv // len(live)) for v in stay.values())


def test_plan_map_prefers_existing_copies():
    current = [[0, 1], [0, 2], [0, 1], [0, 2], [1, 0], [2, 0]]
    target = plan_map(current, [1, 2], 1)  # node 0 gone: its actives go where their replicas are
    assert [c[0] for c in target[:4]] == [1, 2, 1, 2]
    assert target[4][0] == 1 and target[5][0] == 2
