"""F.conv2d, F.linear, F.layer_norm, F.batch_norm and F.prelu of a module's
own parameters, and a parameter scaling channels (layer_scale), for the
exporter.

A module of the user's own that holds ``weight`` (and ``bias``) as
nn.Conv2d or nn.Linear would, and calls ``F.conv2d(x, self.weight,
self.bias, ...)`` or ``F.linear(x, self.weight, self.bias)`` in its
forward(), is the service's conv2d or linear layer named by that module:
its state_dict keys are then ``<module>.weight`` and ``<module>.bias``,
exactly the layer's, so a checkpoint loads back with
``load_state_dict(strict=True)``. The call is described by the attributes
of nn.Conv2d / nn.Linear the converter reads of a module (ConvCall,
LinearCall), taken from the weight's shape and the call's arguments.

Anything else is refused naming the op and module path: a weight that is
computed (weight standardisation, a scaled or transposed parameter), a
parameter named otherwise or held by another module (the service names a
layer's parameters <layer>.weight and <layer>.bias), a buffer (the service
would train it), or a stride, padding, dilation or group count computed
from tensors.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple, Union

import torch
import torch.fx

from .export_attention import SUFFIX_MAX
from .export_error import ExportError
from .export_values import _ChannelParam

Arg = Callable[[int, str, Any], Any]


@dataclass
class ConvCall:
    """The nn.Conv2d attributes the converter's conv2d reads."""
    in_channels: int
    out_channels: int
    kernel_size: Tuple[int, int]
    stride: Any
    padding: Union[str, Any]
    dilation: Any
    groups: int
    bias: Optional[torch.Tensor]
    padding_mode: str = "zeros"


@dataclass
class LinearCall:
    """The nn.Linear attributes the converter's linear reads."""
    in_features: int
    out_features: int
    bias: Optional[torch.Tensor]


@dataclass
class LayerNormCall:
    """The nn.LayerNorm attributes the converter's layernorm reads."""
    normalized_shape: Tuple[int, ...]
    eps: float
    elementwise_affine: bool
    bias: Optional[torch.Tensor]


def _owned(module: torch.nn.Module, w: Any, bias: Any, op: str, path: str, like: str) -> \
        Tuple[str, torch.Tensor, Optional[torch.Tensor]]:
    """The module path that owns the parameters w (named weight) and bias
    (None, or the same module's parameter named bias), and the two tensors."""
    params = dict(module.named_parameters())
    target = str(w.target) if isinstance(w, torch.fx.Node) and w.op == "get_attr" else ""
    owner, _, leaf = target.rpartition(".")
    weight = params.get(target)
    if weight is None or leaf != "weight" or not owner:
        what = (f"the buffer {target}" if target and target in dict(module.named_buffers()) else
                f"the top-level module's own parameter {target}" if weight is not None and not owner else
                f"the parameter {target}" if weight is not None else
                f"the module tensor {target}" if target else "a computed weight")
        raise ExportError(f"takes {what}; supported is a parameter named weight held by a submodule, with its "
                          f"bias None or that submodule's parameter named bias, as {like} holds them (the layer "
                          "is named by that submodule, its parameters <submodule>.weight and .bias)",
                          op=op, module_path=path)
    b: Optional[torch.Tensor] = None
    if bias is not None:
        bt = str(bias.target) if isinstance(bias, torch.fx.Node) and bias.op == "get_attr" else ""
        b = params.get(bt)
        if b is None or bt != f"{owner}.bias":
            raise ExportError(f"takes the bias {bt or 'computed from tensors'} with the weight {target}; supported "
                              f"is {owner}.bias, a parameter, or None", op=op, module_path=path)
    return owner, weight, b


def _number(v: Any, what: str, op: str, path: str) -> Any:
    if isinstance(v, torch.fx.Node) or (isinstance(v, (list, tuple)) and
                                        any(isinstance(e, torch.fx.Node) for e in v)):
        raise ExportError(f"takes a computed {what}; the service's conv2d takes numbers", op=op, module_path=path)
    return tuple(v) if isinstance(v, list) else v


