"""streamfeed.export on padding and clamps, without a server: zero padding
folded into the convolution that reads it, the pad layers of every F.pad
mode and of a convolution's own padding_mode or padding="same" (PyTorch's
split), clamps as relu, relu6 or a clamp layer with its bounds and the
gradient rule of the torch that exports, and what of them is refused,
naming the op, the module path and why. Each exported spec is checked to
compute the module's own eval output (spec_interpreter.assert_spec_computes_the_module)."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
nn = torch.nn
F = torch.nn.functional

from streamfeed.export import ExportError, convert  # noqa: E402
from streamfeed.export_folds import torch_clamp_rule  # noqa: E402
from spec_interpreter import assert_spec_computes_the_module  # noqa: E402


class PaddedClamped(nn.Module):
    """Zero padding before a convolution in each spelling (nn.ZeroPad2d,
    nn.ConstantPad2d(p, 0.0), F.pad with its defaults and with mode and
    value given; before an unpadded convolution, a padded, dilated and
    grouped one, a 5x1 one and one with padding="same"), and every spelling
    of a clamp that is relu or relu6, in place where nothing reads the
    input again."""

    def __init__(self):
        super().__init__()
        self.pad = nn.ZeroPad2d(1)
        self.conv1 = nn.Conv2d(3, 8, 3)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, dilation=2, groups=2)
        self.block = nn.Sequential(nn.ConstantPad2d((0, 0, 2, 2), 0.0), nn.Conv2d(8, 8, (5, 1)))
        self.conv4 = nn.Conv2d(8, 8, 3, padding="same", bias=False)
        self.act = nn.Hardtanh(0., 6.)
        self.act_ = nn.Hardtanh(0, 6, inplace=True)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        y = self.conv1(self.pad(x))
        y = torch.clamp(y, min=0) + y.clamp(min=0) + y.clamp_min(0) + torch.clamp_min(y, 0) + y.clip(min=0)
        y = self.conv2(F.pad(y, (1, 1, 1, 1)))
        y = F.hardtanh(y, 0., 6.) + self.act(y) + torch.clamp(y, 0, 6) + y.clamp(0., 6.) + torch.clip(y, 0, 6)
        y = self.act_(self.block(y))
        y = F.hardtanh_(self.conv4(F.pad(y, (0, 0, 1, 1), mode="constant", value=0)), 0., 6.)
        y = F.hardtanh(y.clamp_(min=0).clamp_min_(0), 0, 6, inplace=True).clamp_(0, 6)
        return self.fc(y.mean((2, 3)))


def test_zero_padding_folds_into_its_convolution_and_clamps_export_as_relu_and_relu6():
    torch.manual_seed(0)
    model = PaddedClamped()
    with torch.no_grad():  # inputs past 6, so that relu6 clamps them
        for conv in (model.conv2, model.block[1]):
            conv.weight.mul_(8)
    sd = model.state_dict()
    ex = assert_spec_computes_the_module(model, hw=8)
    convs = [la for la in ex.spec["layers"] if la["type"] == "conv2d"]
    assert [(la["name"], la.get("pad")) for la in convs] == [("conv1", 1), ("conv2", 2), ("block.1", [2, 0]),
                                                             ("conv4", [2, 1])]
    assert convs[1]["dilation"] == 2 and convs[1]["groups"] == 2
    kinds = [la["type"] for la in ex.spec["layers"] if la["type"] not in ("conv2d", "add")]
    assert kinds == ["relu"] * 5 + ["relu6"] * 6 + ["relu6", "relu", "relu", "relu6", "relu6"] + \
        ["global_avgpool", "flatten", "linear"]
    assert {la["name"] for la in ex.spec["layers"]} >= {"act", "act_"}
    # The padding has no parameters and no layer: the state_dict is the module's, and loads back strictly.
    assert ex.tensors.keys() == sd.keys()
    PaddedClamped().load_state_dict(ex.tensors, strict=True)


class Padded(nn.Module):
    """Padding in each spelling that has a layer now: a CycleGAN generator's
    ReflectionPad2d(3) before an unpadded 7x7 convolution and a residual
    block's ReflectionPad2d(1), ReplicationPad2d, CircularPad2d, F.pad in
    modes reflect, replicate and circular, TensorFlow's "same" as a zero pad
    on the right and bottom before a stride-2 convolution (folded where the
    sums are even: ZeroPad2d(1) into an unpadded conv; a layer where they are
    not, the conv keeping its own padding), ConstantPad2d with 0.5, F.pad
    with value -1, and zero padding read by a pool and by two convolutions."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.ReflectionPad2d(3), nn.Conv2d(3, 4, 7))
        self.block = nn.Sequential(nn.ReflectionPad2d(1), nn.Conv2d(4, 4, 3), nn.ReLU(), nn.ReplicationPad2d(1),
                                   nn.Conv2d(4, 4, 3))
        self.same = nn.ZeroPad2d((0, 1, 0, 1))
        self.down = nn.Conv2d(4, 4, 3, stride=2)
        self.fold = nn.Sequential(nn.ZeroPad2d(1), nn.Conv2d(4, 4, 3))
        self.onto = nn.Sequential(nn.ZeroPad2d((2, 1, 1, 1)), nn.Conv2d(4, 4, 3, padding=1))
        self.fill, self.circ = nn.ConstantPad2d((1, 0, 2, 1), 0.5), nn.CircularPad2d((1, 2, 0, 1))
        self.zero, self.c2, self.c3 = nn.ZeroPad2d(1), nn.Conv2d(4, 4, 3), nn.Conv2d(4, 4, 3)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        y = self.stem(x)
        y = y + self.block(y)
        y = self.down(self.same(y))
        y = self.onto(self.fold(y))
        y = F.pad(F.pad(y, (1, 1, 2, 0), "reflect"), [0, 1, 1, 0], mode="replicate")
        y = F.pad(self.circ(self.fill(y)), (2, 1, 1, 2), "circular")
        z = self.zero(F.pad(y, (1, 1, 1, 1), value=-1.0))
        return self.fc(F.max_pool2d(z, 2).mean((2, 3)) + self.c2(z).mean((2, 3)) + self.c3(z).mean((2, 3)))


