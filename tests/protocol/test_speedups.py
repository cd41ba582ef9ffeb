"""The compiled twins (_speedups.c) against their Python specifications.

split: both paths must give the same frames, the same errors (type, text, fatal or not) and leave
the same bytes buffered, for any bytes fed in any chunks; and the splitter itself must stop before
every frame it leaves to the Python loop. The request loop's `peek`/`consume` reading must decode
as the frames iterator does, with either path.

encode_mutations: the same bytes and the same stop as dcp.encode_mutations_py for any documents;
an item whose fields do not fit stops the run (the Python twin raises there); items whose reads
change the list do not crash it.

stamp_mutations: the same bytes, or the same ValueError, as dcp.stamp_mutations_py for stored
runs and for runs broken in every way it checks (cut, another message, seqnos out of order);
its output is what encode_mutations makes with that opaque and key layout. mutations_upto: the
same head (bytes, count, last seqno), or the same error, as dcp.mutations_upto_py.

walk_stream: the same end and frame offsets as frame.walk_stream_py, stopping at exactly the frames
the client's Python loop must see. (gather and concat, the twins of protocol.columns, are tested in
tests/protocol/test_columns.py.)"""

import os
import struct
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcpflow.engine.item import Item
from dcpflow.protocol import dcp
from dcpflow.protocol import frame as frame_mod
from dcpflow.protocol.document import Document
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import Frame, FrameDecoder, encode_frame, request
from dcpflow.protocol.keys import encode_leb128

from .test_fuzz import near_valid_frames

split = frame_mod._split
needs_split = pytest.mark.skipif(split is None, reason="the compiled splitter is not built")
EQUIV = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_the_compiled_twins_are_built():
    """CI builds them (scripts/setup.sh installs with a compiler): a missing build must not pass
    unnoticed as a slower server. DCPFLOW_PURE_PYTHON=1 turns them off on purpose."""
    if os.environ.get("DCPFLOW_PURE_PYTHON"):
        assert split is None and dcp.encode_mutations is dcp.encode_mutations_py
    else:
        assert split is not None, "dcpflow.protocol._speedups did not build: pip install -e . needs gcc and Python.h"
        assert dcp.encode_mutations is not dcp.encode_mutations_py
        assert dcp.mutations_upto is not dcp.mutations_upto_py


def _decode(data: bytes, chunks: list[int], compiled: bool, max_body: int = 4096, stop_every: int = 0):
    """Everything the decoder does with `data` fed in `chunks` sizes: frames, errors, leftovers.
    `stop_every` > 0 abandons the iteration after that many frames (as a server does when a
    request has to wait) and iterates afresh."""
    saved = frame_mod._split
    frame_mod._split = split if compiled else None
    try:
        dec = FrameDecoder(max_body_len=max_body)
        out: list = []
        pos = 0
        sizes = chunks or [len(data) or 1]
        i = 0
        while pos < len(data):
            n = sizes[i % len(sizes)]
            i += 1
            dec.feed(data[pos:pos + n])
            pos += n
            for _ in range(len(data) + 2):
                try:
                    for taken, f in enumerate(dec.frames(), 1):
                        out.append(("frame", tuple(f), type(f)))
                        if stop_every and taken == stop_every:
                            break
                    else:
                        break
                except ProtocolError as e:
                    out.append(("error", str(e), e.fatal, e.status, e.opcode, e.opaque))
                    if e.fatal:
                        return out, None
        return out, dec.buffered
    finally:
        frame_mod._split = saved


def _decode_peeking(data: bytes, chunks: list[int], compiled: bool, limit: int, runs: list[int]):
    """What `_decode` records, read as the request loop reads: `peek(limit)`, run the first
    `runs[i]` of those frames (at least one), `consume` them; the next chunk is fed between a
    peek and its consume."""
    saved = frame_mod._split
    frame_mod._split = split if compiled else None
    try:
        dec = FrameDecoder(max_body_len=4096)
        out: list = []
        pos = i = r = 0
        sizes = chunks or [len(data) or 1]
        while pos < len(data) or i == 0:
            n = sizes[i % len(sizes)]
            i += 1
            dec.feed(data[pos:pos + n])
            pos += n
            while True:
                try:
                    frames = dec.peek(limit)
                except ProtocolError as e:
                    out.append(("error", str(e), e.fatal, e.status, e.opcode, e.opaque))
                    if e.fatal:
                        return out, None
                    continue
                if not frames:
                    break
                ran = max(1, min(len(frames), runs[r % len(runs)]))
                r += 1
                out.extend(("frame", tuple(f), type(f)) for f in frames[:ran])
                if pos < len(data):
                    dec.feed(data[pos:pos + n])
                    pos += n
                dec.consume(ran)
        return out, dec.buffered
    finally:
        frame_mod._split = saved


