/* server/config.c — the option table: every option one row (name, type, default, bounds,
 * flags, cross-field check, description), and the preset augmentation recipes. The
 * loader (config_load.c), the checks (config_checks.c), the renderers
 * (config_render.c) and the live state (config_live.c) loop over it. See config.h. */
#include "server/config.h"
#include "server/config_impl.h"

#include <stddef.h>
#include <string.h>

#define F(field) offsetof(sf_config, field), sizeof(((sf_config *)0)->field)

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
const sf_cfg_recipe sf_cfg_recipes[] = {
    {"seed-classifier", W1_AUGMENT, W1_EVAL_AUGMENT},
    {"seed-encdec", W1_AUGMENT, W1_EVAL_AUGMENT},
    {"resnet18", RESNET_AUGMENT, RESNET_EVAL_AUGMENT},
    {"tiny", TINY_AUGMENT, TINY_AUGMENT},
};
const size_t sf_cfg_recipes_len = sizeof sf_cfg_recipes / sizeof sf_cfg_recipes[0];

const char *sf_cfg_recipe_of(const sf_config *c, int eval)
{
    if (!c->model.spec[0])
        for (size_t i = 0; i < sf_cfg_recipes_len; i++)
            if (strcmp(c->model.preset, sf_cfg_recipes[i].preset) == 0)
                return eval ? sf_cfg_recipes[i].eval : sf_cfg_recipes[i].train;
    return "[]";
}

const char *sf_config_train_pipeline(const sf_config *c)
{
    return c->augment.pipeline[0] ? c->augment.pipeline : sf_cfg_recipe_of(c, 0);
}

const char *sf_config_eval_pipeline(const sf_config *c)
{
    return c->augment.eval_pipeline[0] ? c->augment.eval_pipeline : sf_cfg_recipe_of(c, 1);
}

