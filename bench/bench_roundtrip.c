/* bench_roundtrip — what a message costs in DTorch next to raw ZeroMQ, measured in one run.
 *
 * The references are measured here, not quoted, because these machines are noisy and a ratio
 * is only meaningful between figures taken minutes apart on the same box:
 *   (a) raw ZeroMQ DEALER/ROUTER ping-pong of one 64-byte frame: over inproc:// with the
 *       ROUTER in a second thread, and over ipc:// with the ROUTER in a forked child process
 *       (the shape of DTorch's thread and process workers);
 *   (b) DTorch: dt_full of 4 float32 on a 2-device mesh, dt_tensor_fetch, dt_future_wait;
 *   (c) pipelining: N one-element dt_full ops then dt_synchronize, beside N raw 64-byte
 *       DEALER sends then one echoed flush message;
 *   (d) the same for registry ops through dt_op_run on a (2, 2) float32 Replicate tensor: add,
 *       exp, reshape and select, each result released at once (what a decode step issues: the
 *       work is nothing, the cost is the call), beside the same raw sends; their user-thread CPU
 *       is measured apart, in chunks of 1024 ops with an untimed dt_synchronize after each (the
 *       devices run these slower than the thread issues them, and a wait on a full outbox would
 *       count as the ops' cost).
 *
 * Usage: bench_roundtrip [pingpong_iters [dtorch_iters [pipeline_ops]]]
 * Process workers run DTORCH_WORKER_PATH, else the dtorch-worker next to this program's
 * build directory (../dtorch-worker relative to argv[0]).
 */
#include <czmq.h>
#include <errno.h>
#include <limits.h>
#include <libgen.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "dtorch.h"

#define S_MSG_SIZE 64
#define S_WARMUP 2000   /* round trips before timing: connects, page faults, caches */
#define S_REPEATS 3     /* pipelined runs per figure; the best is kept (noise only slows) */

/* First byte of every raw message: what the peer does with it. */
enum { S_PING = 'P', S_DATA = 'D', S_FLUSH = 'F', S_QUIT = 'Q' };

typedef struct {
    double median_us, p90_us;
} s_latency;

typedef struct {
    double ops_per_s;  /* end to end: first send to last completion */
    double submit_ns;  /* per op, the send loop alone on the calling thread (wall time) */
    double cpu_ns;     /* ... and that thread's CPU time in it: on 2 cores the other threads preempt it */
} s_throughput;

/* The calling thread's CPU time (ns). */
static double s_thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

typedef struct {
    s_latency rt;
    s_throughput pipe;
    s_throughput ops[4];   /* s_ops, DTorch only */
} s_result;

/* (d)'s ops: name, inputs (the same tensor each time), int attributes. */
static const struct {
    const char *name;
    int nin, nints;
    int64_t ints[2];
} s_ops[] = {{"add", 2, 0, {0}}, {"exp", 1, 0, {0}}, {"reshape", 1, 1, {4}}, {"select", 1, 2, {0, 0}}};
#define S_NOPS ((int)(sizeof s_ops / sizeof s_ops[0]))



/* Sorts the samples (ns) in place. */
static s_latency s_summarise(double *ns, int n)
{
    qsort(ns, (size_t)n, sizeof *ns, bench_cmp_double);
    return (s_latency){ns[n / 2] / 1e3, ns[(int)(0.9 * (n - 1))] / 1e3};
}

static void s_die(const char *what)
{
    fprintf(stderr, "bench_roundtrip: %s failed: %s (%s)\n", what, dt_last_error(), zmq_strerror(zmq_errno()));
    exit(1);
}

/* ---- raw ZeroMQ ---------------------------------------------------------------------------- */

/* The peer: echoes pings and flushes to whoever sent them, swallows data, stops at QUIT.
 * QUIT gets no reply because the peer closes its socket right after and CZMQ's default linger
 * of 0 could drop the reply anyway. */
