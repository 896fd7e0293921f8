"""Forward modes and layer kinds: the two per-batch / per-layer dimensions of the Plan's tables."""

from __future__ import annotations

from enum import Enum


class ForwardMode(str, Enum):
    """What a forward pass does (SGLang's meanings).

    ``seq_lens`` always counts the tokens in the KV cache *after* this forward's tokens are written;
    ``extend_prefix_lens`` counts the cached prefix. The convention holds in eager runs and in
    CUDA-graph replay.
    """

    EXTEND = "extend"  # prefill of new tokens, with or without a cached prefix
    DECODE = "decode"  # one new token per request
    TARGET_VERIFY = "target_verify"  # chain speculative decoding: draft tokens, causal among themselves
    DRAFT_EXTEND_V2 = "draft_extend_v2"  # fixed new tokens per request, written before attention
    IDLE = "idle"  # empty batch (DP padding)


class LayerKind(str, Enum):
    """How an attention layer attends."""

    FULL = "full"  # causal over the whole context
    SLIDING_WINDOW = "sliding_window"  # causal over the last sliding_window_size tokens
    CHUNKED_LOCAL = "chunked_local"  # causal within attention_chunk_size blocks (Llama-4 iRoPE)
    CROSS_ATTENTION = "cross_attention"  # decoder queries over encoder tokens, non-causal
    ENCODER_ONLY = "encoder_only"  # bidirectional over the request's own tokens
