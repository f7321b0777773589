"""Arithmetic of one tensor with Python numbers as the service's ``affine``
layer (``scale * x + shift``): ``x * c``, ``c * x``, ``x / c``, ``x + c``,
``c + x``, ``x - c``, ``c - x`` and ``-x``, spelled as operators, as
``torch.mul``/``div``/``add``/``sub``/``neg`` or as the ``Tensor`` methods
(in-place forms included, under export.py's in-place rule). Each such node
is one step ``(a, b)`` of ``a * z + b`` on its tensor operand ``z``; the
converter folds a step into the affine layer that made ``z`` when nothing
else reads ``z`` (``(x - 0.5) / 0.5`` and ``x * 2 - 1`` are one layer). An
op whose other operand is not a Python number (a tensor, a size) is not a
step: it stays whatever export.py makes of it."""
from __future__ import annotations

import math
import operator
from typing import Any, Callable, Dict, Optional, Tuple

import torch
import torch.fx

__all__ = ["AffineRefusal", "AffineStep", "affine_step", "fold", "set_fields", "FLOAT32_MAX", "IN_PLACE_OPERATORS"]

# The largest finite float32: the service stores scale and shift as floats.
FLOAT32_MAX = 3.4028234663852886e38

_NEG = {operator.neg, torch.neg, torch.negative}
_MUL = {operator.mul, operator.imul, torch.mul, torch.multiply}
_DIV = {operator.truediv, operator.itruediv, torch.div, torch.divide, torch.true_divide}
_ADD = {operator.add, operator.iadd, torch.add}
_SUB = {operator.sub, operator.isub, torch.sub, torch.subtract}
_METHODS = {"neg": "neg", "neg_": "neg", "negative": "neg", "mul": "mul", "mul_": "mul", "multiply": "mul",
            "div": "div", "div_": "div", "divide": "div", "true_divide": "div", "add": "add", "add_": "add",
            "sub": "sub", "sub_": "sub", "subtract": "sub"}
# The in-place operator forms (x += c, x -= c, x *= c, x /= c): export.py's
# in-place rule covers them with the methods whose names end in "_".
IN_PLACE_OPERATORS = (operator.iadd, operator.isub, operator.imul, operator.itruediv)


class AffineRefusal(ValueError):
    """A step the service cannot take (a division by zero, a constant that
    is not finite, alpha or rounding_mode); export.py raises it as an
    ExportError naming the op and its module path."""


# (the tensor operand, a, b): the node computes a * operand + b.
AffineStep = Tuple[torch.fx.Node, float, float]


def _family(n: torch.fx.Node) -> Optional[str]:
    if n.op == "call_method":
        return _METHODS.get(str(n.target))
    if n.op != "call_function":
        return None
    for name, fns in (("neg", _NEG), ("mul", _MUL), ("div", _DIV), ("add", _ADD), ("sub", _SUB)):
        if n.target in fns:
            return name
    return None


def _number(v: Any) -> Optional[float]:
    """A Python number as a float (None: not one; a bool is not taken for
    one). Raises AffineRefusal where it is not finite."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:
        f = math.inf
    if not math.isfinite(f) or abs(f) > FLOAT32_MAX:
        raise AffineRefusal(f"the constant {v!r} is not a finite float32 number; the service's affine layer takes "
                            "finite scales and shifts")
    return f


def affine_step(n: torch.fx.Node, is_tensor: Callable[[Any], bool]) -> Optional[AffineStep]:
    """The step n computes when it is arithmetic of one tensor (is_tensor:
    a value the service computes) with a Python number; None otherwise.
    Raises AffineRefusal for a step the service cannot take."""
    fam = _family(n)
    if fam is None or not n.args:
        return None
    x0 = n.args[0]
    if fam == "neg":
        return (x0, -1.0, 0.0) if isinstance(x0, torch.fx.Node) and is_tensor(x0) and len(n.args) == 1 else None
    x1 = n.args[1] if len(n.args) > 1 else n.kwargs.get("other")
    c0, c1 = _number(x0), _number(x1)
    if isinstance(x0, torch.fx.Node) and is_tensor(x0) and c1 is not None:
        z, c, first = x0, c1, False
    elif isinstance(x1, torch.fx.Node) and is_tensor(x1) and c0 is not None:
        z, c, first = x1, c0, True
    else:
        return None
    alpha = n.kwargs.get("alpha", n.args[2] if len(n.args) > 2 and fam in ("add", "sub") else 1)
    if fam in ("add", "sub") and (isinstance(alpha, bool) or alpha != 1):
        raise AffineRefusal(f"alpha {alpha!r} is not supported (alpha=1 only)")
    if fam == "div" and n.kwargs.get("rounding_mode") is not None:
        raise AffineRefusal(f"rounding_mode {n.kwargs['rounding_mode']!r} is not supported (a true division only)")
    if fam == "mul":
        return z, c, 0.0
    if fam == "add":
        return z, 1.0, c
    if fam == "sub":
        return (z, -1.0, c) if first else (z, 1.0, -c)
    if first:
        raise AffineRefusal("divides a number by a tensor (a reciprocal), which has no layer kind; x / c is an "
                            "affine layer")
    if c == 0:
        raise AffineRefusal("divides by zero (PyTorch gives infinities and NaNs); the service's affine layer takes "
                            "finite scales")
    return z, 1.0 / c, 0.0


def fold(scale: float, shift: float, a: float, b: float) -> Tuple[float, float]:
    """a * (scale * z + shift) + b as (scale', shift'); AffineRefusal where
    either leaves float32's finite range."""
    s, t = a * scale, a * shift + b
    if not (math.isfinite(s) and math.isfinite(t)) or abs(s) > FLOAT32_MAX or abs(t) > FLOAT32_MAX:
        raise AffineRefusal(f"the layer's scale {s!r} and shift {t!r} leave float32's finite range")
    return s, t


def set_fields(layer: Dict[str, Any], scale: float, shift: float) -> None:
    """An affine layer's fields, each written only where it differs from
    its default (scale 1, shift 0), as export.py writes every field."""
    for key, v, default in (("scale", scale, 1.0), ("shift", shift, 0.0)):
        if v == default:
            layer.pop(key, None)
        else:
            layer[key] = v
