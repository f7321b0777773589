"""Training parity with PyTorch on the CPU reference backend (fp32 on both
sides), or on the CUDA backend where STREAMFEED_PARITY_BACKEND=cuda and the
binary is a CUDA build on a GPU host (every case passed on an H100 with these
same tolerances, model.precision fp32). Each case starts the service and a PyTorch model from the same
weights -- the PyTorch module's state_dict saved with safetensors and given to
the service as model.init_from -- posts the same fixed batches to both, with
an augmentation that only converts uint8 to float (to_dtype), and requires
that the service trains exactly like the PyTorch loop its options document:
per batch the same loss (the batch's reply), learning rate
(streamfeed_learning_rate) and pre-clip gradient norm (the sum of the
streamfeed_grad_norm histogram), and after every optimizer step the same
parameters, batchnorm buffers and optimizer state (GET /v1/checkpoint against
the module's state_dict and the optimizer's state). Comparing the parameters
after every step is what checks each step's learning rate, not only its
closed form.

Covered: SGD (momentum, weight decay), AdamW (betas, eps, decoupled weight
decay; with weight decay 0 it is torch.optim.Adam), each optim.schedule with
and without the linear warmup, clip_grad_norm_ on steps that clip and steps
that do not, label smoothing (eval batches too), gradient accumulation (the
mean of the micro-batch losses, also over micro-batches of different sizes),
model.freeze, a checkpoint save and resume halfway through a run, batchnorm
running statistics and eval mode (a model.spec: no small preset has
batchnorm), and the W1 and W2 presets for three steps each (resnet18 is too
slow here). streamfeed has no nesterov and no Adam with L2 weight decay.

Tolerances. The two sides sum in different orders (PyTorch's blocked
reductions, the reference's plain loops), so they agree to a few float
roundings, not bit for bit; each bound below was set from the worst
difference measured over these cases, with PyTorch in float64 beside both to
tell rounding from a real difference (figures in the comments at Tol). The
tight bounds catch, for instance, one step of OneCycleLR's default momentum
cycling (1e-5 in the parameters) or 1 - beta2 formed from a float beta2
(1.3e-5 in exp_avg_sq); a wrong learning rate or a missed weight decay is
orders of magnitude larger."""
import json
import math
import os
import sys
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import pytest
from safetensors.numpy import load as st_load

from sfharness import REPO, built_with_asan, st_body

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional
from safetensors.torch import save_file as torch_save_file  # noqa: E402  (needs torch)

sys.path.insert(0, str(REPO / "bench"))
from torch_interop import torch_model  # noqa: E402  (the presets' PyTorch modules)

SCALE = 0.00392156862745098  # 1/255
AUG = json.dumps([{"op": "to_dtype", "dtype": "float32", "scale": SCALE}])
# Which backend trains: the reference here; a GPU host sets cuda.
BACKEND = os.environ.get("STREAMFEED_PARITY_BACKEND", "ref")
TOL_LR = 1e-12  # the learning rate: float64 formulas on both sides


@dataclass(frozen=True)
class Tol:
    """Relative tolerances; a tensor's difference is measured by its L2 norm
    (as docs/DESIGN.md section 8 measures)."""
    loss: float = 2e-6        # a batch's loss
    norm: float = 2e-6        # the pre-clip gradient norm
    param: float = 2e-6       # each parameter and batchnorm running statistic
    opt_tensor: float = 5e-5  # each optimizer-state tensor (momentum, exp_avg, exp_avg_sq)
    opt_all: float = 3e-6     # the optimizer state of all parameters taken as one vector


