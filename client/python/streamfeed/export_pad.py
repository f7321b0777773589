"""How streamfeed.export maps padding of a map's height and width
(``nn.ZeroPad2d``, ``nn.ConstantPad2d``, ``nn.ReflectionPad2d``,
``nn.ReplicationPad2d``, ``nn.CircularPad2d``, ``F.pad`` in modes constant,
reflect, replicate and circular on a 4-D input):

- zero padding that only one ``nn.Conv2d`` reads folds into that
  convolution's ``pad`` where the sums pad each axis evenly (the conv2d kind
  pads [h, w] on both sides): no layer, and the convolution costs no more;
- any other padding is one ``pad`` layer (fields ``pad`` = [left, right,
  top, bottom], ``mode``, ``value``), asymmetric zero padding before a
  convolution among it (TensorFlow's "same"), the convolution keeping its
  own padding.

A ``Conv2d``'s own padding goes the same way (conv_pads): with
``padding_mode`` reflect, replicate or circular it is a pad layer of that
mode named ``<conv path>.pad`` before the convolution, which then pads
nothing; ``padding="same"`` whose total per axis is odd (an even kernel, or
a dilation) pads one more on the right and bottom, as PyTorch does, so the
convolution pads the smaller side and a zero pad layer adds the rest.

Refused, naming the op, the module path and why: pads of other than the
last two dimensions, negative pads (crops), pads or values not known at
export, a value that is not a finite float32 number, and the bounds of the
modes (which PyTorch refuses too), and 3-D and 5-D padding (no map)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from .export_error import ExportError
from .export_values import _Padded, _Val

__all__ = ["PAD_MODULES", "PadSpec", "is_pad", "pad_spec", "pad_input", "folds_into_conv", "conv_sides", "conv_pads",
           "emit_pad", "pads_nothing"]

# The padding modules by class (subclasses are not these), with their mode;
# nn.CircularPad2d where the installed torch has it (2.1 and later).
PAD_MODULES: Dict[type, str] = {nn.ZeroPad2d: "constant", nn.ConstantPad2d: "constant",
                                nn.ReflectionPad2d: "reflect", nn.ReplicationPad2d: "replicate"}
if hasattr(nn, "CircularPad2d"):
    PAD_MODULES[getattr(nn, "CircularPad2d")] = "circular"
_MODES = ("constant", "reflect", "replicate", "circular")
# The largest pad on one side the pad kind takes (SF_MAX_PAD of gpu/model.h),
# and float32's largest finite value (the service holds the value so).
_MAX_PAD = 1024
# The widest padding a conv2d layer takes on a side (SF_MAX_KERNEL of
# gpu/layers.h); a convolution that pads more exports as a zero pad layer
# before an unpadded conv2d.
_MAX_CONV_PAD = 64
_FLT_MAX = 3.4028234663852886e38
_SUPPORTED = ("supported are F.pad of the height and width of a [N, C, H, W] map (2 or 4 pads, each in "
              f"[0, {_MAX_PAD}]) and the *Pad2d modules")


@dataclass(frozen=True)
class PadSpec:
    """A padding's (left, right, top, bottom) as PyTorch orders them, its
    mode and its value (mode constant)."""
    sides: Tuple[int, int, int, int]
    mode: str
    value: float


def is_pad(n: torch.fx.Node, mod: Optional[nn.Module]) -> bool:
    """Whether n pads: a padding module's call, or F.pad."""
    if n.op == "call_module":
        return type(mod) in PAD_MODULES
    return n.op == "call_function" and n.target is F.pad


def _pad_args(n: torch.fx.Node, mod: Optional[nn.Module]) -> Tuple[Any, Any, Any]:
    """(pads, mode, value) of a padding module or an F.pad call."""
    if mod is not None:
        return getattr(mod, "padding"), PAD_MODULES[type(mod)], getattr(mod, "value", 0.0)

    def arg(i: int, kw: str, default: Any) -> Any:
        return n.args[i] if len(n.args) > i else n.kwargs.get(kw, default)
    value = arg(3, "value", None)
    return arg(1, "pad", None), arg(2, "mode", "constant"), 0.0 if value is None else value


