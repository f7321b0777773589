/* gpu/ref/generic.h — compiles the generic part of a reference file twice: for
 * float (the backend's functions) and for double (the _f64 functions the
 * finite-difference tests use), so the two cannot drift.
 *
 * A reference file (conv.c, pool.c, ...) writes its functions once, on a scalar
 * type T, in the #else branch of an `#ifndef T`; its first branch defines
 * SF_REF_SELF to the file's own name and includes this header, which includes
 * the file back once per type with:
 *   T        the scalar type (float, double)
 *   SF_FN(x) the function name for that type (x, x##_f64)
 *   SF_EXP, SF_LOG, SF_SQRT  exp/log/sqrt for T
 * Accumulators are T too, so the float version computes what a float kernel
 * would, but for the per-channel sums that make a bias's, a channel scale's
 * and a PReLU weight's gradient: those run over a whole batch of maps (a
 * one-value parameter over the whole tensor), where one float running sum
 * drifts by about sqrt(n) rounding steps, far beyond PyTorch's blocked sums
 * and the CUDA kernels' trees; they accumulate in double (HGNetV2's
 * LearnableAffineBlock gradients, sums that nearly cancel, were 10 to 35
 * times further from float64 than PyTorch's float32 with float running
 * sums, at most about 6 times with double ones). Outputs are overwritten,
 * never accumulated into (the one place that sums into its output, the
 * maxpool backward, zeroes it first). Semantics are PyTorch's; see
 * gpu/ref/ref.h for each function's contract.
 */
#ifndef SF_REF_SELF
#error "generic.h is included by a gpu/ref/*.c file that defines SF_REF_SELF to its own name"
#endif

#define T float
#define SF_FN(name) name
#define SF_EXP expf
#define SF_LOG logf
#define SF_SQRT sqrtf
#include SF_REF_SELF
#undef T
#undef SF_FN
#undef SF_EXP
#undef SF_LOG
#undef SF_SQRT

#define T double
#define SF_FN(name) name##_f64
#define SF_EXP exp
#define SF_LOG log
#define SF_SQRT sqrt
#include SF_REF_SELF
#undef T
#undef SF_FN
#undef SF_EXP
#undef SF_LOG
#undef SF_SQRT

#undef SF_REF_SELF