def conv_call(module: torch.nn.Module, arg: Arg, op: str, path: str) -> Tuple[str, ConvCall]:
    """F.conv2d(input, weight, bias, stride, padding, dilation, groups):
    the owning module's path and the call as nn.Conv2d attributes."""
    owner, w, b = _owned(module, arg(1, "weight", None), arg(2, "bias", None), op, path, "nn.Conv2d")
    if w.dim() != 4:
        raise ExportError(f"takes a {w.dim()}-d weight; conv2d's is [out, in/groups, kh, kw]", op=op,
                          module_path=path)
    groups = int(_number(arg(6, "groups", 1), "group count", op, path))
    return owner, ConvCall(in_channels=int(w.shape[1]) * groups, out_channels=int(w.shape[0]),
                           kernel_size=(int(w.shape[2]), int(w.shape[3])),
                           stride=_number(arg(3, "stride", 1), "stride", op, path),
                           padding=_number(arg(4, "padding", 0), "padding", op, path),
                           dilation=_number(arg(5, "dilation", 1), "dilation", op, path), groups=groups, bias=b)


def linear_call(module: torch.nn.Module, arg: Arg, op: str, path: str) -> Tuple[str, LinearCall]:
    """F.linear(input, weight, bias): the owning module's path and the call
    as nn.Linear attributes."""
    owner, w, b = _owned(module, arg(1, "weight", None), arg(2, "bias", None), op, path, "nn.Linear")
    if w.dim() != 2:
        raise ExportError(f"takes a {w.dim()}-d weight; linear's is [out, in]", op=op, module_path=path)
    return owner, LinearCall(in_features=int(w.shape[1]), out_features=int(w.shape[0]), bias=b)


def layer_norm_call(module: torch.nn.Module, arg: Arg, op: str, path: str) -> Tuple[str, LayerNormCall]:
    """F.layer_norm(input, normalized_shape, weight, bias, eps) of a
    module's own weight and bias, or weight alone (timm's LayerNorm, an
    nn.LayerNorm subclass calling it; its LayerNorm2dNoBias): the owning
    module's path and the call as nn.LayerNorm attributes."""
    shape = _number(arg(1, "normalized_shape", None), "normalized_shape", op, path)
    shape = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
    w, b = arg(2, "weight", None), arg(3, "bias", None)
    if w is None:
        raise ExportError("has no weight; the service's layernorm has one (and a bias or none)", op=op,
                          module_path=path)
    owner, _, bias = _owned(module, w, b, op, path, "nn.LayerNorm")
    eps = float(_number(arg(4, "eps", 1e-5), "eps", op, path))
    return owner, LayerNormCall(normalized_shape=shape, eps=eps, elementwise_affine=True, bias=bias)


@dataclass
class BatchNormCall:
    """The nn.BatchNorm2d attributes the converter's batchnorm2d reads."""
    affine: bool
    track_running_stats: bool
    momentum: float
    eps: float


