"""streamfeed.export without a server: the model spec and the weights file it
writes for hand-made modules and for the torchvision families of
docs/EXPORT.md at 64x64, the refusals (op, module path, what is supported),
and that a refused or failed export writes nothing.

The spec is checked by meaning, not only by shape: run_spec (spec_interpreter.py) runs a spec
layer by layer with torch functions, as MODEL-SPEC.md defines each kind, on
the exported tensors, and must give the module's own eval-mode output. A
wrong input order, a missed permute, a swapped mul or a lost layer changes
the numbers."""
import collections
import importlib.util
import json
import os

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")
nn = torch.nn
F = torch.nn.functional
from safetensors.torch import load_file  # noqa: E402  (needs torch)

from streamfeed.export import SUPPORTED_MODULES, ExportError, convert, export_model, main  # noqa: E402

from spec_interpreter import assert_spec_computes_the_module, run_spec  # noqa: E402

M = torchvision.models


def randomize_batchnorm(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm2d, nn.BatchNorm1d)):
                m.running_mean.copy_(torch.rand(m.running_mean.shape, generator=g) * 0.4 - 0.2)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
    return model


# ---- the families ----------------------------------------------------------------------------

FAMILIES = ["resnet50", "resnext50_32x4d", "wide_resnet50_2", "mobilenet_v2", "mobilenet_v3_small",
            "mobilenet_v3_large", "efficientnet_b0", "regnet_y_400mf", "convnext_tiny", "densenet121",
            "squeezenet1_1", "vgg11_bn", "shufflenet_v2_x0_5"]


@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_exports_to_a_spec_that_computes_the_module_with_every_tensor_named(name):
    torch.manual_seed(0)
    model = randomize_batchnorm(getattr(M, name)(num_classes=10))
    sd = model.state_dict()
    ex = assert_spec_computes_the_module(model)
    assert ex.tensors.keys() == sd.keys()
    for k, v in sd.items():
        assert torch.equal(ex.tensors[k], v), k
    names = [layer["name"] for layer in ex.spec["layers"]]
    assert len(names) == len(set(names)), "layer names must be unique"
    assert all(len(n_) <= 63 for n_ in names)
    assert ex.spec["input"] == [3, 64, 64] and ex.spec["classes"] == 10


SEGMENTATION = ["fcn_resnet50", "deeplabv3_resnet50", "deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large"]


@pytest.mark.parametrize("name", SEGMENTATION)
def test_the_segmentation_families_export_their_out_head_resized_to_the_input(name):
    """forward() returns {"out": logits}: the export takes it, names every
    tensor as the module's state_dict, and ends in the bilinear resize to the
    input; with an auxiliary head it is refused, naming aux_loss."""
    build = getattr(M.segmentation, name)
    kw = {} if name.startswith("lraspp") else {"aux_loss": False}
    model = randomize_batchnorm(build(num_classes=5, weights=None, weights_backbone=None, **kw))
    ex = assert_spec_computes_the_module(model, hw=32)
    assert ex.tensors.keys() == model.state_dict().keys()
    assert ex.spec["layers"][-1] == {"type": "upsample", "name": ex.spec["layers"][-1]["name"], "size": [32, 32],
                                     "mode": "bilinear"}
    if kw:
        with pytest.raises(ExportError) as e:
            convert(build(num_classes=5, weights=None, weights_backbone=None, aux_loss=True), (1, 3, 64, 64))
        assert "aux_loss=False" in str(e.value)


def test_the_kinds_of_the_families_are_the_ones_their_modules_call_for():
    kinds = {n: {layer["type"] for layer in convert(getattr(M, n)(num_classes=10), (1, 3, 64, 64)).spec["layers"]}
             for n in ("efficientnet_b0", "convnext_tiny", "densenet121", "mobilenet_v3_small", "squeezenet1_1")}
    assert {"silu", "sigmoid", "mul", "stochastic_depth", "dropout"} <= kinds["efficientnet_b0"]
    assert {"layernorm2d", "layer_scale", "gelu", "linear", "stochastic_depth"} <= kinds["convnext_tiny"]
    assert "permute" not in kinds["convnext_tiny"]
    assert {"concat", "avgpool2d"} <= kinds["densenet121"]
    assert {"hardswish", "hardsigmoid", "mul"} <= kinds["mobilenet_v3_small"]
    assert "concat" in kinds["squeezenet1_1"]


def test_convnext_blocks_become_per_pixel_linears_and_a_layer_scale_of_the_block():
    ex = convert(M.convnext_tiny(num_classes=10), (1, 3, 64, 64))
    by_name = {layer["name"]: layer for layer in ex.spec["layers"]}
    assert by_name["features.1.0.block.3"] == {"type": "linear", "name": "features.1.0.block.3", "out": 384,
                                                "over": "channels"}
    assert by_name["features.1.0.block.2"]["type"] == "layernorm2d"
    assert by_name["features.1.0.block.2"]["eps"] == 1e-6
    assert by_name["features.1.0"] == {"type": "layer_scale", "name": "features.1.0"}
    assert "features.1.0.layer_scale" in ex.tensors


def test_squeeze_and_excitation_multiplies_the_map_by_its_scale_in_that_order():
    ex = convert(M.mobilenet_v3_small(num_classes=10), (1, 3, 64, 64))
    layers = ex.spec["layers"]
    mul = next(layer for layer in layers if layer["type"] == "mul")
    assert mul["name"] == "features.1.block.1.mul"
    # The full map (the block's first activation) first, the [C,1,1] scale second.
    assert mul["inputs"] == ["features.1.block.0.2", "features.1.block.1.scale_activation"]


@pytest.mark.parametrize("name", ["shufflenet_v2_x1_0", "shufflenet_v2_x1_5", "shufflenet_v2_x2_0"])
def test_every_shufflenet_width_exports_its_shuffles_and_chunks(name):
    ex = convert(getattr(M, name)(num_classes=10), (1, 3, 64, 64))
    by_name = {layer["name"]: layer for layer in ex.spec["layers"]}
    assert by_name["stage2.0.channel_shuffle"]["groups"] == 2
    # The stride-1 block: both chunks of its input, the first straight into the concatenation.
    c = by_name["stage2.1.chunk0"]["count"]
    assert by_name["stage2.1.chunk0"]["start"] == 0 and by_name["stage2.1.chunk1"] == {
        "type": "channel_slice", "name": "stage2.1.chunk1", "inputs": ["stage2.0.channel_shuffle"], "start": c,
        "count": c}
    assert by_name["stage2.1.cat"]["inputs"] == ["stage2.1.chunk0", "stage2.1.branch2.7"]


