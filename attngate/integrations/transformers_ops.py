"""The plain transformers path's kernel calls as torch custom ops (:mod:`attngate.integrations.transformers_plain`),
each with a fake (meta) implementation: to torch.compile each is one opaque op of the graph (as vLLM registers its
attention), so a compiled model keeps one graph around it, and a kernel package's Python, which no graph can hold,
runs at call time. What each passes is decided from the Plan by the caller."""

from __future__ import annotations

from typing import Optional

import torch

from attngate.backends import fa_padded, varlen
from attngate.integrations.transformers_rows import DECISIONS, unpad


# an opaque op to torch.compile (as vLLM registers its attention): the varlen lengths live on the host and a kernel
# package's Python is no graph's, so a compiled model keeps one graph around it rather than breaking at every layer
@torch.library.custom_op("attngate::plain_kernel_attention", mutates_args=())
def kernel_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    visible: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    sinks: Optional[torch.Tensor],
    module_id: int,
    kernel: str,
    scale: float,
) -> torch.Tensor:
    """The call on the GPU kernel ``kernel`` ("fa" or "flashinfer") for the attention module ``module_id`` (its
    decisions as kept), over the batch unpadded into varlen rows: ``[B, S, H, Dv]``, zeros at padding queries.
    ``attention_mask``, transformers' (``visible`` is made from it), names the batch's layout: every layer it reaches
    shares one unpadding."""
    d = DECISIONS[module_id]
    rows = unpad(query, key, value, visible, d, attention_mask)
    cu_q, cu_k = rows.cu_seqlens
    common = dict(
        cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, scale=scale, causal=d.causal, window_left=d.window, softcap=d.logit_cap
    )
    if kernel == "fa":
        out = varlen.fa4_varlen(
            rows.q,
            rows.k,
            rows.v,
            max_seqlen_q=int(rows.lens[0].max()),
            max_seqlen_k=int(rows.lens[1].max()),
            sinks=sinks,
            **common,
        )
    else:
        if (
            sinks is not None
        ):  # the plan refuses FlashInfer for sinks (flashinfer.no-attention-sinks); a config edited since
            raise ValueError(
                "FlashInfer runs no learned attention sinks; configure() the model again with another attention_backend"
            )
        out = varlen.flashinfer_ragged(
            rows.q,
            rows.k,
            rows.v,
            lens=rows.lens,
            kernel_family=d.prefill_kernel_family,
            workspace_size_mb=d.workspace_size_mb,
            **common,
        )
    return rows.pad_back(out, query, value)


# keys per split of a decode step on the padded FA path (attngate.backends.fa_padded): 128 CTAs on an H100 for one
# 32k request with 4 KV heads; a fixed count, so a request's split points do not depend on its batch
DECODE_SPLIT_KEYS = 1024


@torch.library.custom_op("attngate::fa_padded_attention", mutates_args=())
def fa_padded_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    extents: torch.Tensor,
    sinks: Optional[torch.Tensor],
    scale: float,
    causal: bool,
    window_left: int,
    softcap: float,
) -> torch.Tensor:
    """FA4 over transformers' padded batch and cache in place: ``query: [B, S, H, D]``, ``key``/``value:
    [B, S_kv, H_kv, D/Dv]`` (views of its ``[B, H, S, D]`` tensors), ``extents: [4, B]`` int32 (where each request's
    valid queries and keys run), ``window_left`` -1: no window -> ``[B, S, H, Dv]``, zeros at padding queries."""
    return fa_padded.fa4_padded(
        query,
        key,
        value,
        extents,
        scale=scale,
        causal=causal,
        window_left=None if window_left < 0 else window_left,
        softcap=softcap,
        sinks=sinks,
        split_keys=DECODE_SPLIT_KEYS,
    )


@fa_padded_attention.register_fake
def _(query, key, value, extents, sinks, scale, causal, window_left, softcap) -> torch.Tensor:
    b, s, h, _ = query.shape
    return query.new_empty(b, s, h, value.shape[-1])


@kernel_attention.register_fake
def _(query, key, value, visible, attention_mask, sinks, module_id, kernel, scale) -> torch.Tensor:
    b, h, s, _ = query.shape
    return query.new_empty(b, s, h, value.shape[-1])
