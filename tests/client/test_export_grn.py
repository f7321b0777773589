"""streamfeed.export on ConvNeXt V2's Global Response Normalization
(export_grn.py), without a server: both spellings make one grn layer per
GRN (tests/integration/test_export_timm.py trains them against PyTorch),
and a norm used any other way is refused naming the step."""
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from streamfeed.export import ExportError, convert  # noqa: E402


class NormHead(nn.Module):
    """A norm over the channels, not a GRN: refused."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        y = self.c(x)
        return (y / y.norm(p=2, dim=1, keepdim=True)).flatten(1)


class GrnWithoutResidual(nn.Module):
    """A GRN whose x is not added back: refused at the step that leaves."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 4, 1)
        self.grn = nn.Module()
        self.grn.weight, self.grn.bias = nn.Parameter(torch.ones(4)), nn.Parameter(torch.zeros(4))

    def forward(self, x):
        y = self.c(x)
        g = y.norm(p=2, dim=(2, 3), keepdim=True)
        n = g / (g.mean(dim=1, keepdim=True) + 1e-6)
        return (torch.addcmul(self.grn.bias.view(1, -1, 1, 1), self.grn.weight.view(1, -1, 1, 1), y * n)).flatten(1)


def test_a_norm_over_the_channels_is_refused_naming_what_is_supported():
    with pytest.raises(ExportError, match=r"norm with p=2 over dim=1") as e:
        convert(NormHead(), (1, 3, 8, 8))
    assert "Global Response Normalization" in str(e.value)


def test_a_grn_without_its_residual_add_is_refused_at_that_step():
    with pytest.raises(ExportError, match=r"not to an add of x"):
        convert(GrnWithoutResidual(), (1, 3, 8, 8))


class GrnVariant(nn.Module):
    """A GRN on an NCHW map with one step changed (how): each is refused, none
    accepted as a plain GRN nor crashing."""

    def __init__(self, how):
        super().__init__()
        self.how = how
        self.c = nn.Conv2d(3, 8, 1)
        self.grn = nn.Module()
        self.grn.weight, self.grn.bias = nn.Parameter(torch.ones(8)), nn.Parameter(torch.zeros(8))

    def forward(self, x):
        y = self.c(x)
        g = y.norm(p=2, dim=(2, 3), keepdim=True)
        m = g.mean(dim=1, keepdim=True)
        if self.how == "floor":
            n = torch.div(g, m + 1e-6, rounding_mode="floor")
        elif self.how == "alpha":
            n = g / torch.add(m, 1e-6, alpha=1e6)
        elif self.how == "clamp":
            n = g / m.clamp(min=1e-6)
        else:
            n = g / (m + 1e-6)
        w = self.grn.weight.view(1, 1, 1, -1) if self.how == "rows" else self.grn.weight.view(1, -1, 1, 1)
        return (y + torch.addcmul(self.grn.bias.view(1, -1, 1, 1), w, y * n)).flatten(1)


@pytest.mark.parametrize("how,message", [("floor", "no rounding mode"), ("alpha", "plus a number"),
                                         ("clamp", "plus a number"), ("rows", "broadcast along the channels")])
def test_a_grn_with_another_step_is_refused_naming_it(how, message):
    with pytest.raises(ExportError, match=message):
        convert(GrnVariant(how), (1, 3, 8, 8))