class Shuffled(nn.Module):
    """Every functional form of the channel moves and the pooling functions:
    an uneven chunk (7 channels in 3: 3, 3, 1) of which one piece is unused,
    split by sizes and by one size, channel ranges, the shuffle written out
    (ending in a flatten and in a view) and as F, torch and nn.ChannelShuffle,
    F.max_pool2d, torch.max_pool2d and F.avg_pool2d with their arguments."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 7, 1)
        self.b = nn.Conv2d(3, 6, 3, padding=1)
        self.shuffle = nn.ChannelShuffle(3)
        self.fc = nn.Linear(47, 5)

    def forward(self, x):
        a, b = self.a(x), self.b(x)
        p, q, _ = a.chunk(3, dim=1)
        r, s = torch.split(b, [2, 4], dim=1)
        t = torch.chunk(b, 2, 1)[1]
        u = b.split(4, 1)[1]
        y = torch.cat([p, b[:, 1:4], r, a[:, 5:], s, t, u, q], 1)  # 3 + 3 + 2 + 2 + 4 + 3 + 2 + 3 = 22
        n, c, h, w = y.size()
        y = torch.transpose(y.view(n, 2, c // 2, h, w), 1, 2).contiguous().view(n, c, h, w)
        z = self.shuffle(b)
        z = z.view(n, 3, 2, h, w).transpose(2, 1).flatten(1, 2)
        z = torch.cat([F.channel_shuffle(z, 2), torch.channel_shuffle(b, 3)], 1)  # 12
        y = torch.cat([F.max_pool2d(y, 3, padding=1, ceil_mode=True),  # 22 x 3 x 3 of 8 x 8
                       F.avg_pool2d(torch.cat([z, z[:, :1]], 1), kernel_size=3, stride=3, padding=1,
                                    ceil_mode=True, count_include_pad=False)], 1)  # 13
        y = torch.max_pool2d(y, 2, 1)  # 35 x 2 x 2
        y = torch.cat([y.mean((2, 3), keepdim=True), y[:, 3:15].mean((2, 3), keepdim=True)], 1)  # 35 + 12 = 47
        return self.fc(y.flatten(1))


def test_channel_moves_and_pooling_functions_export_to_a_spec_that_computes_the_module():
    ex = assert_spec_computes_the_module(Shuffled(), hw=8)
    by_name = {layer["name"]: layer for layer in ex.spec["layers"]}
    assert [(by_name[f"chunk{i}"]["start"], by_name[f"chunk{i}"]["count"]) for i in (0, 1)] == [(0, 3), (3, 3)]
    assert "chunk2" not in by_name  # the unused piece makes no layer
    assert by_name["slice"] == {"type": "channel_slice", "name": "slice", "inputs": ["b"], "start": 1, "count": 3}
    assert by_name["shuffle"] == {"type": "channel_shuffle", "name": "shuffle", "inputs": ["b"], "groups": 3}
    assert by_name["maxpool"] == {"type": "maxpool2d", "name": "maxpool", "inputs": ["channel_shuffle"], "k": 3,
                                  "pad": 1, "ceil_mode": True}
    assert by_name["avgpool"]["count_include_pad"] is False and by_name["avgpool"]["ceil_mode"] is True
    kinds = [layer["type"] for layer in ex.spec["layers"]]
    assert kinds.count("channel_shuffle") == 5 and kinds.count("maxpool2d") == 2


def test_inception_v3_exports_its_1xk_and_kx1_kernels_and_its_functional_pools():
    torch.manual_seed(0)
    model = M.inception_v3(num_classes=10, aux_logits=False, init_weights=False)
    ex = assert_spec_computes_the_module(randomize_batchnorm(model), hw=75)
    by_name = {layer["name"]: layer for layer in ex.spec["layers"]}
    assert by_name["Mixed_6b.branch7x7_2.conv"] == {"type": "conv2d", "name": "Mixed_6b.branch7x7_2.conv",
                                                    "out": 128, "k": [1, 7], "pad": [0, 3], "bias": False}
    assert by_name["Mixed_6b.branch7x7_3.conv"]["k"] == [7, 1] and by_name["Mixed_6b.branch7x7_3.conv"]["pad"] == [3, 0]
    assert by_name["Mixed_7b.branch3x3_2a.conv"]["k"] == [1, 3]
    assert by_name["Mixed_5b.avgpool"] == {"type": "avgpool2d", "name": "Mixed_5b.avgpool", "inputs": ["maxpool2"],
                                           "k": 3, "stride": 1, "pad": 1}
    assert by_name["Mixed_6a.maxpool"]["k"] == 3 and by_name["Mixed_6a.maxpool"]["stride"] == 2


def test_a_conv_window_is_one_number_where_its_axes_agree_and_h_w_where_they_do_not():
    model = nn.Sequential(nn.Conv2d(3, 4, (3, 5), stride=(2, 1), padding=(1, 2)),
                          nn.Conv2d(4, 4, 3, padding="same", dilation=(1, 2)),
                          nn.Conv2d(4, 4, (1, 3), padding="same"),
                          nn.Conv2d(4, 4, (2, 2), stride=(1, 1), padding=(0, 0)),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))
    ex = assert_spec_computes_the_module(model, hw=9)
    convs = [layer for layer in ex.spec["layers"] if layer["type"] == "conv2d"]
    assert [(c["k"], c.get("stride", 1), c.get("pad", 0), c.get("dilation", 1)) for c in convs] == [
        ([3, 5], [2, 1], [1, 2], 1), (3, 1, [1, 2], [1, 2]), ([1, 3], 1, [0, 1], 1), (2, 1, 0, 1)]


def test_channel_dropout_exports_as_dropout2d_and_is_nothing_at_p_zero():
    class M2(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = nn.Conv2d(3, 4, 3, padding=1)
            self.d = nn.Dropout2d(0.2)
            self.z = nn.Dropout2d(0.0)
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            y = F.dropout2d(self.z(self.d(self.c(x))), 0.1, self.training)
            y = F.dropout2d(y, 0.3, training=False)  # an identity: no layer
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))

    ex = assert_spec_computes_the_module(M2(), hw=8)
    drops = [layer for layer in ex.spec["layers"] if layer["type"] == "dropout2d"]
    assert [(d["name"], d["p"]) for d in drops] == [("d", 0.2), ("dropout2d", 0.1)]


def test_batchnorm1d_on_flat_features_exports_as_batchnorm2d_and_is_refused_on_sequences():
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Flatten(), nn.Linear(4 * 8 * 8, 12),
                          nn.BatchNorm1d(12, eps=1e-3), nn.ReLU(), nn.Linear(12, 3))
    ex = assert_spec_computes_the_module(randomize_batchnorm(model), hw=8)
    bn = ex.spec["layers"][3]
    assert bn == {"type": "batchnorm2d", "name": "3", "eps": 1e-3}
    assert ex.tensors["3.running_var"].shape == (12,)

    class Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = nn.Conv2d(3, 4, 3, padding=1)
            self.bn = nn.BatchNorm1d(4)

        def forward(self, x):
            return self.bn(self.c(x).flatten(2)).mean(2)

    with pytest.raises(ExportError) as e:
        convert(Seq(), (2, 3, 8, 8))
    assert e.value.module_path == "bn" and "flat features" in str(e.value)


def test_log_softmax_over_features_exports_in_each_spelling_and_is_refused_elsewhere():
    for tail in (nn.LogSoftmax(dim=1), nn.LogSoftmax(-1)):
        ex = assert_spec_computes_the_module(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(144, 5), tail),
                                             hw=8)
        assert ex.spec["layers"][-1] == {"type": "log_softmax", "name": "3"}

    class Tail(nn.Module):
        def __init__(self, how):
            super().__init__()
            self.fc, self.how = nn.Linear(3 * 8 * 8, 6), how

        def forward(self, x):
            y = self.fc(x.flatten(1))
            return {"f": lambda: F.log_softmax(y, dim=1), "t": lambda: torch.log_softmax(y, -1),
                    "m": lambda: y.log_softmax(1)}[self.how]()

    for how in "ftm":
        ex = assert_spec_computes_the_module(Tail(how), hw=8)
        assert ex.spec["layers"][-1]["type"] == "log_softmax"
    with pytest.raises(ExportError) as e:
        convert(nn.Sequential(nn.Conv2d(3, 4, 3), nn.LogSoftmax(dim=1)), (1, 3, 8, 8))
    assert e.value.module_path == "1" and "flat features" in str(e.value)
    with pytest.raises(ExportError) as e:
        convert(nn.Sequential(nn.Flatten(), nn.LogSoftmax(dim=0)), (1, 3, 8, 8))
    assert "dim 0" in str(e.value)
    for model in (nn.Sequential(nn.Flatten(), nn.Softmax(dim=1)), Softmaxed()):
        with pytest.raises(ExportError) as e:
            convert(model, (1, 3, 8, 8))
        assert "softmax is not supported" in str(e.value) and "log_softmax (nn.NLLLoss)" in str(e.value)


def test_adaptive_max_pooling_exports_as_a_max_pool_of_one_square_window():
    class Heads(nn.Module):
        def __init__(self, functional):
            super().__init__()
            self.c = nn.Conv2d(3, 4, 3, padding=1)
            self.gmp = nn.AdaptiveMaxPool2d(1)
            self.fc = nn.Linear(4 * 2 * 2 if functional else 4, 5)
            self.functional = functional

        def forward(self, x):
            y = F.relu(self.c(x))
            y = F.adaptive_max_pool2d(y, (2, 2)) if self.functional else self.gmp(y)
            return self.fc(y.view(x.size(0), -1))

    for functional, want in ((False, ("gmp", 12)), (True, ("maxpool", 6))):
        ex = assert_spec_computes_the_module(Heads(functional), hw=12)
        assert [(p["name"], p["k"]) for p in ex.spec["layers"] if p["type"] == "maxpool2d"] == [want]
    for model, hw in ((nn.Sequential(nn.Conv2d(3, 4, (3, 1)), nn.AdaptiveMaxPool2d(1)), 8),
                      (nn.Sequential(nn.Conv2d(3, 4, 1), nn.AdaptiveMaxPool2d(3)), 8),
                      (nn.Sequential(nn.Conv2d(3, 4, 1), nn.AdaptiveMaxPool2d(1)), 80)):
        with pytest.raises(ExportError) as e:
            convert(model, (1, 3, hw, hw))
        assert e.value.module_path == "1" and "one square window" in str(e.value)


class TwoHeads(nn.Module):
    """A multi-branch head: global average and global max features of one
    map, and a linear projection of the flattened map, concatenated along
    the features."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 4, 3, padding=1)
        self.proj = nn.Linear(4 * 8 * 8, 6)
        self.fc = nn.Linear(4 + 4 + 6, 3)

    def forward(self, x):
        y = F.relu(self.c(x))
        feats = [F.adaptive_avg_pool2d(y, 1).flatten(1), torch.flatten(F.adaptive_max_pool2d(y, 1), 1),
                 self.proj(y.flatten(1))]
        return self.fc(torch.cat(feats, dim=1))


