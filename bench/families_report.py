"""The families' speed and memory table from bench/families_run.sh output, as
markdown ready for bench/results:

    python3 bench/families_report.py OUTDIR [OUTDIR ...] [--out families.md]

Several OUTDIRs (the default list split across calls with FAMILIES=) make
one table; each family's row comes from the last OUTDIR that has it, and the
header names every call's GPU, commit and date. Speed ratios are taken only
within one call (a row's streamfeed and PyTorch figures come from the same
OUTDIR). Columns: streamfeed's samples/s over HTTP; PyTorch's best variant
and its samples/s; their ratio; streamfeed's peak device memory (NVML, the
process); PyTorch's peak of its best variant and the least over its variants
(each variant in a process of its own); streamfeed's over the least. A
run that failed shows no figure, and the reason under the table.
The marks of the issues: every family >= 1.0x PyTorch's best, resnet50 at
batch 256 >= 1.3x, vit_b_16 at batch 256 >= 1.2x; peak memory <= PyTorch's.
"""
import argparse
import json
import os
import sys

SPEED_MARKS = {("resnet50", 256): 1.3, ("vit_b_16", 256): 1.2}
VARIANT_NAMES = {"eager": "eager", "compile": "torch.compile"}


def jload(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def collect(outdir):
    """{family: row} of one call's folder."""
    rows = {}
    for fam in sorted(os.listdir(outdir)):
        d = os.path.join(outdir, fam)
        if not os.path.isdir(d):
            continue
        sf, pt = jload(os.path.join(d, "streamfeed.json")), jload(os.path.join(d, "pytorch.json"))
        ex, sk = jload(os.path.join(d, "export.json")), jload(os.path.join(d, "skipped.json"))
        ck = jload(os.path.join(d, "check.json"))
        if not (sf or pt or ex or sk or ck):
            continue
        fam = "timm:" + fam[5:] if fam.startswith("timm-") else fam  # the folder of timm:NAME
        rows[fam] = {"family": fam, "streamfeed": sf, "pytorch": pt or [], "export": ex, "skipped": sk,
                     "check": ck, "call": outdir}
    return rows


def num(v):
    """An integer figure with its thousands apart by spaces (1 234 567), or a dash."""
    return "—" if v is None else f"{round(v):,}".replace(",", " ")


def peak_mib(rec):
    """The process's peak as NVML listed it, else the device's used memory above the idle baseline."""
    if rec.get("peak_process_mib") is not None:
        return rec["peak_process_mib"]
    return rec.get("peak_device_delta_mib")


def row_figures(r):
    """The row's figures and the notes that explain a missing one. A
    streamfeed figure shows only beside a passed numerics gate of the same
    call (check.json)."""
    sf, notes = r["streamfeed"] or {}, []
    ck = r.get("check")
    if not (ck and ck.get("ok")):
        if sf.get("samples_per_s"):
            notes.append("streamfeed's figure withheld: no passed numerics gate in this call")
        if ck:
            notes.append(f"numerics gate: {ck.get('error')}")
        sf = {k: v for k, v in sf.items() if k not in ("samples_per_s", "peak_process_mib", "peak_device_delta_mib")}
    f = {"family": r["family"], "batch": sf.get("batch"), "sf": sf.get("samples_per_s"),
         "sf_mib": peak_mib(sf) if sf.get("samples_per_s") else None, "pt": None, "pt_variant": None, "pt_mib": None,
         "pt_min_mib": None, "pt_min_variant": None}
    if r["skipped"]:
        notes.append(r["skipped"].get("error", "not started"))
    if r["export"] and r["export"].get("error"):
        notes.append(f"export: {r['export']['error']}")
    if sf.get("error"):
        notes.append(f"streamfeed: {sf['error']}")
    ok = [p for p in r["pytorch"] if p.get("samples_per_s")]
    for p in r["pytorch"]:
        if p.get("error"):
            notes.append(f"PyTorch {p['variant']}: {p['error']}")
        f["batch"] = f["batch"] or p.get("batch")
    if ok:
        best = max(ok, key=lambda p: p["samples_per_s"])
        f.update(pt=best["samples_per_s"], pt_variant=best["variant"], pt_mib=peak_mib(best),
                 pt_layout=best.get("memory_format"))
        mems = [p for p in ok if peak_mib(p) is not None]
        if mems:
            least = min(mems, key=peak_mib)
            f.update(pt_min_mib=peak_mib(least), pt_min_variant=least["variant"])
    if any(rec and rec.get("peak_process_mib") is None and rec.get("peak_device_delta_mib") is not None
           for rec in [sf] + ok):
        notes.append("NVML listed no process of this pid (a container's own pid namespace): peak memory here "
                     "is the device's used memory above its idle baseline instead")
    f["ratio"] = f["sf"] / f["pt"] if f["sf"] and f["pt"] else None
    f["mem_ratio"] = f["sf_mib"] / f["pt_min_mib"] if f["sf_mib"] and f["pt_min_mib"] else None
    return f, notes


def verdict(f):
    marks = []
    if f["ratio"] is not None:
        need = SPEED_MARKS.get((f["family"], f["batch"]), 1.0)
        marks.append(f"speed {'met' if f['ratio'] >= need else 'NOT met'} (≥ {need:.1f}×)")
    if f["mem_ratio"] is not None:
        marks.append(f"memory {'met' if f['mem_ratio'] <= 1.0 else 'NOT met'}")
    return ", ".join(marks) or "—"


def render(calls, order=None):
    """Markdown of the table; calls is a list of (outdir, {family: row})."""
    rows = {}
    for _, rs in calls:
        rows.update(rs)
    fams = [f for f in (order or []) if f in rows] + sorted(f for f in rows if f not in (order or []))
    out = ["# torchvision (and timm:) families: streamfeed over HTTP against PyTorch's best, speed and peak memory",
           ""]
    for outdir, rs in calls:
        torch = next((p.get("torch") for r in rs.values() for p in r["pytorch"] if p.get("torch")), None)
        out.append(f"- GPU: {read(os.path.join(outdir, 'gpu.txt')) or 'unknown'}; commit "
                   f"{read(os.path.join(outdir, 'commit.txt')) or 'unknown'}; date "
                   f"{read(os.path.join(outdir, 'date.txt')) or 'unknown'}"
                   + (f"; torch {torch}" if torch else "")
                   + (f" ({', '.join(sorted(rs))})" if len(calls) > 1 else ""))
    sample = next((r for r in rows.values() if r["streamfeed"] and r["streamfeed"].get("server_args")), None)
    pt_sample = next((p for r in rows.values() for p in r["pytorch"] if p.get("steps")), None)
    out += ["- Numerics gate (bench/families_check.py), before each streamfeed run: one step at the run's precision"
            " and input size against PyTorch's float32 step from the same weights (eval logits, loss, every "
            "parameter's gradient, batchnorm's statistics); a family that fails it shows no streamfeed figure.",
            "- streamfeed: the model exported from torchvision or timm (`python -m streamfeed.export`, only num_classes=1000"
            " set), fed over HTTP by streamfeed-load (uint8 images, converted and normalised on the GPU), "
            "samples/s trained over a steady window from the service's own /metrics"
            + (f"; {sample['family']}'s flags beside its config.json: `{sample['streamfeed']['server_args']}`"
               if sample else "") + ".",
            "- PyTorch: the same torchvision or timm model, the same batch and optimizer (SGD momentum 0.9; AdamW for ViT), "
            "bf16 autocast, model-only on a device-resident uint8 batch normalised on the GPU each step (its best"
            " case); variants eager and torch.compile, channels_last for the CNNs"
            + (f"; {pt_sample['warmup']} warm-up + {pt_sample['steps']} timed steps, {pt_sample['optim_impl']} "
               f"optimizer" if pt_sample else "") + ".",
            "- Peak memory: the process's device memory as NVML reports it (nvidia-smi --query-compute-apps), "
            "sampled every ~0.05 s, each PyTorch variant in a process of its own.", "",
            "| family | batch | streamfeed samples/s | PyTorch best samples/s (variant) | ratio | streamfeed peak MiB"
            " | PyTorch peak MiB, best variant | PyTorch peak MiB, least (variant) | memory ratio | marks |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    all_notes = []
    for fam in fams:
        f, notes = row_figures(rows[fam])
        var = VARIANT_NAMES.get(f["pt_variant"], f["pt_variant"])
        out.append(f"| {fam} | {num(f['batch'])} | {num(f['sf'])} | "
                   f"{num(f['pt'])}" + (f" ({var})" if var else "") + " | "
                   + ("—" if f["ratio"] is None else f"**{f['ratio']:.2f}×**") + f" | {num(f['sf_mib'])} | "
                   f"{num(f['pt_mib'])} | {num(f['pt_min_mib'])}"
                   + (f" ({VARIANT_NAMES.get(f['pt_min_variant'], f['pt_min_variant'])})"
                      if f["pt_min_variant"] else "") + " | "
                   + ("—" if f["mem_ratio"] is None else f"{f['mem_ratio']:.2f}") + f" | {verdict(f)} |")
        all_notes += [f"{fam}: {n}" for n in notes]
    if all_notes:
        out += ["", "Figures missing, and why:", ""] + [f"- {n[:600]}" for n in all_notes]
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdirs", nargs="+")
    ap.add_argument("--order", default="", help="families in the order of the rows (others follow, sorted)")
    ap.add_argument("--out", help="write the markdown here (default: stdout)")
    ap.add_argument("--json", help="also write the rows' figures as JSON")
    a = ap.parse_args(argv)
    calls = [(d, collect(d)) for d in a.outdirs]
    md = render(calls, a.order.replace(",", " ").split())
    if a.out:
        with open(a.out, "w") as f:
            f.write(md)
    else:
        sys.stdout.write(md)
    if a.json:
        rows = {}
        for _, rs in calls:
            rows.update(rs)
        with open(a.json, "w") as f:
            json.dump([row_figures(r)[0] | {"call": r["call"]} for r in rows.values()], f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
