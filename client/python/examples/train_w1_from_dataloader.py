#!/usr/bin/env python3
"""Train streamfeed's W1 model from a torch DataLoader.

The dataset is synthetic and learnable: each 256x256x3 uint8 image is one of
ten colours (its label) plus uniform noise in [-40, 40], generated per index
from a seed, so the DataLoader's worker processes produce the same data on
every run. The loader yields uint8 NHWC batches ([B,256,256,3]) exactly as a
real decoding loader would; streamfeed.Client.feed uploads them over several
connections while the server augments and trains on its GPU. Then a held-out
set (another seed) is scored as the evaluation "holdout" (Client.evaluate)
and its sample-weighted loss and top-1 printed (Client.eval_summary).

Run a server with the W1 model (``make run`` on a GPU host, or
``build/streamfeed --model.preset seed-classifier``), then::

    pip install -e 'client/python[all]'      # torch, tqdm
    python client/python/examples/train_w1_from_dataloader.py --url http://localhost:8080

Without a GPU, the tiny model with a resizing pipeline takes the same 256x256
batches on the CPU reference backend::

    PIPE='[{"op":"resize","size":[32,32]},{"op":"to_dtype","scale":0.00392157},
           {"op":"normalize","mean":[0.5],"std":[0.25]}]'
    build/streamfeed --model.preset tiny --pipeline.backend ref --optim.lr 0.005 \\
        --optim.momentum 0.9 --augment.pipeline "$PIPE" --augment.eval_pipeline "$PIPE"

Needs torch; exits with a message where it is not installed.
"""
import argparse
import sys

import numpy as np

try:
    import torch
    from torch.utils.data import DataLoader, Dataset
except ImportError:  # pragma: no cover - depends on the environment
    sys.exit("this example needs torch: pip install torch (or pip install -e 'client/python[all]')")

from streamfeed import Client, FeedAborted, RetryPolicy

# Ten well separated colours; the label is the colour's index.
PALETTE = np.array([(225, 30, 30), (30, 225, 30), (30, 30, 225), (225, 225, 30), (225, 30, 225),
                    (30, 225, 225), (225, 225, 225), (30, 30, 30), (128, 128, 128), (225, 128, 30)],
                   dtype=np.int16)


class ColourImages(Dataset):
    """`length` samples of (uint8 image [size,size,3], int64 label): the
    label's colour plus noise, deterministic in (seed, index)."""

    def __init__(self, length, size=256, classes=10, noise=40, seed=0):
        if not 1 <= classes <= len(PALETTE):
            raise ValueError(f"classes must be in [1, {len(PALETTE)}]")
        self.length, self.size, self.classes, self.noise, self.seed = length, size, classes, noise, seed

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        rng = np.random.default_rng((self.seed, index))
        label = int(rng.integers(0, self.classes))
        jitter = rng.integers(-self.noise, self.noise + 1, (self.size, self.size, 3), dtype=np.int16)
        image = np.clip(PALETTE[label] + jitter, 0, 255).astype(np.uint8)
        return torch.from_numpy(image), label  # the default collate stacks to [B,H,W,3] uint8


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://localhost:8080", help="the streamfeed server")
    p.add_argument("--token", default=None, help="bearer token, when the server has http.token set")
    p.add_argument("--batches", type=int, default=200, help="batches to send")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--size", type=int, default=256, help="image height and width (W1: 256)")
    p.add_argument("--connections", type=int, default=4, help="concurrent uploads")
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=None, help="set optim.lr on the server first (hot)")
    p.add_argument("--eval-batches", type=int, default=4, help="held-out batches scored after training (0: none)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)

    client = Client(args.url, token=args.token, retry=RetryPolicy(max_retries=50))
    client.wait_ready(timeout=60)
    model = client.model()
    print(f"server {args.url}: model {model['preset']} input {model['input']} ({model['params']} params), "
          f"backend {model['backend']}, step {model['step']}")
    if args.lr is not None:
        print("applied:", client.patch_config({"optim": {"lr": args.lr}})["applied"])

    dataset = ColourImages(args.batches * args.batch_size, size=args.size, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=False, num_workers=args.workers,
                        persistent_workers=args.workers > 0)
    try:
        # A batch the server refuses (e.g. shape_mismatch when the model's
        # input does not fit --size) stops the run at once (feed's default).
        summary = client.feed(loader, connections=args.connections,
                              progress=False if args.no_progress else None)
    except FeedAborted as e:
        print(f"stopped: {e}", file=sys.stderr)
        return 1
    print(summary)
    if summary.first_loss is not None and summary.last_loss is not None:
        print(f"loss {summary.first_loss:.4f} -> {summary.last_loss:.4f}")
    if args.eval_batches > 0:
        # Another seed: images the model has not trained on. Eval batches run
        # forward only, after every training batch sent before them.
        holdout = ColourImages(args.eval_batches * args.batch_size, size=args.size, seed=args.seed + 1)
        for images, labels in DataLoader(holdout, batch_size=args.batch_size):
            client.evaluate(images, labels, eval="holdout")
        e = client.eval_summary("holdout")
        shown = {k: "n/a" if v is None else f"{v:.4f}" for k, v in (("loss", e.loss), ("top-1", e.top1),
                                                                    ("top-5", e.top5))}
        print(f"holdout: {e.samples} samples at step {e.last_step}, "
              + ", ".join(f"{k} {v}" for k, v in shown.items()))
    return 0 if summary.ok else 1


if __name__ == "__main__":
    sys.exit(main())
