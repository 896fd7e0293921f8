"""FlashAttention-4 (``flash_attn.cute``) over a padded batch in place: no unpadding, no host synchronisation.

A padded batch (transformers' layout: ``[B, S, H, D]`` queries, ``[B, H_kv, S_kv, D]`` keys and values, its
DynamicCache or static cache as is) is handed to the varlen kernel as it lies in memory: each request's row starts
at its own offset (``cu_seqlens_*``, on the device) and runs for its own length (``seqused_*``, on the device), so
padding is skipped by where the kernel starts reading, not by copying the valid tokens out. Keys in the cache's
head-major layout are read through an overlapping strided view (``_token_rows``): token ``i`` of request ``b`` is
flat row ``b * row + i`` with the head stride left as it is. Only shapes are read on the host, so the call can be
captured in a CUDA graph and traced by torch.compile as one opaque op.

A decode step (one query per request) splits each request's keys every ``split_keys`` keys into separate kernel
rows and merges their states (log-sum-exp), since flash_attn.cute has no split-KV on SM90 (``fa.num_splits`` 1
there) and one row per KV head leaves most SMs idle at small batch. The split points depend on the request alone,
not on the batch (as FlashInfer's ``fixed_split_size``), so a request's result is the same in any batch.

Shapes: ``extents: [4, B]`` int32 on q's device: first valid query, end of valid queries, first valid key, end of
valid keys (padded positions); the valid queries are the last ones of the valid keys (bottom-right, as causal
decoding of a left- or right-padded batch lays them out). Result ``[B, S, H, Dv]`` in q's dtype, zeros at queries
outside the valid range.
"""

from __future__ import annotations

import importlib

import torch

from attngate.backends.fa_kernels import fa_window_size


