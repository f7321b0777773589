"""streamfeed.export refuses a module whose torch.fx trace computes another
output than its own forward(): the exporter maps the trace, so a module the
trace gets wrong would train as another model than the user's, silently.
torch.fx records `z += 1` on a Proxy as an out-of-place add, so an in-place
write through a second name of a tensor is lost in the trace; eager PyTorch
writes it into the tensor both names share. Modules the trace gets right
export as before."""
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from streamfeed.export import ExportError, convert  # noqa: E402


class AliasedInPlace(nn.Module):
    """z is y under another name: `z += 1` changes y in eager PyTorch, and
    the head reads y."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4, 5)

    def forward(self, x):
        y = self.conv(x)
        z = y
        z += 1.0
        return self.head(y.mean((2, 3)))


class OutOfPlace(AliasedInPlace):
    """The same computation written out of place: what the trace records."""

    def forward(self, x):
        y = self.conv(x)
        y = y + 1.0
        return self.head(y.mean((2, 3)))


def test_an_in_place_write_through_another_name_is_refused_naming_what_differs():
    torch.manual_seed(0)
    with pytest.raises(ExportError) as e:
        convert(AliasedInPlace(), (3, 8, 8))
    msg = str(e.value)
    assert "forward()" in msg and "trace" in msg and "in-place write" in msg, msg
    assert e.value.op == "forward"


def test_the_same_computation_out_of_place_exports():
    torch.manual_seed(0)
    ex = convert(OutOfPlace(), (3, 8, 8))
    assert [layer["type"] for layer in ex.spec["layers"]][:2] == ["conv2d", "affine"]


def test_the_check_leaves_the_module_as_it_was():
    """The check runs the module in eval mode without gradients: batchnorm's
    running statistics and every submodule's mode stay as they were."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    m.train()
    m[1].eval()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    convert(m, (3, 8, 8))
    assert m.training and not m[1].training and m[0].training
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), k


class DrawsInEval(nn.Module):
    """F.dropout with training=True draws in eval mode too, and a forward()
    that passes self.training on bakes the training mode into a trace made
    in it: neither is a difference between the trace and the module."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = torch.nn.functional.dropout(self.conv(x), 0.5, training=True)
        return torch.nn.functional.dropout(y, 0.3, self.training).mean((2, 3))


def test_a_forward_that_draws_exports_and_leaves_the_callers_random_state():
    m = DrawsInEval()
    torch.manual_seed(3)
    convert(m, (3, 8, 8))
    after = torch.rand(4)
    torch.manual_seed(3)
    assert torch.equal(torch.rand(4), after)