# The tiny model and W1. Measured, the service against PyTorch float32 (and
# PyTorch float32 against float64): losses 2.0e-7, norms 8.7e-8 (2.0e-7),
# parameters 4.1e-7 (2.9e-7), the optimizer state as a whole 5.0e-7
# (4.4e-7). A single optimizer-state tensor reaches 1.1e-5 (7.7e-6): bias
# gradients, sums over 2048 positions with cancellation.
TIGHT = Tol()
# Batchnorm's backward subtracts batch means, and the float32 gradients of the
# convolutions before it are good to ~1e-5 on either side. Measured on the two
# batchnorm models here: parameters 2.6e-6 (1.7e-6), running statistics
# 4.3e-6 (3.0e-6), an optimizer-state tensor 3.9e-5 (3.0e-5), as a whole
# 1.4e-5 (9.7e-6), norms 1.3e-6 (9.8e-7).
BATCHNORM = Tol(norm=1e-5, param=2e-5, opt_tensor=2e-4, opt_all=1e-4)
# W2's gradients are sums over 2 x 65536 pixels: its last bias's is 6e-5 off
# the float64 one in PyTorch float32 too. Measured: norms 4.4e-5 (4.9e-5),
# parameters 2.0e-6 (1.2e-6), an optimizer-state tensor 6.1e-5 (2.7e-5), as a
# whole 1.2e-5 (5.3e-6).
W2_SUMS = Tol(norm=3e-4, param=1e-5, opt_tensor=3e-4, opt_all=1e-4)


@pytest.fixture(autouse=True)
def _torch_deterministic():
    """Deterministic PyTorch kernels, as the reference is; the setting is
    restored afterwards (the test process is shared with other modules)."""
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(was)


def rel(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm((got - want).ravel()) / max(np.linalg.norm(want.ravel()), 1e-30))


def as_input(images):
    """What to_dtype makes of a uint8 NHWC batch: float32(x) * float32(scale), NCHW."""
    return torch.from_numpy(images).permute(0, 3, 1, 2).float() * torch.tensor(SCALE, dtype=torch.float32)


def assert_the_service_sees_as_input(server, images):
    """POST /v1/transform: the model input is as_input's, bit for bit, so
    both sides train on the same floats."""
    r = server.post_batch(st_body(images), path="/v1/transform")
    assert r.status_code == 200, r.text
    assert np.array_equal(st_load(r.content)["images"], as_input(images).numpy())


# ---- the two sides -------------------------------------------------------------------