static void s_peer_loop(void *router)
{
    char id[256], payload[S_MSG_SIZE];
    for (;;) {
        int idn = zmq_recv(router, id, sizeof id, 0);
        if (idn < 0) {
            if (zmq_errno() == EINTR)
                continue;
            return;
        }
        int n = zmq_recv(router, payload, sizeof payload, 0);
        if (n < 1 || payload[0] == S_QUIT)
            return;
        if (payload[0] == S_DATA)
            continue;
        zmq_send(router, id, (size_t)idn, ZMQ_SNDMORE);
        zmq_send(router, payload, (size_t)n, 0);
    }
}

static void *s_peer_thread(void *router)
{
    zsock_t *sock = router;
    s_peer_loop(zsock_resolve(sock));
    zsock_destroy(&sock);
    return NULL;
}

static void s_send_kind(void *dealer, char kind)
{
    char msg[S_MSG_SIZE];
    memset(msg, 0x5a, sizeof msg);
    msg[0] = kind;
    if (zmq_send(dealer, msg, sizeof msg, 0) != (int)sizeof msg)
        s_die("zmq_send");
}

static void s_recv_reply(void *dealer)
{
    char msg[S_MSG_SIZE];
    if (zmq_recv(dealer, msg, sizeof msg, 0) != (int)sizeof msg)
        s_die("zmq_recv");
}

static s_latency s_raw_pingpong(void *dealer, int iters, double *samples)
{
    for (int i = 0; i < S_WARMUP; i++) {
        s_send_kind(dealer, S_PING);
        s_recv_reply(dealer);
    }
    for (int i = 0; i < iters; i++) {
        double t0 = bench_now_ns();
        s_send_kind(dealer, S_PING);
        s_recv_reply(dealer);
        samples[i] = bench_now_ns() - t0;
    }
    return s_summarise(samples, iters);
}

/* n data messages, then a flush whose echo proves the peer has taken every one of them.
 * Default high-water marks: the DEALER blocks (never drops) when the peer falls behind,
 * which is the raw counterpart of DTorch's credit window. */
static s_throughput s_raw_pipeline(void *dealer, long n)
{
    s_throughput best = {0, 0, 0};
    for (int r = 0; r < S_REPEATS; r++) {
        double t0 = bench_now_ns(), c0 = s_thread_cpu_ns();
        for (long i = 0; i < n; i++)
            s_send_kind(dealer, S_DATA);
        double t1 = bench_now_ns(), cpu = (s_thread_cpu_ns() - c0) / (double)n;
        s_send_kind(dealer, S_FLUSH);
        s_recv_reply(dealer);
        double t2 = bench_now_ns();
        double ops = (double)n / ((t2 - t0) * 1e-9), sub = (t1 - t0) / (double)n;
        if (ops > best.ops_per_s)
            best.ops_per_s = ops;
        if (r == 0 || sub < best.submit_ns)
            best.submit_ns = sub;
        if (r == 0 || cpu < best.cpu_ns)
            best.cpu_ns = cpu;
    }
    return best;
}

static s_result s_raw_run(const char *endpoint, int iters, long pipe_ops, double *samples)
{
    zsock_t *dealer = zsock_new_dealer(endpoint);  /* ">" is CZMQ's default for a DEALER: connect */
    if (!dealer)
        s_die(endpoint);
    void *d = zsock_resolve(dealer);
    s_result res = {s_raw_pingpong(d, iters, samples), s_raw_pipeline(d, pipe_ops)};
    s_send_kind(d, S_QUIT);
    zsock_destroy(&dealer);
    return res;
}

/* The ipc peer, forked before the parent has any ZeroMQ context (contexts do not survive fork):
 * the child makes its own and never returns. */
static pid_t s_fork_ipc_peer(const char *endpoint)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    /* if the benchmark dies, the peer must not block in recv forever */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(1);
    zsys_handler_set(NULL);
    zsock_t *router = zsock_new_router(endpoint);  /* "@": CZMQ's default for a ROUTER: bind */
    if (!router)
        _exit(1);
    s_peer_loop(zsock_resolve(router));
    zsock_destroy(&router);
    zsys_shutdown();
    _exit(0);
}

/* ---- DTorch -------------------------------------------------------------------------------- */

