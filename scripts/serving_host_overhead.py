"""Host time per call of the serving entry points at decode, and a CUDA graph replay's time against
the layer's kernel time.

    python scripts/serving_host_overhead.py [--presets flash,pro] [--tokens 64] [--calls 200]

One rank (world size 1), the EP8-rank proxies (flash with 32 experts, pro with 48; SPEC §9),
buffers for 8192 tokens, a decode batch of `--tokens` tokens with num_tokens_bound = that batch,
uniformly random distinct experts. Per preset:

- host µs per call, eager: the median over `--calls` calls, each timed alone, the GPU drained
  every 4 calls outside the timing (so a full launch queue never blocks a call; fp8_mega_moe also
  with the GPU idle at every call): megamoe.deep_gemm's
  fp8_mega_moe (fused buffer, FP8 staging tensors), the native call under it alone (its arguments
  prepared once: the rest is Python's checks), MoELayer.forward given y (FP8 input), and for
  comparison MoELayer.forward without y (values checked on the host, synchronizes);
- host µs per graph replay: CUDAGraph.replay() of one captured decode step (fp8_mega_moe), the
  same way;
- device µs per replay: CUDA events around `--calls` replays back to back, and the replay's
  period in 50 profiled replays (one replay's first kernel start to the next's), against the
  layer's kernel time in those same replays (the profiler's durations: the fused kernel, the
  staging kernel before it, every kernel of the step); the ratios use the period, so both sides
  come from one loop. The target is a pro replay within 2 % of the layer's kernel time.

Prints a markdown table and one JSON line per preset.
"""

import argparse
import json
import os
import statistics
import tempfile
import time

import torch

import megamoe.deep_gemm as deep_gemm
from megamoe import torch_reference as ref

PRESETS = {"flash": (4096, 2048, 32, 6), "pro": (7168, 3072, 48, 6)}
CAPACITY = 8192


def host_us(call, calls, drain=4):
    """Host µs of one call: the median over `calls` calls, each timed alone, the GPU drained
    every `drain` calls (outside the timing) so that a full launch queue never blocks one
    (drain=1: every call finds the GPU idle)."""
    call()
    torch.cuda.synchronize()
    times = []
    for i in range(calls):
        t0 = time.perf_counter_ns()
        call()
        times.append(time.perf_counter_ns() - t0)
        if i % drain == drain - 1:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return statistics.median(times) / 1e3


def replay_device_us(graph, calls):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    torch.cuda.synchronize()
    start.record()
    for _ in range(calls):
        graph.replay()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) * 1e3 / calls


def kernel_us(graph, calls):
    """Per replay, medians over `calls` replays back to back under the profiler: (the replay's
    period, from one replay's first kernel start to the next's; the fused kernel's duration; the
    staging kernel's; every kernel's of the replay; kernels per replay). Period and kernels come
    from the same replays, so a clock that drifts between loops moves both."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            graph.replay()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    fused = [k["dur"] for k in kernels if k["name"].startswith("layer_fused")]
    stage = [k["dur"] for k in kernels if k["name"] == "layer_stage"]
    per_step = len(kernels) // calls
    steps = [sum(k["dur"] for k in kernels[i * per_step : (i + 1) * per_step]) for i in range(calls)]
    starts = [kernels[i * per_step]["ts"] for i in range(calls)]
    period = statistics.median(b - a for a, b in zip(starts, starts[1:]))
    return (period, statistics.median(fused), statistics.median(stage), statistics.median(steps), per_step)


def measure(preset, tokens, calls):
    h, i, e, k = PRESETS[preset]
    gen = torch.Generator(device="cuda").manual_seed(0)
    weights = ref.random_weights(e, h, i, generator=gen)
    x, idx, w = ref.random_batch(tokens, h, e, k, generator=gen)
    qx, sx = ref.quantize(x, 128, ref.INPUT_FLOOR)
    y = torch.empty((tokens, h), dtype=torch.bfloat16, device="cuda")

    buffer = deep_gemm.get_symm_buffer_for_mega_moe(None, e, CAPACITY, k, h, i, fused=True)
    l1, l2 = deep_gemm.transform_weights_for_mega_moe_sm90(weights[:2], weights[2:])
    buffer.x[:tokens].copy_(qx)
    buffer.x_sf[:tokens].copy_(sx)
    buffer.topk_idx[:tokens].copy_(idx)
    buffer.topk_weights[:tokens].copy_(w)

    def step():
        deep_gemm.fp8_mega_moe(y, l1, l2, buffer, num_tokens_bound=tokens)

    out = dict(preset=f"{preset}/{e}", tokens=tokens)
    out["fp8_mega_moe_host_us"] = host_us(step, calls)
    out["fp8_mega_moe_idle_host_us"] = host_us(step, max(calls // 4, 10), drain=1)
    layer = buffer.layer
    out["forward_y_host_us"] = host_us(lambda: layer.forward((qx, sx), idx, w, num_tokens_bound=tokens, y=y), calls)
    # The native call alone, its arguments prepared once: what the Python checks add on top.
    x_ptr, xsf_ptr, idx_ptr, w_ptr = buffer._staging
    staged = [(tokens, x_ptr, xsf_ptr, idx_ptr, True, w_ptr, y.data_ptr(), None)]
    streams = [torch.cuda.current_stream().cuda_stream]
    out["native_launch_host_us"] = host_us(lambda: layer._native.launch(staged, tokens, streams), calls)
    out["forward_sync_host_us"] = host_us(
        lambda: layer.forward((qx, sx), idx, w, num_tokens_bound=tokens), max(calls // 10, 5)
    )
    layer.check()

    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        step()
    out["replay_host_us"] = host_us(graph.replay, calls)
    out["replay_events_us"] = replay_device_us(graph, calls)
    period, fused, stage, every, per_step = kernel_us(graph, min(calls, 50))
    out.update(
        replay_period_us=period,
        fused_kernel_us=fused,
        stage_kernel_us=stage,
        step_kernels_us=every,
        kernels_per_step=per_step,
    )
    out["replay_over_fused_kernel"] = period / fused
    out["replay_over_step_kernels"] = period / every
    layer.check()
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", default="flash,pro")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--calls", type=int, default=200)
    args = p.parse_args()
    rows = []
    for preset in args.presets.split(","):
        rows.append(measure(preset, args.tokens, args.calls))
        torch.cuda.empty_cache()  # the preset's layer and graph are freed once measure returns
    print(
        "| preset | T | fp8_mega_moe host µs | same, GPU idle | native launch µs | "
        "forward(y) host µs | forward (sync) µs | "
        "replay host µs | replay µs (events) | replay period µs | fused kernel µs | "
        "staging kernel µs | "
        "step kernels µs (n) | replay / fused kernel | replay / step kernels |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['preset']} | {r['tokens']} | {r['fp8_mega_moe_host_us']:.1f} | "
            f"{r['fp8_mega_moe_idle_host_us']:.1f} | "
            f"{r['native_launch_host_us']:.1f} | "
            f"{r['forward_y_host_us']:.1f} | {r['forward_sync_host_us']:.1f} | "
            f"{r['replay_host_us']:.1f} | {r['replay_events_us']:.1f} | "
            f"{r['replay_period_us']:.1f} | "
            f"{r['fused_kernel_us']:.1f} | {r['stage_kernel_us']:.1f} | "
            f"{r['step_kernels_us']:.1f} ({r['kernels_per_step']}) | "
            f"{r['replay_over_fused_kernel']:.4f} | {r['replay_over_step_kernels']:.4f} |"
        )
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
