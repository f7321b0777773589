/* server/checkpoint.h — the training state as a file: parameters and
 * optimizer state in safetensors, named as PyTorch's state_dict names them.
 *
 * The format (format_version 1). One safetensors file holds, in this order:
 *   "<layer>.weight", "<layer>.bias"      F32, PyTorch shapes (conv2d [oc,ic,k,k],
 *                                         conv_transpose2d [ic,oc,k,k], linear
 *                                         [out,in], batchnorm2d [c]); <layer> is the
 *                                         layer's name, "0", "2", ... for Sequential
 *                                         presets, torchvision's for resnet18
 *   "<bn>.running_mean", "<bn>.running_var"  F32 [c], each batchnorm2d layer's buffers
 *   "<bn>.num_batches_tracked"            I64 [], one per batchnorm2d layer (the
 *                                         service keeps one counter: the same value
 *                                         in each), so torch's strict
 *                                         model.load_state_dict takes the file
 *   "optim.<layer>.weight.momentum_buffer", ...   optim.name=sgd: F32, the SGD
 *                                         momentum of each parameter, same shapes
 *   "optim.<p>.exp_avg", then "optim.<p>.exp_avg_sq"  optim.name=adamw instead:
 *                                         AdamW's moments (torch.optim.AdamW's names)
 *   "optim.step"                          I64 [], optimizer steps taken
 * (the optim. tensors are left out on request) and "__metadata__" (strings):
 * format "streamfeed.checkpoint", format_version "1", step, model (the model
 * as a JSON layer list, model.spec syntax), optimizer "sgd" | "adamw",
 * config_hash (FNV-1a 64 of the effective configuration, secrets masked),
 * backend. The tensors lie back to back in the order above, so the parameter
 * block is exactly the backend's flat buffer and the running statistics its
 * flat buffers area (gpu/model.h).
 *
 * Reading is strict where a checkpoint replaces the state (PUT, load, resume):
 * every tensor of the state_dict part must be there with its PyTorch shape and
 * dtype (F32; num_batches_tracked I64 [] or [1]), no other tensor may be,
 * optimizer tensors come all or none and must be the service's optimizer's
 * (another optimizer's state, by tensor name or by __metadata__.optimizer, is
 * 400 checkpoint_optimizer_mismatch); a file without them loads the state_dict
 * and zeroes the optimizer state (a new optimizer, as in PyTorch), keeping the
 * step count unless the file has one. Of differing num_batches_tracked values
 * the largest is kept. Counts (optim.step, num_batches_tracked, the metadata's
 * step) above SF_CKPT_MAX_COUNT are refused on every read, and a snapshot past
 * it fails rather than write a file no read would take. Reading for
 * model.init_from is partial: tensors whose name is a parameter's or a
 * batchnorm buffer's initialise it (shape and dtype must match), every other
 * tensor is ignored.
 *
 * Backends without the optional vtable entries (get/set_buffers,
 * get/set_opt_sq: NULL) keep working for models without batchnorm and with
 * SGD; a batchnorm model's checkpoint then fails (501 buffers_unsupported on
 * load), and an AdamW one is taken without its optimizer state only.
 *
 * Who calls the backend. Only the engine thread, between two steps, through
 * an engine command (sf_engine_post), so a snapshot sees the state after a
 * completed step and a restore lands between steps; before the engine starts
 * and after it stopped, main's thread calls it directly (sf_ckpt_start,
 * sf_ckpt_shutdown). File and URL transfers run on this module's two I/O
 * threads, one for files and one for URLs (a slow URL never holds a save to
 * disk), never on the engine thread (training does not wait for a disk or a
 * network) and never on an HTTP thread.
 *
 * Untrusted input. Every value read into the state must be finite (400
 * checkpoint_not_finite). PUT bodies and downloads stream to an unnamed file
 * in checkpoint.dir, bounded by the largest file the model's state can be,
 * and are decoded from its mapping. Where a URL may send the service is
 * checkpoint_url.h's business.
 *
 * Requests: an HTTP handler starts an operation (sf_ckpt_get, _put, _save,
 * _load), then calls sf_ckpt_op_advance each time it runs until it returns 1;
 * in between it waits (sf_http_wait) on (SF_WAIT_CMD, sf_ckpt_op_key(op)). The
 * keys of these operations have the top bit set, so they never collide with
 * engine command ids, which count up from 1. An operation is shared by the
 * request and the thread working on it; sf_ckpt_op_release drops the
 * request's reference (the request may go away at any time).
 *
 * Files: writes go to a hidden temporary file in the target's directory,
 * fsync, rename over the target, fsync of the directory, so a crash leaves
 * the previous file or the new one, never a torn one. Periodic, final and
 * default saves are named ckpt-<step>.safetensors in checkpoint.dir and the
 * newest checkpoint.keep of them are kept. Paths given by requests must lie
 * inside checkpoint.dir (relative to it, or absolute under it; no ".."
 * component, no hidden name, no NUL, no component over NAME_MAX; symbolic
 * links are resolved before the check); the ckpt-<step> files of load {} and
 * resume are opened without following a symbolic link.
 *
 * The code: checkpoint.c (requests and process life), checkpoint_op.c (an
 * operation's life), checkpoint_format.c (layout, header, decoder, errors), checkpoint_snapshot.c (the state against the
 * backend), checkpoint_io.c (the I/O threads), checkpoint_store.c (files),
 * checkpoint_url.c (libcurl).
 */