static dt_tensor *s_full(dt_mesh *mesh, int64_t numel)
{
    return dt_full(mesh, 1, (int64_t[]){numel}, DT_FLOAT32, NULL, (dt_scalar){.is_int = false, .f = 1.0});
}

/* One op, one fetch, one wait: the whole latency a user sees for a value. The releases sit
 * outside the timed span because they only queue free records for the next op's message. */
static s_latency s_dt_roundtrip(dt_mesh *mesh, int iters, double *samples)
{
    for (int i = 0; i < S_WARMUP + iters; i++) {
        double t0 = bench_now_ns();
        dt_tensor *x = s_full(mesh, 4);
        if (!x)
            s_die("dt_full");
        dt_future *f = dt_tensor_fetch(x);
        if (!f || dt_future_wait(f, -1) != 0)
            s_die("fetch");
        double t1 = bench_now_ns();
        const float *v = dt_future_data(f, 0);
        if (!v || v[0] != 1.0f || v[3] != 1.0f) {
            fprintf(stderr, "bench_roundtrip: fetched a wrong value\n");
            exit(1);
        }
        if (i >= S_WARMUP)
            samples[i - S_WARMUP] = t1 - t0;
        dt_future_release(&f);
        dt_tensor_release(&x);
    }
    return s_summarise(samples, iters);
}

/* One op of the pipeline: dt_full of one element (op < 0), or s_ops[op] on x; released at once,
 * as a training loop would: nothing piles up on the devices. */
static void s_dt_one(dt_mesh *mesh, int op, int id, dt_tensor *x)
{
    dt_tensor *y = NULL;
    if (op < 0) {
        y = s_full(mesh, 1);
    } else {
        dt_op_attrs attrs = {.nints = s_ops[op].nints};
        memcpy(attrs.ints, s_ops[op].ints, sizeof s_ops[op].ints);
        if (dt_op_run(id, s_ops[op].nin, (dt_tensor *[]){x, x}, &attrs, 1, &y) != 1)
            y = NULL;
    }
    if (!y)
        s_die(op < 0 ? "dt_full" : s_ops[op].name);
    dt_tensor_release(&y);
}

/* The user thread's CPU time per op (ns) with the devices kept out of its way: chunks of
 * S_CHUNK ops, each timed alone and followed by an untimed dt_synchronize, so that the thread never
 * waits on a full outbox (whose wait would count as the op's cost). Best of S_REPEATS. */
#define S_CHUNK 1024
static double s_dt_submit_cpu(dt_mesh *mesh, long n, int op, dt_tensor *x)
{
    int id = op < 0 ? -1 : dt_op_id(s_ops[op].name);
    double best = 0;
    for (int r = 0; r < S_REPEATS; r++) {
        double cpu = 0;
        for (long done = 0; done < n; done += S_CHUNK) {
            long chunk = n - done < S_CHUNK ? n - done : S_CHUNK;
            double c0 = s_thread_cpu_ns();
            for (long i = 0; i < chunk; i++)
                s_dt_one(mesh, op, id, x);
            cpu += s_thread_cpu_ns() - c0;
            if (dt_synchronize() != 0)
                s_die("dt_synchronize");
        }
        if (r == 0 || cpu / (double)n < best)
            best = cpu / (double)n;
    }
    return best;
}

static s_throughput s_dt_pipeline(dt_mesh *mesh, long n, int op, dt_tensor *x)
{
    int id = op < 0 ? -1 : dt_op_id(s_ops[op].name);
    s_throughput best = {0, 0, 0};
    for (int r = 0; r < S_REPEATS; r++) {
        double t0 = bench_now_ns(), c0 = s_thread_cpu_ns();
        for (long i = 0; i < n; i++)
            s_dt_one(mesh, op, id, x);
        double t1 = bench_now_ns(), cpu = (s_thread_cpu_ns() - c0) / (double)n;
        if (dt_synchronize() != 0)
            s_die("dt_synchronize");
        double t2 = bench_now_ns();
        double ops = (double)n / ((t2 - t0) * 1e-9), sub = (t1 - t0) / (double)n;
        if (ops > best.ops_per_s)
            best.ops_per_s = ops;
        if (r == 0 || sub < best.submit_ns)
            best.submit_ns = sub;
        if (r == 0 || cpu < best.cpu_ns)
            best.cpu_ns = cpu;
    }
    return best;
}

