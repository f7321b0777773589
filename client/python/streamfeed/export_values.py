"""The values of a traced graph as streamfeed.export tracks them while it
converts a module: a tensor as the service sees it (the layer that makes
it, its per-sample shape, its layout) and the partial patterns on their way
to a layer (a MultiheadAttention's output pair, a channel shuffle's views, a
chunk's pieces, a parameter expanded over the batch). Plain data: the
converter in export.py decides what each becomes; the two checks at the end
are the form a layer of a map asks of its input."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import torch.fx

from .export_error import ExportError


@dataclass
class _Val:
    """A tensor of the traced graph as the service sees it: the layer that
    makes it (-1: the model input), its per-sample shape in the service's
    terms ([C,H,W], [F], or [T,C] for a token sequence), whether PyTorch
    holds it permuted to channels-last ([N,H,W,C], ConvNeXt's blocks),
    whether it is a token sequence (tokens: [N,T,C] in PyTorch and in the
    service) and whether it is a map reshaped to [N,C,H*W] on its way to
    becoming one (ct: no layer of its own; the permute that follows makes
    the tokens)."""
    layer: int
    shape: Tuple[int, ...]
    nhwc: bool = False
    tokens: bool = False
    ct: bool = False

    def plain(self, ndim: int) -> bool:
        """Whether the tensor has ndim dimensions per sample in the service's
        own form: a [C,H,W] map (3) or flat features (1), neither
        channels-last, nor a token sequence, nor a map on its way to one."""
        return len(self.shape) == ndim and not (self.nhwc or self.tokens or self.ct)


@dataclass
class _Attention:
    """The output pair of a MultiheadAttention call: (its output, its
    attention weights); only the first may be used."""
    out: _Val


@dataclass
class _Grouped:
    """A map viewed as [N, groups, C/groups, H, W] on its way to a channel
    shuffle (transposed: after its transpose(1, 2)); the view that ends
    the pattern makes the channel_shuffle layer. The whole pattern was
    checked at its first view."""
    x: _Val
    groups: int
    transposed: bool = False


@dataclass
class _Pieces:
    """The tuple of a chunk or split along channels: piece i is the
    channels pieces[i] = (start, count) of x, made into a channel_slice
    layer when an index takes it (a piece nothing takes costs nothing)."""
    x: _Val
    pieces: List[Tuple[int, int]]
    node: torch.fx.Node
    short: str
    taken: Dict[int, _Val] = field(default_factory=dict)


@dataclass
class _Expanded:
    """A module parameter expanded over the batch (the class token before
    its torch.cat)."""
    target: str
    shape: Tuple[int, ...]


@dataclass
class _ChannelParam:
    """A module's [C] parameter viewed as [1, C, 1, 1] (timm's ConvNeXt:
    ``x.mul(self.gamma.reshape(1, -1, 1, 1))``), or as [C] itself (as_is:
    timm's MetaFormer ``Scale`` on a channels-last map,
    ``x * self.scale.view((C,))``), waiting for its mul."""
    target: str
    as_is: bool = False

    def misused(self, what: str) -> str:
        view = "[C]" if self.as_is else "[1, C, 1, 1]"
        return (f"takes the parameter {self.target} viewed as {view} as its {what}; such a view is "
                "supported as a map's per-channel scale (x * it: layer_scale) only")


@dataclass
class _Padded:
    """A map zero-padded on its way into the one nn.Conv2d that reads it
    (nn.ZeroPad2d, nn.ConstantPad2d(p, 0), F.pad): no layer of its own
    where the convolution can add sides, (left, right, top, bottom) as
    PyTorch orders them, to its own padding; else a pad layer named name
    (generated: made from a function's module path), which op and path
    name where it is refused. A convolution's own padding, where it needs
    a pad layer, is described so too (export_pad.conv_pads)."""
    x: _Val
    sides: Tuple[int, int, int, int]
    op: str
    path: str
    name: str
    generated: bool


@dataclass
class _TokenSlice:
    """x[:, start:] of a token sequence x: the tokens from start on, which
    only a mean over the tokens reads (token_mean's start; timm's average
    pooling leaves the class token out so)."""
    x: _Val
    start: int

    def misused(self, what: str) -> str:
        return (f"takes x[:, {self.start}:] of a token sequence as its {what}; such a slice is supported as the "
                "input of a mean over the tokens (dim=1) only")


@dataclass
class _ChannelSeq:
    """The pooled channels of a map viewed as a one-channel sequence
    [N, 1, C] (ECA's x.mean((2, 3)).view(n, 1, -1)); x is the service's
    [C,1,1] map, which holds the same values in a row in either layout
    (export_eca.py)."""
    x: _Val

    def misused(self, what: str) -> str:
        return (f"takes the pooled channels viewed as [N, 1, C] as its {what}; such a view is supported as the "
                "input of nn.Conv1d(1, 1, k, padding=(k - 1) // 2), of an activation and of a view back to "
                "[N, C, 1, 1] or [N, C] (ECA's channel attention)")


@dataclass
class _Broadcast:
    """A [C,1,1] map expanded to [C,H,W] (y.expand_as(x)), which only a
    multiply by a map of that shape reads: the service's mul broadcasts a
    [C,1,1] factor itself. shape is the expansion's, [C,H,W]."""
    x: _Val
    shape: Tuple[int, ...]

    def misused(self, what: str) -> str:
        return (f"takes a [C,1,1] map expanded to [C,H,W] as its {what}; such an expansion is supported as a "
                "factor of a multiply only")


def _spatial(shape: Tuple[int, ...], op: str, path: str) -> Tuple[int, int, int]:
    if len(shape) != 3:
        raise ExportError(f"needs a [C,H,W] map, not a tensor of per-sample shape {list(shape)}", op=op,
                          module_path=path)
    return shape[0], shape[1], shape[2]


def _need_nchw(x: _Val, op: str, path: str) -> None:
    """Refuses a module that runs only on a [C,H,W] map in the service's own
    layout when its input is channels-last or a token sequence."""
    if x.nhwc:
        raise ExportError("runs on a channels-last (permuted) tensor; only LayerNorm, Linear and "
                          "activations are supported between permute(0,2,3,1) and permute(0,3,1,2)",
                          op=op, module_path=path)
    if x.tokens or x.ct:
        raise ExportError("runs on a token sequence; LayerNorm, Linear, MultiheadAttention, activations, "
                          "dropout and adds are supported on tokens", op=op, module_path=path)
