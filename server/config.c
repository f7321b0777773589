/* server/config.c — the option table and the live configuration. See config.h. */
#include "server/config.h"

#include "gpu/layers.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu/aug.h"
#include "gpu/model.h"
#include "server/lr_schedule.h"
#include "server/netaddr.h"
#include "server/text.h"
#include "server/tls.h"

#define F(field) offsetof(sf_config, field), sizeof(((sf_config *)0)->field)

static int check_model(const sf_config *c, char *err, size_t errlen);
static int check_augment(const sf_config *c, char *err, size_t errlen);
static int check_slots(const sf_config *c, char *err, size_t errlen);
static int check_checkpoint(const sf_config *c, char *err, size_t errlen);
static int check_host(const sf_config *c, char *err, size_t errlen);
static int check_listeners(const sf_config *c, char *err, size_t errlen);
static int check_tls_priorities(const sf_config *c, char *err, size_t errlen);
static int check_schedule(const sf_config *c, char *err, size_t errlen);
static int check_distributed(const sf_config *c, char *err, size_t errlen);
static int check_eval_augment(const sf_config *c, char *err, size_t errlen);

/* Defaults reproduce W1 of docs/WORKLOADS.md. */
#define W1_AUGMENT                                                                              \
    "[{\"op\":\"to_dtype\",\"dtype\":\"float32\",\"scale\":1.0},"                              \
    "{\"op\":\"random_crop\",\"size\":[128,128]},{\"op\":\"resize\",\"size\":[256,256]},"      \
    "{\"op\":\"random_rotation\",\"degrees\":[-45,45]},"                                       \
    "{\"op\":\"gaussian_blur\",\"kernel_size\":7,\"sigma\":[0.1,2.0]},"                        \
    "{\"op\":\"normalize\",\"mean\":[0],\"std\":[1]}]"

/* The eval counterpart of W1_AUGMENT: its crop taken from the centre, no
 * rotation or blur. */
#define W1_EVAL_AUGMENT                                                                         \
    "[{\"op\":\"to_dtype\",\"dtype\":\"float32\",\"scale\":1.0},"                              \
    "{\"op\":\"center_crop\",\"size\":[128,128]},{\"op\":\"resize\",\"size\":[256,256]},"      \
    "{\"op\":\"normalize\",\"mean\":[0],\"std\":[1]}]"

/* tiny: pixels to [0,1], then centred, for train and eval alike. */
#define TINY_AUGMENT                                                                            \
    "[{\"op\":\"to_dtype\",\"dtype\":\"float32\",\"scale\":0.00392156862745098},"              \
    "{\"op\":\"normalize\",\"mean\":[0.5],\"std\":[0.25]}]"

/* resnet18: torchvision's ImageNet recipe (references/classification). The
 * eval resize is to 256x256 (resize takes both sides), not the shorter side. */
#define IMAGENET_NORMALIZE                                                                      \
    "{\"op\":\"normalize\",\"mean\":[0.485,0.456,0.406],\"std\":[0.229,0.224,0.225]}]"
#define RESNET_AUGMENT                                                                          \
    "[{\"op\":\"to_dtype\",\"dtype\":\"float32\",\"scale\":0.00392156862745098},"              \
    "{\"op\":\"random_resized_crop\",\"size\":[224,224]},{\"op\":\"horizontal_flip\",\"p\":0.5}," \
    IMAGENET_NORMALIZE
#define RESNET_EVAL_AUGMENT                                                                     \
    "[{\"op\":\"to_dtype\",\"dtype\":\"float32\",\"scale\":0.00392156862745098},"              \
    "{\"op\":\"resize\",\"size\":[256,256]},{\"op\":\"center_crop\",\"size\":[224,224]},"     \
    IMAGENET_NORMALIZE

/* Each preset's train and eval pipelines (augment.pipeline and
 * augment.eval_pipeline when those are empty). */
static const struct {
    const char *preset, *train, *eval;
} preset_recipes[] = {
    {"seed-classifier", W1_AUGMENT, W1_EVAL_AUGMENT},
    {"seed-encdec", W1_AUGMENT, W1_EVAL_AUGMENT},
    {"resnet18", RESNET_AUGMENT, RESNET_EVAL_AUGMENT},
    {"tiny", TINY_AUGMENT, TINY_AUGMENT},
};

static const char *recipe_of(const sf_config *c, int eval)
{
    if (!c->model.spec[0])
        for (size_t i = 0; i < sizeof preset_recipes / sizeof preset_recipes[0]; i++)
            if (strcmp(c->model.preset, preset_recipes[i].preset) == 0)
                return eval ? preset_recipes[i].eval : preset_recipes[i].train;
    return "[]";
}

const char *sf_config_train_pipeline(const sf_config *c)
{
    return c->augment.pipeline[0] ? c->augment.pipeline : recipe_of(c, 0);
}

const char *sf_config_eval_pipeline(const sf_config *c)
{
    return c->augment.eval_pipeline[0] ? c->augment.eval_pipeline : recipe_of(c, 1);
}

