/* Failure injection over the public API (issue 6, item 6): for every entry
 * point that allocates or does I/O, the k-th allocation (or I/O call) fails,
 * for every k from 1 to the number the call makes when nothing fails. Each
 * failing run must
 *   - return the clean error (FKVF_E_NOMEM; FKVF_E_IO for I/O), with the
 *     handle's message set when a handle exists;
 *   - leave the handle either failed for good (every later call returns the
 *     same error: the writer after a failed write, the appender) or fully
 *     usable: the failed call, retried, succeeds and the run ends with
 *     exactly the results of a run without failures (readers, search,
 *     quantizer);
 *   - leak nothing: outstanding allocations and bytes are 0 after the
 *     handles are freed;
 *   - leave a committed archive intact: a file that existed still opens in
 *     strict mode and is byte-identical (or, after a successful rename, is
 *     the new archive), no temporary file is left.
 *
 * How failures are injected. Allocation: the fkvf_allocator hook where the
 * entry point takes one; every other allocation through GNU ld
 * --wrap=malloc,calloc,realloc,free,aligned_alloc on this executable, which
 * is linked against the static library, so the library's own calls to the
 * malloc family come here too (calls inside other shared libraries, such as
 * zlib's inflateInit, cannot be reached this way: they are not counted). One
 * counter numbers the allocations of both kinds, so "the k-th allocation"
 * is either. I/O: the writer's fkvf_sink and, for files, --wrap of the
 * system calls libfkvf makes (open, read, write, fsync, fdatasync, rename,
 * mkstemp, ftruncate, fstat, mmap, flock, link, lstat, opendir, readdir): the
 * k-th call fails with EIO or
 * ENOSPC, or (write) writes half of its bytes and every later write fails.
 * The appender's own fkvf_io hook is exercised by test_append.
 *
 * Accepted without an error: fkvf_writer_finish ignores a failed fsync of
 * the directory after its rename (open or fsync of the directory): the
 * archive is complete and in place. Built without FKVF_INJECT_WRAP (a
 * linker without --wrap), only the hook and sink loops run. The --wrap part
 * works under ASan+UBSan (the __real_ functions are ASan's interceptors).
 *
 * Every public function of fkvf.h, one per row, and what covers it (test
 * public_functions_listed checks that this table names them all; the
 * fkvf_validate_* rows and their test are for an fkvf.h that has them,
 * FKVF_VALIDATE_STRICT defined):
 *   alloc         the allocation loop of the named scenarios
 *   io            the I/O loop (sink hook; --wrap of the system calls)
 *   n/a asserted  a step of a scenario that, in a run without failures, is
 *                 asserted to make no allocation and no I/O call (the step
 *                 kinds: 'A' allocates, 'I' I/O, 'B' both, '-' neither)
 *   n/a pure      no allocation and no I/O, asserted by na_pure_functions
 *   n/a free      releases only; the leak check after every run covers it
 *   test_append   covered by test_append's fault tests (b) and (d)
 *
 *  fkvf_version_number           | n/a pure
 *  fkvf_version_string           | n/a pure
 *  fkvf_strerror                 | n/a pure
 *  fkvf_error_name               | n/a pure
 *  fkvf_error_class              | n/a pure
 *  fkvf_codebook_size            | n/a pure
 *  fkvf_codebook_tables_offset   | n/a pure (test_layer_stages layout_worked_example)
 *  fkvf_codebook_auto_k          | n/a pure
 *  fkvf_codebook_pays            | n/a pure
 *  fkvf_codebook_key_settings    | n/a pure (na_pure_functions: metadata index built first)
 *  fkvf_codebook_hash            | n/a pure
 *  fkvf_index_stream_id          | n/a pure (test_common index_stream_id_canonical_order)
 *  fkvf_index_stream_id_shape    | n/a pure (test_layer_stages layout_worked_example)
 *  fkvf_index_stream_count       | n/a pure (test_layer_stages layout_worked_example)
 *  fkvf_index_stream_ord         | n/a pure (test_layer_stages layout_worked_example)
 *  fkvf_reader_open_memory       | alloc (reader_mem, reader_ext, reader_zidx)
 *  fkvf_reader_open_file         | alloc + io (reader_file: flags 0, READ, READ|STRICT)
 *  fkvf_reader_open_source       | alloc (reader_source; the source's own failures: test_source)
 *  fkvf_reader_source_stats      | n/a pure (na_pure_functions)
 *  fkvf_reader_set_source_cache  | alloc (reader_source with 4096-byte units and a budget of
 *                                |   one byte: every block dropped at every safe point)
 *  fkvf_reader_source_cache      | n/a pure (na_pure_functions)
 *  fkvf_reader_free              | n/a free (every scenario; leak check)
 *  fkvf_reader_message           | n/a (read after every failure)
 *  fkvf_reader_error             | n/a pure (na_pure_functions: a failed open's handle)
 *  fkvf_reader_file_name         | n/a pure (na_pure_functions; test_find: the path found)
 *  fkvf_reader_info              | n/a asserted (reader_mem)
 *  fkvf_reader_section           | n/a asserted (reader_mem)
 *  fkvf_reader_section_data      | alloc (reader_mem: deflated section)
 *  fkvf_reader_desc              | n/a asserted (reader_mem: parsed at open)
 *  fkvf_reader_meta_count        | alloc (reader_mem: metadata index, lazily)
 *  fkvf_reader_meta              | n/a asserted (reader_mem)
 *  fkvf_reader_meta_find         | n/a asserted (reader_mem)
 *  fkvf_reader_stream_count      | n/a asserted (reader_mem)
 *  fkvf_reader_stream_info       | n/a asserted (reader_mem)
 *  fkvf_reader_stream_find       | n/a asserted (reader_mem)
 *  fkvf_reader_stream_spec       | n/a asserted (reader_mem)
 *  fkvf_reader_stream_get        | n/a asserted (reader_mem: block state made at open)
 *  fkvf_reader_stream_read_u8    | n/a asserted (reader_mem)
 *  fkvf_reader_set_row_cache     | n/a asserted (reader_mem)
 *  fkvf_reader_stream_read       | n/a asserted (reader_mem)
 *  fkvf_reader_stream_point      | n/a asserted (reader_mem)
 *  fkvf_reader_exact_row         | n/a asserted (reader_mem)
 *  fkvf_reader_is_exact          | n/a asserted (reader_mem)
 *  fkvf_reader_codebook          | n/a asserted (reader_mem, reader_ext)
 *  fkvf_reader_codebook_ref      | n/a asserted (reader_mem, reader_ext)
 *  fkvf_reader_attach_codebook   | n/a asserted (reader_ext: the codebook is built at first use)
 *  fkvf_reader_metric            | alloc (test_encoder_metric allocation_failures)
 *  fkvf_reader_find_codebook     | alloc + io (reader_find: by hint in the archive's directory,
 *                                |   flags 0 and READ; by hash in a search path, memory archive)
 *  fkvf_reader_row_bytes         | n/a asserted (reader_mem)
 *  fkvf_reader_restore           | alloc (reader_mem, reader_file, reader_ext)
 *  fkvf_reader_set_threads       | n/a pure (na_pure_functions); threaded runs: test_threads
 *  fkvf_reader_trim              | n/a pure (na_pure_functions); its effect: cli_memory (RSS)
 *  fkvf_reader_read_size         | n/a asserted (reader_mem)
 *  fkvf_reader_read              | alloc (reader_mem, reader_ext)
 *  fkvf_reader_verify            | alloc (reader_mem, reader_file, reader_zidx)
 *  fkvf_validate_memory          | alloc (validate; compiled where fkvf.h has it)
 *  fkvf_validate_file            | alloc + io (validate; compiled where fkvf.h has it)
 *  fkvf_writer_options_init      | n/a pure
 *  fkvf_writer_create_file       | alloc + io (writer_file, writer_cbfile_file,
 *                                |   writer_noreplace_file: the link of no_replace)
 *  fkvf_writer_create_sink       | alloc + io (writer_sink, writer_cbfile, writer_ext)
 *  fkvf_writer_free              | n/a free (every writer scenario; unlinks the temporary file)
 *  fkvf_writer_message           | n/a (read after every failure)
 *  fkvf_writer_error             | n/a pure (na_pure_functions: a failed create's handle)
 *  fkvf_writer_set_desc          | alloc + io (writer_*)
 *  fkvf_writer_meta_u64          | alloc (writer_*; written at commit)
 *  fkvf_writer_meta_i64          | alloc (writer_*)
 *  fkvf_writer_meta_f64          | alloc (writer_*)
 *  fkvf_writer_meta_bool         | alloc (writer_*)
 *  fkvf_writer_meta_utf8         | alloc (writer_*)
 *  fkvf_writer_meta_bytes        | alloc (writer_*)
 *  fkvf_writer_add_exact         | alloc + io (writer_*)
 *  fkvf_stream_spec_align        | n/a pure
 *  fkvf_quad_bits_for            | n/a pure (test_common quad_bits_for_widths)
 *  fkvf_writer_add_index_segment | alloc + io (writer_*)
 *  fkvf_writer_add_token_segment | alloc + io (writer_sink, writer_file)
 *  fkvf_writer_add_codebooks     | alloc + io (writer_*, writer_cbfile*)
 *  fkvf_writer_add_codebook_ref  | alloc + io (writer_ext)
 *  fkvf_writer_add_metric        | alloc (test_encoder_metric allocation_failures); its
 *                                |   I/O is fkvf_writer_add_section's (writer_sink)
 *  fkvf_writer_add_section       | alloc + io (writer_sink, writer_file: deflated and plain)
 *  fkvf_writer_set_positions     | n/a asserted (writer_*)
 *  fkvf_writer_commit            | alloc + io (writer_sink, writer_file)
 *  fkvf_writer_finish            | alloc + io (writer_*)
 *  fkvf_append_options_init      | n/a pure
 *  fkvf_appender_create          | io (appender, system calls); alloc: test_append (d)
 *  fkvf_appender_open            | io (appender); alloc: test_append (d)
 *  fkvf_appender_append          | alloc: test_append (d); no I/O, asserted (appender);
 *                                |   alloc + io when it writes (appender_spill: --wrap)
 *  fkvf_appender_set_queue_bytes | n/a asserted (appender_spill)
 *  fkvf_appender_commit          | io (appender); fkvf_io and alloc: test_append (b), (d)
 *  fkvf_appender_sync            | io (appender); test_append fault_sync_now_fails
 *  fkvf_appender_info            | n/a (no allocation, no I/O)
 *  fkvf_appender_message         | n/a (read after every failure)
 *  fkvf_appender_error           | n/a pure (na_pure_functions: not a handle)
 *  fkvf_appender_free            | n/a free (appender; leak check)
 *  fkvf_compact_options_init     | n/a pure
 *  fkvf_archive_compact          | alloc + io (compact, compact_in_place: --wrap); the
 *                                |   caller's allocator: test_compact
 *  fkvf_archive_op_error         | n/a pure (na_pure_functions: a failed compaction's handle)
 *  fkvf_archive_op_free          | n/a free (compact, recover; leak check)
 *  fkvf_recover_options_init     | n/a pure
 *  fkvf_archive_recover          | alloc + io (recover: --wrap)
 *  fkvf_search_open              | alloc (search, search_zidx)
 *  fkvf_search_free              | n/a free (search)
 *  fkvf_search_message           | n/a (read after every failure)
 *  fkvf_search_error             | n/a pure (na_pure_functions)
 *  fkvf_search_info              | n/a asserted (search)
 *  fkvf_search_suffix            | alloc (search, search_zidx)
 *  fkvf_search_longest           | n/a asserted (search, search_zidx)
 *  fkvf_search_query_point       | n/a asserted (search)
 *  fkvf_search_default_radius    | n/a asserted (search)
 *  fkvf_search_radius            | n/a asserted (search, search_zidx)
 *  fkvf_search_context           | n/a asserted (search)
 *  fkvf_search_prefix_reuse      | alloc (search)
 *  fkvf_search_index_build       | alloc (search: NULL, --wrap); its alloc: test_search index_build_caller_allocator
 *  fkvf_search_index_build_as    | alloc (search: NULL, --wrap, a named stream); an unnamed one, its alloc: test_layer_stages archive_external_codebook
 *  fkvf_search_buffer_free       | n/a free (search)
 *  fkvf_search_keys_open         | alloc (search_keys)
 *  fkvf_search_keys_free         | n/a free (search_keys)
 *  fkvf_search_keys_message      | n/a (read after every failure)
 *  fkvf_search_keys_error        | n/a pure (na_pure_functions)
 *  fkvf_search_keys              | alloc (search_keys)
 *  fkvf_archive_append_sections  | alloc + io (append_sections: --wrap)
 *  fkvf_reader_stream_segment    | n/a asserted (reader_mem)
 *  fkvf_ngon_rmax                | n/a pure
 *  fkvf_ngon_max_span            | n/a pure
 *  fkvf_f32_to_f16               | n/a pure
 *  fkvf_f16_to_f32               | n/a pure
 *  fkvf_f32_to_bf16              | n/a pure
 *  fkvf_bf16_to_f32              | n/a pure
 *  fkvf_convert                  | n/a pure
 *  fkvf_rope_apply_f64           | n/a pure
 *  fkvf_rope_apply_f32           | n/a pure
 *  fkvf_rope_table               | n/a pure
 *  fkvf_rope_apply_table_f64     | n/a pure
 *  fkvf_rvq_params_init          | n/a pure
 *  fkvf_rvq_train                | alloc (rvq)
 *  fkvf_rvq_from_tables          | alloc (rvq)
 *  fkvf_rvq_from_tables_decode   | alloc (rvq)
 *  fkvf_rvq_from_tables16_borrow | alloc (reader_mem, reader_file, reader_ext: restore of the f16 codebook on a CPU with F16C)
 *  fkvf_rvq_from_tables16_encode | alloc (rvq, on a CPU with F16C)
 *  fkvf_rvq_subset               | alloc (rvq)
 *  fkvf_rvq_free                 | n/a free (rvq)
 *  fkvf_rvq_set_threads          | n/a pure (na_pure_functions); threaded runs: test_threads
 *  fkvf_cpu_count                | n/a pure (na_pure_functions)
 *  fkvf_rvq_shape                | n/a pure
 *  fkvf_rvq_tables_size          | n/a pure
 *  fkvf_rvq_tables               | n/a pure
 *  fkvf_rvq_centroids            | n/a pure
 *  fkvf_rvq_codes_per_position   | n/a pure
 *  fkvf_rvq_encode               | alloc (rvq: greedy and beam; under a metric:
 *                                |   test_encoder_metric allocation_failures)
 *  fkvf_rvq_set_metric           | alloc (test_encoder_metric allocation_failures)
 *  fkvf_rvq_get_metric           | n/a pure
 *  fkvf_metric_matrix_check      | no allocator argument (malloc scratch; -1 when it
 *                                |   fails): test_encoder_metric metric_refusals
 *  fkvf_rvq_decode               | alloc (rvq)
 *  fkvf_rvq_decode_to            | alloc (rvq: layers 1.., heads-first)
 */
#define _GNU_SOURCE
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fkvf.h"
#include "testutil.h"

/* ---- the injector ---------------------------------------------------------- */

#define MAX_STEPS 48

typedef struct injector {
    /* allocation */
    int track;           /* record allocations in the live set */
    int armed;           /* count (and maybe fail) allocations and I/O calls */
    long calls, fail_at; /* allocations while armed; the one to fail (0 never) */
    int failed;
    long live;
    size_t live_bytes;
    /* I/O */
    long io_calls, io_fail_at;
    int io_err;   /* errno of the failure */
    int io_short; /* the failing write writes half, then every write fails */
    int io_broken, io_failed;
    const char *fail_call; /* the call that failed */
    int fail_step;         /* in this step */
    /* per step (clean runs): calls made */
    int step;
    long step_allocs[MAX_STEPS], step_io[MAX_STEPS];
} injector;

static injector g;