def test_flat_features_concatenate_along_dim_1():
    ex = assert_spec_computes_the_module(TwoHeads(), hw=8)
    cat = [layer for layer in ex.spec["layers"] if layer["type"] == "concat"]
    assert len(cat) == 1 and len(cat[0]["inputs"]) == 3
    with pytest.raises(ExportError) as e:
        convert(nn.Sequential(nn.Flatten(), CatOf(0)), (1, 3, 8, 8))
    assert "dimension 0" in str(e.value)


class CatOf(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.cat([x, x], self.dim)


def test_groupnorm_exports_with_its_groups_and_eps_affine_or_not():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(4, 8), nn.ReLU(), nn.Flatten(),
                          nn.Linear(8 * 8 * 8, 6), nn.GroupNorm(2, 6, eps=1e-3), nn.Linear(6, 3))
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.GroupNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    ex = assert_spec_computes_the_module(model, hw=8)
    gns = [layer for layer in ex.spec["layers"] if layer["type"] == "groupnorm"]
    assert gns == [{"type": "groupnorm", "name": "1", "num_groups": 4},
                   {"type": "groupnorm", "name": "5", "num_groups": 2, "eps": 1e-3}]
    # affine=False: no parameters, in the spec as in the module's state_dict
    model = nn.Sequential(nn.Conv2d(3, 8, 1), nn.GroupNorm(2, 8, affine=False), nn.Flatten(),
                          nn.Linear(8 * 8 * 8, 6), nn.GroupNorm(3, 6, eps=1e-3, affine=False), nn.Linear(6, 3))
    ex = assert_spec_computes_the_module(model, hw=8)
    assert [layer for layer in ex.spec["layers"] if layer["type"] == "groupnorm"] == [
        {"type": "groupnorm", "name": "1", "num_groups": 2, "affine": False},
        {"type": "groupnorm", "name": "4", "num_groups": 3, "eps": 1e-3, "affine": False}]
    assert ex.tensors.keys() == model.state_dict().keys() and not any(k.startswith(("1.", "4.")) for k in ex.tensors)


def test_instance_norm_exports_as_a_group_per_channel_without_running_statistics():
    model = nn.Sequential(nn.Conv2d(3, 5, 3, padding=1), nn.InstanceNorm2d(5, affine=True, eps=1e-3), nn.ReLU(),
                          nn.InstanceNorm2d(5), nn.Flatten(), nn.Linear(5 * 8 * 8, 3))
    with torch.no_grad():
        model[1].weight.uniform_(0.5, 1.5)
        model[1].bias.uniform_(-0.5, 0.5)
    ex = assert_spec_computes_the_module(model, hw=8)
    assert ex.spec["layers"][1] == {"type": "groupnorm", "name": "1", "num_groups": 5, "eps": 1e-3}
    assert ex.spec["layers"][3] == {"type": "groupnorm", "name": "3", "num_groups": 5, "affine": False}
    for norm in (nn.InstanceNorm2d(5, track_running_stats=True),
                 nn.InstanceNorm2d(5, affine=True, track_running_stats=True)):
        with pytest.raises(ExportError) as e:
            convert(nn.Sequential(nn.Conv2d(3, 5, 1), norm), (1, 3, 8, 8))
        assert e.value.module_path == "1" and "track_running_stats=False" in str(e.value)


