/* Writes the seed corpus of the fuzz targets: well-formed inputs of each kind, from the schema's
 * own encoders, so the fuzzers start from records a worker (or the controller) accepts and mutate
 * from there.
 *   make_corpus DIR   writes DIR/envelope, DIR/records, DIR/worker, DIR/peer and DIR/controller, one
 *                     file per seed */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mb_codec.h"
#include "mb_schema.h"
#include "op_registry.h"

static const char *s_dir;

static void s_write(const char *target, const char *name, const void *data, size_t size)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", s_dir, target);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/%s/%s", s_dir, target, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size) {
        perror(path);
        exit(1);
    }
    fclose(f);
}

static void s_record(const char *name, mb_writer *w)
{
    s_write("records", name, w->data, w->size);
    free(mb_w_release(w));
}

static const int64_t S_SHAPE[] = {2, 3};

static void s_compute(mb_writer *w, const char *op, uint64_t a, uint64_t b, uint64_t out)
{
    const uint64_t ins[2] = {a, b};
    mb_encode_compute(w, op_index(op_find(op)), 2, ins, 0, NULL, 0, NULL, NULL, 0, NULL, 0, NULL, 1);
    mb_encode_out(w, out, DT_FLOAT32, 2, S_SHAPE);
}

/* worker seed: [count][payload length][payload][body] */
static void s_worker(const char *name, uint8_t count, const void *payload, uint8_t plen, mb_writer *body)
{
    size_t size = 2 + plen + body->size;
    char *buf = malloc(size);
    buf[0] = (char)count;
    buf[1] = (char)plen;
    memcpy(buf + 2, payload, plen);
    memcpy(buf + 2 + plen, body->data, body->size);
    s_write("worker", name, buf, size);
    free(buf);
    free(mb_w_release(body));
}

/* peer seed: [flags][count][body length][payload length][payload][body (a REGION or RELEASE)][op records] */
static void s_peer(const char *name, uint8_t flags, uint8_t count, const void *payload, uint8_t plen, mb_writer *body,
                   mb_writer *ops)
{
    size_t size = 4 + plen + body->size + ops->size;
    char *buf = malloc(size);
    buf[0] = (char)flags;
    buf[1] = (char)count;
    buf[2] = (char)body->size;
    buf[3] = (char)plen;
    memcpy(buf + 4, payload, plen);
    memcpy(buf + 4 + plen, body->data, body->size);
    memcpy(buf + 4 + plen + body->size, ops->data, ops->size);
    s_write("peer", name, buf, size);
    free(buf);
    free(mb_w_release(body));
    free(mb_w_release(ops));
}

/* controller seed: [flags] then messages, each [device][kind][count][npayloads][payload
 * lengths][body length (2 bytes)][payloads][body]: appended to *seed by s_message */
typedef struct {
    char buf[4096];
    size_t size;
} s_seed;

static void s_message(s_seed *seed, uint8_t device, mb_kind kind, uint8_t count, const void *payload, uint8_t plen,
                      mb_writer *body)
{
    char *at = seed->buf + seed->size;
    at[0] = (char)device;
    at[1] = kind == MB_COMPLETIONS ? 1 : 0;
    at[2] = (char)count;
    at[3] = payload ? 1 : 0;
    size_t n = 4;
    if (payload)
        at[n++] = (char)plen;
    at[n++] = (char)(body->size >> 8);
    at[n++] = (char)body->size;
    if (payload)
        memcpy(at + n, payload, plen), n += plen;
    memcpy(at + n, body->data, body->size);
    seed->size += n + body->size;
    free(mb_w_release(body));
}

/* An array of offsets each written as a 9-byte int64 (0xd3), as no encoder here writes a small one:
 * a mutation of those 8 bytes, or a dictionary word laid over them, reaches any int64 in place. */
