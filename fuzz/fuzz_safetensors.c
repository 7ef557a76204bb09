/* Fuzz target: parse any bytes as a .safetensors KV cache (tools/cacheio.c),
 * strictly and with extra tensors ignored. Must never crash, hang or leak;
 * a failure must leave a message; a cache that parses must write back and
 * read back to the same cache. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "cacheio.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const unsigned flags[] = {0, KVIO_READ_IGNORE_EXTRA};
    for (size_t f = 0; f < sizeof flags / sizeof flags[0]; f++) {
        kvio_cache c;
        char err[256];
        err[0] = 0;
        if (kvio_read_safetensors_mem(data, size, "fuzz", flags[f], &c, err, sizeof err) != KVIO_OK) {
            if (!err[0] || c.keys || c.n_layers)
                abort();
            continue;
        }
        uint8_t *out = NULL;
        size_t n = 0;
        if (kvio_write_mem(&c, KVIO_FMT_SAFETENSORS, 0, &out, &n, err, sizeof err) != KVIO_OK)
            abort();
        kvio_cache d;
        if (kvio_read_safetensors_mem(out, n, "fuzz-rt", 0, &d, err, sizeof err) != KVIO_OK ||
            !kvio_cache_equal(&c, &d) || d.n_meta != c.n_meta)
            abort();
        kvio_cache_free(&d);
        free(out);
        kvio_cache_free(&c);
    }
    return 0;
}
