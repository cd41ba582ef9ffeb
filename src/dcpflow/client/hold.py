"""Rollback mitigation's rule without I/O: events held per vbucket until every copy persisted them,
released in order, dropped above a rollback point (mitigation.py runs it against the servers)."""

from collections import deque

from .events import Deletion, Expiration, Mutation, Rollback, SnapshotMarker, StreamEnd, SystemEvent
from .offsets import Offset, VbTracker

#: What a held event costs beyond its key and value (the record, its tuple, the deque slot).
EVENT_OVERHEAD = 200
_NONE = ()  # add() released nothing


def event_size(event) -> int:
    """Bytes a held event counts for: its key and value plus a fixed overhead."""
    return EVENT_OVERHEAD + len(getattr(event, "key", b"") or b"") + len(getattr(event, "value", b"") or b"")


class HoldGate:
    """The hold / release / drop rule, without I/O.

    `add(event)` holds an event and returns the events that may go to the application now;
    `persisted(vb, seqno)` says how far every copy of a vbucket has persisted and returns what that
    releases. Each held entry has a release key, a seqno that must be persisted before the entry
    goes: a document or system event its own seqno; a snapshot marker the seqno before its
    snapshot (so it never claims a boundary above what is persisted); a rollback or stream end the
    key of the entry before it (it goes right after them). Keys never decrease within a vbucket,
    so release is a FIFO pop."""

    def __init__(self, starts: dict[int, Offset], max_bytes: int, markers: bool = False):
        self.trackers = {vb: VbTracker(vb, off) for vb, off in starts.items()}
        self.held: dict[int, deque] = {vb: deque() for vb in starts}
        self.confirmed: dict[int, int] = {vb: off.seqno for vb, off in starts.items()}
        self.released: dict[int, int] = {vb: off.seqno for vb, off in starts.items()}
        self.max_bytes = max_bytes
        self.markers = markers
        self.bytes = 0
        #: bytes released since the reader last said the application took everything (`taken`)
        self.out_bytes = 0
        self.held_max = 0  # the most bytes ever held
        self.released_count = 0
        self._stats = {"dropped": 0, "rollbacks_hidden": 0, "polls": 0}

    @property
    def stats(self) -> dict:
        """held_max_bytes, released (events), dropped (above a rollback point), rollbacks_hidden
        (nothing released to undo), polls (poll periods passed); the counters of the hot path are
        kept in attributes and gathered here."""
        st = self._stats
        st["held_max_bytes"] = self.held_max
        st["released"] = self.released_count
        return st

    @property
    def full(self) -> bool:
        return self.bytes >= self.max_bytes

    @property
    def empty(self) -> bool:
        return self.bytes == 0 and not any(self.held.values())

    def offsets(self) -> dict[int, Offset]:
        """Per vbucket, the committed offset of what was released."""
        return {vb: tr.committed for vb, tr in self.trackers.items()}

    def waiting(self) -> dict[int, int]:
        """{vbucket: vbucket UUID to observe with} for every vbucket with events held: the UUID of
        the newest held event (the branch the stream is on now)."""
        out = {}
        for vb, q in self.held.items():
            if q:
                uuid = next((e[3] for e in reversed(q) if e[3] is not None), None)
                out[vb] = uuid if uuid is not None else self.trackers[vb].vbuuid
        return out

    def add(self, event) -> list | tuple:
        """Hold `event`; return what may go to the application now (an empty tuple: nothing)."""
        t = type(event)
        vb = event.vbucket
        q = self.held[vb]
        if t is Mutation or t is Deletion or t is Expiration:  # the common case, kept short
            seqno = event.seqno
            size = EVENT_OVERHEAD + len(event.key) + len(event.value)
            if not q and seqno <= self.confirmed[vb]:  # nothing before it, persisted already
                tr = self.trackers[vb]
                tr.vbuuid = event.vbuuid
                tr.item(seqno)
                self.released[vb] = seqno
                self.out_bytes += size
                self.released_count += 1
                return (event,)
            q.append((seqno, event, size, event.vbuuid))
            self.bytes += size
            if self.bytes > self.held_max:
                self.held_max = self.bytes
            return _NONE if q[0][0] > self.confirmed[vb] else self._release(vb)
        last = q[-1][0] if q else self.released[vb]
        if t is SnapshotMarker:
            entry = (max(last, event.start - 1), event, 0, None)
        elif t is Rollback:
            return self._rollback(event)
        elif t is StreamEnd:
            entry = (last, event, 0, None)
        else:  # a system event (collections): it has a seqno, and a manifest uid to carry
            size = event_size(event)
            entry = (event.seqno, event, size, event.vbuuid)
            self.bytes += size
            if self.bytes > self.held_max:
                self.held_max = self.bytes
        q.append(entry)
        return self._release(vb)

    def _rollback(self, event: Rollback) -> list:
        """Drop what lies above the rollback point; queue the rollback itself behind the rest."""
        vb = event.vbucket
        q = self.held[vb]
        point = event.offset.seqno
        while q and q[-1][0] > point:
            _, dropped, size, _ = q.pop()
            self.bytes -= size
            if size:
                self._stats["dropped"] += 1
        self.confirmed[vb] = min(self.confirmed[vb], point)
        q.append((q[-1][0] if q else min(self.released[vb], point), event, 0, None))
        return self._release(vb)

    def persisted(self, vb: int, seqno: int) -> list:
        """Every copy of `vb` has persisted up to `seqno`: release what that covers."""
        if seqno > self.confirmed[vb]:
            self.confirmed[vb] = seqno
        return self._release(vb)

    def _release(self, vb: int) -> list:
        q = self.held[vb]
        limit = self.confirmed[vb]
        out = []
        tr = self.trackers[vb]
        freed = 0
        while q and q[0][0] <= limit:
            key, event, size, uuid = q.popleft()
            if uuid is not None:  # a document or system event
                freed += size
                tr.vbuuid = uuid  # the branch it came from (the feed's trackers learn it on open)
                if type(event) is SystemEvent and event.manifest_uid is not None:
                    tr.saw_manifest(event.manifest_uid)
                tr.item(key)
                self.released[vb] = key
                self.released_count += 1
                out.append(event)
                continue
            t = type(event)
            if t is SnapshotMarker:
                if tr.marker is not None and event.start <= tr.marker[1]:
                    # overlaps the open snapshot: the stream was reopened from inside it (what the
                    # feed's trackers learn from the reopen), so that snapshot was not completed
                    tr.marker = None
                tr.snapshot(event.start, event.end)
                if self.markers:
                    out.append(event)
            elif t is Rollback:
                undoes = self.released[vb] > event.offset.seqno
                tr.rolled_back(event.offset)
                self.released[vb] = event.offset.seqno
                if undoes:
                    out.append(event)
                else:
                    self._stats["rollbacks_hidden"] += 1
            else:  # StreamEnd
                if event.reason == 0:  # OK: the snapshot holding the end is complete
                    tr.stream_end_ok()
                out.append(event)
        self.bytes -= freed
        self.out_bytes += freed
        return out