def batch_norm_call(module: torch.nn.Module, arg: Arg, op: str, path: str, x: Any) -> Tuple[str, BatchNormCall]:
    """F.batch_norm(input, running_mean, running_var, weight, bias, training,
    momentum, eps) of a batchnorm module's own tensors: what timm's
    BatchNormAct2d (an nn.BatchNorm2d subclass whose forward() calls it, then
    its activation) and modules written like it do. The owning module's path
    and the call as nn.BatchNorm2d attributes; the module's
    ``num_batches_tracked.add_(1)`` feeds no output and is the count the
    service keeps under that name anyway. x: the input's value, which must
    be a [C,H,W] map."""
    if not x.plain(3):
        raise ExportError(f"normalises a tensor of per-sample shape {list(x.shape)}"
                          f"{' held channels-last' if x.nhwc else ''}; supported is a [C,H,W] map", op=op,
                          module_path=path)
    names = ("running_mean", "running_var", "weight", "bias")
    given = [arg(i + 1, k, None) for i, k in enumerate(names)]
    targets = [str(v.target) if isinstance(v, torch.fx.Node) and v.op == "get_attr" else "" for v in given]
    owner = targets[0].rpartition(".")[0]
    mod = module.get_submodule(owner) if owner and all(targets) else None
    if not isinstance(mod, torch.nn.modules.batchnorm._BatchNorm) or \
            targets != [f"{owner}.{k}" for k in names] or not mod.affine or not mod.track_running_stats:
        shown = ", ".join(t or "computed" if v is not None else "None" for t, v in zip(targets, given))
        raise ExportError(f"takes ({shown}) as running_mean, running_var, weight and bias; supported are the "
                          "four of one nn.BatchNorm2d (or subclass, as timm's BatchNormAct2d) with affine=True and "
                          "track_running_stats=True, under their own names (the layer is named by that module)",
                          op=op, module_path=path)
    training = arg(5, "training", False)
    if training is not True:
        raise ExportError(f"runs with training={training!r} in a training-mode trace: it normalises by the running "
                          "statistics while training (a frozen batchnorm); the service's batchnorm trains on the "
                          "batch's statistics", op=op, module_path=path)
    momentum = _number(arg(6, "momentum", 0.1), "momentum", op, path)
    eps = _number(arg(7, "eps", 1e-5), "eps", op, path)
    if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or isinstance(eps, bool) or \
            not isinstance(eps, (int, float)):
        raise ExportError(f"momentum {momentum!r} and eps {eps!r} must be numbers known at export (momentum=None, "
                          "a cumulative average, is not supported)", op=op, module_path=path)
    return owner, BatchNormCall(affine=True, track_running_stats=True, momentum=float(momentum), eps=float(eps))


def group_norm_call(module: torch.nn.Module, n: torch.fx.Node, arg: Arg, group: bool, op: str, path: str) -> \
        Tuple[Optional[str], int, float, bool]:
    """F.group_norm(x, G, weight, bias, eps) and F.instance_norm(x,
    running_mean, running_var, weight, bias, use_input_stats, momentum, eps):
    the submodule whose own weight and bias they take (timm's GroupNorm1, an
    nn.GroupNorm subclass calling it; its GroupNorm1NoBias, a weight alone;
    None without them), the group count (0: one a channel), eps, and
    whether a bias is taken. Running statistics are refused: the service's
    groupnorm keeps none."""
    w_at, b_at = (2, 3) if group else (3, 4)
    w, b = arg(w_at, "weight", None), arg(b_at, "bias", None)
    given = [k for i, k in ((1, "running_mean"), (2, "running_var")) if not group and arg(i, k, None) is not None]
    if not group and not arg(5, "use_input_stats", True):
        given.append("use_input_stats=False")
    if given:
        raise ExportError(f"is supported without {', '.join(given)} (the service's groupnorm keeps no running "
                          "statistics)", op=op, module_path=path)
    if w is None and b is not None:
        raise ExportError("takes a bias without a weight; the service's groupnorm has a weight and a bias, as "
                          "nn.GroupNorm and nn.InstanceNorm2d(affine=True) hold them, a weight alone, or neither",
                          op=op, module_path=path)
    owner = _owned(module, w, b, op, path, "nn.GroupNorm")[0] if w is not None else None
    eps, groups = arg(4 if group else 7, "eps", 1e-5), arg(1, "num_groups", None) if group else 0
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or isinstance(groups, bool) or \
            not isinstance(groups, int):
        raise ExportError(f"num_groups {groups!r} and eps {eps!r} must be numbers known at export", op=op,
                          module_path=path)
    return owner, groups, float(eps), b is not None


def prelu_call(state: Dict[str, torch.Tensor], arg: Arg, op: str, path: str) -> Tuple[str, int]:
    """F.prelu(x, self.weight) of a module's own 1-D tensor named weight
    (state: the module's state_dict): that module's path, whose prelu layer
    it is as nn.PReLU's, and the number of slopes."""
    w = arg(1, "weight", None)
    target = str(w.target) if isinstance(w, torch.fx.Node) and w.op == "get_attr" else ""
    p = state.get(target) if target else None
    owner, _, leaf = target.rpartition(".")
    if p is None or leaf != "weight" or p.dim() != 1:
        raise ExportError(f"takes the slopes {w!r}; supported is a module's 1-D parameter named weight "
                          "(as nn.PReLU holds it)", op=op, module_path=path)
    return owner, int(p.shape[0])


