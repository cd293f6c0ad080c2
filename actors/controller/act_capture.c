/* act_capture — capturing the op records of a function once, and replaying them by one record
 * per device (see act_capture.h; the devices' side is act_replay.c). */
#include "act_capture.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "act_runtime.h"
#include "dt_error.h"
#include "mb_schema.h"

typedef struct {
    int64_t device;
    mb_writer pk;
    uint32_t nrecords;
} s_dev;

typedef struct {
    int64_t device;
    uint64_t id;
} s_free;

/* The capture running now; all of it under the runtime's lock. */
static struct {
    bool on;
    pthread_t thread;              /* the one thread whose ops it takes */
    uint64_t epoch;                /* of the tensors made inside it */
    char name[96];
    uint64_t tensor_lo, transfer_lo, stream_lo;
    s_dev *devs;
    int ndevs, cap_devs;
    dt_idmap index;                /* device + 1 -> index + 1 into devs */
    s_free *frees;                 /* FREEs of older tensors, held back until the DEFINE */
    size_t nfrees, cap_frees;
    char failed[DT_ERRMSG_MAX];    /* why it cannot be kept ("" when it can) */
} s_cap;

static uint64_t s_captures;        /* captures begun: tags their tensors' epochs */
static uint64_t s_next_graph = 1;

bool act_capture_active(void) { return s_cap.on; }

uint64_t act_capture_epoch(void) { return s_cap.on ? s_cap.epoch : 0; }

bool act_capture_made(uint64_t epoch) { return (epoch >> 32) != 0; }

void act_capture_fail(const char *why)
{
    if (s_cap.on && !s_cap.failed[0])
        snprintf(s_cap.failed, sizeof s_cap.failed, "%s", why);
}

int act_capture_refuse(const char *op)
{
    if (!s_cap.on)
        return 0;
    return dt_err(DT_EUNSUPPORTED, "%s: not allowed inside dtorch.capture(): it needs the controller (a fetch, a "
                  "synchronize, host data, device stats or another capture's replay); do it outside the captured "
                  "function, or pass the tensor in as an argument", op);
}

int act_capture_begin(const char *name)
{
    if (act_runtime_begin("capture", NULL, 0) != 0)
        return dt_last_error_code();
    int rc = 0;
    if (s_cap.on) {
        rc = dt_err(DT_EUNSUPPORTED, "capture: a capture is already running (captures do not nest)");
    } else {
        memset(&s_cap, 0, sizeof s_cap);
        s_cap.on = true;
        s_cap.thread = pthread_self();
        s_cap.epoch = act_rt.epoch | (++s_captures << 32);
        snprintf(s_cap.name, sizeof s_cap.name, "%s", name && *name ? name : "?");
        s_cap.tensor_lo = act_rt.next_tensor_id;
        s_cap.transfer_lo = act_rt.next_transfer_id;
        s_cap.stream_lo = act_rt.stream;
        dt_idmap_init(&s_cap.index);
    }
    act_runtime_end();
    return rc;
}

bool act_capture_thread(void) { return s_cap.on && pthread_equal(s_cap.thread, pthread_self()); }

