/* act_worker_records — every record a device runs goes through act_worker_run_record, from a
 * batch or a replay: it reads the record's code and hands it to its runner (the ops, the peers',
 * the replays'), timing it while the device traces. The records that answer the controller (SYNC,
 * FETCH, STATS, TRACE) are answered here, into the reply of the batch being run: values lent by
 * handle or sent as frames, and errors. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "act_worker.h"
#include "dt_dtype.h"
#include "dt_error.h"
#include "dt_pool.h"
#include "dt_shm.h"
#include "mb_schema.h"
#include "op_backend.h"

static int s_add_payload(act_worker *w, mb_buf buf)
{
    if (w->npayloads == w->cap_payloads) {
        int cap = w->cap_payloads ? 2 * w->cap_payloads : 8;
        mb_buf *grown = realloc(w->payloads, (size_t)cap * sizeof *grown);
        if (!grown) {
            if (buf.free_fn)
                buf.free_fn(buf.data, buf.hint);
            return -1;
        }
        w->payloads = grown;
        w->cap_payloads = cap;
    }
    w->payloads[w->npayloads] = buf;
    return w->npayloads++;
}

static void s_reply_error(act_worker *w, uint64_t fid, int64_t piece, int code, const char *msg)
{
    mb_encode_error(&w->reply, fid, piece, code, msg);
    w->nreply++;
}

/* The bytes of t as a payload frame: straight from its storage when the host can read device
 * memory in place, else a host copy. -1 (and why) when there is no memory for it. (Pieces in
 * shared memory are lent to the controller by handle instead: s_reply_value.) */
static int s_piece_frame(act_worker *w, const act_wtensor *t, const char **why)
{
    size_t size = act_wtensor_bytes(t);
    if (w->backend->host_view) {
        atomic_fetch_add(&t->storage->refs, 1);
        return s_add_payload(w, (mb_buf){(void *)w->backend->host_view(t->data), size, act_storage_free_fn, t->storage});
    }
    void *host = malloc(size ? size : 1);
    if (!host || (*why = act_copy_bytes(w->backend->to_host, host, t->data, size))) {
        free(host);
        return -1;
    }
    return s_add_payload(w, (mb_buf){host, size, mb_buf_free, NULL});
}

/* A VALUE completion for piece of future fid: t's bytes, lent by handle when they are in shared
 * memory, else as a frame; or none (t NULL: a SYNC's answer). */
static void s_reply_value(act_worker *w, uint64_t fid, int64_t piece, act_wtensor *t)
{
    int frame = -1;
    act_handle lent = {.segment = -1};
    if (t && (lent = act_shm_lend(w, t, 0, act_wtensor_bytes(t), -1)).segment >= 0) {
        w->stats[MB_STAT_shm_bytes_fetched] += (int64_t)act_wtensor_bytes(t);
    } else if (t) {
        const char *why = "out of memory on the device";
        if ((frame = s_piece_frame(w, t, &why)) < 0) {
            s_reply_error(w, fid, piece, DT_ENOMEM, why);
            return;
        }
    }
    mb_encode_value(&w->reply, fid, piece, t ? t->dtype : DT_FLOAT32, t ? t->ndim : 0, t ? t->shape : NULL, frame,
                    lent.segment, lent.serial, lent.offset, lent.hold);
    w->nreply++;
}

/* A STATS record's answer: the counters as a VALUE of MB_NSTATS int64. */
static void s_reply_stats(act_worker *w, uint64_t fid, int64_t piece)
{
    w->stats[MB_STAT_pooled_bytes] = (int64_t)(dt_pool_kept() + dt_shm_kept());
    w->stats[MB_STAT_onednn_convs] = op_backend_onednn_convs(); /* this thread ran the device's kernels */
    w->stats[MB_STAT_onednn_matmuls] = op_backend_onednn_matmuls();
    int64_t *counters = malloc(sizeof w->stats);
    if (counters)
        memcpy(counters, w->stats, sizeof w->stats);
    int frame = counters ? s_add_payload(w, (mb_buf){counters, sizeof w->stats, mb_buf_free, NULL}) : -1;
    if (frame < 0) {
        s_reply_error(w, fid, piece, DT_ENOMEM, "out of memory on the device");
        return;
    }
    mb_encode_value(&w->reply, fid, piece, DT_INT64, 1, (const int64_t[]){MB_NSTATS}, frame, -1, 0, 0, 0);
    w->nreply++;
}

void act_worker_drop_reply(act_worker *w)
{
    for (int i = 0; i < w->npayloads; i++)
        if (w->payloads[i].free_fn)
            w->payloads[i].free_fn(w->payloads[i].data, w->payloads[i].hint);
    w->npayloads = 0;
    w->nreply = 0;
    w->reply.size = 0;
    w->reply.failed = false;
}

