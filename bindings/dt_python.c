/* dtorch._C — the Python face of the C API: DTensor and TensorFuture handles, meshes, the
 * factories, the ops of the registry and the runtime calls. Every argument a Python caller
 * gives is checked and converted here (the s_arg_* helpers), with torch's messages; Python in
 * dtorch/ keeps torch's signatures and printing.
 *
 * Blocking waits release the GIL (wait hooks) and turn Ctrl-C into KeyboardInterrupt. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "dtorch.h"

/* ---- errors ------------------------------------------------------------------------------ */

/* Bad values and bad types are ValueError and TypeError to a Python user, and RuntimeError to
 * code written against PyTorch (which raises RuntimeError for shape and dtype mismatches): the
 * exceptions are both. Likewise a piece that does not fit in memory is a MemoryError and a
 * RuntimeError (torch.OutOfMemoryError is one). */
static PyObject *s_value_error, *s_type_error, *s_memory_error;

static PyObject *s_raise(void)
{
    int code = dt_last_error_code();
    if (code == DT_EINTR && PyErr_Occurred())
        return NULL; /* the signal handler's exception (KeyboardInterrupt) is already set */
    PyObject *type = PyExc_RuntimeError;
    switch (code) {
    case DT_EINVAL: type = s_value_error; break;
    case DT_ETYPE: type = s_type_error; break;
    case DT_EINDEX: type = PyExc_IndexError; break;
    case DT_ETIMEDOUT: type = PyExc_TimeoutError; break;
    case DT_ENOMEM: type = s_memory_error; break;
    case DT_EINTR: type = PyExc_KeyboardInterrupt; break;
    default: break;
    }
    PyErr_SetString(type, dt_last_error()[0] ? dt_last_error() : "dtorch: unknown error");
    return NULL;
}

/* ---- wait hooks: the GIL is released while the runtime makes us wait ----------------------- */

static _Thread_local PyThreadState *s_saved;

static void s_wait_enter(void) { s_saved = PyEval_SaveThread(); }
static void s_wait_leave(void) { PyEval_RestoreThread(s_saved); }
static bool s_wait_interrupt(void) { return PyErr_CheckSignals() != 0; }

/* ---- Python classes the arguments are checked against (dtorch registers them) --------------- */

typedef struct {
    PyObject_HEAD
    dt_mesh *mesh;
} s_Mesh;

static PyTypeObject s_FutureType, s_MeshType;
/* dtorch.DTensor itself: a heap type made from s_tensor_spec (PyInit__C), so that dtorch adds its
 * Python-written methods to the type itself rather than to a subclass (_tensor.py) */
static PyTypeObject *s_tensor_type;
static PyTypeObject *s_future_cls = &s_FutureType;
static PyObject *s_mesh_cls;      /* dtorch.DeviceMesh */
static PyObject *s_placement_cls; /* dtorch.Placement */
static PyObject *s_dtype_code;    /* dtorch._dtype._code_of: a dtype, its name or a numpy dtype -> its code */

/* ---- arguments: every entry point turns Python values into C ones with these --------------- */

static const char *s_type_name(PyObject *o) { return Py_TYPE(o)->tp_name; }

static bool s_is_bool(PyObject *o)
{
    if (PyBool_Check(o))
        return true;
    if (PyLong_CheckExact(o) || PyFloat_CheckExact(o))
        return false; /* the common case, without comparing type names */
    const char *name = s_type_name(o);
    return !strcmp(name, "numpy.bool") || !strcmp(name, "numpy.bool_");
}

/* An int (a Python int or anything with __index__, such as numpy's; not a bool). */
static int s_arg_int(const char *fn, const char *what, PyObject *o, int64_t *v)
{
    if (s_is_bool(o) || !PyIndex_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s(): %s must be an int, got %s", fn, what, s_type_name(o));
        return -1;
    }
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (x == -1 && PyErr_Occurred())
        return -1;
    if (overflow) {
        PyErr_Format(s_value_error, "%s(): %s %R is out of range (a 64-bit integer)", fn, what, o);
        return -1;
    }
    *v = x;
    return 0;
}

/* A sequence of at most max ints; returns how many. */
static int s_arg_ints(const char *fn, const char *what, PyObject *seq, int64_t *out, int max)
{
    PyObject *fast = PySequence_Fast(seq, "");
    if (!fast) {
        PyErr_Format(PyExc_TypeError, "%s(): %s must be a sequence of ints, got %s", fn, what, s_type_name(seq));
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    int rc = (int)n;
    if (n > max) {
        PyErr_Format(PyExc_ValueError, "%s(): %s: at most %d entries, got %zd", fn, what, max, n);
        rc = -1;
    }
    for (Py_ssize_t i = 0; i < n && rc >= 0; i++)
        if (s_arg_int(fn, what, PySequence_Fast_GET_ITEM(fast, i), &out[i]) != 0)
            rc = -1;
    Py_DECREF(fast);
    return rc;
}

/* A size as torch takes it: separate ints, or one sequence of them (zeros(2, 3), zeros((2, 3))). */
static int s_arg_sizes(const char *fn, PyObject *args, int64_t *out)
{
    PyObject *seq = args;
    if (PyTuple_Check(args) && PyTuple_GET_SIZE(args) == 1 &&
        (PyTuple_Check(PyTuple_GET_ITEM(args, 0)) || PyList_Check(PyTuple_GET_ITEM(args, 0))))
        seq = PyTuple_GET_ITEM(args, 0);
    PyObject *fast = PySequence_Fast(seq, "size must be a tuple of ints");
    if (!fast)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    int rc = (int)n;
    if (n > DT_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "%s(): a size of %zd dims; at most %d", fn, n, DT_MAX_DIMS);
        rc = -1;
    }
    for (Py_ssize_t i = 0; i < n && rc >= 0; i++) {
        PyObject *s = PySequence_Fast_GET_ITEM(fast, i);
        if (s_is_bool(s) || !PyIndex_Check(s)) {
            PyErr_Format(PyExc_TypeError, "%s(): argument 'size' must be tuple of ints, but found element of type "
                         "%s at pos %zd", fn, s_type_name(s), i);
            rc = -1;
        } else {
            int overflow = 0;
            if ((out[i] = PyLong_AsLongLongAndOverflow(s, &overflow)) == -1 && PyErr_Occurred())
                rc = -1;
            else if (overflow) {
                PyErr_Format(s_value_error, "%s(): size %R at pos %zd is out of range (a tensor holds at most 2**48 "
                             "elements)", fn, s, i);
                rc = -1;
            }
        }
    }
    Py_DECREF(fast);
    return rc;
}

/* numpy's scalar types (numpy.int64, numpy.float32, ...), not its arrays */
static bool s_is_numpy_scalar(PyObject *o)
{
    const char *name = s_type_name(o);
    return !strncmp(name, "numpy.", 6) && strcmp(name, "numpy.ndarray") != 0;
}

/* A Python number (bool, int, float, or numpy's): 1 with *v set, 0 when o is not a number. */
static int s_number(PyObject *o, dt_scalar *v, bool *is_bool)
{
    bool b = s_is_bool(o);
    if (is_bool)
        *is_bool = b;
    if (b || PyLong_Check(o) || (s_is_numpy_scalar(o) && PyIndex_Check(o))) {
        int overflow = 0;
        long long x = b ? PyObject_IsTrue(o) : PyLong_AsLongLongAndOverflow(o, &overflow);
        if (overflow) {
            PyErr_SetString(PyExc_OverflowError, "value does not fit in int64");
            return -1;
        }
        if (x == -1 && PyErr_Occurred())
            return -1;
        *v = (dt_scalar){true, x, (double)x};
        return 1;
    }
    if (PyFloat_Check(o) || (s_is_numpy_scalar(o) && Py_TYPE(o)->tp_as_number && Py_TYPE(o)->tp_as_number->nb_float)) {
        double f = PyFloat_AsDouble(o);
        if (f == -1.0 && PyErr_Occurred())
            return -1;
        *v = (dt_scalar){false, 0, f};
        return 1;
    }
    return 0;
}

static int s_arg_number(const char *fn, const char *what, PyObject *o, dt_scalar *v, bool *is_bool)
{
    int rc = s_number(o, v, is_bool);
    if (rc == 0)
        PyErr_Format(PyExc_TypeError, "%s(): %s must be a number, got %s", fn, what, s_type_name(o));
    return rc == 1 ? 0 : -1;
}

static int s_arg_float(const char *fn, const char *what, PyObject *o, double *v)
{
    dt_scalar s;
    if (s_arg_number(fn, what, o, &s, NULL) != 0)
        return -1;
    *v = s.is_int ? (double)s.i : s.f;
    return 0;
}

/* A dtype (dtorch's, its name, or a numpy dtype); None gives otherwise. */
static int s_arg_dtype(PyObject *o, int otherwise, int *code)
{
    if (o == Py_None) {
        *code = otherwise;
        return 0;
    }
    PyObject *c = PyObject_CallOneArg(s_dtype_code, o);
    *code = c ? (int)PyLong_AsLong(c) : -1;
    Py_XDECREF(c);
    return c ? 0 : -1;
}

/* A dtorch.DeviceMesh: the Python object and its C mesh. */
static int s_arg_mesh(const char *fn, PyObject *o, dt_mesh **mesh)
{
    int is = s_mesh_cls ? PyObject_IsInstance(o, s_mesh_cls) : 0;
    if (is < 0)
        return -1;
    PyObject *c = is ? PyObject_GetAttrString(o, "_c") : NULL;
    if (!c || !PyObject_TypeCheck(c, &s_MeshType)) {
        Py_XDECREF(c);
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s(): device_mesh must be a dtorch.DeviceMesh, got %s", fn, s_type_name(o));
        return -1;
    }
    *mesh = ((s_Mesh *)c)->mesh;
    Py_DECREF(c);
    return 0;
}

/* placements: None (all Replicate: *result NULL) or one Placement per mesh dim. */
static int s_arg_placements(PyObject *o, int mesh_ndim, dt_placement *storage, const dt_placement **result)
{
    *result = NULL;
    if (o == Py_None)
        return 0;
    int single = PyObject_IsInstance(o, s_placement_cls);
    if (single != 0) {
        if (single > 0)
            PyErr_SetString(PyExc_TypeError,
                            "placements must be a sequence of Placement (e.g. [Shard(0)]), not a single Placement");
        return -1;
    }
    PyObject *fast = PySequence_Fast(o, "placements must be a sequence of Placement (e.g. [Shard(0)])");
    if (!fast)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    int rc = 0;
    for (Py_ssize_t i = 0; i < n && rc == 0; i++) {
        PyObject *p = PySequence_Fast_GET_ITEM(fast, i), *raw = NULL;
        int is = PyObject_IsInstance(p, s_placement_cls);
        if (is == 0)
            PyErr_Format(PyExc_TypeError, "placements must hold Shard, Replicate or Partial, got %R", p);
        int kind, dim, op;
        if (is <= 0 || !(raw = PyObject_CallMethod(p, "_raw", NULL)) || !PyArg_ParseTuple(raw, "iii", &kind, &dim, &op))
            rc = -1;
        else if (i < DT_MAX_DIMS)
            storage[i] = (dt_placement){kind, dim, op};
        Py_XDECREF(raw);
    }
    Py_DECREF(fast);
    if (rc == 0 && n != mesh_ndim) {
        PyErr_Format(PyExc_ValueError,
                     "`placements` must have the same length as `device_mesh.ndim`! Found placements length: "
                     "%zd, and device_mesh.ndim: %d.", n, mesh_ndim);
        rc = -1;
    }
    if (rc == 0)
        *result = storage;
    return rc;
}

/* DTorch computes no gradients: requires_grad=True (or a source tensor that requires them) is
 * refused rather than ignored. */
static int s_arg_inference_only(const char *fn, PyObject *requires_grad)
{
    int wants = requires_grad ? PyObject_IsTrue(requires_grad) : 0;
    if (wants > 0)
        PyErr_Format(PyExc_NotImplementedError,
                     "%s(): DTorch is inference-only: requires_grad=True is not supported", fn);
    return wants ? -1 : 0;
}

/* The same for a tensor handed in: one whose requires_grad attribute is true. */
static int s_arg_source(const char *fn, PyObject *source)
{
    PyObject *rg = PyObject_GetAttrString(source, "requires_grad");
    if (!rg) {
        PyErr_Clear();
        return 0;
    }
    int rc = s_arg_inference_only(fn, rg);
    Py_DECREF(rg);
    return rc;
}

static int s_arg_tensor(const char *fn, int pos, PyObject *o, dt_tensor **t);

/* Binds vectorcall arguments to the parameters names[0..n): out[i] borrowed, NULL when not given;
 * the first npositional may come by position. TypeError for too many, unknown or repeated. */
static int s_bind(const char *fn, PyObject *const *names, int n, int npositional, PyObject *const *args,
                  Py_ssize_t nargs, PyObject *kwnames, PyObject **out)
{
    for (int i = 0; i < n; i++)
        out[i] = NULL;
    if (nargs > npositional) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d positional arguments (%zd given)", fn, npositional, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        out[i] = args[i];
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        int i = 0;
        while (i < n && PyUnicode_Compare(key, names[i]) != 0)
            i++;
        if (i == n) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", fn, key);
            return -1;
        }
        if (out[i]) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%U'", fn, key);
            return -1;
        }
        out[i] = args[nargs + k];
    }
    return 0;
}

