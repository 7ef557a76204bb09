/*
 * cacheio_npz.c - .npz, a zip of .npy members (docs/cache-files.md section
 * 5), read and written through libarchive.
 */
#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cacheio_impl.h"

/* Read the current member fully (bounded by its .npy header and the
 * expansion budget) into a malloc'd buffer; fill t. */
static int npz_member(const ctx *x, struct archive *a, struct archive_entry *e, const char *label,
                      uint64_t *used, uint64_t budget, kv_tensor *t)
{
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0, pre = 0, hdr_end = 0;
    uint64_t limit = 12 + (uint64_t)KVIO_MAX_NPY_HEADER, expect = 0;
    int parsed = 0, rc = KVIO_OK;
    npy_hdr h;
    int64_t declared = archive_entry_size_is_set(e) ? archive_entry_size(e) : -1;

    for (;;) {
        if (len == cap) {
            if (parsed && cap >= limit) { /* all expected bytes read: must be at EOF */
                uint8_t extra;
                la_ssize_t r = archive_read_data(a, &extra, 1);
                if (r < 0) {
                    rc = cio_fail(x, KVIO_E_FORMAT, "%s: corrupt member: %s", label, archive_error_string(a));
                    goto out;
                }
                if (r > 0) {
                    rc = cio_fail(x, KVIO_E_FORMAT, "%s: member holds more bytes than its .npy header describes (%" PRIu64 ")",
                              label, expect);
                    goto out;
                }
                break;
            }
            uint64_t nc = cap ? 2 * (uint64_t)cap : 65536;
            if (nc > limit)
                nc = limit;
            if (nc > SIZE_MAX) {
                rc = cio_fail(x, KVIO_E_NOMEM, "%s: member too large for memory", label);
                goto out;
            }
            uint8_t *nb = realloc(buf, nc ? (size_t)nc : 1);
            if (!nb) {
                rc = cio_fail(x, KVIO_E_NOMEM, "%s: out of memory", label);
                goto out;
            }
            buf = nb;
            cap = (size_t)nc;
            if (cap == len) { /* limit reached before the header was parsed */
                rc = cio_fail(x, KVIO_E_FORMAT, "%s: .npy header too long", label);
                goto out;
            }
        }
        la_ssize_t r = archive_read_data(a, buf + len, cap - len);
        if (r < 0) {
            rc = cio_fail(x, KVIO_E_FORMAT, "%s: corrupt member: %s", label, archive_error_string(a));
            goto out;
        }
        if (r == 0)
            break;
        len += (size_t)r;
        *used += (uint64_t)r;
        if (parsed && len > limit) {
            rc = cio_fail(x, KVIO_E_FORMAT, "%s: member holds more bytes than its .npy header describes (%" PRIu64 ")",
                      label, expect);
            goto out;
        }
        if (*used > budget) {
            rc = cio_fail(x, KVIO_E_FORMAT,
                      "%s: the archive decompresses to more than %u times its size; refusing",
                      label, KVIO_NPZ_MAX_EXPANSION);
            goto out;
        }
        if (!parsed) {
            if (!hdr_end) {
                rc = cio_npy_prefix(x, label, buf, len, &pre, &hdr_end);
                if (rc == NPY_NEED_MORE) {
                    rc = KVIO_OK;
                    continue;
                }
                if (rc)
                    goto out;
            }
            if (len < hdr_end)
                continue;
            if ((rc = cio_npy_dict(x, label, buf + pre, hdr_end - pre, &h)))
                goto out;
            if (!add_ok(hdr_end, h.nbytes, &expect)) {
                rc = cio_fail(x, KVIO_E_FORMAT, "%s: size overflows", label);
                goto out;
            }
            if (declared >= 0 && (uint64_t)declared != expect) {
                rc = cio_fail(x, KVIO_E_FORMAT,
                          "%s: zip entry size %" PRId64 " does not match the %" PRIu64 " bytes its .npy header describes",
                          label, declared, expect);
                goto out;
            }
            parsed = 1;
            limit = expect;
            if (len > limit) {
                rc = cio_fail(x, KVIO_E_FORMAT, "%s: member holds more bytes than its .npy header describes (%" PRIu64 ")",
                          label, expect);
                goto out;
            }
        }
    }
    if (!parsed) {
        if (!hdr_end) {
            rc = cio_npy_prefix(x, label, buf ? buf : (const uint8_t *)"", len, &pre, &hdr_end);
            if (rc == NPY_NEED_MORE || rc == KVIO_OK)
                rc = cio_fail(x, KVIO_E_FORMAT, "%s: truncated .npy header (%zu bytes)", label, len);
        } else {
            rc = cio_fail(x, KVIO_E_FORMAT, "%s: truncated .npy header (%zu of %zu bytes)", label, len, hdr_end);
        }
        goto out;
    }
    if (len < expect) {
        rc = cio_fail(x, KVIO_E_FORMAT, "%s: truncated: member ends after %zu of %" PRIu64 " bytes", label, len, expect);
        goto out;
    }
    snprintf(t->dtype_name, sizeof t->dtype_name, "%s", h.descr);
    t->type = h.type;
    t->esize = h.esize;
    t->ndim = h.ndim;
    memcpy(t->dims, h.dims, sizeof t->dims);
    t->nbytes = h.nbytes;
    t->data = buf + hdr_end;
    t->owned = buf;
    buf = NULL;
out:
    free(buf);
    return rc;
}

