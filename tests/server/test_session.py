"""Session commands over a real socket: HELLO grants, SASL (SCRAM-SHA1/256/512, PLAIN), roles,
SELECT_BUCKET / NO_BUCKET, GET_ERROR_MAP, GET_CLUSTER_CONFIG, VERSION, NOOP, QUIT, pipelining."""

import json
import threading

import pytest

from dcpflow.protocol import error_map, kv
from dcpflow.protocol.config import parse_cluster_map
from dcpflow.protocol.frame import request
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .client import SDK_FEATURES, Closed

GRANTED_TO_SDK = (Feature.TCP_NODELAY, Feature.XATTR, Feature.XERROR, Feature.SELECT_BUCKET, Feature.JSON,
                  Feature.ALT_REQUEST_SUPPORT, Feature.SYNC_REPLICATION, Feature.VATTR, Feature.COLLECTIONS,
                  Feature.SUBDOC_CREATE_AS_DELETED, Feature.PRESERVE_TTL, Feature.SUBDOC_REPLICA_READ,
                  Feature.SUBDOC_BINARY_XATTR, Feature.UNORDERED_EXECUTION, Feature.DEDUPE_NOT_MY_VBUCKET_CLUSTERMAP,
                  Feature.SNAPPY, Feature.MUTATION_SEQNO)


def test_hello_grants_only_what_is_implemented_in_request_order(server):
    with server.client() as c:
        assert c.hello(*SDK_FEATURES) == GRANTED_TO_SDK
        # never TLS on a plain socket, never retired codes, no clustermap push without Duplex
        assert c.hello(Feature.TLS, Feature.DATATYPE_RETIRED, Feature.CLUSTERMAP_CHANGE_NOTIFICATION,
                       0x7777) == ()
        # a second HELLO replaces the set
        assert c.hello(Feature.MUTATION_SEQNO) == (Feature.MUTATION_SEQNO,)


def test_hello_odd_value_is_einval_and_connection_survives(server):
    with server.client() as c:
        reply = c.call(Opcode.HELLO, key=b"agent", value=b"\x00\x04\x00")
        assert reply.status == Status.EINVAL
        assert c.call(Opcode.NOOP).status == Status.SUCCESS


@pytest.mark.parametrize("mech", ["SCRAM-SHA512", "SCRAM-SHA256", "SCRAM-SHA1"])
def test_scram_success_and_wrong_password(server, mech):
    with server.client() as c:
        mechs = c.call(Opcode.SASL_LIST_MECHS)
        assert mechs.value.split() == [b"SCRAM-SHA512", b"SCRAM-SHA256", b"SCRAM-SHA1"]
        reply = c.auth_scram("Administrator", "password", mech)
        assert reply.status == Status.SUCCESS and reply.value.startswith(b"v=")
        assert c.select("default").status == Status.SUCCESS
    with server.client() as c:
        assert c.auth_scram("Administrator", "wrong", mech).status == Status.AUTH_ERROR
        assert c.select("default").status == Status.EACCESS  # still unauthenticated
    with server.client() as c:
        assert c.auth_scram("nobody", "password", mech).status == Status.AUTH_ERROR


def test_scram_nonce_with_spaces_as_the_sdk_sends_it(server):
    with server.client() as c:
        assert c.auth_scram("reader", "readpw", nonce="ab cd ef+/ 12").status == Status.SUCCESS


def test_scram_tampered_messages_fail(server):
    with server.client() as c:
        first = c.call(Opcode.SASL_AUTH, key=b"SCRAM-SHA256", value=b"n,,n=reader,r=abc")
        assert first.status == Status.AUTH_CONTINUE
        nonce = dict(p.split("=", 1) for p in first.value.decode().split(","))["r"]
        bad = c.call(Opcode.SASL_STEP, key=b"SCRAM-SHA256", value=f"c=biws,r={nonce}x,p=AAAA".encode())
        assert bad.status == Status.AUTH_ERROR
        # a STEP without an exchange, or a channel-binding request, fails too
        assert c.call(Opcode.SASL_STEP, key=b"SCRAM-SHA256", value=b"c=biws,r=a,p=b").status == Status.AUTH_ERROR
        assert c.call(Opcode.SASL_AUTH, key=b"SCRAM-SHA256",
                      value=b"p=tls-unique,,n=reader,r=abc").status == Status.AUTH_ERROR
        assert c.call(Opcode.SASL_AUTH, key=b"CRAM-MD5", value=b"x").status == Status.AUTH_ERROR


