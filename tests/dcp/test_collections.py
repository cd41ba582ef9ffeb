"""DCP and collections over real sockets (stream-request-value.md, system_event.md,
seqno-advanced.md): system events at their seqnos, filters by collection and by scope, the
manifest uid on resumption (behind, equal, ahead), stream-ids for several filtered streams of one
vbucket, FILTER_EMPTY, FlatBuffers events, and backfills that skip dropped collections."""

# ruff: noqa: F811  (pytest fixtures re-used by name as parameters)

import json

import pytest

from dcpflow.dcp.filter import COLLECTIONS_MANIFEST_IS_AHEAD
from dcpflow.protocol import dcp
from dcpflow.protocol.dcp import StreamEndReason, SystemEventId
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.keys import encode_leb128, split_key
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .conftest import engine_of, keys_in, make_server, server, to_disk_only  # noqa: F401

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


def summary(messages) -> list[tuple]:
    """What a stream sent, in order: ("event", seqno, id, key), ("doc", seqno, cid, key), ("adv", seqno),
    ("end", reason); markers as ("marker", start, end)."""
    out = []
    for m in messages:
        if isinstance(m, dcp.DcpSystemEvent):
            out.append(("event", m.by_seqno, SystemEventId(m.event), m.key))
        elif isinstance(m, (dcp.DcpMutation, dcp.DcpDeletion)):
            cid, key = split_key(m.key)
            out.append(("doc", m.by_seqno, cid, key))
        elif isinstance(m, dcp.DcpSeqnoAdvanced):
            out.append(("adv", m.by_seqno))
        elif isinstance(m, dcp.DcpStreamEnd):
            out.append(("end", StreamEndReason(m.reason)))
        elif isinstance(m, dcp.DcpSnapshotMarker):
            out.append(("marker", m.start_seqno, m.end_seqno))
    return out


def no_markers(rows):
    return [r for r in rows if r[0] != "marker"]


def test_a_collection_aware_stream_sees_system_events_and_prefixed_keys(server, clients, cwriter):
    setup_app(server)
    put(cwriter, 0, b"d")
    put(cwriter, ORDERS, b"o")
    high = server.call(lambda: engine_of(server).vbucket(VB).high_seqno)
    c, r = open_stream(clients, end=high)
    assert r.status == Status.SUCCESS
    got = c.until_stream_end(VB)
    assert no_markers(summary(got)) == [
        ("event", 1, SystemEventId.CREATE_SCOPE, b"app"), ("event", 2, SystemEventId.BEGIN_COLLECTION, b"orders"),
        ("event", 3, SystemEventId.BEGIN_COLLECTION, b"events"), ("doc", 4, 0, b"d"), ("doc", 5, ORDERS, b"o"),
        ("end", StreamEndReason.OK)]
    events = [m for m in got if isinstance(m, dcp.DcpSystemEvent)]
    assert [(m.version, m.decode_value()) for m in events] == [
        (0, {"manifest_uid": 1, "scope_id": APP}),
        (0, {"manifest_uid": 2, "scope_id": APP, "collection_id": ORDERS}),
        (1, {"manifest_uid": 3, "scope_id": APP, "collection_id": EVENTS, "max_ttl": 30})]
    # a connection without collections sees the default collection only, and no events
    legacy, r = open_stream(clients, features=(Feature.XERROR,), end=high)
    assert r.status == Status.SUCCESS
    assert [(m.by_seqno, m.key) for m in legacy.until_stream_end(VB) if isinstance(m, dcp.DcpMutation)] == [(4, b"d")]


def test_a_collection_filter_hides_the_rest_and_closes_snapshots_with_seqno_advanced(server, clients, cwriter):
    setup_app(server)
    put(cwriter, ORDERS, b"o1")
    put(cwriter, EVENTS, b"e1")
    put(cwriter, 0, b"d1")  # the last item of the snapshot is hidden from the filter below
    c, r = open_stream(clients, {"collections": ["8"]})
    assert r.status == Status.SUCCESS
    got = summary(c.messages_until(lambda m: isinstance(m, dcp.DcpSeqnoAdvanced)))
    assert got == [("marker", 0, 6), ("event", 2, SystemEventId.BEGIN_COLLECTION, b"orders"),
                   ("doc", 4, ORDERS, b"o1"), ("adv", 6)]
    put(cwriter, EVENTS, b"e2")  # a snapshot with nothing for the stream: its marker and SEQNO_ADVANCED
    assert summary(c.messages_until(lambda m: isinstance(m, dcp.DcpSeqnoAdvanced))) == [("marker", 7, 7), ("adv", 7)]
    put(cwriter, ORDERS, b"o2")
    assert summary(c.messages_until(lambda m: isinstance(m, dcp.DcpMutation)))[-1] == ("doc", 8, ORDERS, b"o2")


