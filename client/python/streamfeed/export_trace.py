"""The exporter's torch.fx tracer: which modules stay whole, how a
forward() with more arguments than the batch is traced, and the numbers a
module computes from its input's shape.

torch.fx records arithmetic on ``x.shape`` as graph nodes, but Python
itself needs a real value where such a number decides control flow
(``if x.shape[-1] > 16``), is iterated (``for s in x.shape``), has its
length taken, or goes through ``int()``, ``math.ceil`` or ``range``
(timm's ``pad_same``: ``math.ceil(ih / s)``). symbolic_trace refuses all
of those. The service trains at one input size, so a number that depends
only on the input's shape is a constant of the exported model, and this
tracer gives Python that constant: it runs the part of the graph traced so
far on the example input, at two batch sizes. A number that differs
between them (it depends on the batch size) is refused, as is one computed
from a tensor's values (``x.sum().item()``, ``x.max() > 0``): those would
be frozen at the example's values without a word. The converter's check
(export_check.check_trace) then compares the trace with the module's own
forward() on another input of the same shape."""
from __future__ import annotations

import inspect
import math
import operator
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

import torch
import torch.fx
from torch import nn
from torch.fx.proxy import Attribute, Proxy, TraceError

__all__ = ["LEAF_NAMES", "ShapeTraceError", "Tracer", "fold_shape_numbers", "from_shapes"]

# Modules outside torch.nn that are layers of their own: the tracer keeps them
# whole instead of tracing their forward() into ops.
LEAF_NAMES = {("torchvision.ops.stochastic_depth", "StochasticDepth"),
              ("torchvision.models.convnext", "LayerNorm2d"),
              ("timm.layers.drop", "DropPath")}

# Reads of a tensor that give its shape, never its values.
_SHAPE_ATTRS = ("shape", "ndim")
_SHAPE_METHODS = ("size", "dim", "ndimension", "numel", "nelement")


