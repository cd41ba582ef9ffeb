"""A vbucket's hash table (`VBucket.ht`): the current version of every key, as compact records
rather than a Python object per version (issue 46).

A dict of key -> Item spent about 310 bytes per entry beyond the key (measured with tracemalloc
over 100k SETs: the Item's 12 slots 128, the dict's slot about 52, the by-seqno and CAS ints 32
and 40, the key's and the value's bytes headers 33 and 42). The compiled table (_hashtable.c)
keeps one allocation per entry - a 52-byte head, the key, and the value inline up to
INLINE_MAX bytes (a reference to its bytes object beyond) - in an insertion-ordered array with an
open-addressing index: about 80 bytes per entry beyond the key, against kv_engine's StoredValue of
about 56 plus the key.

The seam is a mapping, so the engine reads it as it read the dict: `get`, `[key]`, `in`, `len`,
`pop`, `del`, and `keys()`/`values()`/`items()` in insertion order (the item pager walks that
order); besides, `put` (the fields as plain ints and bytes: what `ht[key] = item` calls, and the
SET path directly), `version` (what a SET over an entry needs, without building its Item) and
`reply` (a GET's whole reply packed from the record: the GET path builds no Item at all).
A key is bytes (default collection) or (collection id, bytes). What differs from a dict:

* a read builds a new `Item` from the record each time, so two reads of one version are equal,
  not identical: compare versions with `same_version` (by-seqno and CAS), never with `is`;
* `ht[key] = item` copies the item's fields in (`put` takes them as plain ints and bytes); an item
  whose value is NOT_RESIDENT keeps only its metadata.

`TableSpec` is the specification of the compiled `Table`, in Python: the same API and answers
(tests/engine/test_hashtable.py drives both with random operation sequences), and the table the
engine uses where the extension is not built. `ENTRY_OVERHEAD` is what the table in use spends per
entry beyond the key and the value's bytes: the engine's memory accounting (memory.py) counts it
per entry, and `meta_bytes()` is the table's own exact count.
"""

import sys

from dcpflow.protocol.datatype import Datatype
from dcpflow.protocol.frame import Magic, compiled
from dcpflow.protocol.kv import GET_RESPONSE_HEAD

from .item import NOT_RESIDENT, DeleteSource, Item

#: The compiled table, or None (not built, or DCPFLOW_PURE_PYTHON set): then the specification serves.
Table = compiled("Table", "dcpflow.engine._hashtable")
#: Values up to this length are kept inside the record; longer ones by reference to their bytes.
INLINE_MAX = 1024

__all__ = ["ENTRY_OVERHEAD", "HashTable", "TableSpec", "same_version"]

_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1
_SOURCES = (DeleteSource.EXPLICIT, DeleteSource.TTL)
_pack_get_head = GET_RESPONSE_HEAD.pack
_RESPONSE = int(Magic.RESPONSE)
_JSON_BIT = int(Datatype.JSON)  # the one datatype bit `reply` sends as stored


def same_version(a: Item | None, b: Item | None) -> bool:
    """Whether two reads of a hash table are the same version of a key (or both nothing): the same
    by-seqno and CAS (GET_LOCKED gives a version a new CAS; eviction changes only its value's
    residence)."""
    if a is None or b is None:
        return a is b
    return a.by_seqno == b.by_seqno and a.cas == b.cas


def _key(key) -> tuple:
    """(the dict key, key bytes, collection id) of a table key, with the compiled table's errors."""
    if isinstance(key, tuple):
        if len(key) != 2 or not isinstance(key[0], int) or not isinstance(key[1], bytes):
            raise TypeError("a key is bytes or (collection id, bytes)")
        cid, data = key
        if not 0 < cid <= _U32:
            raise ValueError("a key's collection id is in 1..2**32-1 (the default collection's keys are bytes)")
        cid = int(cid)
    elif isinstance(key, bytes):
        cid, data = 0, key
    else:
        raise TypeError("a key is bytes or (collection id, bytes)")
    if len(data) > 0xFFFF:
        raise ValueError("a key is at most 65535 bytes")
    data = bytes(data)
    return (data if not cid else (cid, data)), data, cid


def _u(v, top: int, name: str) -> int:
    if not isinstance(v, int):
        raise TypeError(f"{name} must be an int")
    if not 0 <= v <= top:
        raise OverflowError(f"{name} out of range")
    return int(v)