def _token_rows(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``x: [B, S, H, D]`` (any strides, ``D`` contiguous) as ``[N, H, D]`` flat token rows sharing x's memory and
    the flat row of each request's first token: ``b * row``. Heads keep their stride, so a head-major cache
    (``[B, H, S, D]`` transposed) is read in place; the view overlaps itself there, which the kernel (reading only
    the rows ``cu_seqlens`` and ``seqused`` name) never notices."""
    b, s, h, d = x.shape
    if x.stride(-1) != 1 or x.stride(0) % x.stride(1):
        x = x.contiguous()
    row = x.stride(0) // x.stride(1)
    flat = x.as_strided(((b - 1) * row + s, h, d), (x.stride(1), x.stride(2), 1))
    return flat, row


def _offsets(start: torch.Tensor, row: int) -> torch.Tensor:
    """``cu_seqlens`` whose entry b is the flat row of request b's first valid token (``[B + 1]`` int32; the last
    entry, which ``seqused`` makes unread, one past the view)."""
    b = start.shape[0]
    base = torch.arange(0, (b + 1) * row, row, dtype=torch.int32, device=start.device)
    return base + torch.nn.functional.pad(start, (0, 1))


def fa4_padded(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    extents: torch.Tensor,
    *,
    scale: float,
    causal: bool,
    window_left: int | None,
    softcap: float,
    sinks: torch.Tensor | None,
    split_keys: int,
) -> torch.Tensor:
    """``q: [B, S, H, D]``, ``k: [B, S_kv, H_kv, D]``, ``v: [B, S_kv, H_kv, Dv]`` (bf16/fp16, any strides with the
    last dimension contiguous), ``extents`` as the module says -> ``[B, S, H, Dv]``. ``window_left``: earlier keys a
    query sees (None: no window); ``softcap`` 0: none; ``sinks: [H]`` or None; ``split_keys``: keys per split of a
    decode step (0: no split)."""
    varlen = importlib.import_module("flash_attn.cute").flash_attn_varlen_func
    b, s, h, _ = q.shape
    s_kv = k.shape[1]
    q_start, q_end, k_start, k_end = extents.unbind(0)
    k_flat, k_row = _token_rows(k)
    v_flat, v_row = _token_rows(v)
    if v_row != k_row:  # one cu_seqlens_k offsets both: V in K's layout (a prefill's fresh V beside its roped K)
        k_flat, k_row = _token_rows(k.contiguous())
        v_flat, v_row = _token_rows(v.contiguous())
    if s == 1 and split_keys and s_kv > split_keys:
        pieces = -(-s_kv // split_keys)
        return _split_decode(
            varlen, q, k_flat, v_flat, k_row, extents, pieces, scale, window_left, softcap, sinks, split_keys
        )
    out = varlen(
        q.reshape(b * s, h, q.shape[-1]),  # a view of transformers' query; a copy only where it is head-major
        k_flat,
        v_flat,
        cu_seqlens_q=_offsets(q_start, s),
        cu_seqlens_k=_offsets(k_start, k_row),
        seqused_q=q_end - q_start,
        seqused_k=k_end - k_start,
        max_seqlen_q=s,
        max_seqlen_k=s_kv,
        softmax_scale=scale,
        causal=causal,
        window_size=fa_window_size(window_left, causal),
        learnable_sink=None if sinks is None else sinks.float(),
        softcap=softcap,
    )
    out = (out[0] if isinstance(out, tuple) else out).view(b, s, h, -1)
    pos = torch.arange(s, device=q.device)
    valid = (pos >= q_start[:, None]) & (pos < q_end[:, None])
    return torch.where(valid[:, :, None, None], out, 0)  # rows the kernel did not write hold whatever was there


def _split_decode(varlen, q, k_flat, v_flat, k_row, extents, pieces, scale, window_left, softcap, sinks, split_keys):
    """One query per request over its keys cut every ``split_keys``: kernel row ``(b, c)`` reads request b's keys
    ``[start + c * split_keys, ...)`` (the window, which a one-query row sees as its last keys, taken in advance), the
    states merged in float32 with the sinks added once."""
    b, _, h, _ = q.shape
    q_start, q_end, k_start, k_end = extents.unbind(0)
    if window_left is not None:
        k_start = torch.maximum(k_start, k_end - 1 - window_left)
    c = torch.arange(pieces, dtype=torch.int32, device=q.device)
    used = (k_end - k_start)[:, None] - c * split_keys
    used = used.clamp(0, split_keys).to(torch.int32).flatten()
    starts = torch.minimum(k_start[:, None] + c * split_keys, k_end[:, None]).flatten()  # an empty piece: at the end
    rows = torch.arange(b, dtype=torch.int32, device=q.device).repeat_interleave(pieces) * k_row
    cu_k = torch.nn.functional.pad(rows + starts, (0, 1), value=k_flat.shape[0])
    q_rows = q[:, 0].unsqueeze(1).expand(b, pieces, h, q.shape[-1]).reshape(b * pieces, h, q.shape[-1])
    out, lse = varlen(
        q_rows,
        k_flat,
        v_flat,
        cu_seqlens_q=torch.arange(b * pieces + 1, dtype=torch.int32, device=q.device),
        cu_seqlens_k=cu_k.to(torch.int32),
        seqused_k=used,
        max_seqlen_q=1,
        max_seqlen_k=split_keys,
        softmax_scale=scale,
        causal=False,  # every key of a one-query row before its position is seen (the window taken above)
        softcap=softcap,
        return_lse=True,
    )
    lse = lse.view(h, b, pieces).permute(1, 2, 0)  # [B, pieces, H], -inf where a piece holds no key
    total = torch.logsumexp(lse, 1)  # [B, H]
    if sinks is not None:
        total = torch.logaddexp(total, sinks.float()[None, :])
    weights = torch.exp(lse - total[:, None]).nan_to_num(0.0)
    merged = (weights[..., None] * out.view(b, pieces, h, -1).float()).sum(1)
    valid = q_end > q_start
    return torch.where(valid[:, None, None], merged, 0).to(q.dtype).unsqueeze(1)
