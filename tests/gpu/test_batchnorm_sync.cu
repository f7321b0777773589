/* tests/gpu/test_batchnorm_sync.cu — the split BatchNorm2d of
 * distributed.batchnorm sync (sf_cuda_bn_sync_*, gpu/cuda/batchnorm.h) on one
 * GPU, with two ranks played in one process: each rank's half of a batch
 * makes its sums on the device, the host adds the two ranks' sums (the
 * all-reduce), and each rank normalises and back-propagates its half with
 * the summed sums. SyncBatchNorm over two ranks of n0 and n1 samples is
 * BatchNorm2d over the n0 + n1 samples, so the halves' outputs, statistics,
 * running statistics (the same bits on both ranks), input gradients and the
 * ranks' summed dgamma/dbeta are checked against sf_ref_bn2d_*_f64 on the
 * whole batch, and each rank's sums against the reference's own split
 * (sf_ref_bn2d_sync_stat_sums, sf_ref_bn2d_sync_grad_sums). fp32 and bf16,
 * NCHW and NHWC, with and without the fused ReLU, the bf16 row kernels and
 * the generic ones, and a rank with no samples. Then the four calls and a
 * host-free stand-in for the all-reduce captured into a CUDA graph replay
 * bit-equal to the eager run.
 * Prints "ok <case>" or "FAIL <case>: ..." per case; exits 1 on any failure,
 * 0 with "SKIPPED: no CUDA device" when there is no GPU.
 */
#include <cmath>

#include "tests/gpu/bn_inputs.h"
#include "tests/gpu/op_test.h"

/* The 2c per-channel sums: max |got - ref| <= tol * max |ref|, NaN failing;
 * the count (the last) exactly. */
static void check_sums(const char *name, const std::vector<double> &got, const std::vector<double> &ref, double tol)
{
    double worst = 0, scale = 0;
    int bad = 0;
    const size_t nc = ref.size() - 1;
    for (size_t i = 0; i < nc; i++) {
        scale = std::max(scale, fabs(ref[i]));
        if (!std::isfinite(got[i]))
            bad = 1;
        worst = std::max(worst, fabs(got[i] - ref[i]));
    }
    char why[200];
    snprintf(why, sizeof why, "max error %.3g of max %.3g (tol %.1g)%s; count %.17g, want %.17g", worst, scale, tol,
             bad ? ", non-finite" : "", got[nc], ref[nc]);
    pass_or_fail(name, !bad && worst <= tol * (scale > 0 ? scale : 1) && got[nc] == ref[nc], why);
}

static std::vector<double> down_sums(const double *d, int c)
{
    std::vector<double> h(2 * (size_t)c + 1);
    CU(cudaMemcpy(h.data(), d, h.size() * sizeof(double), cudaMemcpyDeviceToHost));
    return h;
}

static void up_sums(double *d, const std::vector<double> &h)
{
    CU(cudaMemcpy(d, h.data(), h.size() * sizeof(double), cudaMemcpyHostToDevice));
}

static std::vector<float> slice(const std::vector<float> &v, size_t from, size_t len)
{
    return std::vector<float>(v.begin() + (long)from, v.begin() + (long)(from + len));
}

/* One rank's device tensors. */
struct rank_t {
    int n;
    size_t len, from; /* elements, and where its samples start in the whole batch (NCHW) */
    dbuf x, y, dy, dx;
    float *rm, *rv, *sm, *si, *dg, *db;
    double *sums;
    void *scr;
};

