/* tests/gpu/ops/groupnorm.cu — GroupNorm (gpu/cuda/groupnorm.h) against the
 * double reference (sf_ref_groupnorm_fwd_f64/_bwd_f64): the output, the
 * saved statistics, dx (or none written when not wanted) and the weight and
 * bias gradients (without affine, no parameters at all; without a bias, the
 * weight's gradient alone: timm's GroupNorm1NoBias), fp32 and bf16,
 * NCHW and NHWC, over maps of odd sizes, groups of one channel
 * (InstanceNorm's grouping), one group (LayerNorm over C,H,W), flat features,
 * shifted data (the two-pass statistics), and the parameter gradients'
 * chunked reduction (several chunks a sample with a short last one, channel
 * vectors across groups, two channel tiles, more samples than chunks), whose
 * backward captured into a CUDA graph replays bit-equal; bad shapes and
 * arguments refused. The rows: tests/gpu/op_cases.cu; helpers and criteria:
 * op_test.h.
 */
#include "tests/gpu/op_cases.h"
#include "tests/gpu/op_test.h"

#include "gpu/cuda/groupnorm.h"

/* shape {n, c, h, w}; p {groups, dx wanted[, affine: 1 weight and bias
 * (absent: 1), 0 none, 2 a weight without a bias]}; f {eps,
 * x's offset}; tol: the output and dx (check_dt), tol_param: statistics and
 * parameter gradients */
void cmp_groupnorm(const op_case &k, const op_env &e)
{
    const cudaStream_t s = e.s;
    const sf_dtype dt = k.dt;
    const sf_layout lay = k.lay;
    const int n = k.shape[0], c = k.shape[1], h = k.shape[2], w = k.shape[3], g = k.p[0], want_dx = k.p[1];
    const int affine = k.p.size() > 2 ? k.p[2] : 1;
    const float eps = k.f[0], offset = k.f[1];
    char nm[200];
    const int bias = affine == 1;
    snprintf(nm, sizeof nm, "groupnorm %s %s n%d c%d %dx%d groups %d eps %g +%g%s%s", dtname(dt), lname(lay), n, c, h,
             w, g, eps, offset, want_dx ? "" : " no dx", affine == 2 ? " no bias" : affine ? "" : " no affine");
    const size_t hw = (size_t)h * w, nx = (size_t)n * c * hw, ns = (size_t)n * g, m = (size_t)(c / g) * hw;
    std::vector<float> x(nx), dy(nx), ga(c), be(c);
    rand_fill_dt(x, dt, 2.f, offset);
    rand_fill_dt(dy, dt, 1.f);
    rand_fill(ga, 0.5f, 1.f);
    rand_fill(be, 0.5f);
    std::vector<double> xd = to_d(x), dyd = to_d(dy), yr(nx), dxr(nx), dgr(c), dbr(c), mr(ns), rr(ns);
    std::vector<double> gad = to_d(ga), bed = to_d(be);
    sf_ref_groupnorm_fwd_f64(xd.data(), n, c, hw, g, affine ? gad.data() : NULL, bias ? bed.data() : NULL, eps,
                             yr.data());
    sf_ref_groupnorm_bwd_f64(xd.data(), n, c, hw, g, affine ? gad.data() : NULL, eps, dyd.data(), dxr.data(),
                             affine ? dgr.data() : NULL, bias ? dbr.data() : NULL);
    for (size_t st = 0; st < ns; st++) { /* group st = ni * g + gi is contiguous in NCHW */
        double sum = 0, v = 0;
        for (size_t i = 0; i < m; i++)
            sum += xd[st * m + i];
        const double mu = sum / (double)m;
        for (size_t i = 0; i < m; i++)
            v += (xd[st * m + i] - mu) * (xd[st * m + i] - mu);
        mr[st] = mu;
        rr[st] = 1.0 / sqrt(v / (double)m + eps);
    }
    const int nhwc = lay == SF_LAYOUT_NHWC;
    io_bufs b = io_make(dt, nhwc ? to_nhwc(x, n, c, h, w) : x, nhwc ? to_nhwc(dy, n, c, h, w) : dy);
    float *dga = dalloc<float>(c), *dbe = dalloc<float>(c), *dm = dalloc<float>(ns), *dr = dalloc<float>(ns),
          *ddg = dalloc<float>(c), *ddb = dalloc<float>(c);
    const size_t scr_bytes = sf_cuda_groupnorm_scratch_bytes(n, c, hw);
    char *scr = dalloc<char>(scr_bytes + 16);
    up(dga, ga);
    up(dbe, be);
    poison_f(ddg, c);
    poison_f(ddb, c);
    /* without affine: no parameters, and the gradients' buffers stay
     * poisoned; without a bias, its gradient's buffer does */
    float *pga = affine ? dga : NULL, *pbe = bias ? dbe : NULL, *pdg = affine ? ddg : NULL, *pdb = bias ? ddb : NULL;
    int rc = sf_cuda_groupnorm_fwd_dt(dt, lay, b.x.p, n, c, hw, g, pga, pbe, eps, b.y.p, dm, dr, s);
    auto bwd = [&](cudaStream_t st) {
        return sf_cuda_groupnorm_bwd_dt(dt, lay, b.x.p, b.dy.p, n, c, hw, g, pga, dm, dr, want_dx ? b.dx.p : NULL, pdg,
                                        pdb, scr, st);
    };
    if (!rc)
        rc = bwd(s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        check_lay(nm, "fwd y", b.y, lay, n, c, h, w, yr, k.tol);
        check_v(subname(nm, "fwd saved mean"), down(dm, ns), mr, k.tol_param);
        check_v(subname(nm, "fwd saved rstd"), down(dr, ns), rr, k.tol_param);
        check_dx_lay(nm, b.dx, lay, n, c, h, w, dxr, want_dx, k.tol);
        if (affine) {
            check_v(subname(nm, "bwd dweight"), down(ddg, c), dgr, k.tol_param);
            check_graph_replay(subname(nm, "bwd: captured graph replays bit-equal"), s, bwd,
                               {{ddg, c * sizeof(float)}, {ddb, c * sizeof(float)}});
        } else {
            size_t written = 0;
            for (const float v : down(ddg, c))
                written += !isnan(v);
            pass_or_fail(subname(nm, "bwd writes no weight gradient"), written == 0, "written");
        }
        if (bias) {
            check_v(subname(nm, "bwd dbias"), down(ddb, c), dbr, k.tol_param);
        } else {
            size_t written = 0;
            for (const float v : down(ddb, c))
                written += !isnan(v);
            pass_or_fail(subname(nm, "bwd writes no bias gradient"), written == 0, "written");
        }
    }
    io_free(b);
    cudaFree(dga); cudaFree(dbe); cudaFree(dm); cudaFree(dr); cudaFree(ddg); cudaFree(ddb); cudaFree(scr);
}

