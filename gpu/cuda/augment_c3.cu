/* gpu/cuda/augment_c3.cu — the fused augmentation kernels for 3-channel images.
 *
 * Instantiates dispatch_c<3, ...> of gpu/cuda/augment_kernels.cuh, and with it
 * the 3-channel kernels, for both output types; a file per channel count so that
 * a parallel build compiles the kernels' variants at once (that header says why).
 */
#include "gpu/cuda/augment_kernels.cuh"

namespace sf_aug_cuda {

SF_AUG_DISPATCH_C(3, float);
SF_AUG_DISPATCH_C(3, uint16_t);

} // namespace sf_aug_cuda
