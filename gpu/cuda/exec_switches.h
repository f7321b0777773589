/* gpu/cuda/exec_switches.h — the CUDA executor's plan switches, which turn
 * one of its measured choices off (or one path on for every layer), so that a
 * test or a benchmark can compare a plan with its plainer variant in the same
 * run. A caller of the backend passes them through sf_train_cfg.sw (a
 * pointer, read by build only); the server passes none, and the executor then
 * runs the measured best. gpu/backend.h names the struct without defining it,
 * so the switches are no part of the backend's contract: the CUDA backend,
 * tests/gpu and bench/ include this header. The executor's own configuration
 * (sf_net_cfg, gpu/cuda/executor.h) carries each switch as a field of the
 * same name, and sf_exec_switches_apply is the one place that copies them
 * there, so that a switch added here reaches the executor by whichever way a
 * caller builds it (the backend, or the executor directly). */
#ifndef SF_GPU_CUDA_EXEC_SWITCHES_H
#define SF_GPU_CUDA_EXEC_SWITCHES_H

typedef struct sf_exec_switches {
    int no_fork;    /* backward-filter after backward-data on one stream */
    int no_fuse;    /* no cuDNN fused conv+bias+ReLU forward */
    int keep_relu;  /* ReLUs as separate kernels, not fused into their producers */
    int allow_rtc;  /* consider cuDNN engines compiled at run time */
    int no_thin;    /* thin 1x1 convolutions through cuDNN, not gpu/cuda/conv_thin.h's kernels */
    int no_patch;   /* non-overlapping convolutions' backward through cuDNN, not gpu/cuda/conv_patch.h's */
    int no_dw;      /* depthwise NHWC convolutions on cuDNN alone, not timed against gpu/cuda/conv_dw.h's */
    int force_dw;   /* depthwise NHWC convolutions on gpu/cuda/conv_dw.h's kernels in every direction, untimed */
    int no_s2d;     /* strided few-channel convolutions as they are, not gpu/cuda/conv_s2d.h's space-to-depth form */
    int no_bn_fuse; /* a batchnorm's residual add, or its ReLU + maxpool, as kernels of their own */
    int no_lt;      /* linear layers' bias as a kernel of its own, not in the cuBLASLt forward GEMM */
    int no_acc;     /* a backward-data written apart and added into its input's gradient, not
                       accumulated there by cuDNN (beta 1) */
    int no_share;   /* a residual add writes both inputs' gradients, not one that a batchnorm
                       input reads as its own */
    int no_lt_tune; /* cuBLASLt's first algorithm for each forward GEMM, untimed, and the backward-data
                       GEMMs on cuBLAS, not the fastest of its candidates on cuBLASLt */
} sf_exec_switches;

struct sf_net_cfg;

#ifdef __cplusplus
extern "C" {
#endif

/* Sets every switch field of *nc to the field of the same name in *sw, and
 * leaves nc's other fields as they are; sw NULL (the server's case) sets
 * every switch to 0, the executor's measured best. */
void sf_exec_switches_apply(const sf_exec_switches *sw, struct sf_net_cfg *nc);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_EXEC_SWITCHES_H */
