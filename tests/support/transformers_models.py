"""Small models built from the real configs of ``examples/models/`` (2-4 layers, a small width, random weights),
shared by the transformers differential tests on the CPU and on the GPU."""

from __future__ import annotations

import copy
import json

import torch
import transformers

from attngate.facts.modes import LayerKind
from attngate.integrations.transformers import register
from tests.support.helpers import MODELS

SMALL = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "vocab_size": 96,
    "num_hidden_layers": 2,
}
MLA = {
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "n_shared_experts": 1,
    "head_dim": None,
}
# name: (config file, overrides on top of SMALL, layer kinds the truncated model must have)
MODELS_UNDER_TEST = {
    "llama": ("Llama-3.1-8B", {}, {LayerKind.FULL}),
    "qwen3": ("Qwen3-8B", {}, {LayerKind.FULL}),
    "mistral-swa": ("Mistral-7B-v0.1", {"sliding_window": 5}, {LayerKind.SLIDING_WINDOW}),
    "gemma2-softcap-swa": (
        "gemma-2-9b",
        {
            "num_hidden_layers": 4,
            "sliding_window": 5,
            "query_pre_attn_scalar": 12,
            "head_dim": 16,
            "num_attention_heads": 4,
        },
        {LayerKind.SLIDING_WINDOW, LayerKind.FULL},
    ),
    "gemma3-pattern": (
        "gemma-3-1b-it",
        {
            "num_hidden_layers": 4,
            "sliding_window": 4,
            "sliding_window_pattern": 2,
            "num_key_value_heads": 1,
            "query_pre_attn_scalar": 8,
        },
        {LayerKind.SLIDING_WINDOW, LayerKind.FULL},
    ),
    "gpt-oss-sinks": (
        "gpt-oss-20b",
        {
            "num_hidden_layers": 4,
            "sliding_window": 5,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "experts_per_token": 2,
            "quantization_config": None,
            "layer_types": ["sliding_attention", "full_attention"] * 2,
        },
        {LayerKind.SLIDING_WINDOW, LayerKind.FULL},
    ),
    # MLA at the real latent geometry (kv_lora_rank 512 + qk_rope 64 = 576 cached values per token), fewer heads
    # Llama 4's text model: chunked local attention (iRoPE) on three layers of four, chunks of 4 tokens so that
    # prefill, the cached prefix and decode all cross chunk boundaries
    "llama4-chunked": (
        "Llama-4-Scout-17B-16E-Instruct",
        {
            "num_hidden_layers": 4,
            "attention_chunk_size": 4,
            "num_local_experts": 2,
            "num_experts_per_tok": 1,
            "intermediate_size_mlp": 96,
        },
        {LayerKind.CHUNKED_LOCAL, LayerKind.FULL},
    ),
    "deepseek-v2-mla": ("DeepSeek-V2-Lite", MLA, {LayerKind.FULL}),
    # MLA at dims no FlashInfer or FA kernel runs (kv_lora_rank 48, qk_rope_head_dim 16): the default backend falls
    # back to the first candidate that runs (attngate.engine.fallback), the reference backend computes it
    "deepseek-v2-small-mla": (
        "DeepSeek-V2-Lite",
        {**MLA, "kv_lora_rank": 48, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32},
        {LayerKind.FULL},
    ),
    "deepseek-v3-mla": (
        "DeepSeek-V3",
        {
            **MLA,
            "q_lora_rank": 32,
            "n_group": 2,
            "topk_group": 1,
            "first_k_dense_replace": 1,
            "quantization_config": None,
        },
        {LayerKind.FULL},
    ),
}


def config_of(file: str, overrides: dict):
    """A small transformers config of ``examples/models/<file>.json`` (its text model), ``SMALL`` and ``overrides``
    applied."""
    raw = json.loads((MODELS / f"{file}.json").read_text())
    raw = raw.get("text_config", raw)  # a multimodal checkpoint: its text model
    raw.update(SMALL)
    raw.update(overrides)
    raw = {k: v for k, v in raw.items() if v is not None and k not in ("auto_map", "torch_dtype", "dtype")}
    raw["pad_token_id"] = raw["bos_token_id"] = raw["eos_token_id"] = 0
    return transformers.AutoConfig.for_model(**raw)


