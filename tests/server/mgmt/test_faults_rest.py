"""The /faults endpoints' answers to bad requests, as the rest of the listener answers them
(ns_server's shapes): 401 without credentials, 403 naming cluster.admin!write for anyone but an
admin (before any 404), 404 for an unknown bucket, 400 for malformed bodies and bad parameters,
413 for an oversized body, 405 for a wrong method - never a traceback, nothing injected, and the
KV port serves throughout."""

import pytest

from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from dcpflow.server import UserDB, make_user

from ..conftest import keys_in, users_db
from .rest_client import http_of

ENDPOINTS = [
    ("GET", "/faults"), ("DELETE", "/faults"),
    ("POST", "/faults/buckets/default/failover"), ("POST", "/faults/buckets/default/rollback"),
    ("POST", "/faults/buckets/default/streams/end"), ("POST", "/faults/buckets/default/persistence/pause"),
    ("POST", "/faults/buckets/default/persistence/resume"), ("POST", "/faults/connections/drop"),
    ("POST", "/faults/delays"), ("DELETE", "/faults/delays"), ("DELETE", "/faults/delays/GET"),
    ("POST", "/faults/nodes/failover"),
]
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
JSON = {"Content-Type": "application/json"}


@pytest.fixture
def rbac_server(make_server):
    users = UserDB([*users_db().users.values(),
                    make_user("badmin", password="badminpw", roles=["bucket_admin[default]"])])
    # A wrong password per endpoint below: more than the login throttle's free failures from one
    # address (its own tests: tests/server/test_throttle.py), so it is off for this server.
    return make_server(users=users, login_failures=0)


def test_only_an_admin_may_inject_faults(rbac_server):
    http = http_of(rbac_server)
    forbidden = {"message": "Forbidden. User needs the following permissions", "permissions": ["cluster.admin!write"]}
    for method, path in ENDPOINTS + [("POST", "/faults/buckets/nope/failover")]:
        assert http.as_user(None).request(method, path).status == 401, (method, path)
        assert http.as_user("Administrator", "wrong").request(method, path).status == 401, (method, path)
        for user, password in (("reader", "readpw"), ("badmin", "badminpw"), ("dcp", "dcppw")):
            reply = http.as_user(user, password).request(method, path)
            assert (reply.status, reply.json) == (403, forbidden), (user, method, path)
    assert http.get("/faults").json["recent"] == []


