"""How streamfeed.export maps ConvNeXt V2's Global Response Normalization
(timm's ``GlobalResponseNorm``) onto the service's grn layer::

    x_g = x.norm(p=2, dim=(1, 2), keepdim=True)              # (2, 3) on an NCHW map
    x_n = x_g / (x_g.mean(dim=-1, keepdim=True) + self.eps)   # dim=1 on an NCHW map
    return x + torch.addcmul(self.bias.view(1, 1, 1, -1), self.weight.view(1, 1, 1, -1), x * x_n)

(``self.weight * (x * x_n) + self.bias + x`` the same). The match starts at
the norm and walks the pattern's nodes, each read only by the next step, so
no intermediate (the norms, their mean) is needed elsewhere; it ends at the
add of x, whose value is the layer's. The weight and the bias are one
submodule's ``[C]`` parameters, viewed or not, and keep their names. Any
other use of a norm is refused naming the step that leaves the pattern."""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

import torch
import torch.fx

from .export_error import ExportError
from .export_nodes import _is_method_or, _meta_shape

__all__ = ["GrnMatch", "match_grn"]

_NORMS = (torch.norm, torch.linalg.vector_norm)
_REFUSAL = ("a norm is supported as ConvNeXt V2's Global Response Normalization: x.norm(p=2, dim=the spatial "
            "dimensions, keepdim=True), divided by its mean over the channels (keepdim) plus a number, times x, "
            "scaled and shifted by one submodule's [C] weight and bias, plus x")


@dataclass
class GrnMatch:
    """A matched GRN: the layer's name, its parameters' own names, eps, the
    nodes it consumes and the last one (x plus the scaled product)."""
    name: str
    param_names: Dict[str, str]
    eps: float
    out: torch.fx.Node
    inner: Set[torch.fx.Node] = field(default_factory=set)


def _only_user(n: torch.fx.Node, what: str, op: str, path: str) -> torch.fx.Node:
    users = list(n.users)
    if len(users) != 1:
        raise ExportError(f"{what} is read by {len(users)} nodes; {_REFUSAL}", op=op, module_path=path)
    return users[0]


def _args(n: torch.fx.Node) -> List[Any]:
    return list(n.args) + list(n.kwargs.values())


def _dims(v: Any) -> Tuple[int, ...]:
    return tuple(int(d) for d in v) if isinstance(v, (tuple, list)) else (int(v),)


def _param(state: Dict[str, torch.Tensor], v: Any, c: int, nhwc: bool, op: str, path: str) -> Optional[str]:
    """The target of a module's [C] parameter broadcast along the map's
    channels: on a channels-last map as it is or viewed [1, 1, 1, C], on an
    NCHW one viewed [1, C, 1, 1] or [C, 1, 1]. None where v is no module
    tensor; refused where it is one that would scale other than the channels
    (a view along the rows, a parameter of another shape: the official
    repository's [1, 1, 1, C] gamma and beta among them)."""
    viewed = None
    if isinstance(v, torch.fx.Node) and _is_method_or(v, ("view", "reshape"), (torch.reshape,)):
        viewed = tuple(_meta_shape(v) or ())
        v = v.args[0]
    if not isinstance(v, torch.fx.Node) or v.op != "get_attr":
        return None
    p = state.get(str(v.target))
    along = ((1, 1, 1, c), (c,)) if nhwc else ((1, c, 1, 1), (c, 1, 1))
    if p is None or tuple(p.shape) != (c,) or (viewed if viewed is not None else (c,)) not in along:
        raise ExportError(f"scales or shifts by the module tensor {v.target} of shape "
                          f"{list(p.shape) if p is not None else '?'}{f' viewed as {list(viewed)}' if viewed else ''}"
                          f"; a GRN's weight and bias are [C] parameters broadcast along the channels "
                          f"({'as they are or viewed [1, 1, 1, C]' if nhwc else 'viewed [1, C, 1, 1]'})", op=op,
                          module_path=path)
    return str(v.target)


def _plain_add(n: torch.fx.Node) -> bool:
    """A two-operand add without alpha."""
    return _is_method_or(n, ("add",), (operator.add, torch.add)) and len(n.args) == 2 and not n.kwargs