static void s_wide_dims(mb_writer *w, int n, const int64_t *v)
{
    mb_w_array(w, (uint32_t)n);
    for (int d = 0; d < n; d++)
        s_mb_w_be(w, 0xd3, (uint64_t)v[d], 8);
}

/* A PART as mb_encode_part writes it, its offsets wide. */
static void s_wide_part(mb_writer *w, mb_part_mode mode, int64_t from, uint64_t transfer, const int64_t *src,
                        const int64_t *dst, const int64_t *shape)
{
    mb_w_array(w, 8);
    mb_w_int(w, mode);
    mb_w_int(w, DT_REDUCE_SUM);
    mb_w_int(w, from);
    mb_w_uint(w, transfer);
    s_wide_dims(w, 2, src);
    s_wide_dims(w, 2, dst);
    mb_w_i64s(w, shape, 2);
    mb_w_int(w, 0);
}

/* The seeds of a worker's redistribute (fuzz_worker) and of what its peers send (fuzz_peer): the
 * rig sends devices 0..3's regions back to the worker (device 0), and device 1's segment is its
 * descriptor 200, serial 1, floats 0, 1, 2, ... (tests/fuzz/fuzz_rig.h) */
static void s_redistribute_seeds(void)
{
    const dt_scalar two = {.is_int = false, .f = 2.0};
    const int64_t zero[2] = {0, 0}, row[2] = {1, 3}, second[2] = {1, 0};
    mb_writer w = {0};
    /* the rows of piece 1 swapped into piece 2: one from the piece, one sent to itself */
    mb_encode_fill(&w, 1, DT_FLOAT32, 2, S_SHAPE, two);
    mb_encode_send(&w, 1, 4, 0, 2, second, 2, row);
    mb_encode_assemble(&w, 2, DT_FLOAT32, 2, S_SHAPE, 1, false, 2);
    mb_encode_part(&w, MB_PART_COPY, DT_REDUCE_SUM, 0, 0, 2, zero, 2, second, 2, row, 0);
    mb_encode_part(&w, MB_PART_COPY, DT_REDUCE_SUM, 0, 4, 2, zero, 2, zero, 2, row, 0);
    mb_encode_fetch(&w, 2, 9, 0);
    s_worker("redistribute", 4, "", 0, &w);
    /* an all-reduce's average: a copy and a reduce of the same region, then a division */
    mb_encode_fill(&w, 1, DT_FLOAT32, 2, S_SHAPE, two);
    mb_encode_send(&w, 1, 5, 2, 2, zero, 2, S_SHAPE);
    mb_encode_assemble(&w, 3, DT_FLOAT32, 2, S_SHAPE, 1, true, 3);
    mb_encode_part(&w, MB_PART_COPY, DT_REDUCE_SUM, 0, 0, 2, zero, 2, zero, 2, S_SHAPE, 0);
    mb_encode_part(&w, MB_PART_REDUCE, DT_REDUCE_SUM, 2, 5, 2, zero, 2, zero, 2, S_SHAPE, 0);
    mb_encode_part(&w, MB_PART_DIV, DT_REDUCE_SUM, 0, 0, 2, zero, 2, zero, 2, S_SHAPE, 2);
    mb_encode_fetch(&w, 3, 9, 0);
    s_worker("allreduce", 4, "", 0, &w);
    /* the redistribute again, every offset written wide */
    mb_encode_fill(&w, 1, DT_FLOAT32, 2, S_SHAPE, two);
    mb_w_array(&w, 6);
    mb_w_int(&w, MB_OP_SEND);
    mb_w_uint(&w, 1);
    mb_w_uint(&w, 4);
    mb_w_int(&w, 0);
    s_wide_dims(&w, 2, second);
    mb_w_i64s(&w, row, 2);
    mb_encode_assemble(&w, 2, DT_FLOAT32, 2, S_SHAPE, 1, false, 2);
    s_wide_part(&w, MB_PART_COPY, 0, 0, zero, second, row);
    s_wide_part(&w, MB_PART_COPY, 0, 4, zero, zero, row);
    mb_encode_fetch(&w, 2, 9, 0);
    s_worker("redistribute_wide", 4, "", 0, &w);

    /* peer: a region of device 1 as a frame, by handle, and one that failed; then the ASSEMBLE that takes it */
    const float floats[6] = {1, 2, 3, 4, 5, 6};
    mb_writer ops = {0};
    const uint8_t from1 = 1 << 4;
    mb_encode_region(&w, 4, 0, DT_FLOAT32, 2, S_SHAPE, NULL, 0, 0, 0, NULL, -1, 0, 0, 0);
    mb_encode_assemble(&ops, 2, DT_FLOAT32, 2, S_SHAPE, 0, false, 1);
    mb_encode_part(&ops, MB_PART_COPY, DT_REDUCE_SUM, 1, 4, 2, zero, 2, zero, 2, S_SHAPE, 0);
    mb_encode_fetch(&ops, 2, 9, 0);
    s_peer("frame", from1, 2, floats, sizeof floats, &w, &ops);
    mb_encode_region(&w, 4, 0, DT_FLOAT32, 2, row, NULL, 0, 0, 0, NULL, -1, 0, 0, 0);
    mb_encode_fill(&ops, 1, DT_FLOAT32, 2, S_SHAPE, two);
    mb_encode_assemble(&ops, 2, DT_FLOAT32, 2, S_SHAPE, 1, false, 2);
    s_wide_part(&ops, MB_PART_COPY, 0, 0, second, zero, row);
    s_wide_part(&ops, MB_PART_COPY, 1, 4, zero, second, row);
    mb_encode_fetch(&ops, 2, 9, 0);
    s_peer("frame_wide", from1, 3, floats, sizeof floats / 2, &w, &ops);
    mb_encode_region(&w, 4, 0, DT_FLOAT32, 2, S_SHAPE, NULL, 0, 0, 2, (const int64_t[]){12, 4}, 200, 1, 64, 7);
    mb_encode_assemble(&ops, 2, DT_FLOAT32, 2, S_SHAPE, 0, false, 1);
    mb_encode_part(&ops, MB_PART_COPY, DT_REDUCE_SUM, 1, 4, 2, zero, 2, zero, 2, S_SHAPE, 0);
    mb_encode_fetch(&ops, 2, 9, 0);
    s_peer("lent", from1 | 4, 2, "", 0, &w, &ops);
    mb_encode_region(&w, 4, DT_EKERNEL, DT_FLOAT32, 2, S_SHAPE, "out of memory", 0, 0, 0, NULL, -1, 0, 0, 0);
    mb_encode_assemble(&ops, 2, DT_FLOAT32, 2, S_SHAPE, 0, false, 1);
    mb_encode_part(&ops, MB_PART_COPY, DT_REDUCE_SUM, 1, 4, 2, zero, 2, zero, 2, S_SHAPE, 0);
    mb_encode_fetch(&ops, 2, 9, 0);
    s_peer("failed", from1 | 4, 2, "", 0, &w, &ops);
    /* a reduce of device 1's row into one of this device's own */
    mb_encode_region(&w, 4, 0, DT_FLOAT32, 2, row, NULL, 0, 0, 0, NULL, -1, 0, 0, 0);
    mb_encode_fill(&ops, 1, DT_FLOAT32, 2, S_SHAPE, two);
    mb_encode_assemble(&ops, 2, DT_FLOAT32, 2, S_SHAPE, 1, false, 2);
    mb_encode_part(&ops, MB_PART_COPY, DT_REDUCE_SUM, 0, 0, 2, zero, 2, zero, 2, S_SHAPE, 0);
    mb_encode_part(&ops, MB_PART_REDUCE, DT_REDUCE_MAX, 1, 4, 2, zero, 2, second, 2, row, 0);
    mb_encode_fetch(&ops, 2, 9, 0);
    s_peer("reduce", from1, 3, floats, sizeof floats / 2, &w, &ops);
    /* a release of what this device lent: nothing it lent has that hold */
    mb_encode_release(&w, 1);
    mb_encode_fill(&ops, 1, DT_FLOAT32, 2, S_SHAPE, two);
    s_peer("release", 1, 1, "", 0, &w, &ops);
}

