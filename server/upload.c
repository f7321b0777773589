/* server/upload.c — see upload.h. */
#include "server/upload.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/clock.h"
#include "server/distributed.h"
#include "server/evals.h"
#include "server/jobs.h"
#include "server/log.h"
#include "server/jpeg_header.h"
#include "server/ring.h"

/* An upload may hold its slot this long before its average rate is checked:
 * TCP slow start and a short pause of the loader are not slowness. */
#define RATE_ALLOWANCE_NS 5000000000ull

void sf_uploads_init(sf_uploads *s)
{
    pthread_mutex_init(&s->holders_mu, NULL);
    s->holders = NULL;
    atomic_init(&s->committing, 0);
}

/* The shared state of the process the upload's request belongs to. */
static sf_uploads *shared_of(const sf_upload *u) { return sf_upload_ctx_of(u->req->app)->shared; }

static void holders_add(sf_upload *u)
{
    sf_uploads *sh = shared_of(u);
    pthread_mutex_lock(&sh->holders_mu);
    u->hprev = NULL;
    u->hnext = sh->holders;
    if (sh->holders)
        sh->holders->hprev = u;
    sh->holders = u;
    u->holding = 1;
    pthread_mutex_unlock(&sh->holders_mu);
}

static void holders_remove_locked(sf_uploads *sh, sf_upload *u)
{
    if (!u->holding)
        return;
    if (u->hprev)
        u->hprev->hnext = u->hnext;
    else
        sh->holders = u->hnext;
    if (u->hnext)
        u->hnext->hprev = u->hprev;
    u->hprev = u->hnext = NULL;
    u->holding = 0;
}

static void holders_remove(sf_upload *u)
{
    sf_uploads *sh = shared_of(u);
    pthread_mutex_lock(&sh->holders_mu);
    holders_remove_locked(sh, u);
    pthread_mutex_unlock(&sh->holders_mu);
}

/* The transform reply, shared by the request and the engine: whichever lets go
 * last frees it, so a client that disconnects mid-transform leaves nothing
 * dangling for the engine to write into. */
struct sf_xform_out {
    atomic_int refs;
    size_t header_len, data_len;
    /* Bytes counted in g_xform_held while a client may still read the
     * reply, else 0 (sf_xform_out_release_share). */
    atomic_size_t held;
    char bytes[]; /* safetensors header, then float32 data */
};

/* The bytes of result replies held now, across requests: transform outputs
 * and the logits of ?return=logits batches. Each is held from its batch's
 * commit until its client has read it, so http.max_connections slow readers
 * could hold gigabytes (a segmentation model's logits are classes x 4 bytes
 * a pixel); new ones are refused (503 transform_busy or logits_busy,
 * Retry-After) beyond what every ring slot's output at once would take. */
static atomic_size_t g_xform_held;

static size_t xform_held_cap(const sf_upload_ctx *cx)
{
    return (size_t)cx->cfg->ring.slots * (size_t)cx->cfg->ring.slot_bytes * 8;
}

static void xform_release_share(sf_xform_out *o)
{
    size_t held = atomic_exchange(&o->held, 0);
    if (held)
        atomic_fetch_sub(&g_xform_held, held);
}

static void xform_release(void *p)
{
    sf_xform_out *o = p;
    if (o && atomic_fetch_sub(&o->refs, 1) == 1) {
        xform_release_share(o);
        free(o);
    }
}

/* The augmentation an upload's batch will get: eval batches have their own. */
static const sf_aug_pipeline *aug_of(const sf_upload_ctx *cx, const sf_upload *u)
{
    return u->eval ? cx->aug_eval : cx->aug;
}

void sf_upload_on_rejected(sf_req *r, const char *reason)
{
    const char *v[] = {reason};
    sf_counter_inc_l(sf_upload_ctx_of(r->app)->m->batches_rejected, v, 1);
    const char *s[] = {"rejected"};
    sf_counter_inc_l(sf_upload_ctx_of(r->app)->m->batches_received, s, 1);
}

/* Rejects the upload: one reply, one count, the slot back to FREE. field
 * (may be NULL) names the bad part, e.g. "jpeg[3]" for a sample. */
static int reject_field(sf_req *r, sf_upload *u, int status, const char *code, const char *field,
                        const char *msg)
{
    if (u && u->slot >= 0 && !u->committed) {
        holders_remove(u);
        sf_ring_abort(sf_upload_ctx_of(r->app)->ring, u->slot);
        u->slot = -1;
    }
    sf_upload_on_rejected(r, code);
    sf_reply_error_field(r, status, code, field, "%s", msg);
    return -1;
}