def pads_nothing(n: torch.fx.Node, mod: Optional[nn.Module]) -> bool:
    """Whether a padding adds nothing on any side of any dimension (Swin's
    and EfficientViT's F.pad of a window size that already divides the
    map): the identity, whatever tensor it pads."""
    pads = _pad_args(n, mod)[0]
    pads = pads if isinstance(pads, (tuple, list)) else [pads]
    return all(_number(p) and p == 0 for p in pads)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, (bool, torch.fx.Node))


def pad_spec(n: torch.fx.Node, mod: Optional[nn.Module], op: str, path: str) -> PadSpec:
    """What a padding does, or a refusal naming what it is instead."""
    pads, mode, value = _pad_args(n, mod)
    if mode not in _MODES:
        raise ExportError(f"pads in mode {mode!r}; the pad kind's modes are {', '.join(_MODES)}", op=op,
                          module_path=path)
    if not _number(value) or not math.isfinite(float(value)) or abs(float(value)) > _FLT_MAX:
        raise ExportError(f"pads with the value {value!r}, which is not a finite float32 number known at export",
                          op=op, module_path=path)
    if not isinstance(pads, (tuple, list)) or not all(isinstance(p, int) and not isinstance(p, bool)
                                                      for p in pads):
        raise ExportError(f"pads by {pads!r}, which are not numbers known at export (computed in forward()); "
                          f"{_SUPPORTED}", op=op, module_path=path)
    if len(pads) not in (2, 4):
        raise ExportError(f"pads {tuple(pads)} pad dimensions other than the height and width of the map; "
                          f"{_SUPPORTED}", op=op, module_path=path)
    left, right, top, bottom = (tuple(pads) + (0, 0))[:4]
    sides = (left, right, top, bottom)
    if min(sides) < 0:
        raise ExportError(f"pads (left, right, top, bottom) = {sides}: a negative pad crops the map, and the "
                          f"service has no crop; {_SUPPORTED}", op=op, module_path=path)
    if max(sides) > _MAX_PAD:
        raise ExportError(f"pads (left, right, top, bottom) = {sides}; {_SUPPORTED}", op=op, module_path=path)
    return PadSpec(sides, str(mode), float(value))


def pad_input(x: _Val, op: str, path: str) -> None:
    """Refuses padding of a tensor that is not a [N, C, H, W] map (3-D and
    5-D padding, a padded sequence)."""
    if len(x.shape) != 3:
        raise ExportError(f"pads a tensor of shape [N, {', '.join(map(str, x.shape))}]; the pad kind pads the height "
                          "and width of a [N, C, H, W] map (3-D and 5-D padding have no layer kind)", op=op,
                          module_path=path)


def folds_into_conv(spec: PadSpec, n: torch.fx.Node, gm: torch.fx.GraphModule) -> bool:
    """Whether the padding n is zeros that one nn.Conv2d alone reads, as its
    input: the convolution may then pad by that much more (fold_pad)."""
    users = list(n.users)
    return spec.mode == "constant" and spec.value == 0 and len(users) == 1 and users[0].op == "call_module" and \
        list(users[0].args) == [n] and type(gm.get_submodule(str(users[0].target))) is nn.Conv2d


def _two(v: Any) -> Tuple[int, int]:
    """An int or an (h, w) pair, as a pair."""
    return (int(v[0]), int(v[1])) if isinstance(v, (tuple, list)) else (int(v), int(v))


