"""The numerics gate of bench/families_run.sh: before a family's speed is
measured, one step of the exported model on the service, at the benchmark's
precision and input size, is compared with PyTorch's float32 step of the same
module from the same weights and batch. A family that fails gets no speed
figure: a throughput of a model that computes the wrong thing is worse than
none (a bf16 stem once ran a wrong convolution for a day while every
benchmark reported its speed).

    python3 bench/families_check.py --bin build/streamfeed --status OUT --size 224 resnet50 vit_b_16 ...

writes OUT/NAME/check.json per family and exits 1 when any failed. With
--preset it checks the service's own preset of that name instead, started
from its PyTorch module's weights (bench/torch_interop.py: W1's
seed-classifier in bench/run.sh, W2's seed-encdec in bench/w2_run.sh, W3's
resnet18 in bench/w3_run.sh). A model whose output is [N, C, H, W] is
trained on a label per pixel.

What is compared, from torchvision.models.NAME(num_classes=1000) (vit_* at
--size), seeded, exported here with streamfeed.export.export_model:

- eval logits of one batch at the initial weights (the forward pass);
- the loss of one training batch, and the gradient of every parameter from
  that step, read back as SGD's momentum buffer (after one step it is the
  gradient itself; weight decay 0), per tensor and all together (the
  backward pass: a lost gradient is 100 % off);
- batchnorm's running statistics after that step (the batch statistics).

Each against PyTorch's float32 forward and backward on the GPU (TF32 off;
on the CPU where there is none, to smoke-test the script).
The bound of each comparison is a floor (FLOORS, by the service's
precision), or four times the distance of PyTorch's own low-precision run
from that float32 run, whichever is larger: for a service in bf16, PyTorch's
bf16 autocast (channels_last for the CNNs, as its side of the table runs);
in tf32, PyTorch with TF32 on; in fp32, PyTorch's float32 on the CPU. The
service is asked to be as close as PyTorch's own other run is, not closer.
A parameter's gradient may also be as far as four times that run's distance
on all the checked gradients together: one tensor's distance is one draw of
the rounding noise, and a small draw alone should not fail a layer. And any
quantity may be as far as four times the float32 reference's own distance
from a float64 run of the same module (the exact value, near enough): a
gradient that is zero in exact arithmetic (HGNetV2's LearnableAffineBlock
bias before a convolution and a batchnorm: 1e-17 in float64) is rounding
noise in every float32 run, and two float32 runs that happen to share their
noise (PyTorch's CPU and GPU) would otherwise bound the service by it.
A tensor whose bound reaches UNCHECKED_AT is counted as unchecked (reported,
not failed): PyTorch's own run tells nothing about it. bf16 alone leaves many of a deep
network's gradients unchecked at its first step (PyTorch's own bf16
gradients of resnet50 are more than 17.5 % off float32 for 159 of its 270
tensors at batch 32); bench/families_run.sh checks fp32 too, whose bounds
catch a gradient lost or misrouted in the graph, whatever the precision.

The exported model differs from the benchmark's in one way: dropout and
stochastic depth are set to p=0 (the exporter leaves them out), since they
draw from the service's RNG and PyTorch's draws differ. And parameters that
torchvision initialises to zero with two or more dimensions (ViT's head) are
drawn from N(0, 0.02): a zero head makes every gradient before it zero, and
the check would see only the head.
"""
import argparse
import copy
import json
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "client", "python"))
sys.path.insert(0, HERE)

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
PIPELINE = [{"op": "to_dtype", "scale": 1 / 255}, {"op": "normalize", "mean": MEAN, "std": STD}]
# The bound's floors by the service's precision, and the PyTorch run whose
# distance from float32 on the GPU sets the bound above them: bf16 against
# bf16 autocast; tf32 against PyTorch with TF32 on; fp32 against PyTorch's
# float32 on the CPU (another summation order and other algorithms, as the
# service's own are: TF32 would be far noisier than a float32 service is,
# and leave most of a ResNet's gradients unchecked).
FLOORS = {"bf16": {"logits": 0.05, "loss": 0.02, "grad": 0.25, "grad_all": 0.1, "stats": 0.05},
          "tf32": {"logits": 0.01, "loss": 0.005, "grad": 0.05, "grad_all": 0.02, "stats": 0.01},
          "fp32": {"logits": 1e-3, "loss": 1e-3, "grad": 0.01, "grad_all": 5e-3, "stats": 1e-3}}
LOW_RUN = {"bf16": "bf16", "tf32": "tf32", "fp32": "cpu"}
UNCHECKED_AT = 0.7