static int reject(sf_req *r, sf_upload *u, int status, const char *code, const char *msg)
{
    return reject_field(r, u, status, code, NULL, msg);
}

static int status_of(sf_st_error e)
{
    switch (e) {
    case SF_ST_E_HEADER_TOO_LARGE:
    case SF_ST_E_BODY_TOO_LARGE:
        return 413;
    case SF_ST_E_LABEL_OUT_OF_RANGE:
    case SF_ST_E_IMAGE_TOO_LARGE:
    case SF_ST_E_BATCH_TOO_LARGE:
    case SF_ST_E_JPEG_SIDE_TOO_LARGE:
    case SF_ST_E_JPEG_TOO_MANY_PIXELS:
    case SF_ST_E_JPEG_BATCH_TOO_LARGE:
        return 422;
    case SF_ST_E_OUT_OF_MEMORY:
        return 503;
    default:
        return 400;
    }
}

/* The option(s) that set the bound a size refusal hit, so that its message
 * says what to raise (the parser knows bounds, not option names); NULL for
 * the other refusals. */
static const char *bound_option(const sf_upload_ctx *cx, sf_st_error e)
{
    const sf_config *c = sf_config_cur();
    switch (e) {
    case SF_ST_E_BODY_TOO_LARGE: return SF_UPLOAD_MAX_BODY_OPTION;
    case SF_ST_E_HEADER_TOO_LARGE: return "limits.max_tensor_header_bytes";
    case SF_ST_E_BATCH_TOO_LARGE:
        return c->limits.max_n < cx->cfg->model.max_batch ? "limits.max_n" : "model.max_batch, a restart option";
    case SF_ST_E_IMAGE_TOO_LARGE: return "limits.max_h and limits.max_w";
    default: return NULL; /* the JPEG bounds' messages name jpeg.max_side, max_pixels, max_batch_pixels */
    }
}

/* Rejects a body the parser refused; a bad JPEG file is named in the reply's
 * field ("jpeg[3]") as in its message, and a size refusal names the option
 * that sets its bound. */
static int reject_parse(sf_req *r, sf_upload *u)
{
    const sf_st_parser *p = &u->parser;
    int64_t bad = sf_st_bad_sample(p);
    char field[32];
    if (bad >= 0)
        snprintf(field, sizeof field, "%s[%lld]", sf_st_info_of(p)->files_name, (long long)bad);
    const char *opt = bound_option(sf_upload_ctx_of(r->app), sf_st_error_of(p));
    char msg[640];
    snprintf(msg, sizeof msg, "%s%s%s%s", sf_st_error_message(p), opt ? " (bound by " : "", opt ? opt : "",
             opt ? ")" : "");
    return reject_field(r, u, status_of(sf_st_error_of(p)), sf_st_error_code(p), bad >= 0 ? field : NULL, msg);
}

/* decode.exif_orientation, decided once for the batch as its body ends:
 * with apply, a file whose EXIF orientation turns it by a quarter keeps its
 * turned size in its header record (the size it trains at) and its
 * orientation (which its decoder applies); with ignore every file keeps the
 * size it is stored at and orientation 1. */
static void orient_files(int n, sf_jpeg_info *ji, unsigned *forms)
{
    const int apply = strcmp(sf_config_cur()->decode.exif_orientation, "apply") == 0;
    for (int i = 0; i < n; i++) {
        if (!apply || ji[i].orientation < 2 || ji[i].orientation > 8) {
            ji[i].orientation = 1;
            continue;
        }
        *forms |= SF_JPEG_FORM_ORIENTED;
        if (ji[i].orientation >= 5) {
            const int32_t t = ji[i].h;
            ji[i].h = ji[i].w;
            ji[i].w = t;
        }
    }
}

/* The encoded form, once every file's header was read. The batch is ragged
 * (*h = *w = 0) when the augmentation maps any source size to one output;
 * otherwise (a list without a resize or crop that fixes the size) every file
 * must have one size, which the plan is made for and checked against the
 * model. *forms: the SF_JPEG_FORM_* bits (gpu/backend.h) over the files, so
 * that the backend picks its decoder from what was read here instead of
 * reading every header again on the engine thread. Returns 0, or -1 after a
 * reply. */
