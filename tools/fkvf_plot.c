/* fkvf plot: the chaos-game points of one stream as a PNG a person can
 * read: a density colour scale (log) with its colour bar, axes with tick
 * labels, a title (archive, stream, point count), the cells (quad) or discs
 * (ngon) of the last symbols with their labels, and optionally the matches
 * of a query marked. Public API only (fkvf.h); zlib writes the PNG; text is
 * drawn with the bitmap font below (no font library). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "cli_util.h"
#include "commands.h"
#include "fkvf.h"

#define PI 3.14159265358979323846


static const char *plot_help =
    "usage: fkvf plot ARCHIVE --stream NAME -o FILE.png [--size PIXELS]\n"
    "                 [--highlight-tokens LIST | --highlight-symbols LIST]\n"
    "                 [--force] [--json]\n"
    "\n"
    "Draws the chaos-game points of a stream (one per position) as a PNG: the\n"
    "unit square for quad streams, the unit disc for ngon streams. Each small\n"
    "square of the plot is coloured by how many points fell into it, on a log\n"
    "scale (the colour bar on the right); white is none. The title names the\n"
    "archive, the stream and its point count; the axes carry the point\n"
    "coordinates. The grid shows where the last symbol puts a point: for quad\n"
    "a cell per last symbol, labelled with it (groups of symbols, labelled by\n"
    "the first, when the cells would be too small to label), the faint lines\n"
    "inside split it by the symbol before; for ngon a disc per last symbol\n"
    "around its vertex, labelled outside the circle.\n"
    "\n"
    "  --stream NAME            tokens or Lx.Hy.K|V.stage (required)\n"
    "  -o FILE.png              output; a name not ending in .png is refused\n"
    "  --size PIXELS            the plot area, PIXELS x PIXELS, 64..4096 (512);\n"
    "                           margins for the title, axes and legend come on\n"
    "                           top (the image is 804 x 644 at 512, 210 x 130\n"
    "                           at 64); text is twice as large from 384 on\n"
    "  --highlight-symbols LIST mark the positions where the stream's symbols\n"
    "                           end with LIST (as 'fkvf search --symbols'): a\n"
    "                           ring around the point of each match's last\n"
    "                           position, and the query's cell or disc outlined\n"
    "  --highlight-tokens LIST  mark the positions where the token stream ends\n"
    "                           with LIST (as 'fkvf search --tokens'); on an\n"
    "                           index stream, the points of those cache\n"
    "                           positions (n_sinks + t) that it holds\n"
    "  --force                  replace FILE.png if it exists (default: refused);\n"
    "                           ARCHIVE is never replaced\n"
    "  --json                   one JSON object: archive, stream, out, width,\n"
    "                           height, points, densest, matches (on failure\n"
    "                           {\"error\":{...}}, docs/cli.md)\n"
    "\n"
    "Highlight symbols outside an index stream's alphabet are refused (exit 2),\n"
    "as in fkvf search. Prints the image size, the plot area's place in it,\n"
    "the densest square and the number of matches.\n"
    "\n"
    "Exit status: 0 ok, 1 invalid input (not an archive, a codebook file, no\n"
    "such stream, no token stream for --highlight-tokens; FILE.png exists\n"
    "without --force or is ARCHIVE), 2 usage or I/O error (a bad option, a name\n"
    "not ending in .png, ARCHIVE does not exist, FILE.png cannot be written).\n";

/* ---- a bitmap font: 5 x 8 cells (7 rows above the baseline, 1 below) ---- */

/* Each glyph is 8 rows of 5 columns, '#' set, separated by spaces. */
typedef struct glyph {
    char c;
    const char *rows;
} glyph;