const sf_cfg_option sf_config_table[] = {
    {"http.host", SF_CT_STRING, F(http.host), "127.0.0.1", 0, 0, NULL, 0, check_host,
     "Address to listen on: an IPv4 or IPv6 literal (0.0.0.0, ::, [::1]) or a host name "
     "(localhost), resolved at start. The default serves this machine only; 0.0.0.0 or :: "
     "listens on every address (the container image and the Kubernetes manifests set it)."},
    {"http.port", SF_CT_INT, F(http.port), "8080", 0, 65535, NULL, 0, NULL,
     "TCP port; 0 picks a free one (printed at start)."},
    {"http.threads", SF_CT_INT, F(http.threads), "4", 1, 256, NULL, 0, NULL,
     "HTTP worker threads (libmicrohttpd thread pool; each thread poll()s its share of the "
     "connections)."},
    {"http.max_connections", SF_CT_INT, F(http.max_connections), "256", 1, 65536, NULL, 0, NULL,
     "Concurrent connections accepted; more are refused."},
    {"http.connection_timeout_s", SF_CT_INT, F(http.connection_timeout_s), "60", 1, 3600, NULL, 0,
     NULL, "Idle connection timeout in seconds."},
    {"http.header_timeout_s", SF_CT_INT, F(http.header_timeout_s), "10", 1, 3600, NULL, SF_CF_HOT, NULL,
     "Seconds a request's head (TLS handshake, request line and headers) may take, from the "
     "connection's accept or, on a kept-alive connection, from the first byte of the next request; "
     "and its body (a JSON body, one drained after a refusal, or an upload's until it holds a ring "
     "slot) after its headers. Then the connection is closed (the idle timeout alone lets a client "
     "that sends a byte every few seconds hold a connection forever)."},
    {"http.max_header_bytes", SF_CT_INT, F(http.max_header_bytes), "16384", 1024, 1048576, NULL, 0,
     NULL, "Largest total size of a request's target (path and query) and headers; a larger target gets 414, "
     "a larger total 431."},
    {"http.max_json_bytes", SF_CT_INT64, F(http.max_json_bytes), "1048576", 1024, 67108864, NULL,
     SF_CF_HOT, NULL, "Largest JSON request body; larger gets 413."},
    {"http.max_json_depth", SF_CT_INT, F(http.max_json_depth), "16", 2, 64, NULL, SF_CF_HOT, NULL,
     "Deepest nesting accepted in a JSON request body."},
    {"http.token", SF_CT_STRING, F(http.token), "", 0, 0, NULL, SF_CF_HOT | SF_CF_SENSITIVE | SF_CF_NEEDS_TOKEN,
     NULL,
     "Bearer token required by mutating endpoints; empty disables auth. PATCH can change it only "
     "while one is set (rotation): an open service is closed by a restart."},
    {"http.metrics_port", SF_CT_INT, F(http.metrics_port), "0", 0, 65535, NULL, 0, check_listeners,
     "Second listener (plain HTTP, on http.host) serving only GET /metrics, /healthz and /readyz, "
     "so probes and scrapes answer when http.max_connections are taken and during the shutdown "
     "drain; 0 disables it."},
    {"http.upload_min_bytes_per_s", SF_CT_INT64, F(http.upload_min_bytes_per_s), "65536", 0, 1e12,
     NULL, SF_CF_HOT, NULL,
     "Slowest average rate of an upload that holds a ring slot, counted from the moment it took "
     "the slot after a 5 s allowance; a slower one is closed and its slot freed (408 "
     "upload_too_slow in the log and metrics). 0 disables the check. It also bounds the block an "
     "upload's body is read in (this rate times the lesser of 4 s and half of "
     "http.connection_timeout_s, at most 256 KiB), so an upload at this rate is never held back; "
     "with 0 a body is read segment by segment as it arrives, which costs one fast connection "
     "about a third of its throughput (docs/DESIGN.md section 1)."},
    {"http.upload_deadline_s", SF_CT_INT, F(http.upload_deadline_s), "300", 0, 86400, NULL,
     SF_CF_HOT, NULL,
     "Longest time an upload may hold a ring slot before its body is complete, and a checkpoint PUT "
     "may take for its body after its headers; a later one is closed (and its slot freed: 408 "
     "upload_deadline_exceeded). 0 disables the deadline."},
    {"http.tls_cert", SF_CT_STRING, F(http.tls_cert), "", 0, 0, NULL, 0, check_listeners,
     "PEM certificate chain for HTTPS on http.port (with http.tls_key); empty serves plain HTTP. "
     "Re-read on SIGHUP and when the file changes."},
    {"http.tls_key", SF_CT_STRING, F(http.tls_key), "", 0, 0, NULL, 0, check_listeners,
     "PEM private key of http.tls_cert (unencrypted)."},
    {"http.tls_priorities", SF_CT_STRING, F(http.tls_priorities),
     "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2:-RSA", 0, 0, NULL, 0, check_tls_priorities,
     "GnuTLS priority string of the HTTPS port: the protocol versions, key exchanges and ciphers it "
     "accepts (`gnutls-cli --priority STRING --list` shows what a string allows). The default takes "
     "TLS 1.2 and 1.3 with forward-secret key exchange only: no TLS 1.0 or 1.1, no static RSA."},
    {"ring.slots", SF_CT_INT, F(ring.slots), "8", 2, 4096, NULL, 0, check_slots,
     "Ring slots of pinned host memory (batches buffered between HTTP and the GPU)."},
    {"ring.slot_bytes", SF_CT_INT64, F(ring.slot_bytes), "67108864", 4096, 17179869184.0, NULL, 0,
     NULL, "Bytes per slot: the largest batch data section accepted (a larger body gets 413 "
     "body_too_large naming this option). The default takes a batch of eight phone photos (3-5 MB "
     "each) or W1's 256 raw 224x224 images; the ring holds ring.slots of them in pinned host memory on "
     "CUDA (512 MiB by default), in untouched pages until used on the reference backend."},
    {"ring.full_policy", SF_CT_ENUM, F(ring.full_policy), "block", 0, 0, "block|reject", SF_CF_HOT,
     NULL, "When no slot is free: block (suspend the upload, 503 after the timeout) or reject (429)."},
    {"ring.full_timeout_ms", SF_CT_INT, F(ring.full_timeout_ms), "10000", 0, 600000, NULL,
     SF_CF_HOT, NULL, "How long a suspended upload waits for a free slot before 503."},
    {"ring.retry_after_s", SF_CT_INT, F(ring.retry_after_s), "1", 0, 3600, NULL, SF_CF_HOT, NULL,
     "Retry-After seconds sent with 429/503 when the ring is full."},
    {"pipeline.mode", SF_CT_ENUM, F(pipeline.mode), "train", 0, 0, "train|sink", 0, NULL,
     "train: augment and train each batch; sink: accept and discard (ingest benchmark)."},
    {"pipeline.backend", SF_CT_ENUM, F(pipeline.backend), "auto", 0, 0, "auto|ref|cuda", 0, NULL,
     "Compute backend: auto picks CUDA when a GPU is usable, else the CPU reference."},
    {"pipeline.device", SF_CT_INT, F(pipeline.device), "0", 0, 63, NULL, 0, NULL,
     "CUDA device ordinal."},
    {"pipeline.overlap", SF_CT_BOOL, F(pipeline.overlap), "true", 0, 0, NULL, 0, NULL,
     "Run augmentation on a transform stream overlapped with the step (CUDA)."},
    {"pipeline.cuda_graphs", SF_CT_BOOL, F(pipeline.cuda_graphs), "true", 0, 0, NULL, 0, NULL,
     "Capture the training step as a CUDA graph and replay it (CUDA)."},
    {"pipeline.layout", SF_CT_ENUM, F(pipeline.layout), "auto", 0, 0, "auto|nchw|nhwc", 0, NULL,
     "Activation layout on the GPU (CUDA). auto: NHWC for tf32 and bf16, NCHW for fp32 and for "
     "tf32 models with transposed convolutions (the faster measured on an H100/H200); a model that "
     "flattens a tensor with spatial extent runs NCHW whatever this says. GET /v1/model shows the "
     "layout chosen."},
    {"pipeline.cudnn_tune_configs", SF_CT_INT, F(pipeline.cudnn_tune_configs), "8", 1, 64, NULL, 0,
     NULL,
     "cuDNN engine configurations timed per convolution when its plan is built (CUDA); the "
     "fastest is kept. 1 takes cuDNN's heuristic pick without timing (faster start-up, slower "
     "steps); larger values search longer at start-up and for each new batch size."},
    {"pipeline.jobs_max", SF_CT_INT, F(pipeline.jobs_max), "4096", 64, 1048576, NULL, 0,
     check_slots, "Batch results kept for GET /v1/batches/{id}; the oldest are evicted."},
    {"pipeline.wait_timeout_ms", SF_CT_INT, F(pipeline.wait_timeout_ms), "60000", 0, 3600000, NULL,
     SF_CF_HOT, NULL, "Longest ?wait=1 hold of a reply; then 202 with the current state."},
    {"diagnose.default_seconds", SF_CT_DOUBLE, F(diagnose.default_seconds), "3", 0.1, 600, NULL,
     SF_CF_HOT, NULL,
     "Length of POST /v1/diagnose without \"seconds\" (capped at diagnose.max_seconds): each "
     "cached stage runs a third of it; the live rate is taken over as long before the call."},
    {"diagnose.max_seconds", SF_CT_DOUBLE, F(diagnose.max_seconds), "10", 0.1, 600, NULL,
     SF_CF_HOT, NULL,
     "Longest diagnose a request may ask for (training pauses while it runs); longer gets 400."},
    {"metrics.gpu_sample_ms", SF_CT_INT, F(metrics.gpu_sample_ms), "1000", 0, 3600000, NULL,
     SF_CF_HOT, NULL,
     "Interval of the GPU readings (NVML) behind streamfeed_gpu_*; 0 stops them. Absent "
     "without device telemetry."},
    {"model.preset", SF_CT_ENUM, F(model.preset), "seed-classifier", 0, 0,
     "seed-classifier|seed-encdec|resnet18|tiny", 0, check_model,
     "Model preset (docs/WORKLOADS.md): seed-classifier is W1, seed-encdec W2, resnet18 W3; tiny "
     "(32x32x3 in, 10 classes) trains in milliseconds on the CPU reference backend."},
    {"model.spec", SF_CT_JSON, F(model.spec), "", 0, 0, NULL, 0, check_model,
     "Model as a JSON layer list (overrides model.preset when set)."},
    {"model.precision", SF_CT_ENUM, F(model.precision), "tf32", 0, 0, "fp32|tf32|bf16", 0, NULL,
     "Math precision of convolutions and matmuls."},
    {"model.seed", SF_CT_INT64, F(model.seed), "0", 0, 9007199254740991.0, NULL, 0, NULL,
     "Seed of parameter initialisation."},
    {"model.max_batch", SF_CT_INT, F(model.max_batch), "256", 1, 65536, NULL, 0, NULL,
     "Largest batch N the model is built for (device memory is sized for it)."},
    {"model.freeze", SF_CT_STRING, F(model.freeze), "", 0, 0, NULL, 0, check_model,
     "Layer-name prefix of the leading layers that run without gradients or optimizer state "
     "(W2: encoder); empty trains every layer. They run in eval mode, as a frozen PyTorch module "
     "put in eval(): their batchnorm layers normalise with the running statistics and leave them "
     "as they are. num_batches_tracked is one counter of every batchnorm layer, so a frozen "
     "layer's counts the training batches where PyTorch's stays (only BatchNorm2d(momentum=None) "
     "reads it; streamfeed's batchnorm uses momentum 0.1)."},
    {"model.grad_accum_steps", SF_CT_INT, F(model.grad_accum_steps), "1", 1, 65536, NULL, 0, NULL,
     "Gradient accumulation: the optimizer steps every k batches on the mean of their gradients."},
    {"optim.name", SF_CT_ENUM, F(optim.name), "sgd", 0, 0, "sgd|adamw", 0, NULL,
     "Optimizer: sgd (momentum, weight decay) or adamw (torch.optim.AdamW)."},
    {"optim.lr", SF_CT_DOUBLE, F(optim.lr), "0.001", 0, 10, NULL, SF_CF_HOT, NULL,
     "SGD learning rate."},
    {"optim.momentum", SF_CT_DOUBLE, F(optim.momentum), "0", 0, 1, NULL, SF_CF_HOT, NULL,
     "SGD momentum."},
    {"optim.weight_decay", SF_CT_DOUBLE, F(optim.weight_decay), "0", 0, 1, NULL, SF_CF_HOT, NULL,
     "Weight decay: L2 for SGD, decoupled for AdamW (PyTorch semantics). One default, 0, for both: "
     "torch.optim.AdamW's own default is 0.01, so a port of a script that relies on it sets 0.01 here."},
    {"optim.beta1", SF_CT_DOUBLE, F(optim.beta1), "0.9", 0, 0.999999, NULL, SF_CF_HOT, NULL,
     "AdamW beta1 (first-moment decay)."},
    {"optim.beta2", SF_CT_DOUBLE, F(optim.beta2), "0.999", 0, 0.999999, NULL, SF_CF_HOT, NULL,
     "AdamW beta2 (second-moment decay)."},
    {"optim.eps", SF_CT_DOUBLE, F(optim.eps), "1e-08", 1e-12, 1, NULL, SF_CF_HOT, NULL,
     "AdamW epsilon."},
    {"optim.schedule", SF_CT_ENUM, F(optim.schedule), "constant", 0, 0,
     "constant|step|multistep|cosine|one_cycle", SF_CF_HOT, check_schedule,
     "Learning-rate schedule over optimizer steps, torch.optim.lr_scheduler semantics (closed "
     "forms): constant (optim.lr), step (StepLR), multistep (MultiStepLR), cosine "
     "(CosineAnnealingLR), one_cycle (OneCycleLR with cycle_momentum=False, cos annealing: the "
     "learning rate only, SGD's momentum and AdamW's beta1 stay as set; ignores optim.lr). The "
     "position is the optimizer step count, so it resumes from a checkpoint; a change applies "
     "from the next optimizer step."},
    {"optim.step_size", SF_CT_INT64, F(optim.step_size), "1", 1, 9007199254740991.0, NULL,
     SF_CF_HOT, check_schedule, "step: multiply the lr by optim.gamma every step_size optimizer steps."},
    {"optim.gamma", SF_CT_DOUBLE, F(optim.gamma), "0.1", 0, 1, NULL, SF_CF_HOT, check_schedule,
     "step, multistep: multiplicative decay factor."},
    {"optim.milestones", SF_CT_JSON, F(optim.milestones), "[]", 0, 0, NULL, SF_CF_HOT,
     check_schedule,
     "multistep: JSON list of strictly increasing optimizer steps (at most 64) at which the lr "
     "is multiplied by optim.gamma."},
    {"optim.t_max", SF_CT_INT64, F(optim.t_max), "0", 0, 9007199254740991.0, NULL, SF_CF_HOT,
     check_schedule, "cosine: T_max, the half period in optimizer steps (>= 1 for cosine)."},
    {"optim.eta_min", SF_CT_DOUBLE, F(optim.eta_min), "0", 0, 10, NULL, SF_CF_HOT, check_schedule,
     "cosine: the lowest learning rate."},
    {"optim.max_lr", SF_CT_DOUBLE, F(optim.max_lr), "0.01", 0, 10, NULL, SF_CF_HOT,
     check_schedule, "one_cycle: the peak learning rate."},
    {"optim.total_steps", SF_CT_INT64, F(optim.total_steps), "0", 0, 9007199254740991.0, NULL,
     SF_CF_HOT, check_schedule,
     "one_cycle: length of the cycle in optimizer steps; after it the last lr holds (torch "
     "raises)."},
    {"optim.pct_start", SF_CT_DOUBLE, F(optim.pct_start), "0.3", 0, 1, NULL, SF_CF_HOT,
     check_schedule, "one_cycle: fraction of the cycle spent increasing the lr."},
    {"optim.div_factor", SF_CT_DOUBLE, F(optim.div_factor), "25", 1, 100000, NULL, SF_CF_HOT,
     check_schedule, "one_cycle: the initial lr is max_lr / div_factor."},
    {"optim.final_div_factor", SF_CT_DOUBLE, F(optim.final_div_factor), "10000", 1, 100000, NULL,
     SF_CF_HOT, check_schedule, "one_cycle: the final lr is the initial lr / final_div_factor."},
    {"optim.warmup_steps", SF_CT_INT64, F(optim.warmup_steps), "0", 0, 9007199254740991.0, NULL,
     SF_CF_HOT, check_schedule,
     "Linear warmup in front of the schedule (LinearLR then SequentialLR): over the first "
     "warmup_steps optimizer steps the lr rises from warmup_start_factor * optim.lr to optim.lr, "
     "then the schedule starts at its own step 0. 0: none. Not with one_cycle."},
    {"optim.warmup_start_factor", SF_CT_DOUBLE, F(optim.warmup_start_factor), "0.333333333333333",
     1e-8, 1, NULL, SF_CF_HOT, check_schedule,
     "Factor of optim.lr at the first warmup step (LinearLR start_factor)."},
    {"optim.clip_grad_norm", SF_CT_DOUBLE, F(optim.clip_grad_norm), "0", 0, 10000, NULL, SF_CF_HOT,
     NULL,
     "Gradient clipping, torch.nn.utils.clip_grad_norm_ semantics: the gradients about to be "
     "applied (after accumulation) are scaled by min(1, max_norm / (norm + 1e-6)), norm the L2 "
     "norm over all trainable parameters. 0: off."},
    {"loss.label_smoothing", SF_CT_DOUBLE, F(loss.label_smoothing), "0", 0, 0.999999, NULL,
     SF_CF_HOT, NULL,
     "Cross-entropy label smoothing, torch.nn.CrossEntropyLoss semantics: the target is (1 - s) "
     "* the label's (or mixup/cutmix's) target + s / classes. Applies to eval batches too."},
    {"train.max_nonfinite_in_row", SF_CT_INT, F(train.max_nonfinite_in_row), "10", 1, 1000000, NULL,
     SF_CF_HOT, NULL,
     "Consecutive optimizer steps skipped for a NaN/Inf loss or gradient after which readyz turns "
     "false with the reason \"diverged\"; a checkpoint load or PUT clears it."},
    {"eval.max_names", SF_CT_INT, F(eval.max_names), "16", 1, 256, NULL, 0, NULL,
     "Distinct evaluation names (POST /v1/batches?mode=eval&eval=<name>) kept, with their "
     "metrics; a batch naming one more is refused with 409 too_many_evals."},
    {"eval.logits_keep_s", SF_CT_INT, F(eval.logits_keep_s), "300", 1, 86400, NULL, SF_CF_HOT, NULL,
     "How long the logits of a ?mode=eval&return=logits&wait=1 batch whose wait ran out (a 202) "
     "are kept for GET /v1/batches/{id}/logits, counted from that 202; then 410 logits_expired."},
    {"eval.logits_keep_max", SF_CT_INT, F(eval.logits_keep_max), "64", 1, 4096, NULL, SF_CF_HOT, NULL,
     "Batches whose logits are kept after their wait ran out; one more evicts the oldest "
     "(streamfeed_logits_evicted_total{reason=\"count\"})."},
    {"eval.logits_keep_bytes", SF_CT_INT64, F(eval.logits_keep_bytes), "268435456", 4096,
     68719476736.0, NULL, SF_CF_HOT, NULL,
     "Bytes of kept logits (safetensors replies) in all; more evicts the oldest "
     "(streamfeed_logits_evicted_total{reason=\"bytes\"}). A ?return=logits batch whose logits "
     "alone exceed it is refused with 413 logits_too_large, so that every 202 can keep them."},
    {"augment.pipeline", SF_CT_JSON, F(augment.pipeline), "", 0, 0, NULL, 0, check_augment,
     "Augmentation ops of training batches as a JSON list (gpu/aug.h documents each op); [] "
     "converts uint8 to float only. Empty: the recipe of model.preset (docs/CONFIG.md lists them)."},
    {"augment.eval_pipeline", SF_CT_JSON, F(augment.eval_pipeline), "", 0, 0, NULL, 0,
     check_eval_augment,
     "Augmentation ops of eval batches (?mode=eval): deterministic ops only (to_dtype, resize, "
     "center_crop, normalize, color_convert). Empty: the eval recipe of model.preset."},
    {"augment.seed", SF_CT_INT64, F(augment.seed), "0", 0, 9007199254740991.0, NULL, 0, NULL,
     "Seed of the per-sample augmentation parameters."},
    {"checkpoint.dir", SF_CT_STRING, F(checkpoint.dir), "", 0, 0, NULL, 0, check_checkpoint,
     "Directory of checkpoint files: periodic and final saves, resume, and the only place the "
     "paths of POST /v1/checkpoint/save and /load may name; empty disables file checkpoints."},
    {"checkpoint.every_steps", SF_CT_INT64, F(checkpoint.every_steps), "0", 0, 1e12, NULL,
     SF_CF_HOT, check_checkpoint, "Save a checkpoint to checkpoint.dir every N optimizer steps; 0 disables."},
    {"checkpoint.keep", SF_CT_INT, F(checkpoint.keep), "3", 1, 100000, NULL, SF_CF_HOT, NULL,
     "Checkpoint files (ckpt-<step>.safetensors) kept in checkpoint.dir; older ones are deleted."},
    {"checkpoint.resume", SF_CT_ENUM, F(checkpoint.resume), "false", 0, 0, "false|true|if_compatible", 0,
     check_checkpoint,
     "At start, load the newest valid checkpoint of checkpoint.dir (corrupt files and symbolic links "
     "are skipped). true: a file of another model or optimizer stops the start; if_compatible: it "
     "is skipped with a warning (the next older compatible file, or the initialisation, is used)."},
    {"checkpoint.on_shutdown", SF_CT_BOOL, F(checkpoint.on_shutdown), "true", 0, 0, NULL,
     SF_CF_HOT, NULL, "On SIGTERM, after the drain, save a final checkpoint to checkpoint.dir (if set)."},
    {"checkpoint.max_bytes", SF_CT_INT64, F(checkpoint.max_bytes), "2147483648", 4096,
     1099511627776.0, NULL, SF_CF_HOT, NULL,
     "Largest checkpoint accepted: PUT /v1/checkpoint body, file read, URL download."},
    {"checkpoint.url_timeout_s", SF_CT_INT, F(checkpoint.url_timeout_s), "300", 1, 86400, NULL,
     SF_CF_HOT, NULL, "Time limit of one checkpoint URL transfer (connection included)."},
    {"checkpoint.url_token", SF_CT_STRING, F(checkpoint.url_token), "", 0, 0, NULL,
     SF_CF_HOT | SF_CF_SENSITIVE, NULL,
     "Bearer token sent with checkpoint URL transfers (to the URL's host only, never to a redirect's)."},
    {"checkpoint.url_allow", SF_CT_STRING, F(checkpoint.url_allow), "", 0, 0, NULL,
     SF_CF_HOT | SF_CF_NEEDS_TOKEN, NULL,
     "Where POST /v1/checkpoint/save and /load may send the service (comma-separated): host names, "
     "domains (.example.com), addresses or networks (10.0.0.0/8, ::1) and URL prefixes "
     "(https://h/ckpt/). Empty: any host, and then only with http.token set. Loopback, link-local "
     "(cloud metadata) and multicast addresses are refused unless listed here as addresses. PATCH "
     "can change it only with http.token set, so an unauthenticated client cannot widen it."},
    {"model.init_from", SF_CT_STRING, F(checkpoint.init_from), "", 0, 0, NULL, SF_CF_URL, NULL,
     "Path or http(s) URL of a safetensors state_dict: its tensors initialise the parameters of the "
     "same name and shape (a pre-trained backbone); the others keep their seeded values."},
    {"limits.max_n", SF_CT_INT, F(limits.max_n), "1024", 1, 65536, NULL, SF_CF_HOT, NULL,
     "Largest batch N accepted."},
    {"limits.max_h", SF_CT_INT, F(limits.max_h), "4096", 1, 65536, NULL, SF_CF_HOT, NULL,
     "Largest image height accepted."},
    {"limits.max_w", SF_CT_INT, F(limits.max_w), "4096", 1, 65536, NULL, SF_CF_HOT, NULL,
     "Largest image width accepted."},
    {"limits.max_tensor_header_bytes", SF_CT_INT, F(limits.max_tensor_header_bytes), "65536", 64,
     16777216, NULL, SF_CF_HOT, NULL, "Largest safetensors JSON header accepted."},
    {"jpeg.max_side", SF_CT_INT, F(jpeg.max_side), "8192", 1, 16384, NULL, SF_CF_HOT, NULL,
     "Largest height or width of an encoded sample, JPEG, PNG or WebP (its header is read before any "
     "decode; a larger one is refused with jpeg_side_too_large)."},
    {"jpeg.max_pixels", SF_CT_INT64, F(jpeg.max_pixels), "33554432", 1, 4294836225.0, NULL, SF_CF_HOT,
     NULL, "Most pixels (h*w) of one encoded sample, JPEG, PNG or WebP; more is refused with "
     "jpeg_too_many_pixels "
     "(decompression bombs). The default, 32 Mi pixels, takes 24- and 33-megapixel camera files."},
    {"jpeg.max_batch_pixels", SF_CT_INT64, F(jpeg.max_batch_pixels), "134217728", 0, 4294967296.0, NULL,
     0, NULL,
     "Most decoded pixels (sum of h*w) of one encoded batch (JPEG, PNG, WebP); more is refused with "
     "jpeg_batch_too_large. "
     "The decode buffers are sized once from it, at start: 3 bytes per pixel for the decoded images "
     "on the reference backend (host memory); on CUDA two such areas in device memory (6 bytes per "
     "pixel; one with pipeline.overlap off), so that a batch decodes while the one before is "
     "augmented, and nvJPEG's own buffers for a batch of model.max_batch files of this many pixels "
     "in all (on an H100 with model.max_batch 1024, 64 Mi pixels held about 2.7 GB of device memory). "
     "The default, 128 Mi pixels, takes a batch of ten 12-megapixel phone photos: 384 MiB of host "
     "memory on the reference backend, 768 MiB of staging on CUDA plus nvJPEG's buffers (docs/IMAGES.md). "
     "0 turns JPEG batches off: nothing is allocated for them and every one is refused with "
     "jpeg_batch_too_large; the setting for jobs that post raw tensors."},
    {"jpeg.decoder", SF_CT_ENUM, F(jpeg.decoder), "auto", 0, 0, "auto|hardware|gpu_hybrid|hybrid", 0, NULL,
     "Which nvJPEG backend decodes JPEG batches on CUDA: auto chooses per batch by the measured rule of "
     "docs/DESIGN.md (the hardware engines, or gpu_hybrid for large batches of small files); the others "
     "force one for every batch (a batch it cannot take fails). The reference backend always uses "
     "libjpeg-turbo."},
    {"decode.on_undecodable", SF_CT_ENUM, F(decode.on_undecodable), "skip", 0, 0, "skip|fail", SF_CF_HOT,
     NULL,
     "A JPEG file whose header passed but whose data the decoder refuses (a bogus Huffman table, a "
     "damaged or cut scan, a file past the batch's decode budget): skip leaves the sample out and the "
     "batch trains on the others (loss and accuracy over those; the reply's skipped_samples names "
     "it, streamfeed_samples_undecodable_total counts it; a batch of which no file decodes fails "
     "with jpeg_undecodable); fail fails the whole batch with jpeg_undecodable. PNG and WebP files "
     "are left out the same way, named png_undecodable and webp_undecodable."},
    {"decode.exif_orientation", SF_CT_ENUM, F(decode.exif_orientation), "ignore", 0, 0, "ignore|apply",
     SF_CF_HOT, NULL,
     "What an encoded file's EXIF orientation tag does: ignore decodes the pixels as stored, as "
     "torchvision.io.decode_image and Pillow's Image.open do; apply turns and mirrors the image as "
     "PIL.ImageOps.exif_transpose does (a file of orientation 5 to 8 trains with its height and width "
     "swapped). Read for each batch as its body arrives; on CUDA a turned file decodes on the host."},
    {"log.level", SF_CT_ENUM, F(log.level), "info", 0, 0, "debug|info|warn|error", SF_CF_HOT, NULL,
     "Log level."},
    {"log.format", SF_CT_ENUM, F(log.format), "text", 0, 0, "text|json", SF_CF_HOT, NULL,
     "Log line format."},
    {"log.requests", SF_CT_BOOL, F(log.requests), "true", 0, 0, NULL, SF_CF_HOT, NULL,
     "Log one line per HTTP request (method, path, status, duration_ms, bytes, request_id, "
     "batch_id)."},
    {"log.probes", SF_CT_BOOL, F(log.probes), "false", 0, 0, NULL, SF_CF_HOT, NULL,
     "Also log the requests of probes and scrapers (/healthz, /readyz, /metrics)."},
    {"shutdown.grace_s", SF_CT_INT, F(shutdown.grace_s), "30", 0, 3600, NULL, SF_CF_HOT, NULL,
     "On SIGTERM, the longest drain: uploads in progress finish and are trained with every "
     "accepted batch, new connections are refused; at the end of it the process stops "
     "(docs/OPERATIONS.md)."},
    {"distributed.world_size", SF_CT_INT, F(distributed.world_size), "1", 1, 1024, NULL, 0,
     check_distributed,
     "Ranks of one data-parallel job (one process per GPU): every optimizer step all-reduces the "
     "gradients of all ranks, so they keep one model. 1: a single process, no collective call "
     "(docs/OPERATIONS.md, \"Data-parallel training\")."},
    {"distributed.rank", SF_CT_INT, F(distributed.rank), "-1", -1, 1023, NULL, 0, check_distributed,
     "This process's rank in [0, world_size). -1: the ordinal N of a StatefulSet pod's host name "
     "(name-N); a single process (world_size 1) is rank 0."},
    {"distributed.rendezvous", SF_CT_STRING, F(distributed.rendezvous), "", 0, 0, NULL, 0, check_distributed,
     "host:port of rank 0's HTTP listener, where the other ranks join (its key-value store under "
     "/v1/distributed/kv/); required on ranks other than 0."},
    {"distributed.host", SF_CT_STRING, F(distributed.host), "", 0, 0, NULL, 0, NULL,
     "Address the collective's TCP connections of this rank listen on, published to the other ranks; "
     "empty: this machine's host name (a pod's resolves to its IP)."},
    {"distributed.verify_every", SF_CT_INT, F(distributed.verify_every), "100", 0, 1000000000, NULL,
     SF_CF_HOT, NULL,
     "Every N rounds that trained (optimizer steps; with gradient accumulation, batches) the ranks "
     "compare a digest of their parameters; a mismatch turns /readyz false (\"diverged across ranks\"). "
     "0 disables."},
    {"distributed.wait_ms", SF_CT_INT, F(distributed.wait_ms), "50", 1, 60000, NULL, SF_CF_HOT, check_distributed,
     "A rank with no batch waits this long for one before it joins the other ranks' step with an "
     "empty contribution (zero gradient, zero weight); counted in "
     "streamfeed_distributed_empty_contributions_total. At most half of distributed.timeout_s."},
    {"distributed.join_timeout_s", SF_CT_INT, F(distributed.join_timeout_s), "300", 1, 86400, NULL, 0,
     NULL, "At start, every rank must have joined within this; else the rank stays up with /readyz false "
     "naming the rendezvous address and refuses batches."},
    {"distributed.timeout_s", SF_CT_INT, F(distributed.timeout_s), "600", 1, 86400, NULL, 0, check_distributed,
     "Longest wait in one collective call once joined (a peer that stopped answering); a closed "
     "connection (a peer that died) fails at once. Then /readyz turns false and batches are refused."},
    {"distributed.bucket_mb", SF_CT_INT, F(distributed.bucket_mb), "25", 1, 4096, NULL, 0, NULL,
     "CUDA backend: the gradients are all-reduced (NCCL) in buckets of consecutive layers of at least "
     "this many MiB, each as soon as the backward has produced it, beside the rest of the backward "
     "(PyTorch DDP's bucket_cap_mb, same default). With model.grad_accum_steps > 1 the whole "
     "gradient is reduced once per batch instead."},
    {"distributed.batchnorm", SF_CT_ENUM, F(distributed.batchnorm), "broadcast", 0, 0, "broadcast|local|sync", 0,
     NULL,
     "Batchnorm in a data-parallel job. broadcast: each rank normalises with its own batch's "
     "statistics, and after every round rank 0's running statistics are copied to every rank, so every "
     "rank's checkpoint is rank 0's, buffers included (PyTorch DDP's broadcast_buffers=True). local: "
     "the same normalisation, and each rank keeps the running statistics of its own batches "
     "(broadcast_buffers=False). sync: training normalises with the statistics of all the ranks' "
     "samples of the round and the backward reduces its per-channel sums over the ranks, so the "
     "running statistics are the job's on every rank (torch.nn.SyncBatchNorm); reference backend "
     "only: the CUDA backend refuses it at start."},
    {"distributed.allow_no_token", SF_CT_BOOL, F(distributed.allow_no_token), "false", 0, 0, NULL, 0,
     check_distributed,
     "Lets a data-parallel job (world_size > 1) start without http.token. Without a token any client "
     "that reaches rank 0's port can write the job's rendezvous store and break its join; only for a "
     "network no stranger reaches. Said in a warning at start."},
};
const size_t sf_config_table_len = sizeof sf_config_table / sizeof sf_config_table[0];

