"""streamfeed.export on ECA's channel attention, without a server: timm's
EcaModule (the pooled channels viewed as [N, 1, C], a Conv1d across them,
a gate, the map scaled by the gate expanded) as global_avgpool,
channel_conv1d, the gate and mul, and every Conv1d or view of the pooled
channels the service cannot run refused naming the module. Each exported
spec is checked to compute the module's own eval output
(spec_interpreter.assert_spec_computes_the_module)."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
nn = torch.nn
F = torch.nn.functional

from streamfeed.export import ExportError, convert  # noqa: E402
from spec_interpreter import assert_spec_computes_the_module  # noqa: E402


class Eca(nn.Module):
    """timm's EcaModule's forward() after a convolution: the pooled channels
    viewed as [N, 1, C], a Conv1d across them, a gate, the map scaled by it
    expanded; then conv's own pool through a second, biased one."""

    def __init__(self, k=3, conv=None, gate=None, tail=None):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3)
        self.conv = conv or nn.Conv1d(1, 1, k, padding=(k - 1) // 2, bias=False)
        self.gate = gate or nn.Sigmoid()
        self.head = nn.Conv1d(1, 1, 5, padding=2)
        self.tail = tail

    def forward(self, x):
        x = self.stem(x)
        y = x.mean((2, 3)).view(x.shape[0], 1, -1)
        y = self.gate(self.conv(y)).view(x.shape[0], -1, 1, 1)
        if self.tail is not None:
            return self.tail(x, y)
        x = x * y.expand_as(x)
        return torch.sigmoid(self.head(x.mean((2, 3)).reshape(x.shape[0], 1, -1))).flatten(1)


def test_ecas_conv1d_across_the_pooled_channels_exports_as_channel_conv1d():
    ex = assert_spec_computes_the_module(Eca(), hw=8)
    assert [la["type"] for la in ex.spec["layers"]] == [
        "conv2d", "global_avgpool", "channel_conv1d", "sigmoid", "mul", "global_avgpool", "channel_conv1d",
        "sigmoid", "flatten"]
    convs = [la for la in ex.spec["layers"] if la["type"] == "channel_conv1d"]
    assert convs == [{"type": "channel_conv1d", "name": "conv", "k": 3, "pad": 1, "bias": False},
                     {"type": "channel_conv1d", "name": "head", "k": 5, "pad": 2, "bias": True}]
    assert ex.tensors["conv.weight"].shape == (1, 1, 3) and ex.tensors["head.bias"].shape == (1,)


def _gate_alone(x, y):  # the gate as the output: a forward PyTorch runs whatever length the Conv1d leaves
    return y.flatten(1)


@pytest.mark.parametrize("model, why, path", [
    (Eca(conv=nn.Conv1d(1, 1, 4, padding=1, bias=False), tail=_gate_alone), "k odd", "conv"),
    (Eca(conv=nn.Conv1d(1, 1, 3, padding=0, bias=False), tail=_gate_alone), "padding=(k - 1) // 2", "conv"),
    (Eca(conv=nn.Conv1d(1, 1, 3, padding=1, padding_mode="circular")), "padding_mode='circular'", "conv"),
    (Eca(conv=nn.Conv1d(1, 2, 1), tail=_gate_alone), "Conv1d(1, 2, 1", "conv"),
    (Eca(gate=nn.Softmax(dim=-1)), "viewed as [N, 1, C]", "gate"),
    (Eca(tail=lambda x, y: x + y.expand_as(x)), "factor of a multiply", ""),
    (Eca(tail=lambda x, y: (y.expand_as(x) * y).sum((2, 3))), "expanded to [8, 6, 6] by a tensor of another", ""),
], ids=["even_kernel", "shrinking_padding", "circular", "two_channels", "softmax_on_the_view", "expand_added",
        "expand_times_its_own_gate"])
def test_a_conv1d_or_view_the_service_cannot_run_is_refused_naming_the_module(model, why, path):
    with pytest.raises(ExportError) as e:
        convert(model, (1, 3, 8, 8))
    assert why in str(e.value) and e.value.module_path == path, str(e.value)


class Conv1dOnAMap(nn.Module):
    def __init__(self):
        super().__init__()
        self.seq = nn.Conv1d(3, 4, 3)

    def forward(self, x):
        return self.seq(x.flatten(2)).flatten(1)


def test_a_conv1d_anywhere_else_is_refused_naming_what_is_supported():
    with pytest.raises(ExportError, match="ECA's Conv1d") as e:
        convert(Conv1dOnAMap(), (1, 3, 8, 8))
    assert e.value.module_path == "seq"
