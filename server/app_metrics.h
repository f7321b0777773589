/* server/app_metrics.h — the process's metric families, one field each, so
 * that a module which counts (the engine, uploads) takes them without the
 * whole composition root (app.h). */
#ifndef SF_APP_METRICS_H
#define SF_APP_METRICS_H

#include "server/metrics.h"

/* Metric families, registered once (app.c: sf_app_metrics_init). */
typedef struct sf_app_metrics {
    sf_family *http_requests, *http_duration, *http_errors;
    sf_family *batches_received, *batches_finished, *batches_rejected, *batches_pending;
    sf_family *uploads_waiting;
    sf_family *bytes_received, *samples_trained, *steps, *loss, *learning_rate;
    sf_family *ring_slots, *queue_wait, *h2d, *transform, *step;
    sf_family *compute_busy, *compute_starved, *build_info;
    sf_family *process_start, *process_cpu, *process_rss, *process_vsize, *process_fds, *process_max_fds;
    sf_family *log_dropped; /* server/log.h: lines a stalled stderr reader cost */
    sf_family *uploads_evicted;
    sf_family *logits_kept, *logits_kept_bytes, *logits_evicted; /* server/kept_logits.h */
    /* The training loop: skipped steps by reason, pre-clip gradient norms,
     * and the named evaluations (labelled eval="<name>", at most
     * eval.max_names of them). */
    sf_family *steps_skipped, *grad_norm;
    sf_family *eval_loss, *eval_accuracy, *eval_samples;
    sf_family *evals_evicted; /* idle evaluations evicted for a new name (eval.name_idle_s) */
    sf_family *jpeg_batches, *jpeg_samples, *jpeg_decode_host; /* labelled decoder="..." */
    sf_family *samples_undecodable; /* samples left out of their batch: the decoder refused their files */
    sf_family *jpeg_decoder_unavailable;                  /* encoded batches failed: no decoder could be made */
    sf_family *jpeg_decoder_device, *jpeg_decoder_pinned; /* what the decoder holds now (bytes) */
    /* Device telemetry (server/telemetry.c), labelled gpu="<ordinal>"; no
     * child until a valid sample, so absent without NVML. */
    sf_family *gpu_utilization, *gpu_memory_used, *gpu_memory_total, *gpu_power;
} sf_app_metrics;

#endif
