/* Which EXAC section supplies a position's row (spec 7.3, 14.3: the last
 * covering section in section order), against a plain model, for many
 * overlapping sections over several commits. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "fkvf.h"
#include "testutil.h"

#define NPOS 200

START_TEST(latest_covering_section_wins)
{
    for (uint64_t seed = 1; seed <= 30; seed++) {
        tu_rng rng = {seed};
        tu_buf b;
        memset(&b, 0, sizeof b);
        fkvf_sink sink = tu_buf_sink(&b);
        fkvf_writer_options o;
        fkvf_writer_options_init(&o);
        o.sync = FKVF_SYNC_NONE;
        fkvf_writer *w = NULL;
        ck_assert_int_eq(fkvf_writer_create_sink(&w, &sink, &o, NULL), FKVF_OK);
        fkvf_desc d;
        memset(&d, 0, sizeof d);
        d.n_layers = d.n_kv_heads = d.key_dim = d.value_dim = 1;
        d.dtype = FKVF_DTYPE_F32; /* a row = 8 bytes: section id, position */
        ck_assert_int_eq(fkvf_writer_set_desc(w, &d), FKVF_OK);
        /* every position covered once first, then random overlapping runs */
        uint32_t owner[NPOS];
        uint32_t rows[2 * NPOS];
        for (uint32_t p = 0; p < NPOS; p++) {
            rows[2 * p] = 0;
            rows[2 * p + 1] = p;
            owner[p] = 0;
        }
        ck_assert_int_eq(fkvf_writer_add_exact(w, 0, NPOS, rows, sizeof(uint32_t) * 2 * NPOS, 0),
                         FKVF_OK);
        uint32_t id = 1;
        unsigned commits = 1 + tu_below(&rng, 5);
        for (unsigned c = 0; c < commits; c++) {
            unsigned ns = tu_below(&rng, 12);
            for (unsigned k = 0; k < ns; k++, id++) {
                uint32_t first = tu_below(&rng, NPOS), cnt = tu_below(&rng, NPOS - first + 1);
                for (uint32_t i = 0; i < cnt; i++) {
                    rows[2 * i] = id;
                    rows[2 * i + 1] = first + i;
                    owner[first + i] = id;
                }
                ck_assert_int_eq(fkvf_writer_add_exact(w, first, cnt, rows,
                                                       sizeof(uint32_t) * 2 * cnt, 0),
                                 FKVF_OK);
            }
            ck_assert_int_eq(fkvf_writer_set_positions(w, NPOS, 0), FKVF_OK);
            ck_assert_int_eq(fkvf_writer_commit(w), FKVF_OK);
        }
        ck_assert_int_eq(fkvf_writer_finish(w), FKVF_OK);
        fkvf_writer_free(w);
        fkvf_reader *r = NULL;
        ck_assert_int_eq(fkvf_reader_open_memory(&r, b.data, b.size, FKVF_OPEN_STRICT, NULL),
                         FKVF_OK);
        for (uint32_t p = 0; p < NPOS; p++) {
            const void *row;
            size_t rb;
            ck_assert_int_eq(fkvf_reader_exact_row(r, p, &row, &rb), FKVF_OK);
            ck_assert_uint_eq(rb, 8);
            uint32_t got[2];
            memcpy(got, row, 8);
            EXPECTF(got[0] == owner[p] && got[1] == p,
                    "seed %llu position %u: row from section %u (position %u), want %u",
                    (unsigned long long)seed, p, got[0], got[1], owner[p]);
        }
        fkvf_reader_free(r);
        tu_buf_free(&b);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("exact_map");
    TCase *t = tcase_create("exact_map");
    tcase_add_test(t, latest_covering_section_wins);
    suite_add_tcase(s, t);
    return tu_run_suite(s);
}