/* Groups that do not divide the channels, no groups, an unknown type, a
 * bias without a weight, and parameter gradients without scratch are refused
 * with the reason. */
void cmp_groupnorm_refused(const op_case &, const op_env &e)
{
    float *z = dalloc<float>(64);
    pass_or_fail("groupnorm refuses groups that do not divide the channels",
                 sf_cuda_groupnorm_fwd_dt(SF_DT_F32, SF_LAYOUT_NCHW, z, 2, 6, 1, 4, z, z, 1e-5f, z, z, z, e.s) == -1 &&
                     strstr(sf_cuda_last_error(), "groups") != NULL,
                 "accepted");
    sf_cuda_clear_error();
    pass_or_fail("groupnorm refuses 0 groups",
                 sf_cuda_groupnorm_bwd_dt(SF_DT_F32, SF_LAYOUT_NCHW, z, z, 2, 6, 1, 0, z, z, z, z, z, z, z, e.s) == -1,
                 "accepted");
    sf_cuda_clear_error();
    const int lone = sf_cuda_groupnorm_fwd_dt(SF_DT_F32, SF_LAYOUT_NCHW, z, 2, 6, 1, 3, NULL, z, 1e-5f, z, z, z, e.s);
    pass_or_fail("groupnorm refuses a bias without a weight",
                 lone == -1 && strstr(sf_cuda_last_error(), "bias") != NULL, "accepted");
    sf_cuda_clear_error();
    const int bare = sf_cuda_groupnorm_bwd_dt(SF_DT_F32, SF_LAYOUT_NHWC, z, z, 2, 6, 1, 3, z, z, z, z, z, z, NULL, e.s);
    pass_or_fail("groupnorm refuses parameter gradients without scratch",
                 bare == -1 && strstr(sf_cuda_last_error(), "scratch") != NULL, "accepted");
    sf_cuda_clear_error();
    pass_or_fail("groupnorm refuses an unknown type",
                 sf_cuda_groupnorm_fwd_dt((sf_dtype)7, SF_LAYOUT_NCHW, z, 2, 6, 1, 3, z, z, 1e-5f, z, z, z, e.s) == -1,
                 "accepted");
    sf_cuda_clear_error();
    cudaFree(z);
}
