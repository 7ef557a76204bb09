/* URLs as fkvf_source: byte-range GET requests through libcurl
 * (cli_remote.h). One easy handle per URL keeps its connection; every
 * handle is released at exit. */
#define _POSIX_C_SOURCE 200809L
#include "cli_remote.h"

#include <curl/curl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "cli_util.h"

#define ATTEMPTS 4           /* tries of one range request */
#define BACKOFF_MS 100       /* before the second try; doubled each time */
#define CONNECT_TIMEOUT_S 10 /* to connect */
#define STALL_TIMEOUT_S 30   /* no byte for this long: the request fails */

typedef struct remote {
    CURL *h;
    char *url;
    uint64_t size;
    struct remote *next;
    /* the request in flight */
    uint8_t *buf;
    size_t want, got;
    int overflow;
    long long first, last, total; /* Content-Range of the answer (-1: none) */
    char err[CURL_ERROR_SIZE];
} remote;

static remote *all;
static uint64_t max_bytes, total_bytes, total_requests;
static int inited;

void cli_remote_set_max_bytes(uint64_t n) { max_bytes = n; }

void cli_remote_totals(uint64_t *bytes, uint64_t *requests)
{
    *bytes = total_bytes;
    *requests = total_requests;
}

int cli_is_url(const char *path)
{
    return path && (!strncmp(path, "http://", 7) || !strncmp(path, "https://", 8));
}

static void release_all(void)
{
    while (all) {
        remote *n = all->next;
        curl_easy_cleanup(all->h);
        free(all->url);
        free(all);
        all = n;
    }
    if (inited)
        curl_global_cleanup();
}

static size_t on_body(char *p, size_t size, size_t n, void *opaque)
{
    remote *m = opaque;
    size_t len = size * n;
    if (len > m->want - m->got) { /* more than asked for: Range ignored */
        m->overflow = 1;
        return 0; /* abort the transfer */
    }
    memcpy(m->buf + m->got, p, len);
    m->got += len;
    return len;
}