class FunctionalNorms(nn.Module):
    """F.group_norm and F.instance_norm without a weight or a bias, on a map
    and on flat features, eps positional and by keyword (with them:
    test_export_functional's own-parameter norms)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.fc = nn.Linear(6 * 8 * 8, 4)

    def forward(self, x):
        y = F.instance_norm(F.relu(F.group_norm(self.conv(x), 3, None, None, 1e-3)), eps=1e-4)
        return F.group_norm(self.fc(torch.flatten(y, 1)), 2)


def test_functional_group_and_instance_norm_without_parameters_export_as_groupnorm():
    ex = assert_spec_computes_the_module(FunctionalNorms(), hw=8)
    gns = [{k: v for k, v in layer.items() if k != "name"} for layer in ex.spec["layers"]
           if layer["type"] == "groupnorm"]
    assert gns == [{"type": "groupnorm", "num_groups": 3, "eps": 1e-3, "affine": False},
                   {"type": "groupnorm", "num_groups": 6, "eps": 1e-4, "affine": False},
                   {"type": "groupnorm", "num_groups": 2, "affine": False}]

    class WithWeight(nn.Module):
        def __init__(self, **kw):
            super().__init__()
            self.w, self.kw = nn.Parameter(torch.ones(3)), kw

        def forward(self, x):
            if self.kw.get("bias_alone"):
                return F.group_norm(x, 3, None, self.w)
            return F.group_norm(x, 3, self.w) if not self.kw else F.instance_norm(x, **self.kw)

    stats = {"running_mean": torch.zeros(3), "running_var": torch.ones(3)}
    for kw, words in (({}, "the top-level module's own parameter w"), ({"bias_alone": True}, "a bias without a weight"),
                      (stats, "without running_mean, running_var"),
                      ({**stats, "use_input_stats": False}, "running_var, use_input_stats=False")):
        with pytest.raises(ExportError) as e:
            convert(WithWeight(**kw), (1, 3, 8, 8))
        assert words in str(e.value)


def test_upsampling_exports_by_an_integer_factor_or_to_a_size_and_is_refused_otherwise():
    class Up(nn.Module):
        def __init__(self, **kw):
            super().__init__()
            self.kw = kw

        def forward(self, x):
            return F.interpolate(x, **self.kw)

    model = nn.Sequential(nn.Upsample(scale_factor=2), nn.Conv2d(3, 4, 3, padding=1), Up(scale_factor=3.0),
                          Up(size=(50, 45), mode="bilinear"), nn.UpsamplingBilinear2d(scale_factor=2),
                          Up(scale_factor=(2, 3), mode="nearest"), Up(size=(31, 17)),
                          Up(scale_factor=0.5, mode="bilinear", recompute_scale_factor=True),
                          nn.Upsample(size=(9, 10), mode="bilinear", align_corners=True),
                          nn.Flatten(), nn.Linear(4 * 9 * 10, 2))
    ex = assert_spec_computes_the_module(model, hw=8)
    ups = [{k: v for k, v in layer.items() if k not in ("type", "inputs")}
           for layer in ex.spec["layers"] if layer["type"] == "upsample"]
    assert ups == [
        {"name": "0", "scale": 2}, {"name": "2.upsample", "scale": 3},
        {"name": "3.upsample", "size": [50, 45], "mode": "bilinear"},
        {"name": "4", "scale": 2, "mode": "bilinear", "align_corners": True},
        {"name": "5.upsample", "size": [200, 270]}, {"name": "6.upsample", "size": [31, 17]},
        {"name": "7.upsample", "size": [15, 8], "mode": "bilinear"},
        {"name": "8", "size": [9, 10], "mode": "bilinear", "align_corners": True}], ups
    for bad, why in ((nn.Upsample(scale_factor=2, mode="bicubic"), "mode 'bicubic'"),
                     (Up(scale_factor=2, mode="bilinear", antialias=True), "antialias"),
                     (Up(scale_factor=1.5), "integer factor or a size"),
                     (Up(scale_factor=0.5, mode="bilinear"), "recompute_scale_factor=True")):
        with pytest.raises(ExportError) as e:
            convert(nn.Sequential(nn.Conv2d(3, 4, 1), bad), (1, 3, 8, 8))
        assert why in str(e.value) and e.value.module_path.startswith("1"), str(e.value)


def test_pixel_shuffles_export_in_each_spelling_with_their_factor_and_a_factor_of_one_is_nothing():
    class SubPixel(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.up, self.down = nn.Conv2d(3, 16, 3, padding=1), nn.PixelShuffle(2), nn.PixelUnshuffle(2)
            self.same, self.fc = nn.PixelShuffle(1), nn.Linear(16 * 8 * 8, 2)

        def forward(self, x):
            y = self.down(self.up(self.conv(x)))                                   # 16 x 8 x 8
            y = F.pixel_unshuffle(F.pixel_shuffle(y, upscale_factor=4), 4)        # 1 x 32 x 32 and back
            y = torch.pixel_unshuffle(torch.pixel_shuffle(self.same(y), 2), downscale_factor=2)
            return self.fc(torch.flatten(y, 1))

    ex = assert_spec_computes_the_module(SubPixel(), hw=8)
    moves = [(layer["type"], layer["factor"]) for layer in ex.spec["layers"] if "factor" in layer]
    assert moves == [("pixel_shuffle", 2), ("pixel_unshuffle", 2), ("pixel_shuffle", 4), ("pixel_unshuffle", 4),
                     ("pixel_shuffle", 2), ("pixel_unshuffle", 2)], moves
    assert [layer["name"] for layer in ex.spec["layers"] if "factor" in layer][:2] == ["up", "down"]


def test_identities_leave_no_layer_and_defaults_leave_no_field():
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Dropout(0.0), nn.Identity(),
                          nn.AdaptiveAvgPool2d((8, 8)), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(4, 5, bias=False))
    ex = convert(model, (1, 3, 8, 8))
    assert ex.spec == {"input": [3, 8, 8], "classes": 5, "layers": [
        {"type": "conv2d", "name": "0", "out": 4, "k": 3, "pad": 1},
        {"type": "relu", "name": "4"}, {"type": "global_avgpool", "name": "5"}, {"type": "flatten", "name": "6"},
        {"type": "linear", "name": "7", "out": 5, "bias": False}]}


def small_vit():
    from torchvision.models.vision_transformer import VisionTransformer
    m = VisionTransformer(image_size=64, patch_size=16, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128,
                          num_classes=10)
    nn.init.normal_(m.heads.head.weight, std=0.05)  # torchvision's zero head would hide the rest
    return m


def test_a_vision_transformer_exports_to_tokens_attention_and_its_class_token():
    torch.manual_seed(0)
    model = small_vit()
    ex = assert_spec_computes_the_module(model)
    assert ex.tensors.keys() == model.state_dict().keys()
    by_name = {layer["name"]: layer for layer in ex.spec["layers"]}
    assert [layer["type"] for layer in ex.spec["layers"][:5]] == ["conv2d", "to_tokens", "class_token",
                                                                   "pos_embedding", "layernorm"]
    assert by_name["class_token"] == {"type": "class_token", "name": "class_token"}
    assert by_name["encoder.pos_embedding"] == {"type": "pos_embedding", "name": "encoder.pos_embedding"}
    assert by_name["encoder.layers.encoder_layer_0.self_attention"] == {
        "type": "self_attention", "name": "encoder.layers.encoder_layer_0.self_attention", "num_heads": 4}
    assert by_name["encoder.layers.encoder_layer_1.mlp.0"] == {
        "type": "linear", "name": "encoder.layers.encoder_layer_1.mlp.0", "out": 128}
    assert ex.spec["layers"][-2]["type"] == "select_token" and ex.spec["layers"][-1]["name"] == "heads.head"
    # torchvision's dropout layers (p 0 by default) leave nothing.
    assert "dropout" not in {layer["type"] for layer in ex.spec["layers"]}


@pytest.mark.parametrize("factory", ["vit_b_16", "vit_b_32"])
def test_vit_b_exports_at_224_with_every_tensor_named(factory):
    model = getattr(M, factory)(num_classes=10)
    ex = convert(model, (1, 3, 224, 224))
    assert ex.tensors.keys() == model.state_dict().keys()
    kinds = [layer["type"] for layer in ex.spec["layers"]]
    assert kinds.count("self_attention") == 12 and ex.spec["classes"] == 10
    tokens = (224 // int(factory[-2:])) ** 2 + 1
    assert tuple(ex.tensors["encoder.pos_embedding"].shape) == (1, tokens, 768)


class Tokens(nn.Module):
    """A patch embedding as timm writes it (flatten(2).transpose(1, 2)) and
    one MultiheadAttention call of the form given."""

    def __init__(self, call="self", **kw):
        super().__init__()
        self.proj = nn.Conv2d(3, 8, 4, 4)
        self.attn = nn.MultiheadAttention(8, 2, **{"batch_first": True, **kw})
        self.register_buffer("mask", torch.zeros(4, 4), persistent=False)
        if call == "cross":
            self.norm = nn.LayerNorm(8)
        self.call = call

    def forward(self, x):
        x = self.proj(x).flatten(2).transpose(1, 2)
        if self.call == "weights":
            y, _ = self.attn(x, x, x)
        elif self.call == "mask":
            y, _ = self.attn(x, x, x, need_weights=False, attn_mask=self.mask)
        elif self.call == "cross":
            y, _ = self.attn(x, self.norm(x), x, need_weights=False)
        else:
            y, _ = self.attn(x, x, x, need_weights=False)
        return y[:, 0]


def test_a_self_attention_written_by_hand_exports_and_computes_the_module():
    torch.manual_seed(1)
    ex = assert_spec_computes_the_module(Tokens(), hw=8)
    assert [layer["type"] for layer in ex.spec["layers"]] == ["conv2d", "to_tokens", "self_attention",
                                                               "select_token"]


def test_a_self_attention_without_biases_exports_without_them():
    """nn.MultiheadAttention(bias=False): neither projection's bias, in the spec or the tensors."""
    torch.manual_seed(2)
    ex = assert_spec_computes_the_module(Tokens(bias=False), hw=8)
    att = ex.spec["layers"][2]
    assert att == {"type": "self_attention", "name": "attn", "num_heads": 2, "in_proj_bias": False,
                   "out_proj_bias": False}
    assert {k for k in ex.tensors if k.startswith("attn.")} == {"attn.in_proj_weight", "attn.out_proj.weight"}


@pytest.mark.parametrize("model, why", [
    (Tokens("weights"), "need_weights"),
    (Tokens("mask"), "attn_mask"),
    (Tokens("cross"), "key or value"),
    (Tokens(batch_first=False), "batch_first"),
    (Tokens(dropout=0.1), "dropout"),
    (Tokens(add_bias_kv=True), "add_bias_kv"),
])
def test_attention_other_than_plain_self_attention_is_refused_naming_the_module(model, why):
    with pytest.raises(ExportError) as e:
        convert(model, (1, 3, 8, 8))
    assert "MultiheadAttention" in e.value.op and e.value.module_path == "attn", str(e.value)
    assert why in str(e.value)


class HandWritten(nn.Module):
    """The functional forms: F.relu, torch.cat, +=, x.view(N,-1), a reused
    ReLU module (three layers of one module), a mean over (2,3)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 4, 1)
        self.b = nn.Conv2d(3, 4, 3, padding=1, groups=1, bias=False)
        self.bn = nn.BatchNorm2d(8, eps=1e-3, momentum=0.01)
        self.relu = nn.ReLU(inplace=True)
        self.c = nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=4)
        self.pool = nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False)
        self.fc = nn.Linear(8 * 5 * 5, 6)

    def forward(self, x):
        y = torch.cat([F.relu(self.a(x)), self.relu(self.b(x))], 1)
        y = self.bn(y)
        z = self.relu(self.c(y))
        z += y
        z = self.relu(self.pool(z)) * torch.sigmoid(z.mean((2, 3), keepdim=True))
        return self.fc(z.view(z.size(0), -1))


def test_a_hand_written_forward_exports_its_functional_ops():
    model = randomize_batchnorm(HandWritten())
    ex = assert_spec_computes_the_module(model, hw=8)
    kinds = [layer["type"] for layer in ex.spec["layers"]]
    assert kinds == ["conv2d", "relu", "conv2d", "relu", "concat", "batchnorm2d", "conv2d", "relu", "add",
                     "avgpool2d", "relu", "global_avgpool", "sigmoid", "mul", "flatten", "linear"]
    names = [layer["name"] for layer in ex.spec["layers"]]
    # The module relu's three calls keep its path (numbered); F.relu at the top takes another name.
    assert [names[i] for i in (1, 3, 7, 10)] == ["relu_1", "relu", "relu_2", "relu_3"]
    bn = ex.spec["layers"][5]
    assert bn["eps"] == 1e-3 and bn["momentum"] == 0.01
    assert ex.spec["layers"][6]["dilation"] == 2 and ex.spec["layers"][6]["groups"] == 4


class LeakyTanh(nn.Module):
    """nn.LeakyReLU and nn.Tanh, and every functional spelling of the two."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.act = nn.LeakyReLU(0.2, inplace=True)
        self.up = nn.ConvTranspose2d(4, 4, 2, stride=2)
        self.out = nn.Tanh()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        y = self.out(self.up(self.act(self.conv(x))))
        y = F.leaky_relu(y, 1.5) + F.leaky_relu(y, negative_slope=-0.5) + F.leaky_relu(y)
        y = torch.tanh(y) + y.tanh() + F.tanh(y)
        return self.fc(y.mean((2, 3)))


