/* The engine's write path, compiled: VBucket.set's common case, and the flusher's rows (encoded_rows,
   below). VBucket.set's common case (vbucket.py; VBucket._set_py is its
   specification, and tests/engine/test_speedups.py runs both on twin vbuckets and compares every
   field they touch).

   A SET with no CAS and no expiry, on an active vbucket with no locks, over a document that is
   absent, deleted or without expiry, into an open checkpoint that need not roll over: the version
   is made (HLC CAS, rev seqno, by-seqno), queued into the open checkpoint with the de-duplication
   and memory accounting of CheckpointManager.queue, stored in the hash table, and the vbucket's
   counters and listeners are updated - the same steps in the same order as the Python. Anything
   else (and any object of an unexpected type) is recognised before the first change and handed
   to _set_py, so every error, its text and every rare branch stay in one place.

   Why: a server SET spent ~330 of its ~490 bytecodes in the Python method and the queue. The
   objects stay ordinary Python objects with __slots__ that the rest of the engine reads as usual;
   this file reads and writes those slots at the offsets configure() takes from the classes (a
   generic getattr costs as much as the bytecode it replaces), and builds Items straight into
   their slots (the dataclass __init__ was 35 bytecodes). */

#define PY_SSIZE_T_CLEAN
#include "../protocol/_speedups.h"

/* The classes whose slots this file uses, in configure()'s argument order. */
enum { C_ITEM, C_VBUCKET, C_MANAGER, C_CHECKPOINT, C_HLC, N_CLASSES };
static const char *class_label[N_CLASSES] = {"Item", "VBucket", "CheckpointManager", "Checkpoint", "HLC"};

/* Every slot used: its class and name. Item's come first, in its field order. */
static const struct { int cls; const char *name; } attr_spec[] = {
#define A(cls, name) {cls, name}
    A(C_ITEM, "key"), A(C_ITEM, "value"), A(C_ITEM, "flags"), A(C_ITEM, "expiry"), A(C_ITEM, "cas"),
    A(C_ITEM, "rev_seqno"), A(C_ITEM, "by_seqno"), A(C_ITEM, "datatype"), A(C_ITEM, "deleted"),
    A(C_ITEM, "delete_time"), A(C_ITEM, "delete_source"),
    A(C_VBUCKET, "id"), A(C_VBUCKET, "state"), A(C_VBUCKET, "locks"), A(C_VBUCKET, "ht"),
    A(C_VBUCKET, "high_seqno"), A(C_VBUCKET, "max_deleted_rev_seqno"), A(C_VBUCKET, "checkpoint_manager"),
    A(C_VBUCKET, "hlc"), A(C_VBUCKET, "ops_create"), A(C_VBUCKET, "ops_update"), A(C_VBUCKET, "num_items"),
    A(C_VBUCKET, "num_deleted"), A(C_VBUCKET, "_dirty"), A(C_VBUCKET, "_on_seqno"),
    A(C_MANAGER, "high_seqno"), A(C_MANAGER, "checkpoints"), A(C_MANAGER, "max_items"), A(C_MANAGER, "_clock"),
    A(C_MANAGER, "mem_usage"), A(C_MANAGER, "memory_quota"),
    A(C_CHECKPOINT, "num_items"), A(C_CHECKPOINT, "deadline"), A(C_CHECKPOINT, "_index"),
    A(C_CHECKPOINT, "_items"), A(C_CHECKPOINT, "_seqnos"), A(C_CHECKPOINT, "high_seqno"),
    A(C_CHECKPOINT, "fixed_end"), A(C_CHECKPOINT, "snap_end"), A(C_CHECKPOINT, "_holes"),
    A(C_CHECKPOINT, "mem_usage"),
    A(C_HLC, "_max"), A(C_HLC, "_clock"), A(C_HLC, "logical_ticks"),
#undef A
};
enum {
    I_KEY, I_VALUE, I_FLAGS, I_EXPIRY, I_CAS, I_REV, I_SEQNO, I_DATATYPE, I_DELETED, I_DELETE_TIME,
    I_DELETE_SOURCE,
    V_ID, V_STATE, V_LOCKS, V_HT, V_HIGH, V_MAX_DELETED_REV, V_CM, V_HLC, V_OPS_CREATE, V_OPS_UPDATE,
    V_NUM_ITEMS, V_NUM_DELETED, V_DIRTY, V_ON_SEQNO,
    M_HIGH, M_CHECKPOINTS, M_MAX_ITEMS, M_CLOCK, M_MEM, M_QUOTA,
    P_NUM_ITEMS, P_DEADLINE, P_INDEX, P_ITEMS, P_SEQNOS, P_HIGH, P_FIXED_END, P_SNAP_END, P_HOLES, P_MEM,
    H_MAX, H_CLOCK, H_TICKS,
    N_ATTRS
};
#define ITEM_FIELDS 11