/* "Content-Range: bytes FIRST-LAST/TOTAL" (case-insensitive name) */
static size_t on_header(char *p, size_t size, size_t n, void *opaque)
{
    remote *m = opaque;
    size_t len = size * n;
    static const char name[] = "content-range:";
    if (len > sizeof name && !strncasecmp(p, name, sizeof name - 1)) {
        char line[160];
        size_t k = len < sizeof line - 1 ? len : sizeof line - 1;
        memcpy(line, p, k);
        line[k] = 0;
        long long a, b, t;
        if (sscanf(line + sizeof name - 1, " bytes %lld-%lld/%lld", &a, &b, &t) == 3) {
            m->first = a;
            m->last = b;
            m->total = t;
        }
    }
    return len;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* One range request [off, off + n) into buf, retried. size_check: the
 * Content-Range total must equal m->size (0 while the size is asked). */
static int get_range(remote *m, uint64_t off, void *buf, size_t n, int size_check)
{
    char range[64];
    snprintf(range, sizeof range, "%" PRIu64 "-%" PRIu64, off, off + n - 1);
    long wait = BACKOFF_MS;
    for (int attempt = 1;; attempt++) {
        m->buf = buf;
        m->want = n;
        m->got = 0;
        m->overflow = 0;
        m->first = m->last = m->total = -1;
        m->err[0] = 0;
        curl_easy_setopt(m->h, CURLOPT_RANGE, range);
        CURLcode cc = curl_easy_perform(m->h);
        long status = 0;
        curl_easy_getinfo(m->h, CURLINFO_RESPONSE_CODE, &status);
        total_requests++;
        total_bytes += m->got;
        const char *why = NULL;
        int retry = 0;
        /* the body of an error page may be longer than the range asked
         * for: the status decides first */
        if (status >= 500) {
            why = "server error";
            retry = 1;
        } else if (status >= 400) {
            why = status == 416 ? "range not satisfiable (the object is shorter than it was)"
                                : "the server refused the request";
        } else if (status == 200 || (m->overflow && status != 206)) {
            why = "the server ignores Range requests (it sent the whole object): serve the "
                  "file with range support (every common HTTP server and object store has it)";
        } else if (m->overflow) {
            why = "the answer is longer than the range asked for";
        } else if (cc != CURLE_OK) {
            why = m->err[0] ? m->err : curl_easy_strerror(cc);
            retry = cc != CURLE_URL_MALFORMAT && cc != CURLE_UNSUPPORTED_PROTOCOL &&
                    cc != CURLE_COULDNT_RESOLVE_HOST && cc != CURLE_WRITE_ERROR;
        } else if (status != 206) {
            why = "unexpected HTTP status";
        } else if (m->first != (long long)off || m->last != (long long)(off + n - 1) ||
                   (size_check && m->total != (long long)m->size) || m->total < 0) {
            why = m->total >= 0 && size_check && m->total != (long long)m->size
                      ? "the object changed size (replaced while it was read)"
                      : "the answer's Content-Range is not the range asked for";
        } else if (m->got != n) {
            why = "the body was cut short";
            retry = 1;
        } else {
            return FKVF_OK;
        }
        if (!retry || attempt == ATTEMPTS) {
            cli_note("%s: bytes %s: %s (HTTP status %ld%s)", m->url, range, why, status,
                     retry ? ", after retries" : "");
            return FKVF_E_IO;
        }
        sleep_ms(wait);
        wait *= 2;
    }
}

static int remote_read(void *opaque, uint64_t off, void *buf, size_t n)
{
    remote *m = opaque;
    if (max_bytes && (n > max_bytes || total_bytes > max_bytes - n)) {
        cli_note("%s: reading %zu more bytes would pass --max-bytes %" PRIu64
                 " (%" PRIu64 " transferred so far)",
                 m->url, n, max_bytes, total_bytes);
        return FKVF_E_LIMIT;
    }
    return get_range(m, off, buf, n, 1);
}

int cli_open_path_or_url(fkvf_reader **r, const char *path)
{
    return cli_is_url(path) ? cli_remote_open(r, path, 0)
                            : fkvf_reader_open_file(r, path, 0, NULL);
}

int cli_remote_open(fkvf_reader **r, const char *url, unsigned flags)
{
    *r = NULL;
    if (!inited) {
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
            cli_note("%s: libcurl could not be initialised", url);
            return FKVF_E_IO;
        }
        inited = 1;
        atexit(release_all);
    }
    remote *m = calloc(1, sizeof *m);
    if (!m || !(m->url = strdup(url)) || !(m->h = curl_easy_init())) {
        if (m)
            free(m->url);
        free(m);
        return FKVF_E_NOMEM;
    }
    m->next = all;
    all = m;
    curl_easy_setopt(m->h, CURLOPT_URL, url);
    curl_easy_setopt(m->h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(m->h, CURLOPT_WRITEDATA, m);
    curl_easy_setopt(m->h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(m->h, CURLOPT_HEADERDATA, m);
    curl_easy_setopt(m->h, CURLOPT_ERRORBUFFER, m->err);
    curl_easy_setopt(m->h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(m->h, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(m->h, CURLOPT_MAXREDIRS, 5L);
    curl_easy_setopt(m->h, CURLOPT_CONNECTTIMEOUT, (long)CONNECT_TIMEOUT_S);
    curl_easy_setopt(m->h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(m->h, CURLOPT_LOW_SPEED_TIME, (long)STALL_TIMEOUT_S);
    /* only the protocols the URL may name (a redirect cannot go to file://) */
    curl_easy_setopt(m->h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(m->h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    /* the size: one byte, whose Content-Range says the total */
    uint8_t one;
    int rc = get_range(m, 0, &one, 1, 0);
    if (rc != FKVF_OK)
        return rc;
    m->size = (uint64_t)m->total;
    fkvf_source src = {remote_read, m, m->size};
    return fkvf_reader_open_source(r, &src, 0, url, flags, NULL);
}
