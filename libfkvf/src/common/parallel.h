/* The library's one way to use several threads: a parallel loop over
 * numbered items with a deterministic result.
 *
 * Every multi-threaded operation of libfkvf (encoding, decoding, training,
 * full verification: read/verify.c's rd_check_par, compaction's index
 * rebuild) cuts its work into items whose results go to disjoint places and do not
 * depend on which thread computes them or in what order,
 * so the output is bit-identical for every thread count. A thread count of
 * 1 runs every item on the calling thread and makes no pthread call (the
 * failure-injection tests count allocations and system calls). */
#ifndef FKVF_COMMON_PARALLEL_H
#define FKVF_COMMON_PARALLEL_H

#include <pthread.h>
#include <stddef.h>

/* The most threads one call uses. */
#define FKVF_PAR_MAX 256

/* The number of CPUs this process may run on (sched_getaffinity; 1 when
 * that cannot be known), at most FKVF_PAR_MAX. Thread-safe. */
unsigned fkvf_par_cpus(void);

/* The thread count for a request as fkvf.h defines it: 0 and 1 are one
 * thread, FKVF_THREADS_ALL is fkvf_par_cpus(), any other count is itself
 * capped at FKVF_PAR_MAX. Thread-safe. */
unsigned fkvf_par_threads(unsigned requested);

/* The workers a loop of n_items items on n_threads threads starts: the
 * smaller of the two, at least 1. A caller that keeps scratch per worker
 * allocates this many. */
unsigned fkvf_par_workers(unsigned n_threads, size_t n_items);

/* One item: worker is 0 .. fkvf_par_workers() - 1 (which scratch to use),
 * item 0 .. n_items - 1. Returns 0 or an FKVF_E_* code. */
typedef int (*fkvf_par_fn)(void *ctx, unsigned worker, size_t item);

/* Run fn for every item on fkvf_par_workers(n_threads, n_items) workers,
 * the calling thread being worker 0. Items are handed out in ascending
 * order, one at a time, to whichever worker is free. Returns 0, or the code
 * of the lowest-numbered item that failed (once an item fails, no item
 * above it is started; items below it still run, so the result does not
 * depend on the schedule). A thread that cannot be started leaves its share
 * to the others (the result is the same). fn must be safe to run on
 * several threads at once for different items. */
int fkvf_par_for(unsigned n_threads, size_t n_items, fkvf_par_fn fn, void *ctx);

/* A lock for what the workers of one loop share besides their items (a
 * progress count): FKVF_PAR_LOCK_INIT, then fkvf_par_enter / fkvf_par_leave
 * around the shared part; nothing to free. */
typedef struct fkvf_par_lock {
    pthread_mutex_t mu;
} fkvf_par_lock;
#define FKVF_PAR_LOCK_INIT {PTHREAD_MUTEX_INITIALIZER}
void fkvf_par_enter(fkvf_par_lock *l);
void fkvf_par_leave(fkvf_par_lock *l);

#endif