static s_result s_dt_run(dt_workers mode, const char *worker_path, int iters, long pipe_ops, double *samples)
{
    if (dt_init(&(dt_config){mode, worker_path}) != 0)
        s_die("dt_init");
    dt_mesh *mesh = dt_mesh_new("cpu", 1, (int64_t[]){2}, (int64_t[]){0, 1}, NULL);
    if (!mesh)
        s_die("dt_mesh_new");
    s_result res;
    res.rt = s_dt_roundtrip(mesh, iters, samples);
    /* one untimed batch so that buffer pools and credit windows are in their steady state */
    s_dt_pipeline(mesh, pipe_ops / 10 + 1, -1, NULL);
    res.pipe = s_dt_pipeline(mesh, pipe_ops, -1, NULL);
    dt_tensor *x = dt_full(mesh, 2, (int64_t[]){2, 2}, DT_FLOAT32, NULL, (dt_scalar){.is_int = false, .f = 1.0});
    if (!x)
        s_die("dt_full");
    for (int op = 0; op < S_NOPS; op++) {
        s_dt_pipeline(mesh, pipe_ops / 10 + 1, op, x);
        res.ops[op] = s_dt_pipeline(mesh, pipe_ops, op, x);
        res.ops[op].cpu_ns = s_dt_submit_cpu(mesh, pipe_ops, op, x);
    }
    dt_tensor_release(&x);
    dt_mesh_release(&mesh);
    if (dt_shutdown() != 0)
        s_die("dt_shutdown");
    return res;
}


/* ---- report -------------------------------------------------------------------------------- */

static void s_row(const char *what, const char *unit, double ref, double dt)
{
    printf("  %-40s %-6s %12.2f %12.2f %9.2fx\n", what, unit, ref, dt, dt / ref);
}

static void s_report(const char *title, const char *ref_desc, const s_result *ref, const s_result *dt, long pipe_ops)
{
    printf("\n%s\n  reference: %s\n", title, ref_desc);
    printf("  %-40s %-6s %12s %12s %10s\n", "figure", "unit", "reference", "DTorch", "DT/ref");
    s_row("op+fetch round trip, median", "us", ref->rt.median_us, dt->rt.median_us);
    s_row("op+fetch round trip, p90", "us", ref->rt.p90_us, dt->rt.p90_us);
    char what[64];
    snprintf(what, sizeof what, "pipelined, %ld ops, end to end", pipe_ops);
    s_row(what, "Mops/s", ref->pipe.ops_per_s / 1e6, dt->pipe.ops_per_s / 1e6);
    s_row("user thread per op (submit loop)", "ns", ref->pipe.submit_ns, dt->pipe.submit_ns);
    s_row("user thread CPU per op (submit loop)", "ns", ref->pipe.cpu_ns, dt->pipe.cpu_ns);
    for (int op = 0; op < S_NOPS; op++) {
        snprintf(what, sizeof what, "%s: pipelined, end to end", s_ops[op].name);
        s_row(what, "Mops/s", ref->pipe.ops_per_s / 1e6, dt->ops[op].ops_per_s / 1e6);
        snprintf(what, sizeof what, "%s: user thread CPU per op (chunks)", s_ops[op].name);
        s_row(what, "ns", ref->pipe.cpu_ns, dt->ops[op].cpu_ns);
    }
}

