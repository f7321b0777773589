/* tests/unit/layer_kind_specs.h — the model specs of the layer-kind tests:
 * each exercises a family of kinds in one small model, trained through the
 * reference backend (test_ref_layer_kinds.c) and parsed, named and checked
 * by the registry (test_layer_registry.c). */
#ifndef SF_TESTS_UNIT_LAYER_KIND_SPECS_H
#define SF_TESTS_UNIT_LAYER_KIND_SPECS_H

/* Grouped and dilated convolution, Inception's 1xk and kx1 kernels (one
 * strided along the height only), leaky ReLU (a GAN discriminator's 0.2),
 * ELU (alpha 0.5), SELU, softplus (beta 2, threshold 2: both branches
 * taken), SiLU, affine (a negative scale and a shift), a clamp to
 * [-0.5, 0.5] under hardtanh's rule (the affine's outputs reach past both
 * bounds), Mish, tanh,
 * batchnorm over flat features (nn.BatchNorm1d); PReLU with a slope per
 * channel and with one over flat features. */
static const char *const GROUPED_SPEC =
    "{\"input\":[3,8,8],\"classes\":4,\"layers\":["
    "{\"type\":\"conv2d\",\"name\":\"c0\",\"out\":6,\"k\":1},"
    "{\"type\":\"prelu\",\"name\":\"pr\",\"num_parameters\":6},"
    "{\"type\":\"leaky_relu\",\"name\":\"lr\",\"negative_slope\":0.2},"
    "{\"type\":\"conv2d\",\"name\":\"g\",\"out\":6,\"k\":3,\"pad\":2,\"groups\":3,\"dilation\":2},"
    "{\"type\":\"elu\",\"name\":\"el\",\"alpha\":0.5},"
    "{\"type\":\"conv2d\",\"name\":\"r13\",\"out\":6,\"k\":[1,3],\"pad\":[0,1]},"
    "{\"type\":\"selu\",\"name\":\"se\"},"
    "{\"type\":\"conv2d\",\"name\":\"r31\",\"out\":6,\"k\":[3,1],\"stride\":[2,1],\"pad\":[1,0],"
    "\"dilation\":[1,2]},"
    "{\"type\":\"softplus\",\"name\":\"sp\",\"beta\":2,\"threshold\":2},"
    "{\"type\":\"silu\",\"name\":\"a\"},{\"type\":\"affine\",\"name\":\"af\",\"scale\":-1.5,\"shift\":0.25},"
    "{\"type\":\"clamp\",\"name\":\"cl\",\"min\":-0.5,\"max\":0.5,\"grad\":\"hardtanh\"},"
    "{\"type\":\"mish\",\"name\":\"mi\"},{\"type\":\"tanh\",\"name\":\"t\"},{\"type\":\"global_avgpool\",\"name\":\"gap\"},"
    "{\"type\":\"flatten\",\"name\":\"f\"},{\"type\":\"prelu\",\"name\":\"pr1\"},"
    "{\"type\":\"batchnorm2d\",\"name\":\"bn1d\"},{\"type\":\"linear\",\"name\":\"fc\",\"out\":4}]}";

/* MobileNetV3's block: depthwise conv, hardswish, squeeze-and-excitation
 * (adaptive pool, 1x1 convs, hardsigmoid, mul broadcast), sigmoid, relu6;
 * a log_softmax after the classifier (the cross-entropy on its output is
 * NLLLoss). */
static const char *const SE_SPEC =
    "{\"input\":[3,8,8],\"classes\":4,\"layers\":["
    "{\"type\":\"conv2d\",\"name\":\"c0\",\"out\":4,\"k\":1},"
    "{\"type\":\"conv2d\",\"name\":\"dw\",\"out\":4,\"k\":3,\"pad\":1,\"stride\":2,\"groups\":4},"
    "{\"type\":\"hardswish\",\"name\":\"a\"},"
    "{\"type\":\"adaptive_avgpool2d\",\"name\":\"se.avgpool\",\"out\":[1,1]},"
    "{\"type\":\"conv2d\",\"name\":\"se.fc1\",\"out\":2,\"k\":1},{\"type\":\"relu6\",\"name\":\"se.act\"},"
    "{\"type\":\"conv2d\",\"name\":\"se.fc2\",\"out\":4,\"k\":1},"
    "{\"type\":\"hardsigmoid\",\"name\":\"se.gate\"},"
    "{\"type\":\"mul\",\"name\":\"se.mul\",\"inputs\":[\"a\",\"se.gate\"]},"
    "{\"type\":\"sigmoid\",\"name\":\"s\"},{\"type\":\"global_avgpool\",\"name\":\"gap\"},"
    "{\"type\":\"flatten\",\"name\":\"f\"},{\"type\":\"linear\",\"name\":\"fc\",\"out\":4},"
    "{\"type\":\"log_softmax\",\"name\":\"lsm\"}]}";

