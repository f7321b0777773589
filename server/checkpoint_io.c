/* server/checkpoint_io.c — the checkpoint I/O threads (one for files, one for
 * URLs): the file and URL transfers of the operations, never on the engine
 * thread or an HTTP thread (see checkpoint_state.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server/checkpoint_state.h"
#include "server/checkpoint_store.h"
#include "server/checkpoint_url.h"
#include "server/text.h"
#include "server/config.h"
#include "server/clock.h"
#include "server/log.h"

#define fail sf_ckpt_fail

/* Keeps the newest checkpoint.keep ckpt-<step> files. */
static void rotate(sf_ckpt *ck)
{
    sf_config *c = malloc(sizeof *c);
    if (!c)
        return;
    sf_config_get(c);
    int keep = c->checkpoint.keep;
    free(c);
    sf_ckpt_store_rotate(ck->dir, keep);
}

/* Reads a file against the model and what this backend can restore. */
int sf_ckpt_decode_for(sf_ckpt *ck, const uint8_t *buf, size_t len, int mode, sf_ckpt_decoded *d,
                       sf_ckpt_error *e)
{
    const sf_backend *be = ck->app->backend;
    sf_ckpt_caps caps = {
        .opt = be->i->set_opt_state && (!ck->lay.adamw || be->i->set_opt_sq),
        .buffers = be->i->set_buffers != NULL,
        .backend = ck->app->backend_name,
    };
    return sf_ckpt_decode(&ck->lay, &caps, buf, len, mode, d, e);
}

/* A file fetched for a request from someone else's server is that server's
 * words: its tensor names, header text and sizes are not repeated to the
 * caller (they would make the service a reader of internal URLs). The code
 * stays, and the tensor when it is one of the model's own names. */
static void hide_fetched(sf_ckpt *ck, const char *url, sf_ckpt_error *e)
{
    int own = 0;
    for (int k = 0; k < ck->lay.n_desc && e->field[0] && !own; k++)
        own = strcmp(ck->lay.desc_names[k], e->field) == 0;
    char shown[512];
    sf_url_redact(url, shown, sizeof shown);
    char msg[sizeof e->msg + 256];
    snprintf(msg, sizeof msg, "GET %.300s: not a usable checkpoint of this model (%s)%s%s", shown, e->code,
             own ? ": tensor " : "", own ? e->field : "");
    size_t n = strnlen(msg, sizeof e->msg - 1);
    memcpy(e->msg, msg, n);
    e->msg[n] = '\0';
    if (!own)
        snprintf(e->field, sizeof e->field, "url");
}

int sf_ckpt_read_source(sf_ckpt *ck, const char *where, int from_operator, int mode, sf_ckpt_decoded *d,
                        sf_ckpt_error *e)
{
    sf_config *c = malloc(sizeof *c);
    if (!c) {
        fail(e, 503, "out_of_memory", NULL, "out of memory");
        return -1;
    }
    sf_config_get(c);
    uint64_t max = (uint64_t)c->checkpoint.max_bytes;
    free(c);
    if (mode == SF_CKPT_READ_STRICT && sf_ckpt_max_file_bytes(&ck->lay) < max)
        max = sf_ckpt_max_file_bytes(&ck->lay);
    int rc;
    if (sf_ckpt_is_url(where)) {
        /* Downloads stream to an unnamed file and are decoded from its
         * mapping: memory holds the decoded state, never the raw bytes. */
        int fd = sf_ckpt_store_spool(ck->dir, e);
        if (fd < 0)
            return -1;
        uint64_t got = 0;
        rc = sf_ckpt_url_transfer(where, !from_operator, fd, max, NULL, 0, &ck->abort_xfer, &got, e);
        if (rc == 0) {
            const uint8_t *p = sf_ckpt_store_map(fd, (size_t)got, e);
            rc = p ? sf_ckpt_decode_for(ck, p, (size_t)got, mode, d, e) : -1;
            if (p) {
                sf_ckpt_store_unmap(p, (size_t)got);
                if (rc && !from_operator)
                    hide_fetched(ck, where, e);
            }
        }
        close(fd);
        return rc;
    }
    uint8_t *buf = NULL;
    size_t len = 0;
    if (sf_ckpt_store_read(where, from_operator, max, &buf, &len, e) != 0)
        return -1;
    rc = sf_ckpt_decode_for(ck, buf, len, mode, d, e);
    free(buf);
    return rc;
}