@needs_split
@EQUIV
@given(near_valid_frames(), st.lists(st.integers(1, 700), min_size=1, max_size=5), st.integers(0, 3))
def test_same_frames_errors_and_leftovers_as_the_python_loop(data, chunks, stop_every):
    assert _decode(data, chunks, True, stop_every=stop_every) == _decode(data, chunks, False, stop_every=stop_every)


@needs_split
@EQUIV
@given(st.binary(max_size=1500), st.lists(st.integers(1, 300), min_size=1, max_size=4))
def test_same_result_for_arbitrary_bytes(data, chunks):
    assert _decode(data, chunks, True) == _decode(data, chunks, False)


def _well_formed():
    """Frames as clients and servers send them: classic and flexible-framing magics, any sizes."""
    return st.builds(
        lambda alt, op, framing, extras, key, value, vb, opaque, cas, dt: encode_frame(
            (0x08 if alt else 0x80) if op % 2 else (0x18 if alt else 0x81), op, framing=framing if alt else b"",
            extras=extras, key=key, value=value, vbucket_or_status=vb, opaque=opaque, cas=cas, datatype=dt),
        st.booleans(), st.integers(0, 255), st.binary(max_size=20), st.binary(max_size=40), st.binary(max_size=255),
        st.binary(max_size=3000), st.integers(0, 0xFFFF), st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1),
        st.integers(0, 255))


@needs_split
@EQUIV
@given(st.lists(_well_formed(), min_size=1, max_size=8), st.lists(st.integers(1, 5000), min_size=1, max_size=3))
def test_well_formed_streams_decode_alike_and_whole(frames, chunks):
    data = b"".join(frames)
    compiled = _decode(data, chunks, True, max_body=1 << 20)
    assert compiled == _decode(data, chunks, False, max_body=1 << 20)
    assert [f[1] for f in compiled[0]] == [tuple(f) for f in map(_parse_one, frames)]
    assert compiled[1] == 0


@EQUIV
@given(st.one_of(near_valid_frames(), st.lists(_well_formed(), min_size=1, max_size=8).map(b"".join)),
       st.lists(st.integers(1, 700), min_size=1, max_size=5), st.integers(1, 5),
       st.lists(st.integers(0, 6), min_size=1, max_size=4), st.booleans())
def test_peek_and_consume_decode_as_the_frames_iterator_does(data, chunks, limit, runs, compiled):
    """Frames, errors and leftovers, however many of each peek run and whatever is fed meanwhile
    (well-formed runs are what the compiled splitter returns several of at once)."""
    if compiled and split is None:
        compiled = False
    assert _decode_peeking(data, chunks, compiled, limit, runs) == _decode(data, chunks, compiled)


def _parse_one(data: bytes) -> Frame:
    (f,) = list(_feed_all(data))
    return f


def _feed_all(data: bytes):
    saved, frame_mod._split = frame_mod._split, None
    try:
        dec = FrameDecoder(max_body_len=1 << 20)
        dec.feed(data)
        return list(dec.frames())
    finally:
        frame_mod._split = saved


@needs_split
@pytest.mark.parametrize("magic", [0x80, 0x81, 0x08, 0x18, 0x82, 0x83])
def test_every_opcode_and_header_field_alike(magic):
    """Every opcode under every magic, with every header field and body part non-trivial: a
    splitter that mixed up a field for some frames only would differ here."""
    framing = b"\x22\x00\x07" if magic in (0x08, 0x18) else b""
    data = b"".join(encode_frame(magic, op, framing=framing, extras=bytes([op]) * (op % 9), key=b"k%d" % op,
                                 value=b"v" * op, vbucket_or_status=op * 257, opaque=0xFEDCBA98 - op,
                                 cas=(1 << 64) - 1 - op, datatype=op % 8) for op in range(256))
    compiled, python = _decode(data, [997], True, max_body=1 << 20), _decode(data, [997], False, max_body=1 << 20)
    assert compiled == python and len(compiled[0]) == 256


# -- the splitter's own contract ----------------------------------------------------------------

