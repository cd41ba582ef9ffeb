"""DCP_STREAM_REQ end to end over a real socket (KV-Engine's stream-request.md and
stream-request-value.md): one case of each way an answer travels (a frame refused by the
protocol, a Refusal, NOT_MY_VBUCKET with the cluster map, UNKNOWN_COLLECTION with the manifest
uid, a started stream and its messages), stream-ids on the wire, privileges, the consumer-side
disconnect, and DCP_GET_FAILOVER_LOG. Every rule of the request itself (each EINVAL and ERANGE
case, KEY_EEXISTS, each flag, the JSON value, the rollback decision) is checked without a socket
in test_stream_request_rules.py."""

import json

import pytest

from dcpflow.protocol import dcp
from dcpflow.protocol.dcp import SnapshotFlag, StreamFlag
from dcpflow.protocol.frame import request
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .client import items, markers
from .conftest import fill, vbucket, wait_persisted

MAX = 0xFFFFFFFFFFFFFFFF
COLLECTIONS = (Feature.XERROR, Feature.COLLECTIONS)


def test_ok_response_carries_the_failover_log(server, clients, writer):
    fill(writer, 3, 2)
    c = clients()
    resp = c.stream_request(3, 0, 2)
    vb = vbucket(server, 3)
    assert resp.status == Status.SUCCESS
    assert list(resp.failover_log) == [tuple(e) for e in vb.failover.entries]
    assert len(items(c.until_stream_end(3))) == 2


@pytest.mark.parametrize("flags", [0x200])  # every flag rule: test_stream_request_rules.py
def test_invalid_stream_flags(server, clients, flags):
    c = clients()
    assert c.stream_request(0, flags=flags).status == Status.EINVAL


def test_unknown_vbucket_is_not_my_vbucket(make_server, tmp_path):
    from .client import DcpClient
    srv = make_server(num_vbuckets=8)
    srv.call(lambda: srv.server.buckets["default"].engine.delete_vbucket(5))
    with DcpClient(srv.port) as c:
        c.connect()
        assert c.stream_request(5).status == Status.NOT_MY_VBUCKET
        assert c.stream_request(9).status == Status.NOT_MY_VBUCKET


def test_disk_only_backfills_and_ends(server, clients, writer):
    fill(writer, 0, 4)
    wait_persisted(server, 0)
    c = clients()
    assert c.stream_request(0, 0, MAX, flags=StreamFlag.DISK_ONLY).status == Status.SUCCESS
    msgs = c.until_stream_end(0)
    (m,) = markers(msgs)
    assert m.flags == SnapshotFlag.DISK | SnapshotFlag.CHECKPOINT and (m.start_seqno, m.end_seqno) == (0, 4)
    assert [i.by_seqno for i in items(msgs)] == [1, 2, 3, 4]


# -- the JSON value (stream-request-value.md) --------------------------------------------------

def value(**doc) -> bytes:
    return json.dumps(doc).encode()


def test_noop_is_mandatory_for_collections(server, clients):
    c = clients(features=COLLECTIONS)
    resp = c.call_dcp(dcp.DcpStreamRequest(0, 0))
    assert resp.status == Status.NOT_SUPPORTED and b"noop" in resp.value


@pytest.mark.parametrize("doc,status", [  # one per answer path; every rule: test_stream_request_rules.py
    ({"uid": 5}, Status.EINVAL),
    ({"collections": ["8"]}, Status.UNKNOWN_COLLECTION),
    ({"scope": "0"}, Status.SUCCESS),
    ({"scope": "9"}, Status.UNKNOWN_SCOPE),
])
def test_value_validation(server, clients, doc, status):
    c = clients(features=COLLECTIONS)
    c.controls(enable_noop="true")
    assert c.stream_request(0, value=value(**doc)).status == status


def test_collection_stream_keys_are_prefixed(server, clients, writer):
    keys = fill(writer, 0, 2)
    c = clients(features=COLLECTIONS)
    c.controls(enable_noop="true")
    assert c.stream_request(0, 0, 2, value=value(collections=["0"])).status == Status.SUCCESS
    got = items(c.until_stream_end(0))
    assert [m.key for m in got] == [b"\x00" + k for k in keys]  # LEB128 collection id 0


# -- stream-ids ------------------------------------------------------------------------------

def test_stream_ids(server, clients, writer):
    fill(writer, 0, 3)
    c = clients(features=COLLECTIONS)
    c.controls(enable_noop="true", enable_stream_id="true")
    assert c.stream_request(0, 0, 3).status == Status.DCP_STREAM_ID_INVALID  # sid required
    assert c.stream_request(0, value=value(sid=0)).status == Status.DCP_STREAM_ID_INVALID
    assert c.stream_request(0, 0, MAX, value=value(sid=7)).status == Status.SUCCESS
    assert c.stream_request(0, 0, 2, value=value(sid=8)).status == Status.SUCCESS  # same vbucket, new sid
    assert c.stream_request(0, 0, 3, value=value(sid=7)).status == Status.KEY_EEXISTS
    seen = set()

    def done(m) -> bool:
        if isinstance(m, dcp.DcpStreamEnd) and m.stream_id == 8:
            seen.add("end8")
        if isinstance(m, dcp.DcpMutation) and m.stream_id == 7 and m.by_seqno == 3:
            seen.add("last7")
        return len(seen) == 2

    msgs = c.messages_until(done)
    for m in msgs:
        assert m.stream_id in (7, 8)  # every stream message carries its sid (magic 0x08, frame id 2)
    assert [m.by_seqno for m in items(msgs) if m.stream_id == 7] == [1, 2, 3]
    assert [m.by_seqno for m in items(msgs) if m.stream_id == 8] == [1, 2]


