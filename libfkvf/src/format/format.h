/* Byte layouts of spec 3-14: parse (validating every field against the
 * bytes given) and serialize. No I/O; no knowledge of readers or writers. */
#ifndef FKVF_FORMAT_H
#define FKVF_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "fkvf.h"

#define FKVF_HEADER_SIZE 64
#define FKVF_TRAILER_SIZE 64
#define FKVF_DIRENT_SIZE 64
#define FKVF_DIRHDR_SIZE 64
#define FKVF_STRM_HDR_SIZE 64
#define FKVF_DESC_FIXED 128
#define FKVF_SUBHDR_SIZE 64 /* EXAC, CBK1 headers */

extern const uint8_t fkvf_magic[9];
extern const uint8_t fkvf_trailer_magic[8];

/* Limits (spec 15). */
#define FKVF_MAX_FILE (UINT64_C(1) << 62)
#define FKVF_MAX_COMMITS (UINT64_C(1) << 24)
#define FKVF_MAX_DIR_ENTRIES (UINT32_C(1) << 20)
#define FKVF_MAX_SECTIONS (UINT64_C(1) << 22)
#define FKVF_MAX_SECTION_SIZE (UINT64_C(1) << 48)
#define FKVF_MAX_INFLATED (UINT64_C(1) << 40)
#define FKVF_MAX_META 65536u
#define FKVF_MAX_META_VALUE (UINT32_C(1) << 24)
#define FKVF_MAX_LAYERS 1024u
#define FKVF_MAX_HEADS 1024u
#define FKVF_MAX_DIM 16384u
#define FKVF_MAX_ID_LEN 4096u
#define FKVF_MIN_BLOCK 64u
#define FKVF_MAX_BLOCK (UINT32_C(1) << 20)
#define FKVF_MAX_NGON_N 65536u

typedef struct fkvf_header {
    uint16_t major, minor;
    uint64_t required_features, optional_features;
} fkvf_header;

typedef struct fkvf_dirent {
    uint32_t type, flags;
    uint64_t offset, stored_size, size, key, checksum;
} fkvf_dirent;

typedef struct fkvf_dirhdr {
    uint32_t entry_count;
    uint64_t commit_seq, n_positions, n_archived;
} fkvf_dirhdr;

typedef struct fkvf_trailer {
    uint64_t commit_seq, dir_offset, dir_size, dir_checksum, prev_trailer, file_size;
} fkvf_trailer;

/* Stream groups (spec 11.2): the directory key of a STRM section. */
#define FKVF_GROUP_INDEX 0u
#define FKVF_GROUP_TOKENS 1u
#define FKVF_MAX_GROUP_STREAMS (UINT32_C(1) << 25)

typedef struct fkvf_strm_hdr {
    uint64_t group;
    uint8_t profile, bits;
    uint8_t k_stages, v_stages;
    uint32_t alphabet;
    uint64_t first_symbol, symbol_count;
    uint32_t span_symbols, block_size;
    double r;
    uint32_t n_streams;
    /* derived */
    uint64_t stream_bytes, n_blocks, data_off, data_bytes, section_size;
} fkvf_strm_hdr;

/* Alignment unit of first_symbol (spec 11.6): quad 128 / gcd(b, 128), ngon L. */
uint32_t fkvf_strm_align(unsigned profile, unsigned bits, uint32_t span_symbols);

/* header */
void fkvf_header_write(uint8_t out[64], const fkvf_header *h);
/* avail = bytes present from offset 0 (may be < 64). */
int fkvf_header_parse(const uint8_t *p, size_t avail, fkvf_header *h, fkvf_diag *d);

/* directory entry / directory header / trailer */
void fkvf_dirent_write(uint8_t out[64], const fkvf_dirent *e);
void fkvf_dirent_read(const uint8_t p[64], fkvf_dirent *e);
void fkvf_dirhdr_write(uint8_t out[64], const fkvf_dirhdr *h);
/* Validates magic and reserved bytes; off = file offset (for messages). */
int fkvf_dirhdr_parse(const uint8_t p[64], uint64_t off, fkvf_dirhdr *h, fkvf_diag *d);
/* Writes the trailer for a trailer located at `off`. */
void fkvf_trailer_write(uint8_t out[64], const fkvf_trailer *t, uint64_t off);
/* Checks magic (TRUNCATED when absent) and checksum (CHECKSUM) and the
 * local consistency of fields (spec 6.1), not the directory checksum. */
