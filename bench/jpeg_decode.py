"""PyTorch's side of the JPEG decode benchmark (bench/jpeg_run.sh): the same
files as build/bench/jpeg_decode decodes with nvJPEG, decoded by

- torchvision.io.decode_jpeg(list, device="cuda"): PyTorch's batched GPU
  decode (nvJPEG underneath), batches of --batch files, timed like
  jpeg_decode.cu: --warmup batches, then --iters batches up to a
  torch.cuda.synchronize() after the last one;
- PIL: Image.open(...).convert("RGB") plus the copy to a numpy array, one
  process on one core, for --pil-seconds; the figure is images/s per core.

    python3 bench/jpeg_decode.py --dir build/jpeg-cache/w1-jpeg-... --batch 32,256 --label w1_256

Prints one human line and one JSON line per measurement; a decoder that cannot
run here (no torchvision, no CUDA) is reported, not fatal.
"""
import argparse
import io
import json
import os
import time

import numpy as np


def load_files(root):
    paths = []
    for d, _, names in os.walk(root):
        paths += [os.path.join(d, n) for n in names if n.lower().endswith(".jpg")]
    paths.sort()
    return [open(p, "rb").read() for p in paths]


def emit(rec, human):
    print(human, flush=True)
    print(json.dumps(rec), flush=True)


def bench_torchvision(files, batch, iters, warmup, label):
    try:
        import torch
        import torchvision
        from torchvision.io import ImageReadMode, decode_jpeg
    except ImportError as e:
        emit({"bench": "jpeg_decode", "label": label, "decoder": "torchvision_cuda", "batch": batch,
              "available": False, "why": str(e)}, f"{label} torchvision cuda batch {batch}: unavailable ({e})")
        return
    if not torch.cuda.is_available():
        emit({"bench": "jpeg_decode", "label": label, "decoder": "torchvision_cuda", "batch": batch,
              "available": False, "why": "no CUDA"}, f"{label} torchvision cuda batch {batch}: no CUDA")
        return
    data = [torch.frombuffer(bytearray(f), dtype=torch.uint8) for f in files]
    nb = (len(data) + batch - 1) // batch
    batches = [[data[(k * batch + i) % len(data)] for i in range(batch)] for k in range(nb)]
    for it in range(warmup):
        decode_jpeg(batches[it % nb], mode=ImageReadMode.RGB, device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for it in range(iters):
        decode_jpeg(batches[it % nb], mode=ImageReadMode.RGB, device="cuda")
    torch.cuda.synchronize()
    sec = time.perf_counter() - t0
    ips = iters * batch / sec
    emit({"bench": "jpeg_decode", "label": label, "decoder": "torchvision_cuda", "batch": batch,
          "images_per_s": ips, "ms_per_batch": sec / iters * 1e3, "iters": iters, "files": len(files),
          "torch": torch.__version__, "torchvision": torchvision.__version__},
         f"{label} torchvision.io.decode_jpeg(cuda) batch {batch}: {ips:.0f} images/s "
         f"({sec / iters * 1e3:.2f} ms a batch; torch {torch.__version__}, torchvision {torchvision.__version__})")


def bench_pil(files, seconds, label):
    try:
        import PIL
        from PIL import Image
    except ImportError as e:
        emit({"bench": "jpeg_decode", "label": label, "decoder": "pil", "available": False, "why": str(e)},
             f"{label} PIL: unavailable ({e})")
        return
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for f in files[:64]:
            np.asarray(Image.open(io.BytesIO(f)).convert("RGB"))
            n += 1
    sec = time.perf_counter() - t0
    emit({"bench": "jpeg_decode", "label": label, "decoder": "pil", "images_per_s_per_core": n / sec,
          "images": n, "pil": PIL.__version__},
         f"{label} PIL (1 core): {n / sec:.0f} images/s (Pillow {PIL.__version__})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--batch", default="32,256")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--pil-seconds", type=float, default=3.0)
    ap.add_argument("--label", default="jpeg")
    a = ap.parse_args()
    files = load_files(a.dir)
    if not files:
        raise SystemExit(f"no *.jpg under {a.dir}")
    print(f"{a.label}: {len(files)} files, {sum(map(len, files)) / len(files) / 1024:.1f} KB average", flush=True)
    for b in (int(x) for x in a.batch.split(",")):
        bench_torchvision(files, b, a.iters, a.warmup, a.label)
    bench_pil(files, a.pil_seconds, a.label)


if __name__ == "__main__":
    main()