class Pair:
    """A service and the PyTorch loop it must match, fed the same batches.

    micro(images, labels) trains one batch on both: the service by POST
    ?wait=1, PyTorch by forward, (loss / accum).backward() and, on every
    accum-th batch, clip_grad_norm_, optimizer.step(), scheduler.step() and
    zero_grad() -- the loop that model.grad_accum_steps, optim.clip_grad_norm,
    optim.schedule and loss.label_smoothing document."""

    def __init__(self, server, model, opt, sched=None, smoothing=0.0, clip=0.0, accum=1, frozen_module=None,
                 tol=TIGHT):
        self.model, self.opt, self.sched, self.tol = model, opt, sched, tol
        self.smoothing, self.clip, self.accum = smoothing, clip, accum
        # model.freeze runs its layers in eval mode: batchnorm there uses and
        # keeps its running statistics, as a frozen PyTorch module in eval().
        self.frozen_module = frozen_module
        self.batches = 0
        self.norms = []  # PyTorch's pre-clip norms, one per optimizer step
        self.use(server)

    def use(self, server):
        """Goes on with another service (a restart)."""
        self.s = server
        self.norm_sum = server.metric("streamfeed_grad_norm_sum")

    def train_mode(self):
        self.model.train()
        if self.frozen_module is not None:
            self.frozen_module.eval()

    def micro(self, images, labels):
        """Trains one batch on both sides, checks the loss, lr and (on an
        optimizer step) the gradient norm; returns whether a step was taken."""
        r = self.s.post_arrays(images, labels, wait=True)
        assert r.status_code == 200 and r.json()["state"] == "done", r.text
        got = r.json()
        lr = self.opt.param_groups[0]["lr"]
        self.train_mode()
        out = self.model(as_input(images))
        loss = F.cross_entropy(out, torch.from_numpy(labels.astype(np.int64)), label_smoothing=self.smoothing)
        (loss / self.accum).backward()
        self.batches += 1
        want = float(loss.detach())
        assert rel(got["loss"], want) <= self.tol.loss, f"batch {self.batches}: loss {got['loss']} vs PyTorch {want}"
        assert math.isclose(self.s.metric("streamfeed_learning_rate"), lr, rel_tol=TOL_LR, abs_tol=1e-300), \
            f"batch {self.batches}: lr {self.s.metric('streamfeed_learning_rate')} vs PyTorch {lr}"
        if self.batches % self.accum:
            assert got["step"] == self.batches // self.accum
            return False
        params = [p for p in self.model.parameters() if p.requires_grad]
        # The service sums the squares in float64; clip_grad_norm_ reduces
        # each tensor in float32, which for W1's 33.5M-element conv weight is
        # 1.2e-4 off the float64 norm of the same gradients (measured), while
        # the clipping it applies agrees (tiny: 1e-7).
        norm = math.sqrt(sum(float(p.grad.double().square().sum()) for p in params))
        if self.clip:
            torch.nn.utils.clip_grad_norm_(params, self.clip)
        self.norms.append(norm)
        self.opt.step()
        if self.sched:
            self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        assert got["step"] == self.batches // self.accum and got["skipped"] is None, got
        norm_sum = self.s.metric("streamfeed_grad_norm_sum")
        assert rel(norm_sum - self.norm_sum, norm) <= self.tol.norm, \
            f"step {got['step']}: pre-clip gradient norm {norm_sum - self.norm_sum} vs PyTorch {norm}"
        self.norm_sum = norm_sum
        return True

    def state(self):
        r = self.s.get("/v1/checkpoint")
        assert r.status_code == 200, r.text
        return st_load(r.content)

    def assert_same_state(self, frozen=()):
        """The service's whole checkpoint against the module's state_dict and
        the optimizer's state: parameters, batchnorm buffers, SGD's momentum
        or AdamW's moments, and the step count. Frozen parameters and running
        statistics must be bit-identical and carry zero optimizer state (the
        service stores zeros for them, PyTorch none)."""
        ck = self.state()
        steps = self.batches // self.accum
        assert int(ck["optim.step"]) == steps
        sd = self.model.state_dict()
        # num_batches_tracked is one counter of every batchnorm layer, also
        # of frozen ones (docs/CONFIG.md, model.freeze), where PyTorch's
        # eval-mode layer keeps its own: the trained layers' count.
        counted = max((int(t) for n, t in sd.items() if n.endswith(".num_batches_tracked") and n not in frozen),
                      default=None)
        for name, t in sd.items():
            want = t.detach().numpy()
            if name.endswith(".num_batches_tracked"):
                assert int(ck[name]) == (counted if name in frozen else int(want)), \
                    f"step {steps}: {name} {int(ck[name])} vs PyTorch {int(want)}"
            elif name in frozen:
                assert np.array_equal(ck[name], want), f"{name} is frozen and must not move"
            else:
                assert rel(ck[name], want) <= self.tol.param, \
                    f"step {steps}: {name} differs by {rel(ck[name], want):.2e}"
        adamw = any(k.endswith(".exp_avg") for k in ck)
        for key in ("exp_avg", "exp_avg_sq") if adamw else ("momentum_buffer",):
            mine, theirs = [], []
            for name, p in self.model.named_parameters():
                got, want = ck[f"optim.{name}.{key}"], self.opt.state.get(p, {}).get(key)
                if want is None:  # frozen, or SGD without momentum
                    assert not got.any(), f"optim.{name}.{key} should be zero"
                    continue
                want = want.numpy()
                assert rel(got, want) <= self.tol.opt_tensor, \
                    f"step {steps}: optim.{name}.{key} differs by {rel(got, want):.2e}"
                mine.append(got.ravel())
                theirs.append(want.ravel())
            if mine:
                err = rel(np.concatenate(mine), np.concatenate(theirs))
                assert err <= self.tol.opt_all, f"step {steps}: the {key} tensors differ by {err:.2e} as a whole"
        if adamw:
            assert all(int(st["step"]) == steps for st in self.opt.state.values())


