"""A read filtered by collection names follows a collection dropped and made again under a
filtered name while it runs (client/follow.py), over real sockets with dcpflow's server: the new
collection's create event and documents arrive, the other collections' do not, nothing of the
other filtered collections is lost or repeated, offsets resume, for events and batches, with the
names in one scope (the widened streams filter on it) or in several (unfiltered), and through a
scope dropped and made again."""

import asyncio

import pytest

from dcpflow.client import DcpClient, MemoryStore, Offset, StreamEnd, SystemEvent, follow
from dcpflow.client.connection import Segment
from dcpflow.client.follow import NameFollower
from dcpflow.client.manifest import Names
from dcpflow.protocol.dcp import DcpMutation, DcpSeqnoAdvanced, DcpStreamEnd, DcpSystemEvent, StreamEndReason
from dcpflow.protocol.keys import encode_leb128
from dcpflow.protocol.system_events import SystemEventId, event_body

from .conftest import NUM_VBUCKETS, PASSWORD, USER, run, url
from .test_collections import FEATURES, change, cid_of, engine, put, shop


def write(st, cid: int, prefix: str, n: int) -> set:
    keys = set()
    with st.login(features=FEATURES) as w:
        for i in range(n):
            key = f"{prefix}-{i}".encode()
            put(w, cid, key)
            keys.add(key)
    return keys


def remake(st, scope: str, name: str) -> int:
    change(st, lambda m: m.drop_collection(scope, name))
    change(st, lambda m: m.add_collection(scope, name))
    return cid_of(st, scope, name)


def docs(events) -> list:
    return [(e.collection_id, e.key, e.seqno) for e in events if e.event == "mutation"]


def test_events_by_name_follow_a_collection_made_again(server):
    ids = shop(server)
    before = write(server, ids["shop.users"], "u", 6)
    orders = write(server, ids["shop.orders"], "o", 6)
    state: dict = {}

    async def go():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
            got = []
            reader = c.events(collections=["shop.users", "shop.orders"])
            async for e in reader:
                got.append(e)
                if "new" not in state and {k for _, k, _ in docs(got)} == before | orders:
                    state["new"] = await asyncio.to_thread(remake, server, "shop", "users")
                    state["after"] = await asyncio.to_thread(write, server, state["new"], "n", 8)
                    state["more"] = await asyncio.to_thread(write, server, ids["shop.orders"], "p", 4)
                    state["logs"] = await asyncio.to_thread(write, server, ids["other.logs"], "l", 4)
                if "new" in state:
                    created = [x for x in got if isinstance(x, SystemEvent) and x.kind == "collection_created"
                               and x.collection_id == state["new"]]
                    keys = {k for _, k, _ in docs(got)}
                    if len(created) == NUM_VBUCKETS and state["after"] | state["more"] <= keys:
                        break
            offsets = reader.offsets
            return got, offsets

    got, offsets = run(go())
    new = state["new"]
    by_id: dict = {}
    for cid, key, _ in docs(got):
        by_id.setdefault(cid, set()).add(key)
    assert by_id == {ids["shop.users"]: before, new: state["after"], ids["shop.orders"]: orders | state["more"]}
    assert len(docs(got)) == len(set(docs(got))) == len(before) + len(orders) + 8 + 4  # nothing twice
    drops = [e for e in got if isinstance(e, SystemEvent) and e.kind == "collection_dropped"]
    assert len(drops) == NUM_VBUCKETS and {e.collection_id for e in drops} == {ids["shop.users"]}
    assert {(e.scope, e.collection) for e in got if isinstance(e, SystemEvent)} == {
        ("shop", "users"), ("shop", "orders")}
    assert not [e for e in got if isinstance(e, StreamEnd)]
    # seqnos in order per vbucket: the widened stream took over exactly where the old one was left
    last: dict = {}
    for e in got:
        if e.event in ("mutation", "system"):
            assert e.seqno > last.get(e.vbucket, 0), e
            last[e.vbucket] = e.seqno
    # the offsets resume: a new read (resolving the names to the new id) has nothing more of them
    high = server.call(lambda: {vb: engine(server).vbucket(vb).high_seqno for vb in range(NUM_VBUCKETS)})
    assert all(offsets[vb].seqno <= high[vb] for vb in offsets)

    async def resume():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
            return [e async for e in c.events(collections=["shop.users", "shop.orders"], start=offsets,
                                              end="now")]
    assert docs(run(resume())) == []


