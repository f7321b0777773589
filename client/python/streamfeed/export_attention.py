"""Self-attention written out in a module's own forward(), for the exporter.

timm's ``Attention``, and most Vision Transformers users write themselves,
project the tokens with one ``nn.Linear`` into q, k and v, split the heads
with views, attend (``F.scaled_dot_product_attention``, or the product,
softmax and product written out), merge the heads and project back with a
second ``nn.Linear``::

    B, N, C = x.shape
    qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)                      # or qkv[0], qkv[1], qkv[2]
    x = F.scaled_dot_product_attention(q, k, v)  # or: (q * scale) @ k.transpose(-2, -1),
                                                 #     .softmax(-1), dropout(p=0), @ v
    x = x.transpose(1, 2).reshape(B, N, C)
    x = self.proj(x)

That is nn.MultiheadAttention's computation exactly (its in_proj_weight is
q, k and v stacked, each head's columns together, as this reshape splits
them), so it is the service's self_attention layer. The layer is named by
the module holding both projections (``blocks.0.attn``) and keeps their
parameters under their own names through the layer's ``param_names``
(``qkv.weight`` for in_proj_weight, ``proj.bias`` for out_proj.bias), so the
checkpoint loads back into the module with ``load_state_dict(strict=True)``.

Hugging Face's layout (``ViTSelfAttention``, and most models ported from
it) projects q, k and v with three ``nn.Linear(C, C)`` of the same tokens,
each viewed as ``[N, T, H, D]`` and transposed to ``[N, H, T, D]``, attends
as above, merges the heads with ``permute(0, 2, 1, 3)`` and a view, and
projects back with a fourth Linear (``attention.output.dense``, held by a
sibling module): the same computation with q, k and v stacked, so the same
layer, with ``separate_qkv`` (the service holds the three weights one after
another, where they read as in_proj_weight) and each Linear's own names.

nn.MultiheadAttention itself is the same layer where it is called as
torchvision's encoder calls it (multihead_query says which calls).

The pattern is matched from the qkv projection on: a Linear over tokens to
three times their width whose output is viewed as ``[N, T, 3, H, D]``. From
there every step must be the pattern's (no other reader of an intermediate:
the service keeps no attention weights to return), or the export is refused
naming the step; identity modules (timm's q_norm, k_norm and norm
defaults) and ``contiguous()`` may stand between steps.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple, cast

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from .export_error import ExportError
from .export_nodes import _is_float32_no_op, _is_method_or, _meta_shape

# What a refused view of a token sequence into heads says.
HEADS_HINT = ("; a token sequence splits into heads only inside self-attention, as nn.MultiheadAttention or written "
              "out from one qkv Linear (docs/EXPORT.md)")
# The longest parameter suffix the service takes (SF_PARAM_SUFFIX_MAX - 1 of
# gpu/model.h).
SUFFIX_MAX = 23
OP = "self-attention"
_SHAPE_METHODS = ("size", "dim")


@dataclass
class QkvAttention:
    """A matched attention: the layer's name and fields, the nodes it
    consumes (none of which makes a layer of its own) and proj, whose value
    is the layer's output."""
    name: str
    heads: int
    params: List[str]
    param_names: Dict[str, str]
    proj: torch.fx.Node
    inner: Set[torch.fx.Node] = field(default_factory=set)
    fields: Dict[str, Any] = field(default_factory=dict)
    map_hw: Optional[Tuple[int, int]] = None  # the heads merged into a channels-last [H, W, C] map


def _value_users(n: torch.fx.Node) -> List[torch.fx.Node]:
    """The readers of n's values (its sizes, read by shape arithmetic, and
    its dtype and device are not)."""
    return [u for u in n.users
            if not (_is_method_or(u, _SHAPE_METHODS, ()) or (u.op == "call_function" and u.target is getattr
                                                    and u.args[1:] in (("shape",), ("dtype",), ("device",))))]