/* ECA-ResNet's channel attention (timm's EcaModule): the pooled channels
 * through channel_conv1d (k 3, no bias), a sigmoid, the broadcast mul; and
 * a biased channel_conv1d across the flat features before the classifier. */
static const char *const ECA_SPEC =
    "{\"input\":[3,8,8],\"classes\":4,\"layers\":["
    "{\"type\":\"conv2d\",\"name\":\"c0\",\"out\":6,\"k\":3,\"pad\":1},{\"type\":\"relu\",\"name\":\"r0\"},"
    "{\"type\":\"global_avgpool\",\"name\":\"eca.pool\"},"
    "{\"type\":\"channel_conv1d\",\"name\":\"eca.conv\",\"k\":3,\"pad\":1,\"bias\":false},"
    "{\"type\":\"sigmoid\",\"name\":\"eca.gate\"},"
    "{\"type\":\"mul\",\"name\":\"eca\",\"inputs\":[\"r0\",\"eca.gate\"]},"
    "{\"type\":\"global_avgpool\",\"name\":\"gap\"},{\"type\":\"flatten\",\"name\":\"f\"},"
    "{\"type\":\"channel_conv1d\",\"name\":\"f.conv\",\"k\":5,\"pad\":2},"
    "{\"type\":\"linear\",\"name\":\"fc\",\"out\":4}]}";

/* MetaFormer v2 (timm's PoolFormerV2, ConvFormer): norms without a bias
 * (layernorm2d, groupnorm of one group, layernorm on features), StarReLU as
 * relu, square and a one-value scale_shift, a pooling token mixer. */
static const char *const METAFORMER_SPEC =
    "{\"input\":[3,8,8],\"classes\":4,\"layers\":["
    "{\"type\":\"conv2d\",\"name\":\"stem\",\"out\":6,\"k\":3,\"stride\":2,\"pad\":1},"
    "{\"type\":\"layernorm2d\",\"name\":\"stem.norm\",\"eps\":1e-6,\"bias\":false},"
    "{\"type\":\"groupnorm\",\"name\":\"norm1\",\"num_groups\":1,\"bias\":false},"
    "{\"type\":\"avgpool2d\",\"name\":\"pool\",\"k\":3,\"stride\":1,\"pad\":1,\"count_include_pad\":false},"
    "{\"type\":\"add\",\"name\":\"res\",\"inputs\":[\"stem.norm\",\"pool\"]},"
    "{\"type\":\"conv2d\",\"name\":\"fc1\",\"out\":8,\"k\":1},"
    "{\"type\":\"relu\",\"name\":\"act.relu\"},{\"type\":\"square\",\"name\":\"act.square\"},"
    "{\"type\":\"scale_shift\",\"name\":\"act\",\"param_names\":{\"weight\":\"scale\"}},"
    "{\"type\":\"global_avgpool\",\"name\":\"gap\"},{\"type\":\"flatten\",\"name\":\"f\"},"
    "{\"type\":\"layernorm\",\"name\":\"head.norm\",\"bias\":false},"
    "{\"type\":\"linear\",\"name\":\"fc\",\"out\":4}]}";

/* ConvNeXt's block: layernorm2d, depthwise conv, linear over channels, GELU,
 * layer scale, stochastic depth, residual; a groupnorm, one without affine
 * (an instance norm: no parameters), upsamplings (nearest by a factor and to a
 * size down, bilinear to an odd size with align_corners and by a factor
 * without); a head with layernorm and the tanh GELU. */
