/* server/checkpoint_store.c — see checkpoint_store.h. */
#include "server/checkpoint_store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server/checkpoint_format.h"
#include "server/log.h"

#define PATH_MAX_IN 1024          /* longest path a request may give */
#define fail sf_ckpt_fail

static int inside_dir(const char *p, const char *dir)
{
    size_t n = strlen(dir);
    if (n == 1 && dir[0] == '/')
        return p[0] == '/';
    return strncmp(p, dir, n) == 0 && (p[n] == '\0' || p[n] == '/');
}

static int parse_ckpt_name(const char *name, uint64_t *step);

/* A request's path, resolved inside checkpoint.dir. for_write: the file need
 * not exist, its directory must. */
int sf_ckpt_store_resolve(const char *dir, const char *in, int for_write, char *out, size_t cap,
                          sf_ckpt_error *e)
{
    if (!dir[0]) {
        fail(e, 409, "checkpoint_dir_unset", "path",
             "paths are resolved in checkpoint.dir, which is not set (start with --checkpoint.dir DIR)");
        return -1;
    }
    size_t n = strlen(in);
    if (n == 0 || n >= PATH_MAX_IN) {
        fail(e, 400, "path_invalid", "path", "path must be 1 to %d bytes", PATH_MAX_IN - 1);
        return -1;
    }
    for (const char *c = in; *c;) {
        size_t l = strcspn(c, "/");
        if (l == 2 && c[0] == '.' && c[1] == '.') {
            fail(e, 400, "path_not_allowed", "path", "path must not contain a \"..\" component");
            return -1;
        }
        /* The file system refuses longer names (ENAMETOOLONG): the request's
         * fault, so a 400 now rather than a failed write later. */
        if (l > NAME_MAX) {
            fail(e, 400, "path_invalid", "path", "a path component is %zu bytes; the limit is %d",
                 l, NAME_MAX);
            return -1;
        }
        c += l;
        while (*c == '/')
            c++;
    }
    char joined[PATH_MAX + PATH_MAX_IN + 2];
    if (in[0] == '/')
        snprintf(joined, sizeof joined, "%s", in);
    else
        snprintf(joined, sizeof joined, "%s/%s", dir, in);
    char *slash = strrchr(joined, '/');
    const char *base = slash + 1;
    if (!base[0] || base[0] == '.') {
        fail(e, 400, "path_invalid", "path", "the file name must be given and not start with \".\"");
        return -1;
    }
    *slash = '\0';
    char real[PATH_MAX];
    if (!realpath(joined[0] ? joined : "/", real)) {
        if (!inside_dir(joined[0] ? joined : "/", dir) && in[0] == '/')
            fail(e, 400, "path_not_allowed", "path", "%s is outside checkpoint.dir (%s)", in, dir);
        else
            fail(e, for_write ? 400 : 404, for_write ? "path_invalid" : "checkpoint_not_found", "path",
                 "directory %s does not exist", joined);
        return -1;
    }
    if (!inside_dir(real, dir)) {
        fail(e, 400, "path_not_allowed", "path", "%s is outside checkpoint.dir (%s)", in, dir);
        return -1;
    }
    if ((size_t)snprintf(out, cap, "%s/%s", real, base) >= cap) {
        fail(e, 400, "path_invalid", "path", "path is too long");
        return -1;
    }
    if (for_write) {
        /* What the write would fail on later, as a 500 from the I/O thread,
         * is the request's fault: a file where a directory is named, or a
         * directory where the file is. */
        struct stat st;
        if (stat(real, &st) != 0 || !S_ISDIR(st.st_mode)) {
            fail(e, 400, "path_invalid", "path", "%s: %s is not a directory", in, real);
            return -1;
        }
        if (lstat(out, &st) == 0 && S_ISDIR(st.st_mode)) {
            fail(e, 400, "path_invalid", "path", "%s is a directory", in);
            return -1;
        }
        /* The rotating checkpoints' names are the service's: a save under
         * one would be ranked by the step in its name, deleted or kept and
         * restored by resume as if the service had written it then. */
        uint64_t step;
        if (parse_ckpt_name(base, &step) == 0 && strcmp(real, dir) == 0) { /* dir is canonical (open_dir) */
            fail(e, 400, "path_reserved", "path",
                 "%s is the name of a rotating checkpoint (" SF_CKPT_FILE_PREFIX "<step>" SF_CKPT_FILE_SUFFIX
                 " in checkpoint.dir, kept by checkpoint.keep); save without \"path\" for one, or under "
                 "another name", in);
            return -1;
        }
    }
    if (!for_write) {
        char fr[PATH_MAX];
        struct stat st;
        if (!realpath(out, fr) || stat(fr, &st) != 0) {
            fail(e, 404, "checkpoint_not_found", "path", "no checkpoint file %s", in);
            return -1;
        }
        if (!inside_dir(fr, dir)) {
            fail(e, 400, "path_not_allowed", "path", "%s leads outside checkpoint.dir (%s)", in, dir);
            return -1;
        }
        if (!S_ISREG(st.st_mode)) {
            fail(e, 400, "path_invalid", "path", "%s is not a regular file", in);
            return -1;
        }
        /* The file checked is the file read: opened by its resolved name, with
         * O_NOFOLLOW, so a link swapped in after the check is not followed. */
        if ((size_t)snprintf(out, cap, "%s", fr) >= cap) {
            fail(e, 400, "path_invalid", "path", "path is too long");
            return -1;
        }
    }
    return 0;
}

