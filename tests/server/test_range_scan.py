"""KV range scans against a real server: through the project's codec (create/continue/cancel,
limits, snapshot requirements and their errors, a scan checked against a model of the bucket
while another connection writes) and the official SDK's collection.scan (range, prefix and
sampling scans return exactly the live keys)."""

import json
import struct

import pytest
from couchbase.kv_range_scan import PrefixScan, RangeScan, SamplingScan, ScanTerm
from couchbase.options import ScanOptions

from dcpflow.protocol import range_scan as rs
from dcpflow.protocol.frame import Frame
from dcpflow.protocol.hello import Feature
from dcpflow.protocol.status import Status

from .client import RawClient
from .conftest import keys_in

VB = 9
S = Status


def login(server) -> RawClient:
    c = server.client()
    return c.login(features=(Feature.XERROR, Feature.JSON, Feature.MUTATION_SEQNO, Feature.XATTR))


def create(c, config: rs.ScanConfig, vb: int = VB) -> Frame:
    c.send(rs.RangeScanCreate(vb, config, c.next_opaque()).encode())
    return c.recv()


def continue_all(c, scan_id: bytes, vb: int = VB, **limits) -> tuple[list, list[Frame]]:
    """One continue: every frame until the one with MORE / COMPLETE (or an error)."""
    opaque = c.next_opaque()
    c.send(rs.RangeScanContinue(vb, scan_id, opaque=opaque, **limits).encode())
    frames, got = [], []
    while True:
        frame = c.recv()
        assert frame.opaque == opaque
        frames.append(frame)
        if frame.status not in rs.CONTINUE_DATA_STATUSES:
            return got, frames
        reply = rs.RangeScanContinueResponse.from_frame(frame)
        got.extend(reply.keys if reply.keys_only else reply.documents)
        if frame.status != S.SUCCESS:
            return got, frames


def scan_all(c, config, vb=VB, empty_ok=False, **limits) -> list:
    """Every entry of a scan of `vb`, continued to the end; `empty_ok`: [] for a vbucket whose range
    holds no document (the create's KEY_ENOENT)."""
    reply = create(c, config, vb)
    if empty_ok and reply.status == S.KEY_ENOENT:
        return []
    assert reply.status == S.SUCCESS, reply
    return continue_to_end(c, rs.RangeScanCreateResponse.from_frame(reply).scan_id, vb, **limits)


def continue_to_end(c, scan_id: bytes, vb=VB, **limits) -> list:
    """Every entry of an open scan from where it stands: continues until RANGE_SCAN_COMPLETE, each
    answer before it RANGE_SCAN_MORE."""
    out = []
    while True:
        got, frames = continue_all(c, scan_id, vb, **limits)
        out.extend(got)
        if frames[-1].status == S.RANGE_SCAN_COMPLETE:
            return out
        assert frames[-1].status == S.RANGE_SCAN_MORE, frames[-1]


ALL = rs.ScanConfig(start=b"", end=b"\xff")


def test_create_continue_cancel(server):
    keys = keys_in(VB, 30, prefix="rs")
    with login(server) as c:
        for k in keys:
            c.set(k, json.dumps({"k": k.decode()}).encode(), vbucket=VB, datatype=1, flags=5)
        assert scan_all(c, ALL._replace(key_only=True)) == sorted(keys)
        docs = scan_all(c, ALL, item_limit=7)
        assert [d.key for d in docs] == sorted(keys)
        assert all(json.loads(d.value) == {"k": d.key.decode()} and d.flags == 5 and d.datatype == 1 and d.cas
                   for d in docs)
        sub = sorted(keys)[5:12]
        assert scan_all(c, rs.ScanConfig(key_only=True, start=sub[0], end=sub[-1])) == sub
        assert scan_all(c, rs.ScanConfig(key_only=True, start=sub[0], end=sub[-1], excl_start=True,
                                         excl_end=True)) == sub[1:-1]
        reply = create(c, ALL._replace(key_only=True))
        scan_id = rs.RangeScanCreateResponse.from_frame(reply).scan_id
        got, frames = continue_all(c, scan_id, item_limit=4)
        assert len(got) == 4 and frames[-1].status == S.RANGE_SCAN_MORE
        c.send(rs.RangeScanCancel(VB, scan_id, c.next_opaque()).encode())
        assert c.recv().status == S.SUCCESS
        assert continue_all(c, scan_id)[1][-1].status == S.KEY_ENOENT  # cancelled
        c.send(rs.RangeScanCancel(VB, scan_id, c.next_opaque()).encode())
        assert c.recv().status == S.KEY_ENOENT
        assert create(c, rs.ScanConfig(start=b"zz", end=b"zzz")).status == S.KEY_ENOENT  # empty range
        assert create(c, ALL._replace(collection_id=8)).status == S.UNKNOWN_COLLECTION


