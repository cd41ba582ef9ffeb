/* The flusher's rows, compiled: store._encoded_rows_py builds the same rows in Python (its
   specification; tests/engine/test_encoded_rows.py holds them equal).

   encoded_rows(vb, items, row_py) - store._encoded_row for each item: the flusher's row of every
   version it writes, built while it holds the GIL (time that, spent in Python per row, is taken from the
   thread serving requests). It reads the documents' fields - the engine's Items are the protocol's
   Documents (dcpflow.protocol.document) - from their slots (_speedups.h) and writes bytes, ints
   and tuples only; an item that is not a Document, or whose fields do not fit their columns or
   the DCP head, is handed to row_py, so its errors stay Python's. */

#define PY_SSIZE_T_CLEAN
#include "../protocol/_speedups.h"

enum {
    I_KEY, I_VALUE, I_FLAGS, I_EXPIRY, I_CAS, I_REV, I_SEQNO, I_DATATYPE, I_DELETED, I_DELETE_TIME,
    I_DELETE_SOURCE, I_CID, N_FIELDS
};
static const char *const FIELD_NAMES[N_FIELDS] = {
    "key", "value", "flags", "expiry", "cas", "rev_seqno", "by_seqno", "datatype", "deleted", "delete_time",
    "delete_source", "cid"};
#define ROW_LEN 14  /* engine/store_rows.FlushRow, in its order (tests/engine/test_encoded_rows.py reads these rows by its names) */
static document_fields_t documents;

/* u64 value of an exact int in [0, 2^64): 1, or 0 with no error set. The common values (below
   2^63) take PyLong_AsLongLongAndOverflow, several times cheaper than the unsigned conversion. */
static int as_u64(PyObject *v, unsigned long long *out) {
    if (!PyLong_CheckExact(v)) return 0;
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (!overflow && !(x == -1 && PyErr_Occurred())) {
        if (x < 0) return 0;
        *out = (unsigned long long)x;
        return 1;
    }
    PyErr_Clear();
    unsigned long long r = PyLong_AsUnsignedLongLong(v);
    if (r == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *out = r;
    return 1;
}

/* Field i of a Document (borrowed). */
#define F(it, i) document_field(&documents, it, i)

#define LARGE_VALUE 2048          /* store.LARGE_VALUE: bound as bytearray below it */
#define ENCODED_VALUE_LIMIT 8192  /* store.ENCODED_VALUE_LIMIT: stored as a whole message below it */
#define DATATYPE_XATTR 0x04

static PyObject *copy_blob(PyObject *bytes) {
    return PyByteArray_FromStringAndSize(PyBytes_AS_STRING(bytes), PyBytes_GET_SIZE(bytes));
}

/* The row of one Item, or NULL with no error set when row_py must build it. */
static PyObject *encoded_row(PyObject *vb_obj, unsigned long long vb, PyObject *it) {
    if (!document_fields_of(&documents, it)) return NULL;
    for (int i = 0; i < N_FIELDS; i++) {
        if (F(it, i) == NULL) return NULL;  /* an unset slot: row_py reports it */
    }
    PyObject *key = F(it, I_KEY), *value = F(it, I_VALUE), *deleted = F(it, I_DELETED);
    if (!PyBytes_CheckExact(key) || !PyBytes_CheckExact(value) || (deleted != Py_True && deleted != Py_False))
        return NULL;
    unsigned long long rev, cas, seqno, flags, expiry, datatype, cid;
    int ok = as_u64(F(it, I_REV), &rev) && as_u64(F(it, I_CAS), &cas) && as_u64(F(it, I_SEQNO), &seqno) &&
             as_u64(F(it, I_FLAGS), &flags) && as_u64(F(it, I_EXPIRY), &expiry) &&
             as_u64(F(it, I_DATATYPE), &datatype) && as_u64(F(it, I_CID), &cid) && cid <= 0xFFFFFFFFULL;
    PyObject *source = F(it, I_DELETE_SOURCE);
    if (!ok || !PyLong_Check(source) || !PyLong_CheckExact(F(it, I_DELETE_TIME))) return NULL;
    Py_ssize_t klen = PyBytes_GET_SIZE(key), vlen = PyBytes_GET_SIZE(value);
    /* only the default collection's: a stored message's key has no collection prefix */
    int plain = deleted == Py_False && !(datatype & DATATYPE_XATTR) && vlen < ENCODED_VALUE_LIMIT && cid == 0;
    unsigned long long body = 31 + (unsigned long long)klen + (unsigned long long)vlen;
    if (plain && (klen + 1 > 0xFFFF || datatype > 0xFF || vb > 0xFFFF || flags > 0xFFFFFFFFULL ||
                  expiry > 0xFFFFFFFFULL || body + 1 > 0xFFFFFFFFULL))  /* +1: room for a collection prefix */
        return NULL;
    PyObject *row = PyTuple_New(ROW_LEN);
    if (row == NULL) return NULL;
    PyObject *v[ROW_LEN] = {
        Py_NewRef(vb_obj), copy_blob(key), Py_NewRef(F(it, I_SEQNO)), PyLong_FromLongLong((long long)rev),
        PyLong_FromLongLong((long long)cas), Py_NewRef(F(it, I_FLAGS)), Py_NewRef(F(it, I_EXPIRY)),
        Py_NewRef(F(it, I_DATATYPE)), PyLong_FromLong(deleted == Py_True), Py_NewRef(F(it, I_DELETE_TIME)),
        PyNumber_Long(source), NULL, NULL, Py_NewRef(F(it, I_CID))};
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
    for (int i = 0; i < ROW_LEN; i++) {
        if (v[i] == NULL) {
            for (int j = 0; j < ROW_LEN; j++) Py_XDECREF(v[j]);
            Py_DECREF(row);
            return NULL;  /* with the error set: a failed allocation is not row_py's to handle */
        }
    }
    for (int i = 0; i < ROW_LEN; i++) PyTuple_SET_ITEM(row, i, v[i]);
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
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "dcpflow.engine._speedups",
                                        "The flusher's rows, compiled (see _speedups.c).", -1, methods};

PyMODINIT_FUNC PyInit__speedups(void) {
    if (document_fields_init(&documents, FIELD_NAMES, N_FIELDS) < 0) return NULL;
    return PyModule_Create(&module_def);
}
