/* Hot loops of the protocol and of the DCP client's decoder, compiled: each has a pure-Python twin
   that is its specification, and tests/protocol/test_speedups.py checks that both give the same
   results for the same input.
   Built as an optional extension: without a compiler, dcpflow runs the Python twins alone.

   split - the frame splitter of FrameDecoder.frames (frame.py). It takes the well-formed frames
   that are all of a busy connection's traffic and stops before the first frame it does not take -
   incomplete, an unknown magic, a body over the limit, lengths that exceed the body - leaving that
   one to the Python loop, so every error, its text and the waiting for more bytes stay in one place.

   encode_mutations - DCP_MUTATION messages for a run of documents (dcp.encode_mutations_py): what a
   producer's in-memory stream sends. It reads the fields of the protocol's own record,
   dcpflow.protocol.document.Document (the engine's Item is one), from its slots, and any other
   object's through getattr, as the Python does. It stops before the first document that is not a plain
   mutation (deleted, xattrs, a large value) or whose fields do not fit the message, leaving it to
   the caller's general path.

   walk_stream - the frame walk of a receive loop (the DCP client's connection, the cluster
   manager's relay link): the offsets of a run of complete request frames whose opcode the caller's
   table marks (stream messages), stopping at the first other or incomplete frame, which the Python
   loop then reads with frame.frame_head (frame.walk_stream_py).

   stamp_mutations - a backfill page of stored DCP_MUTATION messages (opaque 0, no collection
   prefix) as a stream sends them (dcp.stamp_mutations_py): its opaque and, for a collection-aware
   stream, the default collection's prefix; the page's layout and seqno order are checked on the
   way. The copy runs without the GIL (a backfill's worker thread). mutations_upto measures the head
   of such a page up to a seqno (a backfill that ends inside a stored run), with the same checks.

   gather - the first bytes of many frames that sit in several received segments, into one
   matrix (columns.gather_py): the client's columnar decoder reads every header and every key and
   value prefix this way.

   concat - the bytes of many (buffer, offset, length) ranges, one after the other, as one bytes
   object (columns.concat_py): the data of the client's key and value columns, copied once from
   the received segments. */

#define PY_SSIZE_T_CLEAN
#include "_speedups.h"

#define HEADER_LEN 24

/* The magics of frame.Magic; 0x08 and 0x18 carry framing extras. */
static inline int known_magic(unsigned char m) {
    return m == 0x80 || m == 0x81 || m == 0x08 || m == 0x18 || m == 0x82 || m == 0x83;
}

/* A new instance of the tuple subclass `type` (frame.Frame) owning the ten values, or NULL. */
static PyObject *make_frame(PyTypeObject *type, PyObject *items[10]) {
    PyObject *frame = NULL;
    for (int i = 0; i < 10; i++) {
        if (items[i] == NULL) goto done;
    }
    frame = type->tp_alloc(type, 10);
    if (frame == NULL) goto done;
    for (int i = 0; i < 10; i++) {
        PyTuple_SET_ITEM(frame, i, items[i]);
        items[i] = NULL;
    }
done:
    for (int i = 0; i < 10; i++) Py_XDECREF(items[i]);
    return frame;
}

PyDoc_STRVAR(split_doc,
"split(buf, pos, max_body, frame_type, limit) -> (frames, ends)\n\n"
"At most `limit` whole, well-formed frames of the bytes `buf` from `pos`, as `frame_type`\n"
"tuples, and the offset just past each. Stops before the first frame it does not take.");

