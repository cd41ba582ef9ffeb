"""The *WithMeta family on an active vbucket (set_with_meta.md, del_with_meta.md): versions made
elsewhere (XDCR, restore tools) stored with the metadata they carry, when they win conflict
resolution (conflict.py) against the key's version here, tombstones included. Expiry times are
absolute. Metadata taken from elsewhere - here and from a DCP producer (vb_replica.py) - is checked
against MAX_REV_SEQNO and MAX_META_CAS. A mixin of VBucket (vbucket.py), whose slots it uses.
"""

from dcpflow.protocol.meta import WITH_META_OPTIONS_KNOWN, WithMetaOption
from dcpflow.protocol.status import Status

from .conflict import ConflictResolutionMode, DocMeta, incoming_wins
from .errors import EngineError
from .item import DeleteSource, Item
from .vb_locks import in_progress

_ALL_OPTIONS = WITH_META_OPTIONS_KNOWN
#: Metadata taken from elsewhere (*WithMeta, a DCP producer) must leave room for what local writes
#: add to it: a rev seqno is incremented by every later write of the key, and a CAS taken in
#: becomes the floor of the vbucket's clock. 48 bits of rev seqno and a CAS at least 2^32 below
#: 2^64 can never run out; larger values would overflow the u64 fields (and the store) later.
MAX_REV_SEQNO = (1 << 48) - 1
MAX_META_CAS = (1 << 64) - (1 << 32)
_SKIP_CR = WithMetaOption.FORCE_WITH_META_OP | WithMetaOption.SKIP_CONFLICT_RESOLUTION


def cas_too_big(cas: int) -> str:
    return (f"CAS 0x{cas:x} is above 0x{MAX_META_CAS:x}: 0xffffffffffffffff is a locked document's CAS "
            "(Document.md), and a CAS this close to 2^64 would leave the vbucket's clock no room")


def rev_too_big(rev_seqno: int) -> str:
    return f"rev seqno {rev_seqno} is above {MAX_REV_SEQNO} (48 bits): later writes of the key could not increment it"


