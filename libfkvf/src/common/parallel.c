/* The parallel loop of common/parallel.h: POSIX threads, one mutex guarding
 * the next item and the lowest failure. Items are coarse (a range of rows,
 * one stage table set), so a lock per item costs nothing. */
#define _GNU_SOURCE
#include "parallel.h"

#include "fkvf.h"

#include <pthread.h>
#include <sched.h>
#include <stdint.h>

unsigned fkvf_par_cpus(void)
{
#ifdef CPU_COUNT
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0)
            return n > FKVF_PAR_MAX ? FKVF_PAR_MAX : (unsigned)n;
    }
#endif
    return 1;
}

unsigned fkvf_par_threads(unsigned requested)
{
    if (requested == FKVF_THREADS_ALL)
        return fkvf_par_cpus();
    if (requested <= 1)
        return 1;
    return requested > FKVF_PAR_MAX ? FKVF_PAR_MAX : requested;
}

FKVF_API unsigned fkvf_cpu_count(void)
{
    return fkvf_par_cpus();
}

unsigned fkvf_par_workers(unsigned n_threads, size_t n_items)
{
    unsigned t = n_threads ? n_threads : 1;
    if (t > FKVF_PAR_MAX)
        t = FKVF_PAR_MAX;
    return n_items < t ? (n_items ? (unsigned)n_items : 1u) : t;
}

typedef struct par_loop {
    pthread_mutex_t mu;
    size_t next;      /* the next item to hand out */
    size_t n;         /* items */
    size_t fail_item; /* the lowest failed item (n: none) */
    int fail_rc;
    fkvf_par_fn fn;
    void *ctx;
} par_loop;

typedef struct par_worker {
    par_loop *loop;
    unsigned id;
} par_worker;

/* The next item for a worker, or n when there is none left to start: the
 * items are done, or every item left lies above a failure. */
static size_t take(par_loop *p)
{
    pthread_mutex_lock(&p->mu);
    size_t i = p->next < p->fail_item ? p->next++ : p->n;
    pthread_mutex_unlock(&p->mu);
    return i;
}

static void failed(par_loop *p, size_t item, int rc)
{
    pthread_mutex_lock(&p->mu);
    if (item < p->fail_item) {
        p->fail_item = item;
        p->fail_rc = rc;
    }
    pthread_mutex_unlock(&p->mu);
}

static void *work(void *arg)
{
    par_worker *w = arg;
    par_loop *p = w->loop;
    for (size_t i; (i = take(p)) < p->n;) {
        int rc = p->fn(p->ctx, w->id, i);
        if (rc)
            failed(p, i, rc);
    }
    return NULL;
}

/* One worker, the calling thread: no pthread call at all. */
static int run_serial(size_t n_items, fkvf_par_fn fn, void *ctx)
{
    for (size_t i = 0; i < n_items; i++) {
        int rc = fn(ctx, 0, i);
        if (rc)
            return rc;
    }
    return 0;
}

int fkvf_par_for(unsigned n_threads, size_t n_items, fkvf_par_fn fn, void *ctx)
{
    unsigned nw = fkvf_par_workers(n_threads, n_items);
    if (nw <= 1)
        return run_serial(n_items, fn, ctx);
    par_loop p;
    if (pthread_mutex_init(&p.mu, NULL) != 0)
        return run_serial(n_items, fn, ctx);
    p.next = 0;
    p.n = n_items;
    p.fail_item = n_items;
    p.fail_rc = 0;
    p.fn = fn;
    p.ctx = ctx;
    par_worker w[FKVF_PAR_MAX];
    pthread_t tid[FKVF_PAR_MAX];
    unsigned started = 0;
    for (unsigned i = 1; i < nw; i++) {
        w[started + 1].loop = &p;
        w[started + 1].id = started + 1;
        if (pthread_create(&tid[started], NULL, work, &w[started + 1]) != 0)
            break; /* the workers started (and the caller) take its share */
        started++;
    }
    w[0].loop = &p;
    w[0].id = 0;
    work(&w[0]);
    for (unsigned i = 0; i < started; i++)
        pthread_join(tid[i], NULL);
    pthread_mutex_destroy(&p.mu);
    return p.fail_rc;
}

void fkvf_par_enter(fkvf_par_lock *l)
{
    pthread_mutex_lock(&l->mu);
}

void fkvf_par_leave(fkvf_par_lock *l)
{
    pthread_mutex_unlock(&l->mu);
}
