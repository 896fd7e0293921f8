"""``model.generate()`` as users call it, ``attn_implementation="attngate"`` beside sdpa (eager attention where
transformers runs the architecture on eager only: Gemma-2's soft-cap) on the same random bf16 weights.

Per architecture, cache (``default``: the DynamicCache, eager; ``static``: ``cache_implementation="static"``, whose
decode step transformers compiles), batch and prompt length (unpadded prompts, an all-ones mask): the prefill ms
(from ``generate()``'s start to the first step's logits), the decode ms per step (the median gap between consecutive
steps' logits: each step ends in generate()'s own host read of whether every request has finished, so a gap is one
whole step, host and GPU; ``decode_ratio_paired``: the median over calls of the reference call's median step over
the next attngate call's), tokens/s of the whole call, and the first step's logits against the reference
implementation's (largest absolute difference over the largest logit). Each point is timed after a warm-up call of
the same shape (compilation and kernel builds excluded), implementations alternating call by call over ``--reps``
calls each; prefill is the best call's, decode the median over every step of every call, so a step the shared host
stalls moves neither.

    python3 bench/bench_transformers_generate.py --out bench/transformers_generate_h100.json   # on the GPU
    python3 bench/bench_transformers_generate.py --archs llama --caches static --batches 1 --prompts 512
    python3 bench/bench_transformers_generate.py --out run.json --resume   # again, call after call: the points left
    python3 bench/bench_transformers_generate.py --caches default --split-past 1000000000   # decode never split
    python3 bench/bench_transformers_generate.py --bound   # and the step without attention: what any could gain
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from bench_transformers_plain import _model as build_model  # noqa: E402

import attngate.integrations.transformers  # noqa: E402,F401 - registers "attngate"
from attngate.integrations import transformers_ops  # noqa: E402

COMMON = dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=8, pad_token_id=0)
COMMON |= dict(bos_token_id=1, eos_token_id=2, max_position_embeddings=40000)
#: the architectures measured: (config class, overrides, reference implementation)
ARCHS = {
    "llama": (transformers.LlamaConfig, dict(num_attention_heads=16, num_key_value_heads=4, head_dim=128), "sdpa"),
    "qwen3": (transformers.Qwen3Config, dict(num_attention_heads=16, num_key_value_heads=8, head_dim=128), "sdpa"),
    "gemma2": (
        transformers.Gemma2Config,
        dict(
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=256,
            sliding_window=4096,
            attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0,
            query_pre_attn_scalar=256,
        ),
        "eager",
    ),  # fmt: skip
}


#: An attention that costs nothing (zeros, no kernel): the step's time without attention, host and GPU, bounds what
#: any attention implementation can gain over the reference (``--bound``)
NO_ATTENTION = "no_attention"


def _no_attention(module, query, key, value, attention_mask, **kwargs):
    b, h, s, _ = query.shape
    return query.new_zeros(b, s, h, value.shape[-1]), None


def _model(arch: str, impl: str, state=None):
    cls, overrides, _ = ARCHS[arch]
    return build_model(impl, cls(**COMMON, **overrides), state)


class _StepClock(transformers.LogitsProcessor):
    """Notes the host time at each step's logits (a logits processor runs once a step, after the forward). The first
    waits for the GPU: the host reaches it as soon as the prefill is launched, where the eager path has no host read
    of its own (a later step's gap is closed by generate()'s own read of whether every request has finished)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if not self.times:
            torch.cuda.synchronize()
        self.times.append(time.perf_counter())
        return scores


def _generate(model, ids, cache: str, new: int) -> tuple[float, float, list[float], torch.Tensor]:
    """One greedy generate() call: (prefill ms, whole call ms, each decode step's ms, the first step's logits)."""
    clock = _StepClock()
    kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new, min_new_tokens=new)
    kw |= dict(output_logits=True, return_dict_in_generate=True, logits_processor=[clock])
    if cache == "static":
        kw["cache_implementation"] = "static"
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, **kw)
    torch.cuda.synchronize()
    end = time.perf_counter()
    steps = [(b - a) * 1e3 for a, b in zip(clock.times, clock.times[1:])]
    return (clock.times[0] - start) * 1e3, (end - start) * 1e3, steps, out.logits[0].float()