static const glyph font[] = {
    {' ', "..... ..... ..... ..... ..... ..... ..... ....."},
    {'!', "..#.. ..#.. ..#.. ..#.. ..#.. ..... ..#.. ....."},
    {'"', ".#.#. .#.#. ..... ..... ..... ..... ..... ....."},
    {'#', ".#.#. .#.#. ##### .#.#. ##### .#.#. .#.#. ....."},
    {'$', "..#.. .#### #.#.. .###. ..#.# ####. ..#.. ....."},
    {'%', "##... ##..# ...#. ..#.. .#... #..## ...## ....."},
    {'&', ".##.. #..#. #.#.. .#... #.#.# #..#. .##.# ....."},
    {'\'', "..#.. ..#.. .#... ..... ..... ..... ..... ....."},
    {'(', "...#. ..#.. .#... .#... .#... ..#.. ...#. ....."},
    {')', ".#... ..#.. ...#. ...#. ...#. ..#.. .#... ....."},
    {'*', "..... ..#.. #.#.# .###. #.#.# ..#.. ..... ....."},
    {'+', "..... ..#.. ..#.. ##### ..#.. ..#.. ..... ....."},
    {',', "..... ..... ..... ..... ..... ..#.. ..#.. .#..."},
    {'-', "..... ..... ..... .###. ..... ..... ..... ....."},
    {'.', "..... ..... ..... ..... ..... ..... ..#.. ....."},
    {'/', "....# ....# ...#. ..#.. .#... #.... #.... ....."},
    {'0', ".###. #...# #..## #.#.# ##..# #...# .###. ....."},
    {'1', "..#.. .##.. ..#.. ..#.. ..#.. ..#.. .###. ....."},
    {'2', ".###. #...# ....# ...#. ..#.. .#... ##### ....."},
    {'3', "##### ...#. ..#.. ...#. ....# #...# .###. ....."},
    {'4', "...#. ..##. .#.#. #..#. ##### ...#. ...#. ....."},
    {'5', "##### #.... ####. ....# ....# #...# .###. ....."},
    {'6', "..##. .#... #.... ####. #...# #...# .###. ....."},
    {'7', "##### ....# ...#. ..#.. .#... .#... .#... ....."},
    {'8', ".###. #...# #...# .###. #...# #...# .###. ....."},
    {'9', ".###. #...# #...# .#### ....# ...#. .##.. ....."},
    {':', "..... ..... ..#.. ..... ..... ..#.. ..... ....."},
    {';', "..... ..... ..#.. ..... ..... ..#.. ..#.. .#..."},
    {'<', "...#. ..#.. .#... #.... .#... ..#.. ...#. ....."},
    {'=', "..... ..... ##### ..... ##### ..... ..... ....."},
    {'>', ".#... ..#.. ...#. ....# ...#. ..#.. .#... ....."},
    {'?', ".###. #...# ....# ...#. ..#.. ..... ..#.. ....."},
    {'@', ".###. #...# #.### #.#.# #.### #.... .#### ....."},
    {'A', ".###. #...# #...# ##### #...# #...# #...# ....."},
    {'B', "####. #...# #...# ####. #...# #...# ####. ....."},
    {'C', ".###. #...# #.... #.... #.... #...# .###. ....."},
    {'D', "###.. #..#. #...# #...# #...# #..#. ###.. ....."},
    {'E', "##### #.... #.... ####. #.... #.... ##### ....."},
    {'F', "##### #.... #.... ####. #.... #.... #.... ....."},
    {'G', ".###. #...# #.... #.### #...# #...# .#### ....."},
    {'H', "#...# #...# #...# ##### #...# #...# #...# ....."},
    {'I', ".###. ..#.. ..#.. ..#.. ..#.. ..#.. .###. ....."},
    {'J', "..### ...#. ...#. ...#. ...#. #..#. .##.. ....."},
    {'K', "#...# #..#. #.#.. ##... #.#.. #..#. #...# ....."},
    {'L', "#.... #.... #.... #.... #.... #.... ##### ....."},
    {'M', "#...# ##.## #.#.# #.#.# #...# #...# #...# ....."},
    {'N', "#...# #...# ##..# #.#.# #..## #...# #...# ....."},
    {'O', ".###. #...# #...# #...# #...# #...# .###. ....."},
    {'P', "####. #...# #...# ####. #.... #.... #.... ....."},
    {'Q', ".###. #...# #...# #...# #.#.# #..#. .##.# ....."},
    {'R', "####. #...# #...# ####. #.#.. #..#. #...# ....."},
    {'S', ".#### #.... #.... .###. ....# ....# ####. ....."},
    {'T', "##### ..#.. ..#.. ..#.. ..#.. ..#.. ..#.. ....."},
    {'U', "#...# #...# #...# #...# #...# #...# .###. ....."},
    {'V', "#...# #...# #...# #...# #...# .#.#. ..#.. ....."},
    {'W', "#...# #...# #...# #.#.# #.#.# #.#.# .#.#. ....."},
    {'X', "#...# #...# .#.#. ..#.. .#.#. #...# #...# ....."},
    {'Y', "#...# #...# .#.#. ..#.. ..#.. ..#.. ..#.. ....."},
    {'Z', "##### ....# ...#. ..#.. .#... #.... ##### ....."},
    {'[', ".###. .#... .#... .#... .#... .#... .###. ....."},
    {'\\', "#.... #.... .#... ..#.. ...#. ....# ....# ....."},
    {']', ".###. ...#. ...#. ...#. ...#. ...#. .###. ....."},
    {'^', "..#.. .#.#. #...# ..... ..... ..... ..... ....."},
    {'_', "..... ..... ..... ..... ..... ..... ..... #####"},
    {'`', ".#... ..#.. ..... ..... ..... ..... ..... ....."},
    {'a', "..... ..... .###. ....# .#### #...# .#### ....."},
    {'b', "#.... #.... #.##. ##..# #...# #...# ####. ....."},
    {'c', "..... ..... .###. #.... #.... #...# .###. ....."},
    {'d', "....# ....# .##.# #..## #...# #...# .#### ....."},
    {'e', "..... ..... .###. #...# ##### #.... .###. ....."},
    {'f', "..##. .#..# .#... ###.. .#... .#... .#... ....."},
    {'g', "..... ..... .#### #...# #...# .#### ....# .###."},
    {'h', "#.... #.... #.##. ##..# #...# #...# #...# ....."},
    {'i', "..#.. ..... .##.. ..#.. ..#.. ..#.. .###. ....."},
    {'j', "...#. ..... ..##. ...#. ...#. ...#. #..#. .##.."},
    {'k', "#.... #.... #..#. #.#.. ##... #.#.. #..#. ....."},
    {'l', ".##.. ..#.. ..#.. ..#.. ..#.. ..#.. .###. ....."},
    {'m', "..... ..... ##.#. #.#.# #.#.# #.#.# #.#.# ....."},
    {'n', "..... ..... #.##. ##..# #...# #...# #...# ....."},
    {'o', "..... ..... .###. #...# #...# #...# .###. ....."},
    {'p', "..... ..... ####. #...# #...# ####. #.... #...."},
    {'q', "..... ..... .#### #...# #...# .#### ....# ....#"},
    {'r', "..... ..... #.##. ##..# #.... #.... #.... ....."},
    {'s', "..... ..... .#### #.... .###. ....# ####. ....."},
    {'t', ".#... .#... ###.. .#... .#... .#..# ..##. ....."},
    {'u', "..... ..... #...# #...# #...# #..## .##.# ....."},
    {'v', "..... ..... #...# #...# #...# .#.#. ..#.. ....."},
    {'w', "..... ..... #...# #...# #.#.# #.#.# .#.#. ....."},
    {'x', "..... ..... #...# .#.#. ..#.. .#.#. #...# ....."},
    {'y', "..... ..... #...# #...# #...# .#### ....# .###."},
    {'z', "..... ..... ##### ...#. ..#.. .#... ##### ....."},
    {'{', "...## ..#.. ..#.. .#... ..#.. ..#.. ...## ....."},
    {'|', "..#.. ..#.. ..#.. ..#.. ..#.. ..#.. ..#.. ....."},
    {'}', "##... ..#.. ..#.. ...#. ..#.. ..#.. ##... ....."},
    {'~', "..... ..... .#... #.#.# ...#. ..... ..... ....."},
};

/* Digits of a 3 x 5 font for the labels of small cells. */
static const char *tiny_digits[10] = {
    "### #.# #.# #.# ###", ".#. ##. .#. .#. ###", "### ..# ### #.. ###", "### ..# .## ..# ###",
    "#.# #.# ### ..# ..#", "### #.. ### ..# ###", "### #.. ### #.# ###", "### ..# .#. .#. .#.",
    "### #.# ### #.# ###", "### #.# ### ..# ###",
};

static const char *glyph_rows(char c)
{
    for (size_t i = 0; i < sizeof font / sizeof font[0]; i++)
        if (font[i].c == c)
            return font[i].rows;
    return glyph_rows('?');
}

/* ---- a canvas of RGB pixels ---------------------------------------------- */

typedef struct rgb {
    unsigned char r, g, b;
} rgb;

static const rgb INK = {30, 30, 30}, AXIS = {90, 90, 90},
                 GRID = {175, 175, 175}, FAINT = {222, 222, 222}, LABEL = {120, 120, 120},
                 MARK = {0, 190, 60};

typedef struct canvas {
    long w, h;
    unsigned char *p;
} canvas;

static void put(canvas *c, long x, long y, rgb k)
{
    if (x < 0 || y < 0 || x >= c->w || y >= c->h)
        return;
    unsigned char *q = c->p + ((size_t)y * (size_t)c->w + (size_t)x) * 3;
    q[0] = k.r;
    q[1] = k.g;
    q[2] = k.b;
}

