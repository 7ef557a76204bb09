/* Example: open an FKVF archive, print its shape, and read one exact row and
 * the first symbols of each stream. Build against an installed libfkvf:
 *   cmake -S examples -B build-ex -DCMAKE_PREFIX_PATH=/usr/local && cmake --build build-ex
 * or: cc read_archive.c $(pkg-config --cflags --libs libfkvf) */
#include <inttypes.h>
#include <stdio.h>

#include <fkvf.h>

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s ARCHIVE\n", argv[0]);
        return 2;
    }
    fkvf_reader *r = NULL;
    int rc = fkvf_reader_open_file(&r, argv[1], 0, NULL);
    if (rc != FKVF_OK) {
        fprintf(stderr, "%s\n", r ? fkvf_reader_message(r) : fkvf_strerror(rc));
        fkvf_reader_free(r);
        return 1;
    }
    fkvf_archive_info ai;
    fkvf_reader_info(r, &ai);
    fkvf_desc d;
    if (fkvf_reader_desc(r, &d) == FKVF_OK)
        printf("%u layers, %u KV heads, dims %u/%u, %" PRIu64 " positions (%" PRIu64 " archived)\n",
               d.n_layers, d.n_kv_heads, d.key_dim, d.value_dim, ai.n_positions, ai.n_archived);
    const void *row;
    size_t row_bytes;
    if (ai.n_positions && fkvf_reader_exact_row(r, 0, &row, &row_bytes) == FKVF_OK)
        printf("position 0 is exact: %zu bytes\n", row_bytes);
    for (size_t i = 0; i < ai.n_streams; i++) {
        fkvf_stream_info si;
        uint32_t sym[4];
        fkvf_reader_stream_info(r, i, &si);
        size_t n = si.length < 4 ? (size_t)si.length : 4;
        if (fkvf_reader_stream_read(r, i, 0, sym, n) != FKVF_OK) {
            fprintf(stderr, "%s\n", fkvf_reader_message(r));
            fkvf_reader_free(r);
            return 1;
        }
        if (i < 3) {
            printf("stream %016" PRIx64 ":", si.id);
            for (size_t k = 0; k < n; k++)
                printf(" %u", sym[k]);
            printf("\n");
        }
    }
    fkvf_reader_free(r);
    printf("libfkvf %s\n", fkvf_version_string());
    return 0;
}
