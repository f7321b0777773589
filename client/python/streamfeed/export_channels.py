"""How streamfeed.export maps the channel views of a [C,H,W] map: channel
shuffles (``nn.ChannelShuffle``, and torchvision's ``channel_shuffle`` written
as a view to [N, g, C/g, H, W], a transpose of dimensions 1 and 2 and a view
back), pixel shuffles (``nn.PixelShuffle``, ``nn.PixelUnshuffle`` and their
functions), and the channel ranges of ``x.chunk``/``x.split`` along dim 1 and
``x[:, a:b]``. Each is one layer of the service (channel_shuffle,
pixel_shuffle, pixel_unshuffle, channel_slice) or none where the view keeps
the channels in order; any other use of these views is refused naming the op
and module path. A mixin of the converter in export.py, whose builder and
value lookups it uses."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Optional, Tuple

import torch
import torch.fx

from .export_error import ExportError
from .export_nodes import _dims_of, _is_method_or, _meta_shape, _only_user, _path_of
from .export_supported import _supported_functions
from .export_values import _Grouped, _Pieces, _Val, _need_nchw, _spatial

if TYPE_CHECKING:
    from .export import _Builder

__all__ = ["ChannelViews"]


class ChannelViews:
    """The channel-view handlers of export.py's converter."""
    if TYPE_CHECKING:
        b: _Builder

        def val(self, a: Any, node: torch.fx.Node, what: str = "input") -> _Val: ...

        def opname(self, node: torch.fx.Node) -> str: ...

        def fname(self, n: torch.fx.Node, short: str) -> str: ...

    def channel_shuffle(self, path: str, x: _Val, groups: int, op: str, generated: bool = True) -> _Val:
        c, _, _ = _spatial(x.shape, op, path)
        _need_nchw(x, op, path)
        if groups < 1 or c % groups:
            raise ExportError(f"shuffles {c} channels in {groups} groups; the groups must divide the channels",
                              op=op, module_path=path)
        if groups in (1, c):
            return x  # [1, C] or [C, 1] transposed: the channels stay in order
        return self.b.emit("channel_shuffle", path, [x], x.shape, generated=generated, groups=groups)

    def pixel_shuffle(self, path: str, x: _Val, r: int, shuffle: bool, op: str, generated: bool = True) -> _Val:
        """nn.PixelShuffle (shuffle) or nn.PixelUnshuffle by the factor r."""
        c, h, w = _spatial(x.shape, op, path)
        _need_nchw(x, op, path)
        if shuffle and (r < 1 or c % (r * r)):
            raise ExportError(f"upscale_factor {r}: its square must divide the input's {c} channels", op=op,
                              module_path=path)
        if not shuffle and (r < 1 or h % r or w % r):
            raise ExportError(f"downscale_factor {r} must divide the input's height {h} and width {w}", op=op,
                              module_path=path)
        if r == 1:
            return x
        shape = (c // (r * r), h * r, w * r) if shuffle else (c * r * r, h // r, w // r)
        return self.b.emit("pixel_shuffle" if shuffle else "pixel_unshuffle", path, [x], shape,
                           generated=generated, factor=r)

    def pixel_shuffle_call(self, n: torch.fx.Node, shuffle: bool, op: str) -> _Val:
        """F.pixel_shuffle (shuffle) or F.pixel_unshuffle, its factor positional or by keyword."""
        key = "upscale_factor" if shuffle else "downscale_factor"
        r: Any = n.args[1] if len(n.args) > 1 else n.kwargs[key]
        return self.pixel_shuffle(self.fname(n, "pixel_shuffle" if shuffle else "pixel_unshuffle"),
                                  self.val(n.args[0] if n.args else n.kwargs["input"], n), int(r), shuffle, op)

    def shuffle_pattern(self, n: torch.fx.Node, x: _Val, out: Tuple[int, ...]) -> Optional[int]:
        """The groups g where n views the map x as [N, g, C/g, H, W], its
        only reader transposes dimensions 1 and 2 and that one's only
        reader (after an optional contiguous()) views it back as [N, C, H, W]
        or flattens dimensions 1 and 2: torchvision's channel_shuffle. None
        for any other view."""
        if not x.plain(3) or len(out) != 4:
            return None
        c, h, w = x.shape
        if out[0] * out[1] != c or out[2:] != (h, w):
            return None
        t = _only_user(n)
        if t is None or not _is_method_or(t, ("transpose",), (torch.transpose,)):
            return None
        d0, d1 = _dims_of(t, 1)
        if not isinstance(d0, int) or not isinstance(d1, int) or {d0 % 5, d1 % 5} != {1, 2}:
            return None
        u = _only_user(t)
        if u is not None and u.op == "call_method" and u.target == "contiguous":
            u = _only_user(u)
        if u is None or _meta_shape(u) is None or _meta_shape(u)[1:] != x.shape:  # type: ignore[index]
            return None
        if _is_method_or(u, ("flatten",), (torch.flatten,)):
            s0, s1 = _dims_of(u, 1)
            return int(out[0]) if (s0, s1) in ((1, 2), (1, -3)) else None
        if _is_method_or(u, ("view", "reshape"), (torch.reshape,)):
            return int(out[0])
        return None

    def shuffle_step(self, n: torch.fx.Node, gv: _Grouped, meth: Optional[str], op: str, path: str) -> Any:
        """The transpose, contiguous() and closing view of the pattern
        shuffle_pattern matched at its first view."""
        if not gv.transposed and _is_method_or(n, ("transpose",), (torch.transpose,)):
            return _Grouped(gv.x, gv.groups, True)
        if meth == "contiguous":
            return gv
        if gv.transposed and _is_method_or(n, ("view", "reshape", "flatten"), (torch.reshape, torch.flatten)):
            return self.channel_shuffle(self.fname(n, "channel_shuffle"), gv.x, gv.groups, op)
        raise ExportError("uses a map viewed as [N, groups, C/groups, H, W] other than as a channel shuffle",
                          op=op, module_path=path, supported=_supported_functions())

    def pieces(self, n: torch.fx.Node) -> _Pieces:
        """x.chunk(k, dim=1), x.split(size or sizes, dim=1) and their torch
        functions: the channel ranges PyTorch made (an uneven last chunk
        included), read from the traced shapes; of a channels-last map
        [N, H, W, C] along its last dimension too (MambaOut's gated block)."""
        op, path = self.opname(n), _path_of(n)
        x = self.val(n.args[0] if n.args else n.kwargs.get("input", n.kwargs.get("tensor")), n)
        short = "chunk" if "chunk" in str(getattr(n.target, "__name__", n.target)) else "split"
        dim = n.args[2] if len(n.args) > 2 else n.kwargs.get("dim", 0)
        metas = n.meta.get("tensor_meta")
        cl = x.nhwc and len(x.shape) == 3
        if not (x.plain(3) or cl) or not isinstance(dim, int) or dim % 4 != (3 if cl else 1) or \
                not isinstance(metas, (tuple, list)):
            shape = list(x.shape[1:]) + [x.shape[0]] if cl else list(x.shape)  # as torch holds it
            raise ExportError(f"splits a tensor of per-sample shape {shape} along dimension {dim}; the "
                              "service slices [C,H,W] maps along channels (dim=1; dim=-1 of a channels-last map)",
                              op=op, module_path=path)
        spans: List[Tuple[int, int]] = []
        start = 0
        for tm in metas:
            count = int(tm.shape[3 if cl else 1])
            spans.append((start, count))
            start += count
        return _Pieces(x, spans, n, short)

    def channel_slice(self, name: str, x: _Val, start: int, count: int, op: str, path: str) -> _Val:
        c = x.shape[0]
        if count < 1:
            raise ExportError(f"takes no channels (a slice of [{start}, {start + count}) of {c})", op=op,
                              module_path=path)
        if (start, count) == (0, c):
            return x
        return self.b.emit("channel_slice", name, [x], (count,) + tuple(x.shape[1:]), nhwc=x.nhwc, start=start,
                           count=count)

    def take_piece(self, n: torch.fx.Node, pv: _Pieces, op: str, path: str) -> _Val:
        i = n.args[1]
        if not isinstance(i, int) or not -len(pv.pieces) <= i < len(pv.pieces):
            raise ExportError(f"indexes the pieces of a {pv.short} with {i!r}; supported is one piece by its "
                              "number", op=op, module_path=path)
        i %= len(pv.pieces)
        if i not in pv.taken:
            start, count = pv.pieces[i]
            pv.taken[i] = self.channel_slice(self.fname(pv.node, f"{pv.short}{i}"), pv.x, start, count,
                                             self.opname(pv.node), _path_of(pv.node))
        return pv.taken[i]

    def channel_range(self, n: torch.fx.Node, x: _Val, idx: Any, op: str, path: str) -> Optional[_Val]:
        """x[:, a:b] (with any trailing full slices or an Ellipsis) of a
        [C,H,W] map; None for any other index."""
        if not isinstance(idx, tuple) or len(idx) < 2 or not x.plain(3):
            return None
        rest = idx[2:]
        if idx[0] != slice(None) or not isinstance(idx[1], slice) or \
                any(r is not Ellipsis and r != slice(None) for r in rest):
            return None
        sl = idx[1]
        if any(v is not None and not isinstance(v, int) for v in (sl.start, sl.stop, sl.step)) or \
                sl.step not in (None, 1):
            return None
        start, stop, _ = sl.indices(x.shape[0])
        return self.channel_slice(self.fname(n, "slice"), x, start, max(stop - start, 0), op, path)
