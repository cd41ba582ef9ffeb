"""DCP change streams over real sockets (`change_streams`; snapshot-marker.md flags History and May
Duplicate Keys): history on and off in one bucket - the collection with history shows every
version, the other de-duplicates - from memory and from disk, across a restart, and history older
than the bucket's retention is purged."""

# ruff: noqa: F811  (pytest fixtures re-used by name as parameters)

import json

import pytest

from dcpflow.protocol import dcp
from dcpflow.protocol.dcp import SnapshotFlag
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.keys import encode_leb128, split_key
from dcpflow.protocol.opcodes import Opcode
from dcpflow.protocol.status import Status

from .client import DcpClient
from .conftest import engine_of, make_server, server, to_disk_only  # noqa: F401

VB = 5
EVENTS, ORDERS = 8, 9  # scope app: events keeps history, orders does not
HISTORY_FLAGS = int(SnapshotFlag.HISTORY | SnapshotFlag.MAY_CONTAIN_DUPLICATES)


def setup(srv) -> None:
    engine = engine_of(srv)
    srv.call(lambda: engine.change_manifest(lambda m: m.add_scope("app")))
    srv.call(lambda: engine.change_manifest(lambda m: m.add_collection("app", "events", history=True)))
    srv.call(lambda: engine.change_manifest(lambda m: m.add_collection("app", "orders")))


def write_versions(srv) -> int:
    """Three versions of events:e and of orders:o, interleaved (seqnos 4-9); the high seqno."""
    with srv.login(features=(Feature.XERROR, Feature.COLLECTIONS)) as c:
        for i in range(3):
            for cid, key in ((EVENTS, b"e"), (ORDERS, b"o")):
                r = c.call(Opcode.SET, key=encode_leb128(cid) + key, value=b"v%d" % i, extras=b"\0" * 8, vbucket=VB)
                assert r.status == Status.SUCCESS
    return srv.call(lambda: engine_of(srv).vbucket(VB).high_seqno)


def client_of(srv):
    """clients(**kw) for a server of make_server (the `clients` fixture would start `server` too)."""
    made = []

    def make(**kw):
        c = DcpClient(srv.port)
        c.num_vbuckets = srv.config.num_vbuckets
        made.append(c)
        return c.connect(**kw)
    make.made = made
    return make


def stream(clients, *, change_streams: bool, end: int):
    c = clients(features=(Feature.XERROR, Feature.COLLECTIONS))
    c.controls(enable_noop="true")
    if change_streams:
        c.controls(change_streams="true")
    r = c.stream_request(VB, end=end, value=json.dumps({"collections": [format(EVENTS, "x"),
                                                                        format(ORDERS, "x")]}).encode())
    assert r.status == Status.SUCCESS
    got = c.until_stream_end(VB)
    docs = [(split_key(m.key)[0], m.value, m.by_seqno) for m in got if isinstance(m, dcp.DcpMutation)]
    flags = [m.flags for m in got if isinstance(m, dcp.DcpSnapshotMarker)]
    return docs, flags


def test_from_memory_the_history_collection_shows_every_version(server, clients):
    setup(server)
    high = write_versions(server)
    docs, flags = stream(clients, change_streams=True, end=high)
    assert docs == [(EVENTS, b"v0", 4), (EVENTS, b"v1", 6), (EVENTS, b"v2", 8), (ORDERS, b"v2", 9)]
    assert flags and all(f & HISTORY_FLAGS == HISTORY_FLAGS and f & SnapshotFlag.MEMORY for f in flags)
    # without change_streams: one version per key (the snapshot keeps its unique keys), no History flag
    docs, flags = stream(clients, change_streams=False, end=high)
    assert docs == [(EVENTS, b"v2", 8), (ORDERS, b"v2", 9)]
    assert not any(f & HISTORY_FLAGS for f in flags)


def test_a_backfill_in_the_retained_window_sends_every_version_and_survives_restart(make_server):
    srv = make_server()
    clients = client_of(srv)
    setup(srv)
    high = write_versions(srv)
    to_disk_only(srv, VB)
    docs, flags = stream(clients, change_streams=True, end=high)
    assert docs == [(EVENTS, b"v0", 4), (EVENTS, b"v1", 6), (EVENTS, b"v2", 8), (ORDERS, b"v2", 9)]
    assert flags == [int(SnapshotFlag.DISK | SnapshotFlag.CHECKPOINT) | HISTORY_FLAGS]
    assert stream(clients, change_streams=False, end=high) == (
        [(EVENTS, b"v2", 8), (ORDERS, b"v2", 9)], [int(SnapshotFlag.DISK | SnapshotFlag.CHECKPOINT)])
    for c in clients.made:
        c.close()
    srv.stop()
    again = make_server()
    assert again.call(lambda: engine_of(again).manifest.collection("app", "events").history)
    clients = client_of(again)
    docs, flags = stream(clients, change_streams=True, end=high)
    assert docs == [(EVENTS, b"v0", 4), (EVENTS, b"v1", 6), (EVENTS, b"v2", 8), (ORDERS, b"v2", 9)]
    for c in clients.made:
        c.close()


def test_history_beyond_retention_is_purged_and_a_backfill_before_it_is_deduplicated(server, clients):
    setup(server)
    high = write_versions(server)
    to_disk_only(server, VB)
    engine = engine_of(server)

    def compact_keeping(nbytes: int) -> int:
        def run():
            engine.history_retention_bytes = nbytes
            engine.compact(VB)
            return engine.vbucket(VB).history_start
        return server.call(run)

    assert compact_keeping(1 << 30) == 0  # everything fits
    assert stream(clients, change_streams=True, end=high)[0][:3] == [(EVENTS, b"v0", 4), (EVENTS, b"v1", 6),
                                                                     (EVENTS, b"v2", 8)]
    start = compact_keeping(3)  # one older version of events:e ("e" + "v1") fits, v0 goes
    assert start == 5 and server.call(lambda: engine.store.history_count(VB)) >= 1
    # a stream from 0 starts before the history kept: an ordinary, de-duplicated disk snapshot
    assert stream(clients, change_streams=True, end=high) == (
        [(EVENTS, b"v2", 8), (ORDERS, b"v2", 9)], [int(SnapshotFlag.DISK | SnapshotFlag.CHECKPOINT)])


@pytest.mark.parametrize("features, status", [((Feature.XERROR,), Status.NOT_SUPPORTED),
                                              ((Feature.XERROR, Feature.COLLECTIONS), Status.SUCCESS)])
def test_the_control_needs_collections(server, clients, features, status):
    assert clients(features=features).control("change_streams", "true") == status