/* ---- Mesh --------------------------------------------------------------------------------- */

static int s_Mesh_init(s_Mesh *self, PyObject *args, PyObject *kw)
{
    const char *type;
    PyObject *shape_obj, *ids_obj, *names_obj = Py_None;
    if (!PyArg_ParseTuple(args, "sOO|O", &type, &shape_obj, &ids_obj, &names_obj))
        return -1;
    int64_t shape[DT_MAX_DIMS];
    int ndim = s_arg_ints("DeviceMesh", "mesh shape", shape_obj, shape, DT_MAX_DIMS);
    if (ndim < 0)
        return -1;
    Py_ssize_t nids = PySequence_Size(ids_obj);
    if (nids < 0)
        return -1;
    int64_t *ids = PyMem_Malloc((size_t)(nids ? nids : 1) * sizeof *ids);
    if (!ids || s_arg_ints("DeviceMesh", "mesh ids", ids_obj, ids, (int)nids) < 0) {
        PyMem_Free(ids);
        return -1;
    }
    const char *names[DT_MAX_DIMS];
    if (names_obj != Py_None) {
        for (int d = 0; d < ndim; d++) {
            PyObject *name = PySequence_GetItem(names_obj, d);
            names[d] = name ? PyUnicode_AsUTF8(name) : NULL;
            Py_XDECREF(name); /* the tuple keeps the string alive */
            if (!names[d]) {
                PyMem_Free(ids);
                return -1;
            }
        }
    }
    int64_t size = 1;
    for (int d = 0; d < ndim; d++)
        size *= shape[d];
    if (size != nids) {
        PyMem_Free(ids);
        PyErr_Format(PyExc_ValueError, "DeviceMesh: %zd device ids for a mesh of %lld", nids, (long long)size);
        return -1;
    }
    dt_mesh_release(&self->mesh);
    self->mesh = dt_mesh_new(type, ndim, shape, ids, names_obj != Py_None ? names : NULL);
    PyMem_Free(ids);
    if (!self->mesh) {
        s_raise();
        return -1;
    }
    return 0;
}

static void s_Mesh_dealloc(s_Mesh *self)
{
    dt_mesh_release(&self->mesh);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject s_MeshType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dtorch._C.Mesh",
    .tp_basicsize = sizeof(s_Mesh),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)s_Mesh_init,
    .tp_dealloc = (destructor)s_Mesh_dealloc,
    .tp_doc = "A device mesh handle (use dtorch.DeviceMesh).",
};


/* ---- TensorFuture ------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    dt_future *f;
} s_Future;

static PyObject *s_future_wrap(dt_future *f)
{
    if (!f)
        return s_raise();
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
        return s_raise();
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

/* ---- DTensor ------------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    dt_tensor *t;
    PyObject *mesh;   /* the Python DeviceMesh */
    PyObject *shape;  /* cached tuple */
} s_Tensor;

/* DTensor objects freed lately, kept for the next ones: a loop of views or small ops drops each
 * result as it makes the next, and this spares the allocator both ways */
#define S_TENSOR_SPARES 64
static s_Tensor *s_tensor_spare[S_TENSOR_SPARES];
static int s_tensor_spare_count;

static PyObject *s_tensor_wrap(dt_tensor *t, PyObject *mesh)
{
    if (!t)
        return s_raise();
    if (PyErr_Occurred()) {
        /* Ctrl-C during a backpressure wait: the op was queued, its result is dropped */
        dt_tensor_release(&t);
        return NULL;
    }
    /* A DTensor refers to its mesh and a tuple of ints only: no cycle runs through it, so its type
     * is not one the cycle collector tracks (no GC header, no collection set off by a loop of
     * views), and an op's result is the type itself, not a Python subclass of it (whose instances
     * would be tracked, and freed through the subclass's generic deallocation) */
    s_Tensor *self;
    if (s_tensor_spare_count > 0) {
        self = s_tensor_spare[--s_tensor_spare_count];
        PyObject_Init((PyObject *)self, s_tensor_type);
        self->shape = NULL;
    } else if (!(self = (s_Tensor *)s_tensor_type->tp_alloc(s_tensor_type, 0))) {
        dt_tensor_release(&t);
        return NULL;
    }
    self->t = t;
    self->mesh = Py_NewRef(mesh);
    return (PyObject *)self;
}