/* Mixup and cutmix mix whole-image labels: a segmentation model's labels are
 * per pixel, so the pair is refused whichever of the two keys changes. */
static int check_mix_for_model(const sf_config *c, const sf_model *m, char *err, size_t errlen)
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

static int check_model(const sf_config *c, char *err, size_t errlen)
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

static int check_schedule(const sf_config *c, char *err, size_t errlen)
{
    sf_lr_sched s;
    return sf_lr_sched_from_config(c, &s, err, errlen);
}

/* A job of several ranks needs to know who this process is and where rank 0 is. */
static int check_distributed(const sf_config *c, char *err, size_t errlen)
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

static int check_augment(const sf_config *c, char *err, size_t errlen)
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
static int check_eval_augment(const sf_config *c, char *err, size_t errlen)
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
static int check_slots(const sf_config *c, char *err, size_t errlen)
{
    if (c->pipeline.jobs_max < 2 * c->ring.slots + 64) {
        snprintf(err, errlen, "ring.slots (%d) needs pipeline.jobs_max of at least 2*ring.slots+64 (%d); it is %d",
                 c->ring.slots, 2 * c->ring.slots + 64, c->pipeline.jobs_max);
        return -1;
    }
    return 0;
}

/* Periodic saves and resume work on checkpoint.dir: without one they cannot. */
static int check_checkpoint(const sf_config *c, char *err, size_t errlen)
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
static int check_host(const sf_config *c, char *err, size_t errlen)
{
    struct sockaddr_storage ss;
    socklen_t len;
    return sf_netaddr_resolve(c->http.host, c->http.port, &ss, &len, err, errlen);
}

