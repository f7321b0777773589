"""PyTorch idioms that streamfeed.export folds onto layer kinds the service
already has, with no layer of their own:

- zero padding (``nn.ZeroPad2d``, ``nn.ConstantPad2d(p, 0)``, ``F.pad`` in
  mode ``constant`` with value 0) that only one ``nn.Conv2d`` reads becomes
  part of that convolution's ``pad``, where the sums pad each axis evenly
  (the conv2d kind pads [h, w] on both sides);
- clamps that are activations (``torch.clamp``, ``torch.clip``,
  ``clamp_min``, ``clamp_max``, ``F.hardtanh``, ``nn.Hardtanh``, as
  functions, Tensor methods and in place): to [0, inf) a relu, to [0, 6] a
  relu6.

Each function reads one node of the traced graph and says what it becomes
or raises ExportError saying why it cannot; the converter (export.py) emits
the layers."""
from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from .export_error import ExportError
from .export_values import _Padded

__all__ = ["PAD_MODULES", "is_pad", "pad_sides", "check_pad_reader", "fold_pad", "clamp_activation"]

# The padding modules by class (subclasses are not these), with their mode.
# Only a constant zero padding folds; the others are named when refused.
PAD_MODULES: Dict[type, str] = {nn.ZeroPad2d: "constant", nn.ConstantPad2d: "constant",
                                nn.ReflectionPad2d: "reflect", nn.ReplicationPad2d: "replicate",
                                nn.CircularPad2d: "circular"}

# Where zero padding may go instead of a layer: the convolution's own
# padding, the only kind that pads before it computes.
_FOLDS_INTO = "zero padding folds into the padding of the one nn.Conv2d that alone reads it"


def is_pad(n: torch.fx.Node, mod: Optional[nn.Module]) -> bool:
    """Whether n pads: a padding module's call, or F.pad."""
    if n.op == "call_module":
        return type(mod) in PAD_MODULES
    return n.op == "call_function" and n.target is F.pad


def _pad_args(n: torch.fx.Node, mod: Optional[nn.Module]) -> Tuple[Any, str, Any]:
    """(pads, mode, value) of a padding module or an F.pad call."""
    if mod is not None:
        return getattr(mod, "padding"), PAD_MODULES[type(mod)], getattr(mod, "value", 0.0)

    def arg(i: int, kw: str, default: Any) -> Any:
        return n.args[i] if len(n.args) > i else n.kwargs.get(kw, default)
    value = arg(3, "value", None)
    return arg(1, "pad", None), arg(2, "mode", "constant"), 0.0 if value is None else value


def pad_sides(n: torch.fx.Node, mod: Optional[nn.Module], op: str, path: str) -> Tuple[int, int, int, int]:
    """The (left, right, top, bottom) of a zero padding of a map's height
    and width (PyTorch's order), or a refusal naming what it is instead."""
    pads, mode, value = _pad_args(n, mod)
    if mode != "constant":
        raise ExportError(f"{mode} padding has no layer kind yet (the service pads only with zeros, inside a "
                          f"convolution); {_FOLDS_INTO}", op=op, module_path=path)
    if isinstance(value, torch.fx.Node) or not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ExportError(f"pads with the value {value!r}, which is not a number known at export; {_FOLDS_INTO}",
                          op=op, module_path=path)
    if value != 0:
        raise ExportError(f"pads with the value {value!r}; the service's convolutions pad with zeros, and "
                          f"{_FOLDS_INTO}", op=op, module_path=path)
    if not isinstance(pads, (tuple, list)) or not all(isinstance(p, int) and not isinstance(p, bool)
                                                      for p in pads):
        raise ExportError(f"pads by {pads!r}, which are not numbers known at export (computed in forward()); "
                          f"{_FOLDS_INTO}", op=op, module_path=path)
    if len(pads) not in (2, 4):
        raise ExportError(f"pads {tuple(pads)} pad dimensions other than the height and width of the map; "
                          f"{_FOLDS_INTO}", op=op, module_path=path)
    left, right, top, bottom = (tuple(pads) + (0, 0))[:4]
    if min(left, right, top, bottom) < 0:
        raise ExportError(f"pads (left, right, top, bottom) = {(left, right, top, bottom)}: a negative pad crops "
                          f"the map, and the service has no crop; {_FOLDS_INTO}", op=op, module_path=path)
    return left, right, top, bottom


def _reader(u: torch.fx.Node, gm: torch.fx.GraphModule) -> str:
    if u.op == "call_module":
        return f"{type(gm.get_submodule(str(u.target))).__name__} at {str(u.target)!r}"
    name = str(u.target) if u.op == "call_method" else getattr(u.target, "__name__", str(u.target))
    return name if u.name == name else f"{name} ({u.name})"


