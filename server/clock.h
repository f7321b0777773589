/* server/clock.h — the process clock: CLOCK_MONOTONIC in nanoseconds for
 * durations and deadlines, and absolute CLOCK_MONOTONIC deadlines for
 * pthread_cond_timedwait on condition variables whose clock is
 * CLOCK_MONOTONIC (pthread_condattr_setclock): a wall-clock step (NTP, an
 * operator) then neither cuts a wait short nor stretches it. */
#ifndef SF_CLOCK_H
#define SF_CLOCK_H

#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC now, in nanoseconds. */
static inline uint64_t sf_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The CLOCK_MONOTONIC time ms milliseconds from now (ms >= 0). */
static inline struct timespec sf_deadline_after_ms(int ms)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_sec += ms / 1000;
    t.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

#endif
