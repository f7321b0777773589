"""Functions in a user's forward() that take more than tensors. F.conv2d
and F.linear of a module's own parameters (export_params.py):
the layer named by the submodule holding weight and bias, so that the
checkpoint's keys are the module's state_dict keys; and the refusals, each
naming what the call takes instead. Training against PyTorch from the same
weights is tests/integration/test_layer_kinds_torch.py's
functional_conv_linear case. A pooling's arguments computed from the
input's shape (``F.avg_pool2d(x, x.size()[2:])``), which are the numbers
they compute, and one computed from the batch size, refused. Global pooling
written as a reduction over dimensions (``x.sum((2, 3))``,
``torch.amax(x, (2, 3))``, a sum over tokens) as pooling layers."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from streamfeed.export import ExportError, convert  # noqa: E402
from spec_interpreter import assert_spec_computes_the_module  # noqa: E402
from test_export import ArithmeticOf  # noqa: E402

WIDTH = 8  # the reductions' maps' channels


class OwnConv(nn.Module):
    def __init__(self, cin, cout, k, bias=True, **call):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(cout, cin // call.get("groups", 1), k, k) * 0.3)
        self.bias = nn.Parameter(torch.randn(cout) * 0.1) if bias else None
        self.call = call

    def forward(self, x):
        return F.conv2d(x, self.weight, self.bias, **self.call)


class OwnLinear(nn.Module):
    def __init__(self, cin, cout, bias=True):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(cout, cin) * 0.2)
        self.bias = nn.Parameter(torch.randn(cout) * 0.1) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = OwnConv(3, 8, 3, padding=1)
        self.block = nn.Sequential(OwnConv(8, 8, 3, stride=2, padding=1, groups=8), nn.ReLU(),
                                   OwnConv(8, 16, 1, bias=False, dilation=1))
        self.head = OwnLinear(16, 10)

    def forward(self, x):
        y = self.block(torch.relu(self.stem(x)))
        return self.head(F.adaptive_avg_pool2d(y, 1).flatten(1))


def test_functional_conv_and_linear_are_layers_named_by_their_modules():
    model = Net()
    ex = assert_spec_computes_the_module(model, hw=16)
    layers = {la["name"]: la for la in ex.spec["layers"]}
    assert layers["stem"] == {"type": "conv2d", "name": "stem", "out": 8, "k": 3, "pad": 1}
    assert layers["block.0"] == {"type": "conv2d", "name": "block.0", "out": 8, "k": 3, "stride": 2, "pad": 1,
                                 "groups": 8}
    assert layers["block.2"] == {"type": "conv2d", "name": "block.2", "out": 16, "k": 1, "bias": False}
    assert layers["head"] == {"type": "linear", "name": "head", "out": 10}
    assert sorted(ex.tensors) == sorted(model.state_dict())


class TopLevel(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 3, 3, 3))

    def forward(self, x):
        return F.conv2d(x, self.weight).flatten(1)


class Computed(OwnConv):
    def forward(self, x):  # weight standardisation: a weight computed from the parameter
        w = self.weight - self.weight.mean(dim=(1, 2, 3), keepdim=True)
        return F.conv2d(x, w, self.bias)


class OtherName(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(10, 12))

    def forward(self, x):
        return F.linear(x, self.w)


class Buffered(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("weight", torch.randn(10, 12))

    def forward(self, x):
        return F.linear(x, self.weight)


class BorrowedBias(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(10, 12))
        self.other = nn.Linear(12, 10)

    def forward(self, x):
        return F.linear(x, self.weight, self.other.bias)


class Holder(nn.Module):
    def __init__(self, inner, flat):
        super().__init__()
        self.inner, self.flat = inner, flat

    def forward(self, x):
        return self.inner(x.flatten(1) if self.flat else x)


@pytest.mark.parametrize("model, shape, path, why", [
    (TopLevel(), (1, 3, 6, 6), "", "top-level module's own parameter weight"),
    # refused where the weight is computed, naming the parameter it reads
    (Holder(Computed(3, 4, 3), False), (1, 3, 6, 6), "inner", "the tensor inner.weight of the module"),
    (Holder(OtherName(), True), (1, 3, 2, 2), "inner", "the parameter inner.w"),
    (Holder(Buffered(), True), (1, 3, 2, 2), "inner", "the buffer inner.weight"),
    (Holder(BorrowedBias(), True), (1, 3, 2, 2), "inner", "inner.bias, a parameter, or None"),
], ids=["top_level", "computed_weight", "other_name", "buffer", "borrowed_bias"])
def test_a_functional_call_on_other_tensors_is_refused_naming_them(model, shape, path, why):
    with pytest.raises(ExportError) as e:
        convert(model, shape)
    assert why in str(e.value) and e.value.module_path == path, str(e.value)


class ShapePools(nn.Module):
    """Pooling over the whole map with kernels read from the map's size, as
    older CIFAR models write it."""

    def __init__(self, pool):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = pool
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return self.fc(self.pool(y).view(y.size(0), -1))


@pytest.mark.parametrize("pool, kind", [
    (lambda y: F.avg_pool2d(y, y.size()[2:]), "avgpool2d"),
    (lambda y: F.avg_pool2d(y, kernel_size=y.size(3)), "avgpool2d"),
    (lambda y: F.max_pool2d(y, y.shape[2:]), "maxpool2d"),
], ids=["avg_size_slice", "avg_size_int", "max_shape_slice"])
def test_a_pooling_kernel_computed_from_the_map_size_is_that_number(pool, kind):
    ex = assert_spec_computes_the_module(ShapePools(pool), hw=8)
    layer = [la for la in ex.spec["layers"] if la["type"] == kind]
    assert len(layer) == 1 and layer[0]["k"] == 8, layer


def test_a_pooling_kernel_computed_from_the_batch_size_is_refused():
    with pytest.raises(ExportError, match="computed from tensors or the batch size") as e:
        convert(ShapePools(lambda y: F.avg_pool2d(y, y.size(0)).mean((2, 3), keepdim=True)), (2, 3, 8, 8))
    assert e.value.module_path == ""


class Reduced(nn.Module):
    """Global pooling written as a reduction: a sum and an amax over (2,3)
    of a map, and a sum over the tokens."""

    def __init__(self, how):
        super().__init__()
        self.how = how
        self.embed = nn.Conv2d(3, WIDTH, 2, 2)
        self.head = nn.Linear(WIDTH, 5)

    def forward(self, x):
        x = self.embed(x)
        how = self.how
        if how == "sum":
            y = x.sum(dim=(2, 3))
        elif how == "amax":
            y = torch.amax(x, dim=(-2, -1))
        elif how == "amax_keepdim":
            y = x.amax((2, 3), keepdim=True).flatten(1)
        elif how == "sum_tokens":
            y = x.flatten(2).transpose(1, 2)[:, 1:].sum(1)
        elif how == "amax_wide":
            y = x[:, :, :2].amax(dim=(2, 3))
        else:  # the whole tensor's sum, broadcast back over the features
            y = x.mean((2, 3)) + x.sum()
        return self.head(y)


@pytest.mark.parametrize("how, kinds", [
    ("sum", ["global_avgpool", "flatten", "affine"]),
    ("amax", ["maxpool2d", "flatten"]),
    ("amax_keepdim", ["maxpool2d", "flatten"]),
    ("sum_tokens", ["to_tokens", "token_mean", "affine"]),
])
def test_sums_and_maxima_over_the_map_or_the_tokens_are_pooling(how, kinds):
    torch.manual_seed(4)
    ex = assert_spec_computes_the_module(Reduced(how), hw=8)
    assert [layer["type"] for layer in ex.spec["layers"]] == ["conv2d", *kinds, "linear"]


@pytest.mark.parametrize("how, why", [("amax_wide", "square map"), ("all", "over given dimensions")])
def test_other_reductions_are_refused(how, why):
    with pytest.raises(ExportError, match=why):
        convert(Reduced(how), (1, 3, 8, 8))


class OwnLayerNorm(nn.LayerNorm):
    """timm's LayerNorm: F.layer_norm of the module's own weight and bias."""

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class NormedHead(nn.Module):
    def __init__(self, bias=True, extra=None):
        super().__init__()
        self.embed = nn.Conv2d(3, 8, 4, 4)
        self.norm = OwnLayerNorm(8, eps=1e-6, bias=bias)
        self.head = nn.Linear(8, 5)
        self.extra = extra

    def forward(self, x, mask=None, scale=1.0):
        """Arguments after the batch with defaults, as timm's forward(x, attn_mask=None)."""
        y = self.norm(self.embed(x).flatten(2).transpose(1, 2))
        if mask is not None:
            y = y * mask
        return self.head(y.mean(1)) * scale


