/* dtorch.DTensor: a handle to a dt_tensor and the Python DeviceMesh it lives on. Its attributes,
 * Python's operators and the views a model calls most are written here in C, on the per-op hot
 * path; indexing is dtpy_index.c; dtorch adds the rest in Python (_tensor.py) and the registry
 * its ops as methods (dtpy_ops.c). */
#include <string.h>

#include "dtpy.h"

PyTypeObject *dtpy_tensor_type;

/* DTensor objects freed lately, kept for the next ones: a loop of views or small ops drops each
 * result as it makes the next, and this spares the allocator both ways */
#define S_TENSOR_SPARES 64
static dtpy_Tensor *s_tensor_spare[S_TENSOR_SPARES];
static int s_tensor_spare_count;

PyObject *dtpy_tensor_wrap(dt_tensor *t, PyObject *mesh)
{
    if (!t)
        return dtpy_raise();
    if (PyErr_Occurred()) {
        /* Ctrl-C during a backpressure wait: the op was queued, its result is dropped */
        dt_tensor_release(&t);
        return NULL;
    }
    /* A DTensor refers to its mesh and a tuple of ints only: no cycle runs through it, so its type
     * is not one the cycle collector tracks (no GC header, no collection set off by a loop of
     * views), and an op's result is the type itself, not a Python subclass of it (whose instances
     * would be tracked, and freed through the subclass's generic deallocation) */
    dtpy_Tensor *self;
    if (s_tensor_spare_count > 0) {
        self = s_tensor_spare[--s_tensor_spare_count];
        PyObject_Init((PyObject *)self, dtpy_tensor_type);
        self->shape = NULL;
    } else if (!(self = (dtpy_Tensor *)dtpy_tensor_type->tp_alloc(dtpy_tensor_type, 0))) {
        dt_tensor_release(&t);
        return NULL;
    }
    self->t = t;
    self->mesh = Py_NewRef(mesh);
    return (PyObject *)self;
}

