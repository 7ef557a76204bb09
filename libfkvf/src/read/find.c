/* fkvf_reader_find_codebook: the external codebook of an archive (spec 13.5)
 * looked up by content hash in the archive's directory and in the
 * directories of a search path. The name hint is untrusted (spec 18.7): it
 * is only ever a plain file name inside a searched directory. Every
 * candidate is a regular file reached without following a symbolic link,
 * of a bounded size, whose first bytes are the FKVF magic; it is opened
 * (mapped: its directory is parsed, nothing else read), and only a codebook
 * file whose shape fits the archive's descriptor has its CBK1 hashed. */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* d_type, DT_REG */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc.h"
#include "ckd.h"
#include "hash.h"
#include "reader_impl.h"

/* room a codebook file may need beyond its CBK1: header, META, directory */
#define FIND_SLACK (UINT64_C(16) << 20)

typedef struct finder {
    fkvf_reader *r;
    const fkvf_allocator *a;
    uint64_t max_size;    /* larger files are skipped */
    const char *hint;     /* the name hint when it is a plain file name, else NULL */
    dev_t *dev;           /* directories searched (device, inode) */
    ino_t *ino;
    size_t n_dirs, cap_dev, cap_ino;
    char list[600];       /* the directories searched, for the message */
    size_t list_len, list_more;
    int io_code;          /* an I/O error made a candidate unreadable */
    char io_what[260];
    fkvf_reader *found;
} finder;

/* Errors that mean "not there, or not ours to read": the candidate or
 * directory is skipped without an error. Any other (EIO, EMFILE, ...) is
 * remembered: with nothing found, the lookup then fails with FKVF_E_IO. */
static int benign(int e)
{
    return e == ENOENT || e == ENOTDIR || e == EACCES || e == EPERM || e == ELOOP ||
           e == ENAMETOOLONG || e == ENXIO || e == EISDIR;
}

/* path: NULL when `what` (a reader's message) names the file already */
static void note_io(finder *f, const char *path, const char *what)
{
    if (f->io_code)
        return;
    f->io_code = FKVF_E_IO;
    snprintf(f->io_what, sizeof f->io_what, "%.100s%s%.150s", path ? path : "", path ? ": " : "",
             what);
}

static void note_errno(finder *f, const char *path, const char *call, int e)
{
    if (!benign(e)) {
        char w[80];
        snprintf(w, sizeof w, "%s: %.60s", call, strerror(e));
        note_io(f, path, w);
    }
}

/* Append s to the message list ("a, b, c"; "and N more" when it is full). */
static void list_add(finder *f, const char *dir, const char *note)
{
    char item[300];
    snprintf(item, sizeof item, "%s%.200s%s%.80s%s", f->list_len ? ", " : "", dir,
             note ? " (" : "", note ? note : "", note ? ")" : "");
    size_t n = strlen(item);
    if (f->list_more || f->list_len + n + 1 > sizeof f->list - 16) {
        f->list_more++;
        return;
    }
    memcpy(f->list + f->list_len, item, n + 1);
    f->list_len += n;
}

/* dir + '/' + name (allocated), or NULL. */
static char *join(const fkvf_allocator *a, const char *dir, const char *name)
{
    size_t dl = strlen(dir), nl = strlen(name), n;
    int slash = dl > 0 && dir[dl - 1] != '/';
    if (!fkvf_addsz(dl, nl, &n) || !fkvf_addsz(n, (size_t)slash + 1, &n))
        return NULL;
    char *p = fkvf_malloc(a, n);
    if (!p)
        return NULL;
    memcpy(p, dir, dl);
    if (slash)
        p[dl] = '/';
    memcpy(p + dl + (size_t)slash, name, nl + 1);
    return p;
}

/* Reads up to n bytes at the current offset of fd: the count, or -1. */
static ssize_t read_some(int fd, uint8_t *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, buf + got, n - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return -1;
        if (k == 0)
            break;
        got += (size_t)k;
    }
    return (ssize_t)got;
}

