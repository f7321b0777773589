"""How streamfeed.export maps a module's learnable affine, ``x * weight +
bias`` of one submodule's own parameters, onto the service's scale_shift
layer:

- ``self.scale * x + self.bias`` (and ``x * w + b``, either operand order of
  each) where the product's only reader is that add: timm's
  ``LearnableAffineBlock`` (HGNetV2, one value each, ``[1]``), or a per-channel
  weight and bias of a map (``[C,1,1]`` or ``[1,C,1,1]``), of each token
  (``[C]`` or ``[1,1,C]``) or of flat features (``[F]``);
- ``torch.addcmul(bias, weight, x)`` (either factor order, ``value`` 1):
  ResMLP's ``Affine`` (``[1,1,C]`` over tokens);
- a one-value parameter times x without an add: a scale_shift without a bias
  (a per-channel one is layer_scale, export_params.scale_param).

The layer is named by the submodule holding the parameters and keeps their
names (``param_names``) and shapes (its ``param_shape``), so the checkpoint
loads back with ``load_state_dict(strict=True)``. Refused, naming the op and
module path: parameters of two modules, weight and bias of different shapes,
and shapes that do not broadcast over x one value per channel (a ``[C]``
parameter times a [N,C,H,W] map scales its width in PyTorch, not its
channels)."""
from __future__ import annotations

import operator
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.fx

from .export_attention import SUFFIX_MAX
from .export_error import ExportError
from .export_nodes import _only_user
from .export_values import _Val

__all__ = ["scale_shift", "bias_of_product", "addcmul_operands"]

def _shape_field(shape: Tuple[int, ...], c: int, x: _Val) -> Optional[str]:
    """The shape field for a parameter of this shape scaling x: one value, or
    one per channel where PyTorch's broadcasting takes it per channel of x.
    None where it does not."""
    numel = 1
    for d in shape:
        numel *= d
    if numel == 1:  # [1], [1,1,1], [1,1,1,1]; a 0-dim parameter has no shape the service keeps
        return {1: "[C]", 3: "[C,1,1]", 4: "[1,C,1,1]"}.get(len(shape))
    if numel != c:
        return None
    if x.tokens or x.nhwc:  # channels last: the last dimension broadcasts
        return {(c,): "[C]", (1, 1, c): "[1,1,C]"}.get(shape)
    if len(x.shape) == 1:  # flat features [N, F]
        return "[C]" if shape == (c,) else None
    return {(c, 1, 1): "[C,1,1]", (1, c, 1, 1): "[1,C,1,1]"}.get(shape)


def scale_shift(state: Dict[str, Any], x: _Val, weight: str, bias: Optional[str], op: str,
                path: str) -> Tuple[str, List[str], Dict[str, Any]]:
    """The scale_shift layer of x * state[weight] (+ state[bias]): its name
    (the owning submodule), its parameters' names and its fields."""
    w, b = state.get(weight), state.get(bias) if bias else None
    owner, _, wleaf = weight.rpartition(".")
    bowner, _, bleaf = (bias or "").rpartition(".")
    c = x.shape[-1] if (x.tokens or x.nhwc or len(x.shape) == 1) else x.shape[0]
    what = f"{weight}" + (f" plus {bias}" if bias else "")
    if w is None or (bias and b is None) or not owner or (bias and bowner != owner) or x.ct:
        raise ExportError(f"scales by {what}; supported is x * weight + bias of one submodule's own parameters",
                          op=op, module_path=path)
    shape = _shape_field(tuple(w.shape), c, x)
    if shape is None or (b is not None and tuple(b.shape) != tuple(w.shape)):
        raise ExportError(f"scales a tensor of per-sample shape {list(x.shape)} by {weight} of shape "
                          f"{list(w.shape)}" + (f" and {bias} of shape {list(b.shape)}" if b is not None else "") +
                          "; supported are one value each ([1]), or one per channel of equal shapes: [C,1,1] or "
                          "[1,C,1,1] on a [C,H,W] map, [C] or [1,1,C] on tokens or a channels-last map, [F] on "
                          "features", op=op, module_path=path)
    if len(wleaf) > SUFFIX_MAX or len(bleaf) > SUFFIX_MAX:
        raise ExportError(f"the parameter names {wleaf!r}, {bleaf!r} are longer than the service keeps "
                          f"({SUFFIX_MAX} characters)", op=op, module_path=path)
    n = 1 if w.numel() == 1 else c
    f: Dict[str, Any] = {"num_parameters": n, "param_shape": shape}
    if bias is None:
        f["bias"] = False
    names = {k: v for k, v in (("weight", wleaf), ("bias", bleaf)) if v and v != k}
    if names:
        f["param_names"] = names
    return owner, [wleaf] + ([bleaf] if bias else []), f


def _is_add(n: torch.fx.Node) -> bool:
    if n.op == "call_function":
        return bool(n.target in (operator.add, torch.add) and len(n.args) == 2 and n.kwargs.get("alpha", 1) == 1)
    return n.op == "call_method" and n.target == "add" and len(n.args) == 2 and not n.kwargs


def bias_of_product(n: torch.fx.Node) -> Optional[Tuple[torch.fx.Node, torch.fx.Node]]:
    """For the product n of a parameter and x: its only reader when that adds
    one module tensor to it, with that tensor's get_attr node; else None."""
    u = _only_user(n)
    if u is None or not _is_add(u):
        return None
    other = u.args[1] if u.args[0] is n else u.args[0]
    if isinstance(other, torch.fx.Node) and other.op == "get_attr":
        return u, other
    return None


def addcmul_operands(n: torch.fx.Node, op: str, path: str) -> Tuple[torch.fx.Node, torch.fx.Node, Any]:
    """torch.addcmul(input, tensor1, tensor2, value=1) with input a module
    tensor and one factor too: (bias, weight, x)."""
    args = list(n.args) + [n.kwargs[k] for k in ("input", "tensor1", "tensor2") if k in n.kwargs]
    value = n.kwargs.get("value", 1)
    attrs = [a for a in args[1:3] if isinstance(a, torch.fx.Node) and a.op == "get_attr"]
    if len(args) != 3 or value != 1 or not isinstance(args[0], torch.fx.Node) or args[0].op != "get_attr" or \
            len(attrs) != 1:
        raise ExportError("supported is torch.addcmul(bias, weight, x) with value 1, bias and weight a module's "
                          "parameters (ResMLP's Affine)", op=op, module_path=path)
    x = args[2] if args[1] is attrs[0] else args[1]
    return args[0], attrs[0], x
