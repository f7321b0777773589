/* gpu/cuda/backend_jpeg.cu — the CUDA backend's JPEG decoder over its life:
 * what the build prepares, the decoder made by the first encoded batch, and
 * what it holds for GET /v1/model and the gauges. The decode itself is
 * queued by backend_cuda.cu's submit and transform. */
#include "gpu/cuda/backend_ctx.h"

/* What encoded batches need at build: the host arrays of the samples kept
 * and the maker. The decoder itself is made by the first encoded batch
 * (make_jpeg). Without jpeg.max_batch_pixels the backend still trains raw
 * batches; an encoded one fails naming why (c->jpeg_err). */
void build_jpeg(cuda_ctx *c, const sf_train_cfg *cfg)
{
    c->jpeg_err[0] = '\0';
    pthread_mutex_lock(&c->jpeg_mu);
    c->jpeg_not_made = 0;
    pthread_mutex_unlock(&c->jpeg_mu);
    c->jpeg_maker = cfg->jpeg_maker ? *cfg->jpeg_maker : sf_cuda_jpeg_maker{NULL, NULL};
    c->cfg.jpeg_maker = NULL; /* the caller's, copied above */
    if (cfg->jpeg_max_batch_pixels <= 0) {
        snprintf(c->jpeg_err, sizeof c->jpeg_err, "cuda: JPEG decoding is off (jpeg.max_batch_pixels is 0)");
        return;
    }
    c->kept_samples = (sf_aug_sample *)calloc((size_t)cfg->max_batch, sizeof *c->kept_samples);
    c->kept_labels = (uint8_t *)calloc((size_t)cfg->max_batch, 8);
    if (!c->kept_samples || !c->kept_labels)
        snprintf(c->jpeg_err, sizeof c->jpeg_err, "cuda: out of memory for the JPEG batches' kept samples");
}

/* Makes the JPEG decoder on the first encoded batch (submit() or
 * transform(), on the engine thread), sized from the build's config for
 * the largest encoded batch: a job that posts raw pixels never holds its
 * staging areas and nvJPEG's buffers, and a job's first encoded batch pays
 * their creation, once. When it cannot be made (most often: training holds
 * the device memory it needs) nothing of it is kept, the batch is refused
 * with SF_BACKEND_NO_DECODER, counted, and the next encoded batch tries
 * again. 0 when the decoder is there; -1 when decoding is off (c->jpeg_err). */
int make_jpeg(cuda_ctx *c, char *err, size_t errlen)
{
    if (c->jpeg)
        return 0;
    if (c->jpeg_err[0]) {
        sf_errf(err, errlen, "%s", c->jpeg_err);
        return -1;
    }
    const int stages = c->cfg.overlap ? 2 : 1;
    char why[SF_CUDA_ERR_LEN];
    why[0] = '\0';
    sf_cuda_jpeg *j =
        c->jpeg_maker.make
            ? c->jpeg_maker.make(c->jpeg_maker.ctx, c->cfg.max_batch, c->cfg.jpeg_max_batch_pixels, stages,
                                 JPEG_LANES, why, sizeof why)
            : sf_cuda_jpeg_new(c->cfg.max_batch, c->cfg.jpeg_max_batch_pixels, stages, JPEG_LANES, why, sizeof why);
    cudaGetLastError(); /* an allocation that failed leaves no sticky error */
    if (!j) {
        pthread_mutex_lock(&c->jpeg_mu);
        c->jpeg_not_made++;
        pthread_mutex_unlock(&c->jpeg_mu);
        sf_errf(err, errlen,
                "cuda: the JPEG decoder for %d files of %lld pixels in all (%d staging area(s) of %lld MiB and "
                "nvJPEG's buffers) could not be made: %s; the next encoded batch tries again (lower "
                "jpeg.max_batch_pixels, or post raw pixels)",
                c->cfg.max_batch, (long long)c->cfg.jpeg_max_batch_pixels, stages,
                (long long)(c->cfg.jpeg_max_batch_pixels * 3 >> 20), why[0] ? why : "no reason given");
        return SF_BACKEND_NO_DECODER;
    }
    c->jpeg_stages = stages;
    c->jpeg_next = 0;
    pthread_mutex_lock(&c->jpeg_mu);
    c->jpeg = j;
    pthread_mutex_unlock(&c->jpeg_mu);
    return 0;
}

/* What the JPEG decoder holds now: nothing until the first encoded batch.
 * Any thread: jpeg_mu keeps the decoder from being freed under the reading. */
int cu_decoder_memory(sf_backend *be, sf_decoder_memory *out)
{
    cuda_ctx *c = ctx_of(be);
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&c->jpeg_mu);
    if (c->jpeg) {
        sf_cuda_jpeg_mem m;
        sf_cuda_jpeg_memory(c->jpeg, &m);
        out->made = 1;
        out->device_bytes = m.staging_bytes + m.device_bytes;
        out->pinned_bytes = m.pinned_bytes;
    }
    out->not_made = c->jpeg_not_made;
    pthread_mutex_unlock(&c->jpeg_mu);
    return 0;
}