def rel(got, want):
    got, want = np.asarray(got, np.float64).ravel(), np.asarray(want, np.float64).ravel()
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def build(torch, torchvision, family, size, seed, classes, preset):
    """The module: torchvision's family, or with preset the PyTorch
    definition of the service's preset of that name (bench/torch_interop.py:
    seed-classifier is W1's, resnet18 W3's)."""
    torch.manual_seed(seed)
    if preset:
        from torch_interop import torch_model
        model = torch_model(family)
    elif family.startswith("timm:"):  # timm's model NAME, its dropout and drop-path off as below
        import timm
        model = timm.create_model(family[5:], pretrained=False, num_classes=classes, drop_rate=0.0)
    else:
        kwargs = {"num_classes": classes}
        if family.startswith("vit_") and size != 224:
            kwargs["image_size"] = size
        model = getattr(torchvision.models, family)(**kwargs)
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout) or type(m).__name__ == "StochasticDepth":
            m.p = 0.0
        if type(m).__name__ == "DropPath":
            m.drop_prob = 0.0
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2 and not p.any():
                p.normal_(0.0, 0.02)
    return model


def as_input(torch, images, dev):
    x = torch.from_numpy(images).to(dev).permute(0, 3, 1, 2).float() / 255.0
    return (x - torch.tensor(MEAN, device=dev).view(1, 3, 1, 1)) / torch.tensor(STD, device=dev).view(1, 3, 1, 1)


def torch_side(torch, model, eval_images, images, labels, mode, dev):
    """PyTorch's eval logits, loss, gradients and buffers after one training
    forward on dev: mode "fp32" (TF32 off), "tf32" (TF32 on: another
    rounding of float32 work), "cpu" (float32 on the CPU), "fp64" (float64:
    the exact values, near enough) or "bf16" (bf16 autocast, channels_last
    for the CNNs, as PyTorch's side of the table runs)."""
    F = torch.nn.functional
    other = mode in ("tf32", "cpu") and dev == "cpu"
    dev = "cpu" if mode == "cpu" else dev
    m = copy.deepcopy(model).to(dev)
    wide = mode == "fp64"
    if wide:
        m = m.double()
    cl = mode == "bf16" and not type(model).__name__.startswith("Vision")
    if cl:
        m = m.to(memory_format=torch.channels_last)
    ctx = torch.autocast(dev, dtype=torch.bfloat16) if mode == "bf16" else torch.autocast(dev, enabled=False)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = mode == "tf32"
    # A CPU has no TF32: one thread instead of several sums in another order,
    # which is what the comparison needs (quantities that are zero in exact
    # arithmetic, like the batch mean of a convolution of a batchnorm's
    # output, come out as rounding noise, and no bound on them means anything).
    threads = torch.get_num_threads()
    if other:
        torch.set_num_threads(1)

    def inp(x):
        x = as_input(torch, x, dev)
        if wide:
            x = x.double()
        return x.contiguous(memory_format=torch.channels_last) if cl else x
    m.eval()
    with torch.no_grad(), ctx:
        logits = m(inp(eval_images)).double().cpu().numpy()
    m.train()
    with ctx:
        y = m(inp(images))  # the loss in float32 (bf16 autocast's logits), in float64 for fp64
        loss = F.cross_entropy(y if wide else y.float(), torch.from_numpy(labels).long().to(dev))
    loss.backward()
    keep = (lambda t: t.double()) if wide else (lambda t: t.float())  # noqa: E731
    grads = {n: keep(p.grad).cpu().numpy() for n, p in m.named_parameters() if p.grad is not None}
    bufs = {n: keep(b).cpu().numpy() for n, b in m.named_buffers() if b.is_floating_point()}
    out = {"logits": logits, "loss": float(loss.detach()), "grads": grads, "buffers": bufs}
    del m
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.set_num_threads(threads)
    if dev == "cuda":
        torch.cuda.empty_cache()
    return out


def service_side(a, model_args, precision, batch, eval_images, images, labels):
    import requests
    from safetensors.numpy import load as st_load
    from streamfeed.testing import LocalServer
    size = images.shape[1]
    args = model_args + [
        "--model.precision", precision, "--model.max_batch", str(batch),
        "--augment.pipeline", json.dumps(PIPELINE), "--augment.eval_pipeline", json.dumps(PIPELINE),
        "--optim.name", "sgd", "--optim.lr", "0.001", "--optim.momentum", "0.9", "--optim.weight_decay", "0",
        "--optim.schedule", "constant", "--log.requests", "false",
        "--ring.slot_bytes", str(images.nbytes + labels.nbytes + 65536)]
    with LocalServer(os.path.abspath(a.bin), args, start_timeout=a.start_timeout) as srv:
        try:
            c = srv.client(timeout=a.step_timeout, wait_timeout=a.step_timeout)
            logits = np.asarray(c.logits(eval_images, np.zeros_like(labels)), np.float32)
            r = c.post_batch(images, labels, wait=True)
            ck = requests.get(srv.url + "/v1/checkpoint?optimizer=true", timeout=a.step_timeout)
            if ck.status_code != 200:
                raise RuntimeError(f"GET /v1/checkpoint: {ck.status_code} {ck.text[:300]}")
            state = st_load(ck.content)
        except Exception as e:
            raise RuntimeError(f"{e}; the server's log ends: {srv.stderr()[-1500:]}") from e
    return {"logits": logits, "loss": float(r.loss), "state": state}


