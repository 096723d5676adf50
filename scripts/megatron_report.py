"""The summary of a Megatron session (scripts/megatron_checks.py's JSON in DIR): the training loss
plot (DIR/megatron-train-loss.svg, with matplotlib) and a table of every check, printed and
written to DIR/report.txt; with --markdown, the tables for docs/ instead (printed only).

    python scripts/megatron_report.py DIR [--markdown]
"""

import json
import os
import sys


def load(out, name):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def plot(train, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    styles = {
        "flex_megamoe": ("flex + megamoe", "-"),
        "alltoall": ("alltoall", "--"),
        "alltoall_seed2": ("alltoall, another seed", ":"),
    }
    for key, losses in train["losses"].items():
        label, style = styles.get(key, (key, "-"))
        ax.plot(range(1, len(losses) + 1), losses, style, label=label)
    c = train["config"]
    ax.set_title(
        f"GPTModel, {c['layers']} MoE layers, {c['experts']} experts top-{c['topk']}, "
        f"H {c['hidden']}, {c['batch']}x{c['seq']} tokens"
    )
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def table(out):
    lines = []
    imports = load(out, "imports.json")
    if imports:
        lines.append(
            f"imports     HybridEPBuffer = {imports['HybridEPBuffer']}, HAVE_DEEP_EP = {imports['HAVE_DEEP_EP']}"
        )
    for r in load(out, "containers.json") or []:
        lines.append(
            f"container   {r['test']:<26} fused={str(r['fused']):<5} {'ok' if r['ok'] else 'FAIL ' + str(r['error'])}"
        )
    for r in load(out, "parity.json") or []:
        lines.append(
            f"parity      {r['case']:<13} fused={str(r['fused']):<5} output rel {r['output'][1]:.2e}, "
            f"input grad rel {r['input_grad'][1]:.2e}, worst rel {r['worst_relative']:.2e} "
            f"{'ok' if r['ok'] else 'FAIL'}"
        )
    train = load(out, "train_losses.json")
    if train:
        s = train["summary"]
        final = ", ".join(f"{k} {v:.4f}" for k, v in s["final"].items())
        lines.append(
            f"train       {s['steps']} steps; final {final}; mean |d| last steps {s['mean_abs_diff_last']:.4f} "
            f"(seed noise {s['seed_noise_mean_abs_diff_last']:.4f})"
        )
    speed = load(out, "speed.json")
    if speed:
        lines.append(
            "speed       T     E  k  layer a2a ms  layer flex ms  flex all SMs ms  loop torch us  loop mm blk us  loop mm nb us  host d/c us  of it ep d/c us"
        )
        for r in speed:
            nb = r.get("loop_megamoe_nonblocking_us")
            host = f"{r['host_dispatch_us']:.0f}/{r['host_combine_us']:.0f}" if "host_dispatch_us" in r else "-"
            host_ep = (
                f"{r['host_ep_dispatch_us']:.0f}/{r['host_ep_combine_us']:.0f}" if "host_ep_dispatch_us" in r else "-"
            )
            lines.append(
                f"            {r['tokens']:<5} {r['experts']:<2} {r['topk']}  {r['layer_alltoall_ms']:12.2f}  "
                f"{r['layer_flex_ms']:13.2f}  {r['layer_flex_allsms_ms']:15.2f}  {r['loop_torch_us']:13.0f}  "
                f"{r['loop_megamoe_blocking_us']:14.0f}  "
                f"{'-' if nb is None else f'{nb:13.0f}':>13}  {host:>11}  {host_ep:>14}"
            )
        sweep = {k: v for r in speed for k, v in r.items() if k.startswith("loop_megamoe_blocking_") and "sms" in k}
        if sweep:
            lines.append(
                "speed       first cell, blocking loop by SMs: "
                + ", ".join(f"{k[22:-3]} {v:.0f} us" for k, v in sweep.items())
            )
    return lines


def markdown(out):
    lines = []
    rows = load(out, "containers.json") or []
    if rows:
        lines += ["| Megatron test (tp = ep = 1, hybridep) | fusion | result |", "|---|---|---|"]
        lines += [
            f"| `{r['test']}` | {'on' if r['fused'] else 'off'} | {'pass' if r['ok'] else 'FAIL: ' + str(r['error'])} |"
            for r in rows
        ]
        lines.append("")
    rows = load(out, "parity.json") or []
    if rows:
        lines += [
            "| case | fusion | output max abs / rel | input grad max abs / rel | router grad rel | worst expert grad rel |",
            "|---|---|---|---|---|---|",
        ]
        for r in rows:
            params = r["params"]
            router = [v[1] for n, v in params.items() if "router" in n]
            experts = [v[1] for n, v in params.items() if "experts" in n]
            lines.append(
                f"| {r['case']} | {'on' if r['fused'] else 'off'} | {r['output'][0]:.2g} / {r['output'][1]:.2g} | "
                f"{r['input_grad'][0]:.2g} / {r['input_grad'][1]:.2g} | "
                f"{max(router) if router else float('nan'):.2g} | {max(experts) if experts else float('nan'):.2g} |"
            )
        lines.append("")
    speed = load(out, "speed.json") or []
    if speed:
        lines += [
            "| T, experts, top-k | layer alltoall | layer flex + megamoe | flex, all SMs | "
            "loop: torch permute + unpermute | loop: megamoe blocking | loop: megamoe non-blocking |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in speed:
            nb = r.get("loop_megamoe_nonblocking_us")
            lines.append(
                f"| {r['tokens']}, {r['experts']}, {r['topk']} | {r['layer_alltoall_ms']:.2f} ms | {r['layer_flex_ms']:.2f} ms | "
                f"{r['layer_flex_allsms_ms']:.2f} ms | {r['loop_torch_us']:.0f} µs | {r['loop_megamoe_blocking_us']:.0f} µs | "
                f"{'-' if nb is None else f'{nb:.0f} µs'} |"
            )
        lines.append("")
    return lines


def main():
    out = sys.argv[1]
    if "--markdown" in sys.argv[2:]:
        print("\n".join(markdown(out)))
        return
    lines = table(out)
    train = load(out, "train_losses.json")
    if train:
        try:
            plot(train, os.path.join(out, "megatron-train-loss.svg"))
            lines.append(f"plot        {os.path.join(out, 'megatron-train-loss.svg')}")
        except ImportError:
            lines.append("plot        matplotlib is not installed: no plot")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(out, "report.txt"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
