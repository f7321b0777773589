"""distributed.batchnorm against PyTorch itself: two reference-backend ranks of
a small batchnorm net (conv, batchnorm2d, relu, global average pool, linear;
fp32), started from one state_dict (model.init_from) and fed the same
per-rank batches for STEPS rounds with SGD and momentum, against

- broadcast: torch DistributedDataParallel(broadcast_buffers=True), two
  processes over Gloo on the CPU (torch_ddp_batchnorm.py);
- local: the same with broadcast_buffers=False (each rank's own running
  statistics);
- sync: torch.nn.SyncBatchNorm under DDP. PyTorch refuses SyncBatchNorm on
  CPU tensors ("SyncBatchNorm expected input tensor to be on GPU"), so the
  reference is its definition computed in one process: one BatchNorm2d over
  the ranks' batches concatenated (the statistics of every rank's samples,
  the running variance unbiased over the whole count), each rank's loss its
  own batch's mean, and the gradient the mean of the ranks' (DDP's average),
  which is the gradient of the mean of the two losses.

Each rank's loss per step must be within LOSS_TOL (relative), and at the end
every parameter and running statistic of each rank within STATE_TOL
(relative L2, as docs/DESIGN.md section 8 measures) and num_batches_tracked
equal. The two sides sum in different orders, so they agree to a few float
roundings (measured, the worst of losses and tensors: 3.4e-7 in broadcast
and local, 1.3e-6 in sync; the other modes' references are 0.22 to 0.64
away). Each case also requires the service's
result to be far (over 10 x the tolerance) from the other modes' references,
so that a mode computed as another would fail: the ranks' batches are drawn
from different ranges, so their statistics differ.
"""
import json
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file as np_load_file

from sfharness import wait_until
from test_distributed import dist_flags, parameters, post_round

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("this torch has no torch.distributed with Gloo", allow_module_level=True)
from safetensors.torch import load_file as torch_load_file  # noqa: E402  (needs torch)
from safetensors.torch import save_file as torch_save_file  # noqa: E402

import torch_ddp_batchnorm as ref  # noqa: E402  (the net and PyTorch's DDP rank; needs torch)

B = 8
STEPS = 5
WORLD = 2
LOSS_TOL = 1e-4
STATE_TOL = 1e-4
AUG = json.dumps([{"op": "to_dtype", "dtype": "float32", "scale": ref.SCALE}])
MODES = ("broadcast", "local", "sync")


def rel(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm((got - want).ravel()) / max(np.linalg.norm(want.ravel()), 1e-30))


def batches():
    """STEPS rounds of one batch per rank; rank 1's pixels are brighter than
    rank 0's, so each rank's batch statistics differ from the job's."""
    rng = np.random.default_rng(34)
    out = {}
    for s in range(STEPS):
        for r in range(WORLD):
            lo, hi = (0, 180) if r == 0 else (70, 256)
            out[f"images_{s}_{r}"] = rng.integers(lo, hi, (B, 8, 8, 3), dtype=np.uint8)
            out[f"labels_{s}_{r}"] = rng.integers(0, ref.SPEC["classes"], B)
    return out


def initial_state(path):
    """The state every side starts from: a seeded net with random batchnorm
    weights and running statistics, so that every tensor matters."""
    torch.manual_seed(34)
    net = ref.Net()
    g = torch.Generator().manual_seed(34)
    with torch.no_grad():
        net.bn1.weight.copy_(torch.rand(6, generator=g) + 0.5)
        net.bn1.bias.copy_(torch.rand(6, generator=g) * 0.4 - 0.2)
        net.bn1.running_mean.copy_(torch.rand(6, generator=g) * 0.4 - 0.2)
        net.bn1.running_var.copy_(torch.rand(6, generator=g) + 0.5)
        net.bn1.num_batches_tracked.fill_(3)
    torch_save_file(net.state_dict(), str(path))


