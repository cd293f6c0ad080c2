/* dt_shm — memory that other processes of this host can read: memfd segments, and the mappings
 * of other processes' segments.
 *
 * A segment is one memfd of its owner, sealed against shrinking and growing, named
 * "dtorch-<owner pid>-<serial>" and mapped read-write by the owner. Another process reaches it as
 * /proc/<owner pid>/fd/<fd> (so it needs the owner's pid from someone it trusts, and the right to
 * read that process's descriptors: the same user, /proc mounted) and maps it read-only. Nothing
 * is ever in a file system: the memory goes when the last process holding it does, crash or not.
 *
 * Freed segments are kept for reuse like dt_pool's buffers, so a steady-state output faults no
 * page and keeps its serial, and the mappings peers hold of it stay valid. Owner side thread-safe;
 * a dt_shm_peer belongs to one thread. */
#ifndef DT_SHM_H
#define DT_SHM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DT_SHM_KEEP (512ull << 20)      /* most bytes of freed segments kept for reuse */

/* One segment of this process. */
typedef struct {
    void *data;         /* (size) mapped read-write here */
    size_t size;        /* bytes: what was asked, rounded up */
    int fd;             /* the memfd: another process opens /proc/<pid>/fd/<fd> */
    uint64_t serial;    /* unique in this process, never reused; part of its name */
} dt_shm_seg;

/* A segment of at least size bytes (a kept one when one fits), or NULL (and dt_last_error) when
 * the system gives none (no memfd, no file descriptor left, no memory, more than the host's
 * physical memory). */
dt_shm_seg *dt_shm_seg_new(size_t size);
/* Gives a segment back: kept for reuse, or closed and unmapped. Accepts NULL. */
void dt_shm_seg_free(dt_shm_seg *seg);
/* Closes every kept segment. */
void dt_shm_trim(void);
/* Bytes of the freed segments kept now. */
size_t dt_shm_kept(void);

/* Whether this process may open the descriptors of process pid (and so map its segments). */
bool dt_shm_reachable(int pid);

/* The segments of one other process that are mapped here, by serial. */
typedef struct dt_shm_peer dt_shm_peer;

dt_shm_peer *dt_shm_peer_new(int pid);
/* Unmaps every segment and frees p; nulls *p. Accepts NULL. */
void dt_shm_peer_destroy(dt_shm_peer **p);
/* The segment the peer names by (fd, serial), mapped read-only: *base and its real size *size.
 * Mapped once and kept; the first use checks that the descriptor is a memfd of the peer's with
 * that name, sealed against shrinking (so no read of a mapped byte can fault). NULL, or why not. */
const char *dt_shm_peer_map(dt_shm_peer *p, int64_t fd, uint64_t serial, const char **base, size_t *size);
/* How many segments of the peer are mapped here. */
int dt_shm_peer_count(const dt_shm_peer *p);

/* Whether a strided region (shape, byte strides, first element `offset` bytes into a segment of
 * size bytes, elements of elem bytes) lies wholly inside the segment: NULL, or why not. Every
 * number may come from a message; none can make it overflow. */
const char *dt_shm_region_check(size_t size, uint64_t offset, int ndim, const int64_t *shape, const int64_t *strides,
                                size_t elem);

#endif
