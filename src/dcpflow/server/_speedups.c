/* The server's SET handler, compiled: the common case of kv.store (its specification is
   kv._store_py; tests/server/test_speedups.py feeds both the same requests on twin servers and
   compares replies, errors and stored documents).

   A SET or SETQ with no framing extras, 8 bytes of extras, a key of 1-250 bytes on a connection
   without collections, a value within the size limit, and datatype 0 (JSON detected as the Python
   does, by calling its _looks_like_json) or JSON on a connection that negotiated it: the vbucket is
   looked up, the bucket's cmd_set counter counted, VBucket.set called, and the reply packed - the
   same steps in the same order as the Python. Every other request (ADD, REPLACE, preserve-TTL,
   xattrs, collections, a missing vbucket...) is handed to _store_py before anything is done, so
   each check, error and its text stay in one place.

   Why: the Python handler was ~120 bytecodes of a SET's ~200 once VBucket.set was compiled. */

#define PY_SSIZE_T_CLEAN
#include "../protocol/_speedups.h"

#define OP_SET 0x01
#define OP_SETQ 0x11
#define DATATYPE_JSON 0x01
#define MAX_KEY_LEN 250

static PyObject *fallback;         /* kv._store_py */
static PyTypeObject *frame_type;   /* frame.Frame */
static PyObject *looks_like_json;  /* kv._looks_like_json */
static Py_ssize_t max_value_len;   /* frame.MAX_VALUE_LEN */
static unsigned char json_first[256];  /* kv._JSON_FIRST_BYTES */
static unsigned char json_number[256]; /* kv._NUMBER_CHARS */
static unsigned char json_ws[256];     /* kv._JSON_WS */
static PyObject *kwnames;          /* ("flags", "expiry", "datatype", "cas") */
static PyObject *s_set_context, *s_counters_cmd_set, *s_set, *s_cas, *s_uuid, *s_by_seqno, *s_buf, *s_size,
    *s_closing, *s_pos;

/* An attribute read and written at its slot offset while the object's type is the one last seen
   (Counters, Item, the decoder and the Writer are __slots__ classes: a generic getattr or setattr
   cost ~300 instructions each, a fifth of a SET), else by name. */
typedef struct {
    PyObject **name;
    PyTypeObject *type;
    Py_ssize_t offset;
} slot_ref_t;

static slot_ref_t counters_cmd_set = {&s_counters_cmd_set, NULL, -1}, item_cas = {&s_cas, NULL, -1},
                  item_by_seqno = {&s_by_seqno, NULL, -1}, decoder_pos = {&s_pos, NULL, -1},
                  writer_buf = {&s_buf, NULL, -1}, writer_size = {&s_size, NULL, -1},
                  vbucket_uuid = {&s_uuid, NULL, -1};

static Py_ssize_t slot_offset(PyObject *obj, slot_ref_t *ref) {
    if (Py_TYPE(obj) != ref->type) {
        Py_ssize_t off = object_slot_offset(Py_TYPE(obj), *ref->name);
        if (off < 0) return -1;
        Py_XSETREF(ref->type, (PyTypeObject *)Py_NewRef(Py_TYPE(obj)));
        ref->offset = off;
    }
    return ref->offset;
}

/* obj.<ref> (a new reference), or NULL with an error set. */
static PyObject *get_ref(PyObject *obj, slot_ref_t *ref) {
    Py_ssize_t off = slot_offset(obj, ref);
    if (off >= 0 && SLOT_AT(obj, off) != NULL) return Py_NewRef(SLOT_AT(obj, off));
    return PyObject_GetAttr(obj, *ref->name);
}

/* obj.<ref> = value (borrowed): 0, or -1 with an error set. */
static int set_ref(PyObject *obj, slot_ref_t *ref, PyObject *value) {
    Py_ssize_t off = slot_offset(obj, ref);
    if (off < 0) return PyObject_SetAttr(obj, *ref->name, value);
    Py_XSETREF(SLOT_AT(obj, off), Py_NewRef(value));
    return 0;
}