static const char *const CONVNEXT_SPEC =
    "{\"input\":[3,8,8],\"classes\":4,\"layers\":["
    "{\"type\":\"conv2d\",\"name\":\"stem.0\",\"out\":4,\"k\":2,\"stride\":2},"
    "{\"type\":\"layernorm2d\",\"name\":\"stem.1\",\"eps\":1e-6},"
    "{\"type\":\"conv2d\",\"name\":\"block.0\",\"out\":4,\"k\":3,\"pad\":1,\"groups\":4},"
    "{\"type\":\"layernorm2d\",\"name\":\"block.2\"},"
    "{\"type\":\"linear\",\"name\":\"block.3\",\"out\":8,\"over\":\"channels\"},"
    "{\"type\":\"gelu\",\"name\":\"block.4\"},"
    "{\"type\":\"linear\",\"name\":\"block.5\",\"out\":4,\"over\":\"channels\"},"
    "{\"type\":\"layer_scale\",\"name\":\"blk\"},"
    "{\"type\":\"stochastic_depth\",\"name\":\"sd\",\"p\":0.25,\"mode\":\"row\"},"
    "{\"type\":\"add\",\"name\":\"res\",\"inputs\":[\"stem.1\",\"sd\"]},"
    "{\"type\":\"groupnorm\",\"name\":\"gn\",\"num_groups\":2,\"eps\":1e-6},"
    "{\"type\":\"groupnorm\",\"name\":\"inorm\",\"num_groups\":4,\"affine\":false},"
    "{\"type\":\"upsample\",\"name\":\"up\",\"scale\":2},"
    "{\"type\":\"upsample\",\"name\":\"upb\",\"size\":[5,7],\"mode\":\"bilinear\",\"align_corners\":true},"
    "{\"type\":\"upsample\",\"name\":\"upn\",\"size\":[3,6]},"
    "{\"type\":\"upsample\",\"name\":\"upc\",\"scale\":2,\"mode\":\"bilinear\"},"
    "{\"type\":\"adaptive_avgpool2d\",\"name\":\"pool\",\"out\":[2,2]},"
    "{\"type\":\"flatten\",\"name\":\"f\"},{\"type\":\"layernorm\",\"name\":\"head.norm\"},"
    "{\"type\":\"gelu\",\"name\":\"head.act\",\"approximate\":\"tanh\"},"
    "{\"type\":\"linear\",\"name\":\"fc\",\"out\":4}]}";

/* DenseNet's concatenations, batchnorm with eps and momentum, average
 * pooling with ceil_mode, maxpool2d with ceil_mode, channel dropout,
 * dropout. */
static const char *const DENSE_SPEC =
    "{\"input\":[3,8,8],\"classes\":4,\"layers\":["
    "{\"type\":\"conv2d\",\"name\":\"c0\",\"out\":4,\"k\":1},"
    "{\"type\":\"conv2d\",\"name\":\"c1\",\"out\":2,\"k\":3,\"pad\":1},"
    "{\"type\":\"concat\",\"name\":\"cat1\",\"inputs\":[\"c0\",\"c1\"]},"
    "{\"type\":\"batchnorm2d\",\"name\":\"bn\",\"eps\":0.001,\"momentum\":0.2},{\"type\":\"relu\",\"name\":\"r\"},"
    "{\"type\":\"conv2d\",\"name\":\"c2\",\"out\":2,\"k\":1},"
    "{\"type\":\"concat\",\"name\":\"cat2\",\"inputs\":[\"c0\",\"c1\",\"c2\"]},"
    "{\"type\":\"avgpool2d\",\"name\":\"p1\",\"k\":2},"
    "{\"type\":\"avgpool2d\",\"name\":\"p2\",\"k\":3,\"stride\":2,\"pad\":1,\"ceil_mode\":true,"
    "\"count_include_pad\":false},"
    "{\"type\":\"maxpool2d\",\"name\":\"p3\",\"k\":2,\"stride\":2,\"ceil_mode\":true},"
    "{\"type\":\"dropout2d\",\"name\":\"drop2d\",\"p\":0.25},"
    "{\"type\":\"flatten\",\"name\":\"f\"},{\"type\":\"dropout\",\"name\":\"drop\",\"p\":0.25},"
    "{\"type\":\"linear\",\"name\":\"fc\",\"out\":4}]}";

/* A Vision Transformer in miniature: a patch embedding (conv2d, to_tokens),
 * the class token, the position embedding, one encoder block (layernorm and
 * linear on tokens, self-attention, GELU, dropout, residual adds), the
 * class token as features and a head. 8x8 input, 4x4 patches: 4 tokens, 5
 * with the class token, of 8, in 2 heads. */
