"""``attn_implementation="attngate"`` without a runtime, beside sdpa (and transformers' flash_attention_2 where
installed), eager, under torch.compile, and under torch.compile with CUDA graphs.

A Llama-shaped model (8 layers, hidden 2048, 16/4 heads x 128, bf16, random weights). Per batch size and prompt
length, every other request left-padded by a quarter of the prompt:

- decode: the ms of one decode step (all layers and the LM head) over transformers' static cache holding the prompt
  (filled with the same random K/V for every implementation: a 32 x 32k prefill is not what is timed), median of
  ``--steps`` steps fed the same tokens; eager, compiled (inductor, fullgraph) and compiled with CUDA graphs
  (``mode="reduce-overhead"``); the last step's logits against sdpa eager's;
- prefill: the ms of one forward over the padded prompt (no cache, the last position's logits), eager and compiled,
  where batch x prompt <= ``--max-prefill-tokens``;
- greedy: on the first prompt length, 30 greedy decode steps after a real prefill, attngate eager against sdpa eager:
  the first step whose token differs, with sdpa's gap between its top two logits there and the two runs' largest logit
  difference; the same for transformers' eager attention against sdpa, the control.

    python3 bench/bench_transformers_plain.py --out bench/transformers_plain_h100.json     # on the GPU
    python3 bench/plot.py --transformers bench/transformers_plain_h100.json bench/transformers_plain.png
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

import attngate.integrations.transformers  # noqa: E402,F401 - registers "attngate"
from attngate.integrations.transformers_plain import configure, plan_of  # noqa: E402

SHAPE = dict(
    vocab_size=32000,
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=4,
    head_dim=128,
    max_position_embeddings=40000,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
MODES = {"eager": None, "compiled": "default", "cudagraphs": "reduce-overhead"}


def _model(impl: str, cfg, state=None):
    """The causal LM of ``cfg`` (any architecture) in bf16 on the GPU, seeded weights or ``state``; configured for
    attngate where ``impl`` is "attngate"."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        copy.deepcopy(cfg), attn_implementation=impl, dtype=torch.bfloat16
    )
    if state is not None:
        model.load_state_dict(state)
    model = model.cuda().eval()
    if impl == "attngate":
        configure(model)
    return model


def _padding(batch: int, prompt: int) -> torch.Tensor:
    """``[B]`` int64: left padding per request, a quarter of the prompt on every other request."""
    pad = torch.zeros(batch, dtype=torch.long)
    pad[1::2] = prompt // 4
    return pad.cuda()


def _timed(fn, reps: int) -> list[float]:
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def static_cache(model, batch: int, prompt: int, steps: int) -> transformers.StaticCache:
    """A static cache of ``prompt + steps + 8`` slots per request (what generate() would size), allocated up front."""
    cache = transformers.StaticCache(config=model.config, max_cache_len=prompt + steps + 8)
    cache.early_initialization(batch, SHAPE["num_key_value_heads"], SHAPE["head_dim"], torch.bfloat16, "cuda")
    return cache


def decode(forward, cache, batch: int, prompt: int, steps: int) -> tuple[float, torch.Tensor]:
    """Median ms per decode step over ``cache`` refilled with ``prompt`` positions of seeded random K/V (the same for
    every implementation), and the last step's logits."""
    gen = torch.Generator("cuda").manual_seed(2)
    for layer in cache.layers:
        layer.keys.normal_(generator=gen)
        layer.values.normal_(generator=gen)
    pad = _padding(batch, prompt)
    slots = cache.layers[0].keys.shape[2]
    mask = (torch.arange(slots, device="cuda")[None, :] >= pad[:, None]).long()  # one shape: CUDA graphs replay
    tokens = torch.randint(3, SHAPE["vocab_size"], (steps + 3, batch, 1), device="cuda", generator=gen)
    logits = None

    def step(t: int) -> None:
        nonlocal logits
        out = forward(
            input_ids=tokens[t],
            attention_mask=mask,
            position_ids=(prompt + t - pad)[:, None],
            past_key_values=cache,
            use_cache=True,
        )
        logits = out.logits[:, -1].float()

    with torch.no_grad():
        for layer in cache.layers:  # transformers' static cache writes at its own counter
            layer.cumulative_length.fill_(prompt)
        for t in range(3):  # compiles, captures
            step(t)
        for layer in cache.layers:
            layer.cumulative_length.fill_(prompt)
        times = [_timed(lambda t=t: step(t), 1)[0] for t in range(steps)]
    return statistics.median(times), logits


