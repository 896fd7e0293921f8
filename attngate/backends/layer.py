"""``AttentionLayer``: the static description of one attention layer, built per model from ModelFacts."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attngate.facts.model import ModelFacts
from attngate.facts.modes import LayerKind


@dataclass
class AttentionLayer:
    """One attention layer.

    ``sliding_window_size`` follows SGLang: the number of *earlier* tokens a query may see, i.e. the
    HF ``sliding_window`` minus 1 (a query at position p sees keys in [p - sliding_window_size, p]).
    ``logit_cap`` is the softcap (0 = none). ``sinks``: ``[num_q_heads]`` float32 learned sink
    logits or None. For an MLA layer (absorbed form) ``head_dim`` is ``kv_lora_rank + qk_rope_head_dim``,
    ``v_head_dim`` is ``kv_lora_rank`` and ``num_kv_heads`` is 1.
    """

    layer_id: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    scaling: float
    kind: LayerKind = LayerKind.FULL
    sliding_window_size: int = -1
    attention_chunk_size: int | None = None
    logit_cap: float = 0.0
    sinks: torch.Tensor | None = None
    is_mla: bool = False


def layers_from_model(model: ModelFacts, *, scaling: float | None = None, absorbed_mla: bool = False) -> list[AttentionLayer]:
    """One AttentionLayer per entry of ``model.layer_kinds``.

    ``scaling`` defaults to ``query_pre_attn_scalar ** -0.5`` when the config has it, else ``head_dim ** -0.5``.
    With ``absorbed_mla`` an MLA model's layers describe the absorbed form over the latent cache.
    """
    if scaling is None:
        scaling = (model.query_pre_attn_scalar or model.head_dim) ** -0.5
    layers = []
    for i, kind in enumerate(model.layer_kinds):
        heads, kv_heads, hd, vhd = model.num_attention_heads, model.num_key_value_heads, model.head_dim, model.v_head_dim
        if model.use_mla and absorbed_mla:
            kv_heads, hd, vhd = 1, (model.kv_lora_rank or 0) + (model.qk_rope_head_dim or 0), model.kv_lora_rank or 0
        window = (model.sliding_window - 1) if kind == LayerKind.SLIDING_WINDOW and model.sliding_window else -1
        layers.append(AttentionLayer(
            layer_id=i, num_q_heads=heads, num_kv_heads=kv_heads, head_dim=hd, v_head_dim=vhd, scaling=scaling,
            kind=kind, sliding_window_size=window,
            attention_chunk_size=model.attention_chunk_size if kind == LayerKind.CHUNKED_LOCAL else None,
            logit_cap=model.attn_logit_softcapping or 0.0, is_mla=model.use_mla and absorbed_mla,
        ))
    return layers
