"""Offsets: where a vbucket's stream stands, and the rules for moving them.

An `Offset` is what a DCP stream request needs to resume (stream-request.md,
building-a-simple-client.md "Restarting from where you left off"): the vbucket UUID of the
history branch the data came from, the last seqno received, and the snapshot that seqno belongs to.
A valid offset has `snapshot_start <= seqno <= snapshot_end`.

`VbTracker` applies the stream's messages to two offsets (sans-I/O, one per vbucket):

* `position` - exactly what was received: the last seqno and the snapshot it came in. Resuming
  from it re-sends nothing; the server may still roll us back to the snapshot start if its
  history changed inside that snapshot (discussion.md). Used to reopen a stream in-process.
* `committed` - advanced **only at safe points**, where everything up to a snapshot end is known:
  the item whose seqno is the snapshot end, a SEQNO_ADVANCED reaching it, the next snapshot marker
  (the previous snapshot is then complete, even if its last seqnos were not for us), or
  STREAM_END OK. At a committed offset the consumer holds a consistent view (de-duplication cannot
  have hidden a version it still needs), so this is what the StateStore persists. After a restart
  the items of a partly received snapshot are delivered again: at most one snapshot per vbucket.

Rollback (rollback.md, building-a-simple-client.md "Handling a rollback"): the server names a
seqno R, but a consumer can only return to a point where its view was consistent - a snapshot
boundary it completed - because de-duplication inside a snapshot may have replaced versions it
never saw. `rollback_point(R)` is the newest such boundary at or below R (the tracker remembers the
last `BOUNDARIES` of them, and what the read's start offset proves), else 0. Example: a whole vbucket arrived as
one de-duplicated memory snapshot 1..N, then the server lost its unpersisted tail and asks for
R < N: the only consistent point at or below R is 0, so the read starts over, and the versions
that were replaced in memory but survived on disk come back.

What an offset proves (so a restarted client knows the boundaries it cannot remember): its seqno
is a boundary when it equals snapshot_end, and `snapshot_start - 1` is one when the offset carries
a real range (snapshot_start < snapshot_end; `(s, s, s)` is how any consumer at a boundary writes
its snapshot, rollback.md, and proves nothing before s: in a de-duplicated snapshot ending at s,
s - 1 is not a consistent point). The tracker makes the second true by construction: a committed
offset's snapshot_start is one past the consistent point the snapshot followed (`base`), which is
the marker's start only when nothing lay between the two; a snapshot that overlaps the point it
was requested from, or the first snapshot after a reopen from inside a snapshot, gets `base + 1`
instead. For the server a committed offset is a boundary (seqno == snapshot_end), so it ignores
snapshot_start there (rollback.md).

Two traps this avoids (both were bugs in other clients): claiming a snapshot boundary at a seqno
in the middle of a snapshot (the server then cannot tell the consumer to roll back, and versions
hidden by de-duplication are lost, discussion.md example 1), and moving the snapshot range to a
new marker before any item of it arrived (`snapshot_start > seqno`, which the server refuses with
ERANGE).
"""

from collections import deque
from typing import NamedTuple

U64_MAX = 0xFFFFFFFFFFFFFFFF