/* Filled rectangle [x0, x1) x [y0, y1). */
static void rect(canvas *c, long x0, long y0, long x1, long y1, rgb k)
{
    for (long y = y0; y < y1; y++)
        for (long x = x0; x < x1; x++)
            put(c, x, y, k);
}

static void hline(canvas *c, long x0, long x1, long y, rgb k) { rect(c, x0, y, x1, y + 1, k); }
static void vline(canvas *c, long x, long y0, long y1, rgb k) { rect(c, x, y0, x + 1, y1, k); }

/* Outline of a circle of radius rad (pixels), thick pixels wide. */
static void ring(canvas *c, double cx, double cy, double rad, int thick, rgb k)
{
    for (int t = 0; t < thick; t++) {
        double rr = rad + t;
        int steps = 16 + (int)(8.0 * rr);
        for (int i = 0; i < steps; i++) {
            double a = 2.0 * PI * i / steps;
            put(c, lround(cx + rr * cos(a)), lround(cy + rr * sin(a)), k);
        }
    }
}

/* Text: characters are 6 * sc pixels apart, 8 * sc high (top at y). */
static long text_width(const char *s, int sc)
{
    size_t n = strlen(s);
    return n ? ((long)n * 6 - 1) * sc : 0;
}

static void text(canvas *c, long x, long y, const char *s, int sc, rgb k)
{
    for (; *s; s++, x += 6 * sc) {
        const char *g = glyph_rows(*s);
        for (int row = 0; row < 8; row++)
            for (int col = 0; col < 5; col++)
                if (g[row * 6 + col] == '#')
                    rect(c, x + col * sc, y + row * sc, x + (col + 1) * sc, y + (row + 1) * sc, k);
    }
}

/* Digits in the 3 x 5 font, 4 pixels apart. */
static void tiny(canvas *c, long x, long y, const char *s, rgb k)
{
    for (; *s; s++, x += 4) {
        if (*s < '0' || *s > '9')
            continue;
        const char *g = tiny_digits[*s - '0'];
        for (int row = 0; row < 5; row++)
            for (int col = 0; col < 3; col++)
                if (g[row * 4 + col] == '#')
                    put(c, x + col, y + row, k);
    }
}

/* s made printable for the font (non-ASCII and control bytes: '?') and cut
 * to at most max_w pixels at scale sc, with "..." when cut. */
static void fit_text(char *out, size_t n, const char *s, int sc, long max_w)
{
    size_t k = 0;
    for (; s[k] && k + 1 < n; k++)
        out[k] = (s[k] >= 32 && s[k] < 127) ? s[k] : '?';
    out[k] = 0;
    if (text_width(out, sc) <= max_w)
        return;
    while (k > 0 && (out[k] = 0, text_width(out, sc) + text_width("...", sc) + 6 * sc > max_w))
        k--;
    out[k] = 0;
    if (k + 4 <= n)
        strcat(out, "...");
}

/* The density colour scale: t = 0 (one point) .. 1 (the densest square),
 * light blue through teal and amber to dark red; all visible on white. */
static rgb cmap(double t)
{
    static const double at[5] = {0.0, 0.3, 0.55, 0.8, 1.0};
    static const rgb col[5] = {{110, 160, 235}, {30, 160, 150}, {150, 190, 30}, {240, 150, 20},
                               {170, 20, 30}};
    if (!(t > 0.0))
        return col[0];
    if (t >= 1.0)
        return col[4];
    int i = 0;
    while (i < 3 && t > at[i + 1])
        i++;
    double u = (t - at[i]) / (at[i + 1] - at[i]);
    rgb k = {(unsigned char)lround(col[i].r + u * (col[i + 1].r - col[i].r)),
             (unsigned char)lround(col[i].g + u * (col[i + 1].g - col[i].g)),
             (unsigned char)lround(col[i].b + u * (col[i + 1].b - col[i].b))};
    return k;
}

/* ---- PNG (RGB, 8 bits, one filter byte 0 per row, deflated as it goes) ---- */

static void be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static int png_chunk(FILE *f, const char *type, const unsigned char *data, uint32_t n)
{
    unsigned char h[8];
    be32(h, n);
    memcpy(h + 4, type, 4);
    uLong crc = crc32(0L, Z_NULL, 0);
    crc = crc32(crc, h + 4, 4);
    if (n)
        crc = crc32(crc, data, n);
    unsigned char c[4];
    be32(c, (uint32_t)crc);
    return fwrite(h, 1, 8, f) == 8 && (!n || fwrite(data, 1, n, f) == n) && fwrite(c, 1, 4, f) == 4;
}

/* Write the PNG to a temporary file next to path and put it in place
 * (kvio_tmp_*): with force renamed over path, without it linked, so that a
 * file at path, even one made since the output check, is never replaced
 * (KVIO_E_EXISTS). Any failure leaves path as it was. Returns KVIO_OK or a
 * KVIO_E_* code with the message in err. */
static int write_png(const char *path, const canvas *cv, int force, char *err, size_t errlen)
{
    enum { OUT = 1 << 16 };
    unsigned char *out = malloc(OUT), *row = malloc((size_t)cv->w * 3 + 1);
    z_stream z;
    memset(&z, 0, sizeof z);
    if (!out || !row || deflateInit(&z, 9) != Z_OK) {
        free(out);
        free(row);
        snprintf(err, errlen, "%s: out of memory", path);
        return KVIO_E_NOMEM;
    }
    kvio_tmp t;
    int rc = kvio_tmp_open(&t, path, err, errlen);
    int ok = rc == KVIO_OK;
    FILE *f = t.f;
    errno = 0; /* a failure below without errno: "error" */
    if (ok) {
        static const unsigned char sig[8] = {137, 80, 78, 71, 13, 10, 26, 10};
        unsigned char ihdr[13];
        be32(ihdr, (uint32_t)cv->w);
        be32(ihdr + 4, (uint32_t)cv->h);
        ihdr[8] = 8;  /* bit depth */
        ihdr[9] = 2;  /* RGB */
        ihdr[10] = 0; /* deflate */
        ihdr[11] = 0; /* adaptive filtering */
        ihdr[12] = 0; /* no interlace */
        ok = fwrite(sig, 1, 8, f) == 8 && png_chunk(f, "IHDR", ihdr, 13);
    }
    for (long y = 0; ok && y <= cv->h; y++) {
        int flush = y == cv->h ? Z_FINISH : Z_NO_FLUSH;
        if (y < cv->h) {
            row[0] = 0; /* filter: none */
            memcpy(row + 1, cv->p + (size_t)y * (size_t)cv->w * 3, (size_t)cv->w * 3);
            z.next_in = row;
            z.avail_in = (uInt)((size_t)cv->w * 3 + 1);
        }
        int zr;
        do {
            z.next_out = out;
            z.avail_out = OUT;
            zr = deflate(&z, flush);
            if (zr == Z_STREAM_ERROR) {
                ok = 0;
                break;
            }
            uint32_t have = (uint32_t)(OUT - z.avail_out);
            if (have && !png_chunk(f, "IDAT", out, have))
                ok = 0;
        } while (ok && (z.avail_out == 0 || (flush == Z_FINISH && zr != Z_STREAM_END)));
    }
    if (ok)
        ok = png_chunk(f, "IEND", NULL, 0);
    if (rc == KVIO_OK) {
        if (ok) {
            rc = kvio_tmp_place(&t, path, force ? 0 : KVIO_WRITE_NO_REPLACE, err, errlen);
        } else {
            int e = errno;
            kvio_tmp_discard(&t);
            snprintf(err, errlen, "%s: cannot write: %s", path, e ? strerror(e) : "error");
            rc = KVIO_E_IO;
        }
    }
    deflateEnd(&z);
    free(out);
    free(row);
    return rc;
}

