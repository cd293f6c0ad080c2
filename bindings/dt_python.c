/* dtorch._C — the Python face of the C API: DTensor and TensorFuture handles, meshes, the
 * factories and the runtime calls. Python in dtorch/ adds names, argument parsing and
 * printing; everything that runs per op lives here, in C.
 *
 * Blocking waits release the GIL (wait hooks) and turn Ctrl-C into KeyboardInterrupt. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "dtorch.h"

/* ---- errors ------------------------------------------------------------------------------ */

/* Bad values and bad types are ValueError and TypeError to a Python user, and RuntimeError to
 * code written against PyTorch (which raises RuntimeError for shape and dtype mismatches): the
 * exceptions are both. */
static PyObject *s_value_error, *s_type_error;

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
    case DT_ENOMEM: type = PyExc_MemoryError; break;
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

/* ---- argument helpers --------------------------------------------------------------------- */

static int s_int64s(PyObject *seq, int64_t *out, int max, const char *what)
{
    PyObject *fast = PySequence_Fast(seq, what);
    if (!fast)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n > max) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_ValueError, "%s: at most %d entries, got %zd", what, max, n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        out[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
        if (out[i] == -1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return -1;
        }
    }
    Py_DECREF(fast);
    return (int)n;
}

/* placements: None or a sequence of (kind, dim, reduce_op) triples */
static int s_placements(PyObject *obj, dt_placement *out, int expected, const dt_placement **result)
{
    *result = NULL;
    if (obj == Py_None)
        return 0;
    PyObject *fast = PySequence_Fast(obj, "placements must be a sequence");
    if (!fast)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n != expected) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_ValueError,
                     "`placements` must have the same length as `device_mesh.ndim`! Found placements length: "
                     "%zd, and device_mesh.ndim: %d.", n, expected);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int kind, dim, op;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "iii", &kind, &dim, &op)) {
            Py_DECREF(fast);
            return -1;
        }
        out[i] = (dt_placement){kind, dim, op};
    }
    Py_DECREF(fast);
    *result = out;
    return 0;
}

static int s_scalar(PyObject *obj, dt_scalar *out)
{
    if (PyBool_Check(obj) || PyLong_Check(obj)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
        if (overflow) {
            PyErr_SetString(PyExc_OverflowError, "value does not fit in int64");
            return -1;
        }
        *out = (dt_scalar){true, v, (double)v};
        return 0;
    }
    double f = PyFloat_AsDouble(obj);
    if (f == -1.0 && PyErr_Occurred())
        return -1;
    *out = (dt_scalar){false, 0, f};
    return 0;
}

/* ---- Mesh --------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    dt_mesh *mesh;
} s_Mesh;

static int s_Mesh_init(s_Mesh *self, PyObject *args, PyObject *kw)
{
    const char *type;
    PyObject *shape_obj, *ids_obj, *names_obj = Py_None;
    if (!PyArg_ParseTuple(args, "sOO|O", &type, &shape_obj, &ids_obj, &names_obj))
        return -1;
    int64_t shape[DT_MAX_DIMS];
    int ndim = s_int64s(shape_obj, shape, DT_MAX_DIMS, "mesh shape");
    if (ndim < 0)
        return -1;
    Py_ssize_t nids = PySequence_Size(ids_obj);
    if (nids < 0)
        return -1;
    int64_t *ids = PyMem_Malloc((size_t)(nids ? nids : 1) * sizeof *ids);
    if (!ids || s_int64s(ids_obj, ids, (int)nids, "mesh ids") < 0) {
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

static PyTypeObject s_FutureType;
static PyTypeObject *s_future_cls = &s_FutureType; /* the Python subclass, once registered */

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

static PyTypeObject s_TensorType;
static PyTypeObject *s_tensor_cls = &s_TensorType;