def start_pair(start_server, tmp_path, model, flags, make_opt, make_sched=None, smoothing=0.0, clip=0.0, accum=1,
               frozen_prefix=None, frozen_module=None, tol=TIGHT):
    """Saves the module's state_dict, starts the service from it (the same
    flags for a restart are in pair.flags) and checks that the service took
    every tensor bit for bit."""
    init = tmp_path / "init.safetensors"
    torch_save_file(model.state_dict(), str(init))
    flags = ["--pipeline.backend", BACKEND, "--model.precision", "fp32", "--augment.pipeline", AUG,
             "--augment.eval_pipeline", AUG, "--model.max_batch", "16", "--model.init_from", str(init),
             "--log.requests", "false", *flags]
    s = start_server(*flags)
    ck = st_load(s.get("/v1/checkpoint?optimizer=false").content)
    sd = model.state_dict()
    assert ck.keys() == sd.keys()
    for k, v in sd.items():
        assert np.array_equal(ck[k], v.numpy()), f"model.init_from did not take {k} as it is"
    if frozen_prefix:
        for name, p in model.named_parameters():
            p.requires_grad_(not name.startswith(frozen_prefix))
    opt = make_opt(model.parameters())
    pair = Pair(s, model, opt, make_sched(opt) if make_sched else None, smoothing, clip, accum, frozen_module, tol)
    pair.flags = flags
    return pair


