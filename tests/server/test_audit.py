"""The audit trail (server/audit.py) and the bound on what clients can make the server log: failed
logins on both ports, EACCESS, 401s, 403s, re-authentication and bucket/scope/collection changes are
audited with the peer and the user in Couchbase's event format. The JSON-lines file gets every event
- a decoy burst cannot hide the attack behind it -; the WARNING log writes a few lines and a count,
never a line per request; an unwritable file is said once, counted, and does not stop the server."""

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


def wait_for(fn, timeout: float = 60.0):
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
    assert event["id"] == 20481 and event["real_userid"] == {"domain": "local", "user": "reader"}
    assert f'{event["remote"]["ip"]}:{event["remote"]["port"]}' == local
    assert event["local"] == {"ip": "127.0.0.1", "port": server.port}
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
        assert get("reader", "readpw") == 200
        req = urllib.request.Request(url.replace("/pools/default/buckets", "/pools/default/buckets/default"),
                                     method="DELETE")
        import base64
        req.add_header("Authorization", "Basic " + base64.b64encode(b"reader:readpw").decode())
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=10)
        assert refused.value.code == 403
        wait_for(lambda: audit_events(caplog, "access forbidden"))
    (event,) = audit_events(caplog, "authentication failure")  # ns_server's 8264: a 401
    assert event["id"] == 8264 and event["real_userid"]["user"] == "Administrator"
    assert event["raw_url"] == "/pools/default/buckets" and event["remote"]["ip"] == "127.0.0.1"
    (event,) = audit_events(caplog, "access forbidden")  # ns_server's 8275: a 403
    assert event["id"] == 8275 and event["real_userid"]["user"] == "reader"
    assert event["raw_url"] == "/pools/default/buckets/default" and "delete" in event["reason"]


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


def file_events(path, name: str | None = None) -> list[dict]:
    if not path.exists():
        return []
    docs = [json.loads(line) for line in path.read_text().splitlines()]
    return [d for d in docs if name is None or d["name"] == name]


def test_a_decoy_burst_cannot_hide_the_guesses_behind_it(make_server, tmp_path, caplog):
    """The issue's attack: five failed logins as a decoy user, then 20 guesses at Administrator's
    password. The audit file names every one - user and address -, the 20 included (some refused
    unchecked by the login throttle: audited all the same); nothing is merged into a count. The
    WARNING log may summarise beyond its rate."""
    path = tmp_path / "audit.log"
    server = make_server(audit_log=path)
    with caplog.at_level(logging.WARNING), server.client() as c:
        c.hello(Feature.XERROR)
        for _ in range(5):
            assert c.auth_scram("decoy", "x").status == Status.AUTH_ERROR
        for i in range(20):
            assert c.auth_scram("Administrator", f"guess{i}").status == Status.AUTH_ERROR
        address = c.sock.getsockname()
    wait_for(lambda: len(file_events(path)) >= 25)
    events = file_events(path)
    assert [e["name"] for e in events] == ["authentication failed"] * 25
    assert [e["real_userid"]["user"] for e in events] == ["decoy"] * 5 + ["Administrator"] * 20
    assert all(e["remote"] == {"ip": address[0], "port": address[1]} and e["id"] == 20481 for e in events)
    assert sum("locked out" in e["reason"] or "too many failed logins" in e["reason"] for e in events) > 0
    assert len(audit_events(caplog)) <= 2 * SAMPLES  # the log's copy is rate-limited; the file's is not


def test_http_401s_are_audited_with_and_without_credentials(make_server, tmp_path):
    from tests.server.mgmt.rest_client import http_of
    path = tmp_path / "audit.log"
    server = make_server(audit_log=path)
    http = http_of(server)
    assert http.as_user(None).get("/pools/default/buckets").status == 401
    assert http.as_user("Administrator", "wrong").get("/pools/default").status == 401
    assert http.get("/pools/default", headers={"Authorization": "Basic !!!"}).status == 401
    wait_for(lambda: len(file_events(path)) == 3)
    anonymous, wrong, malformed = file_events(path)
    assert anonymous["id"] == 8264 and "real_userid" not in anonymous and anonymous["reason"] == "no credentials"
    assert anonymous["raw_url"] == "/pools/default/buckets" and anonymous["remote"]["ip"] == "127.0.0.1"
    assert anonymous["local"] == {"ip": "127.0.0.1", "port": server.mgmt_port}
    assert wrong["real_userid"] == {"domain": "local", "user": "Administrator"} and wrong["raw_url"] == "/pools/default"
    assert malformed["reason"] == "malformed basic credentials"