def _dims(n: torch.fx.Node) -> Tuple[Any, ...]:
    """A permute's or transpose's dimension arguments after the tensor."""
    args = tuple(n.args[1:]) or tuple(v for k, v in n.kwargs.items() if k != "input")
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    return args


def _norm_dims(dims: Tuple[Any, ...], ndim: int) -> Optional[Tuple[int, ...]]:
    if not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        return None
    return tuple(d % ndim for d in dims)


class _Walk:
    """Follows the pattern from one node to the next, recording what it
    consumed; refuses naming the step where the graph leaves the pattern."""

    def __init__(self, gm: torch.fx.GraphModule, path: str):
        self.gm, self.path = gm, path
        self.inner: Set[torch.fx.Node] = set()

    def refuse(self, msg: str) -> ExportError:
        return ExportError(msg + " (the self-attention written out that maps onto the service's self_attention: "
                           "docs/EXPORT.md)", op=OP, module_path=self.path)

    def passes(self, n: torch.fx.Node) -> bool:
        """A node that leaves its input as it is: an identity module, a
        dropout of p 0 (module or F.dropout), contiguous()."""
        if n.op == "call_module":
            mod = self.gm.get_submodule(str(n.target))
            return type(mod) is nn.Identity or (type(mod) is nn.Dropout and float(mod.p) == 0.0)
        if _is_method_or(n, ("contiguous",), ()) or _is_float32_no_op(n):
            return True
        if n.op == "call_function" and n.target is F.dropout:
            p = n.args[1] if len(n.args) > 1 else n.kwargs.get("p", 0.5)
            training = n.args[2] if len(n.args) > 2 else n.kwargs.get("training", True)
            return (isinstance(p, (int, float)) and float(p) == 0.0) or training is False
        return False

    def users(self, n: torch.fx.Node) -> List[torch.fx.Node]:
        return _value_users(n)

    def past(self, n: torch.fx.Node) -> torch.fx.Node:
        """n, or its one reader past pass-through nodes (timm's q_norm and
        k_norm default to nn.Identity), each recorded."""
        while True:
            users = self.users(n)
            if len(users) != 1 or not self.passes(users[0]):
                return n
            n = users[0]
            self.inner.add(n)

    def next(self, n: torch.fx.Node, what: str) -> torch.fx.Node:
        """n's one reader past pass-through nodes, each recorded."""
        while True:
            users = self.users(n)
            if len(users) != 1:
                raise self.refuse(f"{what} is read by {len(users)} ops ({', '.join(u.name for u in users[:3])}) "
                                  "where the pattern reads it once")
            n = users[0]
            self.inner.add(n)
            if not self.passes(n):
                return n


def _scale_of(n: torch.fx.Node, x: torch.fx.Node) -> Optional[float]:
    """The factor a multiplication or division of x by a Python number
    applies, or None where n is not one."""
    if _is_method_or(n, ("mul",), (operator.mul, torch.mul)):
        other = [a for a in n.args[:2] if a is not x]
        if len(other) == 1 and isinstance(other[0], (int, float)) and not isinstance(other[0], bool):
            return float(other[0])
    if _is_method_or(n, ("div",), (operator.truediv, torch.div)) and len(n.args) == 2 and n.args[0] is x and \
            not n.kwargs and isinstance(n.args[1], (int, float)) and not isinstance(n.args[1], bool) and n.args[1]:
        return 1.0 / float(n.args[1])
    return None


def _matmul(n: torch.fx.Node) -> bool:
    return _is_method_or(n, ("matmul",), (operator.matmul, torch.matmul))


def _softmax_last(n: torch.fx.Node) -> bool:
    if not _is_method_or(n, ("softmax",), (F.softmax, torch.softmax)):
        return False
    dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
    dtype = n.args[2] if len(n.args) > 2 and n.op == "call_method" else n.kwargs.get("dtype")
    return dim in (-1, 3) and dtype in (None, torch.float32)