class TableSpec:
    """The compiled Table's specification (module docstring): a dict of key -> the record's fields,
    in the order the factory takes them."""

    __slots__ = ("_d", "_factory", "_not_resident", "_sources")

    def __init__(self, factory, not_resident, delete_sources: tuple):
        if not isinstance(delete_sources, tuple):
            raise TypeError("delete_sources is a tuple")
        if len(delete_sources) != 2:
            raise ValueError("delete_sources is (EXPLICIT, TTL)")
        self._d: dict = {}
        self._factory, self._not_resident, self._sources = factory, not_resident, delete_sources

    def put(self, key, value, flags, expiry, cas, rev_seqno, by_seqno, datatype, deleted, delete_time,
            delete_source) -> None:
        k, data, cid = _key(key)
        flags = _u(flags, _U32, "flags")
        expiry = _u(expiry, _U32, "expiry")
        cas = _u(cas, _U64, "cas")
        rev_seqno = _u(rev_seqno, _U64, "rev_seqno")
        by_seqno = _u(by_seqno, _U64, "by_seqno")
        datatype = _u(datatype, 0xFF, "datatype")
        deleted = bool(deleted)
        delete_time = _u(delete_time, _U32, "delete_time")
        ttl = _u(delete_source, 1, "delete_source")
        if value is self._not_resident and value is not None:
            pass
        elif isinstance(value, bytes):
            if len(value) > _U32:
                raise OverflowError("a value is less than 4 GiB")
            value = bytes(value)  # (the compiled table copies a value, or keeps a large exact bytes)
        else:
            raise TypeError("a value is bytes (or the table's not-resident marker)")
        self._d[k] = (data, value, flags, expiry, cas, rev_seqno, by_seqno, datatype, deleted, delete_time,
                      self._sources[ttl], cid)

    def _item(self, rec: tuple):
        return self._factory(*rec)

    def get(self, key, default=None):
        rec = self._d.get(_key(key)[0])
        return default if rec is None else self._item(rec)

    def version(self, key) -> tuple[int, int, bool, int] | None:
        """(rev_seqno, expiry, deleted, value length) of the key's entry, or None: what a SET over
        it needs, without building its document (a value not resident has length 0)."""
        rec = self._d.get(_key(key)[0])
        if rec is None:
            return None
        return rec[5], rec[3], rec[8], (0 if rec[1] is self._not_resident else len(rec[1]))

    def reply(self, key, opcode, opaque, reply_key, json) -> bytes | None:
        """A GET's whole success reply packed from the key's entry - the response header, the flags,
        `reply_key` (the key for GETK, b"" for GET) and the value, the datatype sent only if `json`
        (the client negotiated JSON) - or None when the entry is not the common case a GET answers
        straight from the table: none, a tombstone, an expiry set, a value not resident, a datatype
        beyond JSON (xattrs), or a body too long for the header. No document is built."""
        k = _key(key)[0]
        opcode = _u(opcode, 0xFF, "opcode")
        opaque = _u(opaque, _U32, "opaque")
        if not isinstance(reply_key, bytes):
            raise TypeError("reply_key must be bytes")
        if len(reply_key) > 0xFFFF:
            raise ValueError("reply_key is at most 65535 bytes")
        json = bool(json)
        rec = self._d.get(k)
        if rec is None or rec[8] or rec[1] is self._not_resident or rec[3] or rec[7] & ~_JSON_BIT:
            return None
        value = rec[1]
        body = 4 + len(reply_key) + len(value)
        if body > _U32:
            return None
        head = _pack_get_head(_RESPONSE, opcode, len(reply_key), 4, rec[7] if json else 0, 0, body, opaque, rec[4],
                              rec[2])
        return b"".join((head, reply_key, value))

    def __getitem__(self, key):
        rec = self._d.get(_key(key)[0])
        if rec is None:
            raise KeyError(key)
        return self._item(rec)

    def __delitem__(self, key) -> None:
        k = _key(key)[0]
        if k not in self._d:
            raise KeyError(key)
        del self._d[k]

    def __setitem__(self, key, item) -> None:
        raise TypeError("store with put(); a subclass may define __setitem__")

    _MISSING = object()

    def pop(self, key, default=_MISSING):
        k = _key(key)[0]
        rec = self._d.get(k)
        if rec is None:
            if default is TableSpec._MISSING:
                raise KeyError(key)
            return default
        item = self._item(rec)
        del self._d[k]
        return item

    def __contains__(self, key) -> bool:
        return _key(key)[0] in self._d

    def __len__(self) -> int:
        return len(self._d)

    def __iter__(self):
        return iter(self._d)

    def keys(self):
        return iter(self._d)

    def values(self):
        return (self._item(rec) for rec in self._d.values())

    def items(self):
        return ((k, self._item(rec)) for k, rec in self._d.items())

    def clear(self) -> None:
        self._d.clear()

    def meta_bytes(self) -> int:
        """What the Python objects of the entries take beyond their values' bytes (sys.getsizeof)."""
        total = sys.getsizeof(self._d)
        for k, rec in self._d.items():
            total += sys.getsizeof(rec) + sys.getsizeof(rec[0]) + sys.getsizeof(rec[1]) - len(rec[1])
            total += sum(sys.getsizeof(v) for v in rec[4:7] if v > 256)
            if k.__class__ is tuple:
                total += sys.getsizeof(k)
        return total


_Base = Table if Table is not None else TableSpec

#: What one entry costs beyond its key's and value's bytes (module docstring): for the compiled
#: table its 52-byte record head, the rounding of the record to 16 bytes (8 on average) and its
#: share of the entry array and the index (about 21): 80.5 measured at 100k entries over 1024
#: tables; for the specification its Python objects (286 measured).
ENTRY_OVERHEAD = 80 if Table is not None else 290


class HashTable(_Base):
    """The engine's hash table: the table of records (compiled, or its specification) whose reads
    build `Item`s, and whose `ht[key] = item` puts an Item's fields."""

    __slots__ = ()

    def __init__(self):
        super().__init__(Item, NOT_RESIDENT, _SOURCES)

    def __setitem__(self, key, item: Item) -> None:
        self.put(key, item.value, item.flags, item.expiry, item.cas, item.rev_seqno, item.by_seqno,
                 item.datatype, item.deleted, item.delete_time, item.delete_source)

    def __eq__(self, other) -> bool:
        """Equal to a table or dict with the same keys and versions (as a dict of key -> Item)."""
        if isinstance(other, HashTable | dict):
            return dict(self.items()) == dict(other.items())
        return NotImplemented

    __hash__ = None

    def __repr__(self) -> str:
        return f"<HashTable of {len(self)} entries>"
