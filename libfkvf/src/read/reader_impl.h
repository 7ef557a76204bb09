/* Reader internals shared by the files of read/ (reader.c, chain.c, load.c,
 * query.c, stream.c, codebook.c, access.c, restore.c, find.c, verify.c,
 * zidx.c) and, for the chain handle and section bytes, by validate/. */
#ifndef FKVF_READER_IMPL_H
#define FKVF_READER_IMPL_H

#include "codec/codec.h"
#include "error.h"
#include "filemap.h"
#include "handle.h"
#include "fkvf.h"
#include "format/format.h"


typedef struct rd_commit {
    uint64_t seq, trailer_off, dir_off, dir_size, region_start;
    fkvf_dirhdr dh;
    size_t first_section, n_sections;
} rd_commit;

typedef struct rd_section {
    fkvf_dirent e;
    uint64_t commit_seq;
    int checked;       /* whole-section checksum verified (and inflated if deflated) */
    uint8_t *inflated; /* owned, when deflated */
} rd_section;

/* One STRM section: a segment of every stream of its group (spec 11.2). */
typedef struct rd_seg {
    size_t sec;          /* index into sections */
    fkvf_strm_hdr h;
    uint64_t count;      /* effective symbols per stream (after later segments cut it) */
    const uint8_t *data; /* start of the section's data in the file */
    uint64_t data_fileoff;
    uint8_t *block_ok;   /* one byte per block: RD_BLOCK_OK, RD_BLOCK_CACHED */
    int tracked;         /* in its group's segs at cache_idx (a source reader's
                          * cache may drop its blocks; not a verify-only copy) */
    size_t cache_idx;
} rd_seg;
/* Block b of segment g: its data at g->data_fileoff + *start (from the
 * segment's data start: *start), *len bytes (the last block is shorter). */
static inline void rd_block_range(const rd_seg *g, uint64_t b, uint64_t *start, uint64_t *len)
{
    *start = b * g->h.block_size;
    *len = g->h.data_bytes - *start < g->h.block_size ? g->h.data_bytes - *start : g->h.block_size;
}
#define RD_BLOCK_OK 1u     /* checksum (and ngon spans) verified, bytes present */
#define RD_BLOCK_CACHED 2u /* counted in the source cache (source.c) */

/* A block in a source reader's cache: segment idx of group grp. */
typedef struct rd_cached {
    size_t idx;
    uint64_t b;
    unsigned grp;
} rd_cached;

/* A stream group (spec 11.2): the index streams, or the token stream. */
typedef struct rd_group {
    int present;
    unsigned group;
    uint8_t profile, bits, k_stages, v_stages;
    uint32_t alphabet, span, n_streams;
    double r;
    const fkvf_ngon *ngon; /* shared context */
    rd_seg *segs;
    size_t n_segs, cap_segs;
    uint64_t length;
    uint64_t stored_per_stream; /* data bytes of one stream over the segments */
} rd_group;

/* A stream: one member of a group; index streams come first, in the
 * canonical order of spec 11.2 (their index is their ordinal). */
typedef struct rd_stream {
    uint64_t id;
    rd_group *g;
    uint32_t ord;
    uint64_t stored_bytes;
} rd_stream;

typedef struct rd_exact {
    size_t sec;
    fkvf_exac_hdr h;
} rd_exact;

/* A run of positions whose rows come from one EXAC section (the latest in
 * section order that covers them, spec 7.3). */
typedef struct rd_xrun {
    uint64_t first, end;
    size_t x; /* index into exact */
} rd_xrun;

typedef struct rd_ngonctx {
    fkvf_ngon g;
} rd_ngonctx;

struct fkvf_reader {
    /* kind FKVF_HANDLE_READER; FAILED (calls return FKVF_E_STATE, the
     * message of the open kept) until the open succeeds, then OPEN: only
     * then do queries serve data */
    fkvf_handle h;
    const fkvf_allocator *alloc;
    fkvf_diag diag;
    char *name;
    const uint8_t *data;
    uint64_t size;
    fkvf_filemap file; /* a file's bytes, mapped or (FKVF_OPEN_READ) read */
    unsigned flags;
    /* fkvf_reader_open_source: data is a reservation of size bytes that
     * rd_ensure fills unit by unit from src (source.c) */
    fkvf_source src;
    uint8_t *src_map;
    size_t src_map_size;
    uint8_t *src_have; /* one bit per unit: read */
    uint8_t *src_pin;  /* one bit per unit: read for something other than a
                        * block's data (kept until fkvf_reader_free) */
    unsigned src_shift; /* log2 of the unit */
    uint64_t src_bytes, src_reads;
    /* the block cache: blocks read for calls, oldest first (a ring); their
     * bytes dropped at the next safe point when more than src_budget
     * (0: none dropped) */
    rd_cached *src_q;
    size_t src_q_head, src_q_n, src_q_cap;
    uint64_t src_budget, src_cached, src_dropped;