/* The seeds of the controller (fuzz_controller): its futures 1..4 are a FULL fetch of a (2, 3)
 * Shard(0) over devices 0 and 1, the LOCALS of devices 2 and 3, a SYNC of all four, and a FULL
 * fetch of a Partial(sum) over devices 0 and 1. */
static void s_controller_seeds(void)
{
    const float row[3] = {1, 2, 3}, whole[6] = {1, 2, 3, 4, 5, 6};
    const int64_t piece[2] = {1, 3};
    mb_writer w = {0};
    s_seed seed = {.size = 1};
    for (uint8_t d = 0; d < 4; d++) { /* workers the controller started say hello */
        mb_encode_hello(&w, d, 4242, MB_PROTOCOL, op_registry_hash(), "cpu", "node1", "");
        s_message(&seed, d, MB_HELLO, 1, NULL, 0, &w);
    }
    mb_encode_credit(&w, 0);
    s_message(&seed, 0, MB_COMPLETIONS, 1, NULL, 0, &w);
    s_write("controller", "hello", seed.buf, seed.size);
    seed = (s_seed){.buf = {1}, .size = 1}; /* listening: workers from elsewhere */
    mb_encode_hello(&w, 0, 4242, MB_PROTOCOL, op_registry_hash(), "cpu", "node1", "tcp://10.0.0.2:40001");
    s_message(&seed, 0, MB_HELLO, 1, NULL, 0, &w);
    mb_encode_hello(&w, 1, 4243, MB_PROTOCOL, op_registry_hash(), "cpu", "node2", "tcp://10.0.0.3:40001");
    s_message(&seed, 1, MB_HELLO, 1, NULL, 0, &w);
    s_write("controller", "hello_remote", seed.buf, seed.size);

    seed = (s_seed){.buf = {2}, .size = 1}; /* said hello: the fetch's pieces, one from each device */
    for (uint8_t d = 0; d < 2; d++) {
        mb_encode_credit(&w, 2);
        mb_encode_value(&w, 1, d, DT_FLOAT32, 2, piece, 0, -1, 0, 0, 0);
        s_message(&seed, d, MB_COMPLETIONS, 2, row, sizeof row, &w);
    }
    s_write("controller", "fetch", seed.buf, seed.size);
    seed = (s_seed){.buf = {2}, .size = 1};
    for (uint8_t d = 2; d < 4; d++) {
        mb_encode_value(&w, 2, d - 2, DT_FLOAT32, 2, S_SHAPE, 0, -1, 0, 0, 0);
        s_message(&seed, d, MB_COMPLETIONS, 1, whole, sizeof whole, &w);
    }
    s_write("controller", "locals", seed.buf, seed.size);
    seed = (s_seed){.buf = {2}, .size = 1};
    for (uint8_t d = 0; d < 4; d++) {
        mb_encode_value(&w, 3, d, DT_FLOAT32, 0, NULL, -1, -1, 0, 0, 0);
        s_message(&seed, d, MB_COMPLETIONS, 1, NULL, 0, &w);
    }
    s_write("controller", "sync", seed.buf, seed.size);
    seed = (s_seed){.buf = {2}, .size = 1};
    for (uint8_t d = 0; d < 2; d++) {
        mb_encode_value(&w, 4, d, DT_FLOAT32, 2, S_SHAPE, 0, -1, 0, 0, 0);
        s_message(&seed, d, MB_COMPLETIONS, 1, whole, sizeof whole, &w);
    }
    s_write("controller", "partial", seed.buf, seed.size);
    seed = (s_seed){.buf = {2}, .size = 1};
    mb_encode_error(&w, 1, 0, DT_EKERNEL, "add failed on device 0: why");
    mb_encode_credit(&w, 1);
    s_message(&seed, 0, MB_COMPLETIONS, 2, NULL, 0, &w);
    s_write("controller", "error", seed.buf, seed.size);
    seed = (s_seed){.buf = {2 | 4}, .size = 1}; /* device 0 lends its piece by handle */
    mb_encode_value(&w, 1, 0, DT_FLOAT32, 2, piece, -1, 200, 1, 16, 3);
    s_message(&seed, 0, MB_COMPLETIONS, 1, NULL, 0, &w);
    mb_encode_value(&w, 1, 1, DT_FLOAT32, 2, piece, 0, -1, 0, 0, 0);
    s_message(&seed, 1, MB_COMPLETIONS, 1, row, sizeof row, &w);
    s_write("controller", "lent", seed.buf, seed.size);
}

