"""W1 of shared/WORKLOADS.md written the way the PyTorch literature writes it.

Run on the GPU host in the same session as streamfeed's benchmark, so the
ratio of the two is measured on one machine:

    python3 bench/pytorch_w1.py --batch 32 --variants gpu_aug,gpu_aug_streams,cached,cached_cl,compile --json out.json

Variants (steps/s after 10 warm-up steps over >= 100 steps):
  gpu_aug          augmentation on the GPU, serial with the step
  gpu_aug_streams  augmentation on a transform stream overlapped with the step
  cached           model only, one augmented batch kept on the GPU (the upper bound)
  cached_cl        the same in channels_last
  compile          the same under torch.compile
  cached_bf16_cl   bf16 autocast + channels_last
PyTorch's defaults let cuDNN convolutions use TF32: "fp32" here means TF32
convolutions, like streamfeed's default model.precision=tf32.
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

IMG = 256
CLASSES = 10


def make_model():
    layers = [nn.Conv2d(3, 16, 1), nn.ReLU()]
    c = 16
    for i in range(8):
        layers.append(nn.Conv2d(c, 2 * c, 2, stride=2))
        if i < 7:
            layers.append(nn.ReLU())
        c *= 2
    layers += [nn.Flatten(), nn.Linear(4096, CLASSES)]
    return nn.Sequential(*layers)


def gaussian_kernels(sigmas, k=7):
    x = torch.arange(k, device=sigmas.device, dtype=torch.float32) - (k - 1) / 2
    w = torch.exp(-(x[None, :] ** 2) / (2 * sigmas[:, None] ** 2))
    return w / w.sum(dim=1, keepdim=True)


def gpu_augment(raw):
    """raw: uint8 [N,H,W,C] on the GPU -> float [N,3,256,256]: crop 128, resize 256,
    rotate +-45 (fill 0), blur k7 sigma U(0.1,2), normalize mean 0 std 1."""
    n = raw.shape[0]
    x = raw.permute(0, 3, 1, 2).float()
    # random crop 128x128 as roi_align-like slicing per sample, then a batched resize
    ys = torch.randint(0, IMG - 128 + 1, (n,)).tolist()
    xs = torch.randint(0, IMG - 128 + 1, (n,)).tolist()
    crops = torch.stack([x[i, :, ys[i]:ys[i] + 128, xs[i]:xs[i] + 128] for i in range(n)])
    x = F.interpolate(crops, size=(IMG, IMG), mode="bilinear", align_corners=False)
    # per-sample rotation loop (the literature's version)
    angles = (torch.rand(n) * 90 - 45).tolist()
    out = []
    for i in range(n):
        a = math.radians(angles[i])
        theta = torch.tensor([[math.cos(a), -math.sin(a), 0.0], [math.sin(a), math.cos(a), 0.0]],
                             device=x.device).unsqueeze(0)
        grid = F.affine_grid(theta, (1, 3, IMG, IMG), align_corners=False)
        out.append(F.grid_sample(x[i:i + 1], grid, align_corners=False, padding_mode="zeros"))
    x = torch.cat(out)
    # per-sample gaussian blur, separable, reflect padding
    w = gaussian_kernels(torch.rand(n, device=x.device) * 1.9 + 0.1)
    x = F.pad(x, (3, 3, 3, 3), mode="reflect")
    xr = x.reshape(1, n * 3, x.shape[2], x.shape[3])
    wh = w.repeat_interleave(3, dim=0)[:, None, None, :]
    wv = w.repeat_interleave(3, dim=0)[:, None, :, None]
    xr = F.conv2d(xr, wh, groups=n * 3)
    xr = F.conv2d(xr, wv, groups=n * 3)
    x = xr.reshape(n, 3, IMG, IMG)
    return (x - 0.0) / 1.0


def timed(step, steps, warmup=10):
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return steps / (time.perf_counter() - t0)


def run(variant, batch, steps):
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = make_model().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    crit = nn.CrossEntropyLoss()
    raw = torch.randint(0, 256, (batch, IMG, IMG, 3), dtype=torch.uint8, device=dev)
    labels = torch.randint(0, CLASSES, (batch,), device=dev)

    def train_step(x):
        opt.zero_grad(set_to_none=True)
        loss = crit(model(x), labels)
        loss.backward()
        opt.step()

    if variant == "gpu_aug":
        return timed(lambda: train_step(gpu_augment(raw)), steps)
    if variant == "gpu_aug_streams":
        ts, cs = torch.cuda.Stream(), torch.cuda.Stream()
        state = {}
        with torch.cuda.stream(ts):
            state["next"] = gpu_augment(raw)
        state["ev"] = ts.record_event()

        def step():
            cs.wait_event(state["ev"])
            cur = state["next"]
            with torch.cuda.stream(ts):
                nxt = gpu_augment(raw)  # batch N+1 on the transform stream
            ev = ts.record_event()
            with torch.cuda.stream(cs):
                train_step(cur)
            cur.record_stream(cs)  # the consumer stream: keeps cur alive until cs used it
            state["next"], state["ev"] = nxt, ev

        return timed(step, steps)
    x = gpu_augment(raw).detach()
    if variant == "cached":
        return timed(lambda: train_step(x), steps)
    if variant in ("cached_cl", "cached_bf16_cl", "compile"):
        model = model.to(memory_format=torch.channels_last)
        xc = x.contiguous(memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        fwd = torch.compile(model) if variant == "compile" else model

        def step():
            opt.zero_grad(set_to_none=True)
            if variant == "cached_bf16_cl":
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = crit(fwd(xc), labels)
            else:
                loss = crit(fwd(xc), labels)
            loss.backward()
            opt.step()

        return timed(step, steps, warmup=10 if variant != "compile" else 20)
    raise SystemExit(f"unknown variant {variant}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--variants", default="gpu_aug,gpu_aug_streams,cached,cached_cl,compile")
    ap.add_argument("--json")
    a = ap.parse_args()
    res = {"workload": "w1", "batch": a.batch, "torch": torch.__version__,
           "gpu": torch.cuda.get_device_name(0), "steps_per_s": {}}
    for v in a.variants.split(","):
        sps = run(v, a.batch, a.steps)
        res["steps_per_s"][v] = sps
        print(f"pytorch w1 batch {a.batch} {v:>16}: {sps:8.1f} steps/s", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
