"""PyTorch's side of the ImageNet-like JPEG case (bench/jpeg_run.sh): ResNet-18
trained from JPEG files the way PyTorch users build it, on the same files the
service is fed (streamfeed-load --workload imagenet-jpeg: 500x375, quality 90):

    python3 bench/pytorch_jpeg.py --dir build/jpeg-cache/imagenet-jpeg-... --batch 256 --json out.json

torchvision.models.resnet18(num_classes=10), bf16 autocast, channels_last,
cross-entropy, SGD lr 1e-3 momentum 0.9. Per sample, as the service's list
[random_resized_crop 224 (antialias), horizontal_flip, to_dtype 1/255,
normalize ImageNet mean/std]. Variants (samples/s over --steps steps after
--warmup):
  dataloader_pil  torch DataLoader, --workers processes: PIL decode,
                  v2.RandomResizedCrop(224, antialias=True), RandomHorizontalFlip,
                  PILToTensor; pinned, copied to the GPU, normalised there
  gpu_decode      torchvision.io.decode_jpeg(list, device="cuda") per batch,
                  then v2.RandomResizedCrop(224, antialias=True) and
                  RandomHorizontalFlip per image on the GPU (each image has its
                  own crop), stacked and normalised there
A failing variant prints its error and the others run. One line per variant;
--json writes the records (variant, batch, samples_per_s, torch, gpu, ...).
"""
import argparse
import io
import json
import os
import time
import traceback

import torch
import torch.nn as nn

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def load_files(root):
    out = []
    for d, _, names in sorted(os.walk(root)):
        for n in sorted(names):
            if n.lower().endswith(".jpg"):
                out.append((open(os.path.join(d, n), "rb").read(), len(out) % 10))
    return out


class PilDataset(torch.utils.data.Dataset):
    def __init__(self, files):
        from torchvision.transforms import v2
        self.files = files
        self.tf = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip(),
                              v2.PILToTensor()])

    def __len__(self):
        return 1 << 30  # cycled: the loop takes what it needs

    def __getitem__(self, i):
        from PIL import Image
        data, label = self.files[i % len(self.files)]
        return self.tf(Image.open(io.BytesIO(data)).convert("RGB")), label


def train_setup(dev):
    import torchvision
    model = torchvision.models.resnet18(num_classes=10).to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    mean = torch.tensor(MEAN, device=dev).view(1, 3, 1, 1) * 255
    std = torch.tensor(STD, device=dev).view(1, 3, 1, 1) * 255
    lossf = nn.CrossEntropyLoss()

    def step(u8, labels):
        x = ((u8.float() - mean) / std).contiguous(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = lossf(model(x), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def run_dataloader_pil(a, files, dev):
    step = train_setup(dev)
    dl = torch.utils.data.DataLoader(PilDataset(files), batch_size=a.batch, num_workers=a.workers,
                                     pin_memory=True, persistent_workers=True, prefetch_factor=4)
    it = iter(dl)
    t0 = None
    for k in range(a.warmup + a.steps):
        if k == a.warmup:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        x, y = next(it)
        step(x.to(dev, non_blocking=True), y.to(dev, non_blocking=True))
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def run_gpu_decode(a, files, dev):
    from torchvision.io import ImageReadMode, decode_jpeg
    from torchvision.transforms import v2
    step = train_setup(dev)
    tf = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()])
    data = [torch.frombuffer(bytearray(f), dtype=torch.uint8) for f, _ in files]
    labels = torch.tensor([y for _, y in files])
    t0 = None
    for k in range(a.warmup + a.steps):
        if k == a.warmup:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        idx = [(k * a.batch + i) % len(data) for i in range(a.batch)]
        imgs = decode_jpeg([data[i] for i in idx], mode=ImageReadMode.RGB, device=dev)
        x = torch.stack([tf(im) for im in imgs])
        step(x, labels[idx].to(dev, non_blocking=True))
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    ap.add_argument("--variants", default="dataloader_pil,gpu_decode")
    ap.add_argument("--json")
    a = ap.parse_args()
    dev = "cuda"
    torch.backends.cudnn.benchmark = True
    files = load_files(a.dir)
    if not files:
        raise SystemExit(f"no *.jpg under {a.dir}")
    gpu = torch.cuda.get_device_name(0)
    recs = []
    for v in a.variants.split(","):
        fn = {"dataloader_pil": run_dataloader_pil, "gpu_decode": run_gpu_decode}[v]
        try:
            sec = fn(a, files, dev)
            sps = a.steps * a.batch / sec
            rec = {"variant": v, "batch": a.batch, "samples_per_s": sps, "steps": a.steps,
                   "workers": a.workers if v == "dataloader_pil" else 0, "files": len(files),
                   "torch": torch.__version__, "gpu": gpu}
            print(f"pytorch_jpeg {v} batch {a.batch}: {sps:.0f} samples/s"
                  + (f" ({a.workers} workers)" if v == "dataloader_pil" else ""), flush=True)
        except Exception as e:  # report and go on with the other variant
            traceback.print_exc()
            rec = {"variant": v, "batch": a.batch, "error": f"{type(e).__name__}: {e}"}
            print(f"pytorch_jpeg {v}: failed: {rec['error']}", flush=True)
        recs.append(rec)
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(recs, f, indent=1)


if __name__ == "__main__":
    main()
