/* gpu/cuda/augment_c2.cu — the fused augmentation kernels for 2-channel images.
 *
 * Instantiates dispatch_c<2, ...> of gpu/cuda/augment_kernels.cuh, and with it
 * the 2-channel kernels, for both output types; a file per channel count so that
 * a parallel build compiles the kernels' variants at once (that header says why).
 */
#include "gpu/cuda/augment_kernels.cuh"

namespace sf_aug_cuda {

SF_AUG_DISPATCH_C(2, float);
SF_AUG_DISPATCH_C(2, uint16_t);

} // namespace sf_aug_cuda