def _scaled(n: torch.fx.Node, prod: torch.fx.Node, state: Dict[str, torch.Tensor], c: int, nhwc: bool, op: str,
            path: str) -> Tuple[str, str, torch.fx.Node, Set[torch.fx.Node]]:
    """weight * prod + bias from prod's one reader n: addcmul(bias, weight,
    prod), or the product and then the add, either order. Returns the
    weight's and bias's targets, the node holding the sum, and the nodes
    consumed."""
    seen: Set[torch.fx.Node] = set()
    if n.op == "call_function" and n.target is torch.addcmul and len(n.args) == 3 and not n.kwargs:
        w, b = _param(state, n.args[1], c, nhwc, op, path), _param(state, n.args[0], c, nhwc, op, path)
        if w and b and n.args[2] is prod:
            seen.update(a for a in n.args[:2] if isinstance(a, torch.fx.Node) and a.op != "get_attr")
            return w, b, n, seen
    if _is_method_or(n, ("mul",), (operator.mul, torch.mul)) and len(n.args) == 2 and not n.kwargs:
        other = n.args[1] if n.args[0] is prod else n.args[0]
        w = _param(state, other, c, nhwc, op, path)
        add = _only_user(n, "the scaled product", op, path)
        if w and _plain_add(add):
            bias_arg = add.args[1] if add.args[0] is n else add.args[0]
            b = _param(state, bias_arg, c, nhwc, op, path)
            if b:
                seen.update(a for a in (other, bias_arg) if isinstance(a, torch.fx.Node) and a.op != "get_attr")
                seen.add(n)
                return w, b, add, seen
    raise ExportError(f"x times its normalized norms goes to {n.name}; {_REFUSAL}", op=op, module_path=path)


def match_grn(n: torch.fx.Node, x: torch.fx.Node, shape: Tuple[int, ...], nhwc: bool,
              state: Dict[str, torch.Tensor], op: str, path: str) -> GrnMatch:
    """The GRN that the norm node n of x (a map of per-sample shape [C,H,W],
    channels-last when nhwc) starts; refused naming the step otherwise."""
    c = shape[0]
    spatial, channel = ((1, 2), (3, -1)) if nhwc else ((2, 3), (1, -3))
    a = _args(n)
    p = n.kwargs.get("p", n.kwargs.get("ord", a[1] if len(n.args) > 1 else 2))
    dims = n.kwargs.get("dim", n.args[2] if len(n.args) > 2 else None)
    keep = n.kwargs.get("keepdim", n.args[3] if len(n.args) > 3 else False)
    if len(shape) != 3 or p not in (2, 2.0, "fro") or dims is None or \
            {d % 4 for d in _dims(dims)} != set(spatial) or not keep or n.kwargs.get("dtype") is not None:
        raise ExportError(f"takes a norm with p={p!r} over dim={dims!r} (keepdim={keep!r}) of a "
                          f"{'channels-last ' if nhwc else ''}map; {_REFUSAL}", op=op, module_path=path)
    users = list(n.users)
    mean = next((u for u in users if _is_method_or(u, ("mean",), (torch.mean,))), None)
    div = next((u for u in users if _is_method_or(u, ("div", "truediv"), (operator.truediv, torch.div))), None)
    # a division of two operands given in place, without a rounding mode
    if len(users) != 2 or mean is None or div is None or len(div.args) != 2 or div.kwargs or div.args[0] is not n:
        raise ExportError(f"the norms are read by {[u.name for u in users]}, not by their mean and a division "
                          f"(x_g / ..., no rounding mode); {_REFUSAL}", op=op, module_path=path)
    mdims = mean.kwargs.get("dim", mean.args[1] if len(mean.args) > 1 else None)
    mkeep = mean.kwargs.get("keepdim", mean.args[2] if len(mean.args) > 2 else False)
    add = _only_user(mean, "the norms' mean", op, path)
    eps = (add.args[1] if add.args[0] is mean else add.args[0]) if _plain_add(add) else None
    if mdims is None or _dims(mdims)[0] not in channel or len(_dims(mdims)) != 1 or not mkeep or \
            not isinstance(eps, (int, float)) or isinstance(eps, bool) or div.args[1] is not add or \
            _only_user(add, "the mean plus eps", op, path) is not div:
        raise ExportError(f"divides the norms by another than their mean over the channels (keepdim) plus a number; "
                          f"{_REFUSAL}", op=op, module_path=path)
    prod = _only_user(div, "the normalized norms", op, path)
    if not _is_method_or(prod, ("mul",), (operator.mul, torch.mul)) or len(prod.args) != 2 or prod.kwargs or \
            x not in prod.args or div not in prod.args:
        raise ExportError(f"the normalized norms go to {prod.name}, not to a product with x; {_REFUSAL}", op=op,
                          module_path=path)
    w, b, scaled, seen = _scaled(_only_user(prod, "x times its normalized norms", op, path), prod, state, c, nhwc, op,
                                 path)
    out = _only_user(scaled, "the scaled product", op, path)
    if not _is_method_or(out, ("add",), (operator.add, torch.add)) or len(out.args) != 2 or out.kwargs or \
            x not in out.args or scaled not in out.args:
        raise ExportError(f"the scaled product goes to {out.name}, not to an add of x; {_REFUSAL}", op=op,
                          module_path=path)
    owner, _, wleaf = w.rpartition(".")
    bowner, _, bleaf = b.rpartition(".")
    if not owner or owner != bowner:
        raise ExportError(f"scales by {w} and shifts by {b}; the weight and the bias must be one submodule's "
                          "(the layer is named by it)", op=op, module_path=path)
    names = {k: v for k, v in (("weight", wleaf), ("bias", bleaf)) if k != v}
    inner = {n, mean, add, div, prod, scaled} | seen
    return GrnMatch(name=owner, param_names=names, eps=float(eps), out=out, inner=inner)
