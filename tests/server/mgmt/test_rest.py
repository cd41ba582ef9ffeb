"""The REST subset against a real server: ns_server's shapes, bucket create/update/flush/drop,
and ns_server's answers to bad input - while the KV port keeps serving."""

import json
import socket
import time
from pathlib import Path

import pytest

from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status
from dcpflow.server import UserDB, make_user

from ..conftest import ServerThread, users_db
from .rest_client import http_of


def kv_map(server: ServerThread, bucket: str = "default") -> dict:
    with server.login(bucket=bucket) as c:
        return json.loads(c.call(Opcode.GET_CLUSTER_CONFIG).value)


def test_the_map_advertises_the_listener_and_it_answers(server):
    cmap = kv_map(server)
    services = cmap["nodesExt"][0]["services"]
    assert services["mgmt"] == server.server.mgmt.port and services["kv"] == server.port
    assert cmap["nodes"][0]["hostname"] == f"$HOST:{server.server.mgmt.port}"
    root = http_of(server).get("/")
    assert root.status == 302 and root.headers["location"] == "/ui/"


def test_mgmt_port_8091_when_free_else_a_free_one_and_an_explicit_busy_port_fails(make_server, tmp_path):
    held = socket.socket()
    try:
        try:
            held.bind(("127.0.0.1", 8091))
            held.listen()
            holding = True
        except OSError:  # another process holds 8091 now, and may let it go at any moment
            holding = False
        srv = make_server()
        if holding:
            assert srv.server.mgmt.port != 8091
        assert kv_map(srv)["nodesExt"][0]["services"]["mgmt"] == srv.server.mgmt.port
        assert http_of(srv).get("/pools").status == 200
        busy = srv.server.mgmt.port
        with pytest.raises(OSError):
            make_server(data_dir=tmp_path / "other", mgmt_port=busy)
        assert not (tmp_path / "other" / "default").exists()  # failed before any bucket was created
    finally:
        held.close()


def test_pools_and_node_services(server):
    http = http_of(server)
    anonymous = http.as_user(None).get("/pools")
    assert anonymous.status == 200 and anonymous.json["isAdminCreds"] is False
    pools = http.get("/pools").json
    assert pools["isAdminCreds"] is True and pools["pools"][0]["name"] == "default"
    assert pools["uuid"] == http.get("/pools").json["uuid"]
    denied = http.as_user(None).get("/pools/default")
    assert denied.status == 401 and denied.headers["www-authenticate"].startswith("Basic realm=")
    pool = http.get("/pools/default").json
    node = pool["nodes"][0]
    mgmt = server.server.mgmt.port
    assert node["hostname"] == f"127.0.0.1:{mgmt}" and node["thisNode"] is True
    assert node["status"] == "healthy" and node["services"] == ["kv"] and node["ports"]["direct"] == server.port
    assert node["otpNode"] == "ns_1@127.0.0.1" and node["version"].startswith("7.6.0") and node["os"]
    assert pool["bucketNames"] == [{"bucketName": "default", "uuid": server.server.buckets["default"].uuid}]
    services = http.get("/pools/default/nodeServices").json
    assert services["nodesExt"] == [{"services": {"kv": server.port, "mgmt": mgmt}, "thisNode": True,
                                     "hostname": "127.0.0.1"}]


def test_a_bucket_has_the_fields_the_sdks_parse(server):
    http = http_of(server)
    doc = http.get("/pools/default/buckets/default").json
    bucket = server.server.buckets["default"]
    assert doc["name"] == "default" and doc["uuid"] == bucket.uuid and doc["bucketType"] == "membase"
    assert doc["quota"]["rawRAM"] == 100 * 1024 * 1024 and doc["replicaNumber"] == 0
    assert doc["evictionPolicy"] == "valueOnly" and doc["conflictResolutionType"] == "seqno"
    assert "flush" not in doc["controllers"] and doc["numVBuckets"] == 64
    node = doc["nodes"][0]
    assert (node["status"], node["hostname"], node["services"], node["ports"]["direct"]) == \
        ("healthy", f"127.0.0.1:{server.server.mgmt.port}", ["kv"], server.port)
    kv = kv_map(server)
    assert doc["vBucketServerMap"]["vBucketMap"] == kv["vBucketServerMap"]["vBucketMap"]
    assert doc["vBucketServerMap"]["serverList"] == [f"127.0.0.1:{server.port}"]
    assert doc["bucketCapabilities"] == kv["bucketCapabilities"]
    assert "vBucketServerMap" not in http.get("/pools/default/buckets/default?skipMap=true").json
    assert [b["name"] for b in http.get("/pools/default/buckets").json] == ["default"]
    terse = http.get("/pools/default/b/default").json
    assert terse["vBucketServerMap"] == doc["vBucketServerMap"] and terse["nodesExt"][0]["hostname"] == "127.0.0.1"


