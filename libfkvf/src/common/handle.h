/* The part every public handle (reader, writer, appender, search, archive
 * operation, codebook) shares:
 * a magic naming its kind, so that a NULL, freed or other kind of handle is
 * refused, and its state, so that one check at the entry of every public
 * call decides whether the call may run (as libarchive's
 * archive_check_magic). The handle's struct has it as its member `h`, and its
 * diagnostics as its member `diag`. */
#ifndef FKVF_COMMON_HANDLE_H
#define FKVF_COMMON_HANDLE_H

#include <stdint.h>

#include "error.h"

/* the magic of each kind (its four letters, little-endian) */
#define FKVF_HANDLE_READER UINT32_C(0x52564B46)   /* "FKVR" */
#define FKVF_HANDLE_WRITER UINT32_C(0x57564B46)   /* "FKVW" */
#define FKVF_HANDLE_APPENDER UINT32_C(0x50414B46) /* "FKAP" */
#define FKVF_HANDLE_SEARCH UINT32_C(0x48435253)   /* "SRCH" */
#define FKVF_HANDLE_ARCHIVE_OP UINT32_C(0x504F4B46) /* "FKOP" */
#define FKVF_HANDLE_RVQ UINT32_C(0x51564B46)      /* "FKVQ" */
#define FKVF_HANDLE_KEY_SEARCH UINT32_C(0x4B53564B) /* "KVSK" */

typedef enum fkvf_handle_state {
    FKVF_HANDLE_OPEN = 0,     /* calls run */
    FKVF_HANDLE_FINISHED = 1, /* done (a finished writer): calls fail with FKVF_E_STATE */
    FKVF_HANDLE_FAILED = 2    /* failed for good: calls return failed_rc, message kept */
} fkvf_handle_state;

typedef struct fkvf_handle {
    uint32_t magic; /* FKVF_HANDLE_* of its kind; 0 once freed */
    fkvf_handle_state state;
    /* what every call on a FAILED handle returns; 0: the code of the error
     * that failed it (the handle's diagnostic), FKVF_E_STATE if it has none */
    int failed_rc;
} fkvf_handle;

/* Set up h as a handle of this kind, OPEN. */
static inline void fkvf_handle_init(fkvf_handle *h, uint32_t kind)
{
    h->magic = kind;
    h->state = FKVF_HANDLE_OPEN;
    h->failed_rc = 0;
}

/* Mark h failed for good; every later call returns rc (0: the code of the
 * handle's error). */
static inline void fkvf_handle_fail(fkvf_handle *h, int rc)
{
    h->state = FKVF_HANDLE_FAILED;
    h->failed_rc = rc;
}

/* 1 when p (a pointer to a handle struct, may be NULL) is a handle of this
 * kind, whatever its state. */
#define FKVF_HANDLE_IS(p, kind) ((p) != NULL && (p)->h.magic == (kind))
/* 1 when p is an OPEN handle of this kind. */
#define FKVF_HANDLE_IS_OPEN(p, kind) (FKVF_HANDLE_IS(p, kind) && (p)->h.state == FKVF_HANDLE_OPEN)

/* The entry check of a public call on h, whose diagnostic is d (the kind is
 * checked by FKVF_HANDLE_ENTER first): a FAILED handle returns its failure
 * and keeps its message; otherwise the message is cleared, and a FINISHED
 * handle fails with FKVF_E_STATE "WHAT already finished". FKVF_OK: the call
 * may run. */
static inline int fkvf_handle_enter(const fkvf_handle *h, fkvf_diag *d, const char *what)
{
    if (h->state == FKVF_HANDLE_FAILED)
        return h->failed_rc ? h->failed_rc : d->code ? d->code : FKVF_E_STATE;
    fkvf_diag_clear(d);
    if (h->state == FKVF_HANDLE_FINISHED)
        return fkvf_fail(d, FKVF_E_STATE, FKVF_NO_OFFSET, NULL, "%s already finished", what);
    return FKVF_OK;
}

/* FKVF_E_STATE for NULL or another kind of handle (nothing touched), else
 * fkvf_handle_enter on p's handle and diagnostic. A const handle's
 * diagnostic is still cleared: the message belongs to the last call. */
#define FKVF_HANDLE_ENTER(p, kind, what)                                                      \
    (FKVF_HANDLE_IS(p, kind) ? fkvf_handle_enter(&(p)->h, (fkvf_diag *)&(p)->diag, what)      \
                             : FKVF_E_STATE)

#endif
