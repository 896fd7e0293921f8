"""Per-layer attention kinds from a config's layout keys (attngate.facts.hf_schema.LayerLayout), family by family.

Sources (transformers' config classes): Gemma2's alternation, Gemma3's ``sliding_window_pattern``, EXAONE 4's letter
pattern, ``layer_types`` (hybrid models' included), Qwen2's ``use_sliding_window`` / ``max_window_layers``,
Llama-4's ``attention_chunk_size`` / ``no_rope_layers``, Mllama's ``cross_attention_layers``, NemotronH's
``hybrid_override_pattern``; MiMo-V2's ``hybrid_layer_pattern`` / ``sliding_window_size`` (SGLang 0.5.23
configs/model_config.py ``get_hybrid_layer_ids`` l.2723-2729 and its generic fallback l.2812-2821).
"""

from __future__ import annotations

from dataclasses import dataclass

from attngate.facts.hf_schema import LayerLayout
from attngate.facts.modes import LayerKind

_LAYER_KINDS: dict[str, LayerKind | None] = {
    "full_attention": LayerKind.FULL,
    "attention": LayerKind.FULL,
    "sliding_attention": LayerKind.SLIDING_WINDOW,
    "chunked_attention": LayerKind.CHUNKED_LOCAL,
    "linear_attention": None,  # no softmax attention, no KV cache
    "conv": None,
    "mamba": None,
    "mamba2": None,
}
_BIDIRECTIONAL_MODEL_TYPES = {"bert", "roberta", "xlm-roberta", "distilbert", "nomic_bert", "modernbert"}


@dataclass(frozen=True)
class Layout:
    """A model's attention layers: one kind per softmax-attention layer (an encoder-decoder's encoder layers first),
    the model layer index of each where some layers hold no KV cache (else None), the active sliding window and chunk
    (tokens)."""

    kinds: tuple[LayerKind, ...]
    attention_ids: tuple[int, ...] | None = None
    window: int | None = None
    chunk: int | None = None


def layout(keys: LayerLayout, n: int, model_type: str) -> tuple[Layout, list[tuple[str, str]]]:
    """The layout of ``n`` model layers, and (key, message) for each key that cannot give one."""
    problems = list(keys.per_layer_lengths(n))
    if problems:
        return Layout(()), problems
    if model_type in _BIDIRECTIONAL_MODEL_TYPES or keys.is_causal is False:
        return Layout((LayerKind.ENCODER_ONLY,) * n), []
    window, chunk = keys.sliding_window, keys.attention_chunk_size
    if keys.hybrid_layer_pattern is not None and keys.sliding_window_size is not None:
        window = keys.sliding_window_size  # what SGLang's MiMo-V2 layers are given
    if keys.cross_attention_layers is not None:  # Mllama: no window or chunk on any layer
        window = chunk = None
    if keys.use_sliding_window is False:  # Qwen2Config: a window is configured but switched off
        window = None
    if keys.use_bidirectional_attention and window:  # Gemma3TextConfig: |q - k| < sliding_window // 2 + 1
        window = window // 2 + 1
    found = _kinds(keys, n, model_type, window, chunk)
    kinds = found if isinstance(found, tuple) else tuple(found[i] for i in sorted(found))
    attention_ids = tuple(sorted(found)) if isinstance(found, dict) and len(found) < n else None
    if isinstance(found, dict) and not found:
        key = "layer_types" if keys.layer_types is not None else "hybrid_override_pattern"
        problems.append((key, "names no attention layer; attngate plans softmax attention only"))
    for kind, size, key in (
        (LayerKind.SLIDING_WINDOW, window, "sliding_window"),
        (LayerKind.CHUNKED_LOCAL, chunk, "attention_chunk_size"),
    ):
        # a layer kind needs its size: no plan with a window of -1
        if kind in kinds and size is None and getattr(keys, key) is None:
            problems.append((key, f"missing: the config has {kind.value} layers, which need it (tokens)"))
    return Layout(kinds, attention_ids, window, chunk), problems


def _kinds(
    keys: LayerLayout, n: int, model_type: str, window: int | None, chunk: int | None
) -> tuple[LayerKind, ...] | dict[int, LayerKind]:
    """Kinds per model layer; a dict (model layer index -> kind) where some layers may have no softmax attention."""
    if keys.cross_attention_layers is not None:
        cross = set(keys.cross_attention_layers)
        return tuple(LayerKind.CROSS_ATTENTION if i in cross else LayerKind.FULL for i in range(n))
    if keys.hybrid_layer_pattern is not None:  # read before layer_types, as SGLang reads MiMo-V2
        return tuple(LayerKind.SLIDING_WINDOW if flag else LayerKind.FULL for flag in keys.hybrid_layer_pattern)
    if keys.layer_types is not None:
        return {i: kind for i, name in enumerate(keys.layer_types) if (kind := _LAYER_KINDS[name]) is not None}
    if keys.hybrid_override_pattern is not None:  # "*" attention, "M" Mamba-2, "-" MLP, "E" MoE
        return {i: LayerKind.FULL for i, c in enumerate(keys.hybrid_override_pattern) if c == "*"}
    if chunk is not None:
        # Llama-4: RoPE layers attend within chunks; every no_rope_layer_interval-th layer is global NoPE
        if keys.no_rope_layers:
            return tuple(LayerKind.CHUNKED_LOCAL if use_rope else LayerKind.FULL for use_rope in keys.no_rope_layers)
        interval = keys.no_rope_layer_interval or 4
        return tuple(LayerKind.FULL if (i + 1) % interval == 0 else LayerKind.CHUNKED_LOCAL for i in range(n))
    if window is None:
        return (LayerKind.FULL,) * n
    if model_type == "gemma2":  # even layers slide, odd layers are global
        return tuple(LayerKind.SLIDING_WINDOW if i % 2 == 0 else LayerKind.FULL for i in range(n))
    pattern = keys.sliding_window_pattern
    if isinstance(pattern, str):  # EXAONE 4: "LLLG", local (L) or global (G) per layer, repeated
        return tuple(LayerKind.SLIDING_WINDOW if pattern[i % len(pattern)] == "L" else LayerKind.FULL for i in range(n))
    if pattern is not None:  # Gemma3: every pattern-th layer is global
        return tuple(LayerKind.FULL if (i + 1) % pattern == 0 else LayerKind.SLIDING_WINDOW for i in range(n))
    if keys.use_sliding_window is True:  # Qwen2: layer i slides where i >= max_window_layers (0: every layer)
        first = keys.max_window_layers or 0
        return tuple(LayerKind.SLIDING_WINDOW if i >= first else LayerKind.FULL for i in range(n))
    return (LayerKind.SLIDING_WINDOW,) * n  # Mistral-style global window
