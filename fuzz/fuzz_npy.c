/* Fuzz target: parse any bytes as a .npy KV cache (tools/cacheio_npy.c,
 * kvio_read_npy_mem); the property is fz_importer's (fuzz_importer.h). */
#include <stddef.h>
#include <stdint.h>

#include "fuzz_importer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fz_importer(data, size, kvio_read_npy_mem, KVIO_FMT_NPY);
}