static PyTypeObject *classes[N_CLASSES];
static Py_ssize_t offset[N_ATTRS];
static PyObject *item_defaults[3];  /* deleted, delete_time, delete_source of a live version */
static PyObject *fallback;          /* VBucket._set_py */
static PyObject *active_state;      /* VBucketState.ACTIVE */
static long long item_overhead;     /* item.ITEM_OVERHEAD */
static PyObject *zero, *hole_limit, *kw_names[4], *attr_name_value, *s_compact, *s_drop_cursors;
/* time.time_ns and time.monotonic, the clocks HLC and CheckpointManager use unless given others:
   when a slot holds one of them the clock is read here, without a call (~300 instructions each). */
static PyObject *time_ns_fn, *monotonic_fn;

static long long clock_ns(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

#define MAX_CAS 0xFFFFFFFFFFFFFFFEULL
#define LOGICAL_BITS 0xFFFFULL

/* The slot `attr` of `obj` (borrowed; NULL when unset). */
#define SLOT(obj, attr) SLOT_AT(obj, offset[attr])

static inline int is(PyObject *obj, int cls) { return obj != NULL && Py_TYPE(obj) == classes[cls]; }

/* obj.attr = value, stealing value; -1 when value is NULL (an error is set). */
static int put(PyObject *obj, int attr, PyObject *value) {
    if (value == NULL) return -1;
    Py_XSETREF(SLOT(obj, attr), value);
    return 0;
}

/* PyObject_RichCompareBool(a, b, op) for op in GT/GE, natively for small ints. */
static int compare(PyObject *a, PyObject *b, int op) {
    long long x, y;
    if (small_int(a, &x) && small_int(b, &y)) return op == Py_GT ? x > y : x >= y;
    return PyObject_RichCompareBool(a, b, op);
}

/* u64 value of an exact int in [0, 2^64): 1, or 0 with no error set. */
static int as_u64(PyObject *v, unsigned long long *out) {
    long long x;
    if (small_int(v, &x)) {
        if (x < 0) return 0;
        *out = (unsigned long long)x;
        return 1;
    }
    if (!PyLong_CheckExact(v)) return 0;
    unsigned long long r = PyLong_AsUnsignedLongLong(v);
    if (r == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *out = r;
    return 1;
}

/* obj.attr += delta */
static int add(PyObject *obj, int attr, long long delta) {
    PyObject *cur = SLOT(obj, attr);
    if (cur == NULL) {
        PyErr_Format(PyExc_AttributeError, "%s has no value in slot %s", Py_TYPE(obj)->tp_name,
                     attr_spec[attr].name);
        return -1;
    }
    return put(obj, attr, plus(cur, delta));
}

/* Everything the fast path read before its first change: borrowed from slots it does not replace
   before it has used them, except `prev`, `seqno` and `rev`, which it owns. Python code that may
   run in between (the clocks; _compact, which replaces the checkpoint's lists; _drop_cursors) runs
   after the last use of what it could replace. */
typedef struct {
    PyObject *ht, *prev, *seqno, *rev, *cm, *cp, *index, *items, *seqnos, *hlc, *n;
    unsigned long long cas;
    int bump_logical;
} plan_t;

/* Whether obj is an Item with every field set. */
static int is_full_item(PyObject *obj) {
    if (!is(obj, C_ITEM)) return 0;
    for (int i = 0; i < ITEM_FIELDS; i++) {
        if (SLOT(obj, i) == NULL) return 0;
    }
    return 1;
}

static int all_set(PyObject *obj, int first, int last) {
    for (int a = first; a <= last; a++) {
        if (SLOT(obj, a) == NULL) return 0;
    }
    return 1;
}

/* 1: the fast path applies (plan filled); 0: hand over to _set_py; -1: a Python error. */
static int plan_set(PyObject *vb, PyObject *key, plan_t *p) {
    int truth;
    if (!is(vb, C_VBUCKET) || !all_set(vb, V_ID, V_ON_SEQNO)) return 0;
    if (SLOT(vb, V_STATE) != active_state) return 0;
    truth = PyObject_IsTrue(SLOT(vb, V_LOCKS));
    if (truth != 0) return truth < 0 ? -1 : 0;

    p->ht = SLOT(vb, V_HT);
    PyObject *dirty = SLOT(vb, V_DIRTY);
    if (!PyDict_CheckExact(p->ht) || (dirty != Py_None && !PyDict_CheckExact(dirty))) return 0;
    PyObject *prev = PyDict_GetItemWithError(p->ht, key);
    if (prev == NULL && PyErr_Occurred()) return -1;
    if (prev != NULL) {
        if (!is_full_item(prev)) return 0;
        PyObject *deleted = SLOT(prev, I_DELETED);
        if (deleted == Py_False) {
            truth = PyObject_IsTrue(SLOT(prev, I_EXPIRY));
            if (truth != 0) return truth < 0 ? -1 : 0;  /* it may have expired: the clock decides, in Python */
        } else if (deleted != Py_True) {
            return 0;
        }
        p->prev = Py_NewRef(prev);
        p->rev = plus(SLOT(prev, I_REV), 1);
    } else {
        p->rev = plus(SLOT(vb, V_MAX_DELETED_REV), 1);
    }
    if (p->rev == NULL) return -1;
    p->seqno = plus(SLOT(vb, V_HIGH), 1);
    if (p->seqno == NULL) return -1;

    /* CheckpointManager.queue: its seqno check, and the open checkpoint must not roll over. */
    p->cm = SLOT(vb, V_CM);
    if (!is(p->cm, C_MANAGER) || !all_set(p->cm, M_HIGH, M_QUOTA)) return 0;
    truth = compare(p->seqno, SLOT(p->cm, M_HIGH), Py_GT);
    if (truth != 1) return truth < 0 ? -1 : 0;
    PyObject *checkpoints = SLOT(p->cm, M_CHECKPOINTS);
    if (!PyList_CheckExact(checkpoints) || PyList_GET_SIZE(checkpoints) == 0) return 0;
    p->cp = PyList_GET_ITEM(checkpoints, PyList_GET_SIZE(checkpoints) - 1);
    if (!is(p->cp, C_CHECKPOINT) || !all_set(p->cp, P_NUM_ITEMS, P_MEM)) return 0;
    p->n = SLOT(p->cp, P_NUM_ITEMS);
    truth = PyObject_IsTrue(p->n);
    if (truth < 0) return -1;
    if (truth) {
        truth = compare(p->n, SLOT(p->cm, M_MAX_ITEMS), Py_GE);
        if (truth != 0) return truth < 0 ? -1 : 0;
        PyObject *deadline = SLOT(p->cp, P_DEADLINE);
        /* A checkpoint with no age limit has deadline +inf, which no clock reaches. */
        if (!(PyFloat_CheckExact(deadline) && Py_IS_INFINITY(PyFloat_AS_DOUBLE(deadline)) &&
              PyFloat_AS_DOUBLE(deadline) > 0)) {
            PyObject *clock = SLOT(p->cm, M_CLOCK);
            if (clock == monotonic_fn && PyFloat_CheckExact(deadline)) {  /* time.monotonic's seconds */
                if ((double)clock_ns(CLOCK_MONOTONIC) / 1e9 >= PyFloat_AS_DOUBLE(deadline)) return 0;
            } else {
                PyObject *now = PyObject_CallNoArgs(clock);
                if (now == NULL) return -1;
                truth = PyObject_RichCompareBool(now, deadline, Py_GE);
                Py_DECREF(now);
                if (truth != 0) return truth < 0 ? -1 : 0;
            }
        }
    }
    p->index = SLOT(p->cp, P_INDEX);
    p->items = SLOT(p->cp, P_ITEMS);
    p->seqnos = SLOT(p->cp, P_SEQNOS);
    if (!PyDict_CheckExact(p->index) || !PyList_CheckExact(p->items) || !PyList_CheckExact(p->seqnos)) return 0;

    /* HLC.next, decided here and applied later: a counter at its limit is Python's error to raise. */
    p->hlc = SLOT(vb, V_HLC);
    if (!is(p->hlc, C_HLC) || !all_set(p->hlc, H_MAX, H_TICKS)) return 0;
    unsigned long long max, ns;
    if (!as_u64(SLOT(p->hlc, H_MAX), &max)) return 0;
    PyObject *clock = SLOT(p->hlc, H_CLOCK);
    long long wall;
    if (clock == time_ns_fn && (wall = clock_ns(CLOCK_REALTIME)) >= 0) {
        ns = (unsigned long long)wall;
    } else {
        PyObject *now = PyObject_CallNoArgs(clock);
        if (now == NULL) return -1;
        int ok = as_u64(now, &ns);
        Py_DECREF(now);
        if (!ok) return 0;
    }
    ns &= ~LOGICAL_BITS;
    if (ns > max) {
        p->cas = ns;
        p->bump_logical = 0;
    } else {
        if (max >= MAX_CAS) return 0;
        p->cas = max + 1;
        p->bump_logical = 1;
    }
    return 1;
}

static PyObject *new_item(PyObject *key, PyObject *value, PyObject *flags, PyObject *datatype, PyObject *cas,
                          plan_t *p) {
    PyObject *fields[ITEM_FIELDS] = {
        key, value, flags, zero, cas, p->rev, p->seqno, datatype,
        item_defaults[0], item_defaults[1], item_defaults[2]};
    PyTypeObject *type = classes[C_ITEM];
    PyObject *item = type->tp_alloc(type, 0);
    if (item != NULL) {
        for (int i = 0; i < ITEM_FIELDS; i++) SLOT(item, i) = Py_NewRef(fields[i]);
        /* Bytes and ints cannot lead back to the item, so it can never be in a reference cycle: the
           cyclic GC need not track it (CPython untracks such tuples and dicts the same way). Each
           collection traversed every young version, and a full one every version in memory. */
        if (PyBytes_CheckExact(key) && PyBytes_CheckExact(value) && PyLong_CheckExact(flags) &&
            PyLong_CheckExact(datatype) && PyObject_GC_IsTracked(item))
            PyObject_GC_UnTrack(item);
    }
    return item;
}

/* Checkpoint._compact, compiled for a checkpoint of Items (else the Python runs): the holes
   de-duplication left are dropped from its items, its seqnos follow, its index is rebuilt. With
   hot keys a vbucket's open checkpoint compacts every 65 writes, and the Python comprehensions were
   ~5% of a SET. */
static int compact(PyObject *cp) {
    PyObject *items = SLOT(cp, P_ITEMS), *index = SLOT(cp, P_INDEX);
    int fast = PyList_CheckExact(items) && (index == Py_None || PyDict_CheckExact(index));
    Py_ssize_t n = fast ? PyList_GET_SIZE(items) : 0, live = 0;
    for (Py_ssize_t i = 0; fast && i < n; i++) {
        PyObject *it = PyList_GET_ITEM(items, i);
        if (it == Py_None) continue;
        fast = is_full_item(it) && PyBytes_CheckExact(SLOT(it, I_KEY));
        live++;
    }
    if (!fast) {
        PyObject *r = PyObject_CallMethodNoArgs(cp, s_compact);
        Py_XDECREF(r);
        return r ? 0 : -1;
    }
    PyObject *kept = PyList_New(live), *seqnos = PyList_New(live);
    PyObject *positions = index == Py_None ? Py_NewRef(Py_None) : _PyDict_NewPresized(live);
    if (kept == NULL || seqnos == NULL || positions == NULL) goto fail;
    for (Py_ssize_t i = 0, j = 0; i < n; i++) {
        PyObject *it = PyList_GET_ITEM(items, i);
        if (it == Py_None) continue;
        PyList_SET_ITEM(kept, j, Py_NewRef(it));
        PyList_SET_ITEM(seqnos, j, Py_NewRef(SLOT(it, I_SEQNO)));
        if (positions != Py_None) {
            PyObject *pos = PyLong_FromSsize_t(j);
            int rc = pos == NULL ? -1 : PyDict_SetItem(positions, SLOT(it, I_KEY), pos);
            Py_XDECREF(pos);
            if (rc < 0) goto fail;
        }
        j++;
    }
    put(cp, P_ITEMS, kept);
    put(cp, P_SEQNOS, seqnos);
    put(cp, P_INDEX, positions);
    put(cp, P_HOLES, Py_NewRef(zero));
    return 0;
fail:
    Py_XDECREF(kept);
    Py_XDECREF(seqnos);
    Py_XDECREF(positions);
    return -1;
}

/* CheckpointManager.queue into the open checkpoint the plan checked. */
static int queue(plan_t *p, PyObject *key, PyObject *item, PyObject *value) {
    PyObject *cm = p->cm, *cp = p->cp, *seqno = p->seqno, *n = p->n;
    Py_INCREF(n);  /* its slot is replaced below */
    PyObject *pos = PyDict_GetItemWithError(p->index, key);
    if (pos == NULL && PyErr_Occurred()) goto fail;
    Py_XINCREF(pos);
    PyObject *obj = PyLong_FromSsize_t(PyList_GET_SIZE(p->items));
    if (obj == NULL) goto fail;
    int rc = PyDict_SetItem(p->index, key, obj);
    Py_DECREF(obj);
    if (rc < 0 || PyList_Append(p->items, item) < 0 || PyList_Append(p->seqnos, seqno) < 0) goto fail;
    put(cp, P_HIGH, Py_NewRef(seqno));
    put(cm, M_HIGH, Py_NewRef(seqno));
    int fixed = PyObject_IsTrue(SLOT(cp, P_FIXED_END));
    if (fixed < 0) goto fail;
    if (!fixed) put(cp, P_SNAP_END, Py_NewRef(seqno));
    Py_ssize_t vlen = PyObject_Length(value);
    if (vlen < 0) goto fail;
    long long size;
    if (pos == NULL) {
        if (put(cp, P_NUM_ITEMS, plus(n, 1)) < 0) goto fail;
        Py_ssize_t klen = PyObject_Length(key);
        if (klen < 0) goto fail;
        size = (long long)klen + (long long)vlen + item_overhead;
    } else {
        Py_ssize_t i = PyLong_AsSsize_t(pos);
        if (i == -1 && PyErr_Occurred()) goto fail;
        PyObject *older = PyList_GetItem(p->items, i);  /* IndexError if the index lies, as in Python */
        if (older == NULL) goto fail;
        PyObject *old_value = is_full_item(older) ? Py_NewRef(SLOT(older, I_VALUE))
                                                  : PyObject_GetAttr(older, attr_name_value);
        if (old_value == NULL) goto fail;
        Py_ssize_t olen = PyObject_Length(old_value);
        Py_DECREF(old_value);
        if (olen < 0) goto fail;
        size = (long long)vlen - (long long)olen;
        if (PyList_SetItem(p->items, i, Py_NewRef(Py_None)) < 0) goto fail;
        if (add(cp, P_HOLES, 1) < 0) goto fail;
        PyObject *holes = SLOT(cp, P_HOLES);
        int over = compare(holes, hole_limit, Py_GT);
        if (over == 1) over = compare(holes, n, Py_GT);
        if (over < 0) goto fail;
        if (over && compact(cp) < 0) goto fail;
    }
    if (add(cp, P_MEM, size) < 0 || add(cm, M_MEM, size) < 0) goto fail;
    PyObject *quota = SLOT(cm, M_QUOTA);
    if (quota != NULL && quota != Py_None) {
        int over = compare(SLOT(cm, M_MEM), quota, Py_GT);
        if (over < 0) goto fail;
        if (over) {
            obj = PyObject_CallMethodNoArgs(cm, s_drop_cursors);
            if (obj == NULL) goto fail;
            Py_DECREF(obj);
        }
    }
    Py_XDECREF(pos);
    Py_DECREF(n);
    return 0;
fail:
    Py_XDECREF(pos);
    Py_DECREF(n);
    return -1;
}

static int notify(PyObject *listener, PyObject *id, PyObject *arg) {
    if (listener == Py_None) return 0;
    PyObject *args[2] = {id, arg};
    PyObject *r = PyObject_Vectorcall(listener, args, 2, NULL);
    Py_XDECREF(r);
    return r ? 0 : -1;
}

/* The whole write, once plan_set said it applies. Returns the new Item or NULL. */
static PyObject *apply_set(PyObject *vb, PyObject *key, PyObject *value, PyObject *flags, PyObject *datatype,
                           plan_t *p) {
    PyObject *cas = PyLong_FromUnsignedLongLong(p->cas);
    if (cas == NULL) return NULL;
    put(p->hlc, H_MAX, Py_NewRef(cas));
    if (p->bump_logical && add(p->hlc, H_TICKS, 1) < 0) {
        Py_DECREF(cas);
        return NULL;
    }
    PyObject *item = new_item(key, value, flags, datatype, cas, p);
    Py_DECREF(cas);
    if (item == NULL) return NULL;
    if (queue(p, key, item, value) < 0) goto fail;
    /* _queue's accounting for a live version over `prev` */
    if (p->prev == NULL || SLOT(p->prev, I_DELETED) == Py_True) {
        if (p->prev != NULL && add(vb, V_NUM_DELETED, -1) < 0)
            goto fail;
        if (add(vb, V_OPS_CREATE, 1) < 0 || add(vb, V_NUM_ITEMS, 1) < 0) goto fail;
    } else if (add(vb, V_OPS_UPDATE, 1) < 0) {
        goto fail;
    }
    /* queue() may have run Python (_compact, _drop_cursors and its on_drop callbacks): read the
       hash table's slot again rather than trust the pointer the plan borrowed. */
    PyObject *ht = SLOT(vb, V_HT);
    if (ht == NULL || PyDict_SetItem(ht, key, item) < 0) {
        if (ht == NULL) PyErr_SetString(PyExc_AttributeError, "VBucket.ht was deleted during a set");
        goto fail;
    }
    put(vb, V_HIGH, Py_NewRef(p->seqno));
    PyObject *id = SLOT(vb, V_ID), *dirty = SLOT(vb, V_DIRTY);
    if (dirty != Py_None && PyDict_SetItem(dirty, id, Py_None) < 0) goto fail;
    if (notify(SLOT(vb, V_ON_SEQNO), id, p->seqno) < 0) goto fail;
    return item;
fail:
    Py_DECREF(item);
    return NULL;
}

/* VBucket.set(self, key, value, *, flags=0, expiry=0, datatype=0, cas=0), bound as a method. */
static PyObject *vbucket_set(PyObject *module, PyObject *const *args, Py_ssize_t nargsf, PyObject *kwnames) {
    if (fallback == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "dcpflow.engine._speedups.configure() was not called");
        return NULL;
    }
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *kw[4] = {NULL, NULL, NULL, NULL};  /* flags, expiry, datatype, cas */
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    int plain = nargs == 3;
    for (Py_ssize_t i = 0; plain && i < nkw; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        int k = 0;
        while (k < 4 && name != kw_names[k]) k++;  /* call sites pass interned names */
        for (int j = 0; k == 4 && j < 4; j++) {
            int eq = PyUnicode_Check(name) ? PyUnicode_Compare(name, kw_names[j]) : 1;
            if (eq == -1 && PyErr_Occurred()) return NULL;
            if (eq == 0) k = j;
        }
        if (k == 4) {
            plain = 0;
        } else {
            kw[k] = args[nargs + i];
        }
    }
    for (int k = 1; plain && k < 4; k += 2) {  /* no expiry, no CAS */
        if (kw[k] != NULL) {
            int truth = PyObject_IsTrue(kw[k]);
            if (truth < 0) return NULL;
            plain = !truth;
        }
    }
    if (!plain) return PyObject_Vectorcall(fallback, args, nargsf, kwnames);

    PyObject *vb = args[0], *key = args[1], *value = args[2];
    plan_t p = {0};
    PyObject *result = NULL;
    int planned = plan_set(vb, key, &p);
    if (planned > 0) {
        /* Over an older version, its key object stands for the key from here on (an equal bytes
           object): the hash table, the checkpoint's index and the new Item then share one object,
           so their lookups match by identity instead of comparing bytes in another cache line. */
        PyObject *older_key = p.prev != NULL ? SLOT(p.prev, I_KEY) : NULL;
        key = older_key != NULL && PyBytes_CheckExact(older_key) && PyBytes_CheckExact(key) ? older_key : key;
        Py_INCREF(key);
        result = apply_set(vb, key, value, kw[0] ? kw[0] : zero, kw[2] ? kw[2] : zero, &p);
        Py_DECREF(key);
    } else if (planned == 0) {
        result = PyObject_Vectorcall(fallback, args, nargsf, kwnames);
    }
    Py_XDECREF(p.prev);
    Py_XDECREF(p.seqno);
    Py_XDECREF(p.rev);
    return result;
}

static PyMethodDef set_def = {
    "set", (PyCFunction)(void (*)(void))vbucket_set, METH_FASTCALL | METH_KEYWORDS,
    "VBucket.set with its common case compiled (VBucket._set_py is its specification)."};

/* configure(set_py, (Item, VBucket, CheckpointManager, Checkpoint, HLC), item_defaults, active_state,
   item_overhead) -> the method to bind as VBucket.set. Refuses (TypeError) classes whose slots
   are not the ones this file uses. */
static PyObject *configure(PyObject *module, PyObject *args) {
    PyObject *set_py, *types, *defaults, *active;
    long long overhead;
    if (!PyArg_ParseTuple(args, "OO!O!OL", &set_py, &PyTuple_Type, &types, &PyTuple_Type, &defaults, &active,
                          &overhead))
        return NULL;
    if (PyTuple_GET_SIZE(types) != N_CLASSES || PyTuple_GET_SIZE(defaults) != 3) {
        PyErr_SetString(PyExc_TypeError, "configure() takes (Item, VBucket, CheckpointManager, Checkpoint, HLC) "
                        "and (deleted, delete_time, delete_source)");
        return NULL;
    }
    for (int c = 0; c < N_CLASSES; c++) {
        if (!PyType_Check(PyTuple_GET_ITEM(types, c))) {
            PyErr_Format(PyExc_TypeError, "%s is not a class", class_label[c]);
            return NULL;
        }
    }
    /* Item's fields must be exactly the ones new_item fills. */
    PyObject *slots = PyObject_GetAttrString(PyTuple_GET_ITEM(types, C_ITEM), "__slots__");
    PyObject *fields = slots ? PySequence_Tuple(slots) : NULL;
    Py_XDECREF(slots);
    if (fields == NULL) return NULL;
    int ok = PyTuple_GET_SIZE(fields) == ITEM_FIELDS;
    for (int i = 0; ok && i < ITEM_FIELDS; i++) {
        PyObject *f = PyTuple_GET_ITEM(fields, i);
        ok = PyUnicode_Check(f) && PyUnicode_CompareWithASCIIString(f, attr_spec[i].name) == 0;
    }
    Py_DECREF(fields);
    if (!ok) {
        PyErr_SetString(PyExc_TypeError, "Item's fields are not the ones engine/_speedups.c fills");
        return NULL;
    }
    Py_ssize_t offsets[N_ATTRS];
    for (int a = 0; a < N_ATTRS; a++) {
        PyObject *name = PyUnicode_InternFromString(attr_spec[a].name);
        if (name == NULL) return NULL;
        offsets[a] = object_slot_offset((PyTypeObject *)PyTuple_GET_ITEM(types, attr_spec[a].cls), name);
        Py_DECREF(name);
        if (offsets[a] < 0) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not an object slot", class_label[attr_spec[a].cls],
                         attr_spec[a].name);
            return NULL;
        }
    }
    PyObject *func = PyCFunction_New(&set_def, NULL);
    if (func == NULL) return NULL;
    PyObject *method = PyInstanceMethod_New(func);
    Py_DECREF(func);
    if (method == NULL) return NULL;
    Py_XSETREF(fallback, Py_NewRef(set_py));
    Py_XSETREF(active_state, Py_NewRef(active));
    for (int c = 0; c < N_CLASSES; c++) Py_XSETREF(classes[c], (PyTypeObject *)Py_NewRef(PyTuple_GET_ITEM(types, c)));
    for (int i = 0; i < 3; i++) Py_XSETREF(item_defaults[i], Py_NewRef(PyTuple_GET_ITEM(defaults, i)));
    memcpy(offset, offsets, sizeof offsets);
    item_overhead = overhead;
    return method;
}

