"""streamfeed.export takes a forward() that computes numbers from its
input's shape where Python needs their values: a branch on a map's size,
TF's 'same' padding through math.ceil (timm's pad_same, its tf_ models),
int(), len() and loops over x.shape. The service trains at one input size,
so such a number is a constant of the exported model; the tracer runs the
graph traced so far on the example input, at two batch sizes, to find it.
A number that depends on the batch size, or one computed from a tensor's
values, is refused naming what it is and where: freezing it at the
example's value would train another model than the user's, silently."""
import math

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from streamfeed.export import ExportError, convert  # noqa: E402


def kinds(ex):
    return [layer["type"] for layer in ex.spec["layers"]]


def layer(ex, name):
    return next(x for x in ex.spec["layers"] if x["name"] == name)


class SamePad(nn.Module):
    """TF's 'same' padding for a 3x3 stride-2 convolution, computed from
    the input's sides with math.ceil and max(), as timm's pad_same does."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=2)
        self.fc = nn.Linear(4, 5)

    def forward(self, x):
        ih, iw = x.shape[-2:]
        ph, pw = (max((math.ceil(s / 2) - 1) * 2 + 3 - s, 0) for s in (ih, iw))
        x = F.pad(x, [pw // 2, pw - pw // 2, ph // 2, ph - ph // 2])
        return self.fc(F.relu(self.conv(x)).mean((2, 3)))


@pytest.mark.parametrize("hw,pads", [(20, [0, 1, 0, 1]), (15, [1, 1, 1, 1])])
def test_same_padding_computed_with_math_ceil_is_the_pad_it_is(hw, pads):
    ex = convert(SamePad(), (3, hw, hw))
    conv = layer(ex, "conv")
    if "pad" in kinds(ex):
        assert layer(ex, "pad")["pad"] == pads
    else:  # an even pad folds into the convolution's own
        assert pads[0] == pads[1] == pads[2] == pads[3] and conv.get("pad") == pads[0], ex.spec
    assert conv["stride"] == 2


class ShapeBranch(nn.Module):
    """Pools only a map wider than 8, adds a projection where it keeps the
    shape, and checks its sides in a loop: each decided by shapes alone."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.proj = nn.Conv2d(8, 8, 1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        x = F.relu(self.bn(self.conv(x)))
        if x.shape[-1] > 8:
            x = F.avg_pool2d(x, 2)
        for side in x.shape[2:]:
            assert side <= 8
        y = self.proj(x)
        if y.shape == x.shape and len(y.shape) == 4:
            y = y + x
        return self.fc(y.mean((2, 3)).reshape(y.shape[0], int(y.shape[1])))


def test_a_branch_on_the_maps_size_follows_the_example_input():
    wide, narrow = convert(ShapeBranch(), (3, 16, 16)), convert(ShapeBranch(), (3, 8, 8))
    assert "avgpool2d" in kinds(wide) and "avgpool2d" not in kinds(narrow)
    assert "add" in kinds(wide) and "add" in kinds(narrow)


def test_tracing_leaves_the_module_its_buffers_modes_and_the_random_state_as_they_were():
    torch.manual_seed(0)
    m = ShapeBranch()
    m.eval()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    rng = torch.get_rng_state()
    call, getattr_ = nn.Module.__call__, nn.Module.__getattr__
    convert(m, (3, 16, 16))
    assert not m.training and not m.bn.training
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert torch.equal(torch.get_rng_state(), rng)
    assert nn.Module.__call__ is call and nn.Module.__getattr__ is getattr_


class Block(nn.Module):
    def __init__(self, forward):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 1)
        self._forward = forward

    def forward(self, x):
        return self._forward(self.conv(x))


class Net(nn.Module):
    """A stem, then a block (module path `body`) whose forward() is the
    case under test."""

    def __init__(self, forward):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.body = Block(forward)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(self.body(self.stem(x)).mean((2, 3)))


def relu_if_positive(x):
    return F.relu(x) if x.sum() > 0 else x


def relu_if_mean_item_positive(x):
    return F.relu(x) if x.mean().item() > 0 else x


def relu_if_batch_over_two(x):
    return F.relu(x) if x.shape[0] > 2 else x


def batch_as_int(x):
    return x.reshape(int(x.shape[0]), 4, -1).mean(2)[..., None, None]


def loop_over_batch(x):
    return sum(x[i:i + 1] for i in range(x.shape[0]))


def loop_over_samples(x):
    return torch.stack([F.relu(t) for t in x.unbind(0)])


@pytest.mark.parametrize("forward,words", [
    (relu_if_positive, "computed from a tensor's values"),
    (relu_if_mean_item_positive, "computed from a tensor's values"),
    (relu_if_batch_over_two, "depends on the batch size"),
    (batch_as_int, "depends on the batch size"),
    (loop_over_batch, "depends on the batch size"),
    (loop_over_samples, "depends on the batch size"),
])
def test_a_number_from_values_or_the_batch_size_is_refused_naming_it_and_the_module(forward, words):
    with pytest.raises(ExportError) as e:
        convert(Net(forward), (3, 8, 8))
    assert words in str(e.value), str(e.value)
    assert e.value.module_path == "body", e.value.module_path
    # The trace's recorders are gone after a refusal too.
    m = nn.Linear(2, 2)
    assert isinstance(m(torch.zeros(1, 2)), torch.Tensor)


def test_a_shape_number_times_a_tensors_value_is_a_tensors_value():
    def forward(x):
        return F.relu(x) if x.shape[-1] * x.mean() > 4 else x
    with pytest.raises(ExportError) as e:
        convert(Net(forward), (3, 8, 8))
    assert "computed from a tensor's values" in str(e.value)


def test_a_loop_over_a_chunks_tensors_exports_each_piece():
    """[f(t) for t in x.chunk(2, 1)]: the number of pieces is a shape's."""
    def forward(x):
        return torch.cat([F.relu(t) for t in x.chunk(2, 1)], 1)
    ex = convert(Net(forward), (3, 8, 8))
    assert kinds(ex).count("channel_slice") == 2 and kinds(ex).count("relu") == 2, kinds(ex)