def test_plain_is_offered_only_over_tls_by_default(server):
    with server.client() as c:
        mechs = c.call(Opcode.SASL_LIST_MECHS)
        assert mechs.value.split() == [b"SCRAM-SHA512", b"SCRAM-SHA256", b"SCRAM-SHA1"]
        c.hello(Feature.XERROR)
        refused = c.auth_plain("Administrator", "password")  # right password, wrong channel
        assert refused.status == Status.AUTH_ERROR
        assert b"only over TLS" in refused.value and b"--allow-plain-over-tcp" in refused.value
        assert c.select("default").status == Status.EACCESS
        wrong = c.auth_scram("Administrator", "nope", "SCRAM-SHA512")
        assert b"Authentication failed" in wrong.value  # credentials errors stay generic
        assert c.auth_scram("Administrator", "password", "SCRAM-SHA512").status == Status.SUCCESS


def test_plain_success_and_failure(make_server):
    server = make_server(plain_over_tcp=True)
    with server.client() as c:
        assert c.call(Opcode.SASL_LIST_MECHS).value.split()[-1] == b"PLAIN"
        assert c.auth_plain("Administrator", "wrong").status == Status.AUTH_ERROR
        assert c.auth_plain("Administrator", "password").status == Status.SUCCESS
        assert c.select("default").status == Status.SUCCESS
    with server.client() as c:
        assert c.call(Opcode.SASL_AUTH, key=b"PLAIN", value=b"no-separators").status == Status.AUTH_ERROR


def test_unauthenticated_commands_get_eaccess_but_bootstrap_commands_work(server):
    with server.client() as c:
        c.hello(Feature.XERROR)
        assert c.call(Opcode.VERSION).value == b"7.6.0-0000"
        assert c.call(Opcode.NOOP).status == Status.SUCCESS
        assert c.call(Opcode.GET_ERROR_MAP, value=b"\x00\x02").status == Status.SUCCESS
        for opcode, kwargs in [(Opcode.GET, {"key": b"k"}), (Opcode.SELECT_BUCKET, {"key": b"default"}),
                               (Opcode.GET_CLUSTER_CONFIG, {}), (Opcode.SET_VBUCKET, {"extras": b"\x01"})]:
            reply = c.call(opcode, **kwargs)
            assert reply.status == Status.EACCESS, opcode
            assert b"authenticate" in reply.value


def test_no_bucket_before_select_bucket(server):
    with server.client() as c:
        c.login(bucket=None)
        assert c.get(b"k").status == Status.NO_BUCKET
        assert c.set(b"k", b"v").status == Status.NO_BUCKET
        assert c.select("default").status == Status.SUCCESS
        assert c.set(b"k", b"v").status == Status.SUCCESS
        assert c.select("@no bucket@").status == Status.SUCCESS
        assert c.get(b"k").status == Status.NO_BUCKET


def test_select_bucket_rules(make_server):
    server = make_server(buckets=("default", "other"))
    with server.client() as c:
        c.login(user="reader", password="readpw", bucket=None)
        assert c.select("other").status == Status.EACCESS  # no role there
        assert c.select("missing").status == Status.EACCESS  # cannot probe names
        assert c.select("default").status == Status.SUCCESS
        assert kv.ListBucketsResponse.from_frame(c.call(Opcode.LIST_BUCKETS)).buckets == ("default",)
    with server.client() as c:
        c.login(bucket=None)
        assert c.select("missing").status == Status.KEY_ENOENT
        assert c.select("other").status == Status.SUCCESS
        assert kv.ListBucketsResponse.from_frame(c.call(Opcode.LIST_BUCKETS)).buckets == ("default", "other")


