/* dt_shm — memfd segments owned here (kept for reuse), the mapped segments of other processes, and
 * the bounds check of a region that a message says lies in one. */
#include "dt_shm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dt_error.h"
#include "dt_pool.h"

#define S_HUGE (2u << 20)       /* segments from this size up are whole huge pages */
#define S_SMALL (64u << 10)     /* ... smaller ones whole multiples of this */
#define S_SLOTS 64              /* freed segments kept at most */
#define S_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
#define S_MAX_MAPPED 1024       /* segments of one peer mapped here; past it the least recently used goes */
#define S_WHY_MAX 256

static pthread_mutex_t s_lock = PTHREAD_MUTEX_INITIALIZER;
static dt_shm_seg *s_kept[S_SLOTS];
static size_t s_kept_bytes;
static uint64_t s_next_serial = 1;

static _Thread_local char s_why[S_WHY_MAX]; /* the message a failed check returns */

/* Rounded so that segments of nearly the same size are interchangeable. */
static size_t s_round(size_t size)
{
    size_t unit = size < S_HUGE ? S_SMALL : S_HUGE;
    return (size + unit - 1) / unit * unit;
}

/* What readlink says of the descriptor of segment serial of process pid. */
static void s_link_name(char *buf, size_t n, int pid, uint64_t serial)
{
    snprintf(buf, n, "/memfd:dtorch-%d-%" PRIu64 " (deleted)", pid, serial);
}

dt_shm_seg *dt_shm_seg_new(size_t size)
{
    /* a segment is populated at once: one larger than the host would have the kernel's OOM killer
     * end this process rather than fail the call */
    size_t host = dt_pool_host_memory();
    if (host && size > host) {
        dt_err(DT_ENOMEM, "cannot make a shared memory segment of %zu bytes: the host has %zu bytes of memory",
               size, host);
        return NULL;
    }
    size = s_round(size ? size : 1);
    pthread_mutex_lock(&s_lock);
    for (int i = 0; i < S_SLOTS; i++)
        if (s_kept[i] && s_kept[i]->size == size) {
            dt_shm_seg *seg = s_kept[i];
            s_kept[i] = NULL;
            s_kept_bytes -= size;
            pthread_mutex_unlock(&s_lock);
            return seg;
        }
    uint64_t serial = s_next_serial++;
    pthread_mutex_unlock(&s_lock);
    dt_shm_seg *seg = calloc(1, sizeof *seg);
    if (!seg) {
        dt_err(DT_ENOMEM, "out of memory");
        return NULL;
    }
    char name[64];
    snprintf(name, sizeof name, "dtorch-%d-%" PRIu64, (int)getpid(), serial);
    seg->fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    seg->data = MAP_FAILED;
    if (seg->fd < 0 || ftruncate(seg->fd, (off_t)size) != 0 || fcntl(seg->fd, F_ADD_SEALS, S_SEALS) != 0 ||
        (seg->data = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, seg->fd, 0)) == MAP_FAILED) {
        dt_err(DT_ESYS, "cannot make a shared memory segment of %zu bytes: %s", size, strerror(errno));
        if (seg->fd >= 0)
            close(seg->fd);
        free(seg);
        return NULL;
    }
    /* every byte of a piece is written: take the pages now, in one call rather than a fault each
     * (and as huge pages where the system allows them for shared memory) */
    madvise(seg->data, size, MADV_HUGEPAGE);
    madvise(seg->data, size, MADV_POPULATE_WRITE);
    seg->size = size;
    seg->serial = serial;
    return seg;
}

static void s_seg_close(dt_shm_seg *seg)
{
    munmap(seg->data, seg->size);
    close(seg->fd);
    free(seg);
}

void dt_shm_seg_free(dt_shm_seg *seg)
{
    if (!seg)
        return;
    pthread_mutex_lock(&s_lock);
    for (int i = 0; i < S_SLOTS && s_kept_bytes + seg->size <= DT_SHM_KEEP; i++)
        if (!s_kept[i]) {
            s_kept[i] = seg;
            s_kept_bytes += seg->size;
            pthread_mutex_unlock(&s_lock);
            return;
        }
    pthread_mutex_unlock(&s_lock);
    s_seg_close(seg);
}

void dt_shm_trim(void)
{
    pthread_mutex_lock(&s_lock);
    for (int i = 0; i < S_SLOTS; i++) {
        if (s_kept[i])
            s_seg_close(s_kept[i]);
        s_kept[i] = NULL;
    }
    s_kept_bytes = 0;
    pthread_mutex_unlock(&s_lock);
}

size_t dt_shm_kept(void)
{
    pthread_mutex_lock(&s_lock);
    size_t n = s_kept_bytes;
    pthread_mutex_unlock(&s_lock);
    return n;
}

bool dt_shm_reachable(int pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", pid);
    DIR *dir = pid > 0 ? opendir(path) : NULL;
    if (dir)
        closedir(dir);
    return dir != NULL;
}

/* ---- the segments of another process --------------------------------------------------------- */

typedef struct {
    uint64_t serial;
    int fd;                 /* the owner's descriptor number */
    const char *base;       /* (size) mapped read-only */
    size_t size;
    uint64_t used;          /* the peer's clock when last looked up */
} s_mapped;

struct dt_shm_peer {
    int pid;
    int n, cap;
    s_mapped *maps;         /* (n) */
    uint64_t clock;         /* counts lookups */
};

