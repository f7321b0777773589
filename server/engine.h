/* server/engine.h — the engine thread: READY slots in, trained batches out.
 *
 * One engine per backend (per GPU). It pops READY slots in FIFO order, draws
 * each batch's augmentation parameters on the host (gpu/aug.h), submits the
 * batch to the backend, and harvests completions by polling, so that up to
 * backend->max_inflight batches overlap (transform of N+1 during the step of
 * N). It is the only thread that calls the backend after start-up. Results go
 * to the job table and the metrics; requests waiting on a job are woken.
 *
 * Ingestion never waits on the engine: HTTP threads only touch the ring.
 */
#ifndef SF_ENGINE_H
#define SF_ENGINE_H

#include <stddef.h>

struct sf_app;
typedef struct sf_engine sf_engine;

sf_engine *sf_engine_start(struct sf_app *app, char *err, size_t errlen);
int sf_engine_running(sf_engine *e);
/* Batches taken from the ring and not finished. */
int sf_engine_inflight(sf_engine *e);
/* Stops the thread after the batches already submitted finish; READY slots
 * not yet taken are failed with "shutdown". */
void sf_engine_stop(sf_engine *e);

#endif
