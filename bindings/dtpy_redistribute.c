/* Redistribute: one tensor to other placements or another mesh, many at once, many into tensors
 * that exist, and the plan of steps a redistribute would take. */
#include "dtpy.h"

/* The target of a redistribute: a DeviceMesh, or None for the tensor's own (*mesh NULL); and its
 * placements, which must be given. */
static int s_arg_target(const char *fn, PyObject *py_mesh, PyObject *pls, dt_mesh **mesh)
{
    *mesh = NULL;
    if (py_mesh != Py_None && dtpy_arg_mesh(fn, py_mesh, mesh) != 0)
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
    if (!PyArg_ParseTuple(args, "OOO", &tensor, &py_mesh, &pls) ||
        dtpy_arg_tensor("redistribute", 0, tensor, &t) != 0 || s_arg_target("redistribute", py_mesh, pls, &mesh) != 0 ||
        dtpy_arg_placements(pls, dt_mesh_ndim(mesh ? mesh : dt_tensor_mesh(t)), storage, &pl) != 0)
        return NULL;
    return dtpy_tensor_wrap(dt_redistribute(t, mesh, pl), mesh ? py_mesh : ((dtpy_Tensor *)tensor)->mesh);
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
    int shared = list ? dtpy_arg_all_placements(pls) : -1;
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
        if (dtpy_arg_tensor(fn, (int)i, PySequence_Fast_GET_ITEM(list, i), &in[i]) != 0)
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
        int rc = pl ? dtpy_arg_placements(pl, stride, placements + i * stride, &given) : -1;
        Py_XDECREF(pl);
        if (rc != 0)
            goto done;
    }
    if (dt_redistribute_many((int)n, in, mesh, placements, out) != 0) {
        dtpy_raise();
        goto done;
    }
    result = PyList_New(n);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *m = mesh ? py_mesh : ((dtpy_Tensor *)PySequence_Fast_GET_ITEM(list, i))->mesh;
        PyObject *wrapped = result ? dtpy_tensor_wrap(out[i], m) : NULL;
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
        if (dtpy_arg_tensor(fn, (int)i, PySequence_Fast_GET_ITEM(src, i), &in[i]) != 0 ||
            dtpy_arg_tensor("redistribute_many (out)", (int)i, PySequence_Fast_GET_ITEM(dst, i), &out[i]) != 0)
            goto done;
    if (dt_redistribute_into((int)n, in, out) != 0) {
        dtpy_raise();
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
        dtpy_arg_tensor("redistribute_plan", 0, tensor, &t) != 0 ||
        s_arg_target("redistribute_plan", py_mesh, pls, &mesh) != 0 ||
        dtpy_arg_placements(pls, dt_mesh_ndim(mesh ? mesh : dt_tensor_mesh(t)), storage, &pl) != 0)
        return NULL;
    dt_plan_step steps[DT_MAX_DIMS + 1];
    int n = dt_redistribute_plan(t, mesh, pl, steps, DT_MAX_DIMS + 1);
    if (n < 0)
        return dtpy_raise();
    PyObject *list = PyList_New(n);
    for (int i = 0; list && i < n; i++)
        PyList_SET_ITEM(list, i, Py_BuildValue("siL", steps[i].kind, steps[i].mesh_dim,
                                               (long long)steps[i].remote_elements));
    return list;
}

static PyMethodDef s_methods[] = {
    {"_redistribute", s_redistribute, METH_VARARGS, NULL},
    {"_redistribute_many", s_redistribute_many, METH_VARARGS, NULL},
    {"_redistribute_into", s_redistribute_into, METH_VARARGS, NULL},
    {"_redistribute_plan", s_redistribute_plan, METH_VARARGS, NULL},
    {NULL},
};

int dtpy_redistribute_init(PyObject *m) { return PyModule_AddFunctions(m, s_methods); }
