"""Draws docs/figures/*.svg from benchmark data: the layer against its peers and the floor, the
layer's own benchmark, dispatch/combine, the grouped GEMM, and accuracy against hidden size.

    python3 scripts/plot_perf.py [--data docs/perf/data] [--out docs/figures] [--png DIR]
                                 [--check] [FILE.jsonl ...]

Inputs:
- every `*.jsonl` under --data, read in name order (named `YYYY-MM-DD-what.jsonl` by the day the
  numbers were measured, so that later measurements come later), then each FILE given: JSON Lines as
  `megamoe bench layer|dispatch|gemm --json PATH` writes them (one measured cell per line), and
  `"bench": "accuracy"` lines (a layer check's diff against the CPU reference). A line may carry
  `"timing"`: "events" (CUDA events around back-to-back calls, what the benches measure; the
  default) or "kernel_l2_flush" (summed kernel durations with an L2 flush before each call, the
  peers' harness), and `"source"`: the log it came from. For the same cell the line read last
  wins, so a FILE given on the command line replaces the stored numbers of its cells.
- `peers.json` under --data: the peers' numbers, each series with the table it was copied from.

--check reads and validates every input and draws nothing (no matplotlib needed); --png also
writes each figure as PNG into DIR. Needs matplotlib (`python3 -m pip install matplotlib`).
"""

import argparse
import glob
import json
import math
import os
import statistics
import sys

# Fields every line of a bench needs (JSON_SCHEMA: the common fields, and each bench's own).
REQUIRED = {
    "layer": ("preset", "experts", "ranks", "tokens", "arm", "median_us", "floor_us"),
    "dispatch": ("preset", "ranks", "tokens", "dtype", "sms", "arm", "median_us", "floor_us"),
    "gemm": ("preset", "arm", "median_us"),
    "accuracy": ("preset", "hidden", "ranks", "tokens", "kernel", "diff"),
}
# What makes two lines the same cell (the later one replaces the earlier).
CELL = (
    "bench",
    "preset",
    "experts",
    "ranks",
    "gpus",
    "routing",
    "masked",
    "tokens",
    "dtype",
    "sms",
    "arm",
    "kernel",
    "shape",
    "layout",
    "pad",
    "flush_l2",
    "rows_per_expert",
    "timing",
)
PROXIES = (("flash", 32), ("pro", 48))  # the EP8-rank proxies (SPEC §9)
TIMING = {
    "events": "CUDA events, calls back to back",
    "kernel_l2_flush": "kernel time, L2 flushed before each call",
}


class InputError(Exception):
    pass


def read_lines(paths):
    """Every line of the files, validated, the last of each cell kept (in reading order)."""
    cells = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for n, text in enumerate(f, 1):
                if not text.strip():
                    continue
                where = f"{path}:{n}"
                try:
                    d = json.loads(text)
                except json.JSONDecodeError as e:
                    raise InputError(f"{where}: not JSON ({e})") from None
                bench = d.get("bench") if isinstance(d, dict) else None
                if bench not in REQUIRED:
                    raise InputError(f"{where}: bench must be one of {sorted(REQUIRED)}, got {bench!r}")
                missing = [k for k in REQUIRED[bench] if d.get(k) is None]
                if missing:
                    raise InputError(f"{where}: {bench} line without {', '.join(missing)}")
                for k in ("median_us", "floor_us", "diff"):
                    v = d.get(k)
                    if v is not None and not (isinstance(v, (int, float)) and v > 0 and math.isfinite(v)):
                        raise InputError(f"{where}: {k} must be a positive number, got {v!r}")
                d.setdefault("timing", "events")
                if d["timing"] not in TIMING:
                    raise InputError(f"{where}: timing must be one of {sorted(TIMING)}, got {d['timing']!r}")
                cells[tuple(d.get(k) for k in CELL)] = d
    return list(cells.values())


def read_peers(path):
    with open(path, encoding="utf-8") as f:
        peers = json.load(f)
    for key in ("layer", "floor", "dispatch", "gemm", "accuracy"):
        if key not in peers:
            raise InputError(f"{path}: no {key!r} section")
    for s in peers["layer"]:
        for key in ("name", "timing", "source"):
            if key not in s:
                raise InputError(f"{path}: a layer series without {key!r}")
        if s["timing"] not in TIMING:
            raise InputError(f"{path}: {s['name']}: timing must be one of {sorted(TIMING)}")
    for s in peers["dispatch"]:
        if s.get("kind") not in ("fused", "unfused"):
            raise InputError(f"{path}: dispatch series {s.get('name')!r}: kind must be fused or unfused")
    return peers


