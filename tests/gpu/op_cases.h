/* tests/gpu/op_cases.h — the op case table that tests/gpu/test_ops.cu runs,
 * as ggml's test-backend-ops runs every op against the CPU: one row per case
 * (the op family, which of its checks, element type, layout, shape, the op's
 * parameters, tolerances), each row naming the compare function that runs the
 * CUDA op and its double-precision reference of gpu/ref on fresh random
 * inputs and prints one "ok <check>" or "FAIL <check>: ..." line per output
 * it compares (op_test.h's criteria).
 *
 * The table is op_cases() in tests/gpu/op_cases.cu; the compare functions are
 * in tests/gpu/ops/<family>.cu, each with a comment naming what its row's
 * shape and parameters mean. Adding an op is its compare function and rows in
 * the table. */
#ifndef SF_TESTS_GPU_OP_CASES_H
#define SF_TESTS_GPU_OP_CASES_H

#include <string>
#include <vector>

#include <cublasLt.h>
#include <cublas_v2.h>

#include "gpu/cuda/program.h"
#include "gpu/cuda/tensor.h"

/* What the driver makes once and lends every case. */
struct op_env {
    cudaStream_t s;     /* device 0's blocking stream (test_stream) */
    cudnnHandle_t dnn;  /* a cuDNN handle on s */
    cublasHandle_t blas; /* a cuBLAS handle on s, its workspace ws */
    cublasLtHandle_t lt;
    void *ws;           /* ws_bytes of device memory: blas's workspace, and the cuBLASLt plans' */
    size_t ws_bytes;
};

struct op_case;
typedef void (*op_compare)(const op_case &c, const op_env &e);

/* One case. A family without a layout (elementwise ops) sets laid 0, and its
 * name then shows none. The shape and the parameters mean what the compare
 * function's comment says. */
struct op_case {
    const char *op;        /* the family: what -o selects */
    const char *check;     /* which of the family's checks (a sub-op, or a property such as "refused") */
    op_compare run;
    sf_dtype dt;
    int laid;              /* 1: the case has a layout (lay) */
    sf_layout lay;
    std::vector<int> shape;
    std::vector<int> p;    /* the op's integer parameters */
    std::vector<float> f;  /* the op's real parameters (eps, probabilities) */
    double tol;            /* the outputs' bound (0: exact values), below */
    double tol_param;      /* fp32 parameter gradients (weights, scales, biases) and per-channel fp32
                            * outputs (statistics), in either element type */
    double tol_aux;        /* a third bound, for outputs a family holds to a bound of their own (dx,
                            * an eval forward, tf32, a backward): its compare function says which */
};
/* The bounds. Every check that holds an output to a number takes it from the
 * case's row, so the table shows each case's criterion; each compare
 * function's comment says which of its outputs tol, tol_param and tol_aux
 * bound. tol is op_test.h's criterion for the case's element type: for fp32
 * data the relative error ||got - ref|| / ||ref|| (check_v); for bf16 data
 * in the GEMM and convolution families (attention, conv, conv_dw, conv_gemm,
 * conv_transpose, linear; check_gemm) and in sdpa the max error
 * max|got - ref| / max|ref| (check_max); bf16 outputs that check_dt judges
 * are held to half a bf16 ulp, which is no number of the row, and do not read
 * it. The criteria that stay in the compare functions are those that are not
 * a number per case: exact equality (dropout's masks and stochastic depth,
 * concat's, channels' and tokens' moves, the masks and casts of pointwise, SGD and the
 * weights' permutation in optimizer, pool's argmax and maxpool_dt's
 * selection), NaN propagation (activation nan), check_dt's half an ulp,
 * refusals and eligibility rules, and captured graphs replaying bit-equal. */

/* The case's name: what -k matches, -l lists, and the seed of its inputs. */
std::string op_case_name(const op_case &c);

/* Every case, in the order the driver runs them. */
std::vector<op_case> op_cases();