/* ---- the plot ------------------------------------------------------------ */

/* The plot area: P x P pixels at (x0, y0), data [lo, hi] on both axes,
 * y up. */
typedef struct view {
    long x0, y0, P;
    double lo, hi;
} view;

static double vx(const view *v, double x) { return v->x0 + (x - v->lo) / (v->hi - v->lo) * v->P; }
static double vy(const view *v, double y)
{
    return v->y0 + v->P - (y - v->lo) / (v->hi - v->lo) * v->P;
}

/* The data point of a stream point: quad [0, 1)^2, ngon the unit disc. */
static void data_xy(const fkvf_stream_info *si, const fkvf_point *p, double *x, double *y)
{
    if (si->profile == FKVF_PROFILE_QUAD) {
        *x = ldexp((double)p->x, -64);
        *y = ldexp((double)p->y, -64);
    } else {
        *x = p->fx;
        *y = p->fy;
    }
}

/* Pixel column / row inside the plot area (clamped) of a data point. */
static long pcol(const view *v, double x)
{
    double u = (x - v->lo) / (v->hi - v->lo) * v->P;
    long i = u > 0 ? (long)u : 0;
    return i >= v->P ? v->P - 1 : i;
}
static long prow(const view *v, double y)
{
    double u = (y - v->lo) / (v->hi - v->lo) * v->P;
    long i = u > 0 ? (long)u : 0;
    return v->P - 1 - (i >= v->P ? v->P - 1 : i);
}

static unsigned ndigits(uint64_t v)
{
    unsigned n = 1;
    while (v >= 10)
        v /= 10, n++;
    return n;
}

/* quad: the cells of the last symbols. A cell of depth j (2^j per axis)
 * holds the points whose last symbol has its top j base-4 digits fixed;
 * depth d = b/2 is one cell per symbol. The deepest depth whose cells are
 * at least 8 pixels and hold their label is drawn and labelled (with the
 * first symbol of the group), the next one faintly. Returns the depth. */
static unsigned quad_grid(canvas *cv, const view *v, fkvf_search *s, unsigned b, int sc,
                          unsigned *depth_out)
{
    unsigned d = b / 2, j = 0;
    for (unsigned t = d < 12 ? d : 12; t >= 1; t--) {
        double cell = (double)v->P / (double)(1u << t);
        uint64_t maxlab = (((uint64_t)1 << (2 * t)) - 1) << (2 * (d - t));
        if (cell >= 8.0 && (double)(ndigits(maxlab) * 4 + 2) <= cell) {
            j = t;
            break;
        }
    }
    *depth_out = j;
    if (!j)
        return 0;
    unsigned n = 1u << j;
    double cell = (double)v->P / n;
    /* faint lines one level deeper (the next digit: of the last symbol when
     * j < d, of the symbol before when j = d) */
    if (cell / 2 >= 4.0)
        for (unsigned i = 0; i < 2 * n; i++) {
            long p = v->x0 + lround(i * cell / 2);
            vline(cv, p, v->y0, v->y0 + v->P, FAINT);
            hline(cv, v->x0, v->x0 + v->P, v->y0 + lround(i * cell / 2), FAINT);
        }
    for (unsigned i = 1; i < n; i++) {
        vline(cv, v->x0 + lround(i * cell), v->y0, v->y0 + v->P, GRID);
        hline(cv, v->x0, v->x0 + v->P, v->y0 + lround(i * cell), GRID);
    }
    /* labels: the group's first symbol, at its cell's top-left corner (the
     * query point of that one symbol is the cell's lower-left corner), in
     * the largest font that fits */
    uint64_t maxlab = (((uint64_t)1 << (2 * j)) - 1) << (2 * (d - j));
    long lw = (long)ndigits(maxlab);
    int fs = 0; /* 0: the 3 x 5 digits; else the text font at this scale */
    for (int k = sc; k >= 1 && !fs; k--)
        if ((double)((lw * 6 - 1) * k + 4) <= cell && (double)(8 * k + 4) <= cell / 2)
            fs = k;
    for (uint64_t g = 0; g < ((uint64_t)1 << (2 * j)); g++) {
        uint32_t c = (uint32_t)(g << (2 * (d - j)));
        fkvf_point qp;
        if (fkvf_search_query_point(s, &c, 1, &qp) != FKVF_OK)
            continue;
        double x = ldexp((double)qp.x, -64), y = ldexp((double)qp.y, -64);
        char lab[16];
        snprintf(lab, sizeof lab, "%" PRIu32, c);
        long px = lround(vx(v, x)) + 2, py = lround(vy(v, y + 1.0 / n)) + 2;
        if (fs)
            text(cv, px, py, lab, fs, LABEL);
        else
            tiny(cv, px, py, lab, LABEL);
    }
    return j;
}

/* ngon: the disc of each last symbol (centre (1 - r) V(c), radius r: the
 * query point of c alone) when it is at least 3 pixels, the discs of the
 * last two symbols faintly for small alphabets, and labels outside the
 * unit circle for every m-th symbol that fits. Returns m (0: none). */
