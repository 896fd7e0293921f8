"""The fact namespace that rule conditions read: names, types and values.

Three sources feed it: ``ServerArgs`` fields (after adjustment), ``ModelFacts`` and ``Platform``,
plus facts derived from them (:mod:`attngate.facts.derived`). Per-mode and per-layer rules
also read ``forward_mode`` / ``layer_kind``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, Optional

from attngate.facts.derived import DERIVED_FACTS, derived_facts
from attngate.facts.gpus import GPU_ARCHS
from attngate.facts.model import ModelFacts
from attngate.facts.modes import ForwardMode, LayerKind
from attngate.facts.platform import Platform
from attngate.facts.server_args import ServerArgs
from attngate.types import FactType


@dataclass(frozen=True, slots=True)
class FactSpec:
    name: str
    type: FactType
    origin: Literal["server_args", "model", "platform", "derived", "mode", "layer", "gate"]
    doc: str


def _model_fact(name: str, annotation: Any, doc: str, *, minimum: float | None = None) -> FactSpec:
    return FactSpec(name, dataclasses.replace(FactType.from_annotation(annotation), minimum=minimum), "model", doc)


_MODEL_FACTS = [
    _model_fact("architecture", str, "first entry of config.json architectures"),
    _model_fact("model_type", str, "config.json model_type"),
    _model_fact("use_mla", bool, "multi-head latent attention (config has kv_lora_rank)"),
    _model_fact("num_attention_heads", int, "query heads", minimum=1),
    _model_fact("num_key_value_heads", int, "KV heads", minimum=1),
    _model_fact("gqa_group_size", int, "query heads per KV head", minimum=1),
    _model_fact("head_dim", int, "QK head dim, elements", minimum=1),
    _model_fact("v_head_dim", int, "V head dim, elements", minimum=1),
    _model_fact("swa_num_attention_heads", int, "query heads of the sliding-window layers (config swa_*)", minimum=1),
    _model_fact("swa_num_key_value_heads", int, "KV heads of the sliding-window layers", minimum=1),
    _model_fact("swa_head_dim", int, "QK head dim of the sliding-window layers, elements", minimum=1),
    _model_fact("swa_v_head_dim", int, "V head dim of the sliding-window layers, elements", minimum=1),
    _model_fact("kv_lora_rank", Optional[int], "MLA latent (ckv) width, elements; None without MLA", minimum=1),
    _model_fact("qk_rope_head_dim", Optional[int], "MLA rope part (kpe) of the QK head dim, elements", minimum=1),
    _model_fact("has_asymmetric_kv", bool, "head_dim != v_head_dim, or swa_head_dim != swa_v_head_dim"),
    _model_fact(
        "head_dims_multiple_of_8",
        bool,
        "every head dim (full and sliding-window layers, q·k and V) is a multiple of 8 (FlashAttention's 16-bit "
        "alignment)",
    ),
    _model_fact("sliding_window", Optional[int], "active sliding window, tokens", minimum=1),
    _model_fact("has_sliding_window", bool, "some layer uses a sliding window"),
    _model_fact("is_hybrid_swa", bool, "sliding-window and full-attention layers mixed"),
    _model_fact("is_local_attention_model", bool, "chunked local attention layers (Llama-4)"),
    _model_fact("attention_chunk_size", Optional[int], "local attention chunk, tokens", minimum=1),
    _model_fact("is_encoder_decoder", bool, "encoder-decoder model (Whisper)"),
    _model_fact("has_cross_attention", bool, "some layer attends over encoder tokens"),
    _model_fact("is_encoder_only", bool, "every layer is bidirectional (BERT, gte-Qwen2)"),
    _model_fact("is_multimodal", bool, "config has a vision or audio tower"),
    _model_fact("has_softcap", bool, "attn_logit_softcapping is set"),
    _model_fact("has_attention_sinks", bool, "learned attention sinks (gpt-oss)"),
    _model_fact("has_dual_chunk_attention", bool, "config has dual_chunk_attention_config"),
    _model_fact("has_dsa_indexer", bool, "config has index_topk (DeepSeek Sparse Attention's indexer)"),
    _model_fact(
        "has_recurrent_layers",
        bool,
        "some layers keep a recurrent state, not a KV cache (linear attention, Mamba, conv)",
    ),
    _model_fact(
        "use_bidirectional_attention",
        bool,
        "decoder layers attend both ways (EmbeddingGemma); a sliding window reaches after a query as before it",
    ),
]
_PLATFORM_FACTS = [
    FactSpec("gpu_arch", FactType("str", GPU_ARCHS), "platform", "GPU architecture"),
    FactSpec("sm_major", FactType("int"), "platform", "compute capability major"),
    FactSpec("has_flashinfer", FactType("bool"), "platform", "FlashInfer is installed"),
    FactSpec("has_flash_attn_cute", FactType("bool"), "platform", "FlashAttention-4 (flash_attn.cute) is installed"),
    FactSpec(
        "has_flash_attn_interface", FactType("bool"), "platform", "FlashAttention-3 (flash_attn_interface) is installed"
    ),
    FactSpec(
        "runs_sglang",
        FactType("bool"),
        "platform",
        "SGLang's attention backends run the plan (false: attngate's own, AttngateRuntime and the transformers path)",
    ),
]
_DERIVED_FACTS = [FactSpec(fact.name, fact.type, "derived", fact.doc) for fact in DERIVED_FACTS]
MODE_FACT = FactSpec(
    "forward_mode", FactType("str", tuple(m.value for m in ForwardMode)), "mode", "forward mode of the batch"
)
LAYER_FACT = FactSpec(
    "layer_kind", FactType("str", tuple(k.value for k in LayerKind)), "layer", "kind of the attention layer"
)


def _server_arg_facts() -> list[FactSpec]:
    return [
        FactSpec(name, FactType.from_field(field), "server_args", field.description or "server argument")
        for name, field in ServerArgs.model_fields.items()
    ]


#: Every fact a global rule may read, by name.
FACTS: dict[str, FactSpec] = {
    f.name: f for f in [*_server_arg_facts(), *_MODEL_FACTS, *_PLATFORM_FACTS, *_DERIVED_FACTS]
}


def model_facts(model: ModelFacts) -> dict[str, Any]:
    values = {f.name: getattr(model, f.name, None) for f in _MODEL_FACTS if f.name != "has_softcap"}
    values["has_softcap"] = model.attn_logit_softcapping is not None
    return values


def base_facts(args: ServerArgs, model: ModelFacts, platform: Platform) -> dict[str, Any]:
    """The fact values of one configuration (without forward_mode / layer_kind)."""
    values = args.model_dump()
    values.update(model_facts(model))
    values.update(
        gpu_arch=platform.gpu_arch,
        sm_major=platform.sm_major,
        has_flashinfer=platform.has_flashinfer,
        has_flash_attn_cute=platform.has_flash_attn_cute,
        has_flash_attn_interface=platform.has_flash_attn_interface,
        runs_sglang=platform.runs_sglang,
    )
    values.update(derived_facts(values))
    return values