/* Live set: open addressing over the pointers allocated while tracking. */
#define LIVE_CAP (1u << 16)
static struct {
    void *p;
    size_t n;
} live_set[LIVE_CAP];
static const uintptr_t TOMB = 1;

static size_t slot_of(void *p) { return (size_t)(((uintptr_t)p >> 4) * 2654435761u) & (LIVE_CAP - 1); }

static void live_add(void *p, size_t n)
{
    size_t i = slot_of(p);
    for (size_t probe = 0; probe < LIVE_CAP; probe++, i = (i + 1) & (LIVE_CAP - 1)) {
        if (!live_set[i].p || (uintptr_t)live_set[i].p == TOMB) {
            live_set[i].p = p;
            live_set[i].n = n;
            g.live++;
            g.live_bytes += n;
            return;
        }
    }
    abort(); /* more live blocks than the set holds: make LIVE_CAP larger */
}

/* 1 when p was tracked (and is forgotten now) */
static int live_del(void *p)
{
    if (!p || !g.live)
        return 0;
    size_t i = slot_of(p);
    for (size_t probe = 0; probe < LIVE_CAP; probe++, i = (i + 1) & (LIVE_CAP - 1)) {
        if (!live_set[i].p)
            return 0;
        if (live_set[i].p == p) {
            live_set[i].p = (void *)TOMB;
            g.live--;
            g.live_bytes -= live_set[i].n;
            return 1;
        }
    }
    return 0;
}

static void live_reset(void)
{
    memset(live_set, 0, sizeof live_set);
    g.live = 0;
    g.live_bytes = 0;
}

/* 1: this allocation fails */
static int alloc_fails(void)
{
    if (!g.armed)
        return 0;
    g.calls++;
    if (g.step >= 0 && g.step < MAX_STEPS)
        g.step_allocs[g.step]++;
    if (g.calls == g.fail_at) {
        g.failed = 1;
        g.fail_call = "alloc";
        g.fail_step = g.step;
        return 1;
    }
    return 0;
}

/* 1: this I/O call fails (errno set) */
static int io_fails(const char *call)
{
    if (!g.armed)
        return 0;
    g.io_calls++;
    if (g.step >= 0 && g.step < MAX_STEPS)
        g.step_io[g.step]++;
    if (g.io_calls == g.io_fail_at) {
        g.io_failed = 1;
        g.fail_call = call;
        g.fail_step = g.step;
        errno = g.io_err;
        return 1;
    }
    return 0;
}

#ifdef FKVF_INJECT_WRAP
void *__real_malloc(size_t n);
void *__real_calloc(size_t c, size_t n);
void *__real_realloc(void *p, size_t n);
void __real_free(void *p);
void *__real_aligned_alloc(size_t a, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t c, size_t n);
void *__wrap_realloc(void *p, size_t n);
void __wrap_free(void *p);
void *__wrap_aligned_alloc(size_t a, size_t n);
#define REAL_MALLOC __real_malloc
#define REAL_REALLOC __real_realloc
#define REAL_FREE __real_free
#else
#define REAL_MALLOC malloc
#define REAL_REALLOC realloc
#define REAL_FREE free
#endif

static void *track_new(void *p, size_t n)
{
    if (p && g.track)
        live_add(p, n);
    return p;
}

static void *inj_malloc(size_t n)
{
    if (alloc_fails())
        return NULL;
    return track_new(REAL_MALLOC(n ? n : 1), n);
}

static void *inj_realloc(void *p, size_t n)
{
    if (alloc_fails())
        return NULL;
    void *q = REAL_REALLOC(p, n ? n : 1);
    if (q) {
        int was = p ? live_del(p) : g.track;
        if (was)
            live_add(q, n);
    }
    return q;
}

static void inj_free(void *p)
{
    if (p) {
        live_del(p);
        REAL_FREE(p);
    }
}

#ifdef FKVF_INJECT_WRAP
void *__wrap_malloc(size_t n) { return inj_malloc(n); }
void *__wrap_calloc(size_t c, size_t n)
{
    if (n && c > SIZE_MAX / n)
        return NULL;
    void *p = inj_malloc(c * n);
    if (p)
        memset(p, 0, c * n);
    return p;
}
void *__wrap_realloc(void *p, size_t n) { return inj_realloc(p, n); }
void __wrap_free(void *p) { inj_free(p); }
void *__wrap_aligned_alloc(size_t a, size_t n)
{
    if (alloc_fails())
        return NULL;
    return track_new(__real_aligned_alloc(a, n), n);
}

/* the system calls libfkvf makes */
/* On a 32-bit build (_FILE_OFFSET_BITS=64, CMakeLists.txt) glibc's headers
 * turn these calls into their 64-bit-offset forms (open64, fstat64, ...),
 * which are the symbols --wrap has to catch (tests/CMakeLists.txt). */
#ifdef FKVF_INJECT_LFS64
#define WRAPPED(f) __wrap_##f##64
#define REAL(f) __real_##f##64
#else
#define WRAPPED(f) __wrap_##f
#define REAL(f) __real_##f
#endif
int REAL(open)(const char *path, int flags, ...);
int WRAPPED(open)(const char *path, int flags, ...);
ssize_t __real_read(int fd, void *buf, size_t n);
ssize_t __wrap_read(int fd, void *buf, size_t n);
ssize_t __real_write(int fd, const void *buf, size_t n);
ssize_t __wrap_write(int fd, const void *buf, size_t n);
int __real_fsync(int fd);
int __wrap_fsync(int fd);
int __real_fdatasync(int fd);
int __wrap_fdatasync(int fd);
int __real_rename(const char *a, const char *b);
int __wrap_rename(const char *a, const char *b);
int REAL(mkstemp)(char *tmpl);
int WRAPPED(mkstemp)(char *tmpl);
int REAL(ftruncate)(int fd, off_t n);
int WRAPPED(ftruncate)(int fd, off_t n);
int REAL(fstat)(int fd, struct stat *st);
int WRAPPED(fstat)(int fd, struct stat *st);
void *REAL(mmap)(void *addr, size_t n, int prot, int flags, int fd, off_t off);
void *WRAPPED(mmap)(void *addr, size_t n, int prot, int flags, int fd, off_t off);
int __real_flock(int fd, int op);
int __wrap_flock(int fd, int op);
int __real_link(const char *a, const char *b);
int __wrap_link(const char *a, const char *b);
int REAL(lstat)(const char *path, struct stat *st);
int WRAPPED(lstat)(const char *path, struct stat *st);
DIR *__real_opendir(const char *path);
DIR *__wrap_opendir(const char *path);
struct dirent *REAL(readdir)(DIR *d);
struct dirent *WRAPPED(readdir)(DIR *d);

int WRAPPED(open)(const char *path, int flags, ...)
{
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = (mode_t)va_arg(ap, int);
        va_end(ap);
    }
    if (io_fails("open"))
        return -1;
    return REAL(open)(path, flags, mode);
}
ssize_t __wrap_read(int fd, void *buf, size_t n)
{
    return io_fails("read") ? -1 : __real_read(fd, buf, n);
}
ssize_t __wrap_write(int fd, const void *buf, size_t n)
{
    if (g.io_broken) {
        errno = g.io_err;
        return -1;
    }
    if (io_fails("write")) {
        if (g.io_short && n > 1) {
            g.io_broken = 1;
            return __real_write(fd, buf, n / 2);
        }
        return -1;
    }
    return __real_write(fd, buf, n);
}
int __wrap_fsync(int fd) { return io_fails("fsync") ? -1 : __real_fsync(fd); }
int __wrap_fdatasync(int fd) { return io_fails("fdatasync") ? -1 : __real_fdatasync(fd); }
int __wrap_rename(const char *a, const char *b) { return io_fails("rename") ? -1 : __real_rename(a, b); }
int WRAPPED(mkstemp)(char *tmpl) { return io_fails("mkstemp") ? -1 : REAL(mkstemp)(tmpl); }
int __wrap_link(const char *a, const char *b) { return io_fails("link") ? -1 : __real_link(a, b); }
int WRAPPED(ftruncate)(int fd, off_t n) { return io_fails("ftruncate") ? -1 : REAL(ftruncate)(fd, n); }
int WRAPPED(fstat)(int fd, struct stat *st) { return io_fails("fstat") ? -1 : REAL(fstat)(fd, st); }
void *WRAPPED(mmap)(void *addr, size_t n, int prot, int flags, int fd, off_t off)
{
    return io_fails("mmap") ? MAP_FAILED : REAL(mmap)(addr, n, prot, flags, fd, off);
}
int __wrap_flock(int fd, int op) { return io_fails("flock") ? -1 : __real_flock(fd, op); }
int WRAPPED(lstat)(const char *path, struct stat *st)
{
    return io_fails("lstat") ? -1 : REAL(lstat)(path, st);
}
DIR *__wrap_opendir(const char *path) { return io_fails("opendir") ? NULL : __real_opendir(path); }
struct dirent *WRAPPED(readdir)(DIR *d) { return io_fails("readdir") ? NULL : REAL(readdir)(d); }
#endif

/* the allocator hook: the same counter and live set */
static void *h_alloc(void *opaque, size_t n)
{
    (void)opaque;
    return inj_malloc(n);
}
static void *h_realloc(void *opaque, void *p, size_t n)
{
    (void)opaque;
    return inj_realloc(p, n);
}
static void h_free(void *opaque, void *p)
{
    (void)opaque;
    inj_free(p);
}
static const fkvf_allocator AL = {h_alloc, h_realloc, h_free, NULL};

/* a sink into a growable buffer whose k-th write / sync fails (io_fails) */
typedef struct fsink {
    uint8_t *data;
    size_t size, cap;
} fsink;

static long long fs_write(void *opaque, const void *data, size_t size)
{
    fsink *b = opaque;
    if (g.io_broken) {
        errno = g.io_err;
        return -1;
    }
    if (io_fails("sink write")) {
        if (!g.io_short || size < 2)
            return -1;
        g.io_broken = 1;
        size /= 2;
    }
    if (b->size + size > b->cap) {
        size_t nc = b->cap ? b->cap : 4096;
        while (nc < b->size + size)
            nc *= 2;
        uint8_t *p = REAL_REALLOC(b->data, nc);
        if (!p)
            return -1;
        b->data = p;
        b->cap = nc;
    }
    memcpy(b->data + b->size, data, size);
    b->size += size;
    return (long long)size;
}
static int fs_sync(void *opaque)
{
    (void)opaque;
    return io_fails("sink sync") ? -1 : 0;
}
static void fs_free(fsink *b)
{
    REAL_FREE(b->data);
    memset(b, 0, sizeof *b);
}

/* ---- files ------------------------------------------------------------------- */

static char tmpdir[64];