static PyObject *s_tensor_wrap(dt_tensor *t, PyObject *mesh)
{
    if (!t)
        return s_raise();
    if (PyErr_Occurred()) {
        /* Ctrl-C during a backpressure wait: the op was queued, its result is dropped */
        dt_tensor_release(&t);
        return NULL;
    }
    s_Tensor *self = (s_Tensor *)s_tensor_cls->tp_alloc(s_tensor_cls, 0);
    if (!self) {
        dt_tensor_release(&t);
        return NULL;
    }
    self->t = t;
    self->mesh = Py_NewRef(mesh);
    return (PyObject *)self;
}

static void s_Tensor_dealloc(s_Tensor *self)
{
    dt_tensor_release(&self->t);
    Py_CLEAR(self->mesh);
    Py_CLEAR(self->shape);
    Py_TYPE(self)->tp_free((PyObject *)self);
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

static PyGetSetDef s_Tensor_getset[] = {
    {"shape", (getter)s_Tensor_get_shape, NULL, "The global shape.", NULL},
    {"ndim", (getter)s_Tensor_get_ndim, NULL, "Number of dims.", NULL},
    {"_dtype_code", (getter)s_Tensor_get_dtype_code, NULL, NULL, NULL},
    {"device_mesh", (getter)s_Tensor_get_mesh, NULL, "The DeviceMesh it lives on.", NULL},
    {"_placements_raw", (getter)s_Tensor_get_placements_raw, NULL, NULL, NULL},
    {NULL},
};

static PyMethodDef s_Tensor_methods[] = {
    {"future", (PyCFunction)s_Tensor_future, METH_NOARGS, "A TensorFuture of the whole value."},
    {"_locals_future", (PyCFunction)s_Tensor_locals_future, METH_NOARGS, "A TensorFuture of every piece."},
    {NULL},
};

/* ---- operators: straight into the op registry, the per-op hot path -------------------------- */

enum { S_ADD, S_SUB, S_MUL, S_DIV, S_POW, S_NEG, S_ABS, S_EQ, S_NE, S_LT, S_LE, S_GT, S_GE, S_AND, S_OR, S_NOT,
       S_MATMUL, S_NOPS };
static const char *s_op_names[S_NOPS] = {"add", "sub", "mul", "div", "pow", "neg", "abs", "eq", "ne", "lt",
                                         "le", "gt", "ge", "logical_and", "logical_or", "logical_not", "matmul"};
static int s_op_ids[S_NOPS];

static PyObject *s_run1(int op, dt_tensor *const *in, int n, const dt_op_attrs *attrs, PyObject *mesh)
{
    if (s_op_ids[op] < 0 && (s_op_ids[op] = dt_op_id(s_op_names[op])) < 0)
        return s_raise();
    dt_tensor *out[2];
    int made = dt_op_run(s_op_ids[op], n, in, attrs, 1, out);
    if (made < 0)
        return s_raise();
    return s_tensor_wrap(out[0], mesh);
}

/* a op b where either side may be a Python number; anything else is not ours to handle */
static PyObject *s_binary(int op, PyObject *a, PyObject *b)
{
    dt_op_attrs attrs;
    attrs.nints = 0;
    attrs.nfloats = 0;
    attrs.has_scalar = false;
    bool ta = PyObject_TypeCheck(a, &s_TensorType), tb = PyObject_TypeCheck(b, &s_TensorType);
    dt_tensor *in[2];
    if (ta && tb) {
        in[0] = ((s_Tensor *)a)->t;
        in[1] = ((s_Tensor *)b)->t;
        return s_run1(op, in, 2, &attrs, ((s_Tensor *)a)->mesh);
    }
    PyObject *number = ta ? b : a;
    if (!(PyLong_Check(number) || PyFloat_Check(number)))
        Py_RETURN_NOTIMPLEMENTED;
    if (s_scalar(number, &attrs.scalar) != 0)
        return NULL;
    attrs.has_scalar = true;
    if (!ta) {
        attrs.nints = 1;
        attrs.ints[0] = 1; /* the number is on the left */
    }
    s_Tensor *t = (s_Tensor *)(ta ? a : b);
    in[0] = t->t;
    return s_run1(op, in, 1, &attrs, t->mesh);
}

static PyObject *s_unary(int op, PyObject *a)
{
    dt_op_attrs attrs = {0};
    dt_tensor *in[1] = {((s_Tensor *)a)->t};
    return s_run1(op, in, 1, &attrs, ((s_Tensor *)a)->mesh);
}

static PyObject *s_nb_add(PyObject *a, PyObject *b) { return s_binary(S_ADD, a, b); }
static PyObject *s_nb_sub(PyObject *a, PyObject *b) { return s_binary(S_SUB, a, b); }
static PyObject *s_nb_mul(PyObject *a, PyObject *b) { return s_binary(S_MUL, a, b); }
static PyObject *s_nb_div(PyObject *a, PyObject *b) { return s_binary(S_DIV, a, b); }
static PyObject *s_nb_and(PyObject *a, PyObject *b) { return s_binary(S_AND, a, b); }
static PyObject *s_nb_or(PyObject *a, PyObject *b) { return s_binary(S_OR, a, b); }
static PyObject *s_nb_neg(PyObject *a) { return s_unary(S_NEG, a); }
static PyObject *s_nb_abs(PyObject *a) { return s_unary(S_ABS, a); }
static PyObject *s_nb_invert(PyObject *a) { return s_unary(S_NOT, a); }

static PyObject *s_nb_pow(PyObject *a, PyObject *b, PyObject *mod)
{
    if (mod != Py_None)
        Py_RETURN_NOTIMPLEMENTED;
    return s_binary(S_POW, a, b);
}

static PyObject *s_nb_matmul(PyObject *a, PyObject *b)
{
    if (!PyObject_TypeCheck(a, &s_TensorType) || !PyObject_TypeCheck(b, &s_TensorType))
        Py_RETURN_NOTIMPLEMENTED;
    return s_binary(S_MATMUL, a, b);
}

static PyObject *s_richcompare(PyObject *a, PyObject *b, int cmp)
{
    static const int ops[] = {[Py_LT] = S_LT, [Py_LE] = S_LE, [Py_EQ] = S_EQ,
                              [Py_NE] = S_NE, [Py_GT] = S_GT, [Py_GE] = S_GE};
    return s_binary(ops[cmp], a, b);
}

/* DTensors hash by identity, as torch tensors do, even though == builds a tensor */
static Py_hash_t s_hash(PyObject *self) { return (Py_hash_t)((uintptr_t)self >> 4); }

static PyNumberMethods s_Tensor_number = {
    .nb_add = s_nb_add,
    .nb_subtract = s_nb_sub,
    .nb_multiply = s_nb_mul,
    .nb_true_divide = s_nb_div,
    .nb_power = s_nb_pow,
    .nb_negative = s_nb_neg,
    .nb_absolute = s_nb_abs,
    .nb_invert = s_nb_invert,
    .nb_and = s_nb_and,
    .nb_or = s_nb_or,
    .nb_matrix_multiply = s_nb_matmul,
};

static PyTypeObject s_TensorType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dtorch._C.DTensor",
    .tp_basicsize = sizeof(s_Tensor),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_dealloc = (destructor)s_Tensor_dealloc,
    .tp_getset = s_Tensor_getset,
    .tp_methods = s_Tensor_methods,
    .tp_as_number = &s_Tensor_number,
    .tp_richcompare = s_richcompare,
    .tp_hash = s_hash,
    .tp_doc = "A tensor laid out over a DeviceMesh.",
};

