"""The failover log and the rule that says whether a consumer's history diverged from a producer's.

Pure functions over values, shared by both ends of a DCP stream: the server decides a stream
request with them (dcpflow.engine.failover, which adds the server's own rules: ranges, purge seqno),
the client picks the branch it resumes on after a ROLLBACK, and the Spark source plans its re-reads.

A failover entry is (vbucket UUID, seqno): the UUID names a branch of the vbucket's history and
the seqno is where that branch began - it shares every seqno up to there with the branch before it.
Logs are newest first, as DCP_GET_FAILOVER_LOG and a successful stream request send them
(https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/commands/failover-log.md).

The rule (https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/rollback.md,
in the form kv_engine applies it): a consumer stands at `seqno` on the branch `vbuuid`, inside the
snapshot `snapshot_start..snapshot_end` (both equal to seqno at a snapshot boundary). DCP
de-duplicates within a snapshot, so what it holds is consistent only at the snapshot's end: it
needs the producer to share its branch up to the snapshot end - or only up to seqno when seqno is
the snapshot start (it has nothing of that snapshot yet). The producer shares the branch up to
`upper`: the seqno where the next newer branch began, or its high seqno when the consumer's
branch is its newest. If it does not reach that far, the consumer must roll back: to upper, or to
the snapshot start when that is lower (nothing in the snapshot is consistent before its end). A
UUID the log does not name shares nothing: back to 0.
"""

from collections.abc import Iterable
from typing import NamedTuple


class FailoverEntry(NamedTuple):
    uuid: int
    seqno: int


class Divergence(NamedTuple):
    """A consumer's history diverged from the producer's: roll back to `seqno`. `upper` is the
    last seqno the consumer's branch shares with the producer's history (None: the producer does
    not know the branch, nothing is shared)."""

    seqno: int
    upper: int | None
    reason: str


def branch_end(log: Iterable[tuple[int, int]], vbuuid: int, high_seqno: int) -> int | None:
    """The last seqno the branch `vbuuid` shares with the producer's history: where the next newer
    branch began, or `high_seqno` if it is the newest. None if the log does not name it."""
    upper = high_seqno
    for uuid, seqno in log:  # newest first
        if uuid == vbuuid:
            return upper
        upper = seqno
    return None


def branch_of(log: Iterable[tuple[int, int]], seqno: int) -> int | None:
    """The UUID of the branch that holds `seqno`: the newest entry that began at or before it
    (building-a-simple-client.md, "Handling a rollback": drop the entries newer than the rollback
    point). None if every entry began after it."""
    for uuid, entry_seqno in log:  # newest first
        if entry_seqno <= seqno:
            return uuid
    return None


def divergence(log: Iterable[tuple[int, int]], vbuuid: int, seqno: int, snapshot_start: int, snapshot_end: int,
               high_seqno: int, *, strict_vbuuid: bool = False) -> Divergence | None:
    """Has the history of a consumer at (vbuuid, seqno, snapshot) diverged from the producer's with
    this failover log and high seqno, and where must it roll back to? None: it has not.

    A consumer at seqno 0 holds nothing and needs no common history, unless it asked for the strict
    check (the StrictVbUuid stream-request flag) with a non-zero UUID. Expects
    snapshot_start <= seqno <= snapshot_end (the server refuses anything else before asking).
    """
    if seqno == 0 and (not strict_vbuuid or vbuuid == 0):
        return None
    upper = branch_end(log, vbuuid, high_seqno)
    if upper is None:
        return Divergence(0, None, f"vbucket UUID {vbuuid} not found in the failover log: consumer and producer "
                                   "have no common history")
    needed = seqno if seqno == snapshot_start else snapshot_end
    if needed <= upper:
        return None
    start = seqno if seqno == snapshot_end else snapshot_start  # a complete snapshot: consistent at seqno
    return Divergence(min(upper, start), upper, f"consumer ahead of producer - producer upper at {upper}")
