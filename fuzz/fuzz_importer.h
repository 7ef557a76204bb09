/* The property every raw-cache importer target checks (tools/cacheio*.c),
 * for one format: any bytes parsed strictly, with extra arrays ignored, and
 * positions-first (KVIO_READ_NHD) must never crash, hang or leak; a failure
 * leaves a message and an empty cache; a cache that parses is well-formed
 * (kvio_cache_check), lists at most KVIO_MAX_IGNORED skipped names, writes
 * back in the same format and layout (which sniffs as that format) and
 * reads back to the same cache, metadata included. */
#ifndef FKVF_FUZZ_IMPORTER_H
#define FKVF_FUZZ_IMPORTER_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "cacheio.h"
#include "fuzz_util.h"

typedef int (*fz_import_fn)(const void *data, size_t size, const char *name, unsigned flags,
                            kvio_cache *out, char *err, size_t errlen);

static inline int fz_importer(const uint8_t *data, size_t size, fz_import_fn import,
                              kvio_format fmt)
{
    static const unsigned flags[] = {0, KVIO_READ_IGNORE_EXTRA, KVIO_READ_IGNORE_EXTRA | KVIO_READ_NHD};
    for (size_t f = 0; f < sizeof flags / sizeof flags[0]; f++) {
        unsigned nhd = flags[f] & KVIO_READ_NHD;
        kvio_cache c;
        char err[256];
        err[0] = 0;
        if (import(data, size, "fuzz", flags[f], &c, err, sizeof err) != KVIO_OK) {
            FZ_CHECK(err[0] && !c.keys && !c.values && !c.tokens && !c.n_layers);
            continue;
        }
        FZ_CHECK(kvio_cache_check(&c, err, sizeof err) == KVIO_OK);
        for (size_t i = 0; i < KVIO_MAX_IGNORED; i++)
            FZ_CHECK((c.ignored[i] != NULL) == (i < c.n_ignored));
        uint8_t *out = NULL;
        size_t n = 0;
        FZ_CHECK(kvio_write_mem(&c, fmt, nhd ? KVIO_WRITE_NHD : 0, &out, &n, err, sizeof err) == KVIO_OK);
        FZ_CHECK(kvio_format_sniff(out, n) == fmt);
        kvio_cache d;
        FZ_CHECK(import(out, n, "fuzz-rt", nhd, &d, err, sizeof err) == KVIO_OK);
        FZ_CHECK(kvio_cache_equal(&c, &d) && d.n_meta == c.n_meta);
        kvio_cache_free(&d);
        free(out);
        kvio_cache_free(&c);
    }
    return 0;
}

#endif
