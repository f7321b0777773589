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

    python3 tools/export_sweep.py [--skip-large] [--timm] [NAME ...]

NAME: models to convert (default: every listed one); --skip-large leaves out
the six largest (ViT-L and ViT-H, RegNetY-16GF, -32GF and -128GF: minutes of
build time and tens of GB of host memory each). --timm converts timm's
models instead (timm installed): one or two of each architecture timm has,
the list below, each at its pretrained configuration's input size.
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

# One or two models of each of timm's architectures, the smaller where there
# are several.
TIMM = ("resnet50", "resnet18d", "resnext50_32x4d", "seresnext26d_32x4d", "ecaresnet26t", "res2net50_26w_4s",
        "resnetv2_50", "efficientnet_b0", "tf_efficientnet_b0", "efficientnetv2_rw_t", "tinynet_a",
        "mobilenetv3_large_100", "mobilenetv4_conv_small", "mnasnet_100", "spnasnet_100", "fbnetc_100",
        "hardcorenas_a", "lcnet_050", "ghostnet_100", "rexnet_100", "regnetx_002", "regnety_008",
        "densenet121", "dla34", "dpn68", "cspresnet50", "darknet53", "vovnet39a", "ese_vovnet19b_dw",
        "selecsls42b", "gernet_s", "repvgg_a0", "mobileone_s0", "fastvit_t8", "repvit_m1", "hgnetv2_b0",
        "hrnet_w18_small", "inception_v3", "xception41", "tresnet_m", "nfnet_l0", "vgg11_bn", "convnext_tiny",
        "convmixer_768_32", "poolformer_s12", "poolformerv2_s12", "convformer_s18", "caformer_s18",
        "convnextv2_atto", "mambaout_femto", "inception_next_tiny", "starnet_s1", "efficientformer_l1", "edgenext_xx_small", "mobilevit_xs",
        "efficientvit_b0", "gcresnet33ts", "halonet26t", "botnet26t_256", "lambda_resnet26t", "coatnet_0_rw_224",
        "maxvit_tiny_tf_224", "swin_tiny_patch4_window7_224", "vit_small_patch16_224", "deit_small_patch16_224",
        "beit_base_patch16_224", "eva02_tiny_patch14_224", "cait_xxs24_224", "xcit_nano_12_p16_224",
        "levit_128s", "pit_ti_224", "coat_lite_tiny", "tnt_s_patch16_224", "twins_svt_small", "crossvit_tiny_240",
        "nest_tiny", "mixer_b16_224", "resmlp_12_224")
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


def timm_models():
    import timm

    def make(name):
        def fn():
            model = timm.create_model(name, pretrained=False, num_classes=10)
            return model, model.pretrained_cfg.get("input_size", (3, 224, 224))[1]
        return fn
    return [("timm:" + n, make(n)) for n in TIMM]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*")
    ap.add_argument("--skip-large", action="store_true")
    ap.add_argument("--timm", action="store_true", help="timm's models (the TIMM list) instead of torchvision's")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    counts = {"OK": 0, "REFUSED": 0, "CRASH": 0}
    for name, fn in timm_models() if args.timm else models():
        if (args.names and name not in args.names and name[5:] not in args.names) or \
                (args.skip_large and name in LARGE):
            continue
        t0 = time.monotonic()
        try:
            model, hw = fn() if args.timm else build(name, fn)
            ex = convert(model, (1, 3, hw, hw))
            verdict, what = "OK", f"{len(ex.spec['layers'])} layers"
        except ExportError as e:
            verdict, what = "REFUSED", str(e)
        except Exception as e:  # noqa: BLE001 - anything else the exporter raises is a bug to report
            verdict, what = "CRASH", f"{type(e).__name__}: {e}"
        counts[verdict] += 1
        print(f"{name}: {verdict} {what[:300]} ({time.monotonic() - t0:.1f} s)", flush=True)
    timm_version = f", timm {__import__('timm').__version__}" if args.timm else ""
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}{timm_version}: "
          + ", ".join(f"{v} {k}" for k, v in counts.items()))
    return 1 if counts["CRASH"] else 0


if __name__ == "__main__":
    sys.exit(main())