def test_padding_maps_onto_pad_layers_and_folds_into_a_convolution_where_it_can():
    torch.manual_seed(0)
    model = Padded()
    sd = model.state_dict()
    ex = assert_spec_computes_the_module(model, hw=16)
    pads = [(la["name"], la["pad"], la["mode"], la.get("value")) for la in ex.spec["layers"] if la["type"] == "pad"]
    assert pads == [("stem.0", [3, 3, 3, 3], "reflect", None), ("block.0", [1, 1, 1, 1], "reflect", None),
                    ("block.3", [1, 1, 1, 1], "replicate", None), ("same", [0, 1, 0, 1], "constant", None),
                    ("onto.0", [2, 1, 1, 1], "constant", None), ("pad", [1, 1, 2, 0], "reflect", None),
                    ("pad_1", [0, 1, 1, 0], "replicate", None), ("fill", [1, 0, 2, 1], "constant", 0.5),
                    ("circ", [1, 2, 0, 1], "circular", None), ("pad_2", [2, 1, 1, 2], "circular", None),
                    ("pad_3", [1, 1, 1, 1], "constant", -1.0), ("zero", [1, 1, 1, 1], "constant", None)]
    convs = {la["name"]: la.get("pad", 0) for la in ex.spec["layers"] if la["type"] == "conv2d"}
    assert convs == {"stem.1": 0, "block.1": 0, "block.4": 0, "down": 0, "fold.1": 1, "onto.1": 1, "c2": 0, "c3": 0}
    # The pads have no parameters: the state_dict is the module's, and loads back strictly.
    assert ex.tensors.keys() == sd.keys()
    Padded().load_state_dict(ex.tensors, strict=True)


