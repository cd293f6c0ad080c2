/* bench_util — the timing and statistics every benchmark here shares. */
#ifndef BENCH_UTIL_H
#define BENCH_UTIL_H

#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static inline double bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts the n samples in place and returns their median. */
static inline double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* DTORCH_WORKER_PATH, else <dir of argv[0]>/../dtorch-worker (bench/ sits inside the build dir);
 * NULL when neither names an executable. */
static inline const char *bench_worker_path(const char *argv0, char *buf, size_t size)
{
    const char *env = getenv("DTORCH_WORKER_PATH");
    if (env && *env)
        return env;
    char self[PATH_MAX];
    if (!realpath(argv0, self)) {
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n <= 0)
            return NULL;
        self[n] = '\0';
    }
    snprintf(buf, size, "%s/../dtorch-worker", dirname(self));
    return access(buf, X_OK) == 0 ? buf : NULL;
}

#endif
