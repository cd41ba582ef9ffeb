"""Who a bucket tells about its changes: DCP streams wake on a vbucket's new high seqno and on a
dropped checkpoint cursor, the replication and persistence waiters on each flushed batch, the
server on vbucket state changes. A mixin of `Bucket` (bucket.py), whose listener lists it keeps."""

from collections.abc import Callable

SeqnoListener = Callable[[int, int], None]
#: listener(vbid, event): event is "state" (state changed), "rollback", "failover" (a new branch of
#: history on an active: `Bucket.failover`) or "deleted".
VBucketListener = Callable[[int, str], None]
#: listener(vbid, cursor_name): the vbucket's checkpoints dropped that cursor (memory, or on demand).
CursorListener = Callable[[int, str], None]


class BucketListeners:
    """`Bucket`'s listeners (module docstring)."""

    __slots__ = ()

    def add_seqno_listener(self, listener: SeqnoListener) -> None:
        """Call `listener(vbid, seqno)` whenever a vbucket's high seqno advances (on the owner
        thread, inside the write): DCP streams wake up on it. Keep it cheap and non-raising.

        Vbuckets only call back while someone listens: with no listener every write skips the call."""
        self._seqno_listeners.append(listener)
        if len(self._seqno_listeners) == 1:
            self._set_seqno_hook(self._notify_seqno)

    def remove_seqno_listener(self, listener: SeqnoListener) -> None:
        self._seqno_listeners.remove(listener)
        if not self._seqno_listeners:
            self._set_seqno_hook(None)

    def _set_seqno_hook(self, hook: SeqnoListener | None) -> None:
        for vb in self._vbuckets.values():
            vb._on_seqno = hook

    def add_persistence_listener(self, listener: SeqnoListener) -> None:
        """Call `listener(vbid, persisted_seqno)` after each flush batch completes."""
        self._persistence_listeners.append(listener)

    def remove_persistence_listener(self, listener: SeqnoListener) -> None:
        self._persistence_listeners.remove(listener)

    def add_vbucket_listener(self, listener: VBucketListener) -> None:
        """Call `listener(vbid, event)` after a vbucket changed state ("state"), was rolled back
        ("rollback"), failed over ("failover") or was deleted ("deleted"): DCP streams of that
        vbucket end on it."""
        self._vbucket_listeners.append(listener)

    def remove_vbucket_listener(self, listener: VBucketListener) -> None:
        self._vbucket_listeners.remove(listener)

    def add_cursor_listener(self, listener: CursorListener) -> None:
        """Call `listener(vbid, cursor_name)` when a vbucket's checkpoints drop a cursor (over the
        checkpoint memory quota, or CheckpointManager.drop_cursor): the DCP stream reading with it
        goes on from disk, and its connection runs a send pass for it. On the owner thread, inside
        the write or the memory recovery that dropped it: keep it cheap and non-raising."""
        self._cursor_listeners.append(listener)

    def remove_cursor_listener(self, listener: CursorListener) -> None:
        self._cursor_listeners.remove(listener)

    def _notify_cursor_dropped(self, vbid: int, cursor) -> None:
        for listener in list(self._cursor_listeners):
            listener(vbid, cursor.name)

    def _notify_vbucket(self, vbid: int, event: str) -> None:
        for listener in list(self._vbucket_listeners):
            listener(vbid, event)

    def _notify_seqno(self, vbid: int, seqno: int) -> None:
        for listener in self._seqno_listeners:
            listener(vbid, seqno)

    def _after_flush(self) -> None:
        """Checkpoints the flusher just wrote may be releasable now, not only at the next refused
        write (a writer that was told ETMPFAIL finds room when it retries)."""
        mem = self.memory
        if mem.quota is not None and mem.checkpoint >= mem.checkpoint_upper:
            self.recover_checkpoint_memory()

    def _notify_persisted(self, vbid: int, seqno: int) -> None:
        for listener in self._persistence_listeners:
            listener(vbid, seqno)