mb_writer *act_capture_record(int64_t device, uint64_t free_id)
{
    if (free_id && free_id < s_cap.tensor_lo) {
        if (s_cap.nfrees == s_cap.cap_frees) {
            size_t cap = s_cap.cap_frees ? 2 * s_cap.cap_frees : 64;
            s_free *grown = realloc(s_cap.frees, cap * sizeof *grown);
            if (!grown) {
                snprintf(s_cap.failed, sizeof s_cap.failed, "out of memory");
                return NULL;
            }
            s_cap.frees = grown;
            s_cap.cap_frees = cap;
        }
        s_cap.frees[s_cap.nfrees++] = (s_free){device, free_id};
        return NULL;
    }
    uintptr_t at = (uintptr_t)dt_idmap_get(&s_cap.index, (uint64_t)device + 1);
    if (!at) {
        if (s_cap.ndevs == s_cap.cap_devs) {
            int cap = s_cap.cap_devs ? 2 * s_cap.cap_devs : 8;
            s_dev *grown = realloc(s_cap.devs, (size_t)cap * sizeof *grown);
            if (!grown)
                goto nomem;
            s_cap.devs = grown;
            s_cap.cap_devs = cap;
        }
        if (dt_idmap_put(&s_cap.index, (uint64_t)device + 1, (void *)(uintptr_t)(s_cap.ndevs + 1)) != 0)
            goto nomem;
        s_cap.devs[s_cap.ndevs] = (s_dev){.device = device};
        at = (uintptr_t)++s_cap.ndevs;
    }
    s_dev *d = &s_cap.devs[at - 1];
    d->nrecords++;
    return &d->pk;
nomem:
    /* the record still needs somewhere to go: a scratch writer, and the capture fails */
    snprintf(s_cap.failed, sizeof s_cap.failed, "out of memory");
    static mb_writer scratch;
    scratch.size = 0;
    return &scratch;
}

/* Ends the capture under the lock: its held-back FREEs go out for real (send), its buffers are
 * freed. */
static void s_finish(bool send)
{
    act_runtime *rt = &act_rt;
    for (size_t i = 0; send && i < s_cap.nfrees; i++) {
        act_device *dev = rt->devices[s_cap.frees[i].device];
        if (dev && dev->state != ACT_DEV_DEAD)
            mb_encode_free(act_runtime_record_now(s_cap.frees[i].device), s_cap.frees[i].id);
    }
    for (int i = 0; i < s_cap.ndevs; i++)
        free(s_cap.devs[i].pk.data);
    free(s_cap.devs);
    free(s_cap.frees);
    dt_idmap_destroy(&s_cap.index);
    rt->stream = s_cap.stream_lo; /* nothing ran: no random numbers were used */
    memset(&s_cap, 0, sizeof s_cap);
}

void act_capture_abort(void)
{
    pthread_mutex_lock(&act_rt.lock);
    if (s_cap.on)
        s_finish(true);
    pthread_mutex_unlock(&act_rt.lock);
}

void act_capture_reset(void)
{
    if (s_cap.on)
        s_finish(false);
}

