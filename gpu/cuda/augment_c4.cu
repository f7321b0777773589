/* gpu/cuda/augment_c4.cu — the fused augmentation kernels for 4-channel images.
 *
 * Instantiates dispatch_c<4, ...> of gpu/cuda/augment_kernels.cuh, and with it
 * the 4-channel kernels, for both output types; a file per channel count so that
 * a parallel build compiles the kernels' variants at once (that header says why).
 */
#include "gpu/cuda/augment_kernels.cuh"

namespace sf_aug_cuda {

SF_AUG_DISPATCH_C(4, float);
SF_AUG_DISPATCH_C(4, uint16_t);

} // namespace sf_aug_cuda