#ifndef SF_CHECKPOINT_H
#define SF_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "server/checkpoint_format.h" /* sf_ckpt_error */

struct sf_app;
typedef struct sf_ckpt sf_ckpt;
typedef struct sf_ckpt_op sf_ckpt_op;

/* Large buffers (snapshots to send, bodies and files being read) alive at
 * once for requests; one more is refused with 503 checkpoint_busy. A
 * download (GET /v1/checkpoint) holds its buffer until its client has read
 * the reply, so downloads hold at most SF_CKPT_MAX_DOWNLOAD_BUFFERS of them:
 * clients that read slowly, or never, cannot refuse every save, load and
 * PUT. */
#define SF_CKPT_MAX_BUFFERS 4
#define SF_CKPT_MAX_DOWNLOAD_BUFFERS 2

/* ---- process life (main.c) -------------------------------------------------- */

/* After the backend is built, before the engine starts: registers the metrics,
 * checks checkpoint.dir (created if missing) and removes temporary files a
 * crash left there, starts the I/O threads, then applies checkpoint.resume
 * (the newest valid ckpt-<step>.safetensors; with if_compatible, the newest
 * one of this model and optimizer) or, when nothing was resumed,
 * model.init_from. Without a backend (sink mode) only the metrics. Returns 0,
 * or -1 with err (the process should not start). */
int sf_ckpt_start(struct sf_app *app, char *err, size_t errlen);
/* After the engine started: periodic saves (checkpoint.every_steps). */
void sf_ckpt_attach(struct sf_app *app);
/* After sf_engine_stop, before the backend is destroyed: stops the I/O threads
 * (a write in progress completes; a URL transfer is cut short), writes the
 * final checkpoint (checkpoint.on_shutdown, when the state changed since the
 * last file), and frees everything. */
void sf_ckpt_shutdown(struct sf_app *app);

/* ---- request operations (handlers/checkpoint.c) ------------------------------ */

/* Each returns an operation, or NULL with e filled (nothing was started). */
/* GET /v1/checkpoint: a snapshot, as a safetensors file in memory. */
sf_ckpt_op *sf_ckpt_get(struct sf_app *app, int with_optimizer, sf_ckpt_error *e);
/* PUT /v1/checkpoint: the body, streamed into fd (sf_ckpt_spool_open; len
 * bytes from offset 0; borrowed for the call), is validated at once; on
 * success it is applied between two steps. */
sf_ckpt_op *sf_ckpt_put(struct sf_app *app, int fd, size_t len, sf_ckpt_error *e);
/* An unnamed temporary file in checkpoint.dir (P_tmpdir without one) for a
 * PUT body: bodies go to disk, not memory. The fd, or -1 with e. */
int sf_ckpt_spool_open(struct sf_app *app, sf_ckpt_error *e);
/* The largest PUT body or download accepted: checkpoint.max_bytes, or less
 * when this model's whole state (parameters, optimizer state, buffers) and a
 * header cannot be that large (a longer file cannot be its checkpoint). */
uint64_t sf_ckpt_max_bytes(struct sf_app *app);
/* POST /v1/checkpoint/save: exactly one of path, url, or neither (then
 * ckpt-<step>.safetensors in checkpoint.dir, counted in checkpoint.keep). */
sf_ckpt_op *sf_ckpt_save(struct sf_app *app, const char *path, const char *url, int with_optimizer,
                         sf_ckpt_error *e);
/* POST /v1/checkpoint/load: path, url, or neither (the newest valid
 * ckpt-<step>.safetensors of checkpoint.dir). */
sf_ckpt_op *sf_ckpt_load(struct sf_app *app, const char *path, const char *url, sf_ckpt_error *e);

/* Moves the operation on (it may post the next stage); 1 when it finished
 * (then sf_ckpt_op_error says how), 0 while it runs. */
int sf_ckpt_op_advance(struct sf_app *app, sf_ckpt_op *op);
uint64_t sf_ckpt_op_key(const sf_ckpt_op *op);
/* NULL when the operation succeeded. */
const sf_ckpt_error *sf_ckpt_op_error(const sf_ckpt_op *op);

typedef struct sf_ckpt_result {
    uint64_t step;          /* the step count of the state saved or loaded */
    uint64_t bytes;         /* file size */
    int tensors;            /* tensors in the file */
    int optimizer;          /* 1: optimizer state was saved / restored */
    double seconds;         /* the whole operation */
    char where[2048];       /* the file written or read, or the URL; "" for GET/PUT */
    int url;                /* where is a URL (its query cut off) */
} sf_ckpt_result;
void sf_ckpt_op_result(const sf_ckpt_op *op, sf_ckpt_result *out);

/* GET: hands the file over (once); free_fn(data) releases it. */
int sf_ckpt_op_take_file(sf_ckpt_op *op, void **data, size_t *len, void (**free_fn)(void *));
void sf_ckpt_op_release(sf_ckpt_op *op);

/* A large request buffer (a PUT body): 0 when one of SF_CKPT_MAX_BUFFERS was
 * free, else -1 (reply 503 checkpoint_busy). Pair with sf_ckpt_buffer_return. */
int sf_ckpt_buffer_reserve(struct sf_app *app);
void sf_ckpt_buffer_return(struct sf_app *app);
/* The same for a download's reply, within SF_CKPT_MAX_DOWNLOAD_BUFFERS. */
int sf_ckpt_download_reserve(struct sf_app *app);
void sf_ckpt_download_return(struct sf_app *app);

#endif