@needs_split
def test_split_returns_frames_and_the_offset_after_each():
    a, b = request(0x00, key=b"k", opaque=7), request(0x01, key=b"key", extras=bytes(8), value=b"v" * 5)
    frames, ends = split(a + b, 0, 4096, Frame, 64)
    assert ends == [len(a), len(a) + len(b)]
    assert all(type(f) is Frame for f in frames)
    assert frames[0] == Frame(0x80, 0x00, 0, 0, 7, 0, b"", b"", b"k", b"")
    assert frames[1].extras == bytes(8) and frames[1].key == b"key" and frames[1].value == b"vvvvv"
    assert split(a + b, len(a), 4096, Frame, 64) == ([frames[1]], [len(a) + len(b)])


@needs_split
def test_split_takes_at_most_limit_frames():
    data = request(0x0A) * 10
    frames, ends = split(data, 0, 4096, Frame, 3)
    assert len(frames) == 3 and ends == [24, 48, 72]


@needs_split
@pytest.mark.parametrize("tail, why", [
    (request(0x00, key=b"abc")[:-1], "incomplete"),
    (b"\x42" + request(0x00)[1:], "unknown magic"),
    (struct.pack(">BBHBBHIIQ", 0x80, 0, 0, 0, 0, 0, 5000, 0, 0) + bytes(5000), "body over the limit"),
    (struct.pack(">BBHBBHIIQ", 0x80, 0, 10, 0, 0, 0, 4, 0, 0) + bytes(4), "key longer than the body"),
    (struct.pack(">BBBBBBHIIQ", 0x08, 0, 3, 1, 1, 0, 0, 4, 0, 0) + bytes(4), "framing+extras+key over body"),
    (request(0x00)[:23], "short header"),
])
def test_split_stops_before_a_frame_it_leaves_to_python(tail, why):
    good = request(0x00, key=b"k")
    frames, ends = split(good + tail, 0, 4096, Frame, 64)
    assert ends == [len(good)], why


@needs_split
def test_split_frames_have_the_flexible_framing_layout():
    framing = bytes([0x22, 0x00, 0x07])  # stream id 7
    data = request(0x57, framing=framing, key=b"k", extras=b"e" * 3, value=b"v")
    ((f,), _) = split(data, 0, 4096, Frame, 64)
    assert (f.magic, f.framing, f.extras, f.key, f.value) == (0x08, framing, b"eee", b"k", b"v")


@needs_split
@pytest.mark.parametrize("args", [
    (bytearray(24), 0, 4096, Frame, 1), (b"", 0, 4096, list, 1), (b"", 1, 4096, Frame, 1),
    (b"", -1, 4096, Frame, 1), (b"", 0, -1, Frame, 1), (b"",), ("x", 0, 1, Frame, 1),
])
def test_split_rejects_bad_arguments(args):
    with pytest.raises((TypeError, ValueError, OverflowError)):
        split(*args)


# -- encode_mutations ------------------------------------------------------------------------------

encode = dcp.encode_mutations
needs_encode = pytest.mark.skipif(encode is dcp.encode_mutations_py, reason="the compiled encoder is not built")
U64, U32 = st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1)


def _items():
    """Documents as the engine has them: mostly plain mutations, some deletions, xattrs and large
    values (what the encoder leaves to the general path)."""
    return st.builds(Item, st.binary(min_size=1, max_size=40), st.binary(max_size=300), U32, U32, U64, U64, U64,
                     st.integers(0, 7), st.sampled_from([False] * 6 + [True]),
                     cid=st.sampled_from([0] * 6 + [1, 5, 8, 0x555, 0xFFFFFFFF]))


@needs_encode
@EQUIV
@given(st.lists(_items(), max_size=12), st.integers(0, 12), st.integers(0, 0xFFFF), U32, st.booleans(),
       st.sampled_from([1, 50, 2048]))
def test_encode_mutations_same_bytes_and_stop_as_the_python_twin(items, start, vb, opaque, collections, large):
    start = min(start, len(items))
    assert encode(items, start, vb, opaque, collections, large) == \
        dcp.encode_mutations_py(items, start, vb, opaque, collections, large)