static void s_Tensor_dealloc(s_Tensor *self)
{
    PyTypeObject *type = Py_TYPE(self); /* a heap type: each instance holds a reference to it */
    dt_tensor_release(&self->t);
    Py_CLEAR(self->mesh);
    Py_CLEAR(self->shape);
    if (type == s_tensor_type && s_tensor_spare_count < S_TENSOR_SPARES)
        s_tensor_spare[s_tensor_spare_count++] = self; /* the GIL guards the list */
    else
        type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static PyObject *s_Tensor_get_shape(s_Tensor *self, void *unused)
{
    if (!self->shape) {
        int ndim = dt_tensor_ndim(self->t);
        const int64_t *shape = dt_tensor_shape(self->t);
        if (!(self->shape = PyTuple_New(ndim)))
            return NULL;
        for (int d = 0; d < ndim; d++)
            PyTuple_SET_ITEM(self->shape, d, PyLong_FromLongLong(shape[d]));
    }
    return Py_NewRef(self->shape);
}

static PyObject *s_Tensor_get_ndim(s_Tensor *self, void *unused) { return PyLong_FromLong(dt_tensor_ndim(self->t)); }

static PyObject *s_Tensor_get_dtype_code(s_Tensor *self, void *unused)
{
    return PyLong_FromLong(dt_tensor_dtype(self->t));
}

static PyObject *s_Tensor_get_mesh(s_Tensor *self, void *unused) { return Py_NewRef(self->mesh); }

static PyObject *s_Tensor_get_placements_raw(s_Tensor *self, void *unused)
{
    int n = dt_mesh_ndim(dt_tensor_mesh(self->t));
    const dt_placement *pl = dt_tensor_placements(self->t);
    PyObject *tuple = PyTuple_New(n);
    for (int i = 0; tuple && i < n; i++)
        PyTuple_SET_ITEM(tuple, i, Py_BuildValue("iii", pl[i].kind, pl[i].dim, pl[i].reduce_op));
    return tuple;
}

static PyObject *s_Tensor_future(s_Tensor *self, PyObject *unused) { return s_future_wrap(dt_tensor_fetch(self->t)); }

static PyObject *s_Tensor_locals_future(s_Tensor *self, PyObject *unused)
{
    return s_future_wrap(dt_tensor_fetch_locals(self->t));
}

static PyObject *s_Tensor_get_requires_grad(s_Tensor *self, void *unused) { Py_RETURN_FALSE; }

static PyObject *s_Tensor_get_contiguous(s_Tensor *self, void *unused)
{
    return PyBool_FromLong(dt_tensor_is_contiguous(self->t));
}

static PyObject *s_Tensor_get_T(PyObject *self, void *closure);
static PyObject *s_Tensor_get_mT(PyObject *self, void *closure);

static PyGetSetDef s_Tensor_getset[] = {
    {"shape", (getter)s_Tensor_get_shape, NULL, "The global shape.", NULL},
    {"ndim", (getter)s_Tensor_get_ndim, NULL, "Number of dims.", NULL},
    {"_dtype_code", (getter)s_Tensor_get_dtype_code, NULL, NULL, NULL},
    {"device_mesh", (getter)s_Tensor_get_mesh, NULL, "The DeviceMesh it lives on.", NULL},
    {"_placements_raw", (getter)s_Tensor_get_placements_raw, NULL, NULL, NULL},
    {"requires_grad", (getter)s_Tensor_get_requires_grad, NULL, "Always False: DTorch is inference-only.", NULL},
    {"_contiguous", (getter)s_Tensor_get_contiguous, NULL, NULL, NULL},
    {"T", s_Tensor_get_T, NULL, "Every dim reversed (the tensor itself below 2 dims).", NULL},
    {"mT", s_Tensor_get_mT, NULL, "The last two dims swapped (a matrix, or a batch of them).", NULL},
    {NULL},
};

static PyObject *s_Tensor_reshape(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
static PyObject *s_Tensor_view(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
static PyObject *s_Tensor_permute(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
static PyObject *s_Tensor_transpose(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
static PyObject *s_Tensor_t(PyObject *self, PyObject *unused);

static PyMethodDef s_Tensor_methods[] = {
    {"future", (PyCFunction)s_Tensor_future, METH_NOARGS, "A TensorFuture of the whole value."},
    {"reshape", (PyCFunction)(void (*)(void))s_Tensor_reshape, METH_FASTCALL,
     "reshape(*shape): the same elements in another shape (one size may be -1), given as ints or one sequence."},
    {"view", (PyCFunction)(void (*)(void))s_Tensor_view, METH_FASTCALL,
     "view(*shape): reshape (pieces are never shared, so a view is a reshape)."},
    {"permute", (PyCFunction)(void (*)(void))s_Tensor_permute, METH_FASTCALL,
     "permute(*dims): the dims reordered, output dim i being input dim dims[i] (ints or one sequence)."},
    {"transpose", (PyCFunction)(void (*)(void))s_Tensor_transpose, METH_FASTCALL,
     "transpose(dim0, dim1): dims dim0 and dim1 swapped."},
    {"t", (PyCFunction)s_Tensor_t, METH_NOARGS, "t(): the transpose of a tensor of at most 2 dims."},
    {"_locals_future", (PyCFunction)s_Tensor_locals_future, METH_NOARGS, "A TensorFuture of every piece."},
    {NULL},
};

/* ---- running ops: the per-op hot path -------------------------------------------------------- */

static int s_arg_tensor(const char *fn, int pos, PyObject *o, dt_tensor **t)
{
    if (!PyObject_TypeCheck(o, s_tensor_type)) {
        PyErr_Format(PyExc_TypeError, "%s(): expected a DTensor at position %d, got %s (an input must be a DTensor: "
                     "distribute arrays with dtorch.distribute_tensor first)", fn, pos, s_type_name(o));
        return -1;
    }
    *t = ((s_Tensor *)o)->t;
    return 0;
}

/* made new tensors as one DTensor, or a tuple of them */
static PyObject *s_wrap_all(int made, dt_tensor **out, PyObject *mesh)
{
    if (made == 1)
        return s_tensor_wrap(out[0], mesh);
    PyObject *tuple = PyTuple_New(made);
    for (int o = 0; o < made; o++) {
        PyObject *t = tuple ? s_tensor_wrap(out[o], mesh) : NULL;
        if (!t) {
            for (int p = o + (tuple ? 1 : 0); p < made; p++)
                dt_tensor_release(&out[p]);
            Py_XDECREF(tuple);
            return NULL;
        }
        PyTuple_SET_ITEM(tuple, o, t);
    }
    return tuple;
}

static PyObject *s_run(int id, int n, dt_tensor *const *in, const dt_op_attrs *attrs, PyObject *mesh)
{
    dt_tensor *out[2];
    int made = dt_op_run(id, n, in, attrs, 2, out);
    return made < 0 ? s_raise() : s_wrap_all(made, out, mesh);
}

/* a op b where either side may be a Python number (attrs.scalar; ints[0] = 1: on the left).
 * NULL without an exception when neither is a DTensor or the other is not a number. */
static PyObject *s_binary(int id, PyObject *a, PyObject *b)
{
    dt_op_attrs attrs;
    attrs.nints = 0;
    attrs.nfloats = 0;
    attrs.has_scalar = false;
    bool ta = PyObject_TypeCheck(a, s_tensor_type), tb = PyObject_TypeCheck(b, s_tensor_type);
    dt_tensor *in[2];
    if (ta && tb) {
        in[0] = ((s_Tensor *)a)->t;
        in[1] = ((s_Tensor *)b)->t;
        return s_run(id, 2, in, &attrs, ((s_Tensor *)a)->mesh);
    }
    if (!ta && !tb)
        return NULL;
    if (s_number(ta ? b : a, &attrs.scalar, NULL) != 1)
        return NULL;
    attrs.has_scalar = true;
    if (!ta) {
        attrs.nints = 1;
        attrs.ints[0] = 1;
    }
    s_Tensor *t = (s_Tensor *)(ta ? a : b);
    in[0] = t->t;
    return s_run(id, 1, in, &attrs, t->mesh);
}

/* the ids of the ops behind Python's operators, looked up at import */
enum { S_ADD, S_SUB, S_MUL, S_DIV, S_FLOORDIV, S_MOD, S_POW, S_NEG, S_ABS, S_EQ, S_NE, S_LT, S_LE, S_GT, S_GE,
       S_AND, S_OR, S_NOT, S_MATMUL, S_RESHAPE, S_PERMUTE, S_NOPS };
static const char *const s_operator_ops[S_NOPS] = {"add", "sub", "mul", "div", "floor_divide", "remainder", "pow",
                                                   "neg", "abs", "eq", "ne", "lt", "le", "gt", "ge", "logical_and",
                                                   "logical_or", "logical_not", "matmul", "reshape", "permute"};
static int s_operator_ids[S_NOPS];

static PyObject *s_operator(int op, PyObject *a, PyObject *b)
{
    PyObject *r = s_binary(s_operator_ids[op], a, b);
    if (!r && !PyErr_Occurred())
        Py_RETURN_NOTIMPLEMENTED;
    return r;
}

static PyObject *s_unary(int op, PyObject *a)
{
    dt_op_attrs attrs = {0};
    dt_tensor *in[1] = {((s_Tensor *)a)->t};
    return s_run(s_operator_ids[op], 1, in, &attrs, ((s_Tensor *)a)->mesh);
}

static PyObject *s_nb_add(PyObject *a, PyObject *b) { return s_operator(S_ADD, a, b); }
static PyObject *s_nb_sub(PyObject *a, PyObject *b) { return s_operator(S_SUB, a, b); }
static PyObject *s_nb_mul(PyObject *a, PyObject *b) { return s_operator(S_MUL, a, b); }
static PyObject *s_nb_div(PyObject *a, PyObject *b) { return s_operator(S_DIV, a, b); }
static PyObject *s_nb_floordiv(PyObject *a, PyObject *b) { return s_operator(S_FLOORDIV, a, b); }
static PyObject *s_nb_mod(PyObject *a, PyObject *b) { return s_operator(S_MOD, a, b); }
static PyObject *s_nb_and(PyObject *a, PyObject *b) { return s_operator(S_AND, a, b); }
static PyObject *s_nb_or(PyObject *a, PyObject *b) { return s_operator(S_OR, a, b); }
static PyObject *s_nb_neg(PyObject *a) { return s_unary(S_NEG, a); }
static PyObject *s_nb_abs(PyObject *a) { return s_unary(S_ABS, a); }
static PyObject *s_nb_invert(PyObject *a) { return s_unary(S_NOT, a); }

static PyObject *s_nb_pow(PyObject *a, PyObject *b, PyObject *mod)
{
    if (mod != Py_None)
        Py_RETURN_NOTIMPLEMENTED;
    return s_operator(S_POW, a, b);
}

/* Sizes or dims given as ints or as one sequence of them (a tuple, a list, any iterable), as torch
 * takes them, into attrs->ints; 0, or -1 with a TypeError naming fn and the argument (what). */
static int s_ints_arg(const char *fn, const char *what, PyObject *const *args, Py_ssize_t nargs, dt_op_attrs *attrs)
{
    PyObject *seq = NULL, *const *items = args;
    Py_ssize_t n = nargs;
    if (nargs == 1 && !PyIndex_Check(args[0])) {
        if (PyObject_TypeCheck(args[0], s_tensor_type) || PyUnicode_Check(args[0]) ||
            !(seq = PySequence_Fast(args[0], ""))) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s(): argument '%s' must be tuple of ints, not %s", fn, what,
                         s_type_name(args[0]));
            return -1;
        }
        items = PySequence_Fast_ITEMS(seq);
        n = PySequence_Fast_GET_SIZE(seq);
    }
    int rc = -1;
    attrs->nints = 0;
    attrs->nfloats = 0;
    attrs->has_scalar = false;
    if (n > (Py_ssize_t)(sizeof attrs->ints / sizeof attrs->ints[0])) {
        PyErr_Format(PyExc_ValueError, "%s(): %zd %s are more than DTorch tensors have dims", fn, n, what);
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (s_is_bool(items[i]) || !PyIndex_Check(items[i])) {
            PyErr_Format(PyExc_TypeError, "%s(): argument '%s' must be tuple of ints, but found element of type %s "
                         "at pos %zd", fn, what, s_type_name(items[i]), i);
            goto done;
        }
        Py_ssize_t v = PyNumber_AsSsize_t(items[i], PyExc_OverflowError);
        if (v == -1 && PyErr_Occurred())
            goto done;
        attrs->ints[attrs->nints++] = v;
    }
    rc = 0;
done:
    Py_XDECREF(seq);
    return rc;
}

/* x.reshape(*shape) and x.view(*shape) in C: they are a decode step's commonest calls, and the
 * Python wrapper's argument handling cost more than the op itself. */
static PyObject *s_reshape(const char *fn, PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    dt_op_attrs attrs;
    if (s_ints_arg(fn, "shape", args, nargs, &attrs) != 0)
        return NULL;
    dt_tensor *in[1] = {((s_Tensor *)self)->t};
    return s_run(s_operator_ids[S_RESHAPE], 1, in, &attrs, ((s_Tensor *)self)->mesh);
}

/* x.permute(*dims), x.transpose(dim0, dim1) and x.t() in C, for the same reason: attention
 * transposes three times a layer, and the Python wrappers cost several times the op (a view made
 * on the controller). */
static PyObject *s_Tensor_permute(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    dt_op_attrs attrs;
    if (s_ints_arg("permute", "dims", args, nargs, &attrs) != 0)
        return NULL;
    dt_tensor *in[1] = {((s_Tensor *)self)->t};
    return s_run(s_operator_ids[S_PERMUTE], 1, in, &attrs, ((s_Tensor *)self)->mesh);
}

/* dim normalised for ndim dims (a 0-d tensor takes -1 and 0), as torch: 0, or -1 with the error */
static int s_dim_arg(const char *fn, PyObject *o, int ndim, int *out)
{
    if (!PyLong_CheckExact(o) && (s_is_bool(o) || !PyIndex_Check(o))) {
        PyErr_Format(PyExc_TypeError, "%s(): dim must be an int, got %s", fn, s_type_name(o));
        return -1;
    }
    Py_ssize_t d = PyNumber_AsSsize_t(o, NULL); /* out of Py_ssize_t: clipped, then out of range */
    if (d == -1 && PyErr_Occurred())
        return -1;
    int n = ndim > 0 ? ndim : 1;
    if (d < -n || d >= n) {
        PyErr_Format(PyExc_IndexError, "%s: Dimension out of range (expected to be in range of [%d, %d], but got %zd)",
                     fn, -n, n - 1, d);
        return -1;
    }
    *out = (int)(d < 0 ? d + n : d);
    return 0;
}

/* x permuted: output dim d is input dim perm[d] */
static PyObject *s_permuted(s_Tensor *x, int ndim, const int64_t *perm)
{
    dt_op_attrs attrs;
    attrs.nints = ndim;
    attrs.nfloats = 0;
    attrs.has_scalar = false;
    memcpy(attrs.ints, perm, (size_t)ndim * sizeof *perm);
    dt_tensor *in[1] = {x->t};
    return s_run(s_operator_ids[S_PERMUTE], 1, in, &attrs, x->mesh);
}

/* self with dims d0 and d1 (in range) swapped: a permute */
static PyObject *s_swapped(PyObject *self, int d0, int d1)
{
    int ndim = dt_tensor_ndim(((s_Tensor *)self)->t);
    if (ndim == 0)
        return Py_NewRef(self);
    int64_t perm[DT_MAX_DIMS];
    for (int d = 0; d < ndim; d++)
        perm[d] = d;
    perm[d0] = d1;
    perm[d1] = d0;
    return s_permuted((s_Tensor *)self, ndim, perm);
}

static PyObject *s_transpose(const char *fn, PyObject *self, PyObject *dim0, PyObject *dim1)
{
    int ndim = dt_tensor_ndim(((s_Tensor *)self)->t), d0, d1;
    if (s_dim_arg(fn, dim0, ndim, &d0) != 0 || s_dim_arg(fn, dim1, ndim, &d1) != 0)
        return NULL;
    return s_swapped(self, d0, d1);
}

static PyObject *s_Tensor_transpose(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2)
        return PyErr_Format(PyExc_TypeError, "transpose() takes 2 arguments (dim0, dim1), got %zd", nargs);
    return s_transpose("transpose", self, args[0], args[1]);
}

static PyObject *s_Tensor_t(PyObject *self, PyObject *unused)
{
    int ndim = dt_tensor_ndim(((s_Tensor *)self)->t);
    if (ndim > 2)
        return PyErr_Format(PyExc_ValueError, "t() expects a tensor with <= 2 dimensions, but self is %dD", ndim);
    if (ndim < 2)
        return Py_NewRef(self);
    return s_swapped(self, 0, 1);
}

/* x.T: every dim reversed (x itself below 2 dims), and x.mT: the last two swapped, as torch. In C:
 * a property in Python cost four times the permute it makes. */
static PyObject *s_Tensor_get_T(PyObject *self, void *closure)
{
    (void)closure;
    int ndim = dt_tensor_ndim(((s_Tensor *)self)->t);
    if (ndim < 2)
        return Py_NewRef(self);
    int64_t perm[DT_MAX_DIMS];
    for (int d = 0; d < ndim; d++)
        perm[d] = ndim - 1 - d;
    return s_permuted((s_Tensor *)self, ndim, perm);
}

static PyObject *s_Tensor_get_mT(PyObject *self, void *closure)
{
    (void)closure;
    int ndim = dt_tensor_ndim(((s_Tensor *)self)->t);
    if (ndim < 2)
        return PyErr_Format(PyExc_RuntimeError, "tensor.mT is only supported on matrices or batches of matrices. "
                            "Got %d-D tensor.", ndim);
    return s_swapped(self, ndim - 2, ndim - 1);
}

static PyObject *s_Tensor_reshape(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return s_reshape("reshape", self, args, nargs);
}

static PyObject *s_Tensor_view(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs == 1 && !PyIndex_Check(args[0]) && (PyType_Check(args[0]) || PyObject_HasAttrString(args[0], "itemsize")))
        return PyErr_Format(PyExc_TypeError, "view: reinterpreting the bytes as another dtype is not supported; use "
                            ".to(dtype)");
    return s_reshape("view", self, args, nargs);
}

/* a @ b: two DTensors (numbers and arrays are not ours) */
static PyObject *s_nb_matmul(PyObject *a, PyObject *b)
{
    if (!PyObject_TypeCheck(a, s_tensor_type) || !PyObject_TypeCheck(b, s_tensor_type))
        Py_RETURN_NOTIMPLEMENTED;
    return s_operator(S_MATMUL, a, b);
}

static PyObject *s_richcompare(PyObject *a, PyObject *b, int cmp)
{
    static const int ops[] = {[Py_LT] = S_LT, [Py_LE] = S_LE, [Py_EQ] = S_EQ,
                              [Py_NE] = S_NE, [Py_GT] = S_GT, [Py_GE] = S_GE};
    return s_operator(ops[cmp], a, b);
}

/* DTensors hash by identity, as torch tensors do, even though == builds a tensor */
static Py_hash_t s_hash(PyObject *self) { return (Py_hash_t)((uintptr_t)self >> 4); }

/* A list of ints as an index, as torch's x[[0, 2]]: its positions, in memory of its own (PyMem_Free)
 * that dt_index reads; NULL with an exception for a list of anything else. */
static int64_t *s_list_positions(PyObject *list)
{
    Py_ssize_t n = PyList_GET_SIZE(list);
    int64_t *v = PyMem_Malloc((size_t)(n ? n : 1) * sizeof *v);
    if (!v)
        return PyErr_NoMemory(), NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PyList_GET_ITEM(list, i);
        if (s_is_bool(o) || !PyIndex_Check(o)) {
            PyMem_Free(v);
            return PyErr_Format(PyExc_TypeError, "a list index holds ints only (got %s)", s_type_name(o)), NULL;
        }
        if ((v[i] = PyNumber_AsSsize_t(o, PyExc_IndexError)) == -1 && PyErr_Occurred()) {
            PyMem_Free(v);
            return NULL;
        }
    }
    return v;
}

/* x[index]: ints, slices (step > 0), None and Ellipsis, and at most one integer DTensor or list
 * of ints among them (dt_index) */
