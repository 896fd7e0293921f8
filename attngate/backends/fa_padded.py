"""FlashAttention-4 (``flash_attn.cute``) over a padded batch in place: no unpadding, no host synchronisation.

A padded batch (transformers' layout: ``[B, H, S, D]`` queries, ``[B, H_kv, S_kv, D]`` keys and values, its
DynamicCache or static cache as is) is handed to the varlen kernel as it lies in memory:
each request's row starts at its own offset (``cu_seqlens_*``, on the device) and runs for its own length
(``seqused_*``, on the device), so padding is skipped by where the kernel starts reading, not by copying the valid
tokens out. Keys in the cache's head-major layout are read through an overlapping strided view (:func:`token_rows`):
token ``i`` of request ``b`` is flat row ``b * row + i``, the head stride left as it is. Only shapes and strides are
read on the host, so the call can be captured in a CUDA graph and traced by torch.compile as one opaque op.

A decode step (one query per request) may split each request's keys every ``split_keys`` keys into separate kernel
rows and merge their states (log-sum-exp), since flash_attn.cute has no split-KV on SM90 (``fa.num_splits`` 1 there)
and one row per KV head leaves most SMs idle at small batch. The split points are offsets from each request's first
key: with a fixed ``split_keys`` (as FlashInfer's ``fixed_split_size``) a request's result is the same in any batch.

The metadata (:func:`rows`, :func:`split_rows`) and the epilogues (:func:`zero_padding`, :func:`merge_split`) are plain
torch on the device, apart from the kernel call (attngate.backends.varlen.fa4_varlen over :func:`token_rows` views of
K and V), so that a compiled graph fuses them and computes the metadata once per forward; in eager on CUDA the merge is
one Triton kernel.

``extents: [4, B]`` int32 on q's device: each request's first valid query, end of valid queries, first valid key and
end of valid keys (padded positions); the valid queries are the last ones of the valid keys (bottom-right, as causal
decoding of a left- or right-padded batch lays them out).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attngate.backends.triton_optional import triton_launcher


def token_rows(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``x: [B, H, S, D]`` (transformers' layout; ``D`` contiguous, ``stride(0)`` a multiple of ``stride(2)``: see
    :func:`same_layout`) as ``[N, H, D]`` flat token rows sharing x's memory, and the flat row of each request's first
    token: ``b * row``. Heads keep their stride, so a head-major cache is read in place; the view overlaps itself
    there, which the kernel (reading only the rows ``cu_seqlens`` and ``seqused`` name) never notices."""
    b, h, s, d = x.shape
    token = x.stride(2)
    row = x.stride(0) // token
    return x.as_strided(((b - 1) * row + s, h, d), (token, x.stride(1), 1)), row


