"""Learning-rate schedules through the real server on the CPU reference
backend: the learning rate in force (streamfeed_learning_rate, set when a
batch goes to the backend) follows warmup + cosine per optimizer step, also
with gradient accumulation; the lr reaches the optimizer; a checkpoint
restore (its optimizer step count is the schedule's position) continues the
schedule. The expected values are torch.optim.lr_scheduler's closed forms
(LinearLR + SequentialLR + CosineAnnealingLR)."""
import math

import numpy as np
from safetensors.numpy import load as st_load

from sfharness import learnable_batch

SAFETENSORS = {"Content-Type": "application/vnd.safetensors"}
AUG = '[{"op":"to_dtype","scale":0.00392157}]'
TINY = ["--model.preset", "tiny", "--pipeline.backend", "ref", "--augment.pipeline", AUG,
        "--model.seed", "1"]
BASE, WARM, START, T_MAX, ETA = 0.05, 3, 0.25, 5, 0.001
SCHED = ["--optim.lr", str(BASE), "--optim.schedule", "cosine", "--optim.t_max", str(T_MAX),
         "--optim.eta_min", str(ETA), "--optim.warmup_steps", str(WARM),
         "--optim.warmup_start_factor", str(START)]


def expected_lr(t):
    if t < WARM:
        return BASE * (START + (1 - START) * t / WARM)
    t -= WARM
    return ETA + (BASE - ETA) * (1 + math.cos(math.pi * t / T_MAX)) / 2


def train_one(s, rng):
    """Trains one batch; returns (its reply, the learning rate in force)."""
    x, y = learnable_batch(rng, 4)
    r = s.post_arrays(x, y, wait=True)
    assert r.status_code == 200 and r.json()["state"] == "done", r.text
    return r.json(), s.metric("streamfeed_learning_rate")


def test_warmup_then_cosine_learning_rate_follows_the_schedule_per_step(start_server):
    s = start_server(TINY + SCHED)
    rng = np.random.default_rng(3)
    for t in range(10):
        reply, lr = train_one(s, rng)
        assert reply["step"] == t + 1
        assert math.isclose(lr, expected_lr(t), rel_tol=1e-9), (t, lr, expected_lr(t))


def test_with_gradient_accumulation_the_schedule_advances_per_optimizer_step(start_server):
    s = start_server(TINY + SCHED + ["--model.grad_accum_steps", "2"])
    rng = np.random.default_rng(4)
    for b in range(8):
        _, lr = train_one(s, rng)
        assert math.isclose(lr, expected_lr(b // 2), rel_tol=1e-9), (b, lr)


def test_a_restored_checkpoint_continues_the_schedule_from_its_step(start_server):
    s = start_server(TINY + SCHED)
    rng = np.random.default_rng(5)
    for _ in range(4):
        train_one(s, rng)
    ck = s.get("/v1/checkpoint")
    assert ck.status_code == 200 and ck.headers["X-Checkpoint-Step"] == "4"
    for _ in range(3):
        train_one(s, rng)
    # Back to step 4 on this server: the next optimizer step is step 4's lr.
    r = s.request("PUT", "/v1/checkpoint", data=ck.content, headers=SAFETENSORS)
    assert r.status_code == 200, r.text
    for t in (4, 5):
        _, lr = train_one(s, rng)
        assert math.isclose(lr, expected_lr(t), rel_tol=1e-9), (t, lr)
    # A fresh server given the checkpoint before its first batch resumes too.
    s2 = start_server(TINY + SCHED)
    r = s2.request("PUT", "/v1/checkpoint", data=ck.content, headers=SAFETENSORS)
    assert r.status_code == 200, r.text
    reply, lr = train_one(s2, rng)
    assert reply["step"] == 5
    assert math.isclose(lr, expected_lr(4), rel_tol=1e-9), lr


def test_the_scheduled_lr_reaches_the_optimizer(start_server):
    """step_size 2, gamma 0: from optimizer step 2 the lr is 0, so plain SGD
    leaves the parameters where they are."""
    s = start_server(TINY + ["--optim.lr", "0.05", "--optim.schedule", "step",
                             "--optim.step_size", "2", "--optim.gamma", "0"])
    rng = np.random.default_rng(6)

    def params():
        sd = st_load(s.get("/v1/checkpoint?optimizer=false").content)
        return {k: v for k, v in sd.items() if not k.startswith("optim.")}

    p0 = params()
    train_one(s, rng)
    p1 = params()
    assert any(not np.array_equal(p0[k], p1[k]) for k in p0)
    train_one(s, rng)
    p2 = params()
    for _ in range(2):
        _, lr = train_one(s, rng)
        assert lr == 0
    p4 = params()
    assert all(np.array_equal(p2[k], p4[k]) for k in p2)


def test_patching_the_schedule_applies_from_the_next_step(start_server):
    s = start_server(TINY + ["--optim.lr", "0.05"])
    rng = np.random.default_rng(7)
    for _ in range(3):
        _, lr = train_one(s, rng)
        assert lr == 0.05
    r = s.patch_config({"optim": {"schedule": "multistep", "milestones": [2, 4], "gamma": 0.5}})
    assert r.status_code == 200, r.text
    _, lr = train_one(s, rng)  # optimizer step 3: one milestone passed
    assert math.isclose(lr, 0.025, rel_tol=1e-12)
    _, lr = train_one(s, rng)  # step 4: two
    assert math.isclose(lr, 0.0125, rel_tol=1e-12)
    bad = s.patch_config({"optim": {"schedule": "cosine", "t_max": 0}})
    assert bad.status_code == 400 and "t_max" in bad.text, bad.text
