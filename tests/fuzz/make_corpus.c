/* Writes the seed corpus of the fuzz targets: well-formed inputs of each kind, from the schema's
 * own encoders, so the fuzzers start from records a worker accepts and mutate from there.
 *   make_corpus DIR   writes DIR/envelope, DIR/records and DIR/worker, one file per seed */
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
    return 0;
}