/* The candidate dir/name: FKVF_OK with f->found set when it is the codebook
 * (attached), FKVF_OK when it is not (skipped), else an error that ends the
 * lookup (FKVF_E_NOMEM, or the attach error of a file whose hash matched). */
static int try_file(finder *f, const char *dir, const char *name)
{
    fkvf_reader *r = f->r;
    char *path = join(f->a, dir, name);
    if (!path)
        return fkvf_fail(&r->diag, FKVF_E_NOMEM, FKVF_NO_OFFSET, NULL,
                         "no memory for a codebook candidate's path");
    int rc = FKVF_OK, fd = -1;
    fkvf_reader *c = NULL;
    struct stat st;
    if (lstat(path, &st) != 0) {
        note_errno(f, path, "lstat", errno);
        goto out;
    }
    if (!S_ISREG(st.st_mode) || st.st_size < FKVF_HEADER_SIZE ||
        (uint64_t)st.st_size > f->max_size)
        goto out; /* symbolic links, devices, FIFOs, directories; sizes no codebook has */
    fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        note_errno(f, path, "open", errno);
        goto out;
    }
    /* the file opened, which may have replaced the one lstat saw */
    if (fstat(fd, &st) != 0) {
        note_errno(f, path, "fstat", errno);
        goto out;
    }
    if (!S_ISREG(st.st_mode) || st.st_size < FKVF_HEADER_SIZE ||
        (uint64_t)st.st_size > f->max_size)
        goto out;
    uint8_t magic[sizeof fkvf_magic];
    ssize_t got = read_some(fd, magic, sizeof magic);
    if (got < 0) {
        note_errno(f, path, "read", errno);
        goto out;
    }
    if ((size_t)got != sizeof magic || memcmp(magic, fkvf_magic, sizeof magic) != 0)
        goto out; /* not an FKVF file: nothing more is read */
    /* mapped; non-strict whatever r's flags (spec 13.5: a candidate with a
     * torn tail still serves its CBK1); only the directory is parsed */
    rc = rd_open_fd(&c, fd, path, 0, f->a);
    if (rc == FKVF_E_NOMEM) {
        fkvf_fail(&r->diag, rc, FKVF_NO_OFFSET, NULL, "codebook candidate %.200s: %s", path,
                  c ? c->diag.msg : "no memory");
        goto out;
    }
    if (rc == FKVF_E_IO)
        note_io(f, c ? NULL : path, c ? c->diag.msg : "I/O error");
    if (rc != FKVF_OK || c->has_desc || c->cb_kind != 1 ||
        !fkvf_cbk1_matches(&c->cb_shape, &r->desc)) {
        rc = FKVF_OK; /* an invalid file, an archive, a codebook of another shape */
        goto out;
    }
    const uint8_t *p;
    uint64_t n;
    rc = rd_section_bytes(c, c->cb_sec, &p, &n);
    if (rc == FKVF_E_NOMEM) {
        fkvf_fail(&r->diag, rc, FKVF_NO_OFFSET, NULL, "codebook candidate %.200s: %s", path,
                  c->diag.msg);
        goto out;
    }
    size_t nb;
    if (rc != FKVF_OK || !fkvf_tosz(n, &nb)) {
        rc = FKVF_OK; /* a checksum error: not the codebook */
        goto out;
    }
    uint8_t h[16];
    fkvf_xxh3_128(p, nb, h);
    if (memcmp(h, r->cb_ref_hash, 16) != 0)
        goto out;
    if (r->flags & FKVF_OPEN_READ) {
        /* the match, as r was opened: a private copy of its bytes */
        fkvf_reader_free(c);
        c = NULL;
        rc = rd_open_fd(&c, fd, path, r->flags, f->a);
        if (rc != FKVF_OK) {
            if (rc == FKVF_E_IO)
                note_io(f, c ? NULL : path, c ? c->diag.msg : "I/O error");
            fkvf_fail(&r->diag, rc, FKVF_NO_OFFSET, NULL, "codebook candidate %.200s: %s", path,
                      c ? c->diag.msg : "no memory");
            if (rc != FKVF_E_NOMEM)
                rc = FKVF_OK; /* skipped: reported as an I/O error if nothing else matches */
            goto out;
        }
    }
    /* the match replaces a note of a candidate skipped before */
    fkvf_diag_clear(&r->diag);
    rc = rd_attach_codebook(r, c);
    if (rc == FKVF_OK) {
        f->found = c;
        c = NULL;
    }
