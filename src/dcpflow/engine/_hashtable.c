/* A vbucket's hash table, compiled: compact records that own their memory (issue 46).

   hashtable.TableSpec is its specification, in Python: the same API, and
   tests/engine/test_hashtable.py drives both with random operation sequences and holds their
   answers equal.

   A record is one allocation: a 52-byte head (CAS, by-seqno, rev seqno, hash, collection id,
   flags, expiry, delete time, value length, key length, datatype, state bits), the key's bytes,
   and the value - its bytes inline when it is at most INLINE_MAX long, else a reference to the
   bytes object it was given - or nothing when the value is not resident (evicted). kv_engine's
   StoredValue is about 56 bytes plus the key, for the same fields
   (https://github.com/couchbase/kv_engine/blob/master/engines/ep/src/stored-value.h).

   The table keeps insertion order, as a dict does (the item pager walks it in that order): an
   array of record pointers in insertion order (a removed one leaves a hole until the array is
   compacted) and an open-addressing index of 32-bit positions into it, linear probing, at most
   2/3 full. Keys hash with CPython's keyed hash of bytes (the one its dicts use for bytes keys),
   so colliding keys cannot be chosen by a client.

   The API is narrow: `put(key, value, flags, expiry, cas, rev_seqno, by_seqno, datatype, deleted,
   delete_time, delete_source)` takes plain ints and bytes; a read answers a new document built by
   calling the `factory` type the table was made with (the engine's Item) with the twelve fields
   in Document's order. Compiled code reads and writes bytes and ints only - never an attribute of
   an engine object. A key is bytes (the default collection) or (collection id, bytes). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifndef _WIN32
#include <sys/mman.h>
#endif

#define INLINE_MAX 1024
#define EMPTY 0xFFFFFFFFu
#define DUMMY 0xFFFFFFFEu
#define MAX_ENTRIES 0x7FFFFFF0u

enum { B_DELETED = 1, B_TTL = 2, B_NOT_RESIDENT = 4, B_VALUE_REF = 8 };

typedef struct {
    uint64_t cas, by_seqno, rev_seqno;
    uint32_t hash, cid, flags, expiry, delete_time, vlen;
    uint16_t klen;
    uint8_t datatype, bits;
    unsigned char data[];  /* key, then the inline value or a PyObject * */
} rec_t;

#define REC_HEAD offsetof(rec_t, data)

typedef struct {
    PyObject_HEAD
    PyObject *factory, *not_resident, *sources;  /* sources: (EXPLICIT, TTL) */
    rec_t **entries;
    uint32_t *index;
    Py_ssize_t nentries, ecap, nlive;
    size_t isize;  /* a power of 2, or 0 */
    size_t nfill;  /* index slots not EMPTY: live entries and DUMMYs */
    size_t rec_bytes;  /* what the records' allocations take, inline values excluded */
} Table;

/* -- the records' allocator ------------------------------------------------------------------
   Records of at most SMALL_MAX bytes come from CPython's small-object allocator (see SMALL_MAX
   below). Larger ones come from slabs of their own rather than from the C library's heap: there
   they would sit between the short-lived buffers of each write (the request's bytes, the flush
   batches) and keep that memory from ever going back to the system once those are freed
   (measured: 540 bytes of RSS per 340-byte document with malloc, 420 with slabs). A record of at most SLAB_MAX bytes takes a block of its size
   rounded up to 16 bytes, carved from pages of SLAB_PAGE bytes that come from 1 MiB chunks
   mapped from the system; a
   freed block goes on its class's free list for the next record of that class. Nothing goes back
   to the system: a table that shrinks keeps its blocks for the records that come next. Larger
   records (only very long keys) use malloc. Only called with the GIL held. */

#define SLAB_MAX 2048
#define SLAB_CLASSES (SLAB_MAX / 16)
#define SLAB_PAGE (16 * 1024)
#define SLAB_CHUNK (1024 * 1024)

static void *slab_free_list[SLAB_CLASSES + 1];
static char *slab_chunk_at, *slab_chunk_end;
static size_t slab_reserved;  /* bytes taken from the system for slabs */

static inline size_t slab_class(size_t n) { return (n + 15) >> 4; }

/* A chunk straight from the system (mmap): from malloc, a chunk could land in the C library's heap
   between the large short-lived buffers of requests and flush batches, and pin their memory. */
