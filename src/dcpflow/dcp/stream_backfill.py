"""A producer stream's backfill: the pages the server's backfill reads hand it (ActiveStream's disk half).

Page: https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/commands/stream-request.md
("Memory vs disk"). The owner (server/backfill.py) opens the scan, calls `backfill_begin` with the
store's purge seqno, then hands pages to `backfill_page` (Items), `backfill_rows` (raw store rows:
plain mutations are encoded straight from the row) or `backfill_encoded` (pages SQLite encoded),
and `backfill_complete` at the end of the range. What the backfill's snapshot looks like is in
active_stream.py's docstring.
"""

import functools

from dcpflow.engine.collections import SYSTEM_CID
from dcpflow.engine.item import DATATYPE_XATTR, Item
from dcpflow.engine.store import LARGE_VALUE, EncodedPage
from dcpflow.engine.store_rows import (
    CAS,
    CID,
    DATATYPE,
    DELETED,
    EXPIRY,
    FLAGS,
    KEY,
    REV_SEQNO,
    SEQNO,
    VALUE,
    item_from_row,
)
from dcpflow.protocol.dcp import (
    StreamEndReason,
    pack_mutation_head,
    pack_mutation_head_sid,
)

from .stream_types import CHK, DISK, HISTORY, MAY_DUPLICATE, U64, Frames, StreamState


class StreamBackfill:
    """The disk half of ActiveStream (see the module docstring)."""

    def backfill_begin(self, purge_seqno: int) -> None:
        """The scan is open: queue the Disk|Checkpoint marker for the whole backfill range."""
        rng = self.backfill
        self.backfill_running = True
        self._backfills += 1
        self._marker(rng.start, rng.end, DISK | CHK | (HISTORY | MAY_DUPLICATE if rng.history else 0), purge_seqno,
                     hcs=self.vb.persisted_hcs)

    def _prepares_before(self, seqno: int) -> None:
        """Queue the backfill's in-flight prepares below `seqno`, keeping the snapshot in seqno order."""
        pending = self._backfill_prepares
        while pending and pending[0].by_seqno < seqno:
            self._queue_sync_item(pending.pop(0))

    def backfill_page(self, items: list[Item]) -> None:
        if self.dead:
            return
        end = self.end_seqno
        skip_deletes = self.opts.skip_deletes_in_initial_backfill and self._initial_backfill
        last = items[-1].by_seqno if items else 0
        items = self._admit(items)
        for item in items:
            if item.by_seqno > end:
                break
            if self._backfill_prepares:
                self._prepares_before(item.by_seqno)
            if skip_deletes and item.deleted and item.cid != SYSTEM_CID:
                continue
            self._queue_one(item)
            self.backfill_items += 1
        if last:
            self.last_read_seqno = min(last, end)
        if self.ready_bytes > self.peak_ready_bytes:
            self.peak_ready_bytes = self.ready_bytes
        if self._emptied:
            self._end(StreamEndReason.FILTER_EMPTY)

    def backfill_rows(self, rows: list[tuple]) -> None:
        """A page of raw store rows (`BackfillScan.next_rows`, store_rows.BackfillRow as plain
        tuples, read by its field constants): plain mutations are encoded straight from the row - no
        Item is built - everything else via `backfill_page`."""
        opts = self.opts
        if opts.no_value or opts.no_value_underlying_datatype or opts.compress_values or self._backfill_prepares:
            self.backfill_page([item_from_row(r) for r in rows])
            return
        if self.dead:
            return
        end, vbid, opaque = self.end_seqno, self.vbid, self.opaque
        prefixed = opts.collections
        allows, prefixes = self.filter.allows, self._prefixes
        append = self.ready.append
        sid, system = self.stream_id, SYSTEM_CID
        # with a stream-id, the alternative framing's one byte of key length: longer keys (none
        # is: 250 bytes and a prefix) take the general path
        pack = pack_mutation_head if sid is None else functools.partial(pack_mutation_head_sid, stream_id=sid)
        short_keys = sid is not None
        u64, xattr, large = U64, DATATYPE_XATTR, LARGE_VALUE  # locals: this loop runs per row
        nbytes = count = 0
        last = self.last_sent_seqno
        for r in rows:
            seqno = r[SEQNO]
            if seqno > end:
                break
            datatype = r[DATATYPE]
            cid = r[CID]
            if cid != system and not allows(cid):  # a document the filter hides (as _admit does)
                continue
            # an event, a deletion, a shaped value, or a key too long for the stream-id framing
            if cid == system or r[DELETED] or datatype & xattr or (short_keys and len(r[KEY]) > 250):
                if nbytes:
                    self.ready_bytes += nbytes
                    self.items_sent += count
                    self.backfill_items += count
                    nbytes = count = 0
                self.last_sent_seqno = last
                self.backfill_page([item_from_row(r)])
                last = self.last_sent_seqno
                if self.dead:  # the filter was left empty
                    return
                continue
            key, value = r[KEY], r[VALUE]
            if prefixed:
                key = prefixes[cid] + key
            vlen = len(value)
            data = pack(vbid, seqno, r[REV_SEQNO] & u64, r[FLAGS], r[EXPIRY], key, vlen, r[CAS] & u64, datatype, opaque)
            if vlen >= large:
                append(data)
                append(memoryview(value))
                nbytes += len(data) + vlen
            else:
                data += value
                append(data)
                nbytes += len(data)
            count += 1
            last = seqno
        self.ready_bytes += nbytes
        self.items_sent += count
        self.backfill_items += count
        self.last_sent_seqno = last
        if rows:
            self.last_read_seqno = min(rows[-1][1], end)
        if self.ready_bytes > self.peak_ready_bytes:
            self.peak_ready_bytes = self.ready_bytes

    @property
    def takes_encoded_pages(self) -> bool:
        """Does the stream send stored mutations - the default collection's - as they are
        (`BackfillScan.next_chunk`)?"""
        opts = self.opts
        return (self.stream_id is None and not opts.no_value and not opts.no_value_underlying_datatype
                and not opts.compress_values and self.filter.default
                and not (self.backfill is not None and self.backfill.history) and not self._backfill_prepares)

    def backfill_encoded(self, page: EncodedPage) -> None:
        """A page SQLite encoded for this stream (opaque, key layout): queued as it is."""
        if page.last_seqno > self.end_seqno:
            raise ValueError(f"encoded page ends at {page.last_seqno}, past the stream's end {self.end_seqno}")
        self.ready.append(Frames(page.data, page.count))
        self.ready_bytes += len(page.data)
        self.items_sent += page.count
        self.backfill_items += page.count
        self.last_sent_seqno = self.last_read_seqno = page.last_seqno
        if self.ready_bytes > self.peak_ready_bytes:
            self.peak_ready_bytes = self.ready_bytes

    def backfill_complete(self) -> None:
        """The scan reached the end of the range: continue from memory, or end the stream."""
        rng = self.backfill
        self.backfill = None
        self.backfill_running = False
        self._initial_backfill = False
        if rng is None:
            return
        if self._backfill_prepares and not self.dead:
            self._prepares_before(rng.end + 1)
        self.last_read_seqno = rng.end
        self._seqno_advanced_if_needed()
        if self.disk_only or rng.end >= self.end_seqno:
            self._end(StreamEndReason.OK)
        elif self.cursor is None or self.cursor.dropped:
            self._recover_from_drop()
        else:
            self.state = StreamState.IN_MEMORY

