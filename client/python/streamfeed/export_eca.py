"""How streamfeed.export maps ECA's channel attention (timm's ``EcaModule``,
the ECA-Net paper's module, in ECA-ResNets and ECA-NFNets)::

    y = x.mean((2, 3)).view(x.shape[0], 1, -1)   # the pooled channels as a one-channel sequence
    y = self.gate(self.conv(y))                  # nn.Conv1d(1, 1, k, padding=(k - 1) // 2), a sigmoid
    return x * y.view(x.shape[0], -1, 1, 1).expand_as(x)

The mean is a global_avgpool whose [C,1,1] output holds each sample's C
values in a row in either of the service's layouts, the memory of the
[N, 1, C] view: the view costs no layer, the Conv1d is a channel_conv1d
layer along those values, an activation stays on them, the view back to
[N, C, 1, 1] (or [N, C]) ends the pattern, and ``expand_as`` is the
broadcast the service's mul does itself. Any other reader of the view,
and a Conv1d anywhere else, is refused naming the op and module path. A
mixin of the converter in export.py, whose builder and value lookups it
uses."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Tuple, Union

import torch
import torch.fx
from torch import nn

from .export_error import ExportError
from .export_folds import function_activation, module_activation
from .export_nodes import _meta_shape
from .export_values import _Broadcast, _ChannelSeq, _Val

if TYPE_CHECKING:
    from .export import _Builder

__all__ = ["ChannelConvs", "CONV1D_REFUSAL", "ECA_HINT"]

CONV1D_REFUSAL = ("nn.Conv1d is supported as ECA's Conv1d(1, 1, k, padding=(k - 1) // 2) across the pooled "
                  "channels x.mean((2, 3)).view(n, 1, -1) (channel_conv1d); the service has no [N, C, L] tensors")


# What a refused view to [N, 1, C] is told: the form ECA's view takes.
ECA_HINT = ("; the pooled channels as [N, 1, C] are supported as ECA writes them: x.mean((2, 3)) without keepdim, "
            "read only by views to [N, 1, C]")


def _is_view(u: torch.fx.Node) -> bool:
    return (u.op == "call_method" and u.target in ("view", "reshape")) or \
        (u.op == "call_function" and u.target is torch.reshape)


class ChannelConvs:
    """The ECA handlers of export.py's converter."""
    if TYPE_CHECKING:
        b: _Builder

        def val(self, a: Any, node: torch.fx.Node, what: str = "input") -> _Val: ...

        def fname(self, n: torch.fx.Node, short: str) -> str: ...

        def flatten(self, path: str, x: _Val, n: torch.fx.Node, op: str, start: int, end: int) -> _Val: ...

    def channel_seq_mean(self, n: torch.fx.Node, c: int) -> bool:
        """Whether every reader of the mean n (over a map's height and
        width, no keepdim) views it as [N, 1, C]: then it stays the pooled
        [C,1,1] map, with no flatten, for the Conv1d across its channels."""
        users = list(n.users)
        return bool(users) and all(_is_view(u) and _meta_shape(u) is not None and
                                   tuple(_meta_shape(u) or ())[1:] == (1, c) for u in users)

    def channel_seq_module(self, n: torch.fx.Node, seq: _ChannelSeq, mod: Any, op: str, path: str) -> _ChannelSeq:
        """A module called on the [N, 1, C] view: ECA's Conv1d, an
        activation, or an identity."""
        if isinstance(mod, nn.Conv1d):
            return _ChannelSeq(self.channel_conv1d(seq.x, mod, op, path))
        act = module_activation(n, mod, op, path)
        if act:
            return _ChannelSeq(self.b.emit(act[0], path, [seq.x], seq.x.shape, **act[1]))
        if type(mod) is nn.Identity:
            return seq
        raise ExportError(seq.misused("input"), op=op, module_path=path)

    def channel_conv1d(self, x: _Val, mod: nn.Conv1d, op: str, path: str) -> _Val:
        k, pad = int(mod.kernel_size[0]), mod.padding
        p = pad if isinstance(pad, str) else int(pad[0])
        if p == "same":
            p = (k - 1) // 2 if k % 2 else -1
        elif p == "valid":
            p = 0
        plain = (mod.in_channels, mod.out_channels, mod.groups, tuple(mod.stride), tuple(mod.dilation),
                 mod.padding_mode) == (1, 1, 1, (1,), (1,), "zeros")
        if not plain or p != (k - 1) // 2 or k % 2 == 0:
            raise ExportError(f"Conv1d({mod.in_channels}, {mod.out_channels}, {k}, stride={tuple(mod.stride)}, "
                              f"padding={pad!r}, dilation={tuple(mod.dilation)}, groups={mod.groups}, "
                              f"padding_mode={mod.padding_mode!r}) across the pooled channels; supported is "
                              "Conv1d(1, 1, k, padding=(k - 1) // 2) with k odd, which keeps the C channels the "
                              "multiply needs", op=op, module_path=path)
        return self.b.emit("channel_conv1d", path, [x], x.shape, params=["weight"] + (["bias"] if mod.bias is not
                                                                                       None else []),
                           k=k, pad=p, bias=mod.bias is not None)

    def channel_seq_function(self, n: torch.fx.Node, seq: _ChannelSeq, meth: Optional[str], out: Tuple[int, ...],
                             op: str, path: str) -> Union[_ChannelSeq, _Val]:
        """A function or tensor method on the [N, 1, C] view: a view that
        keeps it or ends it (a flatten to [N, C] too), or an activation."""
        t = n.target
        c = seq.x.shape[0]
        if _is_view(n) or meth == "flatten" or t is torch.flatten:
            if out == (1, c):
                return seq
            if out == (c, 1, 1):
                return seq.x
            if out == (c,):
                return self.flatten(path, seq.x, n, op, 1, -1)
        if meth == "contiguous":
            return seq
        act = function_activation(n, op, path)
        if act:
            return _ChannelSeq(self.b.emit(act[0], self.fname(n, act[0]), [seq.x], seq.x.shape, **act[1]))
        raise ExportError(seq.misused("input") + (f" (here a view to {list(out)})" if _is_view(n) else ""), op=op,
                          module_path=path)

    def broadcast(self, n: torch.fx.Node, x: _Val, out: Tuple[int, ...], op: str, path: str) -> _Broadcast:
        """y.expand_as(x) or y.expand(...) of a [C,1,1] map to [C,H,W]: the
        broadcast of a multiply, which the service's mul does itself."""
        if len(x.shape) != 3 or x.shape[1:] != (1, 1) or len(out) != 3 or out[0] != x.shape[0] or \
                x.nhwc or x.tokens or x.ct:
            raise ExportError(f"expands a tensor of per-sample shape {list(x.shape)} to {list(out)}; supported is "
                              "a [C,1,1] map expanded to [C,H,W] as a factor of a multiply", op=op, module_path=path)
        return _Broadcast(x, out)
