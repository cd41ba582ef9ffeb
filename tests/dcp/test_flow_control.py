"""Flow control (KV-Engine's flow-control.md and buffer-ack.md, as its code behaves): every message
but a noop is charged its wire size; the producer never has more than the buffer plus one message
unacknowledged; BUFFER_ACK gets no reply and any opaque works (the page's "opaque 0 acknowledges
for the connection" convention is ignored: erratum 38); size 0 disables it. End to end here, one
case of each path; the window's rules are checked without a socket in test_flow_control_rules.py
and test_flow_control_state.py."""

import time

import pytest

from dcpflow.protocol import dcp
from dcpflow.protocol.status import Status

from .client import items
from .conftest import fill, to_disk_only

MAX = 0xFFFFFFFFFFFFFFFF


def read_available(c, seconds: float) -> int:
    """Read whatever arrives within `seconds`; returns the wire bytes of stream messages."""
    before = c.received_bytes
    c.backlog.extend(c.quiet(seconds))
    return c.received_bytes - before


# one case over a real socket (a backfill of values sent without copying, LARGE_VALUE); every
# combination, and a property over buffers, values and acks: test_flow_control_rules.py
@pytest.mark.parametrize("backfill", [True])
@pytest.mark.parametrize("size", [5000])
def test_never_more_than_buffer_plus_one_message(server, clients, writer, backfill, size):
    value = b"x" * size
    n = 100 if size < 1000 else 20
    fill(writer, 0, n, value=value)
    if backfill:
        to_disk_only(server, 0)
    buffer = 2000
    c = clients()
    c.controls(connection_buffer_size=buffer)
    assert c.stream_request(0, 0, n).status == Status.SUCCESS
    biggest = 24 + 31 + 8 + len(value)  # a mutation of this test
    acked = 0
    got = []
    while not any(isinstance(m, dcp.DcpStreamEnd) for m in got):
        deadline = time.monotonic() + 60
        while True:  # the producer fills the window, then stops
            read_available(c, 0.02)
            outstanding = c.received_bytes - acked
            assert outstanding <= buffer + biggest, outstanding
            if outstanding >= buffer or any(isinstance(m, dcp.DcpStreamEnd) for m in c.backlog):
                break
            assert time.monotonic() < deadline, "the producer stopped below its window"
        read_available(c, 0.05)  # and sends nothing more
        assert c.received_bytes - acked == outstanding
        got += c.backlog
        c.backlog.clear()
        # acknowledge a part of it, with an arbitrary opaque (erratum 38)
        part = outstanding // 2 or outstanding
        c.send(dcp.DcpBufferAck(part, opaque=0xABCD).encode())
        acked += part
    assert [m.by_seqno for m in items(got)] == list(range(1, n + 1))
    assert all(m.value == value for m in items(got))


def test_buffer_ack_has_no_reply(server, clients):
    c = clients()
    c.controls(connection_buffer_size=100)
    c.send(dcp.DcpBufferAck(10, opaque=77).encode())
    reply = c.call_dcp(dcp.DcpControl(b"enable_noop", b"false"))
    assert reply.status == Status.SUCCESS and not c.backlog  # the only reply is the control's


def test_buffer_ack_shape_is_checked(server, clients):
    c = clients()
    assert c.call(0x5d, extras=b"\0\0\1").status == Status.EINVAL


def test_noops_are_not_charged(server, clients):
    c = clients()
    c.controls(connection_buffer_size=1, enable_noop="true", set_noop_interval="0.1")
    c.stream_request(0)  # an idle stream: nothing but noops
    deadline = time.monotonic() + 60  # three noops come in 0.3 s, unless the machine is busy
    while c.noops < 3:
        assert time.monotonic() < deadline, f"{c.noops} noops"
        c.quiet(0.1)
    assert c.received_bytes == 0

