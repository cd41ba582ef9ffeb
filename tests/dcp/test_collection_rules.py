"""DCP and collections without a socket: the rules tests/dcp/test_collections.py checks over a
server (stream-request-value.md, system_event.md, seqno-advanced.md), asserted on what a
DcpProducer returns and sends over the real engine: system events at their seqnos, filters
by collection and by scope, the manifest uid on resumption, stream-ids for several filtered
streams of one vbucket, FILTER_EMPTY, FlatBuffers events, backfills that skip dropped collections
and ToLatest of a filtered stream."""

import json

from dcpflow.dcp.errors import Refusal
from dcpflow.dcp.filter import COLLECTIONS_MANIFEST_IS_AHEAD
from dcpflow.dcp.producer import Started
from dcpflow.protocol import dcp
from dcpflow.protocol.dcp import StreamEndReason, StreamFlag, SystemEventId
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.status import Status

from .sansio import MAX, drain, engine_fixture, no_markers, producer, request, summary, to_disk_only, written

engine = engine_fixture(4)
VB = 3
APP, ORDERS, EVENTS = 8, 8, 9  # scope app (8): orders (8), events (9)


def setup_app(engine) -> None:
    engine.change_manifest(lambda m: m.add_scope("app"))
    engine.change_manifest(lambda m: m.add_collection("app", "orders"))
    engine.change_manifest(lambda m: m.add_collection("app", "events", max_ttl=30))


def put(engine, cid: int, key: bytes, value: bytes = b"v") -> int:
    """Write key in collection cid (vbucket VB); its seqno."""
    return engine.vbucket(VB).set((cid, key) if cid else key, value).by_seqno


def served(p, change) -> list:
    """Make a change to the vbucket, tell the connection (the shell's seqno listener) and take
    what it sends: a stream served between changes, as a server serves it."""
    change()
    written(p, VB)
    return drain(p)


def connection(engine, collections: bool = True, name: str = "t", **controls):
    p = producer(engine, name=name)
    for key, value in ({"enable_noop": "true"} if collections else {}).items() | controls.items():
        assert not isinstance(p.control(key, value, now=100.0, collections=collections), Refusal)
    return p


def ask(p, value: dict | None = None, *, collections: bool = True, start=0, end=MAX, flags=0):
    body = json.dumps(value).encode() if value else b""
    return p.stream_request(request(VB, start, end, value=body, flags=flags), collections=collections)


def check_app_stream(got: list) -> None:
    """What a collection-aware stream of `setup_app` with "d" (default) and "o" (orders) sends."""
    assert no_markers(summary(got)) == [
        ("event", 1, SystemEventId.CREATE_SCOPE, b"app"), ("event", 2, SystemEventId.BEGIN_COLLECTION, b"orders"),
        ("event", 3, SystemEventId.BEGIN_COLLECTION, b"events"), ("doc", 4, 0, b"d"), ("doc", 5, ORDERS, b"o"),
        ("end", StreamEndReason.OK)]
    events = [m for m in got if isinstance(m, dcp.DcpSystemEvent)]
    assert [(m.version, m.decode_value()) for m in events] == [
        (0, {"manifest_uid": 1, "scope_id": APP}),
        (0, {"manifest_uid": 2, "scope_id": APP, "collection_id": ORDERS}),
        (1, {"manifest_uid": 3, "scope_id": APP, "collection_id": EVENTS, "max_ttl": 30})]


def test_a_collection_aware_stream_sees_system_events_and_prefixed_keys(engine):
    setup_app(engine)
    put(engine, 0, b"d")
    high = put(engine, ORDERS, b"o")
    p = connection(engine)
    assert isinstance(ask(p, end=high), Started)
    got = drain(p)
    check_app_stream(got)
    # a connection without collections sees the default collection only, and no events
    legacy = connection(engine, collections=False, name="legacy")
    assert isinstance(ask(legacy, collections=False, end=high), Started)
    assert [(m.by_seqno, m.key) for m in drain(legacy) if isinstance(m, dcp.DcpMutation)] == [(4, b"d")]


def test_a_collection_filter_hides_the_rest_and_closes_snapshots_with_seqno_advanced(engine):
    setup_app(engine)
    put(engine, ORDERS, b"o1")
    put(engine, EVENTS, b"e1")
    put(engine, 0, b"d1")  # the last item of the snapshot is hidden from the filter below
    p = connection(engine)
    assert isinstance(ask(p, {"collections": ["8"]}), Started)
    assert summary(drain(p)) == [("marker", 0, 6), ("event", 2, SystemEventId.BEGIN_COLLECTION, b"orders"),
                                 ("doc", 4, ORDERS, b"o1"), ("adv", 6)]
    engine.vbucket(VB).checkpoint_manager.create_checkpoint()
    put(engine, EVENTS, b"e2")  # a snapshot with nothing for the stream: its marker and SEQNO_ADVANCED
    written(p, VB)
    assert summary(drain(p)) == [("marker", 7, 7), ("adv", 7)]
    put(engine, ORDERS, b"o2")
    written(p, VB)
    assert summary(drain(p))[-1] == ("doc", 8, ORDERS, b"o2")


