"""DCP_OPEN (open-connection.md) and DCP_CONTROL (control.md) over a real socket, as KV-Engine's
code behaves where its pages say otherwise or nothing
(https://github.com/couchbase/kv_engine/tree/master/docs/dcp/documentation/commands):

* DCP_OPEN: flags 0x02, 0x10 and 0x80 are EINVAL, as are 0x08 with 0x40, and 0x100 without 0x04
  (erratum 19);
* DCP_CONTROL: `connection_buffer_size` is a u32 (0 disables flow control), `set_noop_interval`
  takes any interval from 0.1 s, and the V2.2 marker key is `max_marker_version` - the page's
  "snapshot_max_marker_version" is unknown (erratum 12); `enable_expiry_opcode` answers OK but
  turns expiry messages on only if DCP_OPEN had IncludeDeleteTimes (erratum 13); a control has no
  extras (erratum 7).
"""

import json

import pytest

from dcpflow.protocol import dcp
from dcpflow.protocol.dcp import OpenFlag
from dcpflow.protocol.frame import request
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from tests.server.client import Closed

from .client import DcpClient


def login(server, user="dcp", password="dcppw", features=(Feature.XERROR,)) -> DcpClient:
    c = DcpClient(server.port)
    return c.login(user, password, "default", features=features)


@pytest.mark.parametrize("flags", [OpenFlag.PRODUCER | OpenFlag.INVALID_NOTIFIER, OpenFlag.PRODUCER | OpenFlag.UNUSED,
                                   OpenFlag.PRODUCER | OpenFlag.PITR_REMOVED, OpenFlag.PRODUCER | 0x400,
                                   OpenFlag.PRODUCER | OpenFlag.NO_VALUE | OpenFlag.NO_VALUE_WITH_UNDERLYING_DATATYPE,
                                   OpenFlag.PRODUCER | OpenFlag.INCLUDE_DELETED_USER_XATTRS,
                                   OpenFlag.SKIP_DELETES_IN_INITIAL_BACKFILL])
def test_open_rejects_invalid_flags(server, flags):
    with login(server) as c:
        assert c.open("x", flags).status == Status.EINVAL


def test_open_value_rules(server):
    with login(server) as c:
        # a producer may not carry consumer_name; the value must be JSON flagged as JSON
        assert c.open("x", OpenFlag.PRODUCER, json.dumps({"consumer_name": "r"}).encode()).status == Status.EINVAL
        bad = dcp.DcpOpen(b"x", OpenFlag.PRODUCER).encode()
        reply = c.call(Opcode.DCP_OPEN, key=b"x", extras=bad[24:32], value=b'{"a":1}')
        assert reply.status == Status.EINVAL
        assert c.call(Opcode.DCP_OPEN, extras=bad[24:32]).status == Status.EINVAL  # no name


def test_open_producer_needs_dcp_privilege(server):
    with login(server, "reader", "readpw") as c:
        reply = c.open("x")
        assert reply.status == Status.EACCESS
        assert b"DcpProducer" in reply.value


def test_open_consumer_needs_consumer_privilege(server):
    with login(server) as c:
        assert c.open("x", 0).status == Status.EACCESS
    with login(server, "Administrator", "password") as c:
        assert c.open("x", 0).status in (Status.SUCCESS, Status.NOT_SUPPORTED)


def test_open_twice_on_one_connection(server):
    with login(server) as c:
        assert c.open("x").status == Status.SUCCESS
        assert c.open("y").status == Status.EINVAL


def test_open_needs_a_bucket(server):
    c = DcpClient(server.port)
    c.hello(Feature.XERROR)
    assert c.auth_scram("dcp", "dcppw").status == Status.SUCCESS
    assert c.open("x").status == Status.NO_BUCKET
    c.close()


def test_reused_name_disconnects_the_older_connection(server):
    a, b = login(server), login(server)
    try:
        assert a.open("same").status == Status.SUCCESS
        assert b.open("same").status == Status.SUCCESS
        assert a.is_closed(5)
        assert b.control("enable_noop", "true") == Status.SUCCESS
    finally:
        a.close()
        b.close()


def test_control_before_open_is_einval(server):
    with login(server) as c:
        assert c.control("enable_noop", "true") == Status.EINVAL


