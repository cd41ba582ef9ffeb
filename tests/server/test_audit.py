"""The audit trail of refusals (server/audit.py) and the bound on what clients can make the server
log: failed logins, EACCESS and re-authentication are audited at WARNING with the peer and the user,
optionally to a JSON-lines file; a burst of bad input or failed logins writes a few lines and a
count, never a line per request."""

import json
import logging
import random
import socket

import pytest

from dcpflow.protocol.frame import request
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from dcpflow.server.boundedlog import MAX_CHARS, SAMPLES

from .client import Closed


def audit_events(caplog, name: str | None = None) -> list[dict]:
    out = []
    for r in caplog.records:
        if r.name == "dcpflow.audit" and r.getMessage().startswith("audit "):
            doc = json.loads(r.getMessage()[len("audit "):])
            if name is None or doc["name"] == name:
                out.append(doc)
    return out


def wait_for(fn, timeout: float = 10.0):
    import time
    deadline = time.monotonic() + timeout
    while not fn():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_failed_logins_are_audited_with_peer_and_user(server, caplog):
    with caplog.at_level(logging.WARNING), server.client() as c:
        c.hello(Feature.XERROR)
        assert c.auth_scram("reader", "wrong password").status == Status.AUTH_ERROR
        host, port = c.sock.getsockname()
        local = f"{host}:{port}"
        wait_for(lambda: audit_events(caplog, "authentication failed"))
    (event,) = audit_events(caplog, "authentication failed")
    assert event["id"] == 20481 and event["real_userid"] == {"source": "local", "user": "reader"}
    assert event["peername"] == local and event["sockname"].endswith(f":{server.port}")
    assert "wrong password" in event["reason"] and event["mechanism"] == "SCRAM-SHA512"
    assert all(r.levelno == logging.WARNING for r in caplog.records if r.name == "dcpflow.audit")


def test_access_refusals_and_a_change_of_user_are_audited(server, caplog):
    with caplog.at_level(logging.WARNING), server.login(user="reader", password="readpw") as c:
        assert c.set(b"k", b"v").status == Status.EACCESS
        assert c.select("nosuchbucket").status == Status.EACCESS
        assert c.auth_scram("writer", "writepw").status == Status.SUCCESS
        wait_for(lambda: len(audit_events(caplog)) >= 3)
    refused = audit_events(caplog, "command access failure")
    assert [(e["id"], e["real_userid"]["user"], e["command"], e["bucket"]) for e in refused] == [
        (20484, "reader", "SET", "default"), (20484, "reader", "SELECT_BUCKET", "nosuchbucket")]
    assert "lacks WRITE" in refused[0]["reason"]
    (changed,) = audit_events(caplog, "privileges changed")
    assert changed["real_userid"]["user"] == "writer" and changed["previous_user"] == "reader"


def test_the_audit_trail_also_goes_to_a_file_as_json_lines(make_server, tmp_path, caplog):
    path = tmp_path / "audit" / "audit.log"
    server = make_server(audit_log=path)
    with server.client() as c:
        c.hello()
        assert c.auth_scram("nobody", "x").status == Status.AUTH_ERROR
        assert c.call(Opcode.GET, key=b"k").status == Status.EACCESS  # not authenticated
    wait_for(lambda: path.exists() and len(path.read_text().splitlines()) == 2)
    first, second = (json.loads(line) for line in path.read_text().splitlines())
    assert first["name"] == "authentication failed" and first["real_userid"]["user"] == "nobody"
    assert second["name"] == "command access failure" and second["reason"] == "authenticate first (SASL)"


def test_management_refusals_are_audited(server, caplog):
    import urllib.error
    import urllib.request
    url = f"http://127.0.0.1:{server.mgmt_port}/pools/default/buckets"

    def get(user: str, password: str) -> int:
        req = urllib.request.Request(url)
        import base64
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
        try:
            return urllib.request.urlopen(req, timeout=10).status
        except urllib.error.HTTPError as e:
            return e.code

    with caplog.at_level(logging.WARNING):
        assert get("Administrator", "nope") == 401
        wait_for(lambda: audit_events(caplog, "authentication failed"))
    (event,) = audit_events(caplog, "authentication failed")
    assert event["real_userid"]["user"] == "Administrator" and event["mechanism"] == "HTTP basic"


def _log_bytes(caplog) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in caplog.records:
        if r.name.startswith("dcpflow"):
            out[r.name] = out.get(r.name, 0) + len(r.getMessage())
    return out


def test_a_burst_of_bad_input_and_failed_logins_makes_a_bounded_log(make_server, caplog):
    """300 unauthenticated connections that each send seeded random bytes after a bad magic (closed for it), and 300
    failed logins on one connection: each kind of event logs at most its samples per interval (and
    a summary), whatever the count. Bound: two intervals' worth per kind, in case the burst
    straddles one."""
    server = make_server(plain_over_tcp=True)
    rng = random.Random(36)
    with caplog.at_level(logging.WARNING):
        for _ in range(300):
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
                junk = bytes([rng.choice([0x00, 0x42, 0x47, 0xff])]) + rng.randbytes(rng.randrange(23, 200))
                s.sendall(junk)
                s.settimeout(10)
                try:
                    while s.recv(65536):
                        pass
                except ConnectionResetError:
                    pass  # closed: what the server does with a stream it cannot frame
        with server.client() as c:
            c.hello(Feature.XERROR)
            for i in range(300):
                assert c.auth_plain(f"nobody{i}", "x\n" * 50).status == Status.AUTH_ERROR
        server.call(lambda: server.server.audit.tick())
    invalid = audit_events(caplog, "invalid packet")
    failed = audit_events(caplog, "authentication failed")
    assert 1 <= len(invalid) <= 2 * SAMPLES and 1 <= len(failed) <= 2 * SAMPLES
    counts = server.call(lambda: dict(server.server.audit.counts))
    assert counts["invalid packet"] == 300 and counts["authentication failed"] == 300
    lines = [r for r in caplog.records if r.name.startswith("dcpflow")]
    assert len(lines) <= 2 * 2 * (SAMPLES + 1)  # two kinds, two intervals at most, samples and a summary each
    assert sum(_log_bytes(caplog).values()) <= len(lines) * (MAX_CHARS + 600)
    assert all("\n" not in r.getMessage() for r in lines)  # "x\n" from the client never splits a line


def test_a_closed_connection_for_bad_input_is_audited_as_an_invalid_packet(server, caplog):
    with caplog.at_level(logging.WARNING), server.login() as c:
        c.send(request(Opcode.NOOP).replace(b"\x80", b"\x42", 1))
        with pytest.raises(Closed):
            c.recv()
        wait_for(lambda: audit_events(caplog, "invalid packet"))
    (event,) = audit_events(caplog, "invalid packet")
    assert event["id"] == 20483 and event["real_userid"]["user"] == "Administrator" and event["bucket"] == "default"
    assert "invalid magic 0x42" in event["reason"]


def test_refusal_counts_are_metrics(server):
    import base64
    import urllib.request
    with server.client() as c:
        c.hello()
        for _ in range(3):
            assert c.auth_scram("nobody", "x").status == Status.AUTH_ERROR
    req = urllib.request.Request(f"http://127.0.0.1:{server.mgmt_port}/metrics")
    req.add_header("Authorization", "Basic " + base64.b64encode(b"Administrator:password").decode())
    text = urllib.request.urlopen(req, timeout=10).read().decode()
    assert 'kv_audit_events_total{event="authentication failed"} 3' in text
    assert 'kv_audit_events_total{event="command access failure"} 0' in text