    fkvf_header hdr;
    rd_commit *commits;
    size_t n_commits;
    rd_section *sections;
    size_t n_sections;
    uint64_t committed_size, torn_bytes;
    uint64_t n_positions, n_archived;

    int has_desc;
    fkvf_desc desc;
    char *model_id, *tokenizer_id;
    uint64_t row_bytes;

    int has_meta;
    size_t meta_sec;
    uint32_t meta_count;
    size_t *meta_off; /* offsets of its entries, once checked */
    int meta_checked;

    /* codebook (spec 13) */
    int cb_kind;                  /* 0 none, 1 embedded CBK1, 2 external CBRF */
    size_t cb_sec;
    int cb_known;                 /* shape known: embedded, or external attached */
    fkvf_codebook_shape cb_shape; /* its layer_stages: cb_layers, or the
                                   * attached codebook file's */
    uint8_t *cb_layers;           /* the embedded CBK1's layer table (2 * n_layers),
                                   * copied when loaded; NULL without one */
    uint8_t cb_ref_hash[16];
    char *cb_ref_name;
    uint32_t cb_ref_name_len;     /* its length in the CBRF (a NUL inside: strlen is shorter) */
    fkvf_reader *cb_file;         /* attached codebook file (borrowed) */
    size_t cb_file_sec;
    struct fkvf_rvq *rvq;         /* codebook for restore, built on first use */
    struct fkvf_rvq *rvq16;       /* restore of an f16 codebook on a CPU with the
                                   * kernels: a handle borrowing its tables in the
                                   * CBK1 contents rvq16_cb (rd_restore_rvq) */
    const void *rvq16_cb;
    unsigned threads;             /* of restore's decoding (fkvf_reader_set_threads) */
    size_t *cb_streams;           /* stream index of each RVQ code j (restore) */
    float *metric_k, *metric_v;   /* the CMET's matrices in binary32, once
                                   * fkvf_reader_metric checked it (metric.c) */
    int metric_loaded;

    rd_exact *exact;
    size_t n_exact;
    rd_xrun *xruns; /* sorted, disjoint: O(log n) row lookup however many commits */
    size_t n_xruns;

    rd_group groups[2]; /* FKVF_GROUP_INDEX, FKVF_GROUP_TOKENS */
    size_t n_streams;   /* index streams, then the token stream (rd_stream_at) */

    uint8_t *vtxs_seen; /* one bit per N with a VTXS section (spec 10.3) */

    rd_ngonctx **ngons;
    size_t n_ngons;

    /* fkvf_reader_read (access.c), each built on first use (NULL before):
     * the RoPE inverse frequencies of the descriptor (rope_dims / 2), and
     * the stage table of every index stream in the streams' order (spec
     * 11.2), in rvq and, for an f16 codebook, in its CBK1 contents acc_cb */
    double *acc_freqs;
    const float **acc_tab;
    const uint8_t **acc_tab16;
    const uint8_t *acc_cb;
    /* fkvf_reader_read's index row cache (access.c, rc_*): rc_slots slots of
     * the codes of every index stream for a block of symbols of one segment,
     * position-major; slot i holds block rc_blk[i] of segment rc_seg[i]
     * (SIZE_MAX: empty). rc_state 0 not yet tried, 1 in use, -1 not used. */
    uint8_t *rc_codes; /* codes of rc_cw bytes (1 when k <= 256, else 2) */
    unsigned rc_cw;
    size_t *rc_seg;
    uint64_t *rc_blk;
    size_t rc_slots;
    int rc_state;
    size_t rc_limit; /* its budget in bytes, when rc_limit_set (else RC_BYTES) */
    int rc_limit_set;
    /* its hit rate (access.c rc_row): slots filled once, lookups and hits
     * of the current window, lookups left without fills */
    size_t rc_used;
    uint32_t rc_looks, rc_hits, rc_nofill;
};

/* Checks the handle (FKVF_E_STATE also for one whose open failed); clears
 * the diagnostic. */
int rd_enter(const fkvf_reader *r);
/* rd_enter as the first statement of a public call: returns its error */
#define ENTER(r)                \
    do {                        \
        int rc_ = rd_enter(r);  \
        if (rc_)                \
            return rc_;         \
    } while (0)
/* The encoder metric (spec 13.8, metric.c): the checks of the clause on
 * r's CMET section (FKVF_E_NOT_FOUND when the chain has none); *sec its
 * index and *h its header when FKVF_OK. */