class ConvPadded(nn.Module):
    """Convolutions that pad themselves other than with zeros on both sides:
    padding_mode reflect (an ESRGAN-style body), replicate with [h, w]
    padding, circular, circular with nothing to pad ("valid"), reflect after
    a ZeroPad2d, and padding="same" with an even kernel alone and after a
    ZeroPad2d that leaves the sums uneven, or even (TensorFlow's (1, 0, 1, 0)
    before a 2x2 one: no layer), a dilation that makes it even again, a
    rectangular dilated kernel in mode reflect, then a plain convolution."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"), nn.LeakyReLU(0.2),
                                  nn.Conv2d(4, 4, 3, padding=(2, 1), padding_mode="replicate"))
        self.wrap = nn.Conv2d(4, 4, 3, padding=1, padding_mode="circular")
        self.unpadded = nn.Conv2d(4, 4, 1, padding="valid", padding_mode="circular")
        self.zero, self.mirror = nn.ZeroPad2d(1), nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect")
        self.even = nn.Conv2d(4, 4, 4, padding="same")
        self.tf, self.uneven = nn.ZeroPad2d((0, 1, 0, 1)), nn.Conv2d(4, 4, 4, padding="same", bias=False)
        self.left, self.evened = nn.ZeroPad2d((1, 0, 1, 0)), nn.Conv2d(4, 4, 2, padding="same")
        self.dilated = nn.Conv2d(4, 4, 3, dilation=2, padding="same")
        self.wide = nn.Conv2d(4, 4, (2, 3), dilation=(1, 3), padding="same", padding_mode="reflect")
        self.plain, self.fc = nn.Conv2d(4, 4, 3, padding=1), nn.Linear(4, 3)

    def forward(self, x):
        y = self.unpadded(self.wrap(self.body(x)))
        y = self.uneven(self.tf(self.even(self.mirror(self.zero(y)))))
        y = self.plain(self.wide(self.dilated(self.evened(self.left(y)))))
        return self.fc(y.mean((2, 3)))


def test_a_convs_own_padding_in_another_mode_or_uneven_same_is_a_pad_layer_before_it():
    model = ConvPadded()
    sd = model.state_dict()
    ex = assert_spec_computes_the_module(model, hw=12)
    layers = [(la["name"], la["type"], la.get("pad", 0), la.get("mode")) for la in ex.spec["layers"]
              if la["type"] in ("pad", "conv2d")]
    assert layers == [
        ("body.0.pad", "pad", [1, 1, 1, 1], "reflect"), ("body.0", "conv2d", 0, None),
        ("body.2.pad", "pad", [1, 1, 2, 2], "replicate"), ("body.2", "conv2d", 0, None),
        ("wrap.pad", "pad", [1, 1, 1, 1], "circular"), ("wrap", "conv2d", 0, None),
        ("unpadded", "conv2d", 0, None),
        # the zeros before a reflect convolution stay a layer of their own, under their module's name
        ("zero", "pad", [1, 1, 1, 1], "constant"), ("mirror.pad", "pad", [1, 1, 1, 1], "reflect"),
        ("mirror", "conv2d", 0, None),
        # "same" with a 4x4 kernel pads 1 left and top, 2 right and bottom (F.conv2d's split)
        ("even.pad", "pad", [0, 1, 0, 1], "constant"), ("even", "conv2d", 1, None),
        ("tf", "pad", [0, 2, 0, 2], "constant"), ("uneven", "conv2d", 1, None),
        ("evened", "conv2d", 1, None), ("dilated", "conv2d", 2, None),
        ("wide.pad", "pad", [3, 3, 0, 1], "reflect"), ("wide", "conv2d", 0, None),
        ("plain", "conv2d", 1, None)]
    # Each convolution keeps its module path and parameters: the checkpoint loads back strictly.
    assert ex.tensors.keys() == sd.keys()
    ConvPadded().load_state_dict(ex.tensors, strict=True)


@pytest.mark.parametrize("k, d", [(1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (2, 2), (3, 2), (4, 3), ((2, 5), (3, 2))])
def test_same_padding_splits_each_axis_as_pytorch_does(k, d):
    from streamfeed.export_pad import conv_sides
    for mode in ("zeros", "reflect"):
        conv = nn.Conv2d(1, 1, k, dilation=d, padding="same", padding_mode=mode)
        # PyTorch's own (left, right, top, bottom) for F.pad in a padding_mode
        assert conv_sides(conv) == tuple(conv._reversed_padding_repeated_twice)
    x = torch.randn(1, 1, 9, 11, dtype=torch.float64)
    w = torch.randn(1, 1, *nn.modules.utils._pair(k), dtype=torch.float64)
    left, right, top, bottom = conv_sides(conv)
    want = F.conv2d(x, w, dilation=d, padding="same")
    assert torch.equal(F.conv2d(F.pad(x, (left, right, top, bottom)), w, dilation=d), want)


class Stem(nn.Module):
    """A module whose forward() is f(self, x), holding a 3x3 convolution
    (conv) and the modules given; Stemmed nests it at "stem"."""

    def __init__(self, f, **mods):
        super().__init__()
        self.f, self.conv = f, nn.Conv2d(3, 4, 3)
        for name, m in mods.items():
            setattr(self, name, m)

    def forward(self, x):
        return self.f(self, x)


class Stemmed(nn.Module):
    def __init__(self, f, **mods):
        super().__init__()
        self.stem = Stem(f, **mods)

    def forward(self, x):
        return self.stem(x).flatten(1)


def _pad_conv(s, x):
    return s.conv(s.pad(x))


def _conv_act(s, x):
    return s.act(s.conv(x))


@pytest.mark.parametrize("f", [
    lambda s, x: F.pad(s.conv(x).permute(0, 2, 3, 1), (0, 0, 0, 0, 0, 0)).permute(0, 3, 1, 2),
    lambda s, x: F.pad(s.conv(x).flatten(2).transpose(1, 2), (0, 0, 0, 0)).mean(1),
    lambda s, x: s.pad(s.conv(x)),
], ids=["channels-last-three-dims", "tokens", "ZeroPad2d-0"])
def test_a_padding_of_zeros_is_nothing_whatever_it_pads(f):
    """Swin's and EfficientViT's F.pad of a window size that already divides
    the map pads nothing: no layer, on a channels-last map or tokens too."""
    ex = assert_spec_computes_the_module(Stemmed(f, pad=nn.ZeroPad2d(0)), hw=8)
    assert "pad" not in [la["type"] for la in ex.spec["layers"]], ex.spec["layers"]


class Clamped(nn.Module):
    """Clamps at bounds other than relu's and relu6's in each spelling: nn.Hardtanh() at its default [-1, 1],
    nn.Hardtanh(-2, 0.5, inplace=True), F.hardtanh and its in-place spellings, torch.clamp, torch.clip, the
    Tensor methods clamp, clip, clamp_min and clamp_max and their in-place ones, one bound or two, on a map,
    on channels-last, on flat features and on tokens."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.act, self.act_ = nn.Hardtanh(), nn.Hardtanh(-2, 0.5, inplace=True)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        y = self.conv(x) * 4  # past the bounds
        y = self.act(y) + F.hardtanh(y, -2., 2.) + torch.clamp(y, 0, 1) + y.clamp(-1, 1) + torch.clip(y, -3, 3)
        y = y + y.clip(min=-0.5) + y.clamp_min(1) + torch.clamp_max(y, 0.25) + y.clamp(max=-1) + torch.clamp(y, max=2)
        y = self.act_(F.hardtanh_(y.clamp_(-5, 5).clamp_min_(-4).clamp_max_(4).clip_(-3.5, 3.5), -3, 3))
        y = F.hardtanh(y, -1.5, 1.5, inplace=True)
        z = y.permute(0, 2, 3, 1).clamp(-1, 0.75).permute(0, 3, 1, 2)  # channels-last
        t = z.flatten(2).transpose(1, 2).clamp(min=-0.9)[:, 0]  # on tokens [N, T, C], then the first
        return self.fc(t.clamp(-0.3, 0.3))


