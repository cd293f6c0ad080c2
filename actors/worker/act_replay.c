/* act_replay — a device's captured op sequences: kept once (DEFINE), run again on new inputs
 * by one small record (REPLAY), forgotten (DROP).
 *
 * A DEFINE brings the records the controller packed for this device while it captured a
 * function (dtorch.capture), scanned here once and kept as bytes, with every id a replay rewrites
 * widened to a full uint64 (0xcf and 8 bytes) so that it is patched where it lies, in place.
 * Before each replay those ids are patched: an input's id becomes the replay's input,
 * an id the capture made moves into the replay's own block of fresh ids (tensor_base + (id -
 * tensor_lo)), and so do transfers and random streams; then the records run through the
 * worker's one record runner, exactly as a batch would. Every other tensor the records name is
 * a constant (weights, a KV cache written in place): it is pinned, so a FREE from the
 * controller leaves it until the sequence is dropped. Tensors the capture made and neither freed
 * nor returned are freed at the end of each replay.
 *
 * Records that need the controller (FETCH, SYNC, STATS, LOAD) or nest captures are refused at
 * capture time; a DEFINE holding one anyway keeps the sequence broken, and its replays poison
 * their outputs with why. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "act_worker.h"
#include "dt_error.h"
#include "mb_codec.h"

typedef enum { S_RANGE, S_INPUT, S_TRANSFER, S_SEED, S_STREAM } s_kind;

/* One id inside the kept records that each replay rewrites. */
typedef struct {
    size_t at;        /* while scanning, the offset of its encoding in the DEFINE's bytes; then of its 8
                       * big-endian bytes in the kept ones */
    int len;          /* while scanning, the bytes of its encoding there */
    s_kind kind;
    uint64_t value;   /* as captured; for S_INPUT, the input's slot */
} s_patch;

struct act_graph {
    uint64_t id;
    char name[96];
    char *error;                    /* why the sequence cannot run (NULL: it can) */
    uint8_t *bytes;                 /* the records' msgpack, patched ids widened */
    mb_cursor *records;             /* each record's bytes in them */
    uint32_t nrecords;
    s_patch *patches;
    size_t npatches, cap_patches;
    uint64_t tensor_lo, tensor_hi, transfer_lo, transfer_hi, stream_lo, stream_hi;
    mb_ids ins, outs;
    uint64_t *constants;            /* pinned tensor ids */
    size_t nconstants, cap_constants;
    uint64_t *leftovers;            /* ids the capture made, kept by nothing: freed after a replay */
    size_t nleftovers;
};

static bool s_grow(void **items, size_t *cap, size_t n, size_t size)
{
    if (n < *cap)
        return true;
    size_t grown = *cap ? *cap * 2 : 64;
    void *p = realloc(*items, grown * size);
    if (!p)
        return false;
    *items = p;
    *cap = grown;
    return true;
}

static void s_graph_free(act_graph *g)
{
    if (!g)
        return;
    free(g->records);
    free(g->bytes);
    free(g->patches);
    free(g->constants);
    free(g->leftovers);
    free(g->error);
    free(g);
}

static bool s_in(const mb_ids *ids, uint64_t id, int *slot)
{
    for (int i = 0; i < ids->n; i++)
        if (ids->v[i] == id) {
            if (slot)
                *slot = i;
            return true;
        }
    return false;
}

/* ---- pins: constants of kept sequences outlive the controller's FREE ----------------------- */

/* the pin map holds (count << 1 | freed) per tensor id, never 0 */
static void s_pin(act_worker *w, uint64_t id)
{
    uintptr_t v = (uintptr_t)dt_idmap_get(&w->pins, id);
    dt_idmap_put(&w->pins, id, (void *)(v + 2));
}