dt_shm_peer *dt_shm_peer_new(int pid)
{
    dt_shm_peer *p = calloc(1, sizeof *p);
    if (p)
        p->pid = pid;
    return p;
}

static void s_unmap(dt_shm_peer *p, int i)
{
    munmap((void *)p->maps[i].base, p->maps[i].size);
    p->maps[i] = p->maps[--p->n];
}

void dt_shm_peer_destroy(dt_shm_peer **pp)
{
    dt_shm_peer *p = *pp;
    *pp = NULL;
    if (!p)
        return;
    while (p->n)
        s_unmap(p, p->n - 1);
    free(p->maps);
    free(p);
}

int dt_shm_peer_count(const dt_shm_peer *p) { return p ? p->n : 0; }

/* Whether the owner's descriptor fd is still segment serial. */
static bool s_names(int pid, int fd, uint64_t serial)
{
    char path[64], want[96], got[96];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, fd);
    s_link_name(want, sizeof want, pid, serial);
    ssize_t n = readlink(path, got, sizeof got - 1);
    return n >= 0 && (size_t)n == strlen(want) && memcmp(got, want, (size_t)n) == 0;
}

/* Unmaps the segments whose descriptor the owner has closed (it gave the segment back to the
 * system): their serials never come again. Only on a miss, so the steady state pays nothing. */
static void s_sweep(dt_shm_peer *p)
{
    for (int i = p->n - 1; i >= 0; i--)
        if (!s_names(p->pid, p->maps[i].fd, p->maps[i].serial))
            s_unmap(p, i);
}

/* Opens and maps the owner's descriptor fd, checking it is segment serial: NULL or why not. */
static const char *s_map_new(dt_shm_peer *p, int fd, uint64_t serial, s_mapped *out)
{
    /* what the descriptor is, before opening it: only a segment is ever opened */
    if (!s_names(p->pid, fd, serial)) {
        snprintf(s_why, sizeof s_why, "descriptor %d of process %d is not its shared segment %" PRIu64, fd, p->pid,
                 serial);
        return s_why;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", p->pid, fd);
    int own = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (own < 0) {
        snprintf(s_why, sizeof s_why, "cannot open %s: %s", path, strerror(errno));
        return s_why;
    }
    /* and what was opened: the descriptor may have changed since readlink looked */
    struct stat st;
    int seals = fcntl(own, F_GET_SEALS);
    snprintf(path, sizeof path, "/proc/self/fd/%d", own);
    char want[96], got[96];
    s_link_name(want, sizeof want, p->pid, serial);
    ssize_t n = readlink(path, got, sizeof got - 1);
    const char *why = NULL;
    if (n < 0 || (size_t)n != strlen(want) || memcmp(got, want, (size_t)n) != 0)
        why = "it changed while being opened";
    else if (fstat(own, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0)
        why = "it is not a memory segment";
    else if (seals < 0 || !(seals & F_SEAL_SHRINK))
        why = "it is not sealed against shrinking";
    void *base = MAP_FAILED;
    if (!why && (base = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED | MAP_POPULATE, own, 0)) == MAP_FAILED)
        why = strerror(errno);
    close(own);
    if (why) {
        snprintf(s_why, sizeof s_why, "cannot map segment %" PRIu64 " of process %d: %s", serial, p->pid, why);
        return s_why;
    }
    *out = (s_mapped){serial, fd, base, (size_t)st.st_size, p->clock};
    return NULL;
}

const char *dt_shm_peer_map(dt_shm_peer *p, int64_t fd, uint64_t serial, const char **base, size_t *size)
{
    if (fd < 0 || fd > INT_MAX)
        return "a segment descriptor out of range";
    p->clock++;
    for (int i = 0; i < p->n; i++)
        if (p->maps[i].serial == serial && p->maps[i].fd == (int)fd) {
            p->maps[i].used = p->clock;
            *base = p->maps[i].base;
            *size = p->maps[i].size;
            return NULL;
        }
    s_sweep(p);
    if (p->n == S_MAX_MAPPED) {
        int oldest = 0;
        for (int i = 1; i < p->n; i++)
            if (p->maps[i].used < p->maps[oldest].used)
                oldest = i;
        s_unmap(p, oldest);
    }
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 8;
        s_mapped *grown = realloc(p->maps, (size_t)cap * sizeof *grown);
        if (!grown)
            return "out of memory";
        p->maps = grown;
        p->cap = cap;
    }
    const char *why = s_map_new(p, (int)fd, serial, &p->maps[p->n]);
    if (why)
        return why;
    *base = p->maps[p->n].base;
    *size = p->maps[p->n].size;
    p->n++;
    return NULL;
}

const char *dt_shm_region_check(size_t size, uint64_t offset, int ndim, const int64_t *shape, const int64_t *strides,
                                size_t elem)
{
    /* the last byte of the region is offset + sum((shape[d] - 1) * strides[d]) + elem - 1 */
    uint64_t last = offset;
    bool empty = false;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0 || strides[d] < 0)
            return "a region with a negative size or stride";
        if (shape[d] == 0)
            empty = true;
        uint64_t step;
        if (shape[d] > 0 && (__builtin_mul_overflow((uint64_t)(shape[d] - 1), (uint64_t)strides[d], &step) ||
                             __builtin_add_overflow(last, step, &last)))
            return "a region beyond any segment";
    }
    if (empty)
        return offset <= size ? NULL : "a region outside its segment";
    if (__builtin_add_overflow(last, (uint64_t)elem, &last) || last > size)
        return "a region outside its segment";
    return NULL;
}
