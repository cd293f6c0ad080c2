/* _C.Mesh: the C mesh inside a dtorch.DeviceMesh (its _c), made from the mesh's device type,
 * shape, device ids and dim names. */
#include "dtpy.h"

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
    int ndim = dtpy_arg_ints("DeviceMesh", "mesh shape", shape_obj, shape, DT_MAX_DIMS);
    if (ndim < 0)
        return -1;
    Py_ssize_t nids = PySequence_Size(ids_obj);
    if (nids < 0)
        return -1;
    int64_t *ids = PyMem_Malloc((size_t)(nids ? nids : 1) * sizeof *ids);
    if (!ids || dtpy_arg_ints("DeviceMesh", "mesh ids", ids_obj, ids, (int)nids) < 0) {
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
        dtpy_raise();
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

bool dtpy_mesh_check(PyObject *o, dt_mesh **mesh)
{
    if (!PyObject_TypeCheck(o, &s_MeshType))
        return false;
    *mesh = ((s_Mesh *)o)->mesh;
    return true;
}

int dtpy_mesh_init(PyObject *m)
{
    if (PyType_Ready(&s_MeshType) < 0 || PyModule_AddObjectRef(m, "Mesh", (PyObject *)&s_MeshType) < 0)
        return -1;
    return 0;
}