static char *slab_chunk_new(void) {
#ifdef MAP_ANONYMOUS
    void *p = mmap(NULL, SLAB_CHUNK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : (char *)p;
#else
    return malloc(SLAB_CHUNK);
#endif
}

/* Records of at most SMALL_MAX bytes (the common case: a small key and a small inline value) come
   from the interpreter's small-object allocator (pymalloc) instead, whose pools they then share with
   the Items, keys and values of the checkpoints: a load that outruns the flusher fills its
   checkpoint quota with those, and once the backlog is written the freed pools take the records
   that come next. With slabs of their own the two peaks added up - at a 512 MiB quota, 154 MB of
   empty pools beside the slabs (measured with sys._debugmallocstats) - though the quota bounds
   their sum. pymalloc rounds to 16 bytes, as the slabs do. */
#define SMALL_MAX 512

static void *slab_alloc(size_t n) {
    if (n <= SMALL_MAX) return PyObject_Malloc(n);
    if (n > SLAB_MAX) return malloc(n);
    size_t c = slab_class(n);
    void *b = slab_free_list[c];
    if (b == NULL) {
        size_t bsize = c << 4;
        if (slab_chunk_end - slab_chunk_at < SLAB_PAGE) {
            char *chunk = slab_chunk_new();
            if (chunk == NULL) return NULL;
            slab_reserved += SLAB_CHUNK;
            slab_chunk_at = chunk;
            slab_chunk_end = chunk + SLAB_CHUNK;
        }
        char *page = slab_chunk_at;
        slab_chunk_at += SLAB_PAGE;
        size_t count = SLAB_PAGE / bsize;
        for (size_t i = count; i-- > 0;) {  /* threaded so the page is used from its start */
            *(void **)(page + i * bsize) = slab_free_list[c];
            slab_free_list[c] = page + i * bsize;
        }
        b = slab_free_list[c];
    }
    slab_free_list[c] = *(void **)b;
    return b;
}

static void slab_release(void *b, size_t n) {
    if (n <= SMALL_MAX) {
        PyObject_Free(b);
        return;
    }
    if (n > SLAB_MAX) {
        free(b);
        return;
    }
    size_t c = slab_class(n);
    *(void **)b = slab_free_list[c];
    slab_free_list[c] = b;
}

/* What a record of n bytes takes. */
static inline size_t alloc_size(size_t n) {
    if (n <= SLAB_MAX) return slab_class(n) << 4;
    size_t c = (n + 8 + 15) & ~(size_t)15;  /* glibc: an 8-byte size word, 16-byte chunks */
    return c < 32 ? 32 : c;
}

/* A referenced value's bytes object (more than INLINE_MAX bytes): the C library's malloc. */
static inline size_t object_size(size_t n) { return (n + 8 + 15) & ~(size_t)15; }

static inline size_t rec_value_store(const rec_t *r) {
    if (r->bits & B_VALUE_REF) return sizeof(PyObject *);
    if (r->bits & B_NOT_RESIDENT) return 0;
    return r->vlen;
}

/* The bytes a record's allocation (and a referenced value's object header) take beyond its
   inline value. */
static size_t rec_meta(const rec_t *r) {
    size_t vs = rec_value_store(r);
    size_t m = alloc_size(REC_HEAD + r->klen + vs);
    if (r->bits & B_VALUE_REF) {
        m += object_size(offsetof(PyBytesObject, ob_sval) + 1 + r->vlen) - r->vlen;
    } else {
        m -= vs;
    }
    return m;
}

static inline PyObject *rec_ref(const rec_t *r) {
    PyObject *o;
    memcpy(&o, r->data + r->klen, sizeof o);
    return o;
}

static inline size_t rec_size(const rec_t *r) { return REC_HEAD + r->klen + rec_value_store(r); }

/* (A referenced value is an exact bytes object: releasing it runs no Python code.) */
static void rec_free(Table *t, rec_t *r) {
    t->rec_bytes -= rec_meta(r);
    if (r->bits & B_VALUE_REF) Py_DECREF(rec_ref(r));
    slab_release(r, rec_size(r));
}

/* -- keys -------------------------------------------------------------------------------------- */

typedef struct {
    const char *data;
    Py_ssize_t len;
    uint32_t cid;
    uint32_t hash;
} keyref;

/* Parse a key: bytes, or (collection id > 0, bytes). 0, or -1 with TypeError/ValueError set. */
static int parse_key(PyObject *key, keyref *k) {
    PyObject *b = key;
    k->cid = 0;
    if (PyTuple_Check(key)) {
        if (PyTuple_GET_SIZE(key) != 2 || !PyLong_Check(PyTuple_GET_ITEM(key, 0)) ||
            !PyBytes_Check(PyTuple_GET_ITEM(key, 1))) {
            PyErr_SetString(PyExc_TypeError, "a key is bytes or (collection id, bytes)");
            return -1;
        }
        unsigned long long cid = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(key, 0));
        if (cid == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            cid = 0;
        }
        if (cid == 0 || cid > 0xFFFFFFFFull) {
            PyErr_SetString(PyExc_ValueError, "a key's collection id is in 1..2**32-1 (the default collection's keys are bytes)");
            return -1;
        }
        k->cid = (uint32_t)cid;
        b = PyTuple_GET_ITEM(key, 1);
    } else if (!PyBytes_Check(key)) {
        PyErr_SetString(PyExc_TypeError, "a key is bytes or (collection id, bytes)");
        return -1;
    }
    k->data = PyBytes_AS_STRING(b);
    k->len = PyBytes_GET_SIZE(b);
    if (k->len > 0xFFFF) {
        PyErr_SetString(PyExc_ValueError, "a key is at most 65535 bytes");
        return -1;
    }
    /* CPython's keyed hash of the bytes, cached in the object as a dict's lookup caches it */
    Py_hash_t ph = PyObject_Hash(b);
    if (ph == -1) return -1;
    uint64_t h = (uint64_t)ph;
    h ^= (uint64_t)k->cid * 0x9E3779B97F4A7C15ull;
    k->hash = (uint32_t)(h ^ (h >> 32));
    return 0;
}

