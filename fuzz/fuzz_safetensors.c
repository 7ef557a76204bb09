/* Fuzz target: parse any bytes as a .safetensors KV cache (tools/cacheio_safetensors.c,
 * kvio_read_safetensors_mem); the property is fz_importer's (fuzz_importer.h). */
#include <stddef.h>
#include <stdint.h>

#include "fuzz_importer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fz_importer(data, size, kvio_read_safetensors_mem, KVIO_FMT_SAFETENSORS);
}