/* ---- factories ---------------------------------------------------------------------------- */

/* Common head of every factory: (py_mesh, c_mesh, shape, dtype, placements, ...) */
typedef struct {
    PyObject *py_mesh;
    dt_mesh *mesh;
    int ndim;
    int64_t shape[DT_MAX_DIMS];
    int dtype;
    dt_placement storage[DT_MAX_DIMS];
    const dt_placement *placements;
} s_head;

static int s_parse_head(PyObject *py_mesh, PyObject *c_mesh, PyObject *shape, int dtype, PyObject *pl, s_head *h)
{
    if (!PyObject_TypeCheck(c_mesh, &s_MeshType)) {
        PyErr_SetString(PyExc_TypeError, "device_mesh must be a dtorch.DeviceMesh");
        return -1;
    }
    h->py_mesh = py_mesh;
    h->mesh = ((s_Mesh *)c_mesh)->mesh;
    h->dtype = dtype;
    if (shape != Py_None && (h->ndim = s_int64s(shape, h->shape, DT_MAX_DIMS, "size")) < 0)
        return -1;
    return s_placements(pl, h->storage, dt_mesh_ndim(h->mesh), &h->placements);
}

/* _make(kind, py_mesh, c_mesh, shape, dtype, placements, value): kind in
 * "full" "zeros" "ones" "empty" "rand" "randn" (value is used by "full" only) */
