/* client/jpeg_pool.h — streamfeed-load's pools of JPEG files, sent
 * undecoded in the encoded body form (jpeg + jpeg_offsets + labels): the
 * class folders of a --dir (ImageFolder layout), and the natural-looking
 * files of the JPEG workloads (w1-jpeg, imagenet-jpeg), generated once into a
 * cache folder and then read like a --dir.
 *
 * Both return 0, 1 on a runtime failure, 2 on a usage error (a message is
 * printed); out->jpeg_dir names the folder the files were read from.
 */
#ifndef SF_CLIENT_JPEG_POOL_H
#define SF_CLIENT_JPEG_POOL_H

#include "client/loader.h"

/* --dir PATH of class folders holding *.jpg files. */
int pool_load_jpeg_dir(const options *o, const char *root, pool *out);

/* --workload w1-jpeg or imagenet-jpeg: --pool x --batch files of the
 * workload's size, quality 90, 4:2:0, generated once into the cache (a folder
 * per seed, count and --learnable, written beside and renamed into place when
 * complete, so an interrupted run leaves nothing half-made) and then sent
 * like a --dir. */
int pool_generate_jpeg(const options *o, pool *out);

#endif
