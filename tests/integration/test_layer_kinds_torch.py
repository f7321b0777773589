"""The layer kinds beyond the convolution chain against PyTorch, on the
reference backend (or the backend STREAMFEED_PARITY_BACKEND names) in fp32:
small modules that use each of them -- grouped, depthwise and dilated
convolutions, the activations (a GAN's leaky ReLU and tanh among them,
ELU, SELU, softplus and Mish), arithmetic with numbers (affine), learnable
weights and biases (scale_shift: timm's LearnableAffineBlock, ResMLP's
Affine by torch.addcmul; ResMLP's block, whose two layer scales are its
own parameters), PReLU,
clamps at any bounds (Hardtanh, torch.clamp),
squeeze-and-excitation's broadcast multiply,
ConvNeXt's LayerNorm2d, per-pixel Linear, layer scale and stochastic depth,
DenseNet's concatenations, average pooling with ceil_mode and
count_include_pad, maxpool2d with ceil_mode, batchnorm with its own eps and
momentum, dropout, ShuffleNetV2's channel shuffle and chunks, Inception's
1xk and kx1 convolutions, BatchNorm1d, GroupNorm, and without parameters
GroupNorm(affine=False) and InstanceNorm2d, a decoder's nearest and bilinear
resizes, super-resolution's pixel shuffle and its inverse, a CycleGAN-like
generator's reflect, replicate, asymmetric zero, constant and circular
padding, convolutions that pad themselves in those modes or "same" with an
even kernel, F.conv2d and F.linear of a module's own weight and bias, global
pooling written as x.sum((2, 3)) and torch.amax, ConvNeXt's original block
with its layer scale a [C] gamma on the channels-last map, pools whose
kernel is larger than a 2x2 map with ceil_mode -- start from the module's own state_dict
(model.init_from, which checks every tensor's name and shape), train five SGD
steps on the same batches with the loss, the gradient norm, the parameters,
the buffers and the momentum compared after each, then an eval batch: its
loss and top-1, its logits, and the service's checkpoint loaded back into a
fresh module with load_state_dict(strict=True), which must compute them too.
Dropout and stochastic depth run with p = 0: the service draws its own masks
(gpu/rng.h), not PyTorch's."""
import json
import re
import subprocess
import sys

import pytest

from sfharness import BIN, REPO
from sfharness import st_body
from safetensors.numpy import load as st_load
from test_torch_parity import BACKEND, SGD, Tol, _torch_deterministic, as_input, assert_eval_like_pytorch, batches, rel, sgd, start_pair  # noqa: F401

torch = pytest.importorskip("torch")
nn = torch.nn

from streamfeed.export_folds import torch_clamp_rule  # noqa: E402  (needs torch)

# Layer norm and batchnorm subtract means, as in the batchnorm parity case.
NORMS = Tol(norm=1e-5, param=2e-5, opt_tensor=2e-4, opt_all=1e-4)


def _container(**members):
    m = nn.Module()
    for k, v in members.items():
        setattr(m, k, v)
    return m


SE_SPEC = {"input": [3, 8, 8], "classes": 10, "layers": [
    {"type": "conv2d", "name": "c0", "out": 4, "k": 1},
    {"type": "conv2d", "name": "dw", "out": 4, "k": 3, "pad": 1, "stride": 2, "groups": 4},
    {"type": "hardswish", "name": "a"},
    {"type": "adaptive_avgpool2d", "name": "se.avgpool", "out": [1, 1]},
    {"type": "conv2d", "name": "se.fc1", "out": 2, "k": 1}, {"type": "relu6", "name": "se.act"},
    {"type": "conv2d", "name": "se.fc2", "out": 4, "k": 1}, {"type": "hardsigmoid", "name": "se.gate"},
    {"type": "mul", "name": "se.mul", "inputs": ["a", "se.gate"]},
    {"type": "conv2d", "name": "g", "out": 4, "k": 3, "pad": 2, "groups": 2, "dilation": 2},
    {"type": "silu", "name": "act"}, {"type": "sigmoid", "name": "sig"},
    {"type": "global_avgpool", "name": "gap"}, {"type": "flatten", "name": "flat"},
    {"type": "linear", "name": "fc", "out": 10}]}


class SqueezeExcite(nn.Module):
    def __init__(self):
        super().__init__()
        self.c0 = nn.Conv2d(3, 4, 1)
        self.dw = nn.Conv2d(4, 4, 3, stride=2, padding=1, groups=4)
        self.se = _container(fc1=nn.Conv2d(4, 2, 1), fc2=nn.Conv2d(2, 4, 1))
        self.g = nn.Conv2d(4, 4, 3, padding=2, dilation=2, groups=2)
        self.fc = nn.Linear(4, 10)

    def forward(self, x):
        a = nn.functional.hardswish(self.dw(self.c0(x)))
        s = nn.functional.adaptive_avg_pool2d(a, 1)
        gate = nn.functional.hardsigmoid(self.se.fc2(nn.functional.relu6(self.se.fc1(s))))
        y = torch.sigmoid(nn.functional.silu(self.g(a * gate)))
        return self.fc(torch.flatten(y.mean((2, 3)), 1))


CONVNEXT_SPEC = {"input": [3, 8, 8], "classes": 10, "layers": [
    {"type": "conv2d", "name": "stem.0", "out": 4, "k": 2, "stride": 2},
    {"type": "layernorm2d", "name": "stem.1", "eps": 1e-6},
    {"type": "conv2d", "name": "block.0", "out": 4, "k": 3, "pad": 1, "groups": 4},
    {"type": "layernorm2d", "name": "block.2", "eps": 1e-6},
    {"type": "linear", "name": "block.3", "out": 8, "over": "channels"},
    {"type": "gelu", "name": "block.4"},
    {"type": "linear", "name": "block.5", "out": 4, "over": "channels"},
    {"type": "layer_scale", "name": "ls"},
    {"type": "stochastic_depth", "name": "sd", "p": 0.0, "mode": "row"},
    {"type": "add", "name": "res", "inputs": ["stem.1", "sd"]},
    {"type": "adaptive_avgpool2d", "name": "pool", "out": [2, 2]},
    {"type": "flatten", "name": "flat"}, {"type": "layernorm", "name": "head.norm"},
    {"type": "gelu", "name": "head.act", "approximate": "tanh"},
    {"type": "linear", "name": "fc", "out": 10}]}


class LayerNorm2d(nn.LayerNorm):
    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class Permute(nn.Module):
    def __init__(self, dims):
        super().__init__()
        self.dims = dims

    def forward(self, x):
        return x.permute(*self.dims)


