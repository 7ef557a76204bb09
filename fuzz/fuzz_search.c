/* Fuzz target: open any bytes as an archive and search every stream (up to
 * four) with and without its ZIDX index (spec 20): exact, longest and
 * radius queries, query points, context, prefix reuse, index building,
 * verification. Must never crash, hang or leak; a hostile index may give
 * wrong answers or an error, never an access outside the file. Without an
 * index (FKVF_SEARCH_NO_INDEX) the answers are checked against the stream
 * itself: every suffix hit and longest match holds the query's symbols
 * (fkvf_search_context), longest matches come by length descending then
 * position ascending, and a radius query with the default radius verifies
 * exactly the suffix hits. Key retrieval (fkvf_search_keys) runs a few
 * queries on the first KV heads: hits in range, at most m, best first. */
#include <stddef.h>
#include <stdint.h>

#include "fkvf.h"
#include "fuzz_util.h"

/* c[t-len+1 .. t] == q[0 .. len)? (through the reader) */
static int holds(fkvf_reader *r, size_t idx, uint64_t t, const uint32_t *q, size_t len)
{
    uint32_t c[40];
    size_t got = 0;
    if (len > 40 || fkvf_search_context(r, idx, t, len, c, &got) != FKVF_OK || got != len)
        return 0;
    return memcmp(c, q, len * sizeof *q) == 0;
}

static void check_answers(fkvf_search *s, fkvf_reader *r, size_t idx, const uint32_t *q,
                          size_t l)
{
    uint64_t out[8], out2[8], nf = 0;
    fkvf_match m[4];
    size_t nm = 0;
    fkvf_radius_result rr;
    if (fkvf_search_suffix(s, q, l, out, 8, &nf) == FKVF_OK) {
        for (uint64_t i = 0; i < nf && i < 8; i++) {
            FZ_CHECK(out[i] + 1 >= l && holds(r, idx, out[i], q, l));
            FZ_CHECK(i == 0 || out[i] > out[i - 1]);
        }
        if (fkvf_search_radius(s, q, l, 0.0, out2, 8, &rr) == FKVF_OK) {
            FZ_CHECK(rr.verified == nf && rr.candidates >= rr.verified);
            FZ_CHECK(nf == 0 || memcmp(out, out2, (nf < 8 ? nf : 8) * sizeof *out) == 0);
        }
    }
    if (fkvf_search_longest(s, q, l, 4, m, &nm) == FKVF_OK) {
        FZ_CHECK(nm <= 4);
        for (size_t i = 0; i < nm; i++) {
            FZ_CHECK(m[i].length >= 1 && m[i].length <= l);
            FZ_CHECK(holds(r, idx, m[i].position, q + l - m[i].length, (size_t)m[i].length));
            FZ_CHECK(i == 0 || m[i].length < m[i - 1].length ||
                     (m[i].length == m[i - 1].length && m[i].position > m[i - 1].position));
        }
        if (nf)
            FZ_CHECK(nm >= 1 && m[0].length == l);
    }
    fkvf_point p;
    (void)fkvf_search_query_point(s, q, l, &p);
    double rad = fkvf_search_default_radius(s, l);
    FZ_CHECK(rad > 0);
}

static void queries(fkvf_search *s, fkvf_reader *r, size_t idx, uint64_t len, int check)
{
    uint32_t q[40];
    uint64_t out[8], nf;
    fkvf_match m[4];
    size_t nm;
    fkvf_radius_result rr;
    /* queries from the stream itself (so they match), then fixed ones */
    size_t got = 0;
    if (len)
        (void)fkvf_search_context(r, idx, len / 2, 40, q, &got);
    for (size_t l = 1; l <= got; l += 7) {
        (void)fkvf_search_suffix(s, q + got - l, l, out, 8, &nf);
        (void)fkvf_search_longest(s, q + got - l, l, 4, m, &nm);
        (void)fkvf_search_radius(s, q + got - l, l, 0.0, out, 8, &rr);
        if (check)
            check_answers(s, r, idx, q + got - l, l);
    }
    static const uint32_t fixed[4] = {0, 1, 7, 0xFFFFFFFFu};
    (void)fkvf_search_suffix(s, fixed, 3, out, 8, &nf);
    (void)fkvf_search_longest(s, fixed, 4, 4, m, &nm);
    (void)fkvf_search_radius(s, fixed, 2, 0.25, out, 8, &rr);
    if (check)
        check_answers(s, r, idx, fixed, 3);
    fkvf_search_status inf;
    if (fkvf_search_info(s, &inf) == FKVF_OK)
        FZ_CHECK(inf.length == len && inf.n_indexed <= len);
}

/* key retrieval on layer 0 and the last layer, head 0, with a few queries */
static void key_queries(fkvf_reader *r)
{
    fkvf_desc d;
    fkvf_archive_info ai;
    if (fkvf_reader_desc(r, &d) || fkvf_reader_info(r, &ai) || d.key_dim > 256 ||
        ai.n_archived > 100000)
        return;
    fkvf_key_search *ks = NULL;
    if (fkvf_search_keys_open(&ks, r, NULL) == FKVF_OK) {
        float q[256];
        for (uint32_t i = 0; i < d.key_dim; i++)
            q[i] = (float)((int)(i * 7 % 5) - 2);
        fkvf_key_hit hits[8];
        const uint32_t layers[2] = {0, d.n_layers - 1};
        for (int li = 0; li < 2; li++)
            for (int v = 0; v < 3; v++) {
                fkvf_key_query kq = {layers[li], 0, q, d.key_dim, v == 2 ? d.n_sinks + 3 : 0,
                                     0, 8, v == 1 ? FKVF_KEY_CANDIDATES_MAX : 0,
                                     v == 2 ? 5 : 0};
                size_t n = 99;
                if (fkvf_search_keys(ks, &kq, hits, &n, NULL) != FKVF_OK)
                    continue;
                FZ_CHECK(n <= 8);
                for (size_t i = 0; i < n; i++) {
                    FZ_CHECK(hits[i].position >= d.n_sinks && hits[i].position >= kq.first &&
                             hits[i].position < (uint64_t)d.n_sinks + ai.n_archived);
                    FZ_CHECK(i == 0 || hits[i].score <= hits[i - 1].score);
                }
            }
    }
    fkvf_search_keys_free(ks);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fkvf_reader *r = NULL;
    if (fkvf_reader_open_memory(&r, data, size, 0, NULL) == FKVF_OK) {
        fkvf_archive_info ai;
        fkvf_reader_info(r, &ai);
        for (size_t i = 0; i < ai.n_streams && i < 4; i++) {
            fkvf_stream_info si;
            if (fkvf_reader_stream_info(r, i, &si) || si.length > 100000)
                continue;
            for (unsigned fl = 0; fl < 2; fl++) {
                fkvf_search *s = NULL;
                if (fkvf_search_open(&s, r, i, fl ? FKVF_SEARCH_NO_INDEX : 0, NULL) == FKVF_OK)
                    queries(s, r, i, si.length, fl == 1);
                fkvf_search_free(s);
            }
            void *zd;
            size_t zs;
            uint64_t key;
            if (fkvf_search_index_build(r, i, &zd, &zs, &key, NULL) == FKVF_OK)
                fkvf_search_buffer_free(zd, NULL);
        }
        uint32_t prompt[3] = {1, 2, 3};
        fkvf_prefix_reuse pr;
        (void)fkvf_search_prefix_reuse(r, prompt, 3, &pr);
        key_queries(r);
        (void)fkvf_reader_verify(r);
    }
    fkvf_reader_free(r);
    return 0;
}
