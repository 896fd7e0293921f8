"""Differential tests against transformers' own eager attention, on models built from the real configs.

Each model is a real config of ``examples/models/`` truncated to 2-4 layers and a small width
(random weights, fixed seed, float32 on the CPU). Two prompts of different lengths go through
attngate together: chunked prefill (EXTEND without, then with, a cached prefix), then token-by-token
DECODE through the paged cache. Every position's logits must equal those of one full forward of
transformers' eager attention within 2e-4 (float32 accumulation on both sides; the observed
differences are about 1e-6).
"""

from __future__ import annotations

import copy
import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from attngate.facts.modes import LayerKind  # noqa: E402
from attngate.integrations.transformers import AttngateRuntime, register  # noqa: E402
from helpers import MODELS  # noqa: E402

ATOL = 2e-4
SMALL = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 8, "num_key_value_heads": 2,
         "head_dim": 8, "vocab_size": 96, "num_hidden_layers": 2}
# name: (config file, overrides on top of SMALL, layer kinds the truncated model must have)
MODELS_UNDER_TEST = {
    "llama": ("Llama-3.1-8B", {}, {LayerKind.FULL}),
    "qwen3": ("Qwen3-8B", {}, {LayerKind.FULL}),
    "mistral-swa": ("Mistral-7B-v0.1", {"sliding_window": 5}, {LayerKind.SLIDING_WINDOW}),
    "gemma2-softcap-swa": ("gemma-2-9b", {"num_hidden_layers": 4, "sliding_window": 5, "query_pre_attn_scalar": 12,
                                          "head_dim": 16, "num_attention_heads": 4}, {LayerKind.SLIDING_WINDOW, LayerKind.FULL}),
    "gemma3-pattern": ("gemma-3-1b-it", {"num_hidden_layers": 4, "sliding_window": 4, "sliding_window_pattern": 2,
                                         "num_key_value_heads": 1, "query_pre_attn_scalar": 8}, {LayerKind.SLIDING_WINDOW, LayerKind.FULL}),
    "gpt-oss-sinks": ("gpt-oss-20b", {"num_hidden_layers": 4, "sliding_window": 5, "num_local_experts": 4,
                                      "num_experts_per_tok": 2, "experts_per_token": 2, "quantization_config": None,
                                      "layer_types": ["sliding_attention", "full_attention"] * 2},
                      {LayerKind.SLIDING_WINDOW, LayerKind.FULL}),
    "deepseek-mla": ("DeepSeek-V2-Lite", {"num_attention_heads": 4, "num_key_value_heads": 4, "kv_lora_rank": 16,
                                          "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8,
                                          "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                          "n_shared_experts": 1, "head_dim": None}, {LayerKind.FULL}),
}
PROMPTS = (23, 17)  # tokens of the two requests
CHUNKS = (9, 6)  # first EXTEND, second EXTEND (over the cached prefix); the rest is decoded


def _config(file: str, overrides: dict):
    raw = json.loads((MODELS / f"{file}.json").read_text())
    raw.update(SMALL)
    raw.update(overrides)
    raw = {k: v for k, v in raw.items() if v is not None and k not in ("auto_map", "torch_dtype", "dtype")}
    raw["pad_token_id"] = raw["bos_token_id"] = raw["eos_token_id"] = 0
    return transformers.AutoConfig.for_model(**raw)


def _pair(cfg, auto=transformers.AutoModelForCausalLM):
    register()
    torch.manual_seed(0)
    ref = auto.from_config(copy.deepcopy(cfg), attn_implementation="eager", dtype=torch.float32).eval()
    ours = auto.from_config(copy.deepcopy(cfg), attn_implementation="attngate", dtype=torch.float32).eval()
    ours.load_state_dict(ref.state_dict())
    return ref, ours


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("name", sorted(MODELS_UNDER_TEST))
def test_chunked_prefill_and_decode_match_transformers(name, page_size):
    file, overrides, kinds = MODELS_UNDER_TEST[name]
    ref, ours = _pair(_config(file, overrides))
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 96, (n,), generator=gen) for n in PROMPTS]
    with torch.no_grad():
        full = [ref(p[None]).logits[0] for p in prompts]

    rt = AttngateRuntime(ours, page_size=page_size, num_slots=256)
    assert kinds == set(rt.facts.layer_kinds)
    reqs = [rt.add_request() for _ in prompts]
    got: list[list[torch.Tensor]] = [[], []]
    start = 0
    for n in CHUNKS:  # EXTEND: both requests in one forward, the second chunk over the cached prefix
        out = rt.extend({r: p[start:start + n] for r, p in zip(reqs, prompts)})
        got[0].append(out[:n])
        got[1].append(out[n:])
        start += n
    for i in range(start, max(PROMPTS)):  # DECODE, batch shrinking as the shorter prompt ends
        live = [(k, r) for k, (r, p) in enumerate(zip(reqs, prompts)) if i < len(p)]
        out = rt.decode({r: prompts[k][i] for k, r in live})
        for row, (k, _) in enumerate(live):
            got[k].append(out[row:row + 1])
    for k in range(2):
        diff = (torch.cat(got[k]) - full[k]).abs().max().item()
        assert diff < ATOL, f"{name}, page_size {page_size}, request {k}: max |diff| {diff:.2e}"


def test_encoder_only_embedding_model_matches_transformers():
    cfg = _config("all-MiniLM-L6-v2", {"num_key_value_heads": None, "head_dim": None, "intermediate_size": 128})
    ref, ours = _pair(cfg, transformers.AutoModel)
    ids = torch.randint(1, 96, (19,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = ref(ids[None]).last_hidden_state[0]
    rt = AttngateRuntime(ours, page_size=16, num_slots=64)
    assert set(rt.facts.layer_kinds) == {LayerKind.ENCODER_ONLY}
    assert rt.plan.layer("encoder_only").common.causal is False
    got = rt.extend({rt.add_request(): ids})
    assert (got - expected).abs().max().item() < ATOL
    assert rt.pool.k_buffer[0].abs().sum() == 0  # encoder-only layers write no KV cache