static PyObject *s_Tensor_getitem(s_Tensor *self, PyObject *key)
{
    enum { S_MAX_ITEMS = 64 };
    if (PyLong_CheckExact(key)) { /* x[i], the commonest index, without the walk below */
        dt_index_item item = {.kind = DT_INDEX_INT};
        if ((item.i = PyLong_AsSsize_t(key)) == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return PyErr_Format(PyExc_IndexError, "index %R is out of bounds for dimension 0", key);
        }
        return s_tensor_wrap(dt_index(self->t, 1, &item), self->mesh);
    }
    bool tuple = PyTuple_Check(key);
    Py_ssize_t n = tuple ? PyTuple_GET_SIZE(key) : 1;
    dt_index_item items[S_MAX_ITEMS];
    Py_ssize_t list_at = -1; /* the item that is a list, its positions read after the walk */
    if (n > S_MAX_ITEMS)
        return PyErr_Format(PyExc_IndexError, "too many indices for tensor of dimension %d", dt_tensor_ndim(self->t));
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = tuple ? PyTuple_GET_ITEM(key, i) : key;
        dt_index_item *it = &items[i];
        memset(it, 0, sizeof *it);
        /* the common items first: an exact int or a slice is told apart by its type alone, where
         * the DTensor check walks the type's bases */
        if (PyLong_CheckExact(o)) {
            it->kind = DT_INDEX_INT;
            if ((it->i = PyLong_AsSsize_t(o)) == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                return PyErr_Format(PyExc_IndexError, "cannot fit 'int' into an index-sized integer");
            }
        } else if (o == Py_None) {
            it->kind = DT_INDEX_NONE;
        } else if (o == Py_Ellipsis) {
            it->kind = DT_INDEX_ELLIPSIS;
        } else if (PySlice_Check(o)) {
            PySliceObject *s = (PySliceObject *)o;
            PyObject *bounds[3] = {s->start, s->stop, s->step};
            bool *has[3] = {&it->has_start, &it->has_stop, &it->has_step};
            int64_t *val[3] = {&it->start, &it->stop, &it->step};
            it->kind = DT_INDEX_SLICE;
            for (int b = 0; b < 3; b++) {
                if (bounds[b] == Py_None)
                    continue;
                if (!PyIndex_Check(bounds[b]))
                    return PyErr_Format(PyExc_TypeError, "slice indices must be integers or None or have an "
                                        "__index__ method");
                *has[b] = true;
                *val[b] = PyNumber_AsSsize_t(bounds[b], NULL);
                if (*val[b] == -1 && PyErr_Occurred())
                    return NULL;
            }
        } else if (PyObject_TypeCheck(o, s_tensor_type)) {
            it->kind = DT_INDEX_TENSOR;
            it->tensor = ((s_Tensor *)o)->t;
        } else if (PyList_Check(o)) {
            if (list_at >= 0)
                return PyErr_Format(PyExc_TypeError, "indexing with more than one DTensor or list index is not supported");
            it->kind = DT_INDEX_LIST;
            it->npositions = PyList_GET_SIZE(o);
            list_at = i;
        } else if (!s_is_bool(o) && PyIndex_Check(o)) {
            it->kind = DT_INDEX_INT;
            if ((it->i = PyNumber_AsSsize_t(o, PyExc_IndexError)) == -1 && PyErr_Occurred())
                return NULL;
        } else {
            return PyErr_Format(PyExc_TypeError, "only integers, slices (`:`), ellipsis (`...`), None, lists of "
                                "integers and integer DTensors are valid indices (got %s)", s_type_name(o));
        }
    }
    int64_t *positions = NULL;
    if (list_at >= 0 && !(items[list_at].positions = positions =
                              s_list_positions(tuple ? PyTuple_GET_ITEM(key, list_at) : key)))
        return NULL;
    dt_tensor *r = dt_index(self->t, (int)n, items);
    PyMem_Free(positions);
    if (r == self->t) { /* nothing to do: the tensor itself, as torch's x[...] */
        dt_tensor_release(&r);
        return Py_NewRef(self);
    }
    return s_tensor_wrap(r, self->mesh);
}


static PyType_Slot s_tensor_slots[] = {
    {Py_tp_dealloc, s_Tensor_dealloc},
    {Py_tp_getset, s_Tensor_getset},
    {Py_tp_methods, s_Tensor_methods},
    {Py_nb_add, s_nb_add},
    {Py_nb_subtract, s_nb_sub},
    {Py_nb_multiply, s_nb_mul},
    {Py_nb_true_divide, s_nb_div},
    {Py_nb_floor_divide, s_nb_floordiv},
    {Py_nb_remainder, s_nb_mod},
    {Py_nb_power, s_nb_pow},
    {Py_nb_negative, s_nb_neg},
    {Py_nb_absolute, s_nb_abs},
    {Py_nb_invert, s_nb_invert},
    {Py_nb_and, s_nb_and},
    {Py_nb_or, s_nb_or},
    {Py_nb_matrix_multiply, s_nb_matmul},
    {Py_mp_subscript, s_Tensor_getitem},
    {Py_tp_richcompare, s_richcompare},
    {Py_tp_hash, s_hash},
    {Py_tp_doc, "A tensor laid out over a DeviceMesh with one placement per mesh dim."},
    {0, NULL},
};

/* Mutable (no Py_TPFLAGS_IMMUTABLETYPE): dtorch sets its Python-written methods on it */
static PyType_Spec s_tensor_spec = {
    .name = "dtorch.DTensor",
    .basicsize = sizeof(s_Tensor),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .slots = s_tensor_slots,
};

/* ---- the ops of the registry as Python callables -----------------------------------------------
 * One Op per registry row that says how Python calls it (dt_op_info.sig): dtorch.<name>,
 * DTensor.<name> (an Op binds as a method, like a function) and nn.functional.<name>. */

#define S_OP_PARAMS (1 + 4) /* input, and other or up to 4 float attributes */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int id;
    dt_op_sig sig;
    char name[64];
    int nparams;
    PyObject *params[S_OP_PARAMS];  /* their names */
    double defaults[S_OP_PARAMS];   /* of a unary op's float attributes, params[1..] */
    PyObject *signature;            /* "(input, other)", for inspect */
    PyObject *doc;
} s_Op;

static PyObject *s_Op_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    s_Op *op = (s_Op *)callable;
    PyObject *v[S_OP_PARAMS];
    if (s_bind(op->name, op->params, op->nparams, op->nparams, args, PyVectorcall_NARGS(nargsf), kwnames, v) != 0)
        return NULL;
    for (int i = 0; i < (op->sig == DT_SIG_BINARY ? 2 : 1); i++)
        if (!v[i])
            return PyErr_Format(PyExc_TypeError, "%s() missing required argument '%U'", op->name, op->params[i]);
    if (op->sig == DT_SIG_BINARY) {
        PyObject *r = s_binary(op->id, v[0], v[1]);
        if (r || PyErr_Occurred())
            return r;
        bool ta = PyObject_TypeCheck(v[0], s_tensor_type), tb = PyObject_TypeCheck(v[1], s_tensor_type);
        if (!ta && !tb)
            return PyErr_Format(PyExc_TypeError, "%s(): expected a DTensor, got %s and %s (distribute arrays with "
                                "dtorch.distribute_tensor first)", op->name, s_type_name(v[0]), s_type_name(v[1]));
        return PyErr_Format(PyExc_TypeError, "%s(): expected a DTensor or a number, got %s (distribute arrays with "
                            "dtorch.distribute_tensor first)", op->name, s_type_name(ta ? v[1] : v[0]));
    }
    dt_tensor *in[1];
    if (!PyObject_TypeCheck(v[0], s_tensor_type))
        return PyErr_Format(PyExc_TypeError, "%s(): expected a DTensor, got %s (distribute arrays with "
                            "dtorch.distribute_tensor first)", op->name, s_type_name(v[0]));
    in[0] = ((s_Tensor *)v[0])->t;
    dt_op_attrs attrs;
    attrs.nints = 0;
    attrs.has_scalar = false;
    attrs.nfloats = op->nparams - 1;
    for (int i = 1; i < op->nparams; i++) {
        attrs.floats[i - 1] = op->defaults[i];
        if (v[i] && s_arg_float(op->name, PyUnicode_AsUTF8(op->params[i]), v[i], &attrs.floats[i - 1]) != 0)
            return NULL;
    }
    return s_run(op->id, 1, in, &attrs, ((s_Tensor *)v[0])->mesh);
}

/* op as a method: bound to the instance, as functions are */
static PyObject *s_Op_get(PyObject *self, PyObject *obj, PyObject *type)
{
    return obj && obj != Py_None ? PyMethod_New(self, obj) : Py_NewRef(self);
}

static void s_Op_dealloc(s_Op *self)
{
    for (int i = 0; i < self->nparams; i++)
        Py_XDECREF(self->params[i]);
    Py_XDECREF(self->signature);
    Py_XDECREF(self->doc);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *s_Op_repr(s_Op *self) { return PyUnicode_FromFormat("<dtorch op %s>", self->name); }
static PyObject *s_Op_get_name(s_Op *self, void *unused) { return PyUnicode_FromString(self->name); }
static PyObject *s_Op_get_doc(s_Op *self, void *unused) { return Py_NewRef(self->doc); }
static PyObject *s_Op_get_signature(s_Op *self, void *unused) { return Py_NewRef(self->signature); }
static PyObject *s_Op_get_module(s_Op *self, void *unused) { return PyUnicode_FromString("dtorch"); }
static PyObject *s_Op_get_id(s_Op *self, void *unused) { return PyLong_FromLong(self->id); }

static PyGetSetDef s_Op_getset[] = {
    {"__name__", (getter)s_Op_get_name, NULL, NULL, NULL},
    {"__qualname__", (getter)s_Op_get_name, NULL, NULL, NULL},
    {"__doc__", (getter)s_Op_get_doc, NULL, NULL, NULL},
    {"__text_signature__", (getter)s_Op_get_signature, NULL, NULL, NULL},
    {"__module__", (getter)s_Op_get_module, NULL, NULL, NULL},
    {"id", (getter)s_Op_get_id, NULL, "The op's id in the registry.", NULL},
    {NULL},
};

static PyTypeObject s_OpType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dtorch._C.Op",
    .tp_basicsize = sizeof(s_Op),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_vectorcall_offset = offsetof(s_Op, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = s_Op_get,
    .tp_dealloc = (destructor)s_Op_dealloc,
    .tp_repr = (reprfunc)s_Op_repr,
    .tp_getset = s_Op_getset,
    .tp_doc = "An op of the registry, called with torch's signature.",
};

/* The Op of a registry row: params "input, other" (binary) or "input" and the row's float
 * attributes ("beta=1, threshold=20"). */
static PyObject *s_op_new(const dt_op_info *info)
{
    s_Op *op = PyObject_New(s_Op, &s_OpType);
    if (!op)
        return NULL;
    op->vectorcall = s_Op_vectorcall;
    op->id = info->id;
    op->sig = info->sig;
    snprintf(op->name, sizeof op->name, "%s", info->name);
    op->nparams = 0;
    op->signature = op->doc = NULL;
    char sig[256];
    int used = snprintf(sig, sizeof sig, "(input");
    op->params[op->nparams++] = PyUnicode_FromString("input");
    if (info->sig == DT_SIG_BINARY) {
        op->params[op->nparams++] = PyUnicode_FromString("other");
        used += snprintf(sig + used, sizeof sig - (size_t)used, ", other");
    }
    for (const char *p = info->floats; info->sig == DT_SIG_UNARY && *p && op->nparams < S_OP_PARAMS;) {
        while (*p == ' ' || *p == ',')
            p++;
        const char *eq = strchr(p, '=');
        if (!eq)
            break;
        op->params[op->nparams] = PyUnicode_FromStringAndSize(p, eq - p);
        op->defaults[op->nparams++] = strtod(eq + 1, (char **)&p);
    }
    if (info->sig == DT_SIG_UNARY && info->floats[0])
        used += snprintf(sig + used, sizeof sig - (size_t)used, ", %s", info->floats);
    snprintf(sig + used, sizeof sig - (size_t)used, ")");
    const char *where = info->exports & DT_PY_FN ? "torch" : "torch.nn.functional";
    op->signature = PyUnicode_FromString(sig);
    op->doc = PyUnicode_FromFormat("%s%s\n--\n\nElementwise %s%s, as %s.%s.", info->name, sig, info->name,
                                   info->sig == DT_SIG_BINARY ? " with broadcasting and Python numbers" : "", where,
                                   info->name);
    for (int i = 0; i < op->nparams; i++)
        if (!op->params[i]) {
            op->nparams = i;
            Py_DECREF(op);
            return NULL;
        }
    if (!op->signature || !op->doc) {
        Py_DECREF(op);
        return NULL;
    }
    return (PyObject *)op;
}

/* the registry as Python sees it, built once at import: (name, id, nin, nout, sig, exports,
 * floats, Op or None) per op */
static PyObject *s_registry_rows;
static char s_op_names[256][64]; /* by id, for messages */

static int s_registry_build(void)
{
    int n = dt_op_count();
    if (!(s_registry_rows = PyTuple_New(n)))
        return -1;
    for (int i = 0; i < n; i++) {
        dt_op_info info;
        if (dt_op_info_at(i, &info) != 0) {
            s_raise();
            return -1;
        }
        if (info.id >= 0 && info.id < 256)
            snprintf(s_op_names[info.id], sizeof s_op_names[info.id], "%s", info.name);
        PyObject *fn = info.sig != DT_SIG_NONE && info.exports ? s_op_new(&info) : Py_NewRef(Py_None);
        PyObject *row = fn ? Py_BuildValue("siiiiisN", info.name, info.id, info.nin, info.nout, (int)info.sig,
                                           info.exports, info.floats, fn)
                           : NULL;
        if (!row)
            return -1;
        PyTuple_SET_ITEM(s_registry_rows, i, row);
        /* methods are defined on the type itself */
        if ((info.exports & DT_PY_METHOD) && PyObject_SetAttrString((PyObject *)s_tensor_type, info.name, fn) != 0)
            return -1;
    }
    for (int op = 0; op < S_NOPS; op++)
        if ((s_operator_ids[op] = dt_op_id(s_operator_ops[op])) < 0) {
            s_raise();
            return -1;
        }
    return 0;
}

static PyObject *s_registry(PyObject *mod, PyObject *unused) { return Py_NewRef(s_registry_rows); }

/* _op(op, inputs, ints, floats, scalar): a registered op (its name or id) with raw attributes;
 * -> a DTensor, or a tuple of them. ints/floats: sequences or None; scalar: a number or None. */
static PyObject *s_op(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5)
        return PyErr_Format(PyExc_TypeError, "_op(op, inputs, ints, floats, scalar)");
    int id = PyUnicode_Check(args[0]) ? dt_op_id(PyUnicode_AsUTF8(args[0])) : (int)PyLong_AsLong(args[0]);
    if (id < 0)
        return PyErr_Occurred() ? NULL : s_raise();
    const char *name = id < 256 && s_op_names[id][0] ? s_op_names[id] : "op";
    PyObject *fast = PySequence_Fast(args[1], "inputs must be a sequence of DTensors");
    if (!fast)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    dt_tensor *in[32];
    PyObject *result = NULL, *mesh = Py_None;
    dt_op_attrs attrs = {0};
    if (n > 32) {
        PyErr_Format(PyExc_ValueError, "%s(): too many tensor inputs (%zd; at most 32)", name, n);
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (s_arg_tensor(name, (int)i, PySequence_Fast_GET_ITEM(fast, i), &in[i]) != 0)
            goto done;
    if (n > 0)
        mesh = ((s_Tensor *)PySequence_Fast_GET_ITEM(fast, 0))->mesh;
    if (args[2] != Py_None && (attrs.nints = s_arg_ints(name, "a dim or size", args[2], attrs.ints, 16)) < 0)
        goto done;
    if (args[3] != Py_None) {
        PyObject *floats = PySequence_Fast(args[3], "float attributes must be a sequence");
        if (!floats)
            goto done;
        attrs.nfloats = (int)PySequence_Fast_GET_SIZE(floats);
        int rc = attrs.nfloats > 4 ? -1 : 0;
        if (rc)
            PyErr_Format(PyExc_ValueError, "%s(): too many float attributes", name);
        for (int i = 0; i < attrs.nfloats && rc == 0; i++)
            rc = s_arg_float(name, "a float attribute", PySequence_Fast_GET_ITEM(floats, i), &attrs.floats[i]);
        Py_DECREF(floats);
        if (rc)
            goto done;
    }
    if (args[4] != Py_None) {
        if (s_arg_number(name, "the number operand", args[4], &attrs.scalar, NULL) != 0)
            goto done;
        attrs.has_scalar = true;
    }
    result = s_run(id, (int)n, in, &attrs, mesh);
done:
    Py_DECREF(fast);
    return result;
}

/* tuple of n new DTensors, or NULL (releasing them) */
static PyObject *s_wrap_tuple(int n, dt_tensor **out, PyObject *mesh)
{
    PyObject *tuple = PyTuple_New(n);
    for (int i = 0; i < n; i++) {
        PyObject *t = tuple ? s_tensor_wrap(out[i], mesh) : NULL;
        out[i] = NULL;
        if (!t) {
            for (int j = i + 1; j < n; j++)
                dt_tensor_release(&out[j]);
            Py_CLEAR(tuple);
            break;
        }
        PyTuple_SET_ITEM(tuple, i, t);
    }
    return tuple;
}

/* _cut(kind, tensor, a, dim): split (a: a size or a list of them), chunk (a: chunks) or unbind */
static PyObject *s_cut(PyObject *mod, PyObject *args)
{
    const char *kind;
    PyObject *tensor, *a, *dim_o, *result = NULL;
    dt_tensor *t, **out = NULL;
    int64_t dim, size = 0, *sections = NULL;
    int nsections = 0;
    if (!PyArg_ParseTuple(args, "sOOO", &kind, &tensor, &a, &dim_o) || s_arg_tensor(kind, 0, tensor, &t) != 0 ||
        s_arg_int(kind, "dim", dim_o, &dim) != 0)
        return NULL;
    bool split = !strcmp(kind, "split"), chunk = !strcmp(kind, "chunk");
    if (split && (PyList_Check(a) || PyTuple_Check(a))) {
        Py_ssize_t len = PySequence_Size(a);
        if (len > INT32_MAX || !(sections = PyMem_Malloc(sizeof *sections * (size_t)(len ? len : 1))))
            return PyErr_NoMemory();
        if ((nsections = s_arg_ints(kind, "split size", a, sections, (int)len)) < 0)
            goto done;
    } else if ((split || chunk) && s_arg_int(kind, split ? "split_size" : "chunks", a, &size) != 0) {
        return NULL;
    }
    /* the first pass counts the pieces, the second makes them */
    for (int pass = 0, n = 0; pass < 2; pass++) {
        int got = split ? dt_split(t, dim, size, nsections, sections, n, out)
                  : chunk ? dt_chunk(t, size, dim, n, out)
                          : dt_unbind(t, dim, n, out);
        if (got < 0) {
            s_raise();
            break;
        }
        if (pass) {
            result = s_wrap_tuple(got, out, ((s_Tensor *)tensor)->mesh);
        } else if (!(out = PyMem_Calloc((size_t)(got ? got : 1), sizeof *out))) {
            PyErr_NoMemory();
            break;
        }
        n = got;
    }
done:
    PyMem_Free(sections);
    PyMem_Free(out);
    return result;
}

/* _ring_attention(query, key, value, query_index, key_index, mesh_dim, is_causal, scale or None[,
 * joint_key, joint_value, joint_index: all None or all tensors]) */
static PyObject *s_ring_attention(PyObject *mod, PyObject *args)
{
    const char *fn = "ring_attention";
    PyObject *tensors[8] = {NULL}, *dim_o, *causal_o, *scale_o;
    dt_tensor *in[8] = {NULL};
    int64_t dim;
    double scale = 0.0;
    if (!PyArg_ParseTuple(args, "OOOOOOOO|OOO", &tensors[0], &tensors[1], &tensors[2], &tensors[3], &tensors[4],
                          &dim_o, &causal_o, &scale_o, &tensors[5], &tensors[6], &tensors[7]))
        return NULL;
    for (int i = 0; i < 8; i++)
        if (tensors[i] && (i < 5 || tensors[i] != Py_None) && s_arg_tensor(fn, i, tensors[i], &in[i]) != 0)
            return NULL;
    int causal = PyObject_IsTrue(causal_o);
    if (causal < 0 || s_arg_int(fn, "mesh_dim", dim_o, &dim) != 0 ||
        (scale_o != Py_None && s_arg_float(fn, "scale", scale_o, &scale) != 0))
        return NULL;
    int mesh_dim = dim < INT_MIN ? INT_MIN : dim > INT_MAX ? INT_MAX : (int)dim; /* out of range either way */
    return s_tensor_wrap(dt_ring_attention_joint(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], mesh_dim,
                                                 causal, scale_o != Py_None, scale),
                         ((s_Tensor *)tensors[0])->mesh);
}

