/* fkvf_archive_append_sections: one commit of extra sections (such as ZIDX
 * search indexes, spec 20) appended to an existing archive (spec 7.4, 7.6).
 * Reads the file's state through the public reader API and writes through
 * the writer's internal resume interface, like the appender. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "alloc.h"
#include "fkvf.h"
#include "write/writer_resume.h"

static int say(char *msg, size_t n, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int say(char *msg, size_t n, int rc, const char *fmt, ...)
{
    if (msg && n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, n, fmt, ap);
        va_end(ap);
    }
    return rc;
}

static int spec_of(fkvf_reader *r, uint64_t id, fkvf_stream_spec *spec, uint64_t *len)
{
    size_t idx;
    fkvf_stream_info si;
    if (fkvf_reader_stream_find(r, id, &idx) != FKVF_OK ||
        fkvf_reader_stream_info(r, idx, &si) != FKVF_OK)
        return 0;
    memset(spec, 0, sizeof *spec);
    spec->profile = si.profile;
    if (si.profile == FKVF_PROFILE_QUAD) {
        spec->symbol_bits = si.symbol_bits;
    } else {
        spec->alphabet = si.alphabet;
        spec->r = si.r;
        spec->span_symbols = si.span_symbols;
    }
    *len = si.length;
    return 1;
}

FKVF_API int fkvf_archive_append_sections(const char *path, const fkvf_section_add *secs,
                                          size_t n, unsigned sync, char *msg, size_t msg_size)
{
    if (msg && msg_size)
        msg[0] = 0;
    if (!path || (!secs && n) || sync > FKVF_SYNC_NONE)
        return say(msg, msg_size, FKVF_E_INVALID_ARG, "invalid arguments");
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return say(msg, msg_size, FKVF_E_IO, "%s: cannot open for appending: %s", path,
                   strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        close(fd);
        return say(msg, msg_size, FKVF_E_IO, "%s: cannot lock the file (%s)", path, strerror(e));
    }
    fkvf_reader *r = NULL;
    int rc = fkvf_reader_open_file(&r, path, 0, NULL);
    fkvf_resume st;
    memset(&st, 0, sizeof st);
    fkvf_archive_info ai;
    fkvf_desc d;
    fkvf_codebook_shape cb;
    memset(&cb, 0, sizeof cb);
    uint32_t *vtxs = NULL;
    size_t nv = 0, capv = 0;
    char *mid = NULL, *tid = NULL;
    const fkvf_allocator *a = fkvf_alloc_or_default(NULL);
    if (rc) {
        say(msg, msg_size, rc, "%s", r ? fkvf_reader_message(r) : fkvf_strerror(rc));
        goto fail;
    }
    if ((rc = fkvf_reader_info(r, &ai)) || (rc = fkvf_reader_desc(r, &d))) {
        say(msg, msg_size, rc, "%s", fkvf_reader_message(r));
        goto fail;
    }
    if (ai.torn_bytes) {
        rc = say(msg, msg_size, FKVF_E_TORN,
                 "%s: %llu bytes after the last complete commit: recover the file first",
                 path, (unsigned long long)ai.torn_bytes);
        goto fail;
    }
    mid = fkvf_strndup(a, d.model_id ? d.model_id : "", d.model_id ? strlen(d.model_id) : 0);
    tid = fkvf_strndup(a, d.tokenizer_id ? d.tokenizer_id : "",
                       d.tokenizer_id ? strlen(d.tokenizer_id) : 0);
    if (!mid || !tid) {
        rc = say(msg, msg_size, FKVF_E_NOMEM, "no memory");
        goto fail;
    }
    d.model_id = mid;
    d.tokenizer_id = tid;
    int ext = 0;
    uint8_t hash[16];
    const char *name;
    if ((rc = fkvf_reader_codebook_ref(r, &ext, hash, &name))) {
        say(msg, msg_size, rc, "%s", fkvf_reader_message(r));
        goto fail;
    }
    if (ext) {
        st.cb_kind = 2; /* no segments are added: the shape is not needed */
        st.cb = &cb;
    } else if (fkvf_reader_codebook(r, &cb, NULL, NULL, NULL) == FKVF_OK) {
        st.cb_kind = 1;
        st.cb = &cb;
    }
    st.index_present = spec_of(r, FKVF_STREAM_ID(0, 0, 0, 0, 0), &st.index_spec, &st.index_length);
    st.token_present = spec_of(r, FKVF_STREAM_ID_TOKENS, &st.token_spec, &st.token_length);
    for (size_t i = 0; i < ai.n_sections; i++) {
        fkvf_section_info s;
        if (fkvf_reader_section(r, i, &s) || s.type != FKVF_SECTION_VTXS)
            continue;
        if (fkvf_grow(a, (void **)&vtxs, &capv, nv + 1, sizeof *vtxs)) {
            rc = say(msg, msg_size, FKVF_E_NOMEM, "no memory");
            goto fail;
        }
        vtxs[nv++] = (uint32_t)s.key;
    }
    st.committed_size = ai.committed_size;
    st.last_seq = ai.n_commits;
    st.required_features = ai.required_features;
    st.optional_features = ai.optional_features;
    st.n_positions = ai.n_positions;
    st.n_archived = ai.n_archived;
    st.desc = &d;
    st.vtxs = vtxs;
    st.n_vtxs = nv;
    st.fd = fd;
    st.path = path;
    fkvf_reader_free(r); /* before the writer takes over the file */
    r = NULL;
    fkvf_writer_options wo;
    fkvf_writer_options_init(&wo);
    wo.no_sync = sync == FKVF_SYNC_NONE;
    fkvf_writer *w = NULL;
    rc = fkvf_writer_resume(&w, &st, &wo, NULL); /* owns fd from here */
    fd = -1;
    if (rc == FKVF_OK) {
        for (size_t i = 0; i < n && rc == FKVF_OK; i++)
            rc = fkvf_writer_add_section(w, secs[i].type, secs[i].flags, secs[i].key,
                                         secs[i].data, secs[i].size);
        if (rc == FKVF_OK)
            rc = fkvf_writer_set_positions(w, ai.n_positions, ai.n_archived);
        if (rc == FKVF_OK)
            rc = fkvf_writer_commit(w);
        if (rc == FKVF_OK)
            rc = fkvf_writer_finish(w);
        if (rc) {
            say(msg, msg_size, rc, "%s", fkvf_writer_message(w));
            fkvf_writer_rollback(w);
        }
    } else {
        say(msg, msg_size, rc, "%s", w ? fkvf_writer_message(w) : fkvf_strerror(rc));
    }
    fkvf_writer_free(w);
fail:
    fkvf_reader_free(r);
    fkvf_free(a, vtxs);
    fkvf_free(a, mid);
    fkvf_free(a, tid);
    if (fd >= 0)
        close(fd);
    return rc;
}