def model_pair(cfg, auto=None):
    """The same random weights twice: transformers' eager attention and attngate's (float32, seeded)."""
    auto = auto or transformers.AutoModelForCausalLM
    register()
    torch.manual_seed(0)
    ref = auto.from_config(copy.deepcopy(cfg), attn_implementation="eager", dtype=torch.float32).eval()
    ours = auto.from_config(copy.deepcopy(cfg), attn_implementation="attngate", dtype=torch.float32).eval()
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def mllama_pair(hidden_size: int = 64):
    """A small Mllama (Llama 3.2 Vision) with its cross-attention gates open (transformers initialises them to 0, which
    would hide the cross layers' output); the vision tower on eager, the language model on attngate."""
    vision = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_global_layers=1,
        num_attention_heads=2,
        image_size=28,
        patch_size=14,
        max_num_tiles=2,
        intermediate_layers_indices=[0],
        vision_output_dim=64,
        supported_aspect_ratios=[[1, 1], [1, 2], [2, 1]],
    )
    text = dict(
        vocab_size=128,
        hidden_size=hidden_size,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        cross_attention_layers=[1, 3],
        rope_scaling=None,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
    )
    cfg = transformers.MllamaConfig(vision_config=vision, text_config=text, image_token_index=127)
    torch.manual_seed(0)
    ref = transformers.MllamaForConditionalGeneration._from_config(
        copy.deepcopy(cfg), attn_implementation="eager", dtype=torch.float32
    )
    with torch.no_grad():
        for name, param in ref.named_parameters():
            if "gate" in name and param.numel() == 1:
                param.fill_(1.0)
    ours = transformers.MllamaForConditionalGeneration._from_config(
        copy.deepcopy(cfg),
        attn_implementation={"text_config": "attngate", "vision_config": "eager", "": "eager"},
        dtype=torch.float32,
    )
    ours.load_state_dict(ref.state_dict())
    return ref.eval(), ours.eval(), cfg


def two_images():
    """Two requests with two images each (image tokens at 3 and 7, two tiles each): text between them sees the first
    image, text after the second only the second; the second request sees one tile of its second image."""
    ids = torch.randint(1, 120, (2, 12), generator=torch.Generator().manual_seed(0))
    ids[:, [3, 7]] = 127
    cross = torch.zeros(2, 12, 2, 2, dtype=torch.long)
    cross[:, 3:7, 0] = 1
    cross[:, 7:, 1] = 1
    cross[1, 7:, 1, 1] = 0
    return dict(
        input_ids=ids,
        pixel_values=torch.randn(2, 2, 2, 3, 28, 28, generator=torch.Generator().manual_seed(2)),
        aspect_ratio_ids=torch.tensor([[2, 2], [2, 2]]),
        aspect_ratio_mask=torch.ones(2, 2, 2, dtype=torch.long),
        cross_attention_mask=cross,
    )


def on_fa_standin(monkeypatch) -> list[tuple[list[int], list[int], bool]]:
    """Run the GPU path on the CPU: flash_attn.cute is the stand-in, every tensor counts as on the GPU. Returns the
    list that each varlen call appends its (cu_seqlens_q, cu_seqlens_k, causal, seqused_q, seqused_k) to. Call after building the models
    (transformers probes flash_attn's import spec there)."""
    import sys

    from attngate.integrations import transformers_plain
    from tests.support.standins import flash_attn_cute

    modules = flash_attn_cute.modules()
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(transformers_plain, "_on_gpu", lambda t: True)
    calls, original = [], modules["flash_attn.cute"].flash_attn_varlen_func

    def recorded(q, k, v, **kw):
        used = [None if kw.get(n) is None else kw[n].tolist() for n in ("seqused_q", "seqused_k")]
        calls.append((kw["cu_seqlens_q"].tolist(), kw["cu_seqlens_k"].tolist(), kw["causal"], *used))
        return original(q, k, v, **kw)

    monkeypatch.setattr(modules["flash_attn.cute"], "flash_attn_varlen_func", recorded)
    return calls
