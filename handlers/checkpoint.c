/* handlers/checkpoint.c — GET and PUT /v1/checkpoint, POST /v1/checkpoint/save
 * and /v1/checkpoint/load.
 *
 * Each request starts one checkpoint operation (server/checkpoint.h) and
 * waits for it without holding a thread: the operation runs on the engine
 * thread between two steps and on the checkpoint I/O thread, and wakes the
 * request on (SF_WAIT_CMD, its key). What a request holds (its operation, a
 * PUT body) lives in r->user and is released by on_done, also when the client
 * goes away first; that is why every route here has stream callbacks.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "handlers/handlers.h"
#include "server/app.h"
#include "server/distributed.h"
#include "server/checkpoint.h"
#include "server/config.h"

const char *const h_checkpoint_json_types[] = {"application/json", NULL};

typedef struct ckpt_req {
    sf_ckpt_op *op;
    int fd;            /* PUT body: an unnamed temporary file, -1 before the first byte */
    size_t len;
    int reserved;      /* the body holds a checkpoint buffer reservation */
} ckpt_req;

static ckpt_req *req_of(sf_req *r)
{
    if (!r->user) {
        ckpt_req *q = calloc(1, sizeof(ckpt_req));
        if (q)
            q->fd = -1;
        r->user = q;
    }
    return r->user;
}

static void drop_body(sf_req *r, ckpt_req *q)
{
    if (q->fd >= 0)
        close(q->fd);
    q->fd = -1;
    q->len = 0;
    if (q->reserved)
        sf_ckpt_buffer_return(r->app);
    q->reserved = 0;
}

static void ckpt_done(sf_req *r, int ok)
{
    ckpt_req *q = r->user;
    if (!q)
        return;
    sf_ckpt_op_release(q->op);
    drop_body(r, q);
    free(q);
    r->user = NULL;
}

static int reply_ckpt_error(sf_req *r, const sf_ckpt_error *e)
{
    return sf_reply_error_field(r, e->status, e->code, e->field[0] ? e->field : NULL, "%s", e->msg);
}

static int reply_result(sf_req *r, sf_ckpt_op *op)
{
    sf_ckpt_result res;
    sf_ckpt_op_result(op, &res);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "step", (double)res.step);
    cJSON_AddNumberToObject(o, "bytes", (double)res.bytes);
    cJSON_AddNumberToObject(o, "tensors", res.tensors);
    cJSON_AddBoolToObject(o, "optimizer", res.optimizer);
    cJSON_AddNumberToObject(o, "seconds", res.seconds);
    if (res.where[0])
        cJSON_AddStringToObject(o, res.url ? "url" : "path", res.where);
    return sf_reply_json(r, 200, o);
}

static int reply_file(sf_req *r, sf_ckpt_op *op)
{
    sf_ckpt_result res;
    sf_ckpt_op_result(op, &res);
    void *data;
    size_t len;
    void (*free_fn)(void *);
    if (sf_ckpt_op_take_file(op, &data, &len, &free_fn) != 0)
        return sf_reply_error(r, 500, "internal", "the checkpoint snapshot is missing");
    char v[64];
    snprintf(v, sizeof v, "%llu", (unsigned long long)res.step);
    sf_reply_header(r, "X-Checkpoint-Step", v);
    snprintf(v, sizeof v, "attachment; filename=\"ckpt-%010llu.safetensors\"",
             (unsigned long long)res.step);
    sf_reply_header(r, "Content-Disposition", v);
    return sf_reply_bytes(r, 200, "application/vnd.safetensors", data, len, free_fn);
}

/* Moves the request's operation on until it finished, suspending in between. */
static int run_op(sf_req *r, ckpt_req *q, int (*reply)(sf_req *, sf_ckpt_op *))
{
    sf_app *app = r->app;
    for (;;) {
        uint64_t gen = sf_http_gen(app->http, SF_WAIT_CMD);
        if (sf_ckpt_op_advance(app, q->op)) {
            const sf_ckpt_error *e = sf_ckpt_op_error(q->op);
            return e ? reply_ckpt_error(r, e) : reply(r, q->op);
        }
        if (r->wait == SF_WAIT_SHUTDOWN)
            break;
        /* No timeout of its own: a checkpoint finishes or fails, and ends at
         * shutdown; the periodic wake only re-checks. */
        if (sf_http_wait(r, SF_WAIT_CMD, sf_ckpt_op_key(q->op), gen, 60000) == 0)
            return 0;
        /* Waits are refused once the server shuts down: do not spin. */
        if (atomic_load(&app->draining) && !sf_ckpt_op_advance(app, q->op))
            break;
    }
    return sf_reply_error(r, 503, "shutting_down",
                          "the service is shutting down before the checkpoint operation finished");
}

/* ---- GET /v1/checkpoint ------------------------------------------------------ */

static int no_body(sf_req *r, const uint8_t *data, size_t *len)
{
    *len = 0; /* a GET's body means nothing here; max_body 0 refuses one with a length */
    return 0;
}

static uint64_t zero_body(sf_app *app) { return 0; }