def series(points):
    """{tokens: µs} as sorted (x, y) lists."""
    xs = sorted(int(t) for t in points)
    return xs, [points[str(x)] if str(x) in points else points[x] for x in xs]


def layer_arm(lines, preset, experts, arm, timing):
    return {
        d["tokens"]: d
        for d in lines
        if d["bench"] == "layer"
        and d["preset"] == preset
        and d["experts"] == experts
        and d["ranks"] == 1
        and d.get("routing", "uniform") == "uniform"
        and not d.get("masked")
        and d["arm"] == arm
        and d["timing"] == timing
    }


def plain_log_y(ax):
    """A log y axis labelled with plain numbers (200, 500, 1000) rather than powers of ten."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def tokens_axis(ax, xs):
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([str(x) for x in xs])
    ax.minorticks_off()
    ax.set_xlabel("tokens per rank")
    ax.grid(True, which="major", alpha=0.3)


def save(fig, name, out, png):
    fig.savefig(os.path.join(out, name + ".svg"), metadata={"Date": None})
    if png:
        fig.savefig(os.path.join(png, name + ".png"), dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)


def plot_layer_vs_peers(plt, lines, peers, out, png):
    """megamoe's fused and split layer, the peers and the floor, on the EP8-rank proxies."""
    fig, axes = plt.subplots(2, 2, figsize=(11, 8.2), height_ratios=[3, 2], sharex="col")
    timings_used = set()
    for col, (preset, experts) in enumerate(PROXIES):
        top, bottom = axes[0][col], axes[1][col]
        floor = {int(t): v for t, v in peers["floor"][preset].items()}
        # megamoe, timed as the peers were when such lines exist
        for arm, style in (
            ("fused", dict(color="C0", marker="o", lw=2.2)),
            ("split", dict(color="C0", marker="s", lw=1.4, ls="--")),
        ):
            got = layer_arm(lines, preset, experts, arm, "kernel_l2_flush")
            timing = "kernel_l2_flush"
            if not got:
                got, timing = layer_arm(lines, preset, experts, arm, "events"), "events"
            if not got:
                continue
            timings_used.add(timing)
            xs = sorted(got)
            label = f"megamoe {arm}" + ("" if timing == "kernel_l2_flush" else " (CUDA events)")
            top.plot(xs, [got[x]["median_us"] for x in xs], label=label, **style)
            bottom.plot(xs, [got[x]["median_us"] / got[x]["floor_us"] for x in xs], **style)
            floor.update({x: got[x]["floor_us"] for x in xs})
        styles = [
            dict(color="C3", marker="^", lw=1.8),
            dict(color="C2", marker="v", lw=1.4),
            dict(color="0.45", marker="x", lw=1.2, ls=":"),
        ]
        for s, style in zip(peers["layer"], styles):
            if preset not in s:
                continue
            xs, ys = series(s[preset])
            label = s["name"] + ("" if s["timing"] == "kernel_l2_flush" else " (CUDA events, another day)")
            top.plot(xs, ys, label=label, **style)
            if s["timing"] == "kernel_l2_flush":
                bottom.plot(xs, [y / floor[x] for x, y in zip(xs, ys) if x in floor], **style)
        xs = sorted(floor)
        top.plot(xs, [floor[x] for x in xs], color="k", lw=1.0, ls="-.", label="floor (SPEC §8)")
        bottom.axhline(1.0, color="k", lw=1.0, ls="-.")
        plain_log_y(top)
        top.set_ylabel("µs per call (log)")
        top.set_title(f"{preset}, {experts} experts (one EP8 rank on one H200)")
        top.grid(True, which="both", alpha=0.3)
        bottom.set_ylabel("time / floor")
        bottom.set_ylim(0.9, 2.6)
        tokens_axis(bottom, xs)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8.5, frameon=False)
    how = (
        TIMING["kernel_l2_flush"] if timings_used == {"kernel_l2_flush"} else "megamoe: CUDA events; peers: kernel time"
    )
    fig.suptitle(f"MoE layer forward, EP8-rank proxy ({how})", fontsize=11)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    save(fig, "layer-vs-peers", out, png)


