/* tests/gpu/ops/dropout.cu — dropout, channel dropout and stochastic depth
 * (gpu/cuda/dropout.h) against the reference's float functions
 * (sf_ref_dropout_fwd, sf_ref_dropout2d_fwd, sf_ref_stochastic_depth_fwd),
 * bit for bit: the same
 * counter-based keys must drop the same elements and scale the kept ones
 * alike, in fp32 and bf16 (the reference's output rounded to bf16), NCHW and
 * NHWC (each element keyed by its NCHW index), at odd sizes (n=3, C=3, 7x5)
 * and on flat features, for p in {0, 0.3, 1}, in place too, one element
 * off 16-byte alignment, on samples larger than the vector kernels' unrolled
 * passes and past the grid's 65 535 rows. The batch
 * sequence number is read from device memory: a launch captured into a CUDA
 * graph and replayed after the value changed draws the new sequence's mask
 * (what the executor's captured step relies on); a NULL sequence is 0.
 * The rows: tests/gpu/op_cases.cu; helpers and criteria: op_test.h.
 */
#include "tests/gpu/op_cases.h"
#include "tests/gpu/op_test.h"

#include "gpu/cuda/dropout.h"

static const uint64_t SEED = 0x5eed1234abcdull, LAYER = 7;

/* The reference's output for sequence seq, as the device stores it (bf16: rounded). */
static const char *const UNIT_NAME[3] = {"dropout", "stochastic_depth", "dropout2d"};

static std::vector<double> reference(sf_dtype dt, const std::vector<float> &x, int n, int c, size_t hw, float p,
                                     uint64_t seq, int unit)
{
    std::vector<float> y(x.size());
    if (unit == SF_DROP_SAMPLE)
        sf_ref_stochastic_depth_fwd(x.data(), n, (size_t)c * hw, p, SEED, seq, LAYER, y.data());
    else if (unit == SF_DROP_CHANNEL)
        sf_ref_dropout2d_fwd(x.data(), n, c, hw, p, SEED, seq, LAYER, y.data());
    else
        sf_ref_dropout_fwd(x.data(), n, (size_t)c * hw, p, SEED, seq, LAYER, y.data());
    round_dt(y, dt);
    return to_d(y);
}

static void test_dropout(cudaStream_t s, sf_dtype dt, sf_layout lay, int n, int c, int h, int w, float p, int unit,
                         int in_place, int mis)
{
    char nm[200];
    snprintf(nm, sizeof nm, "%s %s %s n%d c%d %dx%d p %g%s%s", UNIT_NAME[unit], dtname(dt),
             lname(lay), n, c, h, w, (double)p, in_place ? " in place" : "", mis ? " misaligned" : "");
    const size_t hw = (size_t)h * w, elems = (size_t)c * hw, len = (size_t)n * elems;
    std::vector<float> x(len);
    rand_fill_dt(x, dt, 1.f);
    const uint64_t seq = 1234567;
    const std::vector<double> ref = reference(dt, x, n, c, hw, p, seq, unit);
    dbuf bx = dbuf_make(dt, len, mis), by = dbuf_make(dt, len, mis);
    uint64_t *d_seq = dalloc<uint64_t>(1);
    CU(cudaMemcpy(d_seq, &seq, sizeof seq, cudaMemcpyHostToDevice));
    up_dt(bx, to_lay(x, lay, n, c, h, w));
    poison_dt(by);
    const dbuf &out = in_place ? bx : by;
    const int rc = sf_cuda_dropout_dt(dt, lay, bx.p, out.p, n, c, hw, p, SEED, d_seq, LAYER, (sf_drop_unit)unit, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        const std::vector<float> got = from_lay(down_dt(out, len), lay, n, c, h, w);
        check_ulp(nm, got, ref, 0, 0);
        const size_t units = unit == SF_DROP_SAMPLE ? (size_t)n : unit == SF_DROP_CHANNEL ? (size_t)n * c : len;
        if (p > 0 && p < 1 && units >= 16) { /* the mask is a mask: some of each (3 samples may all stay) */
            size_t zeros = 0;
            for (float v : got)
                zeros += v == 0.f;
            char sub[260];
            snprintf(sub, sizeof sub, "%s drops some and keeps some", nm);
            pass_or_fail(sub, zeros > 0 && zeros < len, "all kept or all dropped");
        }
    }
    dbuf_free(bx); dbuf_free(by);
    cudaFree(d_seq);
}

