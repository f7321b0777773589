/* server/checkpoint_snapshot.c — the training state against the backend:
 * file buffers, snapshots into them and restores from decoded files (see
 * checkpoint_state.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "gpu/common.h"
#include "server/checkpoint_state.h"
#include "server/config.h"
#include "server/log.h"


blob *sf_ckpt_blob_new(sf_ckpt *ck, int with_opt, int pinned, int reserved)
{
    size_t hdr = ck->lay.hdr_bytes[with_opt ? 1 : 0];
    size_t len = hdr + sf_ckpt_data_bytes(&ck->lay, with_opt);
    size_t total = (BLOB_PREFIX + len + 63) & ~(size_t)63;
    sf_backend *be = ck->app->backend;
    uint8_t *base = pinned ? be->i->host_alloc(be, total) : aligned_alloc(64, total);
    if (!base)
        return NULL;
    blob *b = (blob *)base;
    memset(b, 0, sizeof *b);
    b->ck = ck;
    b->file = base + BLOB_PREFIX;
    b->len = len;
    b->hdr = hdr;
    const sf_model *m = &ck->app->model;
    b->params = (float *)(b->file + hdr);
    b->bufs = b->params + m->n_params;
    b->nbt_at = (uint8_t *)(b->bufs + m->n_buffers);
    b->with_opt = with_opt;
    if (with_opt) {
        b->mom = (float *)(b->nbt_at + (size_t)ck->lay.n_bn * sizeof(int64_t));
        b->sq = ck->lay.adamw ? b->mom + m->n_params : NULL;
        b->step_at = (uint8_t *)(b->mom + (ck->lay.adamw ? 2 : 1) * m->n_params);
    }
    b->pinned = pinned;
    b->reserved = reserved;
    return b;
}

void sf_ckpt_blob_free(blob *b)
{
    if (!b)
        return;
    sf_ckpt *ck = b->ck;
    if (b->reserved)
        atomic_fetch_sub(&ck->buffers, 1);
    if (b->reserved == BLOB_DOWNLOAD)
        atomic_fetch_sub(&ck->downloads, 1);
    if (b->pinned)
        ck->app->backend->i->host_free(ck->app->backend, b);
    else
        free(b);
}

/* The free function of a file handed to an HTTP reply. */
void sf_ckpt_blob_free_file(void *file) { sf_ckpt_blob_free((blob *)((uint8_t *)file - BLOB_PREFIX)); }

/* One more of a count bounded by max: 0, or -1 (unchanged) when it is full. */
static int take_one(atomic_int *n, int max)
{
    if (atomic_fetch_add(n, 1) >= max) {
        atomic_fetch_sub(n, 1);
        return -1;
    }
    return 0;
}

int sf_ckpt_buffer_reserve(sf_app *app)
{
    return app->ckpt ? take_one(&app->ckpt->buffers, SF_CKPT_MAX_BUFFERS) : -1;
}

int sf_ckpt_download_reserve(sf_app *app)
{
    sf_ckpt *ck = app->ckpt;
    if (!ck || take_one(&ck->downloads, SF_CKPT_MAX_DOWNLOAD_BUFFERS) != 0)
        return -1;
    if (take_one(&ck->buffers, SF_CKPT_MAX_BUFFERS) != 0) {
        atomic_fetch_sub(&ck->downloads, 1);
        return -1;
    }
    return 0;
}

void sf_ckpt_download_return(sf_app *app)
{
    if (app->ckpt)
        atomic_fetch_sub(&app->ckpt->downloads, 1);
    sf_ckpt_buffer_return(app);
}

void sf_ckpt_buffer_return(sf_app *app)
{
    if (app->ckpt)
        atomic_fetch_sub(&app->ckpt->buffers, 1);
}

/* FNV-1a 64 of the effective configuration as GET /v1/config shows it. */
static uint64_t config_hash(void)
{
    sf_config *c = malloc(sizeof *c);
    if (!c)
        return 0;
    sf_config_get(c);
    cJSON *j = sf_config_to_json(c);
    free(c);
    char *txt = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    const uint64_t h = sf_hash_bytes(SF_HASH_SEED, txt, txt ? strlen(txt) : 0);
    cJSON_free(txt);
    return h;
}

/* ---- snapshot and restore (the engine thread, or main's before/after it) ---------- */

/* The backend can hand over the whole optimizer state (AdamW: both moments). */
int sf_ckpt_can_read_opt(const sf_ckpt *ck)
{
    const sf_backend *be = ck->app->backend;
    return be->i->get_opt_state && (!ck->lay.adamw || be->i->get_opt_sq);
}

