/* dt_device — what the devices have counted: each worker keeps its counters (mb_schema.h,
 * MB_STATS) and answers a STATS record with them, in order with the records before it. */

#include "act_capture.h"
#include "act_future.h"
#include "act_runtime.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "mb_schema.h"

static int s_stats(const char *op, dt_mesh *mesh, bool reset_peak, int max, dt_device_stat *out)
{
    if (!mesh || max < 0 || (max > 0 && !out))
        return dt_err(DT_EINVAL, "%s: expected a mesh and room for its entries", op);
    dt_future *f = act_future_new(ACT_FETCH_LOCALS, (int)mesh->size);
    if (!f)
        return dt_err(DT_ENOMEM, "%s: out of memory", op);
    f->dtype = DT_INT64;
    f->ndim = 1;
    f->shape[0] = MB_NSTATS;
    for (int i = 0; i < f->npieces; i++)
        f->pieces[i] = (act_piece){.device = mesh->ids[i], .mesh_index = i, .shape = {MB_NSTATS}};
    int rc = act_runtime_begin(op, &mesh, 1);
    if (rc != 0) {
        dt_future_release(&f);
        return rc;
    }
    if ((rc = act_capture_refuse(op)) != 0 || (rc = act_runtime_track(f)) != 0) {
        act_runtime_end();
        dt_future_release(&f);
        return rc;
    }
    act_runtime_urgent();
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