def test_leaky_relu_and_tanh_export_in_every_spelling_with_their_slopes():
    ex = assert_spec_computes_the_module(LeakyTanh(), hw=8)
    layers = ex.spec["layers"]
    assert [la.get("negative_slope") for la in layers if la["type"] == "leaky_relu"] == [0.2, 1.5, -0.5, 0.01]
    assert [la["name"] for la in layers if la["type"] == "tanh"][0] == "out"
    assert sum(la["type"] == "tanh" for la in layers) == 4


@pytest.mark.parametrize("slope", [float("inf"), float("nan")])
def test_a_slope_the_service_cannot_hold_is_refused(slope):
    with pytest.raises(ExportError) as e:
        convert(nn.Sequential(nn.Conv2d(3, 4, 3), nn.LeakyReLU(slope)), (1, 3, 8, 8))
    assert "negative_slope" in str(e.value) and e.value.module_path == "1"


class SmoothActs(nn.Module):
    """nn.ELU, nn.SELU, nn.Softplus and nn.Mish, and every functional
    spelling of the four: the parameters positional and by keyword, the
    in-place functions on a tensor nothing else reads."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.elu = nn.ELU(0.5, inplace=True)
        self.selu = nn.SELU()
        self.sp = nn.Softplus(2, 1.5)
        self.mish = nn.Mish()
        self.conv2 = nn.Conv2d(4, 4, 1)
        self.conv3 = nn.Conv2d(4, 4, 1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        y = self.mish(self.sp(self.selu(self.elu(self.conv(x)))))
        y = F.elu(y) + F.elu(y, 0.3) + F.elu(y, alpha=-0.5) + F.elu_(self.conv2(y), 2.0)
        y = F.selu(y) + torch.selu(y) + torch.selu_(self.conv3(y))
        y = F.softplus(y) + F.softplus(y, 2, 0.5) + F.softplus(y, beta=-1, threshold=3) + F.mish(y)
        return self.fc(y.mean((2, 3)))


def test_elu_selu_softplus_and_mish_export_in_every_spelling_with_their_parameters():
    ex = assert_spec_computes_the_module(SmoothActs(), hw=8)
    layers = ex.spec["layers"]
    assert [la["alpha"] for la in layers if la["type"] == "elu"] == [0.5, 1.0, 0.3, -0.5, 2.0]
    assert [(la["beta"], la["threshold"]) for la in layers if la["type"] == "softplus"] == \
        [(2.0, 1.5), (1.0, 20.0), (2.0, 0.5), (-1.0, 3.0)]
    assert [la["name"] for la in layers if la["type"] in ("selu", "mish")][:2] == ["selu", "mish"]
    assert sum(la["type"] == "selu" for la in layers) == 4 and sum(la["type"] == "mish" for la in layers) == 2


@pytest.mark.parametrize("mod,field", [(nn.ELU(float("inf")), "alpha"), (nn.Softplus(float("nan")), "beta"),
                                       (nn.Softplus(0), "beta 0"), (nn.Softplus(1, float("-inf")), "threshold")])
def test_an_activation_parameter_the_service_cannot_hold_is_refused(mod, field):
    with pytest.raises(ExportError) as e:
        convert(nn.Sequential(nn.Conv2d(3, 4, 3), mod), (1, 3, 8, 8))
    assert field in str(e.value) and e.value.module_path == "1"


class Arithmetic(nn.Module):
    """Arithmetic with Python numbers in every spelling: a normalisation of
    the input ((x - 0.5) / 0.5, one layer), x * 2 - 1 after a convolution,
    then c - x, -x, torch.mul, Tensor.div, torch.add and torch.sub, the
    in-place operators and methods on a tensor nothing else reads, and a
    step that leaves x as it is (x * 1 folds in; + 0 alone makes nothing)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 4, 1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        y = self.conv((x - 0.5) / 0.5) * 2 - 1
        y = F.relu(y)
        y = -(0.25 - torch.mul(y, 3).div(2))
        y = torch.sub(torch.add(3 + y, 0.5), 1)
        y += 1
        y = y.mul_(0.5).sub_(2).neg() * 1
        z = self.conv2(y) + 0
        return self.fc(torch.relu(z / 4).mean((2, 3)))


def test_arithmetic_with_numbers_becomes_one_affine_layer_per_chain():
    ex = assert_spec_computes_the_module(Arithmetic(), hw=8)
    layers = ex.spec["layers"]
    assert [la["type"] for la in layers] == ["affine", "conv2d", "affine", "relu", "affine", "conv2d", "affine",
                                             "relu", "global_avgpool", "flatten", "linear"]
    affine = [la for la in layers if la["type"] == "affine"]
    assert affine[0] == {"type": "affine", "name": "affine", "scale": 2.0, "shift": -1.0}
    assert (affine[1]["scale"], affine[1]["shift"]) == (2.0, -1.0)
    # r the relu's output: -(0.25 - 1.5 r) + 3 + 0.5 - 1 + 1 = 1.5 r + 3.25, then * 0.5 - 2 and negated
    assert (affine[2]["scale"], affine[2]["shift"]) == (-0.75, 0.375)
    # z / 4 (z = conv2(y) + 0, which is conv2's output): the shift at its default is left out
    assert affine[3]["scale"] == 0.25 and "shift" not in affine[3]


class ArithmeticRead(nn.Module):
    """A step whose tensor another op reads too is not folded: y = x * 2
    is read by y + 1 and by the sum, so y + 1 is a second layer."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        y = self.conv(x) * 2
        return (y + (y + 1)).flatten(1)


def test_a_step_on_a_tensor_something_else_reads_is_a_layer_of_its_own():
    ex = assert_spec_computes_the_module(ArithmeticRead(), hw=6)
    assert [(la["type"], la.get("scale", 1.0), la.get("shift", 0.0)) for la in ex.spec["layers"]
            if la["type"] == "affine"] == [("affine", 2.0, 0.0), ("affine", 1.0, 1.0)]


class LayoutArithmetic(nn.Module):
    """Arithmetic on a channels-last tensor (between ConvNeXt's permutes,
    before a LayerNorm) and on a token sequence (before the class token is
    taken): elementwise, so the layer is the same in either."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 2, stride=2)
        self.ln = nn.LayerNorm(4)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        y = self.ln(self.conv(x).permute(0, 2, 3, 1) * 2 + 1).permute(0, 3, 1, 2)
        t = 1 - y.flatten(2).transpose(1, 2) * 0.5
        return self.fc(t[:, 0])


def test_arithmetic_on_tokens_and_channels_last_tensors_is_an_affine_layer_too():
    ex = assert_spec_computes_the_module(LayoutArithmetic(), hw=8)
    assert [la["type"] for la in ex.spec["layers"]] == ["conv2d", "affine", "layernorm2d", "to_tokens", "affine",
                                                       "select_token", "linear"]


class ArithmeticOf(nn.Module):
    def __init__(self, f):
        super().__init__()
        self.block = nn.Sequential(nn.Conv2d(3, 4, 3))
        self.head = _Apply(f)

    def forward(self, x):
        return self.head(self.block(x)).flatten(1)


class _Apply(nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, x):
        return self.f(x)


