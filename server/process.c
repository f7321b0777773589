/* server/process.c — see process.h. */
#include "server/process.h"

#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

int sf_process_stats_read(sf_process_stats *out)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return -1;
    out->cpu_seconds = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
                       (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f)
        return -1;
    unsigned long long pages_virt = 0, pages_res = 0;
    int got = fscanf(f, "%llu %llu", &pages_virt, &pages_res);
    fclose(f);
    if (got != 2)
        return -1;
    double page = (double)sysconf(_SC_PAGESIZE);
    out->virtual_bytes = (double)pages_virt * page;
    out->resident_bytes = (double)pages_res * page;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int n = 0;
    for (struct dirent *e = readdir(d); e; e = readdir(d))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    out->open_fds = n - 1; /* the directory stream's own descriptor */
    struct rlimit rl;
    out->max_fds = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                       ? (double)rl.rlim_cur
                       : -1;
    return 0;
}

static pthread_once_t start_once = PTHREAD_ONCE_INIT;
static double start_time;

/* The process's start tick (field 22 of /proc/self/stat) after boot time
 * would be exact; the wall clock at the first call (main, before anything
 * slow) is within milliseconds of it and needs no parsing. */
static void take_start_time(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    start_time = (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

double sf_process_start_time(void)
{
    pthread_once(&start_once, take_start_time);
    return start_time;
}