/* The worker seeds of one COMPUTE of each op whose kernel checks its own pieces (every op but the
 * elementwise ones, whose infer a worker checks): its inputs filled as pieces 1.. (zeros: valid
 * positions), the attributes and ctx the controller sends for the op on one device, its outputs as
 * pieces 10 and 11 (a write in place: piece 1), then a fetch. The fuzzer mutates the pieces' shapes,
 * dtypes and the integers around what each kernel accepts. */
typedef struct {
    dt_dtype dtype;
    int ndim;
    int64_t shape[4];
} s_spec;

#define S_SPECS(...) (int)(sizeof((s_spec[]){__VA_ARGS__}) / sizeof(s_spec)), (s_spec[]){__VA_ARGS__}
#define S_INTS(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}
#define S_NONE 0, NULL
#define F32(...) {DT_FLOAT32, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), {__VA_ARGS__}}
#define I64(...) {DT_INT64, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), {__VA_ARGS__}}

static void s_kernel_seed(const char *op, int nin, const s_spec *in, int nout, const s_spec *out, int nints,
                          const int64_t *ints, int nfloats, const double *floats, int nctx, const int64_t *ctx)
{
    const op_def *def = op_find(op);
    mb_writer w = {0};
    uint64_t ids[8];
    for (int i = 0; i < nin; i++) {
        ids[i] = (uint64_t)i + 1;
        mb_encode_fill(&w, ids[i], in[i].dtype, in[i].ndim, in[i].shape, (dt_scalar){.is_int = true, .i = 0});
    }
    mb_encode_compute(&w, op_index(def), nin, ids, nints, ints, nfloats, floats, NULL, nctx, ctx, 0, NULL,
                      (uint32_t)nout);
    for (int o = 0; o < nout; o++)
        mb_encode_out(&w, def->inplace && o == 0 ? 1 : 10 + (uint64_t)o, out[o].dtype, out[o].ndim, out[o].shape);
    mb_encode_fetch(&w, def->inplace ? 1 : 10, 9, 0);
    char name[64];
    snprintf(name, sizeof name, "kernel_%s", op);
    s_worker(name, (uint8_t)(nin + 2), "", 0, &w);
}