static PyObject *split(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "split(buf, pos, max_body, frame_type, limit) takes 5 arguments");
        return NULL;
    }
    PyObject *buf = args[0];
    if (!PyBytes_Check(buf)) {
        PyErr_SetString(PyExc_TypeError, "split: buf must be bytes");
        return NULL;
    }
    if (!PyType_Check(args[3]) || !PyType_IsSubtype((PyTypeObject *)args[3], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "split: frame_type must be a tuple subclass");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)args[3];
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    if (pos == -1 && PyErr_Occurred()) return NULL;
    unsigned long long max_body = PyLong_AsUnsignedLongLong(args[2]);
    if (max_body == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    Py_ssize_t limit = PyLong_AsSsize_t(args[4]);
    if (limit == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t end = PyBytes_GET_SIZE(buf);
    if (pos < 0 || pos > end) {
        PyErr_SetString(PyExc_ValueError, "split: pos outside the buffer");
        return NULL;
    }
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(buf);

    PyObject *frames = PyList_New(0);
    PyObject *ends = PyList_New(0);
    if (frames == NULL || ends == NULL) goto fail;
    Py_ssize_t n = 0;
    while (n < limit && end - pos >= HEADER_LEN) {
        const unsigned char *h = data + pos;
        unsigned char magic = h[0];
        uint32_t body = be32(h + 8);
        if (!known_magic(magic) || body > max_body || (Py_ssize_t)body > end - pos - HEADER_LEN) break;
        uint32_t fr_len, key_len, ext_len = h[4];
        if (magic == 0x08 || magic == 0x18) {
            fr_len = h[2];
            key_len = h[3];
        } else {
            fr_len = 0;
            key_len = be16(h + 2);
        }
        if ((uint64_t)fr_len + ext_len + key_len > body) break;
        const char *b = (const char *)h + HEADER_LEN;
        PyObject *items[10] = {
            PyLong_FromLong(magic),
            PyLong_FromLong(h[1]),
            PyLong_FromLong(h[5]),
            PyLong_FromLong(be16(h + 6)),
            PyLong_FromUnsignedLong(be32(h + 12)),
            PyLong_FromUnsignedLongLong(be64(h + 16)),
            PyBytes_FromStringAndSize(b, fr_len),
            PyBytes_FromStringAndSize(b + fr_len, ext_len),
            PyBytes_FromStringAndSize(b + fr_len + ext_len, key_len),
            PyBytes_FromStringAndSize(b + fr_len + ext_len + key_len, body - fr_len - ext_len - key_len),
        };
        PyObject *frame = make_frame(type, items);
        if (frame == NULL) goto fail;
        int failed = PyList_Append(frames, frame);
        Py_DECREF(frame);
        if (failed) goto fail;
        pos += HEADER_LEN + (Py_ssize_t)body;
        PyObject *at = PyLong_FromSsize_t(pos);
        if (at == NULL) goto fail;
        failed = PyList_Append(ends, at);
        Py_DECREF(at);
        if (failed) goto fail;
        n++;
    }
    return Py_BuildValue("(NN)", frames, ends);
fail:
    Py_XDECREF(frames);
    Py_XDECREF(ends);
    return NULL;
}


/* -- encode_mutations ------------------------------------------------------------------------ */

enum { F_KEY, F_VALUE, F_CAS, F_BY_SEQNO, F_REV_SEQNO, F_FLAGS, F_EXPIRY, F_DATATYPE, F_DELETED, F_CID, N_FIELDS };
static const char *const FIELD_NAMES[N_FIELDS] = {
    "key", "value", "cas", "by_seqno", "rev_seqno", "flags", "expiry", "datatype", "deleted", "cid",
};
/* The fields a mutation needs, read from a Document's slots (_speedups.h). */
static document_fields_t documents;

enum { BORROWED, OWNED, MISSING };

/* The item's fields: borrowed references (BORROWED) when it is a Document - no Python code runs
   while they are used - else new references from getattr (OWNED, release() them); MISSING when a
   field is not there (the caller's general path reports it), or -1 with another exception set. */
static int read_fields(PyObject *item, PyObject *out[N_FIELDS]) {
    if (document_fields_of(&documents, item)) {
        for (int i = 0; i < N_FIELDS; i++) {
            out[i] = document_field(&documents, item, i);
            if (out[i] == NULL) return MISSING;  /* an unset slot */
        }
        return BORROWED;
    }
    Py_INCREF(item);  /* a property may drop the caller's last reference to it */
    for (int i = 0; i < N_FIELDS; i++) {
        out[i] = PyObject_GetAttr(item, documents.names[i]);
        if (out[i] == NULL) {
            for (int j = 0; j < i; j++) Py_DECREF(out[j]);
            Py_DECREF(item);
            if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
                PyErr_Clear();
                return MISSING;
            }
            return -1;
        }
    }
    Py_DECREF(item);
    return OWNED;
}

/* An int field as an unsigned number of at most `max`; 0 if it is not one (no exception left). */
static int as_unsigned(PyObject *v, unsigned long long max, unsigned long long *out) {
    if (!PyLong_Check(v)) return 0;
    unsigned long long x = PyLong_AsUnsignedLongLong(v);
    if (x == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (x > max) return 0;
    *out = x;
    return 1;
}

typedef struct {
    unsigned long long datatype, cas, seqno, rev, flags, expiry, cid;
    int prefix;  /* the bytes of the key's collection prefix */
    Py_ssize_t size;  /* the whole message */
} Mutation;

/* The unsigned LEB128 form of x (Collections.md's key prefix) at p; its length. */
static int put_leb128(unsigned char *p, unsigned long long x) {
    int n = 0;
    do {
        unsigned char b = x & 0x7F;
        x >>= 7;
        p[n++] = x ? (b | 0x80) : b;
    } while (x);
    return n;
}

static int leb128_len(unsigned long long x) {
    int n = 1;
    while (x >>= 7) n++;
    return n;
}

/* Whether the fields make a plain mutation that fits the message; if so, fill *m. A document of
   the default collection, or with `collections` of a user collection (id 8 or more; an engine
   keeps its system events under 1). */
static int plain_mutation(PyObject *f[N_FIELDS], int collections, Py_ssize_t large_value, Mutation *m) {
    if (!PyBytes_Check(f[F_KEY]) || !PyBytes_Check(f[F_VALUE]) || f[F_DELETED] != Py_False) return 0;
    if (!as_unsigned(f[F_CID], collections ? 0xFFFFFFFFULL : 0, &m->cid) || (m->cid && m->cid < 8)) return 0;
    if (!as_unsigned(f[F_DATATYPE], 0xFF, &m->datatype) || (m->datatype & 0x04)) return 0;  /* 0x04: xattrs */
    m->prefix = collections ? leb128_len(m->cid) : 0;
    Py_ssize_t klen = PyBytes_GET_SIZE(f[F_KEY]) + m->prefix, vlen = PyBytes_GET_SIZE(f[F_VALUE]);
    if (vlen >= large_value || klen > 0xFFFF || 31 + klen + vlen > 0xFFFFFFFFLL) return 0;
    m->size = MUTATION_FIXED + klen + vlen;
    return as_unsigned(f[F_CAS], ~0ULL, &m->cas) && as_unsigned(f[F_BY_SEQNO], ~0ULL, &m->seqno)
           && as_unsigned(f[F_REV_SEQNO], ~0ULL, &m->rev) && as_unsigned(f[F_FLAGS], 0xFFFFFFFFULL, &m->flags)
           && as_unsigned(f[F_EXPIRY], 0xFFFFFFFFULL, &m->expiry);
}

/* A stream's documents were written long before it reads them, so nearly every field is a cache
   miss: ask for the item 8 ahead (its first two lines: the slots), and for the fields of the item
   4 ahead (fetched by then), the value's first three lines (a value below LARGE_VALUE is mostly
   small; more lines cost more than they save). */
static inline void prefetch_ahead(PyObject *seq, Py_ssize_t i) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    if (i + 8 < n) {
        prefetch(items[i + 8]);
        prefetch((const char *)items[i + 8] + 64);
    }
    if (i + 4 < n && document_fields_known(&documents, Py_TYPE(items[i + 4]))) {
        PyObject *item = items[i + 4];
        for (int k = 0; k < F_DATATYPE; k++) {  /* key, value, cas, seqnos, flags, expiry */
            prefetch(document_field(&documents, item, k));
        }
        const char *value = (const char *)document_field(&documents, item, F_VALUE);
        prefetch(value + 64);
        prefetch(value + 128);
    }
}