def test_bad_requests_get_ns_server_errors_inject_nothing_and_kv_keeps_serving(server):
    http = http_of(server)
    with server.login() as w:
        for k in keys_in(2, 3, prefix="bad"):
            w.set(k, b"v")
        assert w.call(Opcode.SET_VBUCKET, extras=bytes([2]), vbucket=6).status == Status.SUCCESS  # a replica
    cases = [
        # malformed bodies
        ("/faults/buckets/default/failover", b"vbuckets=%zz", FORM),
        ("/faults/buckets/default/failover", b"vbuckets=1&vbuckets=2", FORM),
        ("/faults/buckets/default/failover", b"vbuckets=\xff", FORM),
        ("/faults/buckets/default/failover", b"just garbage", FORM),
        ("/faults/buckets/default/failover", b'{"vbuckets": [1,', JSON),
        ("/faults/buckets/default/failover", b'[1, 2]', JSON),
        ("/faults/buckets/default/failover", b'"all"', JSON),
        # bad parameters
        ("/faults/buckets/default/failover", b"", FORM),
        ("/faults/buckets/default/failover", b"vbuckets=64", FORM),
        ("/faults/buckets/default/failover", b"vbuckets=3-1", FORM),
        ("/faults/buckets/default/failover", b"vbuckets=0-1000000000000", FORM),
        ("/faults/buckets/default/failover", b"vbuckets=one", FORM),
        ("/faults/buckets/default/failover", b'{"vbuckets": [true]}', JSON),
        ("/faults/buckets/default/failover", b'{"vbuckets": ["1"]}', JSON),
        ("/faults/buckets/default/failover", b'{"vbuckets": []}', JSON),
        ("/faults/buckets/default/failover", b"vbuckets=6", FORM),  # a replica
        ("/faults/buckets/default/failover", b"vbuckets=1&unclean=perhaps", FORM),
        ("/faults/buckets/default/failover", b"vbuckets=1&clean=1", FORM),
        ("/faults/buckets/default/rollback", b"vbucket=2", FORM),
        ("/faults/buckets/default/rollback", b"vbucket=2&seqno=3", FORM),  # its high seqno
        ("/faults/buckets/default/rollback", b"vbucket=2&seqno=-1", FORM),
        ("/faults/buckets/default/rollback", b'{"vbucket": 2, "seqno": 1.5}', JSON),
        ("/faults/buckets/default/rollback", b'{"vbucket": 2, "seqno": 18446744073709551616}', JSON),
        ("/faults/buckets/default/rollback", b"vbucket=64&seqno=1", FORM),
        ("/faults/buckets/default/rollback", b"vbucket=6&seqno=0", FORM),  # a replica
        ("/faults/buckets/default/streams/end", b"", FORM),
        ("/faults/buckets/default/streams/end", b"reason=STATE_CHANGED&vbuckets=x", FORM),
        ("/faults/buckets/default/streams/end", b'{"reason": "SLOW", "name": 7}', JSON),
        ("/faults/nodes/failover", b"", FORM),  # not a cluster node
        ("/faults/nodes/failover", b"node=127.0.0.1:1&force=1", FORM),
    ]
    for path, body, headers in cases:
        reply = http.post(path, body, headers=headers)
        assert reply.status == 400 and "errors" in reply.json, (path, body, reply)
        assert b"Traceback" not in reply.body
    replica = http.post("/faults/buckets/default/rollback", b"vbucket=6&seqno=0", headers=FORM).json["errors"]
    assert replica == {"vbucket": "vbucket 6 is replica on this node: only an active vbucket fails over or rolls "
                                  "back here (a node failover promotes replicas)"}
    huge = http.post("/faults/delays", b"seconds=1&opcode=" + b"G" * (2 * 1024 * 1024), headers=FORM)
    assert huge.status == 413 and "larger than" in huge.json["errors"]["_"]
    for what in ("failover", "rollback", "streams/end", "persistence/pause", "persistence/resume"):
        reply = http.post(f"/faults/buckets/nope/{what}", b"vbuckets=1", headers=FORM)
        assert reply.status == 404 and reply.text == "Requested resource not found.\r\n", what
    assert http.request("PUT", "/faults/delays").status == 405
    assert http.get("/faults/buckets/default/failover").status == 405
    assert http.post("/faults/nothing/here").status == 404
    active = http.get("/faults").json
    assert active == {"persistence_paused": [], "delays": [], "recent": []}  # nothing was injected
    with server.login() as w:
        assert w.set(b"still", b"serving").status == Status.SUCCESS and w.get(b"still").value == b"serving"
    engine = server.server.buckets["default"].engine
    assert server.call(lambda: [len(engine.vbucket(vb).failover) for vb in (1, 2)]) == [1, 1]


def test_a_good_request_as_form_or_json_and_its_record(server):
    http = http_of(server)
    as_form = http.post("/faults/buckets/default/failover", {"vbuckets": "0-1,3"})
    as_json = http.post("/faults/buckets/default/failover", b'{"vbuckets": [4], "unclean": true}', headers=JSON)
    assert [v["vbucket"] for v in as_form.json["vbuckets"]] == [0, 1, 3]
    assert as_json.json["unclean"] is True and [v["vbucket"] for v in as_json.json["vbuckets"]] == [4]
    recent = http.get("/faults").json["recent"]
    assert [(r["fault"], r["vbuckets"], r["unclean"]) for r in recent] == [("failover", [0, 1, 3], False),
                                                                          ("failover", [4], True)]
    events = [e.text for e in server.server.mgmt.observer.events if e.kind == "fault"]
    assert len(events) == 2 and "unclean failover of 1 vbucket(s)" in events[1]
