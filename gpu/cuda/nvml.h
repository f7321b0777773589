/* gpu/cuda/nvml.h — device telemetry through NVML, loaded at run time.
 *
 * libnvidia-ml.so.1 is dlopen()ed at the first call (pthread_once), so the
 * binary has no link-time dependency on the driver and still starts where
 * there is none; then every call answers -1.
 *
 * The device is named by its PCI bus id as CUDA reports it
 * (cudaDeviceGetPCIBusId), which maps a CUDA ordinal to the NVML device also
 * under CUDA_VISIBLE_DEVICES; when that lookup fails and NVML sees exactly one
 * device, that one is used.
 *
 * Threads: any thread, concurrently. Fields the driver does not report for
 * this device (power on some virtual GPUs, say) are -1; valid is 1 when the
 * device was found and its memory read.
 */
#ifndef SF_GPU_CUDA_NVML_H
#define SF_GPU_CUDA_NVML_H

#ifdef __cplusplus
extern "C" {
#endif

#include "gpu/backend.h"

/* Fills out (zeroed first) for the device with this PCI bus id. Returns 0, or
 * -1 with out->valid == 0 when NVML or the device is unavailable. */
int sf_nvml_device_stats(const char *pci_bus_id, sf_device_stats *out);

/* Why NVML is unavailable ("" when it loaded), for logs and tests. */
const char *sf_nvml_error(void);

#ifdef __cplusplus
}
#endif

#endif /* SF_GPU_CUDA_NVML_H */
