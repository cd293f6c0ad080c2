/* Device types and the workers' hello: a worker is told its device type at spawn and refuses one
 * this build has no backend for; a device id is of one type; a worker that speaks another
 * protocol or op registry (a stand-in, fake-dtorch-worker, says such a hello through the real
 * controller) is refused with a message naming both sides, and the futures waiting on its
 * device fail with it. The memory a CPU device has (the host's), and the controller's check
 * that no piece is larger. */
#include <criterion/criterion.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "act_worker.h"
#include "dt_error.h"
#include "dt_layout.h"
#include "dt_pool.h"
#include "dtn_tensor.h"
#include "dtorch.h"
#include "mb_schema.h"
#include "op_backend.h"
#include "op_registry.h"

extern char **environ;

#define S_FLT(v) ((dt_scalar){.is_int = false, .f = (v)})

static void s_expect_in(const char *text, const char *part, const char *what)
{
    cr_expect(text && strstr(text, part), "%s: '%s' does not say '%s'", what, text ? text : "(null)", part);
}

static dt_mesh *s_mesh(int64_t first, int64_t n)
{
    int64_t ids[4];
    for (int64_t i = 0; i < n; i++)
        ids[i] = first + i;
    dt_mesh *m = dt_mesh_new("cpu", 1, (int64_t[]){n}, ids, NULL);
    cr_assert_not_null(m, "%s", dt_last_error());
    return m;
}

/* ---- backends by device type ------------------------------------------------------------------ */

Test(backend, lookup)
{
    const op_backend *cpu = op_backend_find("cpu");
    cr_assert_not_null(cpu);
    cr_expect_str_eq(cpu->name, "cpu");
    cr_expect_eq(op_backend_host(), cpu, "the host backend is the CPU one");
    cr_expect_null(op_backend_find("tpu"));
    cr_expect_null(op_backend_find(NULL));
    cr_expect_eq(op_backend_check("here", "cpu"), 0);
    cr_expect_eq(op_backend_check("here", "tpu"), DT_EINVAL);
    s_expect_in(dt_last_error(), "unknown device type 'tpu'", "tpu");
#ifdef DTORCH_HAVE_CUDA
    const op_backend *cuda = op_backend_find("cuda");
    cr_assert_not_null(cuda, "a CUDA build has the CUDA backend");
    cr_expect_str_eq(cuda->name, "cuda");
    cr_expect_eq(op_backend_check("here", "cuda"), 0);
    cr_expect(cuda->attach && cuda->alloc && cuda->free && cuda->to_device && cuda->to_host && cuda->copy_region &&
              cuda->run && cuda->fill && cuda->random && cuda->arange && cuda->combine && cuda->scale_div &&
              cuda->synchronize);
    cr_expect(!cuda->adopt_host && !cuda->host_view, "device memory is not host memory");
#else
    cr_expect_null(op_backend_find("cuda"), "no CUDA backend in this build");
    cr_expect_eq(op_backend_check("here", "cuda"), DT_EDEVICE);
    s_expect_in(dt_last_error(), "'cuda' device backend is not available", "cuda");
#endif
    /* the slots every backend must have */
    cr_expect(cpu->alloc && cpu->free && cpu->to_device && cpu->to_host && cpu->copy_region && cpu->run && cpu->fill &&
              cpu->random && cpu->arange && cpu->combine && cpu->scale_div);
}

/* The CPU table's copies and collectives, as a worker uses them. */
Test(backend, cpu_slots)
{
    const op_backend *be = op_backend_find("cpu");
    float *a = be->alloc(4 * sizeof *a);
    cr_assert_not_null(a);
    cr_expect_null(be->fill(a, DT_FLOAT32, 4, S_FLT(2.0)));
    const float src[4] = {1, 2, 3, 4};
    cr_expect_null(be->combine(a, a, src, DT_FLOAT32, 4, DT_REDUCE_SUM));
    cr_expect_null(be->scale_div(a, DT_FLOAT32, 4, 2));
    cr_expect(a[0] == 1.5f && a[3] == 3.0f, "%g %g", a[0], a[3]);
    /* a column out of a 2x2 layout, through each copy slot */
    const op_copy_fn copies[] = {be->to_device, be->to_host, be->copy_region, be->copy_from_peer};
    for (int c = 0; c < 4; c++) {
        float col[2] = {0};
        cr_expect_null(copies[c](col, (int64_t[]){4}, src + 1, (int64_t[]){8}, 1, (int64_t[]){2}, 4));
        cr_expect(col[0] == 2 && col[1] == 4, "copy slot %d", c);
    }
    cr_expect(be->adopt_host(a, 16), "pooled memory is aligned");
    cr_expect_not(be->adopt_host((char *)a + 1, 15), "a misaligned frame is copied");
    cr_expect_eq(be->host_view(a), a);
    be->free(a, 4 * sizeof *a);
}