int sf_ckpt_io_enqueue(sf_ckpt *ck, sf_ckpt_op *op)
{
    sf_ckpt_queue *q = &ck->q[op->url ? SF_CKPT_Q_URLS : SF_CKPT_Q_FILES];
    pthread_mutex_lock(&ck->mu);
    if (!q->started || ck->stop || q->queued >= SF_CKPT_IO_QUEUE_MAX) {
        pthread_mutex_unlock(&ck->mu);
        return -1;
    }
    sf_ckpt_op_ref(op);
    op->next = NULL;
    if (q->tail)
        q->tail->next = op;
    else
        q->head = op;
    q->tail = op;
    q->queued++;
    pthread_cond_broadcast(&ck->cv); /* both threads wait on it: wake the right one too */
    pthread_mutex_unlock(&ck->mu);
    return 0;
}

void sf_ckpt_count_save(sf_ckpt *ck, int ok, uint64_t t0, uint64_t step)
{
    sf_counter_add(ok ? ck->m_ok : ck->m_failed, 1);
    if (ok) {
        sf_hist_observe(ck->m_seconds, (double)(sf_now_ns() - t0) / 1e9);
        sf_gauge_set(ck->m_last_step, (double)step);
    }
}

/* Writes op->b where op says: a path, a URL, or ckpt-<step> in checkpoint.dir
 * (then rotated). Runs on the I/O thread, or on main's at shutdown. */
int sf_ckpt_write_blob(sf_ckpt *ck, sf_ckpt_op *op)
{
    blob *b = op->b;
    int rc;
    char err[512] = "";
    if (op->url) {
        rc = sf_ckpt_url_transfer(op->where, 1, -1, 0, b->file, b->len, &ck->abort_xfer, NULL, &op->err);
        if (rc)
            op->failed = 1;
        sf_url_redact(op->where, op->res.where, sizeof op->res.where);
        op->res.url = 1;
    } else {
        char path[PATH_MAX + 80];
        if (op->where[0])
            snprintf(path, sizeof path, "%s", op->where);
        else
            snprintf(path, sizeof path, "%s/" SF_CKPT_FILE_PREFIX "%010llu" SF_CKPT_FILE_SUFFIX, ck->dir,
                     (unsigned long long)b->step);
        rc = sf_ckpt_store_write(path, b->file, b->len, err, sizeof err);
        snprintf(op->res.where, sizeof op->res.where, "%.2000s", path);
        if (rc) {
            sf_ckpt_op_fail(op, 500, "checkpoint_write_failed", err);
        } else if (!op->where[0]) {
            atomic_store(&ck->saved_step, b->step);
            atomic_store(&ck->saved_gen, b->gen);
            rotate(ck);
        }
    }
    sf_ckpt_count_save(ck, rc == 0, op->t0, b->step);
    op->res.step = b->step;
    op->res.bytes = b->len;
    op->res.tensors = sf_ckpt_n_tensors(&ck->lay, b->with_opt);
    op->res.optimizer = b->with_opt;
    op->res.seconds = (double)(sf_now_ns() - op->t0) / 1e9;
    if (rc && op->kind != OP_GET)
        SF_WARN("checkpoint: saving step %llu to %s failed: %s", (unsigned long long)b->step,
                op->res.where, op->err.msg);
    else if (op->kind == OP_PERIODIC || op->kind == OP_FINAL)
        SF_INFO("checkpoint: step %llu saved to %s (%zu bytes, %.3f s)", (unsigned long long)b->step,
                op->res.where, b->len, op->res.seconds);
    return rc;
}

/* The newest ckpt-<step> of checkpoint.dir that reads as a checkpoint;
 * corrupt files are skipped with a warning, any other failure stops. */
/* Files another model or optimizer wrote: decoding them failed for what they
 * are, not for damage. */
static int incompatible(const char *code)
{
    static const char *const codes[] = {"checkpoint_model_mismatch", "checkpoint_optimizer_mismatch",
                                        "checkpoint_tensor_mismatch", "checkpoint_tensor_missing",
                                        "checkpoint_tensor_unknown", "checkpoint_version_unsupported",
                                        "checkpoint_too_large"};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
        if (strcmp(code, codes[i]) == 0)
            return 1;
    return 0;
}

