"""A bucket's statistics as kv_engine's STAT groups name them (`stats`, `vbucket-seqno`,
`vbucket-details`, `failovers`, `collections`): read-only views over its vbuckets, its memory
and its store. A mixin of `Bucket` (bucket.py)."""

from .eviction import BFILTER_FP_PROB, FULL_EVICTION, POLICIES
from .vbucket import VBucket, VBucketState


class BucketStats:
    """`Bucket`'s statistics (module docstring)."""

    __slots__ = ()

    def collection_stats(self) -> dict[str, int]:
        """Per collection over the vbuckets (kv_engine's `stats collections` keys): live documents
        in active vbuckets and the highest seqno in any."""
        out: dict[str, int] = {"manifest_uid": self.manifest.uid}
        for scope in self.manifest.scopes:
            for c in scope.collections:
                p = f"0x{scope.uid:x}:0x{c.uid:x}:"
                out[p + "items"] = sum(vb.collection_items(c.uid) for vb in self._vbuckets.values()
                                       if vb.state == VBucketState.ACTIVE)
                out[p + "high_seqno"] = max((vb.collection_high_seqno(c.uid) for vb in self._vbuckets.values()),
                                            default=0)
        return out

    def _select(self, vbid: int | None) -> list[VBucket]:
        if vbid is None:
            return [self._vbuckets[v] for v in sorted(self._vbuckets)]
        return [self.vbucket(vbid)]

    def vbucket_seqno_stats(self, vbid: int | None = None) -> dict[str, int]:
        """`stats vbucket-seqno [vb]`."""
        out: dict[str, int] = {}
        for vb in self._select(vbid):
            p = f"vb_{vb.id}:"
            snap_start, snap_end = vb.persisted_snapshot
            out.update({
                p + "high_seqno": vb.high_seqno,
                p + "abs_high_seqno": vb.high_seqno,
                p + "last_persisted_seqno": vb.persisted_seqno,
                p + "uuid": vb.uuid,
                p + "purge_seqno": vb.purge_seqno,
                p + "last_persisted_snap_start": snap_start,
                p + "last_persisted_snap_end": snap_end,
                p + "high_prepared_seqno": vb.high_seqno,
                p + "high_completed_seqno": vb.high_seqno,
                p + "max_visible_seqno": vb.max_visible_seqno,
            })
        return out

    def vbucket_details_stats(self, vbid: int | None = None) -> dict[str, int | str]:
        """`stats vbucket-details [vb]`: "vb_N" is the state name, then vb_N:<stat>."""
        out: dict[str, int | str] = {}
        for vb in self._select(vbid):
            stats = vb.stats()
            out[f"vb_{vb.id}"] = stats.pop("state")
            out.update({f"vb_{vb.id}:{k}": v for k, v in stats.items()})
            out.update({f"vb_{vb.id}:checkpoint_{k}": v for k, v in vb.checkpoint_manager.stats().items()})
        return out

    def failovers_stats(self, vbid: int | None = None) -> dict[str, int]:
        """`stats failovers [vb]`: vb_N:num_entries and vb_N:<i>:id / vb_N:<i>:seq, newest first."""
        out: dict[str, int] = {}
        for vb in self._select(vbid):
            entries = vb.failover.entries
            out[f"vb_{vb.id}:num_entries"] = len(entries)
            out[f"vb_{vb.id}:num_erroneous_entries_erased"] = 0
            for i, entry in enumerate(entries):
                out[f"vb_{vb.id}:{i}:id"] = entry.uuid
                out[f"vb_{vb.id}:{i}:seq"] = entry.seqno
        return out

    def stats(self) -> dict[str, int]:
        """Bucket-wide counters (`stats` with no group)."""
        by_state = {s: 0 for s in VBucketState}
        items = {s: 0 for s in VBucketState}
        resident = {s: 0 for s in VBucketState}  # documents with their value in memory
        queue = 0
        full = self.eviction_policy == FULL_EVICTION
        for vb in self._vbuckets.values():
            by_state[vb.state] += 1
            items[vb.state] += vb.num_items
            resident[vb.state] += vb.resident_entries() - vb.num_deleted if not full else vb.resident_entries()
            queue += vb.high_seqno - vb.persisted_seqno
        mem = self.memory
        if not full:  # every key is in memory; the values the pager evicted and reads brought back
            non_resident = max(0, mem.num_value_evictions - mem.num_bg_fetches)
            resident[VBucketState.ACTIVE] -= non_resident
        filters = [vb._filter for vb in self._vbuckets.values() if vb._filter is not None]

        def perc(state: VBucketState) -> int:
            n = items[state]
            return 100 if n == 0 else max(0, min(100, 100 * resident[state] // n))
        return {
            "curr_items": items[VBucketState.ACTIVE],
            "curr_items_tot": sum(items.values()),
            "vb_active_num": by_state[VBucketState.ACTIVE],
            "vb_replica_num": by_state[VBucketState.REPLICA],
            "vb_pending_num": by_state[VBucketState.PENDING],
            "vb_dead_num": by_state[VBucketState.DEAD],
            "vb_replica_curr_items": items[VBucketState.REPLICA],
            "ep_queue_size": queue,
            "ep_total_persisted": self.flusher.items_flushed,
            "ep_num_vbuckets": self.num_vbuckets,
            "ep_item_eviction_policy": POLICIES[self.eviction_policy],
            "vb_active_perc_mem_resident": perc(VBucketState.ACTIVE),
            "vb_replica_perc_mem_resident": perc(VBucketState.REPLICA),
            "ep_num_non_resident": max(0, sum(items.values()) - sum(resident.values())),
            "vb_active_num_non_resident": max(0, items[VBucketState.ACTIVE] - resident[VBucketState.ACTIVE]),
            "ep_bfilter_enabled": int(full),
            "ep_bfilter_fp_prob": BFILTER_FP_PROB,
            "ep_bfilter_key_count": sum(f.capacity for f in filters),
            "ep_bfilter_memory": sum(f.size_in_bits for f in filters) // 8,
            **self.memory.stats(),
        }