def compare(sf, ref, low, floors, exact=None):
    """The comparisons, each {"what", "rel", "bound", "pytorch_rel",
    "reference_rel"} (pytorch_rel: PyTorch's own low-precision run's distance;
    reference_rel: the float32 reference's from exact, the float64 run, when
    there is one); a failed one has ok False."""
    out = []

    def own_error(want, exactv):
        """The reference's distance from the float64 run's value (0 without one)."""
        return 0.0 if exactv is None else rel(want, exactv)

    def one(what, got, want, lowv, floor, noise=0.0, exactv=None):
        spread, own = rel(lowv, want), own_error(want, exactv)
        bound = max(floor, 4 * spread, 4 * own)
        r = rel(got, want)
        out.append({"what": what, "rel": r, "bound": max(bound, 4 * noise), "pytorch_rel": spread,
                    "reference_rel": own, "ok": r <= max(bound, 4 * noise), "unchecked": bound >= UNCHECKED_AT})
    ex = exact or {"logits": None, "loss": None, "grads": {}, "buffers": {}}
    one("eval logits", sf["logits"], ref["logits"], low["logits"], floors["logits"], exactv=ex["logits"])
    one("loss", [sf["loss"]], [ref["loss"]], [low["loss"]], floors["loss"],
        exactv=None if exact is None else [ex["loss"]])
    missing = [n for n in ref["grads"] if f"optim.{n}.momentum_buffer" not in sf["state"]]
    if missing:
        raise RuntimeError(f"the checkpoint has no momentum buffer of {missing[:5]}")
    g = {n: sf["state"][f"optim.{n}.momentum_buffer"] for n in ref["grads"]}
    # All gradients together, of the tensors PyTorch's own run can check one
    # by one: a tensor that is zero in exact arithmetic (the bias of a
    # batchnorm whose output a convolution feeds to another batchnorm) is
    # rounding noise on every side, and its noise would outweigh the rest
    # (resnet50's first-step gradients, all together, are 65 % apart between
    # PyTorch's TF32 and float32 runs).
    checked = [n for n in ref["grads"]
               if max(floors["grad"], 4 * rel(low["grads"][n], ref["grads"][n]),
                      4 * own_error(ref["grads"][n], ex["grads"].get(n))) < UNCHECKED_AT] or list(ref["grads"])
    cat = lambda d: np.concatenate([d[n].ravel().astype(np.float64) for n in checked])  # noqa: E731
    noise = rel(cat(low["grads"]), cat(ref["grads"]))
    # A tensor may be as far from float32 as four times PyTorch's own distance
    # on it, or on all the checked gradients together: one tensor's distance
    # is one draw of the rounding noise, and a layer where that draw was small
    # would fail on noise (densenet121's denselayer13 in block 4, fp32 on the
    # H200: 4.1 times PyTorch's CPU distance on that layer, 2.2 times on all
    # gradients). A lost or misrouted gradient is off by its whole size, far
    # beyond either.
    for n in ref["grads"]:
        one(f"gradient of {n}", g[n], ref["grads"][n], low["grads"][n], floors["grad"], noise, ex["grads"].get(n))
    one(f"all gradients ({len(checked)} tensors)", cat(g), cat(ref["grads"]), cat(low["grads"]),
        floors["grad_all"], exactv=None if exact is None else cat(ex["grads"]))
    for n, want in ref["buffers"].items():
        if n in sf["state"]:
            one(f"buffer {n}", sf["state"][n], want, low["buffers"][n], floors["stats"],
                exactv=ex["buffers"].get(n))
    return out


def model_args(a, torch, model, family, batch, out):
    """The service's flags that choose the model: the module exported into
    out, or with --preset the service's own preset of the family's name
    started from the module's weights."""
    if a.preset:
        from safetensors.torch import save_file
        os.makedirs(out)
        path = os.path.join(out, "init.safetensors")
        save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, path)
        return ["--model.preset", family, "--model.init_from", path]
    from streamfeed.export import export_model
    export_model(model, (batch, 3, a.size, a.size), out, recipe=None)
    return ["--config", os.path.join(out, "config.json")]