static void s_kernel_seeds(void)
{
    const double eps[1] = {1e-5};
    s_kernel_seed("sum", S_SPECS(F32(2, 3)), S_SPECS(F32(2)), S_INTS(0, -1, 1), S_NONE, S_INTS(2, 3));
    s_kernel_seed("argmax", S_SPECS(F32(2, 3)), S_SPECS(I64(2)), S_INTS(0, 1), S_NONE, S_INTS(1));
    s_kernel_seed("max_dim", S_SPECS(F32(2, 3)), S_SPECS(F32(2), I64(2)), S_INTS(1, 0), S_NONE, S_INTS(1));
    s_kernel_seed("topk", S_SPECS(F32(2, 3)), S_SPECS(F32(2, 2), I64(2, 2)), S_INTS(2, 1, 1, 1), S_NONE, S_INTS(1));
    s_kernel_seed("softmax", S_SPECS(F32(2, 3)), S_SPECS(F32(2, 3)), S_INTS(1, -1), S_NONE, S_INTS(1));
    s_kernel_seed("cumsum", S_SPECS(F32(2, 3)), S_SPECS(F32(2, 3)), S_INTS(0, -1), S_NONE, S_INTS(0));
    s_kernel_seed("layer_norm", S_SPECS(F32(2, 3), F32(3), F32(3)), S_SPECS(F32(2, 3)), S_INTS(3, 3), 1, eps,
                  S_INTS(3, 3));
    s_kernel_seed("reshape", S_SPECS(F32(2, 3)), S_SPECS(F32(3, 2)), S_INTS(3, 2), S_NONE, S_NONE);
    s_kernel_seed("permute", S_SPECS(F32(2, 3)), S_SPECS(F32(3, 2)), S_INTS(1, 0), S_NONE, S_NONE);
    s_kernel_seed("expand", S_SPECS(F32(1, 3)), S_SPECS(F32(2, 3)), S_INTS(2, 3), S_NONE, S_NONE);
    s_kernel_seed("cat", S_SPECS(F32(2, 3), F32(1, 3)), S_SPECS(F32(3, 3)), S_INTS(0), S_NONE, S_NONE);
    s_kernel_seed("slice", S_SPECS(F32(4, 3)), S_SPECS(F32(2, 3)), S_INTS(0, 1, 4, 2), S_NONE, S_INTS(0, 1, 2));
    s_kernel_seed("index_select", S_SPECS(F32(4, 3), I64(2)), S_SPECS(F32(2, 3)), S_INTS(0, 0), S_NONE, S_NONE);
    s_kernel_seed("triu", S_SPECS(F32(3, 3)), S_SPECS(F32(3, 3)), S_INTS(0), S_NONE, S_INTS(0, 0));
    s_kernel_seed("matmul", S_SPECS(F32(2, 3), F32(3, 2)), S_SPECS(F32(2, 2)), S_NONE, S_NONE, S_NONE);
    s_kernel_seed("linear", S_SPECS(F32(2, 3), F32(2, 3), F32(2)), S_SPECS(F32(2, 2)), S_NONE, S_NONE, S_INTS(1));
    s_kernel_seed("embedding", S_SPECS(I64(3), F32(4, 2)), S_SPECS(F32(3, 2)), S_NONE, S_NONE, S_INTS(0, 4));
    s_kernel_seed("scaled_dot_product_attention", S_SPECS(F32(1, 2, 4), F32(1, 3, 4), F32(1, 3, 4)),
                  S_SPECS(F32(1, 2, 4)), S_INTS(1, 0, 0), S_NONE, S_INTS(0));
    s_kernel_seed("rope", S_SPECS(F32(1, 1, 2, 4), I64(1, 2), F32(2)), S_SPECS(F32(1, 1, 2, 4)), S_NONE, 1,
                  (const double[]){1.0}, S_NONE);
    s_kernel_seed("slice_assign_", S_SPECS(F32(4, 3), F32(2, 3)), S_SPECS(F32(4, 3)), S_INTS(0, 1), S_NONE, S_INTS(0));
    s_kernel_seed("index_copy_", S_SPECS(F32(4, 3), I64(2), F32(2, 3)), S_SPECS(F32(4, 3)), S_INTS(0), S_NONE,
                  S_NONE);
    s_kernel_seed("attention_block",
                  S_SPECS(F32(1, 1, 2, 4), F32(1, 1, 3, 4), F32(1, 1, 3, 4), I64(1, 2), I64(1, 3)),
                  S_SPECS(F32(1, 1, 2, 4), F32(1, 1, 2)), S_INTS(1), 1, (const double[]){0.5}, S_NONE);
    s_kernel_seed("attention_merge", S_SPECS(F32(2, 1, 2, 4), F32(2, 1, 2)), S_SPECS(F32(1, 1, 2, 4), F32(1, 1, 2)),
                  S_INTS(2), S_NONE, S_NONE);
    s_kernel_seed("conv2d", S_SPECS(F32(1, 2, 4, 4), F32(3, 2, 3, 3), F32(3)), S_SPECS(F32(1, 3, 2, 2)),
                  S_INTS(1, 1, 0, 0, 0, 0, 1, 1, 1), S_NONE, S_NONE);
    s_kernel_seed("group_norm", S_SPECS(F32(1, 4, 2, 2), F32(4), F32(4)), S_SPECS(F32(1, 4, 2, 2)), S_INTS(2, 3), 1,
                  eps, S_NONE);
    s_kernel_seed("interpolate", S_SPECS(F32(1, 1, 2, 2)), S_SPECS(F32(1, 1, 4, 4)), S_INTS(1, 0, 4, 4), 2,
                  (const double[]){0, 0}, S_NONE);
    s_kernel_seed("pad", S_SPECS(F32(1, 2, 3)), S_SPECS(F32(1, 2, 5)), S_INTS(1, 1, 1), 1, (const double[]){0},
                  S_NONE);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: make_corpus DIR\n");
        return 2;
    }
    s_dir = argv[1];
    mkdir(s_dir, 0755);
    const dt_scalar two = {.is_int = false, .f = 2.0};
    mb_writer w = {0};

    /* every record kind, alone */
    mb_encode_free(&w, 7), s_record("free", &w);
    mb_encode_empty(&w, 1, DT_FLOAT32, 2, S_SHAPE), s_record("empty", &w);
    mb_encode_fill(&w, 1, DT_INT64, 2, S_SHAPE, two), s_record("fill", &w);
    mb_encode_random(&w, 1, DT_FLOAT32, 2, S_SHAPE, 2, (const int64_t[]){0, 0}, 2, S_SHAPE, 5, 1, true);
    s_record("random", &w);
    mb_encode_arange(&w, 1, DT_INT64, 1, (const int64_t[]){6}, 0, (dt_scalar){.is_int = true, .i = 3}, two);
    s_record("arange", &w);
    mb_encode_load(&w, 1, DT_FLOAT32, 2, S_SHAPE, 0), s_record("load", &w);
    mb_encode_fetch(&w, 1, 9, 0), s_record("fetch", &w);
    mb_encode_sync(&w, 9, 0), s_record("sync", &w);
    mb_encode_send(&w, 1, 4, 1, 2, (const int64_t[]){0, 0}, 2, S_SHAPE), s_record("send", &w);
    mb_encode_assemble(&w, 2, DT_FLOAT32, 2, S_SHAPE, 1, false, 2);
    mb_encode_part(&w, MB_PART_COPY, DT_REDUCE_SUM, 0, 0, 2, (const int64_t[]){0, 0}, 2, (const int64_t[]){0, 0}, 2,
                   (const int64_t[]){1, 3}, 1);
    mb_encode_part(&w, MB_PART_REDUCE, DT_REDUCE_MAX, 1, 4, 2, (const int64_t[]){0, 0}, 2, (const int64_t[]){1, 0}, 2,
                   (const int64_t[]){1, 3}, 1);
    s_record("assemble", &w);
    s_compute(&w, "add", 1, 2, 3), s_record("compute", &w);
    mb_encode_stats(&w, 9, 0, true), s_record("stats", &w);
    mb_encode_trace(&w, 9, 0, MB_TRACE_START), s_record("trace", &w);
    mb_encode_define(&w, 1, "step", 10, 20, 1, 1, 0, 0, 1, (const uint64_t[]){5}, 1, (const uint64_t[]){11}, 2, 0);
    s_record("define", &w);
    mb_encode_replay(&w, 1, 1, (const uint64_t[]){100}, 1000, 1, 0, 0), s_record("replay", &w);
    mb_encode_drop(&w, 1), s_record("drop", &w);
    mb_encode_credit(&w, 3), s_record("credit", &w);
    mb_encode_value(&w, 9, 0, DT_FLOAT32, 2, S_SHAPE, 0, -1, 0, 0, 0), s_record("value", &w);
    mb_encode_value(&w, 9, 0, DT_FLOAT32, 2, S_SHAPE, -1, 3, 1, 64, 5), s_record("value_lent", &w);
    mb_encode_region(&w, 4, 0, DT_FLOAT32, 2, S_SHAPE, NULL, 0, 0, 0, NULL, 3, 1, 64, 5), s_record("region", &w);
    mb_encode_process(&w, 1, 4242), s_record("process", &w);
    mb_encode_release(&w, 5), s_record("release", &w);
    mb_encode_error(&w, 9, 0, DT_EKERNEL, "why"), s_record("error", &w);
    mb_encode_hello(&w, 0, 42, MB_PROTOCOL, 1, "cpu", "node1", "tcp://10.0.0.2:40001"), s_record("hello", &w);
    mb_encode_endpoint(&w, 3, "tcp://10.0.0.3:40002"), s_record("endpoint", &w);
    mb_encode_abort(&w, 1), s_record("abort", &w);

    /* an envelope: [header length][header][body of two records] */
    mb_header h = {MB_VERSION, MB_OPS, 0, MB_SENDER_CONTROLLER, 2};
    char header[MB_MAX_HEADER];
    size_t hn = mb_header_encode(&h, header);
    mb_encode_fill(&w, 1, DT_FLOAT32, 2, S_SHAPE, two);
    mb_encode_fetch(&w, 1, 9, 0);
    char *env = malloc(1 + hn + w.size);
    env[0] = (char)hn;
    memcpy(env + 1, header, hn);
    memcpy(env + 1 + hn, w.data, w.size);
    s_write("envelope", "ops", env, 1 + hn + w.size);
    free(env);
    free(mb_w_release(&w));

    /* worker sequences */
    mb_encode_fill(&w, 1, DT_FLOAT32, 2, S_SHAPE, two);
    mb_encode_fill(&w, 2, DT_FLOAT32, 2, S_SHAPE, two);
    s_compute(&w, "mul", 1, 2, 3);
    mb_encode_fetch(&w, 3, 9, 0);
    mb_encode_free(&w, 1);
    s_worker("compute", 5, "", 0, &w);
    const float floats[6] = {1, 2, 3, 4, 5, 6};
    mb_encode_load(&w, 1, DT_FLOAT32, 2, S_SHAPE, 0);
    mb_encode_fetch(&w, 1, 9, 0);
    s_worker("load", 2, floats, sizeof floats, &w);
    mb_writer recs = {0};
    s_compute(&recs, "add", 5, 1, 10);
    s_compute(&recs, "mul", 10, 10, 11);
    mb_encode_free(&recs, 10);
    mb_encode_fill(&w, 1, DT_FLOAT32, 2, S_SHAPE, two);
    mb_encode_define(&w, 1, "step", 10, 20, 1, 1, 0, 0, 1, (const uint64_t[]){5}, 1, (const uint64_t[]){11}, 3, 0);
    mb_encode_fill(&w, 100, DT_FLOAT32, 2, S_SHAPE, two);
    mb_encode_replay(&w, 1, 1, (const uint64_t[]){100}, 1000, 1, 0, 0);
    mb_encode_fetch(&w, 1001, 9, 0);
    mb_encode_drop(&w, 1);
    s_worker("replay", 6, recs.data, (uint8_t)recs.size, &w);
    free(mb_w_release(&recs));
    s_redistribute_seeds();
    s_kernel_seeds();
    s_controller_seeds();
    return 0;
}