static void s_Tensor_dealloc(dtpy_Tensor *self)
{
    PyTypeObject *type = Py_TYPE(self); /* a heap type: each instance holds a reference to it */
    dt_tensor_release(&self->t);
    Py_CLEAR(self->mesh);
    Py_CLEAR(self->shape);
    if (type == dtpy_tensor_type && s_tensor_spare_count < S_TENSOR_SPARES)
        s_tensor_spare[s_tensor_spare_count++] = self; /* the GIL guards the list */
    else
        type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static PyObject *s_Tensor_get_shape(dtpy_Tensor *self, void *unused)
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

static PyObject *s_Tensor_get_ndim(dtpy_Tensor *self, void *unused) { return PyLong_FromLong(dt_tensor_ndim(self->t)); }

static PyObject *s_Tensor_get_dtype_code(dtpy_Tensor *self, void *unused)
{
    return PyLong_FromLong(dt_tensor_dtype(self->t));
}

static PyObject *s_Tensor_get_mesh(dtpy_Tensor *self, void *unused) { return Py_NewRef(self->mesh); }

static PyObject *s_Tensor_get_placements_raw(dtpy_Tensor *self, void *unused)
{
    int n = dt_mesh_ndim(dt_tensor_mesh(self->t));
    const dt_placement *pl = dt_tensor_placements(self->t);
    PyObject *tuple = PyTuple_New(n);
    for (int i = 0; tuple && i < n; i++)
        PyTuple_SET_ITEM(tuple, i, Py_BuildValue("iii", pl[i].kind, pl[i].dim, pl[i].reduce_op));
    return tuple;
}

static PyObject *s_Tensor_future(dtpy_Tensor *self, PyObject *unused)
{
    return dtpy_future_wrap(dt_tensor_fetch(self->t));
}

static PyObject *s_Tensor_locals_future(dtpy_Tensor *self, PyObject *unused)
{
    return dtpy_future_wrap(dt_tensor_fetch_locals(self->t));
}

static PyObject *s_Tensor_get_requires_grad(dtpy_Tensor *self, void *unused) { Py_RETURN_FALSE; }

static PyObject *s_Tensor_get_contiguous(dtpy_Tensor *self, void *unused)
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

/* made new tensors as one DTensor, or a tuple of them */
static PyObject *s_wrap_all(int made, dt_tensor **out, PyObject *mesh)
{
    if (made == 1)
        return dtpy_tensor_wrap(out[0], mesh);
    PyObject *tuple = PyTuple_New(made);
    for (int o = 0; o < made; o++) {
        PyObject *t = tuple ? dtpy_tensor_wrap(out[o], mesh) : NULL;
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

PyObject *dtpy_tensor_run(int id, int n, dt_tensor *const *in, const dt_op_attrs *attrs, PyObject *mesh)
{
    dt_tensor *out[2];
    int made = dt_op_run(id, n, in, attrs, 2, out);
    return made < 0 ? dtpy_raise() : s_wrap_all(made, out, mesh);
}

/* a op b where either side may be a Python number (attrs.scalar; ints[0] = 1: on the left).
 * NULL without an exception when neither is a DTensor or the other is not a number. */
PyObject *dtpy_tensor_binary(int id, PyObject *a, PyObject *b)
{
    dt_op_attrs attrs;
    attrs.nints = 0;
    attrs.nfloats = 0;
    attrs.has_scalar = false;
    bool ta = PyObject_TypeCheck(a, dtpy_tensor_type), tb = PyObject_TypeCheck(b, dtpy_tensor_type);
    dt_tensor *in[2];
    if (ta && tb) {
        in[0] = ((dtpy_Tensor *)a)->t;
        in[1] = ((dtpy_Tensor *)b)->t;
        return dtpy_tensor_run(id, 2, in, &attrs, ((dtpy_Tensor *)a)->mesh);
    }
    if (!ta && !tb)
        return NULL;
    if (dtpy_arg_try_number(ta ? b : a, &attrs.scalar, NULL) != 1)
        return NULL;
    attrs.has_scalar = true;
    if (!ta) {
        attrs.nints = 1;
        attrs.ints[0] = 1;
    }
    dtpy_Tensor *t = (dtpy_Tensor *)(ta ? a : b);
    in[0] = t->t;
    return dtpy_tensor_run(id, 1, in, &attrs, t->mesh);
}

/* the ids of the ops behind Python's operators (the op table's operator column names them) and of
 * matmul, reshape and permute, looked up at import */
enum { S_ADD, S_SUB, S_MUL, S_DIV, S_FLOORDIV, S_MOD, S_POW, S_NEG, S_ABS, S_EQ, S_NE, S_LT, S_LE, S_GT, S_GE,
       S_AND, S_OR, S_NOT, S_MATMUL, S_RESHAPE, S_PERMUTE, S_NOPS };
static const char *const s_operator_ops[S_NOPS] = {
    "__add__", "__sub__", "__mul__", "__truediv__", "__floordiv__", "__mod__", "__pow__", "__neg__", "__abs__",
    "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__and__", "__or__", "__invert__",
    "matmul", "reshape", "permute"};
static int s_operator_ids[S_NOPS];

static PyObject *s_operator(int op, PyObject *a, PyObject *b)
{
    PyObject *r = dtpy_tensor_binary(s_operator_ids[op], a, b);
    if (!r && !PyErr_Occurred())
        Py_RETURN_NOTIMPLEMENTED;
    return r;
}

static PyObject *s_unary(int op, PyObject *a)
{
    dt_op_attrs attrs = {0};
    dt_tensor *in[1] = {((dtpy_Tensor *)a)->t};
    return dtpy_tensor_run(s_operator_ids[op], 1, in, &attrs, ((dtpy_Tensor *)a)->mesh);
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
        if (PyObject_TypeCheck(args[0], dtpy_tensor_type) || PyUnicode_Check(args[0]) ||
            !(seq = PySequence_Fast(args[0], ""))) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s(): argument '%s' must be tuple of ints, not %s", fn, what,
                         dtpy_arg_type_name(args[0]));
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
        if (dtpy_arg_is_bool(items[i]) || !PyIndex_Check(items[i])) {
            PyErr_Format(PyExc_TypeError, "%s(): argument '%s' must be tuple of ints, but found element of type %s "
                         "at pos %zd", fn, what, dtpy_arg_type_name(items[i]), i);
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
    dt_tensor *in[1] = {((dtpy_Tensor *)self)->t};
    return dtpy_tensor_run(s_operator_ids[S_RESHAPE], 1, in, &attrs, ((dtpy_Tensor *)self)->mesh);
}

/* x.permute(*dims), x.transpose(dim0, dim1) and x.t() in C, for the same reason: attention
 * transposes three times a layer, and the Python wrappers cost several times the op (a view made
 * on the controller). */
static PyObject *s_Tensor_permute(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    dt_op_attrs attrs;
    if (s_ints_arg("permute", "dims", args, nargs, &attrs) != 0)
        return NULL;
    dt_tensor *in[1] = {((dtpy_Tensor *)self)->t};
    return dtpy_tensor_run(s_operator_ids[S_PERMUTE], 1, in, &attrs, ((dtpy_Tensor *)self)->mesh);
}

/* dim normalised for ndim dims (a 0-d tensor takes -1 and 0), as torch: 0, or -1 with the error */
static int s_dim_arg(const char *fn, PyObject *o, int ndim, int *out)
{
    if (!PyLong_CheckExact(o) && (dtpy_arg_is_bool(o) || !PyIndex_Check(o))) {
        PyErr_Format(PyExc_TypeError, "%s(): dim must be an int, got %s", fn, dtpy_arg_type_name(o));
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
static PyObject *s_permuted(dtpy_Tensor *x, int ndim, const int64_t *perm)
{
    dt_op_attrs attrs;
    attrs.nints = ndim;
    attrs.nfloats = 0;
    attrs.has_scalar = false;
    memcpy(attrs.ints, perm, (size_t)ndim * sizeof *perm);
    dt_tensor *in[1] = {x->t};
    return dtpy_tensor_run(s_operator_ids[S_PERMUTE], 1, in, &attrs, x->mesh);
}

/* self with dims d0 and d1 (in range) swapped: a permute */
static PyObject *s_swapped(PyObject *self, int d0, int d1)
{
    int ndim = dt_tensor_ndim(((dtpy_Tensor *)self)->t);
    if (ndim == 0)
        return Py_NewRef(self);
    int64_t perm[DT_MAX_DIMS];
    for (int d = 0; d < ndim; d++)
        perm[d] = d;
    perm[d0] = d1;
    perm[d1] = d0;
    return s_permuted((dtpy_Tensor *)self, ndim, perm);
}

static PyObject *s_transpose(const char *fn, PyObject *self, PyObject *dim0, PyObject *dim1)
{
    int ndim = dt_tensor_ndim(((dtpy_Tensor *)self)->t), d0, d1;
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
    int ndim = dt_tensor_ndim(((dtpy_Tensor *)self)->t);
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
    int ndim = dt_tensor_ndim(((dtpy_Tensor *)self)->t);
    if (ndim < 2)
        return Py_NewRef(self);
    int64_t perm[DT_MAX_DIMS];
    for (int d = 0; d < ndim; d++)
        perm[d] = ndim - 1 - d;
    return s_permuted((dtpy_Tensor *)self, ndim, perm);
}

static PyObject *s_Tensor_get_mT(PyObject *self, void *closure)
{
    (void)closure;
    int ndim = dt_tensor_ndim(((dtpy_Tensor *)self)->t);
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
    if (!PyObject_TypeCheck(a, dtpy_tensor_type) || !PyObject_TypeCheck(b, dtpy_tensor_type))
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
    {Py_mp_subscript, dtpy_index_getitem},
    {Py_tp_richcompare, s_richcompare},
    {Py_tp_hash, s_hash},
    {Py_tp_doc, "A tensor laid out over a DeviceMesh with one placement per mesh dim."},
    {0, NULL},
};

/* Mutable (no Py_TPFLAGS_IMMUTABLETYPE): dtorch sets its Python-written methods on it */
static PyType_Spec s_tensor_spec = {
    .name = "dtorch.DTensor",
    .basicsize = sizeof(dtpy_Tensor),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .slots = s_tensor_slots,
};

/* DTensor made from its spec, and the ids of the ops behind its operators */
int dtpy_tensor_init(PyObject *m)
{
    if (!(dtpy_tensor_type = (PyTypeObject *)PyType_FromSpec(&s_tensor_spec)))
        return -1;
    for (int op = 0; op < S_NOPS; op++)
        if ((s_operator_ids[op] = dt_op_id(s_operator_ops[op])) < 0) {
            dtpy_raise();
            return -1;
        }
    return PyModule_AddObjectRef(m, "DTensor", (PyObject *)dtpy_tensor_type) < 0 ? -1 : 0;
}