def test_roles_are_enforced(server):
    with server.client() as admin:
        admin.login()
        assert admin.set(b"doc", b"v").status == Status.SUCCESS
    with server.client() as reader:
        reader.login(user="reader", password="readpw")
        assert reader.get(b"doc").value == b"v"
        assert reader.set(b"doc", b"x").status == Status.EACCESS
        assert reader.delete(b"doc").status == Status.EACCESS
        assert reader.call(Opcode.SET_VBUCKET, extras=b"\x02", vbucket=3).status == Status.EACCESS
    with server.client() as writer:
        writer.login(user="writer", password="writepw")
        assert writer.set(b"doc", b"w").status == Status.SUCCESS
        assert writer.get(b"doc").status == Status.EACCESS  # data_writer cannot read
    with server.client() as dcp:
        dcp.login(user="dcp", password="dcppw")  # dcp_reader[*]
        assert dcp.get(b"doc").value == b"w"
        assert dcp.set(b"doc", b"x").status == Status.EACCESS
        assert dcp.call(Opcode.GET_ALL_VB_SEQNOS).status == Status.SUCCESS


def test_reauthentication_resets_the_bucket(server):
    with server.client() as c:
        c.login()
        assert c.auth_scram("reader", "readpw").status == Status.SUCCESS
        assert c.get(b"k").status == Status.NO_BUCKET
        assert c.auth_scram("reader", "bad").status == Status.AUTH_ERROR
        assert c.select("default").status == Status.EACCESS


def test_error_map_v2_and_v1(server):
    with server.client() as c:
        reply = c.call(Opcode.GET_ERROR_MAP, value=b"\x00\x02")
        doc = json.loads(reply.value)
        assert doc["version"] == 2 and doc["errors"]["24"]["name"] == "EACCESS"
        assert reply.value == error_map.encode_error_map(2)
        assert json.loads(c.call(Opcode.GET_ERROR_MAP, value=b"\x00\x07").value)["version"] == 2
        assert json.loads(c.call(Opcode.GET_ERROR_MAP, value=b"\x00\x01").value)["version"] == 1
        assert c.call(Opcode.GET_ERROR_MAP, value=b"\x00\x00").status == Status.EINVAL


def test_cluster_config_bucket_and_cluster_level(server):
    with server.client() as c:
        c.login(bucket=None)
        cluster = json.loads(c.call(Opcode.GET_CLUSTER_CONFIG).value)
        assert "vBucketServerMap" not in cluster
        assert cluster["nodesExt"] == [{"services": {"kv": server.port, "mgmt": server.mgmt_port}, "thisNode": True,
                                        "hostname": "$HOST"}]
        c.select("default")
        reply = c.call(Opcode.GET_CLUSTER_CONFIG)
        doc = json.loads(reply.value)
        assert reply.datatype == 1
        assert doc["name"] == "default" and doc["nodeLocator"] == "vbucket" and doc["bucketType"] == "membase"
        assert doc["vBucketServerMap"]["serverList"] == [f"$HOST:{server.port}"]
        assert doc["nodes"] == [{"hostname": f"$HOST:{server.mgmt_port}", "ports": {"direct": server.port}}]
        cmap = parse_cluster_map(reply.value, host="127.0.0.1")
        assert cmap.num_vbuckets == 64 and all(chain == (0,) for chain in cmap.vbucket_map)
        assert cmap.server_for_vbucket(5) == f"127.0.0.1:{server.port}"
        # the uuid is stable across requests; with the known version in the extras, no map is resent
        assert json.loads(c.call(Opcode.GET_CLUSTER_CONFIG).value)["uuid"] == doc["uuid"] != ""
        known = kv.GetClusterConfig(doc["revEpoch"], doc["rev"]).encode()
        c.send(known)
        reply = c.recv()
        assert reply.status == Status.SUCCESS and reply.value == b""
        c.send(kv.GetClusterConfig(doc["revEpoch"], doc["rev"] - 1).encode())
        assert json.loads(c.recv().value)["rev"] == doc["rev"]


