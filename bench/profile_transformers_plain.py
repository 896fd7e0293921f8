"""Where the host time of one decode step of the plain transformers path goes (run on the device): cProfile of
``--steps`` decode steps of bench_transformers_plain's model, attngate and sdpa, eager and compiled, top entries by own
time, the ms per step without the profiler, and (attngate) the host time spent inside flash_attn.cute's interface.

    python3 bench/profile_transformers_plain.py --batch 1 --prompt 512
    python3 bench/profile_transformers_plain.py --phase prefill --batch 1 --prompt 8192   # the GPU kernels of a prefill
    python3 bench/profile_transformers_plain.py --phase calls    # one decode attention call and its parts, beside sdpa
    python3 bench/profile_transformers_plain.py --phase calls --calls 1x16385 --pieces 0,512,1024,2048   # split sizes
    python3 bench/profile_transformers_plain.py --phase graph --batch 1 --prompt 512   # a compiled step's GPU kernels
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch
import transformers

sys.path[:0] = [str(Path(__file__).resolve().parent)]

from bench_transformers_plain import MODES, SHAPE, _model, _padding, static_cache  # noqa: E402


def _decode_steps(impl: str, compiled: bool, batch: int, prompt: int, steps: int, pad: torch.Tensor):
    """``(step, rewind)`` over bench_transformers_plain's model (``compiled``: torch.compile'd, fullgraph, dynamic) and a
    static cache holding ``prompt`` positions, each request left-padded by ``pad: [B]``: ``step(t)`` decodes the
    token after position ``prompt + t``; ``rewind()`` sets the cache's write counter back to the prompt (transformers'
    static cache writes at its own counter: each loop reuses the same slots). Already warmed up (compiled) and
    rewound."""
    model = _model(impl, transformers.LlamaConfig(**SHAPE))
    forward = torch.compile(model.forward, fullgraph=True, dynamic=True) if compiled else model.forward
    cache = static_cache(model, batch, prompt, steps)
    mask = (torch.arange(cache.layers[0].keys.shape[2], device="cuda")[None, :] >= pad[:, None]).long()
    token = torch.full((batch, 1), 7, device="cuda")

    def step(t: int) -> None:
        position = (prompt + t - pad)[:, None]
        forward(input_ids=token, attention_mask=mask, position_ids=position, past_key_values=cache, use_cache=True)

    def rewind() -> None:
        for layer in cache.layers:
            layer.cumulative_length.fill_(prompt)

    with torch.no_grad():
        rewind()
        for t in range(3):  # compiles
            step(t)
        rewind()
        torch.cuda.synchronize()
    return step, rewind


def profile(impl: str, mode: str, batch: int, prompt: int, steps: int, top: int) -> None:
    step, rewind = _decode_steps(impl, MODES[mode] is not None, batch, prompt, steps, _padding(batch, prompt))
    with torch.no_grad():
        t0 = time.perf_counter()
        for t in range(steps):
            step(t)
        torch.cuda.synchronize()
        plain_ms = (time.perf_counter() - t0) * 1e3 / steps
        rewind()
        kernel_us, calls = (
            _timed_kernel_calls(lambda: [step(t) for t in range(steps)]) if impl == "attngate" else (0, 0)
        )
        rewind()
        prof = cProfile.Profile()
        prof.enable()
        for t in range(steps):
            step(t)
        torch.cuda.synchronize()
        prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    inside = (
        f"; flash_attn_varlen_func {calls / steps:.0f} calls a step, {kernel_us / max(calls, 1):.1f} us a call on the "
        f"host, {kernel_us / steps / 1e3:.3f} ms a step"
        if calls
        else ""
    )
    print(
        f"===== {impl} {mode} b{batch} p{prompt}: {plain_ms:.3f} ms a step ({steps} steps){inside}\n{text.getvalue()}"
    )


def _timed_kernel_calls(run) -> tuple[float, int]:
    """Host µs spent inside ``flash_attn.cute.flash_attn_varlen_func`` (its Python interface and launch) while
    ``run()`` runs, and the number of calls: perf_counter around each call, no synchronisation."""
    import flash_attn.cute as fa

    original, spent = fa.flash_attn_varlen_func, [0.0, 0]

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t0
            spent[1] += 1

    fa.flash_attn_varlen_func = timed
    try:
        run()
        torch.cuda.synchronize()
    finally:
        fa.flash_attn_varlen_func = original
    return spent[0] * 1e6, spent[1]


def prefill_kernels(impl: str, batch: int, prompt: int, top: int) -> None:
    """The GPU kernels of one prefill forward over a padded prompt (no cache), under torch.profiler: device time
    per kernel, and the forward's wall ms without the profiler."""
    from bench_transformers_plain import prefill

    model = _model(impl, transformers.LlamaConfig(**SHAPE))
    ms = prefill(model.forward, batch, prompt)
    gen = torch.Generator("cuda").manual_seed(3)
    ids = torch.randint(3, SHAPE["vocab_size"], (batch, prompt), device="cuda", generator=gen)
    mask = (torch.arange(prompt, device="cuda")[None, :] >= _padding(batch, prompt)[:, None]).long()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.no_grad(), torch.profiler.profile(activities=activities) as prof:
        model(input_ids=ids, attention_mask=mask, use_cache=False, logits_to_keep=1)
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=top, max_name_column_width=60)
    print(f"===== prefill {impl} b{batch} p{prompt}: {ms:.3f} ms a forward\n{table}")


