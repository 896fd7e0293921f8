"""MLA (multi-head latent attention) math every backend shares: absorb, decompress, project out.

The cache holds one latent row per token, ``ckv ++ kpe``: ``[kv_lora_rank + qk_rope_head_dim]``
(576 values for DeepSeek-V2/V3, against ``2 * heads * 192`` for full K/V). Per layer, ``w_kc:
[H, qk_nope_head_dim, kv_lora_rank]`` and ``w_vc: [H, kv_lora_rank, v_head_dim]`` (the two halves
of kv_b_proj) relate the two forms, for ``q = q_nope ++ q_rope``:

- non-absorbed: ``k_nope = ckv @ w_kc^T`` per head, ``k = k_nope ++ kpe``, ``v = ckv @ w_vc``;
  attention with q/k head dim ``qk_nope + qk_rope`` and v head dim ``v_head_dim``;
- absorbed: ``q_abs = q_nope @ w_kc`` (``[T, H, kv_lora_rank]``), attention of ``q_abs ++ q_rope``
  against the latent rows (one KV head, v = ckv), then ``out = o_latent @ w_vc``.

Both give the same scores (``q_nope . k_nope = q_abs . ckv``) and the same output; a backend picks
the form the plan's per-mode ``common.mla_form`` names.
"""

from __future__ import annotations

import torch

from attngate.backends.runtime.layer import AttentionLayer
from attngate.errors import BatchMetadataError, Problem


def check_mla_weights(layer: AttentionLayer) -> None:
    """Raise BatchMetadataError when an MLA layer has no bound w_kc / w_vc."""
    if layer.w_kc is None or layer.w_vc is None:
        raise BatchMetadataError(
            Problem(
                f"layer {layer.layer_id}",
                "an MLA layer needs w_kc and w_vc (kv_b_proj) bound",
                code="batch-metadata.mla-weights-unbound",
            )
        )


def absorbed_for_batch(form: str, has_prefix: bool) -> bool:
    """Whether a batch runs the absorbed form under the mode's ``common.mla_form``."""
    return form == "absorbed" or (form == "non_absorbed_without_prefix" and has_prefix)


def absorb_q(q: torch.Tensor, layer: AttentionLayer) -> torch.Tensor:
    """``q: [T, H, qk_nope + qk_rope]`` -> ``[T, H, kv_lora_rank + qk_rope]``, computed in q's dtype (a batched
    matmul; bf16 on a GPU accumulates in float32; the reference passes float32)."""
    nope = layer.qk_nope_head_dim
    q_abs = torch.einsum("thn,hnr->thr", q[..., :nope], layer.w_kc.to(q.dtype))
    return torch.cat([q_abs, q[..., nope:]], dim=-1)


def decompress(
    latent: torch.Tensor, layer: AttentionLayer, dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``latent: [S, 1, kv_lora_rank + qk_rope]`` -> ``k: [S, H, qk_nope + qk_rope]``, ``v: [S, H, v_head_dim]``."""
    dtype = dtype or latent.dtype
    ckv, kpe = latent[:, 0, : layer.kv_lora_rank].to(dtype), latent[:, 0, layer.kv_lora_rank :].to(dtype)
    k_nope = torch.einsum("sr,hnr->shn", ckv, layer.w_kc.to(dtype))
    v = torch.einsum("sr,hrv->shv", ckv, layer.w_vc.to(dtype))
    k = torch.cat([k_nope, kpe[:, None, :].expand(-1, layer.num_q_heads, -1)], dim=-1)
    return k, v


def project_out(o_latent: torch.Tensor, layer: AttentionLayer) -> torch.Tensor:
    """``o_latent: [T, H, kv_lora_rank]`` -> ``[T, H, v_head_dim]``, computed in o_latent's dtype."""
    return torch.einsum("thr,hrv->thv", o_latent, layer.w_vc.to(o_latent.dtype))