class Offset(NamedTuple):
    """Resume point of one vbucket. `vbuuid` is an unsigned 64-bit int (0 = no history yet)."""

    vbuuid: int = 0
    seqno: int = 0
    snapshot_start: int = 0
    snapshot_end: int = 0

    @classmethod
    def at(cls, vbuuid: int, seqno: int) -> "Offset":
        """A snapshot boundary: (vbuuid, seqno, seqno, seqno), the way a consumer standing at a
        boundary writes its snapshot (rollback.md). It claims consistency at seqno only."""
        return cls(vbuuid, seqno, seqno, seqno)

    def check(self) -> "Offset":
        """Return self if usable in a stream request, else raise ValueError saying why."""
        for name, value in zip(self._fields, self, strict=True):
            if not isinstance(value, int) or not 0 <= value <= U64_MAX:
                raise ValueError(f"offset {name}={value!r} is not an unsigned 64-bit integer")
        if not self.snapshot_start <= self.seqno <= self.snapshot_end:
            raise ValueError(f"offset {tuple(self)} breaks snapshot_start <= seqno <= snapshot_end "
                             f"(stream-request.md)")
        return self

    @property
    def is_boundary(self) -> bool:
        return self.seqno == self.snapshot_end

    def to_json(self) -> dict:
        return self._asdict()

    @classmethod
    def from_json(cls, doc) -> "Offset":
        """From a dict with the four field names, or a 4-element list; raises ValueError."""
        if isinstance(doc, cls):
            return doc
        if isinstance(doc, list | tuple) and len(doc) == 4:
            return cls(*doc).check()
        if not isinstance(doc, dict):
            raise ValueError(f"an offset is a JSON object with {', '.join(cls._fields)}; got {doc!r}")
        missing = [f for f in cls._fields if f not in doc]
        if missing:
            raise ValueError(f"offset {doc!r} lacks {', '.join(missing)}")
        return cls(*(doc[f] for f in cls._fields)).check()


BEGINNING = Offset()
_new = tuple.__new__
#: How many completed-snapshot ends a tracker remembers as rollback points.
BOUNDARIES = 512


def rollback_offset(failover_log, seqno: int) -> Offset:
    """Where to resume after ROLLBACK(seqno) (building-a-simple-client.md "Handling a rollback"):
    drop failover entries newer than the rollback point and take the newest remaining one, whose
    branch contains `seqno`. No entry (or seqno 0) means start over with no history."""
    if seqno:
        for uuid, entry_seqno in failover_log:  # newest first
            if entry_seqno <= seqno:
                return Offset.at(uuid, seqno)
    return BEGINNING