def test_bucket_and_collection_changes_are_audited(make_server, tmp_path):
    from tests.server.mgmt.rest_client import http_of
    path = tmp_path / "audit.log"
    server = make_server(audit_log=path)
    http = http_of(server)
    assert http.post("/pools/default/buckets", {"name": "b2", "ramQuota": "100"}).status == 202
    assert http.post("/pools/default/buckets/b2/scopes", {"name": "s"}).status == 200
    assert http.post("/pools/default/buckets/b2/scopes/s/collections", {"name": "c"}).status == 200
    assert http.delete("/pools/default/buckets/b2/scopes/s/collections/c").status == 200
    assert http.delete("/pools/default/buckets/b2/scopes/s").status == 200
    assert http.delete("/pools/default/buckets/b2").status == 200
    wait_for(lambda: len(file_events(path)) == 6)
    events = file_events(path)
    assert [(e["id"], e["name"]) for e in events] == [
        (8201, "create bucket"), (8259, "create scope"), (8261, "create collection"), (8262, "drop collection"),
        (8260, "drop scope"), (8203, "delete bucket")]
    assert all(e["bucket_name"] == "b2" and e["real_userid"]["user"] == "Administrator" for e in events)
    assert events[2]["scope_name"] == "s" and events[2]["collection_name"] == "c" and events[2]["new_manifest_uid"]


def test_user_changes_are_audited(make_server, tmp_path):
    """Users made, changed (a password too) and dropped over the management REST are in the audit
    file with ns_server's ids, the user they name and who did it."""
    from tests.server.mgmt.rest_client import http_of
    path = tmp_path / "audit.log"
    server = make_server(audit_log=path)
    http = http_of(server)
    user = "/settings/rbac/users/local/ann"
    assert http.request("PUT", user, {"password": "secret1", "roles": "admin"}).status == 200
    assert http.request("PUT", user, {"roles": "data_reader[default]"}).status == 200
    assert http.as_user("ann", "secret1").post("/controller/changePassword", {"password": "secret2"}).status == 200
    assert http.delete(user).status == 200
    wait_for(lambda: len(file_events(path)) == 4)
    events = file_events(path)
    assert [(e["id"], e["name"]) for e in events] == [
        (8232, "set user"), (8232, "set user"), (8232, "set user"), (8194, "delete user")]
    assert all(e["identity"] == {"domain": "local", "user": "ann"} for e in events)
    assert [e["real_userid"]["user"] for e in events] == ["Administrator", "Administrator", "ann", "Administrator"]
    assert [e.get("reason") for e in events] == ["added", "updated", "password changed", None]
    assert events[1]["roles"] == ["data_reader[default]"]


def test_an_unwritable_audit_file_is_said_once_counted_and_retried(make_server, tmp_path, caplog):
    """The audit file's directory is a file: the server says so once at ERROR, keeps serving,
    counts every event it could not write, and once the file can be written again records how
    many were lost there."""
    blocker = tmp_path / "audit"
    blocker.write_text("not a directory")
    path = blocker / "audit.log"
    server = make_server(audit_log=path)
    with caplog.at_level(logging.WARNING), server.client() as c:
        c.hello()
        for _ in range(3):
            assert c.auth_scram("nobody", "x").status == Status.AUTH_ERROR
        assert c.auth_scram("Administrator", "password").status == Status.SUCCESS
        assert c.select("default").status == Status.SUCCESS  # serving goes on
    assert server.call(lambda: server.server.audit.lost) == 3
    loud = [r for r in caplog.records if r.name == "dcpflow.audit" and r.levelno == logging.ERROR]
    assert len(loud) == 1 and "CANNOT WRITE THE AUDIT LOG" in loud[0].getMessage()
    blocker.unlink()
    server.call(lambda: setattr(server.server.audit, "interval", 0.0))  # retry at the next look
    server.call(lambda: server.server.audit.tick())
    (lost,) = file_events(path, "audit events lost")
    assert lost["count"] == 3