static void release(PyObject *f[N_FIELDS]) {
    for (int i = 0; i < N_FIELDS; i++) Py_DECREF(f[i]);
}

PyDoc_STRVAR(encode_mutations_doc,
"encode_mutations(items, start, vbucket, opaque, collections, large_value) -> (data, stop)\n\n"
"The DCP_MUTATION messages of items[start:stop] joined, where stop is the index of the first item\n"
"that is not a plain mutation (deleted, xattrs, a value of at least large_value bytes, not the\n"
"default collection's or - with collections - a user collection's document) or whose\n"
"fields do not fit the message (or len(items)). Same bytes as dcp.encode_mutations_py.");

static PyObject *encode_mutations(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "encode_mutations(items, start, vbucket, opaque, collections, large_value) takes 6 arguments");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "encode_mutations: items must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *data = NULL;
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred()) goto fail;
    unsigned long vbucket = PyLong_AsUnsignedLong(args[2]);
    if (vbucket == (unsigned long)-1 && PyErr_Occurred()) goto fail;
    unsigned long opaque = PyLong_AsUnsignedLong(args[3]);
    if (opaque == (unsigned long)-1 && PyErr_Occurred()) goto fail;
    Py_ssize_t large_value = PyLong_AsSsize_t(args[5]);
    if (large_value == -1 && PyErr_Occurred()) goto fail;
    int collections = PyObject_IsTrue(args[4]);
    if (collections < 0) goto fail;
    if (vbucket > 0xFFFF || opaque > 0xFFFFFFFFUL || start < 0 || start > n) {
        PyErr_SetString(PyExc_ValueError, "encode_mutations: vbucket, opaque or start out of range");
        goto fail;
    }

    /* One pass over the run, into a buffer that doubles as needed (fields are read once: most of
       the time goes to fetching them from memory). */
    Py_ssize_t size = 4096, used = 0, stop = start;
    data = PyBytes_FromStringAndSize(NULL, size);
    if (data == NULL) goto fail;
    for (; stop < PySequence_Fast_GET_SIZE(seq); stop++) {  /* re-read: a getattr may change the list */
        PyObject *f[N_FIELDS];
        Mutation m;
        prefetch_ahead(seq, stop);
        int got = read_fields(PySequence_Fast_ITEMS(seq)[stop], f);
        if (got < 0) goto fail;
        if (got == MISSING) break;
        int owned = got == OWNED;
        if (!plain_mutation(f, collections, large_value, &m)) {
            if (owned) release(f);
            break;
        }
        if (used + m.size > size) {
            while (used + m.size > size) size *= 2;
            if (_PyBytes_Resize(&data, size) < 0) {
                if (owned) release(f);
                goto fail;  /* data is NULL now */
            }
        }
        unsigned char *p = (unsigned char *)PyBytes_AS_STRING(data) + used;
        Py_ssize_t key_size = PyBytes_GET_SIZE(f[F_KEY]), value_size = PyBytes_GET_SIZE(f[F_VALUE]);
        Py_ssize_t klen = key_size + m.prefix;
        put_mutation_head(p, (uint64_t)klen, m.datatype, vbucket, (uint64_t)(31 + klen + value_size), opaque, m.cas,
                          m.seqno, m.rev, m.flags, m.expiry);
        p += MUTATION_FIXED;
        if (collections) p += put_leb128(p, m.cid);  /* the collection's LEB128 prefix */
        memcpy(p, PyBytes_AS_STRING(f[F_KEY]), (size_t)key_size);
        memcpy(p + key_size, PyBytes_AS_STRING(f[F_VALUE]), (size_t)value_size);
        used += m.size;
        if (owned) release(f);
    }
    if (_PyBytes_Resize(&data, used) < 0) goto fail;
    Py_DECREF(seq);
    return Py_BuildValue("(Nn)", data, stop);
fail:
    Py_XDECREF(data);
    Py_DECREF(seq);
    return NULL;
}


/* -- walk_stream and gather ---------------------------------------------------------------- */