class VbTracker:
    """The offsets of one vbucket's stream, moved by what the application has consumed."""

    __slots__ = ("vbucket", "vbuuid", "committed", "_pos", "marker", "purge_seqno", "boundaries", "base", "anchor")

    def __init__(self, vbucket: int, start: Offset = BEGINNING):
        self.vbucket = vbucket
        self.vbuuid = start.vbuuid
        self.committed = start
        self._pos: tuple | None = None  # position fields when ahead of `committed` (cheaper than an Offset)
        self.marker: tuple[int, int] | None = None  # the snapshot being received, until complete
        self.purge_seqno = 0
        # Consistent points to roll back to, newest last: what the start offset proves (module
        # docstring), then the ends of the snapshots completed since and the rollback points.
        self.boundaries: deque[int] = deque([0], maxlen=BOUNDARIES)
        if 1 < start.snapshot_start < start.snapshot_end:  # a real range: (s, s, s) only says "at s"
            self.boundaries.append(start.snapshot_start - 1)
        if start.seqno == start.snapshot_end and start.seqno > self.boundaries[-1]:
            self.boundaries.append(start.seqno)
        self.base = self.boundaries[-1]  # the consistent point the current snapshot follows
        self.anchor = start  # where the read started or last rolled back to (see range_end)

    @property
    def position(self) -> Offset:
        pos = self._pos
        return self.committed if pos is None else _new(Offset, pos)

    def rollback_point(self, seqno: int) -> int:
        """The newest consistent point at or below the server's rollback seqno (0 if none)."""
        for b in reversed(self.boundaries):
            if b <= seqno:
                return b
        return 0

    def rollback_offset(self, failover_log, seqno: int) -> Offset:
        """Where to resume after ROLLBACK(seqno): the newest consistent point at or below it, on the
        failover entry covering it, with the snapshot info at that point (rollback.md, consumer
        side) - snapshot_start is one past the boundary before it, so that a restart from this
        offset still knows that boundary."""
        point = self.rollback_point(seqno)
        offset = rollback_offset(failover_log, point)
        if offset.seqno:
            prev = self.rollback_point(offset.seqno - 1)
            offset = offset._replace(snapshot_start=prev + 1 if prev else 0)
        return offset

    def opened(self, failover_log) -> None:
        """A stream request succeeded: what follows belongs to the newest branch of its log."""
        if failover_log:
            self.vbuuid = failover_log[0][0]
        self.marker = None

    def _commit(self, seqno: int, start: int, end: int) -> None:
        base = self.base
        if start != base + 1:  # not right after the point it followed: claim only that point
            start = base + 1 if base else 0
        self.committed = Offset(self.vbuuid, seqno, min(start, seqno), max(end, seqno))
        self._pos = None
        self.marker = None
        self.base = seqno
        if seqno > self.boundaries[-1]:
            self.boundaries.append(seqno)

    def snapshot(self, start: int, end: int) -> None:
        """SNAPSHOT_MARKER: the previous snapshot, if still open, is complete. If we stand exactly at
        a boundary, nothing of ours lies between it and the new snapshot's start, so `start - 1` is
        consistent too; after a reopen from inside a snapshot it is not (the new marker may start
        where we resumed)."""
        if self.marker is not None:
            prev_start, prev_end = self.marker
            if prev_end > self.committed.seqno:
                self._commit(prev_end, prev_start, prev_end)
        b = self.boundaries[-1]
        if self._pos is None and self.committed.seqno == b:
            if start - 1 > b:
                self.boundaries.append(start - 1)
            self.base = max(b, start - 1)
        else:
            self.base = b
        self.marker = (start, end)

    def item(self, seqno: int) -> None:
        """A mutation, deletion, expiration or system event with this seqno."""
        marker = self.marker
        if marker is None:  # no marker: lenient, a one-item snapshot
            self._commit(seqno, seqno, seqno)
        elif seqno >= marker[1]:
            self._commit(seqno, marker[0], marker[1])
        else:
            start = marker[0]
            self._pos = (self.vbuuid, seqno, start if start <= seqno else seqno, marker[1])

    def seqno_advanced(self, seqno: int) -> None:
        marker = self.marker
        if marker is None:
            if seqno > self.committed.seqno:
                self._commit(seqno, seqno, seqno)
        elif seqno >= marker[1]:
            self._commit(marker[1], marker[0], marker[1])
        elif seqno > self.position.seqno:
            self._pos = (self.vbuuid, seqno, min(marker[0], seqno), marker[1])

    def stream_end_ok(self) -> None:
        """STREAM_END OK comes after the complete snapshot containing the end seqno."""
        if self.marker is not None:
            start, end = self.marker
            if end > self.committed.seqno:
                self._commit(end, start, end)
            self.marker = None

    def rolled_back(self, offset: Offset) -> None:
        self.vbuuid = offset.vbuuid
        self.committed = self.anchor = offset
        self._pos = None
        self.marker = None
        while self.boundaries and self.boundaries[-1] > offset.seqno:
            self.boundaries.pop()
        if not self.boundaries or self.boundaries[-1] < offset.seqno:
            self.boundaries.append(offset.seqno)
        self.base = offset.seqno

    def range_end(self, end: int) -> Offset:
        """The offset at `end` for a bounded read that kept only seqnos <= end: a boundary if `end`
        closed a snapshot, else the mid-snapshot offset whose snapshot range lets the server
        decide a rollback correctly. A read whose start (or rollback point) lies at or beyond `end`
        read nothing: it stays where it was."""
        c = self.committed
        if c.seqno <= end or c == self.anchor:
            return c
        if c.snapshot_start <= end:
            return Offset(c.vbuuid, end, c.snapshot_start, c.snapshot_end)
        # `end` fell between snapshots: nothing of ours lies there. Claim the boundary before it
        # as well when `end` is itself a known boundary.
        if self.rollback_point(end) < end:
            return Offset.at(c.vbuuid, end)
        prev = self.rollback_point(end - 1) if end else 0
        return Offset(c.vbuuid, end, prev + 1 if prev else 0, end)