static int jpeg_batch_shape(sf_req *r, sf_upload *u, int *h, int *w, unsigned *forms)
{
    const sf_upload_ctx *cx = sf_upload_ctx_of(r->app);
    const sf_st_info *in = sf_st_info_of(&u->parser);
    sf_jpeg_info *ji = (sf_jpeg_info *)(void *)(sf_ring_bytes(cx->ring, u->slot) + in->jpeg_info_dest_off);
    *forms = 0;
    for (int i = 0; i < in->n; i++)
        *forms |= sf_jpeg_forms(&ji[i]);
    orient_files(in->n, ji, forms);
    *h = *w = 0;
    sf_aug_plan plan;
    char ragged_err[256];
    if (!cx->backend || sf_aug_plan_make_ragged(aug_of(cx, u), in->c, &plan, ragged_err, sizeof ragged_err) == 0)
        return 0;
    for (int i = 1; i < in->n; i++) {
        if (ji[i].h != ji[0].h || ji[i].w != ji[0].w) {
            char msg[512], field[32];
            snprintf(msg, sizeof msg,
                     "sample %d of \"%s\" is %dx%d (HxW) but sample 0 is %dx%d, and this augmentation needs "
                     "one source size: %s",
                     i, in->files_name, ji[i].h, ji[i].w, ji[0].h, ji[0].w, ragged_err);
            snprintf(field, sizeof field, "%s[%d]", in->files_name, i);
            return reject_field(r, u, 422, "jpeg_sizes_differ", field, msg);
        }
    }
    char err[256];
    if (sf_aug_plan_make(aug_of(cx, u), ji[0].h, ji[0].w, in->c, &plan, err, sizeof err))
        return reject(r, u, 422, "augment_shape_invalid", err);
    if (u->kind == 0 && (plan.c != cx->model->in_c || plan.out_h != cx->model->in_h ||
                         plan.out_w != cx->model->in_w)) {
        char msg[256];
        snprintf(msg, sizeof msg,
                 "encoded samples of %dx%d (HxW) augment to %dx%dx%d but the model takes %dx%dx%d (C,H,W)",
                 ji[0].h, ji[0].w, plan.c, plan.out_h, plan.out_w, cx->model->in_c, cx->model->in_h,
                 cx->model->in_w);
        return reject(r, u, 422, "shape_mismatch", msg);
    }
    *h = ji[0].h;
    *w = ji[0].w;
    return 0;
}

uint64_t sf_upload_max_body(struct sf_app *app)
{
    const sf_upload_ctx *cx = sf_upload_ctx_of(app);
    const sf_config *c = sf_config_cur();
    /* A body is the data (at most one slot) plus its header. */
    return (uint64_t)cx->cfg->ring.slot_bytes + 8 + (uint64_t)c->limits.max_tensor_header_bytes;
}

static sf_upload *upload_of(sf_req *r, int kind)
{
    if (r->user)
        return r->user;
    sf_upload *u = calloc(1, sizeof *u);
    if (!u)
        return NULL;
    u->kind = kind;
    if (kind == 0) {
        /* The query was checked by the route before the first body byte. */
        const char *mode = sf_req_arg(r, "mode"), *name = sf_req_arg(r, "eval"), *ret = sf_req_arg(r, "return");
        u->eval = mode && strcmp(mode, "eval") == 0;
        u->want_logits = u->eval && ret && strcmp(ret, "logits") == 0;
        snprintf(u->eval_name, sizeof u->eval_name, "%s", name ? name : SF_EVAL_DEFAULT_NAME);
    }
    u->slot = -1;
    u->req = r;
    pthread_mutex_init(&u->mu, NULL);
    const sf_config *c = sf_config_cur();
    sf_st_limits lim = {0};
    lim.max_header_bytes = (uint64_t)c->limits.max_tensor_header_bytes;
    lim.max_body_bytes = sf_upload_max_body(r->app);
    lim.max_n = c->limits.max_n < sf_upload_ctx_of(r->app)->cfg->model.max_batch ? c->limits.max_n
                                                              : sf_upload_ctx_of(r->app)->cfg->model.max_batch;
    lim.max_h = c->limits.max_h;
    lim.max_w = c->limits.max_w;
    /* Labels are checked in sink mode too: it benchmarks the same ingest path. */
    lim.classes = kind == 0 ? sf_upload_ctx_of(r->app)->model->n_classes : 0;
    lim.labels_required = kind == 0;
    lim.jpeg_max_side = c->jpeg.max_side;
    lim.jpeg_max_pixels = c->jpeg.max_pixels;
    /* The decode buffers were sized from the value at start (restart-only). */
    lim.jpeg_max_batch_pixels = sf_upload_ctx_of(r->app)->cfg->jpeg.max_batch_pixels;
    /* 0 allocated no decode buffers: JPEG batches are off. */
    lim.jpeg_off = sf_upload_ctx_of(r->app)->cfg->jpeg.max_batch_pixels == 0;
    sf_st_init(&u->parser, &lim);
    r->user = u;
    return u;
}

