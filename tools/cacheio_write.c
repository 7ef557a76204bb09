/*
 * cacheio_write.c - writing a cache: kvio_write_mem, kvio_write, and the
 * output files of the tools (kvio_tmp_*: a temporary file next to the
 * output, put in place atomically; kvio_output_mode: the umask).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cacheio_impl.h"

static int write_any(const ctx *x, sink *s, const kvio_cache *c, kvio_format fmt, unsigned flags)
{
    int rc = kvio_cache_check(c, x->err, x->errlen);
    if (rc)
        return rc;
    switch (fmt) {
    case KVIO_FMT_SAFETENSORS: return cio_write_safetensors(x, s, c, flags);
    case KVIO_FMT_NPY: return cio_write_npy(x, s, c, flags);
    case KVIO_FMT_NPZ: return cio_write_npz(x, s, c, flags);
    default: return cio_fail(x, KVIO_E_ARG, "no output format (use a .safetensors, .npy or .npz name)");
    }
}

int kvio_write_mem(const kvio_cache *c, kvio_format fmt, unsigned flags, uint8_t **out,
                   size_t *out_size, char *err, size_t errlen)
{
    ctx x = {"(memory)", err, errlen};
    sink s = {0};
    if (!out || !out_size)
        return cio_fail(&x, KVIO_E_ARG, "no output buffer");
    *out = NULL;
    *out_size = 0;
    int rc = write_any(&x, &s, c, fmt, flags);
    if (rc) {
        free(s.buf);
        return rc;
    }
    *out = s.buf ? s.buf : malloc(1);
    *out_size = s.len;
    return *out ? KVIO_OK : cio_fail(&x, KVIO_E_NOMEM, "out of memory");
}

unsigned kvio_output_mode(void)
{
    static int known;
    static mode_t mode;
    if (!known) {
        mode_t m = umask(0); /* the only way to read it; restored at once */
        umask(m);
        mode = (mode_t)(0666 & ~m);
        known = 1;
    }
    return (unsigned)mode;
}

/* Temporary files that exist under their name right now (kvio_tmp_open to
 * kvio_tmp_place / _discard / _unlink): a process ended by SIGINT, SIGTERM or
 * SIGHUP removes them before it dies, so that an interrupted command (an
 * unpack that streams for minutes) leaves nothing behind. The handler is
 * installed at the first kvio_tmp_open, only for signals whose disposition
 * is still the default, and does only async-signal-safe things (unlink,
 * signal, raise). The tools are single-threaded; more slots than any
 * command has outputs at once (a full table: that file is not watched). */
#define TMP_SLOTS 8
static char *volatile tmp_live[TMP_SLOTS];
static int tmp_handlers;

static void tmp_on_signal(int sig)
{
    for (int i = 0; i < TMP_SLOTS; i++) {
        char *p = tmp_live[i];
        if (p && p[0])
            unlink(p);
    }
    signal(sig, SIG_DFL);
    raise(sig); /* delivered when the handler returns: the default action */
}

static void tmp_watch(char *path)
{
    if (!tmp_handlers) {
        static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
        tmp_handlers = 1;
        for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
            struct sigaction old, sa;
            if (sigaction(sigs[i], NULL, &old) != 0 || old.sa_handler != SIG_DFL)
                continue; /* ignored or handled by the program: left alone */
            memset(&sa, 0, sizeof sa);
            sa.sa_handler = tmp_on_signal;
            sigemptyset(&sa.sa_mask);
            (void)sigaction(sigs[i], &sa, NULL);
        }
    }
    for (int i = 0; i < TMP_SLOTS; i++)
        if (!tmp_live[i]) {
            tmp_live[i] = path;
            return;
        }
}

static void tmp_unwatch(const char *path)
{
    for (int i = 0; i < TMP_SLOTS; i++)
        if (tmp_live[i] == path)
            tmp_live[i] = NULL;
}

void kvio_tmp_unlink(kvio_tmp *t)
{
    if (!t || !t->path)
        return;
    tmp_unwatch(t->path);
    unlink(t->path);
    free(t->path);
    t->path = NULL;
}

void kvio_tmp_discard(kvio_tmp *t)
{
    if (!t)
        return;
    if (t->f)
        fclose(t->f);
    if (t->path) {
        tmp_unwatch(t->path);
        unlink(t->path);
        free(t->path);
    }
    t->f = NULL;
    t->path = NULL;
}

int kvio_tmp_open(kvio_tmp *t, const char *path, char *err, size_t errlen)
{
    ctx x = {path, err, errlen};
    static const char suffix[] = ".tmp-XXXXXX";
    if (!t)
        return cio_fail(&x, KVIO_E_ARG, "no temporary file handle");
    t->path = NULL;
    t->f = NULL;
    if (!path || !*path)
        return cio_fail(&x, KVIO_E_ARG, "no path");
    size_t n = strlen(path);
    if (n > SIZE_MAX - sizeof suffix)
        return cio_fail(&x, KVIO_E_ARG, "path too long");
    char *tmp = malloc(n + sizeof suffix);
    if (!tmp)
        return cio_fail(&x, KVIO_E_NOMEM, "out of memory");
    memcpy(tmp, path, n);
    memcpy(tmp + n, suffix, sizeof suffix);
    int fd = mkstemp(tmp); /* O_EXCL, mode 0600 */
    if (fd < 0) {
        int e = errno;
        free(tmp);
        return cio_fail(&x, KVIO_E_IO, "cannot create a temporary file next to it: %s", strerror(e));
    }
    /* mkstemp ignores the umask; the mode fopen would give. If the file
     * system refuses, the file stays 0600: narrower, never wider. */
    (void)fchmod(fd, (mode_t)kvio_output_mode());
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        int e = errno;
        close(fd);
        unlink(tmp);
        free(tmp);
        return cio_fail(&x, e == ENOMEM ? KVIO_E_NOMEM : KVIO_E_IO, "cannot open the temporary file: %s",
                    strerror(e));
    }
    t->path = tmp;
    t->f = f;
    tmp_watch(tmp);
    return KVIO_OK;
}