static void s_unpin(act_worker *w, uint64_t id)
{
    uintptr_t v = (uintptr_t)dt_idmap_take(&w->pins, id);
    if (v >= 4)
        dt_idmap_put(&w->pins, id, (void *)(v - 2));
    else if (v & 1)
        act_wtensor_drop(w, id);   /* the controller freed it while a sequence still used it */
}

void act_replay_free(act_worker *w, uint64_t id)
{
    uintptr_t v = (uintptr_t)dt_idmap_get(&w->pins, id);
    if (v)
        dt_idmap_put(&w->pins, id, (void *)(v | 1));
    else
        act_wtensor_drop(w, id);
}

/* ---- DEFINE --------------------------------------------------------------------------------- */

typedef struct {
    act_worker *w;
    act_graph *g;
    const uint8_t *base;            /* the DEFINE's bytes, which patch offsets count from */
    dt_idmap made, freed, pinned;   /* ids the records make and free; constants pinned so far */
    bool nomem;
} s_scan;

/* A field the scan looks at: its place in the bytes, and its value when it is an integer >= 0. */
typedef struct {
    mb_cursor at;
    bool is_uint;
    uint64_t value;
    int len;
} s_field;

static s_field s_at(mb_cursor at)
{
    s_field f = {.at = at};
    mb_cursor c = at;
    f.is_uint = mb_read_u64(&c, &f.value);
    f.len = (int)(c.p - at.p);
    return f;
}

/* Element i of the array at c (a record, or one of a list's elements); none when c holds no such
 * element. The bytes were checked whole (mb_body_next), so a skip only fails on a short array. */
static s_field s_elem(mb_cursor c, uint32_t i)
{
    mb_cursor at;
    return mb_elem(c, i, &at) ? s_at(at) : (s_field){.is_uint = false};
}

static void s_add_patch(s_scan *s, const s_field *f, s_kind kind, uint64_t value)
{
    act_graph *g = s->g;
    if (!s_grow((void **)&g->patches, &g->cap_patches, g->npatches, sizeof *g->patches)) {
        s->nomem = true;
        return;
    }
    g->patches[g->npatches++] = (s_patch){(size_t)(f->at.p - s->base), f->len, kind, value};
}

typedef enum { S_USE, S_MAKE, S_FREE } s_role;

/* A tensor id field: patched when an input or made by the capture, else a constant to pin.
 * Fields of the wrong type are left alone: the record's decoder refuses them when it runs. */
static void s_tensor(s_scan *s, s_field f, s_role role)
{
    if (!f.is_uint)
        return;
    act_graph *g = s->g;
    uint64_t id = f.value;
    int slot;
    if (id >= g->tensor_lo && id < g->tensor_hi) {
        s_add_patch(s, &f, S_RANGE, id);
        if (role != S_USE && dt_idmap_put(role == S_MAKE ? &s->made : &s->freed, id, (void *)1) != 0)
            s->nomem = true;
    } else if (s_in(&g->ins, id, &slot)) {
        s_add_patch(s, &f, S_INPUT, (uint64_t)slot);
    } else if (id && id != UINT64_MAX && !dt_idmap_get(&s->pinned, id)) {
        if (dt_idmap_put(&s->pinned, id, (void *)1) != 0 ||
            !s_grow((void **)&g->constants, &g->cap_constants, g->nconstants, sizeof *g->constants)) {
            s->nomem = true;
            return;
        }
        g->constants[g->nconstants++] = id;
        s_pin(s->w, id);
    }
}

static void s_transfer(s_scan *s, s_field f)
{
    if (f.is_uint && f.value >= s->g->transfer_lo && f.value < s->g->transfer_hi)
        s_add_patch(s, &f, S_TRANSFER, f.value);
}

/* fn on each element of the array field `list` (field UINT32_MAX), or on field `field` of each */
static void s_each(s_scan *s, mb_cursor rec, uint32_t list, uint32_t field, void (*fn)(s_scan *, s_field))
{
    mb_cursor c;
    uint32_t n;
    if (!mb_elem(rec, list, &c) || !mb_read_array(&c, &n))
        return;
    for (uint32_t i = 0; i < n; i++) {
        fn(s, field == UINT32_MAX ? s_at(c) : s_elem(c, field));
        if (mb_skip(&c) != 0)
            return;
    }
}