/* ---- device types at spawn ------------------------------------------------------------------- */

Test(device_type, thread_worker_refuses_unknown)
{
    int rc = act_worker_run("inproc://dtorch-test-no-controller", 3, "tpu", NULL, NULL);
    cr_expect_eq(rc, DT_EINVAL);
    s_expect_in(dt_last_error(), "no 'tpu' device backend", "worker");
    s_expect_in(dt_last_error(), "device 3", "worker");
    s_expect_in(dt_last_error(), "'cpu'", "worker");
}

/* Runs dtorch-worker with args as the controller starts it: the run's secret on the read end of a
 * pipe (descriptor 3) whose write end this test holds until the worker has exited. Its output goes
 * to out; returns its wait status. */
static int s_run_worker(char *const argv[], char *out, size_t size)
{
    int secret[2], output[2];
    cr_assert_eq(pipe(secret), 0);
    cr_assert_eq(pipe(output), 0);
    cr_assert_eq(write(secret[1], "0123456789abcdef0123456789abcdef", 32), 32);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, secret[0], 3);
    posix_spawn_file_actions_adddup2(&actions, output[1], 1);
    posix_spawn_file_actions_adddup2(&actions, output[1], 2);
    pid_t pid;
    cr_assert_eq(posix_spawn(&pid, argv[0], &actions, NULL, argv, environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    close(secret[0]);
    close(output[1]);
    size_t n = 0;
    ssize_t got;
    while (n + 1 < size && (got = read(output[0], out + n, size - 1 - n)) > 0)
        n += (size_t)got;
    out[n] = '\0';
    int status = 0;
    waitpid(pid, &status, 0);
    close(output[0]);
    close(secret[1]);
    return status;
}

Test(device_type, process_worker_refuses_unknown)
{
    char *path = getenv("DTORCH_WORKER_PATH");
    cr_assert_not_null(path, "meson test sets DTORCH_WORKER_PATH");
    char endpoint[64], out[1024];
    snprintf(endpoint, sizeof endpoint, "ipc:///tmp/dtorch-test-none-%d.ipc", (int)getpid());
    char *argv[] = {path, "--connect", endpoint, "--device", "2", "--device-type", "tpu", "--run-fd", "3", NULL};
    int status = s_run_worker(argv, out, sizeof out);
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 1, "status %d", status);
    s_expect_in(out, "no 'tpu' device backend", "dtorch-worker");
}

static void s_with_type(dt_mesh *m, const char *type) { snprintf(m->device_type, sizeof m->device_type, "%s", type); }

/* A mesh of an unknown type cannot be made, so the tests relabel one (and, in a build without the
 * CUDA backend, one of a known type that the build lacks). */
static void s_unknown_type_at_call_site(dt_workers mode)
{
    cr_assert_eq(dt_init(&(dt_config){mode, getenv("DTORCH_WORKER_PATH")}), 0, "%s", dt_last_error());
    dt_mesh *m = s_mesh(0, 2);
    s_with_type(m, "tpu");
    cr_expect_null(dt_zeros(m, 1, (int64_t[]){4}, DT_FLOAT32, NULL));
    cr_expect_eq(dt_last_error_code(), DT_EINVAL);
    s_expect_in(dt_last_error(), "unknown device type 'tpu'", "zeros on tpu");
#ifndef DTORCH_HAVE_CUDA
    s_with_type(m, "cuda");
    cr_expect_null(dt_zeros(m, 1, (int64_t[]){4}, DT_FLOAT32, NULL));
    cr_expect_eq(dt_last_error_code(), DT_EDEVICE);
    s_expect_in(dt_last_error(), "'cuda' device backend is not available", "zeros on cuda");
#endif
    /* nothing was started for them: the same ids serve a cpu mesh */
    s_with_type(m, "cpu");
    dt_tensor *t = dt_ones(m, 1, (int64_t[]){4}, DT_FLOAT32, NULL);
    cr_assert_not_null(t, "%s", dt_last_error());
    dt_future *f = dt_tensor_fetch(t);
    cr_assert_not_null(f, "%s", dt_last_error());
    cr_expect_eq(dt_future_wait(f, 10), 0, "%s", dt_last_error());
    dt_future_release(&f);
    dt_tensor_release(&t);
    dt_mesh_release(&m);
    cr_expect_eq(dt_shutdown(), 0);
}