def graph_kernels(impl: str, batch: int, prompt: int, steps: int, top: int) -> None:
    """The GPU kernels of ``steps`` compiled decode steps over a static cache holding ``prompt`` positions (no padding,
    as generate() with cache_implementation="static" runs them): device µs a step per kernel under torch.profiler."""
    step, _ = _decode_steps(impl, True, batch, prompt, steps, torch.zeros(batch, dtype=torch.long, device="cuda"))
    with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for t in range(steps):
            step(t)
        torch.cuda.synchronize()
    events = sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total)
    total = sum(e.self_device_time_total for e in events) / steps
    print(f"===== compiled decode {impl} b{batch} p{prompt}: GPU {total:.1f} us a step")
    for e in events[:top]:
        print(f"  {e.self_device_time_total / steps:8.1f} us  x{e.count / steps:5.1f}  {e.key[:110]}")


def _per_call_us(fn, calls: int = 300) -> float:
    """Wall µs a call of ``fn`` over ``calls`` back-to-back calls, synchronised at the end, the best of 5."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def _device_us(fn, calls: int = 50) -> float:
    """GPU µs a call of ``fn``: the kernels' device time under torch.profiler over ``calls`` calls."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return sum(event.self_device_time_total for event in prof.key_averages()) / calls


def split_sweep(shapes: list[tuple[int, int]], pieces: list[int]) -> None:
    """attngate's decode call of layer 0 per least piece (``DECODE_MIN_PIECE_KEYS``; 0: unsplit), pieces sized to the
    GPU (transformers_ops.decode_split_keys): wall µs a call back to back and GPU µs a call, beside sdpa's (no mask),
    per (batch, keys)."""
    import torch.nn.functional as F

    from attngate.integrations import transformers_ops, transformers_plain

    model = _model("attngate", transformers.LlamaConfig(**SHAPE))
    module = model.model.layers[0].self_attn
    h, h_kv, d = SHAPE["num_attention_heads"], SHAPE["num_key_value_heads"], SHAPE["head_dim"]
    kept = transformers_ops.DECODE_SPLIT_KEYS, transformers_ops.DECODE_MIN_PIECE_KEYS
    for b, s_kv in shapes:
        q = torch.randn(b, h, 1, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, h_kv, s_kv, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        sdpa = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
        line = [f"sdpa {_per_call_us(sdpa):.1f}/{_device_us(sdpa):.1f}"]
        for least in pieces:
            transformers_ops.DECODE_SPLIT_KEYS = kept[0] if least else 1 << 40
            transformers_ops.DECODE_MIN_PIECE_KEYS = least or kept[1]
            call = lambda: transformers_plain.plain_attention(module, q, k, v, None)  # noqa: E731
            line.append(f"pieces >= {least or 'off'} {_per_call_us(call):.1f}/{_device_us(call):.1f}")
        transformers_ops.DECODE_SPLIT_KEYS, transformers_ops.DECODE_MIN_PIECE_KEYS = kept
        print(f"b{b} keys {s_kv} (wall/GPU us a call): " + ", ".join(line))


def decode_calls(shapes: list[tuple[int, int]]) -> None:
    """One decode step's attention call of layer 0, timed alone per (batch, keys): sdpa (no mask, as transformers
    calls it for an all-ones mask; and with a bool mask; and transformers' own sdpa call, its Python included),
    attngate's whole call (no mask; a bool mask), and its parts:
    the layer's decisions, the padded FA call (:func:`attngate.integrations.transformers_ops.fa_in_place`) and the
    kernel call with its arguments alone (the FA4 fast launch)."""
    import torch.nn.functional as F
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from attngate.backends import fa_padded
    from attngate.integrations import transformers_ops, transformers_plain
    from attngate.integrations.transformers_rows import PaddedBatch

    model = _model("attngate", transformers.LlamaConfig(**SHAPE))
    module = model.model.layers[0].self_attn
    h, h_kv, d = SHAPE["num_attention_heads"], SHAPE["num_key_value_heads"], SHAPE["head_dim"]
    for b, s_kv in shapes:
        q = torch.randn(b, h, 1, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, h_kv, s_kv, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        mask = torch.ones(b, 1, 1, s_kv, dtype=torch.bool, device="cuda")
        context, decisions = transformers_plain.decisions_of(module)
        batch = PaddedBatch(None, b, 1, s_kv, q.device, context.masks)
        q_rows = q.reshape(b, h, d)
        k_rows, v_rows, row = fa_padded.same_layout(k, v)
        cu_q, cu_k, used_q, used_k = fa_padded.rows(batch.extents(True), 1, row)
        scale = d**-0.5
        sdpa_call = ALL_ATTENTION_FUNCTIONS["sdpa"]
        timings = {
            "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
            "transformers' sdpa call": lambda: sdpa_call(module, q, k, v, None, dropout=0.0, scaling=scale),
            "sdpa, bool mask": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True),
            "attngate": lambda: transformers_plain.plain_attention(module, q, k, v, None),
            "attngate, bool mask": lambda: transformers_plain.plain_attention(module, q, k, v, mask),
            "decisions": lambda: transformers_plain.decisions_of(module),
            "padded FA call": lambda: transformers_ops.fa_in_place(decisions, batch, q, k, v, None, scale),
            "kernel call alone": lambda: transformers_ops._fa_varlen_eager(
                q_rows, k_rows, v_rows, cu_q, cu_k, used_q, used_k, 1, s_kv, None, scale, True, -1, 0.0, False
            ),
        }
        line = ", ".join(f"{name} {_per_call_us(fn):.1f}" for name, fn in timings.items())
        print(f"b{b} keys {s_kv} (us a call): {line}")
        prof = cProfile.Profile()  # where the whole call's host time goes, by function
        prof.enable()
        for _ in range(1000):
            transformers_plain.plain_attention(module, q, k, v, None)
        torch.cuda.synchronize()
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(18)
        print(f"attngate b{b} keys {s_kv}, 1000 calls under cProfile:\n{text.getvalue()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--impls", default="attngate,sdpa")
    parser.add_argument("--modes", default="eager,compiled")
    parser.add_argument("--phase", choices=["decode", "prefill", "calls", "graph"], default="decode")
    parser.add_argument("--calls", default="1x513,8x2049,1x16385", help="--phase calls: batch x keys, comma-separated")
    parser.add_argument(
        "--pieces", default="", help="--phase calls: sweep DECODE_MIN_PIECE_KEYS over these (0: unsplit)"
    )
    args = parser.parse_args()
    if args.phase == "calls":
        shapes = [tuple(map(int, shape.split("x"))) for shape in args.calls.split(",")]
        if args.pieces:
            split_sweep(shapes, [int(least) for least in args.pieces.split(",")])
        decode_calls(shapes)
        return
    if args.phase == "graph":
        for impl in args.impls.split(","):
            graph_kernels(impl, args.batch, args.prompt, args.steps, args.top)
        return
    if args.phase == "prefill":
        for impl in args.impls.split(","):
            prefill_kernels(impl, args.batch, args.prompt, args.top)
        return
    for impl in args.impls.split(","):
        for mode in args.modes.split(","):
            profile(impl, mode, args.batch, args.prompt, args.steps, args.top)


if __name__ == "__main__":
    main()
