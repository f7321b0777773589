/* gpu/ref/layers_w23_impl.h — the reference layers of W2/W3 (issue 9), written
 * once for a scalar type. Private to gpu/ref/layers_w23.c, which includes it
 * twice, exactly as layers.c includes layers_impl.h:
 *   T        the scalar type (float, double)
 *   SF_FN(x) the function name for that type (x, x##_f64)
 *   SF_EXP, SF_LOG, SF_SQRT  exp/log/sqrt for T
 * Accumulators are T too, so the float version computes what a float kernel
 * would. Outputs are overwritten, never accumulated into (the one place that
 * sums into its output, the maxpool backward, zeroes it first).
 * Semantics are PyTorch's; see gpu/ref/ref.h for each function's contract.
 */
#if !defined(T) || !defined(SF_FN) || !defined(SF_EXP) || !defined(SF_LOG) || !defined(SF_SQRT)
#error "layers_w23_impl.h is included by gpu/ref/layers_w23.c with T, SF_FN, SF_EXP, SF_LOG, SF_SQRT defined"
#endif

/* ---- conv_transpose2d ------------------------------------------------------ */

/* The adjoint of conv2d: every input pixel scatters its kernel into the output.
 *   y[n][o][iy*s+ky-p][ix*s+kx-p] += x[n][c][iy][ix] * w[c][o][ky][kx]
 * over all c, iy, ix, ky, kx whose target lies inside the output, starting
 * from y = b[o] (or 0). Taps that land in the cropped border (the -p) are
 * dropped, which is what PyTorch's padding means for a transposed conv. */
void SF_FN(sf_ref_convt2d_fwd)(const T *x, int n, int c, int h, int w, const T *wt, const T *b,
                               int oc, int k, int stride, int pad, T *y)
{
    const int oh = (h - 1) * stride - 2 * pad + k, ow = (w - 1) * stride - 2 * pad + k;
    for (int ni = 0; ni < n; ni++) {
        for (int o = 0; o < oc; o++) {
            T *yp = y + ((size_t)ni * oc + o) * oh * ow;
            for (int i = 0; i < oh * ow; i++)
                yp[i] = b ? b[o] : (T)0;
            for (int ci = 0; ci < c; ci++) {
                const T *xp = x + ((size_t)ni * c + ci) * h * w;
                const T *wp = wt + ((size_t)ci * oc + o) * k * k;
                for (int iy = 0; iy < h; iy++) {
                    for (int ix = 0; ix < w; ix++) {
                        const T xv = xp[(size_t)iy * w + ix];
                        for (int ky = 0; ky < k; ky++) {
                            const int oy = iy * stride + ky - pad;
                            if (oy < 0 || oy >= oh)
                                continue;
                            for (int kx = 0; kx < k; kx++) {
                                const int ox = ix * stride + kx - pad;
                                if (ox < 0 || ox >= ow)
                                    continue;
                                yp[(size_t)oy * ow + ox] += xv * wp[ky * k + kx];
                            }
                        }
                    }
                }
            }
        }
    }
}

/* With oy = iy*s+ky-p, ox = ix*s+kx-p (inside the output only):
 *   db[o]             = sum_{n,oy,ox} dy[n][o][oy][ox]
 *   dw[c][o][ky][kx]  = sum_{n,iy,ix} x[n][c][iy][ix] * dy[n][o][oy][ox]
 *   dx[n][c][iy][ix]  = sum_{o,ky,kx} w[c][o][ky][kx] * dy[n][o][oy][ox]
 * (dx is conv2d's forward of dy with the same weight, no bias.) */
