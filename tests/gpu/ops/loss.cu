/* tests/gpu/ops/loss.cu — the losses of gpu/cuda/loss.h against the
 * reference: softmax cross-entropy (sf_ref_xent: loss, gradient, correct
 * count, NaN for a bad label), the label conversion from u8/i32/i64, and the
 * per-pixel cross-entropy (sf_ref_xent2d) in both layouts at W2's head shape
 * and odd shapes, with a bad label. *
 * The rows: tests/gpu/op_cases.cu; helpers and criteria: op_test.h.
 */
#include "tests/gpu/op_cases.h"
#include "tests/gpu/op_test.h"

/* Fresh logits [n, k] (ties: rounded to integers, so that many tie) and
 * labels (the hash salted with `salt`). */
static void xent_draw(int n, int k, int ties, uint64_t salt, std::vector<float> &l, std::vector<int32_t> &lab)
{
    l.resize((size_t)n * k);
    rand_fill(l, 3.f);
    if (ties)
        for (auto &v : l)
            v = roundf(v); /* few distinct values: many ties */
    lab.resize(n);
    for (int i = 0; i < n; i++)
        lab[i] = (int32_t)(sf_hash4(g_seed, i, salt, salt) % (uint64_t)k);
    g_seed++;
}

/* Runs sf_cuda_xent on l and lab (ctl: the device's loss control, or NULL),
 * then checks the loss within tol and the logits' gradient within tol_grad
 * against the reference; returns 1 with the device's counts in h when it ran,
 * else reports the failure under nm. */
static int run_xent(cudaStream_t s, const char *nm, const std::vector<float> &l, const std::vector<int32_t> &lab, int n,
                    int k, const sf_loss_ctl *ctl, double lref, const std::vector<double> &dref, double tol,
                    double tol_grad, sf_xent_out *h)
{
    float *dl = dalloc<float>(l.size()), *dd = dalloc<float>(l.size());
    int32_t *dlab = dalloc<int32_t>(n);
    sf_xent_out *out = dalloc<sf_xent_out>(1);
    up(dl, l);
    CU(cudaMemcpy(dlab, lab.data(), 4 * n, cudaMemcpyHostToDevice));
    poison_f(dd, l.size());
    CU(cudaMemset(out, 0xff, sizeof *out));
    const int rc = sf_cuda_xent(dl, dlab, n, k, dd, out, ctl, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        CU(cudaMemcpy(h, out, sizeof *h, cudaMemcpyDeviceToHost));
        check(subname(nm, "loss"), &h->loss, &lref, 1, tol);
        check_f(subname(nm, "dlogits"), down(dd, l.size()).data(), dref, tol_grad);
    }
    cudaFree(dl); cudaFree(dd); cudaFree(dlab); cudaFree(out);
    return !rc;
}

/* Hard labels: the loss within tol, the gradient within tol_aux, the correct
 * count exact. */
static void test_xent(cudaStream_t s, const op_case &kc, int n, int k)
{
    char nm[100];
    std::vector<float> l;
    std::vector<int32_t> lab;
    xent_draw(n, k, 0, 5, l, lab);
    std::vector<double> ld = to_d(l), dref((size_t)n * k);
    double lref;
    int cref;
    sf_ref_xent_f64(ld.data(), lab.data(), n, k, &lref, dref.data(), &cref);
    snprintf(nm, sizeof nm, "xent n%d k%d", n, k);
    sf_xent_out h;
    if (run_xent(s, nm, l, lab, n, k, NULL, lref, dref, kc.tol, kc.tol_aux, &h)) {
        char why[80];
        snprintf(why, sizeof why, "correct %d vs %d, bad %d", h.correct, cref, h.bad);
        if (h.correct == cref && h.bad == 0) {
            printf("ok %s correct (%d)\n", nm, cref);
            g_ok++;
        } else {
            fail(subname(nm, "correct"), why);
        }
    }
}

/* Label smoothing, mixed targets (labels rolled by one) and top-5 hits
 * against sf_ref_xent_soft_f64; ties among the logits exercise top-5's order.
 * The loss within tol, the gradient within tol_aux, the hits exact. */