/* The compare functions, one family per file under tests/gpu/ops/. */
void cmp_activation(const op_case &c, const op_env &e);
void cmp_activation_nan(const op_case &c, const op_env &e);
void cmp_clamp_edges(const op_case &c, const op_env &e);
void cmp_activation_refused(const op_case &c, const op_env &e);
void cmp_concat(const op_case &c, const op_env &e);
void cmp_concat_refused(const op_case &c, const op_env &e);
void cmp_channel_shuffle(const op_case &c, const op_env &e);
void cmp_channel_slice(const op_case &c, const op_env &e);
void cmp_pixel_shuffle(const op_case &c, const op_env &e);
void cmp_channels_refused(const op_case &c, const op_env &e);
void cmp_log_softmax(const op_case &c, const op_env &e);
void cmp_groupnorm(const op_case &c, const op_env &e);
void cmp_upsample(const op_case &c, const op_env &e);
void cmp_upsample_refused(const op_case &c, const op_env &e);
void cmp_groupnorm_refused(const op_case &c, const op_env &e);
void cmp_grn(const op_case &c, const op_env &e);
void cmp_grn_refused(const op_case &c, const op_env &e);
void cmp_log_softmax_refused(const op_case &c, const op_env &e);
void cmp_mul(const op_case &c, const op_env &e);
void cmp_channel_scale(const op_case &c, const op_env &e);
void cmp_prelu(const op_case &c, const op_env &e);
void cmp_channel_conv1d(const op_case &c, const op_env &e);
void cmp_channel_conv1d_refused(const op_case &c, const op_env &e);
void cmp_prelu_refused(const op_case &c, const op_env &e);
void cmp_pad(const op_case &c, const op_env &e);
void cmp_pad_refused(const op_case &c, const op_env &e);
void cmp_layernorm(const op_case &c, const op_env &e);
void cmp_transpose(const op_case &c, const op_env &e);
void cmp_to_tokens(const op_case &c, const op_env &e);
void cmp_class_token(const op_case &c, const op_env &e);
void cmp_pos_embedding(const op_case &c, const op_env &e);
void cmp_select_token(const op_case &c, const op_env &e);
void cmp_token_mean(const op_case &c, const op_env &e);
void cmp_dropout(const op_case &c, const op_env &e);
void cmp_dropout_graph_replay(const op_case &c, const op_env &e);
void cmp_dropout_null_seq(const op_case &c, const op_env &e);
void cmp_maxpool(const op_case &c, const op_env &e);
void cmp_avgpool(const op_case &c, const op_env &e);
void cmp_maxpool_dt(const op_case &c, const op_env &e);
void cmp_avgpool_dt(const op_case &c, const op_env &e);
void cmp_avgpool2d_dt(const op_case &c, const op_env &e);
void cmp_adaptive_dt(const op_case &c, const op_env &e);
void cmp_maxpool_pre_bn(const op_case &c, const op_env &e);
void cmp_xent(const op_case &c, const op_env &e);
void cmp_xent_soft(const op_case &c, const op_env &e);
void cmp_labels(const op_case &c, const op_env &e);
void cmp_xent2d(const op_case &c, const op_env &e);
void cmp_relu(const op_case &c, const op_env &e);
void cmp_bias_grad(const op_case &c, const op_env &e);
void cmp_add(const op_case &c, const op_env &e);
void cmp_relu_dt(const op_case &c, const op_env &e);
void cmp_add_dt(const op_case &c, const op_env &e);
void cmp_grad_fork_dt(const op_case &c, const op_env &e);
void cmp_bias_act_dt(const op_case &c, const op_env &e);
void cmp_bias_grad_dt(const op_case &c, const op_env &e);
void cmp_cast(const op_case &c, const op_env &e);
void cmp_fill_random_dt(const op_case &c, const op_env &e);
void cmp_sgd(const op_case &c, const op_env &e);
void cmp_sgd_mixed(const op_case &c, const op_env &e);
void cmp_adamw(const op_case &c, const op_env &e);
void cmp_weights_perm(const op_case &c, const op_env &e);
void cmp_conv_dw(const op_case &c, const op_env &e);
void cmp_conv_dw_refused(const op_case &c, const op_env &e);
void cmp_conv_dw_rules(const op_case &c, const op_env &e);
void cmp_attention_core(const op_case &c, const op_env &e);
void cmp_attention_layer(const op_case &c, const op_env &e);
void cmp_attention_refused(const op_case &c, const op_env &e);
void cmp_sdpa(const op_case &c, const op_env &e);
void cmp_sdpa_refused(const op_case &c, const op_env &e);
void cmp_linear(const op_case &c, const op_env &e);
void cmp_linear_bf16(const op_case &c, const op_env &e);
void cmp_linear_bad_dtype(const op_case &c, const op_env &e);
void cmp_linear_map(const op_case &c, const op_env &e);
void cmp_linear_lt(const op_case &c, const op_env &e);
void cmp_linear_lt_refuses(const op_case &c, const op_env &e);
void cmp_convt(const op_case &c, const op_env &e);
void cmp_convt_cache(const op_case &c, const op_env &e);
void cmp_convt_bias_dt(const op_case &c, const op_env &e);
void cmp_convt_patch(const op_case &c, const op_env &e);
void cmp_convt_patch_rules(const op_case &c, const op_env &e);
void cmp_conv_gemm(const op_case &c, const op_env &e);
void cmp_conv_gemm_fallback(const op_case &c, const op_env &e);
void cmp_conv_gemm_lend_binds_back(const op_case &c, const op_env &e);
void cmp_conv_gemm_refuses(const op_case &c, const op_env &e);
void cmp_conv(const op_case &c, const op_env &e);
void cmp_conv_bad_dtype(const op_case &c, const op_env &e);
void cmp_conv_thin(const op_case &c, const op_env &e);
void cmp_conv_thin_rules(const op_case &c, const op_env &e);
void cmp_conv_patch(const op_case &c, const op_env &e);
void cmp_conv_patch_refuses_bf16(const op_case &c, const op_env &e);
void cmp_conv_patch_rules(const op_case &c, const op_env &e);
void cmp_conv_s2d(const op_case &c, const op_env &e);
void cmp_conv_s2d_rules(const op_case &c, const op_env &e);
void cmp_conv_gd(const op_case &c, const op_env &e);
void cmp_conv_rect(const op_case &c, const op_env &e);
void cmp_bn(const op_case &c, const op_env &e);
void cmp_bn_dt(const op_case &c, const op_env &e);
void cmp_bn_res(const op_case &c, const op_env &e);
void cmp_bn_mask_from_x(const op_case &c, const op_env &e);
void cmp_bn_graph_replay(const op_case &c, const op_env &e);
void cmp_bn_act(const op_case &c, const op_env &e);
void cmp_bn_act_refused(const op_case &c, const op_env &e);

#endif
