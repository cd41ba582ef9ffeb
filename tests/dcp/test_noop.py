"""Noops and dead-connection detection, as KV-Engine's code behaves (its no-op.md and
dead-connections.md say the producer sends noops only when idle and disconnects when a noop is not
answered within an interval: erratum 37): with `enable_noop` the producer sends a noop every
interval while none is outstanding, whatever other traffic there is, and closes the connection
only when nothing at all was received for dcp_idle_timeout.

These two run end to end over a socket (the shell's timer, a real consumer); every rule, and these
two, is checked without a socket in test_noop_rules.py."""

import time

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


def test_idle_consumer_is_disconnected(make_server):
    srv = make_server(dcp_idle_timeout=0.6)
    c = DcpClient(srv.port).connect()
    c.answer_noops = False
    c.controls(enable_noop="true", set_noop_interval="0.1")
    t0 = time.monotonic()
    assert c.is_closed(5)
    assert 0.5 <= time.monotonic() - t0 < 3
    c.close()