static unsigned ngon_grid(canvas *cv, const view *v, fkvf_search *s, const fkvf_stream_info *si,
                          int sc)
{
    uint32_t N = si->alphabet;
    double r = si->r, ppu = (double)v->P / (v->hi - v->lo); /* pixels per unit */
    ring(cv, vx(v, 0), vy(v, 0), ppu, 1, FAINT);
    if (N <= 16 && r * r * ppu >= 3.0)
        for (uint32_t a = 0; a < N; a++)
            for (uint32_t b2 = 0; b2 < N; b2++) {
                uint32_t q[2] = {a, b2};
                fkvf_point p;
                if (fkvf_search_query_point(s, q, 2, &p) == FKVF_OK)
                    ring(cv, vx(v, p.fx), vy(v, p.fy), r * r * ppu, 1, FAINT);
            }
    if (N <= 4096 && r * ppu >= 3.0)
        for (uint32_t c = 0; c < N; c++) {
            fkvf_point p;
            if (fkvf_search_query_point(s, &c, 1, &p) == FKVF_OK)
                ring(cv, vx(v, p.fx), vy(v, p.fy), r * ppu, 1, GRID);
        }
    /* labels on a circle of radius 1 + gap: every m-th symbol, m a power of
     * two large enough that neighbouring labels do not touch */
    double lr = 1.0 + 9.0 * sc / ppu;
    double need = (double)(ndigits(N - 1) * 6 * sc + 4 * sc);
    double room = 2.0 * PI * lr * ppu / N;
    unsigned m = 1;
    while (m < N && room * m < need)
        m *= 2;
    for (uint32_t c = 0; c < N; c += m) {
        fkvf_point p;
        if (fkvf_search_query_point(s, &c, 1, &p) != FKVF_OK)
            continue;
        double ux = p.fx / (1.0 - r), uy = p.fy / (1.0 - r); /* V(c) */
        char lab[16];
        snprintf(lab, sizeof lab, "%" PRIu32, c);
        double cx = vx(v, ux * lr), cy = vy(v, uy * lr);
        text(cv, lround(cx - text_width(lab, sc) / 2.0), lround(cy - 3.5 * sc), lab, sc, LABEL);
        /* a tick from the circle towards the label */
        for (int k = 0; k <= 3 * sc; k++)
            put(cv, lround(vx(v, ux) + ux * k), lround(vy(v, uy) - uy * k), AXIS);
    }
    return m;
}

/* A non-empty density square: its count and index (row-major). */
typedef struct sq_ent {
    uint32_t count;
    size_t at;
} sq_ent;

static int cmp_sq(const void *a, const void *b)
{
    const sq_ent *x = a, *y = b;
    if (x->count != y->count)
        return x->count < y->count ? -1 : 1;
    return x->at < y->at ? -1 : x->at > y->at;
}

typedef struct plot_opts {
    const char *path, *stream, *out, *hl_tokens, *hl_symbols;
    uint64_t size;
    int force, json;
} plot_opts;


static int ends_png(const char *s)
{
    size_t n = strlen(s);
    if (n < 5 || s[n - 5] == '/')
        return 0;
    const char *e = s + n - 4;
    return e[0] == '.' && (e[1] | 32) == 'p' && (e[2] | 32) == 'n' && (e[3] | 32) == 'g';
}

/* The matched positions of the highlight query in the plotted stream (the
 * last position of each match), malloc'd in *out (*n); *outside counts
 * token matches at cache positions the plotted index stream does not hold.
 * Returns CLI_OK or an exit status after an error line. */
static int highlight_positions(fkvf_reader *r, const plot_opts *o, size_t idx, uint64_t id,
                               const fkvf_stream_info *si, const uint32_t *q, size_t qn,
                               uint64_t **out, uint64_t *n, uint64_t *outside)
{
    *out = NULL;
    *n = *outside = 0;
    int tok = o->hl_tokens != NULL;
    size_t qidx = idx;
    if (tok && fkvf_reader_stream_find(r, FKVF_STREAM_ID_TOKENS, &qidx) != FKVF_OK)
        return cli_fail(CLI_INVALID, FKVF_E_NOT_FOUND, o->path,
                        "the archive has no token stream (--highlight-tokens)");
    fkvf_search *s = NULL;
    uint64_t *pos = NULL, nf = 0;
    int rc = fkvf_search_open(&s, r, qidx, 0, NULL);
    if (!rc)
        rc = fkvf_search_suffix(s, q, qn, NULL, 0, &nf);
    if (!rc && !(pos = malloc((size_t)(nf ? nf : 1) * sizeof *pos)))
        rc = FKVF_E_NOMEM;
    if (!rc)
        rc = fkvf_search_suffix(s, q, qn, pos, (size_t)nf, &nf);
    if (rc) {
        int ex = cli_fail_search(rc, s, o->path, "");
        fkvf_search_free(s);
        free(pos);
        return ex;
    }
    fkvf_search_free(s);
    uint64_t k = 0, S = 0;
    if (tok && (id >> 56) == FKVF_STREAM_KIND_INDEX) {
        fkvf_desc d;
        if (fkvf_reader_desc(r, &d) == FKVF_OK)
            S = d.n_sinks;
    }
    for (uint64_t i = 0; i < nf; i++) {
        uint64_t t = pos[i];
        if (tok && qidx != idx) { /* cache position -> index stream position */
            if (t < S || t - S >= si->length) {
                (*outside)++;
                continue;
            }
            t -= S;
        }
        pos[k++] = t;
    }
    *out = pos;
    *n = k;
    return CLI_OK;
}

/* A plot being drawn: the stream, the highlighted query, the layout (text
 * scale sc, margins, the plot area of P x P pixels in density squares of
 * B x B) and the canvas. */
typedef struct plot_state {
    fkvf_reader *r;
    fkvf_search *s;
    uint64_t id;
    size_t idx;
    char nm[64];            /* the stream's name */
    fkvf_stream_info si;
    int quad;
    const char *hl;         /* the highlight's list, or NULL */
    uint32_t *q;            /* and its symbols */
    size_t qn;
    uint64_t *hpos, nh, outside; /* the matches; those at positions not in the stream */
    long P, ML, MT, MR, MB, B, nb;
    int sc;
    view v;
    canvas cv;
    uint32_t *cnt;          /* points per density square */
    uint32_t mx;            /* the densest square's */
    double lm;              /* log(mx), or 1 */
    unsigned depth, every;  /* what the grid shows (quad depth, ngon label step) */
} plot_state;

static void plot_free(plot_state *st)
{
    fkvf_search_free(st->s);
    free(st->cv.p);
    free(st->cnt);
    free(st->hpos);
    free(st->q);
    fkvf_reader_free(st->r);
}