static void make_dir(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/fkvf-inject-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void path_in(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", tmpdir, name); }

static void clear_dir(void)
{
    DIR *d = opendir(tmpdir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        (void)unlinkat(dirfd(d), e->d_name, 0);
    }
    closedir(d);
}

static void remove_dir(void)
{
    clear_dir();
    rmdir(tmpdir);
}

static int tmp_files(void)
{
    DIR *d = opendir(tmpdir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp-"))
            n++;
    closedir(d);
    return n;
}

/* files read into blocks of the real malloc (free with REAL_FREE): not
 * counted (tu_read_file, plain stdio) */
static void *real_alloc(void *opaque, size_t n)
{
    (void)opaque;
    return REAL_MALLOC(n);
}
static void *real_realloc(void *opaque, void *p, size_t n)
{
    (void)opaque;
    return REAL_REALLOC(p, n);
}
static void real_free(void *opaque, void *p)
{
    (void)opaque;
    REAL_FREE(p);
}
static const fkvf_allocator REAL_AL = {real_alloc, real_realloc, real_free, NULL};

static int file_is(const char *path, const uint8_t *want, size_t n)
{
    size_t m;
    uint8_t *p = tu_read_file(path, &m, &REAL_AL);
    int same = p && m == n && memcmp(p, want, n) == 0;
    REAL_FREE(p);
    return same;
}

/* ---- fixture: a cache, its codebook and archives ------------------------------ */

enum { L = 2, H = 2, D = 4, N = 64, S = 2, W = 8, NA = N - S - W, K = 16, KS = 2, VS = 1 };
#define ROW_BYTES ((size_t)L * H * 2 * D * 2) /* f16 */
#define ROW_F32 ((size_t)L * H * 2 * D * 4)

typedef struct fixture {
    uint16_t rows[N * ROW_BYTES / 2];
    uint32_t tokens[N];
    fkvf_rvq *q;
    fkvf_codebook_shape shape;
    void *tables;
    size_t tables_size;
    uint16_t *codes; /* NA x codes_per_position */
    size_t cpp;
    uint8_t xtra[3000]; /* a compressible extra section */
    char long_key[240];  /* metadata keys and text */
    char long_text[400];
    fsink a;  /* the main archive (writer_sink's clean run) */
    fsink cb; /* a codebook file */
    fsink x;  /* an archive that refers to cb */
    uint8_t cb_hash[16];
} fixture;

static fixture *fx;

static fkvf_desc fx_desc(void)
{
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = L;
    d.n_kv_heads = H;
    d.key_dim = d.value_dim = D;
    d.dtype = FKVF_DTYPE_F16;
    d.n_sinks = S;
    d.window = W;
    d.model_id = "test/inject";
    d.tokenizer_id = "tok";
    return d;
}

static fkvf_stream_spec idx_spec(void)
{
    fkvf_stream_spec s;
    memset(&s, 0, sizeof s);
    s.profile = FKVF_PROFILE_QUAD;
    s.symbol_bits = 4;
    return s;
}

static fkvf_stream_spec tok_spec(void)
{
    fkvf_stream_spec s;
    memset(&s, 0, sizeof s);
    s.profile = FKVF_PROFILE_QUAD;
    s.symbol_bits = 10;
    return s;
}

static void fx_rvq_params(fkvf_rvq_params *p)
{
    fkvf_rvq_params_init(p);
    p->n_layers = L;
    p->n_kv_heads = H;
    p->key_dim = p->value_dim = D;
    p->k = K;
    p->k_stages = KS;
    p->v_stages = VS;
    p->max_iters = 3;
    p->table_dtype = FKVF_DTYPE_F16;
}

/* ---- scenarios ---------------------------------------------------------------- */

/* A scenario is a sequence of calls (steps) on a context. kinds[i] says what
 * step i does in a run without failures: 'A' allocates, 'I' does I/O, 'B'
 * both, '-' neither, '?' depends (not asserted). */
typedef struct scen {
    const char *title;
    size_t n_steps;
    const char *const *names;
    const char *kinds;
    void *ctx;
    void (*setup)(void *ctx);
    int (*step)(void *ctx, size_t i);
    const char *(*message)(void *ctx); /* the handle's message, NULL without a handle */
    /* I/O failures nothing reports: after its rename, fkvf_writer_finish
     * fsyncs the directory and ignores a failure of that (open, fsync): the
     * archive is in place and complete. The step where that is accepted. */
    const char *quiet_io_step;
    /* the call whose failure there goes unreported (NULL: the directory's
     * open or fsync); fkvf_reader_find_codebook skips a name it could not
     * lstat and finds the codebook further on */
    const char *quiet_io_call;
    /* optional: right after step i failed (unarmed), before the retry */
    void (*after_fail)(void *ctx, size_t i);
    int syscalls; /* its I/O is system calls: not counted without FKVF_INJECT_WRAP */
    /* after the run (unarmed): clean 1 for the reference run; stopped: the
     * step that failed for good, or -1 when every step succeeded. Checks
     * the results and the files, frees every handle. */
    void (*finish)(void *ctx, int clean, long stopped);
} scen;

enum { MODE_ALLOC, MODE_IO_EIO, MODE_IO_ENOSPC, MODE_IO_SHORT };

typedef struct run_result {
    long stopped;    /* step that failed for good, -1 none */
    long failures;   /* failing calls seen */
    long recovered;  /* of those, steps that succeeded when retried */
} run_result;

static void run_once(const scen *sc, int mode, long k, int clean, run_result *res)
{
    memset(&g, 0, sizeof g);
    g.step = -1;
    live_reset();
    if (mode == MODE_ALLOC) {
        g.fail_at = k;
    } else {
        g.io_fail_at = k;
        g.io_err = mode == MODE_IO_ENOSPC ? ENOSPC : EIO;
        g.io_short = mode == MODE_IO_SHORT;
    }
    g.track = 1;
    sc->setup(sc->ctx);
    res->stopped = -1;
    const int want = mode == MODE_ALLOC ? FKVF_E_NOMEM : FKVF_E_IO;
    for (size_t i = 0; i < sc->n_steps; i++) {
        g.step = (int)i;
        g.armed = 1;
        int rc = sc->step(sc->ctx, i);
        g.armed = 0;
        if (rc == FKVF_OK)
            continue;
        EXPECTF(!clean, "%s: step %s failed without injection: %s (%s)", sc->title, sc->names[i],
                fkvf_error_name(rc), sc->message(sc->ctx) ? sc->message(sc->ctx) : "");
        EXPECTF(rc == want, "%s mode %d k %ld: step %s gave %s, want %s (%s)", sc->title, mode, k,
                sc->names[i], fkvf_error_name(rc), fkvf_error_name(want),
                sc->message(sc->ctx) ? sc->message(sc->ctx) : "");
        EXPECTF(mode == MODE_ALLOC ? g.failed : g.io_failed,
                "%s k %ld: step %s failed with %s but nothing was injected", sc->title, k,
                sc->names[i], fkvf_error_name(rc));
        const char *msg = sc->message(sc->ctx);
        EXPECTF(!msg || *msg, "%s mode %d k %ld: step %s: %s without a message", sc->title, mode,
                k, sc->names[i], fkvf_error_name(rc));
        res->failures++;
        if (sc->after_fail) {
            g.io_broken = 0;
            sc->after_fail(sc->ctx, i);
        }
        /* retry: the handle failed for good, or the call now succeeds */
        g.io_broken = 0;
        int rc2 = sc->step(sc->ctx, i);
        if (rc2 == FKVF_OK) {
            res->recovered++;
            continue;
        }
        EXPECTF(rc2 == rc, "%s mode %d k %ld: step %s retried gave %s after %s", sc->title, mode, k,
                sc->names[i], fkvf_error_name(rc2), fkvf_error_name(rc));
        res->stopped = (long)i;
        break;
    }
    g.step = -1;
    sc->finish(sc->ctx, clean, res->stopped);
    g.track = 0;
    EXPECTF(g.live == 0 && g.live_bytes == 0, "%s mode %d k %ld (%s): %ld blocks, %zu bytes leaked",
            sc->title, mode, k,
            res->stopped >= 0 ? sc->names[res->stopped] : "completed", g.live, g.live_bytes);
}

/* The reference run, the kinds check, then every k; returns the clean run's
 * count of allocations (MODE_ALLOC) or I/O calls. */
static long loop(const scen *sc, int mode)
{
    run_result res;
    memset(&res, 0, sizeof res);
    run_once(sc, mode, 0, 1, &res);
    long total = mode == MODE_ALLOC ? g.calls : g.io_calls;
    long per[MAX_STEPS], per_io[MAX_STEPS];
    memcpy(per, g.step_allocs, sizeof per);
    memcpy(per_io, g.step_io, sizeof per_io);
    if (mode == MODE_ALLOC || mode == MODE_IO_EIO) {
        for (size_t i = 0; i < sc->n_steps; i++) {
            char kd = sc->kinds[i];
            int a = per[i] > 0, io = per_io[i] > 0;
            if (getenv("FKVF_INJECT_VERBOSE"))
                fprintf(stderr, "%s %s: %ld allocations, %ld I/O calls\n", sc->title,
                        sc->names[i], per[i], per_io[i]);
            if (kd == '?' || getenv("FKVF_INJECT_CALIBRATE"))
                continue;
#ifndef FKVF_INJECT_WRAP
            if (sc->syscalls) /* I/O not seen */
                kd = kd == 'B' ? 'A' : kd == 'I' ? '-' : kd;
#endif
            EXPECTF(a == (kd == 'A' || kd == 'B') && io == (kd == 'I' || kd == 'B'),
                    "%s: step %s is '%c' but made %ld allocations and %ld I/O calls", sc->title,
                    sc->names[i], kd, per[i], per_io[i]);
        }
    }
    ck_assert_msg(total > 0, "%s: nothing to inject", sc->title);
    long failures = 0, quiet_runs = 0;
    for (long k = 1; k <= total; k++) {
        memset(&res, 0, sizeof res);
        run_once(sc, mode, k, 0, &res);
        int quiet = res.failures == 0 && mode != MODE_ALLOC && sc->quiet_io_step &&
                    g.fail_step >= 0 && !strcmp(sc->names[g.fail_step], sc->quiet_io_step) &&
                    (sc->quiet_io_call ? !strcmp(g.fail_call, sc->quiet_io_call)
                                       : (!strcmp(g.fail_call, "open") || !strcmp(g.fail_call, "fsync")));
        EXPECTF(res.failures >= 1 || quiet,
                "%s mode %d k %ld: the injected failure (%s in %s) was not reported", sc->title,
                mode, k, g.fail_call ? g.fail_call : "none",
                g.fail_step >= 0 ? sc->names[g.fail_step] : "setup");
        quiet_runs += quiet;
        failures += res.failures;
    }
    ck_assert_int_ge(failures + quiet_runs, total);
    ck_assert_int_le(quiet_runs, 2); /* the directory's open and fsync */
    return total;
}

/* ---- writer scenarios --------------------------------------------------------- */

typedef struct wctx {
    int to_file;   /* 0 sink, 1 create_file */
    int no_replace; /* create_file with no_replace: no file at the path before */
    int kind;      /* 0 main archive, 1 codebook file, 2 external ref */
    fkvf_writer *w;
    fsink out;
    char path[128];
    uint8_t *old; /* the file at path before (to_file) */
    size_t old_size;
    size_t commit1; /* reference: bytes of commit 1 */
} wctx;

static const char *const w_names[] = {
    "create",     "set_desc",      "meta_bool",         "meta_u64",
    "meta_i64",   "meta_f64",      "meta_utf8",         "meta_bytes",
    "add_codebooks", "add_exact(sinks)", "add_exact(window)", "add_index_segment",
    "add_token_segment", "set_positions", "commit", "add_section(deflate)",
    "add_section", "finish"};
enum { W_STEPS = sizeof w_names / sizeof w_names[0] };
static const char *const cbw_names[] = {"create", "add_codebooks", "finish"};
static const char *const xw_names[] = {"create", "set_desc", "add_codebook_ref", "add_exact",
                                       "add_index_segment", "set_positions", "finish"};

static const char *w_message(void *ctx)
{
    wctx *c = ctx;
    return c->w ? fkvf_writer_message(c->w) : NULL;
}

static void w_setup(void *ctx)
{
    wctx *c = ctx;
    c->w = NULL;
    fs_free(&c->out);
    if (c->to_file && c->no_replace)
        unlink(c->path);
    else if (c->to_file)
        tu_write_file(c->path, c->old, c->old_size);
}

static int w_create(wctx *c, uint64_t req)
{
    fkvf_writer_free(c->w);
    c->w = NULL;
    fs_free(&c->out);
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.optional_features = c->kind == 0 ? FKVF_OPTFEAT_TOKEN_STREAM : 0;
    o.required_features = req;
    o.block_size = 64;
    o.no_replace = c->no_replace;
    if (c->to_file)
        return fkvf_writer_create_file(&c->w, c->path, &o, &AL);
    fkvf_sink s = {fs_write, fs_sync, &c->out};
    return fkvf_writer_create_sink(&c->w, &s, &o, &AL);
}

static int w_step(void *ctx, size_t i)
{
    wctx *c = ctx;
    fkvf_desc d = fx_desc();
    fkvf_stream_spec is = idx_spec(), ts = tok_spec();
    static const uint8_t blob[5] = {1, 2, 3, 4, 5};
    switch (i) {
    case 0: return w_create(c, FKVF_FEAT_DEFLATE);
    case 1: return fkvf_writer_set_desc(c->w, &d);
    /* each entry outgrows the metadata buffer (it doubles), so each allocates */
    case 2: return fkvf_writer_meta_bool(c->w, "b", 1);
    case 3: return fkvf_writer_meta_u64(c->w, "u.abcdefghijklmnopqrstuvw", 7);
    case 4: return fkvf_writer_meta_i64(c->w, fx->long_key + 120, -7);
    case 5: return fkvf_writer_meta_f64(c->w, fx->long_key, 0.5);
    case 6: return fkvf_writer_meta_utf8(c->w, "s", fx->long_text);
    case 7: return fkvf_writer_meta_bytes(c->w, "y", fx->xtra, 1000);
    case 8: return fkvf_writer_add_codebooks(c->w, &fx->shape, fx->tables, fx->tables_size, 0);
    case 9: return fkvf_writer_add_exact(c->w, 0, S, fx->rows, S * ROW_BYTES, 0);
    case 10:
        return fkvf_writer_add_exact(c->w, N - W, W, (const uint8_t *)fx->rows + (N - W) * ROW_BYTES,
                                     W * ROW_BYTES, 0);
    case 11: return fkvf_writer_add_index_segment(c->w, &is, 0, NA, fx->codes, fx->cpp, 1);
    case 12: return fkvf_writer_add_token_segment(c->w, &ts, 0, fx->tokens, N);
    case 13: return fkvf_writer_set_positions(c->w, N, NA);
    case 14: {
        int rc = fkvf_writer_commit(c->w);
        if (rc == FKVF_OK && !c->commit1)
            c->commit1 = c->to_file ? 1 : c->out.size;
        return rc;
    }
    case 15:
        return fkvf_writer_add_section(c->w, FKVF_FOURCC('X', 'T', 'R', 'A'), FKVF_SECTION_DEFLATE,
                                       1, fx->xtra, sizeof fx->xtra);
    case 16:
        return fkvf_writer_add_section(c->w, FKVF_FOURCC('X', 'T', 'R', 'B'), 0, 2, blob,
                                       sizeof blob);
    default: return fkvf_writer_finish(c->w);
    }
}

static int cbw_step(void *ctx, size_t i)
{
    wctx *c = ctx;
    switch (i) {
    case 0: return w_create(c, 0);
    case 1: return fkvf_writer_add_codebooks(c->w, &fx->shape, fx->tables, fx->tables_size, 0);
    default: return fkvf_writer_finish(c->w);
    }
}

static int xw_step(void *ctx, size_t i)
{
    wctx *c = ctx;
    fkvf_desc d = fx_desc();
    fkvf_stream_spec is = idx_spec();
    switch (i) {
    case 0: return w_create(c, FKVF_FEAT_EXTERNAL_CODEBOOK);
    case 1: return fkvf_writer_set_desc(c->w, &d);
    case 2: return fkvf_writer_add_codebook_ref(c->w, &fx->shape, fx->cb_hash, "cb.fkvf");
    case 3: return fkvf_writer_add_exact(c->w, 0, S, fx->rows, S * ROW_BYTES, 0);
    case 4: return fkvf_writer_add_index_segment(c->w, &is, 0, NA, fx->codes, fx->cpp, 1);
    case 5: return fkvf_writer_set_positions(c->w, S + NA, NA);
    default: return fkvf_writer_finish(c->w);
    }
}

/* Restore of every position of an archive in memory: 0 or an error. */
static int restore_all(const uint8_t *data, size_t size, unsigned flags, float *out,
                       uint64_t *commits)
{
    fkvf_reader *r = NULL;
    int rc = fkvf_reader_open_memory(&r, data, size, flags, NULL);
    fkvf_archive_info ai;
    if (!rc)
        rc = fkvf_reader_info(r, &ai);
    if (!rc && commits)
        *commits = ai.n_commits;
    if (!rc && out)
        rc = fkvf_reader_restore(r, 0, ai.n_positions, FKVF_DTYPE_F32, out,
                                 (size_t)ai.n_positions * ROW_F32);
    fkvf_reader_free(r);
    return rc;
}

static fsink *w_ref(const wctx *c)
{
    return c->kind == 0 ? &fx->a : c->kind == 1 ? &fx->cb : &fx->x;
}

static void w_finish(void *ctx, int clean, long stopped)
{
    wctx *c = ctx;
    fsink *ref = w_ref(c);
    if (stopped >= 0) {
        /* failed for good: every later call gives the same error */
        int rc = fkvf_writer_commit(c->w);
        EXPECTF(rc == FKVF_E_NOMEM || rc == FKVF_E_IO || stopped == 0,
                "writer: commit after a failure gave %s", fkvf_error_name(rc));
        if (stopped > 0)
            EXPECT(fkvf_writer_finish(c->w) == rc);
    }
    fkvf_writer_free(c->w);
    c->w = NULL;
    if (c->to_file) {
        EXPECTF(tmp_files() == 0, "writer: a temporary file was left (stopped at %ld)", stopped);
        if (stopped < 0) {
            /* the new archive is in place: the bytes the sink writer wrote */
            EXPECTF(file_is(c->path, ref->data, ref->size),
                    "writer: %s is not the reference archive", c->path);
        } else if (c->no_replace) {
            /* nothing at the path: no partial file, no link */
            struct stat sb;
            EXPECTF(lstat(c->path, &sb) != 0, "writer: %s exists after a failure", c->path);
        } else {
            /* the file that was there is untouched */
            EXPECTF(file_is(c->path, c->old, c->old_size), "writer: %s changed after a failure",
                    c->path);
        }
        return;
    }
    if (stopped < 0) {
        if (clean && ref->size == 0) { /* fx_build: the reference */
            *ref = c->out;
            memset(&c->out, 0, sizeof c->out);
        } else {
            EXPECTF(c->out.size == ref->size && memcmp(c->out.data, ref->data, ref->size) == 0,
                    "writer: the output differs from the reference");
        }
    } else {
        /* what reached the sink is a prefix of the reference; when commit 1
         * was complete it opens (not strict) at commit 1 */
        EXPECT(c->out.size <= ref->size && memcmp(c->out.data, ref->data, c->out.size) == 0);
        if (c->kind == 0 && c->out.size >= c->commit1 && c->commit1 > 0) {
            uint64_t commits = 0;
            EXPECT(restore_all(c->out.data, c->out.size, 0, NULL, &commits) == FKVF_OK);
            /* commit 2 complete: only its sync failed */
            EXPECT(commits == 1 || (commits == 2 && c->out.size == ref->size));
        }
    }
    fs_free(&c->out);
}

static scen w_scen(wctx *c, int kind)
{
    scen s;
    memset(&s, 0, sizeof s);
    c->kind = kind;
    s.ctx = c;
    s.setup = w_setup;
    s.message = w_message;
    s.finish = w_finish;
    s.quiet_io_step = "finish";
    s.syscalls = c->to_file;
    if (kind == 0) {
        s.title = c->to_file ? "writer_file" : "writer_sink";
        s.n_steps = W_STEPS;
        s.names = w_names;
        s.step = w_step;
        /* the metadata is buffered until the commit; set_positions only
         * records the numbers */
        s.kinds = "BBAAAAAABBBBB-BBIB";
    } else if (kind == 1) {
        s.title = c->no_replace ? "writer_noreplace_file"
                  : c->to_file  ? "writer_cbfile_file"
                                : "writer_cbfile";
        s.n_steps = 3;
        s.names = cbw_names;
        s.step = cbw_step;
        s.kinds = "BBB";
    } else {
        s.title = "writer_ext";
        s.n_steps = 7;
        s.names = xw_names;
        s.step = xw_step;
        s.kinds = "BBBBB-B";
    }
    return s;
}

/* ---- fixture construction ------------------------------------------------------ */

static void fx_build(void)
{
    if (fx)
        return;
    fx = REAL_MALLOC(sizeof *fx);
    ck_assert_ptr_nonnull(fx);
    memset(fx, 0, sizeof *fx);
    tu_rng rng = {42};
    for (size_t i = 0; i < N * ROW_BYTES / 2; i++)
        fx->rows[i] = fkvf_f32_to_f16((float)((int)tu_below(&rng, 2001) - 1000) / 500.0f);
    tu_le_u16(fx->rows, N * ROW_BYTES / 2); /* rows are little-endian bytes (fkvf_rows) */
    static const uint32_t words[] = {5, 9, 3, 700, 5, 9, 44, 3};
    for (size_t t = 0; t < N; t++)
        fx->tokens[t] = t % 11 == 10 ? tu_below(&rng, 1000) : words[t % 8];
    for (size_t i = 0; i + 1 < sizeof fx->long_key; i++)
        fx->long_key[i] = (char)('a' + i % 26);
    for (size_t i = 0; i + 1 < sizeof fx->long_text; i++)
        fx->long_text[i] = (char)('A' + i % 26);
    for (size_t i = 0; i < sizeof fx->xtra; i++)
        fx->xtra[i] = (uint8_t)(i % 13 == 0 ? i : 'a' + i % 3);
    fkvf_rvq_params p;
    fx_rvq_params(&p);
    fkvf_rows blk = {fx->rows, N, FKVF_DTYPE_F16, 0};
    ck_assert_int_eq(fkvf_rvq_train(&fx->q, &p, &blk, 1, NULL), FKVF_OK);
    uint32_t heads;
    fkvf_rvq_shape(fx->q, &fx->shape, &heads);
    fx->tables_size = fkvf_rvq_tables_size(fx->q);
    fx->tables = REAL_MALLOC(fx->tables_size);
    ck_assert_int_eq(fkvf_rvq_tables(fx->q, fx->tables, fx->tables_size), FKVF_OK);
    fx->cpp = fkvf_rvq_codes_per_position(fx->q);
    fx->codes = REAL_MALLOC(NA * fx->cpp * sizeof *fx->codes);
    fkvf_rows arch = {(const uint8_t *)fx->rows + S * ROW_BYTES, NA, FKVF_DTYPE_F16, S};
    ck_assert_int_eq(fkvf_rvq_encode(fx->q, &arch, NULL, 1, fx->codes, fx->cpp, 1), FKVF_OK);
    /* the archives: the clean runs of the writer scenarios */
    static wctx c;
    memset(&c, 0, sizeof c);
    scen s = w_scen(&c, 0);
    run_result res;
    run_once(&s, MODE_ALLOC, 0, 1, &res);
    s = w_scen(&c, 1);
    run_once(&s, MODE_ALLOC, 0, 1, &res);
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, fx->cb.data, fx->cb.size, FKVF_OPEN_STRICT, NULL),
                     FKVF_OK);
    ck_assert_int_eq(fkvf_reader_codebook(r, NULL, NULL, NULL, fx->cb_hash), FKVF_OK);
    fkvf_reader_free(r);
    s = w_scen(&c, 2);
    run_once(&s, MODE_ALLOC, 0, 1, &res);
    ck_assert_uint_gt(fx->a.size, 0);
    ck_assert_uint_gt(fx->x.size, 0);
    /* the main archive is valid and restores (strict) */
    ck_assert_int_eq(restore_all(fx->a.data, fx->a.size, FKVF_OPEN_STRICT, NULL, NULL), FKVF_OK);
}

/* ---- reader scenarios ----------------------------------------------------------- */

typedef struct rctx {
    fkvf_reader *r;
    int file;         /* reader_file: open_file with flags */
    unsigned flags;
    char path[128];
    size_t xsec, tok, idx0; /* section and stream indices */
    const void *xdata;
    size_t xsize;
    fkvf_desc d;
    size_t n_meta;
    uint64_t meta_sum;
    fkvf_meta_entry found;
    fkvf_stream_info si;
    fkvf_stream_spec sp;
    size_t seg_section;
    uint64_t seg_first, seg_count;
    uint32_t sym;
    uint8_t u8[NA];
    uint32_t toks[N];
    fkvf_point pt;
    const void *xrow;
    size_t xrow_bytes;
    int is_exact;
    fkvf_codebook_shape cbs;
    uint8_t cb_hash[16];
    int is_ext;
    size_t row_bytes, read_bytes;
    float restored[N * ROW_F32 / 4];
    uint16_t partial[N * ROW_BYTES / 2];
    float one[ROW_F32 / 4]; /* archived position S + 3, all of it (the index row cache) */
    /* references (the clean run) */
    int have_ref;
    float ref_restored[N * ROW_F32 / 4];
    uint16_t ref_partial[N * ROW_BYTES / 2];
    uint8_t ref_u8[NA];
    fkvf_point ref_pt;
} rctx;

static const char *const r_names[] = {
    "open_memory", "info",  "section",   "section_data", "desc",      "meta_count",
    "meta",        "meta_find", "stream_count", "stream_find", "stream_info", "stream_spec",
    "stream_segment", "stream_get", "stream_read_u8", "stream_read", "stream_point",
    "exact_row",   "is_exact", "codebook",  "codebook_ref", "row_bytes", "restore",
    "read_size",   "read",   "set_row_cache", "read_one", "verify"};
enum { R_STEPS = sizeof r_names / sizeof r_names[0] };

static const char *r_message(void *ctx)
{
    rctx *c = ctx;
    return c->r ? fkvf_reader_message(c->r) : NULL;
}

static void r_setup(void *ctx)
{
    rctx *c = ctx;
    c->r = NULL;
    if (c->file)
        tu_write_file(c->path, fx->a.data, fx->a.size);
}

static fkvf_read_request r_request(void)
{
    fkvf_read_request q;
    memset(&q, 0, sizeof q);
    q.first = 1;
    q.count = N - 3;
    q.layer_first = 1;
    q.head_first = 1;
    q.parts = FKVF_PART_VALUES;
    q.dtype = FKVF_DTYPE_F16;
    q.layout = FKVF_LAYOUT_HEADS;
    return q;
}

static int r_step(void *ctx, size_t i)
{
    rctx *c = ctx;
    int rc;
    fkvf_archive_info ai;
    fkvf_read_request q = r_request();
    switch (i) {
    case 0:
        fkvf_reader_free(c->r);
        c->r = NULL;
        return fkvf_reader_open_memory(&c->r, fx->a.data, fx->a.size, FKVF_OPEN_STRICT, &AL);
    case 1:
        if ((rc = fkvf_reader_info(c->r, &ai)))
            return rc;
        return ai.n_positions == N && ai.n_commits == 2 ? FKVF_OK : FKVF_E_CORRUPT;
    case 2:
        if ((rc = fkvf_reader_info(c->r, &ai)))
            return rc;
        for (size_t k = 0; k < ai.n_sections; k++) {
            fkvf_section_info si;
            if ((rc = fkvf_reader_section(c->r, k, &si)))
                return rc;
            if (si.type == FKVF_FOURCC('X', 'T', 'R', 'A') && (si.flags & FKVF_SECTION_DEFLATE)) {
                c->xsec = k;
                return FKVF_OK;
            }
        }
        return FKVF_E_NOT_FOUND;
    case 3: return fkvf_reader_section_data(c->r, c->xsec, &c->xdata, &c->xsize);
    case 4: return fkvf_reader_desc(c->r, &c->d);
    case 5: return fkvf_reader_meta_count(c->r, &c->n_meta);
    case 6:
        c->meta_sum = 0;
        for (size_t k = 0; k < c->n_meta; k++) {
            fkvf_meta_entry e;
            if ((rc = fkvf_reader_meta(c->r, k, &e)))
                return rc;
            c->meta_sum += e.key_len + e.value_len;
        }
        return FKVF_OK;
    case 7: return fkvf_reader_meta_find(c->r, "s", &c->found);
    case 8: {
        size_t n;
        if ((rc = fkvf_reader_stream_count(c->r, &n)))
            return rc;
        return n == (size_t)L * H * (KS + VS) + 1 ? FKVF_OK : FKVF_E_CORRUPT;
    }
    case 9:
        if ((rc = fkvf_reader_stream_find(c->r, FKVF_STREAM_ID_TOKENS, &c->tok)))
            return rc;
        return fkvf_reader_stream_find(c->r, FKVF_STREAM_ID(FKVF_STREAM_KIND_INDEX, 1, 1, 1, 0),
                                       &c->idx0);
    case 10: return fkvf_reader_stream_info(c->r, c->tok, &c->si);
    case 11: return fkvf_reader_stream_spec(c->r, c->tok, &c->sp);
    case 12:
        return fkvf_reader_stream_segment(c->r, c->tok, 0, &c->seg_section, &c->seg_first,
                                          &c->seg_count);
    case 13: return fkvf_reader_stream_get(c->r, c->tok, 37, &c->sym);
    case 14: return fkvf_reader_stream_read_u8(c->r, c->idx0, 0, c->u8, NA);
    case 15: return fkvf_reader_stream_read(c->r, c->tok, 0, c->toks, N);
    case 16: return fkvf_reader_stream_point(c->r, c->tok, 50, &c->pt);
    case 17: return fkvf_reader_exact_row(c->r, N - 1, &c->xrow, &c->xrow_bytes);
    case 18: return fkvf_reader_is_exact(c->r, S + 3, &c->is_exact);
    case 19: return fkvf_reader_codebook(c->r, &c->cbs, NULL, NULL, c->cb_hash);
    case 20: return fkvf_reader_codebook_ref(c->r, &c->is_ext, NULL, NULL);
    case 21: return fkvf_reader_row_bytes(c->r, FKVF_DTYPE_F32, &c->row_bytes);
    case 22:
        return fkvf_reader_restore(c->r, 0, N, FKVF_DTYPE_F32, c->restored, sizeof c->restored);
    case 23: return fkvf_reader_read_size(c->r, &q, &c->read_bytes);
    case 24: return fkvf_reader_read(c->r, &q, c->partial, sizeof c->partial);
    case 25: return fkvf_reader_set_row_cache(c->r, FKVF_ROW_CACHE_DEFAULT);
    case 26: {
        fkvf_read_request one = {S + 3, 1, 0, 0, 0, 0, 0, FKVF_DTYPE_F32, FKVF_LAYOUT_ROWS};
        return fkvf_reader_read(c->r, &one, c->one, sizeof c->one);
    }
    default: return fkvf_reader_verify(c->r);
    }
}

static void r_finish(void *ctx, int clean, long stopped)
{
    rctx *c = ctx;
    /* a reader never fails for good: the failed call, retried, succeeded */
    EXPECTF(stopped < 0, "reader: %s failed again when retried", stopped >= 0 ? r_names[stopped] : "");
    if (stopped < 0) {
        /* what the archive holds (independent of the reader) */
        EXPECT(c->xsize == sizeof fx->xtra && memcmp(c->xdata, fx->xtra, c->xsize) == 0);
        EXPECT(!strcmp(c->d.model_id, "test/inject") && !strcmp(c->d.tokenizer_id, "tok"));
        EXPECT(c->d.n_layers == L && c->d.window == W);
        EXPECT(c->n_meta == 6);
        EXPECT(c->meta_sum == 1 + 1 + 25 + 8 + 119 + 8 + 239 + 8 + 1 + 399 + 1 + 1000);
        EXPECT(c->found.value_len == 399 && !memcmp(c->found.value, fx->long_text, 399));
        EXPECT(c->si.length == N && c->sp.symbol_bits == 10 && c->seg_first == 0 &&
               c->seg_count == N);
        EXPECT(c->sym == fx->tokens[37]);
        EXPECT(memcmp(c->toks, fx->tokens, sizeof c->toks) == 0);
        for (size_t t = 0; t < NA; t++) /* layer 1, head 1, values, stage 0 */
            EXPECT(c->u8[t] == fx->codes[t * fx->cpp + (1 * H + 1) * (KS + VS) + KS]);
        EXPECT(c->xrow_bytes == ROW_BYTES &&
               !memcmp(c->xrow, (const uint8_t *)fx->rows + (N - 1) * ROW_BYTES, ROW_BYTES));
        EXPECT(c->is_exact == 0 && c->is_ext == 0);
        EXPECT(c->cbs.k == K && !memcmp(c->cb_hash, fx->cb_hash, 16));
        EXPECT(c->row_bytes == ROW_F32 && c->read_bytes == (size_t)(N - 3) * 1 * 1 * D * 2);
        /* one position read whole (through the row cache; a failure to
         * allocate it was reported and the retry succeeded) is its restored
         * row */
        EXPECT(!memcmp(c->one, c->restored + (S + 3) * ROW_F32 / 4, sizeof c->one));
        /* exact positions restore to their rows (both little-endian) */
        for (size_t e = 0; e < (size_t)L * H * 2 * D; e++) {
            EXPECT(tu_ldf32le(&c->restored[e]) == fkvf_f16_to_f32(tu_ld16le(&fx->rows[e])));
            EXPECT(tu_ldf32le(&c->restored[(N - 1) * ROW_F32 / 4 + e]) ==
                   fkvf_f16_to_f32(tu_ld16le(&fx->rows[(N - 1) * ROW_BYTES / 2 + e])));
        }
        if (clean && !c->have_ref) {
            memcpy(c->ref_restored, c->restored, sizeof c->restored);
            memcpy(c->ref_partial, c->partial, c->read_bytes);
            c->ref_pt = c->pt;
            c->have_ref = 1;
        } else {
            EXPECT(!memcmp(c->restored, c->ref_restored, sizeof c->restored));
            EXPECT(!memcmp(c->partial, c->ref_partial, c->read_bytes));
            EXPECT(c->pt.x == c->ref_pt.x && c->pt.y == c->ref_pt.y);
        }
    }
    fkvf_reader_free(c->r);
    c->r = NULL;
}

/* open_file (flags), restore, verify */
static const char *const rf_names[] = {"open_file", "restore", "verify"};

static int rf_step(void *ctx, size_t i)
{
    rctx *c = ctx;
    switch (i) {
    case 0:
        fkvf_reader_free(c->r);
        c->r = NULL;
        return fkvf_reader_open_file(&c->r, c->path, c->flags, &AL);
    case 1:
        return fkvf_reader_restore(c->r, 0, N, FKVF_DTYPE_F32, c->restored, sizeof c->restored);
    default: return fkvf_reader_verify(c->r);
    }
}

/* reader_source: a source over the archive's bytes (test_source has its
 * read failures); its steps and checks are reader_file's */
static const char *const rs_names[] = {"open_source", "restore", "verify"};

static int rs_read(void *opaque, uint64_t off, void *buf, size_t n)
{
    (void)opaque;
    memcpy(buf, fx->a.data + off, n);
    return FKVF_OK;
}

/* the unit of the open, and the block cache's budget set after it (0:
 * the default) */
static uint32_t rs_unit = 512;
static uint64_t rs_budget;

static int rs_step(void *ctx, size_t i)
{
    rctx *c = ctx;
    if (i == 0) {
        fkvf_reader_free(c->r);
        c->r = NULL;
        fkvf_source src = {rs_read, NULL, fx->a.size};
        int rc = fkvf_reader_open_source(&c->r, &src, rs_unit, "source", c->flags, &AL);
        return rc || !rs_budget ? rc : fkvf_reader_set_source_cache(c->r, rs_budget);
    }
    return rf_step(ctx, i);
}

static void rf_finish(void *ctx, int clean, long stopped)
{
    rctx *c = ctx;
    (void)clean;
    EXPECTF(stopped < 0, "%s: %s failed again when retried",
            c->file ? "reader_file" : "reader_source", stopped >= 0 ? rf_names[stopped] : "");
    float *ref = REAL_MALLOC(sizeof c->restored);
    ck_assert_ptr_nonnull(ref);
    EXPECT(restore_all(fx->a.data, fx->a.size, FKVF_OPEN_STRICT, ref, NULL) == FKVF_OK);
    if (stopped < 0)
        EXPECT(!memcmp(ref, c->restored, sizeof c->restored));
    REAL_FREE(ref);
    fkvf_reader_free(c->r);
    c->r = NULL;
    if (c->file) /* the reader never writes its file */
        EXPECT(file_is(c->path, fx->a.data, fx->a.size));
}

/* an archive that refers to an external codebook: attach, restore, read */
typedef struct xctx {
    fkvf_reader *r, *cb;
    int is_ext;
    const char *name;
    float restored[N * ROW_F32 / 4];
    uint16_t partial[N * ROW_BYTES / 2];
    int have_ref;
    float ref_restored[N * ROW_F32 / 4];
} xctx;

static const char *const x_names[] = {"open_memory(archive)", "open_memory(codebook)",
                                      "codebook_ref", "attach_codebook", "codebook", "restore",
                                      "read"};

static const char *x_message(void *ctx)
{
    xctx *c = ctx;
    fkvf_reader *r = g.step == 1 ? c->cb : c->r; /* the handle of the step */
    return r ? fkvf_reader_message(r) : NULL;
}

static void x_setup(void *ctx)
{
    xctx *c = ctx;
    c->r = c->cb = NULL;
}

static int x_step(void *ctx, size_t i)
{
    xctx *c = ctx;
    fkvf_read_request q = r_request();
    q.count = S + NA - 1;
    switch (i) {
    case 0:
        fkvf_reader_free(c->r);
        c->r = NULL;
        return fkvf_reader_open_memory(&c->r, fx->x.data, fx->x.size, FKVF_OPEN_STRICT, &AL);
    case 1:
        fkvf_reader_free(c->cb);
        c->cb = NULL;
        return fkvf_reader_open_memory(&c->cb, fx->cb.data, fx->cb.size, FKVF_OPEN_STRICT, &AL);
    case 2: return fkvf_reader_codebook_ref(c->r, &c->is_ext, NULL, &c->name);
    case 3: return fkvf_reader_attach_codebook(c->r, c->cb);
    case 4: return fkvf_reader_codebook(c->r, NULL, NULL, NULL, NULL);
    case 5:
        return fkvf_reader_restore(c->r, 0, S + NA, FKVF_DTYPE_F32, c->restored,
                                   (S + NA) * ROW_F32);
    default: return fkvf_reader_read(c->r, &q, c->partial, sizeof c->partial);
    }
}

static void x_finish(void *ctx, int clean, long stopped)
{
    xctx *c = ctx;
    (void)clean;
    EXPECTF(stopped < 0, "reader_ext: %s failed again when retried",
            stopped >= 0 ? x_names[stopped] : "");
    if (stopped < 0) {
        EXPECT(c->is_ext == 1 && !strcmp(c->name, "cb.fkvf"));
        if (!c->have_ref) {
            /* the same codes and codebook as the main archive: the same rows */
            float *a = REAL_MALLOC(N * ROW_F32);
            ck_assert_ptr_nonnull(a);
            EXPECT(restore_all(fx->a.data, fx->a.size, 0, a, NULL) == FKVF_OK);
            EXPECT(!memcmp(a, c->restored, (S + NA) * ROW_F32));
            REAL_FREE(a);
            memcpy(c->ref_restored, c->restored, (S + NA) * ROW_F32);
            c->have_ref = 1;
        }
        EXPECT(!memcmp(c->restored, c->ref_restored, (S + NA) * ROW_F32));
    }
    fkvf_reader_free(c->r);
    fkvf_reader_free(c->cb);
    c->r = c->cb = NULL;
}

/* fkvf_reader_find_codebook: the archive that refers to cb.fkvf, with the
 * codebook file in tmpdir; by the name hint next to the archive (open_file,
 * flags), or by content hash under another name in the search path (the
 * archive from memory: no directory of its own). */
typedef struct fctx {
    fkvf_reader *r, *cb;
    int by_path;     /* 0: archive file + hint; 1: memory archive + search path */
    unsigned flags;
    char apath[128]; /* the archive (by_path 0) */
    float restored[N * ROW_F32 / 4];
} fctx;

static const char *const f_names[] = {"open", "find_codebook", "restore"};

static const char *f_message(void *ctx)
{
    fctx *c = ctx;
    return c->r ? fkvf_reader_message(c->r) : NULL;
}

static void f_setup(void *ctx)
{
    fctx *c = ctx;
    c->r = c->cb = NULL;
}

static int f_step(void *ctx, size_t i)
{
    fctx *c = ctx;
    switch (i) {
    case 0:
        fkvf_reader_free(c->r);
        c->r = NULL;
        if (c->by_path)
            return fkvf_reader_open_memory(&c->r, fx->x.data, fx->x.size, c->flags, &AL);
        return fkvf_reader_open_file(&c->r, c->apath, c->flags, &AL);
    case 1:
        fkvf_reader_free(c->cb);
        c->cb = NULL;
        return fkvf_reader_find_codebook(c->r, c->by_path ? tmpdir : NULL, &c->cb);
    default:
        return fkvf_reader_restore(c->r, 0, S + NA, FKVF_DTYPE_F32, c->restored,
                                   (S + NA) * ROW_F32);
    }
}

static void f_finish(void *ctx, int clean, long stopped)
{
    fctx *c = ctx;
    (void)clean;
    EXPECTF(stopped < 0, "reader_find: %s failed again when retried",
            stopped >= 0 ? f_names[stopped] : "");
    if (stopped < 0) {
        EXPECT(c->cb != NULL);
        /* the same codes and codebook as the main archive: the same rows */
        float *a = REAL_MALLOC(N * ROW_F32);
        ck_assert_ptr_nonnull(a);
        EXPECT(restore_all(fx->a.data, fx->a.size, 0, a, NULL) == FKVF_OK);
        EXPECT(!memcmp(a, c->restored, (S + NA) * ROW_F32));
        REAL_FREE(a);
    }
    fkvf_reader_free(c->r);
    fkvf_reader_free(c->cb);
    c->r = c->cb = NULL;
}

/* ---- search -------------------------------------------------------------------- */

enum { QLEN = 3, CAP = N };

typedef struct sctx {
    const uint8_t *data; /* the archive */
    size_t size;
    int has_zidx;
    int partial; /* only the steps up to search_radius */
    fkvf_reader *r;
    fkvf_search *s;
    size_t tok;
    fkvf_search_status info;
    uint64_t found[CAP], n_found;
    fkvf_match longest[4];
    size_t n_longest;
    fkvf_point qp;
    uint64_t rad[CAP];
    fkvf_radius_result rr;
    uint32_t ctxs[8];
    size_t n_ctx;
    fkvf_prefix_reuse pr;
    uint8_t *zidx; /* the index built (copy) */
    size_t zsize;
    uint64_t zkey;
    uint8_t *zidx_as; /* built by fkvf_search_index_build_as (copy) */
    size_t zsize_as;
} sctx;

static const uint32_t query[QLEN] = {5, 9, 3};
static const uint32_t prompt[6] = {5, 9, 3, 700, 5, 1023};

static const char *const s_names[] = {"search_open", "search_info_get", "search_suffix",
                                      "search_longest", "search_query_point",
                                      "search_default_radius", "search_radius",
                                      "search_context", "search_prefix_reuse",
                                      "search_index_build", "search_index_build_as"};

static const char *s_message(void *ctx)
{
    sctx *c = ctx;
    return c->s ? fkvf_search_message(c->s) : NULL;
}

static void s_setup(void *ctx)
{
    sctx *c = ctx;
    c->s = NULL;
    c->r = NULL;
    ck_assert_int_eq(fkvf_reader_open_memory(&c->r, c->data, c->size, 0, &AL), FKVF_OK);
    ck_assert_int_eq(fkvf_reader_stream_find(c->r, FKVF_STREAM_ID_TOKENS, &c->tok), FKVF_OK);
    REAL_FREE(c->zidx);
    c->zidx = NULL;
    REAL_FREE(c->zidx_as);
    c->zidx_as = NULL;
}

/* a copy of the index the library built (d, n) in *keep, outside the
 * counted allocations; the library's buffer freed */
static void keep_index(uint8_t **keep, size_t *keep_n, void *d, size_t n)
{
    REAL_FREE(*keep);
    *keep = REAL_MALLOC(n);
    memcpy(*keep, d, n);
    *keep_n = n;
    fkvf_search_buffer_free(d, NULL);
}

static int s_step(void *ctx, size_t i)
{
    sctx *c = ctx;
    int rc;
    switch (i) {
    case 0:
        fkvf_search_free(c->s);
        c->s = NULL;
        return fkvf_search_open(&c->s, c->r, c->tok, 0, &AL);
    case 1: return fkvf_search_info(c->s, &c->info);
    case 2: return fkvf_search_suffix(c->s, query, QLEN, c->found, CAP, &c->n_found);
    case 3: return fkvf_search_longest(c->s, prompt, 6, 4, c->longest, &c->n_longest);
    case 4: return fkvf_search_query_point(c->s, query, QLEN, &c->qp);
    case 5: return fkvf_search_default_radius(c->s, QLEN) > 0 ? FKVF_OK : FKVF_E_CORRUPT;
    case 6: return fkvf_search_radius(c->s, query, QLEN, 0, c->rad, CAP, &c->rr);
    case 7: return fkvf_search_context(c->r, c->tok, 40, 8, c->ctxs, &c->n_ctx);
    case 8: return fkvf_search_prefix_reuse(c->r, prompt, 6, &c->pr);
    case 9: {
        void *d = NULL;
        size_t n = 0;
        if ((rc = fkvf_search_index_build(c->r, c->tok, &d, &n, &c->zkey, NULL)))
            return rc;
        keep_index(&c->zidx, &c->zsize, d, n);
        return FKVF_OK;
    }
    default: {
        /* a named stream, given its own name: the same index */
        void *d = NULL;
        size_t n = 0;
        if ((rc = fkvf_search_index_build_as(c->r, c->tok, FKVF_STREAM_ID_TOKENS, &d, &n, NULL)))
            return rc;
        keep_index(&c->zidx_as, &c->zsize_as, d, n);
        return FKVF_OK;
    }
    }
}

/* positions t >= len-1 whose last len tokens equal q */
static size_t naive_suffix(const uint32_t *q, size_t len, uint64_t *out)
{
    size_t n = 0;
    for (size_t t = len - 1; t < N; t++) {
        size_t j = 0;
        while (j < len && fx->tokens[t - j] == q[len - 1 - j])
            j++;
        if (j == len)
            out[n++] = t;
    }
    return n;
}

static uint8_t *zidx_ref;
static size_t zidx_ref_size;
static uint64_t zidx_ref_key;

static void s_finish(void *ctx, int clean, long stopped)
{
    sctx *c = ctx;
    (void)clean;
    EXPECTF(stopped < 0, "search: %s failed again when retried",
            stopped >= 0 ? s_names[stopped] : "");
    if (stopped < 0) {
        uint64_t want[CAP];
        size_t nw = naive_suffix(query, QLEN, want);
        EXPECT(nw >= 2 && c->n_found == nw && !memcmp(c->found, want, nw * sizeof *want));
        EXPECT(c->rr.verified == nw && !memcmp(c->rad, want, nw * sizeof *want));
        EXPECT(c->info.length == N && (c->info.n_indexed > 0) == (c->has_zidx != 0));
        /* the longest match of the prompt's tail (..., 5, 1023): 1023 never
         * occurs (tokens are below 1000), so nothing matches it */
        EXPECT(c->n_longest == 0);
    }
    if (stopped < 0 && !c->partial) {
        EXPECT(c->n_ctx == 8 && !memcmp(c->ctxs, fx->tokens + 33, 8 * sizeof *c->ctxs));
        uint64_t pl = 0;
        while (pl < 6 && prompt[pl] == fx->tokens[pl])
            pl++;
        EXPECT(c->pr.prefix_len == pl && c->pr.archive_positions == N && c->pr.match_len == 0);
        if (!zidx_ref) {
            zidx_ref = REAL_MALLOC(c->zsize);
            memcpy(zidx_ref, c->zidx, c->zsize);
            zidx_ref_size = c->zsize;
            zidx_ref_key = c->zkey;
        }
        EXPECT(c->zsize == zidx_ref_size && !memcmp(c->zidx, zidx_ref, c->zsize) &&
               c->zkey == zidx_ref_key);
        EXPECT(c->zsize_as == zidx_ref_size && !memcmp(c->zidx_as, zidx_ref, c->zsize_as));
    }
    fkvf_search_free(c->s);
    fkvf_reader_free(c->r);
    c->s = NULL;
    c->r = NULL;
    REAL_FREE(c->zidx);
    c->zidx = NULL;
    REAL_FREE(c->zidx_as);
    c->zidx_as = NULL;
}


/* key retrieval: open, then two queries (the whole archived range with every
 * candidate, so the answer is exact; a part of it with the default
 * candidates and chunks of 5 positions), answers equal to the run without
 * failures */
typedef struct kctx {
    fkvf_reader *r;
    fkvf_key_search *ks;
    fkvf_key_hit hits[2][8];
    size_t n[2];
} kctx;

static const char *const k_names[] = {"search_keys_open", "search_keys_all", "search_keys_part"};
static fkvf_key_hit keys_ref[2][8];
static size_t keys_ref_n[2];
static int keys_ref_set;

static const char *k_message(void *ctx)
{
    kctx *c = ctx;
    return c->ks ? fkvf_search_keys_message(c->ks) : NULL;
}

static void k_setup(void *ctx)
{
    kctx *c = ctx;
    c->ks = NULL;
    c->r = NULL;
    ck_assert_int_eq(fkvf_reader_open_memory(&c->r, fx->a.data, fx->a.size, 0, &AL), FKVF_OK);
}

static int k_step(void *ctx, size_t i)
{
    kctx *c = ctx;
    static const float q[D] = {1.0f, -0.5f, 0.25f, 2.0f};
    if (i == 0) {
        fkvf_search_keys_free(c->ks);
        c->ks = NULL;
        return fkvf_search_keys_open(&c->ks, c->r, &AL);
    }
    fkvf_key_query kq = {1, 1, q, D, 0, 0, 8, i == 1 ? FKVF_KEY_CANDIDATES_MAX : 0,
                         i == 1 ? 0 : 5};
    if (i == 2) {
        kq.first = S + 10;
        kq.end = S + 40;
    }
    return fkvf_search_keys(c->ks, &kq, c->hits[i - 1], &c->n[i - 1], NULL);
}

static void k_finish(void *ctx, int clean, long stopped)
{
    kctx *c = ctx;
    EXPECTF(stopped < 0, "search_keys: %s failed again when retried",
            stopped >= 0 ? k_names[stopped] : "");
    if (stopped < 0) {
        if (clean && !keys_ref_set) {
            memcpy(keys_ref, c->hits, sizeof keys_ref);
            memcpy(keys_ref_n, c->n, sizeof keys_ref_n);
            keys_ref_set = 1;
        }
        EXPECT(c->n[0] == 8 && c->n[1] == 8);
        EXPECT(!memcmp(c->n, keys_ref_n, sizeof keys_ref_n) &&
               !memcmp(c->hits, keys_ref, sizeof keys_ref));
    }
    fkvf_search_keys_free(c->ks);
    fkvf_reader_free(c->r);
    c->ks = NULL;
    c->r = NULL;
}

/* open + verify of an archive with a ZIDX section (its verification allocates) */
typedef struct zctx {
    const uint8_t *data;
    size_t size;
    fkvf_reader *r;
} zctx;

static const char *const z_names[] = {"open_memory", "verify"};

static const char *z_message(void *ctx)
{
    zctx *c = ctx;
    return c->r ? fkvf_reader_message(c->r) : NULL;
}

static void z_setup(void *ctx)
{
    zctx *c = ctx;
    c->r = NULL;
}

static int z_step(void *ctx, size_t i)
{
    zctx *c = ctx;
    if (i == 0) {
        fkvf_reader_free(c->r);
        c->r = NULL;
        return fkvf_reader_open_memory(&c->r, c->data, c->size, FKVF_OPEN_STRICT, &AL);
    }
    return fkvf_reader_verify(c->r);
}

static void z_finish(void *ctx, int clean, long stopped)
{
    zctx *c = ctx;
    (void)clean;
    EXPECTF(stopped < 0, "reader_zidx: %s failed again when retried",
            stopped >= 0 ? z_names[stopped] : "");
    fkvf_reader_free(c->r);
    c->r = NULL;
}

/* ---- fkvf_archive_append_sections ---------------------------------------------- */

typedef struct actx {
    char path[128];
    char msg[1024];      /* the error of the last call */
    const uint8_t *base; /* the file before */
    size_t base_size;
} actx;

static const char *const as_names[] = {"archive_append_sections"};

static const char *as_message(void *ctx)
{
    actx *c = ctx;
    return c->msg;
}

static void as_setup(void *ctx)
{
    actx *c = ctx;
    c->msg[0] = 0;
    tu_write_file(c->path, c->base, c->base_size);
}

static int as_step(void *ctx, size_t i)
{
    actx *c = ctx;
    (void)i;
    static const uint8_t extra[70] = {9};
    fkvf_section_add secs[2] = {
        {FKVF_SECTION_ZPOS, 0, zidx_ref_key, zidx_ref, zidx_ref_size},
        {FKVF_FOURCC('X', 'T', 'R', 'C'), 0, 3, extra, sizeof extra}};
    fkvf_archive_op *op = NULL;
    int rc = fkvf_archive_append_sections(&op, c->path, secs, 2, FKVF_SYNC_COMMIT);
    fkvf_error_info e;
    if (fkvf_archive_op_error(op, &e) == FKVF_OK) /* op NULL: its allocation failed */
        snprintf(c->msg, sizeof c->msg, "%s", e.message);
    else
        snprintf(c->msg, sizeof c->msg, "%s", fkvf_strerror(rc));
    fkvf_archive_op_free(op);
    return rc;
}

/* the file opens strict at n commits with the cache of the main archive */
static void expect_archive(const char *path, uint64_t commits)
{
    size_t n;
    uint8_t *p = tu_read_file(path, &n, &REAL_AL);
    ck_assert_ptr_nonnull(p);
    uint64_t got = 0;
    float *a = REAL_MALLOC(N * ROW_F32), *b = REAL_MALLOC(N * ROW_F32);
    EXPECTF(restore_all(p, n, FKVF_OPEN_STRICT, a, &got) == FKVF_OK && got == commits,
            "%s: does not open strict at commit %llu (%llu)", path, (unsigned long long)commits,
            (unsigned long long)got);
    EXPECT(restore_all(fx->a.data, fx->a.size, 0, b, NULL) == FKVF_OK);
    EXPECT(!memcmp(a, b, N * ROW_F32));
    REAL_FREE(a);
    REAL_FREE(b);
    REAL_FREE(p);
}

static void as_after_fail(void *ctx, size_t i)
{
    actx *c = ctx;
    (void)i;
    /* cut back: the file is the archive it was */
    EXPECTF(file_is(c->path, c->base, c->base_size), "append_sections: the file changed (%s)",
            c->msg);
}

static void as_finish(void *ctx, int clean, long stopped)
{
    actx *c = ctx;
    (void)clean;
    EXPECT(stopped < 0);
    if (stopped < 0)
        expect_archive(c->path, 3);
}

/* ---- fkvf_archive_compact ------------------------------------------------------- */

typedef struct cctx {
    char src[128], dst[128];
    int in_place;
    fkvf_archive_op *h;
} cctx;

static const char *const cp_names[] = {"archive_compact"};

static const char *cp_message(void *ctx)
{
    cctx *c = ctx;
    fkvf_error_info e;
    return c->h && fkvf_archive_op_error(c->h, &e) == FKVF_OK ? e.message : NULL;
}

static void cp_setup(void *ctx)
{
    cctx *c = ctx;
    c->h = NULL;
    tu_write_file(c->src, fx->a.data, fx->a.size);
    unlink(c->dst);
}

static int cp_step(void *ctx, size_t i)
{
    cctx *c = ctx;
    (void)i;
    fkvf_archive_op_free(c->h);
    c->h = NULL;
    fkvf_compact_options o;
    fkvf_compact_options_init(&o);
    o.in_place = c->in_place;
    o.no_replace = 1;
    return fkvf_archive_compact(&c->h, c->src, c->in_place ? NULL : c->dst, &o, NULL);
}

/* a failed compaction leaves its input as it was, no output, no temporary file */
static void cp_after_fail(void *ctx, size_t i)
{
    cctx *c = ctx;
    (void)i;
    EXPECTF(file_is(c->src, fx->a.data, fx->a.size), "compact: the input changed (%s)",
            cp_message(c));
    EXPECT(c->in_place || access(c->dst, F_OK) != 0);
    EXPECT(tmp_files() == 0);
}

static void cp_finish(void *ctx, int clean, long stopped)
{
    cctx *c = ctx;
    (void)clean;
    fkvf_archive_op_free(c->h);
    c->h = NULL;
    EXPECT(stopped < 0);
    EXPECT(tmp_files() == 0);
    if (stopped < 0)
        expect_archive(c->in_place ? c->src : c->dst, 1);
}

/* ---- fkvf_archive_recover --------------------------------------------------------- */

typedef struct rvctx {
    char path[128];
    uint8_t *torn; /* the main archive and a torn tail of 100 bytes */
    size_t torn_size;
    fkvf_archive_op *h;
} rvctx;

static const char *const rv_names[] = {"archive_recover"};

static const char *rv_message(void *ctx)
{
    rvctx *c = ctx;
    fkvf_error_info e;
    return c->h && fkvf_archive_op_error(c->h, &e) == FKVF_OK ? e.message : NULL;
}

static void rv_setup(void *ctx)
{
    rvctx *c = ctx;
    c->h = NULL;
    tu_write_file(c->path, c->torn, c->torn_size);
}

static int rv_step(void *ctx, size_t i)
{
    rvctx *c = ctx;
    (void)i;
    fkvf_archive_op_free(c->h);
    c->h = NULL;
    return fkvf_archive_recover(&c->h, c->path, NULL, NULL);
}

/* a failed recovery leaves the file torn as it was, or cut (a failure after
 * the cut: its sync, the check) */
static void rv_after_fail(void *ctx, size_t i)
{
    rvctx *c = ctx;
    (void)i;
    EXPECTF(file_is(c->path, c->torn, c->torn_size) || file_is(c->path, fx->a.data, fx->a.size),
            "recover: the file is neither as it was nor cut (%s)", rv_message(c));
}

static void rv_finish(void *ctx, int clean, long stopped)
{
    rvctx *c = ctx;
    (void)clean;
    fkvf_archive_op_free(c->h);
    c->h = NULL;
    EXPECT(stopped < 0);
    if (stopped < 0)
        EXPECTF(file_is(c->path, fx->a.data, fx->a.size), "recover: the file is not cut (%s)",
                clean ? "clean run" : "after a failure");
}

/* ---- appender (system calls; its allocations and fkvf_io: test_append) --------- */

typedef struct pctx {
    char path[128];
    fkvf_appender *a;
    uint64_t committed; /* positions of the last successful commit */
    int spill;          /* 16-bit index symbols (unit 8) and the smallest queue: the
                         * appends write what is decided before the commit */
} pctx;

static const char *const ap_names[] = {"appender_create", "appender_append", "appender_commit",
                                       "appender_open",   "appender_append", "appender_commit",
                                       "appender_sync"};

/* appender_spill: the steps of ap_names with the queue set after the
 * create and the open (-1) */
static const char *const aps_names[] = {"appender_create",    "appender_set_queue",
                                        "appender_append",    "appender_commit",
                                        "appender_open",      "appender_set_queue",
                                        "appender_append",    "appender_commit",
                                        "appender_sync"};
static const int aps_step[] = {0, -1, 1, 2, 3, -1, 4, 5, 6};

static const char *ap_message(void *ctx)
{
    pctx *c = ctx;
    return c->a ? fkvf_appender_message(c->a) : NULL;
}

static void ap_setup(void *ctx)
{
    pctx *c = ctx;
    c->a = NULL;
    c->committed = 0;
    unlink(c->path);
}

static int ap_step(void *ctx, size_t i)
{
    pctx *c = ctx;
    fkvf_append_options o;
    fkvf_append_options_init(&o);
    o.block_size = 64;
    /* the commits' own calls; the automatic compaction's (a failure there
     * leaves the commit standing, FKVF_OK) are test_append_compact's */
    o.no_auto_compact = 1;
    int rc;
    if (c->spill) {
        if (aps_step[i] < 0)
            return fkvf_appender_set_queue_bytes(c->a, 1);
        i = (size_t)aps_step[i];
    }
    switch (i) {
    case 0: {
        fkvf_desc d = fx_desc();
        fkvf_append_create cr;
        memset(&cr, 0, sizeof cr);
        cr.desc = &d;
        cr.codebook = fx->q;
        cr.token_codec = tok_spec();
        if (c->spill) {
            cr.index_codec = idx_spec();
            cr.index_codec.symbol_bits = 16;
        }
        fkvf_appender_free(c->a);
        c->a = NULL;
        return fkvf_appender_create(&c->a, c->path, &cr, &o, NULL);
    }
    case 1: return fkvf_appender_append(c->a, fx->rows, 20 * ROW_BYTES, 20, fx->tokens);
    case 2:
    case 5:
        if ((rc = fkvf_appender_commit(c->a)) == FKVF_OK)
            c->committed = i == 2 ? 20 : N;
        return rc;
    case 3:
        fkvf_appender_free(c->a);
        c->a = NULL;
        o.sync = FKVF_SYNC_NONE;
        return fkvf_appender_open(&c->a, c->path, &o, NULL);
    case 4:
        return fkvf_appender_append(c->a, (const uint8_t *)fx->rows + 20 * ROW_BYTES,
                                    (N - 20) * ROW_BYTES, N - 20, fx->tokens + 20);
    default: return fkvf_appender_sync(c->a);
    }
}

/* the file opens strict at the last commit that succeeded, with its rows */
static void ap_check_file(const pctx *c)
{
    struct stat sb;
    if (stat(c->path, &sb) != 0) {
        EXPECT(c->committed == 0);
        return;
    }
    size_t n;
    uint8_t *p = tu_read_file(c->path, &n, &REAL_AL);
    ck_assert_ptr_nonnull(p);
    fkvf_reader *r = NULL;
    int rc = fkvf_reader_open_memory(&r, p, n, FKVF_OPEN_STRICT, NULL);
    fkvf_archive_info ai;
    EXPECTF(rc == FKVF_OK && fkvf_reader_info(r, &ai) == FKVF_OK &&
                ai.n_positions == c->committed,
            "appender: the file does not open strict at %llu positions: %s (%s; %s failed in "
            "step %d, I/O call %ld, allocation %ld)",
            (unsigned long long)c->committed, r ? fkvf_reader_message(r) : "",
            fkvf_error_name(rc), g.fail_call ? g.fail_call : "nothing", g.fail_step,
            g.io_fail_at, g.fail_at);
    if (rc == FKVF_OK && c->committed) {
        /* the recent window is exact: the rows appended */
        const void *row;
        size_t rb;
        EXPECT(fkvf_reader_exact_row(r, c->committed - 1, &row, &rb) == FKVF_OK &&
               !memcmp(row, (const uint8_t *)fx->rows + (c->committed - 1) * ROW_BYTES, rb));
    }
    fkvf_reader_free(r);
    REAL_FREE(p);
}

static void ap_after_fail(void *ctx, size_t i)
{
    pctx *c = ctx;
    (void)i;
    ap_check_file(c);
}

static void ap_finish(void *ctx, int clean, long stopped)
{
    pctx *c = ctx;
    (void)clean;
    if (stopped >= 0 && c->a) /* the handle is done */
        EXPECT(fkvf_appender_commit(c->a) != FKVF_OK);
    fkvf_appender_free(c->a);
    c->a = NULL;
    EXPECT(tmp_files() == 0);
    if (stopped < 0)
        EXPECT(c->committed == N);
    ap_check_file(c);
}

/* ---- quantizer --------------------------------------------------------------- */

typedef struct qctx {
    fkvf_rvq *t, *q, *qd, *sub, *q16;
    uint16_t codes[NA * 64], codes_beam[NA * 64], codes16[NA * 64];
    float dec[NA * ROW_F32 / 4], dec_to[NA * ROW_F32 / 4];
    uint8_t tables[1 << 14];
    int have_ref;
    float ref_dec[NA * ROW_F32 / 4], ref_dec_to[NA * ROW_F32 / 4];
    uint16_t ref_beam[NA * 64];
} qctx;

static const char *const q_names[] = {"rvq_train",  "rvq_from_tables", "rvq_from_tables_decode",
                                      "rvq_subset", "rvq_encode",      "rvq_encode(beam)",
                                      "rvq_decode", "rvq_decode_to", "rvq_from_tables16_encode",
                                      "rvq_encode(f16 in place)"};

static const char *q_message(void *ctx)
{
    (void)ctx;
    return NULL;
}

static void q_setup(void *ctx)
{
    qctx *c = ctx;
    c->t = c->q = c->qd = c->sub = c->q16 = NULL;
}

static int q_step(void *ctx, size_t i)
{
    qctx *c = ctx;
    fkvf_rvq_params p;
    fx_rvq_params(&p);
    fkvf_rows blk = {fx->rows, N, FKVF_DTYPE_F16, 0};
    fkvf_rows arch = {(const uint8_t *)fx->rows + S * ROW_BYTES, NA, FKVF_DTYPE_F16, S};
    switch (i) {
    case 0:
        fkvf_rvq_free(c->t);
        c->t = NULL;
        return fkvf_rvq_train(&c->t, &p, &blk, 1, &AL);
    case 1:
        fkvf_rvq_free(c->q);
        c->q = NULL;
        return fkvf_rvq_from_tables(&c->q, &fx->shape, 0, fx->tables, fx->tables_size, &AL);
    case 2:
        fkvf_rvq_free(c->qd);
        c->qd = NULL;
        return fkvf_rvq_from_tables_decode(&c->qd, &fx->shape, 0, fx->tables, fx->tables_size,
                                           &AL);
    case 3:
        fkvf_rvq_free(c->sub);
        c->sub = NULL;
        return fkvf_rvq_subset(&c->sub, c->q, 1, 1);
    case 4: return fkvf_rvq_encode(c->q, &arch, NULL, 1, c->codes, fx->cpp, 1);
    case 5: return fkvf_rvq_encode(c->q, &arch, NULL, 4, c->codes_beam, fx->cpp, 1);
    case 6:
        return fkvf_rvq_decode(c->qd, c->codes, fx->cpp, 1, NA, S, NULL, FKVF_DTYPE_F32, c->dec,
                               sizeof c->dec);
    case 7: {
        /* layers 1.. heads-first: the codes of those layers only */
        fkvf_rvq_decode_target t = {1, L - 1, FKVF_LAYOUT_HEADS, NA, 0, 0};
        size_t skip = fx->cpp / L; /* codes of layer 0 */
        return fkvf_rvq_decode_to(c->qd, &t, c->codes + skip, fx->cpp, 1, NA, S, NULL,
                                  FKVF_DTYPE_F32, c->dec_to, sizeof c->dec_to);
    }
    case 8: {
        /* f16 tables in place (a CPU without F16C: UNSUPPORTED, and no
         * handle; step 8 then has nothing to encode with) */
        fkvf_rvq_free(c->q16);
        c->q16 = NULL;
        int rc = fkvf_rvq_from_tables16_encode(&c->q16, &fx->shape, 0, fx->tables,
                                               fx->tables_size, &AL);
        return rc == FKVF_E_UNSUPPORTED ? FKVF_OK : rc;
    }
    default:
        return c->q16 ? fkvf_rvq_encode(c->q16, &arch, NULL, 1, c->codes16, fx->cpp, 1) : FKVF_OK;
    }
}

static void q_finish(void *ctx, int clean, long stopped)
{
    qctx *c = ctx;
    (void)clean;
    EXPECTF(stopped < 0, "rvq: %s failed again when retried", stopped >= 0 ? q_names[stopped] : "");
    if (stopped < 0) {
        /* training is deterministic: the fixture's tables; greedy codes: the fixture's */
        EXPECT(fkvf_rvq_tables_size(c->t) == fx->tables_size && fx->tables_size <= sizeof c->tables);
        EXPECT(fkvf_rvq_tables(c->t, c->tables, fx->tables_size) == FKVF_OK &&
               !memcmp(c->tables, fx->tables, fx->tables_size));
        EXPECT(!memcmp(c->codes, fx->codes, NA * fx->cpp * sizeof *c->codes));
        EXPECT(!c->q16 || !memcmp(c->codes16, fx->codes, NA * fx->cpp * sizeof *c->codes16));
        EXPECT(fkvf_rvq_codes_per_position(c->sub) == (size_t)L * H * 2);
        if (!c->have_ref) {
            memcpy(c->ref_dec, c->dec, sizeof c->dec);
            memcpy(c->ref_dec_to, c->dec_to, sizeof c->dec_to);
            memcpy(c->ref_beam, c->codes_beam, sizeof c->codes_beam);
            c->have_ref = 1;
        }
        EXPECT(!memcmp(c->dec, c->ref_dec, sizeof c->dec));
        EXPECT(!memcmp(c->dec_to, c->ref_dec_to, sizeof c->dec_to));
        EXPECT(!memcmp(c->codes_beam, c->ref_beam, sizeof c->codes_beam));
    }
    fkvf_rvq_free(c->t);
    fkvf_rvq_free(c->q);
    fkvf_rvq_free(c->qd);
    fkvf_rvq_free(c->sub);
    fkvf_rvq_free(c->q16);
    c->t = c->q = c->qd = c->sub = c->q16 = NULL;
}

#define SCEN(sc, ttl, names_, kinds_, ctx_, pre)                          \
    do {                                                                  \
        memset(&(sc), 0, sizeof(sc));                                     \
        (sc).title = (ttl);                                               \
        (sc).n_steps = sizeof(names_) / sizeof((names_)[0]);              \
        (sc).names = (names_);                                            \
        (sc).kinds = (kinds_);                                            \
        (sc).ctx = (ctx_);                                                \
        (sc).setup = pre##_setup;                                         \
        (sc).step = pre##_step;                                           \
        (sc).message = pre##_message;                                     \
        (sc).finish = pre##_finish;                                       \
        ck_assert_uint_eq(strlen(kinds_), (sc).n_steps);                  \
    } while (0)

START_TEST(inject_reader)
{
    fx_build();
    static rctx c;
    memset(&c, 0, sizeof c);
    scen s;
    /* the stream block state is made at open; desc and meta_count parse lazily */
    SCEN(s, "reader_mem", r_names, "A--A-A----------------A-A-AA", &c, r);
    loop(&s, MODE_ALLOC);
}
END_TEST

START_TEST(inject_reader_file)
{
    fx_build();
    make_dir();
    static rctx c;
    memset(&c, 0, sizeof c);
    c.file = 1;
    path_in(c.path, sizeof c.path, "r.fkvf");
    static const unsigned flags[] = {0, FKVF_OPEN_READ, FKVF_OPEN_READ | FKVF_OPEN_STRICT};
    for (size_t f = 0; f < 3; f++) {
        c.flags = flags[f];
        scen s;
        SCEN(s, "reader_file", rf_names, "BAA", &c, r);
        s.syscalls = 1;
        s.step = rf_step;
        s.finish = rf_finish;
        loop(&s, MODE_ALLOC);
#ifdef FKVF_INJECT_WRAP
        loop(&s, MODE_IO_EIO);
#endif
    }
    remove_dir();
}
END_TEST

START_TEST(inject_reader_source)
{
    fx_build();
    static rctx c;
    memset(&c, 0, sizeof c);
    static const unsigned flags[] = {0, FKVF_OPEN_STRICT, 0};
    for (size_t f = 0; f < 3; f++) {
        c.flags = flags[f];
        /* the third run: 4096-byte units, a cache of one byte */
        rs_unit = f == 2 ? 4096 : 512;
        rs_budget = f == 2 ? 1 : 0;
        scen s;
        SCEN(s, "reader_source", rs_names, "BAA", &c, r);
        s.syscalls = 1; /* the reservation (mmap) */
        s.step = rs_step;
        s.finish = rf_finish;
        loop(&s, MODE_ALLOC);
#ifdef FKVF_INJECT_WRAP
        loop(&s, MODE_IO_EIO);
#endif
    }
}
END_TEST

START_TEST(inject_reader_ext)
{
    fx_build();
    static xctx c;
    memset(&c, 0, sizeof c);
    scen s;
    SCEN(s, "reader_ext", x_names, "AA---AA", &c, x);
    loop(&s, MODE_ALLOC);
}
END_TEST

START_TEST(inject_reader_find)
{
    fx_build();
    make_dir();
    static fctx c;
    memset(&c, 0, sizeof c);
    char p[128];
    path_in(c.apath, sizeof c.apath, "x.fkvf");
    tu_write_file(c.apath, fx->x.data, fx->x.size);
    path_in(p, sizeof p, "cb.fkvf");
    tu_write_file(p, fx->cb.data, fx->cb.size);
    static const unsigned flags[] = {0, FKVF_OPEN_READ};
    for (size_t f = 0; f < 2; f++) {
        c.flags = flags[f];
        scen s;
        SCEN(s, "reader_find(hint)", f_names, "BBA", &c, f);
        s.syscalls = 1;
        loop(&s, MODE_ALLOC);
#ifdef FKVF_INJECT_WRAP
        loop(&s, MODE_IO_EIO);
#endif
    }
    /* by hash: the codebook under another name, the archive from memory */
    clear_dir();
    path_in(p, sizeof p, "shared-codebook");
    tu_write_file(p, fx->cb.data, fx->cb.size);
    c.by_path = 1;
    c.flags = FKVF_OPEN_STRICT;
    scen s;
    SCEN(s, "reader_find(path)", f_names, "ABA", &c, f);
    s.syscalls = 1;
    /* the name hint cb.fkvf, absent: a failed lstat of it changes nothing */
    s.quiet_io_step = "find_codebook";
    s.quiet_io_call = "lstat";
    loop(&s, MODE_ALLOC);
#ifdef FKVF_INJECT_WRAP
    loop(&s, MODE_IO_EIO);
#endif
    remove_dir();
}
END_TEST

START_TEST(inject_search)
{
    fx_build();
    static sctx c;
    memset(&c, 0, sizeof c);
    c.data = fx->a.data;
    c.size = fx->a.size;
    scen s;
    SCEN(s, "search", s_names, "A-A-----AAA", &c, s);
    loop(&s, MODE_ALLOC);
    /* with the index appended: the search answers from it */
    make_dir();
    static actx ac;
    memset(&ac, 0, sizeof ac);
    path_in(ac.path, sizeof ac.path, "z.fkvf");
    ac.base = fx->a.data;
    ac.base_size = fx->a.size;
    as_setup(&ac);
    ck_assert_int_eq(as_step(&ac, 0), FKVF_OK);
    size_t n;
    uint8_t *z = tu_read_file(ac.path, &n, &REAL_AL);
    c.data = z;
    c.size = n;
    c.has_zidx = 1;
    SCEN(s, "search_zidx", s_names, "A-A-----AAA", &c, s);
    s.n_steps = 7; /* open .. radius */
    s.kinds = "A-A----";
    c.partial = 1;
    loop(&s, MODE_ALLOC);
    static zctx zc;
    zc.data = z;
    zc.size = n;
    SCEN(s, "reader_zidx", z_names, "AA", &zc, z);
    loop(&s, MODE_ALLOC);
    REAL_FREE(z);
    remove_dir();
}
END_TEST

START_TEST(inject_search_keys)
{
    fx_build();
    static kctx c;
    memset(&c, 0, sizeof c);
    scen s;
    /* the second query reuses the first one's scratch: no allocation */
    SCEN(s, "search_keys", k_names, "AA-", &c, k);
    loop(&s, MODE_ALLOC);
}
END_TEST

START_TEST(inject_append_sections)
{
    fx_build();
    make_dir();
    /* the ZIDX section to append: built once */
    static sctx sc0;
    memset(&sc0, 0, sizeof sc0);
    sc0.data = fx->a.data;
    sc0.size = fx->a.size;
    s_setup(&sc0);
    ck_assert_int_eq(s_step(&sc0, 9), FKVF_OK);
    if (!zidx_ref) {
        zidx_ref = REAL_MALLOC(sc0.zsize);
        memcpy(zidx_ref, sc0.zidx, sc0.zsize);
        zidx_ref_size = sc0.zsize;
        zidx_ref_key = sc0.zkey;
    }
    fkvf_reader_free(sc0.r);
    REAL_FREE(sc0.zidx);
    static actx c;
    memset(&c, 0, sizeof c);
    path_in(c.path, sizeof c.path, "s.fkvf");
    c.base = fx->a.data;
    c.base_size = fx->a.size;
    scen s;
    SCEN(s, "append_sections", as_names, "B", &c, as);
    s.syscalls = 1;
    s.after_fail = as_after_fail;
    loop(&s, MODE_ALLOC);
#ifdef FKVF_INJECT_WRAP
    loop(&s, MODE_IO_EIO);
    loop(&s, MODE_IO_ENOSPC);
    loop(&s, MODE_IO_SHORT);
#endif
    remove_dir();
}
END_TEST

START_TEST(inject_compact)
{
    fx_build();
    make_dir();
    static cctx c;
    for (int in_place = 0; in_place < 2; in_place++) {
        memset(&c, 0, sizeof c);
        path_in(c.src, sizeof c.src, "a.fkvf");
        path_in(c.dst, sizeof c.dst, "c.fkvf");
        c.in_place = in_place;
        scen s;
        SCEN(s, in_place ? "compact_in_place" : "compact", cp_names, "B", &c, cp);
        s.syscalls = 1;
        s.after_fail = cp_after_fail;
        s.quiet_io_step = "archive_compact"; /* the writer's directory fsync after its rename */
        loop(&s, MODE_ALLOC);
#ifdef FKVF_INJECT_WRAP
        loop(&s, MODE_IO_EIO);
        loop(&s, MODE_IO_ENOSPC);
        loop(&s, MODE_IO_SHORT);
#endif
        clear_dir();
    }
    remove_dir();
}
END_TEST

START_TEST(inject_recover)
{
    fx_build();
    make_dir();
    static rvctx c;
    memset(&c, 0, sizeof c);
    path_in(c.path, sizeof c.path, "t.fkvf");
    c.torn_size = fx->a.size + 100;
    c.torn = REAL_MALLOC(c.torn_size);
    ck_assert_ptr_nonnull(c.torn);
    memcpy(c.torn, fx->a.data, fx->a.size);
    memset(c.torn + fx->a.size, 'x', 100);
    scen s;
    SCEN(s, "recover", rv_names, "B", &c, rv);
    s.syscalls = 1;
    s.after_fail = rv_after_fail;
    loop(&s, MODE_ALLOC);
#ifdef FKVF_INJECT_WRAP
    loop(&s, MODE_IO_EIO);
    loop(&s, MODE_IO_ENOSPC);
    loop(&s, MODE_IO_SHORT);
#endif
    REAL_FREE(c.torn);
    remove_dir();
}
END_TEST

#ifdef FKVF_INJECT_WRAP
START_TEST(inject_appender_io)
{
    fx_build();
    make_dir();
    static pctx c;
    memset(&c, 0, sizeof c);
    path_in(c.path, sizeof c.path, "p.fkvf");
    scen s;
    SCEN(s, "appender", ap_names, "BABBABI", &c, ap);
    s.syscalls = 1;
    s.after_fail = ap_after_fail;
    s.quiet_io_step = "appender_create";
    loop(&s, MODE_IO_EIO);
    loop(&s, MODE_IO_ENOSPC);
    loop(&s, MODE_IO_SHORT);
    remove_dir();
}
END_TEST

/* The same with commits written in pieces (fkvf_appender_append writes
 * index segments and sink rows before the commit), under the I/O loops and
 * the allocation loop: a failure anywhere, in an append too, leaves the
 * file at the previous commit, opening strict (nothing half-committed:
 * ap_after_fail), and the handle done, or (memory for the call's first
 * rows) nothing queued. The allocation loop found two bugs: a spill that
 * failed before writing left the call's rows queued in a usable handle
 * (retried, they were queued twice), and the codes kept for the next
 * commit were allocated after the trailer (a durable commit reported as
 * FKVF_E_NOMEM). */
START_TEST(inject_appender_spill_io)
{
    fx_build();
    make_dir();
    static pctx c;
    memset(&c, 0, sizeof c);
    c.spill = 1;
    path_in(c.path, sizeof c.path, "p.fkvf");
    scen s;
    SCEN(s, "appender_spill", aps_names, "B-BBB-BBI", &c, ap);
    s.syscalls = 1;
    s.after_fail = ap_after_fail;
    s.quiet_io_step = "appender_create";
    loop(&s, MODE_IO_EIO);
    loop(&s, MODE_IO_ENOSPC);
    loop(&s, MODE_IO_SHORT);
    loop(&s, MODE_ALLOC);
    remove_dir();
}
END_TEST
#endif

START_TEST(inject_rvq)
{
    fx_build();
    static qctx c;
    memset(&c, 0, sizeof c);
    /* f16 tables in place need the CPU's f16 kernel (x86 with F16C): without
     * it fkvf_rvq_from_tables16_encode is FKVF_E_UNSUPPORTED before it
     * allocates, and step 9 has no handle to encode with (asserted: neither
     * step allocates) */
    fkvf_rvq *probe = NULL;
    int rc16 = fkvf_rvq_from_tables16_encode(&probe, &fx->shape, 0, fx->tables, fx->tables_size,
                                             NULL);
    ck_assert(rc16 == FKVF_OK || rc16 == FKVF_E_UNSUPPORTED);
    ck_assert(rc16 == FKVF_OK ? probe != NULL : probe == NULL);
    fkvf_rvq_free(probe);
    scen s;
    SCEN(s, "rvq", q_names, rc16 == FKVF_OK ? "AAAAAAAAAA" : "AAAAAAAA--", &c, q);
    loop(&s, MODE_ALLOC);
}
END_TEST

START_TEST(inject_writer_sink)
{
    fx_build();
    wctx c;
    memset(&c, 0, sizeof c);
    for (int kind = 0; kind < 3; kind++) {
        scen s = w_scen(&c, kind);
        loop(&s, MODE_ALLOC);
        loop(&s, MODE_IO_EIO);
        loop(&s, MODE_IO_SHORT);
    }
}
END_TEST

START_TEST(inject_writer_file)
{
    fx_build();
    make_dir();
    wctx c;
    memset(&c, 0, sizeof c);
    c.to_file = 1;
    path_in(c.path, sizeof c.path, "w.fkvf");
    /* an older archive at the path: intact until the rename */
    c.old_size = fx->x.size;
    c.old = REAL_MALLOC(c.old_size);
    memcpy(c.old, fx->x.data, c.old_size);
    for (int kind = 0; kind < 2; kind++) {
        scen s = w_scen(&c, kind);
        loop(&s, MODE_ALLOC);
#ifdef FKVF_INJECT_WRAP
        loop(&s, MODE_IO_EIO);
        loop(&s, MODE_IO_ENOSPC);
        loop(&s, MODE_IO_SHORT);
#endif
    }
    /* no_replace: link() instead of rename() puts the file in place */
    c.no_replace = 1;
    scen s = w_scen(&c, 1);
    loop(&s, MODE_ALLOC);
#ifdef FKVF_INJECT_WRAP
    loop(&s, MODE_IO_EIO);
    loop(&s, MODE_IO_ENOSPC);
#endif
    c.no_replace = 0;
    REAL_FREE(c.old);
    remove_dir();
}
END_TEST

#ifdef FKVF_VALIDATE_STRICT
/* ---- validation (fkvf_validate_memory / _file) ------------------------------ */

typedef struct vtctx {
    char path[128];
    size_t viol_mem, viol_file;
} vtctx;

static const char *const v_names[] = {"validate_memory", "validate_file"};

static int v_count(void *opaque, const fkvf_violation *v)
{
    (void)v;
    (*(size_t *)opaque)++;
    return 0;
}

static const char *v_message(void *ctx)
{
    (void)ctx;
    return NULL; /* no handle */
}

static void v_setup(void *ctx)
{
    vtctx *c = ctx;
    tu_write_file(c->path, fx->a.data, fx->a.size);
}

static int v_step(void *ctx, size_t i)
{
    vtctx *c = ctx;
    fkvf_validate_options o;
    memset(&o, 0, sizeof o);
    o.flags = FKVF_VALIDATE_STRICT;
    o.alloc = &AL;
    fkvf_validate_result res;
    if (i == 0) {
        c->viol_mem = 0;
        return fkvf_validate_memory(fx->a.data, fx->a.size, &o, v_count, &c->viol_mem, &res);
    }
    c->viol_file = 0;
    return fkvf_validate_file(c->path, &o, v_count, &c->viol_file, &res);
}

static void v_finish(void *ctx, int clean, long stopped)
{
    vtctx *c = ctx;
    (void)clean;
    EXPECTF(stopped < 0, "validate: %s failed again when retried",
            stopped >= 0 ? v_names[stopped] : "");
    /* a valid archive: nothing to report, whatever failed on the way */
    EXPECTF(c->viol_mem == 0 && c->viol_file == 0, "validate: %zu / %zu violations",
            c->viol_mem, c->viol_file);
    EXPECT(file_is(c->path, fx->a.data, fx->a.size));
}

START_TEST(inject_validate)
{
    fx_build();
    make_dir();
    static vtctx c;
    memset(&c, 0, sizeof c);
    path_in(c.path, sizeof c.path, "v.fkvf");
    scen s;
    SCEN(s, "validate", v_names, "AB", &c, v);
    s.syscalls = 1;
    loop(&s, MODE_ALLOC);
#ifdef FKVF_INJECT_WRAP
    loop(&s, MODE_IO_EIO);
#endif
    remove_dir();
}
END_TEST
#endif

/* The functions listed "n/a pure": armed so that the first allocation and
 * the first I/O call would fail, they make none and still give their results. */
START_TEST(na_pure_functions)
{
    fx_build();
    fkvf_reader *cbr = NULL;
    const void *cbk1;
    size_t cbk1_size;
    ck_assert_int_eq(fkvf_reader_open_memory(&cbr, fx->cb.data, fx->cb.size, 0, NULL), FKVF_OK);
    ck_assert_int_eq(fkvf_reader_codebook(cbr, NULL, &cbk1, &cbk1_size, NULL), FKVF_OK);
    /* handles for the *_error functions, made before counting: a failed
     * open, a failed create, a search */
    static const uint8_t junk[64] = "not an FKVF file";
    fkvf_reader *bad = NULL, *ar = NULL;
    ck_assert_int_eq(fkvf_reader_open_memory(&bad, junk, sizeof junk, 0, NULL), FKVF_E_BAD_MAGIC);
    ck_assert_ptr_nonnull(bad);
    fkvf_writer *bw = NULL;
    fkvf_writer_options bwo;
    fkvf_writer_options_init(&bwo);
    bwo.block_size = 100; /* not a multiple of 64 */
    ck_assert_int_eq(fkvf_writer_create_sink(&bw, &(fkvf_sink){fs_write, NULL, NULL}, &bwo, NULL),
                     FKVF_E_INVALID_ARG);
    ck_assert_ptr_nonnull(bw);
    ck_assert_int_eq(fkvf_reader_open_memory(&ar, fx->a.data, fx->a.size, 0, NULL), FKVF_OK);
    fkvf_search *srch = NULL;
    ck_assert_int_eq(fkvf_search_open(&srch, ar, 0, 0, NULL), FKVF_OK);
    fkvf_key_search *kso = NULL;
    ck_assert_int_eq(fkvf_search_keys_open(&kso, ar, NULL), FKVF_OK);
    fkvf_archive_op *cph = NULL; /* a compaction of a file that does not exist */
    ck_assert_int_eq(fkvf_archive_compact(&cph, "/nonexistent/a.fkvf", "/nonexistent/c.fkvf",
                                          NULL, NULL),
                     FKVF_E_IO);
    ck_assert_ptr_nonnull(cph);
    size_t n_meta; /* the lazily built metadata index, before counting */
    ck_assert_int_eq(fkvf_reader_meta_count(cbr, &n_meta), FKVF_OK);
    memset(&g, 0, sizeof g);
    g.step = -1;
    g.fail_at = 1;
    g.io_fail_at = 1;
    g.io_err = EIO;
    g.armed = 1;
    int ok = 1;
    ok &= fkvf_version_number() == FKVF_VERSION_NUMBER;
    ok &= !strcmp(fkvf_version_string(), FKVF_VERSION_STRING);
    ok &= *fkvf_strerror(FKVF_E_NOMEM) != 0;
    ok &= !strcmp(fkvf_error_name(FKVF_E_IO), "FKVF_E_IO");
    ok &= fkvf_error_class(FKVF_E_CHECKSUM) == FKVF_ERRCLASS_FORMAT;
    ok &= fkvf_codebook_size(&fx->shape) == fx->tables_size + 64;
    ok &= fkvf_codebook_auto_k(&fx->shape, H, 0) == 0;
    ok &= fkvf_codebook_pays(&fx->shape, H, 0, 64, NULL) == 0;
    fkvf_key_settings ks = {1, 0, 1, 0, 10000.0, 0, 0, 0, 0, 0};
    fkvf_key_clash kc;
    ok &= fkvf_codebook_key_settings(cbr, 8, &ks, &kc) == FKVF_OK && !kc.setting;
    uint8_t h[16];
    fkvf_codebook_hash(cbk1, cbk1_size, h);
    fkvf_writer_options wo;
    fkvf_writer_options_init(&wo);
    ok &= wo.block_size == 0;
    fkvf_append_options ao;
    fkvf_append_options_init(&ao);
    ok &= ao.io == NULL;
    fkvf_stream_spec sp = tok_spec();
    ok &= fkvf_stream_spec_align(&sp) == 64; /* 128 / gcd(10, 128) */
    ok &= fkvf_ngon_rmax(4) > 0.4 && fkvf_ngon_rmax(4) < 0.6;
    ok &= fkvf_ngon_max_span(0.5) > 0;
    uint64_t sb = 1, sr = 1;
    ok &= fkvf_reader_source_stats(cbr, &sb, &sr) == FKVF_OK && sb == 0 && sr == 0;
    ok &= fkvf_reader_source_cache(cbr, &sb, &sr) == FKVF_OK && sb == 0 && sr == 0;
    ok &= fkvf_reader_set_source_cache(cbr, 1) == FKVF_OK; /* not a source: a no-op */
    ok &= fkvf_f16_to_f32(fkvf_f32_to_f16(1.5f)) == 1.5f;
    ok &= fkvf_bf16_to_f32(fkvf_f32_to_bf16(-2.0f)) == -2.0f;
    float f[4];
    ok &= fkvf_convert(FKVF_DTYPE_F32, f, FKVF_DTYPE_F16, fx->rows, 4) == FKVF_OK;
    tu_le_f32(f, 4); /* little-endian elements to host floats, for the rope call below */
    ok &= f[1] == fkvf_f16_to_f32(tu_ld16le(&fx->rows[1]));
    fkvf_rope rope = {1, 4, 10000.0};
    double v[4] = {1, 0, 1, 0};
    ok &= fkvf_rope_apply_f64(&rope, 3, 0, v, 4) == FKVF_OK && v[0] != 1;
    ok &= fkvf_rope_apply_f32(&rope, 3, 1, f, 4) == FKVF_OK;
    double cs4[4];
    ok &= fkvf_rope_table(&rope, 3, cs4, 4) == FKVF_OK;
    ok &= fkvf_rope_apply_table_f64(&rope, cs4, 1, v, 4) == FKVF_OK && v[0] > 0.999 && v[0] < 1.001;
    fkvf_rvq_params p;
    fkvf_rvq_params_init(&p);
    ok &= p.k == 256;
    fkvf_codebook_shape cs;
    uint32_t heads;
    fkvf_rvq_shape(fx->q, &cs, &heads);
    ok &= heads == H && cs.k == K;
    ok &= fkvf_rvq_tables_size(fx->q) == fx->tables_size;
    ok &= fkvf_rvq_codes_per_position(fx->q) == fx->cpp;
    ok &= fkvf_rvq_centroids(fx->q, 1, 1, 1, 0) != NULL;
    ok &= fkvf_rvq_tables(fx->q, NULL, 0) != FKVF_OK; /* too small: refused, no allocation */
    ok &= fkvf_cpu_count() >= 1;
    ok &= fkvf_rvq_set_threads(fx->q, 1) == FKVF_OK && fkvf_rvq_set_threads(NULL, 2) != FKVF_OK;
    ok &= fkvf_reader_set_threads(cbr, 1) == FKVF_OK && fkvf_reader_set_threads(NULL, 2) != FKVF_OK;
    ok &= fkvf_reader_trim(cbr) == FKVF_OK && fkvf_reader_trim(NULL) == FKVF_E_STATE;
    fkvf_error_info ei;
    ok &= fkvf_reader_error(bad, &ei) == FKVF_OK && ei.code == FKVF_E_BAD_MAGIC &&
          ei.offset == 0 && ei.clause && !strcmp(ei.clause, "3.1") && *ei.message;
    ok &= fkvf_reader_error(cbr, &ei) == FKVF_OK && ei.code == FKVF_OK && !ei.clause &&
          ei.offset == FKVF_ERROR_NO_OFFSET;
    ok &= fkvf_reader_error(NULL, &ei) == FKVF_E_STATE && ei.code == FKVF_E_STATE;
    ok &= fkvf_reader_error(bad, NULL) == FKVF_E_INVALID_ARG;
    ok &= fkvf_reader_file_name(cbr) == NULL && fkvf_reader_file_name(NULL) == NULL;
    ok &= fkvf_writer_error(bw, &ei) == FKVF_OK && ei.code == FKVF_E_INVALID_ARG &&
          ei.clause && !strcmp(ei.clause, "11.2") && ei.offset == FKVF_ERROR_NO_OFFSET;
    ok &= fkvf_writer_error(NULL, &ei) == FKVF_E_STATE;
    ok &= fkvf_appender_error(NULL, &ei) == FKVF_E_STATE && ei.code == FKVF_E_STATE &&
          *ei.message;
    ok &= fkvf_search_error(srch, &ei) == FKVF_OK && ei.code == FKVF_OK &&
          !strcmp(ei.file, "search");
    ok &= fkvf_search_error(NULL, &ei) == FKVF_E_STATE;
    ok &= fkvf_search_keys_error(kso, &ei) == FKVF_OK && ei.code == FKVF_OK &&
          !strcmp(fkvf_search_keys_message(kso), "ok");
    ok &= fkvf_search_keys_error(NULL, &ei) == FKVF_E_STATE &&
          !strcmp(fkvf_search_keys_message(NULL), "not a key search handle");
    fkvf_compact_options co;
    fkvf_compact_options_init(&co);
    ok &= co.in_place == 0 && co.alloc == NULL;
    ok &= fkvf_archive_op_error(cph, &ei) == FKVF_OK && ei.code == FKVF_E_IO &&
          !strcmp(ei.file, "/nonexistent/a.fkvf") && *ei.message;
    ok &= fkvf_archive_op_error(NULL, &ei) == FKVF_E_STATE && ei.code == FKVF_E_STATE;
    fkvf_recover_options rvo;
    fkvf_recover_options_init(&rvo);
    ok &= rvo.dry_run == 0 && rvo.alloc == NULL;
    g.armed = 0;
    ck_assert_msg(ok, "a pure function gave a wrong result");
    ck_assert_msg(!memcmp(h, fx->cb_hash, 16), "fkvf_codebook_hash differs from the reader's");
    ck_assert_uint_eq(cbk1_size, fx->tables_size + 64);
    fkvf_reader_free(cbr);
    fkvf_search_free(srch);
    fkvf_search_keys_free(kso);
    fkvf_reader_free(ar);
    fkvf_reader_free(bad);
    fkvf_writer_free(bw);
    fkvf_archive_op_free(cph);
    ck_assert_int_eq(g.calls, 0);
    ck_assert_int_eq(g.io_calls, 0);
}
END_TEST

/* The table at the top names every FKVF_API function of fkvf.h, once. */
static char *read_text(const char *path)
{
    size_t n;
    uint8_t *p = tu_read_file(path, &n, &REAL_AL); /* NUL-terminated */
    ck_assert_msg(p != NULL, "cannot read %s", path);
    return (char *)p;
}

START_TEST(public_functions_listed)
{
    const char *src = getenv("FKVF_SRCDIR");
    ck_assert_msg(src != NULL, "FKVF_SRCDIR not set");
    char path[512];
    snprintf(path, sizeof path, "%s/libfkvf/include/fkvf.h", src);
    char *h = read_text(path);
    snprintf(path, sizeof path, "%s/tests/test_inject.c", src);
    char *me = read_text(path);
    char *table_end = strstr(me, "#define _GNU_SOURCE");
    ck_assert_ptr_nonnull(table_end);
    *table_end = 0;
    int n = 0, rows = 0;
    for (char *q = strstr(me, " *  fkvf_"); q; q = strstr(q + 1, " *  fkvf_"))
        rows++;
    for (char *q = strstr(h, "FKVF_API "); q; q = strstr(q + 1, "FKVF_API ")) {
        char *paren = strchr(q, '(');
        char *semi = strchr(q, ';');
        if (!paren || (semi && semi < paren))
            continue; /* the macro's definition */
        char *e = paren;
        char *b = e;
        while (b > q && (b[-1] == '_' || (b[-1] >= 'a' && b[-1] <= 'z') ||
                         (b[-1] >= '0' && b[-1] <= '9')))
            b--;
        if (strncmp(b, "fkvf_", 5))
            continue;
        char row[128];
        snprintf(row, sizeof row, " *  %.*s ", (int)(e - b), b);
        ck_assert_msg(strstr(me, row) != NULL, "%.*s is not in the table of test_inject.c",
                      (int)(e - b), b);
        n++;
    }
    ck_assert_int_ge(n, 104);
    /* rows for functions this fkvf.h lacks: only the fkvf_validate_* pair */
#ifdef FKVF_VALIDATE_STRICT
    ck_assert_int_eq(rows, n);
#else
    ck_assert_int_eq(rows, n + 2);
#endif
    REAL_FREE(h);
    REAL_FREE(me);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("inject");
    TCase *t = tcase_create("inject");
    tcase_set_timeout(t, 600);
    tcase_add_test(t, inject_writer_sink);
    tcase_add_test(t, inject_writer_file);
    tcase_add_test(t, inject_reader);
    tcase_add_test(t, inject_reader_file);
    tcase_add_test(t, inject_reader_source);
    tcase_add_test(t, inject_reader_ext);
    tcase_add_test(t, inject_reader_find);
    tcase_add_test(t, inject_search);
    tcase_add_test(t, inject_search_keys);
    tcase_add_test(t, inject_append_sections);
    tcase_add_test(t, inject_compact);
    tcase_add_test(t, inject_recover);
#ifdef FKVF_INJECT_WRAP
    tcase_add_test(t, inject_appender_io);
    tcase_add_test(t, inject_appender_spill_io);
#endif
    tcase_add_test(t, inject_rvq);
#ifdef FKVF_VALIDATE_STRICT
    tcase_add_test(t, inject_validate);
#endif
    tcase_add_test(t, na_pure_functions);
    tcase_add_test(t, public_functions_listed);
    suite_add_tcase(s, t);
    return s;
}

int main(void) { return tu_run_suite(suite()); }
