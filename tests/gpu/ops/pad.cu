/* tests/gpu/ops/pad.cu — F.pad of gpu/cuda/pad.h against the
 * double-precision reference (gpu/ref/pad.c): the forward exactly (copies
 * and the constant fill), the backward's gather (each input's sum of the
 * output gradients that read it) in fp32 (norm check) and bf16 (half a
 * bf16 ulp: check_dt), and twice bit-identical; every mode, symmetric and
 * asymmetric pads, reflect's and circular's largest pads, an axis of one
 * (replicate: both edges are the one element), NCHW and NHWC. Pads past a
 * mode's bounds, negative ones and an unknown mode are refused. The rows:
 * tests/gpu/op_cases.cu; helpers and the criteria they apply: op_test.h.
 */
#include "tests/gpu/op_cases.h"
#include "tests/gpu/op_test.h"

#include "gpu/cuda/pad.h"

static const char *const PAD_MODES[] = {"constant", "reflect", "replicate", "circular"};

/* shape {n, c, h, w}; p {left, right, top, bottom, mode (SF_PAD_*)}; f
 * {value} (mode constant; a bf16-exact number); tol: dx (the forward is
 * exact) */
void cmp_pad(const op_case &k, const op_env &e)
{
    const cudaStream_t s = e.s;
    const sf_dtype dt = k.dt;
    const sf_layout lay = k.lay;
    const int n = k.shape[0], c = k.shape[1], h = k.shape[2], w = k.shape[3];
    const int pad[4] = {k.p[0], k.p[1], k.p[2], k.p[3]}, mode = k.p[4];
    const float value = k.f.empty() ? 0.f : k.f[0];
    const int oh = h + pad[2] + pad[3], ow = w + pad[0] + pad[1];
    char nm[200];
    snprintf(nm, sizeof nm, "pad %s %s %s n%d c%d %dx%d [%d, %d, %d, %d] value %g", PAD_MODES[mode], dtname(dt),
             lname(lay), n, c, h, w, pad[0], pad[1], pad[2], pad[3], value);
    const size_t xl = (size_t)n * c * h * w, yl = (size_t)n * c * oh * ow;
    std::vector<float> x(xl), dy(yl);
    rand_fill_dt(x, dt, 1.f);
    rand_fill_dt(dy, dt, 1.f);
    std::vector<double> yr(yl), dxr(xl);
    sf_ref_pad_fwd_f64(to_d(x).data(), n, c, h, w, pad, mode, value, yr.data());
    sf_ref_pad_bwd_f64(to_d(dy).data(), n, c, h, w, pad, mode, dxr.data());
    io_bufs b = io_make(dt, to_lay(x, lay, n, c, h, w), to_lay(dy, lay, n, c, oh, ow));
    int rc = sf_cuda_pad_fwd_dt(dt, lay, b.x.p, n, c, h, w, pad, mode, value, b.y.p, s);
    if (!rc)
        rc = sf_cuda_pad_bwd_dt(dt, lay, b.dy.p, n, c, h, w, pad, mode, b.dx.p, s);
    if (ran_ok(s, nm, rc)) {
        check_ulp(subname(nm, "fwd (exact)"), from_lay(down_dt(b.y, yl), lay, n, c, oh, ow), yr, 0, 0);
        check_lay(nm, "dx", b.dx, lay, n, c, h, w, dxr, k.tol);
        /* a gather in a fixed order: the same bits again */
        const std::vector<float> first = down_dt(b.dx, xl);
        poison_dt(b.dx);
        const subname sub(nm, "dx again, bit-identical");
        if (ran_ok(s, sub, sf_cuda_pad_bwd_dt(dt, lay, b.dy.p, n, c, h, w, pad, mode, b.dx.p, s)))
            pass_or_fail(sub, memcmp(first.data(), down_dt(b.dx, xl).data(), sizeof(float) * xl) == 0,
                         "differs from the first run");
    }
    io_free(b);
}

/* Reflect's pad at its axis's size, circular's past it, a negative pad and
 * an unknown mode are refused, forward and backward. */
void cmp_pad_refused(const op_case &k, const op_env &e)
{
    float *p = dalloc<float>(256);
    const struct {
        int pad[4], mode;
        const char *what;
    } bad[] = {{{0, 0, 4, 0}, SF_PAD_REFLECT, "a reflect pad of the height (4)"},
               {{0, 6, 0, 0}, SF_PAD_CIRCULAR, "a circular pad past the width (5)"},
               {{-1, 0, 0, 0}, SF_PAD_CONSTANT, "a negative pad"},
               {{1, 1, 1, 1}, 7, "mode 7"}};
    for (const auto &b : bad) {
        const int rf = sf_cuda_pad_fwd_dt(SF_DT_F32, SF_LAYOUT_NCHW, p, 1, 2, 4, 5, b.pad, b.mode, 0.f, p + 64, e.s);
        const int rb = sf_cuda_pad_bwd_dt(SF_DT_F32, SF_LAYOUT_NHWC, p + 64, 1, 2, 4, 5, b.pad, b.mode, p, e.s);
        char nm[120];
        snprintf(nm, sizeof nm, "pad refuses %s, forward and backward", b.what);
        pass_or_fail(nm, rf == -1 && rb == -1 && strstr(sf_cuda_last_error(), "pad"), "accepted");
    }
    cudaFree(p);
}