def batches(seed, count, n=8, hw=32, classes=10, sizes=None):
    """count fixed batches of random uint8 NHWC images and int64 labels (n
    samples each, or sizes[i] for batch i)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        m = sizes[i % len(sizes)] if sizes else n
        out.append((rng.integers(0, 256, (m, hw, hw, 3), dtype=np.uint8), rng.integers(0, classes, m)))
    return out


def tiny(seed=0):
    torch.manual_seed(seed)
    return torch_model("tiny")


# ---- the options, on the tiny preset ---------------------------------------------------------

SGD = ["--optim.name", "sgd", "--optim.lr", "0.05", "--optim.momentum", "0.9"]
ADAMW = ["--optim.name", "adamw", "--optim.lr", "0.003", "--optim.beta1", "0.8", "--optim.beta2", "0.95",
         "--optim.eps", "1e-6", "--optim.weight_decay", "0.05"]
LS = torch.optim.lr_scheduler


def sgd(lr=0.05, momentum=0.9, weight_decay=0.0):
    return lambda params: torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)


def adamw(lr=0.003, weight_decay=0.05):
    return lambda params: torch.optim.AdamW(params, lr=lr, betas=(0.8, 0.95), eps=1e-6, weight_decay=weight_decay)


def warmup(then=None, steps=3, start=0.25):
    """optim.warmup_steps in front of a schedule: LinearLR then SequentialLR."""
    def make(opt):
        lin = LS.LinearLR(opt, start_factor=start, end_factor=1.0, total_iters=steps)
        return LS.SequentialLR(opt, [lin, then(opt)], milestones=[steps]) if then else lin
    return make


WARMUP = ["--optim.warmup_steps", "3", "--optim.warmup_start_factor", "0.25"]
STEP = ["--optim.schedule", "step", "--optim.step_size", "3", "--optim.gamma", "0.5"]
MULTISTEP = ["--optim.schedule", "multistep", "--optim.milestones", "[2,5]", "--optim.gamma", "0.3"]
COSINE = ["--optim.schedule", "cosine", "--optim.t_max", "5", "--optim.eta_min", "0.005"]
CLIP = ["--optim.clip_grad_norm", "0.5"]
ONE_CYCLE = ["--optim.schedule", "one_cycle", "--optim.max_lr", "0.1", "--optim.total_steps", "8",
             "--optim.pct_start", "0.3", "--optim.div_factor", "10", "--optim.final_div_factor", "100"]


def step_lr(opt):
    return LS.StepLR(opt, step_size=3, gamma=0.5)


def multistep_lr(opt):
    return LS.MultiStepLR(opt, milestones=[2, 5], gamma=0.3)


def cosine_lr(opt):
    return LS.CosineAnnealingLR(opt, T_max=5, eta_min=0.005)


def one_cycle_lr(opt):
    # optim.schedule one_cycle schedules the learning rate only: PyTorch's
    # default cycle_momentum=True would also move SGD's momentum.
    return LS.OneCycleLR(opt, max_lr=0.1, total_steps=8, pct_start=0.3, anneal_strategy="cos",
                         div_factor=10, final_div_factor=100, cycle_momentum=False)


@dataclass
class Case:
    flags: list
    opt: Callable
    sched: Optional[Callable] = None
    smoothing: float = 0.0
    clip: float = 0.0
    accum: int = 1
    sizes: Optional[list] = None
    steps: int = 8  # optimizer steps
    frozen: Optional[str] = None


CASES = {
    "sgd": Case(["--optim.lr", "0.05"], sgd(momentum=0.0)),
    "sgd_weight_decay": Case(["--optim.lr", "0.05", "--optim.weight_decay", "0.02"],
                             sgd(momentum=0.0, weight_decay=0.02)),
    "sgd_momentum_weight_decay": Case(SGD + ["--optim.weight_decay", "0.02"], sgd(weight_decay=0.02)),
    "adamw": Case(ADAMW, adamw()),
    # AdamW without weight decay is Adam.
    "adamw_without_decay_is_adam": Case(
        ["--optim.name", "adamw", "--optim.lr", "0.002", "--optim.weight_decay", "0"],
        lambda params: torch.optim.Adam(params, lr=0.002)),
    "step": Case(SGD + STEP, sgd(), step_lr),
    "multistep": Case(SGD + MULTISTEP, sgd(), multistep_lr),
    "cosine_past_t_max": Case(SGD + COSINE, sgd(), cosine_lr),
    "one_cycle": Case(SGD + ONE_CYCLE, sgd(), one_cycle_lr),
    "warmup": Case(SGD + WARMUP, sgd(), warmup()),
    "warmup_step": Case(SGD + WARMUP + STEP, sgd(), warmup(step_lr)),
    "warmup_multistep": Case(SGD + WARMUP + MULTISTEP, sgd(), warmup(multistep_lr)),
    "warmup_cosine": Case(SGD + WARMUP + COSINE, sgd(), warmup(cosine_lr)),
    "adamw_warmup_cosine": Case(ADAMW + WARMUP + COSINE, adamw(), warmup(cosine_lr)),
    # max_norm among the norms of the steps (0.34 to 0.68 here), so about
    # half the steps clip; the test checks that some do and some do not.
    "clip_grad_norm": Case(SGD + CLIP, sgd(), clip=0.5),
    "adamw_clip_grad_norm": Case(ADAMW + CLIP, adamw(), clip=0.5),
    "label_smoothing": Case(SGD + ["--loss.label_smoothing", "0.2"], sgd(), smoothing=0.2),
    "grad_accum": Case(SGD + ["--model.grad_accum_steps", "2", "--optim.weight_decay", "0.02"],
                       sgd(weight_decay=0.02), accum=2, steps=4),
    # Micro-batches of 3, 8 and 5 samples: each batch's mean loss weighs 1/3
    # (the mean of the batch gradients, not of the samples').
    "grad_accum_uneven_adamw_clip_warmup": Case(
        ADAMW + WARMUP + COSINE + CLIP + ["--model.grad_accum_steps", "3"],
        adamw(), warmup(cosine_lr), clip=0.5, accum=3, sizes=[3, 8, 5], steps=4),
    "freeze_sgd": Case(SGD + ["--model.freeze", "0", "--optim.weight_decay", "0.02"], sgd(weight_decay=0.02),
                       frozen="0."),
    "freeze_adamw": Case(ADAMW + ["--model.freeze", "0"], adamw(), frozen="0."),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_tiny_model_trains_like_pytorch_step_by_step(start_server, tmp_path, name):
    case = CASES[name]
    pair = start_pair(start_server, tmp_path, tiny(), ["--model.preset", "tiny", *case.flags], case.opt, case.sched,
                      case.smoothing, case.clip, case.accum, case.frozen)
    frozen = {n for n, p in pair.model.named_parameters() if not p.requires_grad}
    data = batches(1, case.steps * case.accum + 1, sizes=case.sizes)
    assert_the_service_sees_as_input(pair.s, data[0][0])
    for images, labels in data[:-1]:
        if pair.micro(images, labels):
            pair.assert_same_state(frozen)
    assert_eval_like_pytorch(pair, *data[-1])
    if case.clip:
        assert min(pair.norms) < case.clip < max(pair.norms), \
            f"the case must have steps that clip and steps that do not: norms {pair.norms}"


# ---- a checkpoint save and resume halfway -----------------------------------------------------

RESUME = {
    "sgd": (SGD + ["--optim.weight_decay", "0.02"] + CLIP + WARMUP + COSINE, sgd(weight_decay=0.02),
            warmup(cosine_lr)),
    "adamw": (ADAMW + CLIP + WARMUP + COSINE, adamw(), warmup(cosine_lr)),
}


@pytest.mark.parametrize("opt", list(RESUME))
def test_a_run_saved_and_resumed_halfway_continues_like_an_uninterrupted_pytorch_run(start_server, tmp_path, opt):
    flags, make_opt, make_sched = RESUME[opt]
    ckdir = tmp_path / "ck"
    pair = start_pair(start_server, tmp_path, tiny(), ["--model.preset", "tiny", *flags, "--checkpoint.dir",
                      str(ckdir), "--checkpoint.resume", "true"], make_opt, make_sched, clip=0.5)
    data = batches(2, 8)
    for images, labels in data[:4]:
        pair.micro(images, labels)
    pair.s.stop()  # SIGTERM: the final checkpoint, optimizer state and step count included
    assert [p.name for p in ckdir.iterdir()] == [f"ckpt-{4:010d}.safetensors"]
    # The same flags: checkpoint.resume takes the file (model.init_from yields to it).
    pair.use(start_server(*pair.flags))
    pair.assert_same_state()
    # PyTorch never stopped; the service goes on from step 4, its schedule too.
    for images, labels in data[4:]:
        pair.micro(images, labels)
        pair.assert_same_state()
    assert min(pair.norms) < 0.5 < max(pair.norms)


# ---- batchnorm -------------------------------------------------------------------------------

# A residual block with batchnorm on 16x16 inputs, as a model.spec and as the
# PyTorch module of the same names.
BN_SPEC = {"input": [3, 16, 16], "classes": 10, "layers": [
    {"type": "conv2d", "name": "conv1", "out": 8, "k": 3, "pad": 1, "bias": False},
    {"type": "batchnorm2d", "name": "bn1"}, {"type": "relu", "name": "relu"},
    {"type": "conv2d", "name": "conv2", "out": 8, "k": 3, "pad": 1, "bias": False},
    {"type": "batchnorm2d", "name": "bn2"},
    {"type": "add", "name": "add", "inputs": ["relu", "bn2"]},
    {"type": "maxpool2d", "name": "pool", "k": 2, "stride": 2},
    {"type": "global_avgpool", "name": "avgpool"}, {"type": "flatten", "name": "flatten"},
    {"type": "linear", "name": "fc", "out": 10}]}


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2, 2)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        a = self.relu(self.bn1(self.conv1(x)))
        return self.fc(torch.flatten(self.pool(a + self.bn2(self.conv2(a))).mean((2, 3)), 1))


# The same with its first block frozen (model.freeze "trunk."): nn.Sequential
# members, so that the names are trunk.0, trunk.1 ... as the spec's.
FROZEN_SPEC = {"input": [3, 16, 16], "classes": 10, "layers": [
    {"type": "conv2d", "name": "trunk.0", "out": 8, "k": 3, "pad": 1, "bias": False},
    {"type": "batchnorm2d", "name": "trunk.1"}, {"type": "relu", "name": "trunk.2"},
    {"type": "conv2d", "name": "head.0", "out": 8, "k": 3, "stride": 2, "pad": 1, "bias": False},
    {"type": "batchnorm2d", "name": "head.1"}, {"type": "relu", "name": "head.2"},
    {"type": "global_avgpool", "name": "avgpool"}, {"type": "flatten", "name": "flatten"},
    {"type": "linear", "name": "fc", "out": 10}]}


class TrunkHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.head = nn.Sequential(nn.Conv2d(8, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        return self.fc(torch.flatten(self.head(self.trunk(x)).mean((2, 3)), 1))


def with_random_batchnorm(model, seed):
    """Random batchnorm weights, biases and running statistics (and
    num_batches_tracked 7), so that model.init_from has buffers to take and
    the eval-mode forward depends on them."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.copy_(torch.rand(m.bias.shape, generator=g) * 0.4 - 0.2)
                m.running_mean.copy_(torch.rand(m.running_mean.shape, generator=g) * 0.4 - 0.2)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) * 1.5 + 0.5)
                m.num_batches_tracked.fill_(7)
    return model