@needs_encode
@pytest.mark.parametrize("collections", [False, True])
def test_encode_mutations_are_the_messages_dcp_mutation_encodes(collections):
    cids = [0, 8, 0x7F, 0x80, 0xFFFFFFFF] if collections else [0] * 5  # LEB128 prefixes of 1, 1, 1, 2, 5 bytes
    items = [Item(b"k%d" % i, b"{}" * i, i, 2 * i, (1 << 64) - 1 - i, i + 1, 100 + i, 1, cid=cids[i]) for i in range(5)]
    data, stop = encode(items, 1, 9, 0xDEADBEEF, collections, 2048)
    assert stop == 5
    assert data == b"".join(dcp.DcpMutation(9, it.by_seqno, it.rev_seqno, it.flags, it.expiry, 0,
                                            (encode_leb128(it.cid) if collections else b"") + it.key,
                                            it.value, it.cas, it.datatype, 0xDEADBEEF).encode() for it in items[1:])


@needs_encode
@pytest.mark.parametrize("bad, why", [
    (Item(b"d", b"", by_seqno=1, deleted=True), "deleted"),
    (Item(b"x", b"v", datatype=4, by_seqno=1), "xattrs"),
    (Item(b"l", b"v" * 2048, by_seqno=1), "large value"),
    (Item(b"n", b"v", by_seqno=1, cid=8), "a user collection's document on a stream without collections"),
    (Item(b"r", b"v", by_seqno=1, cid=5), "a reserved collection id"),
    (Item(b"s", b"v", by_seqno=1, cid=1), "a collections system event"),
    (Item(b"f", b"v", flags=2**32, by_seqno=1), "flags over 32 bits"),
    (Item(b"c", b"v", cas=2**64, by_seqno=1), "cas over 64 bits"),
    (Item(b"s", b"v", by_seqno=-1), "negative seqno"),
    (Item(b"k" * 0x10000, b"v", by_seqno=1), "key over 16 bits"),
    (Item(b"t", "text", by_seqno=1), "a value that is not bytes"),  # type: ignore[arg-type]
])
def test_encode_mutations_stops_before_what_it_leaves_to_the_general_path(bad, why):
    good = Item(b"g", b"v", by_seqno=1)
    data, stop = encode([good, bad, good], 0, 0, 0, False, 2048)
    assert stop == 1 and data == dcp.encode_mutations_py([good], 0, 0, 0, False, 2048)[0], why


@needs_encode
def test_encode_mutations_reads_any_object_with_the_fields():
    fields = dict(key=b"k", value=b"v", cas=5, by_seqno=6, rev_seqno=7, flags=8, expiry=9, datatype=1, deleted=False,
                  cid=0)
    ns = SimpleNamespace(**fields)
    assert encode([ns, Item(**fields)], 0, 1, 2, True, 2048) == dcp.encode_mutations_py([ns, Item(**fields)], 0, 1, 2,
                                                                                        True, 2048)
    assert encode([SimpleNamespace(key=b"k")], 0, 1, 2, True, 2048) == (b"", 0)  # left to the general path


@needs_encode
def test_encode_mutations_survives_items_that_change_the_list_while_read():
    """A field read that runs Python code (a property) and empties the list, dropping the last
    reference to the item being read: encoded as read, no crash."""
    items: list = []

    class Shrinking:
        reads = 0
        key, cas, by_seqno, rev_seqno, flags, expiry, datatype, deleted, cid = b"k", 0, 1, 1, 0, 0, 0, False, 0

        @property
        def value(self):
            Shrinking.reads += 1
            if Shrinking.reads == 2:
                items.clear()
            return b"v" * Shrinking.reads

    items.extend([Shrinking(), Shrinking(), Shrinking()])
    data, stop = encode(items, 0, 0, 0, False, 2048)
    assert stop == 2 and data == dcp.encode_mutations_py([SimpleNamespace(**{**vars(Shrinking), "value": b"v"}),
                                                          SimpleNamespace(**{**vars(Shrinking), "value": b"vv"})],
                                                         0, 0, 0, False, 2048)[0]


FIELDS = ("key", "value", "cas", "by_seqno", "rev_seqno", "flags", "expiry", "datatype", "deleted", "cid")


def _both(items):
    """What each twin does with the items: its result, or the exception it raised."""
    out = []
    for f in (encode, dcp.encode_mutations_py):
        try:
            out.append(f(items, 0, 0, 0, False, 2048))
        except Exception as e:  # noqa: BLE001 - the exception is the result compared
            out.append((type(e), str(e)))
    return out


