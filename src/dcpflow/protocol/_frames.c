/* The frame splitter of FrameDecoder.frames (frame.py), compiled.

   frame.py's pure-Python loop is the specification; this finds the same frames, about five times
   faster, for the well-formed frames that are all of a busy connection's traffic. It stops before
   the first frame it does not take - incomplete, an unknown magic, a body over the limit, lengths
   that exceed the body - and leaves that one to the Python loop, so every error, its text and the
   waiting for more bytes stay in one place. tests/protocol/test_frame_speedups.py checks that both
   paths give the same frames for the same bytes. Built as an optional extension: without a
   compiler, dcpflow runs the Python loop alone. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define HEADER_LEN 24

static inline uint16_t be16(const unsigned char *p) { return (uint16_t)((p[0] << 8) | p[1]); }

static inline uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static inline uint64_t be64(const unsigned char *p) {
    return ((uint64_t)be32(p) << 32) | (uint64_t)be32(p + 4);
}

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

static PyMethodDef methods[] = {
    {"split", (PyCFunction)(void (*)(void))split, METH_FASTCALL, split_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "dcpflow.protocol._frames",
    "The compiled frame splitter of dcpflow.protocol.frame (see _frames.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__frames(void) { return PyModule_Create(&module); }
