"""Stream bytes -> Arrow RecordBatches, without a Python object per row or per field.

The connection already found the frame boundaries (connection.py); here the frames of several
segments are decoded together with numpy, each frame addressed as (segment, offset) - the
segments are never joined into one buffer (that copy cost about 0.3 s per million 500-byte
documents):

* one gather per segment (a strided window view indexed by frame offsets) copies the first 48
  bytes of every frame (header + the fixed extras of a document:
  by_seqno, rev_seqno, then flags/expiry of a mutation or the delete time of a deletion V2 /
  expiration; mutation.md, deletion.md, expiration.md, TABLES.md 5.6) into an (n, 48) matrix, and
  each numeric column is a big-endian view of a slice of it;
* keys and values become an Arrow binary_view array whose data buffers are the received segments
  (the 16-byte views, with buffer index and offset, are built with numpy), which Arrow casts to
  plain `binary` in C++;
* the few other frames (snapshot markers, stream ends, seqno-advanced, system events) are walked
  in Python in order; each row's snapshot is the last marker of its vbucket before it, found with
  `searchsorted`, and the trackers see, between two such frames, only the last seqno of each
  vbucket (seqnos rise within a vbucket, so the rest cannot change an offset).

`uint64` fields (cas, vbuuid) are stored as the int64 with the same bits: `value & (2**64 - 1)`
(or numpy `.view(np.uint64)`) gives the unsigned number back.
"""

import struct

import numpy as np
import pyarrow as pa

from dcpflow.protocol.dcp import (
    MARKER_V2_VALUE_BYTES,
    DcpSeqnoAdvanced,
    DcpSnapshotMarker,
    DcpStreamEnd,
    DcpSystemEvent,
    SnapshotFlag,
    decode_dcp,
)
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import compiled, decode_all
from dcpflow.protocol.keys import decode_leb128

from .streams import ADVANCED, ITEM, SNAPSHOT, Feed

SCHEMA = pa.schema([
    pa.field("vbucket", pa.int32(), nullable=False),
    pa.field("seqno", pa.int64(), nullable=False),
    pa.field("vbuuid", pa.int64(), nullable=False),
    pa.field("key", pa.binary(), nullable=False),
    pa.field("value", pa.binary()),  # null for deletions and expirations
    pa.field("event", pa.string(), nullable=False),  # mutation | deletion | expiration
    pa.field("cas", pa.int64(), nullable=False),
    pa.field("rev_seqno", pa.int64(), nullable=False),
    pa.field("flags", pa.int64(), nullable=False),  # u32 as stored by the writer; 0 unless mutation
    pa.field("expiry", pa.int64(), nullable=False),  # u32 epoch seconds; 0 = none; 0 unless mutation
    pa.field("datatype", pa.int32(), nullable=False),
    pa.field("snapshot_start", pa.int64(), nullable=False),
    pa.field("snapshot_end", pa.int64(), nullable=False),
    pa.field("collection_id", pa.int64(), nullable=False),  # 0 = default collection
    pa.field("delete_time", pa.int64(), nullable=False),  # deletions V2 / expirations; else 0
])

_EVENTS = pa.Array.from_buffers(pa.string(), 3, [None, pa.py_buffer(np.array([0, 8, 16, 26], np.int32)),
                                                 pa.py_buffer(b"mutationdeletionexpiration")])
_AR12 = np.arange(12, dtype=np.int64)

# -- the control frames of a stream, in the shape producers send them ------------------------------
# Every stream brings a snapshot marker and a stream end, so with ~1000 documents a vbucket the
# full decode (a Frame, the rules, a typed message: ~15 us) of those two is a tenth of the work.
# These read the canonical shape in place and answer None for anything else, which the full
# decode then accepts or rejects with its own words: what they accept, it accepts the same.
_MARKER_SEQNOS = struct.Struct(">QQI").unpack_from  # start, end, flags (V1 extras; V2.x value head)
_U64_AT = struct.Struct(">Q").unpack_from
_U32_AT = struct.Struct(">I").unpack_from
_MARKER_FLAGS = int(sum(SnapshotFlag))
_MEMORY_DISK = int(SnapshotFlag.MEMORY | SnapshotFlag.DISK)


