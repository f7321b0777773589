/* tests/gpu/ops/sdpa.cu — cuDNN's fused attention (gpu/cuda/sdpa.h) against
 * the double-precision reference attention (sf_ref_attention_core_fwd_f64 /
 * _bwd_f64, gpu/ref/attention.c) on the same bf16-rounded inputs, at the
 * sequence lengths of the transformers served (17: the small configuration's
 * 16 patches and class token; 50: vit_b_32; 197: vit_b_16; 64: a power of
 * two), heads 1, 4 and 12, head dims 16, 32 and 64, batches 1 to 8.
 *
 * Per shape: the output O, the softmax statistics (log-sum-exp per row), and
 * dQ, dK, dV (each part checked on its own, since their scales differ); the
 * same forward and backward captured into a CUDA graph and replayed, checked
 * again (the executor captures its steps); and a negative control: K and V
 * swapped in the input must fail the same criteria, so the checks can fail.
 *
 * A plan that cannot be built is a FAIL that prints cuDNN's version and the
 * heuristics' answer (sdpa.cu puts them in the message); below sm_80, where
 * cuDNN has no fused attention, each case prints SKIPPED. The rows:
 * tests/gpu/op_cases.cu; helpers and criteria: op_test.h. */
#include "tests/gpu/op_cases.h"
#include "tests/gpu/op_test.h"

#include <cudnn.h>

#include "gpu/cuda/check.h"
#include "gpu/cuda/sdpa.h"

/* Tolerances, the rows' (tol: O; tol_aux: dQ, dK, dV; tol_param: the
 * statistics): the max-error criterion of op_test.h (max |got - ref| <= tol *
 * max |ref|, NaN anywhere failing), against a double reference on the same
 * bf16 inputs, so all of the error is the fused kernel's own:
 *  - the forward rounds the probabilities P to bf16 before P V and O once at
 *    the end: each a relative 2^-9 (half an ulp, ~2e-3) of an element, and a
 *    sum of t such terms of mixed sign stays below a few times that relative
 *    to max |O|; 1e-2 leaves a factor of about 2.5 over 2^-8;
 *  - the backward also rounds dS and P to bf16 for its three matmuls and takes
 *    rowsum(dO * O) from the bf16 O, and dP - rowsum cancels, which doubles
 *    the budget: 2e-2;
 *  - the statistics are fp32 throughout (max + log of an fp32 sum of fp32
 *    exponentials of fp32 scores): 1e-4 of max |lse|.
 * Any layout mistake (a swapped K and V, a wrong head stride, a transposed
 * matrix, a missing scale) moves elements by the order of max |ref| itself,
 * far above these; the negative control checks that it does. */

struct shape {
    int n, t, heads, d;
};

/* max |got - ref| / max |ref|, or +inf when any got is not finite. */
static double max_rel(const std::vector<float> &got, const std::vector<double> &ref)
{
    double err = 0, scale = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        if (!isfinite(got[i]))
            return INFINITY;
        err = fmax(err, fabs((double)got[i] - ref[i]));
        scale = fmax(scale, fabs(ref[i]));
    }
    return scale > 0 ? err / scale : INFINITY;
}

/* Columns [off, off+c) of each row of a [rows, 3c] matrix. */
template <typename T> static std::vector<T> part(const std::vector<T> &m, size_t rows, int c, int off)
{
    std::vector<T> r(rows * c);
    for (size_t i = 0; i < rows; i++)
        for (int j = 0; j < c; j++)
            r[i * c + j] = m[i * 3 * c + off + j];
    return r;
}

/* The reference log-sum-exp of each row of scaled scores, [n, heads, t]. */
static std::vector<double> ref_lse(const std::vector<double> &qkv, const shape &sh)
{
    const int c = sh.heads * sh.d, t = sh.t;
    const size_t ld = 3 * (size_t)c;
    const double scale = 1.0 / sqrt((double)sh.d);
    std::vector<double> lse((size_t)sh.n * sh.heads * t), row(t);
    for (int b = 0; b < sh.n; b++)
        for (int h = 0; h < sh.heads; h++)
            for (int i = 0; i < t; i++) {
                const double *q = &qkv[((size_t)b * t + i) * ld + (size_t)h * sh.d];
                double mx = -INFINITY, sum = 0;
                for (int u = 0; u < t; u++) {
                    const double *k = &qkv[((size_t)b * t + u) * ld + c + (size_t)h * sh.d];
                    double s = 0;
                    for (int e = 0; e < sh.d; e++)
                        s += q[e] * k[e];
                    row[u] = s * scale;
                    mx = fmax(mx, row[u]);
                }
                for (int u = 0; u < t; u++)
                    sum += exp(row[u] - mx);
                lse[((size_t)b * sh.heads + h) * t + i] = mx + log(sum);
            }
    return lse;
}