def test_clamps_at_other_bounds_export_as_clamp_layers_with_their_bounds_and_gradient_rule():
    ex = assert_spec_computes_the_module(Clamped(), hw=8)
    clamps = [{k: v for k, v in la.items() if k in ("min", "max", "grad")} for la in ex.spec["layers"]
              if la["type"] == "clamp"]
    H, C = "hardtanh", torch_clamp_rule()  # torch.clamp's own rule in this torch
    assert clamps[:11] == [
        {"min": -1.0, "max": 1.0, "grad": H}, {"min": -2.0, "max": 2.0, "grad": H}, {"min": 0.0, "max": 1.0, "grad": C},
        {"min": -1.0, "max": 1.0, "grad": C}, {"min": -3.0, "max": 3.0, "grad": C}, {"min": -0.5, "grad": C},
        {"min": 1.0, "grad": C}, {"max": 0.25, "grad": C}, {"max": -1.0, "grad": C}, {"max": 2.0, "grad": C},
        {"min": -5.0, "max": 5.0, "grad": C}]
    assert clamps[11:16] == [{"min": -4.0, "grad": C}, {"max": 4.0, "grad": C}, {"min": -3.5, "max": 3.5, "grad": C},
                             {"min": -3.0, "max": 3.0, "grad": H}, {"min": -2.0, "max": 0.5, "grad": H}]
    assert {la["name"] for la in ex.spec["layers"] if la["type"] == "clamp"} >= {"act", "act_"}
    assert clamps[16:] == [{"min": -1.5, "max": 1.5, "grad": H}, {"min": -1.0, "max": 0.75, "grad": C},
                           {"min": -0.9, "grad": C}, {"min": -0.3, "max": 0.3, "grad": C}]
    assert "relu" not in {la["type"] for la in ex.spec["layers"]}
    assert ex.tensors.keys() == Clamped().state_dict().keys()


