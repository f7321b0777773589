/* handlers/config.c — GET /v1/config and PATCH /v1/config (JSON merge patch). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "handlers/handlers.h"
#include "server/app.h"
#include "server/config.h"
#include "server/distributed.h"
#include "server/text.h"

/* Depth of a parsed JSON value (a scalar is 1). */
static int depth_of(const cJSON *j)
{
    int d = 0;
    for (const cJSON *c = j->child; c; c = c->next) {
        int cd = depth_of(c);
        if (cd > d)
            d = cd;
    }
    return d + 1;
}

/* Raw nesting depth, counted before parsing so a hostile body cannot make the
 * parser recurse deeply. Strings are skipped. */
static int raw_depth(const char *s, size_t n)
{
    int d = 0, max = 0, in_str = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (in_str) {
            if (ch == '\\')
                i++;
            else if (ch == '"')
                in_str = 0;
        } else if (ch == '"') {
            in_str = 1;
        } else if (ch == '{' || ch == '[') {
            if (++d > max)
                max = d;
        } else if (ch == '}' || ch == ']') {
            d--;
        }
    }
    return max;
}

static int cmp_key(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A key that appears twice in one object of j, or NULL. JSON leaves such a
 * body's meaning open (RFC 8259 4: the first or the last value may win, and
 * the routes here did differently), and a filter in front that read the
 * other one would be bypassed: refused. Sorted, not pairwise, so a body of
 * many keys costs n log n. The depth is bounded before this runs. */
static const char *duplicate_key(const cJSON *j, char *buf, size_t cap)
{
    if (!cJSON_IsObject(j) && !cJSON_IsArray(j))
        return NULL;
    int n = 0;
    for (const cJSON *k = j->child; k; k = k->next) {
        const char *d = duplicate_key(k, buf, cap);
        if (d)
            return d;
        n++;
    }
    if (!cJSON_IsObject(j) || n < 2)
        return NULL;
    const char **names = malloc((size_t)n * sizeof *names);
    if (!names)
        return NULL; /* the handler's own parse of the body still bounds it */
    int i = 0;
    for (const cJSON *k = j->child; k; k = k->next)
        names[i++] = k->string ? k->string : "";
    qsort(names, (size_t)n, sizeof *names, cmp_key);
    const char *dup = NULL;
    for (i = 1; i < n && !dup; i++)
        if (strcmp(names[i - 1], names[i]) == 0)
            dup = names[i];
    if (dup)
        snprintf(buf, cap, "%s", dup);
    free(names);
    return dup ? buf : NULL;
}

cJSON *h_parse_json_body(sf_req *r)
{
    sf_config c;
    sf_config_get(&c);
    if (!r->body || r->body_len == 0) {
        sf_reply_error(r, 400, "body_empty", "a JSON body is required");
        return NULL;
    }
    if (raw_depth(r->body, r->body_len) > c.http.max_json_depth) {
        sf_reply_error(r, 400, "json_too_deep", "JSON nesting deeper than %d", c.http.max_json_depth);
        return NULL;
    }
    const char *why = NULL;
    cJSON *j = sf_json_parse_whole(r->body, r->body_len, &why);
    if (!j) {
        sf_reply_error(r, 400, "json_invalid", "the body is not one JSON value: %s", why);
        return NULL;
    }
    if (depth_of(j) > c.http.max_json_depth + 1) {
        cJSON_Delete(j);
        sf_reply_error(r, 400, "json_too_deep", "JSON nesting deeper than %d", c.http.max_json_depth);
        return NULL;
    }
    char key[128];
    if (duplicate_key(j, key, sizeof key)) {
        cJSON_Delete(j);
        sf_reply_error_field(r, 400, "json_duplicate_key", key,
                             "the key \"%s\" appears twice in one object; each key may appear once", key);
        return NULL;
    }
    return j;
}

/* "config" as in force, and "from_preset": which of its values are model.preset's recipe. */
static void add_view(cJSON *o, const sf_config *c)
{
    cJSON *from = NULL;
    cJSON_AddItemToObject(o, "config", sf_config_view_json(c, &from));
    cJSON_AddItemToObject(o, "from_preset", from);
}

int h_config_get(sf_req *r)
{
    sf_config c;
    sf_config_get(&c);
    cJSON *o = cJSON_CreateObject();
    add_view(o, &c);
    cJSON_AddItemToObject(o, "pending_restart", sf_config_pending());
    return sf_reply_json(r, 200, o);
}

/* On a service without http.token, a patch that names an option only an
 * authenticated client may change (server/config.h SF_CF_PATCH_NEEDS_TOKEN)
 * to another value is refused whole: 403 config_needs_token. Returns 0 to go
 * on, -1 replied. */
static int refuse_without_token(sf_req *r, const cJSON *patch)
{
    const sf_config *cur = sf_config_cur();
    const sf_cfg_option *o = cur->http.token[0] ? NULL : sf_config_patch_needs_token(patch, cur);
    if (!o)
        return 0;
    const char *harm = strcmp(o->name, "http.token") == 0 ? "lock every other client out"
                       : (o->flags & SF_CF_LOCATION)
                           ? "point the service at a file, directory, URL or address of its choosing"
                           : "widen where it sends the service";
    sf_reply_error_field(r, 403, "config_needs_token", o->name,
                         "%s can be changed at run time only on a service started with http.token: on an "
                         "open one any client could %s; set it at start (flag, config file or environment)",
                         o->name, harm);
    return -1;
}