@pytest.mark.parametrize("f, op, why", [
    (lambda y: y / 0, "operator.truediv", "divides by zero"),
    (lambda y: torch.div(y, 0.0), "torch.div", "divides by zero"),
    (lambda y: y * float("inf"), "operator.mul", "not a finite"),
    (lambda y: y + float("nan"), "operator.add", "not a finite"),
    (lambda y: y - 1e39, "operator.sub", "not a finite"),
    (lambda y: y * 1e30 * 1e30, "operator.mul", "float32's finite range"),
    (lambda y: y / 1e-40, "operator.truediv", "float32's finite range"),
    (lambda y: torch.add(y, 1, alpha=2), "torch.add", "alpha 2"),
    (lambda y: torch.sub(y, 1, alpha=0.5), "torch.sub", "alpha 0.5"),
    (lambda y: torch.div(y, 2, rounding_mode="floor"), "torch.div", "rounding_mode 'floor'"),
    (lambda y: 2 / y, "operator.truediv", "reciprocal"),
], ids=["div0", "torch_div0", "mul_inf", "add_nan", "sub_past_float32", "fold_past_float32", "reciprocal_past_float32", "add_alpha",
        "sub_alpha", "div_rounding", "reciprocal"])
def test_arithmetic_the_service_cannot_take_is_refused_naming_the_op_and_why(f, op, why):
    with pytest.raises(ExportError) as e:
        convert(ArithmeticOf(f), (1, 3, 6, 6))
    assert e.value.op == op and e.value.module_path == "head", str(e.value)
    assert why in str(e.value) and f"at 'head'" in str(e.value)


@pytest.mark.parametrize("f, kinds", [
    (lambda y: y * torch.sigmoid(y), ["conv2d", "sigmoid", "mul"]),
    (lambda y: y + F.relu(y), ["conv2d", "relu", "add"]),
    (lambda y: y - F.relu(y), ["conv2d", "relu", "affine", "add"]),
    (lambda y: torch.sub(F.relu(y), y), ["conv2d", "relu", "affine", "add"]),
], ids=["mul_tensor", "add_tensor", "sub_tensor", "torch_sub"])
def test_arithmetic_of_two_tensors_stays_add_or_mul(f, kinds):
    """A difference of two tensors is the second negated (affine, scale -1),
    then added."""
    ex = assert_spec_computes_the_module(ArithmeticOf(f), hw=6)
    assert [la["type"] for la in ex.spec["layers"]][:-1] == kinds


@pytest.mark.parametrize("f", [lambda y: y / torch.sigmoid(y), lambda y: torch.sub(y, F.relu(y), alpha=2)],
                         ids=["div", "sub_alpha"])
def test_dividing_two_tensors_or_subtracting_with_alpha_stays_refused(f):
    with pytest.raises(ExportError, match="has no layer kind") as e:
        convert(ArithmeticOf(f), (1, 3, 6, 6))
    assert e.value.module_path == "head"


class Slopes(nn.Module):
    """A module's own slopes for F.prelu, held as nn.PReLU holds them."""

    def __init__(self, c):
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(-0.3, 0.6, c))

    def forward(self, x):
        return F.prelu(x, self.weight)