const sf_stream_ops h_checkpoint_get_stream = {no_body, ckpt_done, zero_body, NULL, NULL, NULL};

/* Parses a boolean query argument; -1 after a 400. */
static int bool_arg(sf_req *r, const char *name, int def)
{
    const char *v = sf_req_arg(r, name);
    if (!v)
        return def;
    if (!strcmp(v, "true") || !strcmp(v, "1"))
        return 1;
    if (!strcmp(v, "false") || !strcmp(v, "0"))
        return 0;
    sf_reply_error_field(r, 400, "request_invalid", name, "%s must be true or false", name);
    return -1;
}

int h_checkpoint_get(sf_req *r)
{
    ckpt_req *q = req_of(r);
    if (!q)
        return sf_reply_error(r, 503, "out_of_memory", "out of memory");
    if (!q->op) {
        int opt = bool_arg(r, "optimizer", 1);
        if (opt < 0)
            return -1;
        sf_ckpt_error e;
        q->op = sf_ckpt_get(r->app, opt, &e);
        if (!q->op)
            return reply_ckpt_error(r, &e);
        r->wait = SF_WAIT_NONE;
    }
    return run_op(r, q, reply_file);
}

/* ---- PUT /v1/checkpoint -------------------------------------------------------- */

/* A data-parallel job keeps one state on every rank: it is written by rank 0
 * only, and restored only at start (checkpoint.resume on rank 0, broadcast to
 * the others), never into one rank while the others train on. */
static int refuse_distributed(sf_req *r, int save)
{
    sf_app *app = r->app;
    if (!app->dist)
        return 0;
    if (save && sf_distributed_rank(app->dist) == 0)
        return 0;
    if (save)
        return sf_reply_error(r, 409, "not_rank_zero",
                              "this is rank %d of a data-parallel job: rank 0 writes the checkpoints "
                              "(every rank holds the same parameters)",
                              sf_distributed_rank(app->dist)), -1;
    return sf_reply_error(r, 409, "distributed_restore_refused",
                          "a data-parallel job restores a checkpoint only at start (checkpoint.resume or "
                          "model.init_from on rank 0, broadcast to every rank)"), -1;
}

/* checkpoint.max_bytes, or less when the model's state cannot be that large:
 * the HTTP layer refuses a longer announced Content-Length with 413 before a
 * byte is read. */
static uint64_t put_max_body(sf_app *app) { return sf_ckpt_max_bytes(app); }

static int put_data(sf_req *r, const uint8_t *data, size_t *len)
{
    ckpt_req *q = req_of(r);
    if (!q)
        return sf_reply_error(r, 503, "out_of_memory", "out of memory"), -1;
    uint64_t max = put_max_body(r->app);
    if (!q->reserved) {
        if (sf_ckpt_buffer_reserve(r->app) != 0)
            return sf_reply_error(r, 503, "checkpoint_busy",
                                  "%d checkpoint buffers are in use; retry later",
                                  SF_CKPT_MAX_BUFFERS), -1;
        q->reserved = 1;
    }
    if (q->len + *len > max) {
        drop_body(r, q);
        return sf_reply_error(r, 413, "checkpoint_too_large",
                              "the checkpoint exceeds %llu bytes (checkpoint.max_bytes, or the largest "
                              "checkpoint this model's state can be)", (unsigned long long)max), -1;
    }
    /* The body goes to an unnamed file, not to memory: four bodies at once
     * cost disk, and the decoder reads them through a mapping. */
    if (q->fd < 0) {
        sf_ckpt_error e;
        q->fd = sf_ckpt_spool_open(r->app, &e);
        if (q->fd < 0) {
            drop_body(r, q);
            return sf_reply_error(r, e.status, e.code, "%s", e.msg), -1;
        }
    }
    for (size_t done = 0; done < *len;) {
        ssize_t w = write(q->fd, data + done, *len - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            int err = w < 0 ? errno : EIO;
            drop_body(r, q);
            return sf_reply_error(r, 503, "checkpoint_busy", "cannot store the checkpoint body: %s",
                                  strerror(err)), -1;
        }
        done += (size_t)w;
    }
    q->len += *len;
    *len = 0;
    return 0;
}

/* What the head decides: a service that cannot restore a checkpoint says so
 * before the body is sent (a client waiting for 100 Continue sends none). */
static int put_head(sf_req *r)
{
    if (refuse_distributed(r, 0))
        return -1;
    if (!r->app->backend)
        return sf_reply_error(r, 409, "no_backend",
                              "checkpoints need a compute backend (pipeline.mode=train)"), -1;
    return 0;
}

const sf_stream_ops h_checkpoint_put_stream = {put_data, ckpt_done, put_max_body, NULL,
                                               "checkpoint.max_bytes, or the largest checkpoint this model's "
                                               "state can be", put_head};

