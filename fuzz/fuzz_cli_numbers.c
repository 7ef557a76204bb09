/* Fuzz target: the number parsers of the CLI (tools/cli_util.c) against
 * independent reference parsers written here:
 *  cli_parse_u64: accepted exactly when the string is one or more decimal
 *    digits whose value is <= max, with that value;
 *  cli_parse_f64: accepted only for a whole finite number with nothing
 *    around it (no blanks), with strtod's value;
 *  cli_opt_*: accepted exactly when the number is in the option's range;
 *  cli_parse_list: "d,d,...,d" of numbers <= 2^32-1, exactly;
 *  cli_parse_stream_name: "tokens" or "L<n>.H<n>.<K|V>.<n>" in range,
 *    exactly, and cli_stream_name gives back a name of the same id.
 * The first input byte picks the parser, the rest is the string (up to its
 * first NUL). */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <unistd.h>

#include "cli_util.h"
#include "fuzz_util.h"

/* one or more digits at s[0..]: value (saturating flag), end */
static const char *ref_digits(const char *s, uint64_t *v, int *ovf)
{
    *v = 0;
    *ovf = 0;
    const char *p = s;
    while (*p >= '0' && *p <= '9') {
        unsigned dgt = (unsigned)(*p - '0');
        if (*v > (UINT64_MAX - dgt) / 10)
            *ovf = 1;
        else
            *v = *v * 10 + dgt;
        p++;
    }
    return p;
}

/* cli_parse_u64's contract */
static int ref_u64(const char *s, uint64_t max, uint64_t *out)
{
    uint64_t v;
    int ovf;
    const char *e = ref_digits(s, &v, &ovf);
    if (e == s || *e || ovf || v > max)
        return -1;
    *out = v;
    return 0;
}

static void check_u64(const char *s, uint64_t max)
{
    uint64_t a = 0xA5A5, b = 0x5A5A;
    int ra = cli_parse_u64(s, max, &a), rb = ref_u64(s, max, &b);
    FZ_CHECK(ra == rb);
    FZ_CHECK(ra != 0 || a == b);
}

static void check_f64(const char *s)
{
    double v = 0;
    int rc = cli_parse_f64(s, &v);
    if (rc != 0)
        return;
    FZ_CHECK(*s && !isspace((unsigned char)s[0]));
    FZ_CHECK(isfinite(v));
    char *end;
    errno = 0;
    double w = strtod(s, &end);
    FZ_CHECK(*end == 0 && errno == 0 && memcmp(&v, &w, sizeof v) == 0);
}

/* the cli_opt_* functions write an error line on stderr for a bad value:
 * send it to /dev/null while they run (sanitizer reports still reach the
 * real stderr, which is restored before any check) */
static int quiet_fd = -1, saved_fd = -1;

static void quiet(int on)
{
    if (quiet_fd < 0) {
        quiet_fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
        saved_fd = dup(2);
        if (quiet_fd < 0 || saved_fd < 0)
            return;
    }
    fflush(stderr);
    dup2(on ? quiet_fd : saved_fd, 2);
}

static void check_opts(const char *s)
{
    uint64_t x = 0;
    int p = ref_u64(s, UINT64_MAX, &x);
    uint32_t k;
    quiet(1);
    int rc = cli_opt_k("--k", s, &k);
    quiet(0);
    FZ_CHECK((rc == 0) == (p == 0 && x >= 16 && x <= 4096 && !(x & (x - 1))));
    FZ_CHECK(rc != 0 || k == x);
    uint8_t st;
    quiet(1);
    rc = cli_opt_stages("--k-stages", s, &st);
    quiet(0);
    FZ_CHECK((rc == 0) == (p == 0 && x <= 16));
    FZ_CHECK(rc != 0 || st == x);
    uint64_t n;
    quiet(1);
    rc = cli_opt_count("--sinks", s, &n);
    quiet(0);
    FZ_CHECK((rc == 0) == (p == 0 && x <= UINT32_MAX));
    FZ_CHECK(rc != 0 || n == x);
    uint32_t u;
    quiet(1);
    rc = cli_opt_beam(s, &u);
    quiet(0);
    FZ_CHECK((rc == 0) == (p == 0 && x >= 1 && x <= FKVF_RVQ_MAX_BEAM));
    FZ_CHECK(rc != 0 || u == x);
    quiet(1);
    rc = cli_opt_iters(s, &u);
    quiet(0);
    FZ_CHECK((rc == 0) == (p == 0 && x >= 1 && x <= 100000));
    FZ_CHECK(rc != 0 || u == x);
    quiet(1);
    rc = cli_opt_seed(s, &n);
    quiet(0);
    FZ_CHECK((rc == 0) == (p == 0));
    FZ_CHECK(rc != 0 || n == x);
    quiet(1);
    rc = cli_opt_rope_dims(s, &u);
    quiet(0);
    FZ_CHECK((rc == 0) == (p == 0 && x >= 2 && x <= 65536 && x % 2 == 0));
    FZ_CHECK(rc != 0 || u == x);
    double th;
    quiet(1);
    rc = cli_opt_rope_theta(s, &th);
    quiet(0);
    if (rc == 0) {
        double w;
        FZ_CHECK(cli_parse_f64(s, &w) == 0 && th == w && th > 0 && isfinite(th));
    }
}

