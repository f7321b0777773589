/* server/checkpoint.c — see checkpoint.h: the checkpoint operations (requests,
 * engine commands, the periodic hook) and the module's process life. The
 * format is in checkpoint_format.c, the state against the backend in
 * checkpoint_snapshot.c, the I/O threads in checkpoint_io.c, files in
 * checkpoint_store.c and URL transfers in checkpoint_url.c. */
#include "server/checkpoint_state.h"

#include <curl/curl.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>


#include "server/app.h"
#include "server/clock.h"
#include "server/distributed.h"
#include "server/checkpoint_format.h"
#include "server/checkpoint_store.h"
#include "server/checkpoint_url.h"
#include "server/text.h"
#include "server/config.h"
#include "server/engine.h"
#include "server/http.h"
#include "server/log.h"
#include "server/metrics.h"

#define fail sf_ckpt_fail

/* ---- operations ---------------------------------------------------------------------- */

static void sf_ckpt_op_release_void(void *p) { sf_ckpt_op_release(p); }

static int post_cmd(sf_ckpt *ck, int (*fn)(sf_app *, void *, char *, size_t), sf_ckpt_op *op,
                    sf_ckpt_error *e)
{
    sf_app *app = ck->app;
    if (!app->engine || atomic_load(&app->draining)) {
        fail(e, 503, "shutting_down", NULL, "the service is shutting down");
        return -1;
    }
    if (app->dist && sf_distributed_state(app->dist, NULL, 0) == SF_DIST_JOINING) {
        /* The engine runs no command until every rank has joined: queued
         * now, the request would wait out the whole join window. */
        fail(e, 503, "distributed_unavailable", NULL,
             "this rank is still joining its data-parallel job (distributed.join_timeout_s); checkpoints "
             "are read and written once every rank has joined");
        return -1;
    }
    sf_ckpt_op_ref(op);
    sf_engine_cmd *c = sf_engine_cmd_new(fn, op, sf_ckpt_op_release_void);
    if (!c) {
        sf_ckpt_op_release(op);
        fail(e, 503, "out_of_memory", NULL, "out of memory");
        return -1;
    }
    if (sf_engine_post(app->engine, c) != 0) {
        sf_engine_cmd_release(c); /* frees the command and its reference to op */
        fail(e, 503, "engine_busy", NULL,
             "the engine is stopping or has %d commands queued; retry later", SF_ENGINE_MAX_CMDS);
        return -1;
    }
    sf_engine_cmd_release(c); /* the engine holds its own reference */
    return 0;
}


/* Engine commands: run between two steps with nothing in flight. */
static int cmd_snapshot(sf_app *app, void *arg, char *err, size_t errlen)
{
    sf_ckpt_op *op = arg;
    sf_ckpt *ck = op->ck;
    if (op->kind == OP_PERIODIC && !op->b) {
        /* Periodic saves turned on at run time: the buffer comes now, once. */
        if (!ck->periodic) {
            ck->periodic = sf_ckpt_blob_new(ck, sf_ckpt_can_read_opt(ck), 0, 0);
        }
        op->b = ck->periodic;
        if (!op->b) {
            snprintf(err, errlen, "out of memory for the periodic checkpoint buffer");
            sf_ckpt_count_save(ck, 0, 0, 0);
            SF_WARN("checkpoint: %s", err);
            atomic_store(&ck->periodic_busy, 0);
            return -1;
        }
    }
    if (sf_ckpt_snapshot(ck, op->b, err, errlen) != 0) {
        if (op->kind == OP_PERIODIC) {
            sf_ckpt_count_save(ck, 0, 0, 0);
            SF_WARN("checkpoint: periodic save failed: %s", err);
            atomic_store(&ck->periodic_busy, 0);
        } else {
            sf_ckpt_op_fail(op, 500, "checkpoint_failed", err);
            sf_ckpt_stage_finish(op);
        }
        return -1;
    }
    if (op->kind == OP_GET) {
        op->res.step = op->b->step;
        op->res.bytes = op->b->len;
        op->res.tensors = sf_ckpt_n_tensors(&ck->lay, op->b->with_opt);
        op->res.optimizer = op->b->with_opt;
        sf_ckpt_stage_finish(op);
        return 0;
    }
    /* The file is written on the I/O thread: training goes on meanwhile. */
    if (sf_ckpt_io_enqueue(ck, op) != 0) {
        snprintf(err, errlen, "the checkpoint writer is stopping or busy");
        if (op->kind == OP_PERIODIC) {
            sf_ckpt_count_save(ck, 0, 0, 0);
            atomic_store(&ck->periodic_busy, 0);
        } else {
            sf_ckpt_op_fail(op, 503, "checkpoint_busy", err);
            sf_ckpt_stage_finish(op);
        }
        return -1;
    }
    return 0;
}