static PyObject *s_make(PyObject *mod, PyObject *args)
{
    const char *kind;
    PyObject *py_mesh, *c_mesh, *shape, *pl, *value;
    int dtype;
    s_head h;
    dt_scalar v = {true, 0, 0.0};
    if (!PyArg_ParseTuple(args, "sOOOiOO", &kind, &py_mesh, &c_mesh, &shape, &dtype, &pl, &value) ||
        s_parse_head(py_mesh, c_mesh, shape, dtype, pl, &h) != 0)
        return NULL;
    dt_tensor *t;
    if (strcmp(kind, "full") == 0) {
        if (s_scalar(value, &v) != 0)
            return NULL;
        t = dt_full(h.mesh, h.ndim, h.shape, (dt_dtype)dtype, h.placements, v);
    } else if (strcmp(kind, "zeros") == 0) {
        t = dt_zeros(h.mesh, h.ndim, h.shape, (dt_dtype)dtype, h.placements);
    } else if (strcmp(kind, "ones") == 0) {
        t = dt_ones(h.mesh, h.ndim, h.shape, (dt_dtype)dtype, h.placements);
    } else if (strcmp(kind, "empty") == 0) {
        t = dt_empty(h.mesh, h.ndim, h.shape, (dt_dtype)dtype, h.placements);
    } else if (strcmp(kind, "rand") == 0) {
        t = dt_rand(h.mesh, h.ndim, h.shape, (dt_dtype)dtype, h.placements);
    } else if (strcmp(kind, "randn") == 0) {
        t = dt_randn(h.mesh, h.ndim, h.shape, (dt_dtype)dtype, h.placements);
    } else {
        return PyErr_Format(PyExc_ValueError, "unknown factory '%s'", kind);
    }
    return s_tensor_wrap(t, py_mesh);
}

/* _arange(py_mesh, c_mesh, start, end, step, dtype, placements) */
static PyObject *s_arange(PyObject *mod, PyObject *args)
{
    PyObject *py_mesh, *c_mesh, *start_o, *end_o, *step_o, *pl;
    int dtype;
    s_head h;
    dt_scalar start, end, step;
    if (!PyArg_ParseTuple(args, "OOOOOiO", &py_mesh, &c_mesh, &start_o, &end_o, &step_o, &dtype, &pl) ||
        s_parse_head(py_mesh, c_mesh, Py_None, dtype, pl, &h) != 0 || s_scalar(start_o, &start) != 0 ||
        s_scalar(end_o, &end) != 0 || s_scalar(step_o, &step) != 0)
        return NULL;
    return s_tensor_wrap(dt_arange(h.mesh, start, end, step, (dt_dtype)dtype, h.placements), py_mesh);
}

