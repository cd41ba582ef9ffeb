"""How a producer stream turns items into messages in its ready queue (ActiveStream's encoding half).

Pages (https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/commands/):
mutation.md, deletion.md, expiration.md, snapshot-marker.md, system_event.md, seqno-advanced.md,
prepare.md, commit.md, abort.md, stream-end.md. The rules - markers' starts and ends, value shapes
per IncludeXattrs / NoValue, the filter, sync writes - are in active_stream.py's docstring; this
mixin holds the code that encodes them, over the stream's own fields (`opts`, `filter`, `ready`,
`ready_bytes`, `last_sent_seqno`...), so that ActiveStream keeps the life cycle.
"""


from dcpflow.engine.collections import SYSTEM_CID, SystemEvent
from dcpflow.engine.durability.items import Abort, Commit, Prepare
from dcpflow.engine.item import DATATYPE_SNAPPY, DATATYPE_XATTR, Item
from dcpflow.engine.store import LARGE_VALUE
from dcpflow.protocol import snappy
from dcpflow.protocol.datatype import xattr_body_offset
from dcpflow.protocol.dcp import (
    DcpAbort,
    DcpCommit,
    DcpDeletion,
    DcpExpiration,
    DcpMutation,
    DcpPrepare,
    DcpSeqnoAdvanced,
    DcpSnapshotMarker,
    DcpSystemEvent,
    MarkerVersion,
    SystemEventId,
    encode_mutations,
    pack_deletion,
    pack_mutation_head,
    pack_mutation_head_sid,
)
from dcpflow.protocol.keys import encode_leb128
from dcpflow.protocol.system_events import event_body

from .stream_types import ACK, DISK, Frames, StreamState


class _KeyPrefixes(dict):
    """What a key starts with on a connection with HELLO Collections: its collection id in LEB128,
    by id, made on first use (a stream looks one up per document)."""

    def __missing__(self, cid: int) -> bytes:
        prefix = self[cid] = encode_leb128(cid)
        return prefix