/* The listeners: a metrics port of its own, and TLS with both files or neither. */
static int check_listeners(const sf_config *c, char *err, size_t errlen)
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

static int check_tls_priorities(const sf_config *c, char *err, size_t errlen)
{
    return sf_tls_priorities_check(c->http.tls_priorities, "http.tls_priorities", err, errlen);
}

const sf_cfg_option *sf_config_find(const char *name)
{
    for (size_t i = 0; i < sf_config_table_len; i++)
        if (strcmp(sf_config_table[i].name, name) == 0)
            return &sf_config_table[i];
    return NULL;
}

static void *field_ptr(sf_config *c, const sf_cfg_option *o) { return (char *)c + o->offset; }
static const void *field_cptr(const sf_config *c, const sf_cfg_option *o)
{
    return (const char *)c + o->offset;
}

static int enum_has(const char *choices, const char *v)
{
    size_t n = strlen(v);
    for (const char *p = choices; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncmp(p, v, n) == 0)
            return 1;
        if (!bar)
            break;
        p = bar + 1;
    }
    return 0;
}

/* A bound or value as people write it: integer options as integers (an int64
 * bound of 2^34 prints as 17179869184, not 1.71799e+10), numbers as %g. */
static const char *fmt_num(const sf_cfg_option *o, double v, char *buf, size_t cap)
{
    if (o->type != SF_CT_DOUBLE && v == floor(v) && fabs(v) < 1e18)
        snprintf(buf, cap, "%lld", (long long)v);
    else
        snprintf(buf, cap, "%g", v);
    return buf;
}

