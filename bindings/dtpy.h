/* dtpy.h — what the files of dtorch._C share; private to bindings/ (the C API is dtorch.h).
 *
 * One file a concern, each named dtpy_<concern>.c, its shared functions dtpy_<concern>_*:
 *   dtpy.c              the module: PyInit__C, errors, wait hooks, _register
 *   dtpy_arg.c          every argument a Python caller gives, checked and converted with torch's messages
 *   dtpy_mesh.c         _C.Mesh, the handle inside a dtorch.DeviceMesh
 *   dtpy_future.c       TensorFuture, and the buffers of a fetched value
 *   dtpy_tensor.c       the DTensor type: attributes, Python operators, the views written in C
 *   dtpy_index.c        x[index]
 *   dtpy_ops.c          the registry's ops as Python callables, _op, _cut, _ring_attention
 *   dtpy_factory.c      factories and arrays from Python (_make, _arange, _distribute, _from_local)
 *   dtpy_redistribute.c _redistribute and its batched forms
 *   dtpy_capture.c      captured op sequences
 *   dtpy_runtime.c      starting and stopping the runtime, its workers (local or remote), failures
 *   dtpy_profiler.c     device counters and timelines
 * Every file but dtpy_index.c adds its objects to the module in dtpy_<concern>_init(m), which
 * PyInit__C calls once. */
#ifndef DTPY_H
#define DTPY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdbool.h>

#include "dtorch.h"

/* ---- dtpy.c ------------------------------------------------------------------------------- */

/* dtorch.DTorchValueError and dtorch.DTorchTypeError (made at import): the exceptions bad values
 * and bad types raise, which are also RuntimeErrors */
extern PyObject *dtpy_value_error, *dtpy_type_error;

/* Raises the runtime's last error as its Python exception; NULL. */
PyObject *dtpy_raise(void);

/* ---- dtpy_arg.c --------------------------------------------------------------------------- */

void dtpy_arg_set_classes(PyObject *mesh_cls, PyObject *placement_cls, PyObject *dtype_code);
const char *dtpy_arg_type_name(PyObject *o);
bool dtpy_arg_is_bool(PyObject *o);
int dtpy_arg_int(const char *fn, const char *what, PyObject *o, int64_t *v);
int dtpy_arg_ints(const char *fn, const char *what, PyObject *seq, int64_t *out, int max);
int dtpy_arg_sizes(const char *fn, PyObject *args, int64_t *out);
int dtpy_arg_try_number(PyObject *o, dt_scalar *v, bool *is_bool);
int dtpy_arg_number(const char *fn, const char *what, PyObject *o, dt_scalar *v, bool *is_bool);
int dtpy_arg_float(const char *fn, const char *what, PyObject *o, double *v);
int dtpy_arg_dtype(PyObject *o, int otherwise, int *code);
int dtpy_arg_mesh(const char *fn, PyObject *o, dt_mesh **mesh);
int dtpy_arg_placements(PyObject *o, int mesh_ndim, dt_placement *storage, const dt_placement **result);
int dtpy_arg_all_placements(PyObject *o);
int dtpy_arg_inference_only(const char *fn, PyObject *requires_grad);
int dtpy_arg_source(const char *fn, PyObject *source);
int dtpy_arg_tensor(const char *fn, int pos, PyObject *o, dt_tensor **t);
int dtpy_arg_bind(const char *fn, PyObject *const *names, int n, int npositional, PyObject *const *args,
                  Py_ssize_t nargs, PyObject *kwnames, PyObject **out);

/* ---- dtpy_mesh.c -------------------------------------------------------------------------- */

int dtpy_mesh_init(PyObject *m);
/* Whether o is a _C.Mesh; *mesh its handle when it is. */
bool dtpy_mesh_check(PyObject *o, dt_mesh **mesh);

/* ---- dtpy_future.c ------------------------------------------------------------------------ */

int dtpy_future_init(PyObject *m);
/* The class futures are made as: a subclass of _C.TensorFuture (dtorch.TensorFuture); 0, or -1
 * with a TypeError for anything else. */
int dtpy_future_set_class(PyTypeObject *cls);
/* f as a new TensorFuture (taking it), or NULL with the runtime's error. */
PyObject *dtpy_future_wrap(dt_future *f);

/* ---- dtpy_tensor.c ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    dt_tensor *t;
    PyObject *mesh;   /* the Python DeviceMesh */
    PyObject *shape;  /* cached tuple */
} dtpy_Tensor;

/* dtorch.DTensor itself: a heap type made from its spec at import, so that dtorch adds its
 * Python-written methods to the type itself rather than to a subclass (_tensor.py) */
extern PyTypeObject *dtpy_tensor_type;

int dtpy_tensor_init(PyObject *m);
PyObject *dtpy_tensor_wrap(dt_tensor *t, PyObject *mesh);
PyObject *dtpy_tensor_run(int id, int n, dt_tensor *const *in, const dt_op_attrs *attrs, PyObject *mesh);
PyObject *dtpy_tensor_binary(int id, PyObject *a, PyObject *b);

/* ---- dtpy_index.c ------------------------------------------------------------------------- */

PyObject *dtpy_index_getitem(dtpy_Tensor *self, PyObject *key);

/* ---- the module's functions, one table a file --------------------------------------------- */

int dtpy_ops_init(PyObject *m);
int dtpy_factory_init(PyObject *m);
int dtpy_redistribute_init(PyObject *m);
int dtpy_capture_init(PyObject *m);
int dtpy_runtime_init(PyObject *m);
int dtpy_profiler_init(PyObject *m);

#endif