def test_batches_by_names_in_two_scopes_follow_through_an_unfiltered_stream(server):
    """Names in two scopes: the widened streams are unfiltered and the client picks the names'
    collections out of them (a collection of another name in the same scope is left out)."""
    ids = shop(server)
    before = write(server, ids["shop.users"], "u", 5)
    logs = write(server, ids["other.logs"], "l", 5)
    state: dict = {}

    async def go():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
            starts = {vb: Offset() for vb in range(NUM_VBUCKETS)}
            reader = c.batches(starts, collections=["shop.users", "other.logs"], flush_interval=0.05)
            rows = []
            async for batch in reader:
                rows += batch.to_pylist()
                keys = {r["key"] for r in rows}
                if "new" not in state and keys == before | logs:
                    state["new"] = await asyncio.to_thread(remake, server, "shop", "users")
                    state["orders"] = await asyncio.to_thread(write, server, ids["shop.orders"], "o", 5)
                    state["after"] = await asyncio.to_thread(write, server, state["new"], "n", 7)
                    state["logs"] = await asyncio.to_thread(write, server, ids["other.logs"], "m", 3)
                if "new" in state and state["after"] | state["logs"] <= keys:
                    break
            return rows, reader.system_events

    rows, events = run(go())
    got = sorted((r["collection_id"], r["key"]) for r in rows)
    want = sorted([(ids["shop.users"], k) for k in before] + [(ids["other.logs"], k) for k in logs | state["logs"]]
                  + [(state["new"], k) for k in state["after"]])
    assert got == want
    assert ("collection_created", state["new"]) in {(e.kind, e.collection_id) for e in events}


def test_a_scope_dropped_and_made_again_is_followed_by_name(server):
    ids = shop(server)
    before = write(server, ids["shop.users"], "u", 4)
    state: dict = {}

    def remake_scope():
        change(server, lambda m: m.drop_scope("shop"))
        change(server, lambda m: m.add_scope("shop"))
        change(server, lambda m: m.add_collection("shop", "orders"))
        change(server, lambda m: m.add_collection("shop", "users"))
        return cid_of(server, "shop", "users")

    async def go():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
            got = []
            async for e in c.events(collections=["shop.users"]):
                got.append(e)
                keys = {k for _, k, _ in docs(got)}
                if "new" not in state and keys == before:
                    state["new"] = await asyncio.to_thread(remake_scope)
                    state["orders"] = await asyncio.to_thread(write, server, cid_of(server, "shop", "orders"), "o", 3)
                    state["after"] = await asyncio.to_thread(write, server, state["new"], "n", 6)
                if "new" in state and state["after"] <= keys:
                    break
            return got

    got = run(go())
    assert sorted((cid, k) for cid, k, _ in docs(got)) == sorted(
        [(ids["shop.users"], k) for k in before] + [(state["new"], k) for k in state["after"]])