/* The index slot holding the key's position, or of the first empty slot if it is absent. */
static size_t find_slot(const Table *t, const keyref *k, int *found) {
    size_t mask = t->isize - 1;
    size_t i = k->hash & mask;
    for (;;) {
        uint32_t ix = t->index[i];
        if (ix == EMPTY) {
            *found = 0;
            return i;
        }
        if (ix != DUMMY) {
            const rec_t *r = t->entries[ix];
            if (r->hash == k->hash && r->cid == k->cid && r->klen == k->len && memcmp(r->data, k->data, k->len) == 0) {
                *found = 1;
                return i;
            }
        }
        i = (i + 1) & mask;
    }
}

static rec_t *lookup(const Table *t, const keyref *k, size_t *slot) {
    if (t->isize == 0) return NULL;
    int found;
    size_t i = find_slot(t, k, &found);
    if (!found) return NULL;
    if (slot != NULL) *slot = i;
    return t->entries[t->index[i]];
}

/* -- growth -------------------------------------------------------------------------------- */

/* Compact the entries (drop holes) and rebuild the index at a size for `room` entries. */
static int rebuild(Table *t, Py_ssize_t room) {
    size_t isize = 8;
    while (isize * 2 / 3 < (size_t)room) isize <<= 1;
    uint32_t *index = malloc(isize * sizeof(uint32_t));
    if (index == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(index, 0xFF, isize * sizeof(uint32_t));
    Py_ssize_t n = 0;
    size_t mask = isize - 1;
    for (Py_ssize_t j = 0; j < t->nentries; j++) {
        rec_t *r = t->entries[j];
        if (r == NULL) continue;
        t->entries[n] = r;
        size_t i = r->hash & mask;
        while (index[i] != EMPTY) i = (i + 1) & mask;
        index[i] = (uint32_t)n;
        n++;
    }
    t->nentries = n;
    t->nfill = (size_t)n;
    free(t->index);
    t->index = index;
    t->isize = isize;
    return 0;
}

static int resize_entries(Table *t, Py_ssize_t cap) {
    rec_t **e = realloc(t->entries, (size_t)cap * sizeof(rec_t *));
    if (e == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    t->entries = e;
    t->ecap = cap;
    return 0;
}

/* Room for one more entry at the end of the array, and in the index. */
static int make_room(Table *t) {
    if (t->nentries >= (Py_ssize_t)MAX_ENTRIES) {
        PyErr_SetString(PyExc_OverflowError, "a table holds fewer than 2**31 entries");
        return -1;
    }
    if (t->nentries == t->ecap) {
        Py_ssize_t holes = t->nentries - t->nlive;
        if (holes > 8 && holes >= t->nentries / 4) {
            if (rebuild(t, t->nlive + 1) < 0) return -1;  /* compacts */
        } else {
            Py_ssize_t cap = t->ecap < 8 ? 8 : t->ecap + t->ecap / 2;
            if (resize_entries(t, cap) < 0) return -1;
        }
    }
    if (t->isize == 0 || t->nfill + 1 > t->isize * 2 / 3) {
        /* drops the DUMMYs; leaves room for a quarter more entries at least, so a table that
           takes and loses keys does not rebuild at every new one */
        if (rebuild(t, t->nlive + t->nlive / 4 + 1) < 0) return -1;
    }
    return 0;
}

/* -- values in -------------------------------------------------------------------------------- */

static int as_u(PyObject *v, unsigned long long max, const char *name, unsigned long long *out) {
    if (!PyLong_Check(v)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int", name);
        return -1;
    }
    unsigned long long x = PyLong_AsUnsignedLongLong(v);
    if (x == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_OverflowError, "%s out of range", name);
        return -1;
    }
    if (x > max) {
        PyErr_Format(PyExc_OverflowError, "%s out of range", name);
        return -1;
    }
    *out = x;
    return 0;
}

#define U32 0xFFFFFFFFull
#define U64 0xFFFFFFFFFFFFFFFFull

static PyObject *Table_put(Table *t, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "put(key, value, flags, expiry, cas, rev_seqno, by_seqno, datatype, "
                        "deleted, delete_time, delete_source) takes 11 arguments");
        return NULL;
    }
    keyref k;
    if (parse_key(args[0], &k) < 0) return NULL;
    PyObject *value = args[1];
    unsigned long long flags, expiry, cas, rev, seqno, datatype, delete_time, source;
    if (as_u(args[2], U32, "flags", &flags) < 0 || as_u(args[3], U32, "expiry", &expiry) < 0 ||
        as_u(args[4], U64, "cas", &cas) < 0 || as_u(args[5], U64, "rev_seqno", &rev) < 0 ||
        as_u(args[6], U64, "by_seqno", &seqno) < 0 || as_u(args[7], 0xFF, "datatype", &datatype) < 0)
        return NULL;
    int deleted = PyObject_IsTrue(args[8]);
    if (deleted < 0) return NULL;
    if (as_u(args[9], U32, "delete_time", &delete_time) < 0 || as_u(args[10], 1, "delete_source", &source) < 0)
        return NULL;
    uint8_t bits = (deleted ? B_DELETED : 0) | (source ? B_TTL : 0);
    size_t vlen = 0, vstore = 0;
    if (value == t->not_resident && value != NULL) {
        bits |= B_NOT_RESIDENT;
    } else if (PyBytes_Check(value)) {
        vlen = (size_t)PyBytes_GET_SIZE(value);
        if (vlen > U32) {
            PyErr_SetString(PyExc_OverflowError, "a value is less than 4 GiB");
            return NULL;
        }
        if (vlen > INLINE_MAX && PyBytes_CheckExact(value)) {
            bits |= B_VALUE_REF;
            vstore = sizeof(PyObject *);
        } else {
            vstore = vlen;
        }
    } else {
        PyErr_SetString(PyExc_TypeError, "a value is bytes (or the table's not-resident marker)");
        return NULL;
    }
    size_t slot = 0;
    rec_t *old = lookup(t, &k, &slot);
    Py_ssize_t pos = -1;
    rec_t *r;
    size_t size = REC_HEAD + (size_t)k.len + vstore;
    if (old != NULL) {
        pos = t->index[slot];
        t->rec_bytes -= rec_meta(old);
        if (old->bits & B_VALUE_REF) Py_DECREF(rec_ref(old));
        size_t old_size = rec_size(old);
        if (alloc_size(old_size) == alloc_size(size) && size <= SLAB_MAX && old_size <= SLAB_MAX) {
            r = old;  /* the same block fits */
        } else {
            r = slab_alloc(size);
            if (r == NULL) {  /* the old record stays, without its value reference: drop the entry */
                slab_release(old, old_size);
                t->entries[pos] = NULL;
                t->index[slot] = DUMMY;
                t->nlive--;
                return PyErr_NoMemory();
            }
            memcpy(r, old, REC_HEAD + old->klen);
            slab_release(old, old_size);
        }
    } else {
        if (make_room(t) < 0) return NULL;
        r = slab_alloc(size);
        if (r == NULL) return PyErr_NoMemory();
        r->hash = k.hash;
        r->cid = k.cid;
        r->klen = (uint16_t)k.len;
        memcpy(r->data, k.data, (size_t)k.len);
    }
    r->cas = cas;
    r->by_seqno = seqno;
    r->rev_seqno = rev;
    r->flags = (uint32_t)flags;
    r->expiry = (uint32_t)expiry;
    r->delete_time = (uint32_t)delete_time;
    r->vlen = (uint32_t)vlen;
    r->datatype = (uint8_t)datatype;
    r->bits = bits;
    if (bits & B_VALUE_REF) {
        Py_INCREF(value);
        memcpy(r->data + r->klen, &value, sizeof value);
    } else if (vlen) {
        memcpy(r->data + r->klen, PyBytes_AS_STRING(value), vlen);
    }
    t->rec_bytes += rec_meta(r);
    if (old != NULL) {
        t->entries[pos] = r;
    } else {
        int found;
        size_t i = find_slot(t, &k, &found);
        t->index[i] = (uint32_t)t->nentries;
        t->entries[t->nentries++] = r;
        t->nlive++;
        t->nfill++;
    }
    Py_RETURN_NONE;
}

