#!/usr/bin/env python3
"""Times torch._scaled_grouped_mm (rowwise FP8) on the cases `megamoe bench gemm --json`
measured (same N, K and per-expert group sizes) and prints both side by side with the floor.

usage: bench_gemm_torch.py RESULTS.jsonl
"""

import json
import sys

import torch

PEAK = 1394e12
HBM = 4.2e12


def time_us(fn, warmup=3, iters=20):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    times.sort()
    return times[len(times) // 2]


def torch_case(case):
    n, k, sizes = case["n"], case["k"], case["group_sizes"]
    e, m = len(sizes), sum(sizes)
    dev = "cuda"
    a = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
    w = torch.randn(e, n, k, device=dev).to(torch.float8_e4m3fn)
    sa = torch.rand(m, device=dev, dtype=torch.float32)
    sb = torch.rand(e, n, device=dev, dtype=torch.float32)
    offs = torch.tensor(sizes, device=dev, dtype=torch.int32).cumsum(0, dtype=torch.int32)

    def fn():
        return torch._scaled_grouped_mm(a, w.transpose(-2, -1), sa, sb, offs=offs, out_dtype=torch.bfloat16)

    return time_us(fn)


def main():
    cases = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    rows = []
    timed = {}  # the same group sizes under several paddings are timed once
    for c in cases:
        key = (c["n"], c["k"], tuple(c["group_sizes"]))
        if key not in timed:
            try:
                timed[key] = torch_case(c)
            except Exception as ex:  # report, keep going
                print(f"torch failed on {c['shape']} {c['rows_per_expert']}: {ex}", file=sys.stderr)
                timed[key] = float("nan")
            torch.cuda.empty_cache()  # the case's operands are freed once it returns
        t = timed[key]
        flops = 2.0 * sum(c["group_sizes"]) * c["n"] * c["k"]
        rows.append((c, t, flops / (t * 1e-6) / 1e12))
    print(
        "| shape | layout | rows/expert | megamoe µs | TFLOP/s | floor µs | ×floor | DeepGEMM µs | torch µs | torch TFLOP/s | megamoe / torch |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for c, t, tf in rows:
        print(
            f"| {c['shape']} | {c['layout']} {c.get('pad') or ''} | {c['rows_per_expert']} | {c['median_us']:.1f} | {c['tflops']:.0f} | "
            f"{c['floor_us']:.1f} | {c['median_us'] / c['floor_us']:.2f} | {c['deepgemm_us']} | {t:.1f} | {tf:.0f} | "
            f"{c['median_us'] / t:.2f} |"
        )


if __name__ == "__main__":
    main()
