/* The arguments Python callers give dtorch._C: ints, sizes, numbers, dtypes, meshes, placements,
 * tensors and keyword binding, each checked and converted with torch's messages. */
#include <string.h>

#include "dtpy.h"

/* ---- Python classes the arguments are checked against (dtorch registers them) --------------- */

static PyObject *s_mesh_cls;      /* dtorch.DeviceMesh */
static PyObject *s_placement_cls; /* dtorch.Placement */
static PyObject *s_dtype_code;    /* dtorch._dtype._code_of: a dtype, its name or a numpy dtype -> its code */

void dtpy_arg_set_classes(PyObject *mesh_cls, PyObject *placement_cls, PyObject *dtype_code)
{
    s_mesh_cls = Py_NewRef(mesh_cls);
    s_placement_cls = Py_NewRef(placement_cls);
    s_dtype_code = Py_NewRef(dtype_code);
}

/* ---- arguments: every entry point turns Python values into C ones with these --------------- */

const char *dtpy_arg_type_name(PyObject *o) { return Py_TYPE(o)->tp_name; }

bool dtpy_arg_is_bool(PyObject *o)
{
    if (PyBool_Check(o))
        return true;
    if (PyLong_CheckExact(o) || PyFloat_CheckExact(o))
        return false; /* the common case, without comparing type names */
    const char *name = dtpy_arg_type_name(o);
    return !strcmp(name, "numpy.bool") || !strcmp(name, "numpy.bool_");
}

/* An int (a Python int or anything with __index__, such as numpy's; not a bool). */
int dtpy_arg_int(const char *fn, const char *what, PyObject *o, int64_t *v)
{
    if (dtpy_arg_is_bool(o) || !PyIndex_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s(): %s must be an int, got %s", fn, what, dtpy_arg_type_name(o));
        return -1;
    }
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (x == -1 && PyErr_Occurred())
        return -1;
    if (overflow) {
        PyErr_Format(dtpy_value_error, "%s(): %s %R is out of range (a 64-bit integer)", fn, what, o);
        return -1;
    }
    *v = x;
    return 0;
}

/* A sequence of at most max ints; returns how many. */
int dtpy_arg_ints(const char *fn, const char *what, PyObject *seq, int64_t *out, int max)
{
    PyObject *fast = PySequence_Fast(seq, "");
    if (!fast) {
        PyErr_Format(PyExc_TypeError, "%s(): %s must be a sequence of ints, got %s", fn, what, dtpy_arg_type_name(seq));
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    int rc = (int)n;
    if (n > max) {
        PyErr_Format(PyExc_ValueError, "%s(): %s: at most %d entries, got %zd", fn, what, max, n);
        rc = -1;
    }
    for (Py_ssize_t i = 0; i < n && rc >= 0; i++)
        if (dtpy_arg_int(fn, what, PySequence_Fast_GET_ITEM(fast, i), &out[i]) != 0)
            rc = -1;
    Py_DECREF(fast);
    return rc;
}

/* A size as torch takes it: separate ints, or one sequence of them (zeros(2, 3), zeros((2, 3))). */
int dtpy_arg_sizes(const char *fn, PyObject *args, int64_t *out)
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
        if (dtpy_arg_is_bool(s) || !PyIndex_Check(s)) {
            PyErr_Format(PyExc_TypeError, "%s(): argument 'size' must be tuple of ints, but found element of type "
                         "%s at pos %zd", fn, dtpy_arg_type_name(s), i);
            rc = -1;
        } else {
            int overflow = 0;
            if ((out[i] = PyLong_AsLongLongAndOverflow(s, &overflow)) == -1 && PyErr_Occurred())
                rc = -1;
            else if (overflow) {
                PyErr_Format(dtpy_value_error, "%s(): size %R at pos %zd is out of range (a tensor holds at most 2**48 "
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
    const char *name = dtpy_arg_type_name(o);
    return !strncmp(name, "numpy.", 6) && strcmp(name, "numpy.ndarray") != 0;
}

/* A Python number (bool, int, float, or numpy's): 1 with *v set, 0 when o is not a number. */
int dtpy_arg_try_number(PyObject *o, dt_scalar *v, bool *is_bool)
{
    bool b = dtpy_arg_is_bool(o);
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

int dtpy_arg_number(const char *fn, const char *what, PyObject *o, dt_scalar *v, bool *is_bool)
{
    int rc = dtpy_arg_try_number(o, v, is_bool);
    if (rc == 0)
        PyErr_Format(PyExc_TypeError, "%s(): %s must be a number, got %s", fn, what, dtpy_arg_type_name(o));
    return rc == 1 ? 0 : -1;
}

int dtpy_arg_float(const char *fn, const char *what, PyObject *o, double *v)
{
    dt_scalar s;
    if (dtpy_arg_number(fn, what, o, &s, NULL) != 0)
        return -1;
    *v = s.is_int ? (double)s.i : s.f;
    return 0;
}

/* A dtype (dtorch's, its name, or a numpy dtype); None gives otherwise. */
int dtpy_arg_dtype(PyObject *o, int otherwise, int *code)
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
int dtpy_arg_mesh(const char *fn, PyObject *o, dt_mesh **mesh)
{
    int is = s_mesh_cls ? PyObject_IsInstance(o, s_mesh_cls) : 0;
    if (is < 0)
        return -1;
    PyObject *c = is ? PyObject_GetAttrString(o, "_c") : NULL;
    if (!c || !dtpy_mesh_check(c, mesh)) {
        Py_XDECREF(c);
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s(): device_mesh must be a dtorch.DeviceMesh, got %s", fn,
                     dtpy_arg_type_name(o));
        return -1;
    }
    Py_DECREF(c);
    return 0;
}

/* placements: None (all Replicate: *result NULL) or one Placement per mesh dim. */
int dtpy_arg_placements(PyObject *o, int mesh_ndim, dt_placement *storage, const dt_placement **result)
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
int dtpy_arg_inference_only(const char *fn, PyObject *requires_grad)
{
    int wants = requires_grad ? PyObject_IsTrue(requires_grad) : 0;
    if (wants > 0)
        PyErr_Format(PyExc_NotImplementedError,
                     "%s(): DTorch is inference-only: requires_grad=True is not supported", fn);
    return wants ? -1 : 0;
}

/* The same for a tensor handed in: one whose requires_grad attribute is true. */
int dtpy_arg_source(const char *fn, PyObject *source)
{
    PyObject *rg = PyObject_GetAttrString(source, "requires_grad");
    if (!rg) {
        PyErr_Clear();
        return 0;
    }
    int rc = dtpy_arg_inference_only(fn, rg);
    Py_DECREF(rg);
    return rc;
}

/* Binds vectorcall arguments to the parameters names[0..n): out[i] borrowed, NULL when not given;
 * the first npositional may come by position. TypeError for too many, unknown or repeated. */
int dtpy_arg_bind(const char *fn, PyObject *const *names, int n, int npositional, PyObject *const *args,
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

int dtpy_arg_tensor(const char *fn, int pos, PyObject *o, dt_tensor **t)
{
    if (!PyObject_TypeCheck(o, dtpy_tensor_type)) {
        PyErr_Format(PyExc_TypeError, "%s(): expected a DTensor at position %d, got %s (an input must be a DTensor: "
                     "distribute arrays with dtorch.distribute_tensor first)", fn, pos, dtpy_arg_type_name(o));
        return -1;
    }
    *t = ((dtpy_Tensor *)o)->t;
    return 0;
}

/* Whether o is a sequence that holds only Placements (one list for every tensor). */
int dtpy_arg_all_placements(PyObject *o)
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