def test_snapshot_requirements(server):
    with login(server) as c:
        key = keys_in(VB, 1, prefix="snap")[0]
        written = c.set(key, b"1", vbucket=VB)
        uuid, seqno = struct_token(written)
        ok = rs.SnapshotRequirements(uuid, seqno, timeout_ms=5000)
        assert scan_all(c, ALL._replace(key_only=True, snapshot=ok)) == [key]  # waits for persistence
        assert create(c, ALL._replace(snapshot=ok._replace(vbucket_uuid=uuid + 1))).status == S.VB_UUID_NOT_EQUAL
        future = ok._replace(seqno=seqno + 100)
        assert create(c, ALL._replace(snapshot=future._replace(timeout_ms=None))).status == S.ETMPFAIL
        assert create(c, ALL._replace(snapshot=future._replace(timeout_ms=50))).status == S.ETMPFAIL
        assert create(c, ALL._replace(snapshot=ok._replace(seqno_exists=True))).status == S.SUCCESS
        c.set(key, b"2", vbucket=VB)  # the version with `seqno` is gone
        assert create(c, ALL._replace(snapshot=ok._replace(seqno_exists=True))).status == S.NOT_STORED


def struct_token(frame: Frame) -> tuple[int, int]:
    return struct.unpack(">QQ", frame.extras)


def test_not_my_vbucket_and_state_changes(server):
    with login(server) as c:
        key = keys_in(VB, 1, prefix="nm")[0]
        c.set(key, b"1", vbucket=VB)
        reply = create(c, ALL)
        scan_id = rs.RangeScanCreateResponse.from_frame(reply).scan_id
        assert c.call(0x3D, extras=b"\x02", vbucket=VB).status == S.SUCCESS  # SET_VBUCKET replica
        assert continue_all(c, scan_id)[1][-1].status == S.NOT_MY_VBUCKET
        assert create(c, ALL).status == S.NOT_MY_VBUCKET


def test_a_scan_sees_the_bucket_as_it_was_at_create_while_another_connection_writes(server):
    """The model: the vbucket's live documents when the scan was created. Writes that a second
    connection makes between continues (updates, deletes, new keys in the range) are not seen;
    a scan created afterwards sees them all."""
    keys = keys_in(VB, 60, prefix="cw")
    with login(server) as c, login(server) as writer:
        model = {}
        for i, k in enumerate(keys[:40]):
            c.set(k, str(i).encode(), vbucket=VB)
            model[k] = str(i).encode()
        for k in keys[:5]:
            c.delete(k, vbucket=VB)
            del model[k]
        at_create = dict(model)
        reply = create(c, ALL)
        scan_id = rs.RangeScanCreateResponse.from_frame(reply).scan_id
        seen, step = {}, 0
        while True:
            got, frames = continue_all(c, scan_id, item_limit=3)
            seen.update((d.key, d.value) for d in got)
            k = keys[(step * 7) % len(keys)]
            if step % 3 == 0 and k in model:
                writer.delete(k, vbucket=VB)
                del model[k]
            else:
                writer.set(k, b"w%d" % step, vbucket=VB)
                model[k] = b"w%d" % step
            step += 1
            if frames[-1].status == S.RANGE_SCAN_COMPLETE:
                break
        assert seen == at_create
        after = {d.key: d.value for d in scan_all(c, ALL)}
        assert after == model


def test_sampling(server):
    keys = keys_in(VB, 200, prefix="sm")
    with login(server) as c:
        for k in keys:
            c.set(k, b"1", vbucket=VB)
        everything = scan_all(c, rs.ScanConfig(key_only=True, samples=500, seed=1))
        assert everything == sorted(keys)
        some = scan_all(c, rs.ScanConfig(key_only=True, samples=20, seed=42))
        assert set(some) <= set(keys) and 5 <= len(some) <= 45
        assert scan_all(c, rs.ScanConfig(key_only=True, samples=20, seed=42)) == some


@pytest.fixture(scope="module")
def sdk_collection(tmp_path_factory):
    from .conftest import ServerProcess
    from .test_sdk import connect
    proc = ServerProcess(["--data-dir", str(tmp_path_factory.mktemp("scan")), "--vbuckets", "64"])
    cluster = connect(proc.port)
    try:
        yield cluster.bucket("default").default_collection()
    finally:
        cluster.close()
        proc.cleanup()