Test(device_type, unknown_at_call_site_thread, .timeout = 120) { s_unknown_type_at_call_site(DT_WORKERS_THREAD); }
Test(device_type, unknown_at_call_site_process, .timeout = 120) { s_unknown_type_at_call_site(DT_WORKERS_PROCESS); }

Test(device_type, one_type_per_device_id, .timeout = 120)
{
    cr_assert_eq(dt_init(&(dt_config){DT_WORKERS_THREAD, NULL}), 0, "%s", dt_last_error());
    dt_mesh *cpu = s_mesh(0, 2), *other = s_mesh(1, 2);
    dt_tensor *t = dt_ones(cpu, 1, (int64_t[]){4}, DT_FLOAT32, NULL);
    cr_assert_not_null(t, "%s", dt_last_error());
    s_with_type(other, "cuda");
    cr_expect_null(dt_zeros(other, 1, (int64_t[]){4}, DT_FLOAT32, NULL), "device 1 is a cpu device already");
    cr_expect_eq(dt_last_error_code(), DT_EINVAL);
    s_expect_in(dt_last_error(), "device 1 is a 'cpu' device", "clash");
    s_expect_in(dt_last_error(), "this mesh says 'cuda'", "clash");
    dt_future *f = dt_tensor_fetch(t);
    cr_assert_not_null(f, "the cpu mesh still works: %s", dt_last_error());
    cr_expect_eq(dt_future_wait(f, 10), 0, "%s", dt_last_error());
    dt_future_release(&f);
    dt_tensor_release(&t);
    dt_mesh_release(&cpu);
    dt_mesh_release(&other);
    cr_expect_eq(dt_shutdown(), 0);
}

/* ---- hello ------------------------------------------------------------------------------------- */

/* A process runtime whose workers are fake-dtorch-worker saying a wrong hello (how): the device
 * is refused, and both a waiting future and later calls fail with the reason. */
static void s_refused(const char *how, const char *const *says, int nsays)
{
    const char *fake = getenv("DTORCH_FAKE_WORKER");
    cr_assert_not_null(fake, "meson test sets DTORCH_FAKE_WORKER");
    cr_assert_eq(setenv("DTORCH_FAKE_HELLO", how, 1), 0);
    cr_assert_eq(dt_init(&(dt_config){DT_WORKERS_PROCESS, fake}), 0, "%s", dt_last_error());
    dt_mesh *m = s_mesh(0, 1);
    dt_tensor *t = dt_full(m, 1, (int64_t[]){4}, DT_FLOAT32, NULL, S_FLT(1.0));
    char why[DT_ERRMSG_MAX] = "";
    if (t) {
        dt_future *f = dt_tensor_fetch(t);
        if (f) {
            cr_expect_eq(dt_future_wait(f, 15), DT_EDEVICE, "the fetch: %s", dt_last_error());
            snprintf(why, sizeof why, "%s", dt_future_error(f) ? dt_future_error(f) : "");
            dt_future_release(&f);
        } else {
            cr_expect_eq(dt_last_error_code(), DT_EDEVICE); /* refused before the fetch was queued */
            snprintf(why, sizeof why, "%s", dt_last_error());
        }
        dt_tensor_release(&t);
    } else {
        cr_expect_eq(dt_last_error_code(), DT_EDEVICE);
        snprintf(why, sizeof why, "%s", dt_last_error());
    }
    for (int i = 0; i < nsays; i++)
        s_expect_in(why, says[i], how);
    cr_expect_null(dt_zeros(m, 1, (int64_t[]){4}, DT_FLOAT32, NULL), "a refused device takes no more work");
    cr_expect_eq(dt_last_error_code(), DT_EDEVICE);
    s_expect_in(dt_last_error(), says[0], how);
    dt_mesh_release(&m);
    cr_expect_eq(dt_shutdown(), 0);
}

