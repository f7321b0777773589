/* server/config_checks.c — the checks across options (a row's check) and the validation that runs them. See config.h. */
#include "server/config.h"
#include "server/config_impl.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/aug.h"
#include "gpu/layers.h"
#include "gpu/model.h"
#include "server/lr_schedule.h"
#include "server/netaddr.h"
#include "server/tls.h"

/* Mixup and cutmix mix whole-image labels: a segmentation model's labels are
 * per pixel, so the pair is refused whichever of the two keys changes. */
int check_mix_for_model(const sf_config *c, const sf_model *m, char *err, size_t errlen)
{
    sf_aug_pipeline p;
    if (!m->segmentation || sf_aug_parse(sf_config_train_pipeline(c), &p, err, errlen) != 0)
        return 0; /* a bad list is check_augment's to report */
    const int k = sf_aug_mix_op(&p);
    if (k >= 0) {
        snprintf(err, errlen, "aug op %d (%s): batch-level mixing needs a classifier; the model is a "
                 "segmentation model", k, sf_aug_kind_name(p.ops[k].kind));
        return -1;
    }
    return 0;
}

int sf_config_model(const sf_config *c, sf_model *m, char *err, size_t errlen)
{
    return c->model.spec[0] ? sf_model_from_json(c->model.spec, m, err, errlen)
                            : sf_model_from_preset(c->model.preset, m, err, errlen);
}

int check_model(const sf_config *c, char *err, size_t errlen)
{
    sf_model *m = malloc(sizeof *m);
    if (!m) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int rc = sf_config_model(c, m, err, errlen);
    if (rc == 0 && c->model.freeze[0])
        rc = sf_model_set_freeze(m, c->model.freeze, err, errlen);
    if (rc == 0)
        rc = check_mix_for_model(c, m, err, errlen);
    free(m);
    return rc;
}

int check_schedule(const sf_config *c, char *err, size_t errlen)
{
    sf_lr_sched s;
    return sf_lr_sched_from_config(c, &s, err, errlen);
}

/* A job of several ranks needs to know who this process is and where rank 0 is. */
int check_distributed(const sf_config *c, char *err, size_t errlen)
{
    const int world = c->distributed.world_size, rank = c->distributed.rank;
    if (world > 1 && rank < 0) {
        snprintf(err, errlen, "distributed.rank is not set and the host name ends in no StatefulSet ordinal "
                 "(name-N): set distributed.rank in [0, %d)", world);
        return -1;
    }
    if (rank >= world) {
        snprintf(err, errlen, "distributed.rank %d is not in [0, %d) (distributed.world_size)", rank, world);
        return -1;
    }
    if (world > 1 && !c->http.token[0] && !c->distributed.allow_no_token) {
        snprintf(err, errlen, "a data-parallel job (distributed.world_size %d) needs http.token, the same on "
                 "every rank: without it any client that reaches rank 0's port can write the job's rendezvous "
                 "store and break the job (distributed.allow_no_token true starts it anyway)", world);
        return -1;
    }
    if (world > 1 && rank > 0 && !c->distributed.rendezvous[0]) {
        snprintf(err, errlen, "distributed.rendezvous (host:port of rank 0) is required on rank %d", rank);
        return -1;
    }
    /* A rank waits up to wait_ms for a batch before it enters the round,
     * while the ranks that had one wait for it inside the round's
     * all-reduce, up to timeout_s: a wait near the timeout breaks the job. */
    if (world > 1 && 2 * (int64_t)c->distributed.wait_ms > 1000 * (int64_t)c->distributed.timeout_s) {
        snprintf(err, errlen, "distributed.wait_ms (%d) must be at most half of distributed.timeout_s (%d s): "
                 "the other ranks wait in the round for a rank that waits for a batch",
                 c->distributed.wait_ms, c->distributed.timeout_s);
        return -1;
    }
    return 0;
}

/* The ops' order and parameters as every batch would check them
 * (sf_aug_plan_make), once, on a large square source of the model's
 * channels: a pipeline no batch can pass (mixup before another op) is a
 * config error, not each batch's 422. What depends on the real source (a
 * crop larger than it) stays the upload's to refuse. */
#define PLAN_CHECK_SIDE 4096
static int check_plan(const sf_aug_pipeline *p, int channels, char *err, size_t errlen)
{
    sf_aug_plan *plan = malloc(sizeof *plan);
    if (!plan) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    const int rc = sf_aug_plan_make(p, PLAN_CHECK_SIDE, PLAN_CHECK_SIDE, channels, plan, err, errlen);
    free(plan);
    return rc;
}

