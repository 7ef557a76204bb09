/* Fuzz target: open any bytes as an archive, then verify and read
 * everything the reader exposes. Must never crash, hang or leak. */
#include <stddef.h>
#include <stdint.h>

#include "fkvf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fkvf_reader *r = NULL;
    if (fkvf_reader_open_memory(&r, data, size, 0, NULL) == FKVF_OK) {
        fkvf_archive_info ai;
        fkvf_reader_info(r, &ai);
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
        (void)fkvf_reader_verify(r);
    }
    fkvf_reader_free(r);
    return 0;
}
