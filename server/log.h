/* server/log.h — leveled logging to stderr, one line per event.
 *
 * Lines are "time level message" in text mode or one JSON object per line in
 * json mode (for log collectors: {"time","level","msg", fields...}). The level and format are hot config: any
 * thread may log at any time; the settings are read atomically.
 *
 * A stderr that is a pipe or a socket is written by a thread of its own once
 * sf_log_start has run, through a buffer of SF_LOG_BUFFER_BYTES: a reader that
 * stops reading costs dropped lines (counted, sf_log_dropped), never a
 * blocked request or training step. Lines are written in the order they were
 * logged either way.
 */
#ifndef SF_LOG_H
#define SF_LOG_H

typedef enum sf_log_level { SF_LOG_DEBUG = 0, SF_LOG_INFO, SF_LOG_WARN, SF_LOG_ERROR } sf_log_level;

#include <stdint.h>

#define SF_LOG_BUFFER_BYTES (1u << 20)
/* How long the exit path waits for buffered lines to reach stderr. */
#define SF_LOG_EXIT_FLUSH_MS 2000

/* Starts the writer thread when stderr is a pipe or a socket (1), or leaves
 * lines written directly (0: a file, a terminal; -1: the thread could not
 * start). The buffered lines are flushed at exit, for up to
 * SF_LOG_EXIT_FLUSH_MS. Call it once every signal that another thread
 * must not take is blocked, or not at all (tools, tests). */
int sf_log_start(void);
/* Waits up to timeout_ms for every line logged before the call (and the
 * report of lines dropped until then) to be written: 0 once written, -1 if
 * the reader has not taken them in time. */
int sf_log_flush(int timeout_ms);
/* One line as it is, without time or level (a start-up failure's
 * "streamfeed: ..."), in order with the others. */
void sf_log_raw(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Lines dropped because the buffer was full, since the start. */
uint64_t sf_log_dropped(void);

void sf_log_set_level(sf_log_level l);
void sf_log_set_json(int json);
int sf_log_level_parse(const char *s, sf_log_level *out);
int sf_log_enabled(sf_log_level l);

void sf_log(sf_log_level l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* One field of a structured log line: a string (s != NULL) or a number. */
typedef struct sf_log_field {
    const char *key;
    const char *s;
    double num;
} sf_log_field;
#define SF_LF_STR(k, v) ((sf_log_field){(k), (v) ? (v) : "", 0})
#define SF_LF_NUM(k, v) ((sf_log_field){(k), NULL, (double)(v)})

/* A line with fields: in json mode each field is a member of the object
 * beside time, level and msg; in text mode they follow msg as key=value. */
void sf_log_fields(sf_log_level l, const char *msg, const sf_log_field *f, int n);

/* The current UTC time as the log writes it (RFC 3339, milliseconds). */
void sf_log_time(char *out, int cap);

#define SF_DEBUG(...) sf_log(SF_LOG_DEBUG, __VA_ARGS__)
#define SF_INFO(...) sf_log(SF_LOG_INFO, __VA_ARGS__)
#define SF_WARN(...) sf_log(SF_LOG_WARN, __VA_ARGS__)
#define SF_ERROR(...) sf_log(SF_LOG_ERROR, __VA_ARGS__)

#endif
