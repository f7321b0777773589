"""What the exporter (streamfeed.export) maps onto the service's layer kinds:
the tables its refusals and docs/EXPORT.md show (``SUPPORTED_MODULES``,
``SUPPORTED_FUNCTIONS``), and the spellings of the activations -- module
classes, functions and ``Tensor`` methods of a traced ``forward()`` -- with
the kind each becomes, with the fields an activation takes from a module
or a call (_act_fields). The converter itself is in export.py."""
from __future__ import annotations

import math
from typing import Any, Callable, Dict

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from .export_error import ExportError

__all__ = ["SUPPORTED_MODULES", "SUPPORTED_FUNCTIONS", "MODULE_ACTIVATIONS", "FUNCTION_ACTIVATIONS",
           "METHOD_ACTIVATIONS"]

# What maps onto the layer kinds of the service (gpu/model.h): the module
# classes by name, and the functions and tensor methods of a traced forward().
SUPPORTED_MODULES: Dict[str, str] = {
    "Conv2d": "conv2d (groups, dilation, square or [h, w] windows, zero padding; padding_mode reflect, replicate "
              "or circular and the extra of an uneven padding=\"same\" as a pad layer before it)",
    "ConvTranspose2d": "conv_transpose2d (groups 1, no output_padding)",
    "BatchNorm2d": "batchnorm2d (affine, with running statistics)",
    "BatchNorm1d": "batchnorm2d on flat features [N, F] (affine, with running statistics)",
    "GroupNorm": "groupnorm (affine or not)",
    "InstanceNorm2d": "groupnorm with a group per channel (affine or not, no running statistics)",
    "Upsample": "upsample (modes nearest and bilinear, align_corners; to a size or by integer scale_factor)",
    "UpsamplingNearest2d": "upsample", "UpsamplingBilinear2d": "upsample (bilinear, align_corners)",
    "ZeroPad2d": "the pad of the one Conv2d that reads it where each axis is then padded evenly (the conv's own "
                 "padding added); else pad",
    "ConstantPad2d": "pad (mode constant, any finite value); with the value 0 as ZeroPad2d",
    "ReflectionPad2d": "pad (mode reflect)", "ReplicationPad2d": "pad (mode replicate)",
    "CircularPad2d": "pad (mode circular)",
    "ReLU": "relu", "ReLU6": "relu6", "Hardtanh": "relu6 (min_val 0, max_val 6); else clamp", "SiLU": "silu", "GELU": "gelu", "Hardswish": "hardswish",
    "Hardsigmoid": "hardsigmoid", "Sigmoid": "sigmoid", "Tanh": "tanh",
    "LeakyReLU": "leaky_relu (negative_slope any finite number)", "ELU": "elu (alpha any finite number)",
    "SELU": "selu", "Softplus": "softplus (beta any finite number but 0, threshold any finite number)", "Mish": "mish",
    "MaxPool2d": "maxpool2d (no dilation)", "AvgPool2d": "avgpool2d (no divisor_override)",
    "AdaptiveAvgPool2d": "global_avgpool, adaptive_avgpool2d",
    "AdaptiveMaxPool2d": "maxpool2d where the bins are one square window (1x1 of a square map)",
    "Linear": "linear (on features, per token of a token sequence, or per pixel over channels after a permute)",
    "Dropout": "dropout (p 0: nothing)", "Dropout2d": "dropout2d (of a [C,H,W] map; p 0: nothing)",
    "LogSoftmax": "log_softmax (dim 1 of flat features)",
    "Flatten": "flatten (start_dim 1)",
    "LayerNorm": "layernorm2d (over channels after a permute), layernorm (over features, or each token's)",
    "MultiheadAttention": "self_attention (batch_first, query = key = value, one embed_dim, bias either way, "
                          "dropout 0, no masks, need_weights=False)",
    "LayerNorm2d": "layernorm2d (torchvision.models.convnext.LayerNorm2d)",
    "StochasticDepth": "stochastic_depth (torchvision.ops, mode row; p 0: nothing)",
    "DropPath": "stochastic_depth (timm.layers; scale_by_keep; p 0: nothing)",
    "Identity": "nothing",
    "ChannelShuffle": "channel_shuffle",
    "PixelShuffle": "pixel_shuffle", "PixelUnshuffle": "pixel_unshuffle",
    "PReLU": "prelu (num_parameters 1, or the channels of a map or the features of [N, F])",
    "Conv1d": "channel_conv1d: Conv1d(1, 1, k, padding=(k - 1) // 2), k odd, across the pooled channels "
              "x.mean((2, 3)).view(n, 1, -1) (ECA); nowhere else",
}
SUPPORTED_FUNCTIONS: Dict[str, str] = {
    "operator.add, operator.iadd, torch.add, Tensor.add": "add (two tensors of one shape)",
    "operator.sub, torch.sub, Tensor.sub of two tensors": "affine (scale -1) on the second, then add (two "
                                                          "tensors of one shape)",
    "operator.mul, operator.imul, torch.mul, Tensor.mul": "mul (a map times a map or a [C,1,1] map); "
                                                          "layer_scale (a submodule's [C,1,1] parameter times a "
                                                          "map, or [C] times a channels-last map or tokens); "
                                                          "scale_shift (a submodule's one-value parameter times "
                                                          "x)",
    "weight * x + bias of one submodule's parameters, torch.addcmul(bias, weight, x)":
        "scale_shift (one value each, timm's LearnableAffineBlock; or one per channel: [C,1,1] or [1,C,1,1] on "
        "a map, [C] or [1,1,C] on tokens, ResMLP's Affine)",
    "torch.cat": "concat (maps along channels, flat features along dim 1); class_token (a [1,1,C] parameter "
                 "expanded over the batch, in front of a token sequence)",
    "Tensor.expand": "of a parameter, as torch.cat's class token",
    "x.mean((2, 3)).view(n, 1, -1), a Conv1d and activations on it, then view(n, -1, 1, 1) and "
    "Tensor.expand_as / Tensor.expand of it as a factor of a multiply": "global_avgpool, channel_conv1d, the "
    "activations, mul broadcasting the [C,1,1] gate (ECA's channel attention; the views cost nothing)",
    "operator.add of a parameter": "pos_embedding (a [1,T,C] parameter added to a token sequence)",
    "Tensor.reshape(n, C, h*w) then Tensor.permute(0,2,1), Tensor.flatten(2) then Tensor.transpose(1,2)":
        "to_tokens (a map as a token sequence, VisionTransformer's patch embedding)",
    "x[:, 0]": "select_token (the first token of a sequence as features)",
    "Tensor.mean, torch.mean over dim 1 of a token sequence or of x[:, a:]": "token_mean (the mean of the tokens "
                                                                             "from a on, as timm's average pooling)",
    "torch.flatten, Tensor.flatten, Tensor.view, Tensor.reshape": "flatten (to [N, C*H*W])",
    "F.pixel_shuffle, F.pixel_unshuffle": "pixel_shuffle, pixel_unshuffle",
    "torch.permute, Tensor.permute": "(0,2,3,1) then back (0,3,1,2), around LayerNorm, Linear, GELU",
    "Tensor.transpose(1, 2), torch.transpose, Tensor.permute(0, 2, 1) of a token sequence":
        "transpose_tokens (C tokens of T features: MLP-Mixer's token mixing)",
    "F.relu, torch.relu, F.relu6, F.silu, F.gelu, F.hardswish, F.hardsigmoid, torch.sigmoid, torch.tanh, "
    "F.tanh, Tensor.tanh, F.leaky_relu (negative_slope positional or keyword), F.elu (alpha positional or "
    "keyword), F.selu, torch.selu, F.softplus (beta, threshold positional or keyword), F.mish":
        "the activation of that name",
    "F.pad (modes constant, reflect, replicate, circular; 2 or 4 pads of a [N, C, H, W] map)":
        "pad; zeros folded into the pad of the one Conv2d that reads them, as ZeroPad2d",
    "torch.clamp, Tensor.clamp, torch.clip, Tensor.clip, torch.clamp_min, Tensor.clamp_min, torch.clamp_max, "
    "Tensor.clamp_max, F.hardtanh, and their in-place spellings, with Python numbers as bounds":
        "relu (to [0, inf)), relu6 (to [0, 6]), else clamp (any finite bounds, one or two)",
    "x * c, c * x, x / c, x + c, c + x, x - c, c - x, -x of a tensor and a Python number c (operators, torch.mul, "
    "torch.div, torch.add, torch.sub, torch.neg, Tensor methods, in-place ones)":
        "affine (scale * x + shift; a chain on one tensor is one layer)",
    "torch.square, Tensor.square, x ** 2, torch.pow(x, 2), Tensor.pow(2)": "square (timm's StarReLU: relu, "
    "square, then scale_shift of its scale and bias)",
    "F.prelu, torch.prelu": "prelu (a module's 1-D parameter named weight, as nn.PReLU)",
    "F.conv2d, torch.conv2d": "conv2d named by the submodule that holds the weight and bias parameters it "
                              "takes (named weight and bias, as nn.Conv2d holds them)",
    "F.linear": "linear named by the submodule that holds the weight and bias parameters it takes (named "
                "weight and bias, as nn.Linear holds them)",
    "F.layer_norm": "layernorm named by the submodule that holds the weight and bias it takes (timm's LayerNorm)",
    "F.batch_norm": "batchnorm2d named by the batchnorm module whose running_mean, running_var, weight and bias it "
                    "takes, training=True (timm's BatchNormAct2d)",
    "F.adaptive_avg_pool2d, Tensor.mean over (2,3)": "global_avgpool, adaptive_avgpool2d",
    "Tensor.sum, torch.sum over (2,3) of a map or dim 1 of tokens": "global_avgpool or token_mean, then affine "
                                                                    "(times the count)",
    "Tensor.amax, torch.amax over (2,3) of a square map": "maxpool2d of the map's size",
    "Tensor.norm, torch.norm, torch.linalg.vector_norm (p 2 over H,W, keepdim)": "grn where it starts ConvNeXt V2's "
                                                                                 "Global Response Norm",
    "F.adaptive_max_pool2d": "maxpool2d where the bins are one square window",
    "F.interpolate": "upsample (modes nearest and bilinear; a size, or an integer or recomputed scale_factor)",
    "F.dropout": "dropout", "F.dropout2d": "dropout2d", "Tensor.contiguous": "nothing",
    "Tensor.float, Tensor.to, Tensor.type_as leaving a float32 tensor float32": "nothing",
    "F.group_norm, F.instance_norm": "groupnorm, affine with a submodule's own weight and bias (timm's "
                                     "GroupNorm1) or without both; no running statistics",
    "F.log_softmax, torch.log_softmax, Tensor.log_softmax": "log_softmax (dim 1 of flat features; the service's "
                                                            "cross-entropy on it is nn.NLLLoss)",
    "F.max_pool2d, torch.max_pool2d": "maxpool2d (no dilation, no return_indices)",
    "F.avg_pool2d": "avgpool2d (no divisor_override)",
    "F.channel_shuffle, torch.channel_shuffle, and x.view(n, g, C/g, h, w) then transpose(1, 2), "
    "optionally contiguous(), then view(n, C, h, w) or flatten(1, 2)": "channel_shuffle (ShuffleNet)",
    "Tensor.chunk, torch.chunk, Tensor.split, torch.split along dim 1, each piece taken by index; "
    "x[:, a:b]": "channel_slice (a channel range of a map)",
    "a qkv Linear viewed as [N, T, 3, heads, head_dim], permute(2, 0, 3, 1, 4), unbind(0) or [0], [1], [2], "
    "F.scaled_dot_product_attention or (q * scale) @ k.transpose(-2, -1), softmax(-1), @ v, then transpose(1, 2), "
    "reshape(N, T, C) and a proj Linear": "self_attention (timm's Attention; the Linears' parameter names kept)",
    "query, key and value Linear(C, C) of the same tokens, each viewed as [N, T, heads, head_dim] and transposed "
    "(1, 2), attended as above, permute(0, 2, 1, 3), view(N, T, C) and an output Linear": "self_attention with "
    "separate_qkv (Hugging Face's ViTSelfAttention; the Linears' parameter names kept)",
}