def point(models: dict, arch: str, cache: str, batch: int, prompt: int, new: int, reps: int) -> dict:
    """Both implementations at one shape: prefill ms, decode ms per step, tokens/s, first-step logit difference."""
    ids = torch.randint(3, 32000, (batch, prompt), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    row = {"arch": arch, "cache": cache, "batch": batch, "prompt": prompt, "new_tokens": new}
    prefills: dict[str, list[float]] = {name: [] for name in models}
    totals: dict[str, list[float]] = {name: [] for name in models}
    steps: dict[str, list[float]] = {name: [] for name in models}
    call_steps: dict[str, list[float]] = {name: [] for name in models}  # each call's median step
    first: dict[str, torch.Tensor] = {}
    for name, model in models.items():  # warm-up: compilation, kernel builds, the static cache's allocation
        _generate(model, ids, cache, 3)
    for _ in range(reps):
        for name, model in models.items():
            prefill, total, decode_steps, first[name] = _generate(model, ids, cache, new)
            prefills[name].append(prefill)
            totals[name].append(total)
            steps[name] += decode_steps
            call_steps[name].append(statistics.median(decode_steps))
    names = list(models)
    ref, ours = first[names[0]], first["attngate"]
    row["first_step_logit_diff"] = ((ref - ours).abs().max() / ref.abs().max()).item()
    for name in models:
        values = dict(
            prefill_ms=min(prefills[name]),
            decode_ms=statistics.median(steps[name]),
            total_ms=statistics.median(totals[name]),
            tokens_s=batch * new / statistics.median(totals[name]) * 1e3,
        )
        row |= {f"{name}_{k}": round(v, 3) for k, v in values.items()}
    row["decode_ratio"] = row[f"{names[0]}_decode_ms"] / row["attngate_decode_ms"]  # reference / attngate
    row["prefill_ratio"] = row[f"{names[0]}_prefill_ms"] / row["attngate_prefill_ms"]
    # each attngate call against the reference call just before it: a shared host's slow spells, which last longer
    # than one call, fall on both sides of a pair
    paired = [r / a for r, a in zip(call_steps[names[0]], call_steps["attngate"])]
    row["decode_ratio_paired"] = statistics.median(paired)
    row["decode_ratio_paired_range"] = [round(min(paired), 3), round(max(paired), 3)]
    if NO_ATTENTION in models:  # the most any attention could gain here: the reference's step over one without it
        row["decode_bound"] = row[f"{names[0]}_decode_ms"] / row[f"{NO_ATTENTION}_decode_ms"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--archs", default=",".join(ARCHS))
    parser.add_argument("--caches", default="default,static")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--prompts", default="512,2048,16384,32768")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=262144, help="skip batch x prompt above this")
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--resume", action="store_true", help="keep --out's rows and measure only the points it lacks (several calls)"
    )
    parser.add_argument(
        "--split-past",
        type=int,
        help="split attngate's decode where a query reads more keys than this (transformers_ops.DECODE_SPLIT_KEYS; "
        "a huge value: never), to weigh the split's host time against its GPU time",
    )
    parser.add_argument(
        "--bound", action="store_true", help="also time each step with an attention that costs nothing (decode_bound)"
    )
    args = parser.parse_args()
    if args.bound:
        transformers.AttentionInterface.register(NO_ATTENTION, _no_attention)
        transformers.masking_utils.AttentionMaskInterface.register(NO_ATTENTION, transformers.masking_utils.sdpa_mask)
    if args.split_past is not None:
        transformers_ops.DECODE_SPLIT_KEYS = args.split_past
    report = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "command": " ".join(["python3", *sys.argv]),
        "decode_split_keys": transformers_ops.DECODE_SPLIT_KEYS,
        "rows": [],
    }
    if args.resume and args.out and args.out.exists():
        report["rows"] = [row for row in json.loads(args.out.read_text())["rows"] if "error" not in row]
    done = {(row["arch"], row["cache"], row["batch"], row["prompt"]) for row in report["rows"]}
    for arch in args.archs.split(","):
        todo = [
            (cache, batch, prompt)
            for cache in args.caches.split(",")
            for batch in map(int, args.batches.split(","))
            for prompt in map(int, args.prompts.split(","))
            if batch * prompt <= args.max_tokens and (arch, cache, batch, prompt) not in done
        ]
        if not todo:
            continue
        reference = ARCHS[arch][2]
        ref = _model(arch, reference)
        models = {reference: ref, "attngate": _model(arch, "attngate", ref.state_dict())}
        if args.bound:
            models[NO_ATTENTION] = _model(arch, NO_ATTENTION, ref.state_dict())
        for cache, batch, prompt in todo:
            try:
                row = point(models, arch, cache, batch, prompt, args.new_tokens, args.reps)
            except torch.OutOfMemoryError:
                row = {"arch": arch, "cache": cache, "batch": batch, "prompt": prompt, "error": "OOM"}
            torch._dynamo.reset()
            gc.collect()
            torch.cuda.empty_cache()
            report["rows"].append(row)
            print(json.dumps(row), flush=True)
            if args.out:  # after every point: a run cut short (a device-time limit) keeps what it measured
                args.out.write_text(json.dumps(report, indent=1) + "\n")
        del models, ref
        gc.collect()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