static void rank_make(rank_t &k, sf_dtype dt, int n, size_t from, int c, int h, int w, sf_layout L, int mis)
{
    k.n = n;
    k.from = from;
    k.len = (size_t)n * c * h * w;
    const size_t cap = k.len ? k.len : 1;
    k.x = dbuf_make(dt, cap, mis);
    k.y = dbuf_make(dt, cap, mis);
    k.dy = dbuf_make(dt, cap, mis);
    k.dx = dbuf_make(dt, cap, mis);
    k.rm = dalloc<float>(c);
    k.rv = dalloc<float>(c);
    k.sm = dalloc<float>(c);
    k.si = dalloc<float>(c);
    k.dg = dalloc<float>(c);
    k.db = dalloc<float>(c);
    k.sums = dalloc<double>(2 * (size_t)c + 1);
    k.scr = dalloc<char>(sf_cuda_bn_scratch_bytes(n ? n : 1, c, h, w, L));
}

static void rank_free(rank_t &k)
{
    dbuf_free(k.x); dbuf_free(k.y); dbuf_free(k.dy); dbuf_free(k.dx);
    cudaFree(k.rm); cudaFree(k.rv); cudaFree(k.sm); cudaFree(k.si); cudaFree(k.dg); cudaFree(k.db);
    cudaFree(k.sums); cudaFree(k.scr);
}

/* A rank's tensor back in the whole batch's NCHW order at its offset. */
static void gather(std::vector<float> &whole, const rank_t &k, const dbuf &b, int c, int h, int w, int nhwc)
{
    if (!k.n)
        return;
    std::vector<float> v = down_dt(b, k.len);
    if (nhwc)
        v = to_nchw(v, k.n, c, h, w);
    std::copy(v.begin(), v.end(), whole.begin() + (long)k.from);
}

/* One half of a synchronised pass: each rank's sums (sums(k) launches them
 * into k.sums; want(k, ref) writes the reference's split of a rank with
 * samples), checked under "<nm> rank of <n> <what> sums" within tol, then
 * their sum over the ranks, what the all-reduce gives, in every rank's
 * k.sums and apply(k) on each rank. 0, or the failing launch's result. */
template <class Sums, class Want, class Apply>
static int sync_pass(cudaStream_t s, rank_t (&R)[2], int c, const char *nm, const char *what, double tol, Sums sums,
                     Want want, Apply apply)
{
    const size_t ns = 2 * (size_t)c + 1;
    std::vector<double> total(ns, 0.0);
    int rc = 0;
    for (rank_t &k : R) {
        rc = sums(k);
        CU(cudaStreamSynchronize(s));
        if (rc)
            return rc;
        std::vector<double> got = down_sums(k.sums, c), ref(ns, 0.0);
        if (k.n)
            want(k, ref);
        char sub[280];
        snprintf(sub, sizeof sub, "%s rank of %d %s sums", nm, k.n, what);
        check_sums(sub, got, ref, tol);
        for (size_t i = 0; i < ns; i++)
            total[i] += got[i];
    }
    for (rank_t &k : R) {
        up_sums(k.sums, total);
        if ((rc = apply(k)))
            break;
    }
    CU(cudaStreamSynchronize(s));
    return rc;
}

