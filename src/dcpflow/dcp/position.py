"""One consumer-side stream position: where a DCP consumer's stream of one vbucket stands, and
what a snapshot marker, an item, a stream end and a rollback do to it.

Both consumers of dcpflow decide these things here, so they cannot drift apart: the client's
`Feed` (dcpflow.client.streams, one `VbTracker` per vbucket) and the server's replica consumer
(consumer.py, whose position is the replica vbucket's own high seqno and snapshot). Pure
functions and a small class over protocol values: no I/O, no engine, nothing of the server or the
client (this module imports only dcpflow.protocol), so every rule is tested without a socket
(tests/dcp/test_position.py, tests/client/test_offsets.py).

Pages (https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/):
stream-request.md, snapshot-marker.md, stream-end.md, rollback.md, building-a-simple-client.md.

An `Offset` is what a DCP stream request needs to resume: the vbucket UUID of the history branch
the data came from, the last seqno received, and the snapshot that seqno belongs to (and, for
collections, the manifest uid known there). A valid offset has
`snapshot_start <= seqno <= snapshot_end`. Its JSON form is the client's saved state
(dcpflow.client.offsets).

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

from dcpflow.protocol.dcp import DcpStreamRequest, StreamEndReason
from dcpflow.protocol.failover import branch_of

U64_MAX = 0xFFFFFFFFFFFFFFFF
_FIELDS = ("vbuuid", "seqno", "snapshot_start", "snapshot_end", "manifest_uid")
#: what an offset object without the field does not say (its error message)
_NEEDED = {"vbuuid": "which history it is on", "seqno": "where to resume"}


class OffsetError(ValueError):
    """Offset JSON (or values) that do not make an offset; the message says where and why."""


class Offset(NamedTuple):
    """Resume point of one vbucket. `vbuuid` is an unsigned 64-bit int (0 = no history yet).
    `manifest_uid` is the collections manifest the consumer knows at this point (None: not
    tracked); it is carried and saved with the offset."""

    vbuuid: int = 0
    seqno: int = 0
    snapshot_start: int = 0
    snapshot_end: int = 0
    manifest_uid: int | None = None

    @classmethod
    def at(cls, vbuuid: int, seqno: int) -> "Offset":
        """A snapshot boundary: (vbuuid, seqno, seqno, seqno), the way a consumer standing at a
        boundary writes its snapshot (rollback.md). It claims consistency at seqno only."""
        return cls(vbuuid, seqno, seqno, seqno)

    def check(self, where: str = "offset") -> "Offset":
        """Return self if usable in a stream request, else raise OffsetError saying why."""
        return _checked(self, where)

    @property
    def is_boundary(self) -> bool:
        return self.seqno == self.snapshot_end

    def to_json(self) -> list[int]:
        """The compact form: [vbuuid, seqno] at a boundary whose snapshot is just that seqno, else
        [vbuuid, seqno, snapshot_start, snapshot_end], and the manifest uid fifth when there is one.

        Compact on purpose: Spark writes every end offset of its source to the offset log, puts
        three in each progress report and parses them in every planning call, an offset per
        vbucket each (docs/spark.md has the sizes)."""
        vbuuid, seqno, start, end, uid = self
        if uid is not None:
            return [vbuuid, seqno, start, end, uid]
        if start == seqno == end:
            return [vbuuid, seqno]
        return [vbuuid, seqno, start, end]

    @classmethod
    def from_json(cls, doc, where: str = "offset") -> "Offset":
        """From the compact form (a list, see to_json), or the object form {"vbuuid": …, "seqno": …,
        "snapshot_start": …, "snapshot_end": …, "manifest_uid": …} that earlier state files and
        Spark checkpoints hold and that people write by hand (the snapshot defaults to the seqno,
        the manifest uid to none). An Offset is returned as it is. Raises OffsetError naming
        `where`."""
        if isinstance(doc, cls):
            return doc
        if isinstance(doc, list | tuple):
            n = len(doc)
            if n == 2:
                values = (doc[0], doc[1], doc[1], doc[1], None)
            elif n == 4:
                values = (*doc, None)
            elif n == 5:
                values = tuple(doc)
            else:
                raise OffsetError(f"{where}: expected [vbuuid, seqno] or [vbuuid, seqno, snapshot_start, "
                                  f"snapshot_end] (and a manifest uid), got {doc!r}")
        elif isinstance(doc, dict):
            unknown = doc.keys() - _FIELDS
            if unknown:
                raise OffsetError(f"{where}: unknown field(s) {sorted(unknown)}")
            for name, why in _NEEDED.items():
                if name not in doc:
                    raise OffsetError(f"{where}: missing {name!r} (an offset that lacks {name} does not say {why})")
            seqno = doc["seqno"]
            values = (doc["vbuuid"], seqno, doc.get("snapshot_start", seqno), doc.get("snapshot_end", seqno),
                      doc.get("manifest_uid"))
        else:
            raise OffsetError(f"{where}: expected [vbuuid, seqno] or an object with vbuuid and seqno, got {doc!r}")
        return _checked(tuple.__new__(cls, values), where)


def _checked(o: Offset, where: str) -> Offset:
    for name, v in zip(_FIELDS, o, strict=True):
        # type(): a JSON true is not a seqno
        if (type(v) is not int or not 0 <= v <= U64_MAX) and not (v is None and name == "manifest_uid"):
            raise OffsetError(f"{where}: {name} must be an unsigned 64-bit integer, got {v!r}")
    if not o.snapshot_start <= o.seqno <= o.snapshot_end:
        raise OffsetError(f"{where}: snapshot_start <= seqno <= snapshot_end does not hold "
                          f"({o.snapshot_start}, {o.seqno}, {o.snapshot_end}; stream-request.md)")
    return o


BEGINNING = Offset()
_new = tuple.__new__
#: How many completed-snapshot ends a tracker remembers as rollback points.
BOUNDARIES = 512


def rollback_offset(failover_log, seqno: int) -> Offset:
    """Where to resume after ROLLBACK(seqno) (building-a-simple-client.md "Handling a rollback"):
    the rollback seqno on the branch of the failover log that holds it. No such branch (or seqno
    0) means start over with no history."""
    uuid = branch_of(failover_log, seqno) if seqno else None
    return BEGINNING if uuid is None else Offset.at(uuid, seqno)


class VbTracker:
    """The offsets of one vbucket's stream, moved by what the application has consumed."""

    __slots__ = ("vbucket", "vbuuid", "manifest_uid", "committed", "_pos", "marker", "purge_seqno", "boundaries",
                 "base", "anchor")

    def __init__(self, vbucket: int, start: Offset = BEGINNING):
        self.vbucket = vbucket
        self.vbuuid = start.vbuuid
        self.manifest_uid = start.manifest_uid  # carried into every offset made from here
        self.committed = start
        self._pos: tuple | None = None  # position fields but the manifest uid, when ahead of `committed`
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
        return self.committed if pos is None else _new(Offset, (*pos, self.manifest_uid))

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
        offset still knows that boundary. The manifest uid at that point is not known (None)."""
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
        self.committed = Offset(self.vbuuid, seqno, min(start, seqno), max(end, seqno), self.manifest_uid)
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

    def saw_manifest(self, uid: int) -> None:
        """A system event of manifest `uid` (before its item() step): offsets from here on carry
        it, so a resumed stream is not sent the events already seen (stream-request-value.md)."""
        if self.manifest_uid is None or uid > self.manifest_uid:
            self.manifest_uid = uid

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
        self.manifest_uid = offset.manifest_uid
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
            return c._replace(seqno=end)
        # `end` fell between snapshots: nothing of ours lies there. Claim the boundary before it
        # as well when `end` is itself a known boundary.
        if self.rollback_point(end) < end:
            return c._replace(seqno=end, snapshot_start=end, snapshot_end=end)
        prev = self.rollback_point(end - 1) if end else 0
        return c._replace(seqno=end, snapshot_start=prev + 1 if prev else 0, snapshot_end=end)


# -- asking for a stream from a position ------------------------------------------------------------
def stored_position(vbuuid: int, seqno: int, snapshot_start: int, snapshot_end: int) -> Offset:
    """The position of a consumer that stores what it applied (a replica vbucket: its high seqno and
    the snapshot it was receiving): the same rule as `VbTracker`'s, that a snapshot range only moves
    to a new marker once an item of it is in. A marker whose items did not arrive
    (`snapshot_start > seqno`, which the producer refuses with ERANGE) leaves the consumer at its
    previous end, a boundary; a seqno past the snapshot end is a boundary too."""
    if snapshot_start > seqno:
        return Offset.at(vbuuid, seqno)
    return Offset(vbuuid, seqno, snapshot_start, max(snapshot_end, seqno))


def after_rollback_to_zero(offset: Offset) -> Offset:
    """A consumer rolled back to seqno 0 keeps no history: it asks with vbuuid 0, as
    `rollback_offset` does (a request naming a UUID the producer does not know, with StrictVbUuid,
    would be answered ROLLBACK to 0 again and again)."""
    return offset._replace(vbuuid=0) if offset.seqno == 0 else offset


def stream_request(vbucket: int, position: Offset, end: int, flags: int, value: bytes = b"",
                   opaque: int = 0) -> DcpStreamRequest:
    """DCP_STREAM_REQ from `position` up to `end` (stream-request.md). A position at or past the end
    still asks, with start == end: only the producer can say that the position is on a lost branch
    (it answers ROLLBACK), and an end below the start would be refused with ERANGE."""
    seqno = position.seqno
    return DcpStreamRequest(vbucket, seqno, max(end, seqno), position.vbuuid, position.snapshot_start,
                            position.snapshot_end, flags, value, opaque=opaque)


# -- what a STREAM_END means -------------------------------------------------------------------------
FINISH, REOPEN = "finish", "reopen"
#: Ends after which the stream is asked for again from where it stood, by any consumer: the producer
#: dropped it for being slow, its backfill failed, or its history changed (the new request learns
#: where to roll back to).
RESUMABLE_ENDS = frozenset({StreamEndReason.SLOW, StreamEndReason.BACKFILL_FAIL, StreamEndReason.ROLLBACK})
#: Ends after which the vbucket may have moved to another node.
_MOVED = (StreamEndReason.STATE_CHANGED, StreamEndReason.DISCONNECTED)
_PAUSED = (StreamEndReason.SLOW, StreamEndReason.BACKFILL_FAIL)


class EndAction(NamedTuple):
    """What a STREAM_END means for a consumer: FINISH or REOPEN; refresh the cluster map first
    (the vbucket may have moved); and `pause`, the seconds to wait before reopening (the producer
    said it was overloaded) - a consumer with timers waits them, one relayed without timers (the
    replica consumer) asks again at once."""

    action: str
    remap: bool = False
    pause: float = 0.0


def stream_end(reason: int, *, closed_by_us: bool = False, follows_map: bool = True,
               takeover: bool = False) -> EndAction:
    """stream-end.md, for both consumers. OK finishes (the end seqno was reached), and so does
    Closed when we closed the stream. SLOW, BACKFILL_FAIL and ROLLBACK reopen from where the stream
    stood (after a short pause for the first two), except a takeover stream's: its end is the end
    of the handover.

    Every other reason (StateChanged, Disconnected, FilterEmpty, LostPrivileges, Closed by the
    producer, a reason we do not know) depends on who owns the vbucket's routing. A consumer that
    follows the cluster map itself (`follows_map`, the client) reopens - after a map refresh when
    the vbucket may have moved - and lets the new stream request say what is wrong. A replica
    consumer does not: its stream is over, and the cluster manager that added it decides what
    comes next (it adds the stream again, or not)."""
    if reason == StreamEndReason.OK or (reason == StreamEndReason.CLOSED and closed_by_us):
        return EndAction(FINISH)
    if reason in RESUMABLE_ENDS:
        if takeover:
            return EndAction(FINISH)
        return EndAction(REOPEN, False, 0.1 if reason in _PAUSED else 0.0)
    if follows_map:
        return EndAction(REOPEN, reason in _MOVED)
    return EndAction(FINISH)