def _sdpa(w: _Walk, s: torch.fx.Node, q: torch.fx.Node, k: torch.fx.Node, v: torch.fx.Node, d: int) -> None:
    names = ["query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"]
    if len(s.args) > len(names) or any(key not in names for key in s.kwargs):
        raise w.refuse(f"F.scaled_dot_product_attention is called with arguments {sorted(s.kwargs)}")
    a: Dict[str, Any] = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None,
                         "enable_gqa": False}
    a.update(zip(names, s.args))
    a.update(s.kwargs)
    if (a.get("query"), a.get("key"), a.get("value")) != (q, k, v):
        raise w.refuse("F.scaled_dot_product_attention does not take the split's q, k and v in that order")
    if a["attn_mask"] is not None or a["is_causal"] is not False:
        raise w.refuse("F.scaled_dot_product_attention is given a mask (attn_mask or is_causal); masks are not "
                       "supported")
    if a["dropout_p"] != 0.0:
        raise w.refuse(f"F.scaled_dot_product_attention drops attention weights (dropout_p {a['dropout_p']}); "
                       "the service's self_attention has no attention dropout (0 only)")
    if a["scale"] is not None and not math.isclose(float(a["scale"]), d ** -0.5, rel_tol=1e-6):
        raise w.refuse(f"F.scaled_dot_product_attention's scale {a['scale']} is not 1/sqrt(head_dim) "
                       f"({d ** -0.5:.6g}), the only scale the service's self_attention applies")
    if a["enable_gqa"] is not False:
        raise w.refuse("enable_gqa is not supported")


def _written_out(w: _Walk, q: torch.fx.Node, k: torch.fx.Node, v: torch.fx.Node, d: int) -> torch.fx.Node:
    """(q * scale) @ k.transpose(-2, -1), or the scale after the product;
    softmax over the last dimension; a dropout of p 0; @ v. Returns the
    last product."""
    scale = 1.0
    a = w.next(q, "q")
    s = _scale_of(a, q)
    if s is not None:
        scale, q, a = s, a, w.next(a, "the scaled q")
    kt = w.next(k, "k")
    if not (_is_method_or(kt, ("transpose",), (torch.transpose,)) and _norm_dims(_dims(kt), 4) in ((2, 3), (3, 2))):
        raise w.refuse(f"k is read by {kt.name}, not by a transpose of its last two dimensions")
    if not (_matmul(a) and a.args[:2] == (q, kt)):
        raise w.refuse(f"{a.name} is not q @ k.transpose(-2, -1)")
    w.inner.add(kt)
    nxt = w.next(a, "q @ k^T")
    s = _scale_of(nxt, a)
    if s is not None:
        scale *= s
        a, nxt = nxt, w.next(nxt, "the scaled scores")
    if not _softmax_last(nxt):
        raise w.refuse(f"the scores go to {nxt.name}, not to a softmax over their last dimension")
    if not math.isclose(scale, d ** -0.5, rel_tol=1e-6):
        raise w.refuse(f"the scores are scaled by {scale:.6g}, not by 1/sqrt(head_dim) ({d ** -0.5:.6g}), the only "
                       "scale the service's self_attention applies")
    p = nxt
    o = w.next(p, "the attention weights")
    if not (_matmul(o) and o.args[0] is not None and o.args[1] is v):
        raise w.refuse(f"{o.name} is not the attention weights @ v")
    if w.users(v) != [o]:
        raise w.refuse("v is read elsewhere than by the attention weights' product")
    return o


