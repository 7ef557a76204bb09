/* The container tests' shared model and helpers (test_container_*.c):
 * the archive model (what a test writes and expects to read back), the
 * checks that read an archive back against it, temporary files, and the
 * hand-crafting of files byte by byte (format helpers + hash). */
#ifndef FKVF_CONTAINER_MODEL_H
#define FKVF_CONTAINER_MODEL_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

#include "fkvf.h"
#include "format/format.h"
#include "testutil.h"

/* rc must be `want`; print the handle's message otherwise */
#define RC_R(r, expr, want)                                                                \
    do {                                                                                   \
        int rc_ = (expr);                                                                  \
        if (rc_ != (want))                                                                 \
            ck_abort_msg("%s:%d: %s -> %s, want %s (%s)", __FILE__, __LINE__, #expr,       \
                         fkvf_error_name(rc_), fkvf_error_name(want),                      \
                         fkvf_reader_message(r));                                          \
    } while (0)
#define RC_W(w, expr, want)                                                                \
    do {                                                                                   \
        int rc_ = (expr);                                                                  \
        if (rc_ != (want))                                                                 \
            ck_abort_msg("%s:%d: %s -> %s, want %s (%s)", __FILE__, __LINE__, #expr,       \
                         fkvf_error_name(rc_), fkvf_error_name(want),                      \
                         fkvf_writer_message(w));                                          \
    } while (0)
#define OK_R(r, expr) RC_R(r, expr, FKVF_OK)
#define OK_W(w, expr) RC_W(w, expr, FKVF_OK)

/* ==== the archive model: what a test writes and expects to read back ======== */

#define MAX_STREAMS 80

/* One stream as the reader serves it: an index stream (its group's codec)
 * or the token stream. */
typedef struct tstream {
    uint64_t id;
    fkvf_stream_spec spec; /* the codec of its group */
    uint32_t *sym;
    size_t n;
} tstream;

typedef struct model {
    fkvf_writer_options opts;
    fkvf_desc desc;
    uint64_t n_positions, n_archived;
    size_t row_bytes;
    uint8_t *rows;       /* n_positions rows (archived positions' rows are not written) */
    int meta;            /* write the standard metadata set */
    unsigned exac_flags; /* extra section flags for EXAC (FKVF_SECTION_DEFLATE) */
    int split_tail;      /* tail exact rows in two EXAC sections */
    int extra;           /* add unknown optional sections XTRA (and XTRZ deflated) */
    uint8_t extra_data[300];
    /* the index streams in canonical order (spec 11.2), then the token stream */
    tstream st[MAX_STREAMS];
    size_t n_st;
    int has_index, has_tokens;
    fkvf_stream_spec ispec, tspec; /* the codecs of the two groups */
    int codes_by_stream; /* index codes given one array per stream (pos_stride 1) */
    /* embedded codebook (spec 13), written right after DESC */
    int cb;
    unsigned cb_flags; /* extra section flags for CBK1 (FKVF_SECTION_DEFLATE) */
    fkvf_codebook_shape cbs;
    uint8_t *cb_tables; /* fkvf_codebook_size(&cbs) - 64 bytes */
    size_t cb_tables_size;
    /* cb == 2: a CBRF reference instead (spec 13.5) */
    uint8_t cb_hash[16];
    const char *cb_name;
} model;

#define XTRA FKVF_FOURCC('X', 'T', 'R', 'A')
#define XTRZ FKVF_FOURCC('X', 'T', 'R', 'Z')
fkvf_stream_spec mkspec(fkvf_profile profile, unsigned bits, uint32_t alphabet);

/* `n` symbols below `range`, the extremes of the range included. */
uint32_t *make_symbols(size_t n, uint64_t range, int quad, uint64_t seed);
uint64_t spec_range(const fkvf_stream_spec *s);
size_t model_n_index(const model *m);

/* The index group (spec 11.2): one stream per (layer, head, K|V, stage) of
 * the codebook, in canonical order, each of n_archived symbols below the
 * codebook size k. Call before model_tokens. */
void model_index(model *m, fkvf_profile profile, unsigned bits, uint32_t alphabet,
                 uint64_t seed);

/* Explicit ngon r and L for the index group. */
void model_index_rl(model *m, double r, uint32_t span);

/* The token stream: n_positions symbols over the codec's whole alphabet. */
void model_tokens(model *m, fkvf_profile profile, unsigned bits, uint32_t alphabet,
                  uint64_t seed);
tstream *model_token_stream(model *m);
size_t model_stream_of(const model *m, uint64_t id);

/* Finite f16 / f32 values, from a palette of 16 so that tables deflate. */
extern const uint16_t f16_palette[16];

extern const uint32_t f32_palette[16];
uint8_t *make_tables(const fkvf_codebook_shape *s, uint64_t seed, size_t *size);
void shape_for(fkvf_codebook_shape *s, const fkvf_desc *d, uint32_t k, uint8_t ks,
               uint8_t vs, fkvf_dtype dtype, int pooled);

