"""Where the host time of one decode step of the plain transformers path goes (run on the device): cProfile of
``--steps`` decode steps of bench_transformers_plain's model, attngate and sdpa, eager and compiled, top entries by own
time, the ms per step without the profiler, and (attngate) the host time spent inside flash_attn.cute's interface.

    python3 bench/profile_transformers_plain.py --batch 1 --prompt 512
    python3 bench/profile_transformers_plain.py --phase prefill --batch 1 --prompt 8192   # the GPU kernels of a prefill
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


def profile(impl: str, mode: str, batch: int, prompt: int, steps: int, top: int) -> None:
    model = _model(impl, transformers.LlamaConfig(**SHAPE))
    forward = model.forward if MODES[mode] is None else torch.compile(model.forward, fullgraph=True, dynamic=True)
    cache = static_cache(model, batch, prompt, steps)
    pad = _padding(batch, prompt)
    mask = (torch.arange(cache.layers[0].keys.shape[2], device="cuda")[None, :] >= pad[:, None]).long()
    token = torch.full((batch, 1), 7, device="cuda")

    def step(t: int) -> None:
        forward(
            input_ids=token,
            attention_mask=mask,
            position_ids=(prompt + t - pad)[:, None],
            past_key_values=cache,
            use_cache=True,
        )

    def rewind() -> None:  # transformers' static cache writes at its own counter: each loop reuses the same slots
        for layer in cache.layers:
            layer.cumulative_length.fill_(prompt)

    with torch.no_grad():
        rewind()
        for t in range(3):  # compiles
            step(t)
        rewind()
        torch.cuda.synchronize()
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--impls", default="attngate,sdpa")
    parser.add_argument("--modes", default="eager,compiled")
    parser.add_argument("--phase", choices=["decode", "prefill"], default="decode")
    args = parser.parse_args()
    if args.phase == "prefill":
        for impl in args.impls.split(","):
            prefill_kernels(impl, args.batch, args.prompt, args.top)
        return
    for impl in args.impls.split(","):
        for mode in args.modes.split(","):
            profile(impl, mode, args.batch, args.prompt, args.steps, args.top)


if __name__ == "__main__":
    main()
