"""PyTorch idioms that streamfeed.export folds onto layer kinds the service
already has, with no layer of their own (zero padding that a convolution
folds in is export_pad.py's):

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

__all__ = ["clamp_activation"]

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
