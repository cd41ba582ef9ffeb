"""Offsets of the `dcp` source and the planning done on the driver: plain JSON, pure functions.

An offset is what Spark writes to the checkpoint's offset log before a micro-batch runs and hands
back to `partitions(start, end)` when it (re)runs it, so everything a read needs is in it:

    {"batch": 7,                          # the micro-batch's number: rows get _commit_version = 7
     "resets": [12],                      # vbuckets this batch re-reads from seqno 0 (rollback)
     "vbuckets": {"0": [1234, 88], "1": [1234, 90, 85, 95], ...}}

A vbucket's offset is the client's `Offset` in its compact JSON form (dcpflow.client.offsets):
[vbuuid, seqno], or [vbuuid, seqno, snapshot_start, snapshot_end] when the read stopped inside a
snapshot. Compact on purpose: Spark writes every end offset to the offset log and puts three
(start, end, latest) in each progress report, and the driver parses them in every planning call;
with 1024 vbuckets the object form ({"vbuuid": ..., "seqno": ..., ...}, still accepted) is
several times larger to write, and to parse.

Per vbucket the range of a batch is (start seqno, end seqno] on the history named by the vbuuid.
`batch` only grows, so ordering rows by (_commit_version, seqno) orders them per key even across a
re-read that starts the vbucket's seqnos again from 0. `resets` of an end offset is about that
batch only; as the next start offset it means nothing.

The first batch is special: Spark logs only end offsets, and gets its start by calling
`initialOffset()` again when it (re)runs that batch - after a driver restart, on a new reader,
where startingOffsets=latest names newer seqnos than the ones the batch was planned from (the
seqnos between would be skipped). So an initial offset says `"initial": true`, and an end offset
planned from one carries that start as `"origin"` (its vbuckets are the offset's; those that start
from seqno 0 are left out); `ranges` reads from the origin.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from dcpflow.client.offsets import BEGINNING, Offset, OffsetError, offsets_from_json, offsets_to_json, vbucket_id
from dcpflow.protocol.failover import divergence


class HistoryDiverged(RuntimeError):
    """rollback=fail and a vbucket's history changed since the committed offset."""


EARLIEST = BEGINNING
_new = tuple.__new__


@dataclass(frozen=True)
class OffsetSpec:
    """A user's startingOffsets/endingOffsets JSON: per vbucket an offset or 'earliest'/'latest'."""

    vbuckets: dict[int, Offset | str]
    batch: int = 0


