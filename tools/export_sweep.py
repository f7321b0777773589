#!/usr/bin/env python3
"""tools/export_sweep.py — which of torchvision's models the exporter takes.

Builds each classification and segmentation model torchvision lists (random
weights, num_classes set; segmentation models without their aux head,
GoogLeNet and Inception v3 without theirs), converts it with
streamfeed.export.convert at its usual input size, and prints one line a
model: OK with its layer count, REFUSED with the exporter's message (the op,
the module path, what is supported), or CRASH where the exporter failed
otherwise, which is a bug. Exits 1 when any model crashed. Nothing is
written; no service is needed. docs/EXPORT.md quotes a run.

    python3 tools/export_sweep.py [--skip-large] [NAME ...]

NAME: models to convert (default: every listed one); --skip-large leaves out
the six largest (ViT-L and ViT-H, RegNetY-16GF, -32GF and -128GF: minutes of
build time and tens of GB of host memory each).
"""
import argparse
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client", "python"))

import torch  # noqa: E402
import torchvision  # noqa: E402

from streamfeed.export import ExportError, convert  # noqa: E402

LARGE = ("vit_h_14", "vit_l_16", "vit_l_32", "regnet_y_128gf", "regnet_y_32gf", "regnet_y_16gf")


def models():
    seg = torchvision.models.segmentation
    return ([(n, getattr(torchvision.models, n)) for n in torchvision.models.list_models(module=torchvision.models)] +
            [("segmentation." + n, getattr(seg, n)) for n in torchvision.models.list_models(module=seg)])


def build(name, fn):
    if name.startswith("segmentation."):
        kw = {"num_classes": 5, "weights": None, "weights_backbone": None}
        if not name.startswith("segmentation.lraspp"):
            kw["aux_loss"] = False
        return fn(**kw), 224
    kw = {"num_classes": 10}
    if name in ("googlenet", "inception_v3"):
        kw.update(aux_logits=False, init_weights=True)
    return fn(**kw), 299 if name == "inception_v3" else 224


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*")
    ap.add_argument("--skip-large", action="store_true")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    counts = {"OK": 0, "REFUSED": 0, "CRASH": 0}
    for name, fn in models():
        if (args.names and name not in args.names) or (args.skip_large and name in LARGE):
            continue
        t0 = time.monotonic()
        try:
            model, hw = build(name, fn)
            ex = convert(model, (1, 3, hw, hw))
            verdict, what = "OK", f"{len(ex.spec['layers'])} layers"
        except ExportError as e:
            verdict, what = "REFUSED", str(e)
        except Exception as e:  # noqa: BLE001 - anything else the exporter raises is a bug to report
            verdict, what = "CRASH", f"{type(e).__name__}: {e}"
        counts[verdict] += 1
        print(f"{name}: {verdict} {what[:300]} ({time.monotonic() - t0:.1f} s)", flush=True)
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}: "
          + ", ".join(f"{v} {k}" for k, v in counts.items()))
    return 1 if counts["CRASH"] else 0


if __name__ == "__main__":
    sys.exit(main())
