/* gpu/layer_init.h — the layer kinds' parameter initialisations, PyTorch's
 * defaults for each module, drawn from counter-based hashes of the run's
 * seed, the layer and the element (so a layer's start does not depend on the
 * others'): the registry's rows (gpu/layers.c) point at them. Each writes
 * layer L's (index li) parameters into params at the layer's offsets. */
#ifndef SF_GPU_LAYER_INIT_H
#define SF_GPU_LAYER_INIT_H

#include <stdint.h>

#include "gpu/model.h"

void sf_init_conv2d(const sf_layer *L, int li, uint64_t seed, float *params);
void sf_init_convt2d(const sf_layer *L, int li, uint64_t seed, float *params);
void sf_init_linear(const sf_layer *L, int li, uint64_t seed, float *params);
void sf_init_ones_zeros(const sf_layer *L, int li, uint64_t seed, float *params);
void sf_init_layer_scale(const sf_layer *L, int li, uint64_t seed, float *params);
void sf_init_channel_conv1d(const sf_layer *L, int li, uint64_t seed, float *params);
void sf_init_prelu(const sf_layer *L, int li, uint64_t seed, float *params);
void sf_init_zeros(const sf_layer *L, int li, uint64_t seed, float *params);
void sf_init_pos_embedding(const sf_layer *L, int li, uint64_t seed, float *params);
void sf_init_attention(const sf_layer *L, int li, uint64_t seed, float *params);

#endif /* SF_GPU_LAYER_INIT_H */
