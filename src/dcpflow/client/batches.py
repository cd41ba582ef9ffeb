"""Stream bytes -> Arrow RecordBatches, without a Python object per row or per field.

The connection already found the frame boundaries (connection.py); here the frames of several
segments are decoded together with numpy, each frame addressed as (segment, offset) - the
segments are never joined into one buffer (that copy cost about 0.3 s per million 500-byte
documents):

* one gather (protocol.columns) copies the first bytes of every frame - the header and the fixed
  extras of a document: by_seqno, rev_seqno, then flags/expiry of a mutation or the delete time
  of a deletion V2 / expiration - into one matrix, and each numeric column is a big-endian view of
  a slice of it, where the protocol's DOCUMENT_LAYOUTS (the codec's own structs) put the field;
* keys and values become an Arrow binary_view array whose data buffers are the received segments
  (the 16-byte views, with buffer index and offset, are built with numpy), which Arrow casts to
  plain `binary` in C++;
* the few other frames (snapshot markers, stream ends, seqno-advanced, system events) are walked
  in Python in order, read by the protocol (in place for a marker or stream end in the shape
  producers send, else decode_dcp); each row's snapshot is the last marker of its vbucket before it, found with
  `searchsorted`, and the trackers see, between two such frames, only the last seqno of each
  vbucket (seqnos rise within a vbucket, so the rest cannot change an offset).

`uint64` fields (cas, vbuuid) are stored as the int64 with the same bits: `value & (2**64 - 1)`
(or numpy `.view(np.uint64)`) gives the unsigned number back.
"""

from typing import NamedTuple

import numpy as np
import pyarrow as pa

from dcpflow.protocol.columns import concat_compiled as _concat_c
from dcpflow.protocol.columns import field_column, gather
from dcpflow.protocol.dcp import (
    DOCUMENT_LAYOUTS,
    DcpAbort,
    DcpCommit,
    DcpPrepare,
    DcpSeqnoAdvanced,
    DcpSnapshotMarker,
    DcpStreamEnd,
    DcpSystemEvent,
    decode_dcp,
    marker_fields,
    stream_end_reason,
    sync_seqno,
)
from dcpflow.protocol.errors import ProtocolError
from dcpflow.protocol.frame import HEADER_FIELDS, HEADER_LEN, Field, decode_all
from dcpflow.protocol.keys import decode_leb128
from dcpflow.protocol.opcodes import Opcode

from .events import system_event
from .streams import ADVANCED, ITEM, MANIFEST, SNAPSHOT, Feed

