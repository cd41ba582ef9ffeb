/* What the compiled twins share (protocol/, engine/ and server/_speedups.c include it): big-endian
   fields, the DCP_MUTATION header, where a class keeps an attribute in an object slot, and native
   arithmetic on small ints. */

#ifndef DCPFLOW_SPEEDUPS_H
#define DCPFLOW_SPEEDUPS_H

#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

static inline uint16_t be16(const unsigned char *p) { return (uint16_t)((p[0] << 8) | p[1]); }

static inline uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static inline uint64_t be64(const unsigned char *p) {
    return ((uint64_t)be32(p) << 32) | (uint64_t)be32(p + 4);
}

static inline void put16(unsigned char *p, uint64_t v) { p[0] = (unsigned char)(v >> 8); p[1] = (unsigned char)v; }
static inline void put32(unsigned char *p, uint64_t v) { put16(p, v >> 16); put16(p + 2, v); }
static inline void put64(unsigned char *p, uint64_t v) { put32(p, v >> 32); put32(p + 4, v); }

/* Ask for the cache line at p (a hint: p may be anything, nothing faults). As an asm statement
   because GCC 12 at -O2 -DNDEBUG (setuptools' flags) emitted none of encode_mutations'
   __builtin_prefetch calls - objdump showed no prefetch in it - which made it ~1.7x slower on
   items that have left the caches. */
static inline void prefetch(const void *p) {
#if defined(__GNUC__) && defined(__x86_64__)
    __asm__ volatile("prefetcht0 (%0)" : : "r"(p));
#else
    __builtin_prefetch(p);
#endif
}

#define MUTATION_FIXED (24 + 31)  /* a DCP_MUTATION's header + extras (mutation.md) */

/* A DCP_MUTATION's header and extras, MUTATION_FIXED bytes: `klen` counts a collection prefix,
   `body` is extras + key + value; lock time, nmeta and nru are 0. */
static inline void put_mutation_head(unsigned char *p, uint64_t klen, uint64_t datatype, uint64_t vbucket,
                                     uint64_t body, uint64_t opaque, uint64_t cas, uint64_t seqno, uint64_t rev,
                                     uint64_t flags, uint64_t expiry) {
    p[0] = 0x80;
    p[1] = 0x57;
    put16(p + 2, klen);
    p[4] = 31;
    p[5] = (unsigned char)datatype;
    put16(p + 6, vbucket);
    put32(p + 8, body);
    put32(p + 12, opaque);
    put64(p + 16, cas);
    put64(p + 24, seqno);
    put64(p + 32, rev);
    put32(p + 40, flags);
    put32(p + 44, expiry);
    memset(p + 48, 0, 7);  /* lock time, nmeta, nru */
}

/* Where instances of `type` keep the attribute `name` (an interned str): the offset of a writable
   object slot whose descriptor the class finds (its own or a base's), or -1 when it is anything
   else. A slot read at that offset is what the generic getattr would return. */
static inline Py_ssize_t object_slot_offset(PyTypeObject *type, PyObject *name) {
    PyObject *descr = _PyType_Lookup(type, name);  /* borrowed */
    if (descr == NULL || Py_TYPE(descr) != &PyMemberDescr_Type) return -1;
    if (!PyType_IsSubtype(type, PyDescr_TYPE(descr))) return -1;
    PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
    if (member->type != T_OBJECT_EX || (member->flags & READONLY)) return -1;
    return member->offset;
}

/* The object slot at byte offset `off` of obj (borrowed; NULL when unset): see object_slot_offset. */
#define SLOT_AT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

/* The value of an exact int that fits a long long (1), or 0 with no error set. The counters,
   seqnos and CAS values here always fit: their arithmetic and comparisons stay native (the
   generic number protocol cost ~100 instructions per operation, PyLong_AsUnsignedLongLong ~250). */
static inline int small_int(PyObject *v, long long *out) {
    if (!PyLong_CheckExact(v)) return 0;
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow) return 0;
    if (x == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *out = x;
    return 1;
}

/* a + b (a new reference), natively when a is a small int and the sum fits. */
static inline PyObject *plus(PyObject *a, long long b) {
    long long x;
    if (small_int(a, &x) && !(b > 0 && x > LLONG_MAX - b) && !(b < 0 && x < LLONG_MIN - b))
        return PyLong_FromLongLong(x + b);
    PyObject *b_obj = PyLong_FromLongLong(b);
    if (b_obj == NULL) return NULL;
    PyObject *sum = PyNumber_Add(a, b_obj);
    Py_DECREF(b_obj);
    return sum;
}

#endif
