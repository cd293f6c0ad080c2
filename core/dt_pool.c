/* dt_pool — pooled memory for tensor pieces: large buffers huge-page aligned and kept for reuse. */
#include "dt_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#define S_HUGE (2u << 20)
#define S_SLOTS 128

static pthread_mutex_t s_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    void *data;
    size_t size;
} s_kept[S_SLOTS];
static size_t s_kept_bytes;
static atomic_int s_thp; /* whether the kernel takes MADV_HUGEPAGE: 0 not known yet, 1 yes, 2 no */

/* Rounded so that buffers of nearly the same size are interchangeable: large ones to whole huge
 * pages, medium ones to the next power of two. */
static size_t s_round(size_t size)
{
    if (size >= DT_POOL_LARGE)
        return (size + S_HUGE - 1) / S_HUGE * S_HUGE;
    size_t rounded = DT_POOL_MEDIUM;
    while (rounded < size)
        rounded *= 2;
    return rounded;
}

size_t dt_pool_host_memory(void)
{
    static _Atomic size_t memory; /* 0 until asked: the answer does not change while we run */
    size_t m = memory;
    if (m == 0) {
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        if (pages > 0 && page > 0 && (size_t)pages <= SIZE_MAX / (size_t)page)
            memory = m = (size_t)pages * (size_t)page;
    }
    return m;
}

void *dt_pool_alloc(size_t size)
{
    size_t host = dt_pool_host_memory();
    if (host && size > host)
        return NULL; /* only an overcommitting kernel would give it, and the first touch kills us */
    if (size < DT_POOL_MEDIUM)
        return malloc(size ? size : 1);
    size = s_round(size);
    pthread_mutex_lock(&s_lock);
    for (int i = 0; i < S_SLOTS; i++)
        if (s_kept[i].data && s_kept[i].size == size) {
            void *data = s_kept[i].data;
            s_kept[i].data = NULL;
            s_kept_bytes -= size;
            pthread_mutex_unlock(&s_lock);
            return data;
        }
    pthread_mutex_unlock(&s_lock);
    if (size < DT_POOL_LARGE)
        return malloc(size);
    void *data = NULL;
    if (posix_memalign(&data, S_HUGE, size) != 0)
        return NULL;
    atomic_store(&s_thp, madvise(data, size, MADV_HUGEPAGE) == 0 ? 1 : 2);
    return data;
}

bool dt_pool_huge_pages(void)
{
    int thp = atomic_load(&s_thp);
    if (thp == 0) { /* asked before any large buffer was made: ask the kernel with a mapping of our own */
        void *probe = mmap(NULL, S_HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        thp = probe != MAP_FAILED && madvise(probe, S_HUGE, MADV_HUGEPAGE) == 0 ? 1 : 2;
        if (probe != MAP_FAILED)
            munmap(probe, S_HUGE);
        atomic_store(&s_thp, thp);
    }
    return thp == 1;
}

bool dt_pool_advised(const void *data, size_t size)
{
    return size >= DT_POOL_LARGE && data && ((uintptr_t)data & (S_HUGE - 1)) == 0 && dt_pool_huge_pages();
}

void dt_pool_free(void *data, size_t size)
{
    if (!data)
        return;
    if (size < DT_POOL_MEDIUM) {
        free(data);
        return;
    }
    size = s_round(size);
    pthread_mutex_lock(&s_lock);
    for (int i = 0; i < S_SLOTS && s_kept_bytes + size <= DT_POOL_KEEP; i++)
        if (!s_kept[i].data) {
            s_kept[i].data = data;
            s_kept[i].size = size;
            s_kept_bytes += size;
            pthread_mutex_unlock(&s_lock);
            return;
        }
    pthread_mutex_unlock(&s_lock);
    free(data);
}

void dt_pool_give_back(void *data) { free(data); }

void dt_pool_trim(void)
{
    pthread_mutex_lock(&s_lock);
    for (int i = 0; i < S_SLOTS; i++) {
        free(s_kept[i].data);
        s_kept[i].data = NULL;
    }
    s_kept_bytes = 0;
    pthread_mutex_unlock(&s_lock);
}

size_t dt_pool_kept(void)
{
    pthread_mutex_lock(&s_lock);
    size_t kept = s_kept_bytes;
    pthread_mutex_unlock(&s_lock);
    return kept;
}