/* An embedded codebook matching the descriptor; set it before the streams. */
void model_codebook(model *m, uint32_t k, uint8_t ks, uint8_t vs, fkvf_dtype dtype,
                    int pooled, uint64_t seed);
void model_rows(model *m, uint64_t seed);
void model_free(model *m);

extern const uint8_t weights16[16];

/* The small archive of the damage tests: DESC, CBK1 (k, one key and one
 * value stage, per head), META, EXAC (three sections), VTXS, the index group
 * (2 layers x 2 heads x 2 stages = 8 streams of 5 symbols, codec `ix`) and
 * the token stream (quad 32 bits, 10 symbols).
 * S = 2, n_positions = 10, n_archived = 5: exact rows 0..1 and 7..9. */
void model_small_codec(model *m, uint32_t k, fkvf_profile profile, unsigned bits,
                       uint32_t alphabet);

/* ngon index streams with N = k (k = 16: one span of 5 symbols each) */
void model_small_k(model *m, uint32_t k);
void model_small(model *m);

/* Many blocks, deflated exact rows and codebook, extra sections. The
 * codebook is pooled with k = 4096, so the 12-bit quad index streams use
 * their whole alphabet; 32 index streams (4 layers x 4 heads x one key and
 * one value stage) of 300 symbols in one segment over 64-byte blocks, and a
 * quad 32 token stream. */
void model_many(model *m, fkvf_dtype dtype);

/* f32, no RoPE, no ids, every position exact (n_positions < n_sinks). */
void model_all_exact(model *m);

/* the standard metadata set */
extern const uint8_t blob5[5];

#define N_META 10
int write_meta(fkvf_writer *w);
uint64_t model_sinks(const model *m);

/* Symbols [first, first + count) of the model's index streams as uint16
 * codes, in the layout the model asks for; *ps, *cs: the strides. */
uint16_t *model_codes(const model *m, uint64_t first, uint64_t count, size_t *ps,
                      size_t *cs);

/* The index segment [first, first + count) of the model's streams. */
int write_index_segment(const model *m, fkvf_writer *w, uint64_t first, uint64_t count);

/* Everything up to and including finish; the first error. The index
 * segment has as many symbols as the first index stream of the model. */
int write_model(const model *m, fkvf_writer *w);

/* Write a model to memory. */
void build(const model *m, tu_buf *out);

/* The model's index and token segments (one each). */
int write_streams(const model *m, fkvf_writer *w);
size_t model_n_sections(const model *m);

/* Data bytes of `n` symbols of one stream of this codec (spec 11.3). */
uint64_t stream_bytes_of(const fkvf_stream_spec *s, uint64_t n);

/* Size of a STRM section (spec 11.3) of n_streams streams of n symbols. */
uint64_t strm_size_of(const fkvf_stream_spec *s, uint64_t n, uint64_t n_streams,
                      uint32_t block_size);

/* ==== reading back ================================================================ */
size_t find_section(fkvf_reader *r, uint32_t type, uint64_t key, fkvf_section_info *out);
void check_desc(fkvf_reader *r, const fkvf_desc *want);
void check_meta_entry(const fkvf_meta_entry *e, const char *key, fkvf_meta_type type,
                      const void *value, size_t value_len);
void check_meta(fkvf_reader *r);

/* the vertex table of N from the file (spec 10) */
double *read_vtxs(fkvf_reader *r, uint32_t n);

/* A stream of the served commit equals `ts`: info (its group's codec, n_seg
 * segments holding `stored` data bytes of it), every read path, CGR points. */
void check_stream_seg(fkvf_reader *r, const tstream *ts, uint64_t seed, size_t n_seg,
                      uint64_t stored);

/* A stream of a single-segment group. */
void check_stream(fkvf_reader *r, const tstream *ts, uint64_t seed);
void check_sections(fkvf_reader *r, const uint8_t *file, size_t file_size);
void check_exact(fkvf_reader *r, const model *m);

/* The CBK1 contents of spec 13.1-13.2, laid out here from the spec's table
 * (not with the library's helpers). */
uint8_t *cbk1_bytes(const fkvf_codebook_shape *s, const uint8_t *tables, size_t tsize,
                    size_t *n);
void check_shape_eq(const fkvf_codebook_shape *a, const fkvf_codebook_shape *b);

/* fkvf_reader_codebook serves exactly this codebook; its hash is XXH3-128
 * of the contents (spec 13.3). Returns the contents pointer. */
const void *check_codebook(fkvf_reader *r, const fkvf_codebook_shape *shape,
                           const uint8_t *tables, size_t tsize);
void hex16(const uint8_t h[16], char out[33]);

/* Read back and compare everything of a clean single-commit archive. */
void check_model(fkvf_reader *r, const model *m, const uint8_t *file, size_t size);
void roundtrip_memory(const model *m);

