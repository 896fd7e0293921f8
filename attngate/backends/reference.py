"""The reference backend: plain PyTorch, float32 accumulation, CPU or GPU; the oracle of every backend test.

Semantics (the project's specification of attention):

- Request r's new tokens sit at positions ``[extend_prefix_lens[r], extend_prefix_lens[r] + extend_seq_lens[r])``
  of its own sequence (decoder positions; encoder tokens, if any, come first in ``req_to_token``).
- A causal layer's query at position p sees keys at positions ``<= p``; a sliding-window layer only
  those ``>= p - sliding_window_size`` (SGLang's convention: the window counts earlier tokens), and a
  non-causal one (a bidirectional decoder's, EmbeddingGemma) also only those ``<= p + sliding_window_size``; a
  chunked-local layer only those in p's chunk of ``attention_chunk_size``; cross-attention layers
  see every encoder token; encoder-only layers every token of the request.
- In a TARGET_VERIFY over a speculative tree (the mode's ``common.tree_mask``) a draft token sees, of the draft
  tokens, only its tree ancestors and itself (``ForwardBatch.spec_tree_mask``), besides the cached prefix; positions
  stay those of the flattened order (a window counts them as FlashInfer's window_left does).
- Scores are ``scaling * q.k``, then ``logit_cap * tanh(s / logit_cap)``; a learned sink adds one
  logit per head to the softmax denominator. GQA maps query head h to KV head ``h // (H / H_kv)``.
- KV is written at ``out_cache_loc`` and read back through ``req_to_token`` unless the plan says the
  layer keeps no cache (``common.write_kv_cache`` false for its kind, e.g. under the FA fast path): then the
  write side and the read side both use the raw K/V of this forward.
- MLA layers take ``q: [T, H, qk_nope + qk_rope]`` and the latent ``k: [T, 1, kv_lora_rank +
  qk_rope]`` (ckv ++ kpe, v None), write the latent, and attend in the form of the mode's
  ``common.mla_form`` (attngate.backends.mla): absorbed over the latent rows, or non-absorbed over
  K/V decompressed from them. Both forms are computed here, so each is the oracle of a GPU path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attngate.backends.base import AttentionBackend
from attngate.backends.checks import check_batch
from attngate.backends.mla import (
    absorb_q,
    absorbed_for_batch,
    check_mla_weights,
    decompress,
    project_out,
)
from attngate.backends.runtime.batch_metadata import BatchLengths
from attngate.backends.runtime.forward_batch import ForwardBatch
from attngate.backends.runtime.layer import AttentionLayer
from attngate.errors import BatchMetadataError, Problem
from attngate.facts.modes import LayerKind


@dataclass
class _Metadata:
    """Per-request host lengths (from the shared :class:`BatchLengths`) as Python ints for the per-request loop."""

    q_start: list[int]  # first row of each request in the token dimension
    prefix: list[int]
    new: list[int]
    encoder: list[int]
    rows: list[int]
    tree: torch.Tensor | None = None  # [bs, D, D] bool: speculative tree verify (base.tree_mask_of)

    @classmethod
    def of(cls, lens: BatchLengths) -> _Metadata:
        return cls(
            lens.qo_indptr[:-1].tolist(), lens.prefix.tolist(), lens.new.tolist(), lens.enc.tolist(), lens.rows.tolist()
        )


class ReferenceBackend(AttentionBackend):
    """Plain PyTorch attention over the paged pool; see the module docstring for the semantics."""

    _md: _Metadata | None = None  # the current batch's (init_forward_metadata)

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        check_batch(batch, self.req_to_token, self.kv_pool.num_slots)
        lens = BatchLengths.from_batch(batch)
        self._md = _Metadata.of(lens)
        self._md.tree = self.spec_tree(batch.forward_mode, batch.spec_tree_mask, self._md.new)

    def forward_decode(self, q, k, v, layer, batch, save_kv_cache):
        return self.forward_extend(q, k, v, layer, batch, save_kv_cache)

    def forward_extend(self, q, k, v, layer: AttentionLayer, batch: ForwardBatch, save_kv_cache: bool) -> torch.Tensor:
        md = self._md
        if md is None:
            raise BatchMetadataError(
                Problem(
                    "init_forward_metadata",
                    "call init_forward_metadata(batch) before forward",
                    code="batch-metadata.metadata-missing",
                )
            )
        gates = self.plan.layer(layer.kind).common
        cached = gates.write_kv_cache  # one value for the write and the read side
        if layer.kind == LayerKind.CROSS_ATTENTION:
            return self._cross(q, k, v, layer, batch, save_kv_cache, md)
        if layer.is_mla:
            check_mla_weights(layer)
            absorbed = absorbed_for_batch(self.plan.mode(batch.forward_mode).common.mla_form, any(md.prefix))
        if save_kv_cache and cached:
            if k is None:
                raise BatchMetadataError(
                    Problem(
                        f"layer {layer.layer_id}", "k/v are needed to write the cache", code="batch-metadata.kv-missing"
                    )
                )
            self.kv_pool.set_kv_buffer(layer.layer_id, batch.out_cache_loc, k, v)
        k_buf, v_buf = self.kv_pool.get_kv_buffer(layer.layer_id) if cached else (None, None)
        out = q.new_empty((q.shape[0], layer.num_q_heads, layer.v_head_dim))
        for r in range(batch.batch_size):
            rows = slice(md.q_start[r], md.q_start[r] + md.new[r])
            q_pos = torch.arange(md.prefix[r], md.prefix[r] + md.new[r], device=q.device)
            if cached:
                slots = self.req_to_token[md.rows[r], md.encoder[r] : md.encoder[r] + md.prefix[r] + md.new[r]].long()
                keys, values = k_buf[slots], v_buf[slots]
                k_pos = torch.arange(0, md.prefix[r] + md.new[r], device=q.device)
            else:
                if md.prefix[r]:
                    raise BatchMetadataError(
                        Problem(
                            f"request {r}",
                            "a layer without KV cache cannot attend to a cached prefix",
                            code="batch-metadata.prefix-without-cache",
                        )
                    )
                keys, values = k[rows], v[rows] if v is not None else None
                k_pos = q_pos
            window = layer.sliding_window_size if gates.use_window else None
            mask = None if md.tree is None else _tree_keys(md.tree[r], md.prefix[r], k_pos)
            if not layer.is_mla:
                out[rows] = attend(
                    q[rows], keys, values, q_pos, k_pos, layer, causal=gates.causal, window=window, mask=mask
                ).to(q.dtype)
            elif absorbed:  # keys are latent rows; v is their ckv part
                o = attend(
                    absorb_q(q[rows].float(), layer),
                    keys,
                    keys[..., : layer.kv_lora_rank],
                    q_pos,
                    k_pos,
                    layer,
                    causal=gates.causal,
                    window=window,
                    mask=mask,
                )
                out[rows] = project_out(o, layer).to(q.dtype)
            else:
                k_full, v_full = decompress(keys, layer, torch.float32)
                out[rows] = attend(
                    q[rows], k_full, v_full, q_pos, k_pos, layer, causal=gates.causal, window=window, mask=mask
                ).to(q.dtype)
        return out

    def _cross(self, q, k, v, layer, batch, save_kv_cache, md) -> torch.Tensor:
        if k is not None and save_kv_cache:
            if batch.encoder_out_cache_loc is None:
                raise BatchMetadataError(
                    Problem(
                        "encoder_out_cache_loc",
                        "needed to write the encoder K/V of a cross-attention layer",
                        code="batch-metadata.encoder-slots-missing",
                    )
                )
            self.kv_pool.set_kv_buffer(layer.layer_id, batch.encoder_out_cache_loc, k, v)
        k_buf, v_buf = self.kv_pool.get_kv_buffer(layer.layer_id)
        out = q.new_empty((q.shape[0], layer.num_q_heads, layer.v_head_dim))
        for r in range(batch.batch_size):
            rows = slice(md.q_start[r], md.q_start[r] + md.new[r])
            slots = self.req_to_token[md.rows[r], : md.encoder[r]].long()
            q_pos = torch.arange(md.new[r], device=q.device)
            k_pos = torch.arange(md.encoder[r], device=q.device)
            out[rows] = attend(q[rows], k_buf[slots], v_buf[slots], q_pos, k_pos, layer, causal=False, window=None).to(
                q.dtype
            )
        return out


def _tree_keys(tree: torch.Tensor, prefix: int, k_pos: torch.Tensor) -> torch.Tensor:
    """``[D, Tk]`` bool: every cached prefix key, and of the draft keys (positions ``prefix + j``) the query's tree
    ancestors and itself (``tree: [D, D]``)."""
    draft = (k_pos - prefix).clamp(min=0)
    return torch.where(k_pos >= prefix, tree[:, draft], True)


def visible_keys(
    q_pos: torch.Tensor, k_pos: torch.Tensor, *, causal: bool, window: int | None, chunk: int | None = None
) -> torch.Tensor:
    """Which keys each query sees, as the module doc specifies: ``q_pos: [..., Tq]``, ``k_pos: [Tk]`` (or per row,
    ``[..., 1, Tk]``; int positions) -> ``[..., Tq, Tk]`` bool. ``window``: sliding_window_size (earlier tokens; later
    ones too when not causal), None or < 0 for none; ``chunk``: attention_chunk_size, None for none."""
    q, k = q_pos[..., None], k_pos
    visible = torch.ones(torch.broadcast_shapes(q.shape, k.shape), dtype=torch.bool, device=q_pos.device)
    if causal:
        visible &= k <= q
    if window is not None and window >= 0:
        visible &= k >= q - window
        if not causal:  # a bidirectional layer's window reaches as far after the query (FA's window_size (w, w))
            visible &= k <= q + window
    if chunk:
        visible &= (k // chunk) == (q // chunk)
    return visible


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    layer: AttentionLayer,
    *,
    causal: bool,
    window: int | None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dense attention of one request in float32.

    ``q: [Tq, H, D]``, ``k: [Tk, Hkv, D]``, ``v: [Tk, Hkv, Dv]``, positions ``[Tq]`` / ``[Tk]``; ``mask: [Tq, Tk]``
    bool narrows what the positions allow (a speculative tree); returns ``[Tq, H, Dv]`` float32. A query that sees
    no key (possible only with a window smaller than a gap) gets zeros.
    """
    heads, kv_heads = q.shape[1], k.shape[1]
    group = heads // kv_heads
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), kf) * layer.scaling
    if layer.logit_cap:
        scores = layer.logit_cap * torch.tanh(scores / layer.logit_cap)
    visible = visible_keys(q_pos, k_pos, causal=causal, window=window, chunk=layer.attention_chunk_size)
    if mask is not None:
        visible = visible & mask.to(visible.device)
    scores = scores.masked_fill(~visible, float("-inf"))
    if layer.sinks is not None:
        sink = layer.sinks.float().to(q.device).view(heads, 1, 1).expand(heads, q.shape[0], 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    probs = torch.nan_to_num(probs, nan=0.0)
    return torch.einsum("hqk,khd->qhd", probs, vf)
