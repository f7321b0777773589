"""W3 of shared/WORKLOADS.md (torchvision resnet18, batch 1024) written the way
the PyTorch literature writes it, to run in the same GPU session as streamfeed:

    python3 bench/pytorch_w3.py --batch 1024 --json out.json [--e2e]

torchvision.models.resnet18(num_classes=10), random init; input 224x224 uint8
(32x32 images upscaled, bilinear), normalised on the GPU ((x/255 - 0.5)/0.5);
cross-entropy, SGD lr=1e-3 momentum 0.9, zero_grad(set_to_none=True).

Variants (samples/s after --warmup steps, which include torch.compile's
compilation, over --steps steps; one uint8 batch and its labels sit on the GPU,
each step normalises it there, forward, loss, backward, optimizer step):
  eager          bf16 autocast, NCHW
  eager_cl       bf16 autocast, channels_last
  compile        bf16 autocast, NCHW, torch.compile(model) (--compile-mode)
  compile_cl     bf16 autocast, channels_last, torch.compile(model)
  fp32_eager_cl  no autocast: PyTorch's fp32 defaults (cuDNN convolutions in
                 TF32), channels_last; the reference line
  e2e            (with --e2e, or named in --variants) eager bf16 NCHW end to
                 end: 32x32 uint8 images upscaled to 224 in --workers DataLoader
                 workers, pinned, copied to the GPU, normalised there
A variant that fails (compilation, out of memory) prints its error and the
others still run. One line per variant; --json writes a list of records
(variant, batch, samples_per_s, steps_per_s, ms_per_step, peak_mem_gb, torch,
cudnn, gpu, ...). --device cpu runs the same code on the CPU (bf16 autocast
there): a smoke test of this script, not a benchmark.
"""
import argparse
import gc
import json
import time
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F

IMG, SRC, CLASSES = 224, 32, 10
LR, MOMENTUM = 1e-3, 0.9
VARIANTS = {  # name: (bf16 autocast, channels_last, torch.compile)
    "eager": (True, False, False),
    "eager_cl": (True, True, False),
    "compile": (True, False, True),
    "compile_cl": (True, True, True),
    "fp32_eager_cl": (False, True, False),
    "e2e": (True, False, False),
}
DEFAULT_VARIANTS = "eager,eager_cl,compile,compile_cl,fp32_eager_cl"


def make_model():
    import torchvision
    return torchvision.models.resnet18(num_classes=CLASSES)


def upscale(small):
    """uint8 [N,3,32,32] -> uint8 [N,3,224,224], bilinear (transforms.Resize(224)'s)."""
    x = F.interpolate(small.float(), size=(IMG, IMG), mode="bilinear", align_corners=False)
    return x.round_().clamp_(0, 255).to(torch.uint8)


def normalize(raw):
    """uint8 NCHW (any memory format) -> float, (x/255 - 0.5)/0.5; elementwise,
    so a channels_last input stays channels_last."""
    return (raw.float() / 255 - 0.5) / 0.5


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


class Timer:
    """Wall clock between two synchronize() calls (the figure reported) and
    CUDA events on the current stream over the same steps (a cross-check)."""

    def __init__(self, dev):
        self.dev = dev
        self.cuda = dev.type == "cuda"

    def start(self):
        sync(self.dev)
        if self.cuda:
            self.e0 = torch.cuda.Event(enable_timing=True)
            self.e1 = torch.cuda.Event(enable_timing=True)
            self.e0.record()
        self.t0 = time.perf_counter()

    def stop(self):
        if self.cuda:
            self.e1.record()
        sync(self.dev)
        wall = time.perf_counter() - self.t0
        ev = self.e0.elapsed_time(self.e1) / 1e3 if self.cuda else None
        return wall, ev


def cached_batch(batch, channels_last, dev):
    """The device-cached uint8 batch: 32x32 images upscaled to 224x224 on the
    GPU, kept as HWC images (permuted: a channels_last NCHW view) for the
    channels_last variants and as contiguous NCHW for the others."""
    g = torch.Generator(device="cpu").manual_seed(0)
    small = torch.randint(0, 256, (batch, 3, SRC, SRC), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, CLASSES, (batch,), generator=g)
    big = upscale(small.to(dev))
    if channels_last:
        big = big.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)  # NHWC storage
        assert big.is_contiguous(memory_format=torch.channels_last)
    else:
        big = big.contiguous()
    return big, labels.to(dev)


class Upscaled32(torch.utils.data.Dataset):
    """CIFAR-10-like: n random 32x32 RGB uint8 images, upscaled to 224x224 per
    sample in the worker (uint8 in, uint8 out); labels 0..9."""

    def __init__(self, n, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (n, 3, SRC, SRC), dtype=torch.uint8, generator=g)
        self.labels = torch.randint(0, CLASSES, (n,), generator=g)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        try:
            from torchvision.transforms.v2.functional import resize
        except ImportError:  # torchvision < 0.16
            from torchvision.transforms.functional import resize
        return resize(self.images[i], [IMG, IMG], antialias=True), int(self.labels[i])


def e2e_loader(a):
    ds = Upscaled32(a.e2e_images)
    return torch.utils.data.DataLoader(ds, batch_size=a.batch, shuffle=True, drop_last=True,
                                       num_workers=a.workers, pin_memory=a.device == "cuda",
                                       persistent_workers=a.workers > 0,
                                       prefetch_factor=a.prefetch if a.workers > 0 else None)


