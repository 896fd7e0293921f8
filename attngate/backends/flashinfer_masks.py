"""FlashInfer's custom masks (flattened, request by request over each planned KV range, FlashInfer's
``custom_mask`` layout): the paged half of a ragged+paged window layer, and a speculative tree's verify."""

from __future__ import annotations

import numpy as np
import torch

from attngate.backends.runtime.batch_metadata import BatchLengths, PageRange, host


def prefix_window_mask(window_left: int, rng: PageRange, lens: BatchLengths, device: torch.device) -> torch.Tensor:
    """Flattened ``[sum(new_i * kv_len_i)]`` bool: key at ``start + j`` is visible to the query at ``prefix + i``
    when ``start + j >= prefix + i - window``."""
    parts = []
    for b in range(lens.batch_size):
        q_pos = lens.enc[b] + lens.prefix[b] + np.arange(lens.new[b])
        k_pos = rng.first_token[b] + np.arange(rng.kv_len[b])
        parts.append((k_pos[None, :] >= q_pos[:, None] - window_left).reshape(-1))
    return host(np.concatenate(parts)).to(device, non_blocking=True)


def packed_tree_mask(rng: PageRange, tree: torch.Tensor) -> torch.Tensor:
    """Flattened ``[sum(D * kv_len_r)]`` bool (request, query, key order) over each request's planned KV range:
    its cached keys visible, its last D keys (the draft tokens) where ``tree: [bs, D, D]`` says. A window is not
    folded in: FlashInfer applies window_left beside a custom mask, at the positions the reference gives the
    draft tokens. The scatter's indices come from the host lengths (bs x D x D of them, one copy): a fill and one
    scatter on the device, no sync."""
    d = tree.shape[1]
    kv_len = rng.kv_len.astype(np.int64)
    row0 = d * (np.cumsum(kv_len) - kv_len) + kv_len - d  # each request's first draft key in its first query's row
    steps = np.arange(d)
    where = (
        row0[:, None, None] + steps[None, :, None] * kv_len[:, None, None] + steps[None, None, :]
    )  # [bs, D, D], host
    mask = torch.ones(int(d * kv_len.sum()), dtype=torch.bool, device=tree.device)
    mask[host(where.reshape(-1)).to(tree.device, non_blocking=True)] = tree.flatten()
    return mask