static int cmd_apply(sf_app *app, void *arg, char *err, size_t errlen)
{
    sf_ckpt_op *op = arg;
    int rc = sf_ckpt_apply(op->ck, &op->d, err, errlen);
    if (rc)
        sf_ckpt_op_fail(op, 500, "checkpoint_failed", err);
    sf_counter_add(rc ? op->ck->m_load_failed : op->ck->m_load_ok, 1);
    op->res.step = atomic_load(&app->step);
    op->res.bytes = op->d.bytes;
    op->res.tensors = op->d.tensors;
    op->res.optimizer = op->d.has_opt;
    sf_ckpt_stage_finish(op);
    return rc;
}

/* ---- the periodic hook ---------------------------------------------------------- */

static void after_step(sf_app *app, uint64_t step)
{
    sf_ckpt *ck = app->ckpt;
    /* In a data-parallel job every rank holds the same state: rank 0 writes it. */
    if (!ck || !ck->dir[0] || sf_distributed_rank(app->dist) != 0)
        return;
    sf_config *c = malloc(sizeof *c);
    if (!c)
        return;
    sf_config_get(c);
    int64_t every = c->checkpoint.every_steps;
    free(c);
    if (every <= 0 || step % (uint64_t)every != 0)
        return;
    if (atomic_exchange(&ck->periodic_busy, 1)) {
        /* The last one is still being written: this one is skipped, not queued,
         * so a slow disk costs checkpoints, never training time or memory. */
        sf_counter_add(ck->m_skipped, 1);
        return;
    }
    sf_ckpt_op *op = sf_ckpt_op_new(ck, OP_PERIODIC);
    sf_ckpt_error e;
    if (!op || post_cmd(ck, cmd_snapshot, op, &e) != 0) {
        /* Out of memory, or the engine is stopping (the final save follows). */
        atomic_store(&ck->periodic_busy, 0);
        sf_counter_add(ck->m_skipped, 1);
    }
    sf_ckpt_op_release(op);
}

/* ---- request operations ----------------------------------------------------------- */

static int usable(sf_app *app, sf_ckpt_error *e)
{
    if (!app->backend || !app->ckpt) {
        fail(e, 409, "no_backend", NULL, "checkpoints need a compute backend (pipeline.mode=train)");
        return -1;
    }
    if (atomic_load(&app->draining)) {
        fail(e, 503, "shutting_down", NULL, "the service is shutting down");
        return -1;
    }
    return 0;
}

static int opt_readable(sf_app *app, int with_opt, sf_ckpt_error *e)
{
    if (app->ckpt->lay.n_bn > 0 && !app->backend->i->get_buffers) {
        fail(e, 501, "buffers_unsupported", NULL,
             "the %s backend cannot read its batchnorm running statistics yet", app->backend_name);
        return -1;
    }
    if (with_opt && !sf_ckpt_can_read_opt(app->ckpt)) {
        fail(e, 501, "optimizer_state_unsupported", "optimizer",
             "the %s backend cannot read its optimizer state yet; ask for the parameters alone "
             "(optimizer=false)", app->backend_name);
        return -1;
    }
    return 0;
}

sf_ckpt_op *sf_ckpt_get(sf_app *app, int with_opt, sf_ckpt_error *e)
{
    if (usable(app, e) || opt_readable(app, with_opt, e))
        return NULL;
    sf_ckpt *ck = app->ckpt;
    if (sf_ckpt_download_reserve(app) != 0) {
        fail(e, 503, "checkpoint_busy", NULL, "every checkpoint buffer downloads may hold (%d of %d) is in use; "
             "retry later", SF_CKPT_MAX_DOWNLOAD_BUFFERS, SF_CKPT_MAX_BUFFERS);
        return NULL;
    }
    sf_ckpt_op *op = sf_ckpt_op_new(ck, OP_GET);
    blob *b = op ? sf_ckpt_blob_new(ck, with_opt, 0, BLOB_DOWNLOAD) : NULL;
    if (!b) {
        sf_ckpt_download_return(app);
        sf_ckpt_op_release(op);
        fail(e, 503, "out_of_memory", NULL, "cannot allocate %zu bytes for the checkpoint",
             ck->lay.hdr_bytes[1] + sf_ckpt_data_bytes(&ck->lay, with_opt));
        return NULL;
    }
    op->b = b;
    if (post_cmd(ck, cmd_snapshot, op, e) != 0) {
        sf_ckpt_op_release(op);
        return NULL;
    }
    return op;
}