int fkvf_trailer_parse(const uint8_t p[64], uint64_t off, fkvf_trailer *t, fkvf_diag *d);

/* stream segment header (spec 11.2-11.3): `p` points at the section start,
 * `size` its size; `off` its file offset. Validates every field and the
 * exact section size; ngon vertex checks are the codec's. */
void fkvf_strm_hdr_write(uint8_t out[64], const fkvf_strm_hdr *h, uint64_t section_off);
int fkvf_strm_hdr_parse(const uint8_t *p, uint64_t size, uint64_t off, fkvf_strm_hdr *h,
                        fkvf_diag *d);
/* Fill derived fields (stream_bytes, n_blocks, data_off, data_bytes,
 * section_size) from the primary ones; FKVF_E_LIMIT on overflow. */
int fkvf_strm_hdr_derive(fkvf_strm_hdr *h);

/* descriptor (spec 8) */
typedef struct fkvf_desc_raw {
    fkvf_desc d;
    const uint8_t *model_id;     /* into the section bytes */
    uint32_t model_id_len;
    const uint8_t *tokenizer_id;
    uint32_t tokenizer_id_len;
} fkvf_desc_raw;
int fkvf_desc_parse(const uint8_t *p, uint64_t size, uint64_t off, fkvf_desc_raw *out,
                    fkvf_diag *d);
/* Validate a caller's descriptor (writer side); msg via d. */
int fkvf_desc_check(const fkvf_desc *desc, fkvf_diag *d);
/* Serialized size and bytes. */
size_t fkvf_desc_size(const fkvf_desc *desc);
void fkvf_desc_write(uint8_t *out, const fkvf_desc *desc);
/* Row bytes of an exact row; 0 on overflow. */
uint64_t fkvf_desc_row_bytes(const fkvf_desc *desc);
size_t fkvf_dtype_size(int dtype);

/* metadata (spec 9): validate a META section, count its entries and give
 * their offsets in the section (*entry_off: `count` values from `alloc`, or
 * NULL when there are none; the caller frees it). */
int fkvf_meta_parse(const uint8_t *p, uint64_t size, uint64_t off, uint32_t *count,
                    size_t **entry_off, const fkvf_allocator *alloc, fkvf_diag *d);
/* The entry at offset `at` of an already validated META section. */
void fkvf_meta_entry_at(const uint8_t *p, size_t at, fkvf_meta_entry *e);

/* exact rows header (spec 14) */
typedef struct fkvf_exac_hdr {
    uint64_t first, count;
    uint8_t dtype;
} fkvf_exac_hdr;
void fkvf_exac_hdr_write(uint8_t out[64], const fkvf_exac_hdr *h);
int fkvf_exac_hdr_parse(const uint8_t *p, uint64_t size, uint64_t off, uint64_t row_bytes,
                        fkvf_exac_hdr *h, fkvf_diag *d);

/* Exact positions (spec 14.3): the first position of [lo, hi) that no range
 * [first, first + count) covers, or hi when all are covered. Sorts `ranges`
 * by first; O(n log n). Each first + count must fit in a u64. */
typedef struct fkvf_range {
    uint64_t first, count;
} fkvf_range;
uint64_t fkvf_ranges_first_gap(fkvf_range *ranges, size_t n, uint64_t lo, uint64_t hi);

/* vertex table (spec 10): checks sizes; the values are checked by the codec. */
int fkvf_vtxs_parse(const uint8_t *p, uint64_t size, uint64_t off, uint64_t key, uint32_t *n,
                    fkvf_diag *d);

/* codebooks (spec 13) */
#define FKVF_CBRF_FIXED 24
/* Validates a shape (spec 13.1 ranges, the layer table included); returns
 * its section size or 0. */
uint64_t fkvf_cbk1_size(const fkvf_codebook_shape *s);
/* Bytes before the tables: 64, plus the padded layer table when the shape
 * has one (spec 13.1). */
