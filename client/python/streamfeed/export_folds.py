"""PyTorch idioms that streamfeed.export maps onto layer kinds (zero
padding that a convolution folds in is export_pad.py's):

- clamps (``torch.clamp``, ``torch.clip``, ``clamp_min``, ``clamp_max``,
  ``F.hardtanh``, ``nn.Hardtanh``, as functions, Tensor methods and in
  place) with bounds that are Python numbers: to [0, inf) a relu, to [0, 6]
  a relu6 (the kinds the CUDA backend fuses into a batchnorm), to any other
  bounds a clamp layer whose gradient rule is the spelling's (hardtanh's
  for nn.Hardtanh and F.hardtanh, clamp's for the others: they differ at a
  NaN input, gpu/model.h's SF_CLAMP_GRAD_*). torch.clamp's own rule changed
  between PyTorch releases: 2.15 passes no gradient at a bound, as relu does
  at 0, and 2.11 passes it there; the exporter asks the torch it runs
  (torch_clamp_rule) and writes that rule, so a model trains as it does in
  the user's PyTorch. A clamp to [0, inf) or [0, 6] stays relu or relu6
  (fused into a batchnorm on the GPU) under either rule: under the closed
  one they differ from torch.clamp at inputs exactly 0 (and 6), which pass
  no gradient through relu and relu6.

Each function reads one node of the traced graph and says what it becomes
or raises ExportError saying why it cannot; the converter (export.py) emits
the layers."""
from __future__ import annotations

import functools
import math
import operator
from typing import Any, Dict, Optional, Tuple

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from .export_error import ExportError
from .export_supported import (FUNCTION_ACTIVATIONS, METHOD_ACTIVATIONS, MODULE_ACTIVATIONS, _act_fields,
                               _supported_functions)

__all__ = ["clamp_activation", "torch_clamp_rule", "module_activation", "function_activation"]

# The largest finite float32: the service stores a clamp's bounds as floats.
_FLT_MAX = 3.4028234663852886e38

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


@functools.lru_cache(maxsize=None)
def torch_clamp_rule() -> str:
    """The clamp layer's gradient rule that is torch.clamp's in this torch:
    "clamp" where its backward passes nothing at a bound (2.15), or
    "clamp_closed" where it passes the gradient there (2.11). Asked of
    autograd once: torch.clamp(x, 0, 1) at x = 0 and x = 1."""
    with torch.enable_grad():
        x = torch.tensor([0.0, 1.0], requires_grad=True)
        torch.autograd.backward(torch.clamp(x, 0.0, 1.0).sum())
    assert x.grad is not None
    return "clamp_closed" if bool((x.grad == 1.0).all()) else "clamp"


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
                          "the service's clamp layer takes Python numbers", op=op, module_path=path)
    b = float(v)
    if math.isinf(b) and (b < 0) == (what == "lower"):
        return None
    if not abs(b) <= _FLT_MAX:  # NaN, an infinity on the other side (every value clamped to it), past float32
        raise ExportError(f"clamps with the {what} bound {v!r}, which is not a finite float32 number; the "
                          "service's clamp layer takes finite bounds", op=op, module_path=path)
    return b


def clamp_activation(n: torch.fx.Node, mod: Optional[nn.Module], op: str,
                     path: str) -> Optional[Tuple[str, Dict[str, Any]]]:
    """The kind a clamp maps onto and its fields (relu: [0, inf), relu6:
    [0, 6], clamp with its bounds and rule otherwise), None where n is not a
    clamp, or a refusal naming its bounds and why."""
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
    if kind is not None:
        return kind, {}
    shown = f"[{'-inf' if lo is None else f'{lo:g}'}, {'inf' if hi is None else f'{hi:g}'}]"
    if lo is None and hi is None:
        raise ExportError(f"clamp to {shown} bounds nothing; the service's clamp layer needs a finite bound",
                          op=op, module_path=path)
    if lo is not None and hi is not None and lo > hi:
        raise ExportError(f"clamp to {shown} has its lower bound above its upper one (PyTorch then gives the "
                          "upper bound everywhere); the service's clamp layer needs min <= max", op=op,
                          module_path=path)
    fields: Dict[str, Any] = {} if lo is None else {"min": lo}
    if hi is not None:
        fields["max"] = hi
    fields["grad"] = "hardtanh" if spelling == "hardtanh" else torch_clamp_rule()
    return "clamp", fields


def module_activation(n: torch.fx.Node, mod: nn.Module, op: str, path: str) -> Optional[Tuple[str, Dict[str, Any]]]:
    """The activation kind an activation module's call maps onto (a clamp's
    by its bounds) and its fields read from the module; None for another
    module."""
    act, f = clamp_activation(n, mod, op, path) or (MODULE_ACTIVATIONS.get(type(mod)), None)
    if not act:
        return None
    return act, f if f is not None else _act_fields(act, lambda name, i, default: getattr(mod, name, default), op,
                                                    path)


def function_activation(n: torch.fx.Node, op: str, path: str) -> Optional[Tuple[str, Dict[str, Any]]]:
    """The activation kind an activation function's or Tensor method's call
    maps onto and its fields read from the call's arguments: a clamp's by
    its bounds, x ** 2 (operator.pow, torch.pow, Tensor.pow) as square, any
    other power refused; None for another call."""
    t, meth = n.target, str(n.target) if n.op == "call_method" else None

    def arg(i: int, kw: str, default: Any = None) -> Any:
        return n.args[i] if len(n.args) > i else n.kwargs.get(kw, default)
    if t in (operator.pow, torch.pow) or meth == "pow":
        e = arg(1, "exponent")
        if isinstance(e, bool) or not isinstance(e, (int, float)) or e != 2:
            raise ExportError(f"raises to the power {e!r}; supported is x ** 2 (square)", op=op, module_path=path,
                              supported=_supported_functions())
        return "square", {}
    kind, f = clamp_activation(n, None, op, path) or \
        ((FUNCTION_ACTIVATIONS.get(t) if n.op == "call_function" else METHOD_ACTIVATIONS.get(meth or "")), None)
    if not kind:
        return None
    return kind, f if f is not None else _act_fields(kind, lambda name, i, default: n.kwargs.get(name, default)
                                                     if i < 0 else arg(i, name, default), op, path)