int act_capture_end(const uint64_t *ins, int nins, const uint64_t *outs, int nouts, act_graph_ref **out)
{
    *out = NULL;
    act_runtime *rt = &act_rt;
    if (act_runtime_begin("capture", NULL, 0) != 0) {
        act_capture_abort();
        return dt_last_error_code();
    }
    int rc = 0;
    act_graph_ref *g = NULL;
    if (!s_cap.on)
        rc = dt_err(DT_EINVAL, "capture: no capture is running");
    else if (s_cap.failed[0])
        rc = dt_err(DT_EUNSUPPORTED, "capture '%s': %s", s_cap.name, s_cap.failed);
    else if (nins > MB_MAX_IDS || nouts > MB_MAX_IDS)
        rc = dt_err(DT_EUNSUPPORTED, "capture '%s': %d tensor inputs and %d tensor outputs; at most %d of each",
                    s_cap.name, nins, nouts, MB_MAX_IDS);
    else if (rt->epoch != (s_cap.epoch & 0xffffffffu))
        rc = dt_err(DT_ESHUTDOWN, "capture '%s': the runtime was shut down while capturing", s_cap.name);
    else if (!(g = calloc(1, sizeof *g)) || !(g->devices = calloc((size_t)(s_cap.ndevs ? s_cap.ndevs : 1),
                                                                  sizeof *g->devices)))
        rc = dt_err(DT_ENOMEM, "capture: out of memory");
    for (int i = 0; rc == 0 && i < s_cap.ndevs; i++) {
        act_device *dev = rt->devices[s_cap.devs[i].device];
        if (s_cap.devs[i].pk.failed)
            rc = dt_err(DT_ENOMEM, "capture '%s': out of memory for its records", s_cap.name);
        else if (!dev || dev->state == ACT_DEV_DEAD)
            rc = dt_err(DT_EDEVICE, "capture '%s': device %" PRId64 " is dead: %s", s_cap.name, s_cap.devs[i].device,
                        dev ? dev->reason : "never started");
    }
    bool was_on = s_cap.on;
    s_cap.on = false; /* what follows goes to the outboxes */
    if (rc == 0) {
        g->graph = s_next_graph++;
        g->epoch = s_cap.epoch & 0xffffffffu;
        g->tensor_lo = s_cap.tensor_lo;
        g->tensors = rt->next_tensor_id - s_cap.tensor_lo;
        g->transfers = rt->next_transfer_id - s_cap.transfer_lo;
        g->streams = rt->stream - s_cap.stream_lo;
        snprintf(g->name, sizeof g->name, "%s", s_cap.name);
        for (int i = 0; i < s_cap.ndevs; i++) {
            s_dev *d = &s_cap.devs[i];
            int frame = act_runtime_payload(d->device, (mb_buf){d->pk.data, d->pk.size, mb_buf_free, NULL});
            d->pk.data = NULL; /* the frame owns it now */
            mb_encode_define(act_runtime_record_now(d->device), g->graph, g->name, s_cap.tensor_lo, rt->next_tensor_id,
                             s_cap.transfer_lo, rt->next_transfer_id, s_cap.stream_lo, rt->stream, nins, ins, nouts,
                             outs, d->nrecords, frame);
            g->devices[g->ndevices++] = d->device;
            g->nrecords += d->nrecords;
        }
        *out = g;
    } else if (g) {
        free(g->devices);
        free(g);
    }
    if (was_on)
        s_finish(true);
    act_runtime_end();
    return rc;
}

int act_capture_replay(const act_graph_ref *g, const uint64_t *ins, int nins, uint64_t *tensor_base)
{
    act_runtime *rt = &act_rt;
    if (act_runtime_begin(g->name, NULL, 0) != 0)
        return dt_last_error_code();
    int rc = act_capture_refuse("replay");
    if (rc == 0 && g->epoch != rt->epoch)
        rc = dt_err(DT_ESHUTDOWN, "replay of '%s': it was captured before dtorch.shutdown() and no longer exists",
                    g->name);
    for (int i = 0; rc == 0 && i < g->ndevices; i++) {
        act_device *dev = rt->devices[g->devices[i]];
        if (dev->state == ACT_DEV_DEAD)
            rc = dt_err(DT_EDEVICE, "replay of '%s': device %" PRId64 " is dead: %s", g->name, dev->id, dev->reason);
    }
    if (rc == 0) {
        uint64_t base = rt->next_tensor_id, transfers = rt->next_transfer_id, streams = rt->stream;
        rt->next_tensor_id += g->tensors;
        rt->next_transfer_id += g->transfers;
        rt->stream += g->streams;
        for (int i = 0; i < g->ndevices; i++)
            mb_encode_replay(act_runtime_record(g->devices[i]), g->graph, nins, ins, base, transfers, rt->seed, streams);
        *tensor_base = base;
    }
    act_runtime_end();
    return rc;
}

void act_capture_drop(act_graph_ref **gp)
{
    act_graph_ref *g = *gp;
    *gp = NULL;
    if (!g)
        return;
    act_runtime *rt = &act_rt;
    pthread_mutex_lock(&rt->lock);
    if (rt->running && !rt->stopping && rt->epoch == g->epoch)
        for (int i = 0; i < g->ndevices; i++) {
            act_device *dev = rt->devices[g->devices[i]];
            if (dev && dev->state != ACT_DEV_DEAD)
                mb_encode_drop(act_runtime_record_now(g->devices[i]), g->graph);
        }
    pthread_mutex_unlock(&rt->lock);
    free(g->devices);
    free(g);
}
