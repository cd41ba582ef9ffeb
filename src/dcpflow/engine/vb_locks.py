"""GET_LOCKED / UNLOCK_KEY (BinaryProtocol.md#0x94-get-locked) on a vbucket: `locks` maps a key to
(lock CAS, unlock time). Memory only, like Couchbase's: a restart, a state change or a rollback
forgets them. The same dict blocks a key with a sync write in progress (SYNC_BLOCK), so every write
path that honours locks refuses other writes to it, and a write without either pays one truth test
of an empty dict. A mixin of VBucket (vbucket.py), whose slots it uses.
"""

import dataclasses
import math

from dcpflow.protocol.status import Status

from .errors import EngineError
from .item import Item

#: The `locks` entry of a key with a sync write in progress: every write path that honours
#: GET_LOCKED's locks already looks there (and only when the dict is not empty), so refusing
#: other writes to such a key (SYNC_WRITE_IN_PROGRESS) costs a write without one nothing.
SYNC_BLOCK = (None, math.inf)


def in_progress(key) -> EngineError:
    return EngineError(Status.SYNC_WRITE_IN_PROGRESS, f"a sync write of {key!r} is in progress; retry once it "
                       "completes")


class Locks:
    """GET_LOCKED's locks (module docstring)."""

    __slots__ = ()

    def lock_cas(self, key: bytes, now: float | None = None) -> int | None:
        """The CAS of the key's unexpired lock, or None; an expired lock is released here (lazily,
        as the page says Couchbase does)."""
        lock = self.locks.get(key)
        if lock is None or lock is SYNC_BLOCK:
            return None
        if lock[1] <= (self._clock() if now is None else now):
            del self.locks[key]
            return None
        return lock[0]

    def _check_lock(self, key: bytes, cas: int, now: float) -> None:
        """A mutation of a locked document needs the lock's CAS (it then releases the lock); a key
        with a sync write in progress takes no other write until it completes."""
        if self.locks.get(key) is SYNC_BLOCK:
            raise in_progress(key)
        lock = self.lock_cas(key, now)
        if lock is not None and cas != lock:
            raise EngineError(Status.LOCKED, f"key {key!r} is locked (GET_LOCKED): mutate it with the CAS the "
                              "lock returned, UNLOCK_KEY it, or wait for the lock to expire")

    def get_locked(self, key: bytes, lock_time: float) -> Item:
        """Lock the live document for `lock_time` seconds and return it with a new CAS, the lock's.

        The new CAS is the document's from now on (Document.md: locking hides the old one), but it
        is not a new version: no seqno, nothing queued, nothing for DCP. A restart brings back the
        persisted CAS."""
        self._check_active()
        if self.prepares and key in self.prepares:
            raise in_progress(key)
        now = self._clock()
        live = self._live(key, now)
        if live is None:
            raise self._enoent(key)
        if self.lock_cas(key, now) is not None:
            raise EngineError(Status.LOCKED, f"key {key!r} is already locked (GET_LOCKED): wait for the lock "
                              "to expire or for its holder to unlock it")
        live = self._resident(live)
        cas = self.hlc.next()
        item = dataclasses.replace(live, cas=cas)
        self.ht[key] = item
        self.locks[key] = (cas, now + lock_time)
        return item

    def unlock(self, key: bytes, cas: int) -> None:
        """UNLOCK_KEY's decision tree: ENOENT, NotLocked, Locked (wrong CAS), or unlocked."""
        self._check_active()
        now = self._clock()
        if self._live(key, now) is None:
            raise self._enoent(key)
        lock = self.lock_cas(key, now)
        if lock is None:
            raise EngineError(Status.NOT_LOCKED, f"key {key!r} is not locked")
        if cas != lock:
            raise EngineError(Status.LOCKED, f"key {key!r} is locked with another CAS: UNLOCK_KEY needs the one "
                              "GET_LOCKED returned")
        del self.locks[key]
