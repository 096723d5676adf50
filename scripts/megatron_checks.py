"""Megatron-Core's own MoE code on megamoe's HybridEP-compatible buffer (docs/INTEGRATION.md).

    python scripts/megatron_checks.py CHECK --out DIR [--megatron-src TREE]

CHECK is one of:
  imports     `deep_ep` resolves to megamoe's buffer inside Megatron (fused_a2a), and DeepEP's
              other buffer stays off.
  containers  Megatron's test container (tests/unit_tests/transformer/moe/test_token_dispatcher.py
              in TREE) runs dispatcher_dropless_test and dispatcher_capacity_test with the flex
              dispatcher, backend hybridep, fusion off and on (tp = 1, ep = the world size).
  parity      one MoELayer, flex + megamoe against Megatron's alltoall dispatcher with the same
              weights: output, input gradient, router gradient, every expert gradient; dropless
              (blocking calls) and drop-and-pad (capacity factor 1, non-blocking calls).
  train       a small GPT (Megatron's GPTModel, local spec, MoE layers) trained for --steps steps
              with flex + megamoe, with alltoall, and with alltoall from another seed (the noise
              band); losses in DIR/train_losses.json.
  speed       the MoELayer forward + backward per step (flex + megamoe beside alltoall), and the
              dispatch + combine loop alone (megamoe through Megatron's hybrid_ep_dispatch /
              hybrid_ep_combine, blocking and non-blocking, beside Megatron's torch permute +
              unpermute), CUDA events, median of 20; host time per call; DIR/speed.json.

One process per GPU: run it plainly on one GPU (world of one), or under
`torchrun --nproc_per_node N` (ep = N). Each check prints its numbers and a PASS/FAIL line, writes
DIR/<check>.json, and exits 1 on a failure.
"""

import argparse
import collections
import functools
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from bench_gemm_torch import time_us  # CUDA events, 3 warm-ups, median of 20 (scripts/)

ARGS = None


def log(*a):
    if rank() == 0:
        print(*a, flush=True)


def rank():
    return dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))


def world_size():
    return int(os.environ.get("WORLD_SIZE", "1"))


def write(name, data):
    if rank() == 0:
        os.makedirs(ARGS.out, exist_ok=True)
        with open(os.path.join(ARGS.out, name), "w") as f:
            json.dump(data, f, indent=1)