def _split(w: _Walk, p: torch.fx.Node) -> List[torch.fx.Node]:
    """q, k and v from the permuted [3, N, H, T, D]: unbind(0), or [0], [1],
    [2]; each past pass-through nodes."""
    users = w.users(p)
    pieces: Dict[int, torch.fx.Node] = {}
    if len(users) == 1 and _is_method_or(users[0], ("unbind",), (torch.unbind,)):
        ub = users[0]
        dim = ub.args[1] if len(ub.args) > 1 else ub.kwargs.get("dim", 0)
        if dim != 0:
            raise w.refuse(f"the heads are unbound along dimension {dim}, not 0")
        w.inner.add(ub)
        users = w.users(ub)
    for u in users:
        if not (u.op == "call_function" and u.target is operator.getitem and isinstance(u.args[1], int)
                and u.args[1] in (0, 1, 2) and u.args[1] not in pieces):
            raise w.refuse(f"the [3, N, heads, T, head_dim] view is read by {u.name}, not split into q, k, v")
        pieces[u.args[1]] = u
        w.inner.add(u)
    if sorted(pieces) != [0, 1, 2]:
        raise w.refuse("the [3, N, heads, T, head_dim] view is not split into all of q, k and v")
    return [w.past(pieces[i]) for i in range(3)]


def _merge(w: _Walk, o: torch.fx.Node, t: int, c: int) -> Tuple[torch.fx.Node, Optional[Tuple[int, int]]]:
    """o [N, H, T, D] back to tokens [N, T, C]: transpose(1, 2) or
    permute(0, 2, 1, 3), then reshape/view to [N, T, C] or flatten(2), or
    to a channels-last map [N, h, w, C] of h * w = T (timm's MetaFormer
    Attention). Returns the last node and the map's [h, w] (None: tokens)."""
    tr = w.next(o, "the attention output")
    good = (_is_method_or(tr, ("transpose",), (torch.transpose,)) and _norm_dims(_dims(tr), 4) in ((1, 2), (2, 1))) or \
        (_is_method_or(tr, ("permute",), (torch.permute,)) and _norm_dims(_dims(tr), 4) == (0, 2, 1, 3))
    if not good:
        raise w.refuse(f"the attention output goes to {tr.name}, not to transpose(1, 2) merging the heads")
    m = w.next(tr, "the transposed output")
    ms = tuple(_meta_shape(m) or ())
    if _is_method_or(m, ("reshape", "view"), (torch.reshape,)) and len(ms) == 4 and ms[3] == c and \
            ms[1] * ms[2] == t:
        return m, (int(ms[1]), int(ms[2]))
    if not (_is_method_or(m, ("reshape", "view", "flatten"), (torch.reshape, torch.flatten)) and ms[1:] == (t, c)):
        raise w.refuse(f"the transposed output goes to {m.name}, not to a reshape to [N, T, C] ({t}, {c}) or to a "
                       "channels-last map [N, H, W, C] of those tokens")
    return m, None


def _prefix(*paths: str) -> str:
    """The module path holding every module of paths (each keeps at least its
    last component below it); "" where only the root holds them all."""
    parts = [p.split(".") for p in paths]
    k = 0
    while k < min(len(p) for p in parts) - 1 and all(p[k] == parts[0][k] for p in parts):
        k += 1
    return ".".join(parts[0][:k])


