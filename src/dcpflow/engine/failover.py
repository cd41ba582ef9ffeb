"""The failover log (FailoverTable) and THE rollback decision for DCP stream requests.

Reference: https://github.com/couchbase/kv_engine/blob/master/docs/dcp/documentation/
(failure-scenarios.md, rollback.md, commands/failover-log.md), as KV-Engine's code behaves where
the pages differ: the log is newest-first on the wire (failure-scenarios.md lists it oldest-first),
start == end is a valid request, and the rollback rule is the one `rollback_decision` states.

A failover entry is (vbucket UUID, seqno): a random non-zero 48-bit UUID naming a branch of
history and the seqno at which that branch began. Entries are kept newest first, capped at 25
(`max_failover_entries`); the newest UUID is "the vbucket UUID". When to push an entry is the
VBucket's business (creation, becoming active other than by takeover, unclean warm-up); this
module only knows how.

Whether a consumer's history diverged from this log is decided by dcpflow.protocol.failover,
the rule the client and the Spark source apply too; the server adds its own rules around it
(request ranges, the purge seqno, the high seqno).
"""

import json
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from random import Random

from dcpflow.protocol.failover import FailoverEntry, divergence
from dcpflow.protocol.status import Status

MAX_FAILOVER_ENTRIES = 25
_UUID_MASK = (1 << 48) - 1


class FailoverTable:
    """A vbucket's failover log, newest entry first."""

    def __init__(self, entries: Iterable[tuple[int, int]] | None = None, *,
                 max_entries: int = MAX_FAILOVER_ENTRIES, rng: Random | None = None):
        self.max_entries = max_entries
        self._rng = rng
        self._json: tuple[tuple, str] | None = None  # (entries, to_json() of them)
        self._entries = [FailoverEntry(int(u), int(s)) for u, s in (entries or ())]
        if not self._entries:
            self.create_entry(0)  # a new vbucket starts its history at seqno 0

    # -- reading ---------------------------------------------------------------------------
    @property
    def entries(self) -> list[FailoverEntry]:
        """A copy of the log, newest first (the wire order of GetFailoverLog / StreamRequest)."""
        return list(self._entries)

    @property
    def latest(self) -> FailoverEntry:
        return self._entries[0]

    @property
    def latest_uuid(self) -> int:
        return self._entries[0].uuid

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self):
        return iter(list(self._entries))

    def find(self, uuid: int) -> int | None:
        """Index of the entry with this UUID (0 = newest), or None."""
        for i, entry in enumerate(self._entries):
            if entry.uuid == uuid:
                return i
        return None

    # -- changing ----------------------------------------------------------------------------
    def _new_uuid(self) -> int:
        known = {e.uuid for e in self._entries}
        while True:
            uuid = (self._rng.getrandbits(48) if self._rng else secrets.randbits(48)) & _UUID_MASK
            if uuid and uuid not in known:
                return uuid

    def create_entry(self, seqno: int) -> FailoverEntry:
        """Start a new branch of history at `seqno`.

        Entries with a seqno above the new one are dropped first: they describe a branch this
        vbucket no longer has (writes after `seqno` were lost or never received).
        """
        self._entries = [e for e in self._entries if e.seqno <= seqno]
        entry = FailoverEntry(self._new_uuid(), seqno)
        self._entries.insert(0, entry)
        del self._entries[self.max_entries:]
        return entry

    def prune(self, seqno: int) -> None:
        """Drop entries newer than `seqno` (after a rollback); never leaves the log empty."""
        kept = [e for e in self._entries if e.seqno <= seqno]
        if kept:
            self._entries = kept
        else:
            self._entries = []
            self.create_entry(seqno)

    def replace(self, entries: Iterable[tuple[int, int]]) -> None:
        """Adopt a producer's log (a consumer does this on every successful stream request)."""
        new = [FailoverEntry(int(u), int(s)) for u, s in entries]
        if not new:
            raise ValueError("a failover log cannot be empty")
        self._entries = new[:self.max_entries]

    # -- persistence -------------------------------------------------------------------------
    def to_json(self) -> str:
        # Every flush batch writes the state row of each vbucket it touches (up to 1024, on the
        # event loop's thread), and the log rarely changes between two: the text is kept with the
        # entries it was made from, so any change, by whatever path, makes a new one.
        entries = tuple(self._entries)
        cached = self._json
        if cached is None or cached[0] != entries:
            cached = self._json = (entries, json.dumps([{"id": e.uuid, "seq": e.seqno} for e in entries]))
        return cached[1]

    @classmethod
    def from_json(cls, text: str, **kwargs) -> "FailoverTable":
        return cls([(d["id"], d["seq"]) for d in json.loads(text)], **kwargs)

    # -- rollback ---------------------------------------------------------------------------
    def rollback_decision(self, **kwargs) -> "RollbackDecision":
        """`rollback_decision(self.entries, ...)`; see the module-level function."""
        return rollback_decision(self._entries, **kwargs)