def test_a_scope_filter_follows_the_scope_and_ends_filter_empty(engine):
    setup_app(engine)
    put(engine, 0, b"d")
    p = connection(engine)
    assert isinstance(ask(p, {"scope": "8"}), Started)
    got = drain(p)
    # the stream is served after each change, as a server serves it while the manifest changes
    got += served(p, lambda: put(engine, EVENTS, b"e"))
    got += served(p, lambda: engine.change_manifest(lambda m: m.add_collection("app", "late")))
    got += served(p, lambda: put(engine, 10, b"l"))  # the new collection (id 10) joined the filtered scope
    got += served(p, lambda: engine.change_manifest(lambda m: m.drop_scope("app")))
    assert no_markers(summary(got)) == [
        ("event", 1, SystemEventId.CREATE_SCOPE, b"app"), ("event", 2, SystemEventId.BEGIN_COLLECTION, b"orders"),
        ("event", 3, SystemEventId.BEGIN_COLLECTION, b"events"), ("adv", 4), ("doc", 5, EVENTS, b"e"),
        ("event", 6, SystemEventId.BEGIN_COLLECTION, b"late"), ("doc", 7, 10, b"l"),
        ("event", 8, SystemEventId.END_COLLECTION, b""), ("event", 9, SystemEventId.END_COLLECTION, b""),
        ("event", 10, SystemEventId.END_COLLECTION, b""), ("event", 11, SystemEventId.DROP_SCOPE, b""),
        ("end", StreamEndReason.FILTER_EMPTY)]


def test_a_collections_filter_ends_filter_empty_when_its_last_collection_goes(engine):
    setup_app(engine)
    p = connection(engine)
    assert isinstance(ask(p, {"collections": ["8", "9"]}), Started)
    got = drain(p)
    got += served(p, lambda: engine.change_manifest(lambda m: m.drop_collection("app", "orders")))
    got += served(p, lambda: put(engine, EVENTS, b"still"))
    got += served(p, lambda: engine.change_manifest(lambda m: m.drop_collection("app", "events")))
    assert no_markers(summary(got))[-4:] == [
        ("event", 4, SystemEventId.END_COLLECTION, b""), ("doc", 5, EVENTS, b"still"),
        ("event", 6, SystemEventId.END_COLLECTION, b""), ("end", StreamEndReason.FILTER_EMPTY)]


def test_unknown_collections_scopes_and_a_manifest_uid_ahead_are_refused(engine):
    setup_app(engine)
    for value, status in (({"collections": ["77"]}, Status.UNKNOWN_COLLECTION), ({"scope": "77"}, Status.UNKNOWN_SCOPE),
                          ({"uid": "4"}, COLLECTIONS_MANIFEST_IS_AHEAD),
                          ({"collections": ["8"], "scope": "8"}, Status.EINVAL),
                          ({"collections": ["zz"]}, Status.EINVAL), ({"uid": 3}, Status.EINVAL)):
        try:
            got = ask(connection(engine), value).status
        except ProtocolError as e:  # refused by the frame's own checks
            got = e.status
        assert got == status, value


def test_resuming_with_a_manifest_uid_skips_the_events_the_client_saw(engine):
    setup_app(engine)  # events stamped 1, 2, 3
    put(engine, ORDERS, b"o")
    engine.change_manifest(lambda m: m.add_collection("app", "more"))  # stamped 4
    p = connection(engine)
    assert isinstance(ask(p, {"uid": "2"}), Started)  # behind: it saw the scope and orders
    assert no_markers(summary(drain(p))) == [("event", 3, SystemEventId.BEGIN_COLLECTION, b"events"),
                                             ("doc", 4, ORDERS, b"o"),
                                             ("event", 5, SystemEventId.BEGIN_COLLECTION, b"more")]
    same = connection(engine, name="same")
    assert isinstance(ask(same, {"uid": "4"}, end=5), Started)
    assert no_markers(summary(drain(same))) == [("doc", 4, ORDERS, b"o"), ("adv", 5), ("end", StreamEndReason.OK)]