static void s_use(s_scan *s, s_field f) { s_tensor(s, f, S_USE); }
static void s_make_id(s_scan *s, s_field f) { s_tensor(s, f, S_MAKE); }

/* Finds what each replay rewrites in one record; a message when the record may not be replayed. */
static const char *s_scan_record(s_scan *s, mb_cursor rec)
{
    int64_t code;
    if (mb_record_code(&rec, &code) != 0)
        return "a record without a code";
    switch (code) {
    case MB_OP_FREE:
        s_tensor(s, s_elem(rec, 1), S_FREE);
        return NULL;
    case MB_OP_EMPTY:
    case MB_OP_FILL:
    case MB_OP_ARANGE:
        s_tensor(s, s_elem(rec, 1), S_MAKE);
        return NULL;
    case MB_OP_RANDOM: {
        s_tensor(s, s_elem(rec, 1), S_MAKE);
        s_field seed = s_elem(rec, 6), stream = s_elem(rec, 7);
        if (seed.is_uint)
            s_add_patch(s, &seed, S_SEED, seed.value);
        if (stream.is_uint && stream.value >= s->g->stream_lo && stream.value < s->g->stream_hi)
            s_add_patch(s, &stream, S_STREAM, stream.value);
        return NULL;
    }
    case MB_OP_SEND:
        s_tensor(s, s_elem(rec, 1), S_USE);
        s_transfer(s, s_elem(rec, 2));
        return NULL;
    case MB_OP_ASSEMBLE:
        s_tensor(s, s_elem(rec, 4), S_USE);
        s_tensor(s, s_elem(rec, 1), S_MAKE);
        s_each(s, rec, 6, 3, s_transfer); /* each part's transfer (PARTS follows into) */
        return NULL;
    case MB_OP_COMPUTE:
        s_each(s, rec, 2, UINT32_MAX, s_use);
        s_each(s, rec, 8, 0, s_make_id); /* outs; views name inputs by position, not by id */
        return NULL;
    default:
        return "a record that needs the controller (a fetch, a sync, host data) or another capture";
    }
}

static int s_patch_order(const void *a, const void *b)
{
    size_t x = ((const s_patch *)a)->at, y = ((const s_patch *)b)->at;
    return x < y ? -1 : x > y;
}

/* The kept bytes: src with each patched id widened to 0xcf and 8 bytes, the patches moved to
 * where those 8 bytes lie, and each record's place in them; NULL or why not. */
static const char *s_widen(act_graph *g, const uint8_t *src, size_t size)
{
    if (g->npatches)
        qsort(g->patches, g->npatches, sizeof *g->patches, s_patch_order);
    size_t grown = size;
    for (size_t i = 0; i < g->npatches; i++)
        grown += 9 - (size_t)g->patches[i].len;
    g->bytes = malloc(grown ? grown : 1);
    g->records = calloc(g->nrecords ? g->nrecords : 1, sizeof *g->records);
    if (!g->bytes || !g->records)
        return "out of memory on the device";
    size_t from = 0, to = 0;
    for (size_t i = 0; i < g->npatches; i++) {
        s_patch *p = &g->patches[i];
        memcpy(g->bytes + to, src + from, p->at - from);
        to += p->at - from;
        g->bytes[to++] = 0xcf;
        from = p->at + (size_t)p->len;
        p->at = to;
        to += 8;
    }
    if (size > from)
        memcpy(g->bytes + to, src + from, size - from);
    mb_body_reader r;
    if (mb_body_init(&r, g->bytes, grown, g->nrecords) != 0)
        return dt_last_error();
    for (uint32_t i = 0; i < g->nrecords; i++)
        if (mb_body_next(&r, &g->records[i]) != 1)
            return dt_last_error();
    return NULL;
}