static int set_number(sf_config *c, const sf_cfg_option *o, double v, char *err, size_t errlen)
{
    if (!isfinite(v) || v < o->min || v > o->max) {
        char a[32], b[32], d[32];
        snprintf(err, errlen, "%s: %s is out of range [%s, %s]", o->name, fmt_num(o, v, a, sizeof a),
                 fmt_num(o, o->min, b, sizeof b), fmt_num(o, o->max, d, sizeof d));
        return -1;
    }
    switch (o->type) {
    case SF_CT_INT:
        if (v != floor(v)) {
            snprintf(err, errlen, "%s: expected an integer, got %g", o->name, v);
            return -1;
        }
        *(int *)field_ptr(c, o) = (int)v;
        return 0;
    case SF_CT_INT64:
        if (v != floor(v)) {
            snprintf(err, errlen, "%s: expected an integer, got %g", o->name, v);
            return -1;
        }
        *(int64_t *)field_ptr(c, o) = (int64_t)v;
        return 0;
    case SF_CT_DOUBLE:
        *(double *)field_ptr(c, o) = v;
        return 0;
    default:
        snprintf(err, errlen, "%s: not a number option", o->name);
        return -1;
    }
}

/* An option that was a boolean and grew a third value (checkpoint.resume:
 * false|true|if_compatible) keeps every spelling it accepted as a boolean. */
static int widened_bool(const sf_cfg_option *o)
{
    return o->type == SF_CT_ENUM && enum_has(o->choices, "true") && enum_has(o->choices, "false");
}

static int set_string(sf_config *c, const sf_cfg_option *o, const char *v, char *err, size_t errlen)
{
    if (widened_bool(o)) {
        if (!strcmp(v, "1") || !strcmp(v, "yes"))
            v = "true";
        else if (!strcmp(v, "0") || !strcmp(v, "no"))
            v = "false";
    }
    size_t n = strlen(v);
    if (n >= o->size) {
        snprintf(err, errlen, "%s: value is %zu bytes, at most %zu allowed", o->name, n, o->size - 1);
        return -1;
    }
    /* Values are echoed by GET /v1/config, the logs and the metrics' labels:
     * ill-formed UTF-8 would make each of them invalid for every reader. */
    if (!sf_text_ok(v)) {
        snprintf(err, errlen, "%s: the value is not UTF-8 text (or holds control characters)", o->name);
        return -1;
    }
    if (o->type == SF_CT_ENUM && !enum_has(o->choices, v)) {
        snprintf(err, errlen, "%s: \"%.64s\" is not one of %s", o->name, v, o->choices);
        return -1;
    }
    memcpy(field_ptr(c, o), v, n + 1);
    return 0;
}

/* Edit distance (insertions, deletions, substitutions) of two short names. */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 127 || lb > 127)
        return (size_t)-1;
    size_t row[128];
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

const sf_cfg_option *sf_config_suggest(const char *name)
{
    const sf_cfg_option *best = NULL;
    size_t best_d = (size_t)-1;
    for (size_t i = 0; i < sf_config_table_len; i++) {
        const sf_cfg_option *o = &sf_config_table[i];
        /* "port" for "http.port": the option without its section. */
        if (strcmp(strchr(o->name, '.') + 1, name) == 0)
            return o;
        size_t d = edit_distance(name, o->name);
        if (d < best_d) {
            best_d = d;
            best = o;
        }
    }
    /* A third of the name may be wrong (typos, a wrong section), no more:
     * beyond that the suggestion is a guess. */
    size_t limit = strlen(name) / 3 > 2 ? strlen(name) / 3 : 2;
    return best_d <= limit ? best : NULL;
}

static void unknown_option(const char *name, char *err, size_t errlen)
{
    const sf_cfg_option *s = sf_config_suggest(name);
    if (s)
        snprintf(err, errlen, "unknown option \"%s\" (did you mean \"%s\"?)", name, s->name);
    else
        snprintf(err, errlen, "unknown option \"%s\" (--help lists them)", name);
}