def marker_fields(data, p: int) -> tuple[int, int, int] | None:
    """(start, end, purge seqno) of the snapshot marker at `p`: classic framing, no key, datatype
    0, V1 (20-byte extras) or V2.0/V2.2 (version byte and its value), start <= end, known flags
    and not both Memory and Disk (snapshot-marker.md); else None."""
    if data[p] != 0x80 or data[p + 1] != 0x56 or data[p + 2] or data[p + 3] or data[p + 5]:
        return None
    ext = data[p + 4]
    body = _U32_AT(data, p + 8)[0]
    if ext == 20 and body == 20:
        start, end, flags = _MARKER_SEQNOS(data, p + 24)
        purge = 0
    elif ext == 1 and body > 1 and body - 1 == MARKER_V2_VALUE_BYTES.get(data[p + 24]):
        start, end, flags = _MARKER_SEQNOS(data, p + 25)
        purge = _U64_AT(data, p + 25 + 36)[0] if data[p + 24] == 0x02 else 0
    else:
        return None
    if start > end or flags & ~_MARKER_FLAGS or flags & _MEMORY_DISK == _MEMORY_DISK:
        return None
    return start, end, purge


def stream_end_reason(data, p: int) -> int | None:
    """The reason of the stream end at `p` in classic framing (4-byte extras, no key or value,
    datatype 0: stream-end.md), else None."""
    if data[p] != 0x80 or data[p + 1] != 0x55 or data[p + 2] or data[p + 3] or data[p + 4] != 4 or data[p + 5]:
        return None
    if _U32_AT(data, p + 8)[0] != 4:
        return None
    return _U32_AT(data, p + 24)[0]


def _windows(u8: np.ndarray, width: int) -> np.ndarray:
    """A (len - width + 1, width) view of the bytes: row i is bytes i..i+width. Fancy-indexing it
    by frame offsets copies each frame's first `width` bytes in one pass."""
    return np.lib.stride_tricks.sliding_window_view(u8, width)