def _layer(w: _Walk, o: torch.fx.Node, tokens: Tuple[int, ...], heads: int, in_paths: List[str], in_bias: bool,
           holder: str) -> QkvAttention:
    """From the attention's output o on: the heads merged, the Linear
    projecting them back, and the layer, named by the module holding every
    projection (in_paths: the input projection's module path, or q's, k's
    and v's), their parameters under their own names. holder says which
    module holds them where none does."""
    t, c = tokens
    merged, map_hw = _merge(w, o, t, c)
    proj = w.next(merged, "the merged heads")
    w.inner.discard(proj)
    pmod = w.gm.get_submodule(str(proj.target)) if proj.op == "call_module" else None
    if type(pmod) is not nn.Linear or pmod.in_features != c or pmod.out_features != c:
        raise w.refuse(f"the merged heads go to {proj.name}, not to an nn.Linear({c}, {c}) projecting them back")
    paths = in_paths + [str(proj.target)]
    name = _prefix(*paths)
    if not name:
        raise w.refuse(f"the {'two' if len(paths) == 2 else 'four'} projections are not held by one module "
                       f"({holder}); the layer is named by it")
    rel = [p[len(name) + 1:] for p in paths]
    separate = len(in_paths) == 3
    own, fields = attention_slots(in_bias, pmod.bias is not None, separate)
    if separate:
        theirs = {f"{role}_proj.{kind}": f"{r}.{kind}" for role, r in zip("qkv", rel) for kind in ("weight", "bias")}
    else:
        theirs = {"in_proj_weight": f"{rel[0]}.weight", "in_proj_bias": f"{rel[0]}.bias"}
    theirs.update({"out_proj.weight": f"{rel[-1]}.weight", "out_proj.bias": f"{rel[-1]}.bias"})
    suffixes = [theirs[o] for o in own]
    long = [s for s in suffixes if len(s) > SUFFIX_MAX]
    if long:
        raise w.refuse(f"the parameter name {long[0]} under {name} is longer than the {SUFFIX_MAX} characters the "
                       "service takes")
    return QkvAttention(name=name, heads=heads, params=suffixes, param_names=dict(zip(own, suffixes)), proj=proj,
                        inner=w.inner, fields=fields, map_hw=map_hw)


def _into_heads(lin: torch.fx.Node, t: int, c: int) -> Optional[Tuple[torch.fx.Node, torch.fx.Node, int]]:
    """Where a Linear node's output [N, T, C] is viewed as [N, T, H, D] and
    transposed to [N, H, T, D] (Hugging Face's transpose_for_scores): the
    view, the transpose and H; else None."""
    users = _value_users(lin)
    r = users[0] if len(users) == 1 else None
    rs = _meta_shape(r) if r is not None else None
    if r is None or not _is_method_or(r, ("reshape", "view"), (torch.reshape,)) or rs is None or len(rs) != 4 or \
            rs[1] != t or rs[2] * rs[3] != c or len(_value_users(r)) != 1:
        return None
    tr = _value_users(r)[0]
    if (_is_method_or(tr, ("transpose",), (torch.transpose,)) and _norm_dims(_dims(tr), 4) in ((1, 2), (2, 1))) or \
            (_is_method_or(tr, ("permute",), (torch.permute,)) and _norm_dims(_dims(tr), 4) == (0, 2, 1, 3)):
        return r, tr, rs[2]
    return None