class StreamMessages:
    """The encoding half of ActiveStream (see the module docstring)."""

    def _push(self, data: bytes) -> None:
        self.ready.append(data)
        self.ready_bytes += len(data)

    def pop(self) -> bytes | memoryview | None:
        """The next entry to send (a message, or a message's header followed by a `memoryview`
        continuation holding its value), or None."""
        if not self.ready:
            return None
        data = self.ready.popleft()
        self.ready_bytes -= len(data)
        return data.data if data.__class__ is Frames else data

    def _marker(self, start: int, end: int, flags: int, purge_seqno: int, mvs: int | None = None,
                hcs: int = 0) -> None:
        """`mvs`: the snapshot's max visible seqno when not its end; `hcs`: its high completed
        seqno, which a V2.0 marker carries on Disk snapshots only (snapshot-marker.md)."""
        if self._first_marker:
            start = min(self.snap_start_seqno, start)
            self._first_marker = False
        if end > self.end_seqno:
            end = self.end_seqno
        if self.state is StreamState.TAKEOVER_SEND:
            flags |= ACK
            self.acks_outstanding += 1
        self._marker_end = end
        opts = self.opts
        mvs = end if mvs is None else min(mvs, end)
        if not flags & DISK:
            hcs = 0
        if opts.marker_v22 and flags & DISK:
            msg = DcpSnapshotMarker(self.vbid, start, end, flags, MarkerVersion.V2_2, mvs, hcs, purge_seqno, 0,
                                    self.opaque, self.stream_id)
        elif opts.sync_replication:
            msg = DcpSnapshotMarker(self.vbid, start, end, flags, MarkerVersion.V2_0, mvs, hcs, 0, 0,
                                    self.opaque, self.stream_id)
        else:
            msg = DcpSnapshotMarker(self.vbid, start, end, flags, MarkerVersion.V1, opaque=self.opaque,
                                    stream_id=self.stream_id)
        self._push(msg.encode())

    def _shape_value(self, item: Item) -> tuple[bytes, int]:
        """The value and datatype to ship, per IncludeXattrs / NoValue / NoValueWithUnderlyingDatatype."""
        value, datatype = item.value, item.datatype
        opts = self.opts
        if datatype & DATATYPE_XATTR and not datatype & DATATYPE_SNAPPY:
            xlen = xattr_body_offset(value)
            if not opts.include_xattrs:
                value, datatype = value[xlen:], datatype & ~DATATYPE_XATTR
                xattrs = b""
            else:
                xattrs = value[:xlen]
        else:
            xattrs = b""
        if opts.no_value or opts.no_value_underlying_datatype or item.deleted:
            sent_type = DATATYPE_XATTR if xattrs else 0
            if opts.no_value_underlying_datatype and not item.deleted:
                sent_type = item.datatype & ~DATATYPE_SNAPPY
                if not opts.include_xattrs:
                    sent_type &= ~DATATYPE_XATTR
            return xattrs, sent_type
        return value, datatype

    def _queue_item(self, item: Item) -> None:
        """Encode one item. The common shapes (a mutation, a deletion without stream-id) go through
        the protocol's packers - the same bytes as `DcpMutation(...).encode()` /
        `DcpDeletion(...).encode()` (tested) with no message object per item; everything else
        through the message classes."""
        opts = self.opts
        key = item.key
        if opts.collections:
            key = self._prefixes[item.cid] + key
        deleted, datatype = item.deleted, item.datatype
        if deleted and (not datatype & DATATYPE_XATTR or datatype & DATATYPE_SNAPPY):
            value, datatype = b"", 0  # what _shape_value gives a deletion without readable xattrs
        elif datatype & DATATYPE_XATTR or opts.no_value or opts.no_value_underlying_datatype or deleted:
            value, datatype = self._shape_value(item)
        else:
            value = item.value
        if opts.compress_values and value:
            value, datatype = snappy.compress(value), datatype | DATATYPE_SNAPPY
        seqno = item.by_seqno
        sid = self.stream_id
        if not deleted:
            if sid is None or len(key) < 256:  # the alternative framing has one byte of key length
                vlen = len(value)
                if sid is None:
                    data = pack_mutation_head(self.vbid, seqno, item.rev_seqno, item.flags, item.expiry, key, vlen,
                                              item.cas, datatype, self.opaque)
                else:
                    data = pack_mutation_head_sid(self.vbid, seqno, item.rev_seqno, item.flags, item.expiry, key,
                                                  vlen, item.cas, datatype, self.opaque, sid)
                if vlen >= LARGE_VALUE:
                    # the value goes out as it is stored (no copy into the message): a continuation
                    ready = self.ready
                    ready.append(data)
                    ready.append(memoryview(value))
                    self.ready_bytes += len(data) + vlen
                    self.last_sent_seqno = seqno
                    self.items_sent += 1
                    return
                data += value
            else:
                data = DcpMutation(self.vbid, seqno, item.rev_seqno, item.flags, item.expiry, 0, key, value,
                                   item.cas, datatype, self.opaque, 0, sid).encode()
        elif item.is_expiration and opts.expiry_opcode and opts.delete_times:
            data = DcpExpiration(self.vbid, seqno, item.rev_seqno, key, item.delete_time, value, item.cas,
                                 datatype, self.opaque, sid).encode()
        elif sid is not None:
            data = DcpDeletion(self.vbid, seqno, item.rev_seqno, key, value, item.cas, datatype, self.opaque,
                               item.delete_time if opts.delete_times else None, sid).encode()
        else:
            data = pack_deletion(self.vbid, seqno, item.rev_seqno, key, value, item.cas, datatype, self.opaque,
                                 item.delete_time if opts.delete_times else None)
        self.ready.append(data)
        self.ready_bytes += len(data)
        self.last_sent_seqno = seqno
        self.items_sent += 1

    def _queue_one(self, item: Item) -> None:
        """An admitted item (`_admit`): a system event, a sync-write item, or a document (a commit
        is one for a stream without sync writes)."""
        if item.cid == SYSTEM_CID:
            self._queue_event(item)
        elif item.__class__ is not Item and self.opts.sync_writes:
            self._queue_sync_item(item)
        else:
            self._queue_item(item)

    def _queue_sync_item(self, item: Item) -> None:
        """DCP_PREPARE, DCP_COMMIT or DCP_ABORT (prepare.md, commit.md, abort.md)."""
        cls = item.__class__
        key = item.key
        if self.opts.collections:
            key = self._prefixes[item.cid] + key
        seqno = item.by_seqno
        if cls is Prepare:
            value, datatype = self._shape_value(item) if item.deleted or item.datatype & DATATYPE_XATTR else (
                item.value, item.datatype)
            msg = DcpPrepare(self.vbid, seqno, item.rev_seqno, item.flags, item.expiry, 0, key, value, item.cas,
                             item.level, item.deleted, datatype, self.opaque, 0, self.stream_id)
        elif cls is Commit:
            if not self._prepare_was_sent(item.prepared_seqno, seqno):
                self._queue_item(item)  # the consumer never got the prepare: send what it committed
                return
            msg = DcpCommit(self.vbid, item.prepared_seqno, seqno, key, self.opaque, self.stream_id)
        elif cls is Abort:
            msg = DcpAbort(self.vbid, item.prepared_seqno, seqno, key, self.opaque, self.stream_id)
        else:
            self._queue_item(item)
            return
        self._push(msg.encode())
        self.last_sent_seqno = seqno
        self.items_sent += 1

    def _prepare_was_sent(self, prepared_seqno: int, seqno: int) -> bool:
        """Did the consumer get the prepare a commit at `seqno` names? A backfill sends the prepares
        in flight when it was planned, so a prepare of its range completed before that, by a commit
        beyond the range (read from memory), was never sent: that commit goes out as the committed
        mutation or deletion (KV-Engine's backfill reads such prepares from disk; our store keeps
        only committed versions) - and an abort as an abort, which a consumer accepts without its
        prepare (VBucket.apply_abort). Such a completion precedes the plan, so a backfill's entry
        is dropped once the stream reads past the high seqno it was planned at."""
        backfilled = self._backfilled
        while backfilled and backfilled[0][3] < seqno:
            backfilled.pop(0)
        for start, end, sent, _ in backfilled:
            if start <= prepared_seqno <= end:
                return prepared_seqno in sent
        return True

    def _queue_event(self, item: Item) -> None:
        """DCP_SYSTEM_EVENT (system_event.md) in the layout the connection asked for."""
        ev = SystemEvent.of(item)
        c = ev.collection
        version, key, value = event_body(
            ev.event, flatbuffers=self.opts.flatbuffers_events, manifest_uid=ev.manifest_uid, scope_id=ev.scope_id,
            collection_id=c.uid if c else 0, name=c.name if c else ev.scope_name, max_ttl=c.max_ttl if c else 0,
            history=c.history if c else False)
        self._push(DcpSystemEvent(self.vbid, item.by_seqno, int(ev.event), version, key, value, self.opaque,
                                  self.stream_id).encode())
        self.last_sent_seqno = item.by_seqno
        self.items_sent += 1

    def _admit(self, items: list[Item]) -> list[Item]:
        """What the stream's filter sends of these items (filter.py), in order; the filter follows
        their system events. Stops after the event that leaves the filter empty."""
        flt = self.filter
        out = []
        for item in items:
            cid = item.cid
            if cid == SYSTEM_CID:
                ev = flt.event(item)
                if ev is not None and (ev.event != SystemEventId.MODIFY_COLLECTION or self.opts.flatbuffers_events):
                    out.append(item)
                if flt.empty:
                    self._emptied = True
                    break
            elif flt.allows(cid):
                out.append(item)
        return out

    def _queue_items(self, items: list[Item], sync: bool = False) -> None:
        """`_queue_one` for each admitted item, with runs of plain mutations encoded by the
        protocol's `encode_mutations` into one Frames entry (the in-memory hot loop: compiled when
        built, one bytes object per run, not per item)."""
        opts = self.opts
        if self.stream_id is not None or opts.no_value or opts.no_value_underlying_datatype or \
                opts.compress_values or sync:
            for item in items:
                self._queue_one(item)
            return
        vbid, opaque, collections = self.vbid, self.opaque, opts.collections
        i, n = 0, len(items)
        while i < n:
            data, stop = encode_mutations(items, i, vbid, opaque, collections, LARGE_VALUE)
            if stop > i:
                self.ready.append(Frames(data, stop - i))
                self.ready_bytes += len(data)
                self.items_sent += stop - i
                self.last_sent_seqno = items[stop - 1].by_seqno
            if stop < n:  # a deletion, xattrs, a large value, an event: the general path
                self._queue_one(items[stop])
                stop += 1
            i = stop

    def _seqno_advanced_if_needed(self) -> None:
        """A collection-aware consumer learns the snapshot end it did not see an item for."""
        if self.opts.collections and self.last_sent_seqno < self._marker_end and not self.dead:
            self._push(DcpSeqnoAdvanced(self.vbid, self._marker_end, self.opaque, self.stream_id).encode())
            self.last_sent_seqno = self._marker_end