# key, value, expected status: every key KV-Engine's producer knows (control.md lists only some)
CONTROLS = [
    ("enable_noop", "true", Status.SUCCESS),
    ("enable_noop", "false", Status.SUCCESS),
    ("enable_noop", "whatever", Status.SUCCESS),
    ("set_noop_interval", "20", Status.SUCCESS),
    ("set_noop_interval", "0.1", Status.SUCCESS),
    ("set_noop_interval", "1.5", Status.SUCCESS),
    ("set_noop_interval", "0.05", Status.EINVAL),
    ("set_noop_interval", "abc", Status.EINVAL),
    ("set_noop_interval", "nan", Status.EINVAL),
    ("connection_buffer_size", "0", Status.SUCCESS),
    ("connection_buffer_size", "4294967295", Status.SUCCESS),
    ("connection_buffer_size", "4294967296", Status.EINVAL),
    ("connection_buffer_size", "-1", Status.EINVAL),
    ("connection_buffer_size", "10k", Status.EINVAL),
    ("stream_buffer_size", "1024", Status.NOT_SUPPORTED),
    ("set_priority", "high", Status.SUCCESS),
    ("set_priority", "medium", Status.SUCCESS),
    ("set_priority", "low", Status.SUCCESS),
    ("set_priority", "urgent", Status.EINVAL),
    ("force_value_compression", "true", Status.EINVAL),  # needs HELLO Snappy, which this connection lacks
    ("supports_cursor_dropping", "true", Status.SUCCESS),
    ("supports_cursor_dropping_vulcan", "true", Status.SUCCESS),
    ("supports_hifi_MFU", "true", Status.SUCCESS),
    ("send_stream_end_on_client_close_stream", "true", Status.SUCCESS),
    ("send_stream_end_on_client_close_stream", "false", Status.SUCCESS),
    ("enable_expiry_opcode", "true", Status.SUCCESS),  # OK even without IncludeDeleteTimes (erratum 13)
    ("enable_stream_id", "false", Status.EINVAL),
    ("enable_sync_writes", "true", Status.SUCCESS),
    ("enable_sync_writes", "false", Status.EINVAL),
    ("consumer_name", "replica-1", Status.SUCCESS),
    ("consumer_name", "", Status.EINVAL),
    ("enable_out_of_order_snapshots", "true", Status.SUCCESS),
    ("enable_out_of_order_snapshots", "true_with_seqno_advanced", Status.SUCCESS),
    ("enable_out_of_order_snapshots", "false", Status.EINVAL),
    ("include_deleted_user_xattrs", "true", Status.EINVAL),  # needs DCP_OPEN flag 0x100
    ("v7_dcp_status_codes", "true", Status.SUCCESS),
    ("v7_dcp_status_codes", "false", Status.EINVAL),
    ("flatbuffers_system_events", "true", Status.SUCCESS),
    ("flatbuffers_system_events", "false", Status.EINVAL),
    ("change_streams", "true", Status.NOT_SUPPORTED),
    ("change_streams", "false", Status.EINVAL),
    ("max_marker_version", "2.2", Status.NOT_SUPPORTED),  # needs HELLO Collections
    ("max_marker_version", "2.0", Status.EINVAL),
    ("backfill_order", "round-robin", Status.SUCCESS),
    ("backfill_order", "sequential", Status.SUCCESS),
    ("backfill_order", "random", Status.EINVAL),
    ("cache_transfer", "true", Status.NOT_SUPPORTED),
    ("no_such_key", "true", Status.EINVAL),
    ("snapshot_max_marker_version", "2.2", Status.EINVAL),  # control.md's name for max_marker_version (erratum 12)
]


def test_control_keys(server, clients):
    c = clients()
    for key, value, want in CONTROLS:
        assert (key, value, c.control(key, value)) == (key, value, want)


def test_control_error_carries_a_reason(server, clients):
    c = clients()
    reply = c.call_dcp(dcp.DcpControl(b"no_such_key", b"1"))
    assert reply.status == Status.EINVAL and b"no_such_key" in reply.value


def test_include_deleted_user_xattrs_with_its_open_flag(server):
    with login(server) as c:
        assert c.open("x", OpenFlag.PRODUCER | OpenFlag.INCLUDE_XATTRS |
                      OpenFlag.INCLUDE_DELETED_USER_XATTRS).status == Status.SUCCESS
        assert c.control("include_deleted_user_xattrs", "true") == Status.SUCCESS


def test_max_marker_version_with_collections(server, clients):
    c = clients(features=(Feature.XERROR, Feature.COLLECTIONS))
    assert c.control("max_marker_version", "2.2") == Status.SUCCESS


def test_stream_ids_and_sync_writes_are_exclusive(server, clients):
    a = clients(name="a")
    assert a.control("enable_stream_id", "true") == Status.SUCCESS
    assert a.control("enable_sync_writes", "true") == Status.NOT_SUPPORTED
    b = clients(name="b")
    assert b.control("enable_sync_writes", "true") == Status.SUCCESS
    assert b.control("enable_stream_id", "true") == Status.NOT_SUPPORTED


def test_control_shape_is_checked(server, clients):
    c = clients()
    reply = c.call(Opcode.DCP_CONTROL, key=b"enable_noop")  # no value
    assert reply.status == Status.EINVAL
    reply = c.call(Opcode.DCP_CONTROL, key=b"enable_noop", value=b"true", extras=b"\0\0\0\0")  # erratum 7
    assert reply.status == Status.EINVAL


def test_dcp_commands_on_a_plain_connection_are_einval(server):
    with login(server) as c:
        assert c.call_dcp(dcp.DcpStreamRequest(0, 0)).status == Status.EINVAL
        assert c.call_dcp(dcp.DcpCloseStream(0)).status == Status.EINVAL
        c.send(request(Opcode.DCP_BUFFER_ACKNOWLEDGEMENT, extras=b"\0\0\0\1", opaque=7))
        assert c.recv().status == Status.EINVAL


def test_noop_request_to_a_producer_disconnects(server, clients):
    c = clients()
    c.send(dcp.DcpNoop(5).encode())
    with pytest.raises(Closed):
        c.recv()


@pytest.mark.parametrize("kw", [dict(extras=b"\0\0\0\0"), dict(key=b"k"), dict(value=b"v")])
def test_close_stream_shape(server, clients, kw):
    c = clients()
    assert c.stream_request(0).status == Status.SUCCESS
    assert c.call(Opcode.DCP_CLOSE_STREAM, vbucket=0, **kw).status == Status.EINVAL  # close-stream.md


@pytest.mark.parametrize("extras", [b"", b"\0" * 4, b"\0" * 12])
def test_open_extras_must_be_8_bytes(server, extras):
    with login(server) as c:
        assert c.call(Opcode.DCP_OPEN, key=b"x", extras=extras).status == Status.EINVAL


def test_get_failover_log_shape(server, clients):
    c = clients()
    assert c.call(Opcode.DCP_GET_FAILOVER_LOG, vbucket=0, key=b"k").status == Status.EINVAL
    assert c.call(Opcode.DCP_GET_FAILOVER_LOG, vbucket=0, value=b"v").status == Status.EINVAL
