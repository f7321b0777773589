/* tests/fuzz/fuzz_checkpoint.c — libFuzzer target for the checkpoint decoder
 * (server/checkpoint_format.c on top of sf_st_file_read).
 *
 * The input is a checkpoint file as PUT /v1/checkpoint, a load or a resume
 * would read it. It is decoded against a small batchnorm model (the layout of
 * SPEC below) with SGD and with AdamW, strictly (every tensor, as PUT does)
 * with and without a backend that restores optimizer state, and partially (as
 * model.init_from does). After each decode:
 *   - a success of a strict read hands back every buffer the layout needs,
 *     and every value in them is finite (NaN and infinities are refused);
 *   - a failure has a status in 400..503 and a code, and a strict read
 *     leaves nothing allocated;
 *   - a partial read changes the caller's parameters only where it succeeds.
 * ASan and UBSan see every read of the (unaligned) data section.
 *
 * The seeds in tests/fuzz/corpus_checkpoint are files of the SPEC model as
 * the service writes them (GET /v1/checkpoint with and without optimizer
 * state, from `--model.spec` SPEC, optim.name sgd and adamw), the same as a
 * PyTorch-style state_dict without metadata, and a few broken ones.
 *
 *   make build/fuzz_checkpoint && build/fuzz_checkpoint tests/fuzz/corpus_checkpoint
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/model.h"
#include "server/checkpoint_format.h"

#define CHECK(cond) do { if (!(cond)) __builtin_trap(); } while (0)

static const char SPEC[] =
    "{\"input\":[1,4,4],\"classes\":2,\"layers\":["
    "{\"type\":\"conv2d\",\"name\":\"conv\",\"out\":2,\"k\":3,\"pad\":1},"
    "{\"type\":\"batchnorm2d\",\"name\":\"bn\"},{\"type\":\"relu\",\"name\":\"relu\"},"
    "{\"type\":\"flatten\",\"name\":\"flat\"},{\"type\":\"linear\",\"name\":\"fc\",\"out\":2}]}";

static sf_model model;
static sf_ckpt_layout lay[2]; /* SGD, AdamW */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char err[256];
    CHECK(sf_model_from_json(SPEC, &model, err, sizeof err) == 0);
    for (int adamw = 0; adamw < 2; adamw++)
        CHECK(sf_ckpt_layout_init(&lay[adamw], &model, adamw, err, sizeof err) == 0);
    return 0;
}

static void all_finite(const float *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        CHECK(isfinite(p[i]));
}

static void check_failure(const sf_ckpt_error *e)
{
    CHECK(e->status >= 400 && e->status <= 503);
    CHECK(e->code[0] != '\0');
}

static void strict(const sf_ckpt_layout *L, int can_opt, const uint8_t *data, size_t size)
{
    sf_ckpt_caps caps = {.opt = can_opt, .buffers = 1, .backend = "fuzz"};
    sf_ckpt_decoded d;
    memset(&d, 0, sizeof d);
    sf_ckpt_error e;
    memset(&e, 0, sizeof e);
    if (sf_ckpt_decode(L, &caps, data, size, SF_CKPT_READ_STRICT, &d, &e) == 0) {
        CHECK(d.params && d.bufs);
        all_finite(d.params, model.n_params);
        all_finite(d.bufs, model.n_buffers);
        CHECK(!can_opt == !d.mom);
        CHECK(!(can_opt && L->adamw) == !d.sq);
        if (d.mom)
            all_finite(d.mom, model.n_params);
        if (d.sq)
            all_finite(d.sq, model.n_params);
        CHECK(d.bytes == size);
        sf_ckpt_decoded_free(&d);
    } else {
        check_failure(&e);
        CHECK(!d.params && !d.bufs && !d.mom && !d.sq);
    }
}

static void partial(const sf_ckpt_layout *L, const uint8_t *data, size_t size)
{
    sf_ckpt_caps caps = {.opt = 1, .buffers = 1, .backend = "fuzz"};
    sf_ckpt_decoded d;
    memset(&d, 0, sizeof d);
    d.params = calloc(model.n_params, sizeof(float));
    d.bufs = calloc(model.n_buffers, sizeof(float));
    CHECK(d.params && d.bufs);
    sf_ckpt_error e;
    memset(&e, 0, sizeof e);
    if (sf_ckpt_decode(L, &caps, data, size, SF_CKPT_READ_PARTIAL, &d, &e) == 0) {
        CHECK(d.matched > 0);
        all_finite(d.params, model.n_params);
        all_finite(d.bufs, model.n_buffers);
    } else {
        check_failure(&e);
    }
    sf_ckpt_decoded_free(&d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* An exact-size copy, so ASan sees a read one byte past the file. */
    uint8_t *buf = malloc(size ? size : 1);
    CHECK(buf);
    memcpy(buf, data, size);
    for (int adamw = 0; adamw < 2; adamw++) {
        strict(&lay[adamw], 1, buf, size);
        strict(&lay[adamw], 0, buf, size);
    }
    partial(&lay[0], buf, size);
    free(buf);
    return 0;
}