int kvio_read_npz_mem(const void *data, size_t size, const char *name, unsigned flags,
                      kvio_cache *out, char *err, size_t errlen)
{
    ctx x = {name, err, errlen};
    kv_tensor *t = NULL;
    size_t n = 0, cap = 0;
    int rc = KVIO_OK;
    uint64_t used = 0, budget;
    ign_list ign;
    memset(&ign, 0, sizeof ign);
    if (!out)
        return cio_fail(&x, KVIO_E_ARG, "no output cache");
    memset(out, 0, sizeof *out);
    if (!data || !size)
        return cio_fail(&x, KVIO_E_FORMAT, "empty file (not a zip archive)");
    if (!mul_ok(size, KVIO_NPZ_MAX_EXPANSION, &budget) || !add_ok(budget, 1u << 20, &budget))
        budget = UINT64_MAX;
    struct archive *a = archive_read_new();
    if (!a)
        return cio_fail(&x, KVIO_E_NOMEM, "out of memory");
    archive_read_support_format_zip_seekable(a); /* needs the central directory */
    if (archive_read_open_memory(a, data, size) != ARCHIVE_OK) {
        rc = cio_fail(&x, KVIO_E_FORMAT, "not a readable zip archive: %s", archive_error_string(a));
        goto done;
    }
    for (;;) {
        struct archive_entry *e;
        int r = archive_read_next_header(a, &e);
        if (r == ARCHIVE_EOF)
            break;
        if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
            rc = cio_fail(&x, KVIO_E_FORMAT, "corrupt zip archive: %s", archive_error_string(a));
            goto done;
        }
        const char *mname = archive_entry_pathname(e);
        if (!mname || !*mname) {
            rc = cio_fail(&x, KVIO_E_FORMAT, "zip member %zu has no usable name", n);
            goto done;
        }
        if (archive_entry_filetype(e) == AE_IFDIR)
            continue;
        size_t ml = strlen(mname);
        int is_npy = ml > 4 && !strcmp(mname + ml - 4, ".npy");
        kv_tensor tmp;
        memset(&tmp, 0, sizeof tmp);
        char *tname = is_npy ? malloc(ml - 3) : NULL;
        if (is_npy && !tname) {
            rc = cio_fail(&x, KVIO_E_NOMEM, "out of memory");
            goto done;
        }
        if (tname) {
            memcpy(tname, mname, ml - 4);
            tname[ml - 4] = 0;
            tmp.name = tname;
            cio_classify(&tmp);
        }
        if (!is_npy || tmp.role == R_EXTRA || tmp.role == R_COMPANION) {
            if ((flags & KVIO_READ_IGNORE_EXTRA) || tmp.role == R_COMPANION) {
                rc = cio_ign_add(&ign, tname ? tname : mname);
                free(tname);
                if (rc) {
                    rc = cio_fail(&x, KVIO_E_NOMEM, "out of memory");
                    goto done;
                }
                if (archive_read_data_skip(a) != ARCHIVE_OK) {
                    rc = cio_fail(&x, KVIO_E_FORMAT, "member '%s': corrupt: %s", cio_show(mname).s, archive_error_string(a));
                    goto done;
                }
                continue;
            }
            free(tname);
            rc = is_npy ? cio_fail(&x, KVIO_E_CONVENTION,
                               "member '%s': tensor not part of the cache naming convention (members are "
                               "TENSOR.npy; %s)",
                               cio_show(mname).s, SCHEMES_TEXT)
                        : cio_fail(&x, KVIO_E_CONVENTION, "member '%s': not a .npy file", cio_show(mname).s);
            goto done;
        }
        if (archive_entry_filetype(e) != AE_IFREG) {
            free(tname);
            rc = cio_fail(&x, KVIO_E_FORMAT, "member '%s': not a regular file", cio_show(mname).s);
            goto done;
        }
        if (n == cap) {
            size_t nc = cap ? 2 * cap : 16;
            kv_tensor *nt = realloc(t, nc * sizeof *nt);
            if (!nt) {
                free(tname);
                rc = cio_fail(&x, KVIO_E_NOMEM, "out of memory");
                goto done;
            }
            t = nt;
            cap = nc;
        }
        t[n] = tmp;
        n++; /* owns tname from here on */
        char label[300];
        snprintf(label, sizeof label, "tensor '%s' (member '%s')", cio_show(tname).s, cio_show(mname).s);
        if ((rc = npz_member(&x, a, e, label, &used, budget, &t[n - 1])))
            goto done;
    }
    rc = cio_assemble(&x, t, n, flags, NULL, 0, &ign, out);
done:
    cio_ign_free(&ign);
    for (size_t i = 0; i < n; i++) {
        free(t[i].owned);
        free((char *)(uintptr_t)t[i].name);
    }
    free(t);
    archive_read_free(a);
    return rc;
}