@needs_encode
def test_encode_mutations_reads_slots_only_where_getattr_would_read_them():
    """The slot shortcut must never read where Python would not: a class borrowing Item's slot
    descriptors (Document's; their offsets are not its own), one overriding __getattribute__, one changed
    after the shortcut learned it."""
    borrower = type("Borrower", (), {"__slots__": (), **{f: Document.__dict__[f] for f in FIELDS}})
    compiled, python = _both([borrower()])
    assert compiled[0] is python[0] is TypeError  # (the texts name the first field each read)

    class Redacting(Item):
        __slots__ = ()

        def __getattribute__(self, name):
            value = object.__getattribute__(self, name)
            return b"REDACTED" if name == "value" else value

    compiled, python = _both([Redacting(b"k", b"secret!!", by_seqno=1)])
    assert compiled == python and compiled[0].endswith(b"REDACTED")

    class Patched(Item):
        __slots__ = ()

    item = Patched(b"k", b"original", by_seqno=1)
    assert _both([item])[0][0].endswith(b"original")
    Patched.value = property(lambda self: b"patched!")
    compiled, python = _both([item])
    assert compiled == python and compiled[0].endswith(b"patched!")


def test_the_engines_items_are_the_protocols_documents():
    """The encoders read the protocol's record: the engine's versions are Documents whose fields
    are Document's own slots (Item adds none)."""
    assert issubclass(Item, Document) and Item.__slots__ == ()
    assert all(Item.__dict__.get(f) is None and type(Document.__dict__[f]).__name__ == "member_descriptor"
               for f in FIELDS)


@needs_encode
def test_encode_mutations_a_missing_field_stops_the_run_like_the_python_twin():
    """The Python twin stops at a deletion before reading its cas; the compiled one reads every
    field first, so a missing one must stop the run too, not raise (the general path reports it)."""
    good = Item(b"g", b"v", by_seqno=1)
    tomb = SimpleNamespace(key=b"t", value=b"", deleted=True, datatype=0)
    assert encode([good, tomb], 0, 0, 0, False, 2048) == dcp.encode_mutations_py([good, tomb], 0, 0, 0, False, 2048)
    unset = Item.__new__(Item)  # slots never set
    assert encode([good, unset], 0, 0, 0, False, 2048)[1] == 1


@needs_encode
def test_encode_mutations_argument_errors_raise_before_any_python_code_runs():
    ran = []

    class Flag:
        def __bool__(self):
            ran.append(True)
            return True

    with pytest.raises(TypeError):
        encode([], "0", 0, 0, Flag(), 2048)
    assert not ran


@needs_split
@pytest.mark.parametrize("max_body", [1e6, float("inf"), 2**64, -1, 0])
def test_split_leaves_unusual_body_limits_to_the_python_loop(max_body):
    data = request(0x00, key=b"k")

    def run(compiled):
        try:
            return _decode(data, [len(data)], compiled, max_body=max_body)
        except Exception as e:  # noqa: BLE001
            return type(e), str(e)

    assert run(True) == run(False)


@needs_encode
@pytest.mark.parametrize("args", [
    ([], 1, 0, 0, False, 2048), ([], -1, 0, 0, False, 2048), ([], 0, 0x10000, 0, False, 2048),
    ([], 0, 0, 2**32, False, 2048), (5, 0, 0, 0, False, 2048), ([],),
])
def test_encode_mutations_rejects_bad_arguments(args):
    with pytest.raises((TypeError, ValueError, OverflowError)):
        encode(*args)


# -- walk_stream ----------------------------------------------------------------------------------

walk_c = frame_mod.compiled("walk_stream")
needs_walk = pytest.mark.skipif(walk_c is None, reason="the compiled walk is not built")
STREAM_TABLE = bytes(1 if 0x53 <= op <= 0x5F else 0 for op in range(256))


@st.composite
def frame_runs(draw):
    """Frames a DCP client receives: mostly stream messages, some replies, noops, other magics, a
    body length that overruns the buffer, cut anywhere."""
    out = b""
    for _ in range(draw(st.integers(0, 12))):
        magic = draw(st.sampled_from([0x80, 0x80, 0x80, 0x81, 0x08, 0x18, 0x42]))
        op = draw(st.sampled_from([0x57, 0x58, 0x56, 0x55, 0x5C, 0x5D, 0x01, 0x0A, 0x89]))
        body = draw(st.binary(max_size=40))
        claimed = len(body) if draw(st.integers(0, 9)) else draw(st.integers(0, 2**32 - 1))
        out += struct.pack(">BBHBBHII8x", magic, op, 0, 0, 0, 0, claimed, 0) + body
    cut = draw(st.integers(0, len(out)))
    return out[:cut] if draw(st.booleans()) else out