/* obj.<ref> += delta: the new value (a new reference), or NULL with an error set. */
static PyObject *add_to(PyObject *obj, slot_ref_t *ref, long long delta) {
    PyObject *cur = get_ref(obj, ref);
    if (cur == NULL) return NULL;
    PyObject *sum = plus(cur, delta);
    Py_DECREF(cur);
    if (sum != NULL && set_ref(obj, ref, sum) < 0) Py_CLEAR(sum);
    return sum;
}

/* The session's part of a SET, from conn.set_context (Connection._refresh_ready keeps it current:
   the bucket's vbucket table and counters, and the HELLO features the handler looks at). */
typedef struct {
    PyObject *vbuckets, *counters;  /* borrowed from the context tuple, which the caller owns */
    int collections, json, mutation_seqno;
} session_t;

/* 1: filled; 0: no bucket or not a context this file knows (the Python decides); -1: error. */
static int session_of(PyObject *ctx, session_t *s) {
    if (!PyTuple_CheckExact(ctx) || PyTuple_GET_SIZE(ctx) != 5) return 0;
    s->vbuckets = PyTuple_GET_ITEM(ctx, 0);
    s->counters = PyTuple_GET_ITEM(ctx, 1);
    if (!PyDict_CheckExact(s->vbuckets)) return 0;
    int *flags[3] = {&s->collections, &s->json, &s->mutation_seqno};
    for (int i = 0; i < 3; i++) {
        *flags[i] = PyObject_IsTrue(PyTuple_GET_ITEM(ctx, 2 + i));
        if (*flags[i] < 0) return -1;
    }
    return 1;
}

/* obj.<ref> as u64: 1, or 0 (error set) when it is missing or out of range. */
static int u64_field(PyObject *obj, slot_ref_t *ref, unsigned long long *out) {
    PyObject *v = get_ref(obj, ref);
    if (v == NULL) return 0;
    *out = PyLong_AsUnsignedLongLong(v);
    Py_DECREF(v);
    return !(*out == (unsigned long long)-1 && PyErr_Occurred());
}

/* frame field i as a small unsigned int (< 2^32), or -1 if it is not one. */
static long long small_field(PyObject *frame, Py_ssize_t i) {
    PyObject *v = PyTuple_GET_ITEM(frame, i);
    if (!PyLong_CheckExact(v)) return -1;
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || x < 0 || x > 0xFFFFFFFFLL) {
        PyErr_Clear();
        return -1;
    }
    return x;
}

static PyObject *handover(PyObject *const *args) { return PyObject_Vectorcall(fallback, args, 2, NULL); }

/* 1: the fast path takes this request; 0: _store_py must; -1: error. Fills the outputs. */
static int accept(const session_t *session, PyObject *frame, long long *op, long long *datatype) {
    if (Py_TYPE(frame) != frame_type || PyTuple_GET_SIZE(frame) != 10) return 0;
    *op = small_field(frame, 1);
    if (*op != OP_SET && *op != OP_SETQ) return 0;
    *datatype = small_field(frame, 2);
    PyObject *framing = PyTuple_GET_ITEM(frame, 6), *extras = PyTuple_GET_ITEM(frame, 7);
    PyObject *key = PyTuple_GET_ITEM(frame, 8), *value = PyTuple_GET_ITEM(frame, 9);
    if (!PyBytes_CheckExact(framing) || PyBytes_GET_SIZE(framing) != 0 || !PyBytes_CheckExact(extras) ||
        PyBytes_GET_SIZE(extras) != 8 || !PyBytes_CheckExact(key) || PyBytes_GET_SIZE(key) == 0 ||
        PyBytes_GET_SIZE(key) > MAX_KEY_LEN || !PyBytes_CheckExact(value) || PyBytes_GET_SIZE(value) > max_value_len)
        return 0;
    if (*datatype != 0 && *datatype != DATATYPE_JSON) return 0;
    long long vbid = small_field(frame, 3);
    if (vbid < 0 || vbid > 0xFFFF || small_field(frame, 4) < 0) return 0;
    PyObject *cas = PyTuple_GET_ITEM(frame, 5);
    if (!PyLong_CheckExact(cas)) return 0;
    if (session->collections) return 0;
    /* JSON on a connection that did not negotiate it: Python's error */
    return *datatype != DATATYPE_JSON || session->json;
}