static PyObject *s_set_strict(PyObject *mod, PyObject *arg)
{
    int strict = PyObject_IsTrue(arg);
    if (strict < 0)
        return NULL;
    dt_set_strict(strict);
    Py_RETURN_NONE;
}

static PyObject *s_get_strict(PyObject *mod, PyObject *unused) { return PyBool_FromLong(dt_get_strict()); }

/* ---- factories -------------------------------------------------------------------------------- */

/* _make(kind, size, device_mesh, placements, dtype, requires_grad, fill_value): kind is "full"
 * "zeros" "ones" "empty" "rand" "randn"; size as the caller gave it (a full's size may be an int);
 * fill_value is used by "full" only, and decides its dtype when none is given. */
static PyObject *s_make(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7 || !PyUnicode_Check(args[0]))
        return PyErr_Format(PyExc_TypeError, "_make(kind, size, device_mesh, placements, dtype, requires_grad, value)");
    const char *kind = PyUnicode_AsUTF8(args[0]);
    bool full = !strcmp(kind, "full");
    dt_mesh *mesh;
    int64_t shape[DT_MAX_DIMS];
    dt_placement storage[DT_MAX_DIMS];
    const dt_placement *pl;
    dt_scalar value = {true, 0, 0.0};
    bool is_bool = false;
    int dtype, ndim;
    if (s_arg_inference_only(kind, args[5]) != 0 || s_arg_mesh(kind, args[2], &mesh) != 0)
        return NULL;
    PyObject *size = full && !PyTuple_Check(args[1]) && !PyList_Check(args[1]) ? PyTuple_Pack(1, args[1])
                                                                            : Py_NewRef(args[1]);
    ndim = size ? s_arg_sizes(kind, size, shape) : -1;
    Py_XDECREF(size);
    if (ndim < 0 || (full && s_arg_number(kind, "fill_value", args[6], &value, &is_bool) != 0) ||
        s_arg_dtype(args[4], full ? dt_full_dtype(value, is_bool) : DT_FLOAT32, &dtype) != 0 ||
        s_arg_placements(args[3], dt_mesh_ndim(mesh), storage, &pl) != 0)
        return NULL;
    dt_tensor *t;
    if (full)
        t = dt_full(mesh, ndim, shape, (dt_dtype)dtype, pl, value);
    else if (!strcmp(kind, "zeros"))
        t = dt_zeros(mesh, ndim, shape, (dt_dtype)dtype, pl);
    else if (!strcmp(kind, "ones"))
        t = dt_ones(mesh, ndim, shape, (dt_dtype)dtype, pl);
    else if (!strcmp(kind, "empty"))
        t = dt_empty(mesh, ndim, shape, (dt_dtype)dtype, pl);
    else if (!strcmp(kind, "rand"))
        t = dt_rand(mesh, ndim, shape, (dt_dtype)dtype, pl);
    else if (!strcmp(kind, "randn"))
        t = dt_randn(mesh, ndim, shape, (dt_dtype)dtype, pl);
    else
        return PyErr_Format(PyExc_ValueError, "unknown factory '%s'", kind);
    return s_tensor_wrap(t, args[2]);
}

/* _arange(start, end or None, step, device_mesh, placements, dtype, requires_grad) */
static PyObject *s_arange(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7)
        return PyErr_Format(PyExc_TypeError, "_arange(start, end, step, device_mesh, placements, dtype, requires_grad)");
    dt_mesh *mesh;
    dt_placement storage[DT_MAX_DIMS];
    const dt_placement *pl;
    dt_scalar start = {true, 0, 0.0}, end, step;
    int dtype;
    bool one = args[1] == Py_None; /* arange(end) */
    if (s_arg_inference_only("arange", args[6]) != 0 ||
        (!one && s_arg_number("arange", "start", args[0], &start, NULL) != 0) ||
        s_arg_number("arange", "end", one ? args[0] : args[1], &end, NULL) != 0 ||
        s_arg_number("arange", "step", args[2], &step, NULL) != 0 || s_arg_mesh("arange", args[3], &mesh) != 0 ||
        s_arg_dtype(args[5], dt_arange_dtype(start, end, step), &dtype) != 0 ||
        s_arg_placements(args[4], dt_mesh_ndim(mesh), storage, &pl) != 0)
        return NULL;
    return s_tensor_wrap(dt_arange(mesh, start, end, step, (dt_dtype)dtype, pl), args[3]);
}

/* ---- arrays from Python: numpy's, anything with the buffer protocol, __array__ or DLPack ------ */

static PyObject *s_numpy; /* the numpy module, imported on first use */

static PyObject *s_np(const char *name)
{
    if (!s_numpy && !(s_numpy = PyImport_ImportModule("numpy")))
        return NULL;
    return PyObject_GetAttrString(s_numpy, name);
}

/* data as a numpy array (a view where it can be), and its dtype code; bfloat16 viewed as uint16 */
static PyObject *s_array(const char *fn, PyObject *data, int *dtype)
{
    static const char *const names[DT_NDTYPES] = {"float32", "float16", "bfloat16", "int32", "int64", "bool"};
    PyObject *ndarray = s_np("ndarray"), *array = NULL;
    if (!ndarray)
        return NULL;
    int is = PyObject_IsInstance(data, ndarray);
    Py_DECREF(ndarray);
    if (is < 0)
        return NULL;
    if (is) {
        array = Py_NewRef(data);
    } else {
        bool dlpack = PyObject_HasAttrString(data, "__dlpack__") && !PyObject_HasAttrString(data, "__array__");
        PyObject *convert = s_np(dlpack ? "from_dlpack" : "asarray");
        array = convert ? PyObject_CallOneArg(convert, data) : NULL;
        Py_XDECREF(convert);
        if (!array) {
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyErr_Format(PyExc_TypeError, "%s: cannot read %s as an array: %S", fn, s_type_name(data),
                         value ? value : Py_None);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
            return NULL;
        }
    }
    PyObject *dt = PyObject_GetAttrString(array, "dtype"), *name = dt ? PyObject_GetAttrString(dt, "name") : NULL;
    const char *s = name ? PyUnicode_AsUTF8(name) : NULL;
    *dtype = -1;
    for (int d = 0; s && d < DT_NDTYPES; d++)
        if (!strcmp(s, names[d]))
            *dtype = d;
    if (s && *dtype < 0)
        PyErr_Format(PyExc_TypeError, "%s: unsupported dtype %s; supported: float32, float16, bfloat16, int32, "
                     "int64, bool (convert first, e.g. array.astype(numpy.float32))", fn, s);
    /* a dtype's name says nothing of its byte order: a big-endian '>f4' array is "float32" too, and
     * its bytes would be read as little-endian values; numpy swaps them into a copy */
    PyObject *native = *dtype >= 0 ? PyObject_GetAttrString(dt, "isnative") : NULL;
    if (native == Py_False) {
        PyObject *swapped = PyObject_CallMethod(dt, "newbyteorder", "s", "=");
        Py_SETREF(array, swapped ? PyObject_CallMethod(array, "astype", "O", swapped) : NULL);
        Py_XDECREF(swapped);
    }
    if ((*dtype >= 0 && !native) || !array)
        *dtype = -1;
    Py_XDECREF(native);
    Py_XDECREF(dt);
    Py_XDECREF(name);
    if (*dtype < 0) {
        Py_XDECREF(array);
        return NULL;
    }
    if (*dtype == DT_BFLOAT16) {
        PyObject *u16 = s_np("uint16"), *view = u16 ? PyObject_CallMethod(array, "view", "O", u16) : NULL;
        Py_XDECREF(u16);
        Py_SETREF(array, view);
    }
    return array;
}

