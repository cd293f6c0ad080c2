/* The ops of the registry as Python callables, and the calls that run any op: _op (raw attributes),
 * _cut (split, chunk, unbind), _ring_attention, _halo_conv2d and _halo_interpolate, and set_strict
 * (raise rather than redistribute).
 *
 * One Op per registry row that says how Python calls it (dt_op_info.sig): dtorch.<name>,
 * DTensor.<name> (an Op binds as a method, like a function) and nn.functional.<name>. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtpy.h"

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
    if (dtpy_arg_bind(op->name, op->params, op->nparams, op->nparams, args, PyVectorcall_NARGS(nargsf), kwnames,
                      v) != 0)
        return NULL;
    for (int i = 0; i < (op->sig == DT_SIG_BINARY ? 2 : 1); i++)
        if (!v[i])
            return PyErr_Format(PyExc_TypeError, "%s() missing required argument '%U'", op->name, op->params[i]);
    if (op->sig == DT_SIG_BINARY) {
        PyObject *r = dtpy_tensor_binary(op->id, v[0], v[1]);
        if (r || PyErr_Occurred())
            return r;
        bool ta = PyObject_TypeCheck(v[0], dtpy_tensor_type), tb = PyObject_TypeCheck(v[1], dtpy_tensor_type);
        if (!ta && !tb)
            return PyErr_Format(PyExc_TypeError, "%s(): expected a DTensor, got %s and %s (distribute arrays with "
                                "dtorch.distribute_tensor first)", op->name, dtpy_arg_type_name(v[0]),
                                dtpy_arg_type_name(v[1]));
        return PyErr_Format(PyExc_TypeError, "%s(): expected a DTensor or a number, got %s (distribute arrays with "
                            "dtorch.distribute_tensor first)", op->name, dtpy_arg_type_name(ta ? v[1] : v[0]));
    }
    dt_tensor *in[1];
    if (!PyObject_TypeCheck(v[0], dtpy_tensor_type))
        return PyErr_Format(PyExc_TypeError, "%s(): expected a DTensor, got %s (distribute arrays with "
                            "dtorch.distribute_tensor first)", op->name, dtpy_arg_type_name(v[0]));
    in[0] = ((dtpy_Tensor *)v[0])->t;
    dt_op_attrs attrs;
    attrs.nints = 0;
    attrs.has_scalar = false;
    attrs.nfloats = op->nparams - 1;
    for (int i = 1; i < op->nparams; i++) {
        attrs.floats[i - 1] = op->defaults[i];
        if (v[i] && dtpy_arg_float(op->name, PyUnicode_AsUTF8(op->params[i]), v[i], &attrs.floats[i - 1]) != 0)
            return NULL;
    }
    return dtpy_tensor_run(op->id, 1, in, &attrs, ((dtpy_Tensor *)v[0])->mesh);
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
            dtpy_raise();
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
        if ((info.exports & DT_PY_METHOD) && PyObject_SetAttrString((PyObject *)dtpy_tensor_type, info.name, fn) != 0)
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
        return PyErr_Occurred() ? NULL : dtpy_raise();
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
        if (dtpy_arg_tensor(name, (int)i, PySequence_Fast_GET_ITEM(fast, i), &in[i]) != 0)
            goto done;
    if (n > 0)
        mesh = ((dtpy_Tensor *)PySequence_Fast_GET_ITEM(fast, 0))->mesh;
    if (args[2] != Py_None && (attrs.nints = dtpy_arg_ints(name, "a dim or size", args[2], attrs.ints, 16)) < 0)
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
            rc = dtpy_arg_float(name, "a float attribute", PySequence_Fast_GET_ITEM(floats, i), &attrs.floats[i]);
        Py_DECREF(floats);
        if (rc)
            goto done;
    }
    if (args[4] != Py_None) {
        if (dtpy_arg_number(name, "the number operand", args[4], &attrs.scalar, NULL) != 0)
            goto done;
        attrs.has_scalar = true;
    }
    result = dtpy_tensor_run(id, (int)n, in, &attrs, mesh);
done:
    Py_DECREF(fast);
    return result;
}

/* tuple of n new DTensors, or NULL (releasing them) */
static PyObject *s_wrap_tuple(int n, dt_tensor **out, PyObject *mesh)
{
    PyObject *tuple = PyTuple_New(n);
    for (int i = 0; i < n; i++) {
        PyObject *t = tuple ? dtpy_tensor_wrap(out[i], mesh) : NULL;
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
    if (!PyArg_ParseTuple(args, "sOOO", &kind, &tensor, &a, &dim_o) || dtpy_arg_tensor(kind, 0, tensor, &t) != 0 ||
        dtpy_arg_int(kind, "dim", dim_o, &dim) != 0)
        return NULL;
    bool split = !strcmp(kind, "split"), chunk = !strcmp(kind, "chunk");
    if (split && (PyList_Check(a) || PyTuple_Check(a))) {
        Py_ssize_t len = PySequence_Size(a);
        if (len > INT32_MAX || !(sections = PyMem_Malloc(sizeof *sections * (size_t)(len ? len : 1))))
            return PyErr_NoMemory();
        if ((nsections = dtpy_arg_ints(kind, "split size", a, sections, (int)len)) < 0)
            goto done;
    } else if ((split || chunk) && dtpy_arg_int(kind, split ? "split_size" : "chunks", a, &size) != 0) {
        return NULL;
    }
    /* the first pass counts the pieces, the second makes them */
    for (int pass = 0, n = 0; pass < 2; pass++) {
        int got = split ? dt_split(t, dim, size, nsections, sections, n, out)
                  : chunk ? dt_chunk(t, size, dim, n, out)
                          : dt_unbind(t, dim, n, out);
        if (got < 0) {
            dtpy_raise();
            break;
        }
        if (pass) {
            result = s_wrap_tuple(got, out, ((dtpy_Tensor *)tensor)->mesh);
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
        if (tensors[i] && (i < 5 || tensors[i] != Py_None) && dtpy_arg_tensor(fn, i, tensors[i], &in[i]) != 0)
            return NULL;
    int causal = PyObject_IsTrue(causal_o);
    if (causal < 0 || dtpy_arg_int(fn, "mesh_dim", dim_o, &dim) != 0 ||
        (scale_o != Py_None && dtpy_arg_float(fn, "scale", scale_o, &scale) != 0))
        return NULL;
    int mesh_dim = dim < INT_MIN ? INT_MIN : dim > INT_MAX ? INT_MAX : (int)dim; /* out of range either way */
    return dtpy_tensor_wrap(dt_ring_attention_joint(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], mesh_dim,
                                                 causal, scale_o != Py_None, scale),
                         ((dtpy_Tensor *)tensors[0])->mesh);
}

/* _halo_conv2d(input, weight, bias or None, ints (9), mesh_dim) and _halo_interpolate(input, ints,
 * floats, mesh_dim): the image ops over an input split on a spatial dim (dtensor/dt_halo.c) */
static PyObject *s_halo_conv2d(PyObject *mod, PyObject *args)
{
    const char *fn = "conv2d";
    PyObject *tensors[3], *ints_o, *dim_o;
    dt_tensor *in[3] = {NULL};
    int64_t ints[9], dim;
    if (!PyArg_ParseTuple(args, "OOOOO", &tensors[0], &tensors[1], &tensors[2], &ints_o, &dim_o))
        return NULL;
    for (int i = 0; i < 3; i++)
        if ((i < 2 || tensors[i] != Py_None) && dtpy_arg_tensor(fn, i, tensors[i], &in[i]) != 0)
            return NULL;
    int n = dtpy_arg_ints(fn, "ints", ints_o, ints, 9);
    if (n < 0 || dtpy_arg_int(fn, "mesh_dim", dim_o, &dim) != 0)
        return NULL;
    if (n != 9)
        return PyErr_Format(PyExc_ValueError, "%s(): expected 9 ints, got %d", fn, n);
    int mesh_dim = dim < INT_MIN ? INT_MIN : dim > INT_MAX ? INT_MAX : (int)dim; /* out of range either way */
    return dtpy_tensor_wrap(dt_halo_conv2d(in[0], in[1], in[2], ints, mesh_dim), ((dtpy_Tensor *)tensors[0])->mesh);
}

static PyObject *s_halo_interpolate(PyObject *mod, PyObject *args)
{
    const char *fn = "interpolate";
    PyObject *x_o, *ints_o, *floats_o, *dim_o;
    dt_tensor *x;
    int64_t ints[4], dim;
    double floats[2];
    if (!PyArg_ParseTuple(args, "OOOO", &x_o, &ints_o, &floats_o, &dim_o) || dtpy_arg_tensor(fn, 0, x_o, &x) != 0)
        return NULL;
    int nints = dtpy_arg_ints(fn, "ints", ints_o, ints, 4);
    if (nints < 0 || dtpy_arg_int(fn, "mesh_dim", dim_o, &dim) != 0)
        return NULL;
    PyObject *fast = PySequence_Fast(floats_o, "interpolate(): floats must be a sequence of numbers");
    if (!fast)
        return NULL;
    Py_ssize_t nfloats = PySequence_Fast_GET_SIZE(fast);
    int rc = nfloats > 2 ? -1 : 0;
    if (rc)
        PyErr_Format(PyExc_ValueError, "%s(): at most 2 scale factors, got %zd", fn, nfloats);
    for (Py_ssize_t i = 0; i < nfloats && rc == 0; i++)
        rc = dtpy_arg_float(fn, "floats", PySequence_Fast_GET_ITEM(fast, i), &floats[i]);
    Py_DECREF(fast);
    if (rc)
        return NULL;
    int mesh_dim = dim < INT_MIN ? INT_MIN : dim > INT_MAX ? INT_MAX : (int)dim;
    return dtpy_tensor_wrap(dt_halo_interpolate(x, nints, ints, (int)nfloats, floats, mesh_dim),
                            ((dtpy_Tensor *)x_o)->mesh);
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

static PyMethodDef s_methods[] = {
    {"_op", (PyCFunction)(void (*)(void))s_op, METH_FASTCALL, NULL},
    {"_cut", s_cut, METH_VARARGS, NULL},
    {"_ring_attention", s_ring_attention, METH_VARARGS, NULL},
    {"_halo_conv2d", s_halo_conv2d, METH_VARARGS, NULL},
    {"_halo_interpolate", s_halo_interpolate, METH_VARARGS, NULL},
    {"_registry", s_registry, METH_NOARGS,
     "Every op: (name, id, inputs, outputs, signature kind, exports, float attributes, callable or None)."},
    {"set_strict", s_set_strict, METH_O, "Make ops raise instead of redistributing their inputs."},
    {"get_strict", s_get_strict, METH_NOARGS, NULL},
    {NULL},
};

int dtpy_ops_init(PyObject *m)
{
    if (PyType_Ready(&s_OpType) < 0 || s_registry_build() != 0)
        return -1;
    return PyModule_AddFunctions(m, s_methods);
}