class WithMeta:
    """SetWithMeta, AddWithMeta, DelWithMeta (module docstring)."""

    __slots__ = ()

    def set_with_meta(self, key: bytes, value: bytes, *, cas: int, rev_seqno: int, flags: int = 0,
                      expiry: int = 0, datatype: int = 0, options: int = 0, check_cas: int = 0) -> Item:
        """SetWithMeta (set_with_meta.md): store with the given metadata if it wins conflict
        resolution against the existing version (tombstones included).

        `expiry` is absolute. `check_cas` is the request header's CAS: when non-zero, the
        existing live document must have that CAS (KEY_ENOENT / KEY_EEXISTS otherwise).
        """
        return self._set_with_meta(key, value, cas, rev_seqno, flags, expiry, datatype, options,
                                   check_cas, add=False)

    def add_with_meta(self, key: bytes, value: bytes, *, cas: int, rev_seqno: int, flags: int = 0,
                      expiry: int = 0, datatype: int = 0, options: int = 0, check_cas: int = 0) -> Item:
        """AddWithMeta: as SetWithMeta, but KEY_EEXISTS if a live document exists."""
        return self._set_with_meta(key, value, cas, rev_seqno, flags, expiry, datatype, options,
                                   check_cas, add=True)

    def del_with_meta(self, key: bytes, *, cas: int, rev_seqno: int, flags: int = 0, delete_time: int = 0,
                      options: int = 0, value: bytes = b"", datatype: int = 0, check_cas: int = 0) -> Item:
        """DelWithMeta (del_with_meta.md): store a tombstone with the given metadata.

        A tombstone is stored even if the key is unknown here (so the deletion replicates on);
        conflict resolution compares (rev, cas) or (cas, rev) only. IS_EXPIRATION marks the
        tombstone as a TTL expiry. `delete_time` 0 means now. `value` may carry xattrs.
        """
        regenerate = self._resolve_with_meta(key, DocMeta(cas, rev_seqno, 0, flags, datatype), options,
                                             check_cas, deletion=True)
        source = DeleteSource.TTL if options & WithMetaOption.IS_EXPIRATION else DeleteSource.EXPLICIT
        delete_time = delete_time or int(self._clock())
        cid, key = key if key.__class__ is tuple else (0, key)
        return self._queue(Item(key, value, flags, 0, self._meta_cas(cas, regenerate), rev_seqno,
                                self.high_seqno + 1, datatype, True, delete_time, source, cid))

    def _set_with_meta(self, key: bytes, value: bytes, cas: int, rev_seqno: int, flags: int, expiry: int,
                       datatype: int, options: int, check_cas: int, *, add: bool) -> Item:
        regenerate = self._resolve_with_meta(key, DocMeta(cas, rev_seqno, expiry, flags, datatype), options,
                                             check_cas, deletion=False, add=add)
        cid, key = key if key.__class__ is tuple else (0, key)
        return self._queue(Item(key, value, flags, expiry, self._meta_cas(cas, regenerate), rev_seqno,
                                self.high_seqno + 1, datatype, cid=cid))

    def _resolve_with_meta(self, key: bytes, incoming: DocMeta, options: int, check_cas: int, *,
                           deletion: bool, add: bool = False) -> bool:
        """All checks of a WithMeta write, in order; returns whether to regenerate the CAS."""
        self._check_active()
        if not deletion:
            self._check_memory()
        if self.prepares and key in self.prepares:
            raise in_progress(key)
        skip, regenerate = self._check_options(options, incoming.cas, deletion=deletion)
        if incoming.rev_seqno > MAX_REV_SEQNO:
            raise EngineError(Status.EINVAL, rev_too_big(incoming.rev_seqno))
        existing = self._lookup(key, True)
        live = existing if existing is not None and not existing.deleted else None
        if check_cas:
            self._check_cas(key, live, check_cas)
        if add and live is not None:
            raise EngineError(Status.KEY_EEXISTS, f"key {key!r} already exists")
        if existing is not None and not skip and not incoming_wins(
                self.conflict_resolution, incoming, DocMeta.of(existing), deletion=deletion):
            raise EngineError(Status.KEY_EEXISTS,
                              f"conflict resolution: the existing version of {key!r} wins")
        return regenerate

    def _meta_cas(self, cas: int, regenerate: bool) -> int:
        if regenerate:
            return self.hlc.next()
        self.hlc.observe(cas)  # keep local CAS above anything accepted from elsewhere
        return cas

    def _check_options(self, options: int, cas: int, *, deletion: bool) -> tuple[bool, bool]:
        """Validate WithMeta options (0x01..0x10); returns (skip conflict resolution, regenerate CAS)."""
        if options & ~_ALL_OPTIONS:
            raise EngineError(Status.EINVAL, f"unknown WithMeta option bits 0x{options & ~_ALL_OPTIONS:x}")
        if options & WithMetaOption.IS_EXPIRATION and not deletion:
            raise EngineError(Status.EINVAL, "IS_EXPIRATION is only valid on DelWithMeta")
        skip = bool(options & _SKIP_CR)
        regenerate = bool(options & WithMetaOption.REGENERATE_CAS)
        if regenerate and not skip:
            raise EngineError(Status.EINVAL, "REGENERATE_CAS requires conflict resolution to be skipped "
                              "(FORCE_WITH_META_OP or SKIP_CONFLICT_RESOLUTION)")
        force_accept = bool(options & WithMetaOption.FORCE_ACCEPT_WITH_META_OPS)
        if self.conflict_resolution == ConflictResolutionMode.LWW:
            if not force_accept and not regenerate:
                raise EngineError(Status.EINVAL, "LWW buckets require FORCE_ACCEPT_WITH_META_OPS")
        elif force_accept:
            raise EngineError(Status.EINVAL, "FORCE_ACCEPT_WITH_META_OPS is refused on rev-seqno buckets")
        if cas == 0 and not regenerate:
            raise EngineError(Status.EINVAL, "a WithMeta write must carry the source's CAS (got 0)")
        if cas > MAX_META_CAS and not regenerate:
            raise EngineError(Status.EINVAL, cas_too_big(cas))
        return skip, regenerate