void SF_FN(sf_ref_convt2d_bwd)(const T *x, int n, int c, int h, int w, const T *wt, int oc, int k,
                               int stride, int pad, const T *dy, T *dx, T *dw, T *db)
{
    const int oh = (h - 1) * stride - 2 * pad + k, ow = (w - 1) * stride - 2 * pad + k;
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
    for (int ci = 0; ci < c; ci++) {
        for (int o = 0; o < oc; o++) {
            for (int ky = 0; ky < k; ky++) {
                for (int kx = 0; kx < k; kx++) {
                    T acc = 0;
                    for (int ni = 0; ni < n; ni++) {
                        const T *xp = x + ((size_t)ni * c + ci) * h * w;
                        const T *dyp = dy + ((size_t)ni * oc + o) * oh * ow;
                        for (int iy = 0; iy < h; iy++) {
                            const int oy = iy * stride + ky - pad;
                            if (oy < 0 || oy >= oh)
                                continue;
                            for (int ix = 0; ix < w; ix++) {
                                const int ox = ix * stride + kx - pad;
                                if (ox < 0 || ox >= ow)
                                    continue;
                                acc += xp[(size_t)iy * w + ix] * dyp[(size_t)oy * ow + ox];
                            }
                        }
                    }
                    dw[(((size_t)ci * oc + o) * k + ky) * k + kx] = acc;
                }
            }
        }
    }
    if (!dx)
        return;
    for (int ni = 0; ni < n; ni++) {
        for (int ci = 0; ci < c; ci++) {
            T *dxp = dx + ((size_t)ni * c + ci) * h * w;
            for (int iy = 0; iy < h; iy++) {
                for (int ix = 0; ix < w; ix++) {
                    T acc = 0;
                    for (int o = 0; o < oc; o++) {
                        const T *dyp = dy + ((size_t)ni * oc + o) * oh * ow;
                        const T *wp = wt + ((size_t)ci * oc + o) * k * k;
                        for (int ky = 0; ky < k; ky++) {
                            const int oy = iy * stride + ky - pad;
                            if (oy < 0 || oy >= oh)
                                continue;
                            for (int kx = 0; kx < k; kx++) {
                                const int ox = ix * stride + kx - pad;
                                if (ox < 0 || ox >= ow)
                                    continue;
                                acc += wp[ky * k + kx] * dyp[(size_t)oy * ow + ox];
                            }
                        }
                    }
                    dxp[(size_t)iy * w + ix] = acc;
                }
            }
        }
    }
}

/* ---- per-pixel cross-entropy ----------------------------------------------- */

/* For every pixel (n, y, x): the k logits l[n][j][y][x] (stride h*w apart),
 *   loss = mean over the n*h*w pixels of ( logsumexp_j l - l[label] ),
 *   dl[n][j][y][x] = (softmax_j - [j == label]) / (n*h*w).
 * The argmax is the first maximum (as torch.argmax). A label outside [0,k)
 * makes the loss NaN and that pixel's gradient NaN (as sf_ref_xent). */
void SF_FN(sf_ref_xent2d)(const T *logits, const int32_t *labels, int n, int k, int h, int w,
                          T *loss, T *dlogits, int64_t *correct)
{
    const size_t hw = (size_t)h * w;
    const size_t pixels = (size_t)n * hw;
    T total = 0;
    int64_t right = 0;
    for (int ni = 0; ni < n; ni++) {
        for (size_t pix = 0; pix < hw; pix++) {
            const T *l = logits + (size_t)ni * k * hw + pix; /* l[j * hw] is class j */
            const int32_t lab = labels[(size_t)ni * hw + pix];
            const int valid = lab >= 0 && lab < k;
            int arg = 0;
            T m = l[0];
            for (int j = 1; j < k; j++)
                if (l[j * hw] > m) {
                    m = l[j * hw];
                    arg = j;
                }
            T sum = 0;
            for (int j = 0; j < k; j++)
                sum += SF_EXP(l[j * hw] - m);
            const T lse = m + SF_LOG(sum);
            total += valid ? lse - l[(size_t)lab * hw] : (T)NAN;
            right += valid && arg == lab;
            if (dlogits) {
                T *d = dlogits + (size_t)ni * k * hw + pix;
                for (int j = 0; j < k; j++) {
                    const T p = SF_EXP(l[j * hw] - lse);
                    d[j * hw] = valid ? (p - (j == lab ? (T)1 : (T)0)) / (T)pixels : (T)NAN;
                }
            }
        }
    }
    if (loss)
        *loss = total / (T)pixels;
    if (correct)
        *correct = right;
}

/* ---- batchnorm2d ------------------------------------------------------------- */

/* Training mode. Per channel, over the cnt = n*h*w values:
 *   mean = sum x / cnt;  var = sum (x - mean)^2 / cnt  (biased, two passes);
 *   invstd = 1 / sqrt(var + eps);  y = gamma * (x - mean) * invstd + beta;
 *   running_mean = (1 - m) * running_mean + m * mean;
 *   running_var  = (1 - m) * running_var  + m * var * cnt / (cnt - 1)  (unbiased).
 * PyTorch refuses cnt == 1 in training ("Expected more than 1 value per
 * channel"); here the unbiased variance is then NaN, so running_var becomes
 * NaN rather than silently wrong. running_mean/running_var may both be NULL
 * (track_running_stats=False). */