@dataclass(frozen=True, slots=True)
class RollbackDecision:
    """Outcome of checking a stream request against the failover log.

    status is SUCCESS (stream may start), ROLLBACK (the consumer must roll back to
    `rollback_seqno`; the ROLLBACK response body is only that u64) or ERANGE
    (the request is invalid; `reason` says which rule it broke).
    """

    status: Status
    rollback_seqno: int = 0
    reason: str = ""

    @property
    def needs_rollback(self) -> bool:
        return self.status == Status.ROLLBACK


def rollback_decision(entries: Iterable[tuple[int, int]], *, start_seqno: int, end_seqno: int,
                      vb_uuid: int, snap_start_seqno: int, snap_end_seqno: int, high_seqno: int,
                      purge_seqno: int, client_purge_seqno: int | None = None,
                      strict_vb_uuid: bool = False, ignore_purged_tombstones: bool = False,
                      purge_check_exempt: bool = False) -> RollbackDecision:
    """Decide whether a DCP stream request may start, must roll back, or is out of range.

    As KV-Engine's code decides (rollback.md differs: its wild-card purge compares the snapshot
    start, and its case 1.b applies only with StrictVbUuid):

    0. Validation: start <= end (start == end is fine: the stream ends at once) and
       snap_start <= start <= snap_end, else ERANGE.
    1. start == 0 and (not StrictVbUuid or uuid == 0): no rollback.
    2. start != 0, start < purge seqno and the client's purge_seqno (stream-request value) is not
       the server's: roll back to 0 - the consumer may have missed purged deletions. The purge
       seqno counts as 0 with IgnorePurgedTombstones; `purge_check_exempt` is for a caller that
       established the collection-stream exemption.
    3. UUID not in the failover log: roll back to 0 (no common history).
    4. upper = seqno of the next newer entry after the matching one, else the high seqno.
       If start == snap_start, snap_end = start (the consumer has nothing of that snapshot).
       If snap_end <= upper: no rollback. Otherwise, if start == snap_end, snap_start = start
       (the consumer has all of it), and roll back to upper if upper < snap_start, else to
       snap_start.
    5. A request that needs no rollback but starts beyond the high seqno: ERANGE. This comes
       after the rollback check so a consumer that is ahead on an old branch is told to roll
       back (failure-scenarios.md), not refused.
    """
    if start_seqno > end_seqno:
        return RollbackDecision(Status.ERANGE, reason=(
            f"start seqno {start_seqno} is greater than end seqno {end_seqno}"))
    if not snap_start_seqno <= start_seqno <= snap_end_seqno:
        return RollbackDecision(Status.ERANGE, reason=(
            f"snapshot start {snap_start_seqno} <= start {start_seqno} <= snapshot end "
            f"{snap_end_seqno} does not hold"))

    decision = _history_check(list(entries), start_seqno, vb_uuid, snap_start_seqno, snap_end_seqno,
                              high_seqno, purge_seqno, client_purge_seqno, strict_vb_uuid,
                              ignore_purged_tombstones, purge_check_exempt)
    if decision is not None:
        return decision
    if start_seqno > high_seqno:
        return RollbackDecision(Status.ERANGE, reason=(
            f"start seqno {start_seqno} is greater than the vbucket high seqno {high_seqno}"))
    return RollbackDecision(Status.SUCCESS)


def _history_check(entries: list[tuple[int, int]], start: int, vb_uuid: int, snap_start: int,
                   snap_end: int, high_seqno: int, purge_seqno: int, client_purge_seqno: int | None,
                   strict_vb_uuid: bool, ignore_purged: bool, exempt: bool) -> RollbackDecision | None:
    # Rule 2, the server's own, applies only when start != 0 and rule 1 only when start == 0: checking
    # it before the shared rules keeps kv_engine's order.
    effective_purge = 0 if ignore_purged else purge_seqno
    if (start != 0 and start < effective_purge and not exempt
            and client_purge_seqno != purge_seqno):
        return RollbackDecision(Status.ROLLBACK, 0, (
            f"purge seqno {purge_seqno} is greater than start seqno {start}: the consumer could "
            "miss purged deletions"))
    # Rules 1, 3 and 4: the history check every DCP consumer shares.
    diverged = divergence(entries, vb_uuid, start, snap_start, snap_end, high_seqno, strict_vbuuid=strict_vb_uuid)
    if diverged is None:
        return None
    return RollbackDecision(Status.ROLLBACK, diverged.seqno, diverged.reason)