/* The header is valid: check it against the model, then get a slot. Returns
 * 0 with the slot set, 1 when the request was suspended, -1 after a reply. */
static int header_accepted(sf_req *r, sf_upload *u)
{
    const sf_upload_ctx *cx = sf_upload_ctx_of(r->app);
    const sf_st_info *in = sf_st_info_of(&u->parser);
    if (cx->backend && u->slot < 0 && !u->t_wait_start_ns && in->encoded) {
        /* Every file has its own size: the augmentation must map any size to
         * one output (a ragged plan), and that output and the 3 channels JPEGs
         * decode to must be the model's input. */
        sf_aug_plan plan;
        char err[256];
        /* A list that cannot take ragged sources (no resize or crop that fixes
         * the size) is checked at the commit, when the sizes are known. */
        if (sf_aug_plan_make_ragged(aug_of(cx, u), in->c, &plan, err, sizeof err) == 0 && u->kind == 0 &&
            (plan.c != cx->model->in_c || plan.out_h != cx->model->in_h ||
                             plan.out_w != cx->model->in_w)) {
            char msg[256];
            snprintf(msg, sizeof msg,
                     "JPEG samples augment to %dx%dx%d but the model takes %dx%dx%d (C,H,W)", plan.c,
                     plan.out_h, plan.out_w, cx->model->in_c, cx->model->in_h, cx->model->in_w);
            return reject(r, u, 422, "shape_mismatch", msg);
        }
        if (u->kind == 0 && cx->model->segmentation)
            return reject(r, u, 422, "labels_shape_unsupported",
                          "this model segments: JPEG batches carry class labels [N] only");
    } else if (cx->backend && u->slot < 0 && !u->t_wait_start_ns) {
        /* Check once, before waiting: the augmented shape must be the model's input. */
        sf_aug_plan plan;
        char err[256];
        if (sf_aug_plan_make(aug_of(cx, u), in->h, in->w, in->c, &plan, err, sizeof err))
            return reject(r, u, 422, "augment_shape_invalid", err);
        if (u->kind == 0 && (plan.c != cx->model->in_c || plan.out_h != cx->model->in_h ||
                             plan.out_w != cx->model->in_w)) {
            char msg[256];
            snprintf(msg, sizeof msg,
                     "images of %dx%dx%d augment to %dx%dx%d but the model takes %dx%dx%d (C,H,W)",
                     in->c, in->h, in->w, plan.c, plan.out_h, plan.out_w, cx->model->in_c,
                     cx->model->in_h, cx->model->in_w);
            return reject(r, u, 422, "shape_mismatch", msg);
        }
        if (u->kind == 0 && !cx->model->segmentation && in->label_ndim != 1)
            return reject(r, u, 422, "labels_shape_unsupported",
                          "this model classifies: labels must be [N]");
        if (u->kind == 0 && cx->model->segmentation &&
            (in->label_ndim != 3 || in->label_shape[1] != cx->model->out_h ||
             in->label_shape[2] != cx->model->out_w)) {
            char msg[200];
            snprintf(msg, sizeof msg, "this model segments: labels must be [N,%d,%d] (one class per "
                     "output pixel)", cx->model->out_h, cx->model->out_w);
            return reject(r, u, 422, "labels_shape_unsupported", msg);
        }
    }
    const char *cl = sf_req_header(r, "Content-Length");
    if (cl && u->slot < 0 && strtoull(cl, NULL, 10) != in->body_len) {
        /* The header says how long the body is: a different Content-Length is
         * a truncated or padded upload, known before any data is read. */
        char msg[200];
        snprintf(msg, sizeof msg, "Content-Length is %s but the safetensors header describes %llu bytes",
                 cl, (unsigned long long)in->body_len);
        return reject(r, u, 400, strtoull(cl, NULL, 10) < in->body_len ? "body_too_short" : "body_too_long",
                      msg);
    }
    if (in->dest_bytes > sf_ring_slot_bytes(cx->ring)) {
        char msg[200];
        snprintf(msg, sizeof msg, "batch data of %llu bytes exceeds ring.slot_bytes %zu",
                 (unsigned long long)in->dest_bytes, sf_ring_slot_bytes(cx->ring));
        return reject(r, u, 413, "batch_exceeds_slot", msg);
    }
    if (cx->dist && sf_distributed_state(cx->dist, NULL, 0) == SF_DIST_BROKEN) {
        /* The ranks can no longer take a step together: nothing accepted
         * could be trained (GET /readyz says why). */
        sf_reply_header(r, "Retry-After", "5");
        return reject(r, u, 503, "distributed_unavailable",
                      "this rank's data-parallel job stopped (a peer died, left or never joined): see /readyz");
    }
    for (;;) {
        uint64_t gen = sf_http_gen(*cx->http, SF_WAIT_SLOT);
        int slot = sf_ring_acquire(cx->ring);
        if (slot >= 0) {
            u->slot = slot;
            u->t_slot_ns = sf_now_ns();
            u->slot_bytes = 0;
            holders_add(u);
            sf_req_deadline_done(r); /* the slow-upload sweep bounds it from now */
            sf_slot_meta *m = sf_ring_meta(cx->ring, slot);
            m->t_filling_ns = u->t_slot_ns;
            sf_st_set_dest(&u->parser, sf_ring_bytes(cx->ring, slot), sf_ring_slot_bytes(cx->ring));
            r->wait = SF_WAIT_NONE;
            return 0;
        }
        /* Draining: an upload that began before the signal takes a free slot,
         * but none waits for one (the loader is better served elsewhere). */
        if (atomic_load(cx->draining) || r->wait == SF_WAIT_SHUTDOWN)
            return reject(r, u, 503, "shutting_down", "the service is shutting down");
        const sf_config *c = sf_config_cur();
        char ra[16];
        snprintf(ra, sizeof ra, "%d", c->ring.retry_after_s);
        if (strcmp(c->ring.full_policy, "reject") == 0) {
            sf_reply_header(r, "Retry-After", ra);
            return reject(r, u, 429, "ring_full", "every ring slot is busy; retry later");
        }
        uint64_t now = sf_now_ns();
        if (!u->t_wait_start_ns)
            u->t_wait_start_ns = now;
        uint64_t waited_ms = (now - u->t_wait_start_ns) / 1000000ull;
        if (r->wait == SF_WAIT_TIMEOUT || waited_ms >= (uint64_t)c->ring.full_timeout_ms) {
            sf_reply_header(r, "Retry-After", ra);
            char msg[160];
            snprintf(msg, sizeof msg, "no ring slot became free within %d ms; retry later",
                     c->ring.full_timeout_ms);
            return reject(r, u, 503, "ring_full_timeout", msg);
        }
        if (sf_http_wait(r, SF_WAIT_SLOT, 0, gen, c->ring.full_timeout_ms - (int)waited_ms) == 0)
            return 1;
        /* A slot was freed meanwhile: try again. */
    }
}