/* -- values out -------------------------------------------------------------------------------- */

/* (a, b) from two new references; NULL (the other one released) if either is NULL. */
static PyObject *pair_of(PyObject *a, PyObject *b) {
    PyObject *t = (a != NULL && b != NULL) ? PyTuple_Pack(2, a, b) : NULL;
    Py_XDECREF(a);
    Py_XDECREF(b);
    return t;
}

static PyObject *rec_key(const rec_t *r) {
    PyObject *b = PyBytes_FromStringAndSize((const char *)r->data, r->klen);
    if (b == NULL || r->cid == 0) return b;
    return pair_of(PyLong_FromUnsignedLong(r->cid), b);
}

/* The document of a record: factory(key, value, flags, expiry, cas, rev_seqno, by_seqno, datatype,
   deleted, delete_time, delete_source, cid). */
static PyObject *rec_item(const Table *t, const rec_t *r) {
    if (t->factory == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the table was not initialised");
        return NULL;
    }
    PyObject *a[12];
    PyObject *res = NULL;
    a[0] = PyBytes_FromStringAndSize((const char *)r->data, r->klen);
    if (r->bits & B_NOT_RESIDENT) {
        a[1] = Py_NewRef(t->not_resident);
    } else if (r->bits & B_VALUE_REF) {
        a[1] = Py_NewRef(rec_ref(r));
    } else {
        a[1] = PyBytes_FromStringAndSize((const char *)r->data + r->klen, r->vlen);
    }
    a[2] = PyLong_FromUnsignedLong(r->flags);
    a[3] = PyLong_FromUnsignedLong(r->expiry);
    a[4] = PyLong_FromUnsignedLongLong(r->cas);
    a[5] = PyLong_FromUnsignedLongLong(r->rev_seqno);
    a[6] = PyLong_FromUnsignedLongLong(r->by_seqno);
    a[7] = PyLong_FromUnsignedLong(r->datatype);
    a[8] = Py_NewRef((r->bits & B_DELETED) ? Py_True : Py_False);
    a[9] = PyLong_FromUnsignedLong(r->delete_time);
    a[10] = Py_NewRef(PyTuple_GET_ITEM(t->sources, (r->bits & B_TTL) ? 1 : 0));
    a[11] = PyLong_FromUnsignedLong(r->cid);
    for (int i = 0; i < 12; i++) {
        if (a[i] == NULL) goto done;
    }
    res = PyObject_Vectorcall(t->factory, a, 12, NULL);
done:
    for (int i = 0; i < 12; i++) Py_XDECREF(a[i]);
    return res;
}

