"""User management over REST as ns_server has it (menelaus_web_rbac.erl in
https://github.com/couchbase/ns_server; https://docs.couchbase.com/server/current/rest-api/rbac.html),
driven by the official SDK's user manager (`cluster.users()`: upsert_user, get_user, get_all_users,
drop_user, get_roles - the shapes couchbase-python-client's couchbase/tests/usermgmt_t.py checks),
and what a change does to open KV connections: kv_engine rebuilds a stale privilege context on the
next command (daemon/connection.cc, getPrivilegeContext, in https://github.com/couchbase/kv_engine):
changed roles apply at once, a user no longer defined keeps its connection with no privilege
(EACCESS), and its DCP streams end with LostPrivileges (engines/ep/src/dcp/active_stream.cc)."""

import json
import re

import pytest
from couchbase.auth import AuthDomain
from couchbase.exceptions import AuthenticationException, InvalidArgumentException, UserNotFoundException
from couchbase.management.users import Role, User

from dcpflow.protocol.dcp import StreamEndReason
from dcpflow.protocol.status import Status
from dcpflow.server import UserDB, make_user

from ..sdk import connect
from .rest_client import http_of

USERS = "/settings/rbac/users"


def test_the_sdks_user_manager_creates_reads_changes_and_drops_users(sdk_server, sdk_cluster):
    um = sdk_cluster.users()
    um.upsert_user(User(username="custom-user", password="s3cr3t", display_name="Custom User",
                        roles=[Role(name="data_reader", bucket="default"), Role(name="data_writer", bucket="default")]))
    got = um.get_user("custom-user")
    assert (got.domain, got.user.username, got.user.display_name) == (AuthDomain.Local, "custom-user", "Custom User")
    assert got.password_changed is not None
    # ns_server's collection-aware roles: every scope and collection of the bucket
    assert {(r.role.name, r.role.bucket, r.role.scope, r.role.collection) for r in got.effective_roles} == {
        ("data_reader", "default", "*", "*"), ("data_writer", "default", "*", "*")}
    assert all(o.type == "user" for r in got.effective_roles for o in r.origins)
    assert {u.user.username for u in um.get_all_users()} >= {"Administrator", "custom-user"}

    user_cluster = connect(sdk_server.port, user="custom-user", password="s3cr3t")  # the new user logs in
    try:
        user_cluster.bucket("default").default_collection().upsert("by-custom-user", {"ok": True})
    finally:
        user_cluster.close()

    changed = got.user
    changed.roles = [Role(name="admin")]
    changed.password = "n3w-s3cr3t"
    um.upsert_user(changed)
    again = um.get_user("custom-user")
    assert [(r.role.name, r.role.bucket) for r in again.effective_roles] == [("admin", None)]
    with pytest.raises(AuthenticationException):
        connect(sdk_server.port, user="custom-user", password="s3cr3t").wait_until_ready(timedelta_s(5))
    um.drop_user("custom-user")
    with pytest.raises(UserNotFoundException):
        um.get_user("custom-user")
    with pytest.raises(UserNotFoundException):
        um.drop_user("custom-user")
    with pytest.raises(InvalidArgumentException):  # as the SDK's test_internal_user_fail
        um.upsert_user(User(username="custom-user", password="s3cr3t",
                            roles=[Role(name="data_reader", bucket="not-a-bucket")]))
    with pytest.raises(InvalidArgumentException):
        um.upsert_user(User(username="short", password="abc", roles=[Role(name="admin")]))


def timedelta_s(seconds: float):
    from datetime import timedelta
    return timedelta(seconds=seconds)


def test_the_sdks_get_roles_describes_every_role(sdk_cluster):
    roles = sdk_cluster.users().get_roles()
    admin, = [r for r in roles if r.role.name == "admin"]
    # what the SDK's own test_get_roles looks for
    assert re.match(r".*all cluster features.*web console.*read and write all data.*$", admin.description)
    assert admin.display_name == "Full Admin"
    names = {r.role.name: r for r in roles}
    assert {"bucket_admin", "bucket_full_access", "data_reader", "data_writer", "data_dcp_reader",
            "replication_target"} <= set(names)
    assert names["data_reader"].role.bucket == "*" and names["data_reader"].role.scope == "*"


