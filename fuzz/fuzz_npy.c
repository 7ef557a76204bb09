/* Fuzz target: parse any bytes as a .npy KV cache (tools/cacheio.c,
 * kvio_read_npy_mem), strictly and with extra arrays ignored. Must never
 * crash, hang or leak; a failure must leave a message and an empty cache; a
 * cache that parses must be well-formed (kvio_cache_check), write back as
 * .npy and read back to the same cache. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "cacheio.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const unsigned flags[] = {0, KVIO_READ_IGNORE_EXTRA};
    for (size_t f = 0; f < sizeof flags / sizeof flags[0]; f++) {
        kvio_cache c;
        char err[256];
        err[0] = 0;
        if (kvio_read_npy_mem(data, size, "fuzz", flags[f], &c, err, sizeof err) != KVIO_OK) {
            FZ_CHECK(err[0] && !c.keys && !c.values && !c.tokens && !c.n_layers);
            continue;
        }
        FZ_CHECK(kvio_cache_check(&c, err, sizeof err) == KVIO_OK);
        uint8_t *out = NULL;
        size_t n = 0;
        FZ_CHECK(kvio_write_mem(&c, KVIO_FMT_NPY, 0, &out, &n, err, sizeof err) == KVIO_OK);
        FZ_CHECK(kvio_format_sniff(out, n) == KVIO_FMT_NPY);
        kvio_cache d;
        FZ_CHECK(kvio_read_npy_mem(out, n, "fuzz-rt", 0, &d, err, sizeof err) == KVIO_OK);
        FZ_CHECK(kvio_cache_equal(&c, &d));
        kvio_cache_free(&d);
        free(out);
        kvio_cache_free(&c);
    }
    return 0;
}