static void test_bn_sync(cudaStream_t s, sf_dtype dt, int n0, int n1, int c, int h, int w, sf_layout L, int relu,
                         int mis)
{
    char nm[200], sub[280];
    snprintf(nm, sizeof nm, "bn sync %s ranks of %d+%d c%d %dx%d %s%s%s", dtname(dt), n0, n1, c, h, w, lname(L),
             relu ? " +relu" : "", mis ? " misaligned" : "");
    const int n = n0 + n1, nhwc = L == SF_LAYOUT_NHWC;
    const size_t hw = (size_t)h * w, len = (size_t)n * c * hw, ns = 2 * (size_t)c + 1;
    const float eps = k_bn_eps, mom = k_bn_mom;
    /* the sums: fp32 values less the shift round once (~1e-7 of a value)
     * before they are summed in double; bf16 vectors are summed in fp32 */
    const double tolc = dt == SF_DT_BF16 ? 1e-3 : 1e-4, tols = dt == SF_DT_BF16 ? 1e-6 : 1e-7;
    /* the whole batch's inputs, and the whole batch through BatchNorm2d in double */
    bn_ref r = bn_draw(dt, n, c, h, w);
    const std::vector<float> &x = r.x, &dy = r.dy;
    const std::vector<double> &xd = r.xd, &gd = r.gd, &smr = r.smr, &sir = r.sir, &rmd = r.rmr, &rvd = r.rvr;
    std::vector<double> &yr = r.yr, dyd = to_d(dy), dxr(len), dgr(c), dbr(c);
    if (relu)
        for (size_t i = 0; i < len; i++)
            yr[i] = yr[i] > 0 ? yr[i] : 0;

    float *d_g = dalloc<float>(c), *d_b = dalloc<float>(c);
    up(d_g, r.gamma);
    up(d_b, r.beta);
    rank_t R[2];
    rank_make(R[0], dt, n0, 0, c, h, w, L, mis);
    rank_make(R[1], dt, n1, (size_t)n0 * c * hw, c, h, w, L, mis);
    for (rank_t &k : R) {
        if (k.n) {
            std::vector<float> xr = slice(x, k.from, k.len), dyr = slice(dy, k.from, k.len);
            up_dt(k.x, nhwc ? to_nhwc(xr, k.n, c, h, w) : xr);
            up_dt(k.dy, nhwc ? to_nhwc(dyr, k.n, c, h, w) : dyr);
        }
        up(k.rm, r.rm);
        up(k.rv, r.rv);
        poison_dt(k.y);
        poison_dt(k.dx);
        poison_f(k.sm, c);
        poison_f(k.si, c);
        /* a rank without samples writes no weight gradient: the executor zeroed it */
        CU(cudaMemset(k.dg, 0, sizeof(float) * c));
        CU(cudaMemset(k.db, 0, sizeof(float) * c));
        poison(k.sums, ns * sizeof(double));
    }
    std::vector<float> y(len), dx(len);

    /* forward: each rank's sums, their sum (the all-reduce), each rank's apply */
    if (sync_pass(
            s, R, c, nm, "forward", tols,
            [&](rank_t &k) { return sf_cuda_bn_sync_fwd_sums_dt(dt, k.x.p, k.n, c, h, w, L, k.sums, k.scr, s); },
            [&](const rank_t &k, std::vector<double> &want) {
                sf_ref_bn2d_sync_stat_sums(x.data() + k.from, k.n, c, h, w, want.data());
            },
            [&](rank_t &k) {
                return sf_cuda_bn_sync_fwd_dt(dt, k.x.p, k.n, c, h, w, L, d_g, d_b, eps, mom, k.sums, k.rm, k.rv, k.sm,
                                              k.si, NULL, k.y.p, relu, s);
            })) {
        fail(nm, sf_cuda_last_error());
        goto done;
    }
    for (const rank_t &k : R)
        gather(y, k, k.y, c, h, w, nhwc);
    snprintf(sub, sizeof sub, "%s train y", nm);
    check_dt(sub, dt, y, yr, 1e-4);
    snprintf(sub, sizeof sub, "%s save_mean", nm);
    check_v(sub, down(R[0].sm, c), smr, tolc);
    snprintf(sub, sizeof sub, "%s save_invstd", nm);
    check_v(sub, down(R[0].si, c), sir, tolc);
    snprintf(sub, sizeof sub, "%s running_mean", nm);
    check_v(sub, down(R[0].rm, c), rmd, tolc);
    snprintf(sub, sizeof sub, "%s running_var", nm);
    check_v(sub, down(R[0].rv, c), rvd, tolc);
    {
        std::vector<float> a = down(R[0].rm, c), b = down(R[1].rm, c), av = down(R[0].rv, c), bv = down(R[1].rv, c);
        snprintf(sub, sizeof sub, "%s running statistics the same bits on both ranks", nm);
        pass_or_fail(sub, a == b && av == bv, "the ranks' running statistics differ");
    }

    /* backward: dy masked by the device's own ReLU output, as the forward decided */
    if (relu)
        for (size_t i = 0; i < len; i++)
            if (!(y[i] > 0))
                dyd[i] = 0;
    sf_ref_bn2d_bwd_f64(xd.data(), n, c, h, w, gd.data(), smr.data(), sir.data(), dyd.data(), dxr.data(), dgr.data(),
                        dbr.data());
    if (sync_pass(
            s, R, c, nm, "backward", dt == SF_DT_BF16 ? 1e-5 : 1e-6,
            [&](rank_t &k) {
                return sf_cuda_bn_sync_bwd_sums_dt(dt, k.x.p, k.n, c, h, w, L, d_g, d_b, k.sm, k.si, k.dy.p,
                                                   relu ? k.y.p : NULL, k.dx.p, k.dg, k.db, k.sums, k.scr, s);
            },
            [&](const rank_t &k, std::vector<double> &want) {
                /* the reference's split on this rank's (masked) dy and the device's statistics */
                std::vector<float> dym(k.len), sm = down(k.sm, c), si = down(k.si, c);
                for (size_t i = 0; i < k.len; i++)
                    dym[i] = (float)dyd[k.from + i];
                sf_ref_bn2d_sync_grad_sums(x.data() + k.from, k.n, c, h, w, sm.data(), si.data(), dym.data(),
                                           want.data());
            },
            [&](rank_t &k) {
                return sf_cuda_bn_sync_bwd_dx_dt(dt, k.x.p, k.n, c, h, w, L, d_g, d_b, k.sm, k.si, k.dy.p,
                                                 relu ? k.y.p : NULL, k.dx.p, k.sums, k.scr, s);
            })) {
        fail(nm, sf_cuda_last_error());
        goto done;
    }
    for (const rank_t &k : R)
        gather(dx, k, k.dx, c, h, w, nhwc);
    snprintf(sub, sizeof sub, "%s bwd dx", nm);
    if ((size_t)n * hw > 2) {
        check_dt(sub, dt, dx, dxr, 1e-4);
    } else {
        /* Two values a channel: x-hat is +-sqrt(var / (var + eps)), so dx is
         * the O(eps / var) remainder of terms of the size of dy * gamma *
         * invstd, which rounding to fp32 (bf16) leaves about 1e-7 (4e-3) of
         * that size off; dx is judged against the terms' size, not its own. */
        double scale = 0, err = 0;
        for (size_t i = 0; i < len; i++) {
            const size_t ch = (i / hw) % (size_t)c;
            scale = fmax(scale, fabs(dyd[i]) * gd[ch] * sir[ch]);
            err = fmax(err, fabs((double)dx[i] - dxr[i]));
        }
        char why[160];
        snprintf(why, sizeof why, "max error %.3g of terms up to %.3g", err, scale);
        pass_or_fail(sub, err <= (dt == SF_DT_BF16 ? 1e-2 : 1e-5) * scale, why);
    }
    {
        /* each rank's dgamma, dbeta are its own sums; the gradient all-reduce adds them */
        std::vector<float> dg0 = down(R[0].dg, c), dg1 = down(R[1].dg, c), db0 = down(R[0].db, c),
                           db1 = down(R[1].db, c), dg(c), db(c);
        for (int i = 0; i < c; i++) {
            dg[i] = dg0[i] + dg1[i];
            db[i] = db0[i] + db1[i];
        }
        snprintf(sub, sizeof sub, "%s bwd dgamma summed over the ranks", nm);
        check_v(sub, dg, dgr, tolc);
        snprintf(sub, sizeof sub, "%s bwd dbeta summed over the ranks", nm);
        check_v(sub, db, dbr, tolc);
    }
done:
    rank_free(R[0]);
    rank_free(R[1]);
    cudaFree(d_g);
    cudaFree(d_b);
}