def test_stream_ids_give_one_vbucket_several_filtered_streams(engine):
    setup_app(engine)
    put(engine, ORDERS, b"o")
    put(engine, EVENTS, b"e")
    put(engine, 0, b"d")
    p = connection(engine, enable_stream_id="true")
    for sid, value in ((1, {"collections": ["8"]}), (2, {"collections": ["9", "0"]}), (3, {})):
        assert isinstance(ask(p, {**value, "sid": sid}, end=6), Started)
    by_sid: dict = {}
    for m in drain(p):
        by_sid.setdefault(m.stream_id, []).append(m)
    docs = {sid: [r for r in summary(ms) if r[0] == "doc"] for sid, ms in by_sid.items()}
    assert docs == {1: [("doc", 4, ORDERS, b"o")], 2: [("doc", 5, EVENTS, b"e"), ("doc", 6, 0, b"d")],
                    3: [("doc", 4, ORDERS, b"o"), ("doc", 5, EVENTS, b"e"), ("doc", 6, 0, b"d")]}
    assert all(summary(ms)[-1] == ("end", StreamEndReason.OK) for ms in by_sid.values())
    assert ("adv", 6) in summary(by_sid[1])  # its snapshot ended on what its filter hid
    assert isinstance(ask(p, {"collections": ["8"], "sid": 4}), Started)
    assert ask(p, {"sid": 4}).status == Status.KEY_EEXISTS  # a live one has sid 4


def test_flatbuffers_system_events_and_the_modify_event(engine):
    setup_app(engine)
    engine.change_manifest(lambda m: m.update_collection("app", "orders", max_ttl=7, history=True))
    fb = connection(engine, flatbuffers_system_events="true")
    assert isinstance(ask(fb, end=4), Started)
    got = [m for m in drain(fb) if isinstance(m, dcp.DcpSystemEvent)]
    assert [(m.by_seqno, m.version) for m in got] == [(1, 2), (2, 2), (3, 2), (4, 2)]
    assert got[3].event == SystemEventId.MODIFY_COLLECTION and got[3].key == b"orders"
    assert got[3].decode_value() == {"manifest_uid": 4, "scope_id": APP, "collection_id": ORDERS, "ttl_valid": True,
                                     "max_ttl": 7, "name": "orders", "history": True}
    assert got[0].decode_value() == {"manifest_uid": 1, "scope_id": APP, "name": "app"}
    legacy = connection(engine, name="legacy")  # without FlatBuffers the modify event is not sent
    assert isinstance(ask(legacy, end=4), Started)
    rows = no_markers(summary(drain(legacy)))
    assert [r[1] for r in rows if r[0] == "event"] == [1, 2, 3] and ("adv", 4) in rows


def check_backfill_after_the_drop(got: list, high: int) -> None:
    """What an unfiltered backfill of the vbucket of the test below sends (summary rows)."""
    assert got[0] == ("marker", 0, high)
    assert [r for r in got if r[0] == "doc"] == [("doc", 5, EVENTS, b"e0"), ("doc", 7, EVENTS, b"e1"),
                                                 ("doc", 9, EVENTS, b"e2"), ("doc", 10, 0, b"d")]
    # the drop event replaced the create on disk (both are keyed by the collection)
    assert [r[1:3] for r in got if r[0] == "event"] == [(1, SystemEventId.CREATE_SCOPE),
                                                         (3, SystemEventId.BEGIN_COLLECTION),
                                                         (11, SystemEventId.END_COLLECTION)]


def test_a_backfill_skips_dropped_collections_and_sends_their_drop(engine):
    setup_app(engine)
    for i in range(3):
        put(engine, ORDERS, b"o%d" % i)
        put(engine, EVENTS, b"e%d" % i)
    put(engine, 0, b"d")
    engine.change_manifest(lambda m: m.drop_collection("app", "orders"))
    to_disk_only(engine, VB)
    high = engine.vbucket(VB).high_seqno
    p = connection(engine)
    assert isinstance(ask(p, end=high), Started)
    got = summary(drain(p))
    check_backfill_after_the_drop(got, high)
    only = connection(engine, name="only")  # a filtered backfill: rows, filtered
    assert isinstance(ask(only, {"collections": ["9"]}, end=high), Started)
    got = summary(drain(only))
    assert [r[1] for r in got if r[0] == "doc"] == [5, 7, 9]
    assert got[-2:] == [("adv", high), ("end", StreamEndReason.OK)]
    legacy = connection(engine, collections=False, name="legacy")
    assert isinstance(ask(legacy, collections=False, end=high), Started)
    assert [(m.by_seqno, m.key) for m in drain(legacy) if isinstance(m, dcp.DcpMutation)] == \
        [(10, b"d")]  # (no prefix: a connection without collections)


def test_to_latest_of_a_filtered_stream_ends_at_its_collections_high_seqno(engine):
    setup_app(engine)
    put(engine, ORDERS, b"o")
    put(engine, 0, b"d")
    p = connection(engine)
    assert isinstance(ask(p, {"collections": ["8"]}, flags=StreamFlag.TO_LATEST), Started)
    assert no_markers(summary(drain(p))) == [("event", 2, SystemEventId.BEGIN_COLLECTION, b"orders"),
                                             ("doc", 4, ORDERS, b"o"), ("end", StreamEndReason.OK)]
