"""``AttentionLayer``: the static description of one attention layer, built per model from ModelFacts."""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import TYPE_CHECKING

import torch

from attngate.errors import Problem, UsageError, argument_problems, count_problems
from attngate.facts.model import ModelFacts
from attngate.facts.modes import LayerKind

if TYPE_CHECKING:
    from attngate.plan.schema import Plan


@dataclass
class AttentionLayer:
    """One attention layer.

    ``sliding_window_size`` follows SGLang: the number of *earlier* tokens a query may see, i.e. the
    HF ``sliding_window`` minus 1 (a query at position p sees keys in [p - sliding_window_size, p]).
    ``logit_cap`` is the softcap (0 = none). ``sinks``: ``[num_q_heads]`` float32 learned sink
    logits or None; ``has_sinks`` says the model has them before they are bound.

    MLA layers (``is_mla``): ``head_dim`` is q's head dim ``qk_nope_head_dim + qk_rope_head_dim``,
    ``v_head_dim`` the output's, ``num_kv_heads`` is 1 (the latent is shared by all heads), and the
    cache holds ``kv_lora_rank + qk_rope_head_dim`` values per token (ckv ++ kpe). ``w_kc:
    [num_q_heads, qk_nope_head_dim, kv_lora_rank]`` and ``w_vc: [num_q_heads, kv_lora_rank,
    v_head_dim]`` are kv_b_proj's two halves (SGLang's names); a backend uses them to absorb q_nope
    into the latent (absorbed form) or to decompress the latent into K/V (non-absorbed form).
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
    has_sinks: bool = False
    is_mla: bool = False
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    w_kc: torch.Tensor | None = None
    w_vc: torch.Tensor | None = None

    def __post_init__(self) -> None:
        """UsageError naming every field that cannot describe a layer (checked once, at construction); ``kind``
        may be given as its value (``"full"``), ``sliding_window_size`` as None (no window, as -1)."""
        problems = count_problems(
            ("layer_id", self.layer_id, 0),
            ("num_q_heads", self.num_q_heads, 1),
            ("num_kv_heads", self.num_kv_heads, 1),
            ("head_dim", self.head_dim, 1),
            ("v_head_dim", self.v_head_dim, 1),
            ("kv_lora_rank", self.kv_lora_rank, 0),
            ("qk_rope_head_dim", self.qk_rope_head_dim, 0),
            *(() if self.sliding_window_size is None else [("sliding_window_size", self.sliding_window_size, -1)]),
            *(() if self.attention_chunk_size is None else [("attention_chunk_size", self.attention_chunk_size, 1)]),
        )
        for name in ("scaling", "logit_cap"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, Real) or not value >= 0 or value == math.inf:
                problems.append(
                    Problem(name, f"takes a finite real number >= 0, not {value!r:.80}", code="usage.layer-scalar")
                )
        try:
            self.kind = LayerKind(self.kind)
        except (ValueError, TypeError):
            problems.append(
                Problem(
                    "kind",
                    f"takes a LayerKind ({', '.join(k.value for k in LayerKind)}), not {self.kind!r:.80}",
                    code="usage.layer-kind",
                )
            )
        problems += argument_problems(
            *((name, getattr(self, name), (torch.Tensor, type(None)), "") for name in ("sinks", "w_kc", "w_vc"))
        )
        if problems:
            raise UsageError(problems)

    @property
    def qk_nope_head_dim(self) -> int:
        return self.head_dim - self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        """Values per token in an MLA layer's cache: ``kv_lora_rank + qk_rope_head_dim`` (576 for DeepSeek)."""
        return self.kv_lora_rank + self.qk_rope_head_dim


def layers_from_model(
    model: ModelFacts, plan: "Plan | None" = None, *, scaling: float | None = None, include_encoder: bool = True
) -> list[AttentionLayer]:
    """One AttentionLayer per entry of ``model.layer_kinds``, each with its layer kind's shape (``model.shape``: a
    sliding-window layer's own heads and head dims where the config gives them), and one attention TP rank's heads
    when ``plan`` is given (``plan.heads_per_rank(kind)``), else the model's.

    ``include_encoder=False`` leaves out an encoder-decoder model's encoder layers (each layer keeps its
    ``layer_id``): they attend over the encoder input (Whisper's audio frames), not over the batch's tokens, so a
    paged attention backend does not serve them (SGLang's Whisper runs them with SDPA; see
    :func:`attngate.backends.checks.check_served_layers`).

    ``scaling`` defaults to ``query_pre_attn_scalar ** -0.5`` when the config has it, else the layer's
    ``head_dim ** -0.5``. MLA layers carry no ``w_kc`` / ``w_vc`` yet: the caller binds them from
    the model's weights.
    """
    layers = []
    for i, kind in enumerate(model.layer_kinds):
        if not include_encoder and model.is_encoder_decoder and kind == LayerKind.ENCODER_ONLY:
            continue
        shape = model.shape(kind)
        if plan is not None:
            q_heads, kv_heads = plan.heads_per_rank(kind)
        else:
            q_heads, kv_heads = shape.num_attention_heads, 1 if model.use_mla else shape.num_key_value_heads
        window = (model.sliding_window - 1) if kind == LayerKind.SLIDING_WINDOW and model.sliding_window else -1
        layers.append(
            AttentionLayer(
                layer_id=i,
                num_q_heads=q_heads,
                num_kv_heads=kv_heads,
                head_dim=shape.head_dim,
                v_head_dim=shape.v_head_dim,
                scaling=scaling if scaling is not None else (model.query_pre_attn_scalar or shape.head_dim) ** -0.5,
                kind=kind,
                sliding_window_size=window,
                attention_chunk_size=model.attention_chunk_size if kind == LayerKind.CHUNKED_LOCAL else None,
                logit_cap=model.attn_logit_softcapping or 0.0,
                has_sinks=model.has_attention_sinks,
                is_mla=model.use_mla,
                kv_lora_rank=model.kv_lora_rank or 0,
                qk_rope_head_dim=(model.qk_rope_head_dim or 0) if model.use_mla else 0,
            )
        )
    return layers
