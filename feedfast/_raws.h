/* feedfast/_raws.h: a batch's encoded samples as the threaded path's C consumers take them (sample_batch in
 * feedfast/_native.c, plan_batch in feedfast/_plan.c).
 *
 * `raws` is a list whose items are None (the sample has no such member) or any object with a contiguous buffer:
 * bytes (a local shard's preads), a memoryview or NumPy slice of a fetched window (remote shards: no copy per
 * member, feedfast/sources/rangeread.py), a bytearray. The buffers of items that are not bytes are held from
 * raws_open to raws_close, so their memory stays in place (and a bytearray cannot be resized) while the caller
 * works on it without the GIL; open and close run with the GIL held. An item that is neither, or a buffer that is
 * not contiguous, is a TypeError naming its position. */
#ifndef FEEDFAST_RAWS_H
#define FEEDFAST_RAWS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

typedef struct {
    Py_ssize_t n;
    const unsigned char **data; /* NULL: None */
    Py_ssize_t *lens;
    Py_buffer *views; /* views[i].obj != NULL: a buffer held for item i */
} Raws;

static void
raws_close(Raws *r)
{
    if (r->views != NULL)
        for (Py_ssize_t i = 0; i < r->n; i++)
            if (r->views[i].obj != NULL)
                PyBuffer_Release(&r->views[i]);
    PyMem_Free(r->data);
    PyMem_Free(r->lens);
    PyMem_Free(r->views);
    memset(r, 0, sizeof *r);
}

/* The TypeError for item i, which has no contiguous buffer; the error its buffer request raised, if any, is
 * replaced and quoted. */
static void
raws_refuse(const char *who, Py_ssize_t i, PyObject *item)
{
    if (!PyObject_CheckBuffer(item)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: raws[%zd] must be bytes, a contiguous buffer or None, not %.100s", who, i,
                     Py_TYPE(item)->tp_name);
        return;
    }
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject *why = value != NULL ? PyObject_Str(value) : NULL;
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError,
                 "%s: raws[%zd] (%.100s) is not a contiguous buffer (%s); pass bytes or a contiguous copy "
                 "(numpy.ascontiguousarray)", who, i, Py_TYPE(item)->tp_name,
                 why != NULL ? PyUnicode_AsUTF8(why) : "its buffer was refused");
    Py_XDECREF(why);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
}

/* Each item's bytes and length (see the header comment). 0, or -1 with an exception set and nothing held. */
static int
raws_open(PyObject *list, const char *who, Raws *r)
{
    memset(r, 0, sizeof *r);
    Py_ssize_t n = PyList_GET_SIZE(list);
    r->data = PyMem_Calloc((size_t)n + 1, sizeof *r->data);
    r->lens = PyMem_Calloc((size_t)n + 1, sizeof *r->lens);
    r->views = PyMem_Calloc((size_t)n + 1, sizeof *r->views);
    if (r->data == NULL || r->lens == NULL || r->views == NULL) {
        raws_close(r);
        PyErr_NoMemory();
        return -1;
    }
    r->n = n;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(list, i);
        if (item == Py_None)
            continue;
        if (PyBytes_Check(item)) {
            r->data[i] = (const unsigned char *)PyBytes_AS_STRING(item), r->lens[i] = PyBytes_GET_SIZE(item);
            continue;
        }
        if (PyObject_GetBuffer(item, &r->views[i], PyBUF_SIMPLE) < 0) {
            r->views[i].obj = NULL;
            raws_refuse(who, i, item);
            raws_close(r);
            return -1;
        }
        r->data[i] = (const unsigned char *)r->views[i].buf, r->lens[i] = r->views[i].len;
    }
    return 0;
}

#endif