def check_pad_reader(n: torch.fx.Node, gm: torch.fx.GraphModule, op: str, path: str) -> None:
    """Refuses the padding n, naming what reads it, unless one nn.Conv2d
    alone reads it, as its input."""
    users = list(n.users)
    if len(users) == 1 and users[0].op == "call_module" and list(users[0].args) == [n] and \
            type(gm.get_submodule(str(users[0].target))) is nn.Conv2d:
        return
    what = ", ".join(_reader(u, gm) for u in users[:4]) + (", ..." if len(users) > 4 else "")
    raise ExportError(f"its output is read by {what}; the service has no padding layer: {_FOLDS_INTO} (F.conv2d "
                      "has no layer kind)", op=op, module_path=path)


def fold_pad(padded: _Padded, conv: Tuple[int, int], conv_path: str) -> Tuple[int, int]:
    """The conv2d's pad [h, w] with the padding that feeds it added to the
    convolution's own (conv, [h, w] on each side). The kind pads each axis
    by one amount on both sides, so the sums must be even."""
    left, right, top, bottom = padded.sides
    h, w = conv
    total = (left + w, right + w, top + h, bottom + h)
    if total[0] != total[1] or total[2] != total[3]:
        own = f" with the Conv2d's own padding {list(conv)}" if conv != (0, 0) else ""
        raise ExportError(f"pads (left, right, top, bottom) = {padded.sides}, which{own} pads the input of the "
                          f"Conv2d at {conv_path!r} by {total}: the service's conv2d pads each axis by one amount "
                          "on both sides (pad [h, w]), so asymmetric padding (TensorFlow-style 'same' padding "
                          "among it) is not supported", op=padded.op, module_path=padded.path)
    return top + h, left + w


# The clamping functions of torch (call_function targets), and the
# parameters after the input of each spelling by name, positional order
# first (a Tensor method's too), with PyTorch's defaults.
_CLAMP_FUNCTIONS = {torch.clamp, torch.clamp_, torch.clip, torch.clip_, torch.clamp_min, torch.clamp_min_,
                    torch.clamp_max, torch.clamp_max_, F.hardtanh, F.hardtanh_}
_CLAMP_PARAMS: Dict[str, Tuple[Tuple[str, Optional[float]], ...]] = {
    "clamp": (("min", None), ("max", None)), "clip": (("min", None), ("max", None)),
    "clamp_min": (("min", None),), "clamp_max": (("max", None),),
    "hardtanh": (("min_val", -1.0), ("max_val", 1.0))}
# What a clamp maps onto, by its (lower, upper) bounds (None: unbounded).
_CLAMP_KINDS: Dict[Tuple[Optional[float], Optional[float]], str] = {(0.0, None): "relu", (0.0, 6.0): "relu6"}


def _clamp_spelling(n: torch.fx.Node, mod: Optional[nn.Module]) -> Optional[str]:
    """The spelling of a clamp, in place or not ("clamp_min" for
    x.clamp_min_(0)), or None where n does not clamp."""
    if n.op == "call_module":
        return "hardtanh" if type(mod) is nn.Hardtanh else None
    if n.op == "call_method":
        name = str(n.target)
    elif n.op == "call_function" and n.target in _CLAMP_FUNCTIONS:
        name = str(getattr(n.target, "__name__", ""))
    else:
        return None
    name = name[:-1] if name.endswith("_") else name
    return name if name in _CLAMP_PARAMS else None


def _bound(v: Any, what: str, op: str, path: str) -> Optional[float]:
    """A bound as a number, None where it bounds nothing (None, or an
    infinity on its own side)."""
    if v is None:
        return None
    if isinstance(v, torch.fx.Node) or not isinstance(v, (int, float)) or isinstance(v, bool):
        raise ExportError(f"clamps with the {what} bound {v!r}, which is not a number known at export; "
                          "clamp(min=0) and clamp(0, 6) map to relu and relu6", op=op, module_path=path)
    v = float(v)
    return None if math.isinf(v) and (v < 0) == (what == "lower") else v


def clamp_activation(n: torch.fx.Node, mod: Optional[nn.Module], op: str, path: str) -> Optional[str]:
    """The kind a clamp maps onto (relu: [0, inf), relu6: [0, 6]), None
    where n is not a clamp, or a refusal naming its bounds."""
    spelling = _clamp_spelling(n, mod)
    if spelling is None:
        return None
    given: Dict[str, Any] = {}
    for i, (name, default) in enumerate(_CLAMP_PARAMS[spelling]):
        given[name] = getattr(mod, name) if mod is not None else \
            n.args[1 + i] if len(n.args) > 1 + i else n.kwargs.get(name, default)
    lo = _bound(given.get("min", given.get("min_val")), "lower", op, path)
    hi = _bound(given.get("max", given.get("max_val")), "upper", op, path)
    kind = _CLAMP_KINDS.get((lo, hi))
    if kind is None:
        shown = f"[{'-inf' if lo is None else f'{lo:g}'}, {'inf' if hi is None else f'{hi:g}'}]"
        raise ExportError(f"clamp to {shown} has no layer kind; clamp(min=0) and clamp(0, 6) map to relu and "
                          "relu6", op=op, module_path=path)
    return kind
