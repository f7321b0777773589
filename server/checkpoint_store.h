/* server/checkpoint_store.h — checkpoint files on disk: request paths
 * resolved inside checkpoint.dir, atomic writes, the ckpt-<step> files and
 * their rotation.
 *
 * Writes go to a hidden temporary file in the target's directory, fsync,
 * rename over the target, fsync of the directory, so a crash leaves the
 * previous file or the new one, never a torn one. Temporary files are
 * ".<name>.tmp-<pid>-<n>": hidden and never named like a checkpoint, so
 * nothing reads one, and sf_ckpt_store_remove_tmp clears those a crash left.
 * Every function here may block on the disk: call them from the checkpoint
 * I/O thread or from main's thread, never from the engine's.
 */
#ifndef SF_CHECKPOINT_STORE_H
#define SF_CHECKPOINT_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "server/checkpoint_format.h"

#define SF_CKPT_FILE_PREFIX "ckpt-"
#define SF_CKPT_FILE_SUFFIX ".safetensors"

/* A request's path, resolved inside dir (the realpath of checkpoint.dir; ""
 * when unset: 409). for_write: the file need not exist, its directory must;
 * else out is the file's realpath. Components longer than NAME_MAX are 400.
 * 0 with out set, or -1 with e. */
int sf_ckpt_store_resolve(const char *dir, const char *in, int for_write, char *out, size_t cap,
                          sf_ckpt_error *e);
/* tmp file, fsync, rename, fsync of the directory. 0, or -1 with err. */
int sf_ckpt_store_write(const char *path, const uint8_t *data, size_t len, char *err, size_t errlen);
/* Reads a whole regular file of at most max bytes into *out (malloc).
 * follow 0: a symbolic link is not followed (400 path_not_allowed), for every
 * name that comes from a request or from listing checkpoint.dir. */
int sf_ckpt_store_read(const char *path, int follow, uint64_t max, uint8_t **out, size_t *len,
                       sf_ckpt_error *e);
int sf_ckpt_store_fsync_dir(const char *dir);

typedef struct sf_ckpt_file {
    uint64_t step;
    char name[64];
} sf_ckpt_file;
/* The ckpt-<step> files of dir, newest first (*out: free it); the count, or -1. */
int sf_ckpt_store_list(const char *dir, sf_ckpt_file **out);
/* An unnamed temporary file in dir (P_tmpdir when dir is ""), for bodies and
 * downloads on their way to the decoder: they stream to disk instead of
 * memory. The fd (closing it frees the space), or -1 with e. */
int sf_ckpt_store_spool(const char *dir, sf_ckpt_error *e);
/* Maps len bytes of fd read-only (len 0 is allowed); NULL with e. Only for
 * files the service alone holds (spools): a mapping of a file someone else
 * truncates would fault. */
const uint8_t *sf_ckpt_store_map(int fd, size_t len, sf_ckpt_error *e);
void sf_ckpt_store_unmap(const uint8_t *p, size_t len);

/* Keeps the newest keep ckpt-<step> files of dir. */
void sf_ckpt_store_rotate(const char *dir, int keep);
/* Removes the temporary files an interrupted write left in dir. */
void sf_ckpt_store_remove_tmp(const char *dir);

#endif
