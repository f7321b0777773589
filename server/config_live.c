/* server/config_live.c — the live configuration: the effective and wanted configs, their generation, and PATCH. See config.h. */
#include "server/config.h"
#include "server/config_impl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A patch that sets an empty pipeline to the recipe it already runs (a GET
 * view patched back) leaves it empty, so that it still follows model.preset
 * and the patch changes nothing. */
static void keep_preset_recipes(sf_config *next, const sf_config *was)
{
    if (!sf_cfg_recipe_preset(was) || strcmp(next->model.preset, was->model.preset) != 0 ||
        strcmp(next->model.spec, was->model.spec) != 0)
        return;
    struct {
        char *now;
        const char *before;
        int eval;
    } pipes[] = {
        {next->augment.pipeline, was->augment.pipeline, 0},
        {next->augment.eval_pipeline, was->augment.eval_pipeline, 1},
    };
    for (size_t i = 0; i < sizeof pipes / sizeof pipes[0]; i++) {
        if (pipes[i].before[0] || !pipes[i].now[0])
            continue;
        cJSON *a = cJSON_Parse(pipes[i].now), *b = cJSON_Parse(sf_cfg_recipe_of(was, pipes[i].eval));
        if (a && b && cJSON_Compare(a, b, 1))
            pipes[i].now[0] = '\0';
        cJSON_Delete(a);
        cJSON_Delete(b);
    }
}

const sf_cfg_option *sf_config_patch_needs_token(const cJSON *patch, const sf_config *cur)
{
    sf_config *next = NULL;
    const sf_cfg_option *found = NULL;
    /* Names are matched as sf_config_apply_json matches them. */
    for (const cJSON *sec = cJSON_IsObject(patch) ? patch->child : NULL; sec && !found; sec = sec->next)
        for (const cJSON *kv = cJSON_IsObject(sec) ? sec->child : NULL; kv && !found; kv = kv->next) {
            char name[128], err[256];
            snprintf(name, sizeof name, "%s.%s", sec->string, kv->string);
            const sf_cfg_option *o = sf_config_find(name);
            if (!o || !(o->flags & SF_CF_PATCH_NEEDS_TOKEN))
                continue;
            if (!next && !(next = malloc(sizeof *next))) {
                found = o; /* cannot tell that it is unchanged */
                break;
            }
            *next = *cur;
            if (sf_cfg_set_json(next, o, kv, err, sizeof err) != 0 || !sf_cfg_field_equal(next, cur, o))
                found = o;
        }
    free(next);
    return found;
}

/* ---- the live configuration ------------------------------------------------ */

static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static sf_config live;           /* effective now */
static _Atomic uint64_t live_gen = 1; /* bumped whenever live changes */
static sf_config wanted;         /* effective + pending restart-only changes */
static void (*on_change)(const sf_config *c);

void sf_config_live_init(const sf_config *c)
{
    pthread_mutex_lock(&live_mu);
    live = *c;
    wanted = *c;
    atomic_fetch_add(&live_gen, 1);
    pthread_mutex_unlock(&live_mu);
}

void sf_config_get(sf_config *out)
{
    pthread_mutex_lock(&live_mu);
    *out = live;
    pthread_mutex_unlock(&live_mu);
}

const sf_config *sf_config_cur(void)
{
    static __thread sf_config tl;
    static __thread uint64_t tl_gen; /* 0: never filled (live_gen starts at 1) */
    if (tl_gen != atomic_load(&live_gen)) {
        pthread_mutex_lock(&live_mu);
        tl = live;
        tl_gen = atomic_load(&live_gen);
        pthread_mutex_unlock(&live_mu);
    }
    return &tl;
}

uint64_t sf_config_generation(void) { return atomic_load(&live_gen); }

void sf_config_on_change(void (*fn)(const sf_config *c)) { on_change = fn; }

static cJSON *pending_locked(void)
{
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; i < sf_config_table_len; i++)
        if (!sf_cfg_field_equal(&live, &wanted, &sf_config_table[i]))
            cJSON_AddItemToArray(arr, cJSON_CreateString(sf_config_table[i].name));
    return arr;
}