static int on_data_locked(sf_req *r, sf_upload *u, const uint8_t *data, size_t *len)
{
    size_t left = *len;
    while (left > 0) {
        sf_st_state st = sf_st_state_of(&u->parser);
        if (st == SF_ST_NEED_DEST) {
            int rc = header_accepted(r, u);
            if (rc != 0) {
                *len = left;
                return rc;
            }
            continue;
        }
        if (st == SF_ST_FAILED)
            break;
        size_t used = sf_st_feed(&u->parser, data, left);
        data += used;
        left -= used;
        if (u->slot >= 0)
            u->slot_bytes += used;
        if (used == 0 && sf_st_state_of(&u->parser) != SF_ST_NEED_DEST)
            break;
    }
    if (sf_st_state_of(&u->parser) == SF_ST_FAILED) {
        *len = 0;
        return reject_parse(r, u);
    }
    *len = left;
    return 0;
}

int sf_upload_on_data(sf_req *r, int kind, const uint8_t *data, size_t *len)
{
    sf_upload *u = upload_of(r, kind);
    if (!u) {
        sf_reply_error(r, 503, "out_of_memory", "cannot allocate the upload state");
        return -1;
    }
    pthread_mutex_lock(&u->mu);
    int rc;
    if (u->evicted) {
        /* The sweep took the slot back; bytes libmicrohttpd had already read
         * still arrive: end the connection (on_done counts the eviction). */
        *len = 0;
        rc = SF_STREAM_CLOSE;
    } else {
        rc = on_data_locked(r, u, data, len);
    }
    pthread_mutex_unlock(&u->mu);
    return rc;
}