def test_sdk_collection_scan(sdk_collection):
    col = sdk_collection
    live = {f"user::{i:03}" for i in range(50)} | {f"item::{i:02}" for i in range(20)}
    for key in sorted(live):
        col.upsert(key, {"id": key})
    for i in range(0, 20, 4):
        col.remove(f"item::{i:02}")
        live.discard(f"item::{i:02}")
    ids = {r.id for r in col.scan(RangeScan(ScanTerm("user::"), ScanTerm("user::\xff")), ScanOptions(ids_only=True))}
    assert ids == {k for k in live if k.startswith("user::")}
    rows = list(col.scan(PrefixScan("item::")))
    assert {r.id for r in rows} == {k for k in live if k.startswith("item::")}
    assert all(r.content_as[dict] == {"id": r.id} for r in rows)
    assert {r.id for r in col.scan(RangeScan())} == live
    sample = [r.id for r in col.scan(SamplingScan(10, seed=3), ScanOptions(ids_only=True))]
    assert 0 < len(sample) <= 10 and set(sample) <= live
    excl = {r.id for r in col.scan(RangeScan(ScanTerm("user::000", exclusive=True), ScanTerm("user::010")),
                                   ScanOptions(ids_only=True))}
    assert excl == {f"user::{i:03}" for i in range(1, 11)}


def test_sdk_scan_of_a_named_collection(spawn_server, tmp_path):
    """scope("s").collection("c").scan(...) returns exactly that collection's live keys; the default
    collection's scan, with keys under the same prefix beside them, returns only its own."""
    from .sdk import connect
    proc = spawn_server("--data-dir", str(tmp_path), "--vbuckets", "64")
    cluster = connect(proc.port)
    try:
        bucket = cluster.bucket("default")
        bucket.collections().create_scope("s")
        bucket.collections().create_collection("s", "c")
        named, default = bucket.scope("s").collection("c"), bucket.default_collection()
        for i in range(30):
            named.upsert(f"n::{i:02}", {"i": i})
        for i in range(8):
            default.upsert(f"n::d{i}", {"d": i})
        named.remove("n::05")
        live = {f"n::{i:02}" for i in range(30)} - {"n::05"}
        assert {r.id for r in named.scan(PrefixScan("n::"), ScanOptions(ids_only=True))} == live
        assert {r.id for r in named.scan(RangeScan())} == live
        rows = list(named.scan(RangeScan(ScanTerm("n::10"), ScanTerm("n::19"))))
        assert {r.id: r.content_as[dict] for r in rows} == {f"n::{i}": {"i": i} for i in range(10, 20)}
        assert {r.id for r in named.scan(SamplingScan(100, seed=1), ScanOptions(ids_only=True))} == live
        assert {r.id for r in default.scan(PrefixScan("n::"), ScanOptions(ids_only=True))} == \
            {f"n::d{i}" for i in range(8)}
    finally:
        cluster.close()


def test_a_scan_of_an_unknown_collection_is_refused(server):
    with login(server) as c:
        c.set(b"k", b"{}", datatype=1)
        reply = create(c, rs.ScanConfig(collection_id=0x99, key_only=True, start=b"\x00", end=b"\xff"))
        assert reply.status == S.UNKNOWN_COLLECTION


def test_a_scan_covers_its_collection_and_ends_when_it_is_dropped(server):
    """Keys of a named collection are scanned by a CREATE naming it, not by the default
    collection's; once the collection is dropped a continue answers UNKNOWN_COLLECTION and the
    scan is gone."""
    from dcpflow.protocol.keys import encode_leb128
    from dcpflow.protocol.opcodes import Opcode
    engine = server.server.buckets["default"].engine

    def add() -> int:
        engine.change_manifest(lambda m: m.add_scope("rs"))
        m = engine.change_manifest(lambda m: m.add_collection("rs", "c"))
        return next(c.uid for s in m.scopes if s.name == "rs" for c in s.collections if c.name == "c")

    cid = server.call(add)
    named, default = keys_in(VB, 6, prefix="nc"), keys_in(VB, 3, prefix="nd")
    with server.client() as c:
        c.login(features=(Feature.XERROR, Feature.JSON, Feature.COLLECTIONS))
        for k in named:
            assert c.call(Opcode.SET, key=encode_leb128(cid) + k, extras=bytes(8), value=b"{}", vbucket=VB,
                          datatype=1).status == S.SUCCESS
        for k in default:
            assert c.set(k, b"{}", vbucket=VB, datatype=1).status == S.SUCCESS
        assert scan_all(c, ALL._replace(key_only=True, collection_id=cid)) == sorted(named)
        assert set(scan_all(c, ALL._replace(key_only=True))) >= set(default)
        assert not set(scan_all(c, ALL._replace(key_only=True))) & set(named)
        reply = create(c, ALL._replace(key_only=True, collection_id=cid))
        scan_id = rs.RangeScanCreateResponse.from_frame(reply).scan_id
        got, frames = continue_all(c, scan_id, item_limit=2)
        assert got == sorted(named)[:2] and frames[-1].status == S.RANGE_SCAN_MORE
        server.call(lambda: engine.change_manifest(lambda m: m.drop_collection("rs", "c")))
        assert continue_all(c, scan_id)[1][-1].status == S.UNKNOWN_COLLECTION
        assert continue_all(c, scan_id)[1][-1].status == S.KEY_ENOENT  # the scan was cancelled
        assert create(c, ALL._replace(key_only=True, collection_id=cid)).status == S.UNKNOWN_COLLECTION