Test(hello, other_protocol_refused, .timeout = 120)
{
    char theirs[64], ours[96];
    snprintf(theirs, sizeof theirs, "device 0 speaks protocol %d, registry 0x%016llx", MB_PROTOCOL + 1,
             (unsigned long long)op_registry_hash());
    snprintf(ours, sizeof ours, "this controller protocol %d, registry 0x%016llx", MB_PROTOCOL,
             (unsigned long long)op_registry_hash());
    s_refused("protocol", (const char *[]){theirs, ours, "rebuild dtorch-worker from the same sources"}, 3);
}

Test(hello, other_registry_refused, .timeout = 120)
{
    char theirs[64], ours[96];
    snprintf(theirs, sizeof theirs, "registry 0x%016llx", (unsigned long long)(op_registry_hash() ^ 0x5a5a5a5a));
    snprintf(ours, sizeof ours, "this controller protocol %d, registry 0x%016llx", MB_PROTOCOL,
             (unsigned long long)op_registry_hash());
    s_refused("registry", (const char *[]){theirs, ours, "rebuild dtorch-worker"}, 3);
}

Test(hello, other_device_type_refused, .timeout = 120)
{
    s_refused("type", (const char *[]){"serves tpu device 0, not cpu device 0"}, 1);
}

Test(hello, unreadable_hello_refused, .timeout = 120)
{
    s_refused("garbage", (const char *[]){"hello could not be read", "malformed hello record"}, 2);
}

/* ---- values lent by handle --------------------------------------------------------------------- */

/* A worker process (fake-dtorch-worker) answers fetches with forged handles: each fetch fails with
 * the reason, the device stays alive (a SYNC still works), and nothing crashes. shm: whether the
 * controller lets worker processes lend at all (DTORCH_SHM). */
static void s_forged_value(const char *how, bool shm, const char *says)
{
    const char *fake = getenv("DTORCH_FAKE_WORKER");
    cr_assert_not_null(fake, "meson test sets DTORCH_FAKE_WORKER");
    cr_assert_eq(setenv("DTORCH_FAKE_HELLO", how, 1), 0);
    cr_assert_eq(setenv("DTORCH_SHM", shm ? "1" : "0", 1), 0);
    cr_assert_eq(dt_init(&(dt_config){DT_WORKERS_PROCESS, fake}), 0, "%s", dt_last_error());
    dt_mesh *m = s_mesh(0, 1);
    dt_tensor *t = dt_full(m, 1, (int64_t[]){4}, DT_FLOAT32, NULL, S_FLT(1.0));
    cr_assert_not_null(t, "%s", dt_last_error());
    for (int i = 0; i < 2; i++) {
        dt_future *f = dt_tensor_fetch(t);
        cr_assert_not_null(f, "%s", dt_last_error());
        cr_expect_eq(dt_future_wait(f, 10), DT_EPROTO, "%s: %s", how, dt_last_error());
        const char *why = dt_future_error(f) ? dt_future_error(f) : "";
        s_expect_in(why, "fetch: device 0's value by handle: ", how);
        s_expect_in(why, says, how);
        dt_future_release(&f);
    }
    cr_expect_eq(dt_synchronize(), 0, "the device is alive: %s", dt_last_error());
    dt_tensor_release(&t);
    dt_mesh_release(&m);
    cr_expect_eq(dt_shutdown(), 0);
    unsetenv("DTORCH_SHM");
}

Test(lend, value_outside_its_segment_fails_the_fetch, .timeout = 120)
{
    s_forged_value("lend-outside", true, "a region outside its segment");
}

Test(lend, value_in_no_segment_fails_the_fetch, .timeout = 120)
{
    s_forged_value("lend-foreign", true, "is not its shared segment");
}

Test(lend, value_from_a_worker_never_told_to_lend_fails_the_fetch, .timeout = 120)
{
    s_forged_value("lend-outside", false, "it was never told it may lend by handle");
}

/* The registry's hash covers what a worker must agree on, and is stable within a build. */
Test(hello, registry_hash)
{
    uint64_t h = op_registry_hash();
    cr_expect_neq(h, 0);
    cr_expect_eq(op_registry_hash(), h);
    cr_expect_not_null(op_at(0), "the registry has ops");
}

/* ---- memory: a piece larger than its device's memory is refused where the op is called ------- */