/* _distribute(tensor, device_mesh, placements): tensor is the global value */
static PyObject *s_distribute(PyObject *mod, PyObject *args)
{
    const char *fn = "distribute_tensor";
    PyObject *source, *py_mesh, *pls;
    dt_mesh *mesh;
    dt_placement storage[DT_MAX_DIMS];
    const dt_placement *pl;
    int dtype, as_dtype = -1; /* as_dtype: the elements' dtype when the array holds raw bits (bfloat16 as uint16) */
    if (!PyArg_ParseTuple(args, "OOO|i", &source, &py_mesh, &pls, &as_dtype))
        return NULL;
    if (as_dtype != -1 && dt_dtype_size((dt_dtype)as_dtype) == 0)
        return PyErr_Format(PyExc_ValueError, "%s: unknown dtype code %d", fn, as_dtype);
    if (PyObject_TypeCheck(source, s_tensor_type)) {
        /* already laid out: itself when it is what was asked for */
        PyObject *have = PyObject_GetAttrString(source, "placements"), *want = pls == Py_None ? NULL : PySequence_Tuple(pls);
        int same = PyObject_RichCompareBool(((s_Tensor *)source)->mesh, py_mesh, Py_EQ);
        if (same > 0 && want)
            same = have ? PyObject_RichCompareBool(have, want, Py_EQ) : -1;
        Py_XDECREF(have);
        Py_XDECREF(want);
        if (same < 0)
            return NULL;
        if (same)
            return Py_NewRef(source);
        return PyErr_Format(PyExc_ValueError, "%s: the tensor is already a DTensor with other placements; use "
                            "redistribute", fn);
    }
    if (s_arg_source(fn, source) != 0 || s_arg_mesh(fn, py_mesh, &mesh) != 0)
        return NULL;
    PyObject *array = s_array(fn, source, &dtype);
    if (!array)
        return NULL;
    Py_buffer view;
    if (s_arg_placements(pls, dt_mesh_ndim(mesh), storage, &pl) != 0 ||
        PyObject_GetBuffer(array, &view, PyBUF_STRIDES) != 0) {
        Py_DECREF(array);
        return NULL;
    }
    Py_DECREF(array);
    if (as_dtype != -1)
        dtype = as_dtype;
    if (view.ndim > DT_MAX_DIMS || (size_t)view.itemsize != dt_dtype_size((dt_dtype)dtype)) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "%s: unsupported array (%d dims, %zd-byte items)", fn, view.ndim,
                            view.itemsize);
    }
    int64_t shape[DT_MAX_DIMS], strides[DT_MAX_DIMS];
    for (int d = 0; d < view.ndim; d++) {
        shape[d] = view.shape[d];
        strides[d] = view.strides[d];
    }
    /* the GIL stays held: a full queue makes the runtime release it through the wait hooks */
    dt_tensor *t = dt_distribute(mesh, view.buf, view.ndim, shape, strides, (dt_dtype)dtype, pl);
    PyBuffer_Release(&view);
    return s_tensor_wrap(t, py_mesh);
}

/* The local pieces of from_local as C-contiguous arrays of one dtype: a list of them (one per
 * device) or one array that stands for every device's. */
static PyObject *s_pieces(const char *fn, PyObject *local, Py_ssize_t ndevices, int *dtype)
{
    bool many = PyList_Check(local) || PyTuple_Check(local);
    Py_ssize_t n = many ? PySequence_Size(local) : ndevices;
    if (n < 0)
        return NULL;
    if (n != ndevices)
        return PyErr_Format(PyExc_ValueError, "%s: %zd local pieces for a mesh of %zd devices", fn, n, ndevices);
    PyObject *require = s_np("require"), *list = require ? PyList_New(n) : NULL;
    for (Py_ssize_t i = 0; list && i < n; i++) {
        PyObject *src = many ? PySequence_GetItem(local, i) : Py_NewRef(local), *array = NULL, *c = NULL;
        int d = -1;
        if (src && s_arg_source(fn, src) == 0 && (array = s_array(fn, src, &d)) && i > 0 && d != *dtype)
            PyErr_Format(PyExc_TypeError, "%s: local pieces have different dtypes (%s and %s)", fn,
                         dt_dtype_name((dt_dtype)*dtype), dt_dtype_name((dt_dtype)d));
        /* np.require keeps 0-d pieces 0-d (ascontiguousarray would make them 1-D) */
        if (array && !PyErr_Occurred())
            c = PyObject_CallFunction(require, "OOs", array, Py_None, "C");
        *dtype = i == 0 ? d : *dtype;
        Py_XDECREF(src);
        Py_XDECREF(array);
        if (!c)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, i, c);
    }
    Py_XDECREF(require);
    return list;
}

/* _from_local(local_tensor, device_mesh, placements, shape or None) */
static PyObject *s_from_local(PyObject *mod, PyObject *args)
{
    const char *fn = "from_local";
    PyObject *local, *py_mesh, *pls, *shape_o;
    dt_mesh *mesh;
    dt_placement storage[DT_MAX_DIMS];
    const dt_placement *pl;
    int64_t gshape[DT_MAX_DIMS];
    int dtype = -1, gndim = 0;
    if (!PyArg_ParseTuple(args, "OOOO", &local, &py_mesh, &pls, &shape_o) || s_arg_mesh(fn, py_mesh, &mesh) != 0)
        return NULL;
    PyObject *arrays = s_pieces(fn, local, (Py_ssize_t)dt_mesh_size(mesh), &dtype);
    if (!arrays)
        return NULL;
    PyObject *shape_args = shape_o == Py_None ? NULL : PyTuple_Pack(1, shape_o);
    if (s_arg_placements(pls, dt_mesh_ndim(mesh), storage, &pl) != 0 ||
        (shape_o != Py_None && (!shape_args || (gndim = s_arg_sizes(fn, shape_args, gshape)) < 0))) {
        Py_XDECREF(shape_args);
        Py_DECREF(arrays);
        return NULL;
    }
    Py_XDECREF(shape_args);
    Py_ssize_t n = PyList_GET_SIZE(arrays);
    Py_buffer *views = PyMem_Calloc((size_t)(n ? n : 1), sizeof *views);
    const void **data = PyMem_Calloc((size_t)(n ? n : 1), sizeof *data);
    int64_t *locals = PyMem_Calloc((size_t)(n ? n : 1) * DT_MAX_DIMS, sizeof *locals);
    PyObject *result = NULL;
    Py_ssize_t got = 0;
    int ndim = -1;
    if (!views || !data || !locals) {
        PyErr_NoMemory();
        goto done;
    }
    for (; got < n; got++) {
        if (PyObject_GetBuffer(PyList_GET_ITEM(arrays, got), &views[got], PyBUF_C_CONTIGUOUS) != 0)
            goto done;
        if (ndim < 0)
            ndim = views[got].ndim;
        if (views[got].ndim != ndim || ndim > DT_MAX_DIMS) {
            got++;
            PyErr_Format(PyExc_ValueError, "%s: every local piece needs the same number of dims", fn);
            goto done;
        }
        data[got] = views[got].buf;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        for (int d = 0; d < ndim; d++)
            locals[i * ndim + d] = views[i].shape[d];
    if (shape_o != Py_None && gndim != ndim) {
        PyErr_Format(PyExc_ValueError, "%s: shape has %d dims but the local pieces have %d", fn, gndim, ndim);
        goto done;
    }
    result = s_tensor_wrap(dt_from_local(mesh, data, ndim < 0 ? 0 : ndim, locals, (dt_dtype)dtype, pl,
                                         shape_o != Py_None ? gshape : NULL),
                           py_mesh);
done:
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(data);
    PyMem_Free(locals);
    Py_DECREF(arrays);
    return result;
}

/* ---- redistribute ----------------------------------------------------------------------------- */

/* The target of a redistribute: a DeviceMesh, or None for the tensor's own (*mesh NULL); and its
 * placements, which must be given. */
static int s_arg_target(const char *fn, PyObject *py_mesh, PyObject *pls, dt_mesh **mesh)
{
    *mesh = NULL;
    if (py_mesh != Py_None && s_arg_mesh(fn, py_mesh, mesh) != 0)
        return -1;
    if (pls == Py_None) {
        PyErr_SetString(PyExc_RuntimeError, "placements is needed for redistribute!");
        return -1;
    }
    return 0;
}

/* _redistribute(tensor, device_mesh or None, placements) */
static PyObject *s_redistribute(PyObject *mod, PyObject *args)
{
    PyObject *tensor, *py_mesh, *pls;
    dt_tensor *t;
    dt_mesh *mesh;
    dt_placement storage[DT_MAX_DIMS];
    const dt_placement *pl;
    if (!PyArg_ParseTuple(args, "OOO", &tensor, &py_mesh, &pls) || s_arg_tensor("redistribute", 0, tensor, &t) != 0 ||
        s_arg_target("redistribute", py_mesh, pls, &mesh) != 0 ||
        s_arg_placements(pls, dt_mesh_ndim(mesh ? mesh : dt_tensor_mesh(t)), storage, &pl) != 0)
        return NULL;
    return s_tensor_wrap(dt_redistribute(t, mesh, pl), mesh ? py_mesh : ((s_Tensor *)tensor)->mesh);
}

/* Whether o is a sequence that holds only Placements (one list for every tensor). */
static int s_all_placements(PyObject *o)
{
    PyObject *fast = PySequence_Fast(o, "placements must be a sequence");
    if (!fast)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    int all = n > 0;
    for (Py_ssize_t i = 0; i < n && all > 0; i++)
        all = PyObject_IsInstance(PySequence_Fast_GET_ITEM(fast, i), s_placement_cls);
    Py_DECREF(fast);
    return all;
}

/* _redistribute_many(tensors, device_mesh or None, placements: one sequence for all, or one per tensor) */
static PyObject *s_redistribute_many(PyObject *mod, PyObject *args)
{
    const char *fn = "redistribute_many";
    PyObject *tensors, *py_mesh, *pls;
    dt_mesh *mesh;
    if (!PyArg_ParseTuple(args, "OOO", &tensors, &py_mesh, &pls) || s_arg_target(fn, py_mesh, pls, &mesh) != 0)
        return NULL;
    PyObject *list = PySequence_Fast(tensors, "redistribute_many: tensors must be a sequence of DTensors");
    int shared = list ? s_all_placements(pls) : -1;
    if (shared < 0) {
        Py_XDECREF(list);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(list), npl = shared ? 0 : PySequence_Size(pls);
    dt_tensor **in = PyMem_Calloc((size_t)(n ? n : 1), sizeof *in), **out = PyMem_Calloc((size_t)(n ? n : 1), sizeof *out);
    dt_placement *placements = PyMem_Calloc((size_t)(n ? n : 1) * DT_MAX_DIMS, sizeof *placements);
    PyObject *result = NULL;
    if (!in || !out || !placements) {
        PyErr_NoMemory();
        goto done;
    }
    if (!shared && npl != n) {
        if (npl >= 0)
            PyErr_Format(PyExc_ValueError, "%s: %zd placement lists for %zd tensors", fn, npl, n);
        goto done;
    }
    int stride = mesh ? dt_mesh_ndim(mesh) : -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (s_arg_tensor(fn, (int)i, PySequence_Fast_GET_ITEM(list, i), &in[i]) != 0)
            goto done;
        int ndim = mesh ? stride : dt_mesh_ndim(dt_tensor_mesh(in[i]));
        if (stride < 0)
            stride = ndim;
        else if (ndim != stride) {
            PyErr_Format(PyExc_ValueError, "%s: without device_mesh, every tensor's mesh needs the same number of "
                         "dims", fn);
            goto done;
        }
        PyObject *pl = shared ? Py_NewRef(pls) : PySequence_GetItem(pls, i);
        const dt_placement *given;
        int rc = pl ? s_arg_placements(pl, stride, placements + i * stride, &given) : -1;
        Py_XDECREF(pl);
        if (rc != 0)
            goto done;
    }
    if (dt_redistribute_many((int)n, in, mesh, placements, out) != 0) {
        s_raise();
        goto done;
    }
    result = PyList_New(n);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *m = mesh ? py_mesh : ((s_Tensor *)PySequence_Fast_GET_ITEM(list, i))->mesh;
        PyObject *wrapped = result ? s_tensor_wrap(out[i], m) : NULL;
        out[i] = NULL;
        if (!wrapped) {
            Py_CLEAR(result);
            for (Py_ssize_t j = i + 1; j < n; j++)
                dt_tensor_release(&out[j]);
            break;
        }
        PyList_SET_ITEM(result, i, wrapped);
    }
done:
    Py_DECREF(list);
    PyMem_Free(in);
    PyMem_Free(out);
    PyMem_Free(placements);
    return result;
}