@needs_walk
@EQUIV
@given(frame_runs(), st.integers(0, 64))
def test_walk_stream_is_its_python_twin(buf, pos):
    pos = min(pos, len(buf))
    got = walk_c(buf, pos, STREAM_TABLE)
    assert got == frame_mod.walk_stream_py(buf, pos, STREAM_TABLE)
    end, starts = got
    offsets = struct.unpack(f"={len(starts) // 8}q", starts)
    at = pos
    for o in offsets:  # each taken frame is a complete stream message, back to back
        assert o == at and buf[o] == 0x80 and STREAM_TABLE[buf[o + 1]]
        at = o + 24 + struct.unpack_from(">I", buf, o + 8)[0]
        assert at <= len(buf)
    assert at == end
    if len(buf) - end >= 24:  # it stopped at a frame it does not take
        magic, op, body = buf[end], buf[end + 1], struct.unpack_from(">I", buf, end + 8)[0]
        assert magic != 0x80 or not STREAM_TABLE[op] or end + 24 + body > len(buf)


@needs_walk
@EQUIV
@given(frame_runs(), st.integers(0, 64), st.integers(0, 64))
def test_walk_stream_stops_at_end_in_a_receive_buffer(buf, pos, room):
    """The connection's receive buffer: a bytearray whose bytes past `end` are not received yet
    (here: garbage that would complete a cut frame). The walk sees buf[:end] only."""
    end = len(buf)
    pos = min(pos, end)
    filled = bytearray(buf + b"\x80" * room)
    got = walk_c(filled, pos, STREAM_TABLE, end)
    assert got == frame_mod.walk_stream_py(filled, pos, STREAM_TABLE, end) == walk_c(buf, pos, STREAM_TABLE)


@needs_walk
@pytest.mark.parametrize("args", [(b"", -1, STREAM_TABLE), (b"x" * 24, 25, STREAM_TABLE),
                                  (b"x" * 24, 0, STREAM_TABLE, 25), (b"x" * 24, 0, STREAM_TABLE, -1),
                                  (bytearray(24), 10, STREAM_TABLE, 9)])
def test_walk_stream_rejects_a_position_outside_the_buffer(args):
    for walk in (walk_c, frame_mod.walk_stream_py):
        with pytest.raises(ValueError, match="pos or end outside the buffer"):
            walk(*args)


@needs_walk
@pytest.mark.parametrize("args", [("x" * 24, 0, STREAM_TABLE), (b"", 0, b"\x01" * 255), (b"", 0),
                                  (b"", 0, STREAM_TABLE, 0, 0)])
def test_walk_stream_rejects_bad_arguments(args):
    with pytest.raises(TypeError):
        walk_c(*args)


# -- walk_sid_stream --------------------------------------------------------------------------------

walk_sid_c = frame_mod.compiled("walk_sid_stream")
needs_walk_sid = pytest.mark.skipif(walk_sid_c is None, reason="the compiled walk is not built")


@st.composite
def sid_runs(draw):
    """What a connection with stream-ids receives: mostly stream messages framed with a stream-id,
    some with other framing (other frame infos, none, a stream-id of the wrong size), classic
    frames, replies, lengths that contradict each other or overrun the buffer, cut anywhere."""
    out = b""
    for _ in range(draw(st.integers(0, 12))):
        magic = draw(st.sampled_from([0x08, 0x08, 0x08, 0x08, 0x80, 0x81, 0x18]))
        op = draw(st.sampled_from([0x57, 0x58, 0x56, 0x55, 0x5F, 0x01, 0x89]))
        framing = draw(st.sampled_from([frame_mod.stream_id_frame(draw(st.integers(1, 0xFFFF)))] * 6 +
                                       [b"", b"\x21\x01", b"\x23\x00\x01\x02", b"\x01\x22\x00\x01"]))
        key, extras, value = (draw(st.binary(max_size=12)), draw(st.binary(max_size=20)),
                              draw(st.binary(max_size=30)))
        body = len(framing) + len(key) + len(extras) + len(value)
        claimed = body if draw(st.integers(0, 9)) else draw(st.integers(0, 2**32 - 1))
        out += struct.pack(">BBBBBBHII8x", magic, op, len(framing), len(key), len(extras), 0, 7, claimed, 9) + \
            framing + extras + key + value
    cut = draw(st.integers(0, len(out)))
    return out[:cut] if draw(st.booleans()) else out