def same_layout(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``k, v: [B, H_kv, S_kv, D]`` laid out so that one ``cu_seqlens_k`` offsets both (a prefill's fresh V beside its
    roped K, or an odd layout, is copied contiguous), and their row (:func:`token_rows`)."""
    k_row, v_row = _row(k), _row(v)
    if k_row is None or k_row != v_row:
        k, v = k.contiguous(), v.contiguous()
        k_row = _row(k)
    return k, v, k_row


def _row(x: torch.Tensor) -> int | None:
    """Flat rows per request of ``x: [B, H, S, D]`` read through :func:`token_rows`; None where it cannot be."""
    s0, _, s2, s3 = x.stride()
    return s0 // s2 if s3 == 1 and s2 > 0 and s0 % s2 == 0 else None


def rows(extents: torch.Tensor, s: int, k_row: int) -> tuple[torch.Tensor, ...]:
    """``cu_seqlens_q``, ``cu_seqlens_k`` (``[B + 1]`` int32: each request's first valid flat row; the last entry,
    which ``seqused`` leaves unread, one past), ``seqused_q``, ``seqused_k`` (``[B]`` int32)."""
    q_start, q_end, k_start, k_end = extents.unbind(0)
    return _offsets(q_start, s), _offsets(k_start, k_row), q_end - q_start, k_end - k_start


def _offsets(start: torch.Tensor, row: int) -> torch.Tensor:
    b = start.shape[0]
    base = torch.arange(0, (b + 1) * row, row, dtype=torch.int32, device=start.device)
    return base + torch.nn.functional.pad(start, (0, 1))


def decode_span(s_kv: int, window_left: int | None) -> int:
    """The most keys one decode query reads of ``s_kv`` padded keys: all of them, or its window and itself."""
    return s_kv if window_left is None else min(s_kv, window_left + 1)


def split_rows(
    extents: torch.Tensor, k_row: int, s_kv: int, window_left: int | None, split_keys: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """A decode step's keys cut every ``split_keys``: ``cu_seqlens_q``, ``cu_seqlens_k`` ``[B * P + 1]`` and
    ``seqused_k`` ``[B * P]`` int32 for kernel row ``(b, p)`` (request b's keys ``[start + p * split_keys, ...)``, the
    window, which a one-query row sees as its last keys, taken in advance), and the pieces per request P, enough for
    :func:`decode_span` keys. An empty piece starts at the end."""
    _, _, k_start, k_end = extents.unbind(0)
    if window_left is not None:
        k_start = torch.maximum(k_start, k_end - 1 - window_left)
    pieces = -(-decode_span(s_kv, window_left) // split_keys)
    p = torch.arange(pieces, dtype=torch.int32, device=extents.device) * split_keys
    used = ((k_end - k_start)[:, None] - p).clamp(0, split_keys).flatten()
    starts = torch.minimum(k_start[:, None] + p, k_end[:, None])
    base = torch.arange(0, extents.shape[1] * k_row, k_row, dtype=torch.int32, device=extents.device)
    last = (extents.shape[1] - 1) * k_row + s_kv  # one past the flat view, unread
    cu_k = torch.nn.functional.pad((base[:, None] + starts).flatten(), (0, 1), value=last)
    cu_q = torch.arange(extents.shape[1] * pieces + 1, dtype=torch.int32, device=extents.device)  # one query a row
    return cu_q, cu_k.to(torch.int32), used.to(torch.int32), pieces


def valid_queries(extents: torch.Tensor, s: int) -> torch.Tensor:
    """``[B, S, 1, 1]`` bool: which of the ``s`` padded query positions of each request are valid."""
    pos = torch.arange(s, device=extents.device)
    return ((pos >= extents[0, :, None]) & (pos < extents[1, :, None]))[:, :, None, None]


def zero_padding(out: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``out: [B, S, H, Dv]`` with zeros where ``valid`` (:func:`valid_queries`) is not: rows the kernel did not
    write hold whatever was there."""
    return torch.where(valid, out, 0)


def merge_split(out: torch.Tensor, lse: torch.Tensor, pieces: int, sinks: torch.Tensor | None) -> torch.Tensor:
    """The split rows' states merged (merge_state), learned sinks added once, in float32, piece after piece in order:
    a request's empty pieces (past its keys, where a longer neighbour made more) add exact zeros, so with fixed split
    points its result is bitwise the same in any batch (a reduction over the pieces would group them by their count).
    On CUDA in eager one Triton kernel (:mod:`attngate.backends.fa_padded_triton`) runs it, elsewhere torch ops (a
    compiled graph fuses them).

    Parameters
    ----------
    out : torch.Tensor
        ``[B * P, H, Dv]``: each piece's normalised output (row ``b * P + p``), finite (zeros where it holds no key).
    lse : torch.Tensor
        ``[H, B * P]`` float32: each piece's log-sum-exp of scaled scores, -inf where it holds no key.
    pieces : int
        ``P``, pieces per request.
    sinks : torch.Tensor or None
        ``[H]`` learned sink logits, one more term of every request's softmax.

    Returns
    -------
    torch.Tensor
        ``[B, 1, H, Dv]`` in out's dtype; zeros for a request with no key (and no sinks).
    """
    launch = _triton_merge() if out.is_cuda and not torch.compiler.is_compiling() else None
    if launch is not None:
        return launch(out, lse, pieces, sinks)
    h = out.shape[1]
    b = out.shape[0] // pieces
    lse = lse.view(h, b, pieces)
    top = lse.amax(-1)  # [H, B]: exact in any order
    if sinks is not None:
        top = torch.maximum(top, sinks.float()[:, None])
    top = torch.where(top.isfinite(), top, 0.0)  # a request with no key: every weight exp(-inf) = 0
    total = torch.zeros_like(top) if sinks is None else torch.exp(sinks.float()[:, None] - top)
    merged = out.new_zeros(b, h, out.shape[-1], dtype=torch.float32)
    pieces_out = out.view(b, pieces, h, -1)
    for p in range(pieces):
        weight = torch.exp(lse[..., p] - top)  # [H, B]
        total = total + weight
        merged = merged + weight.t()[..., None] * pieces_out[:, p].float()
    total = total.t()[..., None]
    return torch.where(total > 0, merged / total, 0.0).to(out.dtype).unsqueeze(1)


def _triton_merge() -> Callable[..., torch.Tensor] | None:
    """The Triton launcher of :func:`merge_split` (:mod:`attngate.backends.fa_padded_triton`), None without Triton."""
    return triton_launcher("attngate.backends.fa_padded_triton", "merge_split")