void act_worker_failure(const act_worker *w, char *msg, size_t size, const char *op, const char *why)
{
    char where[160];
    snprintf(msg, size, "%s failed on device %" PRId64 "%s: %s", op, w->device, act_replay_where(w, where, sizeof where),
             why);
}

static int64_t s_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Gives back the marks of the events kept and of the start (a backend that marks). */
static void s_trace_marks_clear(act_worker *w)
{
    const op_backend *b = w->backend;
    if (!b->mark)
        return;
    for (size_t i = 0; w->trace_marks && i < 2 * w->ntrace; i++) {
        b->mark_free(w->trace_marks[i]);
        w->trace_marks[i] = NULL;
    }
    b->mark_free(w->trace_mark0);
    w->trace_mark0 = NULL;
}

void act_worker_trace_free(act_worker *w)
{
    s_trace_marks_clear(w);
    free(w->trace_marks);
    free(w->trace);
}

/* With a backend that marks, each event's times become when the device ran its work (from its
 * marks, counted from the start's mark at host time trace_t0) instead of when the worker queued
 * it; an event whose marks cannot tell keeps the host's times. */
static void s_trace_marks_resolve(act_worker *w)
{
    const op_backend *b = w->backend;
    if (!b->mark || !w->trace_mark0)
        return;
    for (size_t i = 0; i < w->ntrace; i++) {
        int64_t *e = w->trace + i * MB_TRACE_FIELDS;
        int64_t from = b->mark_elapsed_ns(w->trace_mark0, w->trace_marks[2 * i]);
        int64_t to = b->mark_elapsed_ns(w->trace_mark0, w->trace_marks[2 * i + 1]);
        if (from >= 0 && to >= from) {
            e[MB_TRACE_BEGIN] = w->trace_t0 + from;
            e[MB_TRACE_END] = w->trace_t0 + to;
        }
    }
}

/* TRACE: start, stop, or send the events (an int64 (n, MB_TRACE_FIELDS) value). */
static bool s_trace(act_worker *w, mb_cursor *rec)
{
    mb_trace_rec r;
    if (mb_read_trace(rec, &r) != 0)
        return false;
    size_t rows = r.action == MB_TRACE_SEND ? w->ntrace : 1;
    size_t bytes = rows * (r.action == MB_TRACE_SEND ? MB_TRACE_FIELDS : 1) * sizeof(int64_t);
    int64_t *v = malloc(bytes ? bytes : 1);
    if (!v) {
        s_reply_error(w, r.future, r.piece, DT_ENOMEM, "out of memory on the device");
        return true;
    }
    if (r.action == MB_TRACE_START) {
        s_trace_marks_clear(w);
        w->ntrace = 0;
        w->tracing = true;
        if (w->backend->mark) {
            /* the start's mark is reached at once on an idle device: it ties device time to the host's */
            if (w->backend->synchronize)
                w->backend->synchronize();
            w->trace_mark0 = w->backend->mark();
        }
        w->trace_t0 = s_now_ns();
        v[0] = 0;
    } else if (r.action == MB_TRACE_STOP) {
        w->tracing = false;
        v[0] = (int64_t)w->ntrace;
    } else if (r.action == MB_TRACE_SEND) {
        s_trace_marks_resolve(w);
        if (bytes) /* nothing traced: no buffer either */
            memcpy(v, w->trace, bytes);
        s_trace_marks_clear(w);
        w->ntrace = 0;
    } else {
        free(v);
        s_reply_error(w, r.future, r.piece, DT_EINVAL, "unknown trace action");
        return true;
    }
    int frame = s_add_payload(w, (mb_buf){v, bytes, mb_buf_free, NULL});
    if (frame < 0) {
        s_reply_error(w, r.future, r.piece, DT_ENOMEM, "out of memory on the device");
        return true;
    }
    if (r.action == MB_TRACE_SEND)
        mb_encode_value(&w->reply, r.future, r.piece, DT_INT64, 2, (const int64_t[]){(int64_t)rows, MB_TRACE_FIELDS},
                        frame, -1, 0, 0, 0);
    else
        mb_encode_value(&w->reply, r.future, r.piece, DT_INT64, 1, (const int64_t[]){1}, frame, -1, 0, 0, 0);
    w->nreply++;
    return true;
}

static bool s_run_record(act_worker *w, mb_cursor *rec, mb_message *m, int64_t code);