def test_offsets_saved_after_following_resume_on_the_new_collection(server):
    ids = shop(server)
    before = write(server, ids["shop.users"], "u", 3)
    store = MemoryStore()
    state: dict = {}

    async def go():
        async with await DcpClient.connect(url(server.port), USER, PASSWORD) as c:
            reader = c.events(collections=["shop.users"], state=store)
            got = []
            async for e in reader:
                got.append(e)
                keys = {k for _, k, _ in docs(got)}
                if "new" not in state and keys == before:
                    state["new"] = await asyncio.to_thread(remake, server, "shop", "users")
                    state["after"] = await asyncio.to_thread(write, server, state["new"], "n", 5)
                if "new" in state and state["after"] <= keys:
                    break
            await reader.save()
            await reader.aclose()
            more = await asyncio.to_thread(write, server, state["new"], "m", 4)
            second = [e async for e in c.events(collections=["shop.users"], start="saved", end="now", state=store)]
            return more, second, docs(got)[-1]

    more, second, last = run(go())
    # the event the loop broke out after is not consumed yet (an iterator commits on the next
    # step), so it may come again; everything else resumes exactly
    got = {(cid, k) for cid, k, _ in docs(second)} - {last[:2]}
    assert got == {(state["new"], k) for k in more} and len(docs(second)) - len(more) in (0, 1)


def _seg(frames: list[bytes]) -> Segment:
    import array
    data = bytearray()
    starts = array.array("q")
    for f in frames:
        starts.append(len(data))
        data += f
    return Segment(None, data, starts, len(data), len(data))


def _frames(seg: Segment) -> list[bytes]:
    ends = list(seg.starts[1:]) + [seg.end]
    return [bytes(seg.data[a:b]) for a, b in zip(seg.starts, ends, strict=True)]


@pytest.mark.parametrize("with_numpy", [True, False])
def test_the_follower_cuts_after_a_drop_and_filters_a_widened_vbucket(with_numpy, monkeypatch):
    """Sans-I/O: the drop of a filtered id cuts the vbucket's messages up to its STREAM_END; a
    widened vbucket keeps the names' ids and turns the rest into SEQNO_ADVANCED. The same with
    numpy's look at a segment and without numpy (a plain install: the event API needs no extra)."""
    if not with_numpy:
        monkeypatch.setattr(follow, "_numpy", lambda: None)
    names = Names()
    names.learn_scope(8, "shop")
    f = NameFollower((("shop", "users"),), {9}, names)
    dropped = []
    f.on_drop = dropped.append

    def mut(vb, cid, seqno, key=b"k"):
        return DcpMutation(vb, seqno, 1, 0, 0, 0, encode_leb128(cid) + key, b"{}").encode()

    drop = _drop_event(1, 9, 10)
    seg = _seg([mut(0, 9, 5), drop, mut(1, 9, 11), mut(0, 9, 6), DcpStreamEnd(1, StreamEndReason.CLOSED).encode()])
    out = f.rewrite(seg)
    assert _frames(out) == [mut(0, 9, 5), drop, mut(0, 9, 6), DcpStreamEnd(1, StreamEndReason.CLOSED).encode()]
    assert dropped == [1] and f.widened == {1} and not f.cutting
    seg = _seg([mut(1, 12, 11), _create_event(1, 12, 8, "users", 13), mut(1, 13, 13), mut(0, 9, 7)])
    out = f.rewrite(seg)
    assert _frames(out)[0] == DcpSeqnoAdvanced(1, 11).encode()
    assert _frames(out)[1:] == [_create_event(1, 12, 8, "users", 13), mut(1, 13, 13), mut(0, 9, 7)]
    assert f.accept == {9, 13}
    plain = _seg([mut(0, 9, 8)])
    assert f.rewrite(plain) is plain  # nothing to look at: the segment itself
    assert f.rewrite(_seg([mut(1, 12, 14)])) is not None


def _event(vb: int, seqno: int, event, **fields) -> bytes:
    version, key, value = event_body(event, flatbuffers=True, **fields)
    return DcpSystemEvent(vb, seqno, event, version, key, value).encode()


def _drop_event(vb: int, cid: int, seqno: int) -> bytes:
    return _event(vb, seqno, SystemEventId.END_COLLECTION, manifest_uid=3, scope_id=8, collection_id=cid)


def _create_event(vb: int, seqno: int, scope_id: int, name: str, cid: int) -> bytes:
    return _event(vb, seqno, SystemEventId.BEGIN_COLLECTION, manifest_uid=4, scope_id=scope_id, collection_id=cid,
                  name=name)