/* kv._looks_like_json's cheap rejections, which decide most values without a call: 1 JSON, 0 not,
   -1 ask the Python (a value that needs a parse: an object, array, string, or number-shaped bytes,
   or one with whitespace around it). A value of random bytes or hex digits starts with a number
   character or t/f/n about 3 times in 4: it cost a Python call per SET (~0.4 us of ~2.5). */
static int json_verdict(PyObject *value) {
    Py_ssize_t n = PyBytes_GET_SIZE(value);
    const unsigned char *s = (const unsigned char *)PyBytes_AS_STRING(value);
    if (n == 0 || !json_first[s[0]]) return 0;
    if (json_ws[s[0]] || json_ws[s[n - 1]] || s[0] == '{' || s[0] == '[' || s[0] == '"') return -1;
    if (json_number[s[0]]) {
        for (Py_ssize_t i = 1; i < n; i++) {
            if (!json_number[s[i]]) return 0;
        }
        return -1;
    }
    return (n == 4 && memcmp(s, "true", 4) == 0) || (n == 5 && memcmp(s, "false", 5) == 0) ||
           (n == 4 && memcmp(s, "null", 4) == 0);
}

static PyObject *store_planned(PyObject *frame, const session_t *session, long long op, long long datatype,
                               PyObject *const *args);

/* 1 when a function of this module may run: `usage` takes `want` arguments and configure() ran;
   else 0 with the error set. */
static int callable_now(Py_ssize_t nargs, Py_ssize_t want, const char *usage) {
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments", usage, want);
        return 0;
    }
    if (fallback == NULL || frame_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "dcpflow.server._speedups.configure() was not called");
        return 0;
    }
    return 1;
}

static PyObject *store(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (!callable_now(nargs, 2, "store(conn, frame)")) return NULL;
    PyObject *conn = args[0], *frame = args[1];
    PyObject *ctx = PyObject_GetAttr(conn, s_set_context);
    if (ctx == NULL) return NULL;
    session_t session;
    long long op, datatype;
    int accepted = session_of(ctx, &session);
    if (accepted > 0) accepted = accept(&session, frame, &op, &datatype);
    if (accepted <= 0) {
        Py_DECREF(ctx);
        return accepted < 0 ? NULL : handover(args);
    }
    PyObject *result = store_planned(frame, &session, op, datatype, args);
    Py_DECREF(ctx);
    return result;
}

