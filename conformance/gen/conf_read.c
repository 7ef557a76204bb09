/* fkvf-conf-read: libfkvf as a reader under test for conformance/run.sh.
 *
 *   fkvf-conf-read [--open] [--codebooks CBFILE] FILE
 *
 * Default mode "verify": open (non-strict) and full verification
 * (fkvf_reader_verify, as `fkvf verify`). --open: the ordinary access path:
 * open non-strict, restore every position (spec 14.4) and read every token. With an external
 * codebook reference, CBFILE is attached first. Exit 0 accept (stdout:
 * "digest HEX" when the content decodes), 1 reject (stdout: "class NAME"),
 * 2 usage or an environment failure. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include "conf_digest.h"

static int reject(fkvf_reader *r, int rc)
{
    const char *name = fkvf_error_name(rc);
    if (!strncmp(name, "FKVF_E_", 7))
        name += 7;
    if (fkvf_error_class(rc) != FKVF_ERRCLASS_FORMAT) {
        fprintf(stderr, "fkvf-conf-read: %s: %s\n", name, r ? fkvf_reader_message(r) : "");
        return 2;
    }
    printf("class %s\n", name);
    fprintf(stderr, "%s\n", r ? fkvf_reader_message(r) : fkvf_strerror(rc));
    return 1;
}

int main(int argc, char **argv)
{
    const char *path = NULL, *cbpath = NULL;
    int open_mode = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--open"))
            open_mode = 1;
        else if (!strcmp(argv[i], "--codebooks") && i + 1 < argc)
            cbpath = argv[++i];
        else if (!path && argv[i][0] != '-')
            path = argv[i];
        else {
            fprintf(stderr, "usage: fkvf-conf-read [--open] [--codebooks CBFILE] FILE\n");
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "usage: fkvf-conf-read [--open] [--codebooks CBFILE] FILE\n");
        return 2;
    }
    if (cbpath && !*cbpath)
        cbpath = NULL;
    fkvf_reader *r = NULL, *cb = NULL;
    int rc = fkvf_reader_open_file(&r, path, FKVF_OPEN_READ, NULL);
    if (rc) {
        int e = reject(r, rc);
        fkvf_reader_free(r);
        return e;
    }
    int ext = 0;
    uint8_t h[16];
    const char *name;
    if (cbpath && fkvf_reader_codebook_ref(r, &ext, h, &name) == FKVF_OK && ext) {
        rc = fkvf_reader_open_file(&cb, cbpath, FKVF_OPEN_READ, NULL);
        /* a candidate that fails its open is not a usable codebook file
         * (spec 13.5: CODEBOOK, whatever the candidate's own class); one
         * that cannot be read is an environment failure (16.3) */
        if (rc == FKVF_OK) {
            rc = fkvf_reader_attach_codebook(r, cb);
        } else if (rc == FKVF_E_IO || rc == FKVF_E_NOMEM) {
            fprintf(stderr, "fkvf-conf-read: %s: %s\n", cbpath,
                    cb ? fkvf_reader_message(cb) : fkvf_strerror(rc));
            fkvf_reader_free(cb);
            fkvf_reader_free(r);
            return 2;
        } else {
            rc = FKVF_E_CODEBOOK;
        }
    }
    if (!rc && !open_mode)
        rc = fkvf_reader_verify(r);
    if (!rc && open_mode)
        rc = conf_decode_all(r);
    uint64_t d = 0;
    if (!rc)
        rc = conf_digest(r, &d);
    int e = 0;
    if (rc)
        e = reject(r, rc);
    else
        printf("digest %016" PRIx64 "\n", d);
    fkvf_reader_free(r);
    fkvf_reader_free(cb);
    return e;
}