/* ---------------------------------------------------------------------------------------------
   encoded_rows(vb, items, row_py) - store._encoded_row for each item (store._encoded_rows_py is the
   twin): the flusher's row of every version it writes, built while it holds the GIL (3 us per row
   in Python, taken from the thread serving requests). An item that is not an Item (every item,
   before configure() has named the class), or whose fields do not fit their columns or the DCP
   head, is handed to row_py, so its errors stay Python's. */

#define LARGE_VALUE 2048          /* store.LARGE_VALUE: bound as bytearray below it */
#define ENCODED_VALUE_LIMIT 8192  /* store.ENCODED_VALUE_LIMIT: stored as a whole message below it */
#define DATATYPE_XATTR 0x04

static PyObject *copy_blob(PyObject *bytes) {
    return PyByteArray_FromStringAndSize(PyBytes_AS_STRING(bytes), PyBytes_GET_SIZE(bytes));
}

/* The row of one Item, or NULL with no error set when row_py must build it. */
static PyObject *encoded_row(PyObject *vb_obj, unsigned long long vb, PyObject *it) {
    if (!is_full_item(it)) return NULL;
    PyObject *key = SLOT(it, I_KEY), *value = SLOT(it, I_VALUE), *deleted = SLOT(it, I_DELETED);
    if (!PyBytes_CheckExact(key) || !PyBytes_CheckExact(value) || (deleted != Py_True && deleted != Py_False))
        return NULL;
    unsigned long long rev, cas, seqno, flags, expiry, datatype;
    int ok = as_u64(SLOT(it, I_REV), &rev) && as_u64(SLOT(it, I_CAS), &cas) && as_u64(SLOT(it, I_SEQNO), &seqno) &&
             as_u64(SLOT(it, I_FLAGS), &flags) && as_u64(SLOT(it, I_EXPIRY), &expiry) &&
             as_u64(SLOT(it, I_DATATYPE), &datatype);
    PyObject *source = SLOT(it, I_DELETE_SOURCE);
    if (!ok || !PyLong_Check(source) || !PyLong_CheckExact(SLOT(it, I_DELETE_TIME))) return NULL;
    Py_ssize_t klen = PyBytes_GET_SIZE(key), vlen = PyBytes_GET_SIZE(value);
    int plain = deleted == Py_False && !(datatype & DATATYPE_XATTR) && vlen < ENCODED_VALUE_LIMIT;
    unsigned long long body = 31 + (unsigned long long)klen + (unsigned long long)vlen;
    if (plain && (klen + 1 > 0xFFFF || datatype > 0xFF || vb > 0xFFFF || flags > 0xFFFFFFFFULL ||
                  expiry > 0xFFFFFFFFULL || body + 1 > 0xFFFFFFFFULL))  /* +1: room for a collection prefix */
        return NULL;
    PyObject *row = PyTuple_New(13);
    if (row == NULL) return NULL;
    PyObject *v[13] = {
        Py_NewRef(vb_obj), copy_blob(key), Py_NewRef(SLOT(it, I_SEQNO)), PyLong_FromLongLong((long long)rev),
        PyLong_FromLongLong((long long)cas), Py_NewRef(SLOT(it, I_FLAGS)), Py_NewRef(SLOT(it, I_EXPIRY)),
        Py_NewRef(SLOT(it, I_DATATYPE)), PyLong_FromLong(deleted == Py_True), Py_NewRef(SLOT(it, I_DELETE_TIME)),
        PyNumber_Long(source), NULL, NULL};
    if (plain) {  /* the whole message in `dcp`, the value column empty */
        v[11] = PyByteArray_FromStringAndSize(NULL, 0);
        v[12] = PyByteArray_FromStringAndSize(NULL, MUTATION_FIXED + klen + vlen);
        if (v[12] != NULL) {
            unsigned char *p = (unsigned char *)PyByteArray_AS_STRING(v[12]);
            put_mutation_head(p, (uint64_t)klen, datatype, vb, body, 0, cas, seqno, rev, flags, expiry);
            memcpy(p + MUTATION_FIXED, PyBytes_AS_STRING(key), (size_t)klen);
            memcpy(p + MUTATION_FIXED + klen, PyBytes_AS_STRING(value), (size_t)vlen);
        }
    } else {
        v[11] = vlen < LARGE_VALUE ? copy_blob(value) : Py_NewRef(value);
        v[12] = Py_NewRef(Py_None);
    }
    for (int i = 0; i < 13; i++) {
        if (v[i] == NULL) {
            for (int j = 0; j < 13; j++) Py_XDECREF(v[j]);
            Py_DECREF(row);
            return NULL;  /* with the error set: a failed allocation is not row_py's to handle */
        }
    }
    for (int i = 0; i < 13; i++) PyTuple_SET_ITEM(row, i, v[i]);
    return row;
}