int rd_metric_check(fkvf_reader *r, size_t *sec, fkvf_cmet_hdr *h);
/* Bytes of section i, checksum-verified (and inflated) on first touch. */
int rd_section_bytes(fkvf_reader *r, size_t i, const uint8_t **p, uint64_t *size);
/* Section i's stored bytes leave the resident set of a mapped file
 * (fkvf_filemap_drop): after a pass that only checks them (the EXAC
 * sections at open, verify), so that opening or verifying a large file
 * does not hold it all. A later access maps them again. */
void rd_section_drop(fkvf_reader *r, size_t i);
/* Section i's checksum (and inflation) checked again, its error into d
 * (verify; for a reader that is not a source it writes only section i's
 * state and d). */
int rd_section_check(fkvf_reader *r, size_t i, fkvf_diag *d);
/* The vertex table of VTXS section i, sizes checked (spec 10.1), values not:
 * 2N doubles in *xy, to be freed with fkvf_free(r->alloc, ...). */
int rd_vtxs_table(fkvf_reader *r, size_t i, double **xy, uint32_t *n);
/* Verify block b of a segment (checksum, and for ngon every span in it). */
int rd_block_check(fkvf_reader *r, const rd_group *gr, rd_seg *g, uint64_t b);
/* The same with its error into d (rd_check_par's workers: for a reader
 * that is not a source, it writes only block b's flag and d). */
int rd_block_check_d(fkvf_reader *r, const rd_group *gr, rd_seg *g, uint64_t b, fkvf_diag *d);
/* Stream `index` (index streams in canonical order, then the token
 * stream), computed from the groups; FKVF_E_RANGE beyond n_streams. */
int rd_stream_at(const fkvf_reader *r, size_t index, rd_stream *s);
/* Bytes [off, off + n) of the file present in r->data: a no-op for a file
 * or memory; for a source, the missing units read (source.c). The range is
 * within the file (callers check bounds first). */
int rd_source_fill(fkvf_reader *r, uint64_t off, uint64_t n, int pin);
static inline int rd_ensure(fkvf_reader *r, uint64_t off, uint64_t n)
{
    return r->src.read && n ? rd_source_fill(r, off, n, 1) : FKVF_OK;
}
/* rd_ensure for the data of a block (rd_block_check): its units may be
 * dropped again by rd_source_trim once the block is cached */
static inline int rd_ensure_block(fkvf_reader *r, uint64_t off, uint64_t n)
{
    return r->src.read && n ? rd_source_fill(r, off, n, 0) : FKVF_OK;
}
/* Block b of segment g, just verified, counted in a source reader's cache
 * (a no-op for other readers, untracked segments, or one already counted);
 * FKVF_E_NOMEM when its queue cannot grow (the block stays verified,
 * uncounted: kept until fkvf_reader_free). */
int rd_source_cached(fkvf_reader *r, rd_seg *g, uint64_t b, uint64_t len);
/* The units of block b of segment g that no pinned structure and no
 * verified neighbour block share marked unread (and released when the
 * unit is at least a page): the next use asks the source again. For a
 * block that failed its check, and for dropped ones. */
void rd_source_unread(fkvf_reader *r, const rd_seg *g, uint64_t b);
/* Read coalescing for a source reader: byte ranges a call will need, added
 * in file order, merged while each starts in or right after the unit where
 * the run so far ends; a run is read (its missing units, unpinned, in as
 * few source reads as the units present allow) when the next range does
 * not join it, and at rd_prefetch_flush. Nothing is verified here: the
 * blocks are checked when used, as always. No-ops for other readers. */
typedef struct rd_prefetch {
    uint64_t off, end; /* the run: [off, end); end == off: none */
} rd_prefetch;
int rd_prefetch_add(fkvf_reader *r, rd_prefetch *pf, uint64_t off, uint64_t len);
int rd_prefetch_flush(fkvf_reader *r, rd_prefetch *pf);
/* The bytes [*lo, *hi) of stream ord's data in segment g (from the
 * segment's data start) that hold its local symbols [a, b), a < b. */
void rd_seg_span(const rd_group *s, const rd_seg *g, uint32_t ord, uint64_t a, uint64_t b,
                 uint64_t *lo, uint64_t *hi);
/* rd_prefetch_add of the blocks holding local symbols [a, b) of stream ord
 * of segment g (those not verified yet). */
int rd_seg_prefetch(fkvf_reader *r, rd_prefetch *pf, const rd_group *s, const rd_seg *g,
                    uint32_t ord, uint64_t a, uint64_t b);
/* The same for symbols [first, first + count) of stream `index`, over its
 * segments (restore's batches). */
int rd_stream_prefetch(fkvf_reader *r, rd_prefetch *pf, size_t index, uint64_t first,
                       uint64_t count);