PyDoc_STRVAR(walk_stream_doc,
"walk_stream(buf, pos, table[, end]) -> (pos, starts)\n\n"
"From pos, the run of complete frames with magic 0x80 and table[opcode] != 0 in buf[:end] (any\n"
"bytes-like buffer; end defaults to its length): returns the offset just past the run and the\n"
"frames' start offsets as native int64 bytes. Same as frame.walk_stream_py.");

/* The arguments of the walkers, (buf, pos, table[, end]): 0 with *view held (release it), *pos,
   *end and *table set; -1 with an exception set. A receive buffer the connection fills in place
   (a bytearray) is taken as well as bytes. */
static int walk_args(const char *name, PyObject *const *args, Py_ssize_t nargs, Py_buffer *view, Py_ssize_t *pos,
                     Py_ssize_t *end, const unsigned char **table) {
    if (nargs != 3 && nargs != 4) {
        PyErr_Format(PyExc_TypeError, "%s(buf, pos, table[, end]) takes 3 or 4 arguments", name);
        return -1;
    }
    if (!PyBytes_Check(args[2]) || PyBytes_GET_SIZE(args[2]) != 256) {
        PyErr_Format(PyExc_TypeError, "%s: table must be 256 bytes", name);
        return -1;
    }
    *pos = PyLong_AsSsize_t(args[1]);
    if (*pos == -1 && PyErr_Occurred()) return -1;
    *end = -1;
    if (nargs == 4) {
        *end = PyLong_AsSsize_t(args[3]);
        if (*end == -1 && PyErr_Occurred()) return -1;
    }
    if (PyObject_GetBuffer(args[0], view, PyBUF_SIMPLE) < 0) return -1;
    if (nargs == 3) *end = view->len;
    if (*end < 0 || *end > view->len || *pos < 0 || *pos > *end) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s: pos or end outside the buffer", name);
        return -1;
    }
    *table = (const unsigned char *)PyBytes_AS_STRING(args[2]);
    return 0;
}