def torch_ddp(mode, tmp, init, data):
    """PyTorch DDP over Gloo, one process per rank; each rank's state and losses."""
    store = tmp / f"store-{mode}"
    outs = [tmp / f"torch-{mode}-{r}.safetensors" for r in range(WORLD)]
    procs = [subprocess.Popen([sys.executable, ref.__file__, mode, str(r), str(WORLD), str(store), str(init),
                               str(data), str(outs[r])], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for r in range(WORLD)]
    for p in procs:
        text = p.communicate(timeout=300)[0].decode(errors="replace")
        assert p.returncode == 0, text
    return [np_load_file(str(o)) for o in outs]


def torch_sync(init, data):
    """SyncBatchNorm's definition over the ranks' batches, in one process (see the top)."""
    torch.use_deterministic_algorithms(True)
    net = ref.Net()
    net.load_state_dict(torch_load_file(str(init)))
    opt = ref.sgd(net.parameters())
    losses = [[] for _ in range(WORLD)]
    for s in range(STEPS):
        x = torch.cat([ref.as_input(data[f"images_{s}_{r}"]) for r in range(WORLD)])
        out = net(x)
        per_rank = [torch.nn.functional.cross_entropy(out[r * B:(r + 1) * B],
                                                      torch.from_numpy(data[f"labels_{s}_{r}"]).long())
                    for r in range(WORLD)]
        opt.zero_grad()
        (sum(per_rank) / WORLD).backward()
        opt.step()
        for r in range(WORLD):
            losses[r].append(per_rank[r].item())
    state = {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}
    return [dict(state, loss=np.array(losses[r])) for r in range(WORLD)]


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """The initial state, the batches and PyTorch's result for every mode."""
    tmp = tmp_path_factory.mktemp("torch_bn")
    init, data = tmp / "init.safetensors", tmp / "batches.npz"
    initial_state(init)
    b = batches()
    np.savez(data, **b)
    refs = {m: torch_ddp(m, tmp, init, data) for m in ("broadcast", "local")}
    refs["sync"] = torch_sync(init, b)
    return init, b, refs


def service(start_server, init, data, mode):
    """Two reference-backend ranks under distributed.batchnorm mode, trained
    STEPS rounds; each rank's checkpoint with its losses."""
    flags = ["--model.spec", json.dumps(ref.SPEC), "--pipeline.backend", "ref", "--model.precision", "fp32",
             "--augment.pipeline", AUG, "--model.max_batch", str(B), "--model.init_from", str(init),
             "--optim.name", "sgd", "--optim.lr", str(ref.LR), "--optim.momentum", str(ref.MOMENTUM),
             "--distributed.wait_ms", "2000", "--distributed.batchnorm", mode]
    r0 = start_server(dist_flags(WORLD, 0, None) + flags)
    r1 = start_server(dist_flags(WORLD, 1, f"127.0.0.1:{r0.port}") + flags)
    ranks = [r0, r1]
    for s in ranks:
        wait_until(lambda s=s: s.get("/readyz").status_code == 200, timeout=30, what="every rank joined")
    losses = [[] for _ in ranks]
    for s in range(STEPS):
        res = post_round(ranks, [(data[f"images_{s}_{r}"], data[f"labels_{s}_{r}"]) for r in range(WORLD)])
        for r, (code, body) in enumerate(res):
            assert code == 200 and body["state"] == "done" and body["step"] == s + 1, body
            losses[r].append(body["loss"])
    out = []
    for r, s in enumerate(ranks):
        ck = parameters(s)
        out.append(dict({k: v for k, v in ck.items() if not k.startswith("optim.")}, loss=np.array(losses[r])))
    return out


def worst(got, want):
    """The largest relative difference between a rank's result and a
    reference's: losses step by step, then every float tensor of the
    state_dict; num_batches_tracked must be equal."""
    w = max(abs(g - t) / max(abs(t), 1e-30) for g, t in zip(got["loss"], want["loss"]))
    for k, v in want.items():
        if k == "loss":
            continue
        assert k in got, f"{k} missing from the service's checkpoint"
        if k.endswith("num_batches_tracked"):
            w = max(w, 0.0 if int(got[k]) == int(v) else float("inf"))
        else:
            w = max(w, rel(got[k], v))
    return w


@pytest.mark.parametrize("mode", MODES)
def test_each_batchnorm_mode_trains_two_ranks_like_its_pytorch_counterpart(start_server, references, mode):
    init, data, refs = references
    got = service(start_server, init, data, mode)
    for r in range(WORLD):
        assert set(got[r]) == set(refs[mode][r]), (sorted(got[r]), sorted(refs[mode][r]))
        for s, (g, t) in enumerate(zip(got[r]["loss"], refs[mode][r]["loss"])):
            assert abs(g - t) <= LOSS_TOL * abs(t), f"rank {r} step {s + 1}: loss {g} against PyTorch's {t}"
        for k, v in refs[mode][r].items():
            if k == "loss":
                continue
            if k.endswith("num_batches_tracked"):
                assert int(got[r][k]) == int(v), f"rank {r} {k}: {got[r][k]} against PyTorch's {v}"
            else:
                e = rel(got[r][k], v)
                assert e <= STATE_TOL, f"rank {r} {k}: relative difference {e:.2e} from PyTorch's"
    # The same run is far from the other modes' references: computed as
    # another mode, this case would fail.
    for other in MODES:
        if other != mode:
            far = max(worst(got[r], refs[other][r]) for r in range(WORLD))
            assert far > 10 * max(LOSS_TOL, STATE_TOL), f"{mode} is within {far:.1e} of {other}'s reference"


def test_sync_batchnorm_counts_an_empty_rank_as_no_samples_and_uneven_batches_by_their_size(start_server,
                                                                                            references):
    # Rounds in which one rank has no batch (it joins with an empty
    # contribution after distributed.wait_ms) or a smaller one: the job's
    # statistics are those of the samples trained, and the step is the mean
    # over them (each rank's loss gradient weighs n / global_n), i.e. one
    # BatchNorm2d over the batches that came, concatenated, under the mean
    # loss over their samples. An empty rank that counted a sample, or
    # weighed its zeros in the mean, would move the statistics.
    init, data, _ = references
    sizes = [(B, B // 2), (B, 0), (0, B), (B - 2, B), (B, B)]
    rounds = [[(data[f"images_{s}_{r}"][:n], data[f"labels_{s}_{r}"][:n]) if n else None
               for r, n in enumerate(sizes[s])] for s in range(STEPS)]
    net = ref.Net()
    net.load_state_dict(torch_load_file(str(init)))
    opt = ref.sgd(net.parameters())
    want = [[] for _ in range(WORLD)]
    for rnd in rounds:
        present = [(r, b) for r, b in enumerate(rnd) if b is not None]
        out = net(torch.cat([ref.as_input(b[0]) for _, b in present]))
        y = torch.cat([torch.from_numpy(b[1]).long() for _, b in present])
        opt.zero_grad()
        torch.nn.functional.cross_entropy(out, y).backward()
        opt.step()
        at = 0
        for r, b in present:
            n = len(b[1])
            want[r].append(torch.nn.functional.cross_entropy(out[at:at + n], y[at:at + n]).item())
            at += n
    state = {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}

    flags = ["--model.spec", json.dumps(ref.SPEC), "--pipeline.backend", "ref", "--model.precision", "fp32",
             "--augment.pipeline", AUG, "--model.max_batch", str(B), "--model.init_from", str(init),
             "--optim.name", "sgd", "--optim.lr", str(ref.LR), "--optim.momentum", str(ref.MOMENTUM),
             "--distributed.wait_ms", "300", "--distributed.batchnorm", "sync"]
    r0 = start_server(dist_flags(WORLD, 0, None) + flags)
    r1 = start_server(dist_flags(WORLD, 1, f"127.0.0.1:{r0.port}") + flags)
    ranks = [r0, r1]
    for s in ranks:
        wait_until(lambda s=s: s.get("/readyz").status_code == 200, timeout=30, what="every rank joined")
    got = [[] for _ in ranks]
    for s, rnd in enumerate(rounds):
        for r, res in enumerate(post_round(ranks, rnd)):
            if res is not None:
                assert res[0] == 200 and res[1]["state"] == "done" and res[1]["step"] == s + 1, res
                got[r].append(res[1]["loss"])
    for r in range(WORLD):
        assert len(got[r]) == len(want[r])
        for s, (g, t) in enumerate(zip(got[r], want[r])):
            assert abs(g - t) <= LOSS_TOL * abs(t), f"rank {r}, its batch {s + 1}: loss {g} against PyTorch's {t}"
    wait_until(lambda: {s.get("/v1/model").json()["step"] for s in ranks} == {STEPS}, timeout=10,
               what="every rank at the last step")
    cks = [parameters(s) for s in ranks]
    for k, v in state.items():
        if k.endswith("num_batches_tracked"):
            assert [int(ck[k]) for ck in cks] == [int(v)] * WORLD, k
        else:
            for r, ck in enumerate(cks):
                e = rel(ck[k], v)
                assert e <= STATE_TOL, f"rank {r} {k}: relative difference {e:.2e} from PyTorch's"
    for k in cks[0]:
        assert cks[0][k].tobytes() == cks[1][k].tobytes(), f"{k} differs between the ranks"
