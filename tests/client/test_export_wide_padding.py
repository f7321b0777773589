"""streamfeed.export on padding at the limits: a convolution that pads more
on a side than a conv2d layer takes (64) exports as a zero pad layer before
an unpadded conv2d, computing what the module computes; a pad PyTorch itself
refuses on the example input is refused naming the module and PyTorch's
reason, without the trace's dump."""
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from streamfeed.export import ExportError, convert  # noqa: E402


class WideConv(nn.Module):
    def __init__(self, pad, before=None):
        super().__init__()
        self.z = nn.ZeroPad2d(before) if before else nn.Identity()
        self.c = nn.Conv2d(3, 4, 3, padding=pad)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(self.c(self.z(x)).mean((2, 3)))


def spec_output(ex, x):
    """The spec's pad and conv2d layers run with torch (the first two
    layers), then the module's own head on the tensors the exporter wrote."""
    pad, conv = ex.spec["layers"][:2]
    y = F.pad(x, tuple(pad["pad"]))
    p = conv.get("pad", 0)
    y = F.conv2d(y, ex.tensors["c.weight"], ex.tensors["c.bias"], padding=p)
    return F.linear(y.mean((2, 3)), ex.tensors["fc.weight"], ex.tensors["fc.bias"])


@pytest.mark.parametrize("pad, before, sides, name", [
    (70, None, [70, 70, 70, 70], "c.pad"),       # the conv's own padding alone
    (40, 30, [70, 70, 70, 70], "z"),             # with the zero padding before it, named as that module
    (64, None, None, None)])                     # at the limit: the conv2d's own pad, no layer
def test_a_convolution_padding_past_the_conv2d_limit_exports_as_a_pad_layer(pad, before, sides, name):
    torch.manual_seed(0)
    m = WideConv(pad, before)
    ex = convert(m, (3, 8, 8))
    first = ex.spec["layers"][0]
    if sides is None:
        assert first["type"] == "conv2d" and first["pad"] == pad
        return
    assert (first["type"], first["name"], first["pad"]) == ("pad", name, sides)
    assert ex.spec["layers"][1]["type"] == "conv2d" and ex.spec["layers"][1].get("pad", 0) == 0
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        assert torch.allclose(spec_output(ex, x), m(x), rtol=1e-5, atol=1e-6)


def test_a_pad_pytorch_refuses_on_the_example_is_refused_naming_the_module_and_the_reason():
    class TooWide(nn.Module):
        def __init__(self):
            super().__init__()
            self.p, self.c, self.fc = nn.ReflectionPad2d(9), nn.Conv2d(3, 4, 3), nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(self.c(self.p(x)).mean((2, 3)))

    with pytest.raises(ExportError) as e:
        convert(TooWide(), (3, 8, 8))
    assert e.value.op == "forward" and e.value.module_path == "p", str(e.value)
    assert "Padding size should be less than the corresponding input dimension" in str(e.value)
    assert "ShapeProp" not in str(e.value) and "While executing" not in str(e.value)