def conv_sides(mod: nn.Conv2d) -> Tuple[int, int, int, int]:
    """A Conv2d's own padding as (left, right, top, bottom), as PyTorch
    pads: "valid" none; "same" dilation * (kernel - 1) an axis, total // 2
    on the left (top) and the rest on the right (bottom), which F.conv2d's
    "same" and a padding_mode's F.pad both do; a number or (h, w) on both
    sides."""
    k, d = _two(mod.kernel_size), _two(mod.dilation)
    if mod.padding == "valid":
        return 0, 0, 0, 0
    if mod.padding == "same":
        th, tw = d[0] * (k[0] - 1), d[1] * (k[1] - 1)
        return tw // 2, tw - tw // 2, th // 2, th - th // 2
    h, w = _two(mod.padding)
    return w, w, h, h


def conv_pads(b: Any, x: _Val, mod: nn.Conv2d, padded: Optional[_Padded], op: str, path: str) -> \
        Tuple[_Val, Tuple[int, int]]:
    """The input of the nn.Conv2d mod at path after the pad layers its
    padding needs (emitted by the converter's builder b), and the conv2d
    layer's own pad [h, w]. x is the convolution's input, or padded's input
    where zero padding feeds it (folds_into_conv).

    The conv2d kind pads each axis by one amount on both sides, with zeros.
    A padding_mode other than zeros is a pad layer of that mode, named
    <path>.pad so that the convolution keeps its own name and parameters,
    and the convolution pads nothing; zero padding before it stays a layer
    of its own. With zeros, the padding before it and the convolution's own
    add up: where each axis then pads evenly, the sum is the conv's pad and
    there is no layer; else the conv keeps the even part of its own padding
    (an odd "same" pads one more on the right) and one zero pad layer adds
    the rest, named as the padding before it or else <path>.pad. Padding
    wider than a conv2d layer takes (_MAX_CONV_PAD) is all a pad layer."""
    own = conv_sides(mod)
    mine = _Padded(x, own, op, path, f"{path}.pad", True)
    if mod.padding_mode != "zeros":
        if padded is not None:
            x = emit_pad(b, x, PadSpec(padded.sides, "constant", 0.0), padded)
        if any(own):
            x = emit_pad(b, x, PadSpec(own, str(mod.padding_mode), 0.0), mine)
        return x, (0, 0)
    before = padded.sides if padded is not None else (0, 0, 0, 0)
    left, right, top, bottom = (a + c for a, c in zip(own, before))
    if max(own) > _MAX_CONV_PAD or (max(left, top) > _MAX_CONV_PAD and left == right and top == bottom):
        # wider than the conv2d kind pads: all of it is one zero pad layer
        return emit_pad(b, x, PadSpec((left, right, top, bottom), "constant", 0.0), padded or mine), (0, 0)
    if left == right and top == bottom:
        return x, (top, left)
    h, w = min(own[2], own[3]), min(own[0], own[1])
    rest = (left - w, right - w, top - h, bottom - h)
    return emit_pad(b, x, PadSpec(rest, "constant", 0.0), padded or mine), (h, w)


def emit_pad(b: Any, x: _Val, spec: PadSpec, where: _Padded) -> _Val:
    """A pad layer of spec on the [C,H,W] map x, emitted by the converter's
    builder b under where's name, or a refusal naming where's op and path
    where the mode cannot pad that far (PyTorch refuses the same)."""
    c, h, w = x.shape
    left, right, top, bottom = spec.sides
    for p, dim, axis in ((left, w, "width"), (right, w, "width"), (top, h, "height"), (bottom, h, "height")):
        if (spec.mode == "reflect" and p >= dim) or (spec.mode == "circular" and p > dim):
            raise ExportError(f"pads (left, right, top, bottom) = {spec.sides} in mode {spec.mode} a map of "
                              f"{axis} {dim}: reflect needs each pad below its axis's size, circular at most "
                              "its size", op=where.op, module_path=where.path)
    fields: Dict[str, Any] = {"pad": list(spec.sides), "mode": spec.mode}
    if spec.value != 0:
        fields["value"] = spec.value
    out: _Val = b.emit("pad", where.name, [x], (c, h + top + bottom, w + left + right), generated=where.generated,
                       **fields)
    return out
