/* Fuzz target: open any bytes as an archive (non-strict and strict), then
 * verify and read everything the reader exposes. Must never crash, hang or
 * leak; the archive info must be consistent (committed + torn bytes = the
 * file, archived <= positions), a strict open succeeds only on a file
 * without a torn tail and agrees with the non-strict one, and a handle is
 * returned with a message whenever open fails after making one. */
#include <stddef.h>
#include <stdint.h>

#include "fkvf.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fkvf_reader *r = NULL;
    if (fkvf_reader_open_memory(&r, data, size, 0, NULL) == FKVF_OK) {
        fkvf_archive_info ai;
        FZ_CHECK(fkvf_reader_info(r, &ai) == FKVF_OK);
        FZ_CHECK(ai.file_size == size && ai.committed_size <= size &&
                 ai.torn_bytes == size - ai.committed_size && ai.n_archived <= ai.n_positions);
        fkvf_reader *rs = NULL;
        int rcs = fkvf_reader_open_memory(&rs, data, size, FKVF_OPEN_STRICT, NULL);
        FZ_CHECK((rcs == FKVF_OK) == (ai.torn_bytes == 0));
        if (rcs == FKVF_OK) {
            fkvf_archive_info as;
            FZ_CHECK(fkvf_reader_info(rs, &as) == FKVF_OK);
            FZ_CHECK(as.n_commits == ai.n_commits && as.n_positions == ai.n_positions &&
                     as.n_sections == ai.n_sections && as.n_streams == ai.n_streams);
        } else {
            FZ_CHECK(rcs == FKVF_E_TORN);
        }
        fkvf_reader_free(rs);
        fkvf_desc d;
        (void)fkvf_reader_desc(r, &d);
        size_t n = 0;
        if (fkvf_reader_meta_count(r, &n) == FKVF_OK)
            for (size_t i = 0; i < n; i++) {
                fkvf_meta_entry e;
                (void)fkvf_reader_meta(r, i, &e);
            }
        for (size_t i = 0; i < ai.n_streams; i++) {
            fkvf_stream_info si;
            if (fkvf_reader_stream_info(r, i, &si))
                continue;
            uint32_t sym[64];
            for (uint64_t t = 0; t < si.length && t < 256; t += 64) {
                size_t c = si.length - t < 64 ? (size_t)(si.length - t) : 64;
                (void)fkvf_reader_stream_read(r, i, t, sym, c);
            }
            fkvf_point p;
            if (si.length)
                (void)fkvf_reader_stream_point(r, i, si.length - 1, &p);
        }
        for (uint64_t pos = 0; pos < ai.n_positions && pos < 64; pos++) {
            const void *row;
            size_t rb;
            (void)fkvf_reader_exact_row(r, pos, &row, &rb);
        }
        fkvf_rvq_metric m; /* the encoder metric's checks (spec 13.8) */
        (void)fkvf_reader_metric(r, &m);
        (void)fkvf_reader_verify(r);
    }
    fkvf_reader_free(r);
    return 0;
}