@needs_walk_sid
@EQUIV
@given(sid_runs(), st.integers(0, 64), st.integers(0, 16))
def test_walk_sid_stream_is_its_python_twin(buf, pos, room):
    end = len(buf)
    pos = min(pos, end)
    filled = bytearray(buf + b"\x08" * room)  # a receive buffer: bytes past `end` not received yet
    got = walk_sid_c(filled, pos, STREAM_TABLE, end)
    assert got == frame_mod.walk_sid_stream_py(buf, pos, STREAM_TABLE) == walk_sid_c(buf, pos, STREAM_TABLE)
    stop, data, starts, sids = got
    offsets = struct.unpack(f"={len(starts) // 8}q", starts)
    ids = struct.unpack(f"={len(sids) // 8}q", sids)
    at, wire = pos, 0
    for o, sid in zip(offsets, ids, strict=True):  # each: the wire frame, unframed
        size = 24 + struct.unpack_from(">I", buf, at + 8)[0]
        assert frame_mod.unframe_stream_id(buf, at, at + size) == (sid, data[o:o + size - 3])
        at += size
        wire += size
    assert at == stop and len(data) == wire - 3 * len(offsets)


@needs_walk_sid
@pytest.mark.parametrize("args", [(b"", -1, STREAM_TABLE), (b"x" * 24, 25, STREAM_TABLE),
                                  (bytearray(24), 10, STREAM_TABLE, 9)])
def test_walk_sid_stream_rejects_a_position_outside_the_buffer(args):
    for walk in (walk_sid_c, frame_mod.walk_sid_stream_py):
        with pytest.raises(ValueError, match="pos or end outside the buffer"):
            walk(*args)


# -- stamp_mutations -------------------------------------------------------------------------------

stamp = dcp.stamp_mutations
needs_stamp = pytest.mark.skipif(stamp is dcp.stamp_mutations_py, reason="the compiled restamper is not built")


def _stored_run(items: list[Item]) -> list[Item]:
    """Plain mutations with strictly increasing seqnos, as a store keeps them."""
    out, seqno = [], 0
    for it in items:
        seqno += 1 + it.by_seqno % 7
        out.append(Item(it.key, it.value, it.flags, it.expiry, it.cas, it.rev_seqno, seqno, it.datatype & 3))
    return out


def _stamp_outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except ValueError as e:
        return ("error", str(e))


@EQUIV
@given(st.lists(_items(), max_size=10), st.integers(0, 0xFFFF), U32, st.booleans())
def test_stamped_runs_are_what_encode_mutations_makes(items, vb, opaque, collections):
    run = _stored_run(items)
    stored, _ = dcp.encode_mutations_py(run, 0, vb, 0, False, 1 << 20)
    want, _ = dcp.encode_mutations_py(run, 0, vb, opaque, collections, 1 << 20)
    assert dcp.stamp_mutations_py(stored, opaque, collections) == want
    assert stamp(stored, opaque, collections) == want


def _broken_runs():
    """A stored run, then broken: truncated, a byte changed, two messages swapped, or bytes added."""
    return st.tuples(st.lists(_items(), min_size=1, max_size=6), st.sampled_from(["cut", "byte", "swap", "tail"]),
                     st.integers(0, 10_000), st.integers(0, 255))


def _break(items, how: str, at: int, byte: int) -> bytes:
    """One of _broken_runs(), made."""
    run = _stored_run(items)
    data = bytearray(dcp.encode_mutations_py(run, 0, 3, 0, False, 1 << 20)[0])
    if how == "cut":
        del data[at % len(data):]
    elif how == "byte":
        data[at % len(data)] = byte
    elif how == "swap" and len(run) > 1:
        data = bytearray(dcp.encode_mutations_py(run[1:] + run[:1], 0, 3, 0, False, 1 << 20)[0])
    else:
        data += bytes([byte]) * (at % 60)
    return bytes(data)


@needs_stamp
@EQUIV
@given(_broken_runs(), U32, st.booleans())
def test_compiled_stamp_fails_like_its_specification(broken, opaque, collections):
    data = _break(*broken)
    assert _stamp_outcome(stamp, data, opaque, collections) == \
        _stamp_outcome(dcp.stamp_mutations_py, data, opaque, collections)


upto = dcp.mutations_upto


