"""The items of a sync write: the prepare, and the commit or abort that completes it.

Each is an engine `Item` (so checkpoints, cursors and the flusher carry it like any version) with
a class of its own, which is how DCP and the store tell them apart from plain versions:

* `Prepare` - the proposed version (value or tombstone) with its durability level. It never
  enters the hash table and is never de-duplicated in a checkpoint.
* `Commit` - the committed version: a full document (the prepare's value, CAS and rev seqno) at
  the commit's own seqno, remembering the prepare's seqno. It is the key's readable version; a
  consumer without sync writes receives it as a plain mutation or deletion.
* `Abort` - the end of a prepare that did not commit; a tombstone-shaped item that changes no
  document and is sent only to consumers that enabled sync writes.
"""

from ..item import Item


class Prepare(Item):
    __slots__ = ("level",)


class Commit(Item):
    __slots__ = ("prepared_seqno",)


class Abort(Item):
    __slots__ = ("prepared_seqno",)


_SYNC = (Prepare, Abort)


def is_sync_item(item: Item) -> bool:
    """A prepare or an abort: items only consumers that enabled sync writes see."""
    return item.__class__ in _SYNC


def make_prepare(item: Item, level: int) -> Prepare:
    p = _copy(Prepare, item)
    p.level = level
    return p


def make_commit(prepare: Item, seqno: int) -> Commit:
    """The committed version of `prepare` at `seqno` (same value, CAS and rev seqno)."""
    c = _copy(Commit, prepare)
    c.by_seqno = seqno
    c.prepared_seqno = prepare.by_seqno
    return c


def make_abort(prepare: Item, seqno: int, cas: int, delete_time: int) -> Abort:
    a = Abort(prepare.key, b"", 0, 0, cas, prepare.rev_seqno, seqno, 0, True, delete_time, cid=prepare.cid)
    a.prepared_seqno = prepare.by_seqno
    return a


def _copy(cls, item: Item):
    out = object.__new__(cls)
    for name in Item.__dataclass_fields__:
        setattr(out, name, getattr(item, name))
    return out
