"""DCP_OPEN (open-connection.md) and DCP_CONTROL (control.md) over a real socket, as KV-Engine's
code behaves where its pages say otherwise or nothing. These keep one case of each path a
connection takes (privileges, a reused name, an open without a bucket, a refused frame, a control's
status on the wire); every flag, value and key is checked without a socket in
test_open_control_rules.py and test_controls_table.py
(https://github.com/couchbase/kv_engine/tree/master/docs/dcp/documentation/commands):

* DCP_OPEN: flags 0x02, 0x10 and 0x80 are EINVAL, as are 0x08 with 0x40, and 0x100 without 0x04
  (erratum 19);
* DCP_CONTROL: `connection_buffer_size` is a u32 (0 disables flow control), `set_noop_interval`
  takes any interval from 0.1 s, and the V2.2 marker key is `max_marker_version` - the page's
  "snapshot_max_marker_version" is unknown (erratum 12); `enable_expiry_opcode` answers OK but
  turns expiry messages on only if DCP_OPEN had IncludeDeleteTimes (erratum 13); a control has no
  extras (erratum 7).
"""


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


@pytest.mark.parametrize("flags", [OpenFlag.PRODUCER | OpenFlag.INVALID_NOTIFIER])  # all: test_open_control_rules.py
def test_open_rejects_invalid_flags(server, flags):
    with login(server) as c:
        assert c.open("x", flags).status == Status.EINVAL


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


# One key per answer: the status reaches the wire as the state machine gives it. Every key and value
# is checked without a socket (test_open_control_rules.py, test_controls_table.py).
CONTROLS = [
    ("enable_noop", "true", Status.SUCCESS),
    ("connection_buffer_size", "4294967296", Status.EINVAL),
    ("stream_buffer_size", "1024", Status.NOT_SUPPORTED),
    ("no_such_key", "true", Status.EINVAL),
    ("enable_expiry_opcode", "true", Status.SUCCESS),  # OK even without IncludeDeleteTimes (erratum 13)
]


def test_control_keys(server, clients):
    c = clients()
    for key, value, want in CONTROLS:
        assert (key, value, c.control(key, value)) == (key, value, want)


def test_control_error_carries_a_reason(server, clients):
    c = clients()
    reply = c.call_dcp(dcp.DcpControl(b"no_such_key", b"1"))
    assert reply.status == Status.EINVAL and b"no_such_key" in reply.value


def test_max_marker_version_with_collections(server, clients):
    c = clients(features=(Feature.XERROR, Feature.COLLECTIONS))
    assert c.control("max_marker_version", "2.2") == Status.SUCCESS


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