int sf_config_set_text(sf_config *c, const char *name, const char *value, char *err, size_t errlen)
{
    const sf_cfg_option *o = sf_config_find(name);
    if (!o) {
        unknown_option(name, err, errlen);
        return -1;
    }
    switch (o->type) {
    case SF_CT_INT:
    case SF_CT_INT64:
    case SF_CT_DOUBLE: {
        char *end;
        errno = 0;
        double v = strtod(value, &end);
        if (errno || end == value || *end) {
            snprintf(err, errlen, "%s: \"%.64s\" is not a number", name, value);
            return -1;
        }
        return set_number(c, o, v, err, errlen);
    }
    case SF_CT_BOOL:
        if (!strcmp(value, "true") || !strcmp(value, "1") || !strcmp(value, "yes"))
            *(int *)field_ptr(c, o) = 1;
        else if (!strcmp(value, "false") || !strcmp(value, "0") || !strcmp(value, "no"))
            *(int *)field_ptr(c, o) = 0;
        else {
            snprintf(err, errlen, "%s: \"%.64s\" is not a boolean (true/false)", name, value);
            return -1;
        }
        return 0;
    case SF_CT_JSON: {
        if (!value[0])
            return set_string(c, o, value, err, errlen);
        /* Stored in cJSON's canonical rendering, so the same value always
         * compares equal however it was written (1.0 vs 1, spacing). */
        const char *why = NULL;
        cJSON *j = sf_json_parse_whole(value, strlen(value), &why);
        if (!j) {
            snprintf(err, errlen, "%s: %s", name, why);
            return -1;
        }
        char *canon = cJSON_PrintUnformatted(j);
        cJSON_Delete(j);
        if (!canon) {
            snprintf(err, errlen, "%s: out of memory", name);
            return -1;
        }
        int rc = set_string(c, o, canon, err, errlen);
        cJSON_free(canon);
        return rc;
    }
    case SF_CT_STRING:
    case SF_CT_ENUM:
        return set_string(c, o, value, err, errlen);
    }
    return -1;
}

void sf_config_defaults(sf_config *c)
{
    memset(c, 0, sizeof *c);
    char err[256];
    for (size_t i = 0; i < sf_config_table_len; i++) {
        if (sf_config_set_text(c, sf_config_table[i].name, sf_config_table[i].def, err, sizeof err)) {
            /* A default that does not parse is a bug in the table itself. */
            fprintf(stderr, "config table: %s\n", err);
            abort();
        }
    }
}

/* Sets one option from a JSON value (file and PATCH syntax). */
static int set_json(sf_config *c, const sf_cfg_option *o, const cJSON *v, char *err, size_t errlen)
{
    if (cJSON_IsNull(v))
        return sf_config_set_text(c, o->name, o->def, err, errlen);
    switch (o->type) {
    case SF_CT_INT:
    case SF_CT_INT64:
    case SF_CT_DOUBLE:
        if (!cJSON_IsNumber(v)) {
            snprintf(err, errlen, "%s: expected a number", o->name);
            return -1;
        }
        return set_number(c, o, v->valuedouble, err, errlen);
    case SF_CT_BOOL:
        if (!cJSON_IsBool(v)) {
            snprintf(err, errlen, "%s: expected true or false", o->name);
            return -1;
        }
        *(int *)field_ptr(c, o) = cJSON_IsTrue(v);
        return 0;
    case SF_CT_STRING:
    case SF_CT_ENUM:
        if (widened_bool(o) && cJSON_IsBool(v))
            return set_string(c, o, cJSON_IsTrue(v) ? "true" : "false", err, errlen);
        if (!cJSON_IsString(v)) {
            snprintf(err, errlen, "%s: expected a string", o->name);
            return -1;
        }
        /* GET shows a set secret as "***", and a URL without its
         * credentials: sending that back keeps the value. */
        if ((o->flags & SF_CF_SENSITIVE) && strcmp(v->valuestring, "***") == 0)
            return 0;
        if (o->flags & SF_CF_URL) {
            char shown[512];
            sf_url_redact((const char *)field_cptr(c, o), shown, sizeof shown);
            if (strcmp(v->valuestring, shown) == 0)
                return 0;
        }
        return set_string(c, o, v->valuestring, err, errlen);
    case SF_CT_JSON: {
        /* A JSON option takes a JSON value or a string holding JSON. */
        if (cJSON_IsString(v))
            return sf_config_set_text(c, o->name, v->valuestring, err, errlen);
        char *txt = cJSON_PrintUnformatted(v);
        if (!txt) {
            snprintf(err, errlen, "%s: out of memory", o->name);
            return -1;
        }
        int rc = sf_config_set_text(c, o->name, txt, err, errlen);
        cJSON_free(txt);
        return rc;
    }
    }
    return -1;
}

/* 1 when some option is named "sec.<name>". */
static int section_known(const char *sec)
{
    const size_t n = strlen(sec);
    for (size_t i = 0; i < sf_config_table_len; i++)
        if (strncmp(sf_config_table[i].name, sec, n) == 0 && sf_config_table[i].name[n] == '.')
            return 1;
    return 0;
}

int sf_config_apply_json(sf_config *c, const cJSON *obj, char *err, size_t errlen, char *field,
                         size_t fieldlen)
{
    if (field && fieldlen)
        field[0] = '\0';
    if (!cJSON_IsObject(obj)) {
        snprintf(err, errlen, "configuration must be a JSON object of sections");
        return -1;
    }
    for (const cJSON *sec = obj->child; sec; sec = sec->next) {
        if (!cJSON_IsObject(sec)) {
            if (field)
                snprintf(field, fieldlen, "%s", sec->string);
            snprintf(err, errlen, "%s: expected an object of options (e.g. {\"%s\":{...}})",
                     sec->string, sec->string);
            return -1;
        }
        if (!sec->child && !section_known(sec->string)) {
            /* An empty unknown section is a typo, not a no-op (a key in one
             * is refused below, naming the option). */
            if (field)
                snprintf(field, fieldlen, "%s", sec->string);
            snprintf(err, errlen, "unknown section \"%.64s\" (GET /v1/config lists them)", sec->string);
            return -1;
        }
        for (const cJSON *kv = sec->child; kv; kv = kv->next) {
            char name[128];
            snprintf(name, sizeof name, "%s.%s", sec->string, kv->string);
            if (field)
                snprintf(field, fieldlen, "%s", name);
            const sf_cfg_option *o = sf_config_find(name);
            if (!o) {
                unknown_option(name, err, errlen);
                return -1;
            }
            if (set_json(c, o, kv, err, errlen))
                return -1;
        }
    }
    if (field && fieldlen)
        field[0] = '\0';
    return 0;
}

static int field_equal(const sf_config *a, const sf_config *b, const sf_cfg_option *o);

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
        const int set = base && !field_equal(c, base, o);
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
static int validate_change(const sf_config *c, const sf_config *base, char *err, size_t errlen, char *field,
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
    return validate_change(c, NULL, err, errlen, field, fieldlen);
}

static void env_name(const char *opt, char *out, size_t cap)
{
    size_t o = (size_t)snprintf(out, cap, "STREAMFEED_");
    for (const char *p = opt; *p && o + 1 < cap; p++)
        out[o++] = (*p == '.') ? '_' : (char)toupper((unsigned char)*p);
    out[o] = '\0';
}

static int load_file(sf_config *c, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "--config %s: %s", path, strerror(errno));
        return -1;
    }
    /* A config file is small; bound it so a wrong path (a device, a dataset) fails fast. */
    enum { MAX = 1 << 20 };
    char *buf = malloc(MAX + 1);
    size_t n = buf ? fread(buf, 1, MAX + 1, f) : 0;
    fclose(f);
    if (!buf || n > MAX) {
        free(buf);
        snprintf(err, errlen, "--config %s: missing or larger than 1 MiB", path);
        return -1;
    }
    buf[n] = '\0';
    const char *why = NULL;
    cJSON *j = sf_json_parse_whole(buf, n, &why);
    free(buf);
    if (!j) {
        snprintf(err, errlen, "--config %s: %s", path, why);
        return -1;
    }
    char e2[512], fld[128];
    int rc = sf_config_apply_json(c, j, e2, sizeof e2, fld, sizeof fld);
    cJSON_Delete(j);
    if (rc)
        snprintf(err, errlen, "--config %s: %s", path, e2);
    return rc;
}

/* distributed.rank -1: a StatefulSet names its pods <name>-<ordinal> and the
 * pod's host name is its name, so the ordinal is the rank. Read here, once,
 * so the rest of the service sees a plain number. */
static void derive_rank(sf_config *c)
{
    /* One process: no rank to derive (the service answers rank 0 then). */
    if (c->distributed.rank >= 0 || c->distributed.world_size <= 1)
        return;
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0)
        return;
    const char *dash = strrchr(host, '-');
    if (!dash || !dash[1])
        return;
    char *end;
    long n = strtol(dash + 1, &end, 10);
    if (*end == '\0' && n >= 0 && n < 1024)
        c->distributed.rank = (int)n;
}

/* STREAMFEED_* names that are not options but are read elsewhere: the config
 * file's path (below) and streamfeed-load's bearer token. */
static const char *const env_not_options[] = {"STREAMFEED_CONFIG", "STREAMFEED_TOKEN"};

/* What sf_config_load found in the environment that names no option. A
 * mistyped variable would otherwise be ignored in silence (a flag is refused,
 * but the environment is shared with other programs, so it is only warned
 * about). Bounded: the first ENV_WARN_MAX. */
enum { ENV_WARN_MAX = 16 };
static char env_warnings[ENV_WARN_MAX][384];
static int n_env_warnings;

/* The option whose variable is nearest to `var` (STREAMFEED_RING_SLOT ->
 * ring.slots, STREAMFEED_PORT -> http.port), or NULL when none is close:
 * sf_config_suggest's rule, on the variables' spelling. */