void SF_FN(sf_ref_bn2d_fwd_train)(const T *x, int n, int c, int h, int w, const T *gamma,
                                  const T *beta, T eps, T momentum, T *running_mean,
                                  T *running_var, T *save_mean, T *save_invstd, T *y)
{
    const size_t hw = (size_t)h * w;
    const size_t cnt = (size_t)n * hw;
    for (int ci = 0; ci < c; ci++) {
        T sum = 0;
        for (int ni = 0; ni < n; ni++) {
            const T *xp = x + ((size_t)ni * c + ci) * hw;
            for (size_t i = 0; i < hw; i++)
                sum += xp[i];
        }
        const T mean = sum / (T)cnt;
        T sq = 0;
        for (int ni = 0; ni < n; ni++) {
            const T *xp = x + ((size_t)ni * c + ci) * hw;
            for (size_t i = 0; i < hw; i++)
                sq += (xp[i] - mean) * (xp[i] - mean);
        }
        const T var = sq / (T)cnt;
        const T invstd = (T)1 / SF_SQRT(var + eps);
        for (int ni = 0; ni < n; ni++) {
            const T *xp = x + ((size_t)ni * c + ci) * hw;
            T *yp = y + ((size_t)ni * c + ci) * hw;
            for (size_t i = 0; i < hw; i++)
                yp[i] = gamma[ci] * ((xp[i] - mean) * invstd) + beta[ci];
        }
        save_mean[ci] = mean;
        save_invstd[ci] = invstd;
        if (running_mean && running_var) {
            const T unbiased = cnt > 1 ? sq / (T)(cnt - 1) : (T)NAN;
            running_mean[ci] = ((T)1 - momentum) * running_mean[ci] + momentum * mean;
            running_var[ci] = ((T)1 - momentum) * running_var[ci] + momentum * unbiased;
        }
    }
}

/* Eval mode: y = gamma * (x - running_mean) / sqrt(running_var + eps) + beta. */
void SF_FN(sf_ref_bn2d_fwd_eval)(const T *x, int n, int c, int h, int w, const T *gamma,
                                 const T *beta, T eps, const T *running_mean, const T *running_var,
                                 T *y)
{
    const size_t hw = (size_t)h * w;
    for (int ci = 0; ci < c; ci++) {
        const T invstd = (T)1 / SF_SQRT(running_var[ci] + eps);
        for (int ni = 0; ni < n; ni++) {
            const T *xp = x + ((size_t)ni * c + ci) * hw;
            T *yp = y + ((size_t)ni * c + ci) * hw;
            for (size_t i = 0; i < hw; i++)
                yp[i] = gamma[ci] * ((xp[i] - running_mean[ci]) * invstd) + beta[ci];
        }
    }
}

/* Backward of training mode (the batch statistics depend on x). Per channel,
 * with xhat = (x - mean) * invstd over the cnt = n*h*w values:
 *   dbeta  = sum dy;  dgamma = sum dy * xhat;
 *   dx     = gamma * invstd / cnt * (cnt * dy - dbeta - xhat * dgamma). */
void SF_FN(sf_ref_bn2d_bwd)(const T *x, int n, int c, int h, int w, const T *gamma,
                            const T *save_mean, const T *save_invstd, const T *dy, T *dx,
                            T *dgamma, T *dbeta)
{
    const size_t hw = (size_t)h * w;
    const size_t cnt = (size_t)n * hw;
    for (int ci = 0; ci < c; ci++) {
        const T mean = save_mean[ci], invstd = save_invstd[ci];
        T sum_dy = 0, sum_dy_xhat = 0;
        for (int ni = 0; ni < n; ni++) {
            const T *xp = x + ((size_t)ni * c + ci) * hw;
            const T *dyp = dy + ((size_t)ni * c + ci) * hw;
            for (size_t i = 0; i < hw; i++) {
                sum_dy += dyp[i];
                sum_dy_xhat += dyp[i] * ((xp[i] - mean) * invstd);
            }
        }
        dbeta[ci] = sum_dy;
        dgamma[ci] = sum_dy_xhat;
        const T scale = gamma[ci] * invstd / (T)cnt;
        for (int ni = 0; ni < n; ni++) {
            const T *xp = x + ((size_t)ni * c + ci) * hw;
            const T *dyp = dy + ((size_t)ni * c + ci) * hw;
            T *dxp = dx + ((size_t)ni * c + ci) * hw;
            for (size_t i = 0; i < hw; i++) {
                const T xhat = (xp[i] - mean) * invstd;
                dxp[i] = scale * ((T)cnt * dyp[i] - sum_dy - xhat * sum_dy_xhat);
            }
        }
    }
}