static const char *const VIT_SPEC =
    "{\"input\":[3,8,8],\"classes\":4,\"layers\":["
    "{\"type\":\"conv2d\",\"name\":\"conv_proj\",\"out\":8,\"k\":4,\"stride\":4},"
    "{\"type\":\"to_tokens\",\"name\":\"to_tokens\"},"
    "{\"type\":\"class_token\",\"name\":\"class_token\"},"
    "{\"type\":\"pos_embedding\",\"name\":\"encoder.pos_embedding\"},"
    "{\"type\":\"layernorm\",\"name\":\"ln_1\",\"eps\":1e-6},"
    "{\"type\":\"self_attention\",\"name\":\"attn\",\"num_heads\":2},"
    "{\"type\":\"add\",\"name\":\"add\",\"inputs\":[\"attn\",\"encoder.pos_embedding\"]},"
    "{\"type\":\"layernorm\",\"name\":\"ln_2\",\"eps\":1e-6},"
    "{\"type\":\"linear\",\"name\":\"mlp.0\",\"out\":16},{\"type\":\"gelu\",\"name\":\"mlp.1\"},"
    "{\"type\":\"dropout\",\"name\":\"mlp.2\",\"p\":0.25},"
    "{\"type\":\"linear\",\"name\":\"mlp.3\",\"out\":8},"
    "{\"type\":\"add\",\"name\":\"add_1\",\"inputs\":[\"add\",\"mlp.3\"]},"
    "{\"type\":\"layernorm\",\"name\":\"encoder.ln\",\"eps\":1e-6},"
    "{\"type\":\"select_token\",\"name\":\"select_token\"},"
    "{\"type\":\"linear\",\"name\":\"heads.head\",\"out\":4}]}";

/* ShuffleNetV2's stride-1 block: a map chunked in two (both chunks read: the
 * later slice's gradient overwrites c0's, the earlier one's is added to it),
 * one chunk through a branch, the concatenation shuffled; then a slice of
 * the shuffle that is its only reader (the gradient outside it is zero). */
static const char *const SHUFFLE_SPEC =
    "{\"input\":[3,8,8],\"classes\":4,\"layers\":["
    "{\"type\":\"conv2d\",\"name\":\"c0\",\"out\":6,\"k\":1},"
    "{\"type\":\"channel_slice\",\"name\":\"x1\",\"start\":0,\"count\":3,\"inputs\":[\"c0\"]},"
    "{\"type\":\"channel_slice\",\"name\":\"x2\",\"start\":3,\"count\":3,\"inputs\":[\"c0\"]},"
    "{\"type\":\"conv2d\",\"name\":\"branch2\",\"out\":3,\"k\":3,\"pad\":1},"
    "{\"type\":\"concat\",\"name\":\"cat\",\"inputs\":[\"x1\",\"branch2\"]},"
    "{\"type\":\"channel_shuffle\",\"name\":\"shuffle\",\"groups\":2},"
    "{\"type\":\"channel_slice\",\"name\":\"part\",\"start\":1,\"count\":4},"
    "{\"type\":\"relu\",\"name\":\"r\"},{\"type\":\"global_avgpool\",\"name\":\"gap\"},"
    "{\"type\":\"flatten\",\"name\":\"f\"},{\"type\":\"linear\",\"name\":\"fc\",\"out\":4}]}";

/* A CycleGAN-like generator's pads: reflect 3 before a 7x7 convolution,
 * replicate before a 3x3, TensorFlow's "same" as a zero pad on the right
 * and bottom before a stride-2 convolution, then a circular pad and a
 * constant 0.5 one that no convolution reads. */
static const char *const PAD_SPEC =
    "{\"input\":[3,8,8],\"classes\":4,\"layers\":["
    "{\"type\":\"pad\",\"name\":\"rp\",\"pad\":[3,3,3,3],\"mode\":\"reflect\"},"
    "{\"type\":\"conv2d\",\"name\":\"c0\",\"out\":4,\"k\":7},{\"type\":\"relu\",\"name\":\"r0\"},"
    "{\"type\":\"pad\",\"name\":\"ep\",\"pad\":[1,1,1,1],\"mode\":\"replicate\"},"
    "{\"type\":\"conv2d\",\"name\":\"c1\",\"out\":4,\"k\":3},"
    "{\"type\":\"pad\",\"name\":\"zp\",\"pad\":[0,1,0,1]},"
    "{\"type\":\"conv2d\",\"name\":\"c2\",\"out\":4,\"k\":3,\"stride\":2},"
    "{\"type\":\"pad\",\"name\":\"cp\",\"pad\":[1,2,1,0],\"mode\":\"circular\"},"
    "{\"type\":\"pad\",\"name\":\"kp\",\"pad\":[1,1,1,1],\"mode\":\"constant\",\"value\":0.5},"
    "{\"type\":\"tanh\",\"name\":\"t\"},{\"type\":\"global_avgpool\",\"name\":\"gap\"},"
    "{\"type\":\"flatten\",\"name\":\"f\"},{\"type\":\"linear\",\"name\":\"fc\",\"out\":4}]}";

#endif