/* The stream and the highlight's matches. Returns the exit status. */
static int plot_open(const plot_opts *o, plot_state *st)
{
    if (!cli_parse_stream_name(o->stream, &st->id))
        return cli_usage("bad stream name '%s' (tokens or Lx.Hy.K|V.stage)", o->stream);
    uint64_t id = st->id;
    st->hl = o->hl_tokens ? o->hl_tokens : o->hl_symbols;
    if (st->hl && !cli_parse_list(st->hl, &st->q, &st->qn))
        return cli_usage("bad symbol list '%s' (comma-separated integers)", st->hl);
    int ret = cli_open_archive(&st->r, o->path);
    if (ret != CLI_OK)
        return ret;
    cli_stream_name(id, st->nm, sizeof st->nm);
    if (fkvf_reader_stream_find(st->r, id, &st->idx) != FKVF_OK)
        return cli_fail(CLI_INVALID, FKVF_E_NOT_FOUND, o->path, "no stream %s in the archive%s",
                        st->nm,
                        id == FKVF_STREAM_ID_TOKENS ? " (it was packed without token ids)" : "");
    fkvf_reader_stream_info(st->r, st->idx, &st->si);
    st->quad = st->si.profile == FKVF_PROFILE_QUAD;
    if (o->hl_symbols && !fkvf_cli_query_in_alphabet(st->r, o->path, st->idx, st->nm,
                                                     id == FKVF_STREAM_ID_TOKENS, st->q, st->qn))
        return CLI_USAGE;
    if (st->hl && (ret = highlight_positions(st->r, o, st->idx, id, &st->si, st->q, st->qn,
                                             &st->hpos, &st->nh, &st->outside)) != CLI_OK)
        return ret;
    int rc = fkvf_search_open(&st->s, st->r, st->idx, 0, NULL);
    if (rc)
        return cli_fail_search(rc, st->s, o->path, "");
    return CLI_OK;
}

/* Layout: text scale, margins, the plot area; the canvas (white) and the
 * density squares allocated. Returns the exit status. */
static int plot_layout(const plot_opts *o, plot_state *st)
{
    long P = st->P = (long)o->size;
    int sc = st->sc = P >= 384 ? 2 : 1;
    st->ML = 42 * sc, st->MT = 32 * sc, st->MR = 104 * sc, st->MB = 34 * sc;
    st->cv.w = st->ML + P + st->MR;
    st->cv.h = st->MT + P + st->MB;
    view v = {st->ML, st->MT, P, st->quad ? 0.0 : -1.25, st->quad ? 1.0 : 1.25};
    st->v = v;
    st->B = P / 128 > 1 ? P / 128 : 1; /* density squares of B x B pixels */
    st->nb = (P + st->B - 1) / st->B;
    st->cv.p = malloc((size_t)st->cv.w * (size_t)st->cv.h * 3);
    st->cnt = calloc((size_t)st->nb * (size_t)st->nb, sizeof *st->cnt);
    if (!st->cv.p || !st->cnt)
        return cli_fail(CLI_USAGE, FKVF_E_NOMEM, NULL, "out of memory");
    memset(st->cv.p, 255, (size_t)st->cv.w * (size_t)st->cv.h * 3);
    return CLI_OK;
}

/* Every point of the stream counted in its density square. Returns the
 * exit status. */
static int plot_density(const plot_opts *o, plot_state *st)
{
    st->mx = 0;
    for (uint64_t t = 0; t < st->si.length; t++) {
        fkvf_point p;
        int rc = fkvf_reader_stream_point(st->r, st->idx, t, &p);
        if (rc)
            return cli_fail_reader(rc, st->r, o->path, "");
        double x, y;
        data_xy(&st->si, &p, &x, &y);
        uint32_t *c = &st->cnt[(size_t)(prow(&st->v, y) / st->B) * (size_t)st->nb +
                               (size_t)(pcol(&st->v, x) / st->B)];
        if (*c < UINT32_MAX)
            (*c)++;
        if (*c > st->mx)
            st->mx = *c;
    }
    st->lm = st->mx > 1 ? log((double)st->mx) : 1.0;
    return CLI_OK;
}

/* The grid and its labels, then the points: each density square in its
 * colour, as a dot of at least 3 text pixels so that single points are
 * visible, the denser drawn later (on top). Returns the exit status. */
static int plot_points(plot_state *st)
{
    canvas *cv = &st->cv;
    long B = st->B, nb = st->nb, ML = st->ML, MT = st->MT, P = st->P;
    int sc = st->sc;
    /* grid and its labels, under the points */
    st->depth = 0;
    st->every = 0;
    if (st->quad)
        quad_grid(cv, &st->v, st->s, st->si.symbol_bits, sc, &st->depth);
    else
        st->every = ngon_grid(cv, &st->v, st->s, &st->si, sc);
    size_t nz = 0;
    for (size_t i = 0; i < (size_t)nb * (size_t)nb; i++)
        nz += st->cnt[i] != 0;
    sq_ent *order = malloc((nz ? nz : 1) * sizeof *order);
    if (!order)
        return cli_fail(CLI_USAGE, FKVF_E_NOMEM, NULL, "out of memory");
    nz = 0;
    for (size_t i = 0; i < (size_t)nb * (size_t)nb; i++)
        if (st->cnt[i])
            order[nz].count = st->cnt[i], order[nz++].at = i;
    qsort(order, nz, sizeof *order, cmp_sq);
    long dot = B > 3 * sc ? B : 3 * sc;
    for (size_t i = 0; i < nz; i++) {
        long bx = (long)(order[i].at % (size_t)nb), by = (long)(order[i].at / (size_t)nb);
        long cx0 = ML + bx * B + B / 2 - dot / 2, cy0 = MT + by * B + B / 2 - dot / 2;
        long x0 = cx0 < ML ? ML : cx0, y0 = cy0 < MT ? MT : cy0;
        long x1 = cx0 + dot < ML + P ? cx0 + dot : ML + P, y1 = cy0 + dot < MT + P ? cy0 + dot : MT + P;
        rect(cv, x0, y0, x1, y1,
             cmap(st->mx > 1 ? log((double)order[i].count) / st->lm : 0.0));
    }
    free(order);
    return CLI_OK;
}

/* The query's cell (quad) or disc (ngon). */
static void plot_query_mark(plot_state *st)
{
    fkvf_point qp;
    if (fkvf_search_query_point(st->s, st->q, st->qn, &qp) != FKVF_OK)
        return;
    canvas *cv = &st->cv;
    const view *v = &st->v;
    fkvf_search_status inf;
    fkvf_search_info(st->s, &inf);
    size_t m = st->qn < inf.key_symbols ? st->qn : inf.key_symbols;
    if (st->quad) {
        double side = ldexp(1.0, -(int)(m * st->si.symbol_bits / 2));
        double x = ldexp((double)qp.x, -64), y = ldexp((double)qp.y, -64);
        long x0 = lround(vx(v, x)), x1 = lround(vx(v, x + side));
        long y1 = lround(vy(v, y)), y0 = lround(vy(v, y + side));
        if (x1 - x0 >= 3)
            for (int k = 0; k < 2; k++) {
                hline(cv, x0 - k, x1 + k + 1, y0 - k, MARK);
                hline(cv, x0 - k, x1 + k + 1, y1 + k, MARK);
                vline(cv, x0 - k, y0 - k, y1 + k + 1, MARK);
                vline(cv, x1 + k, y0 - k, y1 + k + 1, MARK);
            }
    } else {
        double rad = pow(st->si.r, (double)m) * (double)st->P / (v->hi - v->lo);
        if (rad >= 3.0)
            ring(cv, vx(v, qp.fx), vy(v, qp.fy), rad, 2, MARK);
    }
}

