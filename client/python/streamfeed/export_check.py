"""The exporter's check that torch.fx's trace of a module computes what the
module's own forward() computes. The converter maps the trace, so a module
the trace gets wrong would be trained as another model than the user's,
without a word: torch.fx records ``z += 1`` on a traced value as an
out-of-place add, so an in-place write through a second name of a tensor
(``z = y; z += 1``, after which eager PyTorch's ``y`` has changed too) is
lost, and Python control flow is traced one way only. Both run in eval mode
without gradients on a pseudo-random input of the example's shape, each on
its own copy of it and from the same random state."""
from __future__ import annotations

import re
from typing import Any, Callable, List

import torch
import torch.fx

from .export_error import ExportError

__all__ = ["check_trace", "forward_failed"]

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
