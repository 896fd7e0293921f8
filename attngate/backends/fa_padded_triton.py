"""The Triton kernel of :func:`attngate.backends.fa_padded.merge_split`: a split decode step's pieces merged in one
launch (eager, on CUDA), where the torch ops are several kernels a piece.

Each program merges one request and head, piece after piece in order, as the torch ops do, so a request's result is
the same whatever pieces its batch adds after its own (see merge_split). Imported only on CUDA hosts with Triton
installed (an ImportError here selects the torch ops instead).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["pieces", "lse_head_stride"])
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
    ``lse: [H, B * P]`` float32 (last dim contiguous), ``sinks: [H]`` or None -> ``[B, 1, H, Dv]`` in out's dtype.

    Launched through the compiled kernel of its specialization (:func:`_direct_launch`) once one is verified, else
    through Triton's dispatch, whose Python (binding and specializing every argument) costs about 40 µs of host time
    a launch, more than the merge's GPU time."""
    h, v_head_dim = out.shape[1], out.shape[2]
    b = out.shape[0] // pieces
    merged = out.new_empty(b, 1, h, v_head_dim)
    has_sinks = sinks is not None
    args = (
        out, lse, sinks if has_sinks else lse, merged, pieces, out.stride(0), out.stride(1), lse.stride(0),
        merged.stride(0), merged.stride(2), v_head_dim, has_sinks, triton.next_power_of_2(v_head_dim),
    )  # fmt: skip
    # what Triton specializes on (pieces and lse's stride it is told not to): the ints, dtypes, 16-byte alignment
    key = (out.get_device(), out.dtype, args[5:7], args[8:], *(t.data_ptr() % 16 == 0 for t in args[:4]))
    compiled = _COMPILED.get(key)
    if compiled:
        compiled[(b, h, 1)](*args)
        return merged
    kernel = _merge_kernel[(b, h)](*args[:11], HAS_SINKS=has_sinks, BLOCK_D=args[12])
    if compiled is None and not torch.cuda.is_current_stream_capturing():  # the check reads the host: not in capture
        _COMPILED[key] = _direct_launch(kernel, merged, args, (b, h, 1))
    return merged


# per specialization, the compiled merge kernel once a direct launch of it was verified, or False where it was not
_COMPILED: dict[tuple, Any] = {}


def _direct_launch(kernel: Any, merged: torch.Tensor, args: tuple, grid: tuple[int, int, int]) -> Any:
    """``kernel`` (the CompiledKernel Triton's dispatch just launched) where launching it directly,
    ``kernel[grid](*args)`` with every argument in order, writes what the dispatch wrote bit for bit; False otherwise
    (a Triton whose compiled launcher takes other arguments). One host read, once per specialization."""
    again = merged.new_empty(merged.shape)
    try:
        kernel[grid](*args[:3], again, *args[4:])
        return kernel if torch.equal(again, merged) else False
    except Exception:  # noqa: BLE001 - any refusal of the direct launch keeps Triton's dispatch
        return False
