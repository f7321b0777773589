/* tests/gpu/ops/optimizer.cu — the updates of gpu/cuda/optimizer.h against
 * the reference: SGD with and without momentum (bit-equal to sf_ref_sgd, also
 * through KRSC weight segments, two or 200 listed out of order), AdamW (sf_ref_adamw, with weight decay and
 * permuted segments), and the weight copies between model and device layout
 * (weights_dev / grads_model bit-exact against a host permutation, grads_model
 * touching nothing outside its segments) in fp32 and bf16. *
 * The rows: tests/gpu/op_cases.cu; helpers and criteria: op_test.h.
 */
#include "tests/gpu/op_cases.h"
#include "tests/gpu/op_test.h"

/* SGD over a flat buffer with KRSC segments; compared bit for bit with sf_ref_sgd. */
static void test_sgd(cudaStream_t s, float momentum, int many)
{
    char nm[100];
    snprintf(nm, sizeof nm, "sgd momentum %g with %s KRSC segments", momentum, many ? "200 shuffled" : "2");
    /* layout: 13 loose floats, a conv weight [6][5][2][2] at 13, 7 floats, a conv
     * weight [4][3][3][3] at 140, then loose floats to an odd total. many: a
     * DenseNet's worth of conv weights [2][3][3][3] every 500 floats from 13,
     * listed out of order (the launcher sorts them for its binary search). */
    sf_sgd_segs segs;
    memset(&segs, 0, sizeof segs);
    if (many) {
        segs.n = 200;
        for (int k = 0; k < segs.n; k++) {
            const int at = (k * 7 + 3) % segs.n; /* 7 is prime to 200 */
            segs.s[k].off = 13 + (size_t)at * 500; segs.s[k].len = 2 * 3 * 9; segs.s[k].c = 3; segs.s[k].rs = 9;
        }
    } else {
        segs.n = 2;
        segs.s[0].off = 13; segs.s[0].len = 6 * 5 * 4; segs.s[0].c = 5; segs.s[0].rs = 4;
        segs.s[1].off = 140; segs.s[1].len = 4 * 3 * 9; segs.s[1].c = 3; segs.s[1].rs = 9;
    }
    const size_t len = 100003;
    std::vector<float> p(len), g(len), m(len);
    rand_fill(p, 1.f);
    rand_fill(g, 1.f);
    rand_fill(m, 1.f);
    /* device-layout gradient */
    std::vector<float> gdev = g;
    auto perm = [&](const sf_perm_seg &sg, size_t i) {
        size_t r = i - sg.off, crs = (size_t)sg.c * sg.rs, o = r / crs, rem = r % crs, ci = rem / sg.rs, t = rem % sg.rs;
        return sg.off + o * crs + t * sg.c + ci;
    };
    for (int k = 0; k < segs.n; k++)
        for (size_t i = segs.s[k].off; i < segs.s[k].off + segs.s[k].len; i++)
            gdev[perm(segs.s[k], i)] = g[i];
    const float lr = 0.05f, wd = 1e-3f;
    std::vector<float> pr = p, mr = m;
    sf_ref_sgd(pr.data(), g.data(), mr.data(), len, lr, momentum, wd);
    float *dp = dalloc<float>(len), *dg = dalloc<float>(len), *dm = dalloc<float>(len), *dw = dalloc<float>(len);
    sf_sgd_hyper *hp = dalloc<sf_sgd_hyper>(1);
    sf_sgd_hyper h = {lr, momentum, wd, 0.f};
    CU(cudaMemcpy(hp, &h, sizeof h, cudaMemcpyHostToDevice));
    up(dp, p);
    up(dg, gdev);
    up(dm, m);
    poison_f(dw, len);
    int rc = sf_cuda_sgd(dp, dg, dm, dw, len, hp, &segs, NULL, s);
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        std::vector<float> pg = down(dp, len), mg = down(dm, len), wg = down(dw, len);
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < len; i++)
            if (memcmp(&pg[i], &pr[i], 4) || (momentum != 0.f && memcmp(&mg[i], &mr[i], 4))) {
                if (!bad++)
                    first = i;
            }
        for (int k = 0; k < segs.n; k++)
            for (size_t i = segs.s[k].off; i < segs.s[k].off + segs.s[k].len; i++)
                if (memcmp(&wg[perm(segs.s[k], i)], &pr[i], 4)) {
                    if (!bad++)
                        first = i;
                }
        if (!bad) {
            printf("ok %s (bit-exact)\n", nm);
            g_ok++;
        } else {
            char why[160];
            snprintf(why, sizeof why, "%zu elements differ, first %zu: p %g vs %g", bad, first, pg[first], pr[first]);
            fail(nm, why);
        }
    }
    cudaFree(dp); cudaFree(dg); cudaFree(dm); cudaFree(dw); cudaFree(hp);
}