void sf_upload_sweep(void *ctx)
{
    const sf_upload_ctx *cx = sf_upload_ctx_of(ctx);
    const sf_config *c = sf_config_cur();
    uint64_t now = sf_now_ns();
    uint64_t deadline_ns = (uint64_t)c->http.upload_deadline_s * 1000000000ull;
    double min_rate = (double)c->http.upload_min_bytes_per_s;
    if (!deadline_ns && min_rate <= 0)
        return;
    sf_uploads *sh = cx->shared;
    pthread_mutex_lock(&sh->holders_mu);
    for (sf_upload *u = sh->holders, *next; u; u = next) {
        next = u->hnext;
        if (pthread_mutex_trylock(&u->mu) != 0)
            continue; /* its thread is working on it right now: it moves */
        uint64_t held = now > u->t_slot_ns ? now - u->t_slot_ns : 0;
        const char *why = NULL;
        char msg[200] = "";
        if (deadline_ns && held > deadline_ns) {
            why = "upload_deadline_exceeded";
            snprintf(msg, sizeof msg, "held a ring slot for %.1f s without completing (http.upload_deadline_s %d)",
                     (double)held / 1e9, c->http.upload_deadline_s);
        } else if (min_rate > 0 && held > RATE_ALLOWANCE_NS &&
                   (double)u->slot_bytes < min_rate * (double)(held - RATE_ALLOWANCE_NS) / 1e9) {
            why = "upload_too_slow";
            snprintf(msg, sizeof msg, "sent %llu bytes in %.1f s holding a ring slot, below "
                     "http.upload_min_bytes_per_s %lld after the 5 s allowance",
                     (unsigned long long)u->slot_bytes, (double)held / 1e9,
                     (long long)c->http.upload_min_bytes_per_s);
        }
        if (why && u->slot >= 0 && !u->committed) {
            holders_remove_locked(sh, u);
            sf_ring_abort(cx->ring, u->slot);
            u->slot = -1;
            u->evicted = why;
            SF_WARN("request %s: %s: %s; its slot is freed and the connection closed",
                    u->req->request_id, why, msg);
            /* Alive: on_done removes it from the list (under holders_mu)
             * before it is freed. */
            sf_req_abort(u->req);
        }
        pthread_mutex_unlock(&u->mu);
    }
    pthread_mutex_unlock(&sh->holders_mu);
}

void sf_upload_close(struct sf_app *app)
{
    const sf_upload_ctx *cx = sf_upload_ctx_of(app);
    atomic_store(cx->closing, 1);
    while (atomic_load(&cx->shared->committing) > 0) {
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
    }
}

static size_t xform_header(const sf_st_info *in, const sf_aug_plan *plan, char *buf, size_t cap)
{
    sf_st_tensor_desc t = {"images", SF_ST_F32, 4, {in->n, plan->c, plan->out_h, plan->out_w}};
    return sf_st_header_build(buf, cap, &t, 1, "{\"layout\":\"NCHW\",\"producer\":\"streamfeed\"}");
}

static int commit_locked(sf_req *r, sf_upload *u, uint64_t *job_id);

/* The buffer of a reply the engine writes into, a transform's floats or an
 * eval batch's logits (a header of hl bytes, then dl): its bytes held
 * against cap, the bound of replies not yet read (503 busy_code beyond it,
 * with Retry-After), allocated, and handed to the slot as its result.
 * NULL after the refusal. */
static sf_xform_out *hold_reply(sf_req *r, sf_upload *u, sf_slot_meta *m, size_t hl, size_t dl, size_t cap,
                                const char *busy_code, const char *what)
{
    const size_t want = hl + dl;
    if (atomic_fetch_add(&g_xform_held, want) + want > cap) {
        atomic_fetch_sub(&g_xform_held, want);
        sf_reply_header(r, "Retry-After", "1");
        reject(r, u, 503, busy_code,
               "transform and logits replies not yet read by their clients hold ring.slots x 8 x "
               "ring.slot_bytes; retry once they are");
        return NULL;
    }
    sf_xform_out *o = hl ? malloc(sizeof *o + hl + dl + 64) : NULL;
    if (!o) {
        atomic_fetch_sub(&g_xform_held, want);
        char msg[96];
        snprintf(msg, sizeof msg, "cannot allocate the %s", what);
        reject(r, u, 503, "out_of_memory", msg);
        return NULL;
    }
    atomic_init(&o->refs, 2); /* the request and the engine */
    o->header_len = hl;
    o->data_len = dl;
    atomic_init(&o->held, want);
    u->out = o;
    m->result = (float *)(void *)(o->bytes + hl);
    m->result_owner = o;
    m->release_result = xform_release;
    return o;
}

int sf_upload_commit(sf_req *r, uint64_t *job_id)
{
    sf_upload *u = r->user;
    if (!u) {
        sf_upload_on_rejected(r, "body_empty");
        sf_reply_error(r, 400, "body_empty", "the body must be a safetensors file");
        return -1;
    }
    /* Counted before closing is tested: sf_upload_close sets closing first,
     * then waits for this count, so a commit either sees closing or is
     * waited for (both are sequentially consistent atomics). */
    sf_uploads *sh = sf_upload_ctx_of(r->app)->shared;
    atomic_fetch_add(&sh->committing, 1);
    pthread_mutex_lock(&u->mu);
    int rc = commit_locked(r, u, job_id);
    pthread_mutex_unlock(&u->mu);
    atomic_fetch_sub(&sh->committing, 1);
    return rc;
}