def test_create_update_flush_and_drop_a_bucket(server, tmp_path):
    http = http_of(server)
    created = http.post("/pools/default/buckets", {"name": "orders", "ramQuotaMB": "128", "flushEnabled": "1",
                                                   "conflictResolutionType": "lww", "replicaNumber": "1",
                                                   "numVBuckets": "16", "bucketType": "couchbase"})
    assert created.status == 202 and created.body == b""
    doc = http.get("/pools/default/buckets/orders").json
    assert (doc["conflictResolutionType"], doc["replicaNumber"], doc["numVBuckets"]) == ("lww", 1, 16)
    assert doc["quota"]["rawRAM"] == 128 * 1024 * 1024 and doc["controllers"]["flush"].endswith("/doFlush")
    engine = server.server.buckets["orders"].engine
    assert engine.num_vbuckets == 16 and engine.conflict_resolution.value == "lww"
    with server.login(bucket="orders") as c:
        c.num_vbuckets = 16
        assert c.set(b"o1", b"one").status == Status.SUCCESS

    assert http.post("/pools/default/buckets/orders", {"ramQuotaMB": "256", "flushEnabled": "0"}).status == 200
    doc = http.get("/pools/default/buckets/orders").json
    assert doc["quota"]["rawRAM"] == 256 * 1024 * 1024 and "flush" not in doc["controllers"]
    refused = http.post("/pools/default/buckets/orders/controller/doFlush")
    assert refused.status == 400 and refused.json == {"errors": {"_": "Flush is disabled for the bucket"}}
    fixed = http.post("/pools/default/buckets/orders", {"conflictResolutionType": "seqno", "numVBuckets": "16"})
    assert fixed.status == 400 and "cannot be changed" in fixed.json["errors"]["conflictResolutionType"]
    assert "numVBuckets" not in fixed.json["errors"]  # the same value as now is fine (SDKs send it back)
    assert http.post("/pools/default/buckets/orders", {"flushEnabled": "1"}).status == 200
    assert http.post("/pools/default/buckets/orders/controller/doFlush").status == 200
    with server.login(bucket="orders") as c:
        c.num_vbuckets = 16
        assert c.get(b"o1").status == Status.KEY_ENOENT
    assert server.call(lambda: engine.stats()["curr_items"]) == 0

    data_dir = Path(server.config.data_dir)
    assert json.loads((data_dir / "buckets.json").read_text()) == {"buckets": ["orders"]}
    assert http.delete("/pools/default/buckets/orders").status == 200
    missing = http.get("/pools/default/buckets/orders")
    assert missing.status == 404 and missing.text == "Requested resource not found.\r\n"
    assert not (data_dir / "orders").exists()
    assert json.loads((data_dir / "buckets.json").read_text()) == {"buckets": []}
    with server.client() as c:
        c.login(bucket=None)
        assert c.select("orders").status != Status.SUCCESS
    assert [b["name"] for b in http.get("/pools/default/buckets").json] == ["default"]


