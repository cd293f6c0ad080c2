/* What the devices measure: their counters (_device_stats) and their timelines, with the
 * controller's (_trace_*: dtorch.profiler). */
#include "dtpy.h"

/* _device_stats(device_mesh, reset_peak) -> one dict of counters per device, in mesh order */
static PyObject *s_device_stats(PyObject *mod, PyObject *args)
{
    PyObject *py_mesh, *reset;
    dt_mesh *mesh;
    if (!PyArg_ParseTuple(args, "OO", &py_mesh, &reset) || dtpy_arg_mesh("device_stats", py_mesh, &mesh) != 0)
        return NULL;
    int reset_peak = PyObject_IsTrue(reset);
    int n = (int)dt_mesh_size(mesh);
    dt_device_stat *stats = reset_peak < 0 ? NULL : PyMem_Calloc((size_t)n, sizeof *stats);
    if (!stats)
        return reset_peak < 0 ? NULL : PyErr_NoMemory();
    int got = reset_peak ? dt_device_stats_reset_peak(mesh, n, stats) : dt_device_stats(mesh, n, stats);
    PyObject *list = got < 0 ? dtpy_raise() : PyList_New(got);
    for (int i = 0; list && i < got; i++) {
        const dt_device_stat *d = &stats[i];
        PyObject *entry = Py_BuildValue(
            "{s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L}", "device", (long long)d->device, "bytes_in_use",
            (long long)d->bytes_in_use, "peak_bytes", (long long)d->peak_bytes, "peer_messages_sent",
            (long long)d->peer_messages_sent, "peer_bytes_sent", (long long)d->peer_bytes_sent,
            "peer_messages_received", (long long)d->peer_messages_received, "peer_bytes_received",
            (long long)d->peer_bytes_received, "shm_bytes_sent", (long long)d->shm_bytes_sent, "shm_bytes_received",
            (long long)d->shm_bytes_received, "shm_bytes_fetched", (long long)d->shm_bytes_fetched, "pooled_bytes",
            (long long)d->pooled_bytes, "loads", (long long)d->loads, "loaded_bytes", (long long)d->loaded_bytes,
            "peer_messages_refused", (long long)d->peer_messages_refused, "peer_regions_dropped",
            (long long)d->peer_regions_dropped, "huge_page_bytes", (long long)d->huge_page_bytes, "onednn_convs",
            (long long)d->onednn_convs, "peer_handoffs", (long long)d->peer_handoffs, "onednn_matmuls",
            (long long)d->onednn_matmuls);
        if (!entry)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, i, entry);
    }
    PyMem_Free(stats);
    return list;
}

/* _trace_start(mesh); _trace_stop(mesh) -> [events kept per device]; _trace_events(mesh, counts) ->
 * bytes of every device's counts[i] rows of DT_TRACE_FIELDS int64; _trace_host() -> bytes of [device, records,
 * ns] rows: dtorch.profiler's timelines */
static PyObject *s_trace_start(PyObject *mod, PyObject *py_mesh)
{
    dt_mesh *mesh;
    if (dtpy_arg_mesh("profiler", py_mesh, &mesh) != 0)
        return NULL;
    if (dt_trace_start(mesh) != 0)
        return dtpy_raise();
    Py_RETURN_NONE;
}

static PyObject *s_trace_stop(PyObject *mod, PyObject *py_mesh)
{
    dt_mesh *mesh;
    if (dtpy_arg_mesh("profiler", py_mesh, &mesh) != 0)
        return NULL;
    int64_t n = dt_mesh_size(mesh);
    int64_t *counts = PyMem_Calloc((size_t)n, sizeof *counts);
    if (!counts)
        return PyErr_NoMemory();
    PyObject *list = dt_trace_stop(mesh, counts) != 0 ? dtpy_raise() : PyList_New(n);
    for (int64_t i = 0; list && i < n; i++)
        PyList_SET_ITEM(list, i, PyLong_FromLongLong(counts[i]));
    PyMem_Free(counts);
    return list;
}

static PyObject *s_trace_events(PyObject *mod, PyObject *args)
{
    PyObject *py_mesh, *py_counts;
    dt_mesh *mesh;
    if (!PyArg_ParseTuple(args, "OO", &py_mesh, &py_counts) || dtpy_arg_mesh("profiler", py_mesh, &mesh) != 0)
        return NULL;
    int64_t n = dt_mesh_size(mesh), total = 0;
    if (!PyList_Check(py_counts) || PyList_GET_SIZE(py_counts) != n)
        return PyErr_Format(PyExc_ValueError, "profiler: expected %lld counts", (long long)n);
    int64_t *counts = PyMem_Calloc((size_t)n, sizeof *counts);
    if (!counts)
        return PyErr_NoMemory();
    for (int64_t i = 0; i < n; i++) {
        counts[i] = PyLong_AsLongLong(PyList_GET_ITEM(py_counts, i));
        if (counts[i] < 0 && !PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "profiler: a count is negative");
        if (PyErr_Occurred()) {
            PyMem_Free(counts);
            return NULL;
        }
        total += counts[i];
    }
    /* every device's rows, one device after another */
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(total * DT_TRACE_FIELDS * 8));
    if (out && dt_trace_events(mesh, counts, (int64_t *)PyBytes_AS_STRING(out)) != 0) {
        dtpy_raise();
        Py_CLEAR(out);
    }
    PyMem_Free(counts);
    return out;
}

/* _record_name(code): what a trace event's record was ("compute", "send", ...) */
static PyObject *s_record_name(PyObject *mod, PyObject *code)
{
    long long c = PyLong_AsLongLong(code);
    return c == -1 && PyErr_Occurred() ? NULL : PyUnicode_FromString(dt_record_name(c));
}

static PyObject *s_trace_host(PyObject *mod, PyObject *unused)
{
    int64_t n = dt_trace_host(NULL, 0);
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * 3 * 8));
    if (out) {
        int64_t got = dt_trace_host((int64_t *)PyBytes_AS_STRING(out), n);
        if (got < n)
            n = got;
    }
    return out;
}

static PyMethodDef s_methods[] = {
    {"_trace_start", s_trace_start, METH_O, "Every device of the mesh records its timeline."},
    {"_trace_stop", s_trace_stop, METH_O, "They stop: [events kept per device]."},
    {"_trace_events", s_trace_events, METH_VARARGS, "_trace_events(mesh, counts) -> bytes: every device's rows."},
    {"_record_name", s_record_name, METH_O, "The name of an op record's code."},
    {"_trace_host", s_trace_host, METH_NOARGS, "The controller's batches while tracing, as bytes."},
    {"_device_stats", s_device_stats, METH_VARARGS, "Every device's counters: _device_stats(mesh, reset_peak)."},
    {NULL},
};

/* _HAVE_ONEDNN: whether this build runs the CPU's conv2d through oneDNN (device_stats' onednn_convs
 * count those kernels) */
int dtpy_profiler_init(PyObject *m)
{
#if DTORCH_HAVE_DNNL
    int have_onednn = 1;
#else
    int have_onednn = 0;
#endif
    return PyModule_AddFunctions(m, s_methods) < 0 || PyModule_AddIntConstant(m, "_HAVE_ONEDNN", have_onednn) < 0 ? -1 : 0;
}