@pytest.mark.parametrize("pass_seconds", [None, 0.0])
def test_pipelined_requests_are_answered_in_order(admin, monkeypatch, pass_seconds):
    """One write with 300 mixed requests; replies come back in exactly that order - also when the
    connection yields to the event loop every 64 requests (a pass budget of 0)."""
    if pass_seconds is not None:
        monkeypatch.setattr("dcpflow.server.connection.MAX_PASS_SECONDS", pass_seconds)
    reqs, expect = [], []
    for i in range(100):
        key = b"p%d" % i
        vb = admin.vbucket_of(key)
        reqs.append(request(Opcode.SET, key=key, extras=bytes(8), value=b"v%d" % i, vbucket=vb, opaque=3 * i))
        reqs.append(request(Opcode.GET, key=key, vbucket=vb, opaque=3 * i + 1))
        reqs.append(request(Opcode.NOOP if i % 2 else Opcode.VERSION, opaque=3 * i + 2))
        expect += [(Opcode.SET, 3 * i), (Opcode.GET, 3 * i + 1), (Opcode.NOOP if i % 2 else Opcode.VERSION, 3 * i + 2)]
    admin.send(b"".join(reqs))
    replies = admin.recv_n(len(reqs))
    assert [(r.opcode, r.opaque) for r in replies] == expect
    assert all(r.status == Status.SUCCESS for r in replies)
    assert [r.value for r in replies[1::3]] == [b"v%d" % i for i in range(100)]


def test_a_client_pipelining_faster_than_it_is_served_is_read_no_further(admin, monkeypatch):
    """Requests left for a later pass stop the reading once MAX_PENDING_INPUT of them wait: the
    backlog (and the server's memory) stays bounded however fast a client writes, and every
    request is still answered, in order."""
    from dcpflow.server import connection

    limit = 64 * 1024
    monkeypatch.setattr(connection, "MAX_PASS_SECONDS", 0.0)  # every 64 requests wait for the next pass
    monkeypatch.setattr(connection, "MAX_PENDING_INPUT", limit)
    seen = []
    original = connection.Connection.data_received

    def data_received(self, data):
        original(self, data)
        seen.append(self._decoder.buffered)

    monkeypatch.setattr(connection.Connection, "data_received", data_received)
    n = 200_000  # 4.8 MB of NOOPs, written at once
    sender = threading.Thread(target=admin.send, args=(b"".join(request(Opcode.NOOP, opaque=i) for i in range(n)),))
    sender.start()
    replies = admin.recv_n(n)
    sender.join()
    assert [r.opaque for r in replies] == list(range(n))
    assert max(seen) <= limit + 1024 * 1024  # the limit plus at most one read of the transport


def test_pipelined_bytes_split_anywhere(admin):
    data = b"".join(request(Opcode.NOOP, opaque=i) for i in range(50))
    for i in range(0, len(data), 7):
        admin.send(data[i:i + 7])
    assert [r.opaque for r in admin.recv_n(50)] == list(range(50))


def test_quit_and_quitq(server):
    with server.client() as c:
        reply = c.call(Opcode.QUIT)
        assert reply.status == Status.SUCCESS
        assert c.is_closed()
    with server.client() as c:
        c.send(request(Opcode.QUIT_Q) + request(Opcode.NOOP))
        with pytest.raises(Closed):
            c.recv()


def test_unknown_opcode(server):
    with server.client() as c:
        c.hello(Feature.XERROR)
        reply = c.call(0xE5)
        assert reply.status == Status.UNKNOWN_COMMAND
        assert c.call(Opcode.NOOP).status == Status.SUCCESS