def test_created_buckets_are_served_after_a_restart(make_server, tmp_path):
    first = make_server()
    http = http_of(first)
    assert http.post("/pools/default/buckets", {"name": "kept", "ramQuotaMB": "100", "flushEnabled": "1"}).status \
        == 202
    with first.login(bucket="kept") as c:
        c.set(b"k", b"v")
    first.stop()
    second = make_server()
    doc = http_of(second).get("/pools/default/buckets/kept").json
    assert doc["controllers"]["flush"] and second.server.buckets["kept"].uuid == doc["uuid"]
    with second.login(bucket="kept") as c:
        assert c.get(b"k").value == b"v"
    second.stop()
    # A directory left by an earlier run that this server does not serve is never overwritten.
    (tmp_path / "data" / "buckets.json").unlink()
    third = make_server()
    assert "kept" not in third.server.buckets
    stale = http_of(third).post("/pools/default/buckets", {"name": "kept", "ramQuotaMB": "100"})
    assert stale.status == 400 and "from an earlier run" in stale.json["errors"]["name"]
    assert (tmp_path / "data" / "kept" / "store.sqlite3").exists()


@pytest.mark.parametrize("form, field, words", [
    ({"name": "b", "ramQuotaMB": "abc"}, "ramQuotaMB", "RAM quota"),
    ({"name": "b", "ramQuotaMB": "50"}, "ramQuotaMB", "at least 100"),
    ({"name": "b"}, "ramQuota", "must be specified"),
    ({"name": "b", "ramQuotaMB": "100", "replicaNumber": "4"}, "replicaNumber", "0 to 3"),
    ({"name": "b", "ramQuotaMB": "100", "bucketType": "ephemeral"}, "bucketType", "not supported"),
    ({"name": "b", "ramQuotaMB": "100", "bucketType": "nosuch"}, "bucketType", "must be one of"),
    ({"name": "b", "ramQuotaMB": "100", "conflictResolutionType": "custom"}, "conflictResolutionType",
     "not supported"),
    ({"name": "b", "ramQuotaMB": "100", "evictionPolicy": "nruEviction"}, "evictionPolicy", "not supported"),
    ({"name": "b", "ramQuotaMB": "100", "numVBuckets": "2048"}, "numVBuckets", "1 to 1024"),
    ({"name": "b", "ramQuotaMB": "100", "flushEnabled": "yes"}, "flushEnabled", "0 or 1"),
    ({"name": "b", "ramQuotaMB": "100", "color": "blue"}, "color", "Unsupported parameter"),
    ({"name": "a/b", "ramQuotaMB": "100"}, "name", "can only contain"),
    ({"name": "../x", "ramQuotaMB": "100"}, "name", "can only contain"),
    ({"name": ".x", "ramQuotaMB": "100"}, "name", "cannot start with dot"),
    ({"name": "", "ramQuotaMB": "100"}, "name", "cannot be empty"),
    ({"name": "DEFAULT", "ramQuotaMB": "100"}, "name", "already exists"),
])
def test_invalid_bucket_parameters_get_ns_servers_400(server, form, field, words):
    reply = http_of(server).post("/pools/default/buckets", form)
    assert reply.status == 400 and reply.headers["content-type"].startswith("application/json")
    assert words in reply.json["errors"][field], reply.json
    assert list(server.server.buckets) == ["default"]


