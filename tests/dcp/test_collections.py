"""DCP and collections over real sockets (stream-request-value.md, system_event.md,
seqno-advanced.md): system events at their seqnos, filters by collection and by scope, the
manifest uid on resumption (behind, equal, ahead), stream-ids for several filtered streams of one
vbucket, FILTER_EMPTY, FlatBuffers events, and backfills that skip dropped collections. End to
end here, one case of each path (events and prefixed keys on the wire, a refusal carrying the
manifest uid, a filtered backfill on the server's threads); every filter rule is checked without a
socket in test_collection_rules.py."""

# ruff: noqa: F811  (pytest fixtures re-used by name as parameters)

import json

import pytest

from dcpflow.dcp.filter import COLLECTIONS_MANIFEST_IS_AHEAD
from dcpflow.protocol import dcp
from dcpflow.protocol.dcp import StreamEndReason
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.keys import encode_leb128
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .conftest import engine_of, keys_in, make_server, server, to_disk_only  # noqa: F401
from .sansio import summary
from .test_collection_rules import check_app_stream, check_backfill_after_the_drop

VB = 3
APP, ORDERS, EVENTS = 8, 8, 9  # scope app (8): orders (8), events (9)
COLLECTIONS = (Feature.XERROR, Feature.COLLECTIONS)


def manifest(srv, change):
    return srv.call(lambda: engine_of(srv).change_manifest(change).uid)


def setup_app(srv) -> None:
    manifest(srv, lambda m: m.add_scope("app"))
    manifest(srv, lambda m: m.add_collection("app", "orders"))
    manifest(srv, lambda m: m.add_collection("app", "events", max_ttl=30))


@pytest.fixture
def cwriter(server):
    with server.login(features=(Feature.XERROR, Feature.JSON, Feature.COLLECTIONS)) as c:
        yield c


def put(writer, cid: int, key: bytes, value: bytes = b"v") -> int:
    """Write key in collection cid (vbucket VB); its seqno."""
    r = writer.call(Opcode.SET, key=encode_leb128(cid) + key, value=value, extras=b"\0" * 8, vbucket=VB)
    assert r.status == Status.SUCCESS, r
    return int.from_bytes(r.extras[8:16], "big") if len(r.extras) == 16 else 0


def open_stream(clients, value: dict | None = None, *, features=COLLECTIONS, controls=None, start=0,
                end=0xFFFFFFFFFFFFFFFF, sid=None, client=None, flags=0):
    c = client or clients(features=features)
    if client is None:
        if Feature.COLLECTIONS in features:
            c.controls(enable_noop="true")
        for k, v in (controls or {}).items():
            c.controls(**{k: v})
    body = dict(value or {})
    if sid is not None:
        body["sid"] = sid
    r = c.stream_request(VB, start=start, end=end, value=json.dumps(body).encode() if body else b"", flags=flags)
    return c, r


def test_a_collection_aware_stream_sees_system_events_and_prefixed_keys(server, clients, cwriter):
    setup_app(server)
    put(cwriter, 0, b"d")
    put(cwriter, ORDERS, b"o")
    high = server.call(lambda: engine_of(server).vbucket(VB).high_seqno)
    c, r = open_stream(clients, end=high)
    assert r.status == Status.SUCCESS
    got = c.until_stream_end(VB)
    check_app_stream(got)  # the same as without a socket
    # a connection without collections sees the default collection only, and no events
    legacy, r = open_stream(clients, features=(Feature.XERROR,), end=high)
    assert r.status == Status.SUCCESS
    assert [(m.by_seqno, m.key) for m in legacy.until_stream_end(VB) if isinstance(m, dcp.DcpMutation)] == [(4, b"d")]


def test_unknown_collections_scopes_and_a_manifest_uid_ahead_are_refused(server, clients):
    setup_app(server)
    for value, status in (({"collections": ["77"]}, Status.UNKNOWN_COLLECTION), ({"scope": "77"}, Status.UNKNOWN_SCOPE),
                          ({"uid": "4"}, COLLECTIONS_MANIFEST_IS_AHEAD),
                          ({"collections": ["8"], "scope": "8"}, Status.EINVAL),
                          ({"collections": ["zz"]}, Status.EINVAL), ({"uid": 3}, Status.EINVAL)):
        c = clients(features=COLLECTIONS)
        c.controls(enable_noop="true")
        r = c.call(Opcode.DCP_STREAM_REQ, vbucket=VB, extras=bytes(48), value=json.dumps(value).encode())
        assert r.status == status, value
        if status in (Status.UNKNOWN_COLLECTION, Status.UNKNOWN_SCOPE):
            assert json.loads(r.value)["manifest_uid"] == "3"


def test_a_backfill_skips_dropped_collections_and_sends_their_drop(server, clients, cwriter):
    setup_app(server)
    for i in range(3):
        put(cwriter, ORDERS, b"o%d" % i)
        put(cwriter, EVENTS, b"e%d" % i)
    put(cwriter, 0, b"d")
    manifest(server, lambda m: m.drop_collection("app", "orders"))
    to_disk_only(server, VB)
    high = server.call(lambda: engine_of(server).vbucket(VB).high_seqno)
    c, r = open_stream(clients, end=high)
    got = summary(c.until_stream_end(VB))
    check_backfill_after_the_drop(got, high)  # the same as without a socket
    only, r = open_stream(clients, {"collections": ["9"]}, end=high)  # a filtered backfill: rows, filtered
    got = summary(only.until_stream_end(VB))
    assert [r[1] for r in got if r[0] == "doc"] == [5, 7, 9]
    assert got[-2:] == [("adv", high), ("end", StreamEndReason.OK)]
    legacy, r = open_stream(clients, features=(Feature.XERROR,), end=high)
    assert [(m.by_seqno, m.key) for m in legacy.until_stream_end(VB) if isinstance(m, dcp.DcpMutation)] == \
        [(10, b"d")]  # (no prefix: a connection without collections)