# Reductions over dimensions that map onto pooling: Tensor methods and the
# torch functions of the same names.
_REDUCTIONS: Dict[str, Any] = {"mean": torch.mean, "sum": torch.sum, "amax": torch.amax}

# The activation modules, by class (subclasses are not these), and the kind
# each becomes.
MODULE_ACTIVATIONS: Dict[type, str] = {
    nn.ReLU: "relu", nn.ReLU6: "relu6", nn.SiLU: "silu", nn.Hardswish: "hardswish", nn.Hardsigmoid: "hardsigmoid",
    nn.Sigmoid: "sigmoid", nn.GELU: "gelu", nn.Tanh: "tanh", nn.LeakyReLU: "leaky_relu", nn.ELU: "elu",
    nn.SELU: "selu", nn.Softplus: "softplus", nn.Mish: "mish"}
# The activation functions (call_function targets) and Tensor methods
# (call_method names); F.tanh traces as the method it calls, input.tanh().
FUNCTION_ACTIVATIONS: Dict[Any, str] = {
    F.relu: "relu", torch.relu: "relu", F.relu6: "relu6", F.silu: "silu", F.gelu: "gelu", F.hardswish: "hardswish",
    F.hardsigmoid: "hardsigmoid", torch.sigmoid: "sigmoid", F.sigmoid: "sigmoid", torch.tanh: "tanh", F.tanh: "tanh",
    F.leaky_relu: "leaky_relu", F.leaky_relu_: "leaky_relu", F.elu: "elu", F.elu_: "elu", F.selu: "selu",
    torch.selu: "selu", torch.selu_: "selu", F.softplus: "softplus", F.mish: "mish", torch.square: "square"}
