/* What protocol/_speedups.c and engine/_speedups.c share: big-endian fields, the DCP_MUTATION
   header, and reading the fields of the protocol's document record. */

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
   because GCC at setuptools' flags (-O2 -DNDEBUG) may drop __builtin_prefetch calls altogether,
   and encode_mutations relies on the prefetch to hide cache misses on items that have left the
   caches. */
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

/* -- documents: the protocol's record (dcpflow.protocol.document.Document) ---------------------
   The compiled encoders read documents' fields. A Document keeps them in object slots, so for an
   instance of Document (or of a subclass such as the engine's Item, which adds no slots) a field
   is one load at the offset of Document's own member descriptor; any other object is read through
   getattr by the caller, as the Python specifications read it. The shortcut holds only while the
   class is the one learned and unchanged since (its version tag: CPython clears it when the class
   or a base is modified), looks attributes up generically, and finds every field at Document's
   slot descriptor (no property or other descriptor in front of it). */

#define DOCUMENT_MAX_FIELDS 16

typedef struct {
    int n;
    PyObject *names[DOCUMENT_MAX_FIELDS];  /* interned field names */
    PyTypeObject *document;                /* Document */
    PyTypeObject *type;                    /* the class learned last */
    unsigned int version;
    Py_ssize_t offsets[DOCUMENT_MAX_FIELDS];
} document_fields_t;

/* Set up `r` for the fields `names` (at most DOCUMENT_MAX_FIELDS): 0, or -1 with an exception set. */
static int document_fields_init(document_fields_t *r, const char *const *names, int n) {
    r->n = n;
    for (int i = 0; i < n; i++) {
        r->names[i] = PyUnicode_InternFromString(names[i]);
        if (r->names[i] == NULL) return -1;
    }
    PyObject *module = PyImport_ImportModule("dcpflow.protocol.document");
    if (module == NULL) return -1;
    PyObject *document = PyObject_GetAttrString(module, "Document");
    Py_DECREF(module);
    if (document == NULL) return -1;
    if (!PyType_Check(document)) {
        Py_DECREF(document);
        PyErr_SetString(PyExc_TypeError, "dcpflow.protocol.document.Document is not a class");
        return -1;
    }
    r->document = (PyTypeObject *)document;
    r->type = NULL;
    return 0;
}

static inline int document_fields_known(const document_fields_t *r, PyTypeObject *type) {
    return type == r->type && (type->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) && type->tp_version_tag == r->version;
}

/* Whether instances of `type` are Documents whose slots hold the fields (then learned): 1 or 0. */
static int document_fields_learn(document_fields_t *r, PyTypeObject *type) {
    if (!PyType_IsSubtype(type, r->document) || type->tp_getattro != PyObject_GenericGetAttr) return 0;
    Py_ssize_t offsets[DOCUMENT_MAX_FIELDS];
    for (int i = 0; i < r->n; i++) {
        PyObject *descr = _PyType_Lookup(type, r->names[i]);  /* borrowed */
        if (descr == NULL || Py_TYPE(descr) != &PyMemberDescr_Type || PyDescr_TYPE(descr) != r->document) return 0;
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        if (member->type != T_OBJECT_EX || (member->flags & READONLY)) return 0;
        offsets[i] = member->offset;
    }
    if (!(type->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)) return 0;  /* (the lookups assign one) */
    memcpy(r->offsets, offsets, sizeof offsets);
    r->version = type->tp_version_tag;
    Py_INCREF(type);
    Py_XSETREF(r->type, type);
    return 1;
}

/* Whether obj is a Document whose fields document_field reads from its slots. */
static inline int document_fields_of(document_fields_t *r, PyObject *obj) {
    PyTypeObject *type = Py_TYPE(obj);
    return document_fields_known(r, type) || document_fields_learn(r, type);
}

/* Field i (in document_fields_init's order) of a Document that document_fields_of accepted
   (borrowed; NULL when unset). */
#define document_field(r, obj, i) (*(PyObject **)((char *)(obj) + (r)->offsets[i]))

#endif
