"""The exporter's check that torch.fx's trace of a module computes what the
module's own forward() computes. The converter maps the trace, so a module
the trace gets wrong would be trained as another model than the user's,
without a word: torch.fx records ``z += 1`` on a traced value as an
out-of-place add, so an in-place write through a second name of a tensor
(``z = y; z += 1``, after which eager PyTorch's ``y`` has changed too) is
lost, and Python control flow is traced one way only. Both run in eval mode
without gradients on a pseudo-random input of the example's shape, each on
its own copy of it and from the same random state.

Also the shape propagation the converter reads (propagate): each tensor's
shape, and the numbers the graph computes from its input's shape that do
not depend on the batch size (a pooling kernel of ``x.size()[2:]``), which
the converter takes as the numbers they are."""
from __future__ import annotations

import re
from typing import Any, Callable, List

import torch
import torch.fx
from torch.fx.passes.shape_prop import ShapeProp

from .export_error import ExportError

__all__ = ["check_trace", "forward_failed", "propagate", "static_number"]

# Both sides run the same operators on the same device in the same order, so
# they agree to the last bit but for a kernel that picks another summation
# order between calls; an alias that is lost changes values by their size.
_RTOL = 1e-5


def forward_failed(e: BaseException, shape: List[int]) -> ExportError:
    """The refusal of a module whose forward() raised e on an input of the
    given shape while the trace ran: PyTorch's own message (a reflect pad
    wider than its input: "Padding size should be less than the
    corresponding input dimension") and the module path of the node that
    raised it, without ShapeProp's dump of the node and its traceback."""
    root: BaseException = e
    while root.__cause__ is not None:
        root = root.__cause__
    m = re.search(r"call_module\[target=([\w.]+)\]", str(e))
    return ExportError(f"the module's forward() fails on an input of shape {shape}: {str(root).strip()}",
                       op="forward", module_path=m.group(1) if m else "")


def _leaves(out: Any) -> List[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for k in out for t in _leaves(out[k])]
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in _leaves(v)]
    return []


def check_trace(module: torch.nn.Module, tracer: Callable[[], torch.fx.Tracer], x: torch.Tensor) -> None:
    """Traces ``module`` again as it is now (in eval mode: the converter's
    trace is of training mode, where a forward() that passes
    ``self.training`` on bakes True into the graph), runs that trace and
    the module itself on copies of ``x`` from the same random state (a
    forward() may draw: F.dropout(training=True)), and raises ExportError
    when their outputs differ. The caller has put the module in eval mode
    and turned gradients off. A module that traces in training mode but not
    in eval mode is not checked: the converter's own trace stands."""
    try:
        gm = torch.fx.GraphModule(module, tracer().trace(module))
    except Exception:
        return
    # The example input is often zeros (a shape given): a pseudo-random one
    # of its shape makes a lost write or a branch show in the outputs.
    x = torch.randn(x.shape, generator=torch.Generator().manual_seed(0), dtype=x.dtype)
    with torch.random.fork_rng(devices=[]):  # the caller's random state is left as it was
        state = torch.get_rng_state()
        try:
            traced_out = gm(x.clone())
        except Exception as e:
            raise ExportError(f"the module's forward() fails on an input of shape {list(x.shape)}: {e}",
                              op="forward") from e
        torch.set_rng_state(state)
        try:
            want = _leaves(module(x.clone()))
        except Exception as e:
            raise ExportError(f"the module's forward() fails on an input of shape {list(x.shape)}: {e}",
                              op="forward") from e
    got = _leaves(traced_out)
    why = ""
    if len(got) != len(want):
        why = f"{len(got)} output tensors where forward() returns {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if why:
            break
        if g.shape != w.shape:
            why = f"output {i} is {list(g.shape)} where forward() returns {list(w.shape)}"
            continue
        g64, w64 = g.detach().double(), w.detach().double()
        scale = float(w64.abs().nan_to_num(posinf=0.0, neginf=0.0).max()) if w64.numel() else 0.0
        if not torch.allclose(g64, w64, rtol=_RTOL, atol=_RTOL * scale, equal_nan=True):
            diff = float((g64 - w64).abs().nan_to_num(nan=float("inf")).max())
            why = f"output {i} differs by up to {diff:.3g} (its values reach {scale:.3g})"
    if why:
        raise ExportError(
            f"torch.fx's trace of the module computes another output than its forward() does: {why}. The "
            "trace loses an in-place write made through another name of a tensor (z = y; z += 1 changes y "
            "in PyTorch, not in the trace) and follows Python control flow one way only; write such a step "
            "out of place (z = y + 1) and keep the forward() free of branches on values",
            op="forward")


