"""streamfeed.export on MetaFormer v2's pieces, without a server: norms
without a bias (F.layer_norm and F.group_norm of a weight alone,
nn.LayerNorm(bias=False)), StarReLU as relu, square and a one-value
scale_shift, each spelling of x ** 2, and other powers refused naming
them. Each exported spec is checked to compute the module's own eval output
(spec_interpreter.assert_spec_computes_the_module)."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
nn = torch.nn
F = torch.nn.functional

from streamfeed.export import ExportError, convert  # noqa: E402
from spec_interpreter import assert_spec_computes_the_module  # noqa: E402


class StarReLU(nn.Module):
    """timm's StarReLU (MetaFormer v2), its product and power spelled the
    other way round from timm's (test_export_timm.py has timm's own):
    torch.pow(relu(x), 2) * scale + bias, one learnable value each."""

    def __init__(self):
        super().__init__()
        self.scale, self.bias = nn.Parameter(torch.full((1,), 0.8944)), nn.Parameter(torch.full((1,), -0.4472))

    def forward(self, x):
        return torch.pow(F.relu(x), 2) * self.scale + self.bias


class NoBiasNorms(nn.Module):
    """MetaFormer v2's norms without a bias (timm's LayerNorm2dNoBias and
    GroupNorm1NoBias written as F.layer_norm / F.group_norm of a weight
    alone, nn.LayerNorm(bias=False) on a channels-last map and on
    features), StarReLU, and each spelling of a square."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 8, 3)
        self.n1, self.n2 = nn.LayerNorm(8, bias=False), nn.GroupNorm(1, 8)
        self.n3, self.n4 = nn.LayerNorm(8, bias=False), nn.LayerNorm(8, bias=False)
        self.n2.bias = None
        for m in (self.n1, self.n2, self.n3, self.n4):
            nn.init.normal_(m.weight)
        self.act = StarReLU()
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        y = self.c(x)
        y = F.layer_norm(y.permute(0, 2, 3, 1), (8,), self.n1.weight, None, 1e-6).permute(0, 3, 1, 2)
        y = self.act(F.group_norm(y, 1, self.n2.weight, None, 1e-6))
        y = self.n3(y.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        y = torch.square(y) + y.pow(2) + torch.pow(y, 2) + y.square()
        return self.fc(self.n4(y.mean((2, 3))))


def test_norms_without_a_bias_and_squares_export_as_pytorch_holds_them():
    ex = assert_spec_computes_the_module(NoBiasNorms(), hw=8)
    layers = ex.spec["layers"]
    norms = [la for la in layers if "norm" in la["type"]]
    assert norms == [{"type": "layernorm2d", "name": "n1", "eps": 1e-06, "bias": False},
                     {"type": "groupnorm", "name": "n2", "num_groups": 1, "eps": 1e-06, "bias": False},
                     {"type": "layernorm2d", "name": "n3", "bias": False},
                     {"type": "layernorm", "name": "n4", "bias": False}]
    assert [la["type"] for la in layers].count("square") == 5
    star = [la for la in layers if la["name"].startswith("act")]
    assert [la["type"] for la in star] == ["relu", "square", "scale_shift"], star
    assert star[2]["param_names"] == {"weight": "scale"}
    assert not any(k.endswith(".bias") for k in ex.tensors if k.startswith("n")), sorted(ex.tensors)


@pytest.mark.parametrize("exponent", [3, 0.5, -1])
def test_a_power_other_than_two_is_refused_naming_it(exponent):
    class Power(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = nn.Conv2d(3, 4, 3)

        def forward(self, x):
            return (self.c(x) ** exponent).flatten(1)

    with pytest.raises(ExportError) as e:
        convert(Power(), (1, 3, 8, 8))
    assert f"raises to the power {exponent!r}; supported is x ** 2" in str(e.value) and "pow" in e.value.op


class ScaleOnTheWidth(nn.Module):
    """x * scale.view(C) of an NCHW map broadcasts over its width, not its
    channels: no layer_scale computes that."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 8, 1)
        self.res = nn.Module()
        self.res.scale = nn.Parameter(torch.ones(8))

    def forward(self, x):
        return (self.c(x) * self.res.scale.view((8,))).flatten(1)


def test_a_parameter_viewed_as_itself_scales_only_tokens_or_a_channels_last_map():
    with pytest.raises(ExportError, match=r"multiplies by the module tensor res.scale") as e:
        convert(ScaleOnTheWidth(), (1, 3, 8, 8))
    assert "channels-last map or a token sequence" in str(e.value)


class SplitAcrossRows(nn.Module):
    """A channels-last map split along its rows (dim 1), not its channels."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        top, bottom = torch.split(self.c(x).permute(0, 2, 3, 1), 4, dim=1)
        return (top + bottom).flatten(1)


def test_a_channels_last_map_splits_along_its_channels_only():
    with pytest.raises(ExportError, match=r"splits a tensor of per-sample shape \[8, 8, 4\] along dimension 1"):
        convert(SplitAcrossRows(), (1, 3, 8, 8))


class TokensBack(nn.Module):
    """Tokens turned back into their map by transpose(1, 2).contiguous().view
    or permute(0, 2, 1).reshape: both to_map."""

    def __init__(self, spelling):
        super().__init__()
        self.spelling = spelling
        self.c, self.fc, self.head = nn.Conv2d(3, 8, 2, stride=2), nn.Linear(8, 8), nn.Linear(8, 5)

    def forward(self, x):
        y = self.c(x)
        b, c, h, w = y.shape
        t = self.fc(y.flatten(2).transpose(1, 2))
        if self.spelling == "contiguous":
            y = t.transpose(1, 2).contiguous().view(b, c, h, w)
        else:
            y = t.permute(0, 2, 1).reshape(b, c, h, w)
        return self.head(y.mean((2, 3)))


@pytest.mark.parametrize("spelling", ["contiguous", "permute"])
def test_tokens_go_back_to_their_map_in_either_spelling(spelling):
    ex = assert_spec_computes_the_module(TokensBack(spelling), hw=8)
    assert [la["type"] for la in ex.spec["layers"]].count("to_map") == 1


class MixedLayouts(nn.Module):
    """A channels-last pooled map plus an NCHW one: torch broadcasts them to
    [N, C, 1, C], so the export is refused naming the layouts."""

    def __init__(self):
        super().__init__()
        self.c, self.head = nn.Conv2d(3, 8, 1), nn.Linear(8, 5)

    def forward(self, x):
        y = self.c(x)
        a = y.permute(0, 2, 3, 1).sum((1, 2), keepdim=True)
        return self.head((a + y.mean((2, 3), keepdim=True)).mean((2, 3)))


def test_a_channels_last_and_an_nchw_tensor_are_not_added():
    with pytest.raises(ExportError, match=r"the first channels-last, the other not"):
        convert(MixedLayouts(), (1, 3, 8, 8))


class ScaledLastDim(nn.Module):
    """A [C] parameter viewed as (C,), (1, 1, C) or (1, 1, 1, C) times a
    channels-last map and times tokens: each broadcasts along the channels,
    so each is a layer_scale."""

    def __init__(self, view):
        super().__init__()
        self.view = view
        self.c, self.head = nn.Conv2d(3, 8, 2, stride=2), nn.Linear(8, 5)
        self.s1, self.s2 = nn.Module(), nn.Module()
        self.s1.scale, self.s2.scale = nn.Parameter(torch.rand(8) + 0.5), nn.Parameter(torch.rand(8) + 0.5)

    def forward(self, x):
        y = self.c(x)
        m = y.permute(0, 2, 3, 1) * self.s1.scale.view(self.view)
        t = y.flatten(2).transpose(1, 2) * self.s2.scale.view(self.view[-3:] if len(self.view) > 3 else self.view)
        return self.head(m.mean((1, 2)) + t.mean(1))


@pytest.mark.parametrize("view", [(8,), (1, 1, 8), (1, 1, 1, 8)])
def test_a_parameter_viewed_along_the_last_dimension_is_a_layer_scale(view):
    ex = assert_spec_computes_the_module(ScaledLastDim(view), hw=8)
    assert [la["type"] for la in ex.spec["layers"]].count("layer_scale") == 2