def _separate(gm: torch.fx.GraphModule, n: torch.fx.Node, tokens: Tuple[int, ...]) -> QkvAttention:
    """Hugging Face's layout (see the module's docstring): Linear node n is
    one of three Linear(C, C) of the same tokens split into heads; which is
    q, k and v the attention says (the arguments of
    F.scaled_dot_product_attention, or which one is transposed and which one
    multiplies the attention weights)."""
    t, c = tokens
    path = str(n.target)
    w = _Walk(gm, path.rsplit(".", 1)[0] if "." in path else path)
    x = n.args[0]
    found: Dict[torch.fx.Node, Tuple[torch.fx.Node, torch.fx.Node, int]] = {}
    for u in list(x.users) if isinstance(x, torch.fx.Node) else [n]:
        mod = gm.get_submodule(str(u.target)) if u.op == "call_module" else None
        if type(mod) is nn.Linear and mod.in_features == c and mod.out_features == c:
            hv = _into_heads(u, t, c)
            if hv is not None:
                found[u] = hv
    if len(found) != 3 or len({hv[2] for hv in found.values()}) != 1:
        raise w.refuse(f"{len(found)} Linear({c}, {c}) of the same tokens are split into heads (of "
                       f"{sorted({hv[2] for hv in found.values()})} heads) where self-attention projects three, q, "
                       "k and v, into the same heads")
    heads = next(iter(found.values()))[2]
    d = c // heads
    end: Dict[torch.fx.Node, torch.fx.Node] = {}
    for u, (r, tr, _) in found.items():
        w.inner.update((u, r, tr))
        end[w.past(tr)] = u
    w.inner.discard(n)
    ends = list(end)
    sdpa = {u for e in ends for u in w.users(e)
            if u.op == "call_function" and u.target is F.scaled_dot_product_attention}
    if sdpa:
        o = sdpa.pop()
        bound: Dict[str, Any] = dict(zip(("query", "key", "value"), o.args))
        bound.update({key: val for key, val in o.kwargs.items() if key in ("query", "key", "value")})
        qkv = [bound.get("query"), bound.get("key"), bound.get("value")]
        if sdpa or set(qkv) != set(ends):
            raise w.refuse("F.scaled_dot_product_attention does not take the three projections as its q, k and v")
        q, k, v = (cast(torch.fx.Node, a) for a in qkv)  # the three ends, checked above
        _sdpa(w, o, q, k, v, d)
        w.inner.add(o)
        if any(w.users(e) != [o] for e in ends):
            raise w.refuse("q, k or v is read elsewhere than by F.scaled_dot_product_attention")
    else:
        vs = [e for e in ends if any(_matmul(u) and len(u.args) > 1 and u.args[1] is e for u in w.users(e))]
        ks = [e for e in ends if any(_is_method_or(u, ("transpose",), (torch.transpose,)) for u in w.users(e))]
        if len(vs) != 1 or len(ks) != 1 or vs[0] is ks[0]:
            raise w.refuse("the three projections are not used as q, k and v: one transposed (k), one multiplying "
                           "the attention weights (v)")
        v, k = vs[0], ks[0]
        q = next(e for e in ends if e is not v and e is not k)
        o = _written_out(w, q, k, v, d)
    lins = [end[q], end[k], end[v]]
    has_bias = {gm.get_submodule(str(lin.target)).bias is not None for lin in lins}
    if len(has_bias) != 1:
        raise w.refuse("some of the q, k and v Linears have a bias and some do not; the service's self_attention "
                       "has one for all three or none")
    return _layer(w, o, tokens, heads, [str(lin.target) for lin in lins], has_bias.pop(),
                  "as Hugging Face's ViTAttention holds query, key, value and output.dense")


def match(gm: torch.fx.GraphModule, n: torch.fx.Node, mod: nn.Linear, tokens: Tuple[int, ...]) -> \
        Optional[QkvAttention]:
    """The attention that Linear node n (mod, reading tokens [T, C]) starts,
    or None where its output is not viewed as [N, T, 3, H, D], nor (a
    Linear(C, C)) as [N, T, H, D] split into heads: a plain linear layer.
    Refuses where the pattern starts and then leaves."""
    t, c = tokens
    if mod.out_features == c and _into_heads(n, t, c) is not None:
        return _separate(gm, n, tokens)
    users = [u for u in n.users]
    r = users[0] if len(users) == 1 else None
    rs = _meta_shape(r) if r is not None else None
    if mod.out_features != 3 * c or r is None or not _is_method_or(r, ("reshape", "view"), (torch.reshape,)) or \
            rs is None or len(rs) != 5 or rs[1:3] != (t, 3) or rs[3] * rs[4] != c:
        return None
    heads, d = rs[3], rs[4]
    path = str(n.target)
    w = _Walk(gm, path.rsplit(".", 1)[0] if "." in path else path)
    w.inner.add(r)
    perm = w.next(r, "the [N, T, 3, heads, head_dim] view")
    if not (_is_method_or(perm, ("permute",), (torch.permute,)) and _norm_dims(_dims(perm), 5) == (2, 0, 3, 1, 4)):
        raise w.refuse(f"the [N, T, 3, heads, head_dim] view goes to {perm.name}, not to permute(2, 0, 3, 1, 4)")
    q, k, v = _split(w, perm)
    first = w.users(q)
    if len(first) == 1 and first[0].op == "call_function" and first[0].target is F.scaled_dot_product_attention:
        o = first[0]
        _sdpa(w, o, q, k, v, d)
        w.inner.add(o)
        if w.users(k) != [o] or w.users(v) != [o]:
            raise w.refuse("k or v is read elsewhere than by F.scaled_dot_product_attention")
    else:
        o = _written_out(w, q, k, v, d)
    # timm's qkv_bias=False leaves the qkv Linear without a bias: so is the layer
    return _layer(w, o, tokens, heads, [path], mod.bias is not None, "as timm's Attention holds qkv and proj")