/* ==== files ====================================================================== */
char *make_tmpdir(void);
size_t dir_entries(const char *dir);
void rm_tmpdir(char *dir);
int path_exists(const char *p);

/* ==== hand-crafting files (format helpers + hash) ================================= */

typedef struct craft {
    tu_buf b;
    fkvf_dirent e[64];
    size_t n;
} craft;
void cr_bytes(craft *c, const void *p, size_t n);
void cr_pad(craft *c);
void cr_header(craft *c, uint16_t major, uint16_t minor, uint64_t req, uint64_t opt);

/* Append a section's stored bytes (aligned) and record its entry. */
size_t cr_section(craft *c, uint32_t type, uint32_t flags, uint64_t key, const void *stored,
                  size_t stored_n, uint64_t size);
size_t cr_plain(craft *c, uint32_t type, uint32_t flags, uint64_t key, const void *p,
                size_t n);

/* Offset the directory will get. */
uint64_t cr_dir_off(craft *c);

/* Directory + trailer of a commit. */
void cr_commit(craft *c, uint64_t seq, uint64_t prev, uint64_t n_pos, uint64_t n_arch);

/* A DESC section's bytes. */
uint8_t *desc_bytes(const fkvf_desc *d, size_t *n);
void simple_desc(fkvf_desc *d);
void cr_desc(craft *c, uint32_t extra_flags);

/* META section bytes builder */
typedef struct mbuild {
    tu_buf b;
    uint32_t n;
} mbuild;
void mb_add(mbuild *m, const char *key, uint8_t type, const void *v, uint32_t vl);
void mb_u64(mbuild *m, const char *key, uint64_t v);

/* Recompute, for the last commit, every directory entry checksum, the
 * directory checksum and the trailer checksum (after editing payloads). */
void refresh_last_commit(uint8_t *b, size_t size);

/* The segment header of spec 11.2 at p, read field by field (no checks). */
fkvf_strm_hdr strm_hdr_at(const uint8_t *p);

/* Recompute a STRM section's head checksum and block checksums (spec 11.2-11.4). */
void refresh_strm(uint8_t *b, uint64_t off);

/* A STRM section from the header fields in h (derived sizes filled in here)
 * and `data` (data_bytes bytes, NULL = zeros), with valid checksums, as the
 * next section of c. */
size_t cr_strm(craft *c, fkvf_strm_hdr h, const uint8_t *data);

/* Take over a complete file for editing its last commit: the bytes before
 * that commit's directory, and its entries (to drop, change or add to, then
 * cr_commit again with the returned directory header's values). */
fkvf_dirhdr cr_from_file(craft *c, const uint8_t *b, size_t size);

/* Start a further commit after a complete file. */
void cr_append(craft *c, const uint8_t *b, size_t size);
size_t cr_find(const craft *c, uint32_t type, uint64_t key);
void cr_drop(craft *c, size_t i);

/* Recompute the entry checksums of the pending commit (after editing bytes). */
void cr_rehash(craft *c);

/* CBRF contents (spec 13.5). */
uint8_t *cbrf_bytes(const uint8_t hash[16], const char *name, size_t *n);

/* Open a copy of exactly `n` bytes (so over-reads are caught by ASan), keep
 * the message, free everything. */
int try_open(const uint8_t *p, size_t n, unsigned flags, char *msg, size_t msg_size);

/* ==== shared by several sections ============================================= */

/* A codec of a stream group: quad of `bits`, or ngon of `alphabet`. */
typedef struct codec_choice {
    fkvf_profile profile;
    unsigned bits;     /* quad */
    uint32_t alphabet; /* ngon */
} codec_choice;

/* A writer into *b (emptied first) with options o; the test fails if it
 * cannot be created. */
fkvf_writer *new_writer(tu_buf *b, const fkvf_writer_options *o);

/* The writer's message is not empty and names `what`. */
void assert_msg_names(fkvf_writer *w, const char *what);

/* Where the last commit's directory and trailer are. */
typedef struct layout {
    uint64_t dir_off, dir_size, trailer_off;
} layout;
layout layout_of(const uint8_t *b, size_t size);

/* The baseline the crafted tests mutate: header, DESC (133 bytes, then 59
 * padding bytes), an optional unknown section, directory, trailer. */
void craft_base(craft *c, uint64_t req);
int open_craft(craft *c, unsigned flags, char *msg, size_t msg_size);

/* Opening the crafted file fails with `want`, its message containing `needle`. */
#define EXPECT_OPEN(c, want, needle)                                                    \
    do {                                                                                \
        char m_[600];                                                                   \
        int rc_ = open_craft(c, 0, m_, sizeof m_);                                      \
        ck_assert_msg(rc_ == (want), "open: %s, want %s (%s)", fkvf_error_name(rc_),     \
                      fkvf_error_name(want), m_);                                       \
        ck_assert_msg(strstr(m_, needle) != NULL, "message \"%s\" lacks \"%s\"", m_,    \
                      needle);                                                          \
    } while (0)

#endif
