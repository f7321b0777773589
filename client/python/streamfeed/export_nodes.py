"""What the exporter reads of a traced graph's nodes: the module path a
node belongs to, its op's name as refusals print it, its tensor's shape
from shape propagation, its users, and the shape of a few calls (a chunk
or split, a transpose's or flatten's two dimensions)."""
from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
import torch.fx
from torch import nn

__all__ = ["_path_of", "_op_name", "_meta_shape", "_only_user", "_is_chunk_or_split", "_dims_of", "_is_method_or"]


def _path_of(node: torch.fx.Node) -> str:
    """The module path of a node: its target for call_module, else the
    innermost module whose forward() made it ("" at the top level)."""
    if node.op == "call_module":
        return str(node.target)
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    last = list(stack.values())[-1]
    return str(last[0] if isinstance(last, tuple) else last)


def _op_name(node: torch.fx.Node, module: Optional[nn.Module] = None) -> str:
    if node.op == "call_module" and module is not None:
        cls = type(module)
        return f"{cls.__module__}.{cls.__qualname__}"
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    t = node.target
    mod = getattr(t, "__module__", None) or ""
    name = getattr(t, "__name__", str(t))
    if mod in ("_operator", "operator"):
        return f"operator.{name}"
    if mod.startswith("torch.nn.functional") or (mod == "torch._C._nn"):
        return f"torch.nn.functional.{name}"
    return f"{mod}.{name}" if mod else name


def _meta_shape(node: torch.fx.Node) -> Optional[Tuple[int, ...]]:
    tm = node.meta.get("tensor_meta")
    if tm is None or not hasattr(tm, "shape"):
        return None
    return tuple(int(d) for d in tm.shape)


def _only_user(n: torch.fx.Node) -> Optional[torch.fx.Node]:
    users = list(n.users)
    return users[0] if len(users) == 1 else None


def _is_chunk_or_split(n: torch.fx.Node) -> bool:
    if n.op == "call_method":
        return n.target in ("chunk", "split", "split_with_sizes")
    return n.op == "call_function" and n.target in (torch.chunk, torch.split)


def _dims_of(n: torch.fx.Node, first: int) -> Tuple[Any, Any]:
    """The two dimension arguments of a transpose or a flatten (args from
    position first on, or their keywords)."""
    keys = ("dim0", "dim1") if "transpose" in str(n.target) else ("start_dim", "end_dim")
    a = [n.args[first + i] if len(n.args) > first + i else n.kwargs.get(k) for i, k in enumerate(keys)]
    return a[0], a[1]


def _is_method_or(n: torch.fx.Node, names: Tuple[str, ...], fns: Tuple[Any, ...]) -> bool:
    return (n.op == "call_method" and n.target in names) or (n.op == "call_function" and n.target in fns)


def _is_float32_no_op(n: torch.fx.Node) -> bool:
    """x.float(), x.to(...) or x.type_as(y) that leaves a float32 tensor as it
    is (the same dtype and shape before and after, which shape propagation
    recorded): code written for mixed precision
    (``softmax(..., dtype=torch.float32).to(q.dtype)``) on a float32 module.
    A cast to another dtype is not one: the service has no such layer."""
    if not (n.op == "call_method" and n.target in ("float", "to", "type_as") and n.args and
            isinstance(n.args[0], torch.fx.Node)):
        return False
    a, b = n.args[0].meta.get("tensor_meta"), n.meta.get("tensor_meta")
    return getattr(a, "dtype", None) == torch.float32 and getattr(b, "dtype", None) == torch.float32 and \
        _meta_shape(n) == _meta_shape(n.args[0]) and "memory_format" not in n.kwargs
