/* The spec clause that errors cite, checked against the conformance
 * manifest (conformance/manifest.tsv, its clause column): the reader's
 * fkvf_error_info.clause when it opens a corrupt file of the suite, and the
 * clause of the validator's first violation. Each file's fault has a clause
 * for its check; the messages cite that clause, not the chapter of the
 * structure. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fkvf.h"
#include "testutil.h"

static char *manifest;

/* read once, kept for the whole run */
static void load_manifest(void)
{
    if (manifest)
        return;
    const char *src = getenv("FKVF_SRCDIR");
    ck_assert_msg(src != NULL, "FKVF_SRCDIR not set");
    char path[1024];
    snprintf(path, sizeof path, "%s/conformance/manifest.tsv", src);
    size_t n;
    manifest = (char *)tu_slurp(path, &n);
}

/* the clause column of a file's row */
static void manifest_clause(const char *name, char *out, size_t cap)
{
    char key[128];
    snprintf(key, sizeof key, "\n%s\t", name);
    const char *row = strstr(manifest, key);
    ck_assert_msg(row != NULL, "%s not in the manifest", name);
    row++;
    for (int col = 0; col < 4; col++) {
        row = strchr(row, '\t');
        ck_assert_ptr_nonnull(row);
        row++;
    }
    size_t n = strcspn(row, "\t\n");
    ck_assert_uint_lt(n, cap);
    memcpy(out, row, n);
    out[n] = 0;
}

/* "§X" is in the list ("§3.1 step 6, §17.1"), X whole */
static int cites(const char *list, const char *clause)
{
    char want[40];
    snprintf(want, sizeof want, "\xc2\xa7%s", clause);
    size_t wl = strlen(want);
    for (const char *p = strstr(list, want); p; p = strstr(p + 1, want))
        if (p[wl] == 0 || p[wl] == ' ' || p[wl] == ',')
            return 1;
    return 0;
}

static const char *const files[] = {
    "hdr_checksum.fkvf",        /* header checks: 3.1 */
    "hdr_size_128.fkvf",        "hdr_reserved.fkvf",
    "dir_magic.fkvf",           /* directory checks: 5.3 */
    "dir_reserved.fkvf",        "dir_archived_gt_positions.fkvf",
    "chain_dir_seq.fkvf",       "trl_file_size.fkvf", /* trailer checks: 6.2 */
    "trl_checksum.fkvf",        "bounds_dir_offset.fkvf",
    "dir_checksum.fkvf",        "desc_reserved.fkvf", /* DESC fields: 8.2 */
    "trunc_section_DESC.fkvf",  "exac_dtype.fkvf", /* EXAC: 14.2 */
    "exac_first_position.fkvf", "trunc_section_EXAC.fkvf",
    "trunc_section_STRM.fkvf",  /* STRM section size: 11.2 step 5 */
    "trunc_last_byte.fkvf",     /* a file length not a multiple of 64: 7.2 */
    "dir_exact_uncovered.fkvf", /* every exact position covered: 14.3 */
};
#define N_FILES (sizeof files / sizeof files[0])

START_TEST(reader_cites_the_clause_of_the_check)
{
    load_manifest();
    const char *src = getenv("FKVF_SRCDIR");
    char path[1024], want[256];
    snprintf(path, sizeof path, "%s/conformance/files/%s", src, files[_i]);
    manifest_clause(files[_i], want, sizeof want);
    fkvf_reader *r = NULL;
    int rc = fkvf_reader_open_file(&r, path, 0, NULL);
    ck_assert_msg(rc != FKVF_OK, "%s opened", files[_i]);
    fkvf_error_info e;
    ck_assert_int_eq(fkvf_reader_error(r, &e), FKVF_OK);
    ck_assert_msg(e.clause && cites(want, e.clause), "%s: the reader cites %s, the manifest %s",
                  files[_i], e.clause ? e.clause : "nothing", want);
    fkvf_reader_free(r);
}
END_TEST

typedef struct first_violation {
    int n;
    char clause[16];
} first_violation;

static int keep_first(void *opaque, const fkvf_violation *v)
{
    first_violation *f = opaque;
    if (f->n++ == 0)
        snprintf(f->clause, sizeof f->clause, "%s", v->clause);
    return 0;
}

START_TEST(validator_cites_the_clause_of_the_check)
{
    load_manifest();
    const char *src = getenv("FKVF_SRCDIR");
    char path[1024], want[256];
    snprintf(path, sizeof path, "%s/conformance/files/%s", src, files[_i]);
    manifest_clause(files[_i], want, sizeof want);
    first_violation f = {0, ""};
    ck_assert_int_eq(fkvf_validate_file(path, NULL, keep_first, &f, NULL), FKVF_OK);
    ck_assert_msg(f.n > 0, "%s: no violation", files[_i]);
    ck_assert_msg(cites(want, f.clause), "%s: the validator cites %s, the manifest %s", files[_i],
                  f.clause, want);
}
END_TEST

static Suite *clauses_suite(void)
{
    Suite *s = suite_create("clauses");
    TCase *t = tcase_create("manifest");
    tcase_add_loop_test(t, reader_cites_the_clause_of_the_check, 0, (int)N_FILES);
    tcase_add_loop_test(t, validator_cites_the_clause_of_the_check, 0, (int)N_FILES);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return tu_run_suite(clauses_suite());
}
