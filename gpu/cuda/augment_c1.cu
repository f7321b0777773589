/* gpu/cuda/augment_c1.cu — the fused augmentation kernels for 1-channel images.
 *
 * Instantiates dispatch_c<1, ...> of gpu/cuda/augment_kernels.cuh, and with it
 * the 1-channel kernels, for both output types; a file per channel count so that
 * a parallel build compiles the kernels' variants at once (that header says why).
 */
#include "gpu/cuda/augment_kernels.cuh"

namespace sf_aug_cuda {

SF_AUG_DISPATCH_C(1, float);
SF_AUG_DISPATCH_C(1, uint16_t);

} // namespace sf_aug_cuda