static PyObject *walk_stream(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    Py_buffer view;
    Py_ssize_t pos, end;
    const unsigned char *table;
    if (walk_args("walk_stream", args, nargs, &view, &pos, &end, &table) < 0) return NULL;
    const unsigned char *data = (const unsigned char *)view.buf;
    /* A frame is at least HEADER_LEN bytes: the run holds at most (end - pos) / HEADER_LEN. */
    Py_ssize_t cap = (end - pos) / HEADER_LEN, n = 0;
    PyObject *starts = PyBytes_FromStringAndSize(NULL, cap * (Py_ssize_t)sizeof(int64_t));
    if (starts == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    int64_t *out = (int64_t *)PyBytes_AS_STRING(starts);
    while (end - pos >= HEADER_LEN) {
        const unsigned char *h = data + pos;
        uint32_t body = be32(h + 8);
        if (h[0] != 0x80 || !table[h[1]] || (Py_ssize_t)body > end - pos - HEADER_LEN) break;
        out[n++] = pos;
        pos += HEADER_LEN + (Py_ssize_t)body;
    }
    PyBuffer_Release(&view);
    if (_PyBytes_Resize(&starts, n * (Py_ssize_t)sizeof(int64_t)) < 0) return NULL;
    return Py_BuildValue("(nN)", pos, starts);
}

PyDoc_STRVAR(walk_sid_stream_doc,
"walk_sid_stream(buf, pos, table[, end]) -> (pos, data, starts, sids)\n\n"
"From pos, the run of complete frames with magic 0x08, table[opcode] != 0 and framing extras of\n"
"exactly the DCP stream-id FrameInfo (0x22 + u16) in buf[:end]: the offset past the run, the\n"
"frames in classic framing (magic 0x80) joined, their start offsets in it and their stream-ids\n"
"(both native int64 bytes). Same results as frame.walk_sid_stream_py.");

static PyObject *walk_sid_stream(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    Py_buffer view;
    Py_ssize_t pos, end;
    const unsigned char *table;
    if (walk_args("walk_sid_stream", args, nargs, &view, &pos, &end, &table) < 0) return NULL;
    const unsigned char *data = (const unsigned char *)view.buf;
    Py_ssize_t cap = (end - pos) / HEADER_LEN, n = 0, used = 0;
    /* Every classic frame is 3 bytes shorter than its wire frame: the run fits in end - pos. */
    PyObject *out = PyBytes_FromStringAndSize(NULL, end - pos);
    PyObject *starts = PyBytes_FromStringAndSize(NULL, cap * (Py_ssize_t)sizeof(int64_t));
    PyObject *sids = PyBytes_FromStringAndSize(NULL, cap * (Py_ssize_t)sizeof(int64_t));
    if (out == NULL || starts == NULL || sids == NULL) goto fail;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    int64_t *st = (int64_t *)PyBytes_AS_STRING(starts), *sd = (int64_t *)PyBytes_AS_STRING(sids);
    while (end - pos >= HEADER_LEN) {
        const unsigned char *h = data + pos;
        uint32_t body = be32(h + 8);
        if (h[0] != 0x08 || !table[h[1]] || h[2] != 3 || (Py_ssize_t)body > end - pos - HEADER_LEN ||
            body < 3u + h[3] + h[4] || h[HEADER_LEN] != 0x22) break;
        unsigned char *c = o + used;
        c[0] = 0x80;
        c[1] = h[1];
        c[2] = 0;
        c[3] = h[3];  /* key length: one byte in the alternative framing, two here */
        memcpy(c + 4, h + 4, 4);  /* extras length, datatype, vbucket */
        uint32_t cbody = body - 3;
        c[8] = (unsigned char)(cbody >> 24);
        c[9] = (unsigned char)(cbody >> 16);
        c[10] = (unsigned char)(cbody >> 8);
        c[11] = (unsigned char)cbody;
        memcpy(c + 12, h + 12, 12);  /* opaque, cas */
        memcpy(c + HEADER_LEN, h + HEADER_LEN + 3, cbody);
        st[n] = used;
        sd[n] = ((int64_t)h[HEADER_LEN + 1] << 8) | h[HEADER_LEN + 2];
        n++;
        used += HEADER_LEN + (Py_ssize_t)cbody;
        pos += HEADER_LEN + (Py_ssize_t)body;
    }
    PyBuffer_Release(&view);
    if (_PyBytes_Resize(&out, used) < 0) goto fail_released;
    if (_PyBytes_Resize(&starts, n * (Py_ssize_t)sizeof(int64_t)) < 0) goto fail_released;
    if (_PyBytes_Resize(&sids, n * (Py_ssize_t)sizeof(int64_t)) < 0) goto fail_released;
    return Py_BuildValue("(nNNN)", pos, out, starts, sids);
fail:
    PyBuffer_Release(&view);
fail_released:
    Py_XDECREF(out);
    Py_XDECREF(starts);
    Py_XDECREF(sids);
    return NULL;
}

/* Views of every buffer of the sequence `seq` (gather, concat): NULL with an exception set when
   one is not a buffer; release them with release_views. */
static Py_buffer *hold_views(PyObject *seq, Py_ssize_t nbufs) {
    Py_buffer *views = PyMem_Calloc((size_t)(nbufs ? nbufs : 1), sizeof(Py_buffer));
    if (views == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nbufs; i++) {
        if (PyObject_GetBuffer(PySequence_Fast_ITEMS(seq)[i], &views[i], PyBUF_SIMPLE) < 0) {
            while (i--) PyBuffer_Release(&views[i]);
            PyMem_Free(views);
            return NULL;
        }
    }
    return views;
}

static void release_views(Py_buffer *views, Py_ssize_t nbufs) {
    if (views == NULL) return;
    for (Py_ssize_t i = 0; i < nbufs; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
}

PyDoc_STRVAR(gather_doc,
"gather(out, bufs, sid, pos, width)\n\n"
"Row i of out (a writable C-contiguous buffer of len(pos) * width bytes) gets the width bytes of\n"
"bufs[sid[i]] at pos[i], zero-padded past that buffer's end. sid and pos are int64 buffers of the\n"
"same length. Same as columns.gather_py.");

static PyObject *gather(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "gather(out, bufs, sid, pos, width) takes 5 arguments");
        return NULL;
    }
    Py_ssize_t width = PyLong_AsSsize_t(args[4]);
    if (width == -1 && PyErr_Occurred()) return NULL;
    if (width < 0) {
        PyErr_SetString(PyExc_ValueError, "gather: width must be >= 0");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[1], "gather: bufs must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t nbufs = PySequence_Fast_GET_SIZE(seq);
    Py_buffer out = {0}, sid = {0}, pos = {0};
    Py_buffer *views = hold_views(seq, nbufs);
    PyObject *result = NULL;
    if (views == NULL) goto done;
    if (PyObject_GetBuffer(args[0], &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) goto done;
    if (PyObject_GetBuffer(args[2], &sid, PyBUF_C_CONTIGUOUS) < 0) goto done;
    if (PyObject_GetBuffer(args[3], &pos, PyBUF_C_CONTIGUOUS) < 0) goto done;
    Py_ssize_t n = pos.len / (Py_ssize_t)sizeof(int64_t);
    if (pos.len % (Py_ssize_t)sizeof(int64_t) || sid.len != pos.len || (width && n > PY_SSIZE_T_MAX / width) ||
        out.len != n * width) {
        PyErr_SetString(PyExc_ValueError, "gather: sid and pos must be int64 buffers of one length, "
                                          "out len(pos) * width bytes");
        goto done;
    }
    const int64_t *s = (const int64_t *)sid.buf, *p = (const int64_t *)pos.buf;
    unsigned char *o = (unsigned char *)out.buf;
    for (Py_ssize_t i = 0; i < n; i++, o += width) {
        /* The frames of a batch (~16 MB) have left the caches by the time it is decoded: ask for
           a later row's bytes while this one is copied. */
        Py_ssize_t ahead = i + 8;
        if (ahead < n && s[ahead] >= 0 && s[ahead] < nbufs && p[ahead] >= 0 && p[ahead] < views[s[ahead]].len)
            prefetch((const unsigned char *)views[s[ahead]].buf + p[ahead]);
        if (s[i] < 0 || s[i] >= nbufs || p[i] < 0) {
            PyErr_Format(PyExc_ValueError, "gather: row %zd names buffer %lld at %lld", i, (long long)s[i],
                         (long long)p[i]);
            goto done;
        }
        const Py_buffer *b = &views[s[i]];
        Py_ssize_t have = b->len > p[i] ? b->len - (Py_ssize_t)p[i] : 0;
        if (have > width) have = width;
        memcpy(o, (const unsigned char *)b->buf + p[i], (size_t)have);
        memset(o + have, 0, (size_t)(width - have));
    }
    result = Py_NewRef(Py_None);
done:
    if (out.obj) PyBuffer_Release(&out);
    if (sid.obj) PyBuffer_Release(&sid);
    if (pos.obj) PyBuffer_Release(&pos);
    release_views(views, nbufs);
    Py_DECREF(seq);
    return result;
}

PyDoc_STRVAR(concat_doc,
"concat(bufs, sid, pos, lengths) -> bytes\n\n"
"bufs[sid[i]][pos[i]:pos[i] + lengths[i]] for every i, joined. sid, pos and lengths are int64\n"
"buffers of one length; every range must lie inside its buffer. Same as columns.concat_py.");

static PyObject *concat(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "concat(bufs, sid, pos, lengths) takes 4 arguments");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "concat: bufs must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t nbufs = PySequence_Fast_GET_SIZE(seq);
    Py_buffer sid = {0}, pos = {0}, len = {0};
    Py_buffer *views = hold_views(seq, nbufs);
    PyObject *result = NULL, *out = NULL;
    if (views == NULL) goto done;
    if (PyObject_GetBuffer(args[1], &sid, PyBUF_C_CONTIGUOUS) < 0) goto done;
    if (PyObject_GetBuffer(args[2], &pos, PyBUF_C_CONTIGUOUS) < 0) goto done;
    if (PyObject_GetBuffer(args[3], &len, PyBUF_C_CONTIGUOUS) < 0) goto done;
    Py_ssize_t n = pos.len / (Py_ssize_t)sizeof(int64_t);
    if (pos.len % (Py_ssize_t)sizeof(int64_t) || sid.len != pos.len || len.len != pos.len) {
        PyErr_SetString(PyExc_ValueError, "concat: sid, pos and lengths must be int64 buffers of one length");
        goto done;
    }
    const int64_t *s = (const int64_t *)sid.buf, *p = (const int64_t *)pos.buf, *l = (const int64_t *)len.buf;
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {  /* check every range before allocating */
        if (s[i] < 0 || s[i] >= nbufs || p[i] < 0 || l[i] < 0 || p[i] > views[s[i]].len ||
            l[i] > views[s[i]].len - p[i]) {
            PyErr_Format(PyExc_ValueError, "concat: row %zd names %lld bytes of buffer %lld at %lld", i,
                         (long long)l[i], (long long)s[i], (long long)p[i]);
            goto done;
        }
        if (l[i] > PY_SSIZE_T_MAX - total) {
            PyErr_SetString(PyExc_OverflowError, "concat: the ranges add up to more than a bytes object holds");
            goto done;
        }
        total += (Py_ssize_t)l[i];
    }
    out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL) goto done;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t ahead = i + 8;  /* the segments have left the caches: ask for a later range early */
        if (ahead < n && l[ahead])
            prefetch((const unsigned char *)views[s[ahead]].buf + p[ahead]);
        memcpy(o, (const unsigned char *)views[s[i]].buf + p[i], (size_t)l[i]);
        o += l[i];
    }
    result = out;
    out = NULL;