/* _distribute(py_mesh, c_mesh, array, dtype, placements): array exports a strided buffer */
static PyObject *s_distribute(PyObject *mod, PyObject *args)
{
    PyObject *py_mesh, *c_mesh, *array, *pl;
    int dtype;
    s_head h;
    if (!PyArg_ParseTuple(args, "OOOiO", &py_mesh, &c_mesh, &array, &dtype, &pl) ||
        s_parse_head(py_mesh, c_mesh, Py_None, dtype, pl, &h) != 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(array, &view, PyBUF_STRIDES) != 0)
        return NULL;
    if (view.ndim > DT_MAX_DIMS || (size_t)view.itemsize != dt_dtype_size((dt_dtype)dtype)) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "distribute_tensor: unsupported array (%d dims, %zd-byte items)",
                            view.ndim, view.itemsize);
    }
    int64_t shape[DT_MAX_DIMS], strides[DT_MAX_DIMS];
    for (int d = 0; d < view.ndim; d++) {
        shape[d] = view.shape[d];
        strides[d] = view.strides[d];
    }
    /* the GIL stays held: a full queue makes the runtime release it through the wait hooks */
    dt_tensor *t = dt_distribute(h.mesh, view.buf, view.ndim, shape, strides, (dt_dtype)dtype, h.placements);
    PyBuffer_Release(&view);
    return s_tensor_wrap(t, py_mesh);
}

/* _from_local(py_mesh, c_mesh, arrays, dtype, placements, shape or None): C-contiguous arrays */
static PyObject *s_from_local(PyObject *mod, PyObject *args)
{
    PyObject *py_mesh, *c_mesh, *arrays, *pl, *shape_o;
    int dtype;
    s_head h;
    if (!PyArg_ParseTuple(args, "OOOiOO", &py_mesh, &c_mesh, &arrays, &dtype, &pl, &shape_o) ||
        s_parse_head(py_mesh, c_mesh, shape_o, dtype, pl, &h) != 0)
        return NULL;
    Py_ssize_t n = PySequence_Size(arrays);
    if (n < 0)
        return NULL;
    if (n != dt_mesh_size(h.mesh))
        return PyErr_Format(PyExc_ValueError, "from_local: %zd local pieces for a mesh of %lld devices", n,
                            (long long)dt_mesh_size(h.mesh));
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
        PyObject *a = PySequence_GetItem(arrays, got);
        int rc = a ? PyObject_GetBuffer(a, &views[got], PyBUF_C_CONTIGUOUS) : -1;
        Py_XDECREF(a);
        if (rc != 0)
            goto done;
        if (ndim < 0)
            ndim = views[got].ndim;
        if (views[got].ndim != ndim || ndim > DT_MAX_DIMS) {
            got++;
            PyErr_SetString(PyExc_ValueError, "from_local: every local piece needs the same number of dims");
            goto done;
        }
        data[got] = views[got].buf;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        for (int d = 0; d < ndim; d++)
            locals[i * ndim + d] = views[i].shape[d];
    if (shape_o != Py_None && h.ndim != ndim) {
        PyErr_Format(PyExc_ValueError, "from_local: shape has %d dims but the local pieces have %d", h.ndim, ndim);
        goto done;
    }
    result = s_tensor_wrap(dt_from_local(h.mesh, data, ndim < 0 ? 0 : ndim, locals, (dt_dtype)dtype, h.placements,
                                         shape_o != Py_None ? h.shape : NULL),
                           py_mesh);
done:
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(data);
    PyMem_Free(locals);
    return result;
}

/* ---- redistribute ------------------------------------------------------------------------- */

/* The target of a redistribute: (py_mesh, c_mesh) or (None, None) for the tensor's own mesh. */
static int s_target(PyObject *c_mesh, dt_mesh **mesh)
{
    *mesh = NULL;
    if (c_mesh == Py_None)
        return 0;
    if (!PyObject_TypeCheck(c_mesh, &s_MeshType)) {
        PyErr_SetString(PyExc_TypeError, "device_mesh must be a dtorch.DeviceMesh");
        return -1;
    }
    *mesh = ((s_Mesh *)c_mesh)->mesh;
    return 0;
}

static int s_tensor_arg(PyObject *obj, dt_tensor **t)
{
    if (!PyObject_TypeCheck(obj, &s_TensorType)) {
        PyErr_Format(PyExc_TypeError, "expected a DTensor, got %s", Py_TYPE(obj)->tp_name);
        return -1;
    }
    *t = ((s_Tensor *)obj)->t;
    return 0;
}