@dataclass
class SourceOffset:
    """A whole offset of the source (see the module docstring)."""

    vbuckets: dict[int, Offset]
    batch: int = 0
    resets: frozenset[int] = field(default_factory=frozenset)
    initial: bool = False  # the query's starting point (initialOffset), not the end of a batch
    origin: dict[int, Offset] | None = None  # the first batch's start (module docstring)
    #: with the `collections` option: each name's collection id when the batch was planned
    collections: dict[str, int] | None = None
    #: this batch only: ids that took a name since the start offset ...
    added: frozenset[int] = field(default_factory=frozenset)
    #: ... and ids whose name went or moved to another id (id -> name: dropped, a `drop` row each)
    dropped: dict[int, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        doc: dict = {"batch": self.batch}
        if self.initial:
            doc["initial"] = True
        if self.resets:
            doc["resets"] = sorted(self.resets)
        doc["vbuckets"] = offsets_to_json(self.vbuckets)
        if self.origin is not None:  # its vbuckets are the offset's; those from seqno 0 go unsaid
            doc["origin"] = offsets_to_json({vb: o for vb, o in self.origin.items() if o != EARLIEST})
        if self.collections is not None:
            doc["collections"] = dict(sorted(self.collections.items()))
        if self.added:
            doc["added"] = sorted(self.added)
        if self.dropped:
            doc["dropped"] = {str(cid): name for cid, name in sorted(self.dropped.items())}
        return doc

    @classmethod
    def from_json(cls, doc) -> SourceOffset:
        if isinstance(doc, str):
            doc = json.loads(doc)
        if not isinstance(doc, dict) or "vbuckets" not in doc:
            raise OffsetError(f"not a dcp source offset (no 'vbuckets'): {str(doc)[:200]}")
        vbuckets = offsets_from_json(doc["vbuckets"])
        origin = None
        if "origin" in doc:
            origin = dict.fromkeys(vbuckets, EARLIEST)
            origin.update(offsets_from_json(doc["origin"], "origin "))
        colls = doc.get("collections")
        if colls is not None and (not isinstance(colls, dict) or
                                  not all(isinstance(k, str) and type(v) is int for k, v in colls.items())):
            raise OffsetError(f"'collections' of a dcp source offset must map names to ids: {str(colls)[:200]}")
        return cls(vbuckets, int(doc.get("batch", 0)), frozenset(int(v) for v in doc.get("resets", ())),
                   bool(doc.get("initial", False)), origin, colls,
                   frozenset(int(c) for c in doc.get("added", ())),
                   {int(c): str(n) for c, n in doc.get("dropped", {}).items()})


def parse_vbucket_offsets(doc) -> OffsetSpec:
    """startingOffsets/endingOffsets JSON: either a whole source offset (as found in a checkpoint's
    offset log or a query's progress) or just {"<vb>": offset | "earliest" | "latest"}."""
    if not isinstance(doc, dict):
        raise OffsetError(f"expected a JSON object keyed by vbucket id, got {type(doc).__name__}")
    batch = 0
    if "vbuckets" in doc:
        batch = doc.get("batch", 0)
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 0:
            raise OffsetError(f"'batch' must be a non-negative integer, got {batch!r}")
        doc = doc["vbuckets"]
        if not isinstance(doc, dict):
            raise OffsetError("'vbuckets' must be an object keyed by vbucket id")
    out: dict[int, Offset | str] = {}
    for key, value in doc.items():
        vb = vbucket_id(key)
        if isinstance(value, str) and value.lower() in ("earliest", "latest"):
            out[vb] = value.lower()
        else:
            out[vb] = Offset.from_json(value, f"vbucket {key}")
    if not out:
        raise OffsetError("no vbucket given")
    return OffsetSpec(out, batch)


# ---------------------------------------------------------------------------------------------
# Planning


def resolve(spec: str | OffsetSpec, vbuckets: Iterable[int], high: Mapping[int, int],
            uuids: Mapping[int, int], default: str = "earliest") -> dict[int, Offset]:
    """Turn 'earliest' / 'latest' / a spec into a concrete offset for every vbucket read.
    `high` are the high seqnos now, `uuids` the newest vbuuid of each vbucket; a vbucket missing
    from a JSON spec takes `default`."""
    out = {}
    for vb in vbuckets:
        choice = spec if isinstance(spec, str) else spec.vbuckets.get(vb, default)
        if choice == "earliest":
            out[vb] = EARLIEST
        elif choice == "latest":
            out[vb] = Offset.at(uuids[vb], high[vb])
        else:
            out[vb] = choice
    return out


def diverged(offset: Offset, failover_log: list[tuple[int, int]], high_seqno: int) -> bool:
    """Has this vbucket's history changed since `offset` was read? (the driver's check, and the
    worker's before it reads)

    Conservative on purpose: any failover entry newer than the offset's vbuuid counts, not only
    one that branched below the offset's seqno. The driver plans ranges from high seqnos and cannot
    know whether the last read stopped inside a snapshot, and DCP de-duplicates inside a snapshot,
    so a reader that stopped mid-snapshot may lack a version the new branch kept - the reason the
    server would roll it back to the snapshot start. Re-reading one vbucket costs 1/N of the
    bucket and is always exact; see docs/spark.md. On the newest branch the rule every DCP
    consumer shares decides (dcpflow.protocol.failover): a high seqno below the offset (history
    went backwards) counts too.
    """
    if offset.seqno == 0:
        return False
    if not failover_log or failover_log[0][0] != offset.vbuuid:
        return True
    return divergence(failover_log, offset.vbuuid, offset.seqno, offset.snapshot_start, offset.snapshot_end,
                      high_seqno) is not None


def fair_share(pending: Mapping[int, int], budget: int | None, rotate: int = 0,
               first: Iterable[int] = ()) -> dict[int, int]:
    """Split a budget of seqnos over vbuckets so that each gets min(its pending, a common level):
    no vbucket starves behind a busy one. Units left over by rounding go one each to the vbuckets
    in `first` (rollback re-reads), then round-robin starting at `rotate`, so over successive
    batches every vbucket moves even when the budget is smaller than the number of vbuckets."""
    if budget is None or sum(pending.values()) <= budget:
        return dict(pending)
    vbs = sorted(v for v, p in pending.items() if p > 0)
    # Largest level L with sum(min(p, L)) <= budget, by bisection over [0, max pending].
    lo, hi = 0, max(pending[v] for v in vbs)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(min(pending[v], mid) for v in vbs) <= budget:
            lo = mid
        else:
            hi = mid - 1
    share = {v: min(pending[v], lo) for v in pending}
    left = budget - sum(share.values())
    prio = [v for v in first if v in share]
    order = prio + [vbs[(rotate + i) % len(vbs)] for i in range(len(vbs))] if vbs else prio
    for v in order:
        if left <= 0:
            break
        if share[v] < pending[v]:
            share[v] += 1
            left -= 1
    return share


def plan(start: SourceOffset, high: Mapping[int, int], failover: Mapping[int, list[tuple[int, int]]],
         budget: int | None = None, policy: str = "reread", collections: Mapping[str, int] | None = None
         ) -> SourceOffset:
    """The end offset of the next micro-batch (admission control and rollback detection).

    For each vbucket: if its history diverged, plan a re-read from 0 (listed in `resets`), or raise
    with policy 'fail'; then give it min(pending, fair share of `budget`) seqnos. Returns `start`
    itself (same batch number) when there is nothing to read, so Spark runs no empty batch.

    `collections` (the `collections` option: each name's id, resolved after `high` was read) is
    kept in the end offset. A name whose id differs from the start offset's was dropped and made
    again (or dropped): the new id is `added` to what the ranges read and the old one `dropped` (a
    `drop` row: its documents leave the state); either makes a batch even when no seqno moved.
    """
    resets = set()
    pending: dict[int, int] = {}
    for vb, off in start.vbuckets.items():
        if vb not in high:
            continue
        log = failover.get(vb, [])
        if diverged(off, log, high[vb]):
            if policy == "fail":
                raise HistoryDiverged(
                    f"vbucket {vb}: the committed offset (vbuuid {off.vbuuid}, seqno {off.seqno}) is not on the "
                    f"server's current history (newest failover entry {log[0] if log else None}, high seqno "
                    f"{high[vb]}); rollback=fail stops here. Use rollback=reread to re-read the vbucket.")
            resets.add(vb)
            pending[vb] = high[vb]
        else:
            pending[vb] = max(0, high[vb] - off.seqno)
    share = fair_share(pending, budget, rotate=start.batch, first=sorted(resets))
    ends: dict[int, Offset] = {}
    real_resets = set()
    for vb, off in start.vbuckets.items():
        n = share.get(vb, 0)
        newest = failover[vb][0][0] if failover.get(vb) else off.vbuuid
        if vb in resets and (n > 0 or high.get(vb, 0) == 0):
            real_resets.add(vb)
            ends[vb] = Offset.at(newest, n)
        elif n > 0:
            seqno = off.seqno + n
            ends[vb] = Offset(newest if off.seqno == 0 else off.vbuuid, seqno, seqno, seqno, off.manifest_uid)
        else:
            ends[vb] = off
    added: frozenset[int] = frozenset()
    dropped: dict[int, str] = {}
    prev = start.collections
    if collections is not None and prev is not None:
        added = frozenset(cid for name, cid in collections.items() if prev.get(name) != cid)
        dropped = {cid: name for name, cid in prev.items() if collections.get(name) != cid}
    if not real_resets and not added and not dropped and all(ends[vb] == start.vbuckets[vb] for vb in ends):
        return start
    return SourceOffset(ends, start.batch + 1, frozenset(real_resets),
                        origin=dict(start.vbuckets) if start.initial else None,
                        collections=dict(collections) if collections is not None else prev, added=added,
                        dropped=dropped)


@dataclass(frozen=True, slots=True)
class VbRange:
    """What one vbucket contributes to a micro-batch: stream (start, end] on `start.vbuuid`'s
    history, or (reset) a rollback marker then everything from 0 to `end_seqno`."""

    vbucket: int
    start: Offset
    end_seqno: int
    end_vbuuid: int
    reset: bool = False
    #: the collection ids to read (planned from the `collections` names), or None: the options' filter
    cids: tuple[int, ...] | None = None
    #: the ids taken from the start offset's `dropped`: a `drop` row each, id -> name
    dropped: tuple[tuple[int, str], ...] = ()

    @property
    def weight(self) -> int:
        return self.end_seqno - (0 if self.reset else self.start.seqno)

    def __reduce__(self):
        # Spark pickles every range of a batch into its tasks: as field tuples, not with the
        # dataclass default, which builds a state per object via fields().
        return _range, (self.vbucket, *self.start, self.end_seqno, self.end_vbuuid, self.reset, self.cids,
                        self.dropped)


def _range(vbucket, vbuuid, seqno, snapshot_start, snapshot_end, manifest_uid, end_seqno, end_vbuuid,
           reset, cids=None, dropped=()) -> VbRange:
    return VbRange(vbucket, _new(Offset, (vbuuid, seqno, snapshot_start, snapshot_end, manifest_uid)), end_seqno,
                   end_vbuuid, reset, cids, dropped)


def ranges(start: SourceOffset, end: SourceOffset) -> list[VbRange]:
    """The per-vbucket work between two offsets (what `partitions(start, end)` splits). An end
    offset with an origin was planned from that start, whatever `start` says now.

    With planned collection ids (`end.collections`), a range reads the ids its start knew (those
    of the start offset, or of the end for a first batch, which had none) - a dropped one's last
    documents and drop event included - and the `added` ones, from the same start: the driver
    resolves the names after it reads the high seqnos, so an id it did not see yet made all its
    documents after the ends it planned (a re-read from 0 reads the same ids: the reader leaves out
    those dropped by then); every `dropped` id rides with each vbucket's range, for its `drop` row."""
    base = end.origin if end.origin is not None else start.vbuckets
    cids = None
    if end.collections is not None:
        known = start.collections if start.collections is not None and end.origin is None else end.collections
        cids = tuple(sorted(set(known.values()) | end.added))
    dropped = tuple(sorted(end.dropped.items()))
    out = []
    for vb, e in sorted(end.vbuckets.items()):
        s = base.get(vb, EARLIEST)
        if vb in end.resets:
            out.append(VbRange(vb, EARLIEST, e.seqno, e.vbuuid, reset=True, cids=cids, dropped=dropped))
        elif e.seqno > s.seqno or dropped:
            out.append(VbRange(vb, s, max(e.seqno, s.seqno), e.vbuuid, cids=cids, dropped=dropped))
    return out


def group(work: list[VbRange], n: int) -> list[list[VbRange]]:
    """Put vbucket ranges into at most `n` groups of about equal weight (largest first onto the
    lightest group). Every Spark task has a fixed cost (a Python worker round trip, and a file per task per batch
    in a file sink) far above a small vbucket's reading, so a micro-batch wants about one task per
    core, not one per vbucket. Deterministic for the same input."""
    if not work:
        return []
    n = max(1, min(n, len(work)))
    groups: list[list[VbRange]] = [[] for _ in range(n)]
    loads = [0] * n
    for r in sorted(work, key=lambda r: (-max(r.weight, 1), r.vbucket)):
        i = min(range(n), key=lambda j: (loads[j], j))
        groups[i].append(r)
        loads[i] += max(r.weight, 1)
    return [sorted(g, key=lambda r: r.vbucket) for g in groups if g]