/* The four calls of one rank, with a device-side stand-in for the
 * all-reduce between them (the sums doubled, as two ranks with the same
 * batch would add them), captured into a CUDA graph: the replay is
 * bit-equal to the eager run (the launchers allocate and synchronise
 * nothing, and their reductions are deterministic). */
__global__ void k_twice(double *p, size_t n)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] *= 2.0;
}

static void test_bn_sync_graph_replay(cudaStream_t s, sf_dtype dt, sf_layout L, int n, int c, int hw, int relu)
{
    char nm[200];
    snprintf(nm, sizeof nm, "bn sync %s %s n%d c%d %dx%d%s: captured graph replays bit-equal", dtname(dt), lname(L), n,
             c, hw, hw, relu ? " +relu" : "");
    const size_t ns = 2 * (size_t)c + 1;
    bn_dev_case t = {};
    double *sums = dalloc<double>(ns);
    auto reduce = [&](cudaStream_t st) {
        k_twice<<<(unsigned)((ns + 255) / 256), 256, 0, st>>>(sums, ns);
        return cudaGetLastError() != cudaSuccess;
    };
    auto enq = [&](cudaStream_t st) {
        return sf_cuda_fill(t.rm, c, 0.f, st) || sf_cuda_fill(t.rv, c, 1.f, st) ||
               sf_cuda_bn_sync_fwd_sums_dt(dt, t.x, n, c, hw, hw, L, sums, t.scr, st) || reduce(st) ||
               sf_cuda_bn_sync_fwd_dt(dt, t.x, n, c, hw, hw, L, t.g, t.b, k_bn_eps, k_bn_mom, sums, t.rm, t.rv, t.sm,
                                      t.si, NULL, t.y, relu, st) ||
               sf_cuda_bn_sync_bwd_sums_dt(dt, t.x, n, c, hw, hw, L, t.g, t.b, t.sm, t.si, t.dy, relu ? t.y : NULL,
                                           t.dx, t.dg, t.db, sums, t.scr, st) ||
               reduce(st) ||
               sf_cuda_bn_sync_bwd_dx_dt(dt, t.x, n, c, hw, hw, L, t.g, t.b, t.sm, t.si, t.dy, relu ? t.y : NULL, t.dx,
                                         sums, t.scr, st);
    };
    if (bn_dev_case_make(t, dt, n, c, hw, hw, L, s))
        fail(nm, sf_cuda_last_error());
    else
        check_graph_replay(nm, s, enq,
                           {{t.dx, t.bytes}, {t.dg, c * sizeof(float)}, {t.db, c * sizeof(float)},
                            {t.rv, c * sizeof(float)}});
    bn_dev_case_free(t);
    cudaFree(sums);
}

