/* tests/gpu/ops/channels.cu — the channel shuffle, the channel slice and the
 * pixel shuffle (gpu/cuda/channels.h) against the reference
 * (sf_ref_channel_shuffle_f64, sf_ref_channel_slice_fwd_f64/_bwd_f64,
 * sf_ref_pixel_shuffle_f64): forward and input gradient, exactly (copies,
 * and the slice gradient's zeros outside its channels), in fp32 and bf16,
 * NCHW and NHWC, odd sizes; and groups that do not divide the channels, a
 * slice past them, or a pixel shuffle's factor of 0, refused. The rows:
 * tests/gpu/op_cases.cu; helpers and the criteria they apply: op_test.h.
 */
#include "tests/gpu/op_cases.h"
#include "tests/gpu/op_test.h"

#include "gpu/cuda/channels.h"

/* The shuffle by g and its backward (the shuffle by c / g) on a random map.
 * shape {n, c, h, w}; p {groups}; tol 0 (copies: exact) */
void cmp_channel_shuffle(const op_case &c, const op_env &e)
{
    const sf_dtype dt = c.dt;
    const sf_layout lay = c.lay;
    const int n = c.shape[0], ch = c.shape[1], h = c.shape[2], w = c.shape[3], g = c.p[0];
    const size_t hw = (size_t)h * w, len = (size_t)n * ch * hw;
    char nm[160], sub[200];
    snprintf(nm, sizeof nm, "channel_shuffle %s %s n%d c%d %dx%d groups %d", dtname(dt), lname(lay), n, ch, h, w, g);
    std::vector<float> x(len), dy(len);
    rand_fill_dt(x, dt, 1.f);
    rand_fill_dt(dy, dt, 1.f);
    std::vector<double> yr(len), dxr(len);
    sf_ref_channel_shuffle_f64(to_d(x).data(), n, ch, hw, g, yr.data());
    sf_ref_channel_shuffle_f64(to_d(dy).data(), n, ch, hw, ch / g, dxr.data());
    io_bufs b = io_make(dt, to_lay(x, lay, n, ch, h, w), to_lay(dy, lay, n, ch, h, w));
    int rc = sf_cuda_channel_shuffle_dt(dt, lay, b.x.p, n, ch, hw, g, b.y.p, e.s);
    if (!rc)
        rc = sf_cuda_channel_shuffle_dt(dt, lay, b.dy.p, n, ch, hw, ch / g, b.dx.p, e.s);
    CU(cudaStreamSynchronize(e.s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        snprintf(sub, sizeof sub, "%s fwd (exact)", nm);
        check_ulp(sub, from_lay(down_dt(b.y, len), lay, n, ch, h, w), yr, c.tol, c.tol);
        snprintf(sub, sizeof sub, "%s dx (exact)", nm);
        check_ulp(sub, from_lay(down_dt(b.dx, len), lay, n, ch, h, w), dxr, c.tol, c.tol);
    }
    io_free(b);
}

/* The slice [start, start + count) and its backward, which writes the whole
 * input gradient (the zeros too: dx starts poisoned). shape {n, c, h, w};
 * p {start, count}; tol 0 (exact) */
void cmp_channel_slice(const op_case &c, const op_env &e)
{
    const sf_dtype dt = c.dt;
    const sf_layout lay = c.lay;
    const int n = c.shape[0], ch = c.shape[1], h = c.shape[2], w = c.shape[3], start = c.p[0], count = c.p[1];
    const size_t hw = (size_t)h * w, len = (size_t)n * ch * hw, slen = (size_t)n * count * hw;
    char nm[160], sub[200];
    snprintf(nm, sizeof nm, "channel_slice %s %s n%d c%d %dx%d [%d, %d)", dtname(dt), lname(lay), n, ch, h, w, start,
             start + count);
    std::vector<float> x(len), dy(slen);
    rand_fill_dt(x, dt, 1.f);
    rand_fill_dt(dy, dt, 1.f);
    std::vector<double> yr(slen), dxr(len);
    sf_ref_channel_slice_fwd_f64(to_d(x).data(), n, ch, hw, start, count, yr.data());
    sf_ref_channel_slice_bwd_f64(to_d(dy).data(), n, ch, hw, start, count, dxr.data());
    io_bufs b = io_make(dt, to_lay(x, lay, n, ch, h, w), to_lay(dy, lay, n, count, h, w));
    int rc = sf_cuda_channel_slice_fwd_dt(dt, lay, b.x.p, n, ch, hw, start, count, b.y.p, e.s);
    if (!rc)
        rc = sf_cuda_channel_slice_bwd_dt(dt, lay, b.dy.p, n, ch, hw, start, count, b.dx.p, e.s);
    CU(cudaStreamSynchronize(e.s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        snprintf(sub, sizeof sub, "%s fwd (exact)", nm);
        check_ulp(sub, from_lay(down_dt(b.y, slen), lay, n, count, h, w), yr, c.tol, c.tol);
        snprintf(sub, sizeof sub, "%s dx, zero outside (exact)", nm);
        check_ulp(sub, from_lay(down_dt(b.dx, len), lay, n, ch, h, w), dxr, c.tol, c.tol);
    }
    io_free(b);
}

/* pixel_shuffle (p[1] 0) or pixel_unshuffle (1) by the factor r and the
 * backward of each (the other), the small side [n, c * r * r, h, w] and the
 * large [n, c, h * r, w * r]. shape {n, c, h, w}; p {r, inverse}; tol 0 */
void cmp_pixel_shuffle(const op_case &c, const op_env &e)
{
    const sf_dtype dt = c.dt;
    const sf_layout lay = c.lay;
    const int n = c.shape[0], ch = c.shape[1], h = c.shape[2], w = c.shape[3], r = c.p[0], inv = c.p[1];
    const int cs = ch * r * r, H = h * r, W = w * r;
    const size_t len = (size_t)n * cs * h * w;
    char nm[160], sub[200];
    snprintf(nm, sizeof nm, "pixel_%s %s %s n%d c%d %dx%d factor %d", inv ? "unshuffle" : "shuffle", dtname(dt),
             lname(lay), n, ch, h, w, r);
    /* the input's and the output's shapes: the small side's or the large one's */
    const int xc = inv ? ch : cs, xh = inv ? H : h, xw = inv ? W : w;
    const int yc = inv ? cs : ch, yh = inv ? h : H, yw = inv ? w : W;
    std::vector<float> x(len), dy(len);
    rand_fill_dt(x, dt, 1.f);
    rand_fill_dt(dy, dt, 1.f);
    std::vector<double> yr(len), dxr(len);
    sf_ref_pixel_shuffle_f64(to_d(x).data(), n, ch, h, w, r, inv, yr.data());
    sf_ref_pixel_shuffle_f64(to_d(dy).data(), n, ch, h, w, r, !inv, dxr.data());
    io_bufs b = io_make(dt, to_lay(x, lay, n, xc, xh, xw), to_lay(dy, lay, n, yc, yh, yw));
    int rc = sf_cuda_pixel_shuffle_dt(dt, lay, b.x.p, n, ch, h, w, r, inv, b.y.p, e.s);
    if (!rc)
        rc = sf_cuda_pixel_shuffle_dt(dt, lay, b.dy.p, n, ch, h, w, r, !inv, b.dx.p, e.s);
    CU(cudaStreamSynchronize(e.s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        snprintf(sub, sizeof sub, "%s fwd (exact)", nm);
        check_ulp(sub, from_lay(down_dt(b.y, len), lay, n, yc, yh, yw), yr, c.tol, c.tol);
        snprintf(sub, sizeof sub, "%s dx (exact)", nm);
        check_ulp(sub, from_lay(down_dt(b.dx, len), lay, n, xc, xh, xw), dxr, c.tol, c.tol);
    }
    io_free(b);
}

/* Groups that do not divide the channels, slices outside them, and a pixel
 * shuffle's factor of 0 are refused. shape {channels}; p {groups, start,
 * count} */
void cmp_channels_refused(const op_case &c, const op_env &e)
{
    float *p = dalloc<float>(64);
    const int ch = c.shape[0];
    const int rs = sf_cuda_channel_shuffle_dt(SF_DT_F32, SF_LAYOUT_NCHW, p, 1, ch, 1, c.p[0], p + 32, e.s);
    pass_or_fail("a shuffle whose groups do not divide the channels is refused", rs == -1, "accepted");
    const int rf = sf_cuda_channel_slice_fwd_dt(SF_DT_F32, SF_LAYOUT_NCHW, p, 1, ch, 1, c.p[1], c.p[2], p + 32, e.s);
    const int rb = sf_cuda_channel_slice_bwd_dt(SF_DT_F32, SF_LAYOUT_NHWC, p, 1, ch, 1, c.p[1], c.p[2], p + 32, e.s);
    pass_or_fail("a slice past the channels is refused, forward and backward", rf == -1 && rb == -1, "accepted");
    const int rp = sf_cuda_pixel_shuffle_dt(SF_DT_F32, SF_LAYOUT_NCHW, p, 1, ch, 1, 1, 0, 0, p + 32, e.s);
    pass_or_fail("a pixel shuffle by a factor of 0 is refused", rp == -1, "accepted");
    cudaFree(p);
}