static void test_xent_soft(cudaStream_t s, const op_case &kc, int n, int k, float sm, float lam, int ties, float gsc)
{
    char nm[120];
    std::vector<float> l;
    std::vector<int32_t> lab;
    xent_draw(n, k, ties, 6, l, lab);
    std::vector<double> ld = to_d(l), dref((size_t)n * k);
    double lref;
    int cref, c5ref;
    sf_ref_xent_soft_f64(ld.data(), lab.data(), n, k, sm, lam, &lref, dref.data(), &cref, &c5ref);
    for (double &v : dref) /* a data-parallel rank's share weighs its gradient, not its loss */
        v *= gsc != 0.f ? gsc : 1.0;
    sf_loss_ctl ctl = {sm, lam, gsc}, *dctl = dalloc<sf_loss_ctl>(1);
    CU(cudaMemcpy(dctl, &ctl, sizeof ctl, cudaMemcpyHostToDevice));
    snprintf(nm, sizeof nm, "xent n%d k%d smoothing %g mix %g%s grad scale %g", n, k, sm, lam, ties ? " ties" : "",
             gsc != 0.f ? gsc : 1.f);
    sf_xent_out h;
    if (run_xent(s, nm, l, lab, n, k, dctl, lref, dref, kc.tol, kc.tol_aux, &h)) {
        char n2[160];
        snprintf(n2, sizeof n2, "%s top-1 %d top-5 %d", nm, cref, c5ref);
        pass_or_fail(n2, h.correct == cref && h.correct5 == c5ref && h.bad == 0, "hits differ from the reference");
    }
    cudaFree(dctl);
}

static void test_labels(cudaStream_t s)
{
    const int n = 37;
    uint8_t u8[n];
    int32_t i32[n];
    int64_t i64[n];
    for (int i = 0; i < n; i++) {
        u8[i] = (uint8_t)(i * 7 % 10);
        i32[i] = i * 3 % 10;
        i64[i] = i * 5 % 10;
    }
    const void *src[3] = {u8, i32, i64};
    const size_t sz[3] = {1, 4, 8};
    for (int d = 0; d < 3; d++) {
        void *dsrc = dalloc<char>(n * sz[d]);
        int32_t *dst = dalloc<int32_t>(n);
        CU(cudaMemcpy(dsrc, src[d], n * sz[d], cudaMemcpyHostToDevice));
        CU(cudaMemset(dst, 0xff, 4 * n));
        int rc = sf_cuda_labels_i32(dsrc, d, n, dst, s);
        CU(cudaStreamSynchronize(s));
        int32_t got[n];
        CU(cudaMemcpy(got, dst, 4 * n, cudaMemcpyDeviceToHost));
        int ok = rc == 0;
        for (int i = 0; ok && i < n; i++) {
            int64_t want = d == 0 ? u8[i] : d == 1 ? i32[i] : i64[i];
            ok = got[i] == want;
        }
        char nm[60];
        snprintf(nm, sizeof nm, "labels_i32 dtype %d", d);
        if (ok) {
            printf("ok %s\n", nm);
            g_ok++;
        } else {
            fail(nm, "mismatch");
        }
        cudaFree(dsrc);
        cudaFree(dst);
    }
}

/* ---- per-pixel cross-entropy --------------------------------------------- */

/* The loss within tol, the gradient within tol_aux, the counts exact; a bad
 * label gives a NaN loss and that pixel's gradient NaN. */
