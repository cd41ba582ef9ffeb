"""Noops and dead-connection detection, as KV-Engine's code behaves (its no-op.md and
dead-connections.md say the producer sends noops only when idle and disconnects when a noop is not
answered within an interval: erratum 37): with `enable_noop` the producer sends a noop every
interval while none is outstanding, whatever other traffic there is, and closes the connection
only when nothing at all was received for dcp_idle_timeout."""

import time

from dcpflow.protocol.status import Status

from .client import DcpClient


def run_for(c, seconds: float) -> list:
    out = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        out += c.quiet(0.05)
    return out


def test_noops_at_the_interval(server, clients):
    c = clients()
    c.controls(enable_noop="true", set_noop_interval="0.2")
    run_for(c, 1.05)
    assert 2 <= c.noops <= 6  # ~5; a busy machine may delay a timer


def test_noops_also_while_streaming(server, clients, writer):
    c = clients()
    c.controls(enable_noop="true", set_noop_interval="0.1")
    assert c.stream_request(0).status == Status.SUCCESS
    deadline = time.monotonic() + 0.8
    i = 0
    while time.monotonic() < deadline:
        writer.set(b"busy%d" % i, b"v", vbucket=0)
        c.quiet(0.01)
        i += 1
    assert c.noops >= 2  # traffic does not postpone them (erratum 37)


def test_no_second_noop_while_one_is_outstanding(server, clients):
    c = clients()
    c.answer_noops = False
    c.controls(enable_noop="true", set_noop_interval="0.1")
    run_for(c, 0.8)
    assert c.noops == 1


def test_no_noops_unless_enabled(server, clients):
    c = clients()
    c.controls(set_noop_interval="0.1")
    run_for(c, 0.5)
    assert c.noops == 0
    c.controls(enable_noop="true")
    run_for(c, 0.5)
    assert c.noops >= 1
    c.controls(enable_noop="false")
    before = c.noops
    run_for(c, 0.5)
    assert c.noops - before <= 1


def test_idle_consumer_is_disconnected(make_server):
    srv = make_server(dcp_idle_timeout=0.6)
    c = DcpClient(srv.port).connect()
    c.answer_noops = False
    c.controls(enable_noop="true", set_noop_interval="0.1")
    t0 = time.monotonic()
    assert c.is_closed(5)
    assert 0.5 <= time.monotonic() - t0 < 3
    c.close()


def test_answering_consumer_stays_connected(make_server):
    srv = make_server(dcp_idle_timeout=0.6)
    c = DcpClient(srv.port).connect()
    c.controls(enable_noop="true", set_noop_interval="0.1")
    run_for(c, 1.5)
    assert c.control("set_priority", "high") == Status.SUCCESS
    c.close()


def test_no_idle_disconnect_without_noop(make_server):
    srv = make_server(dcp_idle_timeout=0.3)
    c = DcpClient(srv.port).connect()
    assert not c.is_closed(1.0)
    c.close()