/* _redistribute(tensor, py_mesh, c_mesh, placements) */
static PyObject *s_redistribute(PyObject *mod, PyObject *args)
{
    PyObject *tensor, *py_mesh, *c_mesh, *pl;
    dt_tensor *t;
    dt_mesh *mesh;
    dt_placement storage[DT_MAX_DIMS];
    const dt_placement *placements;
    if (!PyArg_ParseTuple(args, "OOOO", &tensor, &py_mesh, &c_mesh, &pl) || s_tensor_arg(tensor, &t) != 0 ||
        s_target(c_mesh, &mesh) != 0 ||
        s_placements(pl, storage, dt_mesh_ndim(mesh ? mesh : dt_tensor_mesh(t)), &placements) != 0)
        return NULL;
    return s_tensor_wrap(dt_redistribute(t, mesh, placements), mesh ? py_mesh : ((s_Tensor *)tensor)->mesh);
}

/* _redistribute_many(tensors, py_mesh, c_mesh, placements per tensor) */
static PyObject *s_redistribute_many(PyObject *mod, PyObject *args)
{
    PyObject *tensors, *py_mesh, *c_mesh, *pls;
    dt_mesh *mesh;
    if (!PyArg_ParseTuple(args, "OOOO", &tensors, &py_mesh, &c_mesh, &pls) || s_target(c_mesh, &mesh) != 0)
        return NULL;
    Py_ssize_t n = PySequence_Size(tensors);
    if (n < 0 || PySequence_Size(pls) != n) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "redistribute_many: one placements list per tensor");
        return NULL;
    }
    dt_tensor **in = PyMem_Calloc((size_t)(n ? n : 1), sizeof *in), **out = PyMem_Calloc((size_t)(n ? n : 1), sizeof *out);
    PyObject **objs = PyMem_Calloc((size_t)(n ? n : 1), sizeof *objs);
    dt_placement *placements = PyMem_Calloc((size_t)(n ? n : 1) * DT_MAX_DIMS, sizeof *placements);
    PyObject *result = NULL;
    if (!in || !out || !objs || !placements) {
        PyErr_NoMemory();
        goto done;
    }
    int stride = mesh ? dt_mesh_ndim(mesh) : -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        objs[i] = PySequence_GetItem(tensors, i);
        if (!objs[i] || s_tensor_arg(objs[i], &in[i]) != 0)
            goto done;
        int ndim = mesh ? stride : dt_mesh_ndim(dt_tensor_mesh(in[i]));
        if (stride < 0)
            stride = ndim;
        else if (ndim != stride) {
            PyErr_SetString(PyExc_ValueError, "redistribute_many: without device_mesh, every tensor's mesh needs "
                                              "the same number of dims");
            goto done;
        }
        PyObject *pl = PySequence_GetItem(pls, i);
        const dt_placement *given;
        int rc = pl ? s_placements(pl, placements + i * stride, stride, &given) : -1;
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
        PyObject *wrapped = result ? s_tensor_wrap(out[i], mesh ? py_mesh : ((s_Tensor *)objs[i])->mesh) : NULL;
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
    for (Py_ssize_t i = 0; objs && i < n; i++)
        Py_XDECREF(objs[i]);
    PyMem_Free(in);
    PyMem_Free(out);
    PyMem_Free(objs);
    PyMem_Free(placements);
    return result;
}