uint64_t sf_ckpt_max_bytes(sf_app *app)
{
    sf_config *c = malloc(sizeof *c);
    if (!c)
        return 0;
    sf_config_get(c);
    uint64_t max = (uint64_t)c->checkpoint.max_bytes;
    free(c);
    if (app->ckpt && sf_ckpt_max_file_bytes(&app->ckpt->lay) < max)
        max = sf_ckpt_max_file_bytes(&app->ckpt->lay);
    return max;
}

int sf_ckpt_spool_open(sf_app *app, sf_ckpt_error *e)
{
    if (usable(app, e))
        return -1;
    return sf_ckpt_store_spool(app->ckpt->dir, e);
}

sf_ckpt_op *sf_ckpt_put(sf_app *app, int fd, size_t len, sf_ckpt_error *e)
{
    if (usable(app, e))
        return NULL;
    sf_ckpt *ck = app->ckpt;
    sf_ckpt_op *op = sf_ckpt_op_new(ck, OP_PUT);
    if (!op) {
        fail(e, 503, "out_of_memory", NULL, "out of memory");
        return NULL;
    }
    /* Validated here, on the request's thread: a bad file changes nothing. */
    const uint8_t *body = sf_ckpt_store_map(fd, len, e);
    int rc = body ? sf_ckpt_decode_for(ck, body, len, SF_CKPT_READ_STRICT, &op->d, e) : -1;
    if (body)
        sf_ckpt_store_unmap(body, len);
    if (rc != 0) {
        sf_counter_add(ck->m_load_failed, 1);
        sf_ckpt_op_release(op);
        return NULL;
    }
    op->stage = 1;
    if (post_cmd(ck, cmd_apply, op, e) != 0) {
        sf_ckpt_op_release(op);
        return NULL;
    }
    return op;
}

static int target_of(sf_ckpt *ck, sf_ckpt_op *op, const char *path, const char *url, int for_write,
                     sf_ckpt_error *e)
{
    if (path && url) {
        fail(e, 400, "request_invalid", "url", "give \"path\" or \"url\", not both");
        return -1;
    }
    if (url) {
        if (sf_ckpt_url_check(url, 1, e) != 0)
            return -1;
        snprintf(op->where, sizeof op->where, "%s", url);
        op->url = 1;
        return 0;
    }
    if (path)
        return sf_ckpt_store_resolve(ck->dir, path, for_write, op->where, sizeof op->where, e);
    if (!ck->dir[0]) {
        fail(e, 409, "checkpoint_dir_unset", "path",
             "without \"path\" or \"url\" the file is in checkpoint.dir, which is not set");
        return -1;
    }
    op->where[0] = '\0';
    return 0;
}

/* A save or a load (kind) of path or url, its target checked, holding one of
 * the SF_CKPT_MAX_BUFFERS checkpoint buffers (the caller owns the reservation:
 * the save's blob or the load's op->reserved returns it); NULL after fail(). */
static sf_ckpt_op *op_with_buffer(sf_app *app, int kind, const char *path, const char *url,
                                  sf_ckpt_error *e)
{
    sf_ckpt_op *op = sf_ckpt_op_new(app->ckpt, kind);
    if (!op) {
        fail(e, 503, "out_of_memory", NULL, "out of memory");
        return NULL;
    }
    if (target_of(app->ckpt, op, path, url, kind == OP_SAVE, e) != 0) {
        sf_ckpt_op_release(op);
        return NULL;
    }
    if (sf_ckpt_buffer_reserve(app) != 0) {
        sf_ckpt_op_release(op);
        fail(e, 503, "checkpoint_busy", NULL, "%d checkpoint buffers are in use; retry later",
             SF_CKPT_MAX_BUFFERS);
        return NULL;
    }
    return op;
}