def test_bad_requests_get_http_errors_never_a_traceback_and_kv_keeps_serving(server):
    http = http_of(server)
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    for body in (b"name=%zz&ramQuotaMB=100", b"name=x&&ramQuotaMB=100", b"name=\xff\xfe", b"name=a&name=b",
                 b"just-garbage"):
        reply = http.post("/pools/default/buckets", body, headers=form)
        assert reply.status == 400 and "errors" in reply.json, (body, reply)
    as_json = http.post("/pools/default/buckets", b'{"name": "x"}', headers={"Content-Type": "application/json"})
    assert as_json.status == 400 and "x-www-form-urlencoded" in as_json.json["errors"]["_"]
    huge = http.post("/pools/default/buckets", b"name=" + b"x" * (2 * 1024 * 1024), headers=form)
    assert huge.status == 413 and "larger than" in huge.json["errors"]["_"]
    bad_json = http.request("PUT", "/pools/default/buckets/default/scopes", b'{"scopes": [',
                            headers={"Content-Type": "application/json"})
    assert bad_json.status == 400 and "Malformed JSON" in bad_json.json["errors"]["_"]
    for method, path in (("GET", "/pools/default/buckets/nope"), ("DELETE", "/pools/default/buckets/nope"),
                         ("POST", "/pools/default/buckets/nope/controller/doFlush"),
                         ("GET", "/pools/default/buckets/nope/scopes")):
        reply = http.request(method, path)
        assert reply.status == 404 and reply.text == "Requested resource not found.\r\n", (method, path)
    assert http.get("/no/such/path").status == 404
    wrong_method = http.request("PUT", "/pools/default/buckets")
    assert wrong_method.status == 405 and "not allowed" in wrong_method.json["errors"]["_"]
    assert http.as_user("Administrator", "wrong").get("/pools/default").status == 401
    assert http.get("/pools/default", headers={"Authorization": "Basic !!!"}).status == 401
    assert http.get("/pools/default", headers={"Authorization": "Bearer x"}).status == 401
    # Not HTTP at all on the management port.
    with socket.create_connection(("127.0.0.1", server.server.mgmt.port), timeout=10) as s:
        s.sendall(b"\x80\x01\x00\x00garbage that is not http\r\n\r\n")
        answer = s.recv(4096)
        assert answer.split(b" ")[1] == b"400" and b"Traceback" not in answer
    with server.login() as c:
        assert c.set(b"still", b"serving").status == Status.SUCCESS and c.get(b"still").value == b"serving"
    assert http.get("/pools/default").status == 200


@pytest.fixture
def rbac_server(make_server):
    users = UserDB([*users_db().users.values(),
                    make_user("badmin", password="badminpw", roles=["bucket_admin[default]"]),
                    make_user("nobody", password="nobodypw", roles=[])])
    return make_server(users=users)


def test_rest_permissions_follow_the_kv_roles(rbac_server):
    admin = http_of(rbac_server)
    assert admin.post("/pools/default/buckets", {"name": "other", "ramQuotaMB": "100"}).status == 202
    reader = admin.as_user("reader", "readpw")
    assert [b["name"] for b in reader.get("/pools/default/buckets").json] == ["default"]
    assert reader.get("/pools/default/buckets/default").status == 200
    denied = reader.get("/pools/default/buckets/other")
    assert denied.status == 403 and denied.json == {"message": "Forbidden. User needs the following permissions",
                                                    "permissions": ["cluster.bucket[other].settings!read"]}
    assert reader.get("/pools/default/buckets/no-such").status == 403  # no hint whether it exists
    assert reader.post("/pools/default/buckets", {"name": "x", "ramQuotaMB": "100"}).json["permissions"] == \
        ["cluster.buckets!create"]
    assert reader.post("/pools/default/buckets/default", {"flushEnabled": "1"}).status == 403
    assert reader.delete("/pools/default/buckets/default").status == 403
    badmin = admin.as_user("badmin", "badminpw")
    assert badmin.post("/pools/default/buckets/default", {"flushEnabled": "1"}).status == 200
    assert badmin.post("/pools/default/buckets/default/controller/doFlush").status == 200
    assert badmin.post("/pools/default/buckets/other", {"flushEnabled": "1"}).status == 403
    assert badmin.delete("/pools/default/buckets/default").status == 403
    nobody = admin.as_user("nobody", "nobodypw")
    assert nobody.get("/pools/default").status == 200 and nobody.get("/pools/default/buckets").json == []
    assert nobody.get("/metrics").status == 403
    assert set(rbac_server.server.buckets) == {"default", "other"}