/* -- the mapping ------------------------------------------------------------------------------- */

static PyObject *Table_get(Table *t, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get(key, default=None)");
        return NULL;
    }
    keyref k;
    if (parse_key(args[0], &k) < 0) return NULL;
    rec_t *r = lookup(t, &k, NULL);
    if (r == NULL) return Py_NewRef(nargs == 2 ? args[1] : Py_None);
    return rec_item(t, r);
}

/* version(key): (rev_seqno, expiry, deleted, value length) of the key's entry, or None - what a
   SET over it needs, without building its document (or copying its value). A value that is not
   resident has length 0. */
static PyObject *Table_version(Table *t, PyObject *key) {
    keyref k;
    if (parse_key(key, &k) < 0) return NULL;
    rec_t *r = lookup(t, &k, NULL);
    if (r == NULL) Py_RETURN_NONE;
    PyObject *res = PyTuple_New(4);
    if (res == NULL) return NULL;
    PyObject *rev = PyLong_FromUnsignedLongLong(r->rev_seqno);
    PyObject *expiry = PyLong_FromUnsignedLong(r->expiry);
    PyObject *vlen = PyLong_FromUnsignedLong((r->bits & B_NOT_RESIDENT) ? 0 : r->vlen);
    if (rev == NULL || expiry == NULL || vlen == NULL) {
        Py_XDECREF(rev);
        Py_XDECREF(expiry);
        Py_XDECREF(vlen);
        Py_DECREF(res);
        return NULL;
    }
    PyTuple_SET_ITEM(res, 0, rev);
    PyTuple_SET_ITEM(res, 1, expiry);
    PyTuple_SET_ITEM(res, 2, Py_NewRef((r->bits & B_DELETED) ? Py_True : Py_False));
    PyTuple_SET_ITEM(res, 3, vlen);
    return res;
}