int main(int argc, char **argv)
{
    int iters = argc > 1 ? atoi(argv[1]) : 20000;
    int dt_iters = argc > 2 ? atoi(argv[2]) : 10000;
    long pipe_ops = argc > 3 ? atol(argv[3]) : 200000;
    if (iters < 10 || dt_iters < 10 || pipe_ops < 10) {
        fprintf(stderr, "usage: %s [pingpong_iters>=10 [dtorch_iters>=10 [pipeline_ops>=10]]]\n", argv[0]);
        return 2;
    }

    char ipc_endpoint[128];
    snprintf(ipc_endpoint, sizeof ipc_endpoint, "ipc:///tmp/dtorch-bench-%d.ipc", (int)getpid());
    fflush(stdout);
    pid_t peer = s_fork_ipc_peer(ipc_endpoint);  /* first: no context exists yet in this process */
    if (peer < 0) {
        perror("fork");
        return 1;
    }
    zsys_handler_set(NULL);  /* Ctrl-C should stop the benchmark, not set a flag nobody reads */

    char wbuf[PATH_MAX + 32];
    const char *worker_path = bench_worker_path(argv[0], wbuf, sizeof wbuf);
    if (!worker_path) {
        fprintf(stderr, "bench_roundtrip: no dtorch-worker found: set DTORCH_WORKER_PATH\n");
        kill(peer, SIGKILL);
        return 1;
    }

    int nmax = iters > dt_iters ? iters : dt_iters;
    double *samples = malloc(sizeof *samples * (size_t)nmax);
    if (!samples)
        return 1;

    const char *coretype = getenv("OPENBLAS_CORETYPE");
    printf("DTorch round-trip benchmark: %ld CPUs online; OPENBLAS_CORETYPE=%s%s\n", sysconf(_SC_NPROCESSORS_ONLN),
           coretype ? coretype : "(unset)", coretype ? " (set in the environment; these ops do not use BLAS)" : "");
    printf("  ZeroMQ %d.%d.%d, CZMQ %d.%d.%d; message %d B; round trips: %d raw, %d DTorch after %d warm-up; "
           "pipelined: best of %d\n",
           ZMQ_VERSION_MAJOR, ZMQ_VERSION_MINOR, ZMQ_VERSION_PATCH, CZMQ_VERSION_MAJOR, CZMQ_VERSION_MINOR,
           CZMQ_VERSION_PATCH, S_MSG_SIZE, iters, dt_iters, S_WARMUP, S_REPEATS);
    printf("  worker: %s\n", worker_path);
    printf("  DT/ref: DTorch divided by reference (above 1 is slower for us and ns, faster for Mops/s)\n");
    fflush(stdout);

    /* raw inproc: the ROUTER is bound here, then handed to its thread (pthread_create is the
     * full barrier ZeroMQ asks for when a socket changes threads) */
    zsock_t *router = zsock_new_router("inproc://dtorch-bench-pingpong");
    if (!router)
        s_die("inproc router");
    pthread_t peer_thread;
    if (pthread_create(&peer_thread, NULL, s_peer_thread, router) != 0)
        s_die("pthread_create");
    s_result raw_inproc = s_raw_run("inproc://dtorch-bench-pingpong", iters, pipe_ops, samples);
    pthread_join(peer_thread, NULL);

    s_result raw_ipc = s_raw_run(ipc_endpoint, iters, pipe_ops, samples);
    int status;
    waitpid(peer, &status, 0);
    /* ZeroMQ does not always remove the socket file when the child's context ends */
    unlink(ipc_endpoint + strlen("ipc://"));

    s_result dt_thread = s_dt_run(DT_WORKERS_THREAD, worker_path, dt_iters, pipe_ops, samples);
    s_result dt_process = s_dt_run(DT_WORKERS_PROCESS, worker_path, dt_iters, pipe_ops, samples);

    s_report("thread workers (inproc)",
             "raw DEALER/ROUTER ping-pong over inproc://, ROUTER echoing in a second thread; "
             "pipelined = DEALER sends, then one echoed flush",
             &raw_inproc, &dt_thread, pipe_ops);
    s_report("process workers (ipc)",
             "raw DEALER/ROUTER ping-pong over ipc://, ROUTER echoing in a forked child process; "
             "pipelined = DEALER sends, then one echoed flush",
             &raw_ipc, &dt_process, pipe_ops);
    printf("\nDTorch op = dt_full on a 2-device mesh (4 float32 for the round trip, then dt_tensor_fetch + "
           "dt_future_wait;\n  1 element when pipelined, released at once, then dt_synchronize); add, exp, reshape, "
           "select: dt_op_run\n  on a (2, 2) float32 Replicate tensor, each result released at once, beside the "
           "same raw sends\n");

    free(samples);
    zsys_shutdown();
    return 0;
}
