/* handlers/config.c — GET /v1/config and PATCH /v1/config (JSON merge patch). */
#include <stdlib.h>

#include "handlers/handlers.h"
#include "server/app.h"
#include "server/config.h"

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
    cJSON *j = cJSON_ParseWithLength(r->body, r->body_len);
    if (!j) {
        sf_reply_error(r, 400, "json_invalid", "the body is not valid JSON");
        return NULL;
    }
    if (depth_of(j) > c.http.max_json_depth + 1) {
        cJSON_Delete(j);
        sf_reply_error(r, 400, "json_too_deep", "JSON nesting deeper than %d", c.http.max_json_depth);
        return NULL;
    }
    return j;
}

int h_config_get(sf_req *r)
{
    sf_config c;
    sf_config_get(&c);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "config", sf_config_to_json(&c));
    cJSON_AddItemToObject(o, "pending_restart", sf_config_pending());
    return sf_reply_json(r, 200, o);
}

int h_config_patch(sf_req *r)
{
    cJSON *patch = h_parse_json_body(r);
    if (!patch)
        return -1;
    if (!cJSON_IsObject(patch)) {
        cJSON_Delete(patch);
        return sf_reply_error(r, 400, "config_invalid",
                              "a merge patch must be a JSON object of sections");
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
    cJSON_AddItemToObject(o, "config", sf_config_to_json(&c));
    cJSON_AddItemToObject(o, "applied", applied);
    cJSON_AddItemToObject(o, "pending_restart", pending);
    return sf_reply_json(r, 200, o);
}