def check(a, torch, torchvision, family):
    t0 = time.monotonic()
    size, batch = a.size, a.batch
    model = build(torch, torchvision, family, size, a.seed, a.classes, a.preset)
    with torch.no_grad():
        out_shape = tuple(model.eval()(torch.zeros(1, 3, size, size)).shape)
    rng = np.random.default_rng(a.seed)
    eval_images = rng.integers(0, 256, (batch, size, size, 3), dtype=np.uint8)
    images = rng.integers(0, 256, (batch, size, size, 3), dtype=np.uint8)
    # a [N, classes, H, W] output segments: a label per pixel (W2's seed-encdec)
    classes = out_shape[1]
    labels = rng.integers(0, classes, (batch,) + out_shape[2:]).astype(np.int64)
    sfs = {}
    with tempfile.TemporaryDirectory(prefix="streamfeed-check-") as d:
        margs = model_args(a, torch, model, family, batch, os.path.join(d, "model"))
        for prec in a.precision.split(","):
            sfs[prec] = service_side(a, margs, prec, batch, eval_images, images, labels)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ref = torch_side(torch, model, eval_images, images, labels, "fp32", dev)
    exact = torch_side(torch, model, eval_images, images, labels, "fp64", dev)
    lows = {m: torch_side(torch, model, eval_images, images, labels, m, dev) for m in {LOW_RUN[p] for p in sfs}}
    rows = [dict(r, what=f"{prec}: {r['what']}") for prec, sf in sfs.items()
            for r in compare(sf, ref, lows[LOW_RUN[prec]], FLOORS[prec], exact)]
    failed = [r for r in rows if not r["ok"]]
    summary = [r for r in rows if r["what"].split(": ", 1)[1].startswith(("eval logits", "loss", "all gradients"))]
    worst = sorted((r for r in rows if not r["unchecked"]), key=lambda r: r["rel"] / r["bound"], reverse=True)[:5]
    return {"family": family, "ok": not failed, "precision": a.precision, "size": size, "batch": batch,
            "classes": classes, "preset": a.preset, "seed": a.seed, "seconds": round(time.monotonic() - t0, 1),
            "compared": len(rows), "unchecked": sum(r["unchecked"] for r in rows), "failed": failed,
            "summary": summary,
            "worst": worst, "unchecked_what": [r["what"] for r in rows if r["unchecked"]][:40],
            "error": None if not failed else
            f"{len(failed)} of {len(rows)} comparisons out of bounds, first: {failed[0]['what']} "
            f"{failed[0]['rel']:.2e} > {failed[0]['bound']:.2e}"}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build/streamfeed")
    ap.add_argument("--status", required=True, help="results directory: OUT/NAME/check.json per family")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--precision", default="bf16", help="model.precision, or a comma list (a server each): "
                    + ", ".join(FLOORS))
    ap.add_argument("--classes", type=int, default=1000,
                    help="num_classes of the torchvision module (a preset has its own)")
    ap.add_argument("--preset", action="store_true",
                    help="train the service's model.preset of the family's name (seed-classifier: W1, resnet18: "
                         "W3) from its PyTorch module's weights (bench/torch_interop.py) instead of exporting a "
                         "torchvision module")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--start-timeout", type=float, default=120.0)
    ap.add_argument("--step-timeout", type=float, default=120.0)
    ap.add_argument("families", nargs="+")
    a = ap.parse_args(argv)
    bad = [p for p in a.precision.split(",") if p not in FLOORS]
    if bad:
        ap.error(f"--precision: {bad[0]} is not one of {', '.join(FLOORS)}")
    import torch
    import torchvision
    failed = 0
    for fam in a.families:
        try:
            res = check(a, torch, torchvision, fam)
        except Exception as e:  # the family's row says why; the others still run
            res = {"family": fam, "ok": False, "error": f"{type(e).__name__}: {str(e)[:1500]}"}
        d = os.path.join(a.status, fam.replace(":", "-"))  # timm:NAME in timm-NAME: no colon in a path
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "check.json"), "w") as f:
            json.dump(res, f, indent=1)
        w = res.get("worst") or []
        print(f"check {fam}: {'ok' if res['ok'] else 'FAILED: ' + str(res['error'])}"
              + (f" ({res['compared']} comparisons, {res['unchecked']} unchecked, {res['seconds']} s; closest to its"
                 f" bound: {w[0]['what']} {w[0]['rel']:.2e} of {w[0]['bound']:.2e})" if w else ""), flush=True)
        failed |= not res["ok"]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
