"""The Triton kernel of :func:`attngate.backends.fa_padded.merge_split`: a split decode step's pieces merged in one
launch (eager, on CUDA), where the torch ops are several kernels a piece.

Each program merges one request and head, piece after piece in order, as the torch ops do, so a request's result is
the same whatever pieces its batch adds after its own (see merge_split). Imported only on CUDA hosts with Triton
installed (an ImportError here selects the torch ops instead).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["pieces"])
def _merge_kernel(
    out,
    lse,
    sinks,
    merged,
    pieces,
    out_row_stride,
    out_head_stride,
    lse_head_stride,
    merged_row_stride,
    merged_head_stride,
    v_head_dim,
    HAS_SINKS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    b, h = tl.program_id(0), tl.program_id(1)
    first = b.to(tl.int64) * pieces
    lse_row = lse + h * lse_head_stride + first
    top = tl.full([], -float("inf"), tl.float32)
    if HAS_SINKS:
        top = tl.load(sinks + h).to(tl.float32)
    for p in range(pieces):
        top = tl.maximum(top, tl.load(lse_row + p))
    top = tl.where(top == -float("inf"), 0.0, top)  # no key and no sink: every weight exp(-inf) = 0
    total = tl.full([], 0.0, tl.float32)
    if HAS_SINKS:
        total = tl.exp(tl.load(sinks + h).to(tl.float32) - top)
    d = tl.arange(0, BLOCK_D)
    keep = d < v_head_dim
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for p in range(pieces):
        weight = tl.exp(tl.load(lse_row + p) - top)
        total += weight
        row = out + (first + p) * out_row_stride + h * out_head_stride
        acc += weight * tl.load(row + d, mask=keep, other=0.0).to(tl.float32)
    acc = tl.where(total > 0, acc / total, 0.0)
    tl.store(merged + b * merged_row_stride + h * merged_head_stride + d, acc.to(merged.dtype.element_ty), mask=keep)


def merge_split(out: torch.Tensor, lse: torch.Tensor, pieces: int, sinks: torch.Tensor | None) -> torch.Tensor:
    """:func:`attngate.backends.fa_padded.merge_split` in one launch: ``out: [B * P, H, Dv]`` (last dim contiguous),
    ``lse: [H, B * P]`` float32 (last dim contiguous), ``sinks: [H]`` or None -> ``[B, 1, H, Dv]`` in out's dtype."""
    h, v_head_dim = out.shape[1], out.shape[2]
    b = out.shape[0] // pieces
    merged = out.new_empty(b, 1, h, v_head_dim)
    has_sinks = sinks is not None
    _merge_kernel[(b, h)](
        out,
        lse,
        sinks if has_sinks else lse,
        merged,
        pieces,
        out.stride(0),
        out.stride(1),
        lse.stride(0),
        merged.stride(0),
        merged.stride(2),
        v_head_dim,
        HAS_SINKS=has_sinks,
        BLOCK_D=triton.next_power_of_2(v_head_dim),
    )
    return merged