def plot_layer_bench(plt, lines, out, png):
    """`megamoe bench layer`: split, fused, the two GEMMs alone and the floor; fused/split."""
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), height_ratios=[3, 2], sharex="col")
    drawn = False
    for col, (preset, experts) in enumerate(PROXIES):
        top, bottom = axes[0][col], axes[1][col]
        arms = {a: layer_arm(lines, preset, experts, a, "events") for a in ("split", "fused", "gemms")}
        if not arms["split"]:
            top.set_title(f"{preset}, {experts} experts: no bench layer data")
            continue
        drawn = True
        xs = sorted(arms["split"])
        for arm, label, style in (
            ("fused", "fused", dict(color="C0", marker="o", lw=2.2)),
            ("split", "split", dict(color="C1", marker="s", lw=1.6)),
            ("gemms", "our two GEMMs alone", dict(color="0.5", marker=".", lw=1.0, ls="--")),
        ):
            a = arms[arm]
            ax = [x for x in xs if x in a]
            top.plot(ax, [a[x]["median_us"] for x in ax], label=label, **style)
        top.plot(xs, [arms["split"][x]["floor_us"] for x in xs], color="k", lw=1.0, ls="-.", label="floor (SPEC §8)")
        plain_log_y(top)
        top.set_ylabel("µs per call (log)")
        top.set_title(f"{preset}, {experts} experts (one EP8 rank on one H200)")
        top.grid(True, which="both", alpha=0.3)
        fused = arms["fused"]
        fx = [x for x in xs if x in fused and fused[x].get("ratio_min") is not None]
        if fx:
            ratio = [fused[x]["median_us"] / arms["split"][x]["median_us"] for x in fx]
            bottom.plot(fx, ratio, color="C0", marker="o", label="fused / split")
            bottom.fill_between(
                fx,
                [fused[x]["ratio_min"] for x in fx],
                [fused[x]["ratio_max"] for x in fx],
                color="C0",
                alpha=0.2,
                label="per-round band",
            )
        bottom.axhline(1.0, color="k", lw=1.0)
        bottom.set_ylabel("fused / split")
        bottom.legend(fontsize=8, loc="upper left")
        tokens_axis(bottom, xs)
    if not drawn:
        plt.close(fig)
        return
    axes[0][0].legend(fontsize=8, loc="upper left")
    fig.suptitle("megamoe bench layer: EP8-rank proxy, CUDA events, arms interleaved, median of 20", fontsize=11)
    fig.tight_layout()
    save(fig, "layer-bench", out, png)


DISPATCH_ARMS = (
    ("dispatch_with_permute", "dispatch_with_permute", "C0"),
    ("combine_with_unpermute exact", "combine_with_unpermute (exact)", "C1"),
    ("dispatch alone (no permute)", "dispatch alone (no permute)", "0.6"),
    ("NCCL a2a-v + 2 permutes (Megatron path)", "NCCL all-to-all-v + 2 permutes", "C3"),
)