def assert_eval_like_pytorch(pair, images, labels):
    """An eval batch (?mode=eval) against the module in eval() under no_grad:
    its loss (label smoothing included, as loss.label_smoothing says) and
    top-1; with batchnorm, of the running statistics."""
    r = pair.s.request("POST", "/v1/batches?wait=1&mode=eval", data=st_body(images, labels),
                       headers={"Content-Type": "application/vnd.safetensors"})
    assert r.status_code == 200 and r.json()["state"] == "done", r.text
    pair.model.eval()
    with torch.no_grad():
        out = pair.model(as_input(images))
    y = torch.from_numpy(labels)
    loss = float(F.cross_entropy(out, y, label_smoothing=pair.smoothing))
    assert rel(r.json()["loss"], loss) <= pair.tol.loss, (r.json()["loss"], loss)
    assert r.json()["top1"] == float((out.argmax(1) == y).float().mean())


def test_batchnorm_running_statistics_and_eval_mode_follow_pytorch(start_server, tmp_path):
    torch.manual_seed(3)
    pair = start_pair(start_server, tmp_path, with_random_batchnorm(Residual(), 3),
                      ["--model.spec", json.dumps(BN_SPEC), *SGD, "--optim.weight_decay", "0.02"],
                      sgd(weight_decay=0.02), tol=BATCHNORM)
    data = batches(3, 7, hw=16)
    assert_the_service_sees_as_input(pair.s, data[0][0])
    for images, labels in data[:6]:
        pair.micro(images, labels)
        pair.assert_same_state()
    assert_eval_like_pytorch(pair, *data[6])