def test_f_layer_norm_of_a_modules_own_parameters_is_its_layernorm_and_defaults_are_traced():
    torch.manual_seed(6)
    ex = assert_spec_computes_the_module(NormedHead(), hw=8)
    assert ex.spec["layers"][2] == {"type": "layernorm", "name": "norm", "eps": 1e-6}
    assert {"norm.weight", "norm.bias"} <= set(ex.tensors)


def test_f_layer_norm_without_a_bias_is_a_layernorm_without_one():
    torch.manual_seed(6)
    ex = assert_spec_computes_the_module(NormedHead(bias=False), hw=8)
    assert ex.spec["layers"][2] == {"type": "layernorm", "name": "norm", "eps": 1e-6, "bias": False}
    assert "norm.weight" in ex.tensors and "norm.bias" not in ex.tensors


def test_a_second_input_without_a_default_is_refused():
    class TwoInputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x, y):
            return self.fc(x.mean((2, 3)) + y)
    with pytest.raises(ExportError, match="takes 2 inputs"):
        convert(TwoInputs(), (1, 3, 4, 4))


class Casts(nn.Module):
    """Casts that leave a float32 tensor as it is, as code written for mixed
    precision has them, or one to half precision (how="half")."""

    def __init__(self, how):
        super().__init__()
        self.how = how
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4, 5)

    def forward(self, x):
        y = self.conv(x)
        if self.how == "half":
            y = y.to(torch.float16).float()
        else:
            y = torch.relu(y.float()).to(torch.float32).to(x.dtype).type_as(x)
        return self.head(y.mean((2, 3)))