const sf_cfg_option sf_config_table[] = {
    {"http.host", SF_CT_STRING, F(http.host), "127.0.0.1", 0, 0, NULL, SF_CF_LOCATION, check_host,
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
     check_token,
     "Bearer token required by mutating endpoints; empty disables auth. Visible ASCII characters only "
     "(no spaces or control characters: a header could not present them). PATCH can change it only "
     "while one is set (rotation; an authenticated PATCH to null or empty opens the service): an open "
     "service is closed by a restart."},
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
    {"http.tls_cert", SF_CT_STRING, F(http.tls_cert), "", 0, 0, NULL, SF_CF_LOCATION, check_listeners,
     "PEM certificate chain for HTTPS on http.port (with http.tls_key); empty serves plain HTTP. "
     "Re-read on SIGHUP and when the file changes."},
    {"http.tls_key", SF_CT_STRING, F(http.tls_key), "", 0, 0, NULL, SF_CF_LOCATION, check_listeners,
     "PEM private key of http.tls_cert (unencrypted)."},
    {"http.tls_priorities", SF_CT_STRING, F(http.tls_priorities),
     "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2:-RSA", 0, 0, NULL, 0, check_tls_priorities,
     "GnuTLS priority string of the HTTPS port: the protocol versions, key exchanges and ciphers it "
     "accepts (`gnutls-cli --priority STRING --list` shows what a string allows). The default takes "
     "TLS 1.2 and 1.3 with forward-secret key exchange only: no TLS 1.0 or 1.1, no static RSA."},
    {"ring.slots", SF_CT_INT, F(ring.slots), "8", 2, 4096, NULL, 0, check_slots,
     "Ring slots of pinned host memory (batches buffered between HTTP and the GPU)."},
    {"ring.slot_bytes", SF_CT_INT64, F(ring.slot_bytes), "0", 0, 17179869184.0, NULL, 0,
     check_slot_bytes, "Bytes per slot: the largest batch data section accepted (a larger body gets "
     "413 body_too_large naming this option); 0, or at least 4096. 0 (the default): one batch of "
     "model.max_batch raw uint8 samples at the model's input size with int64 labels, and at least 64 "
     "MiB, a batch of eight phone photos (3-5 MB each), rounded up to MiB; GET /v1/config shows the "
     "bytes in force. The ring holds ring.slots of them in pinned host memory on CUDA (512 MiB at 64 "
     "MiB), in untouched pages until used on the reference backend."},
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
     "flattens a tensor with spatial extent for anything but linear layers runs NCHW whatever this "
     "says. GET /v1/model shows the layout chosen."},
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
     "metrics. A batch naming one more evicts the least recently used evaluation idle for "
     "eval.name_idle_s, or is refused with 409 too_many_evals when none is. DELETE "
     "/v1/evals/{name} frees a finished evaluation's name at once."},
    {"eval.name_idle_s", SF_CT_INT, F(eval.name_idle_s), "300", 0, 86400, NULL, SF_CF_HOT, NULL,
     "An evaluation with no batch pending, none accepted or finished and no GET /v1/evals/{name} "
     "for this long is evicted (its aggregates and metric series forgotten; "
     "streamfeed_evals_evicted_total) when eval.max_names are taken and a batch names a new one, "
     "the least recently used first, so that names nobody uses cannot lock new ones out. 0: any "
     "finished evaluation may be evicted."},
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
    {"checkpoint.dir", SF_CT_STRING, F(checkpoint.dir), "", 0, 0, NULL, SF_CF_LOCATION, check_checkpoint,
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
    {"model.init_from", SF_CT_STRING, F(checkpoint.init_from), "", 0, 0, NULL, SF_CF_URL | SF_CF_LOCATION, NULL,
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
     "The decode buffers are sized from it: 3 bytes per pixel for the decoded images on the "
     "reference backend (host memory, at start); on CUDA two such areas in device memory (6 bytes per "
     "pixel; one with pipeline.overlap off), so that a batch decodes while the one before is "
     "augmented, and nvJPEG's own buffers for a batch of model.max_batch files of this many pixels "
     "in all (on an H100 with model.max_batch 1024, 64 Mi pixels held about 2.7 GB of device memory), "
     "made by the first encoded batch, so that a job posting raw tensors holds none of it; when that "
     "memory cannot be had then, the batch fails with jpeg_decoder_unavailable and the next encoded "
     "batch tries again. "
     "The default, 128 Mi pixels, takes a batch of ten 12-megapixel phone photos: 384 MiB of host "
     "memory on the reference backend, 768 MiB of staging on CUDA plus nvJPEG's buffers (docs/IMAGES.md). "
     "0 turns JPEG batches off: nothing is allocated for them and every one is refused with "
     "jpeg_batch_too_large."},
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
    {"distributed.rendezvous", SF_CT_STRING, F(distributed.rendezvous), "", 0, 0, NULL, SF_CF_LOCATION,
     check_distributed,
     "host:port of rank 0's HTTP listener, where the other ranks join (its key-value store under "
     "/v1/distributed/kv/); required on ranks other than 0."},
    {"distributed.host", SF_CT_STRING, F(distributed.host), "", 0, 0, NULL, SF_CF_LOCATION, NULL,
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
     "running statistics are the job's on every rank (torch.nn.SyncBatchNorm). Both backends: Gloo "
     "on the reference one, NCCL on CUDA, where each batchnorm's two all-reduces take their turn "
     "among the gradient buckets' (see docs/DATA-PARALLEL.md)."},
    {"distributed.allow_no_token", SF_CT_BOOL, F(distributed.allow_no_token), "false", 0, 0, NULL, 0,
     check_distributed,
     "Lets a data-parallel job (world_size > 1) start without http.token. Without a token any client "
     "that reaches rank 0's port can write the job's rendezvous store and break its join; only for a "
     "network no stranger reaches. Said in a warning at start."},
};
const size_t sf_config_table_len = sizeof sf_config_table / sizeof sf_config_table[0];

/* The preset whose recipe recipe_of gives, or NULL (a model.spec model, or a preset without one). */
const char *sf_cfg_recipe_preset(const sf_config *c)
{
    if (c->model.spec[0])
        return NULL;
    for (size_t i = 0; i < sf_cfg_recipes_len; i++)
        if (strcmp(c->model.preset, sf_cfg_recipes[i].preset) == 0)
            return sf_cfg_recipes[i].preset;
    return NULL;
}