sf_ckpt_op *sf_ckpt_save(sf_app *app, const char *path, const char *url, int with_opt,
                         sf_ckpt_error *e)
{
    if (usable(app, e) || opt_readable(app, with_opt, e))
        return NULL;
    sf_ckpt *ck = app->ckpt;
    sf_ckpt_op *op = op_with_buffer(app, OP_SAVE, path, url, e);
    if (!op)
        return NULL;
    op->b = sf_ckpt_blob_new(ck, with_opt, 0, 1);
    if (!op->b) {
        sf_ckpt_buffer_return(app);
        sf_ckpt_op_release(op);
        fail(e, 503, "out_of_memory", NULL, "cannot allocate the checkpoint buffer");
        return NULL;
    }
    if (post_cmd(ck, cmd_snapshot, op, e) != 0) {
        sf_ckpt_op_release(op);
        return NULL;
    }
    return op;
}

sf_ckpt_op *sf_ckpt_load(sf_app *app, const char *path, const char *url, sf_ckpt_error *e)
{
    if (usable(app, e))
        return NULL;
    sf_ckpt *ck = app->ckpt;
    sf_ckpt_op *op = op_with_buffer(app, OP_LOAD, path, url, e);
    if (!op)
        return NULL;
    op->reserved = 1;
    if (sf_ckpt_io_enqueue(ck, op) != 0) {
        sf_ckpt_op_release(op);
        fail(e, 503, "checkpoint_busy", NULL, "the checkpoint I/O queue is full or stopping");
        return NULL;
    }
    return op;
}

int sf_ckpt_op_advance(sf_app *app, sf_ckpt_op *op)
{
    if (!atomic_load(&op->stage_done))
        return 0;
    if (op->failed)
        return 1;
    if (op->kind == OP_LOAD && op->stage == 0) {
        /* Read and checked on the I/O thread; restored between two steps. */
        op->stage = 1;
        atomic_store(&op->stage_done, 0);
        if (post_cmd(op->ck, cmd_apply, op, &op->err) != 0) {
            op->failed = 1;
            atomic_store(&op->stage_done, 1);
            return 1;
        }
        return 0;
    }
    op->res.seconds = (double)(sf_now_ns() - op->t0) / 1e9;
    return 1;
}

/* ---- process life ---------------------------------------------------------------------- */

static void register_metrics(sf_ckpt *ck)
{
    static const char *const L_STATUS[] = {"status", NULL};
    sf_family *total = sf_metrics_counter(
        "streamfeed_checkpoints_total",
        "Checkpoints written, by status: ok, failed, or skipped (a periodic save due while the "
        "last one was still being written).",
        L_STATUS);
    sf_family *loads = sf_metrics_counter("streamfeed_checkpoint_loads_total",
                                          "Checkpoints restored (PUT, load, resume), by status.",
                                          L_STATUS);
    sf_family *secs = sf_metrics_histogram(
        "streamfeed_checkpoint_seconds",
        "Time to take a checkpoint: snapshot between two steps, serialise, write and fsync.", NULL,
        sf_buckets_latency, sf_buckets_latency_n);
    sf_family *last = sf_metrics_gauge("streamfeed_checkpoint_last_step",
                                       "Step count of the last checkpoint written.", NULL);
    const char *ok[] = {"ok"}, *failed[] = {"failed"}, *skipped[] = {"skipped"};
    if (!ck) {
        /* Sink mode: the families exist and read 0. */
        sf_metric_child(total, ok);
        sf_metric_child(total, failed);
        sf_metric_child(total, skipped);
        sf_metric_child(loads, ok);
        sf_metric_child(loads, failed);
        sf_metric_only(secs);
        sf_metric_only(last);
        return;
    }
    ck->m_ok = sf_metric_child(total, ok);
    ck->m_failed = sf_metric_child(total, failed);
    ck->m_skipped = sf_metric_child(total, skipped);
    ck->m_load_ok = sf_metric_child(loads, ok);
    ck->m_load_failed = sf_metric_child(loads, failed);
    ck->m_seconds = sf_metric_only(secs);
    ck->m_last_step = sf_metric_only(last);
}

static int open_dir(sf_ckpt *ck, const char *dir, char *err, size_t errlen)
{
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "checkpoint.dir %s: cannot create it: %s", dir, strerror(errno));
        return -1;
    }
    if (!realpath(dir, ck->dir)) {
        snprintf(err, errlen, "checkpoint.dir %s: %s", dir, strerror(errno));
        ck->dir[0] = '\0';
        return -1;
    }
    struct stat st;
    if (stat(ck->dir, &st) != 0 || !S_ISDIR(st.st_mode) || access(ck->dir, W_OK | X_OK) != 0) {
        snprintf(err, errlen, "checkpoint.dir %s is not a writable directory", ck->dir);
        ck->dir[0] = '\0';
        return -1;
    }
    sf_ckpt_store_remove_tmp(ck->dir);
    return 0;
}

