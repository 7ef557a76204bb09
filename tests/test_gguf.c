/* Check suite for tools/gguf.c (placeholder until the suite lands). */
#include <check.h>
#include "testutil.h"
START_TEST(placeholder) { ck_assert(1); }
END_TEST
int main(void)
{
    Suite *s = suite_create("gguf");
    TCase *tc = tcase_create("all");
    tcase_add_test(tc, placeholder);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