static const sf_cfg_option *suggest_env(const char *var)
{
    const char *given = var + strlen("STREAMFEED_");
    const sf_cfg_option *best = NULL;
    size_t best_d = (size_t)-1;
    for (size_t i = 0; i < sf_config_table_len; i++) {
        const sf_cfg_option *o = &sf_config_table[i];
        char name[128];
        env_name(o->name, name, sizeof name);
        const char *key = name + strlen("STREAMFEED_") + (size_t)(strchr(o->name, '.') - o->name) + 1;
        if (strcmp(key, given) == 0)
            return o;
        size_t d = edit_distance(given, name + strlen("STREAMFEED_"));
        if (d < best_d) {
            best_d = d;
            best = o;
        }
    }
    size_t limit = strlen(given) / 3 > 2 ? strlen(given) / 3 : 2;
    return best_d <= limit ? best : NULL;
}

static void find_unknown_env(void)
{
    extern char **environ;
    n_env_warnings = 0;
    for (char **e = environ; e && *e && n_env_warnings < ENV_WARN_MAX; e++) {
        if (strncmp(*e, "STREAMFEED_", 11) != 0)
            continue;
        char var[128];
        size_t n = strcspn(*e, "=");
        if (n >= sizeof var)
            n = sizeof var - 1;
        memcpy(var, *e, n);
        var[n] = '\0';
        int known = 0;
        for (size_t i = 0; i < sizeof env_not_options / sizeof env_not_options[0]; i++)
            known |= strcmp(var, env_not_options[i]) == 0;
        for (size_t i = 0; i < sf_config_table_len && !known; i++) {
            char name[128];
            env_name(sf_config_table[i].name, name, sizeof name);
            known = strcmp(var, name) == 0;
        }
        if (known)
            continue;
        const sf_cfg_option *s = suggest_env(var);
        char meant[160] = "";
        if (s) {
            char name[128];
            env_name(s->name, name, sizeof name);
            snprintf(meant, sizeof meant, "did you mean %s (%s)?", name, s->name);
        }
        snprintf(env_warnings[n_env_warnings++], sizeof env_warnings[0],
                 "environment %s is not an option and is ignored (%s)", var,
                 s ? meant : "streamfeed --help lists the options; each is STREAMFEED_SECTION_OPTION");
    }
}

int sf_config_env_warnings(const char *out[], int max)
{
    int n = n_env_warnings < max ? n_env_warnings : max;
    for (int i = 0; i < n; i++)
        out[i] = env_warnings[i];
    return n;
}

int sf_config_load(sf_config *c, int argc, char **argv, char *err, size_t errlen)
{
    sf_config_defaults(c);
    const char *path = getenv("STREAMFEED_CONFIG");
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            sf_config_print_help(argv[0]);
            return 1;
        }
        if (!strcmp(argv[i], "--help-markdown")) {
            sf_config_print_markdown();
            return 1;
        }
        if (!strcmp(argv[i], "--help-layers")) {
            sf_layer_kinds_markdown(stdout);
            return 1;
        }
        if (!strcmp(argv[i], "--help-openapi")) {
            sf_config_print_openapi();
            return 1;
        }
        if (!strcmp(argv[i], "--config") && i + 1 < argc)
            path = argv[i + 1];
        else if (!strncmp(argv[i], "--config=", 9))
            path = argv[i] + 9;
    }
    if (path && path[0] && load_file(c, path, err, errlen))
        return -1;
    find_unknown_env();
    for (size_t i = 0; i < sf_config_table_len; i++) {
        char name[128];
        env_name(sf_config_table[i].name, name, sizeof name);
        const char *v = getenv(name);
        if (v && sf_config_set_text(c, sf_config_table[i].name, v, err, errlen)) {
            char tmp[512];
            snprintf(tmp, sizeof tmp, "environment %s: %s", name, err);
            snprintf(err, errlen, "%s", tmp);
            return -1;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0) {
            snprintf(err, errlen, "unexpected argument \"%s\" (see --help)", a);
            return -1;
        }
        a += 2;
        char name[128];
        const char *val;
        const char *eq = strchr(a, '=');
        if (eq) {
            snprintf(name, sizeof name, "%.*s", (int)(eq - a), a);
            val = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", a);
            /* "--ring.slots --http.port 0": the next word is an option, so
             * the value is missing (no option value starts with "--"). */
            if (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0) {
                if (!strcmp(name, "config") || sf_config_find(name))
                    snprintf(err, errlen, "--%s needs a value%s%s", name,
                             i + 1 < argc ? ", got the option " : "", i + 1 < argc ? argv[i + 1] : "");
                else
                    unknown_option(name, err, errlen);
                return -1;
            }
            val = argv[++i];
        }
        if (!strcmp(name, "config"))
            continue;
        if (sf_config_set_text(c, name, val, err, errlen))
            return -1;
    }
    derive_rank(c);
    char fld[128];
    return sf_config_validate(c, err, errlen, fld, sizeof fld);
}

/* cJSON prints a number with 15 significant digits whenever that reads back
 * within one ulp (its equality test is approximate), so a seed of 16 digits
 * or a double like 0.9111111111111111 would come back changed from a GET
 * patched back. These are written as the shortest text that reads back to
 * exactly the same value instead. */
static void add_exact_number(cJSON *s, const char *key, double v, int64_t i, int is_int)
{
    char buf[40];
    if (is_int) {
        snprintf(buf, sizeof buf, "%lld", (long long)i);
    } else {
        for (int prec = 15; prec <= 17; prec++) {
            snprintf(buf, sizeof buf, "%.*g", prec, v);
            if (strtod(buf, NULL) == v)
                break;
        }
    }
    cJSON_AddRawToObject(s, key, buf);
}

cJSON *sf_config_to_json(const sf_config *c)
{
    cJSON *root = cJSON_CreateObject();
    for (size_t i = 0; i < sf_config_table_len; i++) {
        const sf_cfg_option *o = &sf_config_table[i];
        const char *dot = strchr(o->name, '.');
        char sec[64];
        snprintf(sec, sizeof sec, "%.*s", (int)(dot - o->name), o->name);
        cJSON *s = cJSON_GetObjectItemCaseSensitive(root, sec);
        if (!s)
            s = cJSON_AddObjectToObject(root, sec);
        const void *p = field_cptr(c, o);
        const char *key = dot + 1;
        switch (o->type) {
        case SF_CT_INT:
            cJSON_AddNumberToObject(s, key, *(const int *)p);
            break;
        case SF_CT_INT64:
            add_exact_number(s, key, 0, *(const int64_t *)p, 1);
            break;
        case SF_CT_DOUBLE:
            add_exact_number(s, key, *(const double *)p, 0, 0);
            break;
        case SF_CT_BOOL:
            cJSON_AddBoolToObject(s, key, *(const int *)p);
            break;
        case SF_CT_STRING:
        case SF_CT_ENUM:
            if ((o->flags & SF_CF_SENSITIVE) && ((const char *)p)[0]) {
                cJSON_AddStringToObject(s, key, "***");
            } else if (o->flags & SF_CF_URL) {
                char shown[512];
                sf_url_redact((const char *)p, shown, sizeof shown);
                cJSON_AddStringToObject(s, key, shown);
            } else {
                cJSON_AddStringToObject(s, key, (const char *)p);
            }
            break;
        case SF_CT_JSON: {
            cJSON *v = ((const char *)p)[0] ? cJSON_Parse((const char *)p) : NULL;
            cJSON_AddItemToObject(s, key, v ? v : cJSON_CreateNull());
            break;
        }
        }
    }
    return root;
}

/* The preset whose recipe recipe_of gives, or NULL (a model.spec model, or a preset without one). */
static const char *recipe_preset(const sf_config *c)
{
    if (c->model.spec[0])
        return NULL;
    for (size_t i = 0; i < sizeof preset_recipes / sizeof preset_recipes[0]; i++)
        if (strcmp(c->model.preset, preset_recipes[i].preset) == 0)
            return preset_recipes[i].preset;
    return NULL;
}

cJSON *sf_config_view_json(const sf_config *c, cJSON **from_preset)
{
    cJSON *root = sf_config_to_json(c);
    cJSON *from = cJSON_CreateObject();
    const char *preset = recipe_preset(c);
    cJSON *aug = cJSON_GetObjectItemCaseSensitive(root, "augment");
    const struct {
        const char *key, *name, *stored;
        int eval;
    } pipes[] = {
        {"pipeline", "augment.pipeline", c->augment.pipeline, 0},
        {"eval_pipeline", "augment.eval_pipeline", c->augment.eval_pipeline, 1},
    };
    for (size_t i = 0; preset && aug && i < sizeof pipes / sizeof pipes[0]; i++) {
        cJSON *recipe = pipes[i].stored[0] ? NULL : cJSON_Parse(recipe_of(c, pipes[i].eval));
        if (recipe) {
            cJSON_ReplaceItemInObjectCaseSensitive(aug, pipes[i].key, recipe);
            cJSON_AddStringToObject(from, pipes[i].name, preset);
        }
    }
    *from_preset = from;
    return root;
}

/* A patch that sets an empty pipeline to the recipe it already runs (a GET
 * view patched back) leaves it empty, so that it still follows model.preset
 * and the patch changes nothing. */