METHOD_ACTIVATIONS: Dict[str, str] = {
    "relu": "relu", "relu_": "relu", "sigmoid": "sigmoid", "sigmoid_": "sigmoid", "tanh": "tanh", "tanh_": "tanh",
    "square": "square"}


def _finite(v: Any, name: str, op: str, path: str) -> float:
    """An activation's parameter (LeakyReLU's negative_slope, ELU's alpha,
    Softplus's beta and threshold) as the service takes it: a finite number
    (PyTorch runs an infinite or NaN one too; one past fp32's range the
    service refuses itself)."""
    if isinstance(v, torch.fx.Node) or not isinstance(v, (int, float)) or isinstance(v, bool):
        raise ExportError(f"{name} {v!r} is not a number known at export", op=op, module_path=path)
    if not math.isfinite(float(v)):
        raise ExportError(f"{name} {v!r} is not a finite number", op=op, module_path=path)
    return float(v)


def _act_fields(kind: str, get: Callable[[str, int, Any], Any], op: str, path: str) -> Dict[str, Any]:
    """The fields of an activation layer of `kind`, read by get(name,
    position, PyTorch's default): a module's attribute, or a call's argument
    by position or keyword (position -1: keyword only)."""
    if kind == "gelu":
        return {"approximate": "tanh"} if get("approximate", -1, "none") == "tanh" else {}
    if kind == "leaky_relu":
        return {"negative_slope": _finite(get("negative_slope", 1, 0.01), "negative_slope", op, path)}
    if kind == "elu":
        return {"alpha": _finite(get("alpha", 1, 1.0), "alpha", op, path)}
    if kind == "softplus":
        beta = _finite(get("beta", 1, 1.0), "beta", op, path)
        if beta == 0:
            raise ExportError("beta 0 divides by zero (PyTorch runs it into infinities); the service takes any "
                              "other finite beta", op=op, module_path=path)
        return {"beta": beta, "threshold": _finite(get("threshold", 2, 20.0), "threshold", op, path)}
    return {}


def _supported_functions() -> str:
    return "; ".join(SUPPORTED_FUNCTIONS)