cJSON *sf_config_pending(void)
{
    pthread_mutex_lock(&live_mu);
    cJSON *a = pending_locked();
    pthread_mutex_unlock(&live_mu);
    return a;
}

/* One patch at a time, its change hook included: the hook runs after live_mu
 * is released (it may read the config), so without this two patches of
 * log.level could reach the logger in the other order than they reached the
 * config, leaving the two disagreeing. */
static pthread_mutex_t patch_mu = PTHREAD_MUTEX_INITIALIZER;

static int patch_serial(const cJSON *patch, cJSON **applied, cJSON **pending, char *err, size_t errlen,
                        char *field, size_t fieldlen, int commit);

int sf_config_patch(const cJSON *patch, cJSON **applied, cJSON **pending, char *err,
                    size_t errlen, char *field, size_t fieldlen)
{
    pthread_mutex_lock(&patch_mu);
    int rc = patch_serial(patch, applied, pending, err, errlen, field, fieldlen, 1);
    pthread_mutex_unlock(&patch_mu);
    return rc;
}

int sf_config_patch_check(const cJSON *patch, char *err, size_t errlen, char *field, size_t fieldlen)
{
    pthread_mutex_lock(&patch_mu);
    int rc = patch_serial(patch, NULL, NULL, err, errlen, field, fieldlen, 0);
    pthread_mutex_unlock(&patch_mu);
    return rc;
}

static int patch_serial(const cJSON *patch, cJSON **applied, cJSON **pending, char *err, size_t errlen,
                        char *field, size_t fieldlen, int commit)
{
    sf_config *next = malloc(sizeof *next);
    if (!next) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    pthread_mutex_lock(&live_mu);
    *next = wanted;
    int rc = sf_config_apply_json(next, patch, err, errlen, field, fieldlen);
    if (!rc) {
        keep_preset_recipes(next, &wanted);
        rc = sf_cfg_validate_change(next, &wanted, err, errlen, field, fieldlen);
    }
    if (!rc) {
        /* The hot options apply now, beside the restart-only values still in
         * effect: that mix must be valid too (checkpoint.every_steps set now
         * with a checkpoint.dir that only the next start would have). */
        sf_config *eff = malloc(sizeof *eff);
        if (!eff) {
            snprintf(err, errlen, "out of memory");
            rc = -1;
        } else {
            *eff = live;
            for (size_t i = 0; i < sf_config_table_len; i++) {
                const sf_cfg_option *o = &sf_config_table[i];
                if ((o->flags & SF_CF_HOT) && !sf_cfg_field_equal(next, &wanted, o))
                    memcpy(sf_cfg_field_ptr(eff, o), sf_cfg_field_cptr(next, o), o->size);
            }
            char why[400];
            rc = sf_cfg_validate_change(eff, &live, why, sizeof why, field, fieldlen);
            if (rc)
                snprintf(err, errlen, "%s (the hot options of this patch apply now, but the "
                         "restart-only ones only at the next start)", why);
            free(eff);
        }
    }
    if (rc || !commit) {
        pthread_mutex_unlock(&live_mu);
        free(next);
        return rc ? -1 : 0;
    }
    cJSON *ap = cJSON_CreateArray();
    for (size_t i = 0; i < sf_config_table_len; i++) {
        const sf_cfg_option *o = &sf_config_table[i];
        if (sf_cfg_field_equal(next, &wanted, o))
            continue;
        if (o->flags & SF_CF_HOT) {
            memcpy(sf_cfg_field_ptr(&live, o), sf_cfg_field_cptr(next, o), o->size);
            cJSON_AddItemToArray(ap, cJSON_CreateString(o->name));
        }
    }
    wanted = *next;
    atomic_fetch_add(&live_gen, 1);
    /* Hot values take effect in live and wanted alike; restart-only ones stay pending. */
    sf_config snapshot = live;
    cJSON *pe = pending_locked();
    pthread_mutex_unlock(&live_mu);
    free(next);
    if (on_change && cJSON_GetArraySize(ap) > 0)
        on_change(&snapshot);
    *applied = ap;
    *pending = pe;
    return 0;
}