uint64_t fkvf_cbk1_head_size(const fkvf_codebook_shape *s);
void fkvf_cbk1_hdr_write(uint8_t out[64], const fkvf_codebook_shape *s);
/* The fkvf_cbk1_head_size - 64 bytes after the header: the layer table and
 * its zero padding (nothing without a table). */
void fkvf_cbk1_layer_table_write(uint8_t *out, const fkvf_codebook_shape *s);
/* Parse + check the header, the layer table and the exact section size (spec
 * 13.1-13.2). layer_stages_ok: the file declares LAYER_STAGES (spec 3.3).
 * s->layer_stages points into p when the section has a layer table. */
int fkvf_cbk1_parse(const uint8_t *p, uint64_t size, uint64_t off, int layer_stages_ok,
                    fkvf_codebook_shape *s, fkvf_diag *d);
/* CBRF (spec 13.5): hash and name (into p). */
int fkvf_cbrf_parse(const uint8_t *p, uint64_t size, uint64_t off, const uint8_t **hash,
                    const uint8_t **name, uint32_t *name_len, fkvf_diag *d);
/* Are all centroid elements of the CBK1 contents p (size bytes, header
 * included, dtype from the header) finite (spec 13.2)? 0 with *bad the
 * content offset of the first that is not. */
int fkvf_cbk1_finite(const uint8_t *p, uint64_t size, fkvf_dtype dtype, uint64_t *bad);
/* The same in two steps, for a check cut into pieces: the content offset
 * of the first centroid element (after the header and any layer table),
 * then the elements in [from, to) (content offsets; from at an element
 * boundary, an element that does not end by `to` is not looked at). */
uint64_t fkvf_cbk1_elements_at(const uint8_t *p, uint64_t size);
int fkvf_cbk1_finite_range(const uint8_t *p, uint64_t from, uint64_t to, fkvf_dtype dtype,
                           uint64_t *bad);
/* Does the shape match the descriptor (spec 13.7)? */
int fkvf_cbk1_matches(const fkvf_codebook_shape *s, const fkvf_desc *desc);

/* Encoder metric, CMET (spec 13.8). */
#define FKVF_CMET_HDR 64
typedef struct fkvf_cmet_hdr {
    uint8_t hash[16]; /* content hash of its CBK1 */
    uint32_t n_layers, n_heads, key_dim, value_dim;
    unsigned parts;   /* bit 0 key matrices, bit 1 value matrices */
} fkvf_cmet_hdr;
/* Steps 1-4 of spec 13.8: the header's fields, the dimension limit and the
 * exact size (p: the section contents, key: its directory key). */
int fkvf_cmet_parse(const uint8_t *p, uint64_t size, uint64_t off, uint64_t key,
                    fkvf_cmet_hdr *h, fkvf_diag *d);
/* The size a valid header implies (dims within FKVF_METRIC_MAX_DIM). */
uint64_t fkvf_cmet_size(const fkvf_cmet_hdr *h);
/* Byte offset, in the contents, of the matrix of (tab = layer * n_heads +
 * head, kv 0 keys / 1 values), a part the header holds. */
uint64_t fkvf_cmet_matrix_off(const fkvf_cmet_hdr *h, size_t tab, unsigned kv);
/* Step 6: the header against its CBK1 (shape and content hash). */
int fkvf_cmet_match(const fkvf_cmet_hdr *h, const fkvf_codebook_shape *cb,
                    const uint8_t hash[16], uint64_t off, fkvf_diag *d);
/* Step 7: every matrix in order (fkvf_metric_check). m: dmax * dmax
 * floats, l: dmax * dmax doubles of scratch, dmax the larger dimension of
 * the parts held. */
int fkvf_cmet_matrices(const uint8_t *p, const fkvf_cmet_hdr *h, uint64_t off, float *m,
                       double *l, fkvf_diag *d);
void fkvf_cmet_hdr_write(uint8_t out[64], const fkvf_cmet_hdr *h);

/* UTF-8 validity (no overlongs, no surrogates, <= U+10FFFF). */
int fkvf_utf8_valid(const uint8_t *s, size_t n);

/* Section type as printable text ("DESC", or "0x........"). */
void fkvf_type_name(uint32_t type, char out[12]);

#endif
