/* Fuzz target: open any bytes as an archive and search every stream (up to
 * four) with and without its ZIDX index (spec 20): exact, longest and
 * radius queries, context, prefix reuse, index building, verification.
 * Must never crash, hang or leak; a hostile index may give wrong answers
 * or an error, never an access outside the file. */
#include <stddef.h>
#include <stdint.h>

#include "fkvf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void queries(fkvf_search *s, fkvf_reader *r, size_t idx, uint64_t len)
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
    }
    static const uint32_t fixed[4] = {0, 1, 7, 0xFFFFFFFFu};
    (void)fkvf_search_suffix(s, fixed, 3, out, 8, &nf);
    (void)fkvf_search_longest(s, fixed, 4, 4, m, &nm);
    (void)fkvf_search_radius(s, fixed, 2, 0.25, out, 8, &rr);
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
                    queries(s, r, i, si.length);
                fkvf_search_free(s);
            }
            void *zd;
            size_t zs;
            uint64_t key;
            if (fkvf_search_index_build(r, i, &zd, &zs, &key) == FKVF_OK)
                fkvf_search_buffer_free(zd);
        }
        uint32_t prompt[3] = {1, 2, 3};
        fkvf_prefix_reuse pr;
        (void)fkvf_search_prefix_reuse(r, prompt, 3, &pr);
        (void)fkvf_reader_verify(r);
    }
    fkvf_reader_free(r);
    return 0;
}