done:
    Py_XDECREF(out);
    if (sid.obj) PyBuffer_Release(&sid);
    if (pos.obj) PyBuffer_Release(&pos);
    if (len.obj) PyBuffer_Release(&len);
    release_views(views, nbufs);
    Py_DECREF(seq);
    return result;
}

/* -- stamp_mutations ------------------------------------------------------------------------- */

enum { STAMP_OK, STAMP_NOT_MUTATION, STAMP_CUT, STAMP_ORDER };

/* Walk the run's messages up to the first one whose seqno is above `upto`: STAMP_OK with the
   head's length in *at, its number of messages and its last seqno (0 if none); or the problem and
   where it is. */
static int stamp_check(const unsigned char *d, Py_ssize_t n, unsigned long long upto, Py_ssize_t *count,
                       Py_ssize_t *at, unsigned long long *seqno, unsigned long long *prev) {
    Py_ssize_t pos = 0, c = 0;
    unsigned long long last = 0;
    int first = 1;
    while (pos < n) {
        *at = pos;
        if (n - pos < MUTATION_FIXED || d[pos] != 0x80 || d[pos + 1] != 0x57 || d[pos + 4] != 31)
            return STAMP_NOT_MUTATION;
        uint64_t klen = be16(d + pos + 2), body = be32(d + pos + 8);
        if (body < 31 + klen || (uint64_t)(n - pos - HEADER_LEN) < body) return STAMP_CUT;
        unsigned long long s = be64(d + pos + 24);
        if (s > upto) break;
        if (!first && s <= last) {
            *seqno = s;
            *prev = last;
            return STAMP_ORDER;
        }
        first = 0;
        last = s;
        pos += HEADER_LEN + (Py_ssize_t)body;
        c++;
    }
    *at = pos;
    *count = c;
    *seqno = last;
    return STAMP_OK;
}

/* The ValueError of a stamp_check problem, worded as the Python twins word it. */
static void stamp_error(const char *name, int bad, Py_ssize_t at, unsigned long long seqno, unsigned long long prev) {
    if (bad == STAMP_NOT_MUTATION)
        PyErr_Format(PyExc_ValueError, "%s: no DCP_MUTATION with 31 bytes of extras at offset %zd", name, at);
    else if (bad == STAMP_CUT)
        PyErr_Format(PyExc_ValueError, "%s: the message at offset %zd is cut or its lengths disagree", name, at);
    else
        PyErr_Format(PyExc_ValueError, "%s: seqno %llu at offset %zd does not follow %llu", name, seqno, at, prev);
}

