/* x[index], as torch indexes: the Python index read into dt_index's items (ints, slices, None,
 * Ellipsis, and at most one integer DTensor or list of ints). */
#include <string.h>

#include "dtpy.h"

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
        if (dtpy_arg_is_bool(o) || !PyIndex_Check(o)) {
            PyMem_Free(v);
            return PyErr_Format(PyExc_TypeError, "a list index holds ints only (got %s)", dtpy_arg_type_name(o)), NULL;
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
PyObject *dtpy_index_getitem(dtpy_Tensor *self, PyObject *key)
{
    enum { S_MAX_ITEMS = 64 };
    if (PyLong_CheckExact(key)) { /* x[i], the commonest index, without the walk below */
        dt_index_item item = {.kind = DT_INDEX_INT};
        if ((item.i = PyLong_AsSsize_t(key)) == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return PyErr_Format(PyExc_IndexError, "index %R is out of bounds for dimension 0", key);
        }
        return dtpy_tensor_wrap(dt_index(self->t, 1, &item), self->mesh);
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
        } else if (PyObject_TypeCheck(o, dtpy_tensor_type)) {
            it->kind = DT_INDEX_TENSOR;
            it->tensor = ((dtpy_Tensor *)o)->t;
        } else if (PyList_Check(o)) {
            if (list_at >= 0)
                return PyErr_Format(PyExc_TypeError, "indexing with more than one DTensor or list index is not supported");
            it->kind = DT_INDEX_LIST;
            it->npositions = PyList_GET_SIZE(o);
            list_at = i;
        } else if (!dtpy_arg_is_bool(o) && PyIndex_Check(o)) {
            it->kind = DT_INDEX_INT;
            if ((it->i = PyNumber_AsSsize_t(o, PyExc_IndexError)) == -1 && PyErr_Occurred())
                return NULL;
        } else {
            return PyErr_Format(PyExc_TypeError, "only integers, slices (`:`), ellipsis (`...`), None, lists of "
                                "integers and integer DTensors are valid indices (got %s)", dtpy_arg_type_name(o));
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
    return dtpy_tensor_wrap(r, self->mesh);
}
