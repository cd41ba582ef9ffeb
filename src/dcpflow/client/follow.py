"""Following collection names through a drop and a create while a read runs.

A read filtered by collection names streams the ids those names had when it started (the server
filters by id: stream-request-value.md). When one of those collections is dropped and made again
under the same name, the new collection has a new id (ids are never reused: Collections.md), and
an id-filtered stream would never send it. So when a vbucket's stream delivers the drop of a
filtered collection, that vbucket's stream is *widened*: closed right after the drop event and
opened again from the drop's seqno filtered by the names' scope (or unfiltered, when the names
span scopes or the scope is gone), and the client picks the read's collections out of it by
name: the ids it started with, plus every collection created later under a filtered name, whose
create event the widened stream carries in seqno order. Nothing is lost or repeated: the old
stream's messages after the drop are discarded (the widened one sends them again), and a message
of another collection becomes a DCP_SEQNO_ADVANCED to its seqno, so offsets move exactly as the
server's own filter would move them (seqno-advanced.md).

`NameFollower.rewrite` applies this to a Segment before the read decodes it, so the event and
batch decoders see an ordinary filtered stream. Its cost falls on name-filtered reads only: a
vectorised look at each segment's opcodes and vbuckets, and a per-message pass over the
segments that hold a system event or a widened vbucket's messages. The look is numpy's when
numpy is installed (the `arrow` extra), and a plain Python one otherwise: the event API works with
the base dependencies.
"""

import array
import functools

from dcpflow.protocol.dcp import DOCUMENT_LAYOUTS, DcpSeqnoAdvanced, decode_dcp, sync_seqno
from dcpflow.protocol.frame import HEADER_FIELDS, HEADER_LEN, decode_all
from dcpflow.protocol.keys import decode_leb128
from dcpflow.protocol.opcodes import Opcode

from .connection import Segment
from .events import system_event

_OP = HEADER_FIELDS["opcode"].offset
_VB = HEADER_FIELDS["vbucket_or_status"].offset
_EXT = HEADER_FIELDS["extras_length"].offset
#: Where a document message keeps its seqno, by (opcode, extras length): the protocol's layouts.
_BY_SEQNO = {key: fields["by_seqno"] for key, fields in DOCUMENT_LAYOUTS.items()}
#: Messages about a document: their key starts with the collection id (LEB128). Those without a
#: layout above (a prepare, commit or abort) are decoded for their seqno.
_DOCUMENTS = frozenset({op for op, _ in DOCUMENT_LAYOUTS} |
                       {Opcode.DCP_PREPARE, Opcode.DCP_COMMIT, Opcode.DCP_ABORT})
_SAME = object()


@functools.cache
def _numpy():
    """numpy, or None without it (imported on the first name-filtered segment, not at start-up)."""
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def _decode(data, a: int, b: int):
    """The typed message of the frame data[a:b] (the few this module reads whole)."""
    return decode_dcp(decode_all(bytes(data[a:b]))[0])


class NameFollower:
    """The per-read state of following names: which vbuckets are widened, which are discarding
    the rest of a stream they are leaving, and the collection ids the names stand for."""

    def __init__(self, names: tuple[tuple[str, str], ...], cids, client_names):
        self.names = frozenset(names)  # (scope, collection) pairs of the filter
        self.accept: set[int] = set(cids)  # ids of the filter's names, ever (only grows)
        self.client_names = client_names  # manifest.Names: scope and collection names by id
        self.widened: set[int] = set()
        self.cutting: set[int] = set()  # vbuckets whose stream is discarded up to its STREAM_END
        self.on_drop = None  # Feed callback(vbucket): a filtered collection was dropped in it

    def widen(self, vbucket: int) -> None:
        self.widened.add(vbucket)

    def reset(self, vbucket: int) -> None:
        """The vbucket's stream is being opened again: what comes next belongs to the new one."""
        self.cutting.discard(vbucket)

    def rewrite(self, seg: Segment) -> Segment | None:
        """The segment as the read should decode it (itself when nothing changes), or None when
        none of its messages is left."""
        data, starts = seg.data, seg.starts
        ops, vbs = self._look(data, starts)
        if ops is None:
            return seg
        out = bytearray()
        out_starts = array.array("q")
        changed = False
        ends = list(starts[1:]) + [seg.end]
        for i, (a, b) in enumerate(zip(starts, ends, strict=True)):
            op, vb = int(ops[i]), int(vbs[i])
            keep = _SAME  # the message as it is; None: left out; bytes: in its place
            if vb in self.cutting:
                if op == Opcode.DCP_STREAM_END:
                    self.cutting.discard(vb)
                else:
                    keep = None
            elif op == Opcode.DCP_SYSTEM_EVENT:
                keep = self._system_event(data, a, b, vb)
            elif op in _DOCUMENTS and vb in self.widened:
                ext = data[a + _EXT]
                cid, _ = decode_leb128(data, a + HEADER_LEN + ext)
                if cid not in self.accept:
                    field = _BY_SEQNO.get((op, ext))
                    seqno = field.read(data, a) if field is not None else sync_seqno(_decode(data, a, b))
                    keep = DcpSeqnoAdvanced(vb, seqno).encode()
            if keep is _SAME:
                keep = data[a:b]
            else:
                changed = True
                if keep is None:
                    continue
            out_starts.append(len(out))
            out += keep
        if not changed:
            return seg
        if not out_starts:
            return None
        return Segment(seg.conn, out, out_starts, len(out), seg.charged)

    def _look(self, data, starts):
        """The opcodes and vbuckets of the segment's messages when one of them is a system event
        or belongs to a widened or cutting vbucket; (None, None) when none does."""
        special = self.widened | self.cutting
        np = _numpy()
        if np is not None:
            u8 = np.frombuffer(data, dtype=np.uint8)
            at = np.frombuffer(starts, dtype=np.int64)
            ops = u8[at + _OP]
            vbs = (u8[at + _VB].astype(np.int64) << 8) | u8[at + _VB + 1]
            look = ops == Opcode.DCP_SYSTEM_EVENT
            if special:
                look |= np.isin(vbs, np.fromiter(special, dtype=np.int64, count=len(special)))
            return (ops, vbs) if look.any() else (None, None)
        ops = [data[a + _OP] for a in starts]
        vbs = [data[a + _VB] << 8 | data[a + _VB + 1] for a in starts]
        if Opcode.DCP_SYSTEM_EVENT in ops or not special.isdisjoint(vbs):
            return ops, vbs
        return None, None

    def _system_event(self, data, a: int, b: int, vb: int):
        """A system event in vbucket `vb`: kept, replaced by a SEQNO_ADVANCED (a widened stream's
        event of another collection), and the drop of a filtered collection on a stream not yet
        widened starts the switch (its later messages are cut)."""
        msg = _decode(data, a, b)
        seqno = msg.by_seqno
        ev = system_event(vb, seqno, msg.event, msg.version, msg.key, msg.value, 0, self.client_names)
        cid = ev.collection_id
        if vb not in self.widened:
            if ev.kind == "collection_dropped" and cid in self.accept:
                self.widened.add(vb)
                self.cutting.add(vb)
                if self.on_drop is not None:
                    self.on_drop(vb)
            return _SAME
        if ev.kind == "collection_created" and (ev.scope, ev.collection) in self.names:
            self.accept.add(cid)
            return _SAME
        if cid is not None and cid in self.accept:
            return _SAME
        return DcpSeqnoAdvanced(vb, seqno).encode()