static void test_xent2d(cudaStream_t s, const op_case &kc, int n, int k, int h, int w, sf_layout L, int bad_label,
                        float sm, float gsc)
{
    char nm[160];
    snprintf(nm, sizeof nm, "xent2d n%d k%d %dx%d %s%s smoothing %g grad scale %g", n, k, h, w, lname(L),
             bad_label ? " bad-label" : "", sm, gsc != 0.f ? gsc : 1.f);
    const size_t npix = (size_t)n * h * w, nl = npix * k;
    std::vector<float> lg(nl);
    rand_fill(lg, 3.f);
    std::vector<int32_t> lab(npix);
    for (size_t i = 0; i < npix; i++)
        lab[i] = (int32_t)(sf_hash4(g_seed, i, 5, 0) % (uint64_t)k);
    g_seed++;
    if (bad_label)
        lab[npix / 2] = k;
    std::vector<double> lgd = to_d(lg), dr(nl);
    double lr;
    int64_t cr, c5r;
    sf_ref_xent2d_smooth_f64(lgd.data(), lab.data(), n, k, h, w, sm, &lr, dr.data(), &cr, &c5r);
    for (double &v : dr)
        v *= gsc != 0.f ? gsc : 1.0;
    sf_loss_ctl ctl = {sm, 1.f, gsc}, *dctl = dalloc<sf_loss_ctl>(1);
    CU(cudaMemcpy(dctl, &ctl, sizeof ctl, cudaMemcpyHostToDevice));
    const int nhwc = L == SF_LAYOUT_NHWC;
    float *d_l = dalloc<float>(nl), *d_d = dalloc<float>(nl);
    int32_t *d_lab = dalloc<int32_t>(npix);
    sf_xent2d_out *d_out = dalloc<sf_xent2d_out>(1);
    void *scr = dalloc<char>(sf_cuda_xent2d_scratch_bytes(n, h, w));
    up(d_l, nhwc ? to_nhwc(lg, n, k, h, w) : lg);
    up(d_lab, lab);
    poison(d_d, nl * 4);
    poison(d_out, sizeof(sf_xent2d_out));
    int rc = sf_cuda_xent2d(d_l, d_lab, n, k, h, w, L, d_d, d_out, scr, sm != 0.f || gsc != 0.f ? dctl : NULL, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        sf_xent2d_out o = down(d_out, 1)[0];
        std::vector<float> dg = down(d_d, nl);
        if (nhwc)
            dg = to_nchw(dg, n, k, h, w);
        char sub[220];
        if (bad_label) {
            size_t nan_grad = 0;
            for (int j = 0; j < k; j++) {
                const size_t pix = npix / 2, ni = pix / ((size_t)h * w), sp = pix % ((size_t)h * w);
                nan_grad += isnan(dg[(ni * k + j) * h * w + sp]) != 0;
            }
            snprintf(sub, sizeof sub, "%s: NaN loss, bad=1, NaN gradient of that pixel", nm);
            pass_or_fail(sub, isnan(o.loss) && o.bad == 1 && nan_grad == (size_t)k, "not reported");
        } else {
            snprintf(sub, sizeof sub, "%s loss", nm);
            float lf = o.loss;
            check(sub, &lf, &lr, 1, kc.tol);
            snprintf(sub, sizeof sub, "%s correct %lld, top-5 %lld of %zu", nm, (long long)o.correct,
                     (long long)o.correct5, npix);
            pass_or_fail(sub, o.correct == cr && o.correct5 == c5r && o.bad == 0, "counts differ from the reference");
            snprintf(sub, sizeof sub, "%s dlogits", nm);
            check_v(sub, dg, dr, kc.tol_aux);
        }
    }
    cudaFree(d_l); cudaFree(d_d); cudaFree(d_lab); cudaFree(d_out); cudaFree(scr); cudaFree(dctl);
}

/* shape {n, classes}; tol: the loss; tol_aux: the logits' gradient (the same
 * in the families below) */
void cmp_xent(const op_case &c, const op_env &e) { test_xent(e.s, c, c.shape[0], c.shape[1]); }
/* shape {n, classes}; p {tied logits}; f {label smoothing, mix lambda, gradient scale (0: 1/n)} */
void cmp_xent_soft(const op_case &c, const op_env &e)
{
    test_xent_soft(e.s, c, c.shape[0], c.shape[1], c.f[0], c.f[1], c.p[0], c.f[2]);
}
void cmp_labels(const op_case &, const op_env &e) { test_labels(e.s); }
/* shape {n, classes, h, w}; p {a bad label}; f {label smoothing, gradient scale (0: 1/n)} */
void cmp_xent2d(const op_case &c, const op_env &e)
{
    test_xent2d(e.s, c, c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.lay, c.p[0], c.f[0], c.f[1]);
}