def test_the_rest_answers_as_ns_server_does(server):
    http = http_of(server)
    made = http.request("PUT", USERS + "/local/alice", {"password": "alicepw", "roles": "data_reader[default:*:*]",
                                                        "name": "Alice"})
    assert (made.status, made.body) == (200, b'""')
    assert http.get(USERS + "/local/alice").json == {
        "id": "alice", "domain": "local", "name": "Alice", "groups": [], "external_groups": [],
        "password_change_date": http.get(USERS + "/local/alice").json["password_change_date"],
        "roles": [{"role": "data_reader", "bucket_name": "default", "scope_name": "*", "collection_name": "*",
                   "origins": [{"type": "user"}]}]}
    assert [u["id"] for u in http.get(USERS).json] == sorted(server.server.users.users)
    assert http.get(USERS + "/external").json == []
    unknown = http.get(USERS + "/local/nobody")
    assert (unknown.status, unknown.json) == (404, "Unknown user.")
    assert http.delete(USERS + "/local/nobody").status == 404
    assert http.get(USERS + "/ldap/alice").json == "Unknown user domain."
    external = http.request("PUT", USERS + "/external/bob", {"roles": "admin"})
    assert (external.status, external.text) == (400, "This http API endpoint requires enterprise edition")
    for form, field, words in (
            ({"password": "bobpw1", "roles": "data_reader[nowhere]"}, "roles", "[data_reader[nowhere]]"),
            ({"password": "bobpw1", "roles": "boss"}, "roles", "unknown, malformed"),
            ({"password": "bobpw1", "roles": "data_reader[default:app:*]"}, "roles", "per bucket"),
            ({"password": "bobpw1", "roles": "admin[default]"}, "roles", "[admin[default]]"),
            ({"password": "bob", "roles": "admin"}, "password", "at least 6 characters"),
            ({"roles": "admin"}, "password", "Field must be given"),
            ({"password": "bobpw1", "groups": "ops"}, "groups", "enterprise edition"),
            ({"password": "bobpw1", "color": "red"}, "color", "Unsupported key")):
        refused = http.request("PUT", USERS + "/local/bob", form)
        assert refused.status == 400 and words in refused.json["errors"][field], (form, refused.text)
    assert http.request("PUT", USERS + "/local/b%3Ab", {"password": "bobpw1"}).status == 400
    assert "bob" not in server.server.users.users
    # without a password the user keeps it: only the roles change
    assert http.request("PUT", USERS + "/local/alice", {"roles": "data_writer[default]"}).status == 200
    with server.login(user="alice", password="alicepw", bucket=None) as c:
        assert c.select("default").status == Status.SUCCESS
    assert http.delete(USERS + "/local/alice").body == b'""'


def test_a_user_changes_its_own_password_through_the_sdk(sdk_server, sdk_cluster):
    sdk_cluster.users().upsert_user(User(username="eve", password="evepw1", roles=[Role(name="data_reader",
                                                                                        bucket="default")]))
    eve = connect(sdk_server.port, user="eve", password="evepw1")
    try:
        eve.users().change_password("evepw2")  # POST /controller/changePassword, as eve
    finally:
        eve.close()
    with pytest.raises(AuthenticationException):
        connect(sdk_server.port, user="eve", password="evepw1").wait_until_ready(timedelta_s(5))
    again = connect(sdk_server.port, user="eve", password="evepw2")
    try:
        again.wait_until_ready(timedelta_s(10))
    finally:
        again.close()
    got = sdk_cluster.users().get_user("eve")  # the roles stay
    assert [(r.role.name, r.role.bucket) for r in got.effective_roles] == [("data_reader", "default")]
    sdk_cluster.users().drop_user("eve")


def test_only_an_administrator_manages_users(server):
    http = http_of(server)
    reader = http.as_user("reader", "readpw")
    for method, path, body in (("GET", USERS, None), ("GET", "/settings/rbac/roles", None),
                               ("GET", USERS + "/local/reader", None),
                               ("PUT", USERS + "/local/reader", {"password": "takeover", "roles": "admin"}),
                               ("DELETE", USERS + "/local/Administrator", None)):
        assert reader.request(method, path, body).status == 403, (method, path)
        assert http.as_user(None).request(method, path, body).status == 401, (method, path)
    assert server.server.users.get("reader").roles == ("data_reader[default]",)
    # a changed password is checked at the next request: the port does not keep the old login
    assert reader.get("/pools/default").status == 200
    assert http.request("PUT", USERS + "/local/reader", {"password": "readpw2", "roles": "data_reader[default]"}) \
        .status == 200
    assert reader.get("/pools/default").status == 401
    assert http.as_user("reader", "readpw2").get("/pools/default").status == 200
    short = http.as_user("reader", "readpw2").post("/controller/changePassword", {"password": "abc"})
    assert short.status == 400 and "at least 6" in short.json["errors"]["password"]
    assert http.as_user(None).post("/controller/changePassword", {"password": "whatever"}).status == 401