def init_parallel():
    """torch.distributed over NCCL (a world of one without torchrun) and Megatron's groups with
    tp = 1, ep = the world size."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29531")
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl")
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, expert_model_parallel_size=world_size())
    model_parallel_cuda_manual_seed(123)


def fused_a2a():
    import megatron.core.transformer.moe.fused_a2a as fa

    return fa


def moe_config(dispatcher, hidden, experts, topk, ffn, fused=True, **extra):
    from megatron.core.transformer.transformer_config import TransformerConfig

    flex = dispatcher == "flex"
    return TransformerConfig(
        num_layers=1,
        hidden_size=hidden,
        num_attention_heads=8,
        ffn_hidden_size=ffn,
        num_moe_experts=experts,
        moe_router_topk=topk,
        moe_router_load_balancing_type="aux_loss",
        moe_aux_loss_coeff=1e-2,
        moe_router_dtype="fp32",
        moe_token_dispatcher_type=dispatcher,
        moe_flex_dispatcher_backend="hybridep" if flex else "deepep",
        moe_permute_fusion_into_hybridep=fused and flex,
        expert_model_parallel_size=world_size(),
        add_bias_linear=False,
        bf16=True,
        params_dtype=torch.bfloat16,
        use_cpu_initialization=True,
        **extra,
    )


def moe_layer(config):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_submodules
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.core.transformer.spec_utils import get_submodules

    spec = get_gpt_layer_local_submodules(num_experts=config.num_moe_experts, moe_grouped_gemm=False).mlp
    layer = MoELayer(config, get_submodules(spec)).cuda().to(torch.bfloat16)
    layer.set_layer_number(0)
    return layer


CALLS = collections.Counter()
"""The calls Megatron made of megamoe's buffer, by (method, direction, fused flag): proof that the
flex runs went through megamoe (no silent fallback) and that the fused flag reached it."""


def count_calls():
    """Wraps the buffer's two methods to count into CALLS (functools.wraps keeps the signature
    Megatron inspects for the fused flags)."""
    from megamoe.compat.hybrid_ep import HybridEPBuffer

    for name, flag, backward in (
        ("dispatch_with_permute", "fuse_permute_dispatch", "handle"),
        ("combine_with_unpermute", "fuse_unpermute_combine", "probs"),
    ):
        orig = getattr(HybridEPBuffer, name)

        def wrapper(self, *a, _orig=orig, _name=name, _flag=flag, _backward=backward, **kw):
            direction = "backward" if kw.get(_backward) is not None else "forward"
            CALLS[(_name, direction, bool(kw.get(_flag, False)))] += 1
            return _orig(self, *a, **kw)

        setattr(HybridEPBuffer, name, functools.wraps(orig)(wrapper))


def calls_seen(fused, at_least):
    """Whether each of the four calls (dispatch and combine, forward and backward) came at least
    `at_least` times with the fused flag `fused` and none came without it; logs the counts."""
    log("    megamoe buffer calls:", {f"{m} {d} fused={f}": n for (m, d, f), n in sorted(CALLS.items())})
    want = [(m, d, fused) for m in ("dispatch_with_permute", "combine_with_unpermute") for d in ("forward", "backward")]
    return all(CALLS[w] >= at_least for w in want) and sum(CALLS.values()) == sum(CALLS[w] for w in want)


# ---------------------------------------------------------------------------------------------


def check_imports():
    import inspect

    fa = fused_a2a()
    cls = getattr(fa, "HybridEPBuffer", None)
    info = {
        "HAVE_HYBRIDEP": fa.HAVE_HYBRIDEP,
        "HAVE_DEEP_EP": fa.HAVE_DEEP_EP,
        "HybridEPBuffer": None if cls is None else f"{cls.__module__}.{cls.__qualname__}",
        "fused_flag_seen": cls is not None
        and "fuse_permute_dispatch" in inspect.signature(cls.dispatch_with_permute).parameters,
    }
    # What Megatron's test container needs beyond megatron.core.
    modules = ["megatron.training.initialize"]
    if ARGS.megatron_src:
        sys.path.insert(0, ARGS.megatron_src)
        modules.append("tests.unit_tests.transformer.moe.test_token_dispatcher")
    for name in modules:
        try:
            __import__(name)
            info[name] = "ok"
        except Exception as e:  # reported: the containers check needs it
            info[name] = f"{type(e).__name__}: {e}"
    ok = (
        all(info[name] == "ok" for name in modules)
        and info["HAVE_HYBRIDEP"]
        and not info["HAVE_DEEP_EP"]
        and info["HybridEPBuffer"] == "megamoe.compat.hybrid_ep.HybridEPBuffer"
        and info["fused_flag_seen"]
    )
    log("imports:", info)
    write("imports.json", info)
    return ok


def check_containers():
    sys.path.insert(0, ARGS.megatron_src)
    from tests.unit_tests.transformer.moe.test_token_dispatcher import MoEModelTestContainer

    fa = fused_a2a()
    count_calls()
    results = []
    ep = world_size()
    for fused in (False, True):
        for test in ("dispatcher_dropless_test", "dispatcher_capacity_test"):
            extra = {}
            if test == "dispatcher_capacity_test":
                extra = dict(
                    moe_token_drop_policy="probs",
                    moe_expert_capacity_factor=0.5,
                    moe_pad_expert_input_to_capacity=False,
                )
            CALLS.clear()
            t0 = time.time()
            error = None
            try:
                container = MoEModelTestContainer(
                    tp_size=1,
                    ep_size=ep,
                    pp_size=1,
                    num_moe_experts=8,
                    moe_router_topk=2,
                    moe_router_load_balancing_type="aux_loss",
                    moe_token_dispatcher_type="flex",
                    moe_permute_fusion=False,
                    hidden_size=1024,
                    moe_flex_dispatcher_backend="hybridep",
                    test_dtype=torch.bfloat16,
                    **extra,
                )
                # The container drops moe_permute_fusion_into_hybridep into **kwargs: the layer
                # is rebuilt with it so the fused flags really reach the buffer.
                container.moe_layer = container.new_moe_layer(moe_permute_fusion_into_hybridep=fused)
                getattr(container, test)()
                del container
            except Exception as e:  # reported below, with the others
                error = f"{type(e).__name__}: {e}"
            fa.reset_hybrid_ep_buffer()
            if error is None and not calls_seen(fused, 1):
                error = f"megamoe's buffer did not see the four calls with fused={fused}: {dict(CALLS)}"
            results.append(
                dict(
                    test=test,
                    fused=fused,
                    ok=error is None,
                    error=error,
                    seconds=round(time.time() - t0, 2),
                    calls={" ".join(map(str, k)): n for k, n in CALLS.items()},
                )
            )
            log(f"container {test} fused={fused}: {'ok' if error is None else 'FAIL ' + error}")
    write("containers.json", results)
    return all(r["ok"] for r in results)


def run_layer(layer, x, grad):
    x = x.clone().requires_grad_(True)
    layer.zero_grad(set_to_none=True)
    out, _ = layer(x)
    out.backward(grad)
    torch.cuda.synchronize()
    grads = {n: p.grad.detach().float().clone() for n, p in layer.named_parameters() if p.grad is not None}
    return out.detach().float(), x.grad.detach().float(), grads


def compare(a, b):
    """max |a - b|, and ‖a - b‖ / ‖b‖."""
    d = (a - b).abs()
    return float(d.max()), float((a - b).norm() / b.norm().clamp_min(1e-30))


def check_parity():
    init_parallel()
    count_calls()
    torch.manual_seed(1234 + rank())
    rows = []
    ok = True
    cases = [
        ("dropless", {}),
        ("drop_and_pad", dict(moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True)),
    ]
    hidden, experts, topk, ffn, tokens = 1024, 8, 2, 2048, 2048
    for name, extra in cases:
        for fused in (True, False):
            ref = moe_layer(moe_config("alltoall", hidden, experts, topk, ffn, **extra))
            mm = moe_layer(moe_config("flex", hidden, experts, topk, ffn, fused=fused, **extra))
            mm.load_state_dict(ref.state_dict())
            x = torch.randn(tokens, 1, hidden, device="cuda", dtype=torch.bfloat16)
            g = torch.randn_like(x)
            CALLS.clear()
            out_r, gx_r, gw_r = run_layer(ref, x, g)
            alltoall_calls = sum(CALLS.values())
            out_m, gx_m, gw_m = run_layer(mm, x, g)
            through_megamoe = alltoall_calls == 0 and calls_seen(fused, 1)
            fused_a2a().reset_hybrid_ep_buffer()
            entry = dict(case=name, fused=fused, output=compare(out_m, out_r), input_grad=compare(gx_m, gx_r))
            missing = sorted(set(gw_r) ^ set(gw_m))
            entry["params"] = {n: compare(gw_m[n], gw_r[n]) for n in sorted(gw_r) if n in gw_m}
            worst = max([entry["output"][1], entry["input_grad"][1]] + [v[1] for v in entry["params"].values()])
            entry["worst_relative"] = worst
            entry["through_megamoe"] = through_megamoe
            entry["calls"] = {" ".join(map(str, k)): n for k, n in CALLS.items()}
            entry["ok"] = not missing and worst < 2e-2 and through_megamoe
            if missing:
                entry["missing_grads"] = missing
            ok &= entry["ok"]
            rows.append(entry)
            log(
                f"parity {name} fused={fused}: output max|d| {entry['output'][0]:.3g} rel {entry['output'][1]:.3g}; "
                f"input grad rel {entry['input_grad'][1]:.3g}; worst param grad rel "
                f"{max(v[1] for v in entry['params'].values()):.3g} over {len(entry['params'])} params"
            )
            for n, (mx, rel) in entry["params"].items():
                log(f"    {n}: max|d| {mx:.3g} rel {rel:.3g}")
            del ref, mm
    write("parity.json", rows)
    return ok


def gpt(dispatcher, seed, args):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.transformer_config import TransformerConfig

    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)
    flex = dispatcher == "flex"
    config = TransformerConfig(
        num_layers=args.layers,
        hidden_size=512,
        num_attention_heads=8,
        ffn_hidden_size=1024,
        num_moe_experts=8,
        moe_router_topk=2,
        moe_router_load_balancing_type="aux_loss",
        moe_aux_loss_coeff=1e-2,
        moe_router_dtype="fp32",
        moe_token_dispatcher_type=dispatcher,
        moe_flex_dispatcher_backend="hybridep" if flex else "deepep",
        moe_permute_fusion_into_hybridep=flex,
        expert_model_parallel_size=world_size(),
        add_bias_linear=False,
        bf16=True,
        params_dtype=torch.bfloat16,
        use_cpu_initialization=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    spec = get_gpt_layer_local_spec(num_experts=8, moe_grouped_gemm=False)
    model = (
        GPTModel(config=config, transformer_layer_spec=spec, vocab_size=args.vocab, max_sequence_length=args.seq)
        .cuda()
        .to(torch.bfloat16)
    )
    return model


def batches(args, steps):
    """A fixed synthetic language: each sequence is a random walk over a fixed successor table, so
    the loss has structure to learn."""
    g = torch.Generator().manual_seed(77 + rank())
    succ = torch.randint(0, args.vocab, (args.vocab, 4), generator=g)
    out = []
    for _ in range(steps):
        tok = torch.empty(args.batch, args.seq + 1, dtype=torch.long)
        tok[:, 0] = torch.randint(0, args.vocab, (args.batch,), generator=g)
        for s in range(args.seq):
            pick = torch.randint(0, 4, (args.batch,), generator=g)
            tok[:, s + 1] = succ[tok[:, s], pick]
        out.append(tok)
    return out


def train(dispatcher, seed, data, args):
    model = gpt(dispatcher, seed, args)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    pos = torch.arange(args.seq, device="cuda").unsqueeze(0).expand(args.batch, -1)
    losses = []
    t0 = time.time()
    for tok in data:
        tok = tok.cuda()
        loss = model(input_ids=tok[:, :-1], position_ids=pos, attention_mask=None, labels=tok[:, 1:]).float().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    fused_a2a().reset_hybrid_ep_buffer()
    return losses, time.time() - t0


def check_train():
    init_parallel()
    count_calls()
    args = ARGS
    data = batches(args, args.steps)
    runs, through = {}, {}
    for label, dispatcher, seed in (
        ("flex_megamoe", "flex", 1),
        ("alltoall", "alltoall", 1),
        ("alltoall_seed2", "alltoall", 2),
    ):
        CALLS.clear()
        losses, secs = train(dispatcher, seed, data, args)
        runs[label] = losses
        # Every MoE layer of every step went through megamoe's buffer (flex), or none (alltoall).
        through[label] = (
            calls_seen(True, args.steps * args.layers) if dispatcher == "flex" else sum(CALLS.values()) == 0
        )
        log(f"train {label}: {len(losses)} steps in {secs:.1f} s; loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    diff = [abs(a - b) for a, b in zip(runs["flex_megamoe"], runs["alltoall"])]
    noise = [abs(a - b) for a, b in zip(runs["alltoall_seed2"], runs["alltoall"])]
    tail = max(5, args.steps // 5)
    summary = dict(
        steps=args.steps,
        max_abs_diff=max(diff),
        mean_abs_diff_last=statistics.mean(diff[-tail:]),
        seed_noise_mean_abs_diff_last=statistics.mean(noise[-tail:]),
        final={k: v[-1] for k, v in runs.items()},
        calls_as_expected=through,
    )
    log("train summary:", summary)
    write(
        "train_losses.json",
        dict(
            config=dict(
                layers=args.layers,
                hidden=512,
                experts=8,
                topk=2,
                seq=args.seq,
                batch=args.batch,
                vocab=args.vocab,
                lr=args.lr,
            ),
            losses=runs,
            summary=summary,
        ),
    )
    learned = runs["flex_megamoe"][-1] < runs["flex_megamoe"][0] - 0.5
    return (
        learned
        and all(through.values())
        and summary["mean_abs_diff_last"] <= max(2 * summary["seed_noise_mean_abs_diff_last"], 0.05)
    )


def host_us(calls, iters=25, warmup=5):
    """Median host µs of the two halves of `calls` (a generator function: a dispatch, yield, its
    combine), each round started with the GPU idle."""
    first, second = [], []
    for _ in range(iters):
        torch.cuda.synchronize()
        run = calls()
        t0 = time.perf_counter()
        next(run)
        t1 = time.perf_counter()
        next(run, None)
        t2 = time.perf_counter()
        first.append(1e6 * (t1 - t0))
        second.append(1e6 * (t2 - t1))
    torch.cuda.synchronize()
    return statistics.median(first[warmup:]), statistics.median(second[warmup:])


def time_ms(fn):
    return time_us(fn) / 1000


def check_speed():
    init_parallel()
    from megatron.core.transformer.moe import moe_utils

    fa = fused_a2a()
    group = dist.new_group(list(range(world_size())))
    hidden, ffn = 4096, 2048
    all_sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    rows = []
    cells = [(4096, 8, 2), (4096, 32, 8), (8192, 8, 2), (8192, 32, 8)]
    if ARGS.quick:
        cells = cells[:1]

    def layer_arms(tokens, experts, topk):
        """The layer with both dispatchers, same weights (flex also with every SM for megamoe),
        and one step of each on the same input."""
        layers = {}
        for d in ("alltoall", "flex"):
            layers[d] = moe_layer(moe_config(d, hidden, experts, topk, ffn))
        layers["flex_allsms"] = moe_layer(
            moe_config("flex", hidden, experts, topk, ffn, moe_flex_dispatcher_num_sms=all_sms)
        )
        layers["flex"].load_state_dict(layers["alltoall"].state_dict())
        layers["flex_allsms"].load_state_dict(layers["alltoall"].state_dict())
        x = torch.randn(tokens, 1, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        g = torch.randn_like(x)

        def step(d):
            if (
                d != "alltoall"
                and fa._hybrid_ep_buffer is not None
                and fa._hybrid_ep_buffer.num_sms != (all_sms if d == "flex_allsms" else None)
            ):
                # One buffer at a time (Megatron's is global): the arm's own SM count.
                fa.reset_hybrid_ep_buffer()
            out, _ = layers[d](x)
            out.backward(g)

        return step

    # Every arm's first steps (compiles, allocations, clocks) before any timing.
    warm = layer_arms(*cells[0])
    for d in ("alltoall", "flex", "flex_allsms") * 5:
        warm(d)
    fa.reset_hybrid_ep_buffer()
    del warm
    for tokens, experts, topk in cells:
        row = dict(tokens=tokens, experts=experts, topk=topk)
        step = layer_arms(tokens, experts, topk)
        for d in ("alltoall", "flex", "flex_allsms") * 2:  # interleaved; the second round kept
            row[f"layer_{d}_ms"] = time_ms(functools.partial(step, d))
        fa.reset_hybrid_ep_buffer()
        del step
        # The loop alone: routing of top-k over random scores, probs f32.
        scores = torch.randn(tokens, experts, device="cuda")
        top = scores.topk(topk, dim=1)
        routing_map = torch.zeros(tokens, experts, dtype=torch.bool, device="cuda").scatter_(1, top.indices, True)
        probs0 = torch.zeros(tokens, experts, device="cuda").scatter_(1, top.indices, top.values.softmax(-1))
        xs = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
        gy = torch.randn_like(xs)
        n_out = tokens * topk

        def torch_loop():
            xr = xs.detach().requires_grad_(True)
            pr = probs0.detach().requires_grad_(True)
            permuted, pprobs, idx, _, _ = moe_utils.permute(xr, routing_map, probs=pr, num_out_tokens=n_out)
            out = moe_utils.unpermute(
                (permuted * pprobs.unsqueeze(-1)).to(torch.bfloat16), idx, xr.shape, routing_map=routing_map
            )
            out.backward(gy)

        def megamoe_loop(bound, sms=None):
            xr = xs.detach().requires_grad_(True)
            pr = probs0.detach().requires_grad_(True)
            rows_, rprobs, _, _, handle = fa.hybrid_ep_dispatch(
                x=xr,
                routing_map=routing_map,
                probs=pr,
                group=group,
                num_local_experts=experts // world_size(),
                fused=True,
                num_permuted_tokens=bound,
                num_sms_dispatch_api=sms,
                num_sms_combine_api=sms,
            )
            out = fa.hybrid_ep_combine(
                x=(rows_ * rprobs.unsqueeze(-1)).to(torch.bfloat16),
                handle=handle,
                num_permuted_tokens=bound,
                pad_multiple=None,
                fused=True,
            )
            out.backward(gy)

        bound = n_out if world_size() == 1 else None
        for _ in range(2):
            row["loop_torch_us"] = time_us(torch_loop)
            row["loop_megamoe_blocking_us"] = time_us(lambda: megamoe_loop(None))
            if bound is not None:
                row["loop_megamoe_nonblocking_us"] = time_us(lambda: megamoe_loop(bound))
        if (tokens, experts, topk) == cells[0] and rank() == 0:
            # Where the loop's device time goes: a kernel and copy profile of 5 loops each.
            from torch.profiler import ProfilerActivity, profile

            with open(os.path.join(ARGS.out, "loop_profile.txt"), "w") as f:
                for name, loop in (
                    ("torch permute + unpermute", torch_loop),
                    ("megamoe blocking", lambda: megamoe_loop(None)),
                    ("megamoe non-blocking", lambda: megamoe_loop(bound)),
                ):
                    if bound is None and "non-blocking" in name:
                        continue
                    loop()
                    torch.cuda.synchronize()
                    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                        for _ in range(5):
                            loop()
                        torch.cuda.synchronize()
                    f.write(f"== {name}: 5 loops\n")
                    try:
                        table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=30)
                    except (KeyError, AttributeError):  # older torch names the column cuda
                        table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=30)
                    f.write(table + "\n")
        if (tokens, experts, topk) == cells[0]:
            # SMs per megamoe call (Megatron's moe_flex_dispatcher_num_sms), blocking loop.
            for sms in (24, 48, 96, all_sms):
                fa.reset_hybrid_ep_buffer()
                row[f"loop_megamoe_blocking_{sms}sms_us"] = time_us(lambda: megamoe_loop(None, sms))
            fa.reset_hybrid_ep_buffer()
        # Host time of one non-blocking call (no device wait inside): dispatch and combine.
        if bound is not None:
            megamoe_loop(bound)  # the buffer, with megamoe's default SMs
            buf = fa._hybrid_ep_buffer

            def compat_calls():
                rows_, _, _, _, h = buf.dispatch_with_permute(
                    hidden=xs,
                    routing_map=routing_map,
                    probs=probs0,
                    num_of_experts_per_rank=experts,
                    num_permuted_tokens=bound,
                    non_blocking=True,
                    fuse_permute_dispatch=True,
                )
                yield
                buf.combine_with_unpermute(hidden=rows_, handle=h, fuse_unpermute_combine=True)

            row["host_dispatch_us"], row["host_combine_us"] = host_us(compat_calls)
            # The same calls' megamoe.ep part alone (routing already in top-k form): what is
            # left is the buffer's own Python (checks, the routing's conversion).
            from megamoe import ep as mep

            idx, pk = buf._topk(routing_map, probs0, buf._ep.num_topk)

            def ep_calls():
                state = buf._new_state(mep)
                rows_, _, _, _ = mep.run_dispatch(buf._ep, state, [xs], None, [idx], [pk], 1, bound)
                yield
                mep.run_combine(buf._ep, state, rows_, "per_rank", None, wait=False)

            row["host_ep_dispatch_us"], row["host_ep_combine_us"] = host_us(ep_calls)
            if (tokens, experts, topk) == cells[0] and rank() == 0:
                # Where the host time goes: 50 non-blocking dispatch + combine calls profiled.
                import cProfile
                import io
                import pstats

                prof = cProfile.Profile()
                for _ in range(50):
                    torch.cuda.synchronize()
                    prof.enable()
                    r, _, _, _, h = buf.dispatch_with_permute(
                        hidden=xs,
                        routing_map=routing_map,
                        probs=probs0,
                        num_of_experts_per_rank=experts,
                        num_permuted_tokens=bound,
                        non_blocking=True,
                        fuse_permute_dispatch=True,
                    )
                    buf.combine_with_unpermute(hidden=r, handle=h, fuse_unpermute_combine=True)
                    prof.disable()
                text = io.StringIO()
                pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
                with open(os.path.join(ARGS.out, "host_profile.txt"), "w") as f:
                    f.write(text.getvalue())
        fa.reset_hybrid_ep_buffer()
        rows.append(row)
        log("speed:", json.dumps({k: (round(v, 1) if isinstance(v, float) else v) for k, v in row.items()}))
    write("speed.json", rows)
    return True


CHECKS = dict(
    imports=check_imports, containers=check_containers, parity=check_parity, train=check_train, speed=check_speed
)


def main():
    global ARGS
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("check", choices=sorted(CHECKS))
    p.add_argument("--out", required=True)
    p.add_argument("--megatron-src", default=None, help="a Megatron-LM source tree (its tests/ is used)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--quick", action="store_true", help="speed: the first cell only")
    ARGS = p.parse_args()
    if ARGS.check == "containers" and not ARGS.megatron_src:
        p.error("containers needs --megatron-src")
    ok = CHECKS[ARGS.check]()
    if dist.is_initialized():
        # Every rank's verdict: one failing rank fails the check.
        flag = torch.tensor([int(bool(ok))], device="cuda")
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        ok = bool(flag.item())
    log(f"{ARGS.check}: {'PASS' if ok else 'FAIL'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