def plot_dispatch(plt, lines, peers, out, png):
    """Dispatch and combine with fused permute: the settings at the default SMs, and by SM count."""
    rows = [d for d in lines if d["bench"] == "dispatch" and d.get("routing", "uniform") == "uniform"]
    if not rows:
        return
    sms_default = statistics.mode(d["sms"] for d in rows if d["arm"] == "dispatch_with_permute")

    def setting(d):
        return d["preset"], d["ranks"], d.get("gpus"), d["tokens"], d["dtype"]

    settings = sorted({setting(d) for d in rows}, key=lambda s: (s[0], s[1], -(s[2] or 0), -s[3], s[4]))
    groups = len(settings) + (1 if peers["dispatch"] else 0)
    fig, (left, right) = plt.subplots(1, 2, figsize=(6 + 1.5 * groups, 5.8), width_ratios=[0.8 * groups, 2])
    width = 0.8 / len(DISPATCH_ARMS)
    labels = []
    for i, s in enumerate(settings):
        preset, ranks, gpus, tokens, dtype = s
        on = f"{ranks} ranks on {gpus} GPU{'s' if gpus != 1 else ''}" if gpus else f"{ranks} ranks, GPUs unrecorded"
        labels.append(f"{preset}, {tokens} tok/rank\n{dtype.upper()}\n{on}")
        for j, (arm, label, color) in enumerate(DISPATCH_ARMS):
            d = next((d for d in rows if setting(d) == s and d["sms"] == sms_default and d["arm"] == arm), None)
            if d is None:
                continue
            x = i + (j - (len(DISPATCH_ARMS) - 1) / 2) * width
            left.bar(x, d["median_us"], width, color=color, label=label if i == 0 else None)
            left.plot(
                [x - width / 2, x + width / 2],
                [d["floor_us"]] * 2,
                color="k",
                lw=2,
                label="floor (SPEC §8)" if (i, j) == (0, 0) else None,
            )
    hyb = peers["dispatch"]
    if hyb:
        i = len(settings)
        labels.append("HybridEP, flash, 4096\nBF16\nits default SMs")
        for k, p in enumerate(hyb):
            for m, (key, color) in enumerate((("dispatch_us", "C0"), ("combine_us", "C1"))):
                x = i + (2 * k + m - 1.5) * width
                left.bar(
                    x, p[key], width, color=color, hatch="//" if p["kind"] == "fused" else "..", edgecolor="k", lw=0.5
                )
                left.text(x, p[key] + 8, p["kind"], rotation=90, ha="center", va="bottom", fontsize=7)
    left.set_xticks(range(len(labels)))
    left.set_xticklabels(labels, fontsize=8)
    left.set_ylabel("µs per call (slowest rank)")
    left.set_title(f"megamoe at {sms_default} SMs per rank, and HybridEP on the same machine")
    left.grid(True, axis="y", alpha=0.3)
    left.set_ylim(0, 1.15 * max(max(p["dispatch_us"], p["combine_us"]) for p in hyb) if hyb else None)
    # by SM count, for the setting with the most SM counts
    best = max(settings, key=lambda s: len({d["sms"] for d in rows if setting(d) == s}))
    for arm, label, color in DISPATCH_ARMS:
        got = sorted((d["sms"], d["median_us"], d["floor_us"]) for d in rows if setting(d) == best and d["arm"] == arm)
        if got:
            right.plot([g[0] for g in got], [g[1] for g in got], marker="o", color=color, label=label)
    for arm, color in (("dispatch_with_permute", "C0"), ("combine_with_unpermute exact", "C1")):
        got = [d["floor_us"] for d in rows if setting(d) == best and d["arm"] == arm]
        if got:
            right.axhline(got[0], color=color, ls="-.", lw=1)
    right.set_xlabel("SMs per rank")
    right.set_ylabel("µs per call")
    right.set_ylim(bottom=0)
    right.set_title(f"{best[0]} {best[3]} tokens/rank, {best[4].upper()}, by SM count")
    right.grid(True, alpha=0.3)
    handles, labels = left.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=8.5, frameon=False)
    fig.suptitle(
        "Dispatch and combine with fused permute, median of 20, arms interleaved"
        " (floors: black bars, dash-dotted lines)",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    save(fig, "dispatch", out, png)


def plot_gemm(plt, lines, peers, out, png):
    """`megamoe bench gemm`: valid TFLOP/s by rows per expert, L1 and L2, beside DeepGEMM and torch."""
    rows = [d for d in lines if d["bench"] == "gemm" and not d.get("flush_l2") and d.get("tflops")]
    if not rows:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8), sharey=True)
    for ax, shape in zip(axes, ("L1", "L2")):
        for layout, style in (
            ("contiguous", dict(color="C0", marker="o", lw=2.2)),
            ("masked", dict(color="C0", marker="D", ls="none", ms=8, mfc="none")),
        ):
            got = {d["rows_per_expert"]: d for d in rows if d.get("shape") == shape and d.get("layout") == layout}
            xs = sorted(got)
            if xs:
                ax.plot(xs, [got[x]["tflops"] for x in xs], label=f"megamoe, {layout}", **style)
        for s, style in zip(
            peers["gemm"], (dict(color="C3", marker="^", lw=1.6), dict(color="0.45", marker="x", lw=1.2, ls=":"))
        ):
            xs, ys = series(s["tflops"].get(shape, {}))
            ax.plot(xs, ys, label=s["name"], **style)
        ax.axhline(1394, color="k", ls="-.", lw=1, label="FP8 dense peak measured (cuBLAS 8192³)")
        ax.set_title(f"{shape}: {'x · W1ᵀ, K 4096, N 4096' if shape == 'L1' else 'a · W2ᵀ, K 2048, N 4096'}")
        ax.set_ylim(0, 1500)
        ax.set_ylabel("valid TFLOP/s")
        xs = sorted({d["rows_per_expert"] for d in rows})
        tokens_axis(ax, xs)
        ax.set_xlabel("rows per expert (mean; 128 local experts)")
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle(
        "FP8 block-scaled grouped GEMM, flash's shapes, one H200, median of 20 (higher is better)", fontsize=11
    )
    fig.tight_layout()
    save(fig, "gemm", out, png)


