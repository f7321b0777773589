/* server/http_wait.c — requests that wait for an event (a ring slot, a batch's
 * result, a command) suspended rather than blocking a thread, and the
 * wake-ups that resume them. See http.h. */
#include "server/http_impl.h"

#include <poll.h>
#include <pthread.h>
#include <stdint.h>

#include "server/clock.h"

/* ---- waiting ------------------------------------------------------------------ */

uint64_t sf_http_gen(sf_http *h, sf_wait_kind kind)
{
    pthread_mutex_lock(&h->wmu);
    uint64_t g = h->gen[kind];
    pthread_mutex_unlock(&h->wmu);
    return g;
}

int sf_http_waiting(sf_http *h, sf_wait_kind kind)
{
    int n = 0;
    pthread_mutex_lock(&h->wmu);
    for (sf_req *r = h->waiters; r; r = r->priv->wait_next)
        n += r->priv->wait_kind == kind;
    pthread_mutex_unlock(&h->wmu);
    return n;
}

void sf_http_unlink_waiter_locked(sf_http *h, sf_req *r)
{
    for (sf_req **pp = &h->waiters; *pp; pp = &(*pp)->priv->wait_next) {
        if (*pp == r) {
            *pp = r->priv->wait_next;
            break;
        }
    }
    r->priv->in_wait_list = 0;
    r->priv->wait_next = NULL;
    if (r->priv->c)
        r->priv->c->waiting = 0;
}

int sf_http_wait(sf_req *r, sf_wait_kind kind, uint64_t key, uint64_t gen, int timeout_ms)
{
    sf_http *h = r->priv->h;
    pthread_mutex_lock(&h->wmu);
    if (h->closed) {
        /* The server is stopping: no new waits. The caller tests its
         * condition again and, seeing SF_WAIT_SHUTDOWN, replies now. */
        r->wait = SF_WAIT_SHUTDOWN;
        pthread_mutex_unlock(&h->wmu);
        return -1;
    }
    if (h->gen[kind] != gen) {
        /* A wake came between the caller's test and now: test again. */
        pthread_mutex_unlock(&h->wmu);
        return -1;
    }
    r->wait = SF_WAIT_NONE;
    r->priv->wait_kind = kind;
    r->priv->wait_key = key;
    r->priv->deadline_ns = sf_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    r->priv->wait_next = h->waiters;
    r->priv->in_wait_list = 1;
    if (r->priv->c)
        r->priv->c->waiting = 1;
    h->waiters = r;
    MHD_suspend_connection(r->priv->conn);
    pthread_cond_signal(&h->wcv);
    pthread_mutex_unlock(&h->wmu);
    return 0;
}

void sf_http_resume_locked(sf_http *h, sf_req *r, sf_wait_state why)
{
    sf_http_unlink_waiter_locked(h, r);
    /* A body's allowance (an upload waiting for a slot) starts again. */
    if (r->priv->c)
        r->priv->c->from_ns = sf_now_ns();
    r->wait = why;
    MHD_resume_connection(r->priv->conn);
}

void sf_http_wake(sf_http *h, sf_wait_kind kind, uint64_t key)
{
    if (!h)
        return;
    pthread_mutex_lock(&h->wmu);
    h->gen[kind]++;
    for (sf_req *r = h->waiters, *next; r; r = next) {
        next = r->priv->wait_next;
        if (r->priv->wait_kind == kind && (key == UINT64_MAX || r->priv->wait_key == key))
            sf_http_resume_locked(h, r, SF_WAIT_WOKEN);
    }
    pthread_mutex_unlock(&h->wmu);
}

void sf_http_wake_all(sf_http *h)
{
    pthread_mutex_lock(&h->wmu);
    h->closed = 1; /* no new waits from now on */
    for (int k = 0; k < SF_WAIT_KINDS; k++)
        h->gen[k]++;
    while (h->waiters)
        sf_http_resume_locked(h, h->waiters, SF_WAIT_SHUTDOWN);
    pthread_cond_broadcast(&h->wcv);
    pthread_mutex_unlock(&h->wmu);
}

/* A suspended connection is not polled by libmicrohttpd, so a client that
 * goes away is seen only when the wait ends, up to its timeout later (a
 * diagnose's whole length, with training paused for it). POLLRDHUP is the
 * peer's FIN, POLLHUP and POLLERR a reset: the client closed its side, and
 * an HTTP client that half-closes before its reply is taken as gone, as
 * nginx does (its 499). Bytes of a pipelined next request are not. Resumed,
 * the connection reads the end of its stream and libmicrohttpd ends the
 * request (req_end: an SF_ROUTE_ON_GONE route's handler is told). */
void sf_http_sweep_gone_locked(sf_http *h)
{
    for (sf_req *r = h->waiters, *next; r; r = next) {
        next = r->priv->wait_next;
        if (r->priv->gone || r->priv->fd < 0)
            continue;
        struct pollfd p = {.fd = r->priv->fd, .events = POLLRDHUP};
        if (poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
            r->priv->gone = 1;
            sf_http_resume_locked(h, r, SF_WAIT_GONE);
        }
    }
}
