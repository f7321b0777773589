/* server/upload.h — a batch body streamed from the socket into a ring slot.
 *
 * Shared by POST /v1/batches (train) and POST /v1/transform (augment only).
 * The body goes through the incremental safetensors parser; once its header is
 * valid a ring slot is acquired (or the request is suspended until one frees,
 * or refused with 429/503 per ring.full_policy) and every data byte is copied
 * once, straight into the slot. When the body has ended the slot is committed
 * (READY) with a new job id. A failure or a client that goes away releases the
 * slot; nothing half-written ever becomes READY.
 *
 * Every rejection replies with its own error code and is counted in
 * streamfeed_batches_rejected_total{reason=code}.
 */
#ifndef SF_UPLOAD_H
#define SF_UPLOAD_H

#include <stdint.h>

#include "server/http.h"
#include "server/safetensors.h"

typedef struct sf_xform_out sf_xform_out;

typedef struct sf_upload {
    sf_st_parser parser;
    int kind;              /* 0 train, 1 transform */
    int slot;              /* -1 until acquired */
    int committed;
    uint64_t job_id;
    uint64_t t_wait_start_ns;
    sf_xform_out *out;     /* transform: the reply buffer (shared with the engine) */
} sf_upload;

/* Stream callbacks (sf_stream_ops) for a route of the given kind. */
int sf_upload_on_data(sf_req *r, int kind, const uint8_t *data, size_t *len);
void sf_upload_on_done(sf_req *r, int ok);
/* Counts a refused upload in batches_rejected_total{reason} (and received{rejected}). */
void sf_upload_on_rejected(sf_req *r, const char *reason);
/* Called when the body has ended: validates the end of the body and commits
 * the slot. Returns 0 with the job id, or -1 after an error reply. */
int sf_upload_commit(sf_req *r, uint64_t *job_id);
uint64_t sf_upload_max_body(struct sf_app *app);

/* Transform output: the safetensors reply ("images" F32 [N,C,H,W]), header
 * included. Valid once the job is done. */
int sf_upload_transform_reply(sf_req *r);

#endif