struct dev {
    uint16_t *qkv, *o, *d_o, *dqkv;
    float *stats;
    void *ws;
};

/* Forward then backward on s; 0, or -1 with a FAIL line. */
static int run_both(sf_sdpa_plan *p, cudnnHandle_t h, const dev &m, cudaStream_t s, const char *nm)
{
    char why[700];
    if (sf_sdpa_fwd(p, h, m.qkv, m.o, m.stats, m.ws, s) ||
        sf_sdpa_bwd(p, h, m.qkv, m.o, m.d_o, m.stats, m.dqkv, m.ws, s)) {
        snprintf(why, sizeof why, "run: %s", sf_cuda_last_error());
        fail(nm, why);
        return -1;
    }
    return 0;
}

static void check_all(const op_case &k, const char *nm, const char *how, const dev &m, const shape &sh,
                      const std::vector<double> &o_ref, const std::vector<double> &lse,
                      const std::vector<double> &dqkv_ref)
{
    const size_t rows = (size_t)sh.n * sh.t;
    const int c = sh.heads * sh.d;
    char name[300];
    snprintf(name, sizeof name, "%s%s: O", nm, how);
    check_max(name, downb(m.o, rows * c), o_ref, k.tol);
    std::vector<float> st(lse.size());
    CU(cudaMemcpy(st.data(), m.stats, st.size() * 4, cudaMemcpyDeviceToHost));
    snprintf(name, sizeof name, "%s%s: softmax statistics (log-sum-exp)", nm, how);
    check_max(name, st, lse, k.tol_param);
    const std::vector<float> g = downb(m.dqkv, rows * 3 * c);
    const char *pn[3] = {"dQ", "dK", "dV"};
    for (int j = 0; j < 3; j++) {
        snprintf(name, sizeof name, "%s%s: %s", nm, how, pn[j]);
        check_max(name, part(g, rows, c, j * c), part(dqkv_ref, rows, c, j * c), k.tol_aux);
    }
}