static int write_all(int fd, const uint8_t *p, size_t len)
{
    while (len > 0) {
        ssize_t w = write(fd, p, len > (1u << 30) ? (1u << 30) : len);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

int sf_ckpt_store_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* Temporary files are ".<name>.tmp-<pid>-<n>" beside the target: hidden, and
 * never named like a checkpoint, so nothing ever reads one. */
static int is_tmp_name(const char *name) { return name[0] == '.' && strstr(name, ".tmp-") != NULL; }

/* tmp file, fsync, rename, fsync of the directory: the target is the old file
 * or the complete new one, whenever the process or the machine stops. */
int sf_ckpt_store_write(const char *path, const uint8_t *data, size_t len, char *err, size_t errlen)
{
    static atomic_uint_least64_t seq;
    char dir[PATH_MAX + 96], tmp[PATH_MAX + 400];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    const char *base = path + (slash - dir) + 1;
    if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    snprintf(tmp, sizeof tmp, "%s/.%.200s.tmp-%d-%llu", dir, base, (int)getpid(),
             (unsigned long long)atomic_fetch_add(&seq, 1));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(err, errlen, "cannot create %.300s: %s", tmp, strerror(errno));
        return -1;
    }
    const char *what = "write";
    int rc = write_all(fd, data, len);
    if (!rc) {
        what = "fsync";
        rc = fsync(fd);
    }
    int saved = errno;
    if (close(fd) != 0 && !rc) {
        what = "close";
        rc = -1;
        saved = errno;
    }
    if (!rc) {
        what = "rename";
        rc = rename(tmp, path);
        saved = errno;
    }
    if (rc) {
        unlink(tmp);
        snprintf(err, errlen, "%s of %.300s failed: %s", what, path, strerror(saved));
        return -1;
    }
    if (sf_ckpt_store_fsync_dir(dir) != 0) {
        snprintf(err, errlen, "fsync of directory %.300s failed: %s", dir, strerror(errno));
        return -1;
    }
    return 0;
}

/* Reads a whole regular file of at most max bytes. */
int sf_ckpt_store_read(const char *path, int follow, uint64_t max, uint8_t **out, size_t *len,
                       sf_ckpt_error *e)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | (follow ? 0 : O_NOFOLLOW));
    if (fd < 0 && errno == ELOOP && !follow) {
        fail(e, 400, "path_not_allowed", "path", "%s is a symbolic link, which is not followed", path);
        return -1;
    }
    if (fd < 0) {
        fail(e, errno == ENOENT ? 404 : 400, errno == ENOENT ? "checkpoint_not_found" : "path_invalid",
             "path", "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        fail(e, 400, "path_invalid", "path", "%s is not a regular file", path);
        return -1;
    }
    if ((uint64_t)st.st_size > max) {
        close(fd);
        fail(e, 413, "checkpoint_too_large", NULL,
             "%s is %lld bytes; the limit is %llu (checkpoint.max_bytes, or the largest checkpoint "
             "this model's state can be)", path, (long long)st.st_size, (unsigned long long)max);
        return -1;
    }
    size_t n = (size_t)st.st_size;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) {
        close(fd);
        fail(e, 503, "out_of_memory", NULL, "cannot hold %zu bytes of %s", n, path);
        return -1;
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    if (got != n) {
        free(buf);
        fail(e, 500, "checkpoint_read_failed", NULL, "reading %s stopped after %zu of %zu bytes",
             path, got, n);
        return -1;
    }
    *out = buf;
    *len = n;
    return 0;
}

/* The step of a file the service itself names, ckpt-%010llu.safetensors:
 * that form exactly (ckpt-1.safetensors or ckpt-007.safetensors are someone
 * else's files, which rotation must not take for old checkpoints and delete,
 * nor for new ones and prefer). */