int sf_ckpt_snapshot(sf_ckpt *ck, blob *b, char *err, size_t errlen)
{
    sf_app *app = ck->app;
    sf_backend *be = app->backend;
    if (be->i->get_params(be, b->params) != 0) {
        snprintf(err, errlen, "the %s backend could not read its parameters", app->backend_name);
        return -1;
    }
    uint64_t step = atomic_load(&app->step);
    if (ck->lay.n_bn > 0) {
        uint64_t nbt = 0;
        if (!be->i->get_buffers) {
            snprintf(err, errlen, "the %s backend cannot read its batchnorm running statistics yet",
                     app->backend_name);
            return -1;
        }
        if (be->i->get_buffers(be, b->bufs, &nbt) != 0) {
            snprintf(err, errlen, "the %s backend could not read its buffers", app->backend_name);
            return -1;
        }
        if (nbt > SF_CKPT_MAX_COUNT) {
            snprintf(err, errlen, "num_batches_tracked is %llu, " SF_CKPT_MAX_COUNT_WHY
                     "; no file is written that could not be loaded again", (unsigned long long)nbt);
            return -1;
        }
        /* One counter in the service; PyTorch has one per layer: the same value in each. */
        for (int i = 0; i < ck->lay.n_bn; i++)
            sf_ckpt_put_le64(b->nbt_at + 8 * (size_t)i, nbt);
    }
    if (b->with_opt) {
        if (!be->i->get_opt_state || (ck->lay.adamw && !be->i->get_opt_sq)) {
            snprintf(err, errlen, "the %s backend cannot read its optimizer state yet",
                     app->backend_name);
            return -1;
        }
        if (be->i->get_opt_state(be, b->mom, &step) != 0 ||
            (ck->lay.adamw && be->i->get_opt_sq(be, b->sq) != 0)) {
            snprintf(err, errlen, "the %s backend could not read its optimizer state",
                     app->backend_name);
            return -1;
        }
        sf_ckpt_put_le64(b->step_at, step);
    }
    /* Only a state loaded at the bound and trained on gets here; its file
     * would be the newest ckpt-<step>, refused at resume, and would rotate the
     * loadable ones away. */
    if (step > SF_CKPT_MAX_COUNT) {
        snprintf(err, errlen, "the step count is %llu, " SF_CKPT_MAX_COUNT_WHY
                 "; no file is written that could not be loaded again", (unsigned long long)step);
        return -1;
    }
    b->step = step;
    b->gen = atomic_load(&ck->state_gen);
    return sf_ckpt_header_write(&ck->lay, b->file, b->hdr, b->with_opt, step, config_hash(),
                                app->backend_name, err, errlen);
}


int sf_ckpt_apply(sf_ckpt *ck, const sf_ckpt_decoded *d, char *err, size_t errlen)
{
    sf_app *app = ck->app;
    sf_backend *be = app->backend;
    if (d->has_opt && (!be->i->set_opt_state || (ck->lay.adamw && !be->i->set_opt_sq))) {
        /* Checked when the file was read; kept here so nothing half-applies. */
        snprintf(err, errlen, "the %s backend cannot restore optimizer state yet", app->backend_name);
        return -1;
    }
    if (ck->lay.n_bn > 0 && !be->i->set_buffers) {
        snprintf(err, errlen, "the %s backend cannot restore batchnorm running statistics yet",
                 app->backend_name);
        return -1;
    }
    if (be->i->set_params(be, d->params) != 0) {
        snprintf(err, errlen, "the %s backend could not set its parameters", app->backend_name);
        return -1;
    }
    if (ck->lay.n_bn > 0 && be->i->set_buffers(be, d->bufs, d->nbt) != 0) {
        snprintf(err, errlen, "the %s backend could not set its buffers", app->backend_name);
        return -1;
    }
    uint64_t step = d->has_step ? d->step : atomic_load(&app->step);
    if (ck->lay.adamw && be->i->set_opt_sq && be->i->set_opt_sq(be, d->sq) != 0) {
        snprintf(err, errlen, "the %s backend could not set its optimizer state", app->backend_name);
        return -1;
    }
    if (be->i->set_opt_state) {
        if (be->i->set_opt_state(be, d->mom, step) != 0) {
            snprintf(err, errlen, "the %s backend could not set its optimizer state",
                     app->backend_name);
            return -1;
        }
        atomic_store(&app->step, step);
        atomic_fetch_add(&app->restore_gen, 1);
        /* Restored weights are finite (a checkpoint with a NaN is refused):
         * whatever diverged is gone. */
        atomic_store(&app->nonfinite_in_row, 0);
        atomic_store(&app->diverged, 0);
    } else if (!atomic_load(&ck->warned_no_opt)) {
        atomic_store(&ck->warned_no_opt, 1);
        SF_WARN("checkpoint: the %s backend has no optimizer-state interface yet: parameters "
                "restored, momentum and step count left as they were", app->backend_name);
    }
    atomic_fetch_add(&ck->state_gen, 1);
    return 0;
}