/* KVIO_WRITE_NO_REPLACE: link(2) fails with EEXIST if path exists, atomically,
 * so a file that appeared while t was written is never replaced. Only where
 * the file system has no hard links, a check just before rename(2). */
static int tmp_link(const ctx *x, const char *tmp, const char *path)
{
    if (link(tmp, path) == 0)
        return KVIO_OK; /* the caller removes the temporary name */
    int e = errno;
    if (e == EPERM || e == ENOTSUP || e == EOPNOTSUPP || e == ENOSYS || e == EMLINK) {
        struct stat sb;
        if (lstat(path, &sb) == 0)
            e = EEXIST;
        else if (errno != ENOENT)
            e = errno; /* cannot tell whether it exists: nothing replaced */
        else if (rename(tmp, path) == 0)
            return KVIO_OK;
        else
            e = errno;
    }
    if (e == EEXIST)
        return cio_fail(x, KVIO_E_EXISTS, "appeared while it was written; not replaced");
    return cio_fail(x, KVIO_E_IO, "cannot link %s into place: %s", tmp, strerror(e));
}

int kvio_tmp_place(kvio_tmp *t, const char *path, unsigned flags, char *err, size_t errlen)
{
    ctx x = {path, err, errlen};
    if (!t || !t->path) {
        kvio_tmp_discard(t);
        return cio_fail(&x, KVIO_E_ARG, "no temporary file");
    }
    if (!path || !*path) {
        kvio_tmp_discard(t);
        return cio_fail(&x, KVIO_E_ARG, "no path");
    }
    int rc = KVIO_OK;
    if (t->f) {
        FILE *f = t->f;
        t->f = NULL;
        /* complete and on disk before it gets the name: a crash after the
         * rename never leaves a partial file in place of the old one */
        int e = 0, earlier = ferror(f) != 0; /* its errno is long gone */
        if (!earlier && (fflush(f) != 0 || fsync(fileno(f)) != 0))
            e = errno;
        if (fclose(f) != 0 && !e && !earlier)
            e = errno;
        if (earlier)
            rc = cio_fail(&x, KVIO_E_IO, "write failed (a write to the temporary file failed)");
        else if (e)
            rc = cio_fail(&x, KVIO_E_IO, "write failed: %s", strerror(e));
    }
    if (!rc && (flags & KVIO_WRITE_NO_REPLACE)) {
        rc = tmp_link(&x, t->path, path); /* then the temporary name goes */
    } else if (!rc) {
        if (rename(t->path, path) == 0)
            t->path[0] = 0; /* nothing left under the temporary name */
        else
            rc = cio_fail(&x, KVIO_E_IO, "cannot rename %s into place: %s", t->path, strerror(errno));
    }
    if (t->path[0])
        unlink(t->path);
    tmp_unwatch(t->path); /* before t->path is reused for the final name */
    if (!rc) {
        /* the new name on disk too (best effort); the buffer is large enough */
        memcpy(t->path, path, strlen(path) + 1);
        char *slash = strrchr(t->path, '/');
        const char *dir = ".";
        if (slash == t->path)
            dir = "/";
        else if (slash) {
            *slash = 0;
            dir = t->path;
        }
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            (void)fsync(dfd);
            close(dfd);
        }
    }
    free(t->path);
    t->path = NULL;
    return rc;
}

int kvio_write(const char *path, kvio_format fmt, unsigned flags, const kvio_cache *c, char *err, size_t errlen)
{
    ctx x = {path, err, errlen};
    if (!path)
        return cio_fail(&x, KVIO_E_ARG, "no path");
    if (fmt == KVIO_FMT_AUTO)
        fmt = kvio_format_from_path(path);
    if (fmt == KVIO_FMT_AUTO)
        return cio_fail(&x, KVIO_E_ARG, "cannot tell the format from the name (use .safetensors, .npy or .npz)");
    int rc = kvio_cache_check(c, NULL, 0);
    if (rc) {
        kvio_cache_check(c, err, errlen);
        return rc;
    }
    struct stat sb;
    if ((flags & KVIO_WRITE_NO_REPLACE) && lstat(path, &sb) == 0)
        return cio_fail(&x, KVIO_E_EXISTS, "exists; not replaced");
    kvio_tmp t;
    if ((rc = kvio_tmp_open(&t, path, err, errlen)) != KVIO_OK)
        return rc;
    sink s = {0};
    s.f = t.f;
    if ((rc = write_any(&x, &s, c, fmt, flags)) != KVIO_OK) {
        kvio_tmp_discard(&t);
        return rc;
    }
    return kvio_tmp_place(&t, path, flags & KVIO_WRITE_NO_REPLACE, err, errlen);
}
