"""W2 of shared/WORKLOADS.md (frozen encoder, trainable decoder) written the way
the PyTorch literature writes it, to run in the same GPU session as streamfeed:

    python3 bench/pytorch_w2.py --batches 8,32,128 --json out.json

Variants (steps/s after 10 warm-up steps over --steps steps; uint8 batches and
labels already on the GPU, converted to float there, as WORKLOADS.md states):
  serial   encoder (no_grad) then decoder step, one stream
  streams  encoder of batch N+1 on one stream while the decoder trains batch N on another
  cached   decoder step only on cached encoder features (the upper bound)
PyTorch's defaults let cuDNN use TF32 for convolutions, like streamfeed's tf32.
"""
import argparse
import json
import time

import torch
import torch.nn as nn

IMG, CLASSES = 256, 10


def encoder():
    layers = [nn.Conv2d(3, 16, 1), nn.ReLU()]
    c = 16
    for _ in range(4):
        layers += [nn.Conv2d(c, 2 * c, 2, stride=2), nn.ReLU()]
        c *= 2
    return nn.Sequential(*layers)


def decoder():
    layers, c = [], 256
    for _ in range(4):
        layers += [nn.ConvTranspose2d(c, c // 2, 2, stride=2), nn.ReLU()]
        c //= 2
    layers.append(nn.Conv2d(16, CLASSES, 1))
    return nn.Sequential(*layers)


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
    enc, dec = encoder().to(dev).eval(), decoder().to(dev).train()
    enc.requires_grad_(False)
    opt = torch.optim.SGD(dec.parameters(), lr=1e-3)
    crit = nn.CrossEntropyLoss()
    raw = torch.randint(0, 256, (batch, 3, IMG, IMG), dtype=torch.uint8, device=dev)
    labels = torch.randint(0, CLASSES, (batch, IMG, IMG), device=dev)

    def dec_step(feats):
        opt.zero_grad(set_to_none=True)
        loss = crit(dec(feats), labels)
        loss.backward()
        opt.step()

    def features():
        with torch.no_grad():
            return enc(raw.float())

    if variant == "serial":
        return timed(lambda: dec_step(features()), steps)
    if variant == "cached":
        f = features()
        return timed(lambda: dec_step(f), steps)
    if variant == "streams":
        es, ds = torch.cuda.Stream(), torch.cuda.Stream()
        st = {}
        with torch.cuda.stream(es):
            st["next"] = features()
        st["ev"] = es.record_event()

        def step():
            ds.wait_event(st["ev"])
            cur = st["next"]
            with torch.cuda.stream(es):
                nxt = features()  # encoder of batch N+1
            ev = es.record_event()
            with torch.cuda.stream(ds):
                dec_step(cur)
            cur.record_stream(ds)  # the consuming stream keeps cur alive
            st["next"], st["ev"] = nxt, ev

        return timed(step, steps)
    raise SystemExit(f"unknown variant {variant}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="8,32,128")
    ap.add_argument("--variants", default="serial,streams,cached")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--json")
    a = ap.parse_args()
    res = {"workload": "w2", "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
           "steps_per_s": {}}
    for b in [int(x) for x in a.batches.split(",")]:
        for v in a.variants.split(","):
            sps = run(v, b, a.steps)
            res["steps_per_s"][f"b{b}_{v}"] = sps
            print(f"pytorch w2 batch {b} {v:>8}: {sps:8.1f} steps/s", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