/* A safe point (no pointer into block data held by the caller): when the
 * cached blocks exceed the budget, the oldest are dropped (their units
 * released and read again when next needed) until they do not. */
void rd_source_trim(fkvf_reader *r);
/* The reservation and unit map of a source reader; r->data and r->size
 * then describe it (source.c). */
int rd_source_init(fkvf_reader *r, const fkvf_source *src, uint32_t unit);
/* The embedded CBK1 loaded and checked (spec 13.1-13.2, 13.7, the stage
 * counts of 11.8), cb_known then set: at open for a file or memory, on first
 * use for a source (load.c); a no-op otherwise or once done. */
int rd_cbk1_load(fkvf_reader *r);
/* Release what a source reader reserved (source.c). */
void rd_source_release(fkvf_reader *r);
/* Parse a STRM section's header into a segment (block flags allocated). */
int rd_seg_init(fkvf_reader *r, size_t i, rd_seg *g);
/* Every stored symbol of streams [o0, o1) of index segment g (also symbols
 * later segments cut away) below k; FKVF_E_SYMBOL, its message into d, on
 * the first that is not (spec 11.8, full verification). Once every block
 * of g is verified, on a reader that is not a source, it only reads. */
int rd_seg_symbols_below(fkvf_reader *r, const rd_group *s, rd_seg *g, uint32_t k, uint32_t o0,
                         uint32_t o1, fkvf_diag *d);

/* Verification on the reader's threads (fkvf_reader_set_threads; verify.c):
 * fn(r, ctx, i, d) for items i = 0 .. n - 1, each error's message into d,
 * on at most one worker per RD_PAR_BYTES of the `bytes` the items read.
 * One worker (one thread asked for, little to check, or a source reader,
 * whose reads fill the reader's state) runs the items in order with d =
 * &r->diag, stopping at the first error. Several run them at once, each with a message of
 * its own: fn must then write nothing of r but what belongs to item i
 * alone. Either way the result is the error of the lowest failing item,
 * its message copied to r->diag: the same for every thread count. */
typedef int (*rd_check_fn)(fkvf_reader *r, void *ctx, size_t item, fkvf_diag *d);
#define RD_PAR_BYTES ((uint64_t)64 << 10)
int rd_check_par(fkvf_reader *r, size_t n, uint64_t bytes, rd_check_fn fn, void *ctx);

/* The work of the public calls of the same name (fkvf_reader_meta_count,
 * fkvf_reader_meta, ...) without their entry check, for the reader's own
 * code: a public call clears the handle's message, these do not (arguments,
 * errors and messages otherwise as the public call's, fkvf.h). */
int rd_meta_count(fkvf_reader *r, size_t *count);
int rd_meta(fkvf_reader *r, size_t index, fkvf_meta_entry *out);
int rd_exact_row(fkvf_reader *r, uint64_t position, const void **row, size_t *row_bytes);
int rd_stream_find(const fkvf_reader *r, uint64_t id, size_t *index);
int rd_stream_read(fkvf_reader *r, size_t index, uint64_t first, uint32_t *out, size_t count);
int rd_codebook(fkvf_reader *r, fkvf_codebook_shape *shape, const void **contents, size_t *size,
                uint8_t hash[16]);
int rd_attach_codebook(fkvf_reader *r, fkvf_reader *cf);

/* Opening (reader.c, with chain.c and load.c): the served commit found and its chain loaded (spec
 * 7.2; the commits, their directories' headers, torn bytes), then every
 * directory's entries (the effective directory, spec 7.3), then the
 * contents interpreted (descriptor, codebook, exact rows, streams). */
int rd_find_head(fkvf_reader *r);
int rd_load_directories(fkvf_reader *r);
int rd_load_contents(fkvf_reader *r);
/* Spec 11.8: with archived positions, exactly the index streams the
 * codebook's stages call for; `code` is CORRUPT (embedded) or CODEBOOK
 * (external codebook attached later, whose hash `ext` the message names). */
int rd_check_index_streams(fkvf_reader *r, int code, const char *ext);

/* A reader over the regular file open as fd (not closed), named `name` in
 * messages, with fkvf_reader_open_file's flags: mapped, or with
 * FKVF_OPEN_READ read from offset 0. *out is set whenever a handle was made
 * (find.c: codebook candidates opened without following symbolic links). */
int rd_open_fd(fkvf_reader **out, int fd, const char *name, unsigned flags,
               const fkvf_allocator *alloc);

/* validate.c: header + commit chain only (see reader.c). */
int rd_open_chain(fkvf_reader **out, const void *data, size_t size, const char *name,
                  const fkvf_allocator *alloc);

#endif