def run(variant, a, dev):
    bf16, cl, compiled = VARIANTS[variant]
    torch.manual_seed(0)
    model = make_model().to(dev).train()
    if cl:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    crit = nn.CrossEntropyLoss()
    fwd = torch.compile(model, mode=a.compile_mode) if compiled else model

    def train_step(raw, labels):
        x = normalize(raw)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            loss = crit(fwd(x), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    timer = Timer(dev)
    t_compile = time.perf_counter()
    if variant == "e2e":
        loader = e2e_loader(a)
        state = {"it": iter(loader)}

        def next_batch():
            try:
                x, y = next(state["it"])
            except StopIteration:  # next epoch (the workers persist)
                state["it"] = iter(loader)
                x, y = next(state["it"])
            return x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)

        step = lambda: train_step(*next_batch())  # noqa: E731
    else:
        raw, labels = cached_batch(a.batch, cl, dev)
        step = lambda: train_step(raw, labels)  # noqa: E731
    loss = None
    for i in range(a.warmup):
        loss = step()
        if i == 0:
            sync(dev)
            t_compile = time.perf_counter() - t_compile  # first step: compilation, cuDNN setup
    sync(dev)
    timer.start()
    for _ in range(a.steps):
        loss = step()
    wall, ev = timer.stop()
    last_loss = float(loss) if loss is not None else None
    peak = torch.cuda.max_memory_allocated(dev) / 1e9 if dev.type == "cuda" else None
    if variant == "e2e":
        del state, loader
    return {
        "variant": variant, "batch": a.batch, "samples_per_s": a.steps * a.batch / wall,
        "steps_per_s": a.steps / wall, "ms_per_step": 1e3 * wall / a.steps,
        "ms_per_step_cuda_events": 1e3 * ev / a.steps if ev is not None else None,
        "peak_mem_gb": peak, "precision": "bf16 autocast" if bf16 else "fp32 (TF32 convolutions)" if
        torch.backends.cudnn.allow_tf32 else "fp32", "memory_format": "channels_last" if cl else "nchw",
        "compile": a.compile_mode if compiled else None, "warmup": a.warmup, "steps": a.steps,
        "first_step_s": t_compile if a.warmup else None, "last_loss": last_loss,
        "workers": a.workers if variant == "e2e" else None,
    }


def cleanup(dev):
    gc.collect()
    try:
        torch._dynamo.reset()
    except Exception:  # noqa: BLE001 (best effort between variants)
        pass
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[2:]))
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=50, help="timed steps (WORKLOADS: >= 50)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps first, compilation included")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"comma list of {','.join(VARIANTS)}")
    ap.add_argument("--e2e", action="store_true", help="also run e2e (the DataLoader variant)")
    ap.add_argument("--workers", type=int, default=8, help="e2e: DataLoader workers")
    ap.add_argument("--prefetch", type=int, default=2, help="e2e: prefetch_factor per worker")
    ap.add_argument("--e2e-images", type=int, default=50000, help="e2e: dataset size (CIFAR-10's train set)")
    ap.add_argument("--compile-mode", default="default",
                    help="torch.compile mode: default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs")
    ap.add_argument("--no-cudnn-benchmark", action="store_true",
                    help="leave torch.backends.cudnn.benchmark off (PyTorch's default; on here by default)")
    ap.add_argument("--device", default="cuda", help="cuda; cpu only as a smoke test of this script")
    ap.add_argument("--json")
    a = ap.parse_args()
    variants = [v for v in a.variants.split(",") if v]
    if a.e2e and "e2e" not in variants:
        variants.append("e2e")
    for v in variants:
        if v not in VARIANTS:
            raise SystemExit(f"unknown variant {v} (known: {', '.join(VARIANTS)})")
    dev = torch.device(a.device)
    torch.backends.cudnn.benchmark = not a.no_cudnn_benchmark
    cuda = dev.type == "cuda"
    env = {"torch": torch.__version__, "torchvision": __import__("torchvision").__version__,
           "cudnn": torch.backends.cudnn.version() if cuda else None,
           "gpu": torch.cuda.get_device_name(dev) if cuda else "cpu",
           "cudnn_benchmark": torch.backends.cudnn.benchmark,
           "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
           "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32}
    print(f"pytorch w3: torch {env['torch']} cuDNN {env['cudnn']} on {env['gpu']}, batch {a.batch}, "
          f"{a.warmup} warm-up + {a.steps} timed steps, cudnn.benchmark={env['cudnn_benchmark']}", flush=True)
    results = []
    for v in variants:
        try:
            r = run(v, a, dev)
            extra = f" peak {r['peak_mem_gb']:5.1f} GB" if r["peak_mem_gb"] is not None else ""
            print(f"pytorch w3 batch {a.batch} {v:>13}: {r['samples_per_s']:9.1f} samples/s "
                  f"{r['steps_per_s']:7.2f} steps/s {r['ms_per_step']:8.2f} ms/step{extra}", flush=True)
        except Exception as e:  # noqa: BLE001 (one variant's failure must not stop the others)
            traceback.print_exc()
            r = {"variant": v, "batch": a.batch, "samples_per_s": None, "steps_per_s": None,
                 "ms_per_step": None, "peak_mem_gb": None, "error": f"{type(e).__name__}: {e}"[:2000]}
            print(f"pytorch w3 batch {a.batch} {v:>13}: FAILED {r['error'][:300]}", flush=True)
        r.update(env)
        results.append(r)
        cleanup(dev)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if all(r.get("samples_per_s") for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
