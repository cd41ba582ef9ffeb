"""Compaction of a bucket: which tombstones and how much history each vbucket keeps (the purge
age, the rollback history, the history retention of collections that keep it), the store's
purge in one transaction, and the dropped collections whose documents it removes. A mixin of
`Bucket` (bucket.py)."""

import json
import math

from .store_compaction import HistoryRetention, PurgeResult

DROPPED_META = "dropped_collections"  # the store's meta row of collections dropped but not yet purged


class BucketCompaction:
    """`Bucket`'s compaction (module docstring)."""

    __slots__ = ()

    def purge_dropped_collections(self) -> int:
        """Delete dropped collections' documents from the store, in every vbucket whose drop event
        is persisted (the others wait for a later call); returns how many documents. A collection
        purged everywhere is forgotten."""
        self._check_idle()
        if not self.dropped_collections:
            return 0
        pairs, waiting = [], set()
        for vb in self._vbuckets.values():
            dropped_at = vb.collections.dropped_at
            for cid in self.dropped_collections:
                if dropped_at.get(cid, 0) > vb.persisted_seqno:
                    waiting.add(cid)
                else:
                    pairs.append((vb.id, cid))
        n = self.store.purge_collections(pairs)
        if waiting != self.dropped_collections:
            self.dropped_collections = waiting
            self.store.set_meta(DROPPED_META, json.dumps(sorted(waiting)))
        return n

    def compact(self, vbid: int | None = None, now: float | None = None,
                keep_history: float | None = None) -> dict[int, PurgeResult]:
        """Purge persisted tombstones older than `purge_interval`, advancing purge seqnos.

        Also trims rollback history older than `rollback_history_seqnos` below the persisted
        high seqno (None keeps all of it), and with `keep_history` to at most that fraction of each
        vbucket's documents (the compaction a fragmented store gets: a rollback further back than
        what is kept resets the vbucket to 0, as a couchstore file's compacted headers do). The
        three steps apart (`compaction_plan`, `store.compact` on any thread, `finish_compaction`)
        let an owner keep serving while the store works.
        """
        self._check_idle()
        results = self.store.compact(self.compaction_plan(vbid, now, keep_history))
        self.finish_compaction(results)
        return results

    def compaction_plan(self, vbid: int | None = None, now: float | None = None,
                        keep_history: float | None = None) -> list[tuple]:
        """(vb, deleted_before, history floor, the history collections' retention, history rows to
        keep) for `Store.compact`."""
        self._check_open()
        now = self._clock() if now is None else now
        deleted_before = int(now - self.purge_interval)
        targets = [self.vbucket(vbid)] if vbid is not None else list(self._vbuckets.values())
        plan = []
        for vb in targets:
            floor = 0
            if self.rollback_history_seqnos is not None:
                floor = max(0, vb.persisted_seqno - self.rollback_history_seqnos)
            keep = HistoryRetention(tuple(sorted(vb.collections.history)), self.history_retention_seconds,
                                    self.history_retention_bytes, now)
            rows = None
            if keep_history is not None:
                rows = math.ceil(keep_history * (vb.num_items + vb.num_deleted))
            plan.append((vb.id, deleted_before, floor, keep, rows))
        return plan

    def finish_compaction(self, results: dict[int, PurgeResult]) -> None:
        """The store purged tombstones: drop the same versions from memory (a vbucket gone meanwhile
        is skipped), then purge dropped collections from the store."""
        for vbid, result in results.items():
            vb = self._vbuckets.get(vbid)
            if vb is not None:
                vb.on_purged(result)
        self.purge_dropped_collections()
