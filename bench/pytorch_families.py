"""PyTorch's side of the families' speed and memory table (bench/families_run.sh):
one torchvision model trained the way the PyTorch literature writes it, each
variant in a fresh process of its own so that its peak device memory, as NVML
reports it for that process (bench/nvml_peak.py, the method of
bench/memory_peak.sh), is its own.

    python3 bench/pytorch_families.py --family resnet50 --batch 256 --json out.json

The model is torchvision.models.FAMILY(num_classes=1000) (vit_* also
image_size=--size when it is not 224), random init, in training mode at its
default configuration (dropout and stochastic depth as torchvision sets
them). One uint8 batch of --size x --size images and its labels sit on the
device (model-only: PyTorch's best case, no input pipeline); each step
normalises it there ((x/255 - mean)/std, ImageNet's), forward under bf16
autocast, cross-entropy, backward, optimizer step with
zero_grad(set_to_none=True). CNNs train with SGD lr 1e-3 momentum 0.9,
vit_* with AdamW lr 1e-3 weight decay 0.01, both with --optim-impl (fused
by default on CUDA: PyTorch's fastest optimizer step).

Variants (--variants, default all):
  eager    bf16 autocast; CNNs in channels_last (the batch stored NHWC, the
           model converted); a ViT as it is (its attention is
           F.scaled_dot_product_attention already)
  compile  the same with torch.compile(model) (--compile-mode)
Samples/s over --steps steps after --warmup untimed ones (which include the
compilation). A variant that fails or passes --timeout reports no figure and
the others still run; the exit status is 1 when any failed. --json writes a
list of records (variant, samples_per_s, peak_process_mib, ...), rewritten
after each variant. --device cpu runs the same code on the CPU: a smoke test
of this script, not a benchmark.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nvml_peak import ProcessPeak, die_with_parent  # noqa: E402

CLASSES = 1000
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
VARIANTS = ("eager", "compile")


def is_vit(family):
    return family.startswith("vit_")


def make_model(family, size):
    """torchvision.models.FAMILY, or for ``timm:NAME`` timm's model NAME at
    its default configuration (the library most users' image models come
    from; its modules export through the same exporter)."""
    if family.startswith("timm:"):
        import timm
        return timm.create_model(family[5:], pretrained=False, num_classes=CLASSES)
    import torchvision
    kwargs = {"num_classes": CLASSES}
    if is_vit(family) and size != 224:
        kwargs["image_size"] = size
    return getattr(torchvision.models, family)(**kwargs)


def run_one(a):
    """One variant in this process; returns its record."""
    import torch
    import torch.nn as nn
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    torch.backends.cudnn.benchmark = True
    channels_last = not is_vit(a.family)
    torch.manual_seed(0)
    model = make_model(a.family, a.size).to(dev).train()
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    impl = {} if not cuda or a.optim_impl == "default" else {a.optim_impl: True}
    if is_vit(a.family):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, **impl)
        optim = "adamw"
    else:
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, **impl)
        optim = "sgd momentum 0.9"
    crit = nn.CrossEntropyLoss()
    fwd = torch.compile(model, mode=a.compile_mode) if a.variant == "compile" else model
    g = torch.Generator(device="cpu").manual_seed(0)
    raw = torch.randint(0, 256, (a.batch, a.size, a.size, 3), dtype=torch.uint8, generator=g).to(dev)
    raw = raw.permute(0, 3, 1, 2)  # NCHW view of NHWC storage, as the images arrive
    if not channels_last:
        raw = raw.contiguous()
    labels = torch.randint(0, CLASSES, (a.batch,), generator=g).to(dev)
    mean = torch.tensor(MEAN, device=dev).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=dev).view(1, 3, 1, 1)

    def step():
        x = (raw.float() / 255 - mean) / std  # elementwise: the memory format stays
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = crit(fwd(x), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    t = time.perf_counter()
    first_step_s = None
    loss = None
    for i in range(a.warmup):
        loss = step()
        if i == 0:
            sync()
            first_step_s = time.perf_counter() - t
    sync()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    sync()
    wall = time.perf_counter() - t0
    return {"family": a.family, "variant": a.variant, "batch": a.batch, "size": a.size,
            "samples_per_s": a.steps * a.batch / wall, "ms_per_step": 1e3 * wall / a.steps,
            "memory_format": "channels_last" if channels_last else "contiguous",
            "precision": "bf16 autocast", "optimizer": optim, "optim_impl": a.optim_impl if cuda else "default",
            "compile": a.compile_mode if a.variant == "compile" else None,
            "warmup": a.warmup, "steps": a.steps, "first_step_s": first_step_s,
            "last_loss": float(loss) if loss is not None else None,
            "torch_peak_allocated_mib": torch.cuda.max_memory_allocated(dev) / 2**20 if cuda else None,
            "torch": torch.__version__, "torchvision": __import__("torchvision").__version__,
            "cudnn": torch.backends.cudnn.version() if cuda else None,
            "gpu": torch.cuda.get_device_name(dev) if cuda else "cpu"}


def child_args(a, variant, out):
    return [sys.executable, os.path.abspath(__file__), "--one", "--family", a.family, "--variant", variant,
            "--batch", str(a.batch), "--size", str(a.size), "--steps", str(a.steps), "--warmup", str(a.warmup),
            "--compile-mode", a.compile_mode, "--optim-impl", a.optim_impl, "--device", a.device, "--json", out]


def run_variant(a, variant):
    """variant in a fresh process, its peak device memory sampled by NVML."""
    fd, out = tempfile.mkstemp(prefix=f"pt-{a.family}-{variant}-", suffix=".json")
    os.close(fd)
    peak = ProcessPeak()
    t = time.monotonic()
    proc = subprocess.Popen(child_args(a, variant, out), preexec_fn=die_with_parent)
    peak.start(proc.pid)
    try:
        rc = proc.wait(timeout=a.timeout or None)
        error = None if rc == 0 else f"exit {rc}"
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        error = f"--timeout {a.timeout:g} s passed"
    except BaseException:  # SIGTERM from an outer timeout: no child is left on the device
        proc.kill()
        proc.wait()
        raise
    finally:
        peak.stop()
    rec = {"family": a.family, "variant": variant, "batch": a.batch, "size": a.size, "samples_per_s": None}
    try:
        with open(out) as f:
            rec.update(json.load(f))
    except (OSError, ValueError):
        pass
    os.unlink(out)
    if rec.get("error"):
        error = rec["error"]
    if error:
        rec["samples_per_s"] = None
        rec["error"] = error
    rec["wall_s"] = time.monotonic() - t
    rec.update(peak.record())
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[2:]))
    ap.add_argument("--family", required=True, help="a torchvision.models factory (resnet50, vit_b_16, ...) or timm:NAME")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--size", type=int, default=224, help="image height and width")
    ap.add_argument("--steps", type=int, default=30, help="timed steps")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps first, compilation included")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {','.join(VARIANTS)}")
    ap.add_argument("--compile-mode", default="default",
                    help="torch.compile mode: default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs")
    ap.add_argument("--optim-impl", default="fused", choices=("fused", "foreach", "default"),
                    help="the optimizer's implementation on CUDA (default fused)")
    ap.add_argument("--timeout", type=float, default=0, help="seconds one variant may take (0: no limit)")
    ap.add_argument("--device", default="cuda", help="cuda; cpu only as a smoke test of this script")
    ap.add_argument("--json")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.batch < 1 or a.size < 1 or a.steps < 1 or a.warmup < 0:
        ap.error("--batch, --size and --steps must be positive, --warmup not negative")

    if a.one:  # the child: one variant, its record (or its error) into --json
        try:
            rec = run_one(a)
        except Exception as e:  # noqa: BLE001 (the parent reports it as this variant's failure)
            traceback.print_exc()
            rec = {"error": f"{type(e).__name__}: {e}"[:2000]}
        with open(a.json, "w") as f:
            json.dump(rec, f)
        return 1 if "error" in rec else 0

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    variants = [v for v in a.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v} (known: {', '.join(VARIANTS)})")
    print(f"pytorch {a.family}: batch {a.batch}, {a.size}x{a.size}, {a.warmup} warm-up + {a.steps} timed steps, "
          f"variants {','.join(variants)}", flush=True)
    results = []
    for v in variants:
        r = run_variant(a, v)
        if r["samples_per_s"]:
            print(f"pytorch {a.family} batch {a.batch} {v:>8}: {r['samples_per_s']:9.1f} samples/s "
                  f"{r['ms_per_step']:8.2f} ms/step, peak {r['peak_process_mib']} MiB (first step "
                  f"{r['first_step_s']:.1f} s, {r['wall_s']:.0f} s in all)", flush=True)
        else:
            print(f"pytorch {a.family} batch {a.batch} {v:>8}: FAILED {r['error'][:300]}", flush=True)
        results.append(r)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(results, f, indent=1)
    return 0 if all(r["samples_per_s"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