static void s_put_be64(uint8_t *at, uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        at[i] = (uint8_t)v;
}

bool act_replay_define(act_worker *w, mb_cursor *rec, mb_message *m)
{
    mb_define_rec r;
    if (mb_read_define(rec, &r) != 0)
        return false;
    if (r.graph == 0 || r.graph == UINT64_MAX || r.count < 0 || r.count > UINT32_MAX || r.frame < 0 ||
        r.frame >= m->npayloads || r.tensor_lo == 0 || r.tensor_lo > r.tensor_hi || r.transfer_lo == 0 ||
        r.transfer_lo > r.transfer_hi || r.stream_lo > r.stream_hi) {
        dt_err(DT_EPROTO, "malformed define record: bad graph id, count, frame or id ranges");
        return false;
    }
    act_graph *g = calloc(1, sizeof *g);
    if (!g) {
        dt_err(DT_ENOMEM, "define: out of memory");
        return false;
    }
    g->id = r.graph;
    snprintf(g->name, sizeof g->name, "%.*s", (int)(r.name.len < 90 ? r.name.len : 90), r.name.ptr);
    g->tensor_lo = r.tensor_lo, g->tensor_hi = r.tensor_hi;
    g->transfer_lo = r.transfer_lo, g->transfer_hi = r.transfer_hi;
    g->stream_lo = r.stream_lo, g->stream_hi = r.stream_hi;
    g->ins = r.ins;
    g->outs = r.outs;
    zmq_msg_t *frame = &m->payloads[r.frame];
    size_t size = zmq_msg_size(frame);
    g->nrecords = (uint32_t)r.count;
    const char *why = NULL;
    s_scan s = {.w = w, .g = g};
    dt_idmap_init(&s.made);
    dt_idmap_init(&s.freed);
    dt_idmap_init(&s.pinned);
    s.base = zmq_msg_data(frame);
    mb_body_reader reader;
    mb_cursor one;
    if (mb_body_init(&reader, s.base, size, g->nrecords) != 0) {
        why = dt_last_error();
    } else {
        for (uint32_t i = 0; i < g->nrecords && !why; i++) {
            int rc = mb_body_next(&reader, &one);
            why = rc == 1 ? s_scan_record(&s, one) : rc == 0 ? "fewer records than declared" : dt_last_error();
        }
        if (!why && mb_body_next(&reader, &one) != 0)
            why = "bytes after the declared records";
    }
    if (!why && s.nomem)
        why = "out of memory on the device";
    if (!why)
        why = s_widen(g, s.base, size);
    if (!why) {
        /* made, neither freed nor returned: nothing keeps them after a replay */
        size_t cursor = 0, n = 0;
        uint64_t id;
        void *v;
        g->leftovers = malloc((s.made.count ? s.made.count : 1) * sizeof *g->leftovers);
        while (g->leftovers && dt_idmap_next(&s.made, &cursor, &id, &v))
            if (!dt_idmap_get(&s.freed, id) && !s_in(&g->outs, id, NULL))
                g->leftovers[n++] = id;
        g->nleftovers = n;
        if (!g->leftovers)
            why = "out of memory on the device";
    }
    dt_idmap_destroy(&s.made);
    dt_idmap_destroy(&s.freed);
    dt_idmap_destroy(&s.pinned);
    if (why) {
        char msg[DT_ERRMSG_MAX];
        snprintf(msg, sizeof msg, "captured '%s' cannot run on device %" PRId64 ": %s", g->name, w->device, why);
        g->error = strdup(msg);
        fprintf(stderr, "dtorch worker %" PRId64 ": %s\n", w->device, msg);
    }
    act_graph *old = dt_idmap_take(&w->graphs, g->id);
    if (old)
        act_replay_forget(w, old);
    if (dt_idmap_put(&w->graphs, g->id, g) != 0) {
        act_replay_forget(w, g);
        dt_err(DT_ENOMEM, "define: out of memory");
        return false;
    }
    return true;
}