def test_a_clamp_layer_takes_the_gradient_rule_of_the_torch_that_exports(monkeypatch):
    """torch.clamp's gradient at a bound changed between PyTorch releases
    (2.15 passes none, 2.11 passes dy): the exporter asks its torch and
    writes that rule; hardtanh's rule is the same in both."""
    import streamfeed.export_folds as folds
    x = torch.tensor([0.0, 1.0], requires_grad=True)
    torch.clamp(x, 0.0, 1.0).sum().backward()
    assert torch_clamp_rule() == ("clamp_closed" if bool((x.grad == 1).all()) else "clamp")
    for rule in ("clamp", "clamp_closed"):
        monkeypatch.setattr(folds, "torch_clamp_rule", lambda rule=rule: rule)
        ex = convert(Stemmed(lambda s, x: F.hardtanh(torch.clamp(s.conv(x), -1, 2), -0.5, 0.5)), (1, 3, 8, 8))
        assert [(la["type"], la["grad"]) for la in ex.spec["layers"][1:3]] == [("clamp", rule), ("clamp", "hardtanh")]
        ex = convert(Stemmed(lambda s, x: s.conv(x).clamp(min=0)), (1, 3, 8, 8))
        assert ex.spec["layers"][1]["type"] == "relu"


@pytest.mark.parametrize("f, kind", [
    (lambda s, x: s.conv(x).clamp(min=0), "relu"), (lambda s, x: F.hardtanh(s.conv(x), 0., 6.), "relu6"),
    (lambda s, x: torch.clip(s.conv(x), 0, 6), "relu6"), (lambda s, x: s.conv(x).clamp_min(0), "relu"),
    (lambda s, x: s.conv(x).clamp(0, float("inf")), "relu"),
    (lambda s, x: torch.clamp(s.conv(x), float("-inf"), 1), "clamp")],
    ids=["clamp-min-0", "hardtanh-0-6", "clip-0-6", "clamp_min-0", "clamp-0-inf", "clamp--inf-1"])
def test_clamps_at_relu_and_relu6_bounds_still_export_as_relu_and_relu6(f, kind):
    ex = convert(Stemmed(f), (1, 3, 8, 8))
    assert [la["type"] for la in ex.spec["layers"]][1] == kind
    if kind == "clamp":
        assert "min" not in ex.spec["layers"][1] and ex.spec["layers"][1]["max"] == 1.0


_NO_CLAMP = "the service's clamp layer"


