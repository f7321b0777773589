/* server/checkpoint_op.c — an operation's life: made, shared by the request
 * and the thread working on it (references), its stages finished, failed,
 * read and freed. checkpoint.c starts and advances operations and
 * checkpoint_io.c works on them; both use this file, which calls neither. */
#include <stdatomic.h>
#include <stdlib.h>

#include "server/checkpoint_state.h"
#include "server/clock.h"
#include "server/http.h"

#define KEY_BIT (1ull << 63)      /* operation wait keys: never an engine command id */

sf_ckpt_op *sf_ckpt_op_new(sf_ckpt *ck, int kind)
{
    sf_ckpt_op *op = calloc(1, sizeof *op);
    if (!op)
        return NULL;
    atomic_init(&op->refs, 1);
    op->ck = ck;
    op->kind = kind;
    op->key = KEY_BIT | atomic_fetch_add(&ck->next_key, 1);
    op->t0 = sf_now_ns();
    return op;
}

void sf_ckpt_op_ref(sf_ckpt_op *op) { atomic_fetch_add(&op->refs, 1); }

void sf_ckpt_op_release(sf_ckpt_op *op)
{
    if (!op || atomic_fetch_sub(&op->refs, 1) != 1)
        return;
    if (op->b && op->b != op->ck->periodic)
        sf_ckpt_blob_free(op->b);
    sf_ckpt_decoded_free(&op->d);
    if (op->reserved)
        atomic_fetch_sub(&op->ck->buffers, 1);
    free(op);
}

/* Ends the current stage and wakes the request waiting on it. */
void sf_ckpt_stage_finish(sf_ckpt_op *op)
{
    atomic_store(&op->stage_done, 1);
    sf_http_wake(op->ck->app->http, SF_WAIT_CMD, op->key);
}

void sf_ckpt_op_fail(sf_ckpt_op *op, int status, const char *code, const char *msg)
{
    op->failed = 1;
    sf_ckpt_fail(&op->err, status, code, NULL, "%s", msg);
}

uint64_t sf_ckpt_op_key(const sf_ckpt_op *op) { return op->key; }

const sf_ckpt_error *sf_ckpt_op_error(const sf_ckpt_op *op) { return op->failed ? &op->err : NULL; }

void sf_ckpt_op_result(const sf_ckpt_op *op, sf_ckpt_result *out) { *out = op->res; }

int sf_ckpt_op_take_file(sf_ckpt_op *op, void **data, size_t *len, void (**free_fn)(void *))
{
    if (op->kind != OP_GET || !op->b || op->failed || !atomic_load(&op->stage_done))
        return -1;
    *data = op->b->file;
    *len = op->b->len;
    *free_fn = sf_ckpt_blob_free_file;
    op->b = NULL;
    return 0;
}