static int parse_ckpt_name(const char *name, uint64_t *step)
{
    size_t pl = strlen(SF_CKPT_FILE_PREFIX), sl = strlen(SF_CKPT_FILE_SUFFIX), n = strlen(name);
    if (n <= pl + sl || n - pl - sl > 20 || strncmp(name, SF_CKPT_FILE_PREFIX, pl) != 0 ||
        strcmp(name + n - sl, SF_CKPT_FILE_SUFFIX) != 0)
        return -1;
    uint64_t v = 0;
    for (size_t i = pl; i < n - sl; i++) {
        if (name[i] < '0' || name[i] > '9' || __builtin_mul_overflow(v, 10, &v) ||
            __builtin_add_overflow(v, (uint64_t)(name[i] - '0'), &v))
            return -1;
    }
    char canon[64];
    snprintf(canon, sizeof canon, SF_CKPT_FILE_PREFIX "%010llu" SF_CKPT_FILE_SUFFIX, (unsigned long long)v);
    if (strcmp(canon, name) != 0)
        return -1;
    *step = v;
    return 0;
}

static int cmp_newest(const void *a, const void *b)
{
    const sf_ckpt_file *x = a, *y = b;
    if (x->step != y->step)
        return x->step > y->step ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* The ckpt-<step> files of dir, newest first; returns the count (-1 on error). */
int sf_ckpt_store_list(const char *dir, sf_ckpt_file **out)
{
    *out = NULL;
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0, cap = 0;
    sf_ckpt_file *v = NULL;
    struct dirent *de;
    while ((de = readdir(d))) {
        uint64_t step;
        if (parse_ckpt_name(de->d_name, &step) != 0 || strlen(de->d_name) >= sizeof v->name)
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            sf_ckpt_file *nv = realloc(v, (size_t)cap * sizeof *nv);
            if (!nv)
                break;
            v = nv;
        }
        v[n].step = step;
        snprintf(v[n].name, sizeof v[n].name, "%s", de->d_name);
        n++;
    }
    closedir(d);
    if (n)
        qsort(v, (size_t)n, sizeof *v, cmp_newest);
    *out = v;
    return n;
}

/* Keeps the newest checkpoint.keep ckpt-<step> files. */
void sf_ckpt_store_rotate(const char *dir, int keep)
{
    sf_ckpt_file *v;
    int n = sf_ckpt_store_list(dir, &v);
    int removed = 0;
    for (int i = keep; i < n; i++) {
        char p[PATH_MAX + 80];
        snprintf(p, sizeof p, "%s/%s", dir, v[i].name);
        if (unlink(p) == 0)
            removed++;
        else
            SF_WARN("checkpoint: cannot remove %s: %s", p, strerror(errno));
    }
    free(v);
    if (removed)
        sf_ckpt_store_fsync_dir(dir);
}

void sf_ckpt_store_remove_tmp(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!is_tmp_name(de->d_name))
            continue;
        char p[PATH_MAX + 300];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISREG(st.st_mode) && unlink(p) == 0)
            SF_INFO("checkpoint: removed %s, left by an interrupted write", p);
    }
    closedir(d);
}

int sf_ckpt_store_spool(const char *dir, sf_ckpt_error *e)
{
    const char *d = dir && dir[0] ? dir : P_tmpdir;
    int fd = open(d, O_RDWR | O_TMPFILE | O_CLOEXEC, 0600);
    if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
        /* No O_TMPFILE on this file system: a hidden name, unlinked at once. */
        char tmp[PATH_MAX + 64];
        snprintf(tmp, sizeof tmp, "%s/.spool.tmp-%d-XXXXXX", d, (int)getpid());
        fd = mkostemp(tmp, O_CLOEXEC);
        if (fd >= 0)
            unlink(tmp);
    }
    if (fd < 0)
        fail(e, 503, "checkpoint_busy", NULL, "cannot create a temporary file in %s: %s", d, strerror(errno));
    return fd;
}

const uint8_t *sf_ckpt_store_map(int fd, size_t len, sf_ckpt_error *e)
{
    static const uint8_t empty[1];
    if (len == 0)
        return empty;
    void *p = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
        fail(e, 503, "out_of_memory", NULL, "cannot map %zu bytes of a temporary file: %s", len, strerror(errno));
        return NULL;
    }
    return p;
}

void sf_ckpt_store_unmap(const uint8_t *p, size_t len)
{
    if (len)
        munmap((void *)p, len);
}