int sf_ckpt_read_newest(sf_ckpt *ck, int skip_incompatible, sf_ckpt_decoded *d, char *chosen, size_t cap,
                        sf_ckpt_error *e)
{
    sf_ckpt_file *v;
    int n = sf_ckpt_store_list(ck->dir, &v);
    if (n < 0) {
        fail(e, 500, "checkpoint_read_failed", NULL, "cannot list %s: %s", ck->dir, strerror(errno));
        return -1;
    }
    for (int i = 0; i < n; i++) {
        char p[PATH_MAX + 80];
        snprintf(p, sizeof p, "%s/%s", ck->dir, v[i].name);
        int rc = sf_ckpt_read_source(ck, p, 0, SF_CKPT_READ_STRICT, d, e);
        if (rc == 0) {
            snprintf(chosen, cap, "%s", p);
            free(v);
            return 0;
        }
        if (skip_incompatible && incompatible(e->code)) {
            SF_WARN("checkpoint.resume=if_compatible: SKIPPING %s, written for another model or "
                    "optimizer (%s: %s); an older compatible file or the initialisation is used "
                    "instead, and this file is left in place", p, e->code, e->msg);
            continue;
        }
        if (strcmp(e->code, "checkpoint_invalid") != 0 && strcmp(e->code, "checkpoint_read_failed") != 0 &&
            strcmp(e->code, "path_not_allowed") != 0) {
            char msg[sizeof e->msg];
            snprintf(msg, sizeof msg, "%s", e->msg);
            snprintf(e->msg, sizeof e->msg, "%.200s: %.270s", p, msg);
            free(v);
            return -1;
        }
        SF_WARN("checkpoint: skipping %s: %s", p, e->msg);
    }
    free(v);
    fail(e, 404, "checkpoint_not_found", NULL, "no valid " SF_CKPT_FILE_PREFIX "<step>" SF_CKPT_FILE_SUFFIX " in %s",
         ck->dir);
    return -1;
}

static void io_read(sf_ckpt *ck, sf_ckpt_op *op)
{
    if (!op->where[0]) {
        if (sf_ckpt_read_newest(ck, 0, &op->d, op->res.where, sizeof op->res.where, &op->err) != 0)
            op->failed = 1;
    } else {
        if (sf_ckpt_read_source(ck, op->where, 0, SF_CKPT_READ_STRICT, &op->d, &op->err) != 0)
            op->failed = 1;
        op->res.url = op->url;
        if (op->url)
            sf_url_redact(op->where, op->res.where, sizeof op->res.where);
        else
            snprintf(op->res.where, sizeof op->res.where, "%s", op->where);
    }
    if (op->failed)
        sf_counter_add(ck->m_load_failed, 1);
}

static void *io_main(void *arg)
{
    sf_ckpt_queue *q = arg;
    sf_ckpt *ck = q->ck;
    pthread_mutex_lock(&ck->mu);
    for (;;) {
        while (!q->head && !ck->stop)
            pthread_cond_wait(&ck->cv, &ck->mu);
        if (ck->stop)
            break;
        sf_ckpt_op *op = q->head;
        q->head = op->next;
        if (!q->head)
            q->tail = NULL;
        q->queued--;
        pthread_mutex_unlock(&ck->mu);
        if (op->kind == OP_LOAD) {
            io_read(ck, op);
            sf_ckpt_stage_finish(op);
        } else {
            sf_ckpt_write_blob(ck, op);
            if (op->kind == OP_PERIODIC)
                atomic_store(&ck->periodic_busy, 0);
            else
                sf_ckpt_stage_finish(op);
        }
        sf_ckpt_op_release(op);
        pthread_mutex_lock(&ck->mu);
    }
    /* Stopping: what is still queued fails. */
    while (q->head) {
        sf_ckpt_op *op = q->head;
        q->head = op->next;
        q->queued--;
        if (op->kind != OP_PERIODIC) {
            sf_ckpt_op_fail(op, 503, "shutting_down", "the service is shutting down");
            sf_ckpt_stage_finish(op);
        }
        sf_ckpt_op_release(op);
    }
    q->tail = NULL;
    pthread_mutex_unlock(&ck->mu);
    return NULL;
}

int sf_ckpt_io_start(sf_ckpt *ck, char *err, size_t errlen)
{
    for (int i = 0; i < SF_CKPT_N_QUEUES; i++) {
        sf_ckpt_queue *q = &ck->q[i];
        q->ck = ck;
        if (pthread_create(&q->th, NULL, io_main, q) != 0) {
            snprintf(err, errlen, "cannot start the checkpoint I/O threads");
            return -1;
        }
        pthread_mutex_lock(&ck->mu);
        q->started = 1;
        pthread_mutex_unlock(&ck->mu);
    }
    return 0;
}

void sf_ckpt_io_stop(sf_ckpt *ck)
{
    pthread_mutex_lock(&ck->mu);
    ck->stop = 1;
    atomic_store(&ck->abort_xfer, 1);
    pthread_cond_broadcast(&ck->cv);
    pthread_mutex_unlock(&ck->mu);
    for (int i = 0; i < SF_CKPT_N_QUEUES; i++) {
        if (ck->q[i].started)
            pthread_join(ck->q[i].th, NULL);
        ck->q[i].started = 0;
    }
}