/* ---- maxpool2d ----------------------------------------------------------------- */

/* oh = (h + 2*pad - k) / stride + 1 (floor, as ceil_mode=False). The window of
 * output (oy, ox) covers input rows oy*s-p .. oy*s-p+k-1 (same for columns);
 * taps in the padding are skipped (padding is -inf in PyTorch: it never wins).
 * The first in-input tap in row-major window order is taken, then a later tap
 * replaces it only if strictly greater or NaN (PyTorch's rule, so the first
 * maximum wins ties and a NaN propagates). A window with no tap inside the
 * input (impossible when pad <= k/2, which PyTorch requires) gives -inf and
 * argmax -1, which the backward skips. */
void SF_FN(sf_ref_maxpool2d_fwd)(const T *x, int n, int c, int h, int w, int k, int stride,
                                 int pad, T *y, int32_t *argmax)
{
    const int oh = (h + 2 * pad - k) / stride + 1, ow = (w + 2 * pad - k) / stride + 1;
    for (size_t plane = 0; plane < (size_t)n * c; plane++) {
        const T *xp = x + plane * h * w;
        T *yp = y + plane * oh * ow;
        int32_t *ap = argmax + plane * oh * ow;
        for (int oy = 0; oy < oh; oy++) {
            for (int ox = 0; ox < ow; ox++) {
                T best = (T)-INFINITY;
                int32_t best_i = -1;
                for (int ky = 0; ky < k; ky++) {
                    const int iy = oy * stride - pad + ky;
                    if (iy < 0 || iy >= h)
                        continue;
                    for (int kx = 0; kx < k; kx++) {
                        const int ix = ox * stride - pad + kx;
                        if (ix < 0 || ix >= w)
                            continue;
                        const T v = xp[(size_t)iy * w + ix];
                        if (best_i < 0 || v > best || isnan(v)) {
                            best = v;
                            best_i = iy * w + ix;
                        }
                    }
                }
                yp[(size_t)oy * ow + ox] = best;
                ap[(size_t)oy * ow + ox] = best_i;
            }
        }
    }
}

/* dx[argmax] += dy for every output. NOTE: this one sums into dx (windows
 * overlap when stride < k, so one input can be chosen by several outputs), so
 * it zeroes the whole of dx first: the result is still written, not
 * accumulated onto what the caller had there. */
void SF_FN(sf_ref_maxpool2d_bwd)(const T *dy, const int32_t *argmax, int n, int c, int h, int w,
                                 int oh, int ow, T *dx)
{
    for (size_t i = 0; i < (size_t)n * c * h * w; i++)
        dx[i] = 0;
    for (size_t plane = 0; plane < (size_t)n * c; plane++) {
        const T *dyp = dy + plane * oh * ow;
        const int32_t *ap = argmax + plane * oh * ow;
        T *dxp = dx + plane * h * w;
        for (size_t o = 0; o < (size_t)oh * ow; o++)
            if (ap[o] >= 0)
                dxp[ap[o]] += dyp[o];
    }
}

/* ---- global average pool ------------------------------------------------------- */

/* y[n][c] = sum_{y,x} x[n][c][y][x] / (h*w) */
void SF_FN(sf_ref_avgpool_fwd)(const T *x, int n, int c, int h, int w, T *y)
{
    const size_t hw = (size_t)h * w;
    for (size_t plane = 0; plane < (size_t)n * c; plane++) {
        const T *xp = x + plane * hw;
        T acc = 0;
        for (size_t i = 0; i < hw; i++)
            acc += xp[i];
        y[plane] = acc / (T)hw;
    }
}

/* dx[n][c][y][x] = dy[n][c] / (h*w) */
void SF_FN(sf_ref_avgpool_bwd)(const T *dy, int n, int c, int h, int w, T *dx)
{
    const size_t hw = (size_t)h * w;
    for (size_t plane = 0; plane < (size_t)n * c; plane++) {
        const T g = dy[plane] / (T)hw;
        for (size_t i = 0; i < hw; i++)
            dx[plane * hw + i] = g;
    }
}

/* ---- residual add ------------------------------------------------------------------ */

/* y = a + b; y may be a or b (in place). The backward is dy for both inputs:
 * no function, the caller passes dy on. */
void SF_FN(sf_ref_add_fwd)(const T *a, const T *b, size_t len, T *y)
{
    for (size_t i = 0; i < len; i++)
        y[i] = a[i] + b[i];
}
