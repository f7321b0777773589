/* tests/gpu/test_layout.cu — the batched transpose of gpu/cuda/layout.h
 * against a host transpose, exact, at square-tile and ragged shapes. *
 * Prints "ok <case>" or "FAIL <case>: ..." per case; exits 1 on any failure,
 * 0 with "SKIPPED: no CUDA device" when there is no GPU. Helpers and the
 * criteria they apply: op_test.h.
 */
#include "tests/gpu/op_test.h"

static void test_transpose(cudaStream_t s, int batch, int rows, int cols)
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
    if (rc) fail(nm, sf_cuda_last_error()); else check_f(nm, down(dy, len).data(), ref, 1e-7);
    cudaFree(dx);
    cudaFree(dy);
}

static void run_cases(cudaStream_t s)
{
    test_transpose(s, 3, 37, 45);
    test_transpose(s, 2, 4096, 3);
}

int main(void)
{
    return run_op_test("test_layout", run_cases);
}