/* reply(key, opcode, opaque, reply_key, json): the whole success reply of a GET of the key, packed
   from its record - the memcached binary protocol's response header (magic 0x81, `opcode`, key
   length, 4 bytes of extras, datatype, status 0, body length, `opaque`, CAS), the flags as the
   extras, `reply_key` (the key for GETK, b"" for GET) and the value - or None when the record is
   not the common case a GET answers straight from the table: no entry, a tombstone, an expiry
   set (the caller reads the clock), a value not resident, a datatype beyond JSON (xattrs), or a
   body too long for the header. The datatype sent is the stored one when `json` is true (the
   client negotiated JSON), else 0. No document is built: the value's bytes are copied once, into
   the reply (https://github.com/couchbase/kv_engine/blob/master/docs/BinaryProtocol.md). */
#define GET_HEAD 28  /* the 24-byte header and the 4-byte flags */

static inline void put_be16(unsigned char *p, uint32_t v) { p[0] = (unsigned char)(v >> 8); p[1] = (unsigned char)v; }
static inline void put_be32(unsigned char *p, uint32_t v) {
    for (int i = 3; i >= 0; i--, v >>= 8) p[i] = (unsigned char)v;
}
static inline void put_be64(unsigned char *p, uint64_t v) {
    for (int i = 7; i >= 0; i--, v >>= 8) p[i] = (unsigned char)v;
}

static PyObject *Table_reply(Table *t, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "reply(key, opcode, opaque, reply_key, json) takes 5 arguments");
        return NULL;
    }
    keyref k;
    if (parse_key(args[0], &k) < 0) return NULL;
    unsigned long long opcode, opaque;
    if (as_u(args[1], 0xFF, "opcode", &opcode) < 0 || as_u(args[2], U32, "opaque", &opaque) < 0) return NULL;
    PyObject *reply_key = args[3];
    if (!PyBytes_Check(reply_key)) {
        PyErr_SetString(PyExc_TypeError, "reply_key must be bytes");
        return NULL;
    }
    Py_ssize_t rklen = PyBytes_GET_SIZE(reply_key);
    if (rklen > 0xFFFF) {
        PyErr_SetString(PyExc_ValueError, "reply_key is at most 65535 bytes");
        return NULL;
    }
    int json = PyObject_IsTrue(args[4]);
    if (json < 0) return NULL;
    const rec_t *r = lookup(t, &k, NULL);
    if (r == NULL || (r->bits & (B_DELETED | B_NOT_RESIDENT)) || r->expiry || (r->datatype & ~1u)) Py_RETURN_NONE;
    size_t body = 4 + (size_t)rklen + r->vlen;
    if (body > U32) Py_RETURN_NONE;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(24 + body));
    if (out == NULL) return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    p[0] = 0x81;
    p[1] = (unsigned char)opcode;
    put_be16(p + 2, (uint32_t)rklen);
    p[4] = 4;
    p[5] = json ? r->datatype : 0;
    p[6] = p[7] = 0;
    put_be32(p + 8, (uint32_t)body);
    put_be32(p + 12, (uint32_t)opaque);
    put_be64(p + 16, r->cas);
    put_be32(p + 24, r->flags);
    memcpy(p + GET_HEAD, PyBytes_AS_STRING(reply_key), (size_t)rklen);
    const char *v = (r->bits & B_VALUE_REF) ? PyBytes_AS_STRING(rec_ref(r)) : (const char *)r->data + r->klen;
    memcpy(p + GET_HEAD + rklen, v, r->vlen);
    return out;
}

static PyObject *Table_subscript(Table *t, PyObject *key) {
    keyref k;
    if (parse_key(key, &k) < 0) return NULL;
    rec_t *r = lookup(t, &k, NULL);
    if (r == NULL) {
        PyErr_SetObject(PyExc_KeyError, key);
        return NULL;
    }
    return rec_item(t, r);
}

