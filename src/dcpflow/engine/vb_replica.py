"""The replica application path of a vbucket: what a DCP consumer (PassiveStream) calls on a replica
or pending vbucket - `snapshot_marker`, then `apply_*` for each item of the snapshot, stored with
the metadata it is given unchanged (no conflict resolution, no new CAS), seqnos strictly rising
inside the marker's range. Prepares, commits and aborts (`apply_prepare` / `apply_commit` /
`apply_abort`) keep the vbucket's prepares and its passive durability monitor (vb_sync_writes.py)
in step. A mixin of VBucket (vbucket.py), whose slots it uses.
"""

from dcpflow.protocol.status import Status

from .checkpoint import CheckpointType
from .durability.items import Abort, Commit, Prepare, make_abort, make_commit, make_prepare
from .durability.requirements import Level
from .errors import EngineError
from .item import DeleteSource, Item
from .vb_sync_writes import LEVELS
from .vb_with_meta import MAX_META_CAS, MAX_REV_SEQNO, cas_too_big, rev_too_big


class ReplicaApply:
    """A replica's snapshot markers and items (module docstring)."""

    __slots__ = ()

    def snapshot_marker(self, start: int, end: int, *, disk: bool = False) -> None:
        """Begin a snapshot received over DCP: a new checkpoint with this range and type."""
        self._check_replica()
        if start > end:
            raise EngineError(Status.EINVAL, f"snapshot start {start} is above its end {end}")
        if end < self.high_seqno:
            raise EngineError(Status.ERANGE, f"snapshot end {end} is below the high seqno {self.high_seqno}")
        ctype = CheckpointType.DISK if disk else CheckpointType.MEMORY
        if self.pdm is not None:  # a new marker: everything of the snapshot before it arrived
            self.pdm.snapshot_received(self.high_seqno)
            self.hps = self.pdm.hps
        self.checkpoint_manager.create_checkpoint(start, end, ctype)
        self.snapshot_start, self.snapshot_end = start, end

    def apply_mutation(self, key: bytes, value: bytes, *, by_seqno: int, cas: int, rev_seqno: int,
                       flags: int = 0, expiry: int = 0, datatype: int = 0) -> Item:
        """Store a replicated mutation exactly as given (no conflict resolution, no new CAS)."""
        cid, key = key if key.__class__ is tuple else (0, key)
        return self._apply(Item(key, value, flags, expiry, cas, rev_seqno, by_seqno, datatype, cid=cid))

    def apply_deletion(self, key: bytes, *, by_seqno: int, cas: int, rev_seqno: int, delete_time: int = 0,
                       value: bytes = b"", datatype: int = 0, flags: int = 0,
                       expiration: bool = False) -> Item:
        """Store a replicated deletion (or, with expiration=True, an expiration)."""
        source = DeleteSource.TTL if expiration else DeleteSource.EXPLICIT
        cid, key = key if key.__class__ is tuple else (0, key)
        return self._apply(Item(key, value, flags, 0, cas, rev_seqno, by_seqno, datatype, True,
                                delete_time or int(self._clock()), source, cid))

    def apply_expiration(self, key: bytes, *, by_seqno: int, cas: int, rev_seqno: int,
                         delete_time: int = 0, value: bytes = b"", datatype: int = 0) -> Item:
        return self.apply_deletion(key, by_seqno=by_seqno, cas=cas, rev_seqno=rev_seqno,
                                   delete_time=delete_time, value=value, datatype=datatype, expiration=True)

    def _apply(self, item: Item) -> Item:
        self._check_replica()
        if item.cas > MAX_META_CAS:
            raise EngineError(Status.EINVAL, cas_too_big(item.cas))
        if item.rev_seqno > MAX_REV_SEQNO:
            raise EngineError(Status.EINVAL, rev_too_big(item.rev_seqno))
        seqno = item.by_seqno
        self._check_applicable(seqno)
        if self.prepares:
            # A version of a key whose prepare is held completes the prepare: a disk snapshot sends
            # a commit as the version it made.
            held = self.prepares.pop(item.key if not item.cid else (item.cid, item.key), None)
            if held is not None:
                self._completed(held.by_seqno)
        self.hlc.observe(item.cas)
        self._queue(item)
        if seqno >= self.snapshot_end and self.pdm is not None:
            self._snapshot_received(seqno)
        return item

    def _check_applicable(self, seqno: int) -> None:
        self._check_replica()
        if seqno <= self.high_seqno:
            raise EngineError(Status.ERANGE, f"seqno {seqno} is not above the high seqno {self.high_seqno}")
        if not self.snapshot_start <= seqno <= self.snapshot_end:
            raise EngineError(Status.ERANGE, f"seqno {seqno} is outside the current snapshot "
                              f"[{self.snapshot_start}, {self.snapshot_end}]")

    def _snapshot_received(self, seqno: int) -> None:
        if self.pdm.snapshot_received(seqno):
            self.hps = self.pdm.hps

    def apply_prepare(self, key, value: bytes, *, by_seqno: int, cas: int, rev_seqno: int, flags: int = 0,
                      expiry: int = 0, datatype: int = 0, deleted: bool = False, delete_time: int = 0,
                      level: int = Level.MAJORITY) -> Prepare:
        """Store a replicated DCP_PREPARE: queued and tracked, the key's readable version unchanged."""
        self._check_applicable(by_seqno)
        if level not in LEVELS:
            raise EngineError(Status.DURABILITY_INVALID_LEVEL, f"durability level {level} is not 1..3")
        cid, bkey = key if key.__class__ is tuple else (0, key)
        item = make_prepare(Item(bkey, value, flags, expiry, cas, rev_seqno, by_seqno, datatype, deleted,
                                 delete_time if deleted else 0, DeleteSource.EXPLICIT, cid), level)
        self.hlc.observe(cas)
        self._queue_sync(item)
        self.prepares[key] = item
        self.pdm.received(item)
        if by_seqno >= self.snapshot_end:
            self._snapshot_received(by_seqno)
        return item

    def apply_commit(self, key, *, prepared_seqno: int, commit_seqno: int) -> Commit:
        """A replicated DCP_COMMIT: the prepare it names becomes the key's version at commit_seqno."""
        self._check_applicable(commit_seqno)
        prepare = self._held_prepare(key, prepared_seqno, "DCP_COMMIT")
        commit = make_commit(prepare, commit_seqno)
        del self.prepares[key]
        self._queue(commit)
        self.checkpoint_manager.mark_sync()
        self._completed(prepared_seqno)
        if commit_seqno >= self.snapshot_end:
            self._snapshot_received(commit_seqno)
        return commit

    def apply_abort(self, key, *, prepared_seqno: int, abort_seqno: int) -> Abort:
        """A replicated DCP_ABORT. An abort may name a prepare this replica never received (the
        producer had nothing to send it: see ActiveStream "Sync writes"; KV-Engine accepts these
        too): it is queued all the same, so the seqnos and the high completed seqno go on."""
        self._check_applicable(abort_seqno)
        if key not in self.prepares and prepared_seqno > self.hcs:
            cid, bkey = key if key.__class__ is tuple else (0, key)
            prepare = Item(bkey, b"", 0, 0, 0, 0, prepared_seqno, 0, True, 0, DeleteSource.EXPLICIT, cid)
        else:
            prepare = self._held_prepare(key, prepared_seqno, "DCP_ABORT")
            del self.prepares[key]
        abort = make_abort(prepare, abort_seqno, prepare.cas, int(self._clock()))
        self._queue_sync(abort)
        self._completed(prepared_seqno)
        if abort_seqno >= self.snapshot_end:
            self._snapshot_received(abort_seqno)
        return abort

    def _held_prepare(self, key, prepared_seqno: int, what: str) -> Prepare:
        prepare = self.prepares.get(key)
        if prepare is None or prepare.by_seqno != prepared_seqno:
            held = "none" if prepare is None else f"seqno {prepare.by_seqno}"
            raise EngineError(Status.EINVAL, f"{what} for {key!r} names the prepare at seqno {prepared_seqno}, "
                              f"but this vbucket holds {held}")
        return prepare
