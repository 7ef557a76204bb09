/* Fuzz target: any bytes as GGUF metadata (tools/gguf.c, gguf_parse). An
 * error leaves a message naming the input and an offset and an empty model;
 * a model that parses holds what gguf.h promises: an architecture string,
 * every dimension >= 1, the KV heads dividing the query heads, an even
 * number of rotated dimensions no larger than the key length for the
 * NORM / NEOX rope types, a finite theta > 0, NUL-terminated strings; and a
 * second parse gives the same answer. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "fuzz_util.h"
#include "gguf.h"

static int empty(const gguf_model *m)
{
    static const gguf_model z;
    return memcmp(m, &z, sizeof z) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gguf_model m, m2;
    char err[512], err2[512];
    int rc = gguf_parse(data, size, "in", &m, err, sizeof err);
    if (rc != GGUF_OK) {
        FZ_CHECK(rc == GGUF_E_FORMAT || rc == GGUF_E_UNSUPPORTED || rc == GGUF_E_NOMEM);
        FZ_CHECK(strncmp(err, "in: offset ", 11) == 0);
        FZ_CHECK(empty(&m));
    } else {
        FZ_CHECK(m.version == 2 || m.version == 3);
        FZ_CHECK(m.arch && m.arch[0] && strlen(m.arch) <= GGUF_MAX_STRING);
        FZ_CHECK(!m.name || strlen(m.name) <= GGUF_MAX_STRING);
        FZ_CHECK(m.n_layer >= 1 && m.n_embd >= 1 && m.n_head >= 1 && m.n_head_kv >= 1);
        FZ_CHECK(m.n_head % m.n_head_kv == 0);
        FZ_CHECK(m.key_dim >= 1 && m.value_dim >= 1);
        FZ_CHECK(m.rope >= GGUF_ROPE_UNKNOWN && m.rope <= GGUF_ROPE_MULTI);
        if (m.rope == GGUF_ROPE_NORM || m.rope == GGUF_ROPE_NEOX)
            FZ_CHECK(m.rope_dims >= 2 && m.rope_dims % 2 == 0 && m.rope_dims <= m.key_dim);
        FZ_CHECK(isfinite(m.rope_theta) && m.rope_theta > 0);
        FZ_CHECK(m.rope_scaled == 0 || m.rope_scaled == 1);
        FZ_CHECK(m.n_kv <= GGUF_MAX_KV && m.n_kv <= size / 13);
    }
    int rc2 = gguf_parse(data, size, "in", &m2, err2, sizeof err2);
    FZ_CHECK(rc2 == rc);
    if (rc)
        FZ_CHECK(strcmp(err, err2) == 0);
    else
        FZ_CHECK(strcmp(m.arch, m2.arch) == 0 && m.n_head == m2.n_head && m.key_dim == m2.key_dim &&
                 m.rope == m2.rope && m.rope_dims == m2.rope_dims);
    gguf_model_free(&m);
    gguf_model_free(&m2);
    FZ_CHECK(empty(&m));
    return 0;
}