out:
    if (fd >= 0)
        close(fd);
    fkvf_reader_free(c);
    fkvf_free(f->a, path);
    return rc;
}

/* One directory: the name hint, then its entries. FKVF_OK (found or not),
 * or an error that ends the lookup. Listed for the message with `label`
 * and what went wrong in it. */
static int search_dir(finder *f, const char *dir, const char *label)
{
    fkvf_reader *r = f->r;
    char note[200];
    snprintf(note, sizeof note, "%s", label ? label : "");
#define NOTE(...)                                                                      \
    snprintf(note + strlen(note), sizeof note - strlen(note), "%s", *note ? ", " : ""), \
        snprintf(note + strlen(note), sizeof note - strlen(note), __VA_ARGS__)
    struct stat st;
    int rc = FKVF_OK;
    if (stat(dir, &st) != 0) {
        int e = errno;
        NOTE("%s", e == ENOENT ? "missing" : strerror(e));
        note_errno(f, dir, "stat", e);
        goto out;
    }
    if (!S_ISDIR(st.st_mode)) {
        NOTE("not a directory");
        goto out;
    }
    for (size_t i = 0; i < f->n_dirs; i++)
        if (f->dev[i] == st.st_dev && f->ino[i] == st.st_ino)
            return FKVF_OK; /* searched already: listed once */
    if (fkvf_grow(f->a, (void **)&f->dev, &f->cap_dev, f->n_dirs + 1, sizeof *f->dev) ||
        fkvf_grow(f->a, (void **)&f->ino, &f->cap_ino, f->n_dirs + 1, sizeof *f->ino))
        return fkvf_fail(&r->diag, FKVF_E_NOMEM, FKVF_NO_OFFSET, NULL,
                         "no memory for the codebook search");
    f->dev[f->n_dirs] = st.st_dev;
    f->ino[f->n_dirs] = st.st_ino;
    f->n_dirs++;
    if (f->hint && ((rc = try_file(f, dir, f->hint)) || f->found))
        goto out;
    DIR *d = opendir(dir);
    if (!d) {
        int e = errno;
        NOTE("%s", e == EACCES ? "unreadable" : strerror(e));
        note_errno(f, dir, "opendir", e);
        goto out;
    }
    for (size_t seen = 0;; seen++) {
        if (seen == FKVF_CODEBOOK_SCAN_MAX) {
            NOTE("only its first %u entries", (unsigned)FKVF_CODEBOOK_SCAN_MAX);
            break;
        }
        errno = 0;
        struct dirent *e = readdir(d);
        if (!e) {
            if (errno) {
                int en = errno;
                NOTE("reading it: %s", strerror(en));
                char w[80];
                snprintf(w, sizeof w, "readdir: %.60s", strerror(en));
                note_io(f, dir, w);
            }
            break;
        }
        const char *nm = e->d_name;
        if (!strcmp(nm, ".") || !strcmp(nm, "..") || (f->hint && !strcmp(nm, f->hint)))
            continue;
#ifdef DT_UNKNOWN
        if (e->d_type != DT_REG && e->d_type != DT_UNKNOWN)
            continue; /* lstat decides for DT_UNKNOWN */
#endif
        if ((rc = try_file(f, dir, nm)) || f->found)
            break;
    }
    closedir(d);
out:
#undef NOTE
    list_add(f, dir, *note ? note : NULL);
    return rc;
}