/* The rest of store(), once accept() said the fast path takes the request. */
static PyObject *store_planned(PyObject *frame, const session_t *session, long long op, long long datatype,
                               PyObject *const *args) {

    PyObject *extras = PyTuple_GET_ITEM(frame, 7), *key = PyTuple_GET_ITEM(frame, 8);
    PyObject *value = PyTuple_GET_ITEM(frame, 9), *cas = PyTuple_GET_ITEM(frame, 5);
    const unsigned char *ex = (const unsigned char *)PyBytes_AS_STRING(extras);
    int verdict = datatype == 0 ? json_verdict(value) : 0;
    if (verdict == 1) {
        datatype = DATATYPE_JSON;
    } else if (verdict < 0) {
        PyObject *is = PyObject_CallOneArg(looks_like_json, value);
        if (is == NULL) return NULL;
        int truth = PyObject_IsTrue(is);
        Py_DECREF(is);
        if (truth < 0) return NULL;
        if (truth) datatype = DATATYPE_JSON;
    }
    PyObject *vb = PyDict_GetItemWithError(session->vbuckets, PyTuple_GET_ITEM(frame, 3));
    if (vb == NULL) {  /* NOT_MY_VBUCKET, with the cluster map: Python's reply */
        return PyErr_Occurred() ? NULL : handover(args);
    }
    Py_INCREF(vb);
    PyObject *result = NULL, *item = NULL, *flags = NULL, *expiry = NULL, *dt = NULL;
    PyObject *count = add_to(session->counters, &counters_cmd_set, 1);  /* counters.cmd_set += 1 */
    if (count == NULL) goto done;
    Py_DECREF(count);

    flags = PyLong_FromUnsignedLong(be32(ex));
    expiry = PyLong_FromUnsignedLong(be32(ex + 4));
    dt = PyLong_FromLongLong(datatype);
    if (flags == NULL || expiry == NULL || dt == NULL) goto done;
    PyObject *call_args[7] = {vb, key, value, flags, expiry, dt, cas};
    /* vb.set(key, value, flags=..., ...). VBucket.set is an instancemethod around a C function
       (engine/_speedups.c) or a plain function (pure Python): either way the function itself is
       called with vb first, so no bound method is made - unless an instance dict could shadow it. */
    PyObject *descr = Py_TYPE(vb)->tp_dictoffset == 0 ? _PyType_Lookup(Py_TYPE(vb), s_set) : NULL;
    if (descr != NULL && Py_TYPE(descr) == &PyInstanceMethod_Type) {
        item = PyObject_Vectorcall(PyInstanceMethod_GET_FUNCTION(descr), call_args, 3, kwnames);
    } else if (descr != NULL && PyFunction_Check(descr)) {
        item = PyObject_Vectorcall(descr, call_args, 3, kwnames);
    } else {
        PyObject *set = PyObject_GetAttr(vb, s_set);
        if (set == NULL) goto done;
        item = PyObject_Vectorcall(set, call_args + 1, 2, kwnames);
        Py_DECREF(set);
    }
    if (item == NULL) goto done;
    if (op == OP_SETQ) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    unsigned long long cas_value;
    if (!u64_field(item, &item_cas, &cas_value)) goto done;
    int truth = session->mutation_seqno;
    unsigned char reply[40] = {0};
    reply[0] = 0x81;
    reply[1] = (unsigned char)op;
    put32(reply + 12, (uint32_t)small_field(frame, 4));
    put64(reply + 16, cas_value);
    if (truth) {
        unsigned long long uuid, seqno;
        if (!u64_field(vb, &vbucket_uuid, &uuid) || !u64_field(item, &item_by_seqno, &seqno)) goto done;
        reply[4] = 16;
        put32(reply + 8, 16);
        put64(reply + 24, uuid);
        put64(reply + 32, seqno);
    }
    result = PyBytes_FromStringAndSize((const char *)reply, truth ? 40 : 24);
done:
    Py_XDECREF(flags);
    Py_XDECREF(expiry);
    Py_XDECREF(dt);
    Py_XDECREF(item);
    Py_DECREF(vb);
    return result;
}

/* configure(store_py, Frame, looks_like_json, json_first_bytes, number_chars, json_ws, max_value_len,
   Counters, Item) */