/* Remove the entry at index slot `slot`. */
static void remove_at(Table *t, size_t slot) {
    uint32_t pos = t->index[slot];
    rec_t *r = t->entries[pos];
    t->entries[pos] = NULL;
    rec_free(t, r);
    t->index[slot] = DUMMY;
    t->nlive--;
    if (pos == (uint32_t)t->nentries - 1) t->nentries--;  /* (its index slot stays a DUMMY) */
}

static int Table_ass_subscript(Table *t, PyObject *key, PyObject *value) {
    if (value != NULL) {
        PyErr_SetString(PyExc_TypeError, "store with put(); a subclass may define __setitem__");
        return -1;
    }
    keyref k;
    if (parse_key(key, &k) < 0) return -1;
    size_t slot;
    if (lookup(t, &k, &slot) == NULL) {
        PyErr_SetObject(PyExc_KeyError, key);
        return -1;
    }
    remove_at(t, slot);
    return 0;
}

static PyObject *Table_pop(Table *t, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "pop(key[, default])");
        return NULL;
    }
    keyref k;
    if (parse_key(args[0], &k) < 0) return NULL;
    size_t slot;
    rec_t *r = lookup(t, &k, &slot);
    if (r == NULL) {
        if (nargs == 2) return Py_NewRef(args[1]);
        PyErr_SetObject(PyExc_KeyError, args[0]);
        return NULL;
    }
    PyObject *item = rec_item(t, r);
    if (item == NULL) return NULL;
    remove_at(t, slot);
    return item;
}

static int Table_contains(Table *t, PyObject *key) {
    keyref k;
    if (parse_key(key, &k) < 0) return -1;
    return lookup(t, &k, NULL) != NULL;
}

static Py_ssize_t Table_length(Table *t) { return t->nlive; }

static PyObject *Table_meta_bytes(Table *t, PyObject *Py_UNUSED(ignored)) {
    size_t n = t->rec_bytes + (size_t)t->ecap * sizeof(rec_t *) + t->isize * sizeof(uint32_t);
    return PyLong_FromSize_t(n);
}

static PyObject *Table_clear(Table *t, PyObject *Py_UNUSED(ignored)) {
    for (Py_ssize_t j = 0; j < t->nentries; j++) {
        if (t->entries[j] != NULL) rec_free(t, t->entries[j]);
    }
    free(t->entries);
    free(t->index);
    t->entries = NULL;
    t->index = NULL;
    t->nentries = t->ecap = t->nlive = 0;
    t->isize = t->nfill = 0;
    Py_RETURN_NONE;
}

static int Table_init(Table *t, PyObject *args, PyObject *kwds) {
    PyObject *factory, *not_resident, *sources;
    static char *kwlist[] = {"factory", "not_resident", "delete_sources", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO!:Table", kwlist, &factory, &not_resident, &PyTuple_Type,
                                     &sources))
        return -1;
    if (PyTuple_GET_SIZE(sources) != 2) {
        PyErr_SetString(PyExc_ValueError, "delete_sources is (EXPLICIT, TTL)");
        return -1;
    }
    Py_XSETREF(t->factory, Py_NewRef(factory));
    Py_XSETREF(t->not_resident, Py_NewRef(not_resident));
    Py_XSETREF(t->sources, Py_NewRef(sources));
    return 0;
}

static void Table_dealloc(Table *t) {
    PyObject *r = Table_clear(t, NULL);
    Py_XDECREF(r);
    Py_XDECREF(t->factory);
    Py_XDECREF(t->not_resident);
    Py_XDECREF(t->sources);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

/* -- iteration: keys, values or items in insertion order ------------------------------------------ */

typedef struct {
    PyObject_HEAD
    Table *table;
    Py_ssize_t pos, size;
    int kind;  /* 0 keys, 1 values, 2 items */
} TableIter;

static PyTypeObject TableIterType;

static PyObject *make_iter(Table *t, int kind) {
    TableIter *it = PyObject_New(TableIter, &TableIterType);
    if (it == NULL) return NULL;
    it->table = (Table *)Py_NewRef(t);
    it->pos = 0;
    it->size = t->nlive;
    it->kind = kind;
    return (PyObject *)it;
}

static PyObject *TableIter_next(TableIter *it) {
    Table *t = it->table;
    if (t == NULL) return NULL;
    if (t->nlive != it->size) {
        PyErr_SetString(PyExc_RuntimeError, "table changed size during iteration");
        return NULL;
    }
    while (it->pos < t->nentries && t->entries[it->pos] == NULL) it->pos++;
    if (it->pos >= t->nentries) {
        Py_CLEAR(it->table);
        return NULL;
    }
    rec_t *r = t->entries[it->pos++];
    if (it->kind == 0) return rec_key(r);
    if (it->kind == 1) return rec_item(t, r);
    PyObject *key = rec_key(r);
    if (key == NULL) return NULL;
    return pair_of(key, rec_item(t, r));
}

static void TableIter_dealloc(TableIter *it) {
    Py_XDECREF(it->table);
    PyObject_Free(it);
}

static PyTypeObject TableIterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dcpflow.engine._hashtable.TableIterator",
    .tp_basicsize = sizeof(TableIter),
    .tp_dealloc = (destructor)TableIter_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)TableIter_next,
};

