/* A background job: one function at a time on one more thread, so that a
 * command can write (or read) one chunk while it computes the next
 * (unpack). Without a thread (it could not be started), jobs run when
 * posted, with the same results. See cli_util.h. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"

struct cli_bg_thread {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int (*fn)(void *);
    void *arg;
    int posted, quit; /* a job waits to run; the thread is to end */
};

static void *bg_main(void *opaque)
{
    cli_bg *bg = opaque;
    struct cli_bg_thread *t = bg->t;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->posted && !t->quit)
            pthread_cond_wait(&t->cv, &t->mu);
        if (!t->posted)
            break; /* quit, nothing left */
        int (*fn)(void *) = t->fn;
        void *arg = t->arg;
        pthread_mutex_unlock(&t->mu);
        int rc = fn(arg);
        pthread_mutex_lock(&t->mu);
        if (rc && !bg->rc)
            bg->rc = rc;
        t->posted = 0;
        pthread_cond_broadcast(&t->cv);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

void cli_bg_start(cli_bg *bg)
{
    memset(bg, 0, sizeof *bg);
    struct cli_bg_thread *t = calloc(1, sizeof *t);
    if (!t)
        return;
    if (pthread_mutex_init(&t->mu, NULL)) {
        free(t);
        return;
    }
    if (pthread_cond_init(&t->cv, NULL)) {
        pthread_mutex_destroy(&t->mu);
        free(t);
        return;
    }
    bg->t = t;
    if (pthread_create(&t->th, NULL, bg_main, bg)) {
        pthread_cond_destroy(&t->cv);
        pthread_mutex_destroy(&t->mu);
        free(t);
        bg->t = NULL;
    }
}

int cli_bg_wait(cli_bg *bg)
{
    struct cli_bg_thread *t = bg->t;
    if (t) {
        pthread_mutex_lock(&t->mu);
        while (t->posted)
            pthread_cond_wait(&t->cv, &t->mu);
        pthread_mutex_unlock(&t->mu);
    }
    return bg->rc;
}

int cli_bg_post(cli_bg *bg, int (*fn)(void *), void *arg)
{
    int rc = cli_bg_wait(bg);
    if (rc)
        return rc; /* a job failed: nothing more runs */
    struct cli_bg_thread *t = bg->t;
    if (!t)
        return bg->rc = fn(arg);
    pthread_mutex_lock(&t->mu);
    t->fn = fn;
    t->arg = arg;
    t->posted = 1;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    return 0;
}

int cli_bg_stop(cli_bg *bg)
{
    int rc = cli_bg_wait(bg);
    struct cli_bg_thread *t = bg->t;
    if (t) {
        pthread_mutex_lock(&t->mu);
        t->quit = 1;
        pthread_cond_broadcast(&t->cv);
        pthread_mutex_unlock(&t->mu);
        pthread_join(t->th, NULL);
        pthread_cond_destroy(&t->cv);
        pthread_mutex_destroy(&t->mu);
        free(t);
        bg->t = NULL;
    }
    return rc;
}