class ConvNeXtish(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 4, 2, stride=2), LayerNorm2d(4, eps=1e-6))
        self.block = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1, groups=4), Permute((0, 2, 3, 1)),
                                   nn.LayerNorm(4, eps=1e-6), nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4),
                                   Permute((0, 3, 1, 2)))
        self.ls = _container(layer_scale=nn.Parameter(torch.rand(4, 1, 1) + 0.5))
        self.head = _container(norm=nn.LayerNorm(16))
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        s = self.stem(x)
        y = s + self.block(s) * self.ls.layer_scale
        y = torch.flatten(nn.functional.adaptive_avg_pool2d(y, (2, 2)), 1)
        return self.fc(nn.functional.gelu(self.head.norm(y), approximate="tanh"))


DENSE_SPEC = {"input": [3, 8, 8], "classes": 10, "layers": [
    {"type": "conv2d", "name": "c0", "out": 4, "k": 1},
    {"type": "conv2d", "name": "c1", "out": 2, "k": 3, "pad": 1},
    {"type": "concat", "name": "cat1", "inputs": ["c0", "c1"]},
    {"type": "batchnorm2d", "name": "bn", "eps": 0.001, "momentum": 0.2}, {"type": "relu", "name": "r"},
    {"type": "conv2d", "name": "c2", "out": 2, "k": 1},
    {"type": "concat", "name": "cat2", "inputs": ["c0", "c1", "c2"]},
    {"type": "avgpool2d", "name": "p1", "k": 2},
    {"type": "avgpool2d", "name": "p2", "k": 3, "stride": 2, "pad": 1, "ceil_mode": True,
     "count_include_pad": False},
    {"type": "maxpool2d", "name": "p3", "k": 2, "stride": 2, "ceil_mode": True},
    {"type": "dropout2d", "name": "drop2d", "p": 0.0},
    {"type": "flatten", "name": "flat"}, {"type": "dropout", "name": "drop", "p": 0.0},
    {"type": "linear", "name": "fc", "out": 10}]}


class Dense(nn.Module):
    def __init__(self):
        super().__init__()
        self.c0 = nn.Conv2d(3, 4, 1)
        self.c1 = nn.Conv2d(4, 2, 3, padding=1)
        self.bn = nn.BatchNorm2d(6, eps=1e-3, momentum=0.2)
        self.c2 = nn.Conv2d(6, 2, 1)
        self.p2 = nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False)
        self.p3 = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        a = self.c0(x)
        b = self.c1(a)
        c = self.c2(torch.relu(self.bn(torch.cat([a, b], 1))))
        y = self.p3(self.p2(nn.functional.avg_pool2d(torch.cat([a, b, c], 1), 2)))
        y = nn.functional.dropout2d(y, 0.0, self.training)
        return self.fc(nn.functional.dropout(torch.flatten(y, 1), 0.0, self.training))


# Pools whose kernel is larger than their 2x2 input (timm's VoVNet at a small
# input): with ceil_mode PyTorch gives one window over the whole map, and the
# average's divisor is the window clipped to the input (count_include_pad or
# not, no padding here).
TINY_POOL_SPEC = {"input": [3, 8, 8], "classes": 10, "layers": [
    {"type": "conv2d", "name": "stem", "out": 4, "k": 4, "stride": 4},
    {"type": "maxpool2d", "name": "mp", "k": 3, "stride": 2, "ceil_mode": True},
    {"type": "avgpool2d", "name": "ap", "k": 3, "stride": 2, "ceil_mode": True, "inputs": ["stem"]},
    {"type": "concat", "name": "cat", "inputs": ["mp", "ap"]},
    {"type": "flatten", "name": "flatten"}, {"type": "linear", "name": "fc", "out": 10}]}


class TinyPools(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 4, stride=4)
        self.mp = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.ap = nn.AvgPool2d(3, 2, ceil_mode=True)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        s = self.stem(x)
        return self.fc(torch.flatten(torch.cat([self.mp(s), self.ap(s)], 1), 1))


# A GAN's activations: LeakyReLU(0.2) after a strided conv (a DCGAN
# discriminator), a transposed conv, batchnorm, leaky_relu at a negative
# slope (both branches carry gradient, with opposite signs), tanh (a
# generator's output), a nearest-neighbour upsampling (a generator's, before
# its convolution).
GAN_SPEC = {"input": [3, 8, 8], "classes": 10, "layers": [
    {"type": "conv2d", "name": "c0", "out": 4, "k": 3, "stride": 2, "pad": 1},
    {"type": "leaky_relu", "name": "lr0", "negative_slope": 0.2},
    {"type": "conv_transpose2d", "name": "up", "out": 4, "k": 2, "stride": 2, "bias": False},
    {"type": "batchnorm2d", "name": "bn"},
    {"type": "leaky_relu", "name": "lr1", "negative_slope": -0.5},
    {"type": "tanh", "name": "t"}, {"type": "upsample", "name": "up2", "scale": 2},
    {"type": "global_avgpool", "name": "gap"}, {"type": "flatten", "name": "flat"},
    {"type": "linear", "name": "fc", "out": 10}]}