/* _redistribute_plan(tensor, c_mesh, placements) -> [(kind, mesh_dim, remote_elements)] */
static PyObject *s_redistribute_plan(PyObject *mod, PyObject *args)
{
    PyObject *tensor, *c_mesh, *pl;
    dt_tensor *t;
    dt_mesh *mesh;
    dt_placement storage[DT_MAX_DIMS];
    const dt_placement *placements;
    if (!PyArg_ParseTuple(args, "OOO", &tensor, &c_mesh, &pl) || s_tensor_arg(tensor, &t) != 0 ||
        s_target(c_mesh, &mesh) != 0 ||
        s_placements(pl, storage, dt_mesh_ndim(mesh ? mesh : dt_tensor_mesh(t)), &placements) != 0)
        return NULL;
    dt_plan_step steps[DT_MAX_DIMS + 1];
    int n = dt_redistribute_plan(t, mesh, placements, steps, DT_MAX_DIMS + 1);
    if (n < 0)
        return s_raise();
    PyObject *list = PyList_New(n);
    for (int i = 0; list && i < n; i++)
        PyList_SET_ITEM(list, i, Py_BuildValue("siL", steps[i].kind, steps[i].mesh_dim,
                                               (long long)steps[i].remote_elements));
    return list;
}

/* ---- ops ---------------------------------------------------------------------------------- */

/* _op(name, inputs, ints, floats, scalar) -> DTensor, or a tuple of them for several outputs.
 * ints/floats: tuples (or None); scalar: a number or None. */
static PyObject *s_op(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyUnicode_Check(args[0]) || !PyTuple_Check(args[1]))
        return PyErr_Format(PyExc_TypeError, "_op(name, inputs, ints, floats, scalar)");
    const char *name = PyUnicode_AsUTF8(args[0]);
    Py_ssize_t n = PyTuple_GET_SIZE(args[1]);
    if (!name || n > 32)
        return name ? PyErr_Format(PyExc_ValueError, "%s: too many tensor inputs", name) : NULL;
    dt_tensor *in[32];
    for (Py_ssize_t i = 0; i < n; i++)
        if (s_tensor_arg(PyTuple_GET_ITEM(args[1], i), &in[i]) != 0)
            return NULL;
    dt_op_attrs attrs = {0};
    if (args[2] != Py_None && (attrs.nints = s_int64s(args[2], attrs.ints, 16, "op attributes")) < 0)
        return NULL;
    if (args[3] != Py_None) {
        PyObject *fast = PySequence_Fast(args[3], "op attributes");
        if (!fast)
            return NULL;
        attrs.nfloats = (int)PySequence_Fast_GET_SIZE(fast);
        for (int i = 0; i < attrs.nfloats && i < 4; i++)
            attrs.floats[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(fast, i));
        Py_DECREF(fast);
        if (attrs.nfloats > 4)
            return PyErr_Format(PyExc_ValueError, "%s: too many attributes", name);
        if (PyErr_Occurred())
            return NULL;
    }
    if (args[4] != Py_None) {
        if (s_scalar(args[4], &attrs.scalar) != 0)
            return NULL;
        attrs.has_scalar = true;
    }
    dt_tensor *out[2];
    int made = dt_op(name, (int)n, in, &attrs, 2, out);
    if (made < 0)
        return s_raise();
    PyObject *mesh = n > 0 ? ((s_Tensor *)PyTuple_GET_ITEM(args[1], 0))->mesh : Py_None;
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

static PyObject *s_set_strict(PyObject *mod, PyObject *arg)
{
    int strict = PyObject_IsTrue(arg);
    if (strict < 0)
        return NULL;
    dt_set_strict(strict);
    Py_RETURN_NONE;
}

static PyObject *s_get_strict(PyObject *mod, PyObject *unused) { return PyBool_FromLong(dt_get_strict()); }

/* ---- runtime ------------------------------------------------------------------------------ */

static PyObject *s_init(PyObject *mod, PyObject *args)
{
    int workers;
    const char *path = NULL;
    if (!PyArg_ParseTuple(args, "iz", &workers, &path))
        return NULL;
    dt_config config = {(dt_workers)workers, path};
    if (dt_init(&config) != 0)
        return s_raise();
    Py_RETURN_NONE;
}

static PyObject *s_shutdown(PyObject *mod, PyObject *unused)
{
    dt_shutdown();
    Py_RETURN_NONE;
}

static PyObject *s_is_running(PyObject *mod, PyObject *unused) { return PyBool_FromLong(dt_is_running()); }

static PyObject *s_current_workers(PyObject *mod, PyObject *unused)
{
    return PyUnicode_FromString(dt_current_workers() == DT_WORKERS_PROCESS ? "process" : "thread");
}