def test_a_scope_filter_follows_the_scope_and_ends_filter_empty(server, clients, cwriter):
    setup_app(server)
    put(cwriter, 0, b"d")
    c, r = open_stream(clients, {"scope": "8"})
    assert r.status == Status.SUCCESS
    put(cwriter, EVENTS, b"e")
    manifest(server, lambda m: m.add_collection("app", "late"))
    put(cwriter, 10, b"l")  # the new collection (id 10) joined the filtered scope
    manifest(server, lambda m: m.drop_scope("app"))
    got = no_markers(summary(c.until_stream_end(VB)))
    assert got == [
        ("event", 1, SystemEventId.CREATE_SCOPE, b"app"), ("event", 2, SystemEventId.BEGIN_COLLECTION, b"orders"),
        ("event", 3, SystemEventId.BEGIN_COLLECTION, b"events"), ("adv", 4), ("doc", 5, EVENTS, b"e"),
        ("event", 6, SystemEventId.BEGIN_COLLECTION, b"late"), ("doc", 7, 10, b"l"),
        ("event", 8, SystemEventId.END_COLLECTION, b""), ("event", 9, SystemEventId.END_COLLECTION, b""),
        ("event", 10, SystemEventId.END_COLLECTION, b""), ("event", 11, SystemEventId.DROP_SCOPE, b""),
        ("end", StreamEndReason.FILTER_EMPTY)]


def test_a_collections_filter_ends_filter_empty_when_its_last_collection_goes(server, clients, cwriter):
    setup_app(server)
    c, r = open_stream(clients, {"collections": ["8", "9"]})
    manifest(server, lambda m: m.drop_collection("app", "orders"))
    put(cwriter, EVENTS, b"still")
    manifest(server, lambda m: m.drop_collection("app", "events"))
    got = no_markers(summary(c.until_stream_end(VB)))
    assert got[-4:] == [("event", 4, SystemEventId.END_COLLECTION, b""), ("doc", 5, EVENTS, b"still"),
                        ("event", 6, SystemEventId.END_COLLECTION, b""), ("end", StreamEndReason.FILTER_EMPTY)]


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


def test_resuming_with_a_manifest_uid_skips_the_events_the_client_saw(server, clients, cwriter):
    setup_app(server)  # events stamped 1, 2, 3
    put(cwriter, ORDERS, b"o")
    manifest(server, lambda m: m.add_collection("app", "more"))  # stamped 4
    c, r = open_stream(clients, {"uid": "2"})  # behind: it saw the scope and orders
    assert r.status == Status.SUCCESS
    got = no_markers(summary(c.messages_until(lambda m: isinstance(m, dcp.DcpSystemEvent) and m.by_seqno == 5)))
    assert got == [("event", 3, SystemEventId.BEGIN_COLLECTION, b"events"), ("doc", 4, ORDERS, b"o"),
                   ("event", 5, SystemEventId.BEGIN_COLLECTION, b"more")]
    same, r = open_stream(clients, {"uid": "4"}, end=5)
    assert no_markers(summary(same.until_stream_end(VB))) == [("doc", 4, ORDERS, b"o"), ("adv", 5),
                                                                ("end", StreamEndReason.OK)]


