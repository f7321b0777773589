/* server/engine_rounds.c — the engine's data-parallel rounds
 * (distributed.world_size > 1): joining the job, agreeing on its settings,
 * rank 0's state on every rank, then one round per optimizer step that all
 * ranks enter together. See engine_rounds.h, and docs/DESIGN.md's section on
 * data-parallel training. */
#include "server/engine_rounds.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/common.h"
#include "server/clock.h"
#include "server/distributed.h"
#include "server/http.h"
#include "server/ring.h"

/* Rank 0's training state on every rank: identical parameters from the first
 * step, also when rank 0 alone resumed from a checkpoint. */
static int broadcast_state(sf_engine *e, char *err, size_t errlen)
{
    const sf_engine_ctx *cx = engine_ctx(e);
    sf_backend *be = cx->backend;
    sf_coll *coll = sf_distributed_coll(cx->dist);
    const size_t np = cx->model->n_params, nb = cx->model->n_buffers;
    float *buf = malloc(sizeof(float) * (np > nb ? np : nb) + 1);
    if (!buf) {
        snprintf(err, errlen, "out of memory for the parameter broadcast");
        return -1;
    }
    int rc = -1;
    uint64_t step = 0, nbt = 0;
    if (be->i->get_params(be, buf) || sf_coll_broadcast(coll, buf, sizeof(float) * np, 0, err, errlen) ||
        be->i->set_params(be, buf))
        goto out;
    if (be->i->get_opt_state(be, buf, &step) || sf_coll_broadcast(coll, buf, sizeof(float) * np, 0, err, errlen) ||
        sf_coll_broadcast(coll, &step, sizeof step, 0, err, errlen) || be->i->set_opt_state(be, buf, step))
        goto out;
    if (be->i->get_opt_sq && (be->i->get_opt_sq(be, buf) ||
                              sf_coll_broadcast(coll, buf, sizeof(float) * np, 0, err, errlen) ||
                              be->i->set_opt_sq(be, buf)))
        goto out;
    if (nb && be->i->get_buffers &&
        (be->i->get_buffers(be, buf, &nbt) || sf_coll_broadcast(coll, buf, sizeof(float) * nb, 0, err, errlen) ||
         sf_coll_broadcast(coll, &nbt, sizeof nbt, 0, err, errlen) || be->i->set_buffers(be, buf, nbt)))
        goto out;
    atomic_store(cx->step, step);
    atomic_fetch_add(cx->restore_gen, 1); /* the schedule re-bases on the broadcast step */
    rc = 0;
out:
    if (rc && !err[0])
        snprintf(err, errlen, "reading or writing the backend's state failed");
    free(buf);
    return rc;
}

/* Harvests completions until at most keep batches are in flight. */
static void settle(sf_engine *e, int keep)
{
    while (engine_inflight(e) > keep)
        engine_poll(e, 1000);
}

/* The ranks' parameter digests, min and max in one all-reduce (max of ~d is
 * ~min of d), with nothing in flight. 0, or -1 when the collective failed. */
static int verify_params(sf_engine *e, uint64_t step, char *err, size_t errlen)
{
    const sf_engine_ctx *cx = engine_ctx(e);
    sf_backend *be = cx->backend;
    if (!be->i->param_digest)
        return 0; /* every rank has the same backend (agree_on_job) */
    /* Whether to take part is never decided by this rank's own state: the
     * others are already in the all-reduce. A digest this rank could not
     * read takes part with the value no maximum picks. */
    uint64_t dg = 0;
    const int have = be->i->param_digest(be, &dg) == 0;
    int64_t v[2] = {have ? (int64_t)dg : INT64_MIN, have ? ~(int64_t)dg : INT64_MIN};
    if (sf_coll_allreduce(sf_distributed_coll(cx->dist), v, 2, SF_COLL_I64, SF_COLL_MAX, err, errlen) != 0)
        return -1;
    const uint64_t hi = (uint64_t)v[0], lo = (uint64_t)~v[1];
    if (have && hi != lo)
        sf_distributed_diverged(cx->dist,
                                "diverged across ranks: the parameter digests differ at step %llu (this rank "
                                "%016llx, lowest %016llx, highest %016llx)",
                                (unsigned long long)step, (unsigned long long)dg, (unsigned long long)lo,
                                (unsigned long long)hi);
    return 0;
}

/* The project's byte hash (0: from its seed), kept to 62 bits so that it
 * and its negation are int64s. */
static int64_t fnv62(uint64_t h, const void *p, size_t n)
{
    return (int64_t)(sf_hash_bytes(h ? h : SF_HASH_SEED, p, n) & 0x3fffffffffffffffull);
}