def test_https_on_the_tls_management_port(make_server, tmp_path):
    import shutil
    import ssl
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-keyout", str(tmp_path / "key.pem"), "-out", str(tmp_path / "cert.pem")], check=True,
                   capture_output=True)
    server = make_server(tls_cert=tmp_path / "cert.pem", tls_key=tmp_path / "key.pem", tls_port=0, mgmt_tls_port=0)
    mgmt = server.server.mgmt
    assert mgmt.tls_port not in (None, mgmt.port)
    services = kv_map(server)["nodesExt"][0]["services"]
    assert services["mgmtSSL"] == mgmt.tls_port and services["mgmt"] == mgmt.port
    ctx = ssl.create_default_context(cafile=str(tmp_path / "cert.pem"))
    ctx.check_hostname = False  # the test certificate names 127.0.0.1 as its CN only
    https = http_of(server)
    https.port, https.tls_context = mgmt.tls_port, ctx
    pool = https.get("/pools/default").json
    assert pool["nodes"][0]["ports"]["httpsMgmt"] == mgmt.tls_port
    assert https.get("/pools/default/buckets/default").json["name"] == "default"
    with socket.create_connection(("127.0.0.1", mgmt.tls_port), timeout=10) as s:  # plain HTTP: no answer
        s.sendall(b"GET /pools HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b"uuid" not in s.recv(4096)


def test_a_cluster_node_leaves_its_bucket_to_the_cluster_manager(make_server):
    from dcpflow.protocol.config import Node

    server = make_server(nodes=[Node(0), Node(1)], this_node=0)
    http = http_of(server)
    for reply in (http.post("/pools/default/buckets", {"name": "x", "ramQuotaMB": "100"}),
                  http.delete("/pools/default/buckets/default"),
                  http.post("/pools/default/buckets/default", {"flushEnabled": "1"}),
                  http.post("/pools/default/buckets/default/controller/doFlush")):
        assert reply.status == 400, reply
    assert "cluster manager" in http.delete("/pools/default/buckets/default").json["errors"]["_"]
    assert list(server.server.buckets) == ["default"]


def test_a_failing_handler_answers_500_without_its_traceback(server, monkeypatch, caplog):
    engine = server.server.buckets["default"].engine

    def broken():
        raise ZeroDivisionError("the secret details")

    monkeypatch.setattr(engine, "stats", broken)
    reply = http_of(server).get("/pools/default/buckets/default")
    assert reply.status == 500 and reply.json == {"errors": {"_": "Unexpected server error, request logged."}}
    assert "secret" not in reply.text and "Traceback" not in reply.text
    assert any("secret details" in str(r.exc_info[1]) for r in caplog.records if r.exc_info)
    monkeypatch.undo()
    with server.login() as c:
        assert c.set(b"after-500", b"v").status == Status.SUCCESS


def test_the_management_port_holds_at_most_its_connection_limit(make_server):
    """--mgmt-max-connections: at the limit a newcomer closes the oldest connection with no request
    in progress and is served; with a request in progress on every one, the newcomer is closed at
    once (both counted in /metrics and logged at a bounded rate); the KV port is not concerned."""
    server = make_server(mgmt_port=0, mgmt_max_connections=3)
    port = server.mgmt_port
    auth = b"Authorization: Basic QWRtaW5pc3RyYXRvcjpwYXNzd29yZA==\r\n"
    request = b"GET /pools HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth + b"\r\n"

    def keep_alive() -> socket.socket:
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(request)
        assert s.recv(65536).startswith(b"HTTP/1.1 200")  # served: aiohttp holds the connection now
        return s

    def closed(s: socket.socket) -> bool:
        try:
            return s.recv(65536) == b""
        except ConnectionResetError:
            return True

    held = [keep_alive() for _ in range(3)]
    newcomer = keep_alive()  # the oldest idle one made room
    assert closed(held[0])
    assert server.call(lambda: server.server.refused_connections["http_evicted"]) == 1
    for s in held + [newcomer]:
        s.close()
    deadline = time.monotonic() + 60
    while server.call(lambda: server.server.mgmt.open_connections) > 0:  # until the server sees the closes
        assert time.monotonic() < deadline
        time.sleep(0.02)
    busy = []
    for _ in range(3):  # a request whose body never ends: in progress
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"POST /pools/default/buckets HTTP/1.1\r\nHost: x\r\n" + auth +
                  b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\nname=")
        busy.append(s)
    deadline = time.monotonic() + 60
    while server.call(lambda: len(server.server.mgmt._busy)) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    extra = socket.create_connection(("127.0.0.1", port), timeout=10)
    extra.sendall(request)
    assert closed(extra)  # closed at once, unanswered
    extra.close()
    assert server.call(lambda: server.server.refused_connections["http_limit"]) == 1
    with server.login() as c:
        assert c.call(Opcode.NOOP).status == Status.SUCCESS
    for s in busy:
        s.close()