/* ---- REPLAY and DROP ------------------------------------------------------------------------ */

bool act_replay_run(act_worker *w, mb_cursor *rec)
{
    mb_replay_rec r;
    if (mb_read_replay(rec, &r) != 0)
        return false;
    act_graph *g = dt_idmap_get(&w->graphs, r.graph);
    if (!g || r.ins.n != g->ins.n) {
        dt_err(DT_EPROTO, "malformed replay record: %s", g ? "wrong number of inputs" : "no such captured sequence");
        return false;
    }
    /* each block of fresh ids holds as many as the capture made, none past the last one (UINT64_MAX is
     * no id, nor is 0) */
    if (r.tensor_base == 0 || g->tensor_hi - g->tensor_lo > UINT64_MAX - r.tensor_base || r.transfer_base == 0 ||
        g->transfer_hi - g->transfer_lo > UINT64_MAX - r.transfer_base ||
        g->stream_hi - g->stream_lo > UINT64_MAX - r.stream_base) {
        dt_err(DT_EPROTO, "malformed replay record: a block of fresh ids runs past the last id");
        return false;
    }
    if (g->error) {
        for (int o = 0; o < g->outs.n; o++)
            if (g->outs.v[o] >= g->tensor_lo && g->outs.v[o] < g->tensor_hi)
                act_wtensor_poison(w, r.tensor_base + (g->outs.v[o] - g->tensor_lo), g->error);
        return true;
    }
    for (size_t i = 0; i < g->npatches; i++) {
        s_patch *p = &g->patches[i];
        uint64_t v = p->value;
        switch (p->kind) {
        case S_RANGE: v = r.tensor_base + (v - g->tensor_lo); break;
        case S_INPUT: v = r.ins.v[v]; break;
        case S_TRANSFER: v = r.transfer_base + (v - g->transfer_lo); break;
        case S_SEED: v = r.seed; break;
        case S_STREAM: v = r.stream_base + (v - g->stream_lo); break;
        }
        s_put_be64(g->bytes + p->at, v);
    }
    w->replay = g;
    for (uint32_t i = 0; i < g->nrecords; i++) {
        w->replay_at = i;
        mb_cursor rec = g->records[i];
        if (!act_worker_run_record(w, &rec, NULL))
            fprintf(stderr, "dtorch worker %" PRId64 ": dropped a malformed record of captured '%s': %s\n", w->device,
                    g->name, dt_last_error());
    }
    w->replay = NULL;
    for (size_t i = 0; i < g->nleftovers; i++)
        act_wtensor_drop(w, r.tensor_base + (g->leftovers[i] - g->tensor_lo));
    return true;
}

void act_replay_forget(act_worker *w, act_graph *g)
{
    for (size_t i = 0; i < g->nconstants; i++)
        s_unpin(w, g->constants[i]);
    s_graph_free(g);
}

bool act_replay_drop(act_worker *w, mb_cursor *rec)
{
    mb_drop_rec r;
    if (mb_read_drop(rec, &r) != 0)
        return false;
    act_graph *g = dt_idmap_take(&w->graphs, r.graph);
    if (g)
        act_replay_forget(w, g);
    return true;
}

const char *act_replay_where(const act_worker *w, char *buf, size_t size)
{
    if (!w->replay)
        return "";
    snprintf(buf, size, " (op %u of captured '%s')", w->replay_at + 1, w->replay->name);
    return buf;
}

void act_replay_close(act_worker *w)
{
    size_t cursor = 0;
    uint64_t id;
    void *g;
    while (dt_idmap_next(&w->graphs, &cursor, &id, &g))
        s_graph_free(g);
    dt_idmap_destroy(&w->graphs);
    dt_idmap_destroy(&w->pins);
}