static void keep_preset_recipes(sf_config *next, const sf_config *was)
{
    if (!recipe_preset(was) || strcmp(next->model.preset, was->model.preset) != 0 ||
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
        cJSON *a = cJSON_Parse(pipes[i].now), *b = cJSON_Parse(recipe_of(was, pipes[i].eval));
        if (a && b && cJSON_Compare(a, b, 1))
            pipes[i].now[0] = '\0';
        cJSON_Delete(a);
        cJSON_Delete(b);
    }
}

static const char *type_name(sf_cfg_type t)
{
    static const char *const n[] = {"int", "int", "number", "bool", "string", "enum", "json"};
    return n[t];
}

void sf_config_print_help(const char *prog)
{
    printf("usage: %s [--config FILE] [--SECTION.OPTION VALUE ...]\n"
           "       %s --version | --help | --help-markdown | --help-layers\n\n"
           "Every option can also be set in the JSON config file ({\"section\":{\"option\":v}})\n"
           "and in the environment (STREAMFEED_SECTION_OPTION). Precedence:\n"
           "defaults < file < environment < flags. [hot] options can change at run time\n"
           "through PATCH /v1/config; [hot with http.token] ones only on a service started\n"
           "with a token; the others need a restart.\n\n",
           prog, prog);
    for (size_t i = 0; i < sf_config_table_len; i++) {
        const sf_cfg_option *o = &sf_config_table[i];
        char env[128];
        env_name(o->name, env, sizeof env);
        printf("  --%-30s %s%s\n", o->name, o->help,
               !(o->flags & SF_CF_HOT)              ? ""
               : (o->flags & SF_CF_NEEDS_TOKEN) ? " [hot with http.token]"
                                                : " [hot]");
        if (o->type == SF_CT_ENUM)
            printf("      %-30s one of %s; default %s; env %s\n", "", o->choices, o->def, env);
        else if (o->type == SF_CT_JSON)
            printf("      %-30s JSON; env %s\n", "", env);
        else if (o->type <= SF_CT_DOUBLE) {
            char lo[32], hi[32];
            printf("      %-30s %s in [%s, %s]; default %s; env %s\n", "", type_name(o->type),
                   fmt_num(o, o->min, lo, sizeof lo), fmt_num(o, o->max, hi, sizeof hi), o->def, env);
        }
        else
            printf("      %-30s %s; default \"%s\"; env %s\n", "", type_name(o->type),
                   (o->flags & SF_CF_SENSITIVE) ? "" : o->def, env);
    }
}

/* Prints s as the text of a Markdown table cell: "|" would end the cell. */
static void md_cell(const char *s)
{
    for (; *s; s++) {
        if (*s == '|')
            fputs("\\|", stdout);
        else
            putchar(*s);
    }
}

void sf_config_print_markdown(void)
{
    printf("<!-- Generated by `streamfeed --help-markdown` from the option table in "
           "server/config.c; do not edit. -->\n\n"
           "| option | env | type | default | range / choices | hot | meaning |\n"
           "| --- | --- | --- | --- | --- | --- | --- |\n");
    for (size_t i = 0; i < sf_config_table_len; i++) {
        const sf_cfg_option *o = &sf_config_table[i];
        char env[128], range[96] = "";
        env_name(o->name, env, sizeof env);
        if (o->type == SF_CT_ENUM)
            snprintf(range, sizeof range, "%s", o->choices);
        else if (o->type <= SF_CT_DOUBLE) {
            char lo[32], hi[32];
            snprintf(range, sizeof range, "%s … %s", fmt_num(o, o->min, lo, sizeof lo),
                     fmt_num(o, o->max, hi, sizeof hi));
        }
        const char *def = o->type == SF_CT_JSON && strlen(o->def) > 24 ? "(see --help)" : o->def;
        printf("| `%s` | `%s` | %s | `", o->name, env, type_name(o->type));
        md_cell(def);
        printf("` | ");
        md_cell(range);
        printf(" | %s | ", !(o->flags & SF_CF_HOT)              ? "restart"
                           : (o->flags & SF_CF_NEEDS_TOKEN) ? "with http.token"
                                                            : "yes");
        md_cell(o->help);
        printf(" |\n");
    }
    printf("\n## Preset recipes\n\n"
           "The augmentation of a preset when augment.pipeline / augment.eval_pipeline are empty "
           "(a model.spec model: `[]` for both).\n\n");
    for (size_t i = 0; i < sizeof preset_recipes / sizeof preset_recipes[0]; i++)
        printf("- `%s`\n  - train: `%s`\n  - eval: `%s`\n", preset_recipes[i].preset, preset_recipes[i].train,
               preset_recipes[i].eval);
}

/* One option's JSON schema as YAML flow mapping. Patch schemas also take
 * null (reset to the default). A JSON option takes any JSON value. */
static void print_option_schema(const sf_cfg_option *o, int patch)
{
    const char *null_t = patch ? ", \"null\"" : "";
    switch (o->type) {
    case SF_CT_INT:
    case SF_CT_INT64:
        printf("{type: [integer%s], minimum: %.17g, maximum: %.17g}", null_t, o->min, o->max);
        break;
    case SF_CT_DOUBLE:
        printf("{type: [number%s], minimum: %.17g, maximum: %.17g}", null_t, o->min, o->max);
        break;
    case SF_CT_BOOL:
        printf("{type: [boolean%s]}", null_t);
        break;
    case SF_CT_STRING:
        printf("{type: [string%s], maxLength: %zu}", null_t, o->size - 1);
        break;
    case SF_CT_ENUM: {
        printf("{enum: [");
        const char *p = o->choices;
        int first = 1;
        while (*p) {
            size_t n = strcspn(p, "|");
            printf("%s\"%.*s\"", first ? "" : ", ", (int)n, p);
            first = 0;
            p += n;
            if (*p == '|')
                p++;
        }
        printf("%s]}", patch ? ", null" : "");
        break;
    }
    case SF_CT_JSON:
        printf("{description: \"JSON (or a string holding JSON)\"}");
        break;
    }
}

void sf_config_print_openapi(void)
{
    printf("    # Generated by `streamfeed --help-openapi` from the option table in server/config.c\n"
           "    # (make docs); tests check it is current. Do not edit by hand.\n");
    for (int patch = 0; patch < 2; patch++) {
        printf("    %s:\n      type: object\n", patch ? "ConfigPatch" : "Config");
        printf("      description: \"%s\"\n",
               patch ? "A JSON merge patch of the configuration (only the options to change); "
                       "null resets an option to its default."
                     : "The effective configuration, by section, then by option.");
        printf("      additionalProperties: false\n      properties:\n");
        /* Sections in order of first appearance; a section's options may be
         * spread over the table (rows are grouped by feature). */
        for (size_t i = 0; i < sf_config_table_len; i++) {
            const char *name = sf_config_table[i].name;
            size_t slen = (size_t)(strchr(name, '.') - name);
            int seen = 0;
            for (size_t k = 0; k < i && !seen; k++)
                seen = strncmp(sf_config_table[k].name, name, slen + 1) == 0;
            if (seen)
                continue;
            printf("        %.*s:\n          type: object\n          additionalProperties: false\n",
                   (int)slen, name);
            if (!patch) {
                printf("          required: [");
                int first = 1;
                for (size_t j = i; j < sf_config_table_len; j++)
                    if (strncmp(sf_config_table[j].name, name, slen + 1) == 0) {
                        printf("%s%s", first ? "" : ", ", sf_config_table[j].name + slen + 1);
                        first = 0;
                    }
                printf("]\n");
            }
            printf("          properties:\n");
            for (size_t j = i; j < sf_config_table_len; j++) {
                const sf_cfg_option *o = &sf_config_table[j];
                if (strncmp(o->name, name, slen + 1) != 0)
                    continue;
                printf("            %s: ", o->name + slen + 1);
                /* GET masks a set secret as "***", beyond the enum/length rules. */
                if (!patch && (o->flags & SF_CF_SENSITIVE))
                    printf("{type: string}");
                else
                    print_option_schema(o, patch);
                printf("\n");
            }
        }
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
            if (!o || !(o->flags & SF_CF_NEEDS_TOKEN))
                continue;
            if (!next && !(next = malloc(sizeof *next))) {
                found = o; /* cannot tell that it is unchanged */
                break;
            }
            *next = *cur;
            if (set_json(next, o, kv, err, sizeof err) != 0 || !field_equal(next, cur, o))
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

static int field_equal(const sf_config *a, const sf_config *b, const sf_cfg_option *o)
{
    if (o->type == SF_CT_STRING || o->type == SF_CT_ENUM || o->type == SF_CT_JSON)
        return strcmp((const char *)field_cptr(a, o), (const char *)field_cptr(b, o)) == 0;
    return memcmp(field_cptr(a, o), field_cptr(b, o), o->size) == 0;
}

static cJSON *pending_locked(void)
{
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; i < sf_config_table_len; i++)
        if (!field_equal(&live, &wanted, &sf_config_table[i]))
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
        rc = validate_change(next, &wanted, err, errlen, field, fieldlen);
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
                if ((o->flags & SF_CF_HOT) && !field_equal(next, &wanted, o))
                    memcpy(field_ptr(eff, o), field_cptr(next, o), o->size);
            }
            char why[400];
            rc = validate_change(eff, &live, why, sizeof why, field, fieldlen);
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
        if (field_equal(next, &wanted, o))
            continue;
        if (o->flags & SF_CF_HOT) {
            memcpy(field_ptr(&live, o), field_cptr(next, o), o->size);
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