static void stamp_copy(const unsigned char *d, Py_ssize_t n, unsigned char *o, uint32_t opaque, int collections) {
    Py_ssize_t pos = 0;
    while (pos < n) {
        uint64_t klen = be16(d + pos + 2), body = be32(d + pos + 8);
        memcpy(o, d + pos, MUTATION_FIXED);
        put32(o + 12, opaque);
        if (collections) {
            put16(o + 2, klen + 1);
            put32(o + 8, body + 1);
            o[MUTATION_FIXED] = 0x00;
            o += MUTATION_FIXED + 1;
        } else {
            o += MUTATION_FIXED;
        }
        size_t rest = (size_t)(body - 31);  /* key and value */
        memcpy(o, d + pos + MUTATION_FIXED, rest);
        o += rest;
        pos += HEADER_LEN + (Py_ssize_t)body;
    }
}

PyDoc_STRVAR(stamp_mutations_doc,
"stamp_mutations(data, opaque, collections) -> bytes\n\n"
"Stored DCP_MUTATION messages (opaque 0, no collection prefix, seqnos increasing) with the\n"
"stream's opaque and, with collections, the default collection's key prefix. ValueError if data\n"
"is not such a run. Same bytes as dcp.stamp_mutations_py.");

static PyObject *stamp_mutations(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "stamp_mutations(data, opaque, collections) takes 3 arguments");
        return NULL;
    }
    unsigned long long opaque = PyLong_AsUnsignedLongLong(args[1]);
    if (opaque == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return NULL;
        PyErr_Clear();
        opaque = 1ULL << 32;
    }
    if (opaque > 0xFFFFFFFFULL) {
        PyErr_SetString(PyExc_ValueError, "stamp_mutations: opaque out of range");
        return NULL;
    }
    int collections = PyObject_IsTrue(args[2]);
    if (collections < 0) return NULL;
    Py_buffer in;
    if (PyObject_GetBuffer(args[0], &in, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *d = (const unsigned char *)in.buf;
    Py_ssize_t n = in.len, count = 0, at = 0;
    unsigned long long seqno = 0, prev = 0;
    int bad;
    Py_BEGIN_ALLOW_THREADS
    bad = stamp_check(d, n, ULLONG_MAX, &count, &at, &seqno, &prev);
    Py_END_ALLOW_THREADS
    PyObject *out = NULL;
    if (bad != STAMP_OK) {
        stamp_error("stamp_mutations", bad, at, seqno, prev);
    } else if ((out = PyBytes_FromStringAndSize(NULL, n + (collections ? count : 0))) != NULL) {
        unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
        Py_BEGIN_ALLOW_THREADS
        stamp_copy(d, n, o, (uint32_t)opaque, collections);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&in);
    return out;
}

PyDoc_STRVAR(mutations_upto_doc,
"mutations_upto(data, upto) -> (nbytes, count, last)\n\n"
"The head of a stored run (what stamp_mutations takes) up to seqno upto: its length in bytes, its\n"
"number of messages and its last seqno (0 if none). ValueError where stamp_mutations would refuse\n"
"that head. Same results as dcp.mutations_upto_py.");

static PyObject *mutations_upto(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "mutations_upto(data, upto) takes 2 arguments");
        return NULL;
    }
    unsigned long long upto = PyLong_AsUnsignedLongLong(args[1]);
    if (upto == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    Py_buffer in;
    if (PyObject_GetBuffer(args[0], &in, PyBUF_SIMPLE) < 0) return NULL;
    Py_ssize_t count = 0, at = 0;
    unsigned long long seqno = 0, prev = 0;
    int bad = stamp_check((const unsigned char *)in.buf, in.len, upto, &count, &at, &seqno, &prev);
    PyBuffer_Release(&in);
    if (bad != STAMP_OK) {
        stamp_error("mutations_upto", bad, at, seqno, prev);
        return NULL;
    }
    return Py_BuildValue("(nnK)", at, count, seqno);
}

/* -- Document.__init__ ------------------------------------------------------------------------
   document_init_for(defaults) - the dataclass constructor of dcpflow.protocol.document.Document,
   compiled: the same parameters (key and value required, then the ten fields with `defaults`, the
   dataclass __init__'s own __defaults__), positional or by name, and the same TypeErrors for a
   missing, unexpected or doubled argument. It stores the fields into the slots of the Document
   being built (an instance of Document or of a subclass such as the engine's Item, whose slots
   are Document's: _speedups.h), or through setattr for a subclass that puts something else in
   front of them. dcp/documents.py installs it as Document.__init__; the dataclass's is its twin
   (document_init_py, tests/protocol/test_speedups.py). Every document the engine's hash table
   reads back is built through it. */

#define INIT_FIELDS 12
static const char *const INIT_NAMES[INIT_FIELDS] = {
    "key", "value", "flags", "expiry", "cas", "rev_seqno", "by_seqno", "datatype", "deleted", "delete_time",
    "delete_source", "cid"};
static document_fields_t init_fields;

typedef struct {
    PyObject_HEAD
    PyObject *defaults[INIT_FIELDS];  /* NULL for key and value */
} DocumentInit;

static void DocumentInit_dealloc(DocumentInit *self) {
    for (int i = 0; i < INIT_FIELDS; i++) Py_XDECREF(self->defaults[i]);
    PyObject_Free(self);
}

