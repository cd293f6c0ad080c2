/* dt_device — what the devices have counted: each worker keeps its counters (mb_schema.h,
 * MB_STATS) and answers a STATS record with them, in order with the records before it. */

#include "act_capture.h"
#include "act_future.h"
#include "act_runtime.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "mb_schema.h"

#include <string.h>

/* A future of one int64 piece per device of mesh, (rows[i], cols) each (rows NULL: (cols,)),
 * tracked, with the mesh's outboxes open for its records: the lock is held until act_runtime_end.
 * NULL (and why) when it cannot be had. */
static dt_future *s_open(const char *op, dt_mesh *mesh, const int64_t *rows, int64_t cols)
{
    dt_future *f = act_future_new(ACT_FETCH_LOCALS, (int)mesh->size);
    if (!f) {
        dt_err(DT_ENOMEM, "%s: out of memory", op);
        return NULL;
    }
    f->dtype = DT_INT64;
    f->ndim = rows ? 2 : 1;
    f->shape[0] = cols;
    for (int i = 0; i < f->npieces; i++) {
        f->pieces[i] = (act_piece){.device = mesh->ids[i], .mesh_index = i, .shape = {rows ? rows[i] : cols, cols}};
        if (!rows)
            f->pieces[i].shape[1] = 0;
    }
    int rc = act_runtime_begin(op, &mesh, 1);
    if (rc == 0 && ((rc = act_capture_refuse(op)) != 0 || (rc = act_runtime_track(f)) != 0))
        act_runtime_end();
    if (rc != 0) {
        dt_future_release(&f);
        return NULL;
    }
    act_runtime_urgent();
    return f;
}

static int s_stats(const char *op, dt_mesh *mesh, bool reset_peak, int max, dt_device_stat *out)
{
    if (!mesh || max < 0 || (max > 0 && !out))
        return dt_err(DT_EINVAL, "%s: expected a mesh and room for its entries", op);
    dt_future *f = s_open(op, mesh, NULL, MB_NSTATS);
    if (!f)
        return dt_last_error_code();
    int rc;
    for (int i = 0; i < f->npieces; i++)
        mb_encode_stats(act_runtime_record(mesh->ids[i]), f->id, i, reset_peak);
    act_runtime_end();
    if ((rc = dt_future_wait(f, -1)) == 0) {
        for (int i = 0; i < f->npieces && i < max; i++) {
            const int64_t *v = dt_future_data(f, i);
            out[i] = (dt_device_stat){.device = mesh->ids[i]};
#define S_COPY(name) out[i].name = v[MB_STAT_##name];
            MB_STATS(S_COPY)
#undef S_COPY
        }
        rc = f->npieces;
    }
    dt_future_release(&f);
    return rc;
}

int dt_device_stats(dt_mesh *mesh, int max, dt_device_stat *out)
{
    return s_stats("device_stats", mesh, false, max, out);
}

int dt_device_stats_reset_peak(dt_mesh *mesh, int max, dt_device_stat *out)
{
    return s_stats("device_stats", mesh, true, max, out);
}

/* ---- timelines (dtorch.profiler) ------------------------------------------------------------ */

/* One TRACE record per device of mesh, waited for: piece i of shape (rows[i], fields), or (1,) for
 * rows NULL; the pieces are copied one after another into out (NULL: not kept). */
static int s_trace(const char *op, dt_mesh *mesh, int64_t action, const int64_t *rows, int64_t *out)
{
    if (!mesh)
        return dt_err(DT_EINVAL, "%s: expected a mesh", op);
    dt_future *f = s_open(op, mesh, rows, rows ? MB_TRACE_FIELDS : 1);
    if (!f)
        return dt_last_error_code();
    for (int i = 0; i < f->npieces; i++)
        mb_encode_trace(act_runtime_record(mesh->ids[i]), f->id, i, action);
    act_runtime_end();
    int rc = dt_future_wait(f, -1);
    for (int i = 0; rc == 0 && out && i < f->npieces; i++) {
        size_t n = (size_t)(rows ? rows[i] * MB_TRACE_FIELDS : 1);
        memcpy(out, dt_future_data(f, i), n * sizeof *out);
        out += n;
    }
    dt_future_release(&f);
    return rc;
}

int dt_trace_start(dt_mesh *mesh)
{
    act_trace_host(true);
    return s_trace("profiler", mesh, MB_TRACE_START, NULL, NULL);
}

int dt_trace_stop(dt_mesh *mesh, int64_t *counts)
{
    int rc = s_trace("profiler", mesh, MB_TRACE_STOP, NULL, counts);
    act_trace_host(false);
    return rc;
}

int dt_trace_events(dt_mesh *mesh, const int64_t *counts, int64_t *events)
{
    return s_trace("profiler", mesh, MB_TRACE_SEND, counts, events);
}

const char *dt_record_name(int64_t code) { return mb_op_name(code); }
