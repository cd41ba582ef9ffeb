"""The compiled `gather` and `concat` (_speedups.c) against their Python specifications,
columns.gather_py and concat_py: the first bytes of frames that sit in several received
segments, zero-padded past a segment's end; and ranges of those segments joined (a key or value
column's data)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcpflow.protocol import columns
from dcpflow.protocol.columns import concat_py, gather_py
from dcpflow.protocol.frame import compiled

gather = compiled("gather")
pytestmark = pytest.mark.skipif(gather is None, reason="the compiled gather is not built")


@st.composite
def gathers(draw):
    bufs = draw(st.lists(st.binary(max_size=80), min_size=1, max_size=6))
    rows = []
    for sid, b in enumerate(bufs):  # ascending buffer ids, as the decoder gathers
        rows += [(sid, draw(st.integers(0, len(b) + 3))) for _ in range(draw(st.integers(0, 5)))]
    return [np.frombuffer(b, dtype=np.uint8) for b in bufs], rows, draw(st.integers(0, 64))


@settings(max_examples=300, deadline=None)
@given(gathers())
def test_gather_is_its_python_twin(case):
    u8s, rows, width = case
    sid = np.array([s for s, _ in rows], dtype=np.int64)
    pos = np.array([p for _, p in rows], dtype=np.int64)
    out = np.full((len(rows), width), 0xAA, dtype=np.uint8)  # every byte must be written
    gather(out, u8s, sid, pos, width)
    expect = gather_py(u8s, sid, pos, width)
    assert out.tobytes() == expect.tobytes()
    assert columns.gather(u8s, sid, pos, width).tobytes() == expect.tobytes()
    for (s, p), row in zip(rows, out, strict=True):  # and what both say, said plainly
        raw = u8s[s].tobytes()[p:p + width]
        assert row.tobytes() == raw + bytes(width - len(raw))


@pytest.mark.parametrize("sid, pos, width, out_rows, match", [
    ([1], [0], 4, 1, "names buffer 1"),
    ([-1], [0], 4, 1, "names buffer -1"),
    ([0], [-2], 4, 1, "at -2"),
    ([0, 0], [0], 4, 2, "one length"),
    ([0], [0], 4, 2, "len\\(pos\\) \\* width"),
])
def test_gather_rejects_rows_it_cannot_read(sid, pos, width, out_rows, match):
    out = np.zeros((out_rows, width), dtype=np.uint8)
    with pytest.raises(ValueError, match=match):
        gather(out, [np.zeros(8, np.uint8)], np.array(sid, np.int64), np.array(pos, np.int64), width)


def test_gather_needs_a_writable_output_and_buffers():
    sid = pos = np.zeros(1, np.int64)
    with pytest.raises(BufferError, match="not writable"):
        gather(b"\0" * 4, [b"abcd"], sid, pos, 4)
    with pytest.raises(TypeError):
        gather(bytearray(4), [object()], sid, pos, 4)
    with pytest.raises(ValueError, match="width"):
        gather(bytearray(4), [b"abcd"], sid, pos, -1)


concat = compiled("concat")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=80), min_size=1, max_size=6), st.data())
def test_concat_is_its_python_twin(bufs, data):
    u8s = [np.frombuffer(b, dtype=np.uint8) for b in bufs]
    rows = []
    for _ in range(data.draw(st.integers(0, 12))):
        s = data.draw(st.integers(0, len(bufs) - 1))
        p = data.draw(st.integers(0, len(bufs[s])))
        rows.append((s, p, data.draw(st.integers(0, len(bufs[s]) - p))))
    sid, pos, lens = (np.array([r[i] for r in rows], dtype=np.int64) for i in range(3))
    got = concat(u8s, sid, pos, lens)
    assert got == concat_py(u8s, sid, pos, lens) == b"".join(bufs[s][p:p + n] for s, p, n in rows)


@pytest.mark.parametrize("sid, pos, lens, match", [
    ([1], [0], [1], "of buffer 1"),
    ([-1], [0], [1], "of buffer -1"),
    ([0], [-2], [1], "at -2"),
    ([0], [0], [-1], "names -1 bytes"),
    ([0], [6], [3], "names 3 bytes of buffer 0 at 6"),  # runs past the buffer's end
    ([0, 0], [0], [1, 1], "one length"),
])
def test_concat_rejects_ranges_it_cannot_read(sid, pos, lens, match):
    args = ([np.zeros(8, np.uint8)], np.array(sid, np.int64), np.array(pos, np.int64), np.array(lens, np.int64))
    with pytest.raises(ValueError, match=match):
        concat(*args)
    if match != "one length":
        with pytest.raises(ValueError, match=match):
            concat_py(*args)