def test_stream_ids_give_one_vbucket_several_filtered_streams(server, clients, cwriter):
    setup_app(server)
    c = clients(features=COLLECTIONS)
    c.controls(enable_noop="true", enable_stream_id="true")
    put(cwriter, ORDERS, b"o")
    put(cwriter, EVENTS, b"e")
    put(cwriter, 0, b"d")
    for sid, value in ((1, {"collections": ["8"]}), (2, {"collections": ["9", "0"]}), (3, {})):
        assert open_stream(clients, value, sid=sid, client=c, end=6)[1].status == Status.SUCCESS
    ended: set = set()

    def all_ended(m) -> bool:
        if isinstance(m, dcp.DcpStreamEnd):
            ended.add(m.stream_id)
        return ended == {1, 2, 3}

    got = c.messages_until(all_ended)
    by_sid: dict = {}
    for m in got:
        by_sid.setdefault(m.stream_id, []).append(m)
    docs = {sid: [r for r in summary(ms) if r[0] == "doc"] for sid, ms in by_sid.items()}
    assert docs == {1: [("doc", 4, ORDERS, b"o")], 2: [("doc", 5, EVENTS, b"e"), ("doc", 6, 0, b"d")],
                    3: [("doc", 4, ORDERS, b"o"), ("doc", 5, EVENTS, b"e"), ("doc", 6, 0, b"d")]}
    assert ("adv", 6) in summary(by_sid[1])  # its snapshot ended on what its filter hid
    assert open_stream(clients, {"collections": ["8"]}, sid=4, client=c)[1].status == Status.SUCCESS
    assert open_stream(clients, {}, sid=4, client=c)[1].status == Status.KEY_EEXISTS  # a live one has sid 4


def test_flatbuffers_system_events_and_the_modify_event(server, clients):
    setup_app(server)
    manifest(server, lambda m: m.update_collection("app", "orders", max_ttl=7, history=True))
    fb, r = open_stream(clients, controls={"flatbuffers_system_events": "true"}, end=4)
    got = [m for m in fb.until_stream_end(VB) if isinstance(m, dcp.DcpSystemEvent)]
    assert [(m.by_seqno, m.version) for m in got] == [(1, 2), (2, 2), (3, 2), (4, 2)]
    assert got[3].event == SystemEventId.MODIFY_COLLECTION and got[3].key == b"orders"
    assert got[3].decode_value() == {"manifest_uid": 4, "scope_id": APP, "collection_id": ORDERS, "ttl_valid": True,
                                     "max_ttl": 7, "name": "orders", "history": True}
    assert got[0].decode_value() == {"manifest_uid": 1, "scope_id": APP, "name": "app"}
    legacy, r = open_stream(clients, end=4)  # without FlatBuffers the modify event is not sent
    rows = no_markers(summary(legacy.until_stream_end(VB)))
    assert [r[1] for r in rows if r[0] == "event"] == [1, 2, 3] and ("adv", 4) in rows


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
    assert got[0] == ("marker", 0, high)
    assert [r for r in got if r[0] == "doc"] == [("doc", 5, EVENTS, b"e0"), ("doc", 7, EVENTS, b"e1"),
                                                 ("doc", 9, EVENTS, b"e2"), ("doc", 10, 0, b"d")]
    # the drop event replaced the create on disk (both are keyed by the collection)
    assert [r[1:3] for r in got if r[0] == "event"] == [(1, SystemEventId.CREATE_SCOPE),
                                                         (3, SystemEventId.BEGIN_COLLECTION),
                                                         (11, SystemEventId.END_COLLECTION)]
    only, r = open_stream(clients, {"collections": ["9"]}, end=high)  # a filtered backfill: rows, filtered
    got = summary(only.until_stream_end(VB))
    assert [r[1] for r in got if r[0] == "doc"] == [5, 7, 9]
    assert got[-2:] == [("adv", high), ("end", StreamEndReason.OK)]
    legacy, r = open_stream(clients, features=(Feature.XERROR,), end=high)
    assert [(m.by_seqno, m.key) for m in legacy.until_stream_end(VB) if isinstance(m, dcp.DcpMutation)] == \
        [(10, b"d")]  # (no prefix: a connection without collections)


def test_to_latest_of_a_filtered_stream_ends_at_its_collections_high_seqno(server, clients, cwriter):
    setup_app(server)
    put(cwriter, ORDERS, b"o")
    put(cwriter, 0, b"d")
    c, r = open_stream(clients, {"collections": ["8"]}, flags=int(dcp.StreamFlag.TO_LATEST))
    got = no_markers(summary(c.until_stream_end(VB)))
    assert got == [("event", 2, SystemEventId.BEGIN_COLLECTION, b"orders"), ("doc", 4, ORDERS, b"o"),
                   ("end", StreamEndReason.OK)]