/* The model's input channels, or 3 when it does not build (check_model's to report). */
static int model_channels(const sf_config *c, sf_model *m)
{
    char merr[256];
    return sf_config_model(c, m, merr, sizeof merr) == 0 ? m->in_c : 0;
}

int check_augment(const sf_config *c, char *err, size_t errlen)
{
    sf_aug_pipeline p;
    if (sf_aug_parse(sf_config_train_pipeline(c), &p, err, errlen) != 0)
        return -1;
    sf_model *m = malloc(sizeof *m);
    if (!m) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    const int in_c = model_channels(c, m);
    int rc = check_plan(&p, in_c > 0 ? in_c : 3, err, errlen);
    if (rc == 0 && in_c > 0 && sf_aug_mix_op(&p) >= 0)
        rc = check_mix_for_model(c, m, err, errlen);
    free(m);
    return rc;
}

/* An evaluation must give the same answer every time it runs: no op that
 * draws a random parameter. Listed by what is allowed, so that an op added
 * later is refused until someone decides it is deterministic. */
int check_eval_augment(const sf_config *c, char *err, size_t errlen)
{
    sf_aug_pipeline p;
    if (sf_aug_parse(sf_config_eval_pipeline(c), &p, err, errlen))
        return -1;
    for (int i = 0; i < p.n_ops; i++) {
        const sf_aug_kind k = p.ops[i].kind;
        if (k != SF_AUG_TO_DTYPE && k != SF_AUG_RESIZE && k != SF_AUG_CENTER_CROP &&
            k != SF_AUG_NORMALIZE && k != SF_AUG_COLOR_CONVERT) {
            snprintf(err, errlen, "op %d (%s) is random; an eval pipeline takes deterministic ops only "
                     "(to_dtype, resize, center_crop, normalize, color_convert)", i, sf_aug_kind_name(k));
            return -1;
        }
    }
    sf_model *m = malloc(sizeof *m);
    if (!m) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    const int in_c = model_channels(c, m);
    free(m);
    return check_plan(&p, in_c > 0 ? in_c : 3, err, errlen);
}

/* Job ids index a ring of results (server/jobs.c): every live batch must keep
 * its entry, so the table must be larger than anything that can be in flight. */
int check_slots(const sf_config *c, char *err, size_t errlen)
{
    if (c->pipeline.jobs_max < 2 * c->ring.slots + 64) {
        snprintf(err, errlen, "ring.slots (%d) needs pipeline.jobs_max of at least 2*ring.slots+64 (%d); it is %d",
                 c->ring.slots, 2 * c->ring.slots + 64, c->pipeline.jobs_max);
        return -1;
    }
    return 0;
}

/* 0 sizes the slots from the model at start (sf_ring_auto_slot_bytes); a
 * value given must hold more than a few headers. */
int check_slot_bytes(const sf_config *c, char *err, size_t errlen)
{
    if (c->ring.slot_bytes != 0 && c->ring.slot_bytes < 4096) {
        snprintf(err, errlen, "ring.slot_bytes: %lld is neither 0 (sized from the model) nor at least 4096",
                 (long long)c->ring.slot_bytes);
        return -1;
    }
    return 0;
}

/* Periodic saves and resume work on checkpoint.dir: without one they cannot. */
int check_checkpoint(const sf_config *c, char *err, size_t errlen)
{
    if (!c->checkpoint.dir[0] && c->checkpoint.every_steps > 0) {
        snprintf(err, errlen, "checkpoint.every_steps (%lld) needs a checkpoint.dir",
                 (long long)c->checkpoint.every_steps);
        return -1;
    }
    if (!c->checkpoint.dir[0] && strcmp(c->checkpoint.resume, "false") != 0) {
        snprintf(err, errlen, "checkpoint.resume (%s) needs a checkpoint.dir", c->checkpoint.resume);
        return -1;
    }
    return 0;
}

/* A listening address that does not resolve fails the start before the
 * backend initialises (which can take seconds on a GPU). */
int check_host(const sf_config *c, char *err, size_t errlen)
{
    struct sockaddr_storage ss;
    socklen_t len;
    return sf_netaddr_resolve(c->http.host, c->http.port, &ss, &len, err, errlen);
}

