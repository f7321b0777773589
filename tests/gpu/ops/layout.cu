/* tests/gpu/ops/layout.cu — the batched transpose of gpu/cuda/layout.h
 * against a host transpose, exact, at square-tile and ragged shapes.
 * The rows: tests/gpu/op_cases.cu; helpers and criteria: op_test.h.
 */
#include "tests/gpu/op_cases.h"
#include "tests/gpu/op_test.h"

static void test_transpose(cudaStream_t s, int batch, int rows, int cols, double tol)
{
    char nm[80];
    snprintf(nm, sizeof nm, "transpose %dx%dx%d", batch, rows, cols);
    const size_t len = (size_t)batch * rows * cols;
    std::vector<float> x(len);
    rand_fill(x, 1.f);
    std::vector<double> ref(len);
    for (int b = 0; b < batch; b++)
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++)
                ref[((size_t)b * cols + c) * rows + r] = x[((size_t)b * rows + r) * cols + c];
    float *dx = dalloc<float>(len), *dy = dalloc<float>(len);
    up(dx, x);
    poison_f(dy, len);
    int rc = sf_cuda_transpose(dx, dy, batch, rows, cols, s);
    CU(cudaStreamSynchronize(s));
    if (rc) fail(nm, sf_cuda_last_error()); else check_f(nm, down(dy, len).data(), ref, tol);
    cudaFree(dx);
    cudaFree(dy);
}

/* shape {batch, rows, cols}; tol: the norm check's bound (the moves are exact) */
void cmp_transpose(const op_case &c, const op_env &e) { test_transpose(e.s, c.shape[0], c.shape[1], c.shape[2], c.tol); }