def test_close_stream_with_stream_ids(server, clients):
    c = clients(features=COLLECTIONS)
    c.controls(enable_noop="true", enable_stream_id="true")
    assert c.stream_request(0, value=value(sid=4)).status == Status.SUCCESS
    assert c.close_stream(0) == Status.DCP_STREAM_ID_INVALID  # sid frame required
    assert c.close_stream(0, stream_id=5) == Status.KEY_ENOENT
    assert c.close_stream(0, stream_id=4) == Status.SUCCESS


# -- DCP_GET_FAILOVER_LOG ----------------------------------------------------------------------

def test_get_failover_log(server, clients, writer):
    c = clients()
    reply = c.call_dcp(dcp.DcpGetFailoverLog(4))
    assert reply.status == Status.SUCCESS
    log = dcp.FailoverLogResponse.from_frame(reply).entries
    assert list(log) == [tuple(e) for e in vbucket(server, 4).failover.entries]
    assert c.call_dcp(dcp.DcpGetFailoverLog(999)).status == Status.NOT_MY_VBUCKET
    assert c.call(Opcode.DCP_GET_FAILOVER_LOG, vbucket=4, extras=b"1234").status == Status.EINVAL


def test_get_failover_log_privileges(server, clients):
    """DcpProducer or MetaRead on the bucket: checked on an open DCP connection whose user then
    re-authenticated (DCP_GET_FAILOVER_LOG is only served on a DCP connection, below)."""
    for user, password, status in (("writer", "writepw", Status.EACCESS), ("reader", "readpw", Status.SUCCESS)):
        c = clients()
        assert c.auth_scram(user, password).status == Status.SUCCESS
        assert c.select("default").status == Status.SUCCESS
        assert c.call(Opcode.DCP_GET_FAILOVER_LOG, vbucket=0).status == status


def test_get_failover_log_needs_a_dcp_connection(server):
    """kv_engine's verify_common_dcp_restrictions: 0x54 before DCP_OPEN is EINVAL, checked before
    privileges; GET_FAILOVER_LOG 0x96 is the command for a connection that is not DCP."""
    from .client import DcpClient
    for user, password in (("reader", "readpw"), ("writer", "writepw")):
        with DcpClient(server.port) as c:
            c.login(user, password, "default", features=(Feature.XERROR,))
            reply = c.call(Opcode.DCP_GET_FAILOVER_LOG, vbucket=0)
            assert reply.status == Status.EINVAL and b"DCP connection" in reply.value
            assert not c.is_closed(0.2)
    with DcpClient(server.port) as c:
        c.login("reader", "readpw", "default")
        assert c.call(Opcode.GET_FAILOVER_LOG, vbucket=0).status == Status.SUCCESS


def test_stream_request_without_dcp_privilege_after_open(server, clients):
    c = clients()
    # re-authenticating as a user without DcpProducer drops the privilege on this connection
    assert c.auth_scram("reader", "readpw").status == Status.SUCCESS
    assert c.select("default").status == Status.SUCCESS
    assert c.stream_request(0).status == Status.EACCESS


def test_stream_request_on_a_consumer_connection_disconnects(server, clients, writer):
    """stream-request.md, "Disconnect: if this command is sent to a consumer endpoint": a
    connection opened without the Producer flag is this server's consumer (it sends STREAM_REQ,
    it does not answer one), so a STREAM_REQ from its peer ends the connection, and no stream
    starts."""
    fill(writer, 3, 2)
    c = clients(user="Administrator", password="password", name="replication:peer", flags=0)
    opaque = c.next_opaque()
    c.send(dcp.DcpStreamRequest(3, 0, MAX, 0, 0, 0, opaque=opaque).encode())
    assert c.is_closed(10)
    answers = []
    while (frame := c.decoder.next_frame()) is not None:
        answers.append(frame)
    assert not [f for f in answers if f.is_response and f.opcode == Opcode.DCP_STREAM_REQ
                and f.status == Status.SUCCESS], answers
    assert not [f for f in answers if not f.is_response and f.opcode == Opcode.DCP_MUTATION], answers


def test_raw_request_bytes(server, clients):
    c = clients()
    raw = request(Opcode.DCP_STREAM_REQ, extras=dcp.DcpStreamRequest(0, 0).encode()[24:72], opaque=0x1000)
    c.send(raw)
    reply = c.recv()
    assert (reply.opcode, reply.status, reply.opaque) == (Opcode.DCP_STREAM_REQ, Status.SUCCESS, 0x1000)