/* ---- AdamW ------------------------------------------------------------------- */

/* Three steps against sf_ref_adamw, p, m and v within tol; also reports how
 * many parameters are bit-equal (the kernel rounds as the reference does). Steps 2 and 3 are
 * staged with a step number 1 and 2 too high and as many skips on the device
 * that the host had not counted (sf_adamw_hyper). With perm, one segment
 * of the buffer holds a conv weight whose gradient the device keeps in KRSC. */
static void test_adamw(cudaStream_t s, size_t len, float wd, int perm, double tol)
{
    char nm[120];
    snprintf(nm, sizeof nm, "adamw len %zu wd %g%s", len, wd, perm ? " permuted segment" : "");
    const float lr = 1e-3f, eps = 1e-8f;
    /* The configured betas are doubles: 1 - 0.999 is formed from the double
     * on both sides, as PyTorch does. */
    const double b1 = 0.9, b2 = 0.999;
    std::vector<float> p(len), m(len, 0.f), v(len, 0.f), g(len);
    rand_fill(p, 1.f);
    float *d_p = dalloc<float>(len), *d_m = dalloc<float>(len), *d_v = dalloc<float>(len), *d_g = dalloc<float>(len),
          *d_w = dalloc<float>(len);
    sf_adamw_hyper *d_h = dalloc<sf_adamw_hyper>(1);
    unsigned *d_skips = dalloc<unsigned>(1);
    up(d_p, p);
    CU(cudaMemset(d_m, 0, len * 4));
    CU(cudaMemset(d_v, 0, len * 4));
    poison(d_w, len * 4);
    sf_sgd_segs segs;
    memset(&segs, 0, sizeof segs);
    const int oc = 4, ci = 3, rs = 4; /* a [4][3][2][2] conv weight at offset 8 */
    if (perm) {
        segs.n = 1;
        segs.s[0].off = 8;
        segs.s[0].len = (size_t)oc * ci * rs;
        segs.s[0].c = ci;
        segs.s[0].rs = rs;
    }
    int rc = 0;
    for (int64_t t = 1; t <= 3 && !rc; t++) {
        rand_fill(g, 0.1f);
        std::vector<float> gdev = g;
        if (perm)
            for (int o = 0; o < oc; o++)
                for (int c = 0; c < ci; c++)
                    for (int r = 0; r < rs; r++)
                        gdev[8 + ((size_t)o * rs + r) * ci + c] = g[8 + ((size_t)o * ci + c) * rs + r];
        up(d_g, gdev);
        /* Staged as the backend stages a batch queued behind `behind` steps
         * that the device then skipped: the host's number t + behind, its
         * count of skips 5, the device's 5 + behind. The update must be of
         * step t (behind 0: the skip count is not read at all). */
        const unsigned behind = (unsigned)(t - 1) % SF_ADAMW_BEHIND;
        sf_adamw_hyper h;
        sf_adamw_hyper_at(&h, lr, b1, b2, eps, wd, t + (int64_t)behind, 5u);
        CU(cudaMemcpy(d_h, &h, sizeof h, cudaMemcpyHostToDevice));
        const unsigned dev_skips = 5u + behind;
        CU(cudaMemcpy(d_skips, &dev_skips, sizeof dev_skips, cudaMemcpyHostToDevice));
        rc = sf_cuda_adamw(d_p, d_g, d_m, d_v, d_w, len, d_h, perm ? &segs : NULL, NULL, behind ? d_skips : NULL, s);
        sf_ref_adamw(p.data(), g.data(), m.data(), v.data(), len, lr, b1, b2, eps, wd, t);
    }
    CU(cudaStreamSynchronize(s));
    if (rc) {
        fail(nm, sf_cuda_last_error());
    } else {
        std::vector<float> pg = down(d_p, len), mg = down(d_m, len), vg = down(d_v, len);
        size_t same = 0;
        for (size_t i = 0; i < len; i++)
            same += memcmp(&pg[i], &p[i], 4) == 0;
        char sub[200];
        snprintf(sub, sizeof sub, "%s p (%zu of %zu bit-equal)", nm, same, len);
        check_v(sub, pg, to_d(p), tol);
        check_v(subname(nm, "m"), mg, to_d(m), tol);
        check_v(subname(nm, "v"), vg, to_d(v), tol);
        if (perm) {
            std::vector<float> wdv = down(d_w, len);
            int okw = 1;
            for (int o = 0; o < oc; o++)
                for (int c = 0; c < ci; c++)
                    for (int r = 0; r < rs; r++)
                        okw &= memcmp(&wdv[8 + ((size_t)o * rs + r) * ci + c], &pg[8 + ((size_t)o * ci + c) * rs + r],
                                      4) == 0;
            snprintf(sub, sizeof sub, "%s: KRSC copy of the updated weight", nm);
            pass_or_fail(sub, okw, "wdev differs from p at the device index");
        }
    }
    cudaFree(d_p); cudaFree(d_m); cudaFree(d_v); cudaFree(d_g); cudaFree(d_w); cudaFree(d_h); cudaFree(d_skips);
}