/* A captured launch reads the sequence at each replay. */
static void test_graph_replay(cudaStream_t s, sf_dtype dt, sf_layout lay, int unit)
{
    char nm[160];
    snprintf(nm, sizeof nm, "%s %s %s captured: each replay draws its sequence's mask", UNIT_NAME[unit], dtname(dt),
             lname(lay));
    const int n = 3, c = 3, h = 7, w = 5;
    const size_t hw = (size_t)h * w, elems = (size_t)c * hw, len = (size_t)n * elems;
    const float p = unit == SF_DROP_ELEMENT ? 0.3f : 0.5f;
    std::vector<float> x(len);
    rand_fill_dt(x, dt, 1.f);
    dbuf bx = dbuf_make(dt, len, 0), by = dbuf_make(dt, len, 0);
    uint64_t *d_seq = dalloc<uint64_t>(1);
    up_dt(bx, to_lay(x, lay, n, c, h, w));
    CU(cudaDeviceSynchronize());
    cudaStream_t cs;
    CU(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    cudaGraph_t gr = NULL;
    cudaGraphExec_t ex = NULL;
    CU(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
    const int rc = sf_cuda_dropout_dt(dt, lay, bx.p, by.p, n, c, hw, p, SEED, d_seq, LAYER, (sf_drop_unit)unit, cs);
    CU(cudaStreamEndCapture(cs, &gr));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        CU(cudaGraphInstantiate(&ex, gr, 0));
        int good = 1, differ = 0;
        std::vector<float> prev;
        for (uint64_t seq = 40; seq < 44; seq++) {
            CU(cudaMemcpy(d_seq, &seq, sizeof seq, cudaMemcpyHostToDevice));
            poison_dt(by);
            CU(cudaDeviceSynchronize()); /* cs does not wait for the legacy stream's copy and fill */
            CU(cudaGraphLaunch(ex, cs));
            CU(cudaStreamSynchronize(cs));
            const std::vector<float> got = from_lay(down_dt(by, len), lay, n, c, h, w);
            const std::vector<double> ref = reference(dt, x, n, c, hw, p, seq, unit);
            for (size_t e = 0; e < len; e++)
                good &= (double)got[e] == ref[e];
            if (!prev.empty())
                differ += memcmp(prev.data(), got.data(), sizeof(float) * len) != 0;
            prev = got;
        }
        pass_or_fail(nm, good && differ > 0, good ? "every replay drew the same mask" : "a replay's mask is not its sequence's");
        cudaGraphExecDestroy(ex);
    }
    if (gr)
        cudaGraphDestroy(gr);
    CU(cudaStreamDestroy(cs));
    dbuf_free(bx); dbuf_free(by);
    cudaFree(d_seq);
}

/* seq NULL: the key's sequence is 0. */
static void test_null_seq(cudaStream_t s)
{
    const int n = 2, c = 3;
    const size_t len = (size_t)n * c;
    std::vector<float> x(len);
    rand_fill(x, 1.f);
    const std::vector<double> ref = reference(SF_DT_F32, x, n, c, 1, 0.5f, 0, SF_DROP_ELEMENT);
    dbuf bx = dbuf_make(SF_DT_F32, len, 0), by = dbuf_make(SF_DT_F32, len, 0);
    up_dt(bx, x);
    poison_dt(by);
    const int rc = sf_cuda_dropout_dt(SF_DT_F32, SF_LAYOUT_NCHW, bx.p, by.p, n, c, 1, 0.5f, SEED, NULL, LAYER,
                                      SF_DROP_ELEMENT, s);
    CU(cudaStreamSynchronize(s));
    if (rc)
        fail("dropout with no sequence pointer", sf_cuda_last_error());
    else
        check_ulp("dropout with no sequence pointer draws sequence 0", down_dt(by, len), ref, 0, 0);
    const int bad = sf_cuda_dropout_dt(SF_DT_F32, SF_LAYOUT_NCHW, bx.p, by.p, n, c, 1, 1.5f, SEED, NULL, LAYER,
                                       SF_DROP_ELEMENT, s);
    pass_or_fail("dropout refuses p outside [0, 1]", bad == -1, "accepted");
    sf_cuda_clear_error();
    const int bad_unit = sf_cuda_dropout_dt(SF_DT_F32, SF_LAYOUT_NCHW, bx.p, by.p, n, c, 1, 0.5f, SEED, NULL, LAYER,
                                            (sf_drop_unit)3, s);
    pass_or_fail("dropout refuses an unknown unit", bad_unit == -1, "accepted");
    sf_cuda_clear_error();
    dbuf_free(bx); dbuf_free(by);
}

/* shape {n, c, h, w}; p {unit (sf_drop_unit: elements, whole samples,
 * whole channels), in place, x and y one element off 16-byte alignment
 * (absent: aligned)}; f {p} */
void cmp_dropout(const op_case &c, const op_env &e)
{
    test_dropout(e.s, c.dt, c.lay, c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.f[0], c.p[0], c.p[1],
                 c.p.size() > 2 ? c.p[2] : 0);
}
/* p {unit} */
void cmp_dropout_graph_replay(const op_case &c, const op_env &e) { test_graph_replay(e.s, c.dt, c.lay, c.p[0]); }
void cmp_dropout_null_seq(const op_case &, const op_env &e) { test_null_seq(e.s); }