/* The listeners: a metrics port of its own, and TLS with both files or neither. */
int check_listeners(const sf_config *c, char *err, size_t errlen)
{
    if (c->http.metrics_port && c->http.metrics_port == c->http.port) {
        snprintf(err, errlen, "http.metrics_port must differ from http.port (%d)", c->http.port);
        return -1;
    }
    if (!c->http.tls_cert[0] != !c->http.tls_key[0]) {
        snprintf(err, errlen, "http.tls_cert and http.tls_key go together: set both or neither");
        return -1;
    }
    return 0;
}

/* A bearer token is what a client can send in an Authorization header, which
 * the check in http.c reads with the spaces around it dropped and libmicrohttpd
 * cuts at a NUL: a token with a space, a tab, a control character or a byte
 * outside ASCII could never be presented, and once set at run time it would
 * lock every client out until a restart. */
int check_token(const sf_config *c, char *err, size_t errlen)
{
    for (const unsigned char *p = (const unsigned char *)c->http.token; *p; p++)
        if (*p < 0x21 || *p > 0x7e) {
            snprintf(err, errlen, "the token holds a character a client cannot send in an Authorization header "
                     "(byte 0x%02x at offset %td): use visible ASCII characters only, no spaces", *p,
                     (const char *)p - c->http.token);
            return -1;
        }
    return 0;
}

int check_tls_priorities(const sf_config *c, char *err, size_t errlen)
{
    return sf_tls_priorities_check(c->http.tls_priorities, "http.tls_priorities", err, errlen);
}


/* Where msg first names the option, as a whole word ("optim.lr" is not named
 * by "optim.lr_warmup"): its offset, or -1. */
static long message_names(const char *msg, const char *name)
{
    const size_t n = strlen(name);
    for (const char *p = strstr(msg, name); p; p = strstr(p + 1, name)) {
        const char b = p == msg ? ' ' : p[-1], a = p[n];
        if (!(isalnum((unsigned char)b) || b == '_' || b == '.') && !(isalnum((unsigned char)a) || a == '_'))
            return p - msg;
    }
    return -1;
}

/* The option a failed check is reported under. A check guards a constraint
 * between several options (each lists it), so the first of them is often not
 * the one at fault: the field is one that this change set (differs from base),
 * preferring the one the message names first; else the option the message
 * names first (messages begin with the option they are about); else the
 * first option that lists the check. */
static const sf_cfg_option *blamed_option(const sf_config *c, const sf_config *base,
                                          const sf_cfg_option *first, const char *msg)
{
    const sf_cfg_option *changed = NULL, *set_named = NULL, *named = NULL;
    long set_at = -1, named_at = -1;
    for (size_t i = 0; i < sf_config_table_len; i++) {
        const sf_cfg_option *o = &sf_config_table[i];
        if (o->check != first->check)
            continue;
        const int set = base && !sf_cfg_field_equal(c, base, o);
        const long at = message_names(msg, o->name);
        if (set && at >= 0 && (set_at < 0 || at < set_at)) {
            set_named = o;
            set_at = at;
        }
        if (set && !changed)
            changed = o;
        if (at >= 0 && (named_at < 0 || at < named_at)) {
            named = o;
            named_at = at;
        }
    }
    return set_named ? set_named : changed ? changed : named ? named : first;
}

/* Runs the checks; base (or NULL) is the config the change started from. */
int sf_cfg_validate_change(const sf_config *c, const sf_config *base, char *err, size_t errlen, char *field,
                           size_t fieldlen)
{
    for (size_t i = 0; i < sf_config_table_len; i++) {
        const sf_cfg_option *o = &sf_config_table[i];
        if (o->check && o->check(c, err, errlen)) {
            o = blamed_option(c, base, o, err);
            if (field)
                snprintf(field, fieldlen, "%s", o->name);
            /* The message names the field first, once. */
            const size_t n = strlen(o->name);
            if (strncmp(err, o->name, n) != 0 || err[n] != ':') {
                char tmp[512];
                snprintf(tmp, sizeof tmp, "%s: %s", o->name, err);
                snprintf(err, errlen, "%s", tmp);
            }
            return -1;
        }
    }
    return 0;
}

int sf_config_validate(const sf_config *c, char *err, size_t errlen, char *field, size_t fieldlen)
{
    return sf_cfg_validate_change(c, NULL, err, errlen, field, fieldlen);
}
