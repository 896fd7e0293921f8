"""``attn_implementation="attngate"`` without a runtime, eager and under torch.compile, beside sdpa.

A Llama-shaped model (8 layers, hidden 2048, 16/4 heads x 128, bf16, random weights) decodes a left-padded batch
over transformers' static cache; one decode step (all layers, the LM head included) is timed per variant, side by
side in one run: sdpa eager, sdpa under torch.compile (inductor), attngate eager, attngate under torch.compile
(each attention call on the plan's kernel one opaque op of the graph). Every variant decodes the tokens sdpa eager
chose (teacher-forced), so that their logits compare. Prints one JSON object (run on the device).
"""

from __future__ import annotations

import copy
import json
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
    max_position_embeddings=4096,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
BATCH, PROMPT, STEPS, MAX_LEN = 8, 512, 32, 1024


def _model(impl: str, cfg, state=None):
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM._from_config(
        copy.deepcopy(cfg), attn_implementation=impl, dtype=torch.bfloat16
    )
    if state is not None:
        model.load_state_dict(state)
    return model.cuda().eval()


def _decode_ms(
    model, ids: torch.Tensor, mask: torch.Tensor, forced: torch.Tensor | None = None
) -> tuple[float, torch.Tensor, torch.Tensor]:
    """Median ms per decode step over STEPS steps after a prefill (the first two steps, which compile, left out),
    greedy or fed ``forced: [B, STEPS]``; also the tokens fed and the last step's logits."""
    cache = transformers.StaticCache(config=model.config, max_cache_len=MAX_LEN)
    times, tokens = [], []
    with torch.no_grad():
        logits = model(ids, attention_mask=mask, past_key_values=cache, use_cache=True).logits[:, -1]
        m = mask
        for t in range(STEPS):
            tok = logits.argmax(-1, keepdim=True) if forced is None else forced[:, t : t + 1]
            tokens.append(tok)
            m = torch.cat([m, torch.ones_like(m[:, :1])], dim=1)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            logits = model(tok, attention_mask=m, past_key_values=cache, use_cache=True).logits[:, -1]
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
    times = sorted(times[2:])
    return times[len(times) // 2], torch.cat(tokens, 1), logits.float()


def main() -> None:
    cfg = transformers.LlamaConfig(**SHAPE)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, SHAPE["vocab_size"], (BATCH, PROMPT), generator=gen).cuda()
    mask = torch.ones_like(ids)
    mask[1::2, : PROMPT // 4] = 0  # every other request left-padded by a quarter
    ref = _model("sdpa", cfg)
    ours = _model("attngate", cfg, ref.state_dict())
    configure(ours)
    results, last = {}, {}
    results["sdpa eager"], forced, last["sdpa eager"] = _decode_ms(ref, ids, mask)
    for name, model in (("sdpa", ref), ("attngate", ours)):
        if name == "attngate":
            results[f"{name} eager"], _, last[f"{name} eager"] = _decode_ms(model, ids, mask, forced)
        torch._dynamo.reset()
        eager_forward = model.forward
        model.forward = torch.compile(eager_forward, dynamic=True, fullgraph=True)
        _decode_ms(model, ids, mask, forced)  # the first run compiles the prefill and the first decode shapes
        results[f"{name} compiled"], _, last[f"{name} compiled"] = _decode_ms(model, ids, mask, forced)
        model.forward = eager_forward
    base = last["sdpa eager"]
    diff = {k: float((v - base).abs().max() / base.abs().max()) for k, v in last.items()}
    print(
        json.dumps(
            {
                "gpu": torch.cuda.get_device_name(),
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "plan": {
                    "prefill": plan_of(ours)[0].plan.prefill_backend,
                    "decode": plan_of(ours)[0].plan.decode_backend,
                    "provider": plan_of(ours)[0].plan.fa.provider,
                },
                "shape": {**SHAPE, "batch": BATCH, "prompt": PROMPT, "steps": STEPS},
                "decode_step_ms_median": {k: round(v, 3) for k, v in results.items()},
                "compiled_over_eager": {
                    n: round(results[f"{n} compiled"] / results[f"{n} eager"], 3) for n in ("sdpa", "attngate")
                },
                "last_logits_max_diff_over_sdpa_eager_max": {k: round(v, 4) for k, v in diff.items()},
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