@pytest.mark.parametrize("f, mods, op, path, why", [
    (lambda s, x: s.conv(F.pad(x, (-1, -1, 0, 0))), {}, "torch.nn.functional.pad", "stem",
     "(-1, -1, 0, 0): a negative pad crops the map"),
    (_pad_conv, {"pad": nn.ConstantPad2d((1, 0, 2, -1), 0.0)}, "ConstantPad2d", "stem.pad", "a negative pad crops"),
    (lambda s, x: s.conv2(F.pad(x, (1, 1, 1, 1, 1, 1))), {"conv2": nn.Conv2d(5, 4, 3)}, "torch.nn.functional.pad",
     "stem", "pad dimensions other than the height and width"),
    (lambda s, x: s.conv(F.pad(x, (1, 1, 1, 1), value=float("inf"))), {}, "torch.nn.functional.pad", "stem",
     "not a finite float32 number"),
    (lambda s, x: F.pad(s.conv(x).flatten(2), (1, 1), "reflect"), {}, "torch.nn.functional.pad", "stem",
     "pads a tensor of shape [N, 4, 36]; the pad kind pads the height and width of a [N, C, H, W] map (3-D and 5-D "
     "padding have no layer kind)"),
    (lambda s, x: s.conv(x).clamp(1, -1), {}, "Tensor.clamp", "stem",
     f"clamp to [1, -1] has its lower bound above its upper one (PyTorch then gives the upper bound everywhere); "
     f"{_NO_CLAMP} needs min <= max"),
    (lambda s, x: torch.clamp(s.conv(x), float("-inf"), float("inf")), {}, "torch.clamp", "stem",
     f"clamp to [-inf, inf] bounds nothing; {_NO_CLAMP} needs a finite bound"),
    (lambda s, x: s.conv(x).clamp_max(float("nan")), {}, "Tensor.clamp_max", "stem",
     f"upper bound nan, which is not a finite float32 number; {_NO_CLAMP} takes finite bounds"),
    (lambda s, x: s.conv(x).clamp_min(float("inf")), {}, "Tensor.clamp_min", "stem",
     "lower bound inf, which is not a finite float32 number"),
    (lambda s, x: s.conv(x).clamp(max=float("-inf")), {}, "Tensor.clamp", "stem",
     "upper bound -inf, which is not a finite float32 number"),
    (lambda s, x: s.conv(x).clamp(min=torch.zeros(1)), {}, "Tensor.clamp", "stem",
     f"lower bound _tensor_constant0, which is not a number known at export; {_NO_CLAMP} takes Python numbers"),
    (lambda s, x: torch.clip(s.conv(x), max=torch.ones(1)), {}, "torch.clip", "stem",
     "upper bound _tensor_constant0, which is not a number known at export"),
], ids=["F.pad-negative", "ConstantPad2d-negative", "F.pad-channels", "F.pad-infinite-value", "F.pad-3d",
        "clamp-min-above-max", "clamp-unbounded", "clamp_max-nan", "clamp_min-inf",
        "clamp-max--inf", "clamp-tensor-bound", "clip-tensor-bound"])
def test_padding_and_clamps_the_service_cannot_run_are_refused_naming_the_op_the_path_and_why(f, mods, op, path, why):
    with pytest.raises(ExportError) as e:
        convert(Stemmed(f, **mods), (1, 3, 8, 8))
    assert op in e.value.op and e.value.module_path == path, str(e.value)
    assert f"at {path!r}" in str(e.value) and why in str(e.value), str(e.value)


@pytest.mark.parametrize("act", [lambda s, y: y.clamp_(0, 6), lambda s, y: F.hardtanh_(y, 0., 6.),
                                 lambda s, y: F.hardtanh(y, 0., 6., inplace=True), lambda s, y: s.act(y)],
                         ids=["clamp_", "hardtanh_", "hardtanh-inplace", "Hardtanh-inplace"])
def test_a_clamp_in_place_whose_input_is_read_later_is_refused(act):
    def f(s, x):
        y = s.conv(x)
        return act(s, y) + y

    with pytest.raises(ExportError, match="in place") as e:
        convert(Stemmed(f, act=nn.Hardtanh(0., 6., inplace=True)), (1, 3, 8, 8))
    assert e.value.module_path.startswith("stem"), str(e.value)