static PyObject *Table_iter(Table *t) { return make_iter(t, 0); }
static PyObject *Table_keys(Table *t, PyObject *Py_UNUSED(ignored)) { return make_iter(t, 0); }
static PyObject *Table_values(Table *t, PyObject *Py_UNUSED(ignored)) { return make_iter(t, 1); }
static PyObject *Table_items(Table *t, PyObject *Py_UNUSED(ignored)) { return make_iter(t, 2); }

static PyMethodDef Table_methods[] = {
    {"put", (PyCFunction)(void (*)(void))Table_put, METH_FASTCALL,
     "put(key, value, flags, expiry, cas, rev_seqno, by_seqno, datatype, deleted, delete_time, delete_source)"},
    {"get", (PyCFunction)(void (*)(void))Table_get, METH_FASTCALL, "get(key, default=None): the document or default"},
    {"pop", (PyCFunction)(void (*)(void))Table_pop, METH_FASTCALL, "pop(key[, default])"},
    {"reply", (PyCFunction)(void (*)(void))Table_reply, METH_FASTCALL,
     "reply(key, opcode, opaque, reply_key, json): a GET's whole success reply packed from the record, or None"},
    {"version", (PyCFunction)Table_version, METH_O,
     "version(key): (rev_seqno, expiry, deleted, value length) of the entry, or None"},
    {"keys", (PyCFunction)Table_keys, METH_NOARGS, "an iterator over the keys, in insertion order"},
    {"values", (PyCFunction)Table_values, METH_NOARGS, "an iterator over the documents"},
    {"items", (PyCFunction)Table_items, METH_NOARGS, "an iterator over (key, document)"},
    {"clear", (PyCFunction)Table_clear, METH_NOARGS, "remove every entry"},
    {"meta_bytes", (PyCFunction)Table_meta_bytes, METH_NOARGS,
     "the bytes the table spends beyond its values' bytes: records (heads, keys, allocator rounding), the "
     "entry array and the index"},
    {NULL, NULL, 0, NULL},
};

static PyMappingMethods Table_as_mapping = {
    .mp_length = (lenfunc)Table_length,
    .mp_subscript = (binaryfunc)Table_subscript,
    .mp_ass_subscript = (objobjargproc)Table_ass_subscript,
};

static PySequenceMethods Table_as_sequence = {
    .sq_contains = (objobjproc)Table_contains,
};

static PyTypeObject TableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dcpflow.engine._hashtable.Table",
    .tp_basicsize = sizeof(Table),
    .tp_dealloc = (destructor)Table_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "A vbucket's hash table of compact records (module docstring).",
    .tp_iter = (getiterfunc)Table_iter,
    .tp_methods = Table_methods,
    .tp_as_mapping = &Table_as_mapping,
    .tp_as_sequence = &Table_as_sequence,
    .tp_init = (initproc)Table_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "dcpflow.engine._hashtable",
    "A vbucket's hash table of compact records, compiled (hashtable.TableSpec is its specification).", -1, NULL,
};

PyMODINIT_FUNC PyInit__hashtable(void) {
    if (PyType_Ready(&TableType) < 0 || PyType_Ready(&TableIterType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&TableType);
    if (PyModule_AddObject(m, "Table", (PyObject *)&TableType) < 0 ||
        PyModule_AddIntConstant(m, "INLINE_MAX", INLINE_MAX) < 0 ||
        PyModule_AddIntConstant(m, "RECORD_HEAD", (long)REC_HEAD) < 0) {
        Py_DECREF(&TableType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