@EQUIV
@given(st.lists(_items(), max_size=10), st.integers(0, 80), U32, st.booleans())
def test_the_head_up_to_a_seqno_is_what_encode_mutations_makes_of_those_documents(items, cut, opaque, collections):
    run = _stored_run(items)
    stored, _ = dcp.encode_mutations_py(run, 0, 9, 0, False, 1 << 20)
    head = [it for it in run if it.by_seqno <= cut]
    want_bytes, _ = dcp.encode_mutations_py(head, 0, 9, 0, False, 1 << 20)
    want = (len(want_bytes), len(head), head[-1].by_seqno if head else 0)
    assert dcp.mutations_upto_py(stored, cut) == want
    assert upto(stored, cut) == want
    assert upto(memoryview(stored), cut) == want
    # what a backfill sends: the head, restamped, is what the encoder makes of those documents
    assert stamp(memoryview(stored)[:want[0]], opaque, collections) == \
        dcp.encode_mutations_py(head, 0, 9, opaque, collections, 1 << 20)[0]


@needs_stamp
@EQUIV
@given(_broken_runs(), st.integers(0, 1 << 64))
def test_compiled_upto_fails_like_its_specification(broken, cut):
    data = _break(*broken)

    def outcome(fn):
        try:
            return ("ok", fn(data, cut))
        except (ValueError, OverflowError) as e:
            return (type(e).__name__, str(e) if isinstance(e, ValueError) else "")
    assert outcome(upto) == outcome(dcp.mutations_upto_py)


@pytest.mark.parametrize("fn", [dcp.stamp_mutations_py, stamp], ids=["python", "active"])
def test_stamp_refuses_what_is_not_a_stored_run(fn):
    one = dcp.DcpMutation(0, 5, 1, 0, 0, 0, b"k", b"v").encode()
    two = dcp.DcpMutation(0, 6, 1, 0, 0, 0, b"l", b"v").encode()
    assert fn(b"", 1, True) == b""
    with pytest.raises(ValueError, match="seqno 5 at offset 57 does not follow 6"):
        fn(two + one, 1, False)
    with pytest.raises(ValueError, match="seqno 5 at offset 57 does not follow 5"):
        fn(one + one, 1, False)  # equal seqnos: a key twice in a page is as wrong
    with pytest.raises(ValueError, match="is cut"):
        fn(one[:-1], 1, False)
    with pytest.raises(ValueError, match="no DCP_MUTATION"):
        fn(dcp.DcpDeletion(0, 5, 1, b"k").encode(), 1, False)
    with pytest.raises(ValueError, match="opaque"):
        fn(one, 1 << 32, False)


# -- Document's constructor ---------------------------------------------------------------------

from dcpflow.protocol.dcp.documents import document_init_py  # noqa: E402

needs_init = pytest.mark.skipif(Document.__init__ is document_init_py,
                                reason="the compiled Document constructor is not built")
_FIELD_NAMES = [f for f in Document.__dataclass_fields__]
_init_values = st.one_of(st.integers(-2, 1 << 70), st.binary(max_size=8), st.none(), st.booleans())


class _Property(Document):
    """A subclass with a property in front of a field: the compiled constructor sets it by name."""

    __slots__ = ("_flags",)

    @property
    def flags(self):
        return self._flags

    @flags.setter
    def flags(self, v):
        self._flags = ("set", v)


@needs_init
@settings(max_examples=300, deadline=None)
@given(st.lists(_init_values, max_size=14),
       st.dictionaries(st.sampled_from(_FIELD_NAMES + ["nope", "self"]), _init_values, max_size=4),
       st.sampled_from([Document, Item, _Property]))
def test_the_compiled_document_constructor_is_the_dataclass_one(args, kwargs, cls):
    """Same fields, or the same error type, for any positional and keyword arguments, on the
    protocol's Document, the engine's Item and a subclass with a property in front of a field."""
    def build(init):
        doc = cls.__new__(cls)
        try:
            init(doc, *args, **kwargs)
        except TypeError:
            return TypeError
        return [getattr(doc, name, "unset") for name in _FIELD_NAMES]

    assert build(Document.__init__) == build(document_init_py)


@needs_init
def test_the_compiled_constructor_builds_what_the_dataclass_builds():
    a = Item(b"k", b"v", 1, expiry=2, cid=8)
    b = Item.__new__(Item)
    document_init_py(b, b"k", b"v", 1, expiry=2, cid=8)
    assert a == b and a.delete_source is b.delete_source and a.rev_seqno == 1
