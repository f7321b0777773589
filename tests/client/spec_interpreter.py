"""A model spec interpreter for the exporter's tests: run_spec runs a spec
layer by layer with torch functions, in eval mode, as docs/LAYERS.md defines
each kind, on the exported tensors; assert_spec_computes_the_module exports
a module and requires the spec to give the module's own output (a wrong
input order, a missed permute, a swapped mul or a lost layer changes the
numbers). Shared by test_export*.py."""
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from streamfeed.export import convert  # noqa: E402


# ---- a spec interpreter (eval mode), the kinds of docs/LAYERS.md in torch -------------------


def run_spec(spec, tensors, x):
    """The eval-mode output of a spec with the given tensors for input x [N,C,H,W]."""
    layers = spec["layers"]
    index = {layer["name"]: i for i, layer in enumerate(layers)}
    outs = []

    def inp(layer, i):
        ins = layer.get("inputs")
        if ins is None:
            return [outs[i - 1] if i else x]
        return [x if v == -1 else outs[index[v] if isinstance(v, str) else v] for v in ins]

    for i, layer in enumerate(layers):
        t, name, a = layer["type"], layer["name"], inp(layer, i)
        renamed = layer.get("param_names", {})  # the module's own suffixes for the kind's
        # "" (a kind's own suffix, or a param_names value) is the layer's name alone
        key = lambda s: f"{name}.{renamed.get(s, s)}" if renamed.get(s, s) else name  # noqa: E731
        p = lambda s: tensors[key(s)]  # noqa: E731
        b = (lambda s: tensors.get(key(s)))
        if t == "conv2d":
            y = F.conv2d(a[0], p("weight"), b("bias") if layer.get("bias", True) else None, layer.get("stride", 1),
                         layer.get("pad", 0), layer.get("dilation", 1), layer.get("groups", 1))
            assert y.shape[1] == layer["out"]
            k = layer["k"] if isinstance(layer["k"], list) else [layer["k"]] * 2
            assert list(p("weight").shape[2:]) == k
        elif t == "conv_transpose2d":
            y = F.conv_transpose2d(a[0], p("weight"), b("bias") if layer.get("bias", True) else None,
                                   layer.get("stride", 1), layer.get("pad", 0))
        elif t == "batchnorm2d":
            y = F.batch_norm(a[0], p("running_mean"), p("running_var"), p("weight"), p("bias"), False, 0.0,
                             layer.get("eps", 1e-5))
        elif t in ("relu", "relu6", "silu", "hardswish", "hardsigmoid", "sigmoid"):
            y = {"relu": F.relu, "relu6": F.relu6, "silu": F.silu, "hardswish": F.hardswish,
                 "hardsigmoid": F.hardsigmoid, "sigmoid": torch.sigmoid}[t](a[0])
        elif t == "gelu":
            y = F.gelu(a[0], approximate=layer.get("approximate", "none"))
        elif t == "tanh":
            y = torch.tanh(a[0])
        elif t == "leaky_relu":
            y = F.leaky_relu(a[0], layer["negative_slope"])
        elif t == "elu":
            y = F.elu(a[0], layer["alpha"])
        elif t == "selu":
            y = torch.selu(a[0])
        elif t == "softplus":
            y = F.softplus(a[0], layer["beta"], layer["threshold"])
        elif t == "mish":
            y = F.mish(a[0])
        elif t == "square":
            y = torch.square(a[0])
        elif t == "affine":
            y = a[0] * layer.get("scale", 1.0) + layer.get("shift", 0.0)
        elif t == "clamp":
            assert layer["grad"] in ("clamp", "clamp_closed", "hardtanh") and ("min" in layer or "max" in layer), name
            y = torch.clamp(a[0], layer.get("min"), layer.get("max"))
        elif t == "prelu":
            assert p("weight").shape == (layer.get("num_parameters", 1),), name
            y = F.prelu(a[0], p("weight"))
        elif t == "channel_conv1d":  # across a [N,C,1,1] map's or [N,C] features' channels
            assert p("weight").shape == (1, 1, layer["k"]), name
            flat = a[0].reshape(a[0].shape[0], 1, -1)
            y = F.conv1d(flat, p("weight"), b("bias") if layer.get("bias", True) else None,
                         padding=layer.get("pad", 0)).reshape(a[0].shape)
        elif t == "maxpool2d":
            y = F.max_pool2d(a[0], layer["k"], layer.get("stride", layer["k"]), layer.get("pad", 0),
                             ceil_mode=layer.get("ceil_mode", False))
        elif t == "avgpool2d":
            y = F.avg_pool2d(a[0], layer["k"], layer.get("stride", layer["k"]), layer.get("pad", 0),
                             ceil_mode=layer.get("ceil_mode", False),
                             count_include_pad=layer.get("count_include_pad", True))
        elif t == "global_avgpool":
            y = a[0].mean((2, 3), keepdim=True)
        elif t == "adaptive_avgpool2d":
            y = F.adaptive_avg_pool2d(a[0], layer["out"])
        elif t == "flatten":
            y = a[0].flatten(1)
        elif t == "linear":
            if layer.get("over") == "channels":
                y = F.linear(a[0].permute(0, 2, 3, 1), p("weight"), b("bias")).permute(0, 3, 1, 2)
            else:
                assert a[0].dim() in (2, 3), name  # features [N,F] or tokens [N,T,C]
                y = F.linear(a[0], p("weight"), b("bias") if layer.get("bias", True) else None)
        elif t == "add":
            assert a[0].shape == a[1].shape, name
            y = a[0] + a[1]
        elif t == "mul":
            assert a[1].shape == a[0].shape or a[1].shape[2:] == (1, 1), name
            y = a[0] * a[1]
        elif t == "layer_scale":  # per channel; a [C] parameter ("vector") scales a map's channels too
            w = p("layer_scale")
            y = a[0] * (w.view(1, -1, 1, 1) if a[0].dim() == 4 and w.dim() == 1 else w)
        elif t == "scale_shift":  # one value each, or one per channel (a map's dimension 1, else the last)
            c = layer.get("num_parameters", 1)
            w = p("weight").reshape(-1)
            sh = b("bias").reshape(-1) if layer.get("bias", True) else torch.zeros_like(w)
            assert w.numel() == c and sh.numel() == c, name
            view = (1, -1, 1, 1) if a[0].dim() == 4 and c > 1 else (-1,)
            y = a[0] * w.view(view) + sh.view(view)
        elif t == "concat":
            assert 2 <= len(a) <= 64
            y = torch.cat(a, 1)
        elif t in ("layernorm2d", "layernorm"):
            # the bias is there unless the layer says "bias": false
            beta = p("bias") if layer.get("bias", True) else None
            assert beta is not None or key("bias") not in tensors, name
            if t == "layernorm2d":
                y = F.layer_norm(a[0].permute(0, 2, 3, 1), (a[0].shape[1],), p("weight"), beta,
                                 layer.get("eps", 1e-5)).permute(0, 3, 1, 2)
            else:
                y = F.layer_norm(a[0], (a[0].shape[-1],), p("weight"), beta, layer.get("eps", 1e-5))
        elif t == "to_tokens":
            y = a[0].flatten(2).transpose(1, 2)
        elif t == "grn":
            g = a[0].norm(p=2, dim=(2, 3), keepdim=True)
            nx = g / (g.mean(dim=1, keepdim=True) + layer.get("eps", 1e-6))
            y = a[0] + p("weight").view(1, -1, 1, 1) * (a[0] * nx) + p("bias").view(1, -1, 1, 1)
        elif t == "to_map":
            y = a[0].transpose(1, 2).unflatten(2, tuple(layer["size"]))
        elif t == "class_token":
            y = torch.cat([p("").expand(a[0].shape[0], -1, -1), a[0]], 1)
        elif t == "pos_embedding":
            y = a[0] + p("")
        elif t == "self_attention":
            x, heads = a[0], layer["num_heads"]
            bias_out = p("out_proj.bias") if layer.get("out_proj_bias", True) else None
            if layer.get("separate_qkv", False):
                w_in = torch.cat([p(f"{r}_proj.weight") for r in "qkv"])
                bias_in = torch.cat([p(f"{r}_proj.bias") for r in "qkv"]) if layer.get("in_proj_bias", True) else None
            else:
                w_in = p("in_proj_weight")
                bias_in = p("in_proj_bias") if layer.get("in_proj_bias", True) else None
            q, k, v = F.linear(x, w_in, bias_in).chunk(3, -1)
            split = lambda z: z.unflatten(-1, (heads, -1)).transpose(1, 2)  # noqa: E731
            att = torch.softmax(split(q) @ split(k).transpose(-1, -2) / (x.shape[-1] // heads) ** 0.5, -1)
            y = F.linear((att @ split(v)).transpose(1, 2).flatten(2), p("out_proj.weight"), bias_out)
        elif t == "select_token":
            y = a[0][:, 0]
        elif t == "transpose_tokens":
            y = a[0].transpose(1, 2)
        elif t == "token_mean":
            y = a[0][:, layer.get("start", 0):].mean(1)
        elif t == "channel_shuffle":
            g, (n_, c, h, w) = layer["groups"], a[0].shape
            y = a[0].reshape(n_, g, c // g, h, w).transpose(1, 2).reshape(n_, c, h, w)
        elif t == "pixel_shuffle":
            y = F.pixel_shuffle(a[0], layer["factor"])
        elif t == "pixel_unshuffle":
            y = F.pixel_unshuffle(a[0], layer["factor"])
        elif t == "pad":
            mode = layer.get("mode", "constant")
            y = F.pad(a[0], layer["pad"], mode, layer.get("value", 0.0) if mode == "constant" else None)
        elif t == "channel_slice":
            assert 0 <= layer["start"] and layer["start"] + layer["count"] <= a[0].shape[1], name
            y = a[0][:, layer["start"]:layer["start"] + layer["count"]]
        elif t == "groupnorm":
            assert (b("weight") is not None) == layer.get("affine", True), name  # no parameters without affine
            assert (b("bias") is not None) == (layer.get("affine", True) and layer.get("bias", True)), name
            y = F.group_norm(a[0], layer["num_groups"], b("weight"), b("bias"), layer.get("eps", 1e-5))
        elif t == "upsample":
            size = layer.get("size") or [d * layer["scale"] for d in a[0].shape[2:]]
            mode = layer.get("mode", "nearest")
            y = F.interpolate(a[0], size=tuple(size), mode=mode,
                              align_corners=layer.get("align_corners", False) if mode == "bilinear" else None)
        elif t == "log_softmax":
            y = F.log_softmax(a[0], dim=1)
        elif t in ("dropout", "dropout2d", "stochastic_depth"):
            y = a[0]
        else:
            raise AssertionError(f"kind {t} is not in docs/LAYERS.md")
        outs.append(y)
    return outs[-1]


def assert_spec_computes_the_module(model, hw=64, n=2, tol=1e-4):
    torch.manual_seed(0)
    ex = convert(model, (n, 3, hw, hw))
    # Fresh batchnorm statistics would make eval mode an identity: give them values.
    model.eval()
    x = torch.randn(n, 3, hw, hw)
    with torch.no_grad():
        want = model(x)
        want = want["out"] if isinstance(want, dict) else want  # torchvision's segmentation models
        got = run_spec(ex.spec, {k: v.double() if v.is_floating_point() else v for k, v in ex.tensors.items()},
                       x.double())
    err = float((got - want.double()).norm() / want.double().norm())
    assert err <= tol, f"the spec computes something else: {err:.2e}"
    assert ex.spec["classes"] == want.shape[1]
    return ex