/* ---- weights: model layout <-> device layout ------------------------------------ */

/* Model index i of segment g -> its device index (the permutation of ref: KCRS -> KRSC). */
static size_t perm_dev_of_model(const sf_perm_seg &g, size_t i)
{
    const size_t r = i - g.off, crs = (size_t)g.c * g.rs;
    const size_t o = r / crs, rem = r % crs, ci = rem / g.rs, t = rem % g.rs;
    return g.off + (o * g.rs + t) * g.c + ci;
}

/* A pretend parameter buffer: segments listed out of order, gaps between
 * them (identity), two c == 1 segments (identity inside a segment), a 1x1 conv
 * (rs 1), segments meeting inside one 8-element group, and with big the shapes
 * of ResNet-18's 3x3 convolutions. weights_dev must write all len elements
 * (bits equal to the host permutation, rounded by sf_bf16_bits for bf16);
 * grads_model must write exactly the segments (bits of the device gradient)
 * and leave every other element of g as it was. */
static void test_weights_perm(cudaStream_t s, sf_dtype dt, int mis, int big)
{
    char nm[200], sub[260];
    snprintf(nm, sizeof nm, "weights_dev/grads_model %s%s%s", dtname(dt), big ? " resnet-sized" : "",
             mis ? " misaligned" : "");
    struct shape {
        int oc, c, rs;
        size_t gap; /* identity elements before the segment */
    };
    std::vector<shape> sh = {
        {4, 3, 9, 5},   /* conv 4x3x3x3 after 5 loose elements */
        {8, 1, 9, 0},   /* c == 1: identity */
        {8, 16, 1, 3},  /* 1x1 conv */
        {16, 8, 4, 0},  /* 2x2 (a convT-like block), meets the previous one */
        {3, 5, 25, 13}, /* 5x5 */
        {10, 1, 1, 1},  /* c == 1, rs == 1 */
    };
    if (big) {
        sh.push_back({64, 64, 9, 64});
        sh.push_back({128, 64, 9, 128});
        sh.push_back({128, 128, 9, 0});
        sh.push_back({512, 256, 9, 512});
    }
    sf_sgd_segs segs;
    memset(&segs, 0, sizeof segs);
    std::vector<sf_perm_seg> list;
    size_t len = 0;
    for (const shape &q : sh) {
        len += q.gap;
        sf_perm_seg g;
        g.off = len;
        g.len = (size_t)q.oc * q.c * q.rs;
        g.c = q.c;
        g.rs = q.rs;
        list.push_back(g);
        len += g.len;
    }
    len += 7; /* a tail */
    /* out of order: the kernels must not assume sorted segments */
    segs.n = (int)list.size();
    for (size_t k = 0; k < list.size(); k++)
        segs.s[k] = list[(k * 7 + 3) % list.size()]; /* 7 is prime to 6 and 10 */

    std::vector<float> p(len);
    rand_fill(p, 1.f);
    std::vector<size_t> dev_of(len); /* model index -> device index */
    std::vector<char> inseg(len, 0);
    for (size_t i = 0; i < len; i++)
        dev_of[i] = i;
    for (const sf_perm_seg &g : list)
        for (size_t i = g.off; i < g.off + g.len; i++) {
            dev_of[i] = perm_dev_of_model(g, i);
            inseg[i] = 1;
        }
    float *pmem = dalloc<float>(len + 4), *d_p = pmem + mis;
    up(d_p, p);
    dbuf bw = dbuf_make(dt, len, mis);
    poison_dt(bw);
    int rc = sf_cuda_weights_dev(d_p, bw.p, dt, len, &segs, s);
    CU(cudaStreamSynchronize(s));
    snprintf(sub, sizeof sub, "%s: weights_dev len %zu, %d segments", nm, len, segs.n);
    if (rc) {
        fail(sub, sf_cuda_last_error());
    } else {
        size_t bad = 0, first = 0;
        if (dt == SF_DT_BF16) {
            std::vector<uint16_t> got(len);
            CU(cudaMemcpy(got.data(), bw.p, len * 2, cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < len; i++)
                if (got[dev_of[i]] != sf_bf16_bits(p[i]) && !bad++)
                    first = i;
        } else {
            std::vector<float> got = down((const float *)bw.p, len);
            for (size_t i = 0; i < len; i++)
                if (memcmp(&got[dev_of[i]], &p[i], 4) != 0 && !bad++)
                    first = i;
        }
        char why[200];
        snprintf(why, sizeof why, "%zu of %zu elements differ (first: model index %zu, device %zu)", bad, len, first,
                 dev_of[first]);
        pass_or_fail(sub, bad == 0, why);
    }

    /* grads_model: a device gradient of dt; g holds a sentinel everywhere */
    std::vector<float> gdv(len);
    rand_fill_dt(gdv, dt, 0.1f);
    dbuf bg = dbuf_make(dt, len, mis);
    up_dt(bg, gdv);
    const float sentinel = -12345.678f;
    std::vector<float> g0(len, sentinel);
    float *gmem = dalloc<float>(len + 4), *d_g = gmem + mis;
    up(d_g, g0);
    rc = sf_cuda_grads_model(bg.p, dt, d_g, &segs, s);
    CU(cudaStreamSynchronize(s));
    snprintf(sub, sizeof sub, "%s: grads_model writes the segments only", nm);
    if (rc) {
        fail(sub, sf_cuda_last_error());
    } else {
        std::vector<float> got = down(d_g, len);
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < len; i++) {
            const float want = inseg[i] ? gdv[dev_of[i]] : sentinel;
            if (memcmp(&got[i], &want, 4) != 0 && !bad++)
                first = i;
        }
        char why[200];
        snprintf(why, sizeof why, "%zu of %zu elements differ (first: model index %zu%s)", bad, len, first,
                 inseg[first] ? "" : ", outside the segments");
        pass_or_fail(sub, bad == 0, why);
    }

    /* no segments: weights_dev is a plain conversion, grads_model writes nothing */
    poison_dt(bw);
    up(d_g, g0);
    rc = sf_cuda_weights_dev(d_p, bw.p, dt, len, NULL, s) || sf_cuda_grads_model(bg.p, dt, d_g, NULL, s);
    CU(cudaStreamSynchronize(s));
    snprintf(sub, sizeof sub, "%s: no segments (identity, nothing written)", nm);
    if (rc) {
        fail(sub, sf_cuda_last_error());
    } else {
        std::vector<float> w = down_dt(bw, len), g = down(d_g, len);
        size_t bad = 0;
        for (size_t i = 0; i < len; i++)
            bad += w[i] != (dt == SF_DT_BF16 ? sf_bf16_round(p[i]) : p[i]) || memcmp(&g[i], &sentinel, 4) != 0;
        pass_or_fail(sub, bad == 0, "differs");
    }

    /* malformed segments are refused */
    {
        sf_sgd_segs bad1 = segs, bad2 = segs, bad3 = segs;
        bad1.s[0].off = len - 1;             /* past the end */
        bad2.s[1] = bad2.s[0];               /* two identical: overlap */
        bad3.s[0].len += 1;                  /* list[3]: c*rs = 32 no longer divides it */
        const int r1 = sf_cuda_weights_dev(d_p, bw.p, dt, len, &bad1, s);
        const int r2 = sf_cuda_grads_model(bg.p, dt, d_g, &bad2, s);
        const int r3 = sf_cuda_weights_dev(d_p, bw.p, dt, len, &bad3, s);
        snprintf(sub, sizeof sub, "%s: malformed segments refused", nm);
        pass_or_fail(sub, r1 == -1 && r2 == -1 && r3 == -1, "accepted");
    }
    dbuf_free(bw); dbuf_free(bg);
    cudaFree(pmem); cudaFree(gmem);
}

