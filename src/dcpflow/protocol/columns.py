"""Fields of many frames at once, as numpy columns: what a columnar reader (the DCP client's Arrow
decoder) needs from frames that stay in the buffers they were received in.

A frame is addressed as (buffer index, offset): several received segments are never joined into
one buffer. `gather` copies the first bytes of every frame into one matrix, `field_column` reads a
big-endian field of every row of such a matrix (a `Field` of frame.HEADER_FIELDS or
dcp.DOCUMENT_LAYOUTS), `concat_compiled` copies many byte ranges (keys, values) into one bytes
object, and `frame_sizes` gives each frame's wire size.

`gather_compiled` and `concat_compiled` are the compiled twins (`_speedups.c`) of `gather_py` and
`concat_py` here, their specifications; tests/protocol/test_columns.py checks that both give the
same results.
Needs numpy (the `arrow` extra); nothing else in dcpflow.protocol imports this module.
"""

import numpy as np

from .frame import HEADER_FIELDS, HEADER_LEN, Field, compiled

_BIG_ENDIAN = {1: "u1", 2: ">u2", 4: ">u4", 8: ">u8"}


def _windows(u8: np.ndarray, width: int) -> np.ndarray:
    """A (len - width + 1, width) view of the bytes: row i is bytes i..i+width. Fancy-indexing it
    by frame offsets copies each frame's first `width` bytes in one pass."""
    return np.lib.stride_tricks.sliding_window_view(u8, width)


def _gather_one(u8: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """The `width` bytes at each position of one buffer, zero-padded past its end (a short frame
    at the end of a segment)."""
    n = len(u8)
    if not len(pos):
        return np.zeros((0, width), dtype=np.uint8)
    safe = pos <= n - width
    if safe.all():
        return _windows(u8, width)[pos]
    out = np.zeros((len(pos), width), dtype=np.uint8)
    if n >= width:
        out[safe] = _windows(u8, width)[pos[safe]]
    for i in np.flatnonzero(~safe):
        tail = u8[int(pos[i]):int(pos[i]) + width]
        out[i, :len(tail)] = tail
    return out


def gather_py(u8s: list[np.ndarray], sid: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """The `width` bytes of buffer sid[i] at pos[i], zero-padded past that buffer's end, as row i
    of an (n, width) uint8 matrix (sid ascending). The specification of the compiled `gather`,
    which saves numpy's fixed cost per buffer (a batch spans some 60 received segments, each
    gathered three times)."""
    if len(u8s) == 1:
        return _gather_one(u8s[0], pos, width)
    bounds = np.searchsorted(sid, np.arange(len(u8s) + 1))
    return np.concatenate([_gather_one(u8, pos[bounds[i]:bounds[i + 1]], width) for i, u8 in enumerate(u8s)])


#: The compiled `gather` (into a given matrix, int64 sid and pos), or None: see `gather`.
gather_compiled = compiled("gather")


def gather(u8s: list[np.ndarray], sid: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """gather_py's matrix, compiled when the extension was built."""
    if gather_compiled is None:
        return gather_py(u8s, sid, pos, width)
    out = np.empty((len(pos), width), dtype=np.uint8)
    gather_compiled(out, u8s, np.ascontiguousarray(sid, dtype=np.int64), np.ascontiguousarray(pos, dtype=np.int64),
                    width)
    return out


def concat_py(u8s: list[np.ndarray], sid: np.ndarray, pos: np.ndarray, lengths: np.ndarray) -> bytes:
    """The ranges [pos, pos + lengths) of buffers sid, joined; ValueError for a range that is not
    inside its buffer. The specification of the compiled `concat`."""
    out = []
    for i, (s, p, n) in enumerate(zip(sid.tolist(), pos.tolist(), lengths.tolist(), strict=True)):
        if not (0 <= s < len(u8s) and p >= 0 and n >= 0 and p + n <= len(u8s[s])):
            raise ValueError(f"concat: row {i} names {n} bytes of buffer {s} at {p}")
        out.append(u8s[s][p:p + n].tobytes())
    return b"".join(out)


#: The compiled `concat` (int64 sid, pos and lengths), or None when the extension was not built: a
#: caller then builds its column another way than concat_py's copy per row.
concat_compiled = compiled("concat")


def field_column(mat: np.ndarray, field: Field) -> np.ndarray:
    """The big-endian `field` of every row of a gathered (n, width) matrix, as a native unsigned
    array (row i holds the first `width` bytes of frame i)."""
    return mat[:, field.offset:field.stop].view(_BIG_ENDIAN[field.size]).ravel()


_BODY_LENGTH = HEADER_FIELDS["body_length"]


def frame_sizes(data, starts: np.ndarray) -> np.ndarray:
    """The wire size (header and body) of each frame of `data` at the int64 offsets `starts`."""
    u8 = np.frombuffer(data, dtype=np.uint8)
    cols = starts[:, None] + np.arange(_BODY_LENGTH.offset, _BODY_LENGTH.stop)
    return u8[cols].view(_BIG_ENDIAN[_BODY_LENGTH.size]).ravel().astype(np.int64) + HEADER_LEN