static PyObject *s_manual_seed(PyObject *mod, PyObject *arg)
{
    unsigned long long seed = PyLong_AsUnsignedLongLongMask(arg);
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

/* _register(DTensor subclass, TensorFuture subclass): the classes handles are made as */
static PyObject *s_register(PyObject *mod, PyObject *args)
{
    PyTypeObject *tensor_cls, *future_cls;
    if (!PyArg_ParseTuple(args, "O!O!", &PyType_Type, &tensor_cls, &PyType_Type, &future_cls))
        return NULL;
    if (!PyType_IsSubtype(tensor_cls, &s_TensorType) || !PyType_IsSubtype(future_cls, &s_FutureType))
        return PyErr_Format(PyExc_TypeError, "_register: expected DTensor and TensorFuture subclasses");
    Py_INCREF(tensor_cls);
    Py_INCREF(future_cls);
    s_tensor_cls = tensor_cls;
    s_future_cls = future_cls;
    Py_RETURN_NONE;
}

static PyMethodDef s_methods[] = {
    {"_make", s_make, METH_VARARGS, NULL},
    {"_arange", s_arange, METH_VARARGS, NULL},
    {"_distribute", s_distribute, METH_VARARGS, NULL},
    {"_from_local", s_from_local, METH_VARARGS, NULL},
    {"_redistribute", s_redistribute, METH_VARARGS, NULL},
    {"_op", (PyCFunction)(void (*)(void))s_op, METH_FASTCALL, NULL},
    {"set_strict", s_set_strict, METH_O, "Make ops raise instead of redistributing their inputs."},
    {"get_strict", s_get_strict, METH_NOARGS, NULL},
    {"_redistribute_many", s_redistribute_many, METH_VARARGS, NULL},
    {"_redistribute_plan", s_redistribute_plan, METH_VARARGS, NULL},
    {"init", s_init, METH_VARARGS, "Start the runtime: init(workers, worker_path)."},
    {"shutdown", s_shutdown, METH_NOARGS, "Stop the runtime and every device actor."},
    {"is_running", s_is_running, METH_NOARGS, NULL},
    {"current_workers", s_current_workers, METH_NOARGS, NULL},
    {"manual_seed", s_manual_seed, METH_O, NULL},
    {"synchronize", s_synchronize, METH_NOARGS, NULL},
    {"_ops_submitted", s_ops_submitted, METH_NOARGS, "Submissions so far (ops, factories, fetches, redistributes)."},
    {"_register", s_register, METH_VARARGS, NULL},
    {NULL},
};

static struct PyModuleDef s_module = {
    PyModuleDef_HEAD_INIT, .m_name = "dtorch._C", .m_doc = "DTorch's C runtime.", .m_size = -1, .m_methods = s_methods,
};

PyMODINIT_FUNC PyInit__C(void)
{
    if (PyType_Ready(&s_MeshType) < 0 || PyType_Ready(&s_FutureType) < 0 || PyType_Ready(&s_ValueType) < 0 ||
        PyType_Ready(&s_TensorType) < 0)
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
    Py_XDECREF(value_bases);
    Py_XDECREF(type_bases);
    if (!s_value_error || !s_type_error || PyModule_AddObjectRef(m, "DTorchValueError", s_value_error) < 0 ||
        PyModule_AddObjectRef(m, "DTorchTypeError", s_type_error) < 0 ||
        PyModule_AddObjectRef(m, "Mesh", (PyObject *)&s_MeshType) < 0 ||
        PyModule_AddObjectRef(m, "TensorFuture", (PyObject *)&s_FutureType) < 0 ||
        PyModule_AddObjectRef(m, "DTensor", (PyObject *)&s_TensorType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    dt_set_wait_hooks(s_wait_enter, s_wait_leave, s_wait_interrupt);
    for (int i = 0; i < S_NOPS; i++)
        s_op_ids[i] = -1; /* looked up on first use */
    return m;
}
