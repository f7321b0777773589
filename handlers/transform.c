/* handlers/transform.c — POST /v1/transform: augmentation only; the reply is
 * the augmented batch as safetensors ("images", F32, [N,C,H,W]). Samples
 * whose files did not decode (decode.on_undecodable skip) are rows of zeros,
 * named by the Streamfeed-Skipped-Samples header ("1,3"). */
#include <string.h>

#include "handlers/handlers.h"
#include "server/app.h"
#include "server/jobs.h"
#include "server/upload.h"

static int transform_data(sf_req *r, const uint8_t *data, size_t *len)
{
    return sf_upload_on_data(r, 1, data, len);
}

/* Known from the head: without a backend nothing can transform the body, and
 * a client waiting for 100 Continue is told so before it sends one. */
static int transform_head(sf_req *r)
{
    if (r->app->backend)
        return 0;
    sf_upload_on_rejected(r, "no_backend");
    return sf_reply_error(r, 409, "no_backend", "transform needs a compute backend (pipeline.mode=train)"), -1;
}

const sf_stream_ops h_transform_stream = {transform_data, sf_upload_on_done, sf_upload_max_body,
                                          sf_upload_on_rejected, SF_UPLOAD_MAX_BODY_OPTION, transform_head};

int h_transform(sf_req *r)
{
    sf_upload *u = r->user;
    if (!u || !u->committed) {
        uint64_t id;
        if (sf_upload_commit(r, &id))
            return -1;
        r->wait = SF_WAIT_NONE;
    }
    u = r->user;
    sf_config c;
    sf_config_get(&c);
    for (;;) {
        uint64_t gen = sf_http_gen(r->app->http, SF_WAIT_JOB);
        sf_job job;
        if (sf_jobs_get(r->app->jobs, u->job_id, &job))
            return sf_reply_error(r, 500, "internal", "the transform job disappeared");
        if (job.state == SF_JOB_DONE) {
            /* The output keeps a row per sample; a row left out (its file did
             * not decode) is zeros, and this header lists them by index. */
            if (job.n_undecodable > 0) {
                char list[1024];
                sf_job_undecodable_list(&job, list, sizeof list);
                sf_reply_header(r, "Streamfeed-Skipped-Samples", list);
            }
            return sf_upload_transform_reply(r);
        }
        if (job.state == SF_JOB_FAILED)
            return sf_reply_error(r,
                                  strcmp(job.err_code, "jpeg_undecodable") == 0           ? 422
                                  : strcmp(job.err_code, "jpeg_decoder_unavailable") == 0 ? 503
                                                                                          : 500,
                                  job.err_code, "%s", job.err_msg);
        if (r->wait == SF_WAIT_TIMEOUT || r->wait == SF_WAIT_SHUTDOWN)
            return sf_reply_error(r, 503, "transform_timeout",
                                  "the transform did not finish within %d ms",
                                  c.pipeline.wait_timeout_ms);
        if (sf_http_wait(r, SF_WAIT_JOB, u->job_id, gen, c.pipeline.wait_timeout_ms) == 0)
            return 0;
    }
}