def test_a_frozen_batchnorm_trunk_runs_in_eval_mode_like_a_frozen_pytorch_module(start_server, tmp_path):
    torch.manual_seed(4)
    model = with_random_batchnorm(TrunkHead(), 4)
    pair = start_pair(start_server, tmp_path, model,
                      ["--model.spec", json.dumps(FROZEN_SPEC), "--model.freeze", "trunk.", *ADAMW], adamw(),
                      frozen_prefix="trunk.", frozen_module=model.trunk, tol=BATCHNORM)
    frozen = {n for n in model.state_dict() if n.startswith("trunk.")}
    data = batches(4, 7, hw=16)
    for images, labels in data[:6]:
        pair.micro(images, labels)
        pair.assert_same_state(frozen)
    assert_eval_like_pytorch(pair, *data[6])


# ---- the W1 and W2 presets ----------------------------------------------------------------------


@pytest.mark.skipif(built_with_asan(), reason="W1's full-size model takes minutes per step on the reference "
                    "backend under AddressSanitizer; the release build's run checks its parity")
def test_w1_seed_classifier_trains_like_pytorch(start_server, tmp_path):
    torch.manual_seed(5)
    pair = start_pair(start_server, tmp_path, torch_model("seed-classifier"),
                      ["--model.preset", "seed-classifier", *SGD, "--optim.weight_decay", "0.02",
                       "--ring.slot_bytes", str(1 << 20)], sgd(weight_decay=0.02))
    # Two steps: the second adds the momentum of the first (W1 takes ~2 s a step here).
    for images, labels in batches(5, 2, n=2, hw=256):
        pair.micro(images, labels)
    pair.assert_same_state()


@pytest.mark.skipif(built_with_asan(), reason="W2's 256x256 encoder-decoder takes longer per step than a request "
                    "waits on the reference backend under AddressSanitizer; the release build's run checks its parity")
def test_w2_seed_encdec_with_its_encoder_frozen_trains_like_pytorch(start_server, tmp_path):
    """W2 segments: labels [N,256,256], the loss the mean over the pixels."""
    torch.manual_seed(6)
    model = torch_model("seed-encdec")
    pair = start_pair(start_server, tmp_path, model,
                      ["--model.preset", "seed-encdec", "--model.freeze", "encoder.", *SGD,
                       "--optim.weight_decay", "0.02"], sgd(weight_decay=0.02), frozen_prefix="encoder.",
                      frozen_module=model.encoder, tol=W2_SUMS)
    frozen = {n for n in model.state_dict() if n.startswith("encoder.")}
    rng = np.random.default_rng(6)
    for _ in range(3):
        pair.micro(rng.integers(0, 256, (2, 256, 256, 3), dtype=np.uint8),
                   rng.integers(0, 10, (2, 256, 256), dtype=np.uint8))
    pair.assert_same_state(frozen)