class PReLUs(nn.Module):
    """nn.PReLU with one slope after a convolution, one per channel (init
    0.1), F.prelu of a module's own per-channel weight, and one per feature
    of flat features [N, F] in the head."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.act = nn.PReLU()
        self.conv2 = nn.Conv2d(4, 4, 3, stride=2, padding=1)
        self.act2 = nn.PReLU(4, init=0.1)
        self.slopes = Slopes(4)
        self.fc1 = nn.Linear(4 * 4 * 4, 6)
        self.act3 = nn.PReLU(6)
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        y = self.slopes(self.act2(self.conv2(self.act(self.conv(x)))))
        return self.fc(self.act3(self.fc1(torch.flatten(y, 1))))


def test_prelu_exports_with_one_slope_or_one_per_channel_under_its_module_weight():
    model = PReLUs()
    with torch.no_grad():
        for m in (model.act, model.act2, model.act3):
            m.weight.uniform_(-0.5, 0.5)  # both signs, so the spec's slopes are the module's
    ex = assert_spec_computes_the_module(model, hw=8)
    prelu = [la for la in ex.spec["layers"] if la["type"] == "prelu"]
    assert prelu == [{"type": "prelu", "name": "act"}, {"type": "prelu", "name": "act2", "num_parameters": 4},
                     {"type": "prelu", "name": "slopes", "num_parameters": 4},
                     {"type": "prelu", "name": "act3", "num_parameters": 6}]
    assert ex.tensors["act.weight"].shape == (1,) and ex.tensors["slopes.weight"].shape == (4,)


class PReLUOn(nn.Module):
    def __init__(self, make, act):
        super().__init__()
        self.block = nn.Sequential(nn.Conv2d(3, 4, 2, stride=2))
        self.act = act
        self.make = make

    def forward(self, x):
        return self.make(self.block(x), self.act)


@pytest.mark.parametrize("make, act, why", [
    (lambda y, act: act(y.flatten(2).transpose(1, 2))[:, 0], nn.PReLU(), "token sequence"),
    (lambda y, act: act(y.permute(0, 2, 3, 1)).permute(0, 3, 1, 2).flatten(1), nn.PReLU(4), "channels-last"),
], ids=["tokens", "channels_last"])
def test_prelu_where_its_slopes_are_not_per_channel_is_refused_naming_the_module(make, act, why):
    with pytest.raises(ExportError) as e:
        convert(PReLUOn(make, act), (1, 3, 8, 8))
    assert why in str(e.value) and e.value.module_path == "act", str(e.value)


def test_prelu_on_channels_last_with_one_slope_is_elementwise_and_exports():
    ex = assert_spec_computes_the_module(
        PReLUOn(lambda y, act: act(y.permute(0, 2, 3, 1)).permute(0, 3, 1, 2).flatten(1), nn.PReLU()), hw=8)
    assert [la["type"] for la in ex.spec["layers"]] == ["conv2d", "prelu", "flatten"]


class FunctionalPReLU(nn.Module):
    def __init__(self, slopes):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.alpha = nn.Parameter(torch.full((4,), 0.2))
        self.slopes = slopes

    def forward(self, x):
        return F.prelu(self.conv(x), self.slopes(self)).flatten(1)


def test_functional_prelu_of_slopes_other_than_a_weight_parameter_is_refused():
    with pytest.raises(ExportError, match="named weight") as e:
        convert(FunctionalPReLU(lambda m: m.alpha), (1, 3, 6, 6))
    assert "prelu" in e.value.op and e.value.module_path == ""


# ---- refusals -----------------------------------------------------------------------------


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Sequential(nn.ReLU(), nn.LSTM(4, 4)))

    def forward(self, x):
        return self.features(x)


class Softmaxed(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Conv2d(3, 4, 3))
        self.head = SoftmaxHead()

    def forward(self, x):
        return self.head(self.block(x))


class SoftmaxHead(nn.Module):
    def forward(self, x):
        return torch.softmax(x.flatten(1), 1)


@pytest.mark.parametrize("model, op, path, supported", [
    (Attention(), "torch.nn.modules.rnn.LSTM", "features.1.1", "Conv2d"),
    (Softmaxed(), "softmax", "head", ""),
    (nn.Sequential(nn.ConvTranspose2d(3, 6, 3, groups=3)), "ConvTranspose2d", "0", ""),
    (nn.Sequential(nn.BatchNorm2d(3, affine=False)), "BatchNorm2d", "0", ""),
    (nn.Sequential(nn.Conv2d(3, 4, 3), nn.Linear(6, 2)), "Linear", "1", ""),
    (nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Dropout2d(0.1)), "Dropout2d", "2", ""),
])
def test_an_unsupported_op_is_refused_naming_the_op_and_the_module_path(model, op, path, supported):
    with pytest.raises(ExportError) as e:
        convert(model, (1, 3, 8, 8))
    assert op in e.value.op and e.value.module_path == path, str(e.value)
    assert f"at {path!r}" in str(e.value) and op in str(e.value)
    if supported:
        assert supported in e.value.supported and "Supported:" in str(e.value)


class Functional(nn.Module):
    def __init__(self, f):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 1)
        self.f = f

    def forward(self, x):
        return self.f(self.conv(x)).flatten(1)


def view_then(after):
    def f(y):
        n, c, h, w = y.size()
        return after(y.view(n, 2, c // 2, h, w))
    return f


@pytest.mark.parametrize("f, op, why", [
    (lambda y: F.max_pool2d(y, 2, dilation=2), "max_pool2d", "dilation 2"),
    (lambda y: F.max_pool2d(y, 2, return_indices=True)[0], "max_pool2d", "return_indices True"),
    (lambda y: F.avg_pool2d(y, 2, divisor_override=3), "avg_pool2d", "divisor_override 3"),
    (lambda y: y.chunk(2, dim=2)[0], "Tensor.chunk", "along dimension 2"),
    (lambda y: torch.split(y, 3)[0], "split", "along dimension 0"),
    (lambda y: y[:, ::2], "getitem", "x[:, a:b] on a map"),
    (lambda y: y[:, 4:2], "getitem", "takes no channels"),
    (view_then(lambda v: v.sum(1)), "Tensor.view", "channel shuffle's view"),
    (view_then(lambda v: v.transpose(1, 3).reshape(v.shape[0], 6, 4, 4)), "Tensor.view",
     "channel shuffle's view"),
    (view_then(lambda v: v.transpose(1, 2).flatten(2)), "Tensor.view", "channel shuffle's view"),
])
def test_channel_moves_and_pooling_functions_out_of_reach_are_refused_naming_the_op(f, op, why):
    with pytest.raises(ExportError) as e:
        convert(Functional(f), (1, 3, 4, 4))
    assert op in e.value.op and why in str(e.value), str(e.value)
    assert "in the top-level module" in str(e.value)


class AuxHeads(nn.Module):
    """A classifier with an auxiliary head that, as torchvision's GoogLeNet
    and Inception v3 in training, returns a namedtuple (tuple=False) or a
    plain tuple (tuple=True) of both outputs."""

    Outputs = collections.namedtuple("Outputs", ["logits", "aux"])

    def __init__(self, plain_tuple):
        super().__init__()
        self.plain_tuple = plain_tuple
        self.body = nn.Conv2d(3, 4, 3)
        self.head, self.aux = nn.Linear(4, 2), nn.Linear(4, 2)

    def forward(self, x):
        y = self.body(x).mean((2, 3))
        out = (self.head(y), self.aux(y))
        return out if self.plain_tuple else self.Outputs(*out)


@pytest.mark.parametrize("plain_tuple, what", [(False, "Outputs"), (True, "tuple")])
def test_a_model_returning_several_outputs_is_refused_with_the_way_out(plain_tuple, what):
    with pytest.raises(ExportError) as e:
        convert(AuxHeads(plain_tuple), (1, 3, 4, 4))
    msg = str(e.value)
    assert f"must return one tensor (the logits); it returns {what}" in msg, msg
    assert "aux_logits=False" in msg, msg


def test_a_module_called_twice_is_refused_since_each_layer_has_its_own_parameters():
    conv = nn.Conv2d(3, 3, 3, padding=1)

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = conv

        def forward(self, x):
            return self.conv(self.conv(x)).flatten(1)

    with pytest.raises(ExportError, match="more than once"):
        convert(Twice(), (1, 3, 4, 4))


class Unused(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3)
        self.unused = nn.Linear(2, 2)

    def forward(self, x):
        return self.conv(x).flatten(1)


def test_parameters_forward_does_not_use_are_refused_since_the_checkpoint_would_not_load_back():
    model = Unused()
    with pytest.raises(ExportError) as e:
        convert(model, (1, 3, 4, 4))
    assert e.value.module_path == "unused" and "unused.weight" in str(e.value)


@pytest.mark.parametrize("write", [lambda y: F.relu(y, inplace=True), F.elu_, F.leaky_relu_,
                                   lambda y: y.add_(1), lambda y: y.mul_(2), lambda y: y.div_(2),
                                   lambda y: y.sub_(1), lambda y: y.neg_()],
                         ids=["relu_inplace", "elu_", "leaky_relu_", "add_", "mul_", "div_", "sub_", "neg_"])
def test_writing_into_a_tensor_that_is_read_later_is_refused(write):
    class Aliased(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 3, 3, padding=1)

        def forward(self, x):
            y = self.conv(x)
            z = write(y)
            return (z + y).flatten(1)

    with pytest.raises(ExportError, match="in place"):
        convert(Aliased(), (1, 3, 4, 4))


def test_a_permute_other_than_to_channels_last_and_back_is_refused():
    class Transposed(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 3, 3)

        def forward(self, x):
            return self.conv(x).permute(0, 1, 3, 2).flatten(1)

    with pytest.raises(ExportError, match=r"permutes with \(0, 1, 3, 2\)"):
        convert(Transposed(), (1, 3, 5, 4))


def test_exporting_leaves_the_module_in_its_mode_with_its_statistics():
    model = M.resnet50(num_classes=10)
    model.layer1.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    convert(model, (2, 3, 64, 64))
    assert model.training and not model.layer1.training and model.layer2.training
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


# ---- the files -----------------------------------------------------------------------------


def test_export_model_writes_a_config_the_service_takes_and_the_state_dict(tmp_path):
    model = randomize_batchnorm(M.squeezenet1_1(num_classes=7))
    ex = export_model(model, (3, 64, 64), tmp_path / "sq")
    assert sorted(os.listdir(tmp_path)) == ["sq"]
    assert sorted(os.listdir(tmp_path / "sq")) == ["config.json", "init.safetensors"]
    cfg = json.loads((tmp_path / "sq" / "config.json").read_text())
    assert cfg["model"] == {"spec": ex.spec, "init_from": str(tmp_path / "sq" / "init.safetensors")}
    # The torchvision recipe at the model's input size.
    assert {"op": "random_resized_crop", "size": [64, 64]} in cfg["augment"]["pipeline"]
    assert {"op": "center_crop", "size": [64, 64]} in cfg["augment"]["eval_pipeline"]
    back = load_file(str(tmp_path / "sq" / "init.safetensors"))
    fresh = M.squeezenet1_1(num_classes=7)
    fresh.load_state_dict(back, strict=True)
    for k, v in model.state_dict().items():
        assert torch.equal(back[k], v)


def test_num_batches_tracked_is_written_as_the_int64_scalar_the_service_reads(tmp_path):
    model = nn.Sequential(nn.Conv2d(3, 2, 1), nn.BatchNorm2d(2), nn.Flatten())
    model[1].num_batches_tracked.fill_(7)
    export_model(model, (3, 2, 2), tmp_path / "bn", recipe=None)
    t = load_file(str(tmp_path / "bn" / "init.safetensors"))["1.num_batches_tracked"]
    assert t.dtype == torch.int64 and t.shape == () and int(t) == 7
    assert "augment" not in json.loads((tmp_path / "bn" / "config.json").read_text())


def test_more_options_go_into_the_config_by_section(tmp_path):
    export_model(nn.Sequential(nn.Conv2d(3, 2, 1), nn.Flatten()), (3, 1, 1), tmp_path / "o", recipe=None,
                 config={"optim": {"name": "adamw", "lr": 0.001}})
    assert json.loads((tmp_path / "o" / "config.json").read_text())["optim"] == {"name": "adamw", "lr": 0.001}


def test_the_adamw_recipe_writes_torch_optim_adamw_defaults(tmp_path):
    model = nn.Sequential(nn.Conv2d(3, 2, 1), nn.Flatten())
    export_model(model, (3, 1, 1), tmp_path / "a", recipe=None, optimizer="adamw", config={"optim": {"lr": 3e-4}})
    optim = json.loads((tmp_path / "a" / "config.json").read_text())["optim"]
    want = torch.optim.AdamW(model.parameters()).defaults
    assert optim == {"name": "adamw", "lr": 3e-4, "beta1": want["betas"][0], "beta2": want["betas"][1],
                     "eps": want["eps"], "weight_decay": want["weight_decay"]}
    with pytest.raises(ExportError, match="'adam'"):
        export_model(model, (3, 1, 1), tmp_path / "b", optimizer="adam")
    assert sorted(os.listdir(tmp_path)) == ["a"]


def test_the_command_takes_the_optimizer(tmp_path, capsys):
    rc = main(["torch.nn:Flatten", "--input", "3,1,1", "--optimizer", "adamw", "--out", str(tmp_path / "c")])
    assert rc == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "c" / "config.json").read_text())["optim"]["name"] == "adamw"


def test_a_refused_export_writes_nothing(tmp_path):
    with pytest.raises(ExportError):
        export_model(Attention(), (3, 8, 8), tmp_path / "out")
    assert os.listdir(tmp_path) == []


def test_an_export_that_fails_while_writing_leaves_nothing(tmp_path, monkeypatch):
    import safetensors.torch

    def broken(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        export_model(nn.Sequential(nn.Conv2d(3, 2, 1), nn.Flatten()), (3, 1, 1), tmp_path / "out")
    assert os.listdir(tmp_path) == []


def test_an_existing_directory_is_replaced_only_when_asked(tmp_path):
    model = nn.Sequential(nn.Conv2d(3, 2, 1), nn.Flatten())
    export_model(model, (3, 1, 1), tmp_path / "d")
    with pytest.raises(ExportError, match="exists"):
        export_model(model, (3, 2, 2), tmp_path / "d")
    assert json.loads((tmp_path / "d" / "config.json").read_text())["model"]["spec"]["input"] == [3, 1, 1]
    export_model(model, (3, 2, 2), tmp_path / "d", overwrite=True)
    assert json.loads((tmp_path / "d" / "config.json").read_text())["model"]["spec"]["input"] == [3, 2, 2]
    assert sorted(os.listdir(tmp_path)) == ["d"]


def test_the_command_exports_a_torchvision_factory(tmp_path, capsys):
    rc = main(["torchvision.models:mobilenet_v3_small", "--kwargs", '{"num_classes": 4}', "--input", "3,64,64",
               "--out", str(tmp_path / "m")])
    assert rc == 0, capsys.readouterr().err
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["model"]["spec"]["classes"] == 4
    assert "streamfeed --config" in capsys.readouterr().out


def test_the_command_reports_a_refusal_and_exits_2(tmp_path, capsys):
    rc = main(["torch.nn:LSTM", "--kwargs", '{"input_size": 3, "hidden_size": 3}', "--input", "3,4,4",
               "--out", str(tmp_path / "x")])
    assert rc == 2
    assert "cannot export" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_the_docs_list_every_supported_module():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "EXPORT.md").read_text()
    for name in SUPPORTED_MODULES:
        assert f"`{name}`" in doc, f"docs/EXPORT.md does not list {name}"


def test_the_export_sweep_reports_each_model_as_exported_or_refused(capsys):
    """tools/export_sweep.py (docs/EXPORT.md quotes a run): a model the
    exporter takes is OK with its layer count, one it refuses names the op;
    only a crash fails the sweep."""
    path = Path(__file__).resolve().parents[2] / "tools" / "export_sweep.py"
    spec = importlib.util.spec_from_file_location("export_sweep", path)
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    assert sweep.main(["squeezenet1_1", "swin_t", "segmentation.lraspp_mobilenet_v3_large"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("squeezenet1_1: OK ") and " layers " in out[0]
    assert out[1].startswith("swin_t: REFUSED cannot export ") and "features.1.0.attn" in out[1], out[1]
    assert out[2].startswith("segmentation.lraspp_mobilenet_v3_large: OK "), out[2]
    assert out[3].endswith("2 OK, 1 REFUSED, 0 CRASH")


class _LearnableAffine(nn.Module):
    """timm's LearnableAffineBlock: one weight and one bias, [1] each."""
    def __init__(self, shape=(1,), bias_shape=None):
        super().__init__()
        self.scale = nn.Parameter(torch.full(shape, 1.5))
        self.bias = nn.Parameter(torch.full(bias_shape or shape, -0.25))

    def forward(self, x):
        return self.scale * x + self.bias