def attention_slots(in_bias: bool, out_bias: bool, separate: bool = False) -> Tuple[List[str], Dict[str, Any]]:
    """self_attention's parameters, in its slot order, with or without each
    projection's bias, q, k and v stacked or separate, and the fields that
    say so (none for both biases, stacked)."""
    if separate:
        names = [f"{r}_proj.weight" for r in "qkv"] + [f"{r}_proj.bias" for r in "qkv"] * in_bias
    else:
        names = ["in_proj_weight"] + ["in_proj_bias"] * in_bias
    names += ["out_proj.weight"] + ["out_proj.bias"] * out_bias
    fields: Dict[str, Any] = {"separate_qkv": True} if separate else {}
    if not in_bias:
        fields["in_proj_bias"] = False
    if not out_bias:
        fields["out_proj_bias"] = False
    return names, fields


def multihead_query(n: torch.fx.Node, mod: Any, op: str, path: str) -> torch.fx.Node:
    """The query of an nn.MultiheadAttention call that is the service's
    self_attention as it stands, as torchvision's EncoderBlock calls it:
    attn(x, x, x, need_weights=False), batch_first, one embed_dim, no bias_kv
    or zero attention, dropout 0 (bias=False too). Anything else is refused."""
    names = ["query", "key", "value", "key_padding_mask", "need_weights", "attn_mask", "average_attn_weights",
             "is_causal"]
    if len(n.args) > len(names) or any(k not in names for k in n.kwargs):
        raise ExportError(f"is called with arguments {list(n.kwargs)} it does not take", op=op, module_path=path)
    bound: Dict[str, Any] = dict(zip(names, n.args))
    bound.update(n.kwargs)
    q = bound.get("query")
    if not isinstance(q, torch.fx.Node) or bound.get("key") is not q or bound.get("value") is not q:
        raise ExportError("attends with a key or value other than its query; the service's self_attention "
                          "is attention(x, x, x)", op=op, module_path=path)
    for mask in ("key_padding_mask", "attn_mask"):
        if bound.get(mask) is not None:
            raise ExportError(f"is given {mask}: masks are not supported", op=op, module_path=path)
    if bound.get("is_causal", False) is not False:
        raise ExportError("is_causal: masks are not supported", op=op, module_path=path)
    if bound.get("need_weights", True) is not False:
        raise ExportError("need_weights=True (nn.MultiheadAttention's default): the service computes no "
                          "attention weights to return; call it with need_weights=False", op=op,
                          module_path=path)
    if not mod.batch_first:
        raise ExportError("batch_first=False: the service's tokens are [N, T, C]", op=op, module_path=path)
    if not mod._qkv_same_embed_dim or mod.kdim != mod.embed_dim or mod.vdim != mod.embed_dim:
        raise ExportError(f"kdim {mod.kdim} / vdim {mod.vdim} differ from embed_dim {mod.embed_dim}: the service "
                          "projects q, k and v from one in_proj_weight", op=op, module_path=path)
    if mod.bias_k is not None or mod.bias_v is not None or mod.add_zero_attn:
        raise ExportError("needs add_bias_kv=False and add_zero_attn=False", op=op, module_path=path)
    if float(mod.dropout) != 0.0:
        raise ExportError(f"dropout {mod.dropout} on the attention weights is not supported (0 only)", op=op,
                          module_path=path)
    return cast(torch.fx.Node, q)  # a Node, checked above
