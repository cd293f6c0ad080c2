/* dt_pool — memory for tensor pieces. Large buffers come 2 MiB-aligned with transparent huge
 * pages asked for, medium ones in power-of-two sizes, and freed ones of both are kept for reuse:
 * a fresh page costs a fault on first touch (~12 us per 4 KiB here), which otherwise dominates
 * copying into new outputs (malloc hands medium buffers back to the system and faults them in
 * again: 7% of a diffusion step's time went to clearing pages). Small buffers are malloc's.
 * Thread-safe. */
#ifndef DT_POOL_H
#define DT_POOL_H

#include <stdbool.h>
#include <stddef.h>

#define DT_POOL_MEDIUM (64u << 10)      /* buffers from this size up are pooled ... */
#define DT_POOL_LARGE (1u << 20)        /* ... and from this size up huge-page aligned */
#define DT_POOL_KEEP (512ull << 20)     /* most bytes kept for reuse */

/* NULL when there is no memory, and for a buffer larger than the host's physical memory, which no
 * piece can have (the controller refuses such a piece before it sends anything: dt_op's rule) */
void *dt_pool_alloc(size_t size);
void dt_pool_free(void *data, size_t size);
/* Gives what dt_pool_alloc returned back to the system at once, keeping nothing (a buffer of the
 * controller's that a worker process received a copy of). */
void dt_pool_give_back(void *data);
/* Whether data (size bytes) is a buffer this pool made 2 MiB-aligned and advised for transparent huge
 * pages (MADV_HUGEPAGE, before anything touched it) on a kernel that took the advice: one of
 * DT_POOL_LARGE bytes or more that dt_pool_alloc returned, or a slice of one from its start. What
 * the kernel then gives (AnonHugePages) depends on the machine's state and is not promised. */
bool dt_pool_advised(const void *data, size_t size);
/* Whether the kernel takes MADV_HUGEPAGE (has transparent huge pages); asked once. */
bool dt_pool_huge_pages(void);
/* Bytes of freed buffers kept for reuse now (this process's, every device of it together). */
size_t dt_pool_kept(void);
/* Bytes of physical memory of this host (cached after the first call); 0 when the system does not
 * say. */
size_t dt_pool_host_memory(void);
/* Gives every kept buffer back to the system. */
void dt_pool_trim(void);

#endif