static PyObject *configure(PyObject *module, PyObject *args) {
    PyObject *store_py, *type, *looks, *first, *counters, *item;
    Py_buffer number, ws;
    Py_ssize_t max_len;
    if (!PyArg_ParseTuple(args, "OO!OOy*y*nO!O!", &store_py, &PyType_Type, &type, &looks, &first, &number, &ws,
                          &max_len, &PyType_Type, &counters, &PyType_Type, &item))
        return NULL;
    Py_ssize_t offsets[3] = {object_slot_offset((PyTypeObject *)counters, s_counters_cmd_set),
                             object_slot_offset((PyTypeObject *)item, s_cas),
                             object_slot_offset((PyTypeObject *)item, s_by_seqno)};
    if (offsets[0] < 0 || offsets[1] < 0 || offsets[2] < 0) {
        PyBuffer_Release(&number);
        PyBuffer_Release(&ws);
        PyErr_SetString(PyExc_TypeError, "Counters.cmd_set, Item.cas and Item.by_seqno must be object slots");
        return NULL;
    }
    memset(json_number, 0, sizeof json_number);
    memset(json_ws, 0, sizeof json_ws);
    for (Py_ssize_t i = 0; i < number.len; i++) json_number[((unsigned char *)number.buf)[i]] = 1;
    for (Py_ssize_t i = 0; i < ws.len; i++) json_ws[((unsigned char *)ws.buf)[i]] = 1;
    PyBuffer_Release(&number);
    PyBuffer_Release(&ws);
    if (!PyType_IsSubtype((PyTypeObject *)type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "Frame must be a tuple type");
        return NULL;
    }
    unsigned char table[256] = {0};
    PyObject *it = PyObject_GetIter(first);
    if (it == NULL) return NULL;
    PyObject *b;
    while ((b = PyIter_Next(it)) != NULL) {
        long v = PyLong_AsLong(b);
        Py_DECREF(b);
        if (v < 0 || v > 255) {
            Py_DECREF(it);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "json_first_bytes must be byte values");
            return NULL;
        }
        table[v] = 1;
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) return NULL;
    Py_XSETREF(fallback, Py_NewRef(store_py));
    Py_XSETREF(frame_type, (PyTypeObject *)Py_NewRef(type));
    Py_XSETREF(looks_like_json, Py_NewRef(looks));
    slot_ref_t *refs[3] = {&counters_cmd_set, &item_cas, &item_by_seqno};
    PyTypeObject *owners[3] = {(PyTypeObject *)counters, (PyTypeObject *)item, (PyTypeObject *)item};
    for (int k = 0; k < 3; k++) {
        Py_XSETREF(refs[k]->type, (PyTypeObject *)Py_NewRef(owners[k]));
        refs[k]->offset = offsets[k];
    }
    memcpy(json_first, table, sizeof table);
    max_value_len = max_len;
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------------------
   dispatch(conn, decoder, frames, ends, ready, writer, limit) -> (n, status, obj):
   Connection._process's loop over a batch of frames from FrameDecoder.peek_batch, compiled
   (connection.py's Python loop is its specification; tests/server/test_speedups.py runs both). As
   the decoder's generator does, each frame is consumed before it runs (decoder._pos = its end:
   FrameDecoder.consume_to, at the slot), so whatever happens in a handler, nothing runs twice.
   A classic request whose opcode is in
   `ready` (the handlers this session may run, checks done) goes to its handler; a bytes reply
   joins writer._buf and writer._size, re-read after every handler (which may itself write or
   flush). It stops, and says why, where the Python has to take over:

     DONE     all n frames ran;
     HANDLE   frames[n] (consumed) did not run - another magic, or not in `ready`: _handle runs it;
     RAISED   frames[n] ran and raised obj (an Exception: anything else propagates);
     WAIT     frames[n] ran and returned obj, an awaitable;
     FLUSH    n frames ran and writer._size passed `limit`;
     CLOSED   n frames ran and the last one closed the connection.

   Why: the generator, islice and loop bytecodes were ~10% of a server SET (perf, dwarf). */

enum { D_DONE, D_HANDLE, D_RAISED, D_WAIT, D_FLUSH, D_CLOSED };

/* writer._buf.append(reply); writer._size += len(reply): the new size, or -1 with an error set. */
static Py_ssize_t queue_reply(PyObject *writer, PyObject *reply) {
    PyObject *out = get_ref(writer, &writer_buf);
    if (out == NULL) return -1;
    int rc = PyList_Append(out, reply);
    Py_DECREF(out);
    if (rc < 0) return -1;
    PyObject *size = add_to(writer, &writer_size, PyBytes_GET_SIZE(reply));
    if (size == NULL) return -1;
    Py_ssize_t total = PyLong_AsSsize_t(size);
    Py_DECREF(size);
    return total;  /* -1 with an error set if it is not an int */
}

static PyObject *dispatched(Py_ssize_t n, int status, PyObject *obj) {
    return Py_BuildValue("(niO)", n, status, obj ? obj : Py_None);
}

