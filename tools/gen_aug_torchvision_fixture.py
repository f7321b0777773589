#!/usr/bin/env python3
"""Writes tests/unit/data/aug_torchvision.h: torchvision's outputs for a few
small uint8 images and single-op (or two-op) augmentation lists, which
tests/unit/test_aug.c compares with the reference backend.

Run once by hand when the fixture must change; CI does not run it (it needs
torch and torchvision, which the project's requirements do not carry):

    python3 -m venv /tmp/tv && /tmp/tv/bin/pip install torch torchvision
    /tmp/tv/bin/python tools/gen_aug_torchvision_fixture.py

The images are uint8, HWC; torchvision gets them as float32 CHW tensors, so
its outputs carry no uint8 rounding, like the service's float output. Each case
pairs the service's augmentation JSON with the torchvision v2 call that it
means; the parameters are fixed (no random draw), so both sides compute one
function.
"""
import math
import os
import sys

import numpy as np
import torch
import torchvision
import torchvision.transforms.v2.functional as F
from torchvision.transforms import InterpolationMode

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "unit", "data",
                   "aug_torchvision.h")


def image(h, w, seed):
    """Smooth shading, hard edges and noise: every filter's border shows."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.empty((h, w, 3))
    img[..., 0] = 128 + 100 * np.sin(x / 3.1 + y / 7.3)
    img[..., 1] = 255 * ((x // 5 + y // 4) % 2)
    img[..., 2] = 40 + 3 * x + 2 * y
    img += rng.normal(0, 12, img.shape)
    img[0, :, :] = 250  # bright first row and last column: the edges matter
    img[:, -1, :] = 5
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


IMAGES = [image(14, 19, 1), image(24, 22, 2)]

BIL = InterpolationMode.BILINEAR
NEAR = InterpolationMode.NEAREST

# (name, image index, service JSON, torchvision function of a float CHW tensor)
CASES = [
    ("resize_up_antialias", 0, '[{"op":"resize","size":[23,29]}]',
     lambda x: F.resize(x, [23, 29], BIL, antialias=True)),
    ("resize_up_no_antialias", 0, '[{"op":"resize","size":[23,29],"antialias":false}]',
     lambda x: F.resize(x, [23, 29], BIL, antialias=False)),
    ("resize_down_antialias", 1, '[{"op":"resize","size":[11,13]}]',
     lambda x: F.resize(x, [11, 13], BIL, antialias=True)),
    ("resize_down_no_antialias", 1, '[{"op":"resize","size":[11,13],"antialias":false}]',
     lambda x: F.resize(x, [11, 13], BIL, antialias=False)),
    ("resize_down_by_five_antialias", 1, '[{"op":"resize","size":[5,4]}]',
     lambda x: F.resize(x, [5, 4], BIL, antialias=True)),
    ("center_crop", 1, '[{"op":"center_crop","size":[15,12]}]',
     lambda x: F.center_crop(x, [15, 12])),
    ("center_crop_then_resize_up", 0,
     '[{"op":"center_crop","size":[9,12]},{"op":"resize","size":[17,20]}]',
     lambda x: F.resize(F.center_crop(x, [9, 12]), [17, 20], BIL, antialias=True)),
    ("center_crop_then_resize_down_antialias", 1,
     '[{"op":"center_crop","size":[19,20]},{"op":"resize","size":[8,7]}]',
     lambda x: F.resize(F.center_crop(x, [19, 20]), [8, 7], BIL, antialias=True)),
    ("flip_then_resize_down_antialias", 1,
     '[{"op":"horizontal_flip","p":1},{"op":"resize","size":[10,9]}]',
     lambda x: F.resize(F.horizontal_flip(x), [10, 9], BIL, antialias=True)),
    ("rotate_bilinear", 0, '[{"op":"random_rotation","degrees":[30,30]}]',
     lambda x: F.rotate(x, 30.0, BIL)),
    ("rotate_nearest", 0,
     '[{"op":"random_rotation","degrees":[-17,-17],"interpolation":"nearest"}]',
     lambda x: F.rotate(x, -17.0, NEAR)),
    ("resize_up_then_rotate", 0,
     '[{"op":"resize","size":[21,27]},{"op":"random_rotation","degrees":[25,25]}]',
     lambda x: F.rotate(F.resize(x, [21, 27], BIL, antialias=True), 25.0, BIL)),
    ("resize_down_antialias_then_rotate", 1,
     '[{"op":"resize","size":[12,10]},{"op":"random_rotation","degrees":[25,25]}]',
     lambda x: F.rotate(F.resize(x, [12, 10], BIL, antialias=True), 25.0, BIL)),
]

# Colour jitter with fixed factors and order: (name, image index, factors of
# brightness, contrast, saturation and the hue shift (None: off), order as
# ColorJitter's fn_idx). torchvision runs on the image scaled to [0, 1], as
# after the service's {"op":"to_dtype","scale":1/255}, so its clamps to [0, 1]
# are the service's at bound 1.
COLOR_CASES = [
    ("brightness_up_clamps", 0, (1.7, None, None, None), (0, 1, 2, 3)),
    ("contrast_down", 1, (None, 0.4, None, None), (0, 1, 2, 3)),
    ("saturation_up", 0, (None, None, 1.8, None), (0, 1, 2, 3)),
    ("hue_shift_positive", 1, (None, None, None, 0.23), (0, 1, 2, 3)),
    ("hue_shift_negative", 0, (None, None, None, -0.41), (0, 1, 2, 3)),
    ("all_four_in_order_3_1_0_2", 1, (1.3, 1.6, 0.3, -0.12), (3, 1, 0, 2)),
    ("all_four_in_order_2_0_3_1", 0, (0.6, 1.9, 1.4, 0.35), (2, 0, 3, 1)),
]

COLOR_FNS = [F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue]


def color_jitter(x, factors, order):
    for f in order:
        if factors[f] is not None:
            x = COLOR_FNS[f](x, factors[f])
    return x


def c_float(v):
    """A C float literal of v ("2" would be an int, "2f" no literal at all)."""
    t = "%.9g" % v
    return t + ("f" if ("." in t or "e" in t) else ".0f")


def c_floats(a, per_line=8):
    vals = [("%.4f" % v).rstrip("0") + "f" for v in a.reshape(-1)]  # "250.f" is a float
    return ",\n".join("    " + ", ".join(vals[i:i + per_line]) for i in range(0, len(vals), per_line))


def main():
    lines = [
        "/* tests/unit/data/aug_torchvision.h — generated by tools/gen_aug_torchvision_fixture.py",
        " * with torch %s, torchvision %s; do not edit. Images are uint8 HWC; outputs" % (
            torch.__version__, torchvision.__version__),
        " * float32 CHW from torchvision v2 on the float images (colour cases: on the",
        " * images scaled to [0, 1], outputs printed with 7 decimals). */",
        "#ifndef SF_TEST_AUG_TORCHVISION_H",
        "#define SF_TEST_AUG_TORCHVISION_H",
        "#include <stdint.h>",
        "",
    ]
    for i, img in enumerate(IMAGES):
        flat = ", ".join(str(int(v)) for v in img.reshape(-1))
        lines.append("static const uint8_t tv_image%d[%d] = {%s};" % (i, img.size, flat))
    lines.append("static const uint8_t *const tv_images[] = {%s};" %
                 ", ".join("tv_image%d" % i for i in range(len(IMAGES))))
    lines.append("static const int tv_image_hw[][2] = {%s};" %
                 ", ".join("{%d, %d}" % img.shape[:2] for img in IMAGES))
    lines.append("")
    for k, (name, idx, js, fn) in enumerate(CASES):
        x = torch.from_numpy(IMAGES[idx]).permute(2, 0, 1).contiguous().float()
        y = fn(x).contiguous()
        assert y.dtype == torch.float32 and y.dim() == 3
        lines.append("static const float tv_out%d[%d] = {\n%s};" % (k, y.numel(), c_floats(y.numpy())))
    lines.append("")
    lines.append("typedef struct tv_case {")
    lines.append("    const char *name, *json;")
    lines.append("    int image, out_h, out_w;")
    lines.append("    const float *want;")
    lines.append("} tv_case;")
    lines.append("static const tv_case tv_cases[] = {")
    for k, (name, idx, js, fn) in enumerate(CASES):
        x = torch.from_numpy(IMAGES[idx]).permute(2, 0, 1).float()
        y = fn(x)
        lines.append('    {"%s", "%s", %d, %d, %d, tv_out%d},' % (
            name, js.replace('"', '\\"'), idx, y.shape[1], y.shape[2], k))
    lines.append("};")
    lines.append("")
    for k, (name, idx, factors, order) in enumerate(COLOR_CASES):
        x = torch.from_numpy(IMAGES[idx]).permute(2, 0, 1).contiguous().float() / 255.0
        y = color_jitter(x, factors, order).contiguous()
        vals = [("%.7f" % v).rstrip("0") + "f" for v in y.numpy().reshape(-1)]
        body = ",\n".join("    " + ", ".join(vals[i:i + 8]) for i in range(0, len(vals), 8))
        lines.append("static const float tv_color_out%d[%d] = {\n%s};" % (k, y.numel(), body))
    lines.append("")
    lines.append("typedef struct tv_color_case {")
    lines.append("    const char *name;")
    lines.append("    int image;")
    lines.append("    float factor[4]; /* brightness, contrast, saturation, hue */")
    lines.append("    int on[4];")
    lines.append("    int order[4];")
    lines.append("    const float *want;")
    lines.append("} tv_color_case;")
    lines.append("static const tv_color_case tv_color_cases[] = {")
    for k, (name, idx, factors, order) in enumerate(COLOR_CASES):
        lines.append('    {"%s", %d, {%s}, {%s}, {%s}, tv_color_out%d},' % (
            name, idx, ", ".join(c_float(f or 0.0) for f in factors),
            ", ".join("1" if f is not None else "0" for f in factors),
            ", ".join(str(o) for o in order), k))
    lines.append("};")
    lines.append("#endif")
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote %s (%d cases)" % (os.path.relpath(OUT), len(CASES)), file=sys.stderr)


if __name__ == "__main__":
    main()
