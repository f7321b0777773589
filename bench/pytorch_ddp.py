"""PyTorch DistributedDataParallel for the workloads streamfeed's data-parallel
job runs (bench/multi_gpu_run.sh runs both in one session):

    torchrun --nproc_per_node G bench/pytorch_ddp.py --workload w3 --batch 256 --json out.json

One process per GPU, NCCL, the model wrapped in DDP (gradients all-reduced in
buckets overlapped with the backward, BatchNorm statistics per rank: DDP's
defaults). Every rank trains on its own device-cached uint8 batch (a
different random batch per rank, normalised on the GPU each step), so the
figure is the training step with its all-reduce and no input pipeline, like
streamfeed's cached stages.

  w3  torchvision resnet18(num_classes=10), 224x224 from 32x32 uint8 images
      upscaled once, bf16 autocast, SGD lr 1e-3 momentum 0.9 (bench/pytorch_w3.py)
  w1  the seed classifier (bench/pytorch_w1.py's make_model), 256x256, TF32,
      SGD lr 1e-3, without W1's augmentation (streamfeed's cached step stage
      has none either)

Variants, best reported: eager and torch.compile, each channels_last (the
faster layout for these convolutions on tensor cores). samples/s is the sum
over the ranks (global batch = G x --batch per step) after --warmup steps,
which include compilation. Rank 0 prints one JSON line per variant and, with
--json, writes the list. --device cpu runs the same code with the gloo backend
on the CPU: a smoke test of this script, not a benchmark.
"""
import argparse
import json
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CLASSES = 10


def make(workload, dev, batch, rank):
    """(model, uint8 NCHW batch on dev in channels_last storage, labels, image side, bf16)."""
    g = torch.Generator(device="cpu").manual_seed(1000 + rank)
    if workload == "w3":
        import torchvision
        model = torchvision.models.resnet18(num_classes=CLASSES)
        small = torch.randint(0, 256, (batch, 3, 32, 32), dtype=torch.uint8, generator=g).to(dev)
        img = F.interpolate(small.float(), size=(224, 224), mode="bilinear", align_corners=False)
        img = img.round_().clamp_(0, 255).to(torch.uint8)
        bf16 = True
    else:
        from pytorch_w1 import make_model
        model = make_model()
        img = torch.randint(0, 256, (batch, 3, 256, 256), dtype=torch.uint8, generator=g).to(dev)
        bf16 = False
    img = img.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, CLASSES, (batch,), generator=g).to(dev)
    return model, img, labels, bf16


def run(variant, a, dev, rank, world):
    torch.manual_seed(0)  # the same initial parameters on every rank (DDP broadcasts rank 0's anyway)
    model, img, labels, bf16 = make(a.workload, dev, a.batch, rank)
    model = model.to(dev).to(memory_format=torch.channels_last)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3, momentum=0.9 if a.workload == "w3" else 0.0)
    net = torch.compile(ddp) if variant == "compile" else ddp

    def step():
        x = (img.float() / 255 - 0.5) / 0.5
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(net(x), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    dist.barrier()
    wall = time.perf_counter() - t0
    # The slowest rank's time is the job's.
    t = torch.tensor([wall], device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    wall = float(t.item())
    return {"variant": variant, "workload": a.workload, "world_size": world, "batch_per_rank": a.batch,
            "steps": a.steps, "seconds": wall, "steps_per_s": a.steps / wall,
            "samples_per_s": a.steps * a.batch * world / wall, "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=["w1", "w3"], default="w3")
    p.add_argument("--batch", type=int, default=256, help="samples per rank per step")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--variants", default="eager,compile")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--json", help="rank 0 writes the records here")
    a = p.parse_args()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", 0))
    if a.device == "cuda":
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        dev = torch.device("cpu")
    dist.init_process_group("nccl" if a.device == "cuda" else "gloo")
    records = []
    for v in a.variants.split(","):
        try:
            r = run(v, a, dev, rank, world)
        except Exception:  # one failed variant (compilation, memory) does not end the run
            if rank == 0:
                traceback.print_exc()
            r = {"variant": v, "workload": a.workload, "world_size": world, "error": traceback.format_exc(limit=1)}
        if rank == 0:
            print(json.dumps(r), flush=True)
        records.append(r)
    ok = [r for r in records if "samples_per_s" in r]
    if rank == 0 and ok:
        best = max(ok, key=lambda r: r["samples_per_s"])
        print(json.dumps({"best": best["variant"], "workload": a.workload, "world_size": world,
                          "samples_per_s": best["samples_per_s"]}), flush=True)
    if rank == 0 and a.json:
        with open(a.json, "w") as f:
            json.dump(records, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
