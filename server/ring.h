/* server/ring.h — the ring of pinned host slots between HTTP and the engine.
 *
 * N slots of slot_bytes each, allocated once through the backend (pinned
 * cudaHostAlloc memory on CUDA, aligned memory on the CPU). A slot moves
 *   FREE --acquire--> FILLING --commit--> READY --pop--> IN_FLIGHT --release--> FREE
 *                        \--abort--> FREE
 * READY slots are popped in commit order (FIFO). Producers are HTTP threads
 * (acquire/commit/abort); the consumer is the engine thread (pop/release).
 * Every function is thread-safe. pop blocks on a condition variable, never
 * polls. The owner of a slot (the thread that moved it out of FREE or READY)
 * is the only one that touches its bytes until it hands the slot on.
 */
#ifndef SF_RING_H
#define SF_RING_H

#include <stddef.h>
#include <stdint.h>

typedef enum sf_slot_state { SF_SLOT_FREE = 0, SF_SLOT_FILLING, SF_SLOT_READY, SF_SLOT_IN_FLIGHT, SF_SLOT_STATES } sf_slot_state;

/* What the producer records about the batch in a slot. */
typedef struct sf_slot_meta {
    uint64_t job_id;
    int kind;            /* 0 train, 1 transform-only */
    int eval;            /* kind 0: an eval batch (forward only; result = its logits or NULL) */
    char eval_name[65];  /* eval: the evaluation's name (server/evals.h) */
    int n, h, w, c, nhwc;
    int label_dtype;     /* sf_label_dtype of gpu/backend.h; -1 when no labels */
    size_t labels_off;   /* labels at bytes + labels_off */
    /* The encoded form (encoded = 1; h, w are 0): JPEG files at bytes + 0,
     * int64 offsets [n+1] at bytes + jpeg_offsets_off, one sf_jpeg_info per
     * sample (server/jpeg_header.h) at bytes + jpeg_info_off. */
    int encoded;
    int files_named_jpeg; /* the body named its files "jpeg" (the alias), not "files" */
    unsigned jpeg_forms; /* SF_JPEG_FORM_* bits of gpu/backend.h over the files */
    size_t jpeg_offsets_off, jpeg_info_off;
    size_t decoded_bytes;
    size_t used;         /* bytes written */
    uint64_t t_filling_ns, t_ready_ns, t_popped_ns;
    float *result;       /* transform-only: where the backend writes the output; eval with
                            ?return=logits: where it writes the logits */
    void *result_owner;  /* reference held for the engine; dropped with release_result */
    void (*release_result)(void *owner);
} sf_slot_meta;

typedef struct sf_ring sf_ring;

typedef void *(*sf_ring_alloc_fn)(void *ctx, size_t bytes);
typedef void (*sf_ring_free_fn)(void *ctx, void *p);

sf_ring *sf_ring_new(int slots, size_t slot_bytes, sf_ring_alloc_fn alloc, sf_ring_free_fn free_fn,
                     void *ctx);
void sf_ring_destroy(sf_ring *r);

int sf_ring_slots(const sf_ring *r);
size_t sf_ring_slot_bytes(const sf_ring *r);

/* The slot size of ring.slot_bytes 0: one batch of max_batch raw uint8
 * samples of c*h*w bytes with label_elems int64 labels each (1, or a
 * segmentation map's pixels), at least SF_RING_AUTO_MIN_BYTES (a batch of
 * eight phone photos), rounded up to MiB and at most max_bytes. */
#define SF_RING_AUTO_MIN_BYTES ((uint64_t)64 << 20)
uint64_t sf_ring_auto_slot_bytes(int max_batch, int c, int h, int w, uint64_t label_elems, uint64_t max_bytes);
uint8_t *sf_ring_bytes(sf_ring *r, int slot);
sf_slot_meta *sf_ring_meta(sf_ring *r, int slot);

/* FREE -> FILLING; -1 when none is free. */
int sf_ring_acquire(sf_ring *r);
/* FILLING -> READY (appended to the FIFO). */
void sf_ring_commit(sf_ring *r, int slot);
/* FILLING -> FREE (an upload failed or was aborted). */
void sf_ring_abort(sf_ring *r, int slot);
/* READY -> IN_FLIGHT, oldest first; waits up to timeout_ms (0: no wait).
 * Returns the slot, or -1 on timeout or after sf_ring_close. */
int sf_ring_pop(sf_ring *r, int timeout_ms);
/* IN_FLIGHT -> FREE. */
void sf_ring_release(sf_ring *r, int slot);
/* Wakes a blocked pop once (it returns -1): the consumer has other work. */
void sf_ring_kick(sf_ring *r);
/* Wakes a blocked pop for good (shutdown). */
void sf_ring_close(sf_ring *r);
/* Counts per state. */
void sf_ring_counts(sf_ring *r, int counts[SF_SLOT_STATES]);
/* Called (outside the ring's lock) whenever a slot becomes FREE. */
void sf_ring_on_free(sf_ring *r, void (*fn)(void *ctx), void *ctx);

const char *sf_slot_state_name(sf_slot_state s);

#endif