/* The host's memory as /proc/meminfo says it (MemTotal, in KiB): an independent reading. */
static size_t s_mem_total(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    cr_assert_not_null(f);
    char line[256];
    unsigned long long kib = 0;
    while (fgets(line, sizeof line, f) && sscanf(line, "MemTotal: %llu kB", &kib) != 1)
        ;
    fclose(f);
    cr_assert_gt(kib, 0);
    return (size_t)kib * 1024;
}

Test(memory, cpu_device_has_the_host_memory)
{
    size_t host = s_mem_total();
    const op_backend *cpu = op_backend_find("cpu");
    cr_assert_not_null(cpu->memory_size);
    cr_expect_eq(cpu->memory_size(0), host);
    cr_expect_eq(cpu->memory_size(7), host, "every CPU device has the host's memory");
    cr_expect_eq(dt_pool_host_memory(), host);
    /* nothing larger is ever asked of the system: it would be granted lazily and kill on touch */
    cr_expect_null(dt_pool_alloc(host + 1));
}

/* dtn_check_fits at the edge, where the largest piece is exactly the host's memory or one byte
 * more (sizes only: nothing is allocated). bool elements are one byte each. */
Test(memory, largest_piece_decides)
{
    int64_t h = (int64_t)s_mem_total();
    dt_mesh *m4 = s_mesh(0, 4);
    dt_mesh *m22 = dt_mesh_new("cpu", 2, (int64_t[]){2, 2}, (int64_t[]){0, 1, 2, 3}, NULL);
    cr_assert_not_null(m22);
    const dt_placement r[2] = {dt_replicate(), dt_replicate()}, s0[2] = {dt_shard(0), dt_shard(0)},
                       s01[2] = {dt_shard(0), dt_shard(1)}, p[1] = {dt_partial(DT_REDUCE_SUM)};
    cr_expect_eq(dtn_check_fits("t", m4, 1, (int64_t[]){h}, r, DT_BOOL), 0, "a replica of exactly the memory");
    cr_expect_eq(dtn_check_fits("t", m4, 1, (int64_t[]){h + 1}, r, DT_BOOL), DT_ENOMEM, "one byte more");
    char want[160];
    snprintf(want, sizeof want, "t: not enough memory: the piece of device 0, bool of shape (%lld,)", (long long)h + 1);
    s_expect_in(dt_last_error(), want, "replica");
    snprintf(want, sizeof want, "takes %lld bytes; the device has %lld bytes of memory", (long long)h + 1,
             (long long)h);
    s_expect_in(dt_last_error(), want, "replica");
    cr_expect_eq(dtn_check_fits("t", m4, 1, (int64_t[]){h + 1}, p, DT_BOOL), DT_ENOMEM, "a Partial piece is whole");
    /* torch.chunk over 4: device 0 holds ceil(n / 4) */
    cr_expect_eq(dtn_check_fits("t", m4, 1, (int64_t[]){4 * h}, s0, DT_BOOL), 0);
    cr_expect_eq(dtn_check_fits("t", m4, 1, (int64_t[]){4 * h + 1}, s0, DT_BOOL), DT_ENOMEM);
    cr_expect_eq(dtn_check_fits("t", m4, 1, (int64_t[]){h}, s0, DT_INT32), 0, "h / 4 int32s of 4 bytes each");
    cr_expect_eq(dtn_check_fits("t", m4, 1, (int64_t[]){h + 4}, s0, DT_INT64), DT_ENOMEM);
    /* 2x2: nested chunks (4h + 1 -> 2h + 1 -> h + 1), and a tile of each dim */
    cr_expect_eq(dtn_check_fits("t", m22, 1, (int64_t[]){4 * h}, s0, DT_BOOL), 0);
    cr_expect_eq(dtn_check_fits("t", m22, 1, (int64_t[]){4 * h + 1}, s0, DT_BOOL), DT_ENOMEM);
    cr_expect_eq(dtn_check_fits("t", m22, 2, (int64_t[]){2 * h, 2}, s01, DT_BOOL), 0);
    cr_expect_eq(dtn_check_fits("t", m22, 2, (int64_t[]){2 * h + 1, 2}, s01, DT_BOOL), DT_ENOMEM);
    cr_expect_eq(dtn_check_fits("t", m22, 2, (int64_t[]){0, INT64_C(1) << 47}, r, DT_INT64), 0, "empty");
    dt_mesh_release(&m4);
    dt_mesh_release(&m22);
}