static PyObject *dispatch(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (!callable_now(nargs, 7, "dispatch(conn, decoder, frames, ends, ready, writer, limit)")) return NULL;
    PyObject *conn = args[0], *decoder = args[1], *frames = args[2], *ends = args[3], *ready = args[4],
             *writer = args[5];
    if (!PyList_CheckExact(frames) || !PyList_CheckExact(ends) || !PyDict_CheckExact(ready) ||
        PyList_GET_SIZE(ends) != PyList_GET_SIZE(frames)) {
        PyErr_SetString(PyExc_TypeError, "dispatch() takes lists of frames and their ends, and a dict of handlers");
        return NULL;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(args[6]);
    if (limit == -1 && PyErr_Occurred()) return NULL;
    Py_INCREF(frames);  /* held across the handlers' Python */
    Py_INCREF(ends);
    Py_ssize_t i = 0;
    int status = D_DONE;
    PyObject *obj = NULL, *result = NULL;
    for (; i < PyList_GET_SIZE(frames) && i < PyList_GET_SIZE(ends); i++) {
        PyObject *frame = PyList_GET_ITEM(frames, i);
        if (set_ref(decoder, &decoder_pos, PyList_GET_ITEM(ends, i)) < 0) goto done;  /* consumed */
        if (Py_TYPE(frame) != frame_type || PyTuple_GET_SIZE(frame) != 10 || small_field(frame, 0) != 0x80) {
            status = D_HANDLE;
            break;
        }
        PyObject *handler = PyDict_GetItemWithError(ready, PyTuple_GET_ITEM(frame, 1));
        if (handler == NULL) {
            if (PyErr_Occurred()) goto done;
            status = D_HANDLE;
            break;
        }
        Py_INCREF(handler);  /* the handler may change `ready` (a login refreshes it) */
        Py_INCREF(frame);
        PyObject *call_args[2] = {conn, frame};
        PyObject *reply = PyObject_Vectorcall(handler, call_args, 2, NULL);
        Py_DECREF(handler);
        Py_DECREF(frame);
        if (reply == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_Exception)) goto done;  /* KeyboardInterrupt and the like */
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyErr_NormalizeException(&type, &value, &tb);
            if (tb != NULL) PyException_SetTraceback(value, tb);
            Py_XDECREF(type);
            Py_XDECREF(tb);
            obj = value;
            status = D_RAISED;
            break;
        }
        Py_ssize_t size = 0;
        if (PyBytes_CheckExact(reply)) {
            size = queue_reply(writer, reply);
            Py_DECREF(reply);
            if (size < 0) goto done;
        } else if (reply == Py_None) {
            Py_DECREF(reply);
        } else {
            obj = reply;
            status = D_WAIT;
            break;
        }
        PyObject *closing = PyObject_GetAttr(conn, s_closing);
        int closed = closing == NULL ? -1 : PyObject_IsTrue(closing);
        Py_XDECREF(closing);
        if (closed < 0) goto done;
        if (closed) {
            status = D_CLOSED;
            i++;
            break;
        }
        if (size > limit) {
            status = D_FLUSH;
            i++;
            break;
        }
    }
    result = dispatched(i, status, obj);
done:
    Py_XDECREF(obj);
    Py_DECREF(frames);
    Py_DECREF(ends);
    return result;
}

static PyMethodDef methods[] = {
    {"dispatch", (PyCFunction)(void (*)(void))dispatch, METH_FASTCALL,
     "dispatch(conn, decoder, frames, ends, ready, writer, limit) -> (n, status, obj): Connection._process's loop "
     "over one batch, compiled."},
    {"store", (PyCFunction)(void (*)(void))store, METH_FASTCALL,
     "store(conn, frame): kv.store's common case compiled; everything else goes to kv._store_py."},
    {"configure", configure, METH_VARARGS,
     "configure(store_py, Frame, looks_like_json, json_first_bytes, number_chars, json_ws, max_value_len, "
     "Counters, Item)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "dcpflow.server._speedups",
                                        "The server's SET handler, compiled (see _speedups.c).", -1, methods};

PyMODINIT_FUNC PyInit__speedups(void) {
    PyObject **slots[] = {&s_set_context, &s_counters_cmd_set, &s_set, &s_cas, &s_uuid, &s_by_seqno, &s_buf,
                          &s_size, &s_closing, &s_pos};
    const char *text[] = {"set_context", "cmd_set", "set", "cas", "uuid", "by_seqno", "_buf", "_size",
                          "_closing", "_pos"};
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++) {
        *slots[i] = PyUnicode_InternFromString(text[i]);
        if (*slots[i] == NULL) return NULL;
    }
    kwnames = Py_BuildValue("(ssss)", "flags", "expiry", "datatype", "cas");
    if (kwnames == NULL) return NULL;
    for (Py_ssize_t i = 0; i < 4; i++) PyUnicode_InternInPlace(&PyTuple_GET_ITEM(kwnames, i));
    return PyModule_Create(&module_def);
}