/* The query: its cell or disc, and a ring around each match. */
static void plot_highlight(const plot_opts *o, plot_state *st)
{
    if (!st->hl)
        return;
    if (!o->hl_tokens || st->id == FKVF_STREAM_ID_TOKENS)
        plot_query_mark(st);
    for (uint64_t i = 0; i < st->nh && i < 100000; i++) {
        fkvf_point p;
        if (fkvf_reader_stream_point(st->r, st->idx, st->hpos[i], &p) != FKVF_OK)
            continue;
        double x, y;
        data_xy(&st->si, &p, &x, &y);
        ring(&st->cv, st->ML + pcol(&st->v, x) + 0.5, st->MT + prow(&st->v, y) + 0.5,
             2.0 * st->sc + st->B / 2.0, 2, MARK);
    }
}

/* Frame, ticks and their labels, axis names; the title (archive, stream,
 * points; then what the grid shows). */
static void plot_axes(const plot_opts *o, plot_state *st)
{
    canvas *cv = &st->cv;
    const view *v = &st->v;
    long ML = st->ML, MT = st->MT, P = st->P;
    int sc = st->sc;
    hline(cv, ML - 1, ML + P + 1, MT - 1, AXIS);
    hline(cv, ML - 1, ML + P + 1, MT + P, AXIS);
    vline(cv, ML - 1, MT - 1, MT + P + 1, AXIS);
    vline(cv, ML + P, MT - 1, MT + P + 1, AXIS);
    static const double qt[5] = {0, 0.25, 0.5, 0.75, 1}, nt[5] = {-1, -0.5, 0, 0.5, 1};
    /* five ticks, or three where five labels would not fit */
    int tstep = P >= 160 * sc ? 1 : 2;
    for (int i = 0; i < 5; i += tstep) {
        double t = st->quad ? qt[i] : nt[i];
        char lab[16];
        snprintf(lab, sizeof lab, "%g", t);
        long px = lround(vx(v, t)), py = lround(vy(v, t));
        if (px >= ML + P)
            px = ML + P;
        if (py <= MT - 1)
            py = MT - 1;
        vline(cv, px, MT + P, MT + P + 4 * sc, AXIS);
        hline(cv, ML - 1 - 4 * sc, ML - 1, py, AXIS);
        text(cv, px - text_width(lab, sc) / 2, MT + P + 6 * sc, lab, sc, INK);
        text(cv, ML - 6 * sc - text_width(lab, sc), py - 4 * sc, lab, sc, INK);
    }
    text(cv, ML + P / 2 - 2 * sc, MT + P + 17 * sc, "x", sc, INK);
    text(cv, 3 * sc, MT + P / 2 - 4 * sc, "y", sc, INK);

    /* title: archive, stream, points; then what the grid shows */
    const fkvf_stream_info *si = &st->si;
    unsigned depth = st->depth, d = si->symbol_bits / 2;
    char t1[256], t2[256], line[256];
    snprintf(line, sizeof line, "%s  %s  %" PRIu64 " point%s", cli_base_name(o->path), st->nm,
             si->length, si->length == 1 ? "" : "s");
    fit_text(t1, sizeof t1, line, sc, cv->w - 8 * sc);
    text(cv, 4 * sc, 3 * sc, t1, sc, INK);
    if (st->quad && depth == d)
        snprintf(line, sizeof line, "quad, %u-bit: one cell per last symbol (%u x %u)",
                 si->symbol_bits, 1u << depth, 1u << depth);
    else if (st->quad && depth)
        snprintf(line, sizeof line, "quad, %u-bit: one cell per %" PRIu64 " last symbols, label = the first",
                 si->symbol_bits, (uint64_t)1 << (2 * (d - depth)));
    else if (st->quad)
        snprintf(line, sizeof line, "quad, %u-bit symbols", si->symbol_bits);
    else
        snprintf(line, sizeof line, "ngon, N = %" PRIu32 ", r = %.3g: one disc per last symbol",
                 si->alphabet, si->r);
    fit_text(t2, sizeof t2, line, sc, cv->w - 8 * sc);
    text(cv, 4 * sc, 14 * sc, t2, sc, AXIS);
}

/* Legend: the colour bar's ticks, 1, 10, 100, ... below the maximum, and
 * the maximum (bar from bt, bh pixels high, at lx, bw wide). */
static void plot_bar_ticks(plot_state *st, long lx, long bt, long bh, long bw)
{
    canvas *cv = &st->cv;
    uint32_t mx = st->mx;
    double lm = st->lm;
    int sc = st->sc;
    for (uint64_t tv = 1; mx >= 1; tv *= 10) {
        int last = tv >= mx;
        uint64_t val = last ? mx : tv;
        double f = mx > 1 ? log((double)val) / lm : 0.0;
        long y = mx > 1 ? bt + lround((1.0 - f) * (double)(bh - 1)) : bt + bh / 2;
        char lab[24];
        snprintf(lab, sizeof lab, "%" PRIu64, val);
        hline(cv, lx + bw, lx + bw + 3 * sc, y, AXIS);
        /* keep the maximum's label clear of the one below it */
        text(cv, lx + bw + 5 * sc, y - 4 * sc, lab, sc, INK);
        if (last || tv > UINT64_MAX / 10)
            break;
        if (tv * 10 < mx && mx > 1 && (log((double)mx) - log((double)tv * 10)) / lm * bh < 10 * sc)
            tv *= 10; /* the next power of ten would overlap the maximum */
    }
    if (!mx)
        text(cv, lx + bw + 5 * sc, bt - 4 * sc, "none", sc, INK);
}

/* Legend: the colour bar (log scale), then the highlight and the ngon
 * label step. */