/* sf_cuda_sgd_mixed is bit-equal to the three passes it replaces
 * (grads_model, sgd, weights_dev), with segments that start and end off the
 * 4-element groups, with and without momentum. */
static void test_sgd_mixed(cudaStream_t s, float momentum)
{
    const size_t len = 10007;
    sf_sgd_segs segs;
    memset(&segs, 0, sizeof segs);
    const size_t so[3][2] = {{5, 1203}, {2000, 4096}, {9001, 1006}}; /* off, len */
    for (int k = 0; k < 3; k++) {
        segs.s[k].off = so[k][0];
        segs.s[k].len = so[k][1];
        segs.s[k].c = 1;
        segs.s[k].rs = (int)so[k][1];
    }
    segs.n = 3;
    std::vector<float> p(len), g(len), m(len), gdf(len);
    rand_fill(p, 1.f);
    rand_fill(g, 1.f);
    rand_fill(m, 0.5f);
    rand_fill(gdf, 1.f);
    round_bf16(gdf);
    float *p1 = dalloc<float>(len), *p2 = dalloc<float>(len), *g1 = dalloc<float>(len), *g2 = dalloc<float>(len),
          *m1 = dalloc<float>(len), *m2 = dalloc<float>(len);
    uint16_t *gd = dalloc<uint16_t>(len), *w1 = dalloc<uint16_t>(len), *w2 = dalloc<uint16_t>(len);
    up(p1, p); up(p2, p); up(g1, g); up(g2, g); up(m1, m); up(m2, m);
    upb(gd, gdf);
    sf_sgd_hyper h = {0.05f, momentum, 0.01f, 0.f}, *dh = dalloc<sf_sgd_hyper>(1);
    CU(cudaMemcpy(dh, &h, sizeof h, cudaMemcpyHostToDevice));
    sf_sgd_segs none;
    memset(&none, 0, sizeof none);
    int rc = sf_cuda_grads_model(gd, SF_DT_BF16, g1, &segs, s) || sf_cuda_sgd(p1, g1, m1, NULL, len, dh, &none, NULL, s) ||
             sf_cuda_weights_dev(p1, w1, SF_DT_BF16, len, NULL, s) ||
             sf_cuda_sgd_mixed(p2, g2, gd, SF_DT_BF16, &segs, m2, w2, len, dh, NULL, s);
    CU(cudaStreamSynchronize(s));
    char name[120];
    snprintf(name, sizeof name, "sgd_mixed bf16 momentum %g", momentum);
    if (rc) {
        fail(name, sf_cuda_last_error());
        return;
    }
    std::vector<float> a = down(p1, len), b = down(p2, len), ma = down(m1, len), mb = down(m2, len);
    std::vector<uint16_t> wa = down(w1, len), wb = down(w2, len);
    pass_or_fail(name, memcmp(a.data(), b.data(), len * 4) == 0 && memcmp(wa.data(), wb.data(), len * 2) == 0 &&
                           (momentum == 0.f || memcmp(ma.data(), mb.data(), len * 4) == 0),
                 "parameters, momentum or bf16 weights differ from grads_model + sgd + weights_dev");
    pass_or_fail("sgd_mixed refuses fp32 data", sf_cuda_sgd_mixed(p2, g2, gd, SF_DT_F32, &segs, m2, w2, len, dh, NULL, s) != 0,
                 "accepted");
    cudaFree(p1); cudaFree(p2); cudaFree(g1); cudaFree(g2); cudaFree(m1); cudaFree(m2);
    cudaFree(gd); cudaFree(w1); cudaFree(w2); cudaFree(dh);
}

/* p {many segments}; f {momentum} */
void cmp_sgd(const op_case &c, const op_env &e) { test_sgd(e.s, c.f[0], c.p[0]); }
/* f {momentum} */
void cmp_sgd_mixed(const op_case &c, const op_env &e) { test_sgd_mixed(e.s, c.f[0]); }
/* shape {length}; p {permuted segments}; f {weight decay}; tol: p, m and v */
void cmp_adamw(const op_case &c, const op_env &e) { test_adamw(e.s, (size_t)c.shape[0], c.f[0], c.p[0], c.tol); }
/* p {misaligned, big} */
void cmp_weights_perm(const op_case &c, const op_env &e) { test_weights_perm(e.s, c.dt, c.p[0], c.p[1]); }