/* _redistribute_into(tensors, destinations): each tensor's value into its destination, in place */
static PyObject *s_redistribute_into(PyObject *mod, PyObject *args)
{
    const char *fn = "redistribute_many";
    PyObject *tensors, *dsts;
    if (!PyArg_ParseTuple(args, "OO", &tensors, &dsts))
        return NULL;
    PyObject *src = PySequence_Fast(tensors, "redistribute_many: tensors must be a sequence of DTensors");
    PyObject *dst = src ? PySequence_Fast(dsts, "redistribute_many: out must be a sequence of DTensors") : NULL;
    Py_ssize_t n = src ? PySequence_Fast_GET_SIZE(src) : 0;
    dt_tensor **in = dst ? PyMem_Calloc((size_t)(2 * n + 1), sizeof *in) : NULL, **out = in ? in + n : NULL;
    PyObject *result = NULL;
    if (dst && !in)
        PyErr_NoMemory();
    if (!in)
        goto done;
    if (PySequence_Fast_GET_SIZE(dst) != n) {
        PyErr_Format(PyExc_ValueError, "%s: %zd tensors but %zd in out", fn, n, PySequence_Fast_GET_SIZE(dst));
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (s_arg_tensor(fn, (int)i, PySequence_Fast_GET_ITEM(src, i), &in[i]) != 0 ||
            s_arg_tensor("redistribute_many (out)", (int)i, PySequence_Fast_GET_ITEM(dst, i), &out[i]) != 0)
            goto done;
    if (dt_redistribute_into((int)n, in, out) != 0) {
        s_raise();
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(src);
    Py_XDECREF(dst);
    PyMem_Free(in);
    return result;
}

/* _redistribute_plan(tensor, device_mesh or None, placements) -> [(kind, mesh_dim, remote_elements)] */
static PyObject *s_redistribute_plan(PyObject *mod, PyObject *args)
{
    PyObject *tensor, *py_mesh, *pls;
    dt_tensor *t;
    dt_mesh *mesh;
    dt_placement storage[DT_MAX_DIMS];
    const dt_placement *pl;
    if (!PyArg_ParseTuple(args, "OOO", &tensor, &py_mesh, &pls) ||
        s_arg_tensor("redistribute_plan", 0, tensor, &t) != 0 ||
        s_arg_target("redistribute_plan", py_mesh, pls, &mesh) != 0 ||
        s_arg_placements(pls, dt_mesh_ndim(mesh ? mesh : dt_tensor_mesh(t)), storage, &pl) != 0)
        return NULL;
    dt_plan_step steps[DT_MAX_DIMS + 1];
    int n = dt_redistribute_plan(t, mesh, pl, steps, DT_MAX_DIMS + 1);
    if (n < 0)
        return s_raise();
    PyObject *list = PyList_New(n);
    for (int i = 0; list && i < n; i++)
        PyList_SET_ITEM(list, i, Py_BuildValue("siL", steps[i].kind, steps[i].mesh_dim,
                                               (long long)steps[i].remote_elements));
    return list;
}

/* ---- runtime ------------------------------------------------------------------------------ */

static PyObject *s_init(PyObject *mod, PyObject *args)
{
    int workers, insecure = 0;
    const char *path = NULL, *listen = NULL, *key = NULL, *worker_key = NULL;
    if (!PyArg_ParseTuple(args, "iz|zzzp", &workers, &path, &listen, &key, &worker_key, &insecure))
        return NULL;
    dt_config config = {(dt_workers)workers, path, listen, key, worker_key, insecure != 0};
    if (dt_init(&config) != 0)
        return s_raise();
    Py_RETURN_NONE;
}

/* (endpoint, controller's public key) of a listening runtime. */
static PyObject *s_listen_info(PyObject *mod, PyObject *unused)
{
    char endpoint[256], key[64];
    if (dt_listen_info(endpoint, sizeof endpoint, key, sizeof key) != 0)
        return s_raise();
    return Py_BuildValue("ss", endpoint, key);
}

/* wait_workers(ids, timeout): the GIL is let go while it waits. */
static PyObject *s_wait_workers(PyObject *mod, PyObject *args)
{
    PyObject *seq;
    double timeout;
    if (!PyArg_ParseTuple(args, "Od", &seq, &timeout))
        return NULL;
    PyObject *fast = PySequence_Fast(seq, "wait_for_workers: devices must be a sequence of ints");
    if (!fast)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    int64_t *ids = PyMem_Malloc((size_t)(n ? n : 1) * sizeof *ids);
    for (Py_ssize_t i = 0; ids && i < n; i++) {
        ids[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
        if (ids[i] == -1 && PyErr_Occurred()) {
            PyMem_Free(ids);
            Py_DECREF(fast);
            return NULL;
        }
    }
    Py_DECREF(fast);
    if (!ids)
        return PyErr_NoMemory();
    int rc = dt_wait_workers(ids, (int)n, timeout);
    PyMem_Free(ids);
    if (rc != 0)
        return s_raise();
    Py_RETURN_NONE;
}

/* worker_info(id) -> (state, remote, host, pid, peer, reason) */
static PyObject *s_worker_info(PyObject *mod, PyObject *args)
{
    long long id;
    if (!PyArg_ParseTuple(args, "L", &id))
        return NULL;
    dt_worker_info info;
    if (dt_worker_info_get(id, &info) != 0)
        return s_raise();
    return Py_BuildValue("iOsLss", info.state, info.remote ? Py_True : Py_False, info.host, (long long)info.pid,
                         info.peer, info.reason);
}

static PyObject *s_shutdown(PyObject *mod, PyObject *unused)
{
    dt_shutdown();
    Py_RETURN_NONE;
}

static PyObject *s_is_running(PyObject *mod, PyObject *unused) { return PyBool_FromLong(dt_is_running()); }

static PyObject *s_manual_seed(PyObject *mod, PyObject *arg)
{
    /* torch's range: a negative seed stands for its 64-bit two's complement, nothing wider */
    int overflow = 0;
    long long value = PyLong_Check(arg) ? PyLong_AsLongLongAndOverflow(arg, &overflow) : 0;
    unsigned long long seed = (unsigned long long)value;
    if (!PyErr_Occurred() && overflow > 0) {
        seed = PyLong_AsUnsignedLongLong(arg);
        if (PyErr_Occurred())
            PyErr_Clear(), overflow = 2;
        else
            overflow = 0;
    }
    if (!PyErr_Occurred() && (overflow || !PyLong_Check(arg))) {
        PyErr_Format(PyLong_Check(arg) ? s_value_error : s_type_error,
                     "manual_seed: the seed must be an integer in [-2**63, 2**64), got %R", arg);
        return NULL;
    }
    if (PyErr_Occurred())
        return NULL;
    dt_manual_seed(seed);
    Py_RETURN_NONE;
}

static PyObject *s_ops_submitted(PyObject *mod, PyObject *unused)
{
    return PyLong_FromUnsignedLongLong(dt_ops_submitted());
}

static PyObject *s_synchronize(PyObject *mod, PyObject *unused)
{
    if (dt_synchronize() != 0)
        return s_raise();
    Py_RETURN_NONE;
}

/* _device_stats(device_mesh, reset_peak) -> one dict of counters per device, in mesh order */
static PyObject *s_device_stats(PyObject *mod, PyObject *args)
{
    PyObject *py_mesh, *reset;
    dt_mesh *mesh;
    if (!PyArg_ParseTuple(args, "OO", &py_mesh, &reset) || s_arg_mesh("device_stats", py_mesh, &mesh) != 0)
        return NULL;
    int reset_peak = PyObject_IsTrue(reset);
    int n = (int)dt_mesh_size(mesh);
    dt_device_stat *stats = reset_peak < 0 ? NULL : PyMem_Calloc((size_t)n, sizeof *stats);
    if (!stats)
        return reset_peak < 0 ? NULL : PyErr_NoMemory();
    int got = reset_peak ? dt_device_stats_reset_peak(mesh, n, stats) : dt_device_stats(mesh, n, stats);
    PyObject *list = got < 0 ? s_raise() : PyList_New(got);
    for (int i = 0; list && i < got; i++) {
        const dt_device_stat *d = &stats[i];
        PyObject *entry = Py_BuildValue(
            "{s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L}", "device", (long long)d->device, "bytes_in_use",
            (long long)d->bytes_in_use, "peak_bytes", (long long)d->peak_bytes, "peer_messages_sent",
            (long long)d->peer_messages_sent, "peer_bytes_sent", (long long)d->peer_bytes_sent,
            "peer_messages_received", (long long)d->peer_messages_received, "peer_bytes_received",
            (long long)d->peer_bytes_received, "shm_bytes_sent", (long long)d->shm_bytes_sent, "shm_bytes_received",
            (long long)d->shm_bytes_received, "shm_bytes_fetched", (long long)d->shm_bytes_fetched, "pooled_bytes",
            (long long)d->pooled_bytes, "loads", (long long)d->loads, "loaded_bytes", (long long)d->loaded_bytes,
            "peer_messages_refused", (long long)d->peer_messages_refused, "peer_regions_dropped",
            (long long)d->peer_regions_dropped);
        if (!entry)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, i, entry);
    }
    PyMem_Free(stats);
    return list;
}

/* _trace_start(mesh); _trace_stop(mesh) -> [events kept per device]; _trace_events(mesh, counts) ->
 * bytes of every device's counts[i] rows of DT_TRACE_FIELDS int64; _trace_host() -> bytes of [device, records,
 * ns] rows: dtorch.profiler's timelines */
static PyObject *s_trace_start(PyObject *mod, PyObject *py_mesh)
{
    dt_mesh *mesh;
    if (s_arg_mesh("profiler", py_mesh, &mesh) != 0)
        return NULL;
    if (dt_trace_start(mesh) != 0)
        return s_raise();
    Py_RETURN_NONE;
}

static PyObject *s_trace_stop(PyObject *mod, PyObject *py_mesh)
{
    dt_mesh *mesh;
    if (s_arg_mesh("profiler", py_mesh, &mesh) != 0)
        return NULL;
    int64_t n = dt_mesh_size(mesh);
    int64_t *counts = PyMem_Calloc((size_t)n, sizeof *counts);
    if (!counts)
        return PyErr_NoMemory();
    PyObject *list = dt_trace_stop(mesh, counts) != 0 ? s_raise() : PyList_New(n);
    for (int64_t i = 0; list && i < n; i++)
        PyList_SET_ITEM(list, i, PyLong_FromLongLong(counts[i]));
    PyMem_Free(counts);
    return list;
}

static PyObject *s_trace_events(PyObject *mod, PyObject *args)
{
    PyObject *py_mesh, *py_counts;
    dt_mesh *mesh;
    if (!PyArg_ParseTuple(args, "OO", &py_mesh, &py_counts) || s_arg_mesh("profiler", py_mesh, &mesh) != 0)
        return NULL;
    int64_t n = dt_mesh_size(mesh), total = 0;
    if (!PyList_Check(py_counts) || PyList_GET_SIZE(py_counts) != n)
        return PyErr_Format(PyExc_ValueError, "profiler: expected %lld counts", (long long)n);
    int64_t *counts = PyMem_Calloc((size_t)n, sizeof *counts);
    if (!counts)
        return PyErr_NoMemory();
    for (int64_t i = 0; i < n; i++) {
        counts[i] = PyLong_AsLongLong(PyList_GET_ITEM(py_counts, i));
        if (counts[i] < 0 && !PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "profiler: a count is negative");
        if (PyErr_Occurred()) {
            PyMem_Free(counts);
            return NULL;
        }
        total += counts[i];
    }
    /* every device's rows, one device after another */
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(total * DT_TRACE_FIELDS * 8));
    if (out && dt_trace_events(mesh, counts, (int64_t *)PyBytes_AS_STRING(out)) != 0) {
        s_raise();
        Py_CLEAR(out);
    }
    PyMem_Free(counts);
    return out;
}

/* _record_name(code): what a trace event's record was ("compute", "send", ...) */
static PyObject *s_record_name(PyObject *mod, PyObject *code)
{
    long long c = PyLong_AsLongLong(code);
    return c == -1 && PyErr_Occurred() ? NULL : PyUnicode_FromString(dt_record_name(c));
}

static PyObject *s_started_devices(PyObject *mod, PyObject *unused)
{
    int n = dt_started_devices(NULL, 0);
    int64_t *ids = PyMem_Calloc((size_t)(n ? n : 1), sizeof *ids);
    if (!ids)
        return PyErr_NoMemory();
    int got = dt_started_devices(ids, n);
    PyObject *list = PyList_New(got < n ? got : n);
    for (int i = 0; list && i < (got < n ? got : n); i++)
        PyList_SET_ITEM(list, i, PyLong_FromLongLong(ids[i]));
    PyMem_Free(ids);
    return list;
}

static PyObject *s_device_type(PyObject *mod, PyObject *arg)
{
    long long id = PyLong_AsLongLong(arg);
    if (id == -1 && PyErr_Occurred())
        return NULL;
    char type[64];
    if (dt_device_type(id, type, sizeof type) != 0)
        Py_RETURN_NONE;
    return PyUnicode_FromString(type);
}

static PyObject *s_trace_host(PyObject *mod, PyObject *unused)
{
    int64_t n = dt_trace_host(NULL, 0);
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * 3 * 8));
    if (out) {
        int64_t got = dt_trace_host((int64_t *)PyBytes_AS_STRING(out), n);
        if (got < n)
            n = got;
    }
    return out;
}

/* _register(TensorFuture, DeviceMesh, Placement, dtype_code): the classes futures are made as and
 * arguments checked against, and dtype_code(x) -> the code of a dtype-like x (DTensors are made as
 * the C type itself, s_tensor_type) */