static void plot_legend(plot_state *st)
{
    canvas *cv = &st->cv;
    int sc = st->sc;
    long B = st->B, P = st->P;
    uint32_t mx = st->mx;
    long lx = st->ML + P + 10 * sc, ly = st->MT;
    char sq[64];
    if (B == 1)
        snprintf(sq, sizeof sq, "per pixel");
    else
        snprintf(sq, sizeof sq, "per %ldx%ld px", B, B);
    text(cv, lx, ly, "points", sc, INK);
    text(cv, lx, ly + 10 * sc, sq, sc, INK);
    long bt = ly + 24 * sc, bh = P / 2 > 40 * sc ? P / 2 : 40 * sc, bw = 12 * sc;
    if (mx <= 1)
        bh = 12 * sc; /* one colour: a swatch, not a scale */
    for (long y = 0; y < bh; y++)
        rect(cv, lx, bt + y, lx + bw, bt + y + 1,
             cmap(mx > 1 ? 1.0 - (double)y / (double)(bh - 1) : 0.0));
    hline(cv, lx - 1, lx + bw + 1, bt - 1, AXIS);
    hline(cv, lx - 1, lx + bw + 1, bt + bh, AXIS);
    vline(cv, lx - 1, bt - 1, bt + bh + 1, AXIS);
    vline(cv, lx + bw, bt - 1, bt + bh + 1, AXIS);
    plot_bar_ticks(st, lx, bt, bh, bw);
    long hy = bt + bh + 14 * sc;
    if (st->hl) {
        ring(cv, lx + 6 * sc, hy + 4 * sc, 2.0 * sc + B / 2.0, 2, MARK);
        char hl1[48];
        snprintf(hl1, sizeof hl1, "%" PRIu64 " match%s", st->nh, st->nh == 1 ? "" : "es");
        text(cv, lx + 16 * sc, hy, hl1, sc, INK);
        text(cv, lx, hy + 11 * sc, "of the query", sc, INK);
        if (st->outside) {
            snprintf(hl1, sizeof hl1, "(+%" PRIu64 " exact)", st->outside);
            text(cv, lx, hy + 22 * sc, hl1, sc, INK);
        }
        hy += 36 * sc;
    }
    if (!st->quad && st->every > 1) {
        char e[32];
        snprintf(e, sizeof e, "every %u%s", st->every, st->every == 2 ? "nd" : "th");
        text(cv, lx, hy, "labels:", sc, AXIS);
        text(cv, lx, hy + 11 * sc, e, sc, AXIS);
    }
}

static void plot_print(const plot_opts *o, const plot_state *st)
{
    const canvas *cv = &st->cv;
    long P = st->P, B = st->B;
    uint64_t n = st->si.length;
    if (o->json) {
        printf("{\"archive\":");
        cli_json_cstr(stdout, o->path);
        printf(",\"stream\":\"%s\",\"out\":", st->nm);
        cli_json_cstr(stdout, o->out);
        printf(",\"width\":%ld,\"height\":%ld,\"plot\":{\"x\":%ld,\"y\":%ld,\"size\":%ld}"
               ",\"points\":%" PRIu64 ",\"densest\":%" PRIu32 ",\"square\":%ld",
               cv->w, cv->h, st->ML, st->MT, P, n, st->mx, B);
        if (st->hl)
            printf(",\"matches\":%" PRIu64 ",\"outside\":%" PRIu64, st->nh, st->outside);
        else
            printf(",\"matches\":null");
        printf("}\n");
        return;
    }
    cli_text_cstr(stdout, o->out); /* a name for the terminal: escaped */
    printf(": %ldx%ld pixels (plot %ldx%ld at %ld,%ld), %" PRIu64
           " point%s of %s, densest square %" PRIu32 " (%ldx%ld px)",
           cv->w, cv->h, P, P, st->ML, st->MT, n, n == 1 ? "" : "s", st->nm, st->mx, B, B);
    if (st->hl)
        printf(", %" PRIu64 " match%s highlighted", st->nh, st->nh == 1 ? "" : "es");
    if (st->outside)
        printf(" (%" PRIu64 " more at cache positions the stream does not hold)", st->outside);
    printf("\n");
}

static int plot_run(const plot_opts *o, plot_state *st)
{
    int ret;
    if ((ret = plot_open(o, st)) != CLI_OK || (ret = plot_layout(o, st)) != CLI_OK ||
        (ret = plot_density(o, st)) != CLI_OK || (ret = plot_points(st)) != CLI_OK)
        return ret;
    plot_highlight(o, st);
    plot_axes(o, st);
    plot_legend(st);
    char werr[1024];
    int rc = write_png(o->out, &st->cv, o->force, werr, sizeof werr);
    if (rc != KVIO_OK)
        return cli_fail_kvio(rc, o->out, werr); /* exists: 1, I/O: 2 */
    plot_print(o, st);
    return CLI_OK;
}

static int plot(const plot_opts *o)
{
    plot_state st;
    memset(&st, 0, sizeof st);
    int ret = plot_run(o, &st);
    plot_free(&st);
    return ret;
}

/* Returns -1 to go on, else the exit status (help printed, usage error). */
static int plot_parse(int argc, char **argv, plot_opts *o)
{
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(plot_help, stdout);
            return CLI_OK;
        }
    plot_opts dflt = {NULL, NULL, NULL, NULL, NULL, 512, 0, 0};
    *o = dflt;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--force"))
            o->force = 1;
        else if (!strcmp(a, "--json"))
            o->json = 1;
        else if (!strcmp(a, "--stream") && v)
            o->stream = argv[++i];
        else if (!strcmp(a, "-o") && v)
            o->out = argv[++i];
        else if (!strcmp(a, "--size") && v && !cli_parse_u64(v, 4096, &o->size) && o->size >= 64)
            i++;
        else if (!strcmp(a, "--highlight-tokens") && v && !o->hl_tokens)
            o->hl_tokens = argv[++i];
        else if (!strcmp(a, "--highlight-symbols") && v && !o->hl_symbols)
            o->hl_symbols = argv[++i];
        else if (a[0] != '-' && !o->path)
            o->path = a;
        else
            return cli_usage("bad argument '%s' (see fkvf plot --help)", a);
    }
    if (!o->path || !o->stream || !o->out)
        return cli_usage("give ARCHIVE, --stream NAME and -o FILE.png (see fkvf plot --help)");
    if (o->hl_tokens && o->hl_symbols)
        return cli_usage("give --highlight-tokens or --highlight-symbols, not both");
    if (!ends_png(o->out))
        return cli_usage("%s: the output is a PNG image: give a name ending in .png", o->out);
    return -1;
}

int fkvf_cli_plot(int argc, char **argv)
{
    plot_opts o;
    int ret = plot_parse(argc, argv, &o);
    if (ret >= 0)
        return ret;
    if ((ret = cli_check_output(o.out, &o.path, 1, o.force)) != CLI_OK)
        return ret;
    return plot(&o);
}