static la_ssize_t npz_write_cb(struct archive *a, void *ud, const void *buf, size_t n)
{
    sink *s = ud;
    cio_sk_put(s, buf, n);
    if (s->rc) {
        archive_set_error(a, EIO, "%s", s->rc == KVIO_E_IO ? "write failed" : "out of memory");
        return -1;
    }
    return (la_ssize_t)n;
}

int cio_write_npz(const ctx *x, sink *s, const kvio_cache *c, unsigned flags)
{
    int rc = KVIO_OK;
    struct archive *a = archive_write_new();
    struct archive_entry *e = archive_entry_new();
    if (!a || !e) {
        rc = cio_fail(x, KVIO_E_NOMEM, "out of memory");
        goto done;
    }
    if (archive_write_set_format_zip(a) != ARCHIVE_OK ||
        ((flags & KVIO_WRITE_DEFLATE) ? archive_write_zip_set_compression_deflate(a)
                                      : archive_write_zip_set_compression_store(a)) != ARCHIVE_OK ||
        archive_write_set_bytes_per_block(a, 0) != ARCHIVE_OK ||
        archive_write_open2(a, s, NULL, npz_write_cb, NULL, NULL) != ARCHIVE_OK) {
        rc = cio_fail(x, KVIO_E_IO, "cannot start the zip archive: %s", archive_error_string(a));
        goto done;
    }
    size_t nt = 2 * (size_t)c->n_layers + (c->tokens ? 1 : 0);
    for (size_t i = 0; i < nt; i++) {
        out_tensor o;
        const char *descr;
        if (i < 2 * (size_t)c->n_layers) {
            cio_out_kv(c, flags, (uint32_t)(i / 2), (int)(i % 2), &o);
            descr = cio_npy_descr(c->dtype);
        } else {
            cio_out_tok(c, flags, &o);
            descr = token_width(c) == 4 ? "<i4" : "<i8";
        }
        sink h = {0};
        if (cio_npy_header(&h, descr, o.dims, o.ndim) || h.rc) {
            free(h.buf);
            rc = cio_fail(x, KVIO_E_NOMEM, "cannot build the .npy header");
            goto done;
        }
        char mname[64];
        snprintf(mname, sizeof mname, "%s.npy", o.name);
        archive_entry_clear(e);
        archive_entry_set_pathname(e, mname);
        archive_entry_set_filetype(e, AE_IFREG);
        archive_entry_set_perm(e, 0644);
        archive_entry_set_mtime(e, 315532800, 0); /* 1980-01-01: reproducible output */
        archive_entry_set_size(e, (la_int64_t)(h.len + o.nbytes));
        if (archive_write_header(a, e) != ARCHIVE_OK ||
            archive_write_data(a, h.buf, h.len) != (la_ssize_t)h.len) {
            free(h.buf);
            rc = cio_fail(x, KVIO_E_IO, "member '%s': %s", mname, archive_error_string(a));
            goto done;
        }
        free(h.buf);
        if (o.is_tokens) {
            sink tk = {0};
            cio_sk_tokens(&tk, c, token_width(c));
            if (tk.rc || (tk.len && archive_write_data(a, tk.buf, tk.len) != (la_ssize_t)tk.len)) {
                free(tk.buf);
                rc = cio_fail(x, KVIO_E_IO, "member '%s': %s", mname, tk.rc ? "out of memory" : archive_error_string(a));
                goto done;
            }
            free(tk.buf);
        } else {
            /* positions-first: a transposed copy of the tensor */
            sink tr = {0};
            const uint8_t *data = o.data;
            if (o.nhd) {
                tr.buf = malloc(o.nbytes ? (size_t)o.nbytes : 1);
                tr.cap = tr.buf ? (size_t)o.nbytes : 0;
                cio_sk_kv(&tr, c, &o);
                if (tr.rc) {
                    free(tr.buf);
                    rc = cio_fail(x, KVIO_E_NOMEM, "member '%s': out of memory", mname);
                    goto done;
                }
                data = tr.buf;
            }
            for (uint64_t at = 0; at < o.nbytes;) {
                size_t chunk = o.nbytes - at > (1u << 20) ? (1u << 20) : (size_t)(o.nbytes - at);
                la_ssize_t w = archive_write_data(a, data + at, chunk);
                if (w <= 0) {
                    free(tr.buf);
                    rc = cio_fail(x, KVIO_E_IO, "member '%s': %s", mname, archive_error_string(a));
                    goto done;
                }
                at += (uint64_t)w;
            }
            free(tr.buf);
        }
    }
    if (archive_write_close(a) != ARCHIVE_OK) {
        rc = cio_fail(x, KVIO_E_IO, "cannot finish the zip archive: %s", archive_error_string(a));
        goto done;
    }
done:
    if (e)
        archive_entry_free(e);
    if (a)
        archive_write_free(a);
    if (!rc && s->rc)
        rc = cio_fail(x, s->rc, "write failed");
    return rc;
}