/* The directory part of an archive's path ("." when it has none). */
static char *dir_of(const fkvf_allocator *a, const char *path)
{
    const char *sl = strrchr(path, '/');
    if (!sl)
        return fkvf_strndup(a, ".", 1);
    size_t n = (size_t)(sl - path);
    return fkvf_strndup(a, path, n ? n : 1); /* "/x": "/" */
}

/* The largest codebook file the descriptor allows: k 4096, 16 + 16 stages,
 * f32 tables per head (spec 13.1, 13.2), plus FIND_SLACK. */
static uint64_t max_codebook_file(const fkvf_desc *d)
{
    uint64_t lh, per, t;
    if (!fkvf_mul64(d->n_layers, d->n_kv_heads, &lh) ||
        !fkvf_add64((uint64_t)16 * d->key_dim, (uint64_t)16 * d->value_dim, &per) ||
        !fkvf_mul64(lh, per, &t) || !fkvf_mul64(t, (uint64_t)4096 * 4, &t) ||
        !fkvf_add64(t, FIND_SLACK, &t))
        return UINT64_MAX;
    return t;
}

FKVF_API int fkvf_reader_find_codebook(fkvf_reader *r, const char *search_path,
                                       fkvf_reader **codebook_file)
{
    if (codebook_file)
        *codebook_file = NULL;
    int rc = rd_enter(r);
    if (rc)
        return rc;
    if (!codebook_file)
        return FKVF_E_INVALID_ARG;
    if (r->cb_kind != 2 || r->cb_known)
        return FKVF_OK; /* no external codebook, or attached already */
    finder f;
    memset(&f, 0, sizeof f);
    f.r = r;
    f.a = r->alloc;
    f.max_size = max_codebook_file(&r->desc);
    const char *hint = r->cb_ref_name;
    if (hint && *hint && strlen(hint) == r->cb_ref_name_len && !strchr(hint, '/') &&
        strcmp(hint, ".") && strcmp(hint, ".."))
        f.hint = hint;
    char *dir = NULL;
    /* a source reader's name is no local path (a URL, say): no directory */
    if (r->name && !r->src.read) {
        if (!(dir = dir_of(f.a, r->name)))
            rc = fkvf_fail(&r->diag, FKVF_E_NOMEM, FKVF_NO_OFFSET, NULL,
                           "no memory for the codebook search");
        else
            rc = search_dir(&f, dir, "the archive's directory");
        fkvf_free(f.a, dir);
        dir = NULL;
    }
    for (const char *p = search_path; !rc && !f.found && p && *p;) {
        const char *e = strchr(p, ':');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n) {
            if (!(dir = fkvf_strndup(f.a, p, n)))
                rc = fkvf_fail(&r->diag, FKVF_E_NOMEM, FKVF_NO_OFFSET, NULL,
                               "no memory for the codebook search");
            else
                rc = search_dir(&f, dir, NULL);
            fkvf_free(f.a, dir);
            dir = NULL;
        }
        p = e ? e + 1 : p + n;
    }
    fkvf_free(f.a, f.dev);
    fkvf_free(f.a, f.ino);
    if (rc)
        return rc;
    if (f.found) {
        *codebook_file = f.found;
        return FKVF_OK;
    }
    char hx[33], more[40] = "";
    fkvf_hex16(r->cb_ref_hash, hx);
    if (f.list_more)
        snprintf(more, sizeof more, " and %zu more", f.list_more);
    uint64_t off = r->sections[r->cb_sec].e.offset;
    if (f.io_code)
        return fkvf_fail(&r->diag, f.io_code, off, "13.5",
                         "external codebook %s (name hint \"%.64s\") not found: %s; searched %s%s",
                         hx, r->cb_ref_name, f.io_what, f.n_dirs || f.list_len ? f.list : "nothing",
                         more);
    return fkvf_fail(&r->diag, FKVF_E_NOT_FOUND, off, "13.5",
                     "external codebook %s (name hint \"%.64s\") not found by content hash in %s%s",
                     hx, r->cb_ref_name, f.list_len ? f.list : "no directory (no path given)",
                     more);
}