def test_casts_that_leave_a_float32_tensor_as_it_is_are_no_layers():
    torch.manual_seed(3)
    ex = assert_spec_computes_the_module(Casts("same"), hw=8)
    assert [layer["type"] for layer in ex.spec["layers"]] == ["conv2d", "relu", "global_avgpool", "flatten",
                                                               "linear"]


def test_a_cast_to_another_dtype_is_refused():
    with pytest.raises(ExportError) as e:
        convert(Casts("half"), (1, 3, 8, 8))
    assert "to" in e.value.op, str(e.value)


class BatchNormAct(nn.BatchNorm2d):
    """timm's BatchNormAct2d in short: an nn.BatchNorm2d subclass whose
    forward() counts num_batches_tracked up itself, calls F.batch_norm with
    the module's own tensors (training as given, or the module's mode) and
    then its activation."""

    def __init__(self, c, training=None, **kw):
        super().__init__(c, **kw)
        self.force = training
        self.act = nn.SiLU()

    def forward(self, x):
        if self.training:
            self.num_batches_tracked.add_(1)
        x = F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                         self.training if self.force is None else self.force, self.momentum, self.eps)
        return self.act(x)


class BnActNet(nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1, bias=False)
        self.bn = norm
        self.head = nn.Conv2d(6, 4, 1)
        self.bn_head = BatchNormAct(4)  # after the global pool: [N, 4, 1, 1]
        self.fc = nn.Linear(4, 5)

    def forward(self, x):
        y = self.bn_head(self.head(self.bn(self.conv(x)).mean((2, 3), keepdim=True)))
        return self.fc(y.flatten(1))


def test_f_batch_norm_of_a_batchnorm_modules_own_tensors_is_its_batchnorm2d_and_leaves_them_as_they_were():
    """The call is the module's batchnorm2d, under its names, with the
    call's eps and momentum; the activation after it is a layer of its own.
    Exporting runs the training-mode trace, where F.batch_norm(training=True)
    would move the running statistics and the count: they stay as they were.
    A batch of one is exported too, although a batchnorm in training mode
    takes no [1, C, 1, 1] map (PyTorch: "Expected more than 1 value per
    channel"): the shapes come from two copies of it."""
    torch.manual_seed(7)
    model = BnActNet(BatchNormAct(6, eps=1e-3, momentum=0.01))
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 2)
                m.num_batches_tracked.fill_(3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ex = convert(model, (1, 3, 8, 8))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(torch.equal(before[k], ex.tensors[k]) for k in before)
    kinds = [(layer["type"], layer["name"]) for layer in ex.spec["layers"]]
    assert kinds[:3] == [("conv2d", "conv"), ("batchnorm2d", "bn"), ("silu", "bn.act")]
    assert ex.spec["layers"][1] == {"type": "batchnorm2d", "name": "bn", "eps": 1e-3, "momentum": 0.01}
    assert {f"bn.{k}" for k in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")} <= \
        set(ex.tensors)
    assert_spec_computes_the_module(model, hw=8)


class OwnStatsNorm(nn.Module):
    """Running statistics and an affine pair held as a module of the user's
    own (not a batchnorm), handed to F.batch_norm."""

    def __init__(self, c):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(c))
        self.bias = nn.Parameter(torch.zeros(c))
        self.register_buffer("running_mean", torch.zeros(c))
        self.register_buffer("running_var", torch.ones(c))

    def forward(self, x):
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, True, 0.1, 1e-5)


