/* bench/loopback_bw.c — the kernel's ceiling for ingest over loopback: F TCP
 * connections on 127.0.0.1, each a sender thread that send()s W1 batch
 * bodies (6.3 MB) from a rotating set of sources and a receiver thread that
 * reads them straight into a rotating set of destinations: one copy on each
 * side, no HTTP, no parsing. The receiver waits as streamfeed's HTTP threads
 * do (poll(), then a non-blocking read) with the same receive low-water mark
 * (server/http.c), so the two figures differ only by what the service does.
 * Prints GB/s.
 *
 *     loopback_bw [FLOWS [BODIES_PER_FLOW]] */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BODY (32u * 256 * 256 * 3 + 256)
#define SETS 16
#define LOWAT (256 << 10)
#define MAX_FLOWS 64

static int iters = 400;
static int port;
static pthread_barrier_t bar;
static double t_start, t_end;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *what)
{
    perror(what);
    exit(1);
}

/* Both ends of every flow wait at the two barriers, so only the transfers
 * are timed, from the moment every connection is up. */
static void timed_start(void)
{
    if (pthread_barrier_wait(&bar) == PTHREAD_BARRIER_SERIAL_THREAD)
        t_start = now();
    pthread_barrier_wait(&bar);
}

static void timed_end(void)
{
    if (pthread_barrier_wait(&bar) == PTHREAD_BARRIER_SERIAL_THREAD)
        t_end = now();
}

static char **buffers(int fill)
{
    char **b = malloc(SETS * sizeof *b);
    for (int i = 0; b && i < SETS; i++) {
        b[i] = malloc(BODY);
        if (!b[i])
            die("malloc");
        memset(b[i], fill ? i + 1 : 0, BODY);
    }
    if (!b)
        die("malloc");
    return b;
}

static void free_buffers(char **b)
{
    for (int i = 0; i < SETS; i++)
        free(b[i]);
    free(b);
}

static void *sender(void *arg)
{
    (void)arg;
    char **src = buffers(1);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
        die("connect");
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    timed_start();
    for (int i = 0; i < iters; i++) {
        const char *p = src[(i * 7) % SETS];
        for (size_t off = 0; off < BODY;) {
            ssize_t n = send(fd, p + off, BODY - off, 0);
            if (n <= 0)
                die("send");
            off += (size_t)n;
        }
    }
    timed_end();
    close(fd);
    free_buffers(src);
    return NULL;
}

static void *receiver(void *arg)
{
    int fd = (int)(intptr_t)arg;
    char **dst = buffers(0);
    int lowat = 1;
    timed_start();
    for (int i = 0; i < iters; i++) {
        char *p = dst[i % SETS];
        for (size_t off = 0; off < BODY;) {
            /* As the server: the mark never exceeds what is still to come,
             * poll() waits for it, and a non-blocking read takes what is
             * there. (A blocking recv() with a mark can sleep for ever: once
             * it has copied part of its target, the kernel wakes it only when
             * a whole mark's worth more has arrived.) */
            int want = BODY - off < LOWAT ? (int)(BODY - off) : LOWAT;
            if (want != lowat && setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof want) == 0)
                lowat = want;
            struct pollfd pfd = {.fd = fd, .events = POLLIN};
            if (poll(&pfd, 1, -1) < 0)
                die("poll");
            ssize_t n = recv(fd, p + off, BODY - off, MSG_DONTWAIT);
            if (n < 0 && (errno == EAGAIN || errno == EINTR))
                continue;
            if (n <= 0)
                die("recv");
            off += (size_t)n;
        }
    }
    timed_end();
    close(fd);
    free_buffers(dst);
    return NULL;
}

int main(int argc, char **argv)
{
    int flows = argc > 1 ? atoi(argv[1]) : 1;
    if (argc > 2)
        iters = atoi(argv[2]);
    if (flows < 1 || flows > MAX_FLOWS || iters < 1)
        return 2;
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t alen = sizeof a;
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) != 0 || listen(l, MAX_FLOWS) != 0 ||
        getsockname(l, (struct sockaddr *)&a, &alen) != 0)
        die("listen");
    port = ntohs(a.sin_port);
    pthread_barrier_init(&bar, NULL, (unsigned)(2 * flows));
    pthread_t snd[MAX_FLOWS], rcv[MAX_FLOWS];
    for (int i = 0; i < flows; i++) {
        pthread_create(&snd[i], NULL, sender, NULL);
        int fd = accept(l, NULL, NULL);
        if (fd < 0)
            die("accept");
        pthread_create(&rcv[i], NULL, receiver, (void *)(intptr_t)fd);
    }
    for (int i = 0; i < flows; i++) {
        pthread_join(snd[i], NULL);
        pthread_join(rcv[i], NULL);
    }
    close(l);
    double s = t_end - t_start;
    double gbs = (double)BODY * iters * flows / s / 1e9;
    printf("{\"bench\":\"loopback\",\"flows\":%d,\"gb_per_s\":%.2f}\n", flows, gbs);
    return 0;
}