/* Data-parallel job: a patch applies on every rank at one step boundary. It
 * is checked here against this rank's config (so a bad one is refused at
 * once), queued, sent to every rank at the next round (server/engine_rounds.c),
 * checked there by every rank and applied on all of them in rank order, or
 * on none when one refuses it; the request waits for that round. It keeps
 * only the patch's id (r->user). */
#define DIST_PATCH_KEY(id) ((1ull << 63) | (id))

static int dist_patch_start(sf_req *r, uint64_t *id)
{
    cJSON *patch = h_parse_json_body(r);
    if (!patch)
        return -1;
    if (!cJSON_IsObject(patch)) {
        cJSON_Delete(patch);
        return sf_reply_error(r, 400, "config_invalid", "a merge patch must be a JSON object of sections"), -1;
    }
    if (refuse_without_token(r, patch)) {
        cJSON_Delete(patch);
        return -1;
    }
    char err[512] = "", field[128] = "";
    int rc = sf_config_patch_check(patch, err, sizeof err, field, sizeof field);
    cJSON_Delete(patch);
    if (rc)
        return sf_reply_error_field(r, 400, "config_invalid", field, "%s", err), -1;
    if (sf_distributed_patch_post(r->app->dist, r->body, r->body_len, id, err, sizeof err) != 0) {
        sf_reply_header(r, "Retry-After", "1");
        return sf_reply_error(r, 503, "distributed_unavailable", "%s", err), -1;
    }
    return 0;
}

static int dist_patch(sf_req *r)
{
    uint64_t id = (uint64_t)(uintptr_t)r->user;
    if (!id) {
        if (dist_patch_start(r, &id))
            return -1;
        r->user = (void *)(uintptr_t)id;
        r->wait = SF_WAIT_NONE;
    }
    for (;;) {
        uint64_t gen = sf_http_gen(r->app->http, SF_WAIT_CMD);
        int status = 0;
        char err[512], field[128];
        cJSON *reply = NULL;
        int st = sf_distributed_patch_result(r->app->dist, id, &status, err, sizeof err, field, sizeof field,
                                             &reply);
        if (st < 0)
            return sf_reply_error(r, 503, "distributed_unavailable", "%s", err);
        if (st > 0) {
            if (status != 0) {
                cJSON_Delete(reply);
                return sf_reply_error_field(r, 400, "config_invalid", field[0] ? field : NULL, "%s", err);
            }
            sf_config c;
            sf_config_get(&c);
            cJSON *o = cJSON_CreateObject();
            add_view(o, &c);
            cJSON *a = reply ? cJSON_DetachItemFromObject(reply, "applied") : NULL;
            cJSON *p = reply ? cJSON_DetachItemFromObject(reply, "pending_restart") : NULL;
            /* Lists of option names, as a single process answers. */
            cJSON_AddItemToObject(o, "applied", cJSON_IsArray(a) ? a : (cJSON_Delete(a), cJSON_CreateArray()));
            cJSON_AddItemToObject(o, "pending_restart",
                                  cJSON_IsArray(p) ? p : (cJSON_Delete(p), cJSON_CreateArray()));
            cJSON_Delete(reply);
            return sf_reply_json(r, 200, o);
        }
        if (r->wait == SF_WAIT_SHUTDOWN) {
            sf_reply_header(r, "Retry-After", "1");
            return sf_reply_error(r, 503, "shutting_down", "the service is shutting down");
        }
        if (r->wait == SF_WAIT_TIMEOUT)
            return sf_reply_error(r, 503, "distributed_unavailable",
                                  "the ranks did not reach a step boundary within 60 s; the patch stays "
                                  "queued and applies at the next one");
        if (sf_http_wait(r, SF_WAIT_CMD, DIST_PATCH_KEY(id), gen, 60000) == 0)
            return 0;
    }
}

int h_config_patch(sf_req *r)
{
    if (r->app->dist)
        return dist_patch(r);
    cJSON *patch = h_parse_json_body(r);
    if (!patch)
        return -1;
    if (!cJSON_IsObject(patch)) {
        cJSON_Delete(patch);
        return sf_reply_error(r, 400, "config_invalid",
                              "a merge patch must be a JSON object of sections");
    }
    if (refuse_without_token(r, patch)) {
        cJSON_Delete(patch);
        return -1;
    }
    cJSON *applied = NULL, *pending = NULL;
    char err[512], field[128];
    int rc = sf_config_patch(patch, &applied, &pending, err, sizeof err, field, sizeof field);
    cJSON_Delete(patch);
    if (rc) {
        /* The error names the field; nothing was changed. */
        return sf_reply_error_field(r, 400, "config_invalid", field, "%s", err);
    }
    sf_config c;
    sf_config_get(&c);
    cJSON *o = cJSON_CreateObject();
    add_view(o, &c);
    cJSON_AddItemToObject(o, "applied", applied);
    cJSON_AddItemToObject(o, "pending_restart", pending);
    return sf_reply_json(r, 200, o);
}