/* self(document, *args, **kwargs): fills the document's fields. */
static PyObject *DocumentInit_call(DocumentInit *self, PyObject *args, PyObject *kwargs) {
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    if (n < 1) {
        PyErr_SetString(PyExc_TypeError, "__init__() needs the document");
        return NULL;
    }
    PyObject *doc = PyTuple_GET_ITEM(args, 0);
    PyObject *v[INIT_FIELDS] = {0};
    if (n - 1 > INIT_FIELDS) {
        PyErr_Format(PyExc_TypeError, "__init__() takes from 3 to %d positional arguments but %zd were given",
                     INIT_FIELDS + 1, n);
        return NULL;
    }
    for (Py_ssize_t i = 1; i < n; i++) v[i - 1] = PyTuple_GET_ITEM(args, i);
    if (kwargs != NULL) {
        Py_ssize_t pos = 0;
        PyObject *name, *value;
        while (PyDict_Next(kwargs, &pos, &name, &value)) {
            int at = -1;
            if (PyUnicode_Check(name)) {
                for (int i = 0; i < INIT_FIELDS; i++) {
                    if (PyUnicode_Compare(name, init_fields.names[i]) == 0) {
                        at = i;
                        break;
                    }
                }
            }
            if (at < 0) {
                PyErr_Format(PyExc_TypeError, "__init__() got an unexpected keyword argument '%S'", name);
                return NULL;
            }
            if (v[at] != NULL) {
                PyErr_Format(PyExc_TypeError, "__init__() got multiple values for argument '%S'", name);
                return NULL;
            }
            v[at] = value;
        }
    }
    for (int i = 0; i < INIT_FIELDS; i++) {
        if (v[i] == NULL) {
            if (self->defaults[i] == NULL) {
                PyErr_Format(PyExc_TypeError, "__init__() missing required argument: '%s'", INIT_NAMES[i]);
                return NULL;
            }
            v[i] = self->defaults[i];
        }
    }
    if (document_fields_of(&init_fields, doc)) {
        for (int i = 0; i < INIT_FIELDS; i++) {
            PyObject **slot = (PyObject **)((char *)doc + init_fields.offsets[i]);
            PyObject *old = *slot;
            *slot = Py_NewRef(v[i]);
            Py_XDECREF(old);
        }
    } else {
        for (int i = 0; i < INIT_FIELDS; i++) {
            if (PyObject_SetAttr(doc, init_fields.names[i], v[i]) < 0) return NULL;
        }
    }
    Py_RETURN_NONE;
}

static PyTypeObject DocumentInitType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dcpflow.protocol._speedups.DocumentInit",
    .tp_basicsize = sizeof(DocumentInit),
    .tp_dealloc = (destructor)DocumentInit_dealloc,
    .tp_call = (ternaryfunc)DocumentInit_call,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Document's constructor, compiled (document_init_for).",
};

static PyObject *document_init_for(PyObject *Py_UNUSED(module), PyObject *defaults) {
    if (!PyTuple_Check(defaults) || PyTuple_GET_SIZE(defaults) != INIT_FIELDS - 2) {
        PyErr_SetString(PyExc_TypeError, "document_init_for(defaults): the dataclass __init__'s 10 defaults");
        return NULL;
    }
    if (init_fields.n == 0 && document_fields_init(&init_fields, INIT_NAMES, INIT_FIELDS) < 0) return NULL;
    DocumentInit *init = PyObject_New(DocumentInit, &DocumentInitType);
    if (init == NULL) return NULL;
    init->defaults[0] = init->defaults[1] = NULL;
    for (int i = 2; i < INIT_FIELDS; i++) init->defaults[i] = Py_NewRef(PyTuple_GET_ITEM(defaults, i - 2));
    /* bound as a method: Document.__init__(self, ...) */
    PyObject *method = PyInstanceMethod_New((PyObject *)init);
    Py_DECREF(init);
    return method;
}

PyDoc_STRVAR(document_init_for_doc,
"document_init_for(defaults) -> Document's __init__, compiled, for the dataclass __init__'s defaults.");

static PyMethodDef methods[] = {
    {"document_init_for", (PyCFunction)document_init_for, METH_O, document_init_for_doc},
    {"split", (PyCFunction)(void (*)(void))split, METH_FASTCALL, split_doc},
    {"encode_mutations", (PyCFunction)(void (*)(void))encode_mutations, METH_FASTCALL, encode_mutations_doc},
    {"walk_stream", (PyCFunction)(void (*)(void))walk_stream, METH_FASTCALL, walk_stream_doc},
    {"walk_sid_stream", (PyCFunction)(void (*)(void))walk_sid_stream, METH_FASTCALL, walk_sid_stream_doc},
    {"stamp_mutations", (PyCFunction)(void (*)(void))stamp_mutations, METH_FASTCALL, stamp_mutations_doc},
    {"mutations_upto", (PyCFunction)(void (*)(void))mutations_upto, METH_FASTCALL, mutations_upto_doc},
    {"gather", (PyCFunction)(void (*)(void))gather, METH_FASTCALL, gather_doc},
    {"concat", (PyCFunction)(void (*)(void))concat, METH_FASTCALL, concat_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "dcpflow.protocol._speedups",
    "Compiled twins of hot loops of dcpflow.protocol and its DCP client (see _speedups.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__speedups(void) {
    if (document_fields_init(&documents, FIELD_NAMES, N_FIELDS) < 0) return NULL;
    if (PyType_Ready(&DocumentInitType) < 0) return NULL;
    return PyModule_Create(&module);
}