int h_checkpoint_put(sf_req *r)
{
    ckpt_req *q = req_of(r);
    if (!q)
        return sf_reply_error(r, 503, "out_of_memory", "out of memory");
    if (!q->op) {
        sf_ckpt_error e;
        if (q->len == 0 && r->app->backend)
            return sf_reply_error(r, 400, "body_empty", "a safetensors checkpoint body is required");
        q->op = sf_ckpt_put(r->app, q->fd, q->len, &e);
        drop_body(r, q); /* decoded into the operation: the raw body is not needed */
        if (!q->op)
            return reply_ckpt_error(r, &e);
        r->wait = SF_WAIT_NONE;
    }
    return run_op(r, q, reply_result);
}

/* ---- POST /v1/checkpoint/save and /load ------------------------------------------ */

/* The JSON body, buffered in r->body (which the HTTP layer frees). */
static int json_data(sf_req *r, const uint8_t *data, size_t *len)
{
    const sf_config *c = sf_config_cur();
    if (r->body_len + *len > (uint64_t)c->http.max_json_bytes)
        return sf_reply_error(r, 413, "body_too_large", "body exceeds the limit of %lld bytes (http.max_json_bytes)",
                              (long long)c->http.max_json_bytes), -1;
    char *nb = realloc(r->body, r->body_len + *len + 1);
    if (!nb)
        return sf_reply_error(r, 503, "out_of_memory", "cannot buffer the request body"), -1;
    memcpy(nb + r->body_len, data, *len);
    r->body = nb;
    r->body_len += *len;
    r->body[r->body_len] = '\0';
    *len = 0;
    return 0;
}

static uint64_t json_max_body(sf_app *app)
{
    return (uint64_t)sf_config_cur()->http.max_json_bytes;
}

const sf_stream_ops h_checkpoint_json_stream = {json_data, ckpt_done, json_max_body, NULL,
                                                "http.max_json_bytes", NULL};

/* A JSON string may hold the escape \u0000, which a C string ends at: a path
 * "ckpt.safetensors\u0000.evil" would silently become "ckpt.safetensors".
 * The raw body is scanned for it (an escaped backslash before "u0000" is
 * skipped as the pair it is). */
static int has_nul_escape(const char *s, size_t n)
{
    for (size_t i = 0; i + 1 < n; i++) {
        if (s[i] != '\\')
            continue;
        if (s[i + 1] == 'u' && i + 5 < n && memcmp(s + i + 2, "0000", 4) == 0)
            return 1;
        i++;
    }
    return 0;
}

/* {"path": ..., "url": ..., "optimizer": bool}; an empty body is {}. Returns 0,
 * or -1 after a 400. *j must be freed by the caller. */
static int parse_target(sf_req *r, int allow_opt, cJSON **j, const char **path, const char **url,
                        int *opt)
{
    *j = NULL;
    *path = *url = NULL;
    *opt = 1;
    if (r->body_len == 0)
        return 0;
    if (has_nul_escape(r->body, r->body_len))
        return sf_reply_error(r, 400, "path_invalid",
                              "the body holds the escape \\u0000: a NUL cannot be part of a path or URL"), -1;
    *j = h_parse_json_body(r);
    if (!*j)
        return -1;
    if (!cJSON_IsObject(*j))
        return sf_reply_error(r, 400, "request_invalid", "the body must be a JSON object"), -1;
    for (const cJSON *it = (*j)->child; it; it = it->next) {
        const char *k = it->string ? it->string : "";
        if (!strcmp(k, "path") || !strcmp(k, "url")) {
            if (!cJSON_IsString(it))
                return sf_reply_error_field(r, 400, "request_invalid", k, "%s must be a string", k), -1;
            *(!strcmp(k, "path") ? path : url) = it->valuestring;
        } else if (allow_opt && !strcmp(k, "optimizer")) {
            if (!cJSON_IsBool(it))
                return sf_reply_error_field(r, 400, "request_invalid", k,
                                            "optimizer must be true or false"), -1;
            *opt = cJSON_IsTrue(it);
        } else {
            return sf_reply_error_field(r, 400, "request_invalid", k,
                                        "unknown field \"%.64s\" (known: path, url%s)", k,
                                        allow_opt ? ", optimizer" : ""), -1;
        }
    }
    return 0;
}

static int save_or_load(sf_req *r, int save)
{
    if (refuse_distributed(r, save))
        return -1;
    ckpt_req *q = req_of(r);
    if (!q)
        return sf_reply_error(r, 503, "out_of_memory", "out of memory");
    if (!q->op) {
        cJSON *j;
        const char *path, *url;
        int opt;
        if (parse_target(r, save, &j, &path, &url, &opt) != 0) {
            cJSON_Delete(j);
            return -1;
        }
        sf_ckpt_error e;
        q->op = save ? sf_ckpt_save(r->app, path, url, opt, &e) : sf_ckpt_load(r->app, path, url, &e);
        cJSON_Delete(j);
        if (!q->op)
            return reply_ckpt_error(r, &e);
        r->wait = SF_WAIT_NONE;
    }
    return run_op(r, q, reply_result);
}

int h_checkpoint_save(sf_req *r) { return save_or_load(r, 1); }
int h_checkpoint_load(sf_req *r) { return save_or_load(r, 0); }
