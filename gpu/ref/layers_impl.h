/* gpu/ref/layers_impl.h — the reference layers, written once for a scalar
 * type. Private to gpu/ref/layers.c, which includes it twice:
 *   T        the scalar type (float, double)
 *   SF_FN(x) the function name for that type (x, x##_f64)
 *   SF_EXP, SF_LOG  exp/log for T
 * Accumulators are T too, so the float version computes what a float kernel
 * would. Outputs are overwritten, never accumulated into.
 */
#if !defined(T) || !defined(SF_FN) || !defined(SF_EXP) || !defined(SF_LOG)
#error "layers_impl.h is included by gpu/ref/layers.c with T, SF_FN, SF_EXP, SF_LOG defined"
#endif

/* tap_range (layers.c): the outputs [o0, o1) whose tap at kernel offset kk
 * reads inside the input (o*stride + kk - pad in [0, in)); the loops below
 * visit only those, which is the same sum as skipping the zero-padded taps. */

/* y[n][o][oy][ox] = b[o] + sum_{c,ky,kx} w[o][c][ky][kx] * x[n][c][oy*s+ky-p][ox*s+kx-p]
 * (taps outside the input read 0). */
void SF_FN(sf_ref_conv2d_fwd)(const T *x, int n, int c, int h, int w, const T *wt, const T *b,
                              int oc, int k, int stride, int pad, T *y)
{
    const int oh = (h + 2 * pad - k) / stride + 1, ow = (w + 2 * pad - k) / stride + 1;
    for (int ni = 0; ni < n; ni++) {
        const T *xn = x + (size_t)ni * c * h * w;
        for (int o = 0; o < oc; o++) {
            T *yp = y + ((size_t)ni * oc + o) * oh * ow;
            for (int i = 0; i < oh * ow; i++)
                yp[i] = b ? b[o] : (T)0;
            for (int ci = 0; ci < c; ci++) {
                const T *xp = xn + (size_t)ci * h * w;
                for (int ky = 0; ky < k; ky++) {
                    int oy0, oy1;
                    tap_range(ky, stride, pad, h, oh, &oy0, &oy1);
                    for (int kx = 0; kx < k; kx++) {
                        int ox0, ox1;
                        tap_range(kx, stride, pad, w, ow, &ox0, &ox1);
                        const T wv = wt[(((size_t)o * c + ci) * k + ky) * k + kx];
                        for (int oy = oy0; oy < oy1; oy++) {
                            const T *xrow = xp + (size_t)(oy * stride + ky - pad) * w + (kx - pad);
                            T *yrow = yp + (size_t)oy * ow;
                            for (int ox = ox0; ox < ox1; ox++)
                                yrow[ox] += wv * xrow[ox * stride];
                        }
                    }
                }
            }
        }
    }
}

/* db[o] = sum dy[n][o][.][.]
 * dw[o][c][ky][kx] = sum_{n,oy,ox} dy[n][o][oy][ox] * x[n][c][iy][ix]
 * dx[n][c][iy][ix] = sum_{o,ky,kx} w[o][c][ky][kx] * dy[n][o][oy][ox]  over the taps that read it */
void SF_FN(sf_ref_conv2d_bwd)(const T *x, int n, int c, int h, int w, const T *wt, int oc, int k,
                              int stride, int pad, const T *dy, T *dx, T *dw, T *db)
{
    const int oh = (h + 2 * pad - k) / stride + 1, ow = (w + 2 * pad - k) / stride + 1;
    if (db) {
        for (int o = 0; o < oc; o++) {
            T acc = 0;
            for (int ni = 0; ni < n; ni++) {
                const T *dyp = dy + ((size_t)ni * oc + o) * oh * ow;
                for (int i = 0; i < oh * ow; i++)
                    acc += dyp[i];
            }
            db[o] = acc;
        }
    }
    for (int o = 0; o < oc; o++) {
        for (int ci = 0; ci < c; ci++) {
            for (int ky = 0; ky < k; ky++) {
                int oy0, oy1;
                tap_range(ky, stride, pad, h, oh, &oy0, &oy1);
                for (int kx = 0; kx < k; kx++) {
                    int ox0, ox1;
                    tap_range(kx, stride, pad, w, ow, &ox0, &ox1);
                    T acc = 0;
                    for (int ni = 0; ni < n; ni++) {
                        const T *dyp = dy + ((size_t)ni * oc + o) * oh * ow;
                        const T *xp = x + ((size_t)ni * c + ci) * h * w;
                        for (int oy = oy0; oy < oy1; oy++) {
                            const T *xrow = xp + (size_t)(oy * stride + ky - pad) * w + (kx - pad);
                            const T *dyrow = dyp + (size_t)oy * ow;
                            for (int ox = ox0; ox < ox1; ox++)
                                acc += dyrow[ox] * xrow[ox * stride];
                        }
                    }
                    dw[(((size_t)o * c + ci) * k + ky) * k + kx] = acc;
                }
            }
        }
    }
    if (!dx)
        return;
    for (size_t i = 0; i < (size_t)n * c * h * w; i++)
        dx[i] = 0;
    for (int ni = 0; ni < n; ni++) {
        T *dxn = dx + (size_t)ni * c * h * w;
        for (int o = 0; o < oc; o++) {
            const T *dyp = dy + ((size_t)ni * oc + o) * oh * ow;
            for (int ci = 0; ci < c; ci++) {
                T *dxp = dxn + (size_t)ci * h * w;
                for (int ky = 0; ky < k; ky++) {
                    int oy0, oy1;
                    tap_range(ky, stride, pad, h, oh, &oy0, &oy1);
                    for (int kx = 0; kx < k; kx++) {
                        int ox0, ox1;
                        tap_range(kx, stride, pad, w, ow, &ox0, &ox1);
                        const T wv = wt[(((size_t)o * c + ci) * k + ky) * k + kx];
                        for (int oy = oy0; oy < oy1; oy++) {
                            T *dxrow = dxp + (size_t)(oy * stride + ky - pad) * w + (kx - pad);
                            const T *dyrow = dyp + (size_t)oy * ow;
                            for (int ox = ox0; ox < ox1; ox++)
                                dxrow[ox * stride] += wv * dyrow[ox];
                        }
                    }
                }
            }
        }
    }
}