def channel_param(state: Dict[str, torch.Tensor], target: str, shape: Tuple[int, ...], op: str,
                  path: str) -> _ChannelParam:
    """A module's [C] parameter viewed as [1, C, 1, 1] or [C, 1, 1], as
    timm's ConvNeXt scales its blocks' output, or as [C] itself (timm's
    MetaFormer ``Scale`` on a channels-last map) or [1, 1, C] or [1, 1, 1, C]
    (the same broadcast along the last dimension): scale_param takes it at
    the mul. Any other view of a module tensor is refused."""
    p = state.get(target)
    if p is not None and p.dim() == 1 and tuple(shape) in tuple((1,) * k + tuple(p.shape) for k in (0, 2, 3)):
        return _ChannelParam(target, as_is=True)
    if p is None or p.dim() != 1 or tuple(shape) not in ((int(p.shape[0]), 1, 1), (1, int(p.shape[0]), 1, 1)):
        raise ExportError(f"views the module tensor {target} as {list(shape)}; supported is a [C] parameter viewed "
                          "as [1, C, 1, 1] that multiplies a map (timm's ConvNeXt: gamma.reshape(1, -1, 1, 1))",
                          op=op, module_path=path)
    return _ChannelParam(target)


def scale_param(state: Dict[str, Any], target: str, n_params: int, x: Any, op: str, path: str,
                viewed: bool = False) -> Tuple[str, str, Dict[str, Any]]:
    """A module parameter multiplying x channel by channel as the service's
    layer_scale: [C,1,1] times a [C,H,W] map (ConvNeXt's CNBlock), [C] times
    a channels-last map (ConvNeXt's original gamma: the layer's ``vector``)
    or a token sequence (timm's LayerScale), or viewed (channel_param) as
    [C,1,1] times a map (timm's ConvNeXt: ``vector`` too, as the parameter
    is [C]). Returns the layer's name (the
    submodule holding the parameter, or the parameter's whole key where that
    submodule holds other tensors directly), the parameter's own name (its
    ``param_names`` where it is not layer_scale; "" for the whole key) and the
    layer's fields."""
    p = state.get(target)
    owner, _, leaf = target.rpartition(".")
    ch = x.shape[-1] if x.tokens else x.shape[0]
    want = (ch,) if x.tokens or x.nhwc or viewed else (ch, 1, 1)
    if n_params != 1 or p is None or not owner or x.ct or (len(x.shape) != 3 and not x.tokens) or \
            tuple(p.shape) != want or len(leaf) > SUFFIX_MAX:
        raise ExportError(f"multiplies by the module tensor {target}; supported is a parameter of a submodule "
                          "scaling each channel: [C,1,1] times a [C,H,W] map (ConvNeXt's CNBlock), [C] times a "
                          "channels-last map or a token sequence (timm's LayerScale)", op=op, module_path=path)
    if viewed and (x.nhwc or x.tokens):
        raise ExportError(f"multiplies a {'channels-last map' if x.nhwc else 'token sequence'} by {target} viewed "
                          "as [1, C, 1, 1]; supported is that view times a [C,H,W] map", op=op, module_path=path)
    f: Dict[str, Any] = {"vector": True} if x.nhwc or viewed else {}
    if any(k != target and k.startswith(owner + ".") and "." not in k[len(owner) + 1:] for k in state):
        # The submodule holds other tensors of its own (ResMLP's block, ls1
        # and ls2): the layer is named by the parameter's whole key, which the
        # parameter keeps (param_names ""), so two such layers of one module
        # do not share a name.
        f["param_names"] = {"layer_scale": ""}
        return target, "", f
    if leaf != "layer_scale":
        f["param_names"] = {"layer_scale": leaf}
    return owner, leaf, f
