/* bench/memcpy_bw.c — the ceiling for ingest: plain memcpy of W1 batch bodies
 * (6.3 MB) from a rotating set of sources into a rotating set of destinations
 * (so the caches do not hold them), on T threads at once. Prints GB/s. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BODY (32u * 256 * 256 * 3 + 256)
#define SETS 16

static int iters = 400;
static pthread_barrier_t bar;
static double t_start, t_end;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *worker(void *arg)
{
    (void)arg;
    char *src[SETS], *dst[SETS];
    for (int i = 0; i < SETS; i++) {
        src[i] = malloc(BODY);
        dst[i] = malloc(BODY);
        memset(src[i], i + 1, BODY);
        memset(dst[i], 0, BODY);
    }
    /* Only the copies are timed: set-up is outside the two barriers. */
    if (pthread_barrier_wait(&bar) == PTHREAD_BARRIER_SERIAL_THREAD)
        t_start = now();
    pthread_barrier_wait(&bar);
    for (int i = 0; i < iters; i++)
        memcpy(dst[i % SETS], src[(i * 7) % SETS], BODY);
    if (pthread_barrier_wait(&bar) == PTHREAD_BARRIER_SERIAL_THREAD)
        t_end = now();
    for (int i = 0; i < SETS; i++) {
        free(src[i]);
        free(dst[i]);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    if (argc > 2)
        iters = atoi(argv[2]);
    pthread_t t[256];
    if (threads < 1 || threads > 256)
        return 2;
    pthread_barrier_init(&bar, NULL, (unsigned)threads);
    for (int i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, worker, NULL);
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    double s = t_end - t_start;
    double gbs = (double)BODY * iters * threads / s / 1e9;
    printf("{\"bench\":\"memcpy\",\"threads\":%d,\"gb_per_s\":%.2f}\n", threads, gbs);
    return 0;
}