static PyObject *s_register(PyObject *mod, PyObject *args)
{
    PyTypeObject *future_cls;
    PyObject *mesh_cls, *placement_cls, *dtype_code;
    if (!PyArg_ParseTuple(args, "O!O!O!O", &PyType_Type, &future_cls, &PyType_Type, &mesh_cls, &PyType_Type,
                          &placement_cls, &dtype_code))
        return NULL;
    if (!PyType_IsSubtype(future_cls, &s_FutureType))
        return PyErr_Format(PyExc_TypeError, "_register: expected a TensorFuture subclass");
    s_future_cls = (PyTypeObject *)Py_NewRef(future_cls);
    s_mesh_cls = Py_NewRef(mesh_cls);
    s_placement_cls = Py_NewRef(placement_cls);
    s_dtype_code = Py_NewRef(dtype_code);
    Py_RETURN_NONE;
}

/* ---- captured op sequences ------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    dt_capture *g;
    PyObject *meshes;  /* tuple: the Python DeviceMesh of each output */
} s_Capture;

static void s_Capture_dealloc(s_Capture *self)
{
    dt_capture_release(&self->g);
    Py_CLEAR(self->meshes);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A list or tuple of DTensors as handles; n, or -1 with an exception. */
static Py_ssize_t s_tensor_list(const char *fn, PyObject *seq, dt_tensor **out, Py_ssize_t max)
{
    PyObject *fast = PySequence_Fast(seq, "expected a list of DTensors");
    if (!fast)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n > max) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_RuntimeError, "%s: %zd tensors; at most %zd", fn, n, max);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (s_arg_tensor(fn, (int)i, PySequence_Fast_GET_ITEM(fast, i), &out[i]) != 0) {
            Py_DECREF(fast);
            return -1;
        }
    Py_DECREF(fast);
    return n;
}

static PyObject *s_Capture_replay(s_Capture *self, PyObject *inputs)
{
    dt_tensor *in[32], *out[32];
    Py_ssize_t n = s_tensor_list("replay", inputs, in, 32);
    if (n < 0)
        return NULL;
    if (dt_capture_replay(self->g, in, (int)n, out) != 0)
        return s_raise();
    int nout = dt_capture_noutputs(self->g);
    PyObject *tuple = PyTuple_New(nout);
    for (int o = 0; o < nout; o++) {
        PyObject *t = tuple ? s_tensor_wrap(out[o], PyTuple_GET_ITEM(self->meshes, o)) : NULL;
        out[o] = NULL;
        if (!t) {
            for (int p = o + 1; p < nout; p++)
                dt_tensor_release(&out[p]);
            Py_CLEAR(tuple);
            break;
        }
        PyTuple_SET_ITEM(tuple, o, t);
    }
    return tuple;
}

static PyObject *s_Capture_get_num_records(s_Capture *self, void *unused)
{
    return PyLong_FromUnsignedLongLong(dt_capture_nrecords(self->g));
}

static PyObject *s_Capture_get_num_devices(s_Capture *self, void *unused)
{
    return PyLong_FromLong(dt_capture_ndevices(self->g));
}

static PyMethodDef s_Capture_methods[] = {
    {"_replay", (PyCFunction)s_Capture_replay, METH_O, "Run the captured ops on new inputs: a tuple of outputs."},
    {NULL},
};

static PyGetSetDef s_Capture_getset[] = {
    {"num_records", (getter)s_Capture_get_num_records, NULL, "Op records the devices keep, over all of them.", NULL},
    {"num_devices", (getter)s_Capture_get_num_devices, NULL, "Devices that keep records of it.", NULL},
    {NULL},
};

static PyTypeObject s_CaptureType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dtorch._C.Capture",
    .tp_basicsize = sizeof(s_Capture),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)s_Capture_dealloc,
    .tp_methods = s_Capture_methods,
    .tp_getset = s_Capture_getset,
    .tp_doc = "Op records kept on the devices, replayed by one record per device.",
};

/* _capture_begin(name, inputs) */
static PyObject *s_capture_begin(PyObject *mod, PyObject *args)
{
    const char *name;
    PyObject *inputs;
    dt_tensor *in[32];
    if (!PyArg_ParseTuple(args, "sO", &name, &inputs))
        return NULL;
    Py_ssize_t n = s_tensor_list("capture", inputs, in, 32);
    if (n < 0)
        return NULL;
    if (dt_capture_begin(name, in, (int)n) != 0)
        return s_raise();
    Py_RETURN_NONE;
}

/* _capture_end(outputs) -> Capture */
static PyObject *s_capture_end(PyObject *mod, PyObject *outputs)
{
    dt_tensor *out[32];
    Py_ssize_t n = s_tensor_list("capture", outputs, out, 32);
    if (n < 0) {
        dt_capture_abort();
        return NULL;
    }
    PyObject *fast = PySequence_Fast(outputs, "expected a list of DTensors");
    PyObject *meshes = fast ? PyTuple_New(n) : NULL;
    for (Py_ssize_t o = 0; meshes && o < n; o++)
        PyTuple_SET_ITEM(meshes, o, Py_NewRef(((s_Tensor *)PySequence_Fast_GET_ITEM(fast, o))->mesh));
    Py_XDECREF(fast);
    s_Capture *self = meshes ? (s_Capture *)s_CaptureType.tp_alloc(&s_CaptureType, 0) : NULL;
    if (!self) {
        Py_XDECREF(meshes);
        dt_capture_abort();
        return NULL;
    }
    self->meshes = meshes;
    if (dt_capture_end(out, (int)n, &self->g) != 0) {
        Py_DECREF(self);
        return s_raise();
    }
    return (PyObject *)self;
}

/* _next_failure(after, timeout) -> (number, device, reason) or None: dt_next_device_failure */
static PyObject *s_next_failure(PyObject *mod, PyObject *args)
{
    unsigned long long after;
    double timeout;
    if (!PyArg_ParseTuple(args, "Kd", &after, &timeout))
        return NULL;
    int64_t device = -1;
    char reason[256];
    uint64_t k = dt_next_device_failure(after, timeout, &device, reason, sizeof reason);
    if (k == 0)
        Py_RETURN_NONE;
    return Py_BuildValue("KLs", (unsigned long long)k, (long long)device, reason);
}

static PyObject *s_failure_count(PyObject *mod, PyObject *unused)
{
    return PyLong_FromUnsignedLongLong(dt_device_failures());
}

static PyObject *s_capture_abort(PyObject *mod, PyObject *unused)
{
    dt_capture_abort();
    Py_RETURN_NONE;
}

static PyObject *s_capture_made(PyObject *mod, PyObject *arg)
{
    dt_tensor *t;
    if (s_arg_tensor("capture", 0, arg, &t) != 0)
        return NULL;
    return PyBool_FromLong(dt_capture_made(t));
}

static PyMethodDef s_methods[] = {
    {"_make", (PyCFunction)(void (*)(void))s_make, METH_FASTCALL, NULL},
    {"_arange", (PyCFunction)(void (*)(void))s_arange, METH_FASTCALL, NULL},
    {"_distribute", s_distribute, METH_VARARGS, NULL},
    {"_from_local", s_from_local, METH_VARARGS, NULL},
    {"_redistribute", s_redistribute, METH_VARARGS, NULL},
    {"_redistribute_many", s_redistribute_many, METH_VARARGS, NULL},
    {"_redistribute_into", s_redistribute_into, METH_VARARGS, NULL},
    {"_redistribute_plan", s_redistribute_plan, METH_VARARGS, NULL},
    {"_op", (PyCFunction)(void (*)(void))s_op, METH_FASTCALL, NULL},
    {"_cut", s_cut, METH_VARARGS, NULL},
    {"_ring_attention", s_ring_attention, METH_VARARGS, NULL},
    {"_registry", s_registry, METH_NOARGS,
     "Every op: (name, id, inputs, outputs, signature kind, exports, float attributes, callable or None)."},
    {"set_strict", s_set_strict, METH_O, "Make ops raise instead of redistributing their inputs."},
    {"get_strict", s_get_strict, METH_NOARGS, NULL},
    {"init", s_init, METH_VARARGS,
     "Start the runtime: init(workers, worker_path[, listen, key, worker_key, insecure])."},
    {"listen_info", s_listen_info, METH_NOARGS, "(endpoint, public key) of a listening runtime."},
    {"_trace_start", s_trace_start, METH_O, "Every device of the mesh records its timeline."},
    {"_trace_stop", s_trace_stop, METH_O, "They stop: [events kept per device]."},
    {"_trace_events", s_trace_events, METH_VARARGS, "_trace_events(mesh, counts) -> bytes: every device's rows."},
    {"_record_name", s_record_name, METH_O, "The name of an op record's code."},
    {"_trace_host", s_trace_host, METH_NOARGS, "The controller's batches while tracing, as bytes."},
    {"_started_devices", s_started_devices, METH_NOARGS, "Ids of the devices whose workers serve now."},
    {"_device_type", s_device_type, METH_O, "_device_type(id) -> the device type a mesh gave it, or None."},
    {"wait_workers", s_wait_workers, METH_VARARGS, "wait_workers(ids, timeout): until their workers connected."},
    {"worker_info", s_worker_info, METH_VARARGS, "worker_info(id) -> (state, remote, host, pid, peer, reason)."},
    {"shutdown", s_shutdown, METH_NOARGS, "Stop the runtime and every device actor."},
    {"is_running", s_is_running, METH_NOARGS, NULL},
    {"manual_seed", s_manual_seed, METH_O, NULL},
    {"synchronize", s_synchronize, METH_NOARGS, NULL},
    {"_device_stats", s_device_stats, METH_VARARGS, "Every device's counters: _device_stats(mesh, reset_peak)."},
    {"_ops_submitted", s_ops_submitted, METH_NOARGS, "Submissions so far (ops, factories, fetches, redistributes)."},
    {"_register", s_register, METH_VARARGS, NULL},
    {"_next_failure", s_next_failure, METH_VARARGS, "The next device failure after a number, or None."},
    {"_failure_count", s_failure_count, METH_NOARGS, "The number of the latest device failure (0: none)."},
    {"_capture_begin", s_capture_begin, METH_VARARGS, "Start capturing: _capture_begin(name, inputs)."},
    {"_capture_end", s_capture_end, METH_O, "End the capture: _capture_end(outputs) -> Capture."},
    {"_capture_abort", s_capture_abort, METH_NOARGS, "End the capture, keeping nothing."},
    {"_capture_made", s_capture_made, METH_O, "Whether a DTensor was made inside a capture (holds no value)."},
    {NULL},
};

static struct PyModuleDef s_module = {
    PyModuleDef_HEAD_INIT, .m_name = "dtorch._C", .m_doc = "DTorch's C runtime.", .m_size = -1, .m_methods = s_methods,
};

PyMODINIT_FUNC PyInit__C(void)
{
    if (PyType_Ready(&s_MeshType) < 0 || PyType_Ready(&s_FutureType) < 0 || PyType_Ready(&s_ValueType) < 0 ||
        !(s_tensor_type = (PyTypeObject *)PyType_FromSpec(&s_tensor_spec)) || PyType_Ready(&s_OpType) < 0 ||
        PyType_Ready(&s_CaptureType) < 0 || s_registry_build() != 0)
        return NULL;
    PyObject *m = PyModule_Create(&s_module);
    if (!m)
        return NULL;
    PyObject *value_bases = PyTuple_Pack(2, PyExc_ValueError, PyExc_RuntimeError);
    PyObject *type_bases = PyTuple_Pack(2, PyExc_TypeError, PyExc_RuntimeError);
    s_value_error = value_bases ? PyErr_NewExceptionWithDoc("dtorch.DTorchValueError",
        "A bad argument value or shape (a ValueError, and a RuntimeError as PyTorch raises).", value_bases, NULL) : NULL;
    s_type_error = type_bases ? PyErr_NewExceptionWithDoc("dtorch.DTorchTypeError",
        "A bad dtype or argument type (a TypeError, and a RuntimeError as PyTorch raises).", type_bases, NULL) : NULL;
    PyObject *memory_bases = PyTuple_Pack(2, PyExc_MemoryError, PyExc_RuntimeError);
    s_memory_error = memory_bases ? PyErr_NewExceptionWithDoc("dtorch.OutOfMemoryError",
        "Not enough memory on a device (a MemoryError, and a RuntimeError as PyTorch raises).", memory_bases, NULL)
                                  : NULL;
    Py_XDECREF(value_bases);
    Py_XDECREF(type_bases);
    Py_XDECREF(memory_bases);
    if (!s_value_error || !s_type_error || !s_memory_error ||
        PyModule_AddObjectRef(m, "DTorchValueError", s_value_error) < 0 ||
        PyModule_AddObjectRef(m, "DTorchTypeError", s_type_error) < 0 ||
        PyModule_AddObjectRef(m, "OutOfMemoryError", s_memory_error) < 0 ||
        PyModule_AddObjectRef(m, "Mesh", (PyObject *)&s_MeshType) < 0 ||
        PyModule_AddObjectRef(m, "TensorFuture", (PyObject *)&s_FutureType) < 0 ||
        PyModule_AddObjectRef(m, "DTensor", (PyObject *)s_tensor_type) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    dt_set_wait_hooks(s_wait_enter, s_wait_leave, s_wait_interrupt);
    return m;
}
