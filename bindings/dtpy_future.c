/* TensorFuture: a value that devices are producing, waited on with the GIL released, and the
 * pieces of its value once ready as buffers numpy wraps. dtorch.TensorFuture subclasses it and
 * registers the subclass; futures are made as that. */
#include "dtpy.h"

typedef struct {
    PyObject_HEAD
    dt_future *f;
} s_Future;

static PyTypeObject s_FutureType;
static PyTypeObject *s_future_cls = &s_FutureType;

PyObject *dtpy_future_wrap(dt_future *f)
{
    if (!f)
        return dtpy_raise();
    if (PyErr_Occurred()) {
        dt_future_release(&f);
        return NULL;
    }
    s_Future *self = (s_Future *)s_future_cls->tp_alloc(s_future_cls, 0);
    if (!self) {
        dt_future_release(&f);
        return NULL;
    }
    self->f = f;
    return (PyObject *)self;
}

static void s_Future_dealloc(s_Future *self)
{
    dt_future_release(&self->f);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A piece of a ready future's value, exposed through the buffer protocol (numpy wraps it). */
typedef struct {
    PyObject_HEAD
    dt_future *f;
    int piece;
    Py_ssize_t shape[DT_MAX_DIMS];
} s_Value;

static int s_Value_getbuffer(s_Value *self, Py_buffer *view, int flags)
{
    dt_dtype dtype = dt_future_dtype(self->f);
    int ndim = dt_future_ndim(self->f);
    const int64_t *shape = dt_future_shape(self->f, self->piece);
    Py_ssize_t n = 1;
    for (int d = 0; d < ndim; d++) {
        self->shape[d] = (Py_ssize_t)shape[d];
        n *= self->shape[d];
    }
    static const char *formats[] = {"f", "e", "H", "i", "q", "?"};
    view->buf = (void *)dt_future_data(self->f, self->piece);
    view->obj = Py_NewRef(self);
    view->itemsize = (Py_ssize_t)dt_dtype_size(dtype);
    view->len = n * view->itemsize;
    view->readonly = 0;
    view->format = (flags & PyBUF_FORMAT) ? (char *)formats[dtype] : NULL;
    view->ndim = ndim;
    view->shape = (flags & PyBUF_ND) ? self->shape : NULL;
    view->strides = NULL;
    view->suboffsets = NULL;
    view->internal = NULL;
    return 0;
}

static void s_Value_dealloc(s_Value *self)
{
    dt_future_release(&self->f);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyBufferProcs s_Value_buffer = {(getbufferproc)s_Value_getbuffer, NULL};

static PyTypeObject s_ValueType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dtorch._C.Value",
    .tp_basicsize = sizeof(s_Value),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)s_Value_dealloc,
    .tp_as_buffer = &s_Value_buffer,
    .tp_doc = "The bytes of a fetched value (a buffer).",
};

/* _wait(timeout or None): waits; raises the failure, TimeoutError, or KeyboardInterrupt. */
static PyObject *s_Future_wait(s_Future *self, PyObject *arg)
{
    double timeout = -1;
    if (arg != Py_None) {
        timeout = PyFloat_AsDouble(arg);
        if (timeout == -1.0 && PyErr_Occurred())
            return NULL;
        if (timeout < 0)
            timeout = 0;
    }
    if (dt_future_wait(self->f, timeout) != 0)
        return dtpy_raise();
    Py_RETURN_NONE;
}

/* _pieces(): [(buffer, dtype code, shape)] of a ready future */
static PyObject *s_Future_pieces(s_Future *self, PyObject *unused)
{
    if (dt_future_status(self->f) != 0)
        return PyErr_Format(PyExc_RuntimeError, "the future is not ready");
    int n = dt_future_npieces(self->f), ndim = dt_future_ndim(self->f);
    PyObject *list = PyList_New(n);
    for (int p = 0; list && p < n; p++) {
        s_Value *v = PyObject_New(s_Value, &s_ValueType);
        PyObject *shape = PyTuple_New(ndim);
        if (!v || !shape) {
            Py_XDECREF(v);
            Py_XDECREF(shape);
            Py_CLEAR(list);
            break;
        }
        v->f = dt_future_ref(self->f);
        v->piece = p;
        const int64_t *s = dt_future_shape(self->f, p);
        for (int d = 0; d < ndim; d++)
            PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(s[d]));
        PyList_SET_ITEM(list, p, Py_BuildValue("NiN", (PyObject *)v, (int)dt_future_dtype(self->f), shape));
    }
    return list;
}

static PyObject *s_Future_done(s_Future *self, PyObject *unused) { return PyBool_FromLong(dt_future_done(self->f)); }

/* _error(): None while pending or ready, else (code, message) */
static PyObject *s_Future_error(s_Future *self, PyObject *unused)
{
    int status = dt_future_status(self->f);
    if (status >= 0)
        Py_RETURN_NONE;
    return Py_BuildValue("is", status, dt_future_error(self->f));
}

static void s_call_python(dt_future *f, void *arg)
{
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *fn = arg;
    PyObject *r = PyObject_CallNoArgs(fn);
    if (!r)
        PyErr_WriteUnraisable(fn);
    Py_XDECREF(r);
    Py_DECREF(fn);
    PyGILState_Release(g);
}

/* _add_done_callback(fn): fn() runs once when the future settles, on a runtime thread */
static PyObject *s_Future_add_done_callback(s_Future *self, PyObject *fn)
{
    if (!PyCallable_Check(fn))
        return PyErr_Format(PyExc_TypeError, "callback must be callable");
    dt_future_on_done(self->f, s_call_python, Py_NewRef(fn));
    Py_RETURN_NONE;
}

static PyMethodDef s_Future_methods[] = {
    {"_wait", (PyCFunction)s_Future_wait, METH_O, "Wait for the future (timeout in seconds or None)."},
    {"_pieces", (PyCFunction)s_Future_pieces, METH_NOARGS, "The ready value as (buffer, dtype, shape) pieces."},
    {"done", (PyCFunction)s_Future_done, METH_NOARGS, "Whether the future has settled."},
    {"_error", (PyCFunction)s_Future_error, METH_NOARGS, "The failure as (code, message), or None."},
    {"_add_done_callback", (PyCFunction)s_Future_add_done_callback, METH_O, "Call fn() once settled."},
    {NULL},
};

static PyTypeObject s_FutureType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dtorch._C.TensorFuture",
    .tp_basicsize = sizeof(s_Future),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_dealloc = (destructor)s_Future_dealloc,
    .tp_methods = s_Future_methods,
    .tp_doc = "A value that devices are producing.",
};

int dtpy_future_set_class(PyTypeObject *cls)
{
    if (!PyType_IsSubtype(cls, &s_FutureType)) {
        PyErr_Format(PyExc_TypeError, "_register: expected a TensorFuture subclass");
        return -1;
    }
    s_future_cls = (PyTypeObject *)Py_NewRef(cls);
    return 0;
}

int dtpy_future_init(PyObject *m)
{
    if (PyType_Ready(&s_FutureType) < 0 || PyType_Ready(&s_ValueType) < 0 ||
        PyModule_AddObjectRef(m, "TensorFuture", (PyObject *)&s_FutureType) < 0)
        return -1;
    return 0;
}