def test_a_modules_weight_times_x_plus_its_bias_is_one_scale_shift_named_by_the_module():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = nn.Conv2d(3, 4, 3, padding=1)
            self.lab = _LearnableAffine()
            self.chan = _LearnableAffine((1, 4, 1, 1))
            self.head = nn.Module()
            self.head.gain = nn.Parameter(torch.tensor([0.5]))
            self.fc = nn.Linear(4 * 8 * 8, 10)

        def forward(self, x):
            y = self.chan(self.lab(self.c(x)))
            return self.fc(torch.flatten(y * self.head.gain, 1))

    m = Net().eval()
    ex = convert(m, (2, 3, 8, 8))
    by_name = {layer["name"]: layer for layer in ex.spec["layers"]}
    assert by_name["lab"] == {"type": "scale_shift", "name": "lab", "num_parameters": 1, "param_shape": "[C]",
                              "param_names": {"weight": "scale"}}
    assert by_name["chan"]["num_parameters"] == 4 and by_name["chan"]["param_shape"] == "[1,C,1,1]"
    assert by_name["head"] == {"type": "scale_shift", "name": "head", "num_parameters": 1, "param_shape": "[C]",
                               "bias": False, "param_names": {"weight": "gain"}}
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(run_spec(ex.spec, ex.tensors, x), m(x), rtol=1e-5, atol=1e-5)


def test_learnable_affines_that_are_not_one_per_channel_are_refused_naming_the_shapes():
    class Wide(nn.Module):  # [C] times an NCHW map broadcasts over its width in PyTorch, not its channels
        def __init__(self):
            super().__init__()
            self.c = nn.Conv2d(3, 4, 3, padding=1)
            self.aff = _LearnableAffine((4,))

        def forward(self, x):
            return self.aff(self.c(x)).mean((2, 3))

    class Mixed(nn.Module):  # a weight and a bias of different shapes
        def __init__(self):
            super().__init__()
            self.c = nn.Conv2d(3, 4, 3, padding=1)
            self.aff = _LearnableAffine((4, 1, 1), (1,))

        def forward(self, x):
            return self.aff(self.c(x)).mean((2, 3))

    for make, want in ((Wide, "of shape [4]"), (Mixed, "and aff.bias of shape [1]")):
        with pytest.raises(ExportError) as e:
            convert(make(), (1, 3, 4, 4))
        assert e.value.module_path == "aff" and want in str(e.value) and "[C,1,1]" in str(e.value), str(e.value)

    class Twice(nn.Module):  # addcmul's value other than 1
        def __init__(self):
            super().__init__()
            self.c = nn.Conv2d(3, 4, 3, padding=1)
            self.alpha = nn.Parameter(torch.ones(4, 1, 1))
            self.beta = nn.Parameter(torch.zeros(4, 1, 1))

        def forward(self, x):
            return torch.addcmul(self.beta, self.alpha, self.c(x), value=2).mean((2, 3))

    with pytest.raises(ExportError) as e:
        convert(Twice(), (1, 3, 4, 4))
    assert "addcmul" in str(e.value) and "value 1" in str(e.value)

    class Root(nn.Module):  # a parameter of the top-level module: no submodule to name the layer by
        def __init__(self):
            super().__init__()
            self.c = nn.Conv2d(3, 4, 3, padding=1)
            self.gain = nn.Parameter(torch.tensor([0.5]))

        def forward(self, x):
            return (self.c(x) * self.gain).mean((2, 3))

    with pytest.raises(ExportError) as e:
        convert(Root(), (1, 3, 4, 4))
    assert "gain" in str(e.value) and "submodule" in str(e.value)


def test_timms_drop_path_is_stochastic_depth_on_maps_and_tokens():
    """timm's DropPath (a model's drop_path_rate): stochastic depth with its
    drop_prob, on a residual branch's map (ResNet) and on a ViT's tokens;
    at rate 0 nothing; scale_by_keep=False (no 1/(1-p)) refused by name."""
    timm = pytest.importorskip("timm", reason="timm is not installed (tests/install_torch.sh installs it)")
    cnn = convert(timm.create_model("resnet18", num_classes=10, drop_path_rate=0.2), (3, 32, 32)).spec["layers"]
    drops = [la for la in cnn if la["type"] == "stochastic_depth"]
    assert [la["name"] for la in drops] == [f"layer{i}.{j}.drop_path" for i in range(1, 5) for j in (0, 1)][1:], drops
    assert all(la["mode"] == "row" for la in drops) and abs(drops[-1]["p"] - 0.2) < 1e-6
    vit = timm.create_model("vit_tiny_patch16_224", num_classes=10, img_size=32, patch_size=8, depth=2,
                            drop_path_rate=0.1)
    layers = convert(vit, (3, 32, 32)).spec["layers"]
    assert [la["name"] for la in layers if la["type"] == "stochastic_depth"] == ["blocks.1.drop_path1",
                                                                                  "blocks.1.drop_path2"]
    none = convert(timm.create_model("resnet18", num_classes=10), (3, 32, 32)).spec["layers"]
    assert "stochastic_depth" not in {la["type"] for la in none}
    unscaled = timm.create_model("resnet18", num_classes=10, drop_path_rate=0.2)
    unscaled.layer4[1].drop_path.scale_by_keep = False
    with pytest.raises(ExportError) as e:
        convert(unscaled, (3, 32, 32))
    assert e.value.module_path == "layer4.1.drop_path" and "scale_by_keep" in str(e.value)
