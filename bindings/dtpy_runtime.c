/* The runtime: starting and stopping it, its workers (threads, local processes, or remote ones
 * that connect to a listening runtime), their failures, the seed, and waiting for every op. */
#include "dtpy.h"

static PyObject *s_init(PyObject *mod, PyObject *args)
{
    int workers, insecure = 0;
    const char *path = NULL, *listen = NULL, *key = NULL, *worker_key = NULL;
    if (!PyArg_ParseTuple(args, "iz|zzzp", &workers, &path, &listen, &key, &worker_key, &insecure))
        return NULL;
    dt_config config = {(dt_workers)workers, path, listen, key, worker_key, insecure != 0};
    if (dt_init(&config) != 0)
        return dtpy_raise();
    Py_RETURN_NONE;
}

/* (endpoint, controller's public key) of a listening runtime. */
static PyObject *s_listen_info(PyObject *mod, PyObject *unused)
{
    char endpoint[256], key[64];
    if (dt_listen_info(endpoint, sizeof endpoint, key, sizeof key) != 0)
        return dtpy_raise();
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
        return dtpy_raise();
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
        return dtpy_raise();
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
        PyErr_Format(PyLong_Check(arg) ? dtpy_value_error : dtpy_type_error,
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
        return dtpy_raise();
    Py_RETURN_NONE;
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

static PyMethodDef s_methods[] = {
    {"init", s_init, METH_VARARGS,
     "Start the runtime: init(workers, worker_path[, listen, key, worker_key, insecure])."},
    {"listen_info", s_listen_info, METH_NOARGS, "(endpoint, public key) of a listening runtime."},
    {"_started_devices", s_started_devices, METH_NOARGS, "Ids of the devices a mesh has started (serving or still starting)."},
    {"_device_type", s_device_type, METH_O, "_device_type(id) -> the device type a mesh gave it, or None."},
    {"wait_workers", s_wait_workers, METH_VARARGS, "wait_workers(ids, timeout): until their workers connected."},
    {"worker_info", s_worker_info, METH_VARARGS, "worker_info(id) -> (state, remote, host, pid, peer, reason)."},
    {"shutdown", s_shutdown, METH_NOARGS, "Stop the runtime and every device actor."},
    {"is_running", s_is_running, METH_NOARGS, NULL},
    {"manual_seed", s_manual_seed, METH_O, NULL},
    {"synchronize", s_synchronize, METH_NOARGS, NULL},
    {"_ops_submitted", s_ops_submitted, METH_NOARGS, "Submissions so far (ops, factories, fetches, redistributes)."},
    {"_next_failure", s_next_failure, METH_VARARGS, "The next device failure after a number, or None."},
    {"_failure_count", s_failure_count, METH_NOARGS, "The number of the latest device failure (0: none)."},
    {NULL},
};

int dtpy_runtime_init(PyObject *m) { return PyModule_AddFunctions(m, s_methods); }