SCHEMA = pa.schema([
    pa.field("vbucket", pa.int32(), nullable=False),
    pa.field("seqno", pa.int64(), nullable=False),
    pa.field("vbuuid", pa.int64(), nullable=False),
    pa.field("key", pa.binary(), nullable=False),
    pa.field("value", pa.binary()),  # null for deletions and expirations
    pa.field("event", pa.string(), nullable=False),  # mutation | deletion | expiration (| prepare | commit | abort)
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

# -- where the fields are: the protocol's layouts of the document messages ---------------------------
#: The row each document message makes, by its `event` (the index into _EVENTS).
_EVENT_OPCODES = {Opcode.DCP_MUTATION: "mutation", Opcode.DCP_DELETION: "deletion",
                  Opcode.DCP_EXPIRATION: "expiration"}
_NAMES = [name.encode() for name in _EVENT_OPCODES.values()]
_EVENTS = pa.Array.from_buffers(pa.string(), len(_NAMES), [
    None, pa.py_buffer(np.cumsum([0] + [len(n) for n in _NAMES], dtype=np.int32)), pa.py_buffer(b"".join(_NAMES))])
_ROW_OPCODES = [int(op) for op in _EVENT_OPCODES]
_MUTATION = int(Opcode.DCP_MUTATION)
_SNAPSHOT_MARKER = int(Opcode.DCP_SNAPSHOT_MARKER)
_STREAM_END = int(Opcode.DCP_STREAM_END)
#: opcode << 8 | extras length -> the row's kind: its event, plus _WITH_DELETE_TIME when the layout
#: has a delete time; -1 where the protocol defines no document layout. One table lookup per row
#: answers all three questions.
_ROW_KIND = np.full(1 << 16, -1, dtype=np.int8)
_EVENT_MASK, _WITH_DELETE_TIME = 3, 4  # (room for four events)
for (_op, _ext), _fields in DOCUMENT_LAYOUTS.items():
    _ROW_KIND[_op << 8 | _ext] = _ROW_OPCODES.index(_op) | (_WITH_DELETE_TIME if "delete_time" in _fields else 0)


def _shared(name: str) -> Field:
    """The field `name` of every document layout that has it: in one place in all of them, which
    is what lets one column read it for every row."""
    where = {fields[name] for fields in DOCUMENT_LAYOUTS.values() if name in fields}
    if len(where) != 1:
        raise RuntimeError(f"the document messages keep {name!r} in {len(where)} places: the batch decoder "
                          f"reads it in one")
    return where.pop()


# The connection hands over request frames in classic framing only (magic 0x80: walk_stream takes
# no other), so every frame here has HEADER_FIELDS' layout.
_OPCODE, _KEY_LENGTH, _EXTRAS_LENGTH, _DATATYPE, _VBUCKET, _BODY_LENGTH, _CAS = (HEADER_FIELDS[n] for n in (
    "opcode", "key_length", "extras_length", "datatype", "vbucket_or_status", "body_length", "cas"))
_BY_SEQNO, _REV_SEQNO, _FLAGS, _EXPIRY, _DELETE_TIME = (_shared(n) for n in (
    "by_seqno", "rev_seqno", "flags", "expiration", "delete_time"))
#: The bytes gathered of every frame: the header and the fixed extras of a document.
_WIDTH = max(f.stop for f in (_OPCODE, _KEY_LENGTH, _EXTRAS_LENGTH, _DATATYPE, _VBUCKET, _BODY_LENGTH, _CAS, _BY_SEQNO,
                              _REV_SEQNO, _FLAGS, _EXPIRY, _DELETE_TIME))
_AR12 = np.arange(12, dtype=np.int64)
_ARROW_TYPES = {np.dtype(np.int8): pa.int8(), np.dtype(np.int32): pa.int32(), np.dtype(np.int64): pa.int64()}


def _numeric(arr: np.ndarray) -> pa.Array:
    """A numpy column as an Arrow array, zero-copy. `pa.array(ndarray)` would also work, but it
    first asks whether the object is a pandas one, which imports pandas (tens of megabytes of
    memory) into a client that never uses it."""
    arr = np.ascontiguousarray(arr)
    return pa.Array.from_buffers(_ARROW_TYPES[arr.dtype], len(arr), [None, pa.py_buffer(arr)])


def _u64_as_i64(mat: np.ndarray, field: Field) -> np.ndarray:
    return field_column(mat, field).astype(np.uint64).view(np.int64)


_I32_MAX = 2**31 - 1


def binary_column(bufs: list[pa.Buffer], u8s: list[np.ndarray], sid: np.ndarray, starts: np.ndarray,
                  lengths: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    """A `binary` array of the byte ranges [starts, starts + lengths) of buffers sid (null where
    `valid` is False).

    Compiled: offsets from a cumulative sum and the data copied once by `concat`. Otherwise built
    as binary_view (Arrow's "German string" layout: 16-byte views, data of up to 12 bytes inline,
    longer data as prefix + buffer index + offset) over the received segments themselves, which
    Arrow casts to plain binary in C++ - a second copy of the data, and per-row work in the cast."""
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
    head = gather(u8s, sid, starts, 12)  # first 12 bytes of each (copied)
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

    def __init__(self, feed: Feed, end_filter: dict[int, int] | None = None, names=None,
                 system_events: list | None = None):
        self.feed = feed
        self.names = names
        self.system_events = system_events  # where typed SystemEvents go (None: not kept)
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
        fr = _gather_frames(segments)
        ops = fr.hdr[:, _OPCODE.offset]
        is_row = ops == _ROW_OPCODES[0]
        for op in _ROW_OPCODES[1:]:
            is_row |= ops == op
        rows = self._rows(fr, np.flatnonzero(is_row))
        cidx = np.flatnonzero(~is_row)
        c_hdr = fr.hdr[cidx]
        c_vb = field_column(c_hdr, _VBUCKET).astype(np.int64)
        last = self._last_seqnos(rows, cidx, c_vb)
        ctl = self._walk_others(fr, cidx, c_hdr, c_vb, last, steps, events)
        if not rows.n:
            return self._sync_batch(ctl.sync_rows, ctl.uuid) if ctl.sync_rows else None
        rows.strip_collections(fr)
        if self.end is not None:
            keep = rows.seq <= self.end[rows.vb]
            if not keep.all():
                if not keep.any():
                    return self._sync_batch(ctl.sync_rows, ctl.uuid) if ctl.sync_rows else None
                rows.select(np.flatnonzero(keep))
        batch = pa.RecordBatch.from_arrays(_columns(fr, rows, ctl), schema=SCHEMA)
        if not ctl.sync_rows:
            return batch
        # the sync-write rows go where their frames were, among the documents
        both = pa.Table.from_batches([batch, self._sync_batch(ctl.sync_rows, ctl.uuid)])
        order = np.argsort(np.concatenate([rows.idx, np.asarray([r[0] for r in ctl.sync_rows], dtype=np.int64)]),
                           kind="stable")
        return both.take(_numeric(order)).combine_chunks().to_batches()[0]

    def _rows(self, fr: "_Frames", ridx: np.ndarray) -> "_Rows":
        """The document frames' fixed fields, checked: a layout the protocol defines, a key, and a
        vbucket this read asked for."""
        mat = fr.hdr[ridx]
        rows = _Rows(ridx, fr.sid[ridx], mat)
        klen = field_column(mat, _KEY_LENGTH).astype(np.int64)
        ext = field_column(mat, _EXTRAS_LENGTH).astype(np.int64)
        blen = field_column(mat, _BODY_LENGTH).astype(np.int64)
        rops = fr.hdr[ridx, _OPCODE.offset]
        vb = rows.vb = field_column(mat, _VBUCKET).astype(np.int64)
        rows.seq = field_column(mat, _BY_SEQNO).astype(np.uint64)
        rows.is_mut = rops == _MUTATION
        rows.kind = _ROW_KIND.take((rops.astype(np.int64) << 8) | ext)
        ok = rows.kind >= 0
        ok &= (klen > 0) & (ext + klen <= blen)
        if rows.n and not ok.all():
            bad = int(np.flatnonzero(~ok)[0])
            raise ProtocolError(f"malformed DCP opcode 0x{int(rops[bad]):02x} for vbucket {int(vb[bad])}: extras "
                                f"{int(ext[bad])}, key {int(klen[bad])}, body {int(blen[bad])} bytes "
                                f"(mutation.md / deletion.md / expiration.md)")
        if rows.n and int(vb.max()) >= self.size:
            raise ProtocolError(f"DCP message for vbucket {int(vb.max())}, which this read did not request")
        rows.kstart = fr.starts[ridx] + HEADER_LEN + ext
        rows.klen = klen
        rows.vstart = rows.kstart + klen
        rows.vlen = blen - ext - klen
        rows.cid = np.zeros(rows.n, dtype=np.int64)
        return rows

    def _last_seqnos(self, rows: "_Rows", cidx: np.ndarray, c_vb: np.ndarray) -> np.ndarray:
        """The last document seqno of each group: the rows of a vbucket before its next other frame
        (indexed by that frame's position among the others), or after its last (nc + vbucket). The
        trackers need no more: seqnos rise within a vbucket."""
        nc, n, vb = len(cidx), rows.n, rows.vb
        ckey = (c_vb << 32) | cidx
        corder = np.argsort(ckey, kind="stable")
        ckey_sorted = ckey[corder]
        nxt = np.searchsorted(ckey_sorted, (vb << 32) | rows.idx)
        has_next = nxt < nc
        nxt_c = np.minimum(nxt, max(nc - 1, 0))
        same = has_next & (c_vb[corder[nxt_c]] == vb) if nc else np.zeros(n, dtype=bool)
        group = np.where(same, corder[nxt_c] if nc else 0, nc + vb)
        last = np.zeros(nc + self.size, dtype=np.uint64)
        if n:
            np.maximum.at(last, group, rows.seq)
        return last

    def _walk_others(self, fr: "_Frames", cidx: np.ndarray, c_hdr: np.ndarray, c_vb: np.ndarray, last: np.ndarray,
                     steps: list, events: list) -> "_Others":
        """The frames that are not document rows, in order, with the decoded trackers in step: the
        rows' last seqnos before each, markers (the snapshots of the rows), stream ends, and the
        few messages decoded whole."""
        feed = self.feed
        streams = feed.streams
        ctl = _Others(self.size, streams)
        c_starts = fr.starts[cidx]
        c_sid = fr.sid[cidx]
        c_end = c_starts + HEADER_LEN + field_column(c_hdr, _BODY_LENGTH).astype(np.int64)
        c_op = c_hdr[:, _OPCODE.offset]
        datas = fr.datas
        nc = len(cidx)
        current, mk_vb, mk_idx, mk_s, mk_e = ctl.current, ctl.mk_vb, ctl.mk_idx, ctl.mk_s, ctl.mk_e
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
            fields = marker_fields(data, p) if op == _SNAPSHOT_MARKER else None  # each checks its opcode too
            if fields is not None:
                start, end, purge = fields
                if purge:
                    tr.purge_seqno = purge
            elif op == _STREAM_END:
                reason = stream_end_reason(data, p)
            if fields is None and reason is None:
                msg = decode_dcp(decode_all(data[p:int(c_end[j])])[0])
                if type(msg) is DcpSnapshotMarker:
                    start, end = msg.start_seqno, msg.end_seqno
                    if msg.purge_seqno:
                        tr.purge_seqno = msg.purge_seqno
                elif type(msg) is DcpStreamEnd:
                    reason = msg.reason
            if op == _SNAPSHOT_MARKER:
                tr.snapshot(start, end)
                steps.append((SNAPSHOT, v, (start, end)))
                current[v] = (start, end)
                mk_vb.append(v)
                mk_idx.append(int(cidx[j]))
                mk_s.append(start)
                mk_e.append(end)
            elif reason is not None:
                ev = feed.stream_end(v, reason, steps)
                if ev is not None:
                    events.append(ev)
            else:
                self._decoded(ctl, tr, v, msg, int(cidx[j]), bool(fr.coll[cidx[j]]), steps)
        for v in np.flatnonzero(last[nc:]):
            v = int(v)
            vs = streams.get(v)
            if vs is not None:
                s = int(last[nc + v])
                vs.decoded.item(s)
                steps.append((ITEM, v, s))
        return ctl

    def _decoded(self, ctl: "_Others", tr, v: int, msg, index: int, collections: bool, steps: list) -> None:
        """A SEQNO_ADVANCED, a sync write (only to a read with sync_writes: the server sends none
        otherwise) or a system event, decoded whole."""
        if type(msg) is DcpSeqnoAdvanced:
            tr.seqno_advanced(msg.by_seqno)
            steps.append((ADVANCED, v, msg.by_seqno))
        elif type(msg) in _SYNC_MESSAGES:
            seqno = sync_seqno(msg)
            if self.end is None or seqno <= int(self.end[v]):
                sync_rows = ctl.sync_rows
                sync_rows.append((index, v, msg, ctl.snapshot_of(v, seqno), collections))
            tr.item(seqno)
            steps.append((ITEM, v, seqno))
        elif type(msg) is DcpSystemEvent:
            ev = system_event(v, msg.by_seqno, msg.event, msg.version, msg.key, msg.value, tr.vbuuid, self.names)
            if ev.manifest_uid is not None:
                tr.saw_manifest(ev.manifest_uid)
                steps.append((MANIFEST, v, ev.manifest_uid))
            if self.system_events is not None and (self.end is None or msg.by_seqno <= int(self.end[v])):
                self.system_events.append(ev)
            tr.item(msg.by_seqno)
            steps.append((ITEM, v, msg.by_seqno))

    @staticmethod
    def _sync_batch(rows: list, uuid: np.ndarray) -> pa.RecordBatch:
        """Rows of DCP_PREPARE (its value, null for a durable delete, and metadata), DCP_COMMIT and
        DCP_ABORT (key and seqno: each completes the latest prepare of its key, the only one a key
        can have open). Few per batch, so built in Python."""
        cols: dict[str, list] = {f.name: [] for f in SCHEMA}
        for _, v, msg, (snap_s, snap_e), collections in rows:
            key, cid = msg.key, 0
            if collections:
                cid, used = decode_leb128(key, 0)
                key = key[used:]
            prepare = type(msg) is DcpPrepare
            cols["vbucket"].append(v)
            cols["seqno"].append(sync_seqno(msg))
            cols["vbuuid"].append(int(uuid[v].view(np.int64)))
            cols["key"].append(key)
            cols["value"].append(None if not prepare or msg.deleted else msg.value)
            cols["event"].append(_SYNC_EVENTS[type(msg)])
            cols["cas"].append(as_int64(msg.cas) if prepare else 0)
            cols["rev_seqno"].append(as_int64(msg.rev_seqno) if prepare else 0)
            cols["flags"].append(msg.flags if prepare and not msg.deleted else 0)
            cols["expiry"].append(msg.expiration if prepare and not msg.deleted else 0)
            cols["datatype"].append(msg.datatype if prepare else 0)
            cols["snapshot_start"].append(as_int64(snap_s))
            cols["snapshot_end"].append(as_int64(snap_e))
            cols["collection_id"].append(cid)
            cols["delete_time"].append(0)
        return pa.RecordBatch.from_pydict(cols, schema=SCHEMA)


def as_int64(u: int) -> int:
    """A u64 as the int64 with the same bits (how SCHEMA stores cas, vbuuid and seqnos)."""
    return u - (1 << 64) if u >= 1 << 63 else u


_SYNC_EVENTS = {DcpPrepare: "prepare", DcpCommit: "commit", DcpAbort: "abort"}
_SYNC_MESSAGES = tuple(_SYNC_EVENTS)


class _Frames(NamedTuple):
    """Every frame of one decode, in order: each is (segment `sid`, local start), never copied into
    one buffer; `hdr` holds each frame's header and first extras (one gather)."""

    datas: list
    u8s: list
    starts: np.ndarray
    sid: np.ndarray
    coll: np.ndarray  # the frame's connection negotiated collections (its keys carry a collection id)
    hdr: np.ndarray


def _gather_frames(segments) -> _Frames:
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
    return _Frames(datas, u8s, starts, sid, coll, gather(u8s, sid, starts, _WIDTH))


class _Rows:
    """The document frames of one decode, column by column: `idx` is each row's frame index,
    `mat` its gathered header and extras, the rest what the columns are made of."""

    __slots__ = ("idx", "sid", "mat", "vb", "seq", "kind", "is_mut", "kstart", "klen", "vstart", "vlen", "cid")
    _COLUMNS = __slots__

    def __init__(self, idx: np.ndarray, sid: np.ndarray, mat: np.ndarray):
        self.idx, self.sid, self.mat = idx, sid, mat

    @property
    def n(self) -> int:
        return len(self.idx)

    def select(self, sel: np.ndarray) -> None:
        """Keep the rows `sel` (the end filter)."""
        for name in self._COLUMNS:
            setattr(self, name, getattr(self, name)[sel])

    def strip_collections(self, fr: _Frames) -> None:
        """Rows from a connection with collections: the key's LEB128 collection id becomes `cid`."""
        rcoll = fr.coll[self.idx]
        if not rcoll.any():
            return
        kstart = self.kstart
        b0 = gather(fr.u8s, self.sid, kstart, 1)[:, 0].astype(np.int64)
        multi = rcoll & (b0 >= 0x80)
        cid = np.where(rcoll, b0, 0)
        used = rcoll.astype(np.int64)
        for i in np.flatnonzero(multi):
            cid[i], used[i] = decode_leb128(fr.datas[int(self.sid[i])], int(kstart[i]))
        self.cid = cid
        self.kstart = kstart + used
        self.klen = self.klen - used
        if (self.klen <= 0).any():
            raise ProtocolError("a DCP key holds only its collection-id prefix (Collections.md)")


class _Others:
    """What the walk over the other frames leaves for the columns: each vbucket's snapshot from
    before this decode (`carry_*`, -1: none) and vbuuid, the markers met (vbucket, frame index,
    start, end), and the sync-write rows."""

    __slots__ = ("carry_s", "carry_e", "uuid", "mk_vb", "mk_idx", "mk_s", "mk_e", "current", "sync_rows")

    def __init__(self, size: int, streams: dict):
        self.carry_s = np.full(size, -1, dtype=np.int64)
        self.carry_e = np.full(size, -1, dtype=np.int64)
        self.uuid = np.zeros(size, dtype=np.uint64)
        for v, vs in streams.items():
            m = vs.decoded.marker
            if m is not None:
                self.carry_s[v], self.carry_e[v] = m
            self.uuid[v] = vs.decoded.vbuuid
        self.mk_vb, self.mk_idx, self.mk_s, self.mk_e = [], [], [], []
        self.current: dict[int, tuple[int, int]] = {}  # vbucket -> its last marker so far in this decode
        self.sync_rows: list = []  # (frame index, vbucket, message, snapshot, collections)

    def snapshot_of(self, v: int, seqno: int) -> tuple[int, int]:
        """The snapshot a sync write at `seqno` belongs to: the vbucket's last marker so far."""
        snap = self.current.get(v)
        if snap is not None:
            return snap
        return (int(self.carry_s[v]), int(self.carry_e[v])) if self.carry_s[v] >= 0 else (seqno, seqno)

    def snapshots(self, vb: np.ndarray, ridx: np.ndarray, seq_i: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each row's snapshot: the last marker of its vbucket before it, else the carried one,
        else the row's own seqno."""
        snap_s = self.carry_s[vb]
        snap_e = self.carry_e[vb]
        if self.mk_vb:
            mvb = np.asarray(self.mk_vb, dtype=np.int64)
            mkey = (mvb << 32) | np.asarray(self.mk_idx, dtype=np.int64)
            morder = np.argsort(mkey, kind="stable")
            mkey_sorted = mkey[morder]
            pos = np.searchsorted(mkey_sorted, (vb << 32) | ridx, side="right") - 1
            posc = np.maximum(pos, 0)
            hit = (pos >= 0) & (mvb[morder][posc] == vb)
            snap_s = np.where(hit, np.asarray(self.mk_s, dtype=np.uint64).view(np.int64)[morder][posc], snap_s)
            snap_e = np.where(hit, np.asarray(self.mk_e, dtype=np.uint64).view(np.int64)[morder][posc], snap_e)
        nosnap = snap_s < 0
        if nosnap.any():
            snap_s = np.where(nosnap, seq_i, snap_s)
            snap_e = np.where(nosnap, seq_i, snap_e)
        return snap_s, snap_e


def _columns(fr: _Frames, rows: _Rows, ctl: _Others) -> list[pa.Array]:
    """SCHEMA's columns of the rows."""
    mat, vb, kind, is_mut, n = rows.mat, rows.vb, rows.kind, rows.is_mut, rows.n
    seq_i = rows.seq.view(np.int64)
    snap_s, snap_e = ctl.snapshots(vb, rows.idx, seq_i)
    bufs = [pa.py_buffer(d) for d in fr.datas]
    flags = field_column(mat, _FLAGS).astype(np.int64)
    delete_time = flags if _DELETE_TIME == _FLAGS else field_column(mat, _DELETE_TIME).astype(np.int64)
    expiry = field_column(mat, _EXPIRY).astype(np.int64)
    zero = np.zeros(n, dtype=np.int64)
    return [
        _numeric(vb.astype(np.int32)),
        _numeric(seq_i),
        _numeric(ctl.uuid[vb].view(np.int64)),
        binary_column(bufs, fr.u8s, rows.sid, rows.kstart, rows.klen),
        binary_column(bufs, fr.u8s, rows.sid, rows.vstart, np.where(is_mut, rows.vlen, 0), is_mut),
        _EVENTS.take(_numeric(kind & _EVENT_MASK)),
        _numeric(_u64_as_i64(mat, _CAS)),
        _numeric(_u64_as_i64(mat, _REV_SEQNO)),
        _numeric(np.where(is_mut, flags, zero)),
        _numeric(np.where(is_mut, expiry, zero)),
        _numeric(field_column(mat, _DATATYPE).astype(np.int32)),
        _numeric(snap_s),
        _numeric(snap_e),
        _numeric(rows.cid),
        _numeric(np.where((kind & _WITH_DELETE_TIME) != 0, delete_time, zero)),
    ]
