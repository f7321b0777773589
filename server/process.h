/* server/process.h — this process's resource use, for the standard process_*
 * metrics (the names and meanings of the Prometheus client libraries). Linux
 * only: read from /proc/self and getrusage/getrlimit. */
#ifndef SF_PROCESS_H
#define SF_PROCESS_H

typedef struct sf_process_stats {
    double cpu_seconds;    /* user + system */
    double resident_bytes;
    double virtual_bytes;
    double open_fds;
    double max_fds;        /* the soft RLIMIT_NOFILE */
} sf_process_stats;

/* Fills *out; returns 0, or -1 when /proc is not readable. */
int sf_process_stats_read(sf_process_stats *out);

/* Seconds since the Unix epoch at which the process started (from the
 * first call on, the same value every time). */
double sf_process_start_time(void);

#endif