def _is_number_value(v: Any) -> bool:
    """An int or float, or a tuple, list or torch.Size of them (no bool: a
    flag is not a size)."""
    if isinstance(v, (tuple, list)):
        return all(_is_number_value(e) for e in v)
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class _ValueProp(ShapeProp):
    """ShapeProp (each tensor's tensor_meta) that also keeps, in each node's
    meta[key], the value it computed where that value is a number or a tuple
    of numbers (a size, an element of one, arithmetic on them)."""

    def __init__(self, gm: torch.fx.GraphModule, key: str):
        super().__init__(gm)
        self.key = key

    def run_node(self, n: torch.fx.Node) -> Any:
        result = super().run_node(n)
        if _is_number_value(result):
            n.meta[self.key] = tuple(result) if isinstance(result, (tuple, list)) else result
        return result


def propagate(gm: torch.fx.GraphModule, x: torch.Tensor) -> None:
    """ShapeProp's propagation of x, which leaves each tensor's shape in
    its node's tensor_meta, and marks the numbers the graph computes from its input's shape that do
    not depend on the batch size: ``F.avg_pool2d(x, x.size()[2:])``'s kernel
    is (4, 4) for any batch, ``x.size(0)`` is not a constant. The graph runs
    on batches of two sizes (x's and one more, the same values otherwise),
    and a node whose number is the same in both gets it as
    meta["sf_static"]. A module whose forward() takes only x's batch size
    (a view with the batch written in) gets no constants, and its computed
    arguments stay refused. Run in eval mode without gradients; x's run is
    the last, so the tensor_meta left is x's (or, for a batch of one, that
    of x twice over where the module takes it)."""
    # A batch of one becomes two where the module takes it: the trace is of
    # training mode, and a batchnorm there refuses one value per channel (a
    # [1, C, 1, 1] map after a global pool: timm's MobileNetV4 head).
    wide = torch.cat([x, x]) if x.shape[0] == 1 else x
    try:
        _ValueProp(gm, "sf_value_alt").propagate(torch.cat([wide, wide[:1]]))
    except Exception:  # noqa: BLE001 (any failure of the user's forward at another batch size)
        for n in gm.graph.nodes:
            n.meta.pop("sf_value_alt", None)
    try:
        _ValueProp(gm, "sf_value").propagate(wide)
    except Exception:  # noqa: BLE001 (a forward() that takes only x's batch size)
        if wide is x:
            raise
        for n in gm.graph.nodes:
            n.meta.pop("sf_value", None)
        _ValueProp(gm, "sf_value").propagate(x)
    for n in gm.graph.nodes:
        v = n.meta.pop("sf_value", None)
        if v is not None and n.meta.pop("sf_value_alt", None) == v:
            n.meta["sf_static"] = v
        n.meta.pop("sf_value_alt", None)


def static_number(v: Any) -> Any:
    """v with every graph node in it (a node, or a node in a tuple or list)
    replaced by the constant propagate() found for it; raises
    LookupError where a node has none (a tensor, or a number that depends on
    the batch size)."""
    if isinstance(v, torch.fx.Node):
        if "sf_static" not in v.meta:
            raise LookupError(v.name)
        return v.meta["sf_static"]
    if isinstance(v, (tuple, list)):
        return type(v)(static_number(e) for e in v)
    return v
