"""Sync writes on a vbucket (durability/): `prepare` queues a prepare that takes a seqno but not the
hash table, and blocks its key (SYNC_BLOCK in `locks`, vb_locks.py) until the active's monitor
commits it (`seqno_ack`, the flusher, `complete_sync_writes`) or aborts it at its deadline; the
commit is the key's new version at a seqno of its own. A replica's passive monitor moves the high
prepared seqno (`hps`) it acknowledges as prepares arrive (vb_replica.py) and persist. Becoming
active adopts the prepares held, without deadlines, and reads of their keys answer
SYNC_WRITE_RE_COMMIT_IN_PROGRESS until they are committed again. `hps`, `hcs` and the prepares
persist through the flusher. A mixin of VBucket (vbucket.py), whose slots it uses.
"""

import math
from collections.abc import Callable

from dcpflow.protocol.dcp import VBucketState
from dcpflow.protocol.status import Status

from .durability import DEFAULT_TIMEOUT, ActiveDurabilityMonitor, Outcome, PassiveDurabilityMonitor, Topology
from .durability.items import Abort, Commit, Prepare, make_abort, make_commit, make_prepare
from .durability.requirements import Level
from .errors import EngineError
from .item import DeleteSource, Item, retain_system_xattrs
from .vb_locks import SYNC_BLOCK, in_progress

_ACTIVE = VBucketState.ACTIVE
LEVELS = (Level.MAJORITY, Level.MAJORITY_AND_PERSIST_ON_MASTER, Level.PERSIST_TO_MAJORITY)


def recommit_in_progress(key) -> EngineError:
    return EngineError(Status.SYNC_WRITE_RE_COMMIT_IN_PROGRESS, f"the sync write of {key!r} this vbucket took over "
                       "(failover or restart) is being committed again; retry")