/* y[n][o] = b[o] + sum_i w[o][i] * x[n][i] */
void SF_FN(sf_ref_linear_fwd)(const T *x, int n, int in, const T *wt, const T *b, int out, T *y)
{
    for (int ni = 0; ni < n; ni++) {
        const T *xn = x + (size_t)ni * in;
        for (int o = 0; o < out; o++) {
            const T *wo = wt + (size_t)o * in;
            T acc = 0;
            for (int i = 0; i < in; i++)
                acc += wo[i] * xn[i];
            y[(size_t)ni * out + o] = (b ? b[o] : (T)0) + acc;
        }
    }
}

/* dx[n][i] = sum_o dy[n][o] w[o][i];  dw[o][i] = sum_n dy[n][o] x[n][i];  db[o] = sum_n dy[n][o] */
void SF_FN(sf_ref_linear_bwd)(const T *x, int n, int in, const T *wt, int out, const T *dy, T *dx,
                              T *dw, T *db)
{
    if (dx) {
        for (int ni = 0; ni < n; ni++) {
            T *dxn = dx + (size_t)ni * in;
            for (int i = 0; i < in; i++)
                dxn[i] = 0;
            for (int o = 0; o < out; o++) {
                const T g = dy[(size_t)ni * out + o];
                const T *wo = wt + (size_t)o * in;
                for (int i = 0; i < in; i++)
                    dxn[i] += g * wo[i];
            }
        }
    }
    for (int o = 0; o < out; o++) {
        T *dwo = dw + (size_t)o * in;
        for (int i = 0; i < in; i++)
            dwo[i] = 0;
        for (int ni = 0; ni < n; ni++) {
            const T g = dy[(size_t)ni * out + o];
            const T *xn = x + (size_t)ni * in;
            for (int i = 0; i < in; i++)
                dwo[i] += g * xn[i];
        }
    }
    if (db) {
        for (int o = 0; o < out; o++) {
            T acc = 0;
            for (int ni = 0; ni < n; ni++)
                acc += dy[(size_t)ni * out + o];
            db[o] = acc;
        }
    }
}

/* y = max(x, 0); NaN propagates (as torch.relu). x == y is allowed. */
void SF_FN(sf_ref_relu_fwd)(const T *x, size_t len, T *y)
{
    for (size_t i = 0; i < len; i++)
        y[i] = x[i] < (T)0 ? (T)0 : x[i];
}

/* dx = dy where y > 0, else 0. dx == dy is allowed. */
void SF_FN(sf_ref_relu_bwd)(const T *y, const T *dy, size_t len, T *dx)
{
    for (size_t i = 0; i < len; i++)
        dx[i] = y[i] > (T)0 ? dy[i] : (T)0;
}

/* loss = mean_n ( logsumexp(l[n]) - l[n][label] );  dl = (softmax - onehot) / n.
 * A label outside [0,k) makes the loss NaN (and that sample's gradient NaN). */
void SF_FN(sf_ref_xent)(const T *logits, const int32_t *labels, int n, int k, T *loss, T *dlogits,
                        int *correct)
{
    T total = 0;
    int right = 0;
    for (int ni = 0; ni < n; ni++) {
        const T *l = logits + (size_t)ni * k;
        const int32_t lab = labels[ni];
        const int valid = lab >= 0 && lab < k;
        int arg = 0;
        T m = l[0];
        for (int j = 1; j < k; j++)
            if (l[j] > m) {
                m = l[j];
                arg = j;
            }
        T sum = 0;
        for (int j = 0; j < k; j++)
            sum += SF_EXP(l[j] - m);
        const T lse = m + SF_LOG(sum);
        total += valid ? lse - l[lab] : (T)NAN;
        right += valid && arg == lab;
        if (dlogits) {
            T *d = dlogits + (size_t)ni * k;
            for (int j = 0; j < k; j++) {
                const T p = SF_EXP(l[j] - lse);
                d[j] = valid ? (p - (j == lab ? (T)1 : (T)0)) / (T)n : (T)NAN;
            }
        }
    }
    if (loss)
        *loss = total / (T)n;
    if (correct)
        *correct = right;
}
