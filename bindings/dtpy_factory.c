/* Factories (_make: full, zeros, ones, empty, rand, randn; _arange) and tensors made from Python's
 * arrays (_distribute, _from_local): numpy's, anything with the buffer protocol, __array__ or DLPack. */
#include <string.h>

#include "dtpy.h"

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
    if (dtpy_arg_inference_only(kind, args[5]) != 0 || dtpy_arg_mesh(kind, args[2], &mesh) != 0)
        return NULL;
    PyObject *size = full && !PyTuple_Check(args[1]) && !PyList_Check(args[1]) ? PyTuple_Pack(1, args[1])
                                                                            : Py_NewRef(args[1]);
    ndim = size ? dtpy_arg_sizes(kind, size, shape) : -1;
    Py_XDECREF(size);
    if (ndim < 0 || (full && dtpy_arg_number(kind, "fill_value", args[6], &value, &is_bool) != 0) ||
        dtpy_arg_dtype(args[4], full ? dt_full_dtype(value, is_bool) : DT_FLOAT32, &dtype) != 0 ||
        dtpy_arg_placements(args[3], dt_mesh_ndim(mesh), storage, &pl) != 0)
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
    return dtpy_tensor_wrap(t, args[2]);
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
    if (dtpy_arg_inference_only("arange", args[6]) != 0 ||
        (!one && dtpy_arg_number("arange", "start", args[0], &start, NULL) != 0) ||
        dtpy_arg_number("arange", "end", one ? args[0] : args[1], &end, NULL) != 0 ||
        dtpy_arg_number("arange", "step", args[2], &step, NULL) != 0 || dtpy_arg_mesh("arange", args[3], &mesh) != 0 ||
        dtpy_arg_dtype(args[5], dt_arange_dtype(start, end, step), &dtype) != 0 ||
        dtpy_arg_placements(args[4], dt_mesh_ndim(mesh), storage, &pl) != 0)
        return NULL;
    return dtpy_tensor_wrap(dt_arange(mesh, start, end, step, (dt_dtype)dtype, pl), args[3]);
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
            PyErr_Format(PyExc_TypeError, "%s: cannot read %s as an array: %S", fn, dtpy_arg_type_name(data),
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
    if (PyObject_TypeCheck(source, dtpy_tensor_type)) {
        /* already laid out: itself when it is what was asked for */
        PyObject *have = PyObject_GetAttrString(source, "placements"), *want = pls == Py_None ? NULL : PySequence_Tuple(pls);
        int same = PyObject_RichCompareBool(((dtpy_Tensor *)source)->mesh, py_mesh, Py_EQ);
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
    if (dtpy_arg_source(fn, source) != 0 || dtpy_arg_mesh(fn, py_mesh, &mesh) != 0)
        return NULL;
    PyObject *array = s_array(fn, source, &dtype);
    if (!array)
        return NULL;
    Py_buffer view;
    if (dtpy_arg_placements(pls, dt_mesh_ndim(mesh), storage, &pl) != 0 ||
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
    return dtpy_tensor_wrap(t, py_mesh);
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
        if (src && dtpy_arg_source(fn, src) == 0 && (array = s_array(fn, src, &d)) && i > 0 && d != *dtype)
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
    if (!PyArg_ParseTuple(args, "OOOO", &local, &py_mesh, &pls, &shape_o) || dtpy_arg_mesh(fn, py_mesh, &mesh) != 0)
        return NULL;
    PyObject *arrays = s_pieces(fn, local, (Py_ssize_t)dt_mesh_size(mesh), &dtype);
    if (!arrays)
        return NULL;
    PyObject *shape_args = shape_o == Py_None ? NULL : PyTuple_Pack(1, shape_o);
    if (dtpy_arg_placements(pls, dt_mesh_ndim(mesh), storage, &pl) != 0 ||
        (shape_o != Py_None && (!shape_args || (gndim = dtpy_arg_sizes(fn, shape_args, gshape)) < 0))) {
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
    result = dtpy_tensor_wrap(dt_from_local(mesh, data, ndim < 0 ? 0 : ndim, locals, (dt_dtype)dtype, pl,
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

static PyMethodDef s_methods[] = {
    {"_make", (PyCFunction)(void (*)(void))s_make, METH_FASTCALL, NULL},
    {"_arange", (PyCFunction)(void (*)(void))s_arange, METH_FASTCALL, NULL},
    {"_distribute", s_distribute, METH_VARARGS, NULL},
    {"_from_local", s_from_local, METH_VARARGS, NULL},
    {NULL},
};

int dtpy_factory_init(PyObject *m) { return PyModule_AddFunctions(m, s_methods); }
