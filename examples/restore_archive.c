/* Example: restore every position of an FKVF archive whose codebook is an
 * external codebook file (fkvf train ... -o CODEBOOK, then fkvf pack
 * --codebooks CODEBOOK), and write the rows as little-endian binary32 in the
 * row layout of spec 14.2: per position, per layer the keys of heads
 * 0..H-1, then their values.
 *
 *   restore_archive ARCHIVE CODEBOOK ROWS.f32
 *
 * ROWS.f32 must not exist (an existing file, such as one of the inputs, is
 * never replaced).
 *
 * CODEBOOK "-": find the codebook file by its content hash in the archive's
 * directory, then in the directories of FKVF_CODEBOOK_PATH (colon-separated),
 * as the fkvf CLI does (fkvf_reader_find_codebook).
 *
 * Exit status: 0 done, 1 invalid input (not an archive, not a codebook
 * file, the wrong one, none found), 2 usage or I/O (also a CODEBOOK path
 * that does not exist). Build against an installed libfkvf as read_archive.c. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fkvf.h>

/* Exit status of a libfkvf error: invalid file data is 1, the rest 2. */
static int status_of(int rc)
{
    return fkvf_error_class(rc) == FKVF_ERRCLASS_FORMAT ? 1 : 2;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s ARCHIVE CODEBOOK|- ROWS.f32\n", argv[0]);
        return 2;
    }
    const char *archive = argv[1], *codebook = argv[2], *outpath = argv[3];
    fkvf_reader *r = NULL, *cb = NULL;
    FILE *out = NULL;
    float *rows = NULL;
    int status = 2;

    int rc = fkvf_reader_open_file(&r, archive, 0, NULL);
    if (rc != FKVF_OK) {
        /* the message lives in the handle (NULL only without memory) */
        fprintf(stderr, "%s\n", r ? fkvf_reader_message(r) : fkvf_strerror(rc));
        status = status_of(rc);
        goto done;
    }
    int external = 0;
    uint8_t hash[16];
    const char *hint = NULL;
    fkvf_reader_codebook_ref(r, &external, hash, &hint);
    if (external) {
        /* The archive stores the codebook's content hash and a name hint.
         * Either the library finds the file by that hash, or the caller says
         * where it is. The codebook handle must stay open as long as r: r
         * reads the tables from it. */
        if (!strcmp(codebook, "-")) {
            rc = fkvf_reader_find_codebook(r, getenv("FKVF_CODEBOOK_PATH"), &cb);
            if (rc != FKVF_OK) {
                /* not found: the message names the hash, the hint and
                 * every directory searched */
                fprintf(stderr, "%s\n", fkvf_reader_message(r));
                status = rc == FKVF_E_NOT_FOUND || rc == FKVF_E_CODEBOOK ? 1 : 2;
                goto done;
            }
            codebook = fkvf_reader_file_name(cb);
        } else {
            rc = fkvf_reader_open_file(&cb, codebook, 0, NULL);
            if (rc != FKVF_OK) {
                fprintf(stderr, "%s\n", cb ? fkvf_reader_message(cb) : fkvf_strerror(rc));
                /* a file that does not exist or cannot be read: 2, as any
                 * path; one that is not an FKVF file: invalid input */
                status = rc == FKVF_E_IO || rc == FKVF_E_NOMEM ? 2 : 1;
                goto done;
            }
            if ((rc = fkvf_reader_attach_codebook(r, cb)) != FKVF_OK) {
                /* wrong file: the message names the expected content hash */
                fprintf(stderr, "%s\n", fkvf_reader_message(r));
                status = 1;
                goto done;
            }
        }
        printf("codebook %s (name hint \"%s\"): ", codebook, hint);
        for (int i = 0; i < 16; i++)
            printf("%02x", hash[i]);
        printf("\n");
    } else {
        fprintf(stderr, "%s: no external codebook; %s not used\n", archive, codebook);
    }

    fkvf_archive_info ai;
    size_t row_bytes;
    if ((rc = fkvf_reader_info(r, &ai)) != FKVF_OK ||
        (rc = fkvf_reader_row_bytes(r, FKVF_DTYPE_F32, &row_bytes)) != FKVF_OK) {
        fprintf(stderr, "%s\n", fkvf_reader_message(r));
        status = status_of(rc);
        goto done;
    }
    /* restore in chunks of positions: memory stays bounded for any archive */
    enum { CHUNK = 64 };
    if (row_bytes == 0 || row_bytes > SIZE_MAX / CHUNK) {
        fprintf(stderr, "%s: rows of %zu bytes are too large\n", archive, row_bytes);
        goto done;
    }
    rows = malloc(CHUNK * row_bytes);
    /* "x": a new file only. Never replace an existing one: it could be an
     * input (the archive or the codebook, which are mapped while they are
     * read: truncating one would lose it and fault this process) */
    out = rows ? fopen(outpath, "wbx") : NULL;
    if (!rows || !out) {
        perror(rows ? outpath : "malloc");
        goto done;
    }
    for (uint64_t t = 0; t < ai.n_positions; t += CHUNK) {
        uint64_t n = ai.n_positions - t < CHUNK ? ai.n_positions - t : CHUNK;
        rc = fkvf_reader_restore(r, t, n, FKVF_DTYPE_F32, rows, CHUNK * row_bytes);
        if (rc != FKVF_OK) {
            fprintf(stderr, "%s\n", fkvf_reader_message(r));
            status = status_of(rc);
            goto done;
        }
        if (fwrite(rows, row_bytes, (size_t)n, out) != (size_t)n) {
            perror(outpath);
            goto done;
        }
    }
    if (fclose(out) != 0) {
        out = NULL;
        perror(outpath);
        goto done;
    }
    out = NULL;
    printf("restored %" PRIu64 " positions (%" PRIu64 " from the codebook), %zu bytes each, to %s\n",
           ai.n_positions, ai.n_archived, row_bytes, outpath);
    status = 0;
done:
    if (out)
        fclose(out);
    free(rows);
    fkvf_reader_free(r);  /* the archive first: it uses the codebook handle */
    fkvf_reader_free(cb); /* accepts NULL */
    return status;
}