def plot_accuracy(plt, lines, peers, out, png):
    """diff (SPEC §3) against hidden size: megamoe and the seed's kernel, and SPEC's bound."""
    acc = [d for d in lines if d["bench"] == "accuracy"]
    fig, ax = plt.subplots(figsize=(8, 5))
    by_h = {}
    for d in acc:
        by_h.setdefault(d["hidden"], []).append(d["diff"])
    if by_h:
        hs = sorted(by_h)
        med = [statistics.median(by_h[h]) for h in hs]
        lo = [med[i] - min(by_h[h]) for i, h in enumerate(hs)]
        hi = [max(by_h[h]) - med[i] for i, h in enumerate(hs)]
        n = sum(len(v) for v in by_h.values())
        ax.errorbar(
            hs,
            med,
            yerr=[lo, hi],
            color="C0",
            marker="o",
            capsize=4,
            ls="none",
            label=f"megamoe against its CPU reference (median, min–max of {n} checks)",
        )
    ref = peers["accuracy"]
    for s in ref["series"]:
        if "points" in s:
            xs, ys = series(s["points"])
            ax.plot(xs, ys, color="C3", marker="^", lw=1.8, label=f"{s['name']}, against DeepGEMM's f32 reference")
        if "range" in s:
            r = s["range"]
            ax.fill_between(
                [r["hidden_min"], r["hidden_max"]],
                [r["diff_min"]] * 2,
                [r["diff_max"]] * 2,
                color="C0",
                alpha=0.2,
                label=f"{s['name']}, against DeepGEMM's f32 reference (range)",
            )
    ax.axhline(1e-4, color="k", ls="-.", lw=1, label="SPEC §3 bound, 1e-4")
    ax.set_xscale("log", base=2)
    ticks = sorted(set(by_h) | {1024, 4096, 7168})
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_yscale("log")
    ax.set_ylim(1e-6, 4e-4)
    ax.set_xlabel("hidden size H")
    ax.set_ylabel("diff = Σ(x−y)² / Σ(x²+y²)  (log)")
    ax.set_title("Accuracy of the FP8 layer against hidden size (lower is better)", fontsize=11)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    save(fig, "accuracy", out, png)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", help="JSON Lines read after --data's, replacing its cells")
    p.add_argument("--data", default="docs/perf/data")
    p.add_argument("--out", default="docs/figures")
    p.add_argument("--png", help="also write PNGs into this folder")
    p.add_argument("--check", action="store_true", help="validate the inputs, draw nothing")
    args = p.parse_args()
    for f in args.files:
        if not os.path.isfile(f):
            p.error(f"files: {f} is not a file")
    try:
        lines = read_lines(sorted(glob.glob(os.path.join(args.data, "*.jsonl"))) + args.files)
        peers = read_peers(os.path.join(args.data, "peers.json"))
    except (InputError, OSError, json.JSONDecodeError) as e:
        sys.exit(f"plot_perf: {e}")
    counts = {}
    for d in lines:
        counts[d["bench"]] = counts.get(d["bench"], 0) + 1
    print("plot_perf: " + ", ".join(f"{n} {b} cells" for b, n in sorted(counts.items())))
    if args.check:
        return
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "megamoe"  # the same SVG bytes for the same data
    import matplotlib.pyplot as plt

    os.makedirs(args.out, exist_ok=True)
    if args.png:
        os.makedirs(args.png, exist_ok=True)
    plot_layer_vs_peers(plt, lines, peers, args.out, args.png)
    plot_layer_bench(plt, lines, args.out, args.png)
    plot_dispatch(plt, lines, peers, args.out, args.png)
    plot_gemm(plt, lines, peers, args.out, args.png)
    plot_accuracy(plt, lines, peers, args.out, args.png)
    print(f"plot_perf: figures in {args.out}")


if __name__ == "__main__":
    main()