class SyncWrites:
    """Prepares, commits, aborts and the durability monitors (module docstring)."""

    __slots__ = ()

    def _start_monitor(self) -> None:
        """The monitor of the vbucket's side. A replica that becomes active adopts the prepares it
        holds without deadlines (the old active may have committed them: they are driven to commit)."""
        if self.state == _ACTIVE:
            if self.adm is None:
                self.adm = ActiveDurabilityMonitor(self.topology, self.persisted_seqno)
                self.adm.adopt(sorted(self.prepares.values(), key=lambda p: p.by_seqno))
                self.recommitting = set(self.prepares)
            self.pdm = None
            for key in self.prepares:
                self.locks[key] = SYNC_BLOCK
        else:
            if self.adm is not None:  # writers waiting on this copy will not hear from it: ambiguous
                for sw in list(self.adm.tracked.values()):
                    for callback in sw.waiters:
                        callback(Outcome.ABORTED)
            self.recommitting = set()
            if self.pdm is None:
                self.pdm = PassiveDurabilityMonitor(self.hps, self.hcs)
                self.pdm.snapshot_end_received = self.high_seqno
                self.pdm.persisted_seqno = self.persisted_seqno
                for p in sorted(self.prepares.values(), key=lambda p: p.by_seqno):
                    self.pdm.received(p)
            self.adm = None

    def set_topology(self, chain) -> None:
        """The first replication chain (active name first; None: an unassigned replica), or None."""
        self.topology = None if chain is None else Topology.of(chain)
        if self.adm is not None:
            self.adm.set_topology(self.topology)

    def prepare(self, key, value: bytes = b"", *, level: int, mode: str = "set", flags: int = 0, expiry: int = 0,
                datatype: int = 0, cas: int = 0, timeout: float | None = None) -> Prepare:
        """Begin a sync write: `mode` set / add / replace / delete, checked as that write is.

        The prepare is queued and tracked; the caller learns the outcome with `on_complete`.
        DURABILITY_IMPOSSIBLE when the chain has too few nodes for a majority."""
        self._check_sync_write(key, level)
        now = self._clock()
        deleted = False
        delete_time = 0
        if mode == "set":
            prev = self._live(key, now)
            if self.locks:
                self._check_lock(key, cas, now)
            if cas:
                self._check_cas(key, prev, cas)
            prev = self._lookup(key, True)
        elif mode == "add":
            if cas:
                raise EngineError(Status.EINVAL, "add does not take a CAS")
            if self._live(key, now) is not None:
                raise EngineError(Status.KEY_EEXISTS, f"key {key!r} already exists")
            prev = self._lookup(key, True)
        elif mode in ("replace", "delete"):
            prev = self._writable(key, cas, now)
            if mode == "delete":
                prev = self._resident(prev)  # its system xattrs are kept
                value, datatype = retain_system_xattrs(prev.value, prev.datatype)
                flags, deleted, delete_time = prev.flags, True, int(now)
        else:
            raise ValueError(f"unknown sync write mode {mode!r}")
        expiry = self._expiry(key, expiry, now) if not deleted else 0
        cid, bkey = key if key.__class__ is tuple else (0, key)
        item = Item(bkey, value, flags, expiry, self.hlc.next(), self._next_rev(prev), self.high_seqno + 1, datatype,
                    deleted, delete_time, DeleteSource.EXPLICIT, cid)
        return self._begin_sync_write(key, item, level, timeout, now)

    def prepare_version(self, key, prev: Item | None, value: bytes, *, level: int, timeout: float | None = None,
                        flags: int = 0, expiry: int = 0, datatype: int = 0, deleted: bool = False, cas: int = 0,
                        finish: Callable[[int, int], bytes] | None = None) -> Prepare:
        """`write_version` as a sync write (a durable sub-document mutation): the version is prepared."""
        self._check_sync_write(key, level)
        item, now = self._next_version(key, prev, value, flags, expiry, datatype, deleted, cas, finish)
        return self._begin_sync_write(key, item, level, timeout, now)

    def _check_sync_write(self, key, level: int) -> None:
        self._check_active()
        if level not in LEVELS:
            raise EngineError(Status.DURABILITY_INVALID_LEVEL, f"durability level {level} is not 1..3")
        if not self.adm.possible:
            why = ("no replication chain is set for it" if self.topology is None else
                   f"its chain has {1 + len(self.topology.replicas)} of the {self.topology.majority} nodes "
                   "a majority needs")
            raise EngineError(Status.DURABILITY_IMPOSSIBLE, f"vbucket {self.id} cannot meet a durability level: "
                              f"{why}")
        if key in self.prepares:
            raise in_progress(key)

    def _begin_sync_write(self, key, item: Item, level: int, timeout: float | None, now: float) -> Prepare:
        prepare = make_prepare(item, level)
        self._queue_sync(prepare)
        self.prepares[key] = prepare
        self.locks[key] = SYNC_BLOCK
        self.adm.track(prepare, level, now + (DEFAULT_TIMEOUT if timeout is None else timeout))
        return prepare

    def on_complete(self, prepare: Prepare, callback: Callable[[Outcome], None]) -> None:
        """Call `callback(outcome)` once the prepare is committed or aborted (at once if it is)."""
        sw = self.adm.tracked.get(prepare.by_seqno) if self.adm is not None else None
        if sw is None:
            raise EngineError(Status.EINVAL, f"seqno {prepare.by_seqno} is not a tracked prepare")
        sw.waiters.append(callback)

    def seqno_ack(self, node: str, seqno: int) -> list:
        """A replica acknowledged every prepare up to `seqno` (DCP_SEQNO_ACK); completes what it can."""
        if self.adm is None:
            return []
        self.adm.seqno_ack(node, seqno)
        return self.complete_sync_writes()

    def complete_sync_writes(self, now: float | None = None) -> list:
        """Commit every satisfied prepare and abort every expired one; returns [(prepare, outcome)]."""
        adm = self.adm
        if adm is None or not adm.tracked:
            return []
        adm.persisted(self.persisted_seqno)
        done = []
        for sw in adm.ready():
            adm.forget(sw.prepare.by_seqno)
            self._commit(sw.prepare)
            done.append((sw, Outcome.COMMITTED))
        now = self._clock() if now is None else now
        for sw in adm.expired(now):
            adm.forget(sw.prepare.by_seqno)
            self._abort(sw.prepare)
            done.append((sw, Outcome.ABORTED))
        for sw, outcome in done:
            for callback in sw.waiters:
                callback(outcome)
        return [(sw.prepare, outcome) for sw, outcome in done]

    def next_sync_deadline(self) -> float:
        return self.adm.next_deadline() if self.adm is not None else math.inf

    def _commit(self, prepare: Prepare) -> Commit:
        key = prepare.key if not prepare.cid else (prepare.cid, prepare.key)
        commit = make_commit(prepare, self.high_seqno + 1)
        del self.prepares[key]
        self.locks.pop(key, None)
        self.recommitting.discard(key)
        self._queue(commit)
        self.checkpoint_manager.mark_sync()
        self._completed(prepare.by_seqno)
        return commit

    def _abort(self, prepare: Prepare) -> Abort:
        key = prepare.key if not prepare.cid else (prepare.cid, prepare.key)
        abort = make_abort(prepare, self.high_seqno + 1, self.hlc.next(), int(self._clock()))
        del self.prepares[key]
        self.locks.pop(key, None)
        self.recommitting.discard(key)
        self._queue_sync(abort)
        self._completed(prepare.by_seqno)
        return abort

    def _queue_sync(self, item: Item) -> None:
        """Queue a prepare or an abort: a seqno, the checkpoints, the flusher, no hash table."""
        self.checkpoint_manager.queue_sync(item)
        if item.cid:
            self.collections.note_other(item.by_seqno, self.high_seqno)
        self.high_seqno = item.by_seqno
        if item.__class__ is Prepare and self.state == _ACTIVE:
            self.hps = item.by_seqno  # a replica's moves as it acknowledges (passive_monitor.py)
        if self._dirty is not None:
            self._dirty[self.id] = None
        if self._on_seqno is not None:
            self._on_seqno(self.id, item.by_seqno)

    def persisted(self, seqno: int, hps: int, hcs: int) -> None:
        """The flusher made everything up to `seqno` durable (with these high prepared/completed seqnos)."""
        self.persisted_hps = max(self.persisted_hps, hps)
        self.persisted_hcs = max(self.persisted_hcs, hcs)
        if self.pdm is not None and self.pdm.persisted(seqno):
            self.hps = self.pdm.hps
        elif self.adm is not None:
            self.adm.persisted(seqno)

    def _completed(self, prepared_seqno: int) -> None:
        if prepared_seqno > self.hcs:
            self.hcs = prepared_seqno
        if self.pdm is not None:
            self.pdm.completed(prepared_seqno)