static void check_list(const char *s)
{
    uint32_t *v = NULL;
    size_t n = 0;
    int rc = cli_parse_list(s, &v, &n);
    /* reference: number (',' number)*, every number <= 2^32-1 */
    int ok = 1;
    size_t cnt = 0;
    const char *p = s;
    for (;;) {
        uint64_t x;
        int ovf;
        const char *e = ref_digits(p, &x, &ovf);
        if (e == p || ovf || x > UINT32_MAX) {
            ok = 0;
            break;
        }
        if (rc == 1) {
            FZ_CHECK(cnt < n && v[cnt] == x);
        }
        cnt++;
        if (!*e)
            break;
        if (*e != ',') {
            ok = 0;
            break;
        }
        p = e + 1;
    }
    FZ_CHECK(rc == ok);
    FZ_CHECK(rc != 1 || cnt == n);
    if (rc == 1)
        free(v);
}

static void check_stream_name(const char *s)
{
    uint64_t id = 0x1234;
    int rc = cli_parse_stream_name(s, &id);
    int ok;
    uint64_t want = 0;
    if (!strcmp(s, "tokens")) {
        ok = 1;
        want = FKVF_STREAM_ID_TOKENS;
    } else {
        uint64_t l = 0, h = 0, st = 0;
        int o1 = 0, o2 = 0, o3 = 0;
        const char *p = s, *e;
        ok = *p++ == 'L';
        ok = ok && (e = ref_digits(p, &l, &o1)) != p && *e == '.' && e[1] == 'H';
        ok = ok && (p = e + 2, (e = ref_digits(p, &h, &o2)) != p) && *e == '.' &&
             (e[1] == 'K' || e[1] == 'V') && e[2] == '.';
        char kv = ok ? e[1] : 0;
        ok = ok && (p = e + 3, (e = ref_digits(p, &st, &o3)) != p) && *e == 0;
        ok = ok && !o1 && !o2 && !o3 && l <= 0xFFFF && h <= 0xFFFF && st <= 0xFF;
        if (ok)
            want = FKVF_STREAM_ID(FKVF_STREAM_KIND_INDEX, l, h, kv == 'V', st);
    }
    FZ_CHECK(rc == ok);
    if (rc == 1) {
        FZ_CHECK(id == want);
        char nm[64];
        uint64_t back = 0;
        cli_stream_name(id, nm, sizeof nm);
        FZ_CHECK(cli_parse_stream_name(nm, &back) == 1 && back == id);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size};
    uint8_t sel = fz_u8(&f);
    uint64_t max = 0;
    if (sel % 6 == 0)
        max = fz_u64(&f);
    if (f.n > 4096)
        return 0;
    char *s = malloc(f.n + 1);
    FZ_CHECK(s);
    memcpy(s, f.p, f.n);
    s[f.n] = 0;
    switch (sel % 6) {
    case 0:
        check_u64(s, max);
        check_u64(s, UINT64_MAX);
        break;
    case 1: check_f64(s); break;
    case 2: check_opts(s); break;
    case 3: check_list(s); break;
    case 4: check_stream_name(s); break;
    default:
        check_u64(s, UINT32_MAX);
        check_f64(s);
        break;
    }
    free(s);
    return 0;
}