@pytest.mark.parametrize("norm, match", [
    (BatchNormAct(6, training=False), "training=False in a training-mode trace"),
    (OwnStatsNorm(6), "supported are the four of one nn.BatchNorm2d"),
    (BatchNormAct(6, affine=False), "supported are the four of one nn.BatchNorm2d"),
], ids=["frozen", "not_a_batchnorm", "no_affine"])
def test_f_batch_norm_is_refused_where_the_service_would_train_another_batchnorm(norm, match):
    with pytest.raises(ExportError, match=match) as e:
        convert(BnActNet(norm), (2, 3, 8, 8))
    assert e.value.module_path == "bn" and e.value.op == "torch.nn.functional.batch_norm"


class ScaledBlock(nn.Module):
    """timm's ConvNeXt block ends in x.mul(self.gamma.reshape(1, -1, 1, 1));
    shape: another parameter shape, viewed as [1, 6, 1, 1] all the same."""

    def __init__(self, view=(1, -1, 1, 1), shape=(6,)):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.gamma = nn.Parameter(torch.rand(shape) + 0.5)
        self.view = view

    def forward(self, x):
        return self.conv(x).mul(self.gamma.reshape(*self.view))


class ScaledNet(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.block = ScaledBlock(**kw)
        self.fc = nn.Linear(6, 5)

    def forward(self, x):
        return self.fc(self.block(x).mean((2, 3)))


@pytest.mark.parametrize("view", [(1, -1, 1, 1), (-1, 1, 1)])
def test_a_channel_parameter_viewed_as_c_1_1_times_a_map_is_a_layer_scale_under_its_own_name(view):
    torch.manual_seed(8)
    ex = assert_spec_computes_the_module(ScaledNet(view=view), hw=8)
    assert ex.spec["layers"][1] == {"type": "layer_scale", "name": "block", "vector": True,
                                    "param_names": {"layer_scale": "gamma"}}
    assert "block.gamma" in ex.tensors


def test_another_view_of_a_module_parameter_is_refused_naming_it():
    with pytest.raises(ExportError, match=r"views the module tensor block.gamma as \[1, 6, 1, 1\]") as e:
        convert(ScaledNet(shape=(2, 3)), (1, 3, 8, 8))
    assert e.value.module_path == "block"


class GroupNorm1(nn.GroupNorm):
    """timm's GroupNorm1 (PoolFormer's norm): one group, F.group_norm of the
    module's own weight and bias, all positional."""

    def __init__(self, c):
        super().__init__(1, c, eps=1e-6)

    def forward(self, x):
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)


class Pooling(nn.Module):
    """PoolFormer's token mixer: pool(x) - x, a difference of two tensors."""

    def __init__(self):
        super().__init__()
        self.pool = nn.AvgPool2d(3, 1, 1, count_include_pad=False)

    def forward(self, x):
        return self.pool(x) - x


class PoolFormerBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 6, 3, padding=1)
        self.norm1 = GroupNorm1(6)
        self.token_mixer = Pooling()
        self.head = nn.Linear(6, 5)

    def forward(self, x):
        x = self.stem(x)
        x = x + self.token_mixer(self.norm1(x))
        return self.head(x.mean((2, 3)))


def test_a_poolformer_block_exports_its_group_norm_under_its_names_and_pool_minus_x_as_affine_and_add():
    torch.manual_seed(9)
    model = PoolFormerBlock()
    with torch.no_grad():
        model.norm1.weight.uniform_(0.5, 1.5)
        model.norm1.bias.uniform_(-0.5, 0.5)
    ex = assert_spec_computes_the_module(model, hw=8)
    layers = ex.spec["layers"]
    assert layers[1] == {"type": "groupnorm", "name": "norm1", "num_groups": 1, "eps": 1e-6}
    assert {"norm1.weight", "norm1.bias"} <= set(ex.tensors)
    kinds = [layer["type"] for layer in layers]
    assert kinds[2:5] == ["avgpool2d", "affine", "add"] and layers[3]["scale"] == -1.0


def test_subtracting_tensors_of_different_shapes_is_refused():
    with pytest.raises(ExportError, match=r"subtracts tensors of shapes \[4, 6, 6\] and \[4, 1, 1\]") as e:
        convert(ArithmeticOf(lambda y: y - y.mean((2, 3), keepdim=True)), (1, 3, 8, 8))
    assert e.value.module_path == "head"


def test_a_viewed_channel_parameter_read_other_than_by_a_mul_is_refused_naming_it():
    """x + bias.view(1, -1, 1, 1): a per-channel bias, which the service has
    as no layer of its own."""
    class Biased(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = ScaledBlock()

        def forward(self, x):
            b = self.block
            return (b.conv(x) + b.gamma.view(1, -1, 1, 1)).flatten(1)
    with pytest.raises(ExportError, match=r"takes the parameter block.gamma viewed as \[1, C, 1, 1\]"):
        convert(Biased(), (1, 3, 8, 8))