static int commit_locked(sf_req *r, sf_upload *u, uint64_t *job_id)
{
    const sf_upload_ctx *cx = sf_upload_ctx_of(r->app);
    if (u->evicted) {
        /* The sweep freed the slot just as the last bytes came in. */
        return reject(r, u, 408, u->evicted, "the upload lost its ring slot for being too slow");
    }
    if (atomic_load(cx->closing))
        return reject(r, u, 503, "shutting_down",
                      "the service is shutting down: the batch was not accepted");
    if (sf_st_finish(&u->parser) != 0)
        return reject_parse(r, u);
    if (u->slot < 0) /* cannot happen after a successful finish; defensive */
        return reject(r, u, 400, "body_empty", "no data");
    const sf_st_info *in = sf_st_info_of(&u->parser);
    int h = in->h, w = in->w;
    unsigned forms = 0;
    if (in->encoded && jpeg_batch_shape(r, u, &h, &w, &forms) != 0)
        return -1;
    sf_slot_meta *m = sf_ring_meta(cx->ring, u->slot);
    m->kind = u->kind;
    m->eval = u->eval;
    snprintf(m->eval_name, sizeof m->eval_name, "%s", u->eval_name);
    m->result = NULL;
    m->result_owner = NULL;
    m->release_result = NULL;
    m->n = in->n;
    m->h = h;
    m->w = w;
    m->c = in->c;
    m->nhwc = in->nhwc;
    m->encoded = in->encoded;
    m->files_named_jpeg = in->encoded && strcmp(in->files_name, "jpeg") == 0;
    m->jpeg_forms = forms;
    m->jpeg_offsets_off = in->jpeg_offsets_dest_off;
    m->jpeg_info_off = in->jpeg_info_dest_off;
    m->decoded_bytes = in->encoded ? (size_t)in->jpeg_pixels * 3 : 0;
    m->labels_off = in->labels_dest_off;
    m->used = in->dest_bytes;
    m->label_dtype = !in->has_labels            ? -1
                     : in->label_dtype == SF_ST_U8 ? SF_LABEL_U8
                     : in->label_dtype == SF_ST_I32 ? SF_LABEL_I32
                                                    : SF_LABEL_I64;
    if (u->kind == 1) { /* a transform: the route's head refused it without a backend */
        sf_aug_plan plan;
        char err[256];
        if ((in->encoded && h == 0 ? sf_aug_plan_make_ragged(cx->aug, in->c, &plan, err, sizeof err)
                                   : sf_aug_plan_make(cx->aug, h, w, in->c, &plan, err, sizeof err)))
            return reject(r, u, 422, "augment_shape_invalid", err);
        size_t hl = xform_header(in, &plan, NULL, 0);
        size_t dl = (size_t)in->n * (size_t)plan.c * (size_t)plan.out_h * (size_t)plan.out_w * 4;
        /* The float output is bounded like an input slot (times the float expansion). */
        if (hl == 0 || dl > (size_t)cx->cfg->ring.slot_bytes * 8)
            return reject(r, u, 413, "output_too_large",
                          "the augmented batch would be too large: its floats may take 8 x ring.slot_bytes");
        sf_xform_out *o = hold_reply(r, u, m, hl, dl, xform_held_cap(cx), "transform_busy", "transform output");
        if (!o)
            return -1;
        xform_header(in, &plan, o->bytes, hl);
    }
    if (u->want_logits) {
        /* The logits reply: [N, classes] (a segmentation model: [N, classes,
         * H, W]) floats, at most model.max_batch of them, like any result. */
        const sf_model *md = cx->model;
        sf_st_tensor_desc t = {"logits", SF_ST_F32, 2, {in->n, md->n_classes, 0, 0}};
        if (md->segmentation) {
            t.ndim = 4;
            t.shape[2] = md->out_h;
            t.shape[3] = md->out_w;
        }
        const char *meta = "{\"producer\":\"streamfeed\"}";
        size_t hl = sf_st_header_build(NULL, 0, &t, 1, meta);
        size_t dl = (size_t)in->n * (size_t)md->n_classes *
                    (md->segmentation ? (size_t)md->out_h * (size_t)md->out_w : 1) * 4;
        /* A 202 (the wait ran out) keeps the logits within eval.logits_keep_bytes,
         * and unread replies share the transforms' bound: logits that could
         * never fit either are refused now, not lost later. */
        int64_t keep = sf_config_cur()->eval.logits_keep_bytes;
        const size_t want = hl + dl, cap = xform_held_cap(cx);
        if ((int64_t)want > keep || want > cap) {
            char msg[200];
            if ((int64_t)want > keep)
                snprintf(msg, sizeof msg, "the logits (%zu bytes) exceed eval.logits_keep_bytes %lld", want,
                         (long long)keep);
            else
                snprintf(msg, sizeof msg, "the logits (%zu bytes) exceed ring.slots x 8 x ring.slot_bytes (%zu), "
                         "what unread replies may hold", want, cap);
            return reject(r, u, 413, "logits_too_large", msg);
        }
        sf_xform_out *o = hold_reply(r, u, m, hl, dl, cap, "logits_busy", "logits reply");
        if (!o)
            return -1;
        sf_st_header_build(o->bytes, hl, &t, 1, meta);
    }
    /* The evaluation's name is made known by its first accepted batch only:
     * the last test, so that no refusal after it leaves an empty evaluation
     * holding one of eval.max_names (the early test in handlers/batches.c
     * may have raced with other names' first batches). */
    if (u->eval && sf_evals_reserve(cx->evals, u->eval_name, sf_evals_idle_ns(sf_config_cur()->eval.name_idle_s)) != 0) {
        if (u->out)
            xform_release(u->out); /* the engine's reference (it never sees the slot); on_done drops ours */
        char msg[160];
        sf_evals_full_message(cx->evals, msg, sizeof msg);
        return reject(r, u, 409, "too_many_evals", msg);
    }
    u->job_id = sf_jobs_create(cx->jobs, in->n, u->eval ? SF_JOB_KIND_EVAL : u->kind);
    if (u->eval)
        sf_jobs_set_eval_name(cx->jobs, u->job_id, u->eval_name);
    m->job_id = u->job_id;
    m->t_ready_ns = sf_now_ns();
    u->committed = 1;
    holders_remove(u);
    sf_ring_commit(cx->ring, u->slot);
    sf_counter_add(sf_metric_only(cx->m->bytes_received), (double)r->bytes_in);
    *job_id = u->job_id;
    r->batch_id = u->job_id;
    return 0;
}