static int resume(sf_ckpt *ck, int *resumed, char *err, size_t errlen)
{
    sf_ckpt_decoded d = {0};
    sf_ckpt_error e = {0};
    char chosen[PATH_MAX + 80];
    *resumed = 0;
    if (sf_ckpt_read_newest(ck, strcmp(ck->app->cfg.checkpoint.resume, "if_compatible") == 0, &d, chosen, sizeof chosen, &e) != 0) {
        if (e.status == 404) {
            SF_INFO("checkpoint.resume: no checkpoint in %s: starting from the initialisation", ck->dir);
            return 0;
        }
        snprintf(err, errlen, "checkpoint.resume: %s", e.msg);
        sf_counter_add(ck->m_load_failed, 1);
        return -1;
    }
    int rc = sf_ckpt_apply(ck, &d, err, errlen);
    if (rc == 0) {
        SF_INFO("checkpoint.resume: restored %s (step %llu%s)", chosen,
                (unsigned long long)atomic_load(&ck->app->step),
                d.has_opt ? ", optimizer state included" : ", no optimizer state in the file");
        atomic_store(&ck->saved_step, atomic_load(&ck->app->step));
        atomic_store(&ck->saved_gen, atomic_load(&ck->state_gen));
        *resumed = 1;
    }
    sf_counter_add(rc ? ck->m_load_failed : ck->m_load_ok, 1);
    sf_ckpt_decoded_free(&d);
    return rc;
}

static int init_from(sf_ckpt *ck, const char *src, char *err, size_t errlen)
{
    sf_app *app = ck->app;
    char shown[512];
    if (sf_ckpt_is_url(src) && !sf_ckpt_url_scheme_ok(src)) {
        snprintf(err, errlen, "model.init_from: only http:// and https:// URLs are allowed");
        return -1;
    }
    if (sf_ckpt_is_url(src))
        sf_url_redact(src, shown, sizeof shown);
    else
        snprintf(shown, sizeof shown, "%.500s", src);
    sf_ckpt_error e = {0};
    sf_ckpt_decoded d = {0};
    d.params = malloc(app->model.n_params * sizeof(float));
    int rc = -1;
    if (!d.params || app->backend->i->get_params(app->backend, d.params) != 0) {
        snprintf(err, errlen, "model.init_from: cannot read the initial parameters");
        goto out;
    }
    /* Batchnorm running statistics named in the file initialise theirs too (a
     * pre-trained backbone runs with its own statistics). */
    sf_backend *be = app->backend;
    int bufs = ck->lay.n_bn > 0 && be->i->get_buffers && be->i->set_buffers;
    if (bufs) {
        d.bufs = malloc(app->model.n_buffers * sizeof(float));
        if (!d.bufs || be->i->get_buffers(be, d.bufs, &d.nbt) != 0) {
            snprintf(err, errlen, "model.init_from: cannot read the initial buffers");
            goto out;
        }
    }
    if (sf_ckpt_read_source(ck, src, 1, SF_CKPT_READ_PARTIAL, &d, &e) != 0) {
        snprintf(err, errlen, "model.init_from %s: %s", shown, e.msg);
        goto out;
    }
    if (be->i->set_params(be, d.params) != 0 || (bufs && be->i->set_buffers(be, d.bufs, d.nbt) != 0)) {
        snprintf(err, errlen, "model.init_from: the backend could not set its parameters");
        goto out;
    }
    atomic_fetch_add(&ck->state_gen, 1);
    SF_INFO("model.init_from: %d of %d parameter tensors initialised from %s (%d tensors in the file)",
            d.matched, ck->lay.n_pt, shown, d.tensors);
    rc = 0;
out:
    sf_ckpt_decoded_free(&d);
    return rc;
}