static void test_shape(cudnnHandle_t h, cudaStream_t s, const op_case &k, shape sh)
{
    char nm[120], why[1200];
    snprintf(nm, sizeof nm, "sdpa n=%d t=%d heads=%d d=%d", sh.n, sh.t, sh.heads, sh.d);
    const int c = sh.heads * sh.d;
    const size_t rows = (size_t)sh.n * sh.t, nqkv = rows * 3 * c, no = rows * c;

    sf_sdpa_plan *p = NULL;
    size_t ws_bytes = 0;
    char err[1024];
    if (sf_sdpa_plan_create(&p, h, sh.n, sh.t, sh.heads, sh.d, &ws_bytes, err, sizeof err)) {
        snprintf(why, sizeof why, "NO PLAN (the executor would fall back to materialised attention): %s", err);
        fail(nm, why);
        return;
    }
    char desc[300];
    printf("   %s\n", sf_sdpa_plan_describe(p, desc, sizeof desc));

    /* scores q.k/sqrt(d) with inputs uniform in [-2, 2] have a standard
     * deviation of 4/3: softmax rows far from uniform, yet not one-hot */
    std::vector<float> qkv(nqkv), d_o(no);
    rand_fill(qkv, 2.f);
    rand_fill(d_o, 1.f);
    round_bf16(qkv);
    round_bf16(d_o);
    const std::vector<double> qkv_d = to_d(qkv), d_o_d = to_d(d_o);
    std::vector<double> a((size_t)sh.n * sh.heads * sh.t * sh.t), o_ref(no), dqkv_ref(nqkv);
    sf_ref_attention_core_fwd_f64(qkv_d.data(), sh.n, sh.t, c, sh.heads, a.data(), o_ref.data());
    sf_ref_attention_core_bwd_f64(qkv_d.data(), a.data(), d_o_d.data(), sh.n, sh.t, c, sh.heads, dqkv_ref.data());
    const std::vector<double> lse = ref_lse(qkv_d, sh);

    dev m;
    m.qkv = dalloc<uint16_t>(nqkv);
    m.o = dalloc<uint16_t>(no);
    m.d_o = dalloc<uint16_t>(no);
    m.dqkv = dalloc<uint16_t>(nqkv);
    m.stats = dalloc<float>(lse.size());
    m.ws = ws_bytes ? (void *)dalloc<char>(ws_bytes) : NULL;
    upb(m.qkv, qkv);
    upb(m.d_o, d_o);

    /* eager */
    poison_b(m.o, no);
    poison_b(m.dqkv, nqkv);
    poison_f(m.stats, lse.size());
    if (run_both(p, h, m, s, nm) == 0) {
        CU(cudaStreamSynchronize(s));
        check_all(k, nm, "", m, sh, o_ref, lse, dqkv_ref);
    }

    /* captured into a CUDA graph and replayed, as the executor runs a step */
    poison_b(m.o, no);
    poison_b(m.dqkv, nqkv);
    poison_f(m.stats, lse.size());
    CU(cudaStreamSynchronize(s));
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    const int rc = run_both(p, h, m, s, nm);
    const cudaError_t ce = cudaStreamEndCapture(s, &graph);
    if (rc == 0 && ce != cudaSuccess) {
        snprintf(why, sizeof why, "stream capture: %s", cudaGetErrorString(ce));
        fail(nm, why);
    } else if (rc == 0) {
        CU(cudaGraphInstantiate(&exec, graph, 0));
        CU(cudaGraphLaunch(exec, s));
        CU(cudaStreamSynchronize(s));
        check_all(k, nm, " (CUDA graph)", m, sh, o_ref, lse, dqkv_ref);
        CU(cudaGraphExecDestroy(exec));
    }
    if (graph)
        CU(cudaGraphDestroy(graph));
    (void)cudaGetLastError();

    /* negative control: K and V swapped must be caught by the same criteria */
    std::vector<float> swapped(qkv);
    for (size_t r = 0; r < rows; r++)
        for (int j = 0; j < c; j++)
            std::swap(swapped[r * 3 * c + c + j], swapped[r * 3 * c + 2 * c + j]);
    upb(m.qkv, swapped);
    if (run_both(p, h, m, s, nm) == 0) {
        CU(cudaStreamSynchronize(s));
        const double eo = max_rel(downb(m.o, no), o_ref);
        const std::vector<float> g = downb(m.dqkv, nqkv);
        const double ek = max_rel(part(g, rows, c, c), part(dqkv_ref, rows, c, c));
        char name[300];
        snprintf(name, sizeof name, "%s: K and V swapped fail the checks (O err %.2e > %.0e, dK err %.2e > %.0e)",
                 nm, eo, k.tol, ek, k.tol_aux);
        pass_or_fail(name, eo > k.tol && ek > k.tol_aux, "the checks would not catch a K/V swap");
    }

    cudaFree(m.qkv);
    cudaFree(m.o);
    cudaFree(m.d_o);
    cudaFree(m.dqkv);
    cudaFree(m.stats);
    if (m.ws)
        cudaFree(m.ws);
    sf_sdpa_plan_destroy(p);
}

/* Whether the device has cuDNN's fused attention (sm_80 or newer); else
 * the case prints SKIPPED with the reason. */
static int has_fused_attention(void)
{
    int major = 0, minor = 0;
    CU(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    CU(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
    if (major < 8)
        printf("SKIPPED: sm_%d%d: cuDNN's fused attention needs sm_80 or newer\n", major, minor);
    return major >= 8;
}

/* shape {n, tokens, heads, head dimension}; tol, tol_param, tol_aux: the
 * Tolerances comment above */
void cmp_sdpa(const op_case &c, const op_env &e)
{
    if (has_fused_attention())
        test_shape(e.dnn, e.s, c, shape{c.shape[0], c.shape[1], c.shape[2], c.shape[3]});
}

/* A shape no engine takes is refused with its reason, not built. shape {n,
 * tokens, heads, head dimension above 128} */
void cmp_sdpa_refused(const op_case &c, const op_env &e)
{
    if (!has_fused_attention())
        return;
    sf_sdpa_plan *p = NULL;
    size_t ws = 0;
    char err[512] = "";
    const int rc = sf_sdpa_plan_create(&p, e.dnn, c.shape[0], c.shape[1], c.shape[2], c.shape[3], &ws, err, sizeof err);
    pass_or_fail("a head dimension above 128 is refused with a reason", rc == -1 && !p && strstr(err, "head_dim"),
                 "accepted, or the reason does not name head_dim");
}
