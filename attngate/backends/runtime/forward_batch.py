"""``ForwardBatch``: the per-forward metadata every backend reads (SGLang's names and meanings)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attngate.facts.modes import ForwardMode


@dataclass
class ForwardBatch:
    """One forward pass over ``batch_size`` requests.

    Attributes:
        forward_mode: EXTEND, DECODE, TARGET_VERIFY, DRAFT_EXTEND_V2 or IDLE.
        batch_size: number of requests (0 for IDLE).
        req_pool_indices: ``[batch_size]`` int64, rows of ``req_to_token``.
        seq_lens: ``[batch_size]`` int32, tokens in the cache *after* this forward's tokens are
            written (every mode; for encoder-decoder models it includes the encoder tokens).
        seq_lens_cpu: the same, on the host.
        extend_prefix_lens: ``[batch_size]`` int32, tokens already cached before this forward.
        extend_seq_lens: ``[batch_size]`` int32, new tokens of this forward (1 for DECODE).
        out_cache_loc: ``[num_tokens]`` int64, the slot each new token's K/V is written to, in
            request order.
        encoder_lens: ``[batch_size]`` int32 encoder tokens at the start of each request's row of
            ``req_to_token``, or None for decoder-only models.
        encoder_out_cache_loc: ``[num_encoder_tokens]`` int64, slots the encoder K/V of cross-attention
            layers are written to when this forward carries them, else None.
        extend_seq_lens_cpu: the new-token counts on the host (lets GPU backends size kernels
            without a device-to-host copy), or None.
        encoder_lens_cpu: ``encoder_lens`` on the host, or None (then read from the device at a sync).
        spec_tree_mask: TARGET_VERIFY over a speculative tree (the plan's ``common.tree_mask``): ``[batch_size, D, D]``
            bool on the device, D draft tokens per request in their flattened order; ``[r, i, j]`` is true when
            draft token j of request r is draft token i's ancestor or i itself (so only for j <= i). None otherwise.
    """

    forward_mode: ForwardMode
    batch_size: int
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    extend_prefix_lens: torch.Tensor
    extend_seq_lens: torch.Tensor
    out_cache_loc: torch.Tensor
    encoder_lens: torch.Tensor | None = None
    encoder_out_cache_loc: torch.Tensor | None = None
    extend_seq_lens_cpu: list[int] | None = None
    encoder_lens_cpu: torch.Tensor | None = None
    spec_tree_mask: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.out_cache_loc.shape[0])