class GanActs(nn.Module):
    def __init__(self):
        super().__init__()
        self.c0 = nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.lr0 = nn.LeakyReLU(0.2)
        # no bias before the batchnorm (DCGAN's too): its gradient is zero
        # up to rounding, which no relative bound compares
        self.up = nn.ConvTranspose2d(4, 4, 2, stride=2, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.t = nn.Tanh()
        self.fc = nn.Linear(4, 10)

    def forward(self, x):
        y = self.t(nn.functional.leaky_relu(self.bn(self.up(self.lr0(self.c0(x)))), -0.5))
        y = nn.functional.interpolate(y, scale_factor=2, mode="nearest")
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


# The smooth activations: ELU at a non-default alpha, batchnorm then SELU
# (a self-normalising net's pair, left unfused on the GPU), softplus at
# beta 2 with a threshold inputs cross (both branches carry gradient), ELU
# at a negative alpha (its negative branch rises), Mish.
SMOOTH_SPEC = {"input": [3, 8, 8], "classes": 10, "layers": [
    {"type": "conv2d", "name": "c0", "out": 6, "k": 3, "pad": 1},
    {"type": "elu", "name": "e0", "alpha": 0.5},
    {"type": "conv2d", "name": "c1", "out": 6, "k": 3, "stride": 2, "pad": 1, "bias": False},
    {"type": "batchnorm2d", "name": "bn"}, {"type": "selu", "name": "s"},
    {"type": "conv2d", "name": "c2", "out": 6, "k": 1},
    {"type": "softplus", "name": "sp", "beta": 2, "threshold": 1.5},
    {"type": "conv2d", "name": "c3", "out": 6, "k": 1},
    {"type": "elu", "name": "e1", "alpha": -0.7}, {"type": "mish", "name": "m"},
    {"type": "global_avgpool", "name": "gap"}, {"type": "flatten", "name": "flat"},
    {"type": "linear", "name": "fc", "out": 10}]}


class SmoothActs(nn.Module):
    def __init__(self):
        super().__init__()
        self.c0 = nn.Conv2d(3, 6, 3, padding=1)
        self.c1 = nn.Conv2d(6, 6, 3, stride=2, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(6)
        self.c2 = nn.Conv2d(6, 6, 1)
        self.c3 = nn.Conv2d(6, 6, 1)
        self.fc = nn.Linear(6, 10)

    def forward(self, x):
        F = nn.functional
        y = nn.SELU()(self.bn(self.c1(nn.ELU(0.5)(self.c0(x)))))
        y = F.softplus(self.c2(y), beta=2, threshold=1.5)
        y = nn.Mish()(F.elu(self.c3(y), -0.7))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


SHUFFLE_SPEC = {"input": [3, 8, 8], "classes": 10, "layers": [
    {"type": "conv2d", "name": "c0", "out": 6, "k": 1},
    {"type": "channel_slice", "name": "x1", "start": 0, "count": 3, "inputs": ["c0"]},
    {"type": "channel_slice", "name": "x2", "start": 3, "count": 3, "inputs": ["c0"]},
    {"type": "conv2d", "name": "branch2", "out": 3, "k": 3, "pad": 1},
    {"type": "concat", "name": "cat", "inputs": ["x1", "branch2"]},
    {"type": "channel_shuffle", "name": "shuffle", "groups": 2},
    {"type": "channel_slice", "name": "part", "start": 1, "count": 5},
    {"type": "channel_shuffle", "name": "shuffle5", "groups": 5}, {"type": "relu", "name": "r"},
    {"type": "flatten", "name": "flat"}, {"type": "linear", "name": "fc", "out": 10}]}


class Shuffle(nn.Module):
    """ShuffleNetV2's stride-1 block (both chunks of c0 read: their
    gradients add in c0's), its shuffle, then a slice that is the shuffle's
    only reader and a shuffle in 5 groups of one channel."""

    def __init__(self):
        super().__init__()
        self.c0 = nn.Conv2d(3, 6, 1)
        self.branch2 = nn.Conv2d(3, 3, 3, padding=1)
        self.shuffle5 = nn.ChannelShuffle(5)
        self.fc = nn.Linear(5 * 8 * 8, 10)

    def forward(self, x):
        x1, x2 = self.c0(x).chunk(2, dim=1)
        y = torch.cat((x1, self.branch2(x2)), dim=1)
        n, c, h, w = y.size()
        y = torch.transpose(y.view(n, 2, c // 2, h, w), 1, 2).contiguous().view(n, c, h, w)
        return self.fc(torch.flatten(torch.relu(self.shuffle5(y[:, 1:6])), 1))


# Inception's factorised convolutions: a 1x3 then a 3x1 (each padded along
# its own axis), a 3x5 strided along the height only, and a 1x3 dilated along
# the width, grouped, without bias, before a batchnorm; a GroupNorm; then an
# MLP head with BatchNorm1d over its hidden features.
FACTORISED_SPEC = {"input": [3, 8, 8], "classes": 10, "layers": [
    {"type": "conv2d", "name": "a", "out": 4, "k": [1, 3], "pad": [0, 1]},
    {"type": "conv2d", "name": "b", "out": 4, "k": [3, 1], "pad": [1, 0]}, {"type": "relu", "name": "r0"},
    {"type": "conv2d", "name": "c", "out": 6, "k": [3, 5], "stride": [2, 1], "pad": [1, 2]},
    {"type": "groupnorm", "name": "gn", "num_groups": 3, "eps": 1e-4},
    {"type": "conv2d", "name": "d", "out": 6, "k": [1, 3], "pad": [0, 2], "dilation": [1, 2], "groups": 2,
     "bias": False},
    {"type": "batchnorm2d", "name": "bn", "eps": 0.001}, {"type": "relu", "name": "r1"},
    {"type": "flatten", "name": "flat"}, {"type": "linear", "name": "hidden", "out": 16, "bias": False},
    {"type": "batchnorm2d", "name": "bn1d", "momentum": 0.3}, {"type": "relu", "name": "r2"},
    {"type": "linear", "name": "fc", "out": 10}]}


class Factorised(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 4, (1, 3), padding=(0, 1))
        self.b = nn.Conv2d(4, 4, (3, 1), padding=(1, 0))
        self.c = nn.Conv2d(4, 6, (3, 5), stride=(2, 1), padding=(1, 2))
        self.gn = nn.GroupNorm(3, 6, eps=1e-4)
        self.d = nn.Conv2d(6, 6, (1, 3), padding=(0, 2), dilation=(1, 2), groups=2, bias=False)
        self.bn = nn.BatchNorm2d(6, eps=0.001)
        self.hidden = nn.Linear(6 * 4 * 8, 16, bias=False)  # a bias before a batchnorm has no gradient
        self.bn1d = nn.BatchNorm1d(16, momentum=0.3)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        y = torch.relu(self.bn(self.d(self.gn(self.c(torch.relu(self.b(self.a(x))))))))
        return self.fc(torch.relu(self.bn1d(self.hidden(torch.flatten(y, 1)))))


# A style-transfer network's normalisations: InstanceNorm2d's default (a
# group per channel, no parameters: its state_dict holds none) after a
# convolution, and GroupNorm(affine=False) whose input a residual add also
# reads (the two gradients add in the convolution's).
PARAMLESS_NORMS_SPEC = {"input": [3, 8, 8], "classes": 10, "layers": [
    {"type": "conv2d", "name": "c0", "out": 6, "k": 3, "pad": 1, "bias": False},
    {"type": "groupnorm", "name": "in0", "num_groups": 6, "affine": False}, {"type": "relu", "name": "r0"},
    {"type": "conv2d", "name": "c1", "out": 8, "k": 3, "stride": 2, "pad": 1},
    {"type": "groupnorm", "name": "gn", "num_groups": 4, "eps": 1e-4, "affine": False},
    {"type": "add", "name": "res", "inputs": ["c1", "gn"]}, {"type": "relu", "name": "r1"},
    {"type": "flatten", "name": "flat"}, {"type": "linear", "name": "fc", "out": 10}]}


class ParamlessNorms(nn.Module):
    def __init__(self):
        super().__init__()
        self.c0 = nn.Conv2d(3, 6, 3, padding=1, bias=False)  # an instance norm takes out a bias (zero gradient)
        self.in0 = nn.InstanceNorm2d(6)
        self.c1 = nn.Conv2d(6, 8, 3, stride=2, padding=1)
        self.gn = nn.GroupNorm(4, 8, eps=1e-4, affine=False)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        y = self.c1(torch.relu(self.in0(self.c0(x))))
        return self.fc(torch.flatten(torch.relu(y + self.gn(y)), 1))


# A decoder's resizes: bilinear to a size (align_corners false, F.interpolate's
# default), bilinear by 2 with align_corners (nn.UpsamplingBilinear2d), bilinear
# down to a smaller size (inputs some outputs skip), nearest to a size that is
# no multiple of its input; flattened, so every output pixel has its own weight.
RESIZE_SPEC = {"input": [3, 8, 8], "classes": 10, "layers": [
    {"type": "conv2d", "name": "c0", "out": 4, "k": 3, "stride": 2, "pad": 1},
    {"type": "upsample", "name": "to_size", "size": [7, 9], "mode": "bilinear"},
    {"type": "conv2d", "name": "c1", "out": 4, "k": 1},
    {"type": "upsample", "name": "up", "scale": 2, "mode": "bilinear", "align_corners": True},
    {"type": "upsample", "name": "down", "size": [5, 6], "mode": "bilinear"},
    {"type": "upsample", "name": "near", "size": [6, 9]},
    {"type": "flatten", "name": "flat"}, {"type": "linear", "name": "fc", "out": 10}]}


class Resize(nn.Module):
    def __init__(self):
        super().__init__()
        self.c0 = nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.c1 = nn.Conv2d(4, 4, 1)
        self.up = nn.UpsamplingBilinear2d(scale_factor=2)
        self.fc = nn.Linear(4 * 6 * 9, 10)

    def forward(self, x):
        y = nn.functional.interpolate(self.c0(x), size=(7, 9), mode="bilinear", align_corners=False)
        y = nn.functional.interpolate(self.up(self.c1(y)), size=(5, 6), mode="bilinear")
        return self.fc(torch.flatten(nn.functional.interpolate(y, size=(6, 9), mode="nearest"), 1))


# A feature pyramid's skip: a residual block's input that a later head also
# reads (U-Net, FPN and LRASPP take their low-level features so). The add is
# then not the first of that input's readers in the backward, and its
# gradient must be added to what the head wrote (the CUDA backend once
# dropped it); the block's batchnorm writes the add's output.
PYRAMID_SPEC = {"input": [3, 8, 8], "classes": 10, "layers": [
    {"type": "conv2d", "name": "stem", "out": 6, "k": 3, "pad": 1, "bias": False},
    {"type": "batchnorm2d", "name": "bn0"}, {"type": "relu", "name": "r0"},
    {"type": "conv2d", "name": "c1", "out": 6, "k": 1, "bias": False},
    {"type": "batchnorm2d", "name": "bn1"},
    {"type": "add", "name": "res", "inputs": ["r0", "bn1"]},
    {"type": "conv2d", "name": "c2", "out": 6, "k": 3, "stride": 2, "pad": 1},
    {"type": "conv2d", "name": "head_high", "out": 4, "k": 1},
    {"type": "upsample", "name": "up", "scale": 2, "mode": "bilinear"},
    {"type": "conv2d", "name": "head_low", "out": 4, "k": 1, "inputs": ["r0"]},
    {"type": "add", "name": "out", "inputs": ["head_low", "up"]},
    {"type": "flatten", "name": "flat"}, {"type": "linear", "name": "fc", "out": 10}]}


class Pyramid(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem, self.bn0 = nn.Conv2d(3, 6, 3, padding=1, bias=False), nn.BatchNorm2d(6)
        self.c1, self.bn1 = nn.Conv2d(6, 6, 1, bias=False), nn.BatchNorm2d(6)
        self.c2 = nn.Conv2d(6, 6, 3, stride=2, padding=1)
        self.head_high, self.head_low = nn.Conv2d(6, 4, 1), nn.Conv2d(6, 4, 1)
        self.fc = nn.Linear(4 * 8 * 8, 10)

    def forward(self, x):
        low = torch.relu(self.bn0(self.stem(x)))
        y = low + self.bn1(self.c1(low))
        up = nn.functional.interpolate(self.head_high(self.c2(y)), scale_factor=2, mode="bilinear")
        return self.fc(torch.flatten(self.head_low(low) + up, 1))


# A super-resolution network's sub-pixel convolution (ESPCN): a convolution
# to r * r times the channels, PixelShuffle(2) to twice the size, then
# PixelUnshuffle(2) back (space to depth, as some encoders downsample).
PIXEL_SHUFFLE_SPEC = {"input": [3, 8, 8], "classes": 10, "layers": [
    {"type": "conv2d", "name": "c0", "out": 8, "k": 3, "pad": 1}, {"type": "relu", "name": "r0"},
    {"type": "pixel_shuffle", "name": "up", "factor": 2},
    {"type": "conv2d", "name": "c1", "out": 3, "k": 3, "pad": 1},
    {"type": "pixel_unshuffle", "name": "down", "factor": 2},
    {"type": "conv2d", "name": "c2", "out": 4, "k": 1}, {"type": "tanh", "name": "t"},
    {"type": "flatten", "name": "flat"}, {"type": "linear", "name": "fc", "out": 10}]}


class SubPixel(nn.Module):
    def __init__(self):
        super().__init__()
        self.c0, self.up = nn.Conv2d(3, 8, 3, padding=1), nn.PixelShuffle(2)
        self.c1, self.down = nn.Conv2d(2, 3, 3, padding=1), nn.PixelUnshuffle(2)
        self.c2, self.fc = nn.Conv2d(12, 4, 1), nn.Linear(4 * 8 * 8, 10)

    def forward(self, x):
        y = self.down(self.c1(self.up(torch.relu(self.c0(x)))))
        return self.fc(torch.flatten(torch.tanh(self.c2(y)), 1))


# Arithmetic with numbers (the exporter's affine layer): an input
# normalisation (x - 0.5) / 0.5, 0.25 - 1.5 * x after a convolution (a
# negative scale, before tanh), and x * 0.5 + 1 on flat features before the
# classifier.
AFFINE_SPEC = {"input": [3, 8, 8], "classes": 10, "layers": [
    {"type": "affine", "name": "norm", "scale": 2.0, "shift": -1.0},
    {"type": "conv2d", "name": "c0", "out": 4, "k": 3, "pad": 1},
    {"type": "affine", "name": "a0", "scale": -1.5, "shift": 0.25}, {"type": "tanh", "name": "t"},
    {"type": "conv2d", "name": "c1", "out": 4, "k": 3, "stride": 2, "pad": 1},
    {"type": "flatten", "name": "flat"}, {"type": "affine", "name": "a1", "scale": 0.5, "shift": 1.0},
    {"type": "linear", "name": "fc", "out": 10}]}


class Affine(nn.Module):
    def __init__(self):
        super().__init__()
        self.c0 = nn.Conv2d(3, 4, 3, padding=1)
        self.c1 = nn.Conv2d(4, 4, 3, stride=2, padding=1)
        self.fc = nn.Linear(4 * 4 * 4, 10)

    def forward(self, x):
        y = torch.tanh(0.25 - 1.5 * self.c0((x - 0.5) / 0.5))
        return self.fc(torch.flatten(self.c1(y), 1) * 0.5 + 1)


# Learnable affines (scale_shift): timm's LearnableAffineBlock (one weight and
# one bias) after a convolution, a per-channel weight and bias of a map held
# as [1,C,1,1], a one-value gain without a bias, ResMLP's Affine ([1,1,C], by
# torch.addcmul) on tokens, and [F] on the head's features. Weights and
# biases start away from 1 and 0 so each one's gradient matters.
SCALE_SHIFT_SPEC = {"input": [3, 8, 8], "classes": 10, "layers": [
    {"type": "conv2d", "name": "c0", "out": 4, "k": 3, "pad": 1},
    {"type": "scale_shift", "name": "lab", "num_parameters": 1, "param_shape": "[C]",
     "param_names": {"weight": "scale"}},
    {"type": "tanh", "name": "tanh"},
    {"type": "scale_shift", "name": "chan", "num_parameters": 4, "param_shape": "[1,C,1,1]"},
    {"type": "scale_shift", "name": "gain", "num_parameters": 1, "param_shape": "[C]", "bias": False,
     "param_names": {"weight": "g"}},
    {"type": "conv2d", "name": "c1", "out": 6, "k": 3, "stride": 2, "pad": 1},
    {"type": "to_tokens", "name": "to_tokens"},
    {"type": "scale_shift", "name": "aff", "num_parameters": 6, "param_shape": "[1,1,C]",
     "param_names": {"weight": "alpha", "bias": "beta"}},
    {"type": "token_mean", "name": "mean"},
    {"type": "scale_shift", "name": "feat", "num_parameters": 6, "param_shape": "[C]"},
    {"type": "linear", "name": "fc", "out": 10}]}


class LearnableAffine(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor([1.5]))
        self.bias = nn.Parameter(torch.tensor([-0.2]))

    def forward(self, x):
        return self.scale * x + self.bias


class TokenAffine(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.alpha = nn.Parameter(1 + 0.1 * torch.randn(1, 1, dim))
        self.beta = nn.Parameter(0.1 * torch.randn(1, 1, dim))

    def forward(self, x):
        return torch.addcmul(self.beta, self.alpha, x)


class ScaleShifts(nn.Module):
    def __init__(self):
        super().__init__()
        self.c0 = nn.Conv2d(3, 4, 3, padding=1)
        self.lab = LearnableAffine()
        self.chan = nn.Module()
        self.chan.weight = nn.Parameter(1 + 0.2 * torch.randn(1, 4, 1, 1))
        self.chan.bias = nn.Parameter(0.2 * torch.randn(1, 4, 1, 1))
        self.gain = nn.Module()
        self.gain.g = nn.Parameter(torch.tensor([0.7]))
        self.c1 = nn.Conv2d(4, 6, 3, stride=2, padding=1)
        self.aff = TokenAffine(6)
        self.feat = nn.Module()
        self.feat.weight = nn.Parameter(1 + 0.2 * torch.randn(6))
        self.feat.bias = nn.Parameter(0.2 * torch.randn(6))
        self.fc = nn.Linear(6, 10)

    def forward(self, x):
        y = torch.tanh(self.lab(self.c0(x)))
        y = self.c1(self.gain.g * (y * self.chan.weight + self.chan.bias))
        t = self.aff(y.flatten(2).transpose(1, 2))
        return self.fc(t.mean(1) * self.feat.weight + self.feat.bias)


# ResMLP's block: its two layer scales ls1 and ls2 are parameters of the
# block itself, so each layer is named by its parameter's whole key
# (param_names ""), beside the Affine norms (torch.addcmul) and the token
# mixing across the transposed sequence.
RESMLP_SPEC = {"input": [3, 8, 8], "classes": 10, "layers": [
    {"type": "conv2d", "name": "stem", "out": 6, "k": 2, "stride": 2},
    {"type": "to_tokens", "name": "to_tokens"},
    {"type": "scale_shift", "name": "blocks.0.norm1", "num_parameters": 6, "param_shape": "[1,1,C]",
     "param_names": {"weight": "alpha", "bias": "beta"}},
    {"type": "transpose_tokens", "name": "blocks.0.transpose"},
    {"type": "linear", "name": "blocks.0.linear_tokens", "out": 16},
    {"type": "transpose_tokens", "name": "blocks.0.transpose_1"},
    {"type": "layer_scale", "name": "blocks.0.ls1", "param_names": {"layer_scale": ""}},
    {"type": "add", "name": "blocks.0.add", "inputs": ["to_tokens", "blocks.0.ls1"]},
    {"type": "scale_shift", "name": "blocks.0.norm2", "num_parameters": 6, "param_shape": "[1,1,C]",
     "param_names": {"weight": "alpha", "bias": "beta"}},
    {"type": "linear", "name": "blocks.0.mlp", "out": 6},
    {"type": "layer_scale", "name": "blocks.0.ls2", "param_names": {"layer_scale": ""}},
    {"type": "add", "name": "blocks.0.add_1", "inputs": ["blocks.0.add", "blocks.0.ls2"]},
    {"type": "token_mean", "name": "mean"},
    {"type": "linear", "name": "fc", "out": 10}]}


class ResMlpBlock(nn.Module):
    def __init__(self, dim, tokens):
        super().__init__()
        self.norm1 = TokenAffine(dim)
        self.linear_tokens = nn.Linear(tokens, tokens)
        self.norm2 = TokenAffine(dim)
        self.mlp = nn.Linear(dim, dim)
        self.ls1 = nn.Parameter(0.5 + 0.1 * torch.randn(dim))
        self.ls2 = nn.Parameter(0.5 + 0.1 * torch.randn(dim))

    def forward(self, x):
        x = x + self.ls1 * self.linear_tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.ls2 * self.mlp(self.norm2(x))


class ResMlpish(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 6, 2, stride=2)
        self.blocks = nn.Sequential(ResMlpBlock(6, 16))
        self.fc = nn.Linear(6, 10)

    def forward(self, x):
        t = self.blocks(self.stem(x).flatten(2).transpose(1, 2))
        return self.fc(t.mean(1))


# PReLU: one slope shared by every channel after a convolution, one per
# channel (init 0.1) after a strided one, and one per feature of the head's
# flat features. Each sees inputs of both signs, so both branches and the
# slopes' gradients are compared.
PRELU_SPEC = {"input": [3, 8, 8], "classes": 10, "layers": [
    {"type": "conv2d", "name": "c0", "out": 4, "k": 3, "pad": 1}, {"type": "prelu", "name": "a0"},
    {"type": "conv2d", "name": "c1", "out": 4, "k": 3, "stride": 2, "pad": 1},
    {"type": "prelu", "name": "a1", "num_parameters": 4},
    {"type": "flatten", "name": "flat"}, {"type": "linear", "name": "fc1", "out": 8},
    {"type": "prelu", "name": "a2", "num_parameters": 8}, {"type": "linear", "name": "fc", "out": 10}]}


class PReLUs(nn.Module):
    def __init__(self):
        super().__init__()
        self.c0, self.a0 = nn.Conv2d(3, 4, 3, padding=1), nn.PReLU()
        self.c1, self.a1 = nn.Conv2d(4, 4, 3, stride=2, padding=1), nn.PReLU(4, init=0.1)
        self.fc1, self.a2 = nn.Linear(4 * 4 * 4, 8), nn.PReLU(8)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        y = self.a1(self.c1(self.a0(self.c0(x))))
        return self.fc(self.a2(self.fc1(torch.flatten(y, 1))))


# A CycleGAN generator's padding (torchvision has none; pytorch-CycleGAN-and-
# pix2pix's ResnetGenerator): ReflectionPad2d(3) before an unpadded 7x7
# convolution, a residual block of ReflectionPad2d(1) and ReplicationPad2d(1)
# before unpadded 3x3 ones, TensorFlow's "same" before a stride-2
# convolution as ZeroPad2d((0, 1, 0, 1)), ConstantPad2d(1, 0.5) and
# F.pad(mode="circular") with unequal sides, then an unpadded convolution.
PAD_SPEC = {"input": [3, 8, 8], "classes": 10, "layers": [
    {"type": "pad", "name": "stem.0", "pad": [3, 3, 3, 3], "mode": "reflect"},
    {"type": "conv2d", "name": "stem.1", "out": 4, "k": 7},
    {"type": "pad", "name": "block.0", "pad": [1, 1, 1, 1], "mode": "reflect"},
    {"type": "conv2d", "name": "block.1", "out": 4, "k": 3}, {"type": "relu", "name": "block.2"},
    {"type": "pad", "name": "block.3", "pad": [1, 1, 1, 1], "mode": "replicate"},
    {"type": "conv2d", "name": "block.4", "out": 4, "k": 3},
    {"type": "add", "name": "res", "inputs": ["stem.1", "block.4"]},
    {"type": "pad", "name": "same", "pad": [0, 1, 0, 1]},
    {"type": "conv2d", "name": "down", "out": 4, "k": 3, "stride": 2},
    {"type": "pad", "name": "fill", "pad": [1, 1, 1, 1], "mode": "constant", "value": 0.5},
    {"type": "pad", "name": "wrap", "pad": [1, 2, 0, 1], "mode": "circular"},
    {"type": "conv2d", "name": "c3", "out": 4, "k": 3}, {"type": "tanh", "name": "t"},
    {"type": "flatten", "name": "flat"}, {"type": "linear", "name": "fc", "out": 10}]}


class Padded(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.ReflectionPad2d(3), nn.Conv2d(3, 4, 7))
        self.block = nn.Sequential(nn.ReflectionPad2d(1), nn.Conv2d(4, 4, 3), nn.ReLU(), nn.ReplicationPad2d(1),
                                   nn.Conv2d(4, 4, 3))
        self.same, self.down = nn.ZeroPad2d((0, 1, 0, 1)), nn.Conv2d(4, 4, 3, stride=2)
        self.fill, self.c3 = nn.ConstantPad2d(1, 0.5), nn.Conv2d(4, 4, 3)
        self.fc = nn.Linear(4 * 5 * 7, 10)

    def forward(self, x):
        y = self.stem(x)
        y = self.down(self.same(y + self.block(y)))
        y = nn.functional.pad(self.fill(y), (1, 2, 0, 1), mode="circular")
        return self.fc(torch.flatten(torch.tanh(self.c3(y)), 1))


# Convolutions that pad themselves (an ESRGAN-style body, image-to-image
# nets): padding_mode reflect, replicate and circular are a pad layer of that
# mode named <conv>.pad before an unpadded conv2d; padding="same" with a 4x4
# kernel pads 1 on the left and top and 2 on the right and bottom (PyTorch's
# split), the conv2d's pad 1 and a zero pad layer for the extra; a 3x3 one
# dilated by 2 pads 2 evenly; then a plain stride-2 convolution. It is the
# spec streamfeed.export writes for ConvPads (checked below).
CONV_PAD_SPEC = {"input": [3, 8, 8], "classes": 10, "layers": [
    {"type": "pad", "name": "reflect.pad", "pad": [1, 1, 1, 1], "mode": "reflect"},
    {"type": "conv2d", "name": "reflect", "out": 4, "k": 3}, {"type": "relu", "name": "act"},
    {"type": "pad", "name": "replicate.pad", "pad": [1, 1, 1, 1], "mode": "replicate"},
    {"type": "conv2d", "name": "replicate", "out": 4, "k": 3},
    {"type": "pad", "name": "circular.pad", "pad": [1, 1, 1, 1], "mode": "circular"},
    {"type": "conv2d", "name": "circular", "out": 4, "k": 3}, {"type": "tanh", "name": "squash"},
    {"type": "pad", "name": "even.pad", "pad": [0, 1, 0, 1], "mode": "constant"},
    {"type": "conv2d", "name": "even", "out": 4, "k": 4, "pad": 1},
    {"type": "conv2d", "name": "dilated", "out": 4, "k": 3, "pad": 2, "dilation": 2},
    {"type": "relu", "name": "act_1"},
    {"type": "conv2d", "name": "plain", "out": 4, "k": 3, "stride": 2, "pad": 1},
    {"type": "flatten", "name": "flat"}, {"type": "linear", "name": "fc", "out": 10}]}


class ConvPads(nn.Module):
    def __init__(self):
        super().__init__()
        self.reflect = nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect")
        self.replicate = nn.Conv2d(4, 4, 3, padding=1, padding_mode="replicate")
        self.circular = nn.Conv2d(4, 4, 3, padding=1, padding_mode="circular")
        self.even = nn.Conv2d(4, 4, 4, padding="same")
        self.dilated = nn.Conv2d(4, 4, 3, dilation=2, padding="same")
        self.plain = nn.Conv2d(4, 4, 3, stride=2, padding=1)
        self.act, self.squash, self.flat, self.fc = nn.ReLU(), nn.Tanh(), nn.Flatten(), nn.Linear(4 * 4 * 4, 10)

    def forward(self, x):
        y = self.replicate(self.act(self.reflect(x)))
        y = self.dilated(self.even(self.squash(self.circular(y))))
        return self.fc(self.flat(self.plain(self.act(y))))


# Clamps at other bounds than relu's and relu6's (the clamp kind):
# nn.Hardtanh() at its default [-1, 1] after a convolution whose weights are
# scaled by 4 (many values beyond the bounds), a GAN output's
# torch.clamp(x, 0, 1), x.clamp(min=-0.5) after a strided convolution, and
# F.hardtanh(x, -2, 2) on flat features. Channel 0 of c0 and channels 0 and
# 1 of c1 have zero weights and a bias exactly at a bound (-1; 0 and 1), so
# every pixel of them sits on a bound, where the rules part: hardtanh passes
# no gradient there, torch.clamp passes none in torch 2.15 and dy in 2.11
# (the spec takes this torch's rule, as the exporter writes it), so those
# weights and biases stay as they are or move as PyTorch moves them, and a
# wrong rule fails the parameter comparison at the first step. No ReLU
# stands before torch.clamp(x, 0, 1): its own zero gradient at 0 would hide
# the clamp's rule there.
CLAMP_RULE = torch_clamp_rule()
CLAMP_SPEC = {"input": [3, 8, 8], "classes": 10, "layers": [
    {"type": "conv2d", "name": "c0", "out": 4, "k": 3, "pad": 1},
    {"type": "clamp", "name": "ht", "min": -1.0, "max": 1.0, "grad": "hardtanh"},
    {"type": "conv2d", "name": "c1", "out": 4, "k": 3, "pad": 1},
    {"type": "clamp", "name": "unit", "min": 0.0, "max": 1.0, "grad": CLAMP_RULE},
    {"type": "conv2d", "name": "c2", "out": 4, "k": 3, "stride": 2, "pad": 1},
    {"type": "clamp", "name": "floor", "min": -0.5, "grad": CLAMP_RULE},
    {"type": "flatten", "name": "flat"}, {"type": "linear", "name": "fc1", "out": 8},
    {"type": "clamp", "name": "h2", "min": -2.0, "max": 2.0, "grad": "hardtanh"},
    {"type": "linear", "name": "fc", "out": 10}]}


class Clamps(nn.Module):
    def __init__(self):
        super().__init__()
        self.c0, self.ht = nn.Conv2d(3, 4, 3, padding=1), nn.Hardtanh()
        self.c1, self.c2 = nn.Conv2d(4, 4, 3, padding=1), nn.Conv2d(4, 4, 3, stride=2, padding=1)
        self.fc1, self.fc = nn.Linear(4 * 4 * 4, 8), nn.Linear(8, 10)
        with torch.no_grad():
            self.c0.weight.mul_(4)
            self.c0.weight[0].zero_()
            self.c0.bias[0] = -1.0
            self.c1.weight[:2].zero_()
            self.c1.bias[:2] = torch.tensor([0.0, 1.0])

    def forward(self, x):
        y = torch.clamp(self.c1(self.ht(self.c0(x))), 0, 1)
        y = self.c2(y).clamp(min=-0.5)
        return self.fc(nn.functional.hardtanh(self.fc1(torch.flatten(y, 1)), -2, 2))


class FunctionalConv(nn.Module):
    """A module of the user's own holding weight and bias as nn.Conv2d does
    and calling F.conv2d on them."""

    def __init__(self, cin, cout, k, stride=1, padding=0, groups=1, bias=True):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(cout, cin // groups, k, k) * 0.3)
        self.bias = nn.Parameter(torch.randn(cout) * 0.1) if bias else None
        self.stride, self.padding, self.groups = stride, padding, groups

    def forward(self, x):
        return nn.functional.conv2d(x, self.weight, self.bias, self.stride, self.padding, 1, self.groups)


class FunctionalLinear(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(cout, cin) * 0.2)
        self.bias = nn.Parameter(torch.randn(cout) * 0.1)

    def forward(self, x):
        return nn.functional.linear(x, self.weight, self.bias)


class Functional(nn.Module):
    """F.conv2d (padding a number, "valid" with stride and groups and no
    bias, "same" with an even kernel) and F.linear of the modules' own
    parameters."""

    def __init__(self):
        super().__init__()
        self.c0 = FunctionalConv(3, 4, 3, padding=1)
        self.c1 = FunctionalConv(4, 4, 3, stride=2, padding="valid", groups=2, bias=False)
        self.c2 = FunctionalConv(4, 4, 2, padding="same")
        self.fc = FunctionalLinear(4 * 3 * 3, 10)

    def forward(self, x):
        y = torch.relu(self.c0(x))
        y = torch.relu(self.c1(y))
        return self.fc(torch.flatten(self.c2(y), 1))


FUNCTIONAL_SPEC = {"input": [3, 8, 8], "classes": 10, "layers": [
    {"type": "conv2d", "name": "c0", "out": 4, "k": 3, "pad": 1}, {"type": "relu", "name": "relu"},
    {"type": "conv2d", "name": "c1", "out": 4, "k": 3, "stride": 2, "groups": 2, "bias": False},
    {"type": "relu", "name": "relu_1"},
    {"type": "pad", "name": "c2.pad", "pad": [0, 1, 0, 1], "mode": "constant"},
    {"type": "conv2d", "name": "c2", "out": 4, "k": 2},
    {"type": "flatten", "name": "flatten"}, {"type": "linear", "name": "fc", "out": 10}]}


class Reductions(nn.Module):
    """Global pooling written as reductions: a sum (scaled by a number,
    which folds into it) and an amax over (2,3) of a map, side by side into
    the head."""

    def __init__(self):
        super().__init__()
        self.c0 = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        y = torch.relu(self.c0(x))
        return self.fc(torch.cat([y.sum((2, 3)) * 0.05, torch.amax(y, dim=(2, 3))], 1))


REDUCTIONS_SPEC = {"input": [3, 8, 8], "classes": 10, "layers": [
    {"type": "conv2d", "name": "c0", "out": 4, "k": 3, "pad": 1}, {"type": "relu", "name": "relu"},
    {"type": "global_avgpool", "name": "sum"}, {"type": "flatten", "name": "flatten"},
    {"type": "affine", "name": "sum_scale", "scale": 3.2},
    {"type": "maxpool2d", "name": "amax", "inputs": ["relu"], "k": 8}, {"type": "flatten", "name": "flatten_1"},
    {"type": "concat", "name": "cat", "inputs": ["sum_scale", "flatten_1"]}, {"type": "linear", "name": "fc", "out": 10}]}


class OriginalBlock(nn.Module):
    """ConvNeXt's block as its original code writes it: the layer scale a
    [C] parameter gamma multiplying the channels-last map before the
    permute back."""

    def __init__(self, dim):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 2 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(2 * dim, dim)
        self.gamma = nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x):
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.gamma * self.pwconv2(self.act(self.pwconv1(self.norm(y))))
        return x + y.permute(0, 3, 1, 2)


class LayerScaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 2, stride=2)
        self.block = OriginalBlock(4)
        self.fc = nn.Linear(4, 10)

    def forward(self, x):
        return self.fc(self.block(self.stem(x)).mean((2, 3)))


LAYER_SCALED_SPEC = {"input": [3, 8, 8], "classes": 10, "layers": [
    {"type": "conv2d", "name": "stem", "out": 4, "k": 2, "stride": 2},
    {"type": "conv2d", "name": "block.dwconv", "out": 4, "k": 3, "pad": 1, "groups": 4},
    {"type": "layernorm2d", "name": "block.norm", "eps": 1e-06},
    {"type": "linear", "name": "block.pwconv1", "out": 8, "over": "channels"}, {"type": "gelu", "name": "block.act"},
    {"type": "linear", "name": "block.pwconv2", "out": 4, "over": "channels"},
    {"type": "layer_scale", "name": "block", "vector": True, "param_names": {"layer_scale": "gamma"}},
    {"type": "add", "name": "block.add", "inputs": ["stem", "block"]},
    {"type": "global_avgpool", "name": "mean"}, {"type": "flatten", "name": "flatten"},
    {"type": "linear", "name": "fc", "out": 10}]}


CASES = {"squeeze_excitation": (SqueezeExcite, SE_SPEC), "convnext_block": (ConvNeXtish, CONVNEXT_SPEC),
         "dense_block": (Dense, DENSE_SPEC), "pools_past_a_tiny_map": (TinyPools, TINY_POOL_SPEC), "gan_activations": (GanActs, GAN_SPEC),
         "shuffle_block": (Shuffle, SHUFFLE_SPEC), "factorised_block": (Factorised, FACTORISED_SPEC),
         "paramless_norms": (ParamlessNorms, PARAMLESS_NORMS_SPEC), "resize_block": (Resize, RESIZE_SPEC),
         "smooth_activations": (SmoothActs, SMOOTH_SPEC), "pyramid_skip": (Pyramid, PYRAMID_SPEC),
         "sub_pixel": (SubPixel, PIXEL_SHUFFLE_SPEC),
         "affine": (Affine, AFFINE_SPEC), "scale_shift": (ScaleShifts, SCALE_SHIFT_SPEC),
         "resmlp_block": (ResMlpish, RESMLP_SPEC),
         "prelu": (PReLUs, PRELU_SPEC), "padding": (Padded, PAD_SPEC),
         "conv_padding": (ConvPads, CONV_PAD_SPEC),
         "clamps": (Clamps, CLAMP_SPEC), "functional_conv_linear": (Functional, FUNCTIONAL_SPEC),
         "reductions": (Reductions, REDUCTIONS_SPEC), "original_convnext_gamma": (LayerScaled, LAYER_SCALED_SPEC)}



@pytest.mark.parametrize("make, spec", [(ConvPads, CONV_PAD_SPEC), (Functional, FUNCTIONAL_SPEC),
                                        (Reductions, REDUCTIONS_SPEC), (LayerScaled, LAYER_SCALED_SPEC),
                                        (TinyPools, TINY_POOL_SPEC), (ScaleShifts, SCALE_SHIFT_SPEC),
                                        (ResMlpish, RESMLP_SPEC)],
                         ids=["conv_padding", "functional_conv_linear", "reductions", "original_convnext_gamma",
                              "pools_past_a_tiny_map", "scale_shift", "resmlp_block"])
def test_the_case_is_the_spec_the_exporter_writes(make, spec):
    sys.path.insert(0, str(REPO / "client" / "python"))
    from streamfeed.export import convert
    assert convert(make(), (1, *spec["input"])).spec == spec


def kinds_the_cuda_backend_lacks(spec):
    """The spec's kinds whose row in the binary's layer table (docs/LAYERS.md)
    says the CUDA backend does not run them: a kind lands with its CUDA
    kernels off until they have passed their op tests on a GPU."""
    table = subprocess.run([BIN, "--help-layers"], capture_output=True, text=True, check=True).stdout
    cuda = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \|.*\| (yes|no)[^|]*\|$", table, re.M)}
    return sorted({layer["type"] for layer in spec["layers"] if cuda.get(layer["type"]) == "no"})


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_model_of_these_kinds_trains_and_evaluates_like_pytorch(start_server, tmp_path, name):
    make, spec = CASES[name]
    lacking = kinds_the_cuda_backend_lacks(spec) if BACKEND == "cuda" else []
    if lacking:
        pytest.skip(f"the CUDA backend does not run {', '.join(lacking)} yet (docs/LAYERS.md's CUDA column)")
    torch.manual_seed(7)
    pair = start_pair(start_server, tmp_path, make(), ["--model.spec", json.dumps(spec), *SGD], sgd(), tol=NORMS)
    data = batches(11, 6, hw=8)
    for images, labels in data[:5]:
        pair.micro(images, labels)
        pair.assert_same_state()
    assert_eval_like_pytorch(pair, *data[5])
    assert_checkpoint_loads_back_and_computes_the_eval_logits(pair, make, *data[5])


def assert_checkpoint_loads_back_and_computes_the_eval_logits(pair, make, images, labels):
    """The service's eval logits (?return=logits) against the trained
    module's within 1e-4, and its checkpoint loaded into a fresh module with
    load_state_dict(strict=True) (every name and shape PyTorch's, none
    missing or extra), which must give them too."""
    r = pair.s.request("POST", "/v1/batches?wait=1&mode=eval&return=logits", data=st_body(images, labels),
                       headers={"Content-Type": "application/vnd.safetensors"})
    assert r.status_code == 200, r.text
    got = st_load(r.content)["logits"]
    pair.model.eval()
    with torch.no_grad():
        want = pair.model(as_input(images)).numpy()
    assert rel(got, want) <= 1e-4, rel(got, want)
    back = make()
    back.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in pair.state().items()
                          if not k.startswith("optim.")}, strict=True)
    back.eval()
    with torch.no_grad():
        again = back(as_input(images)).numpy()
    assert rel(again, got) <= 1e-4, rel(again, got)