int sf_ckpt_start(sf_app *app, char *err, size_t errlen)
{
    if (!app->backend) {
        register_metrics(NULL);
        return 0;
    }
    sf_ckpt *ck = calloc(1, sizeof *ck);
    if (!ck) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    ck->app = app;
    pthread_mutex_init(&ck->mu, NULL);
    pthread_cond_init(&ck->cv, NULL);
    atomic_init(&ck->next_key, 1);
    app->ckpt = ck;
    register_metrics(ck);
    if (sf_ckpt_layout_init(&ck->lay, &app->model, strcmp(app->cfg.optim.name, "adamw") == 0, err,
                            errlen) != 0)
        return -1;
    const sf_config *c = &app->cfg;
    if (c->checkpoint.dir[0] && open_dir(ck, c->checkpoint.dir, err, errlen) != 0)
        return -1;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        snprintf(err, errlen, "libcurl could not be initialised");
        return -1;
    }
    ck->curl_ready = 1;
    int resumed = 0;
    if (strcmp(c->checkpoint.resume, "false") != 0 && resume(ck, &resumed, err, errlen) != 0)
        return -1;
    if (c->checkpoint.init_from[0]) {
        if (resumed)
            SF_INFO("model.init_from ignored: the state was resumed from a checkpoint");
        else if (init_from(ck, c->checkpoint.init_from, err, errlen) != 0)
            return -1;
    }
    if (!resumed) {
        atomic_store(&ck->saved_step, atomic_load(&app->step));
        atomic_store(&ck->saved_gen, atomic_load(&ck->state_gen));
    }
    /* Periodic saves configured from the start get their buffer now, in memory
     * the backend copies to fastest (pinned on CUDA). */
    if (ck->dir[0] && c->checkpoint.every_steps > 0) {
        ck->periodic = sf_ckpt_blob_new(ck, sf_ckpt_can_read_opt(ck), 1, 0);
        if (!ck->periodic) {
            snprintf(err, errlen, "cannot allocate %zu bytes for periodic checkpoints",
                     ck->lay.hdr_bytes[1] + sf_ckpt_data_bytes(&ck->lay, 1));
            return -1;
        }
    }
    return sf_ckpt_io_start(ck, err, errlen);
}

void sf_ckpt_attach(sf_app *app)
{
    if (app->ckpt && app->engine)
        sf_engine_set_after_step(app->engine, after_step);
}

static void final_save(sf_ckpt *ck)
{
    sf_app *app = ck->app;
    sf_config *c = malloc(sizeof *c);
    if (!c)
        return;
    sf_config_get(c);
    int on = c->checkpoint.on_shutdown;
    free(c);
    if (!ck->dir[0] || !on)
        return;
    uint64_t step = atomic_load(&app->step);
    if (step == atomic_load(&ck->saved_step) && atomic_load(&ck->state_gen) == atomic_load(&ck->saved_gen)) {
        SF_INFO("checkpoint: nothing new since step %llu: no final checkpoint needed",
                (unsigned long long)step);
        return;
    }
    int with_opt = sf_ckpt_can_read_opt(ck);
    sf_ckpt_op *op = sf_ckpt_op_new(ck, OP_FINAL);
    if (!op)
        return;
    if (ck->periodic && ck->periodic->with_opt == with_opt) {
        op->b = ck->periodic;
    } else {
        op->b = sf_ckpt_blob_new(ck, with_opt, 0, 0);
        if (!op->b) {
            SF_WARN("checkpoint: no memory for the final checkpoint");
            sf_ckpt_op_release(op);
            return;
        }
    }
    char err[256];
    /* The engine has stopped: nothing is in flight, the backend is ours. */
    if (sf_ckpt_snapshot(ck, op->b, err, sizeof err) != 0) {
        SF_WARN("checkpoint: final save failed: %s", err);
        sf_ckpt_count_save(ck, 0, 0, 0);
    } else {
        sf_ckpt_write_blob(ck, op);
    }
    sf_ckpt_op_release(op);
}

void sf_ckpt_shutdown(sf_app *app)
{
    sf_ckpt *ck = app->ckpt;
    if (!ck)
        return;
    sf_ckpt_io_stop(ck);
    if (app->backend && sf_distributed_rank(app->dist) == 0)
        final_save(ck);
    /* Requests may still hold operations (and GET replies their files): those
     * release themselves; the module's own state goes now. Each of them holds
     * a pointer to ck, so ck itself is kept until exit. */
    if (ck->periodic) {
        sf_ckpt_blob_free(ck->periodic);
        ck->periodic = NULL;
    }
    if (ck->curl_ready)
        curl_global_cleanup();
    ck->curl_ready = 0;
}