static int64_t str62(const char *s) { return fnv62(0, s, strlen(s)); }

/* What sets the sequence and the sizes of the job's collectives: ranks that
 * differ in any of it would pair collectives of different sizes (Gloo then
 * aborts the process that reads the longer message) or skip one the others
 * enter. Checked once, at the join, by one all-reduce (the maximum of each
 * value and of its negation); every rank then fails the job naming the
 * first that differs, as ranks of different world sizes already do. The hot
 * ones among them (distributed.verify_every) change at a round on every rank
 * alike. */
static int agree_on_job(sf_engine *e, char *err, size_t errlen)
{
    const sf_engine_ctx *cx = engine_ctx(e);
    const sf_model *m = cx->model;
    sf_config *c = malloc(sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    sf_config_get(c);
    uint64_t h = 0;
    for (int i = 0; i < m->n_layers; i++) {
        const sf_layer *l = &m->layers[i];
        const int64_t shape[] = {l->kind, l->in_c, l->out_c, l->k, l->stride, l->pad, l->bias, l->affine,
                                 (int64_t)l->n_w, (int64_t)l->n_b, l->frozen, l->out_h, l->out_w};
        h = (uint64_t)fnv62(h, shape, sizeof shape);
        /* The fields that leave the shapes as they are (batchnorm's eps, a
         * dropout's p, which inputs a layer reads) change the model too. */
        const int64_t more[] = {l->groups, l->dilation, l->ceil_mode, l->count_include_pad, l->out_size[0],
                                l->out_size[1], l->approximate, l->over_channels, l->mode, l->n_in,
                                l->kw, l->stride_w, l->pad_w, l->dilation_w, l->heads, l->start, l->count,
                                l->scale, l->align_corners, l->num_parameters, l->pads[0], l->pads[1],
                                l->pads[2], l->pads[3], l->clamp_grad};
        const float fl[] = {l->eps, l->momentum, l->p, l->negative_slope, l->alpha, l->beta, l->threshold,
                            l->affine_scale, l->affine_shift, l->pad_value, l->clamp_min, l->clamp_max};
        h = (uint64_t)fnv62(h, more, sizeof more);
        h = (uint64_t)fnv62(h, fl, sizeof fl);
        h = (uint64_t)fnv62(h, l->in, sizeof l->in[0] * (size_t)(l->n_in > 0 ? l->n_in : 0));
    }
    const int64_t sizes[] = {m->n_layers, (int64_t)m->n_params, (int64_t)m->n_buffers, (int64_t)m->train_off};
    /* hashed: a fingerprint, not worth printing. */
    const struct {
        const char *name;
        int64_t v;
        int hashed;
    } t[] = {
        {"the model (model.preset, model.spec, model.freeze)", fnv62(h, sizes, sizeof sizes), 1},
        {"model.precision", str62(c->model.precision), 1},
        {"model.grad_accum_steps", c->model.grad_accum_steps, 0},
        {"optim.name", str62(c->optim.name), 1},
        {"distributed.verify_every", c->distributed.verify_every, 0},
        {"distributed.bucket_mb", c->distributed.bucket_mb, 0},
        {"distributed.batchnorm", str62(c->distributed.batchnorm), 1},
        {"the backend (pipeline.backend)", str62(cx->backend->i->name(cx->backend)), 1},
    };
    free(c);
    enum { N = sizeof t / sizeof t[0] };
    int64_t v[2 * N];
    for (int i = 0; i < N; i++) {
        v[i] = t[i].v;
        v[N + i] = -t[i].v;
    }
    if (sf_coll_allreduce(sf_distributed_coll(cx->dist), v, 2 * N, SF_COLL_I64, SF_COLL_MAX, err, errlen) != 0)
        return -1;
    for (int i = 0; i < N; i++) {
        if (v[i] == -v[N + i])
            continue;
        if (t[i].hashed)
            snprintf(err, errlen, "the ranks differ in %s: every rank of a job needs the same", t[i].name);
        else
            snprintf(err, errlen, "the ranks differ in %s (this rank %lld, lowest %lld, highest %lld): every rank "
                     "of a job needs the same", t[i].name, (long long)t[i].v, (long long)-v[N + i],
                     (long long)v[i]);
        return -1;
    }
    return 0;
}

/* A batch the job can no longer train: failed with the reason, never lost. */
static void fail_slot(sf_engine *e, int slot)
{
    char why[400];
    sf_distributed_state(engine_ctx(e)->dist, why, sizeof why);
    engine_fail_batch(e, slot, "distributed_unavailable", why);
}

/* The job cannot take another step: run commands (checkpoint reads) and fail
 * every batch that reaches the ring, until the service stops. */
static void broken_loop(sf_engine *e)
{
    const sf_engine_ctx *cx = engine_ctx(e);
    sf_http_wake(*cx->http, SF_WAIT_CMD, UINT64_MAX); /* patches that will not apply are answered */
    while (!engine_stopping(e)) {
        if (engine_has_cmds(e))
            engine_run_cmds(e);
        int slot = sf_ring_pop(cx->ring, 100);
        if (slot >= 0)
            fail_slot(e, slot);
    }
}

/* The rounds. Each: wait up to distributed.wait_ms for a batch, then one
 * control all-reduce (the CTL_* layout below, summed); apply the patches
 * (all ranks, rank order); if anyone has a batch, every rank steps (those
 * without one with an empty contribution) and the backend all-reduces the
 * gradients; every verify_every stepping rounds compare the parameter
 * digests; a stopped rank ends the job on all unless all are shutting down.
 *
 * A round's step is submitted while the previous round's may still run
 * (ROUND_DEPTH in flight), as the single-process loop does: the next batch's
 * copy and transform, and this thread's wait and control all-reduce, go on
 * under the running step, and every rank submits the same steps in the same
 * order, so their all-reduces pair up. Whatever must see finished steps
 * (engine commands, the digest check, an idle round's replies, leaving the
 * rounds) settles first. Decisions that every rank must make alike depend on
 * the rounds alone, never on how far a rank has harvested. */
#define ROUND_DEPTH 2

/* The round's control all-reduce (a sum): whether a rank has a batch and
 * its samples, how many ranks stop (their drain is over), how many drain
 * (they had SIGTERM; a stopped rank too), how many stopped ranks must leave
 * now, then each rank's queued patch length (CTL_PATCH + rank). */
enum { CTL_BATCH, CTL_SAMPLES, CTL_STOP, CTL_DRAINING, CTL_LEAVE, CTL_PATCH };

/* A stopped rank stays in the rounds this long for the other ranks to show
 * that they are shutting down too (the signals of one job's stop reach its
 * ranks milliseconds or more apart); then, if they are not all draining,
 * it ends the job. */
#define STOP_LINGER_NS 1000000000ull
/* ... and leaves at the latest this long before its stop deadline, which
 * keeps time for its final checkpoint. */
#define STOP_RESERVE_NS 1000000000ull
#define STOP_ROUND_MS 10

/* The job ended for this rank: the backend's collectives are released now
 * rather than at exit (sf_backend_i.dist_leave). together: every rank
 * leaves in this round (a stop the rounds agreed on); otherwise the job
 * failed and a peer may be gone. */
static void leave_job(sf_engine *e, int together)
{
    sf_backend *be = engine_ctx(e)->backend;
    if (be->i->dist_leave)
        be->i->dist_leave(be, together);
}

/* Joins the job: the rendezvous, the agreement on the job's settings, the
 * backend's own collectives and rank 0's state broadcast to every rank. -1
 * when the job failed (said). */
static int dist_join(sf_engine *e, char *err, size_t errlen)
{
    sf_distributed *d = engine_ctx(e)->dist;
    if (sf_distributed_join(d) != 0)
        return -1;
    if (agree_on_job(e, err, errlen) != 0) {
        sf_distributed_fail(d, "%s", err);
        return -1;
    }
    sf_backend *be = engine_ctx(e)->backend;
    if (be->i->dist_join && be->i->dist_join(be, err, errlen) != 0) {
        sf_distributed_fail(d, "%s", err);
        return -1;
    }
    if (broadcast_state(e, err, errlen) != 0) {
        sf_distributed_fail(d, "the initial parameter broadcast from rank 0 failed: %s", err);
        return -1;
    }
    sf_distributed_started(d);
    return 0;
}

/* The training batch this rank brings to the next round, or -1: it serves
 * transform-only requests, evaluation batches and commands meanwhile, for
 * distributed.wait_ms at most (STOP_ROUND_MS while a stopped rank lingers). */
static int dist_take_batch(sf_engine *e, int stopping, int someone_stopped)
{
    const sf_engine_ctx *cx = engine_ctx(e);
    int slot = -1;
    /* Transform-only requests and evaluation batches (no gradient, no
     * step) are this rank's own business, served while it waits for a
     * training batch, but for distributed.wait_ms at most: the other
     * ranks wait in the round for this one, and a steady stream of them
     * would keep it out until their collectives time out. */
    /* While a stopped rank lingers (the last round said so), rounds come
     * every STOP_ROUND_MS at most, so that it hears within its linger
     * whether the others are shutting down too. */
    uint64_t wait_ms = (uint64_t)sf_config_cur()->distributed.wait_ms;
    if (someone_stopped && wait_ms > STOP_ROUND_MS)
        wait_ms = STOP_ROUND_MS;
    const uint64_t wait_until_ns = sf_now_ns() + wait_ms * 1000000ull;
    while (!stopping) {
        /* A command posted during the wait (a checkpoint read, say) runs
         * now: this is still between two rounds, where the top of the
         * loop runs them, and going into the round early would only
         * make it wait in the control all-reduce for the other ranks'
         * waits, up to distributed.wait_ms, before it ran. */
        if (engine_has_cmds(e)) {
            settle(e, 0);
            engine_run_cmds(e);
        }
        const uint64_t now = sf_now_ns();
        if (now >= wait_until_ns)
            break;
        /* With the last round's step still running, peek at the ring and
         * harvest between peeks: its reply must not wait for the next
         * batch (a client posting with ?wait=1 sends none until it has
         * it), nor for the whole wait. */
        const int busy = engine_inflight(e) > 0;
        slot = sf_ring_pop(cx->ring, busy ? 0 : (int)((wait_until_ns - now + 999999) / 1000000));
        if (slot < 0) {
            /* Early: a command's kick (it runs at the top), a stop's
             * (the round goes now), or a kick whose command already ran
             * at the top of the loop (the wait goes on: going into the
             * round would hold the next command there). On time, the
             * deadline at the top ends the wait. */
            if (engine_has_cmds(e) || (!busy && !engine_stopping(e)))
                continue;
            if (!busy)
                break;
            engine_poll(e, 1000);
            continue;
        }
        sf_slot_meta *m = sf_ring_meta(cx->ring, slot);
        if (m->kind == 1) {
            m->t_popped_ns = sf_now_ns();
            engine_run_transform(e, slot);
        } else if (m->eval) {
            engine_submit(e, slot, 0);
            settle(e, 0);
        } else {
            break;
        }
        slot = -1;
    }
    return slot;
}

/* The round's step, which every rank takes whether or not its batch trains
 * (its sample count is ctl[CTL_SAMPLES]), then the health and parameter
 * checks. -1 when the job failed (said). */
static int dist_round_step(sf_engine *e, const int64_t *ctl, int slot, int depth, uint64_t *stepped,
                           char *err, size_t errlen)
{
    const sf_engine_ctx *cx = engine_ctx(e);
    sf_distributed *d = cx->dist;
    settle(e, depth - 1); /* room for this round's step */
    const int before = engine_inflight(e);
    if (slot >= 0)
        engine_submit(e, slot, ctl[CTL_SAMPLES]); /* a batch the backend refuses is failed and released */
    /* Every rank takes the round's step whatever became of its batch
     * (the decoder refused one of its files): the other ranks are
     * already inside the step's all-reduce. A refused batch joins it
     * as an empty contribution. The samples it announced are in
     * global_n, but each rank also sums the samples it trained with
     * the gradient, so the backend applies the mean over the samples
     * trained, and every rank skips the step if none was. */
    if (engine_inflight(e) == before) {
        if (engine_submit_empty(e, ctl[CTL_SAMPLES], err, errlen) != 0) {
            sf_distributed_fail(d, "cannot join the step: %s", err);
            return -1;
        }
        sf_distributed_count_empty(d);
    }
    (*stepped)++;
    engine_poll(e, 0);
    const int every = sf_config_cur()->distributed.verify_every;
    const int verify = every > 0 && *stepped % (uint64_t)every == 0;
    if (verify)
        settle(e, 0);
    char herr[200];
    if (cx->backend->i->health(cx->backend, herr, sizeof herr) != 0) {
        sf_distributed_fail(d, "lost the other ranks in the gradient all-reduce: %s", herr);
        return -1;
    }
    sf_distributed_observe_allreduce(d, sf_distributed_backend(d)->allreduce_s);
    if (verify && verify_params(e, atomic_load(cx->step), err, errlen) != 0) {
        sf_distributed_fail(d, "lost the other ranks in the parameter check: %s", err);
        return -1;
    }
    return 0;
}

void engine_rounds(sf_engine *e)
{
    const sf_engine_ctx *cx = engine_ctx(e);
    sf_distributed *d = cx->dist;
    const int world = sf_distributed_world(d), rank = sf_distributed_rank(d);
    const int maxq = cx->backend->i->max_inflight(cx->backend);
    const int depth = maxq < ROUND_DEPTH ? maxq : ROUND_DEPTH;
    uint64_t stepped = 0; /* rounds that took a step: the same count on every rank */
    uint64_t t_stopped = 0; /* when this rank's drain ended (its stop) */
    int all_draining = 0;   /* the last round's: every rank was shutting down */
    int someone_stopped = 0; /* the last round's: a rank had stopped */
    char err[512] = "";
    if (dist_join(e, err, sizeof err) != 0) {
        leave_job(e, 0);
        broken_loop(e);
        return;
    }
    const size_t nctl = CTL_PATCH + (size_t)world;
    int64_t *ctl = calloc(nctl, sizeof *ctl);
    if (!ctl) {
        sf_distributed_fail(d, "out of memory for the round control");
        leave_job(e, 0);
        broken_loop(e);
        return;
    }
    sf_coll *coll = sf_distributed_coll(d);
    int together = 0; /* the loop ended in a stop every rank saw */
    for (;;) {
        if (engine_has_cmds(e)) {
            settle(e, 0); /* commands run between steps */
            engine_run_cmds(e);
        }
        const int stopping = engine_stopping(e);
        int slot = dist_take_batch(e, stopping, someone_stopped);
        /* A stop that came during the wait (its kick ends the wait) goes into
         * this round, not the next: the other ranks would wait out their
         * distributed.wait_ms once more before hearing of it. */
        const int stop_now = stopping || engine_stopping(e);
        const int draining = stop_now || atomic_load(cx->draining);
        /* Whether this stopped rank must leave: decided from its own clock,
         * so it goes into the all-reduce, and every rank acts on the sum. */
        int leave = 0;
        if (stop_now) {
            const uint64_t now = sf_now_ns(), dl = engine_stop_deadline_ns(e);
            if (!t_stopped)
                t_stopped = now;
            leave = (!all_draining && now >= t_stopped + STOP_LINGER_NS) ||
                    (dl && now + STOP_RESERVE_NS >= dl);
        }
        memset(ctl, 0, sizeof *ctl * nctl);
        ctl[CTL_BATCH] = slot >= 0;
        ctl[CTL_SAMPLES] = slot >= 0 ? sf_ring_meta(cx->ring, slot)->n : 0;
        ctl[CTL_STOP] = stop_now;
        ctl[CTL_DRAINING] = draining;
        ctl[CTL_LEAVE] = leave;
        ctl[CTL_PATCH + rank] = sf_distributed_patch_len(d);
        err[0] = '\0';
        if (sf_coll_allreduce(coll, ctl, nctl, SF_COLL_I64, SF_COLL_SUM, err, sizeof err) != 0 ||
            sf_distributed_apply_patches(d, ctl + CTL_PATCH, err, sizeof err) != 0) {
            sf_distributed_fail(d, "lost the other ranks: %s", err);
            sf_http_wake(*cx->http, SF_WAIT_CMD, UINT64_MAX); /* patches waiting are answered */
            if (slot >= 0)
                fail_slot(e, slot);
            break;
        }
        if (ctl[CTL_PATCH + rank] > 0)
            sf_http_wake(*cx->http, SF_WAIT_CMD, UINT64_MAX); /* this rank's patch request replies */
        if (ctl[CTL_BATCH] > 0) {
            if (dist_round_step(e, ctl, slot, depth, &stepped, err, sizeof err) != 0)
                break;
        } else {
            settle(e, 0); /* an idle round: the last steps finish and reply */
        }
        /* A rank that stops (its drain is over) ends the job for every rank,
         * after STOP_LINGER_NS, unless every rank is shutting down: then the
         * job drains as one, the stopped ranks joining with empty
         * contributions, until the last rank's drain is over too (or a
         * stopped rank's deadline comes). So a job stopped by stopping all
         * its ranks trains every batch it accepted. */
        all_draining = ctl[CTL_DRAINING] == world;
        someone_stopped = ctl[CTL_STOP] > 0;
        if (ctl[CTL_STOP] == world || ctl[CTL_LEAVE] > 0) {
            together = 1;
            if (!stop_now)
                sf_distributed_ended(d, "%lld rank(s) shut down: the data-parallel job stopped",
                                    (long long)ctl[CTL_STOP]);
            break;
        }
    }
    /* Steps still in flight finish (or fail, once the backend's watchdog
     * gives up on a lost peer) and reply before the job is left. */
    settle(e, 0);
    free(ctl);
    leave_job(e, together);
    sf_http_wake(*cx->http, SF_WAIT_CMD, UINT64_MAX);
    broken_loop(e);
}
