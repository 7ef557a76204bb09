/* Test helper: append one commit holding an optional section of a given
 * four-character type to an archive (fkvf_archive_append_sections), so that
 * CLI tests can meet section types that no writer of the project produces,
 * e.g. one spelled with a quote or a backslash.
 *   add_section ARCHIVE TYPE      (TYPE: exactly 4 bytes, not a known type)
 * Exit status: 0 done, 1 refused by the library (message on stderr), 2 usage. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "fkvf.h"

int main(int argc, char **argv)
{
    if (argc != 3 || strlen(argv[2]) != 4) {
        fprintf(stderr, "usage: %s ARCHIVE TYPE (4 bytes)\n", argv[0]);
        return 2;
    }
    const unsigned char *t = (const unsigned char *)argv[2];
    static const char data[] = "an optional section";
    fkvf_section_add s;
    memset(&s, 0, sizeof s);
    /* the type as the four bytes in file order (spec 4.2: little-endian u32) */
    s.type = (uint32_t)t[0] | (uint32_t)t[1] << 8 | (uint32_t)t[2] << 16 | (uint32_t)t[3] << 24;
    s.data = data;
    s.size = sizeof data - 1;
    fkvf_archive_op *op = NULL;
    int rc = fkvf_archive_append_sections(&op, argv[1], &s, 1, FKVF_SYNC_NONE);
    if (rc != FKVF_OK) {
        fkvf_error_info e;
        fkvf_archive_op_error(op, &e);
        fprintf(stderr, "%s\n", e.message);
    }
    fkvf_archive_op_free(op);
    return rc == FKVF_OK ? 0 : 1;
}