def test_changes_take_effect_on_open_kv_connections(server):
    http = http_of(server)
    with server.login() as admin:
        assert admin.set(b"doc", b"v1").status == Status.SUCCESS
    assert http.request("PUT", USERS + "/local/carol", {"password": "carolpw", "roles": "data_reader[default]"}) \
        .status == 200
    with server.login(user="carol", password="carolpw") as carol:
        assert carol.get(b"doc").status == Status.SUCCESS
        assert carol.set(b"doc", b"v2").status == Status.EACCESS
        assert http.request("PUT", USERS + "/local/carol", {
            "roles": "data_reader[default],data_writer[default]"}).status == 200
        assert carol.set(b"doc", b"v2").status == Status.SUCCESS  # the same connection, the new roles
        assert http.request("PUT", USERS + "/local/carol", {"roles": "data_writer[default]"}).status == 200
        assert carol.get(b"doc").status == Status.EACCESS  # taken away as at once
        assert http.delete(USERS + "/local/carol").status == 200
        assert carol.set(b"doc", b"v3").status == Status.EACCESS  # dropped: no privilege at all
        assert carol.call(0x0a).status == Status.SUCCESS  # NOOP: the connection stays, as kv_engine's
        assert carol.select("default").status == Status.EACCESS
    with server.client() as again:
        again.hello()
        assert again.auth_scram("carol", "carolpw").status == Status.AUTH_ERROR
    with server.login() as admin:
        assert admin.get(b"doc").value == b"v2"


def test_a_dropped_users_dcp_streams_end_with_lost_privileges(server):
    from tests.dcp.client import DcpClient
    http = http_of(server)
    assert http.request("PUT", USERS + "/local/feed", {"password": "feedpw", "roles": "data_dcp_reader[default]"}) \
        .status == 200
    c = DcpClient(server.port)
    c.num_vbuckets = server.config.num_vbuckets
    try:
        c.connect(user="feed", password="feedpw", name="feed-conn")
        assert c.stream_request(0).status == Status.SUCCESS
        assert c.stream_request(1).status == Status.SUCCESS
        assert http.delete(USERS + "/local/feed").status == 200
        msgs = c.quiet(1.0)
        ended = sorted((m.vbucket, m.reason) for m in msgs if hasattr(m, "reason") and hasattr(m, "vbucket"))
        assert ended == [(0, StreamEndReason.LOST_PRIVILEGES), (1, StreamEndReason.LOST_PRIVILEGES)], msgs
    finally:
        c.close()


def test_users_made_over_rest_survive_a_restart_over_the_users_file(make_server, tmp_path):
    users_file = tmp_path / "users.json"
    users_file.write_text(json.dumps({"users": {
        "Administrator": {"password": "password", "roles": ["admin"]},
        "fileuser": {"password": "filepw", "roles": ["data_reader[default]"]},
        "other": {"password": "otherpw", "roles": ["data_reader[default]"]}}}))
    server = make_server(users=str(users_file))
    http = http_of(server)
    assert http.request("PUT", USERS + "/local/dave", {"password": "davepw", "roles": "bucket_full_access[default]",
                                                       "name": "Dave"}).status == 200
    assert http.delete(USERS + "/local/fileuser").status == 200
    assert http.request("PUT", USERS + "/local/other", {"roles": "data_writer[default]"}).status == 200
    server.stop()
    overlay = (tmp_path / "data" / "users-managed.json").read_text()
    assert "davepw" not in overlay and "otherpw" not in overlay  # hashes only
    again = make_server(users=str(users_file))
    http = http_of(again)
    assert http.get(USERS + "/local/dave").json["name"] == "Dave"
    assert http.get(USERS + "/local/fileuser").status == 404  # dropped stays dropped
    assert [r["role"] for r in http.get(USERS + "/local/other").json["roles"]] == ["data_writer"]
    with again.login(user="dave", password="davepw") as dave:
        assert dave.set(b"k", b"v").status == Status.SUCCESS
    with again.login(user="other", password="otherpw") as other:  # its password from the file, its roles from REST
        assert other.set(b"k2", b"v").status == Status.SUCCESS
    assert http.request("PUT", USERS + "/local/fileuser", {"password": "fresh1", "roles": "admin"}).status == 200
    assert again.call(lambda: again.server.users.get("fileuser").is_admin)


def test_a_damaged_overlay_fails_the_start_with_a_clear_error(tmp_path):
    (tmp_path / "users-managed.json").write_text("{not json")
    db = UserDB([make_user("Administrator", password="password", roles=["admin"])])
    with pytest.raises(ValueError, match="users-managed.json is damaged"):
        db.attach_overlay(tmp_path / "users-managed.json")


def test_users_file_roles_take_ns_servers_collection_spelling():
    user = make_user("u", password="pw", roles=["data_reader[default:*:*]", "data_writer[b:*]"])
    assert set(user.bucket_privileges) == {"default", "b"}
    with pytest.raises(ValueError, match="per bucket"):
        make_user("u", password="pw", roles=["data_reader[default:inventory:*]"])
