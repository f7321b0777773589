"""A PyTorch module as a streamfeed model: ``config.json`` and ``init.safetensors``.

::

    import torch, torchvision
    from streamfeed.export import export_model

    model = torchvision.models.efficientnet_b0(num_classes=10)
    export_model(model, torch.zeros(1, 3, 224, 224), "effnet")
    # then: streamfeed --config effnet/config.json

or from the shell::

    python -m streamfeed.export torchvision.models:efficientnet_b0 --kwargs '{"num_classes":10}' \\
        --input 3,224,224 --out effnet

The module is traced with ``torch.fx.symbolic_trace``. Each ``call_module``
node is one leaf module with its object at hand (a Conv2d's groups and
padding, a BatchNorm2d's eps and momentum) and its ``state_dict`` prefix as
target, so it maps onto one layer of the model spec whose parameters keep
their PyTorch names. ``torch.export`` was not used: its ATen graph splits a
module into op sequences (StochasticDepth into empty, bernoulli_, div_ and
mul; BatchNorm2d into batch_norm plus an add_ on num_batches_tracked;
torchvision's LayerNorm2d into permute, layer_norm, permute) whose parameters
are graph inputs named only in the graph signature, so each layer would have
to be re-assembled from ATen ops by their module-stack metadata; and it takes
about 2 s where symbolic_trace takes 0.06 s (EfficientNet-B0, torch 2.15).

A module or op that has no layer kind is refused with :class:`ExportError`
naming the op, its module path (``features.3.block.1``) and what is supported;
nothing is written then. ``docs/EXPORT.md`` lists what maps to what.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import json
import math
import operator
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from .export_attention import HEADS_HINT, QkvAttention, attention_slots, match as match_attention, multihead_query
from .export_affine import IN_PLACE_OPERATORS, AffineRefusal, affine_step, fold, set_fields
from .export_check import check_trace, forward_failed, propagate, static_number
from .export_nodes import _is_chunk_or_split, _is_float32_no_op, _is_method_or, _meta_shape, _op_name, _path_of
from .export_params import (batch_norm_call, channel_param, conv_call, group_norm_call, layer_norm_call, linear_call,
                            prelu_call, scale_param)
from .export_error import ExportError
from .export_trace import LEAF_NAMES, Tracer, fold_shape_numbers
from .export_recipes import _OPTIMIZERS, _merge, imagenet_recipe, optimizer_recipe
from .export_folds import function_activation, module_activation
from .export_pad import (PAD_MODULES, conv_pads, emit_pad, folds_into_conv, is_pad, pad_input, pad_spec,
                         pads_nothing)
from .export_channels import ChannelViews
from .export_eca import CONV1D_REFUSAL, ECA_HINT, ChannelConvs
from .export_grn import match_grn
from .export_scale_shift import addcmul_operands, bias_of_product, scale_shift as scale_shift_layer
from .export_values import (_Attention, _Broadcast, _ChannelParam, _ChannelSeq, _Expanded, _Grouped, _Padded,
                            _Pieces, _TokenSlice, _Val, _need_nchw, _spatial)
from .export_supported import (MODULE_ACTIVATIONS, SUPPORTED_FUNCTIONS, SUPPORTED_MODULES, _REDUCTIONS,
                               _supported_functions)

__all__ = ["ExportError", "ExportedModel", "convert", "export_model", "imagenet_recipe", "optimizer_recipe",
           "main", "SUPPORTED_MODULES", "SUPPORTED_FUNCTIONS"]

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "init.safetensors"
# The longest layer name the service takes (SF_LAYER_NAME_MAX - 1 of
# gpu/model.h). A layer with parameters must carry its state_dict prefix
# whole; a longer one is refused here rather than by the service at start.
NAME_MAX = 63
# The largest kernel size, stride or padding a layer takes (SF_MAX_KERNEL of
# gpu/layers.h).
MAX_KERNEL = 64


def _in_place_name(n: torch.fx.Node) -> bool:
    """A method or function named for writing into its first argument:
    x.relu_(), F.leaky_relu_, F.elu_, torch.selu_."""
    name = str(n.target) if n.op == "call_method" else getattr(n.target, "__name__", "")
    return bool(n.args) and name.endswith("_") and not name.startswith("_")


def _supported_modules() -> str:
    return ", ".join(SUPPORTED_MODULES)


# ---- tracing ----------------------------------------------------------------------------------

def _is_torchvision(m: nn.Module, name: str) -> bool:
    t = type(m)
    return t.__name__ == name and (t.__module__, name) in LEAF_NAMES


@dataclass
class ExportedModel:
    """What :func:`convert` makes of a module: the model spec (the JSON
    object of ``model.spec``) and the tensors of ``model.init_from`` (the
    module's state_dict, every entry of it, under its own names)."""
    spec: Dict[str, Any]
    tensors: Dict[str, torch.Tensor]


@dataclass
class _Builder:
    module: nn.Module
    layers: List[Dict[str, Any]] = field(default_factory=list)
    names: Set[str] = field(default_factory=set)
    module_paths: Set[str] = field(default_factory=set)
    covered: Dict[str, str] = field(default_factory=dict)  # state_dict key -> layer name
    state: Dict[str, torch.Tensor] = field(default_factory=dict)
    generating: bool = False  # naming the layers of a function (not of a module's own call)

    def unique(self, base: str, generated: bool) -> str:
        """A name for a layer without parameters: its module path (or the
        path of the module whose forward() made it), cut at the end where it
        is too long, so that a model.freeze prefix still covers it, and
        numbered where it is taken."""
        name, i = base[:NAME_MAX], 0
        while name in self.names or ((generated or i) and name in self.module_paths):
            i += 1
            suffix = f"_{i}"
            name = base[:NAME_MAX - len(suffix)] + suffix
        return name

    def emit(self, kind: str, name: str, inputs: Sequence[_Val], shape: Tuple[int, ...], nhwc: bool = False,
             params: Sequence[str] = (), generated: bool = False, tokens: bool = False, **fields: Any) -> _Val:
        """Appends a layer reading inputs and returns its output. name is a
        module path, or a name made from one (generated: a function's).
        params are the state_dict suffixes of its parameters; an empty one
        is the layer's name itself (a parameter the module holds directly)."""
        idx = len(self.layers)
        if params:
            # A layer with parameters is named by its state_dict prefix exactly.
            if name in self.names:
                raise ExportError("the module is called more than once; each call would need its own "
                                  "parameters", op=kind, module_path=name)
            for p in params:
                key = f"{name}.{p}" if p else name
                if key in self.covered:
                    raise ExportError(f"its parameter {key} would be used by two layers; the service gives "
                                      "each layer its own parameters (call the module once, or use two modules)",
                                      op=kind, module_path=name)
                self.covered[key] = name
            if len(name) > NAME_MAX:
                raise ExportError(f"its module path is {len(name)} characters long; the service names a layer "
                                  f"with at most {NAME_MAX} (rename a module on the way)", op=kind, module_path=name)
        else:
            name = self.unique(name, generated or self.generating)
        self.names.add(name)
        layer: Dict[str, Any] = {"type": kind, "name": name}
        if not (len(inputs) == 1 and inputs[0].layer == idx - 1):
            layer["inputs"] = [self.layers[v.layer]["name"] if v.layer >= 0 else -1 for v in inputs]
        layer.update(fields)
        self.layers.append(layer)
        return _Val(idx, shape, nhwc, tokens)


def _hw(v: Any) -> Tuple[int, int]:
    """An int or an (h, w) pair, as a pair."""
    if isinstance(v, (tuple, list)):
        return int(v[0]), int(v[1])
    return int(v), int(v)


def _pair(v: Any, what: str, op: str, path: str) -> int:
    """An int or a square pair, as the service takes one number."""
    h, w = _hw(v)
    if h != w:
        raise ExportError(f"{what} {tuple(v)} is not square; the service takes one {what} for both "
                          "dimensions", op=op, module_path=path)
    return h


def _hw_field(v: Tuple[int, int]) -> Any:
    """One number where both dimensions agree (a square window's spec), else [h, w]."""
    return v[0] if v[0] == v[1] else [v[0], v[1]]


_POOL_FUNCTIONS: Dict[Any, str] = {F.max_pool2d: "maxpool2d", torch.max_pool2d: "maxpool2d",
                                   F.max_pool2d_with_indices: "maxpool2d", F.avg_pool2d: "avgpool2d"}


class _Converter(ChannelViews, ChannelConvs):
    def __init__(self, module: nn.Module, gm: torch.fx.GraphModule):
        self.module, self.gm = module, gm
        self.b = _Builder(module)
        self.b.module_paths = {n for n, _ in module.named_modules() if n}
        self.b.state = dict(module.state_dict(keep_vars=False))
        self.vals: Dict[torch.fx.Node, Any] = {}
        self.affine_layers: Dict[torch.fx.Node, int] = {}  # a node whose value an affine layer makes: its index
        self.claimed: Dict[torch.fx.Node, Any] = {}  # nodes a matched pattern's layer computes: their values

    # -- values --
    def val(self, a: Any, node: torch.fx.Node, what: str = "input") -> _Val:
        if isinstance(a, torch.fx.Node):
            v = self.vals.get(a)
            if isinstance(v, _Val):
                return v
            if isinstance(v, (_TokenSlice, _ChannelParam, _ChannelSeq, _Broadcast)):
                raise ExportError(v.misused(what), op=self.opname(node), module_path=_path_of(node))
            if a.op == "get_attr":
                raise ExportError(f"uses the tensor {a.target} of the module as an {what}; only a [C,1,1] "
                                  "parameter named layer_scale multiplying a map is supported",
                                  op=self.opname(node), module_path=_path_of(node),
                                  supported=_supported_functions())
        raise ExportError(f"takes {a!r} as its {what}, which is not a tensor the service computes",
                          op=self.opname(node), module_path=_path_of(node))

    def opname(self, node: torch.fx.Node) -> str:
        mod = self.gm.get_submodule(str(node.target)) if node.op == "call_module" else None
        return _op_name(node, mod)

    def out_shape(self, node: torch.fx.Node) -> Tuple[int, ...]:
        s = _meta_shape(node)
        assert s is not None, node
        return s[1:]

    # -- the walk --
    def run(self) -> Dict[str, Any]:
        nodes = list(self.gm.graph.nodes)
        out_node = next(n for n in nodes if n.op == "output")
        live = self.live_nodes(out_node)
        self.check_in_place(nodes)
        inp = [n for n in nodes if n.op == "placeholder" and n in live]  # a defaulted constant feeds no output
        if len(inp) != 1:
            raise ExportError(f"forward() takes {len(inp)} inputs; the service feeds one image batch",
                              op="forward", module_path="")
        in_shape = self.out_shape(inp[0])
        if len(in_shape) != 3:
            raise ExportError(f"the input must be an image batch [N,C,H,W], not {list(_meta_shape(inp[0]) or ())}")
        self.vals[inp[0]] = _Val(-1, in_shape)
        for n in nodes:
            if n.op in ("placeholder", "output") or n not in live:
                continue
            if n.op == "get_attr":
                self.vals[n] = "attr"
                continue
            if n in self.claimed:  # inside a pattern an earlier node made into one layer
                self.vals[n] = self.claimed[n]
                continue
            self.vals[n] = self.convert_node(n)
        res = out_node.args[0]
        if isinstance(res, dict) and list(res) == ["out"]:  # torchvision's segmentation models, no aux head
            res = res["out"]
        # Several values: a tuple, or a namedtuple built in forward() (the
        # training-mode output of models with auxiliary heads).
        several = isinstance(res, (tuple, list)) or (isinstance(res, torch.fx.Node) and res.op == "call_function"
                                                     and isinstance(res.target, type))
        if several or not isinstance(res, torch.fx.Node):
            target = res.target if isinstance(res, torch.fx.Node) else None
            what = target.__name__ if isinstance(target, type) else type(res).__name__
            raise ExportError(f"forward() must return one tensor (the logits); it returns {what}"
                              + ("; a model with auxiliary heads exports without them (torchvision: "
                                 "aux_logits=False, segmentation: aux_loss=False)" if several or
                                 isinstance(res, dict) else ""), op="forward", module_path="")
        v = self.val(res, out_node, "output")
        if v.layer < 0 or not self.b.layers:
            raise ExportError("forward() returns its input unchanged: there is nothing to train",
                              op="forward", module_path="")
        if v.nhwc or v.tokens or v.ct:
            raise ExportError("forward() returns a " + ("channels-last (permuted) tensor" if v.nhwc else
                              "token sequence") + "; the service's output is logits [N,K] or [N,K,H,W]",
                              op="forward", module_path="")
        if v.layer != len(self.b.layers) - 1:
            raise ExportError("the output is not made by the last layer", op="forward", module_path="")
        self.check_coverage()
        in_c, in_h, in_w = in_shape
        return {"input": [in_c, in_h, in_w], "classes": v.shape[0], "layers": self.b.layers}

    def live_nodes(self, out: torch.fx.Node) -> Set[torch.fx.Node]:
        live: Set[torch.fx.Node] = set()
        todo = [out]
        while todo:
            n = todo.pop()
            if n in live:
                continue
            live.add(n)
            todo.extend(n.all_input_nodes)
        return live

    def check_in_place(self, nodes: List[torch.fx.Node]) -> None:
        """An op that writes into its input (x += y, ReLU(inplace=True))
        changes what later readers of that input see in PyTorch; the service
        gives each layer its own output, so such a graph would compute
        something else. Refused where a later node reads the input."""
        order = {n: i for i, n in enumerate(nodes)}
        for n in nodes:
            target = None
            if n.op == "call_function" and n.target in IN_PLACE_OPERATORS:
                target = n.args[0]
            elif n.op in ("call_method", "call_function") and _in_place_name(n):
                target = n.args[0]
            elif n.op == "call_module":
                mod = self.gm.get_submodule(str(n.target))
                if getattr(mod, "inplace", False) and n.args:
                    target = n.args[0]
            elif n.op == "call_function" and n.kwargs.get("inplace") and n.args:
                target = n.args[0]
            if not isinstance(target, torch.fx.Node) or target.op == "get_attr":
                continue
            later = [u for u in target.users if u is not n and order[u] > order[n]]
            if later:
                raise ExportError(f"writes into its input in place, which {later[0].name} reads afterwards; "
                                  "the service would give it the value before the write (make the op "
                                  "out of place)", op=self.opname(n), module_path=_path_of(n))

    def check_coverage(self) -> None:
        missing = [k for k in self.b.state if k not in self.b.covered]
        if missing:
            path = missing[0].rsplit(".", 1)[0]
            raise ExportError(f"the state_dict holds {len(missing)} tensor(s) no layer uses ({', '.join(missing[:4])}"
                              f"{', ...' if len(missing) > 4 else ''}): the service could not hold them, and "
                              "its checkpoint would not load back strictly; remove what forward() does not use",
                              op="state_dict", module_path=path)
        for k in self.b.covered:
            if k not in self.b.state:
                raise ExportError(f"the service expects a tensor {k} the module does not have", op="state_dict",
                                  module_path=k.rsplit(".", 1)[0])

    def convert_node(self, n: torch.fx.Node) -> Any:
        shape = _meta_shape(n)
        self.b.generating = n.op != "call_module"
        if is_pad(n, self.gm.get_submodule(str(n.target)) if n.op == "call_module" else None):
            return self.pad(n)
        if n.op == "call_module":
            return self.convert_module(n)
        if _is_chunk_or_split(n):
            return self.pieces(n)
        if n.op == "call_function" and n.target in _POOL_FUNCTIONS:
            # Before the shape check: with return_indices the output is a pair.
            return self.pool_function(n, _POOL_FUNCTIONS[n.target], self.opname(n), _path_of(n))
        if shape is None:
            # Not a tensor (a size, a shape entry): it may only feed a view
            # whose result is checked by its own shape.
            return "meta"
        return self.convert_function(n)

    # -- modules --
    def convert_module(self, n: torch.fx.Node) -> Union[_Val, "_Attention", _ChannelSeq, str]:
        path = str(n.target)
        mod: Any = self.gm.get_submodule(path)
        op = _op_name(n, mod)
        if type(mod) is nn.MultiheadAttention:
            return self.attention(n, mod, op, path)
        if not n.args or n.kwargs or len(n.args) != 1:
            raise ExportError("is called with other than one tensor argument", op=op, module_path=path)
        given = self.vals.get(n.args[0]) if isinstance(n.args[0], torch.fx.Node) else None
        if isinstance(given, _ChannelSeq):
            return self.channel_seq_module(n, given, mod, op, path)
        if isinstance(mod, nn.Conv1d):
            raise ExportError(CONV1D_REFUSAL, op=op, module_path=path)
        padded = given if isinstance(given, _Padded) and isinstance(mod, nn.Conv2d) else None
        x = padded.x if padded else self.val(n.args[0], n)
        out = self.out_shape(n)
        b = self.b
        if isinstance(mod, nn.Conv2d):
            _need_nchw(x, op, path)
            return self.conv2d(path, x, out, op, mod, padded)
        if isinstance(mod, nn.ConvTranspose2d):
            _need_nchw(x, op, path)
            return self.conv_transpose2d(path, x, out, op, mod)
        if type(mod) is nn.BatchNorm2d:
            _need_nchw(x, op, path)
            return self.batchnorm2d(path, x, out, op, mod)
        if isinstance(mod, nn.Upsample):  # UpsamplingNearest2d, UpsamplingBilinear2d (align_corners) among them
            return self.upsample(path, x, out, op, mod.size, mod.scale_factor, mod.mode, mod.align_corners,
                                 mod.recompute_scale_factor)
        if type(mod) in (nn.GroupNorm, nn.InstanceNorm2d):
            return self.groupnorm(path, x, out, op, mod)
        if type(mod) is nn.BatchNorm1d:
            if not x.plain(1):
                raise ExportError(f"runs on flat features [N, F] only (here a tensor of per-sample shape "
                                  f"{list(x.shape)}; the service has no [N, C, L] batchnorm)", op=op, module_path=path)
            return self.batchnorm2d(path, x, out, op, mod)
        act = module_activation(n, mod, op, path)
        if act:
            if x.ct:
                _need_nchw(x, op, path)
            return b.emit(act[0], path, [x], x.shape, nhwc=x.nhwc, tokens=x.tokens, **act[1])
        if type(mod) is nn.MaxPool2d:
            _need_nchw(x, op, path)
            _spatial(x.shape, op, path)
            if _pair(mod.dilation, "dilation", op, path) != 1 or mod.return_indices:
                raise ExportError("dilation and return_indices are not supported", op=op, module_path=path)
            return self.pool("maxpool2d", path, x, out, op, mod.kernel_size, mod.stride, mod.padding,
                             mod.ceil_mode)
        if type(mod) is nn.AvgPool2d:
            _need_nchw(x, op, path)
            _spatial(x.shape, op, path)
            if mod.divisor_override is not None:
                raise ExportError("divisor_override is not supported", op=op, module_path=path)
            return self.pool("avgpool2d", path, x, out, op, mod.kernel_size, mod.stride, mod.padding,
                             mod.ceil_mode, mod.count_include_pad)
        if type(mod) in (nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d):
            _need_nchw(x, op, path)
            if getattr(mod, "return_indices", False):
                raise ExportError("return_indices is not supported", op=op, module_path=path)
            return self.adaptive(path, x, out, op, type(mod) is nn.AdaptiveMaxPool2d)
        if type(mod) is nn.PReLU:
            return self.prelu(path, x, mod.num_parameters, op, path)
        if type(mod) is nn.Linear:
            att = match_attention(self.gm, n, mod, x.shape) if x.tokens else None
            return self.written_attention(att, x) if att else self.linear(path, x, out, op, mod)
        if type(mod) is nn.Dropout:
            if x.ct:
                _need_nchw(x, op, path)
            return self.dropout(path, x, float(mod.p))
        if type(mod) is nn.Dropout2d:
            return self.dropout2d(path, x, float(mod.p), op)
        if type(mod) is nn.LogSoftmax:
            return self.log_softmax(path, x, mod.dim, op)
        if type(mod) is nn.Softmax:
            raise ExportError(_SOFTMAX_REFUSAL, op=op, module_path=path)
        if type(mod) is nn.Flatten:
            return self.flatten(path, x, n, op, mod.start_dim, mod.end_dim)
        if _is_torchvision(mod, "LayerNorm2d"):
            _need_nchw(x, op, path)
            _spatial(x.shape, op, path)
            return self.layernorm(path, x, mod, op, "layernorm2d")
        if type(mod) is nn.LayerNorm:
            return self.layernorm_module(path, x, out, op, mod)
        if _is_torchvision(mod, "StochasticDepth"):
            if mod.mode != "row":
                raise ExportError(f"mode {mod.mode!r}: the service's stochastic depth is row mode (per sample)",
                                  op=op, module_path=path)
            return self.stochastic_depth(path, x, float(mod.p), op)
        if (type(mod).__module__, type(mod).__name__) == ("timm.layers.drop", "DropPath"):
            if not mod.scale_by_keep and float(mod.drop_prob) > 0.0:
                raise ExportError(f"scale_by_keep=False with drop_prob {mod.drop_prob}: the service's stochastic "
                                  "depth scales the samples it keeps by 1/(1-p), as scale_by_keep=True does",
                                  op=op, module_path=path)
            return self.stochastic_depth(path, x, float(mod.drop_prob), op)
        if type(mod) is nn.Identity:
            return x
        if type(mod) is nn.ChannelShuffle:
            return self.channel_shuffle(path, x, int(mod.groups), op, generated=False)
        if type(mod) in (nn.PixelShuffle, nn.PixelUnshuffle):
            shuffle = type(mod) is nn.PixelShuffle
            r = int(mod.upscale_factor if shuffle else mod.downscale_factor)
            return self.pixel_shuffle(path, x, r, shuffle, op, generated=False)
        raise ExportError("has no layer kind in the service", op=op, module_path=path,
                          supported=_supported_modules())

    def conv2d(self, path: str, x: _Val, out: Tuple[int, ...], op: str, mod: Any,
               padded: Optional[_Padded] = None) -> _Val:
        _spatial(x.shape, op, path)
        k, s, d = _hw(mod.kernel_size), _hw(mod.stride), _hw(mod.dilation)
        x, p = conv_pads(self.b, x, mod, padded, op, path)  # pad layers where the conv2d kind cannot pad so
        f: Dict[str, Any] = {"out": mod.out_channels, "k": _hw_field(k)}
        if s != (1, 1):
            f["stride"] = _hw_field(s)
        if p != (0, 0):
            f["pad"] = _hw_field(p)
        if mod.groups != 1:
            f["groups"] = mod.groups
        if d != (1, 1):
            f["dilation"] = _hw_field(d)
        if mod.bias is None:
            f["bias"] = False
        params = ["weight"] + (["bias"] if mod.bias is not None else [])
        return self.b.emit("conv2d", path, [x], out, params=params, **f)

    def stochastic_depth(self, path: str, x: _Val, p: float, op: str) -> _Val:
        """torchvision's StochasticDepth(p, "row") and timm's DropPath: a
        sample's whole branch dropped, on a map (either layout: one decision
        covers the sample), a token sequence or features; nothing at p 0."""
        if x.ct:
            raise ExportError("runs on a [C, H*W] view; apply it to the map or to the tokens", op=op,
                              module_path=path)
        if not 0.0 <= p <= 1.0:
            raise ExportError(f"drops with probability {p}, outside [0, 1]", op=op, module_path=path)
        if p == 0.0:
            return x
        return self.b.emit("stochastic_depth", path, [x], x.shape, nhwc=x.nhwc, tokens=x.tokens, p=p, mode="row")

    def pad(self, n: torch.fx.Node) -> Union[_Padded, _Val]:
        """Padding of a map: zeros that one nn.Conv2d reads fold into its pad
        where they can (no layer), anything else is a pad layer (export_pad)."""
        op, path = self.opname(n), _path_of(n)
        mod = self.gm.get_submodule(path) if n.op == "call_module" else None
        if pads_nothing(n, mod):
            return self.val(n.args[0], n)
        spec = pad_spec(n, mod, op, path)
        x = self.val(n.args[0], n)
        pad_input(x, op, path)
        _need_nchw(x, op, path)
        name, generated = (path, False) if n.op == "call_module" else (self.fname(n, "pad"), True)
        padded = _Padded(x, spec.sides, op, path, name, generated)
        return padded if folds_into_conv(spec, n, self.gm) else emit_pad(self.b, x, spec, padded)

    def conv_transpose2d(self, path: str, x: _Val, out: Tuple[int, ...], op: str, mod: Any) -> _Val:
        if mod.groups != 1 or _pair(mod.dilation, "dilation", op, path) != 1 or \
                _pair(mod.output_padding, "output_padding", op, path) != 0 or mod.padding_mode != "zeros":
            raise ExportError("groups, dilation, output_padding and padding_mode must be their defaults",
                              op=op, module_path=path)
        f: Dict[str, Any] = {"out": mod.out_channels, "k": _pair(mod.kernel_size, "kernel size", op, path)}
        s = _pair(mod.stride, "stride", op, path)
        p = _pair(mod.padding, "padding", op, path)
        if s != 1:
            f["stride"] = s
        if p:
            f["pad"] = p
        if mod.bias is None:
            f["bias"] = False
        return self.b.emit("conv_transpose2d", path, [x], out,
                           params=["weight"] + (["bias"] if mod.bias is not None else []), **f)

    def batchnorm2d(self, path: str, x: _Val, out: Tuple[int, ...], op: str, mod: Any) -> _Val:
        if not mod.affine or not mod.track_running_stats:
            raise ExportError("needs affine=True and track_running_stats=True (the service's batchnorm has "
                              "a weight, a bias and running statistics)", op=op, module_path=path)
        if mod.momentum is None:
            raise ExportError("momentum=None (a cumulative average) is not supported; give a number",
                              op=op, module_path=path)
        f: Dict[str, Any] = {}
        if mod.eps != 1e-5:
            f["eps"] = mod.eps
        if mod.momentum != 0.1:
            f["momentum"] = mod.momentum
        return self.b.emit("batchnorm2d", path, [x], out,
                           params=["weight", "bias", "running_mean", "running_var", "num_batches_tracked"], **f)

    def linear(self, path: str, x: _Val, out: Tuple[int, ...], op: str, mod: Any) -> _Val:
        """nn.Linear over a token sequence, over the channels of a
        channels-last map, or over a flat tensor."""
        b = self.b
        f: Dict[str, Any]
        if x.tokens:
            f = {"out": mod.out_features}
            if mod.bias is None:
                f["bias"] = False
            return b.emit("linear", path, [x], (x.shape[0], mod.out_features), tokens=True,
                          params=["weight"] + (["bias"] if mod.bias is not None else []), **f)
        if x.ct:
            _need_nchw(x, op, path)
        if x.nhwc:
            f = {"out": mod.out_features, "over": "channels"}
            if mod.bias is None:
                f["bias"] = False
            return b.emit("linear", path, [x], (mod.out_features,) + x.shape[1:], nhwc=True,
                          params=["weight"] + (["bias"] if mod.bias is not None else []), **f)
        if len(x.shape) != 1:
            raise ExportError(f"is applied to a [C,H,W] map {list(x.shape)} (over its last dimension); "
                              "flatten first, or permute(0,2,3,1) to apply it per pixel over channels",
                              op=op, module_path=path)
        f = {"out": mod.out_features}
        if mod.bias is None:
            f["bias"] = False
        return b.emit("linear", path, [x], out, params=["weight"] + (["bias"] if mod.bias is not None else []),
                      **f)

    def layernorm_module(self, path: str, x: _Val, out: Tuple[int, ...], op: str, mod: Any) -> _Val:
        """nn.LayerNorm over each token of a sequence, the features of a flat
        tensor or the channels of a channels-last map."""
        if x.tokens:
            if tuple(mod.normalized_shape) != (x.shape[1],):
                raise ExportError(f"normalizes over {tuple(mod.normalized_shape)} of a token sequence of per-sample "
                                  f"shape {list(x.shape)}; supported is LayerNorm over each token's {x.shape[1]} "
                                  "values", op=op, module_path=path)
            return self.layernorm(path, x, mod, op, "layernorm")
        if x.ct:
            _need_nchw(x, op, path)
        c = x.shape[0]
        if tuple(mod.normalized_shape) != (c,) or (len(x.shape) == 3 and not x.nhwc):
            raise ExportError(f"normalizes over {tuple(mod.normalized_shape)} of a tensor of per-sample "
                              f"shape {list(out)}; supported are LayerNorm over the features of a flat "
                              "tensor and over the channels of a channels-last map", op=op, module_path=path)
        return self.layernorm(path, x, mod, op, "layernorm2d" if x.nhwc else "layernorm")

    def pool(self, kind: str, path: str, x: _Val, out: Tuple[int, ...], op: str, k: Any, s: Any, p: Any,
             ceil: bool, count_include_pad: bool = True) -> _Val:
        kk = _pair(k, "kernel size", op, path)
        ss = _pair(s if s is not None else k, "stride", op, path)
        pp = _pair(p, "padding", op, path)
        f: Dict[str, Any] = {"k": kk}
        if ss != kk:
            f["stride"] = ss
        if pp:
            f["pad"] = pp
        if ceil:
            f["ceil_mode"] = True
        if not count_include_pad:
            f["count_include_pad"] = False
        return self.b.emit(kind, path, [x], out, **f)

    def adaptive(self, path: str, x: _Val, out: Tuple[int, ...], op: str, maximum: bool = False) -> _Val:
        c, h, w = _spatial(x.shape, op, path)
        oh, ow = out[1], out[2]
        if (oh, ow) == (h, w):
            # Bins of one pixel each: the identity (VGG's 7x7 pool on a 7x7 map).
            return x
        if maximum:
            # Bins that tile the map with one square window are a max pool of
            # that window (AdaptiveMaxPool2d(1) of a square map: its global max).
            k = h // oh
            if h % oh or w % ow or w // ow != k or k > MAX_KERNEL:
                raise ExportError(f"adaptive max pooling of a {h}x{w} map to {oh}x{ow} is supported where its bins are "
                                  f"one square window of at most {MAX_KERNEL} (the map's sides multiples of the "
                                  "output's by one factor)", op=op, module_path=path)
            return self.b.emit("maxpool2d", path, [x], (c, oh, ow), k=k)
        if (oh, ow) == (1, 1):
            return self.b.emit("global_avgpool", path, [x], (c, 1, 1))
        return self.b.emit("adaptive_avgpool2d", path, [x], (c, oh, ow), out=[oh, ow])

    def dropout(self, path: str, x: _Val, p: float) -> _Val:
        if p == 0.0:
            return x
        return self.b.emit("dropout", path, [x], x.shape, nhwc=x.nhwc, tokens=x.tokens, p=p)

    def softmax_function(self, n: torch.fx.Node, log: bool, op: str, path: str) -> _Val:
        """F.log_softmax, torch.log_softmax, Tensor.log_softmax; softmax's
        spellings are refused, saying why."""
        if not log:
            raise ExportError(_SOFTMAX_REFUSAL, op=op, module_path=path)
        if n.kwargs.get("dtype") is not None or (len(n.args) > 3 and n.args[3] is not None):
            raise ExportError("a dtype other than the input's is not supported", op=op, module_path=path)
        dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
        return self.log_softmax(self.fname(n, "log_softmax"), self.val(n.args[0], n), dim, op)

    def cat(self, n: torch.fx.Node, tensors: Any, dim: Any, out: Tuple[int, ...], op: str, path: str) -> _Val:
        """torch.cat of [C,H,W] maps along channels (of channels-last maps
        along their last dimension: MambaOut's gated block), or of flat
        features along dim 1 (a multi-branch head's features); a class token
        in front of a token sequence (class_token)."""
        if any(isinstance(self.vals.get(v), _Expanded) for v in tensors):
            return self.class_token(n, tensors, dim, op, path)
        vals = [self.val(v, n) for v in tensors]
        cl = all(v.nhwc and len(v.shape) == 3 for v in vals)
        nd = 3 if all(v.plain(3) for v in vals) else 1 if all(v.plain(1) for v in vals) else 0
        if not (cl and dim in (3, -1)) and (not nd or dim not in (1, -nd)):
            raise ExportError(f"concatenates along dimension {dim}; the service concatenates [C,H,W] maps along "
                              "channels (channels-last maps along their last dimension) or flat features along "
                              "dim 1", op=op, module_path=path)
        if len(vals) == 1:
            return vals[0]
        if len({v.shape[1:] for v in vals}) != 1:
            raise ExportError("concatenates maps of different sizes", op=op, module_path=path)
        return self.b.emit("concat", self.fname(n, "cat"), vals, (sum(v.shape[0] for v in vals),) + vals[0].shape[1:],
                           nhwc=cl)

    def upsample(self, path: str, x: _Val, out: Tuple[int, ...], op: str, size: Any, factor: Any, mode: str,
                 align: Any, recompute: Any = None, antialias: Any = False) -> _Val:
        """nn.Upsample, F.interpolate: nearest or bilinear, by one integer factor or to a size (a size
        of the traced output: also integer factors that differ by axis, whose PyTorch scale 1/s is
        in/out's in float, gpu/upsample_rule.h). A fractional factor's 1/s is no size's in/out."""
        c, h, w = _spatial(x.shape, op, path)
        _need_nchw(x, op, path)
        if mode not in ("nearest", "bilinear") or antialias:
            raise ExportError(f"mode {mode!r}{' with antialias' if antialias else ''}: the service resizes with "
                              "modes 'nearest' and 'bilinear', no antialias", op=op, module_path=path)
        f: Dict[str, Any] = {} if mode == "nearest" else {"mode": mode}
        f.update({"align_corners": True} if align else {})
        fs = tuple(factor) if isinstance(factor, (tuple, list)) else (factor, factor)
        if size is None and not recompute and any(float(v) != int(v) for v in fs):
            raise ExportError(f"scale_factor {factor}: the service takes an integer factor or a size; give size= "
                              "or recompute_scale_factor=True", op=op, module_path=path)
        if size is None and len(set(fs)) == 1 and out == (c, h * int(fs[0]), w * int(fs[0])):
            return self.b.emit("upsample", path, [x], out, scale=int(fs[0]), **f)
        return self.b.emit("upsample", path, [x], out, size=[out[1], out[2]], **f)

    def groupnorm(self, path: str, x: _Val, out: Tuple[int, ...], op: str, mod: Any, groups: int = 0,
                  eps: float = 1e-5, affine: bool = True, bias: bool = True) -> _Val:
        """nn.GroupNorm; nn.InstanceNorm2d is GroupNorm with a group per
        channel (its batch statistics in eval as in training, without
        running statistics); without affine neither has parameters. mod None:
        F.group_norm (groups, eps) or F.instance_norm (groups 0) without them,
        or with a weight alone (bias False: timm's GroupNorm1NoBias)."""
        inst = type(mod) is nn.InstanceNorm2d or (mod is None and not groups)
        if not (x.plain(3) or (x.plain(1) and not inst)):
            raise ExportError("runs on a [C,H,W] map" + ("" if inst else " or flat features") + " in the service's "
                              "own layout only", op=op, module_path=path)
        if inst and mod is not None and mod.track_running_stats:
            raise ExportError("needs track_running_stats=False (the service's groupnorm keeps no running statistics: "
                              "it normalises each sample by its own in eval too)", op=op, module_path=path)
        if mod is not None:
            groups, eps, affine = 0 if inst else int(mod.num_groups), float(mod.eps), bool(mod.affine)
            bias = getattr(mod, "bias", None) is not None
        f: Dict[str, Any] = {"eps": eps} if eps != 1e-5 else {}
        if not affine:
            f["affine"] = False
        elif not bias:
            f["bias"] = False
        return self.b.emit("groupnorm", path, [x], out,
                           params=(["weight", "bias"] if bias else ["weight"]) if affine else [],
                           num_groups=groups or x.shape[0], **f)

    def log_softmax(self, path: str, x: _Val, dim: Any, op: str) -> _Val:
        """log_softmax over the features of [N, F] (dim 1 or -1): a
        classifier trained with nn.NLLLoss ends in it, and the service's
        cross-entropy on its output is that loss."""
        if not x.plain(1) or dim not in (1, -1):
            raise ExportError(f"log_softmax is supported over dim 1 of flat features [N, F] only (here dim {dim} of "
                              f"a tensor of per-sample shape {list(x.shape)})", op=op, module_path=path)
        return self.b.emit("log_softmax", path, [x], x.shape)

    def dropout2d(self, path: str, x: _Val, p: float, op: str) -> _Val:
        """nn.Dropout2d on a [C,H,W] map: whole channels (PyTorch drops
        whole features of a flat or 3-D input with a warning; the service
        has no such layer)."""
        _need_nchw(x, op, path)
        _spatial(x.shape, op, path)
        if p == 0.0:
            return x
        return self.b.emit("dropout2d", path, [x], x.shape, p=p)

    def layernorm(self, path: str, x: _Val, mod: Any, op: str, kind: str) -> _Val:
        if not mod.elementwise_affine:
            raise ExportError("needs elementwise_affine=True (the service's layernorm has a weight, and a bias or "
                              "none)", op=op, module_path=path)
        f: Dict[str, Any] = {"eps": mod.eps} if mod.eps != 1e-5 else {}
        if getattr(mod, "bias", None) is None:
            f["bias"] = False
        return self.b.emit(kind, path, [x], x.shape, nhwc=x.nhwc, tokens=x.tokens,
                           params=["weight", "bias"] if f.get("bias", True) else ["weight"], **f)

    def attention(self, n: torch.fx.Node, mod: Any, op: str, path: str) -> _Attention:
        """nn.MultiheadAttention called as torchvision's EncoderBlock calls
        it: self_attention(x, x, x, need_weights=False) on [N,T,C] tokens."""
        x = self.val(multihead_query(n, mod, op, path), n)
        if not x.tokens:
            raise ExportError(f"attends over a tensor of per-sample shape {list(x.shape)}, not a token sequence "
                              "[T, C]", op=op, module_path=path)
        params, fields = attention_slots(mod.in_proj_bias is not None, mod.out_proj.bias is not None)
        out = self.b.emit("self_attention", path, [x], x.shape, tokens=True, num_heads=int(mod.num_heads),
                          params=params, **fields)
        return _Attention(out)

    def grn(self, n: torch.fx.Node, op: str, path: str) -> str:
        """ConvNeXt V2's Global Response Normalization from its norm on
        (export_grn.py): one grn layer whose output is the final add's."""
        src = n.args[0] if n.args else n.kwargs.get("input")
        x = self.val(src, n)
        if not isinstance(src, torch.fx.Node) or x.tokens or x.ct:
            raise ExportError("takes a norm of a tensor other than a map", op=op, module_path=path)
        m = match_grn(n, src, x.shape, x.nhwc, self.b.state, op, path)
        fields: Dict[str, Any] = {} if abs(m.eps - 1e-6) <= 1e-12 else {"eps": m.eps}
        if m.param_names:
            fields["param_names"] = m.param_names
        params = [m.param_names.get(k, k) for k in ("weight", "bias")]
        out = self.b.emit("grn", m.name, [x], x.shape, nhwc=x.nhwc, params=params, **fields)
        self.claimed.update({k: "claimed" for k in m.inner})
        self.claimed[m.out] = out
        return "claimed"

    def written_attention(self, att: QkvAttention, x: _Val) -> str:
        """Self-attention written out from a qkv Linear to a proj Linear
        (export_attention.py): one self_attention layer whose output is the
        proj Linear's; the nodes between make no layer."""
        out = self.b.emit("self_attention", att.name, [x], x.shape, tokens=True, num_heads=att.heads,
                          params=att.params, param_names=att.param_names, **att.fields)
        if att.map_hw:
            # heads merged into a channels-last map [N, H, W, C] before proj
            # (timm's MetaFormer Attention): proj is per token, so the layer
            # projects the tokens and to_map makes them the map after it
            h, w = att.map_hw
            out = self.b.emit("to_map", self.fname(att.proj, "to_map"), [out], (x.shape[1], h, w), nhwc=True,
                              size=[h, w])
        self.claimed.update({n: "claimed" for n in att.inner})
        self.claimed[att.proj] = out
        return "claimed"

    def flatten(self, path: str, x: _Val, n: torch.fx.Node, op: str, start: int, end: int) -> _Val:
        if x.nhwc:
            raise ExportError("flattens a channels-last (permuted) tensor", op=op, module_path=path)
        if start == 2 and end in (-1, 3) and not x.nhwc and not x.tokens and not x.ct and len(x.shape) == 3:
            # [N,C,H,W] to [N,C,H*W]: no data moves; a transpose to tokens follows.
            return _Val(x.layer, (x.shape[0], x.shape[1] * x.shape[2]), ct=True)
        if x.tokens or x.ct:
            raise ExportError("flattens a token sequence", op=op, module_path=path)
        if start != 1 or end not in (-1, len(x.shape)):
            raise ExportError(f"flattens dimensions {start}..{end}; the service flattens all but the batch "
                              "dimension (start_dim=1)", op=op, module_path=path)
        if len(x.shape) == 1:
            return x
        module = n.op == "call_module"  # torch.flatten at the top level is "flatten", not ".flatten"
        return self.b.emit("flatten", path if module else self.fname(n, "flatten"), [x], (math.prod(x.shape),),
                           generated=not module)

    def pool_function(self, n: torch.fx.Node, kind: str, op: str, path: str) -> _Val:
        """F.max_pool2d, torch.max_pool2d and F.avg_pool2d as the layers of
        nn.MaxPool2d and nn.AvgPool2d, with every argument they take."""
        names = ["input", "kernel_size", "stride", "padding"] + \
            (["dilation", "ceil_mode", "return_indices"] if kind == "maxpool2d" else
             ["ceil_mode", "count_include_pad", "divisor_override"])
        a: Dict[str, Any] = {"stride": None, "padding": 0, "dilation": 1, "ceil_mode": False,
                             "return_indices": False, "count_include_pad": True, "divisor_override": None}
        a.update(zip(names, n.args))
        a.update(n.kwargs)
        for k, v in a.items():
            if k == "input":
                continue
            try:  # a number computed from the input's shape (x.size()[2:]) is that number
                a[k] = static_number(v)
            except LookupError:
                raise ExportError(f"takes a {k} computed from tensors or the batch size; the service's pooling "
                                  "takes numbers", op=op, module_path=path) from None
        x = self.val(a["input"], n)
        _need_nchw(x, op, path)
        _spatial(x.shape, op, path)
        if kind == "maxpool2d" and (_pair(a["dilation"], "dilation", op, path) != 1 or a["return_indices"]):
            raise ExportError(f"dilation {a['dilation']} and return_indices {a['return_indices']}: the service's "
                              "maxpool2d has no dilation and returns no indices", op=op, module_path=path)
        if kind == "avgpool2d" and a["divisor_override"] is not None:
            raise ExportError(f"divisor_override {a['divisor_override']} is not supported", op=op,
                              module_path=path)
        stride = a["stride"] if a["stride"] not in (None, [], ()) else None
        return self.pool(kind, self.fname(n, kind.replace("2d", "")), x, self.out_shape(n), op, a["kernel_size"],
                         stride, a["padding"], bool(a["ceil_mode"]), bool(a["count_include_pad"]))

    # -- functions and methods --
    def fname(self, n: torch.fx.Node, short: str) -> str:
        p = _path_of(n)
        return f"{p}.{short}" if p else short

    def convert_function(self, n: torch.fx.Node) -> Any:
        t, op, path = n.target, self.opname(n), _path_of(n)
        meth = str(t) if n.op == "call_method" else None
        out = self.out_shape(n)
        b = self.b

        def arg(i: int, kw: str, default: Any = None) -> Any:
            return n.args[i] if len(n.args) > i else n.kwargs.get(kw, default)

        first = self.vals.get(n.args[0]) if n.args and isinstance(n.args[0], torch.fx.Node) else None
        if isinstance(first, _Grouped):
            return self.shuffle_step(n, first, meth, op, path)
        if isinstance(first, _ChannelSeq):
            return self.channel_seq_function(n, first, meth, out, op, path)
        if t is operator.getitem and isinstance(first, _Pieces):
            return self.take_piece(n, first, op, path)
        if t in (torch.channel_shuffle, F.channel_shuffle, torch.native_channel_shuffle):
            return self.channel_shuffle(self.fname(n, "channel_shuffle"), self.val(arg(0, "input"), n),
                                        int(arg(1, "groups")), op)
        if t in (F.pixel_shuffle, torch.pixel_shuffle, F.pixel_unshuffle, torch.pixel_unshuffle):
            return self.pixel_shuffle_call(n, t in (F.pixel_shuffle, torch.pixel_shuffle), op)

        if meth == "norm" or t in (torch.norm, torch.linalg.vector_norm):
            return self.grn(n, op, path)
        scaled = self.affine(n, op, path)
        if scaled is not None:
            return scaled
        if t in (operator.add, operator.iadd, torch.add) or meth in ("add", "add_"):
            if n.kwargs.get("alpha", 1) != 1 or len(n.args) > 2:
                raise ExportError("alpha is not supported", op=op, module_path=path)
            a0, a1 = arg(0, "input"), arg(1, "other")
            attrs = [v for v in (a0, a1) if isinstance(v, torch.fx.Node) and v.op == "get_attr"]
            if attrs:
                return self.pos_embedding(n, attrs, a1 if a0 is attrs[0] else a0, op, path)
            return self.add(n, self.val(a0, n), self.val(a1, n), op, path)
        if (t in (operator.sub, torch.sub) or meth == "sub") and len(n.args) == 2 and not n.kwargs:
            return self.add(n, self.val(n.args[0], n), self.val(n.args[1], n), op, path, subtract=True)
        if t is torch.addcmul:
            bias, weight, x = addcmul_operands(n, op, path)
            return self.scale_shift(self.val(x, n), str(weight.target), str(bias.target), None, op, path)
        if t in (operator.mul, operator.imul, torch.mul) or meth in ("mul", "mul_"):
            return self.mul(n, arg(0, "input"), arg(1, "other"), op, path)
        if t is torch.cat:
            return self.cat(n, arg(0, "tensors"), arg(1, "dim", 0), out, op, path)
        if t is torch.flatten or meth == "flatten":
            return self.flatten(path, self.val(arg(0, "input"), n), n, op, int(arg(1, "start_dim", 0)),
                                int(arg(2, "end_dim", -1)))
        if meth in ("view", "reshape") or t is torch.reshape:
            if isinstance(n.args[0], torch.fx.Node) and n.args[0].op == "get_attr":
                return channel_param(self.b.state, str(n.args[0].target), _meta_shape(n) or (), op, path)
            x = self.val(n.args[0], n)
            if x.nhwc and len(x.shape) == 3 and out == (x.shape[1] * x.shape[2], x.shape[0]):
                # a channels-last [N,H,W,C] map as [N,H*W,C]: its tokens (timm's MetaFormer Attention)
                return self.b.emit("to_tokens", self.fname(n, "to_tokens"), [x], out, tokens=True)
            if x.nhwc:
                raise ExportError("reshapes a channels-last (permuted) tensor; supported is [N, H, W, C] to its "
                                  "tokens [N, H*W, C]", op=op, module_path=path)
            if out == x.shape:
                return x
            if len(x.shape) == 3 and not x.tokens and not x.ct and out == (x.shape[0], x.shape[1] * x.shape[2]):
                # [N,C,H,W] to [N,C,H*W]: no data moves; a permute to tokens follows.
                return _Val(x.layer, out, ct=True)
            if out == (math.prod(x.shape),):
                return self.flatten(path, x, n, op, 1, -1)
            groups = self.shuffle_pattern(n, x, out)
            if groups is not None:
                return _Grouped(x, groups)
            heads = HEADS_HINT if x.tokens else ECA_HINT if out == (1, math.prod(x.shape)) else ""
            raise ExportError(f"reshapes {list(x.shape)} to {list(out)} (per sample); only a flatten to "
                              "[N, C*H*W] and a channel shuffle's view to [N, g, C/g, H, W] are supported" + heads,
                              op=op, module_path=path, supported=_supported_functions())
        if meth == "transpose" or t is torch.transpose:
            x = self.val(n.args[0], n)
            pair = {int(arg(1, "dim0")) % 3, int(arg(2, "dim1")) % 3}
            if x.ct and pair == {1, 2}:
                return self.to_tokens(n, x)
            if x.tokens and pair == {1, 2}:
                return self.tokens_to_map(n, x) or self.transpose_tokens(n, x)
            raise ExportError("transposes other than a [N,C,H*W] map to [N,H*W,C] tokens and the two dimensions of "
                              "a token sequence", op=op, module_path=path, supported=_supported_functions())
        if t is torch.permute or meth == "permute":
            x = self.val(n.args[0], n)
            raw: Any = n.args[1:] if meth and len(n.args) > 2 else (arg(1, "dims") or n.kwargs.get("dims"))
            dims = tuple(int(d) for d in raw)
            if x.ct and dims == (0, 2, 1):
                return self.to_tokens(n, x)
            if x.tokens and dims == (0, 2, 1):
                return self.tokens_to_map(n, x) or self.transpose_tokens(n, x)
            if not x.nhwc and dims == (0, 2, 3, 1) and len(x.shape) == 3:
                return _Val(x.layer, x.shape, True)
            if x.nhwc and dims == (0, 3, 1, 2):
                return _Val(x.layer, x.shape, False)
            raise ExportError(f"permutes with {dims}; only permute(0,2,3,1) to channels-last and back with "
                              "permute(0,3,1,2) are supported (ConvNeXt's blocks)", op=op, module_path=path)
        if meth == "contiguous" or _is_float32_no_op(n):
            return self.val(n.args[0], n)
        if meth in ("expand", "expand_as"):
            return self.expand(n, first, out, op, path)
        if t is operator.getitem:
            a0 = n.args[0]
            src = self.vals.get(a0) if isinstance(a0, torch.fx.Node) else None
            if isinstance(src, _Attention) and isinstance(a0, torch.fx.Node):
                if n.args[1] != 0:
                    raise ExportError("uses the attention weights (the second output); the service computes none",
                                      op=self.opname(a0), module_path=_path_of(a0))
                return src.out
            x = self.val(n.args[0], n)
            idx = n.args[1]
            if x.tokens:
                return self.token_index(n, x, idx, op, path)
            sliced = self.channel_range(n, x, idx, op, path)
            if sliced is not None:
                return sliced
            raise ExportError(f"indexes with {idx!r}; supported are x[:, 0] on a token sequence (the class token) "
                              "and x[:, a:b] on a map (a channel range)", op=op, module_path=path,
                              supported=_supported_functions())
        act = function_activation(n, op, path)
        if act:
            x = self.val(n.args[0], n)
            if x.ct:
                raise ExportError("runs on a [N,C,H*W] reshape of a map", op=op, module_path=path)
            return b.emit(act[0], self.fname(n, act[0]), [x], x.shape, nhwc=x.nhwc, tokens=x.tokens, **act[1])
        own = self.own_parameters_call(n, t, arg, out, op, path)
        if own is not None:
            return own
        if t in (F.softmax, torch.softmax, F.log_softmax, torch.log_softmax) or meth in ("softmax", "log_softmax"):
            return self.softmax_function(n, t in (F.log_softmax, torch.log_softmax) or meth == "log_softmax", op, path)
        if t is F.interpolate:
            return self.upsample(self.fname(n, "upsample"), self.val(n.args[0], n), out, op, arg(1, "size"),
                                 arg(2, "scale_factor"), arg(3, "mode", "nearest"), arg(4, "align_corners"),
                                 arg(5, "recompute_scale_factor"), arg(6, "antialias", False))
        if t in (F.adaptive_avg_pool2d, F.adaptive_max_pool2d):
            mx = t is F.adaptive_max_pool2d and not arg(2, "return_indices", False)
            return self.adaptive(self.fname(n, "maxpool" if mx else "avgpool"), self.val(n.args[0], n), out, op, mx)
        if meth in _REDUCTIONS or t in _REDUCTIONS.values():
            how = meth if meth in _REDUCTIONS else getattr(t, "__name__", "")
            return self.reduce(n, how, arg(1, "dim"), bool(arg(2, "keepdim", False)), op, path)
        if t in (F.group_norm, F.instance_norm):
            return self.norm_function(n, t is F.group_norm, arg, op, path)
        if t is F.dropout or t is F.dropout2d:
            x = self.val(n.args[0], n)
            prob, training = float(arg(1, "p", 0.5)), bool(arg(2, "training", True))
            if arg(3, "inplace", False) not in (False, True):
                raise ExportError("inplace must be a constant", op=op, module_path=path)
            if t is F.dropout2d:
                return self.dropout2d(self.fname(n, "dropout2d"), x, prob if training else 0.0, op)
            return self.dropout(self.fname(n, "dropout"), x, prob if training else 0.0)
        raise ExportError("has no layer kind in the service", op=op, module_path=path,
                          supported=_supported_functions())

    def expand(self, n: torch.fx.Node, first: Any, out: Tuple[int, ...], op: str,
               path: str) -> Union[_Expanded, _Broadcast]:
        """A [1,1,C] parameter expanded over the batch (a class token, for
        its torch.cat), or a [C,1,1] map expanded to a map's shape for a
        multiply (export_eca.py's broadcast)."""
        if isinstance(n.args[0], torch.fx.Node) and n.args[0].op == "get_attr":
            target = str(n.args[0].target)
            p = self.b.state.get(target)
            if p is None or p.dim() != 3 or p.shape[0] != 1 or out != tuple(p.shape[1:]) or n.target != "expand":
                raise ExportError(f"expands the module tensor {target}; supported is a [1,1,C] parameter expanded "
                                  "over the batch as a class token", op=op, module_path=path)
            return _Expanded(target, tuple(int(d) for d in p.shape))
        return self.broadcast(n, self.val(n.args[0], n), out, op, path)

    def norm_function(self, n: torch.fx.Node, group: bool, arg: Callable[..., Any], op: str, path: str) -> _Val:
        """F.group_norm and F.instance_norm: groupnorm, affine where the call
        takes a submodule's own weight and bias (group_norm_call)."""
        owner, groups, eps, bias = group_norm_call(self.b.module, n, arg, group, op, path)
        return self.groupnorm(owner or self.fname(n, "group_norm" if group else "instance_norm"),
                              self.val(n.args[0], n), self.out_shape(n), op, None, groups, eps, owner is not None,
                              bias)

    def add(self, n: torch.fx.Node, a: _Val, c: _Val, op: str, path: str, subtract: bool = False) -> _Val:
        """a + c of two tensors of one shape; a - c (PoolFormer's pool(x) - x)
        is an affine layer of scale -1 on c, then that add."""
        if a.shape != c.shape or a.nhwc != c.nhwc or a.tokens != c.tokens or a.ct or c.ct:
            raise ExportError(f"{'subtracts' if subtract else 'adds'} tensors of shapes {list(a.shape)} and "
                              f"{list(c.shape)}{_layouts(a, c)}; the service {'subtracts' if subtract else 'adds'} "
                              "tensors of one shape and layout", op=op, module_path=path)
        if subtract:
            c = self.b.emit("affine", self.fname(n, "neg"), [c], c.shape, nhwc=c.nhwc, tokens=c.tokens, scale=-1.0)
        return self.b.emit("add", self.fname(n, "sub" if subtract else "add"), [a, c], a.shape, nhwc=a.nhwc,
                           tokens=a.tokens)

    def to_tokens(self, n: torch.fx.Node, x: _Val) -> _Val:
        c, t = x.shape
        return self.b.emit("to_tokens", self.fname(n, "to_tokens"), [x], (t, c), tokens=True)

    def tokens_to_map(self, n: torch.fx.Node, x: _Val) -> Optional[str]:
        """x.transpose(1, 2).reshape(N, C, H, W) of tokens [H*W, C] (timm's
        MetaFormerStage after its attention blocks; permute(0, 2, 1), and
        contiguous() before the view, alike): the map they were made from,
        one to_map layer that the reshape's value is. None where the
        transpose goes anywhere else (transpose_tokens then)."""
        users = list(n.users)
        r = users[0] if len(users) == 1 else None
        mid = None
        if r is not None and r.op == "call_method" and r.target == "contiguous" and len(r.users) == 1:
            mid, r = r, next(iter(r.users))
        rs = _meta_shape(r) if r is not None else None
        t, c = x.shape
        if r is None or rs is None or not _is_method_or(r, ("reshape", "view"), (torch.reshape,)) or len(rs) != 4 or \
                rs[1] != c or rs[2] * rs[3] != t:
            return None
        h, w = int(rs[2]), int(rs[3])
        if mid is not None:
            self.claimed[mid] = "claimed"
        self.claimed[r] = self.b.emit("to_map", self.fname(r, "to_map"), [x], (c, h, w), size=[h, w])
        return "claimed"

    def transpose_tokens(self, n: torch.fx.Node, x: _Val) -> _Val:
        """Tokens [T, C] as [C, T]: C tokens of T features (MLP-Mixer's
        token mixing runs its Linear over them)."""
        return self.b.emit("transpose_tokens", self.fname(n, "transpose"), [x], (x.shape[1], x.shape[0]), tokens=True)

    def class_token(self, n: torch.fx.Node, tensors: Any, dim: Any, op: str, path: str) -> _Val:
        """torch.cat([class_token.expand(n, -1, -1), x], dim=1): a [1,1,C]
        parameter in front of a token sequence."""
        cls = self.vals.get(tensors[0]) if len(tensors) == 2 else None
        x = self.vals.get(tensors[1]) if len(tensors) == 2 else None
        if not isinstance(cls, _Expanded) or not isinstance(x, _Val) or not x.tokens or dim not in (1, -2) or \
                cls.shape != (1, 1, x.shape[1]):
            raise ExportError("concatenates an expanded module tensor; supported is torch.cat([p.expand(n, -1, -1), "
                              "x], dim=1) of a [1,1,C] parameter p and a token sequence x (a class token)", op=op,
                              module_path=path)
        return self.b.emit("class_token", cls.target, [x], (x.shape[0] + 1, x.shape[1]), tokens=True, params=[""])

    def pos_embedding(self, n: torch.fx.Node, attrs: List[torch.fx.Node], other: Any, op: str, path: str) -> _Val:
        """x + p of a [1,T,C] parameter p and a token sequence x."""
        target = str(attrs[0].target)
        p = self.b.state.get(target)
        x = self.val(other, n) if len(attrs) == 1 else None
        if x is None or p is None or not x.tokens or tuple(p.shape) != (1,) + x.shape:
            raise ExportError(f"adds the module tensor {target}; supported is a [1,T,C] parameter added to a token "
                              "sequence (a position embedding)", op=op, module_path=path)
        return self.b.emit("pos_embedding", target, [x], x.shape, tokens=True, params=[""])

    def token_index(self, n: torch.fx.Node, x: _Val, idx: Any, op: str, path: str) -> Union[_Val, _TokenSlice]:
        """x[:, 0] of tokens is select_token; x[:, a:] the tokens from a on,
        which only a mean over them may read (token_mean); a last index of
        every channel (Hugging Face's x[:, 0, :]) is the same."""
        if isinstance(idx, tuple) and len(idx) == 3 and idx[2] == slice(None):
            idx = idx[:2]
        if isinstance(idx, tuple) and len(idx) == 2 and idx[0] == slice(None):
            if idx[1] == 0:
                return self.b.emit("select_token", self.fname(n, "select_token"), [x], (x.shape[1],))
            s = idx[1]
            if isinstance(s, slice) and s.step in (None, 1) and s.stop is None and isinstance(s.start, int) and \
                    0 <= s.start < x.shape[0]:
                return _TokenSlice(x, s.start)
        raise ExportError(f"indexes a token sequence with {idx!r}; supported are x[:, 0] (the class token) and "
                          "x[:, a:].mean(dim=1) (the mean of the tokens from a on)", op=op, module_path=path,
                          supported=_supported_functions())

    def reduce(self, n: torch.fx.Node, how: str, dim_arg: Any, keep: bool, op: str,
               path: str) -> Union[_Val, _ChannelSeq]:
        """A mean, sum or amax over the spatial dimensions (2,3) of a map
        ((1,2) of a channels-last one: MambaOut's head):
        global_avgpool (a sum: then an affine layer times H*W), or for amax
        of a square map a maxpool2d of its size; a mean or sum over the
        tokens (dim 1) of a token sequence, or of x[:, a:]: token_mean (a
        sum: times their count)."""
        src = self.vals.get(n.args[0]) if isinstance(n.args[0], torch.fx.Node) else None
        x = src.x if isinstance(src, _TokenSlice) else self.val(n.args[0], n)
        dims = list(dim_arg) if isinstance(dim_arg, (tuple, list)) else [dim_arg]
        if n.kwargs.get("dtype") is not None or dim_arg is None or not all(isinstance(d, int) for d in dims):
            raise ExportError(f"a {how} is supported over given dimensions (no dtype)", op=op, module_path=path)
        if x.tokens and how != "amax":
            if [d % 3 for d in dims] != [1] or keep:
                raise ExportError(f"a {how} of a token sequence is supported over its tokens (dim=1, no keepdim) "
                                  f"only, not dim={dim_arg!r}" + (" with keepdim" if keep else ""), op=op,
                                  module_path=path)
            start = src.start if isinstance(src, _TokenSlice) else 0
            f: Dict[str, Any] = {"start": start} if start else {}
            y = self.b.emit("token_mean", self.fname(n, how), [x], (x.shape[1],), **f)
            return self.scaled(n, y, x.shape[0] - start) if how == "sum" else y
        spatial = {1, 2} if x.nhwc else {2, 3}
        if x.tokens or len(x.shape) != 3 or {d % 4 for d in dims} != spatial or len(dims) != 2:
            raise ExportError(f"a {how} is supported over the spatial dimensions (2,3) of a [C,H,W] map "
                              "((1,2) of a channels-last one)" +
                              (", or over the tokens (dim=1) of a token sequence" if how != "amax" else ""),
                              op=op, module_path=path)
        c, h, w = x.shape
        if how == "amax":
            if h != w or h > MAX_KERNEL:
                raise ExportError(f"an amax over (2,3) is supported of a square map of at most {MAX_KERNEL} a side "
                                  f"(a max pool of its size), not {h}x{w}", op=op, module_path=path)
            y = self.b.emit("maxpool2d", self.fname(n, how), [x], (c, 1, 1), k=h, nhwc=x.nhwc and keep)
        elif x.nhwc:  # kept: the pooled channels-last [1, 1, C]; else the features, as of the map
            y = self.b.emit("global_avgpool", self.fname(n, how), [x], (c, 1, 1), nhwc=keep)
        else:
            y = self.b.emit("global_avgpool", self.fname(n, how), [x], (c, 1, 1))
            if how == "mean" and not keep and self.channel_seq_mean(n, c):
                return _ChannelSeq(y)  # ECA's view to [N, 1, C] reads it (export_eca.py)
        y = y if keep else self.flatten(path, y, n, op, 1, -1)
        return self.scaled(n, y, h * w) if how == "sum" else y

    def scaled(self, n: torch.fx.Node, x: _Val, count: int) -> _Val:  # a mean times its count: the sum
        if count == 1:
            return x
        y = self.b.emit("affine", self.fname(n, "sum_scale"), [x], x.shape, nhwc=x.nhwc, tokens=x.tokens)
        set_fields(self.b.layers[y.layer], float(count), 0.0)
        self.affine_layers[n] = y.layer  # a number times the sum folds into it
        return y

    def affine(self, n: torch.fx.Node, op: str, path: str) -> Optional[_Val]:
        """Arithmetic of a tensor with a Python number (export_affine.py) as
        an affine layer, folded into the affine layer that made the tensor
        where nothing else reads it; None when n is no such step. A step that
        leaves x as it is (x * 1, x + 0) makes no layer."""
        try:
            step = affine_step(n, lambda v: isinstance(self.vals.get(v), _Val))
            if step is None:
                return None
            z, a, b = step
            x: _Val = self.vals[z]
            i = self.affine_layers.get(z)
            if i is not None and len(z.users) == 1:
                layer = self.b.layers[i]
                set_fields(layer, *fold(layer.get("scale", 1.0), layer.get("shift", 0.0), a, b))
                self.affine_layers[n] = i
                return x
            a, b = fold(1.0, 0.0, a, b)  # x / c of a tiny c: 1 / c may leave float32's range
        except AffineRefusal as e:
            raise ExportError(str(e), op=op, module_path=path) from None
        if x.ct:
            raise ExportError("runs on a [N,C,H*W] reshape of a map", op=op, module_path=path)
        if (a, b) == (1.0, 0.0):
            return x
        y = self.b.emit("affine", self.fname(n, "affine"), [x], x.shape, nhwc=x.nhwc, tokens=x.tokens)
        set_fields(self.b.layers[y.layer], a, b)
        self.affine_layers[n] = y.layer
        return y

    def prelu(self, name: str, x: _Val, slopes: int, op: str, path: str) -> _Val:
        """nn.PReLU (and F.prelu): one slope for every channel, or one per
        channel of a [C,H,W] map or per feature of flat features [N, F]
        (PyTorch's dimension 1), the parameter <name>.weight [slopes]."""
        if x.tokens or x.ct or len(x.shape) not in (1, 3):
            raise ExportError("runs on a token sequence or a reshaped map; the service's prelu takes a [C,H,W] map "
                              "or flat features [N, F]", op=op, module_path=path)
        if slopes != 1 and (x.nhwc or slopes != x.shape[0]):
            raise ExportError(f"has {slopes} slopes for a tensor of per-sample shape {list(x.shape)}"
                              f"{' held channels-last' if x.nhwc else ''}; supported are one slope, or one per "
                              "channel of a [C,H,W] map or feature of [N, F]", op=op, module_path=path)
        fields: Dict[str, Any] = {"num_parameters": slopes} if slopes != 1 else {}
        return self.b.emit("prelu", name, [x], x.shape, nhwc=x.nhwc, params=["weight"], **fields)

    def own_parameters_call(self, n: torch.fx.Node, t: Any, arg: Callable[[int, str, Any], Any],
                            out: Tuple[int, ...], op: str, path: str) -> Optional[_Val]:
        """F.prelu, F.conv2d, F.linear, F.layer_norm and F.batch_norm of a
        module's own parameters: that module's layer of that kind (None: t is
        none of them)."""
        if t in (F.prelu, torch.prelu):
            owner, slopes = prelu_call(self.b.state, arg, op, path)
            return self.prelu(owner, self.val(arg(0, "input", None), n), slopes, op, path)
        if t in (F.conv2d, torch.conv2d):
            owner, conv = conv_call(self.b.module, arg, op, path)
            x = self.val(arg(0, "input", None), n)
            _need_nchw(x, op, path)
            return self.conv2d(owner, x, out, op, conv)
        if t is F.linear:
            owner, lin = linear_call(self.b.module, arg, op, path)
            return self.linear(owner, self.val(arg(0, "input", None), n), out, op, lin)
        if t is F.layer_norm:
            owner, ln = layer_norm_call(self.b.module, arg, op, path)
            return self.layernorm_module(owner, self.val(arg(0, "input", None), n), out, op, ln)
        if t is F.batch_norm:
            x = self.val(arg(0, "input", None), n)
            owner, bn = batch_norm_call(self.b.module, arg, op, path, x)
            return self.batchnorm2d(owner, x, out, op, bn)
        return None

    def scale_shift(self, x: _Val, weight: str, bias: Optional[str], add: Optional[torch.fx.Node], op: str,
                    path: str) -> _Val:
        """x * weight (+ bias) of a submodule's parameters; add, the node
        adding the bias, is computed by this layer too."""
        owner, params, f = scale_shift_layer(self.b.state, x, weight, bias, op, path)
        out = self.b.emit("scale_shift", owner, [x], x.shape, nhwc=x.nhwc, tokens=x.tokens, params=params, **f)
        if add is not None:
            self.claimed[add] = out
        return out

    def mul(self, n: torch.fx.Node, a0: Any, a1: Any, op: str, path: str) -> _Val:
        attrs = [a for a in (a0, a1) if isinstance(a, torch.fx.Node) and
                 (a.op == "get_attr" or isinstance(self.vals.get(a), _ChannelParam))]
        if attrs:
            x, viewed = self.val(a1 if a0 is attrs[0] else a0, n), self.vals.get(attrs[0])
            if len(attrs) == 1 and not isinstance(viewed, _ChannelParam):
                add, p = bias_of_product(n), self.b.state.get(str(attrs[0].target))
                if add is not None or (p is not None and p.numel() == 1):
                    return self.scale_shift(x, str(attrs[0].target), str(add[1].target) if add else None,
                                            add[0] if add else None, op, path)
            target = viewed.target if isinstance(viewed, _ChannelParam) else str(attrs[0].target)
            owner, leaf, f = scale_param(self.b.state, target, len(attrs), x, op, path,
                                         isinstance(viewed, _ChannelParam) and not viewed.as_is)
            return self.b.emit("layer_scale", owner, [x], x.shape, nhwc=x.nhwc, tokens=x.tokens, params=[leaf], **f)
        # an expansion is only the broadcast the service's mul does: the other
        # factor must be a map of the expanded shape
        v0, v1 = (self.vals.get(v) if isinstance(v, torch.fx.Node) else None for v in (a0, a1))
        bc, other = (v0, v1) if isinstance(v0, _Broadcast) else (v1, v0)
        if isinstance(bc, _Broadcast):
            if not isinstance(other, _Val) or other.shape != bc.shape:
                raise ExportError(f"multiplies a [C,1,1] map expanded to {list(bc.shape)} by a tensor of another "
                                  "shape or kind; supported is the expansion times a map of that shape", op=op,
                                  module_path=path)
            a, c = other, bc.x
        else:
            a, c = self.val(a0, n), self.val(a1, n)
        if len(c.shape) == 3 and len(a.shape) == 3 and a.shape[1:] == (1, 1) and c.shape[1:] != (1, 1):
            a, c = c, a  # the service's mul takes the full map first, the [C,1,1] scale second
        ok = a.shape == c.shape or (len(a.shape) == 3 and c.shape == (a.shape[0], 1, 1) and not a.nhwc)
        # two channels-last views of maps of one shape multiply as the maps do
        if not ok or a.nhwc != c.nhwc or a.tokens != c.tokens or a.ct or c.ct:
            raise ExportError(f"multiplies tensors of shapes {list(a.shape)} and {list(c.shape)}{_layouts(a, c)}; "
                              "supported are equal shapes and a [C,H,W] map times a [C,1,1] one", op=op,
                              module_path=path)
        return self.b.emit("mul", self.fname(n, "mul"), [a, c], a.shape, nhwc=a.nhwc, tokens=a.tokens)


def _layouts(a: _Val, c: _Val) -> str:
    """What a refusal of two operands says of their layouts where they
    differ: torch would broadcast a channels-last [N, H, W, C] against an
    NCHW one along other dimensions than the channels."""
    if a.nhwc == c.nhwc:
        return ""
    return f" ({'the first' if a.nhwc else 'the second'} channels-last, the other not)"


# ---- the public functions -------------------------------------------------------------------

# Why softmax has no layer: the service trains with cross-entropy on the
# model's output, and on probabilities that is another loss than the one a
# script ending in softmax trains with (nn.CrossEntropyLoss on them, or
# NLLLoss on their log).
_SOFTMAX_REFUSAL = ("softmax is not supported: the service trains with cross-entropy on the model's output; return "
                    "the logits (nn.CrossEntropyLoss) or log_softmax (nn.NLLLoss) instead")

_KNOWN_MODULES = (*MODULE_ACTIVATIONS, nn.Conv2d, nn.ConvTranspose2d, nn.BatchNorm2d, nn.BatchNorm1d, nn.GroupNorm,
                  nn.InstanceNorm2d, nn.Upsample, nn.UpsamplingNearest2d, nn.UpsamplingBilinear2d, nn.MaxPool2d,
                  nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d, nn.Linear, nn.Conv1d, nn.Dropout,
                  nn.Dropout2d, nn.LogSoftmax, nn.Softmax, nn.Flatten, nn.LayerNorm, nn.Identity, nn.MultiheadAttention,
                  nn.ChannelShuffle, nn.Hardtanh, nn.PixelShuffle, nn.PixelUnshuffle, nn.PReLU, *PAD_MODULES)


def _refuse_unknown_modules(gm: torch.fx.GraphModule) -> None:
    """Refuses a leaf module without a layer kind before anything runs it
    (an LSTM given an image batch would fail with its own message)."""
    for n in gm.graph.nodes:
        if n.op != "call_module":
            continue
        mod = gm.get_submodule(str(n.target))
        if type(mod) in _KNOWN_MODULES or (type(mod).__module__, type(mod).__name__) in LEAF_NAMES:
            continue
        raise ExportError("has no layer kind in the service", op=_op_name(n, mod), module_path=str(n.target),
                          supported=_supported_modules())


def _as_batch(example_input: Union[torch.Tensor, Sequence[int]]) -> torch.Tensor:
    if not isinstance(example_input, torch.Tensor):
        example_input = torch.zeros(tuple(int(d) for d in example_input))
    if example_input.dim() == 3:
        example_input = example_input.unsqueeze(0)
    if example_input.dim() != 4:
        raise ExportError(f"example_input must be [C,H,W] or [N,C,H,W], not {list(example_input.shape)}")
    return example_input.float()


def convert(module: nn.Module, example_input: Union[torch.Tensor, Sequence[int]]) -> ExportedModel:
    """Traces ``module`` and returns its model spec and its tensors, or
    raises :class:`ExportError`. ``example_input`` is a tensor [N,C,H,W] (or
    [C,H,W], or that shape as a tuple): it fixes the input size of the model.

    The module is traced in training mode (the graph the service trains)
    and its shapes are taken from one forward pass in eval mode under
    no_grad, which leaves batchnorm's running statistics as they are; each
    submodule's mode is restored afterwards. So are its buffers: a
    forward() that calls F.batch_norm(training=True) itself (timm's
    BatchNormAct2d) has that baked into the training-mode trace, whose runs
    here would otherwise move the running statistics and count
    num_batches_tracked up."""
    x = _as_batch(example_input)
    modes = {m: m.training for m in module.modules()}
    buffers = {name: b.detach().clone() for name, b in module.named_buffers()}
    try:
        module.train()
        try:
            graph = Tracer(x).trace(module)
        except Exception as e:  # torch.fx reports data-dependent control flow and the like
            raise ExportError(f"torch.fx cannot trace the module: {e}", op="torch.fx.symbolic_trace",
                              module_path=getattr(e, "module_path", "")) from e
        required = [n for n in graph.nodes if n.op == "placeholder" and not n.args]  # no default
        if len(required) != 1:
            raise ExportError(f"forward() takes {len(required)} inputs without a default; the service feeds one "
                              "image batch", op="forward", module_path="")
        gm = torch.fx.GraphModule(module, graph)
        _refuse_unknown_modules(gm)
        module.eval()
        with torch.no_grad(), torch.random.fork_rng(devices=[]):  # the caller's random state stays
            try:
                propagate(gm, x)
            except Exception as e:
                raise forward_failed(e, list(x.shape)) from e
            check_trace(module, lambda: Tracer(x), x)
        fold_shape_numbers(gm)
        conv = _Converter(module, gm)
        spec = conv.run()
    finally:
        for m, was in modes.items():
            m.training = was
        with torch.no_grad():
            for name, b in module.named_buffers():
                if name in buffers:
                    b.copy_(buffers[name])
    tensors: Dict[str, torch.Tensor] = {}
    for key, t in conv.b.state.items():
        want = torch.int64 if key.endswith(".num_batches_tracked") else torch.float32
        if t.dtype != want:
            raise ExportError(f"{key} is {t.dtype}; the service holds float32 parameters (call module.float() "
                              "before exporting)", op="state_dict", module_path=key.rsplit(".", 1)[0])
        tensors[key] = t.detach().to("cpu").contiguous().clone()
    return ExportedModel(spec, tensors)


def export_model(module: nn.Module, example_input: Union[torch.Tensor, Sequence[int]], out_dir: Union[str, Path],
                 *, recipe: Optional[str] = "imagenet", optimizer: Optional[str] = None,
                 config: Optional[Dict[str, Any]] = None, overwrite: bool = False) -> ExportedModel:
    """Writes ``out_dir/config.json`` (for ``streamfeed --config``: model.spec,
    model.init_from naming the weights by absolute path, and the recipe's
    options) and ``out_dir/init.safetensors`` (the module's state_dict).

    recipe: ``"imagenet"`` adds :func:`imagenet_recipe` for a 3-channel
    input (the service has no recipe of its own for a model.spec model), or
    None for none. optimizer: ``"adamw"`` or ``"sgd"`` writes that optimizer
    at torch.optim's defaults (:func:`optimizer_recipe`); None leaves the
    service's optim options as they are. config: more options by section,
    e.g. ``{"optim": {"lr": 3e-4}}``; they win over the recipe and the
    optimizer.

    Both files are written into a temporary directory beside out_dir that
    is renamed to out_dir at the end, so a refused or failed export leaves
    nothing, and an existing out_dir is replaced only with overwrite=True."""
    from safetensors.torch import save_file

    out = Path(out_dir).resolve()
    if out.exists() and not overwrite:
        raise ExportError(f"{out} exists (pass overwrite=True, or --overwrite, to replace it)")
    if optimizer is not None:
        optimizer_recipe(optimizer)  # refused before anything is traced or written
    exported = convert(module, example_input)
    spec = exported.spec
    cfg: Dict[str, Any] = {"model": {"spec": spec, "init_from": str(out / WEIGHTS_FILE)}}
    if recipe == "imagenet" and spec["input"][0] == 3:
        _merge(cfg, imagenet_recipe((spec["input"][1], spec["input"][2])))
    elif recipe not in (None, "imagenet"):
        raise ExportError(f"recipe {recipe!r}: known are 'imagenet' and None")
    if optimizer is not None:
        _merge(cfg, optimizer_recipe(optimizer))
    if config:
        _merge(cfg, config)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        save_file(exported.tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        (tmp / CONFIG_FILE).write_text(json.dumps(cfg, indent=1) + "\n")
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
            os.replace(out, old / out.name)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return exported


# ---- the command ------------------------------------------------------------------------------


def _factory(ref: str) -> Callable[..., nn.Module]:
    mod_name, _, attr = ref.partition(":")
    if not mod_name or not attr:
        raise SystemExit(f"MODULE:FACTORY expected (e.g. torchvision.models:resnet50), not {ref!r}")
    obj: Any = importlib.import_module(mod_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise SystemExit(f"{ref} is not callable")
    return obj  # type: ignore[no-any-return]


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m streamfeed.export",
                                 description="Export a PyTorch module for `streamfeed --config DIR/config.json`.")
    ap.add_argument("factory", metavar="MODULE:FACTORY", help="e.g. torchvision.models:efficientnet_b0")
    ap.add_argument("--kwargs", default="{}", help="JSON object of the factory's keyword arguments")
    ap.add_argument("--input", required=True, help="C,H,W of one input image, e.g. 3,224,224")
    ap.add_argument("--out", required=True, help="directory to write config.json and init.safetensors into")
    ap.add_argument("--recipe", choices=["imagenet", "none"], default="imagenet",
                    help="augmentation options to write (imagenet: torchvision's classification recipe)")
    ap.add_argument("--optimizer", choices=sorted(_OPTIMIZERS), default=None,
                    help="write this optimizer at torch.optim's defaults (adamw: lr 1e-3, weight_decay 0.01)")
    ap.add_argument("--config", default="{}", help='JSON object of more options by section, e.g. {"optim":{"lr":0.1}}')
    ap.add_argument("--overwrite", action="store_true", help="replace DIR if it exists")
    a = ap.parse_args(argv)
    try:
        kwargs = json.loads(a.kwargs)
        extra = json.loads(a.config)
        shape = tuple(int(v) for v in a.input.split(","))
    except ValueError as e:
        ap.error(str(e))
    if len(shape) != 3 or not isinstance(kwargs, dict) or not isinstance(extra, dict):
        ap.error("--input is C,H,W; --kwargs and --config are JSON objects")
    model = _factory(a.factory)(**kwargs)
    try:
        ex = export_model(model, shape, a.out, recipe=None if a.recipe == "none" else a.recipe,
                          optimizer=a.optimizer, config=extra, overwrite=a.overwrite)
    except ExportError as e:
        print(f"streamfeed.export: {e}", file=sys.stderr)
        return 2
    n = sum(t.numel() for k, t in ex.tensors.items() if not k.endswith("num_batches_tracked"))
    print(f"{Path(a.out) / CONFIG_FILE}: {len(ex.spec['layers'])} layers, {ex.spec['classes']} classes, "
          f"{n} parameters and buffers; run: streamfeed --config {Path(a.out) / CONFIG_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