static void run_cases(cudaStream_t s)
{
    for (const sf_dtype dt : k_dtypes)
        for (const sf_layout L : k_layouts) {
            test_bn_sync(s, dt, 2, 2, 64, 28, 28, L, 1, 0); /* bf16 NHWC: the row kernels */
            test_bn_sync(s, dt, 3, 1, 512, 7, 7, L, 0, 0);  /* unequal ranks */
            test_bn_sync(s, dt, 8, 8, 64, 16, 16, L, 1, 0); /* many chunks */
            test_bn_sync(s, dt, 2, 3, 24, 5, 5, L, 1, 0);   /* C/8 odd */
            test_bn_sync(s, dt, 2, 2, 3, 5, 7, L, 1, 0);    /* C % 8 != 0: scalar */
            test_bn_sync(s, dt, 2, 2, 64, 9, 9, L, 1, 1);   /* misaligned: scalar fallback */
            test_bn_sync(s, dt, 1, 1, 6, 1, 1, L, 0, 0);    /* one value per channel on each rank */
            test_bn_sync(s, dt, 4, 0, 64, 14, 14, L, 1, 0); /* the second rank has no samples */
        }
    for (const sf_dtype dt : k_dtypes)
        for (const sf_layout L : k_layouts)
            test_bn_sync_graph_replay(s, dt, L, 16, 64, 28, dt == SF_DT_BF16);
}

int main(void)
{
    return run_op_test("test_batchnorm_sync", run_cases);
}
