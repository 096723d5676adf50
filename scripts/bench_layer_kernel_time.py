"""The layer's kernel time as PyTorch's profiler records it (CUPTI: from each kernel's start to
its end on the device, as DeepGEMM's own benchmark harness measures its kernels). `megamoe bench
layer` reports CUDA-event time of calls run back to back instead (launch latency included, the
clock held down by the 700 W cap): docs/PERF.md compares the two.

    python scripts/bench_layer_kernel_time.py [--preset flash|pro] [--tokens 64,1024,...]
                                              [--kind fused,split] [--calls 20] [--flush-gb 8]
                                              [--accumulation per-block|rescaled]

One rank, the EP8-rank proxy (flash with 32 experts, pro with 48; SPEC §9), buffers for 8192
tokens, FP8 input (the tuple form, so no quantizer runs), routing of uniformly random distinct
experts. Per cell: the median over calls of the summed duration of the layer's kernels in each
call (fused: its one kernel; split: dispatch, the two GEMMs and combine; a forward without `y`
copies the inputs into the buffer, which runs no kernel), then each kernel's median; the two
kinds are checked bit-equal first. Before each call an 8 GB memset flushes the L2 cache, as DeepGEMM's harness does
("--flush-gb 0": none); it also lets the clock recover from the 700 W cap between calls, where
`megamoe bench layer` runs its calls back to back.
"""

import argparse
import json
import os
import statistics
import tempfile

import torch

import megamoe
from megamoe import torch_reference as ref
from megamoe.ep import quantize_fp8

PRESETS = {"flash": (4096, 2048, 32, 6), "pro": (7168, 3072, 48, 6)}


def kernels_per_call(trace_path):
    """Per call (the host ranges named call_<i>, each closed by a synchronize, so every kernel of
    the call starts inside it): its kernels' names and durations, µs."""
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    calls = sorted(
        (
            e
            for e in events
            if e.get("name", "").startswith("call_") and e.get("ph") == "X" and e.get("cat") == "user_annotation"
        ),
        key=lambda e: e["ts"],
    )
    kernels = [e for e in events if e.get("cat") == "kernel"]
    out = []
    for c in calls:
        lo, hi = c["ts"], c["ts"] + c["dur"]
        out.append([(short_name(k["name"]), k["dur"]) for k in kernels if lo <= k["ts"] < hi])
    return out


def short_name(kernel):
    """A kernel's name without its return type, namespace, template arguments and parameters."""
    return kernel.split("(")[0].split("<")[0].split()[-1].split("::")[-1]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="flash", choices=sorted(PRESETS))
    p.add_argument("--tokens", default="64,256,1024,4096,8192")
    p.add_argument("--kind", default="fused,split")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--flush-gb", type=float, default=8.0)
    p.add_argument("--accumulation", default="per-block", help="per-block (default) or rescaled")
    args = p.parse_args()
    hidden, inter, experts, topk = PRESETS[args.preset]
    tokens_list = [int(t) for t in args.tokens.split(",")]
    kinds = args.kind.split(",")
    gen = torch.Generator(device="cuda").manual_seed(0)
    weights = ref.random_weights(experts, hidden, inter, generator=gen)
    layers = {}
    for kind in kinds:
        layers[kind] = megamoe.get_symm_buffer_for_mega_moe(
            1, experts, 8192, topk, hidden, inter, kind=kind, accumulation=args.accumulation
        )
        layers[kind].load_weights(*weights)
    print(
        f"{args.preset} ({experts} experts), one rank, buffers for 8192 tokens, FP8 input, "
        f"{args.accumulation} accumulation; "
        f"median of {args.calls} calls, µs; L2 flush {args.flush_gb:g} GB"
    )
    print(f"{'tokens':>6} {'kind':>6} {'kernel us':>10}")
    for tokens in tokens_list:
        x, idx, w = ref.random_batch(tokens, hidden, experts, topk, generator=gen)
        xq = quantize_fp8(x)
        want = None
        for kind in kinds:
            layer = layers[kind]
            y = layer.forward(xq, idx, w)  # warm-up, and the output to check
            if want is None:
                want = y
            elif not torch.equal(y, want):
                raise SystemExit(f"{tokens} tokens: {kind} differs from {kinds[0]} in bits")
            for _ in range(2):
                layer.forward(xq, idx, w)
            torch.cuda.synchronize()
            with torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CUDA, torch.profiler.ProfilerActivity.CPU]
            ) as prof:
                for i in range(args.calls):
                    if args.flush_gb > 0:
                        torch.empty(int(args.flush_gb * 1e9) // 4, dtype=torch.int, device="cuda").zero_()
                        torch.cuda.synchronize()  # the memset ends before the call's range opens
                    with torch.profiler.record_function(f"call_{i}"):
                        layer.forward(xq, idx, w)
                        torch.cuda.synchronize()
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "trace.json")
                prof.export_chrome_trace(path)
                per_call = kernels_per_call(path)
            k_us = [sum(us for _, us in call) for call in per_call]
            if len(k_us) != args.calls or min(k_us) <= 0:
                raise SystemExit(f"{tokens} tokens, {kind}: found {len(k_us)} calls in the trace")
            print(f"{tokens:>6} {kind:>6} {statistics.median(k_us):>10.1f}", flush=True)
            # Each kernel's median beside the sum: where a call runs several kernels (split),
            # which of them the time is in.
            names = dict.fromkeys(name for call in per_call for name, _ in call)
            parts = [
                f"{name} {statistics.median(sum(us for n, us in call if n == name) for call in per_call):.1f}"
                for name in names
            ]
            print(f"{'':>13} of which: {', '.join(parts)}", flush=True)


if __name__ == "__main__":
    main()