def prefill(forward, batch: int, prompt: int, reps: int = 2) -> float:
    gen = torch.Generator("cuda").manual_seed(3)
    ids = torch.randint(3, SHAPE["vocab_size"], (batch, prompt), device="cuda", generator=gen)
    mask = (torch.arange(prompt, device="cuda")[None, :] >= _padding(batch, prompt)[:, None]).long()
    with torch.no_grad():
        forward(input_ids=ids, attention_mask=mask, use_cache=False, logits_to_keep=1)
        return min(_timed(lambda: forward(input_ids=ids, attention_mask=mask, use_cache=False, logits_to_keep=1), reps))


def greedy(ref, ours, prompt: int, batch: int = 8, steps: int = 30) -> dict:
    """Greedy decoding after a real prefill, both eager: the first step whose tokens differ, and sdpa's top-2 gap."""
    gen = torch.Generator("cuda").manual_seed(4)
    ids = torch.randint(3, SHAPE["vocab_size"], (batch, prompt), device="cuda", generator=gen)
    mask = (torch.arange(prompt, device="cuda")[None, :] >= _padding(batch, prompt)[:, None]).long()
    runs = []
    with torch.no_grad():
        for model in (ref, ours):
            out = model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=steps,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
            )
            runs.append((out.sequences[:, prompt:], out.logits))
    (want, logits), (got, their_logits) = runs
    differ = (want != got).any(0).nonzero()
    if not len(differ):
        return {"steps": steps, "identical": True}
    t = int(differ[0])
    top2 = logits[t].float().topk(2, -1).values
    rows = want[:, t] != got[:, t]  # the requests whose token differs there: sdpa's margin between its top two
    return {
        "steps": steps,
        "identical": False,
        "first_divergence": t,
        "sdpa_top2_gap": float((top2[rows, 0] - top2[rows, 1]).max()),
        # the two runs' logits at that step, both on the same tokens so far: the noise the gap is set against
        "logits_max_abs_diff": float((logits[t].float() - their_logits[t].float()).abs().max()),
        "sdpa_max_abs_logit": float(logits[t].float().abs().max()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--prompts", default="512,8192,32768")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--max-prefill-tokens", type=int, default=262144)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--greedy", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--greedy-only", action="store_true", help="only the greedy comparisons")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    batches, prompts = ([int(x) for x in s.split(",")] for s in (args.batches, args.prompts))
    cfg = transformers.LlamaConfig(**SHAPE)
    models = {"sdpa": _model("sdpa", cfg)}
    state = models["sdpa"].state_dict()
    models["attngate"] = _model("attngate", cfg, state)
    skipped = {}
    try:
        models["flash_attention_2"] = _model("flash_attention_2", cfg, state)
    except (ImportError, ValueError) as err:
        skipped["flash_attention_2"] = str(err).splitlines()[0]
    torch._dynamo.config.recompile_limit = 64
    forwards = {
        (impl, mode): model.forward
        if compile_mode is None
        else torch.compile(model.forward, mode=compile_mode, fullgraph=True, dynamic=True)
        for impl, model in models.items()
        for mode, compile_mode in MODES.items()
        if mode in args.modes.split(",")
    }
    results = {"decode_ms": {}, "prefill_ms": {}, "logits_max_diff_over_max": {}}
    for prompt in [] if args.greedy_only else prompts:
        for batch in batches:
            cache = static_cache(models["sdpa"], batch, prompt, args.steps)
            ref = None
            for (impl, mode), forward in forwards.items():
                key = f"{impl} {mode} b{batch} p{prompt}"
                ms, logits = decode(forward, cache, batch, prompt, args.steps)
                ref = logits if ref is None else ref  # sdpa eager's, the first
                results["decode_ms"][key] = round(ms, 3)
                results["logits_max_diff_over_max"][key] = round(float((logits - ref).abs().max() / ref.abs().max()), 4)
                if mode != "cudagraphs" and batch * prompt <= args.max_prefill_tokens:
                    try:
                        results["prefill_ms"][key] = round(prefill(forward, batch, prompt), 3)
                    except torch.OutOfMemoryError:  # sdpa's materialized [B, 1, S, S] mask, say
                        results["prefill_ms"][key] = "out of memory"
                        torch.cuda.empty_cache()
                print(key, results["decode_ms"][key], results["prefill_ms"].get(key), flush=True)
            del cache
            torch.cuda.empty_cache()
    report = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "plan": {
            "prefill": plan_of(models["attngate"])[0].plan.prefill_backend,
            "decode": plan_of(models["attngate"])[0].plan.decode_backend,
            "provider": plan_of(models["attngate"])[0].plan.fa.provider,
        },
        "shape": SHAPE,
        "batches": batches,
        "prompts": prompts,
        "not_run": skipped,
        **results,
        "greedy_vs_sdpa": greedy(models["sdpa"], models["attngate"], prompts[0]) if args.greedy else None,
        # the control: transformers' own eager attention against sdpa, two implementations of the same model
        "greedy_eager_vs_sdpa": greedy(models["sdpa"], _model("eager", cfg, state), prompts[0])
        if args.greedy
        else None,
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