static PyObject *encoded_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "encoded_rows(vb, items, row_py) takes 3 arguments");
        return NULL;
    }
    PyObject *vb_obj = args[0], *row_py = args[2];
    unsigned long long vb;
    int ok = as_u64(vb_obj, &vb);
    PyObject *seq = PySequence_Fast(args[1], "items must be iterable");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *it = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *row = ok ? encoded_row(vb_obj, vb, it) : NULL;
        if (row == NULL && !PyErr_Occurred()) {
            PyObject *call_args[2] = {vb_obj, it};
            row = PyObject_Vectorcall(row_py, call_args, 2, NULL);
        }
        if (row == NULL) {
            Py_CLEAR(out);
        } else {
            PyList_SET_ITEM(out, i, row);
        }
    }
    Py_DECREF(seq);
    return out;
}

static PyMethodDef methods[] = {
    {"encoded_rows", (PyCFunction)(void (*)(void))encoded_rows, METH_FASTCALL,
     "encoded_rows(vb, items, row_py) -> [store._encoded_row(vb, item) for item in items]"},
    {"configure", configure, METH_VARARGS,
     "configure(set_py, (Item, VBucket, CheckpointManager, Checkpoint, HLC), (deleted, delete_time, "
     "delete_source), VBucketState.ACTIVE, ITEM_OVERHEAD) -> the compiled VBucket.set, falling back to set_py."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "dcpflow.engine._speedups",
                                        "The engine's write path, compiled (see _speedups.c).", -1, methods};

PyMODINIT_FUNC PyInit__speedups(void) {
    static const char *kw_text[4] = {"flags", "expiry", "datatype", "cas"};
    for (int k = 0; k < 4; k++) {
        kw_names[k] = PyUnicode_InternFromString(kw_text[k]);
        if (kw_names[k] == NULL) return NULL;
    }
    attr_name_value = PyUnicode_InternFromString("value");
    s_compact = PyUnicode_InternFromString("_compact");
    s_drop_cursors = PyUnicode_InternFromString("_drop_cursors");
    zero = PyLong_FromLong(0);
    hole_limit = PyLong_FromLong(64);
    PyObject *time = PyImport_ImportModule("time");
    if (time == NULL) return NULL;
    time_ns_fn = PyObject_GetAttrString(time, "time_ns");
    monotonic_fn = PyObject_GetAttrString(time, "monotonic");
    Py_DECREF(time);
    if (time_ns_fn == NULL || monotonic_fn == NULL) return NULL;
    if (attr_name_value == NULL || s_compact == NULL || s_drop_cursors == NULL || zero == NULL ||
        hole_limit == NULL)
        return NULL;
    return PyModule_Create(&module_def);
}
