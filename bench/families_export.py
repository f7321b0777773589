"""Exports torchvision families for bench/families_run.sh, each with the
project's exporter exactly as its command runs it,

    python -m streamfeed.export torchvision.models:NAME --kwargs '{"num_classes":1000}' \\
        --input 3,SIZE,SIZE --recipe none --optimizer ... --config ... --out MODELS/NAME

but all in one process, so that torch and torchvision are imported once. A
family named timm:NAME is timm's model NAME at its defaults
(``timm:create_model --kwargs '{"model_name": NAME, "num_classes": 1000}'``).

    python3 bench/families_export.py --size 224 --models /tmp/models --status OUT resnet50 vit_b_16 ...

The config each writes is the whole training recipe of the table: the model
with its weights; SGD lr 1e-3 momentum 0.9 for the CNNs, torch.optim.AdamW's
defaults for vit_* (--optimizer adamw); and as augmentation only what
PyTorch's side does on the device: uint8 to float and ImageNet's
normalisation. A family that does not export gets OUT/NAME/export.json with
its error (the table shows it) and the others still export; the exit status
is 1 when any failed.
"""
import argparse
import contextlib
import io
import json
import os
import shlex
import sys
import time

PIPELINE = [{"op": "to_dtype", "scale": 1 / 255},
            {"op": "normalize", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}]


def export_args(family, size, out):
    kwargs = {"num_classes": 1000}
    if family.startswith("vit_") and size != 224:
        kwargs["image_size"] = size
    config = {"augment": {"pipeline": PIPELINE}}
    if family.startswith("vit_"):
        optim = ["--optimizer", "adamw"]
    else:
        optim = ["--optimizer", "sgd"]
        config["optim"] = {"momentum": 0.9}
    factory = f"torchvision.models:{family}"
    if family.startswith("timm:"):  # timm's model NAME at its defaults
        factory, kwargs = "timm:create_model", {"model_name": family[5:], "num_classes": 1000}
    return ([factory, "--kwargs", json.dumps(kwargs), "--input", f"3,{size},{size}",
             "--recipe", "none"] + optim + ["--config", json.dumps(config), "--out", out, "--overwrite"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--models", required=True, help="directory the exported models go into (MODELS/NAME)")
    ap.add_argument("--status", required=True, help="results directory: OUT/NAME/export.json per family")
    ap.add_argument("families", nargs="+")
    a = ap.parse_args()
    from streamfeed.export import main as export_main
    failed = 0
    for fam in a.families:
        args = export_args(fam, a.size, os.path.join(a.models, fam))
        t = time.monotonic()
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                rc = export_main(args)
            error = None if rc == 0 else f"exit {rc}: {err.getvalue().strip()[-2000:]}"
        except SystemExit as e:  # argparse and the exporter's refusals
            error = f"exit {e.code}: {err.getvalue().strip()[-2000:]}"
        except Exception as e:  # noqa: BLE001 (one family's failure must not stop the others)
            error = f"{type(e).__name__}: {e}"[:2000]
        rec = {"family": fam, "command": "python -m streamfeed.export " + shlex.join(args),
               "seconds": time.monotonic() - t, "error": error}
        d = os.path.join(a.status, fam.replace(":", "-"))  # timm:NAME in timm-NAME: no colon in a path
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "export.json"), "w") as f:
            json.dump(rec, f, indent=1)
        print(f"export {fam}: " + (f"FAILED {error}" if error else f"{rec['seconds']:.1f} s"), flush=True)
        failed += error is not None
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