def _gather(u8: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
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


def _gather_all_py(u8s: list[np.ndarray], sid: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """`_gather` over several buffers: row i from buffer sid[i] at pos[i] (sid ascending). The
    specification of the compiled `gather`, which saves numpy's fixed cost per buffer (a batch
    spans some 60 received segments, each gathered three times)."""
    if len(u8s) == 1:
        return _gather(u8s[0], pos, width)
    bounds = np.searchsorted(sid, np.arange(len(u8s) + 1))
    return np.concatenate([_gather(u8, pos[bounds[i]:bounds[i + 1]], width) for i, u8 in enumerate(u8s)])


_gather_c = compiled("gather")


def _gather_all(u8s: list[np.ndarray], sid: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    if _gather_c is None:
        return _gather_all_py(u8s, sid, pos, width)
    out = np.empty((len(pos), width), dtype=np.uint8)
    _gather_c(out, u8s, np.ascontiguousarray(sid, dtype=np.int64), np.ascontiguousarray(pos, dtype=np.int64), width)
    return out


def _be(mat: np.ndarray, lo: int, hi: int, dtype: str) -> np.ndarray:
    """Big-endian field [lo, hi) of every row of the header matrix, as a native array."""
    return mat[:, lo:hi].view(dtype).ravel()


_ARROW_TYPES = {np.dtype(np.int8): pa.int8(), np.dtype(np.int32): pa.int32(), np.dtype(np.int64): pa.int64()}


def _numeric(arr: np.ndarray) -> pa.Array:
    """A numpy column as an Arrow array, zero-copy. `pa.array(ndarray)` would also work, but it
    first asks whether the object is a pandas one, which imports pandas (~50 MB of RSS) into a
    client that never uses it."""
    arr = np.ascontiguousarray(arr)
    return pa.Array.from_buffers(_ARROW_TYPES[arr.dtype], len(arr), [None, pa.py_buffer(arr)])


def _u64_as_i64(mat: np.ndarray, lo: int) -> np.ndarray:
    return _be(mat, lo, lo + 8, ">u8").astype(np.uint64).view(np.int64)


def _concat_py(u8s: list[np.ndarray], sid: np.ndarray, pos: np.ndarray, lengths: np.ndarray) -> bytes:
    """The ranges [pos, pos + lengths) of buffers sid, joined: the specification of the compiled
    `concat`."""
    out = []
    for i, (s, p, n) in enumerate(zip(sid.tolist(), pos.tolist(), lengths.tolist(), strict=True)):
        if not (0 <= s < len(u8s) and p >= 0 and n >= 0 and p + n <= len(u8s[s])):
            raise ValueError(f"concat: row {i} names {n} bytes of buffer {s} at {p}")
        out.append(u8s[s][p:p + n].tobytes())
    return b"".join(out)


_concat_c = compiled("concat")
_I32_MAX = 2**31 - 1


def binary_column(bufs: list[pa.Buffer], u8s: list[np.ndarray], sid: np.ndarray, starts: np.ndarray,
                  lengths: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    """A `binary` array of the byte ranges [starts, starts + lengths) of buffers sid (null where
    `valid` is False).

    Compiled: offsets from a cumulative sum and the data copied once by `concat`. Otherwise built
    as binary_view (Arrow's "German string" layout: 16-byte views, data of up to 12 bytes inline,
    longer data as prefix + buffer index + offset) over the received segments themselves, which
    Arrow casts to plain binary in C++ - a second copy of the data, and per-row work in the cast
    (~0.15 us/row for 1M documents of ~400 B)."""
    n = len(starts)
    if valid is not None and valid.all():
        valid = None
    if _concat_c is not None:
        lens = lengths.astype(np.int64) if valid is None else np.where(valid, lengths, 0).astype(np.int64)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        if offsets[-1] <= _I32_MAX:  # binary's offsets are int32 (the view path's cast says the same)
            data = _concat_c(u8s, np.ascontiguousarray(sid, dtype=np.int64),
                             np.ascontiguousarray(starts, dtype=np.int64), lens)
            validity = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
            return pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(offsets.astype(np.int32)),
                                                          pa.py_buffer(data)])
    views = np.zeros((n, 16), dtype=np.uint8)
    ints = views.view(np.int32)
    ints[:, 0] = lengths.astype(np.int32)
    head = _gather_all(u8s, sid, starts, 12)  # first 12 bytes of each (copied)
    head[_AR12[None, :] >= lengths[:, None]] = 0
    views[:, 4:16] = head
    long = lengths > 12
    if long.any():
        ints[long, 2] = sid[long].astype(np.int32)  # buffer index
        ints[long, 3] = starts[long].astype(np.int32)
    validity = None
    if valid is not None:
        validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
        ints[~valid] = 0
    arr = pa.Array.from_buffers(pa.binary_view(), n, [validity, pa.py_buffer(views), *bufs])
    return arr.cast(pa.binary())


class BatchBuilder:
    """Decodes groups of segments of one Feed into RecordBatches of SCHEMA."""

    def __init__(self, feed: Feed, end_filter: dict[int, int] | None = None):
        self.feed = feed
        size = max(feed.streams, default=0) + 1
        self.size = max(size, 1024)
        self.end = None
        if end_filter is not None:
            self.end = np.full(self.size, np.iinfo(np.uint64).max, dtype=np.uint64)
            for vb, e in end_filter.items():
                self.end[vb] = e

    def decode(self, segments, steps: list, events: list) -> pa.RecordBatch | None:
        """Decode `segments` (in order) into one batch; append tracker steps and application events
        (StreamEnd...) to the lists. Updates the feed's decoded trackers and handles stream ends."""
        feed = self.feed
        streams = feed.streams
        # Frames stay in the segments they arrived in (no copy joins them): a frame is (segment
        # sid, local start), and the Arrow columns point into the segments' buffers.
        datas, u8s, starts_parts, sid_parts, coll_parts = [], [], [], [], []
        for i, seg in enumerate(segments):
            s = np.frombuffer(seg.starts, dtype=np.int64)
            datas.append(seg.data)
            u8s.append(np.frombuffer(seg.data, dtype=np.uint8))
            starts_parts.append(s)
            sid_parts.append(np.full(len(s), i, dtype=np.int64))
            coll_parts.append(np.full(len(s), seg.conn.collections, dtype=bool))
        one = len(starts_parts) == 1
        starts = starts_parts[0] if one else np.concatenate(starts_parts)
        sid = sid_parts[0] if one else np.concatenate(sid_parts)
        coll = coll_parts[0] if one else np.concatenate(coll_parts)
        hdr = _gather_all(u8s, sid, starts, 48)  # every frame's header and first extras, copied
        ops = hdr[:, 1]
        is_row = (ops >= 0x57) & (ops <= 0x59)
        ridx = np.flatnonzero(is_row)
        cidx = np.flatnonzero(~is_row)
        rs = starts[ridx]
        rsid = sid[ridx]
        n = len(rs)

        mat = hdr[ridx]
        klen = _be(mat, 2, 4, ">u2").astype(np.int64)
        ext = mat[:, 4].astype(np.int64)
        blen = _be(mat, 8, 12, ">u4").astype(np.int64)
        rops = ops[ridx]
        vb = _be(mat, 6, 8, ">u2").astype(np.int64)
        seq_u = _be(mat, 24, 32, ">u8").astype(np.uint64)
        is_mut = rops == 0x57
        ok = np.where(is_mut, ext == 31, np.where(rops == 0x58, (ext == 21) | (ext == 18), ext == 20))
        ok &= (klen > 0) & (ext + klen <= blen)
        if n and not ok.all():
            bad = int(np.flatnonzero(~ok)[0])
            raise ProtocolError(f"malformed DCP opcode 0x{int(rops[bad]):02x} for vbucket {int(vb[bad])}: extras "
                                f"{int(ext[bad])}, key {int(klen[bad])}, body {int(blen[bad])} bytes "
                                f"(mutation.md / deletion.md / expiration.md)")
        if n and int(vb.max()) >= self.size:
            raise ProtocolError(f"DCP message for vbucket {int(vb.max())}, which this read did not request")

        # -- the other frames, in order, with the trackers in step ---------------------------------
        c_starts = starts[cidx]
        c_sid = sid[cidx]
        c_vb = (hdr[cidx, 6].astype(np.int64) << 8) | hdr[cidx, 7]
        c_op = ops[cidx]
        nc = len(cidx)
        rkey = (vb << 32) | ridx
        ckey = (c_vb << 32) | cidx
        corder = np.argsort(ckey, kind="stable")
        ckey_sorted = ckey[corder]
        # Group = the next other-frame of the row's vbucket (its position in frame order), or a tail
        # group per vbucket; the trackers need the last seqno of each group.
        nxt = np.searchsorted(ckey_sorted, rkey)
        has_next = nxt < nc
        nxt_c = np.minimum(nxt, max(nc - 1, 0))
        same = has_next & (c_vb[corder[nxt_c]] == vb) if nc else np.zeros(n, dtype=bool)
        group = np.where(same, corder[nxt_c] if nc else 0, nc + vb)
        last = np.zeros(nc + self.size, dtype=np.uint64)
        if n:
            np.maximum.at(last, group, seq_u)

        mk_vb, mk_idx, mk_s, mk_e = [], [], [], []
        carry_s = np.full(self.size, -1, dtype=np.int64)
        carry_e = np.full(self.size, -1, dtype=np.int64)
        uuid = np.zeros(self.size, dtype=np.uint64)
        for v, vs in streams.items():
            m = vs.decoded.marker
            if m is not None:
                carry_s[v], carry_e[v] = m
            uuid[v] = vs.decoded.vbuuid
        for j in range(nc):
            v = int(c_vb[j])
            vs = streams.get(v)
            if vs is None:
                continue
            tr = vs.decoded
            s = int(last[j])
            if s:
                tr.item(s)
                steps.append((ITEM, v, s))
            p = int(c_starts[j])
            data = datas[int(c_sid[j])]
            op = int(c_op[j])
            msg = reason = None
            fields = marker_fields(data, p) if op == 0x56 else None  # each checks its opcode too
            if fields is not None:
                start, end, purge = fields
                if purge:
                    tr.purge_seqno = purge
            elif op == 0x55:
                reason = stream_end_reason(data, p)
            if fields is None and reason is None:
                blen_c = int.from_bytes(data[p + 8:p + 12], "big")
                msg = decode_dcp(decode_all(data[p:p + 24 + blen_c])[0])
                if type(msg) is DcpSnapshotMarker:
                    start, end = msg.start_seqno, msg.end_seqno
                    if msg.purge_seqno:
                        tr.purge_seqno = msg.purge_seqno
                elif type(msg) is DcpStreamEnd:
                    reason = msg.reason
            if op == 0x56:
                tr.snapshot(start, end)
                steps.append((SNAPSHOT, v, (start, end)))
                mk_vb.append(v)
                mk_idx.append(int(cidx[j]))
                mk_s.append(start)
                mk_e.append(end)
            elif reason is not None:
                ev = feed.stream_end(v, reason, steps)
                if ev is not None:
                    events.append(ev)
            elif type(msg) is DcpSeqnoAdvanced:
                tr.seqno_advanced(msg.by_seqno)
                steps.append((ADVANCED, v, msg.by_seqno))
            elif type(msg) is DcpSystemEvent:
                tr.item(msg.by_seqno)
                steps.append((ITEM, v, msg.by_seqno))
        for v in np.flatnonzero(last[nc:]):
            v = int(v)
            vs = streams.get(v)
            if vs is not None:
                s = int(last[nc + v])
                vs.decoded.item(s)
                steps.append((ITEM, v, s))
        if not n:
            return None

        # -- keys (collection prefix stripped), values ----------------------------------------------
        kstart = rs + 24 + ext
        vstart = kstart + klen
        vlen = blen - ext - klen
        cid = np.zeros(n, dtype=np.int64)
        rcoll = coll[ridx]
        if rcoll.any():
            b0 = _gather_all(u8s, rsid, kstart, 1)[:, 0].astype(np.int64)
            multi = rcoll & (b0 >= 0x80)
            cid = np.where(rcoll, b0, 0)
            used = rcoll.astype(np.int64)
            for i in np.flatnonzero(multi):
                cid[i], used[i] = decode_leb128(datas[int(rsid[i])], int(kstart[i]))
            kstart = kstart + used
            klen = klen - used
            if (klen <= 0).any():
                raise ProtocolError("a DCP key holds only its collection-id prefix (Collections.md)")

        # -- which rows to keep ---------------------------------------------------------------------
        if self.end is not None:
            keep = seq_u <= self.end[vb]
            if not keep.all():
                sel = np.flatnonzero(keep)
                if not len(sel):
                    return None
                mat, vb, seq_u, rops, is_mut, rsid = mat[sel], vb[sel], seq_u[sel], rops[sel], is_mut[sel], rsid[sel]
                kstart, klen, vstart, vlen, cid, ridx = (kstart[sel], klen[sel], vstart[sel], vlen[sel], cid[sel],
                                                         ridx[sel])
                n = len(sel)

        # -- snapshot of each row: the last marker of its vbucket before it, else the carried one ---
        seq_i = seq_u.view(np.int64)
        snap_s = carry_s[vb]
        snap_e = carry_e[vb]
        if mk_vb:
            mvb = np.asarray(mk_vb, dtype=np.int64)
            mkey = (mvb << 32) | np.asarray(mk_idx, dtype=np.int64)
            morder = np.argsort(mkey, kind="stable")
            mkey_sorted = mkey[morder]
            pos = np.searchsorted(mkey_sorted, (vb << 32) | ridx, side="right") - 1
            posc = np.maximum(pos, 0)
            hit = (pos >= 0) & (mvb[morder][posc] == vb)
            snap_s = np.where(hit, np.asarray(mk_s, dtype=np.uint64).view(np.int64)[morder][posc], snap_s)
            snap_e = np.where(hit, np.asarray(mk_e, dtype=np.uint64).view(np.int64)[morder][posc], snap_e)
        nosnap = snap_s < 0
        if nosnap.any():
            snap_s = np.where(nosnap, seq_i, snap_s)
            snap_e = np.where(nosnap, seq_i, snap_e)

        bufs = [pa.py_buffer(d) for d in datas]
        u32a = _be(mat, 40, 44, ">u4").astype(np.int64)
        u32b = _be(mat, 44, 48, ">u4").astype(np.int64)
        ext_r = mat[:, 4]
        zero = np.zeros(n, dtype=np.int64)
        columns = [
            _numeric(vb.astype(np.int32)),
            _numeric(seq_i),
            _numeric(uuid[vb].view(np.int64)),
            binary_column(bufs, u8s, rsid, kstart, klen),
            binary_column(bufs, u8s, rsid, vstart, np.where(is_mut, vlen, 0), is_mut),
            _EVENTS.take(_numeric((rops - 0x57).astype(np.int8))),
            _numeric(_u64_as_i64(mat, 16)),
            _numeric(_u64_as_i64(mat, 32)),
            _numeric(np.where(is_mut, u32a, zero)),
            _numeric(np.where(is_mut, u32b, zero)),
            _numeric(mat[:, 5].astype(np.int32)),
            _numeric(snap_s),
            _numeric(snap_e),
            _numeric(cid),
            _numeric(np.where(~is_mut & (ext_r != 18), u32a, zero)),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=SCHEMA)