def _defaults_after_input(fn: Callable[..., Any]) -> Optional[Dict[str, Any]]:
    """The parameters of fn after its first that have a constant default."""
    try:
        params = list(inspect.signature(fn).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    const = (type(None), bool, int, float, str)
    found = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty and
             isinstance(p.default, const) and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return found or None


# Calls that return a tuple of tensors whose number follows from shapes and
# their arguments: iterating one (``[f(t) for t in x.chunk(2, 1)]``) needs
# only that number.
_PIECES = {"chunk", "split", "tensor_split", "unbind", "split_with_sizes"}


def _is_pieces(n: torch.fx.Node) -> bool:
    if n.op == "call_method":
        return str(n.target) in _PIECES
    return n.op == "call_function" and getattr(n.target, "__name__", "") in _PIECES and \
        getattr(n.target, "__module__", "") in ("torch", "torch.functional", "torch._C._VariableFunctions")


def _is_number(v: Any) -> bool:
    """A Python number or bool, or a tuple, list or torch.Size of them."""
    if isinstance(v, (tuple, list)):
        return all(_is_number(e) for e in v)
    return isinstance(v, (int, float, bool))


def _nodes_in(a: Any) -> List[torch.fx.Node]:
    found: List[torch.fx.Node] = []
    torch.fx.node.map_arg(a, lambda n: found.append(n) or n)  # type: ignore[func-returns-value]
    return found


def from_shapes(node: torch.fx.Node, memo: Dict[torch.fx.Node, bool]) -> bool:
    """Whether node's value is computed from tensor shapes and constants
    only: a read of a shape (x.shape, x.size(1), x.dim()), or arithmetic,
    indexing and calls of such values and constants. memo keeps the answers
    for the nodes looked at."""
    todo = [node]
    while todo:
        n = todo[-1]
        if n in memo:
            todo.pop()
            continue
        if n.op == "call_function" and n.target is getattr and len(n.args) == 2 and n.args[1] in _SHAPE_ATTRS:
            memo[n] = True
            todo.pop()
            continue
        if n.op not in ("call_function", "call_method"):
            memo[n] = False
            todo.pop()
            continue
        shape_read = n.op == "call_method" and n.target in _SHAPE_METHODS
        # A shape read's tensor is not read for its values; its other
        # arguments (the dimension) are.
        inner = _nodes_in((n.args[1:], n.kwargs) if shape_read else (n.args, n.kwargs))
        pending = [a for a in inner if a not in memo]
        if pending:
            todo.extend(pending)
            continue
        memo[n] = (shape_read or bool(inner)) and all(memo[a] for a in inner)
        todo.pop()
    return memo[node]


def fold_shape_numbers(gm: torch.fx.GraphModule) -> None:
    """Writes into every call the numbers computed from the input's shape
    that shape propagation found the same at two batch sizes
    (meta["sf_static"], export_check.propagate) in place of the nodes that
    compute them: ``F.pad(x, [0, (8 - w % 8) % 8])`` becomes the pad it is,
    for every layer's converter alike. A number computed from a tensor's
    values is left a node, which the converters refuse."""
    memo: Dict[torch.fx.Node, bool] = {}
    # Decided for every node before any is rewritten: a rewritten node's
    # arguments are constants, which alone do not make a shape number.
    known = {n: n.meta["sf_static"] for n in gm.graph.nodes if "sf_static" in n.meta and from_shapes(n, memo)}

    def value(a: torch.fx.Node) -> Any:
        return known.get(a, a)
    for n in gm.graph.nodes:
        if n.op in ("call_function", "call_method", "call_module"):
            n.args = torch.fx.node.map_arg(n.args, value)
            n.kwargs = torch.fx.node.map_arg(n.kwargs, value)


class ShapeTraceError(TraceError):
    """A refusal of the tracer's, with the module path of the forward()
    it was tracing ("" at the top level)."""

    def __init__(self, message: str, module_path: str):
        super().__init__(message)
        self.module_path = module_path


def _ask(p: Proxy, use: str, measure: Optional[Callable[[Any], Any]] = None) -> Any:
    tracer = p.tracer
    if not isinstance(tracer, Tracer):  # a proxy of another tracer's graph
        raise TraceError(f"{use} of a traced value")
    return tracer.concrete(p, use, measure)


class _ShapeProxy(Proxy):
    """A proxy that Python may ask for a real number: each of these goes
    to the tracer, which answers with the traced value where it depends on
    the input's shape alone."""

    def __getattr__(self, k: str) -> Attribute:
        return _ShapeAttribute(self, k)

    def __len__(self) -> int:
        return int(_ask(self, "len()", len))

    def __int__(self) -> int:
        return int(_ask(self, "int()"))

    def __index__(self) -> int:
        return operator.index(_ask(self, "an index"))

    def __float__(self) -> float:
        return float(_ask(self, "float()"))

    def __ceil__(self) -> int:
        return int(math.ceil(_ask(self, "math.ceil")))

    def __floor__(self) -> int:
        return int(math.floor(_ask(self, "math.floor")))

    def __trunc__(self) -> int:
        return int(math.trunc(_ask(self, "math.trunc")))

    def __round__(self, ndigits: Optional[int] = None) -> Any:
        return round(_ask(self, "round()"), ndigits)


class _ShapeAttribute(_ShapeProxy, Attribute):
    """``x.shape`` and the like: fx's lazily made attribute proxy, with the
    questions above."""


class Tracer(torch.fx.Tracer):
    """torch.fx's tracer with the exporter's leaf modules, forward()'s
    defaults as constants, and (given the example batch) the numbers of the
    input's shape as Python values (see the module's docstring)."""

    def __init__(self, example: Optional[torch.Tensor] = None):
        super().__init__()
        self._inputs: Tuple[torch.Tensor, ...] = ()
        if example is not None:
            # As export_check.propagate: a batch of one becomes two (a
            # training-mode batchnorm refuses one value per channel), and
            # the second run has one sample more.
            wide = torch.cat([example, example]) if example.shape[0] == 1 else example
            self._inputs = (wide, torch.cat([wide, wide[:1]]))
        self._values: Tuple[Dict[torch.fx.Node, Any], ...] = ({}, {})
        self._shape_only: Dict[torch.fx.Node, bool] = {}
        self._module_methods: Dict[str, Any] = {}

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if (type(m).__module__, type(m).__name__) in LEAF_NAMES:
            return True
        return bool(super().is_leaf_module(m, module_qualified_name))

    def trace(self, root: Any, concrete_args: Optional[Dict[str, Any]] = None) -> torch.fx.Graph:
        """A forward() that takes more than the image batch, each with a
        default (timm's ``forward(x, attn_mask=None, is_causal=False)``), is
        traced with those defaults as constants: the service calls it with
        the batch alone, and a traced ``None`` would otherwise be a proxy
        that ``attn_mask is not None`` takes for a mask."""
        if concrete_args is None and isinstance(root, nn.Module):
            concrete_args = _defaults_after_input(root.forward)
        self._values = ({}, {})
        self._shape_only = {}
        # torch.fx's trace replaces nn.Module.__call__ and __getattr__ with
        # its recorders while it runs; evaluating a node calls modules for
        # real, with the methods as they are before the trace.
        self._module_methods = {k: nn.Module.__dict__[k] for k in ("__call__", "__getattr__")}
        return super().trace(root, concrete_args)

    def proxy(self, node: torch.fx.Node) -> Proxy:
        return _ShapeProxy(node, self)

    def to_bool(self, obj: Proxy) -> bool:
        return bool(self.concrete(obj, "a condition (if, while, and, or, not, assert)"))

    def iter(self, obj: Proxy) -> Iterator[Any]:
        # The elements stay traced values (a shape's batch entry among
        # them, or a chunk's tensors); only their number must be the same at
        # every batch size.
        n = int(self.concrete(obj, "iteration", len))
        return iter([obj[i] for i in range(n)])  # type: ignore[index]

    # -- the numbers of the input's shape --
    def concrete(self, obj: Proxy, use: str, measure: Optional[Callable[[Any], Any]] = None) -> Any:
        """The value of obj's node on the example batch, where Python needs
        it (use says for what): a number, a bool or a shape computed from
        the input's shape alone, the same at both batch sizes; or, given
        measure, measure of that value (len of a shape), which must be."""
        node = obj.node
        stack = list((getattr(self, "module_stack", None) or {}).values())
        path = str(stack[-1][0]) if stack else ""
        if not self._inputs:
            raise ShapeTraceError(f"{use} of a traced value needs its value; no example input was given", path)
        pieces = measure is len and _is_pieces(node)
        if not pieces and not from_shapes(node, self._shape_only):
            raise ShapeTraceError(f"{use} of a value computed from a tensor's values ({node.format_node()}): the "
                                  "trace would keep the example's branch or number for every batch; only numbers "
                                  "computed from tensor shapes (x.shape, x.size(), x.dim()) can be used so", path)
        got = [self._evaluate(node, i) for i in range(2)]
        if not pieces and not all(_is_number(g) for g in got):
            raise ShapeTraceError(f"{use} of {type(got[0]).__name__} {node.format_node()}; only numbers computed "
                                  "from tensor shapes can be used so", path)
        if measure is not None:
            got = [measure(g) for g in got]
        if got[0] != got[1]:
            raise ShapeTraceError(f"{use} of a value that depends on the batch size ({node.format_node()}: "
                                  f"{got[0]} at a batch of {self._inputs[0].shape[0]}, {got[1]} at "
                                  f"{self._inputs[1].shape[0]}); the service trains any batch size with one graph",
                                  path)
        return got[0]

    def _evaluate(self, node: torch.fx.Node, which: int) -> Any:
        """node's value on input `which`, running the nodes it needs that
        have not run yet in graph order (memoised per trace), without
        gradients and with the caller's random state kept."""
        values = self._values[which]
        need: Set[torch.fx.Node] = set()
        todo = [node]
        while todo:
            n = todo.pop()
            if n in values or n in need:
                continue
            need.add(n)
            todo.extend(n.all_input_nodes)
        order = [n for n in node.graph.nodes if n in need]
        tracing = {k: nn.Module.__dict__[k] for k in self._module_methods}
        try:
            for k, f in self._module_methods.items():
                setattr(nn.Module, k, f)
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                for n in order:
                    values[n] = self._run(n, values, self._inputs[which])
        finally:
            for k, f in tracing.items():
                setattr(nn.Module, k, f)
        return values[node]

    def _run(self, n: torch.fx.Node, values: Dict[torch.fx.Node, Any], x: torch.Tensor) -> Any:
        def load(a: Any) -> Any:
            return torch.fx.node.map_arg(a, lambda m: values[m])
        args, kwargs = load(n.args), load(n.kwargs)
        if n.op == "placeholder":
            first = next(iter(p for p in n.graph.nodes if p.op == "placeholder"))
            return x if n is first else (args[0] if args else None)
        if n.op == "get_attr":
            obj: Any = self.root
            for part in str(n.target).split("."):
                obj = getattr(obj, part)
            return obj
        if n.op == "call_module":
            return self.root.get_submodule(str(n.target))(*args, **kwargs)
        if n.op == "call_function":
            return n.target(*args, **kwargs)  # type: ignore[operator]
        if n.op == "call_method":
            return getattr(args[0], str(n.target))(*args[1:], **kwargs)
        raise ShapeTraceError(f"cannot evaluate {n.format_node()} while tracing", "")