bool act_worker_run_record(act_worker *w, mb_cursor *rec, mb_message *m)
{
    uint64_t id;
    if (!w->tracing && mb_read_free_fast(rec, &id)) { /* every op's second record */
        act_replay_free(w, id);
        return true;
    }
    const mb_cursor start = *rec;
    int64_t code;
    bool ok;
    if (mb_record_code(rec, &code) != 0)
        return false;
    if (code == MB_OP_TRACE || !w->tracing) {
        ok = code == MB_OP_TRACE ? s_trace(w, rec) : s_run_record(w, rec, m, code);
        if (!ok)
            *rec = start; /* read in part at most: left for the body reader to step over */
        return ok;
    }
    const op_backend *b = w->backend;
    bool marked = b->mark && w->ntrace < ACT_TRACE_MARKED;
    void *mark_begin = marked ? b->mark() : NULL;
    int64_t begin = s_now_ns();
    ok = s_run_record(w, rec, m, code);
    if (!ok)
        *rec = start;
    void *mark_end = marked ? b->mark() : NULL;
    if (w->ntrace == w->cap_trace && w->cap_trace < ACT_TRACE_MAX) {
        size_t cap = w->cap_trace ? 2 * w->cap_trace : 4096;
        int64_t *grown = realloc(w->trace, cap * MB_TRACE_FIELDS * sizeof *grown);
        void **marks = grown && b->mark ? realloc(w->trace_marks, cap * 2 * sizeof *marks) : NULL;
        if (grown)
            w->trace = grown;
        if (marks)
            w->trace_marks = marks;
        if (grown && (!b->mark || marks))
            w->cap_trace = cap;
    }
    if (w->ntrace < w->cap_trace) {
        if (b->mark) {
            w->trace_marks[2 * w->ntrace] = mark_begin;
            w->trace_marks[2 * w->ntrace + 1] = mark_end;
            mark_begin = mark_end = NULL;
        }
        int64_t *e = w->trace + w->ntrace++ * MB_TRACE_FIELDS, op = -1;
        uint64_t number;
        if (code == MB_OP_COMPUTE && mb_field_u64(&start, 1, &number) && number <= INT64_MAX)
            op = (int64_t)number;   /* a COMPUTE's op number comes first */
        e[MB_TRACE_CODE] = code;
        e[MB_TRACE_OP] = op;
        e[MB_TRACE_BEGIN] = begin;
        e[MB_TRACE_END] = s_now_ns();
    }
    if (b->mark) {
        b->mark_free(mark_begin); /* an event dropped past ACT_TRACE_MAX */
        b->mark_free(mark_end);
    }
    return ok;
}

static bool s_run_record(act_worker *w, mb_cursor *rec, mb_message *m, int64_t code)
{
    switch (code) {
    case MB_OP_SYNC: {
        mb_sync_rec r;
        if (mb_read_sync(rec, &r) != 0)
            return false;
        const char *why = w->backend->synchronize ? w->backend->synchronize() : NULL;
        if (why)
            s_reply_error(w, r.future, r.piece, DT_EKERNEL, why);
        else
            s_reply_value(w, r.future, r.piece, NULL);
        return true;
    }
    case MB_OP_FREE: {
        mb_free_rec r;
        if (mb_read_free(rec, &r) != 0)
            return false;
        act_replay_free(w, r.id);
        return true;
    }
    case MB_OP_FETCH: {
        mb_fetch_rec r;
        const char *why;
        if (mb_read_fetch(rec, &r) != 0)
            return false;
        act_wtensor *t = act_wtensor_lookup(w, r.id, &why);
        if (t)
            s_reply_value(w, r.future, r.piece, t);
        else
            s_reply_error(w, r.future, r.piece, DT_EKERNEL, why);
        return true;
    }
    case MB_OP_STATS: {
        mb_stats_rec r;
        if (mb_read_stats(rec, &r) != 0)
            return false;
        s_reply_stats(w, r.future, r.piece);
        if (r.reset_peak)
            w->stats[MB_STAT_peak_bytes] = w->stats[MB_STAT_bytes_in_use];
        return true;
    }
    case MB_OP_SEND:
        return act_peer_send(w, rec);
    case MB_OP_ASSEMBLE:
        return act_peer_assemble(w, rec);
    case MB_OP_COMPUTE:
        return act_worker_compute(w, rec);
    case MB_OP_DEFINE:
        if (!m || w->replay) {
            dt_err(DT_EPROTO, "malformed define record: inside a captured sequence");
            return false;
        }
        return act_replay_define(w, rec, m);
    case MB_OP_REPLAY:
        if (w->replay) {
            dt_err(DT_EPROTO, "malformed replay record: inside a captured sequence");
            return false;
        }
        return act_replay_run(w, rec);
    case MB_OP_DROP:
        return act_replay_drop(w, rec);
    default:
        if (!m && code == MB_OP_LOAD) {
            dt_err(DT_EPROTO, "malformed load record: inside a captured sequence");
            return false;
        }
        act_worker_make(w, code, rec, m);
        return true;
    }
}