static void free_reply(void *p) { xform_release((char *)p - offsetof(sf_xform_out, bytes)); }

void sf_xform_out_retain(sf_xform_out *o) { atomic_fetch_add(&o->refs, 1); }

void sf_xform_out_release(sf_xform_out *o) { xform_release(o); }

void sf_xform_out_release_share(sf_xform_out *o) { xform_release_share(o); }

size_t sf_xform_out_size(const sf_xform_out *o) { return o->header_len + o->data_len; }

int sf_xform_out_reply(sf_req *r, sf_xform_out *o)
{
    /* The reply holds its own reference until libmicrohttpd has sent it. */
    sf_xform_out_retain(o);
    return sf_reply_bytes(r, 200, "application/vnd.safetensors", o->bytes, sf_xform_out_size(o),
                          free_reply);
}

int sf_upload_transform_reply(sf_req *r)
{
    sf_upload *u = r->user;
    return sf_xform_out_reply(r, u->out);
}

void sf_upload_on_done(sf_req *r, int ok)
{
    sf_upload *u = r->user;
    if (!u) {
        /* The client went away before sending any body byte. */
        if (!ok && r->status == 0)
            sf_upload_on_rejected(r, "aborted");
        return;
    }
    /* Out of the sweep's sight first: from here on only this thread sees u. */
    holders_remove(u);
    if (u->slot >= 0 && !u->committed) {
        /* The client went away mid-upload: the slot returns, nothing reaches READY. */
        sf_ring_abort(sf_upload_ctx_of(r->app)->ring, u->slot);
        u->slot = -1;
    }
    if (u->evicted && r->status == 0) {
        /* Closed by the sweep, without a reply: the request's log line and
         * status counters show 408 with the code. */
        r->status = 408;
        sf_upload_on_rejected(r, u->evicted);
        const char *v[] = {u->evicted};
        sf_counter_inc_l(sf_upload_ctx_of(r->app)->m->uploads_evicted, v, 1);
    } else if (!u->committed && r->status == 0) {
        sf_upload_on_rejected(r, "aborted");
    }
    if (u->out) {
        /* The request is over: its reply was sent (the response holds its
         * own reference until libmicrohttpd let it go) or never will be. */
        xform_release_share(u->out);
        xform_release(u->out);
    }
    sf_st_free(&u->parser);
    pthread_mutex_destroy(&u->mu);
    free(u);
    r->user = NULL;
}
