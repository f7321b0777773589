/* tests/unit/test_log_writer.c — the log writer (server/log.c) on a stderr
 * that is a pipe: lines come out whole and in order; a reader that stops
 * reading never blocks the thread that logs, the lines that did not fit are
 * counted and the count is logged once the reader catches up; a flush waits
 * for the reader, but only as long as it is told to; a raw line (a start-up
 * failure's message) keeps its place among the others.
 *
 * The cases share one process-wide writer, started once on a pipe, and run in
 * the order listed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "server/log.h"

static int g_read_fd = -1;

/* Reads what the pipe holds within timeout_ms into buf (NUL-terminated), up
 * to cap - 1 bytes; returns the bytes read. */
static size_t read_some(char *buf, size_t cap, int timeout_ms)
{
    size_t o = 0;
    while (o + 1 < cap) {
        struct pollfd pf = {.fd = g_read_fd, .events = POLLIN};
        if (poll(&pf, 1, timeout_ms) <= 0)
            break;
        ssize_t k = read(g_read_fd, buf + o, cap - 1 - o);
        if (k <= 0)
            break;
        o += (size_t)k;
        timeout_ms = 50; /* the rest of what was written comes at once */
    }
    buf[o] = '\0';
    return o;
}

static int setup(void **state)
{
    (void)state;
    int p[2];
    if (pipe(p) != 0)
        return -1;
    /* The writer takes its own copy of descriptor 2 when it starts: point 2
     * at the pipe for the start only, so that cmocka's reports still reach
     * the real stderr. */
    int saved = dup(STDERR_FILENO);
    dup2(p[1], STDERR_FILENO);
    int rc = sf_log_start();
    dup2(saved, STDERR_FILENO);
    close(saved);
    close(p[1]);
    g_read_fd = p[0];
    return rc == 1 ? 0 : -1;
}

static void test_lines_reach_the_pipe_whole_and_in_order(void **state)
{
    (void)state;
    sf_log_set_level(SF_LOG_INFO);
    SF_INFO("first line");
    sf_log_fields(SF_LOG_WARN, "second line", &SF_LF_NUM("n", 2), 1);
    SF_DEBUG("below the level: not written");
    sf_log_raw("streamfeed: a raw line %d", 7);
    SF_ERROR("third line");
    assert_int_equal(sf_log_flush(5000), 0);
    char buf[4096];
    read_some(buf, sizeof buf, 5000);
    const char *a = strstr(buf, "info  first line\n");
    const char *b = strstr(buf, "warn  second line n=2\n");
    const char *raw = strstr(buf, "\nstreamfeed: a raw line 7\n");
    const char *c = strstr(buf, "error third line\n");
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(raw);
    assert_non_null(c);
    assert_true(a < b && b < raw && raw < c);
    assert_null(strstr(buf, "below the level"));
    assert_int_equal(sf_log_dropped(), 0);
}

#define FLOOD_LINES 4000
#define FLOOD_PAD 600

static void *flood(void *arg)
{
    (void)arg;
    char pad[FLOOD_PAD + 1];
    memset(pad, 'x', FLOOD_PAD);
    pad[FLOOD_PAD] = '\0';
    for (int i = 0; i < FLOOD_LINES; i++)
        SF_INFO("flood %06d %s", i, pad);
    return NULL;
}

/* The pipe (64 KiB) and the writer's buffer hold far fewer than the flood's
 * 2.4 MB: with nobody reading, the logging thread must still finish. */
static void test_a_reader_that_stops_reading_costs_lines_not_a_blocked_thread(void **state)
{
    (void)state;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, flood, NULL), 0);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 60;
    int joined = pthread_timedjoin_np(th, NULL, &until);
    assert_int_equal(joined, 0); /* else logging waited on the reader */
    const uint64_t dropped = sf_log_dropped();
    assert_true(dropped > 0);
    assert_true(dropped < FLOOD_LINES);
    /* Nobody reads: a flush gives up when told to. */
    assert_int_equal(sf_log_flush(200), -1);

    /* The reader comes back: every line that was kept arrives whole and in
     * order, then the count of the dropped ones. */
    size_t cap = (size_t)FLOOD_LINES * (FLOOD_PAD + 100);
    char *buf = malloc(cap);
    assert_non_null(buf);
    buf[0] = '\0';
    size_t n = 0;
    char want[160];
    snprintf(want, sizeof want, "log: %llu lines dropped", (unsigned long long)dropped);
    for (int tries = 0; tries < 200 && !strstr(buf, want); tries++) {
        n += read_some(buf + n, cap - n, 100);
    }
    assert_non_null(strstr(buf, want));
    int kept = 0, first = -1, last = -1;
    for (char *line = buf; line && *line;) {
        char *nl = strchr(line, '\n');
        assert_non_null(nl);
        *nl = '\0';
        const char *f = strstr(line, "flood ");
        if (f) {
            int i = atoi(f + 6);
            assert_true(i > last);
            assert_int_equal(strlen(f), 6 + 6 + 1 + FLOOD_PAD);
            if (first < 0)
                first = i;
            last = i;
            kept++;
        }
        line = nl + 1;
    }
    assert_int_equal((uint64_t)kept + dropped, FLOOD_LINES);
    /* The buffer was empty when the flood began: its first lines are kept. */
    assert_int_equal(first, 0);
    free(buf);
    assert_int_equal(sf_log_flush(5000), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lines_reach_the_pipe_whole_and_in_order),
        cmocka_unit_test(test_a_reader_that_stops_reading_costs_lines_not_a_blocked_thread),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
