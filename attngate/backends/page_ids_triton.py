"""The Triton kernel of :func:`attngate.backends.batch_metadata.page_ids`: one launch per batch, no host sync.

Imported only on CUDA hosts with Triton installed (an ImportError here selects the torch ops instead).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _page_ids_kernel(req_to_token, rows, starts, out, r2t_stride, bs, page_size, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    row = tl.load(rows + b).to(tl.int64)
    out_start = tl.load(starts + b)  # kv_indptr[b]
    first = tl.load(starts + bs + b)  # first_page[b]
    count = tl.load(starts + 2 * bs + b)
    base = req_to_token + row * r2t_stride
    for j0 in range(0, count, BLOCK):
        j = j0 + tl.arange(0, BLOCK)
        keep = j < count
        slot = tl.load(base + (first + j) * page_size, mask=keep)
        tl.store(out + out_start + j, (slot // page_size).to(tl.int32), mask=keep)


def launch(req_to_token: torch.Tensor, rows: torch.Tensor, starts: torch.Tensor, out: torch.Tensor, page_size: int) -> None:
    """``starts: [3, bs]`` int64 on the device (kv_indptr[:-1], first_page, counts); writes ``out`` in place."""
    bs = starts.shape[1]
    _page_ids_kernel[(bs,)](req_to_token, rows, starts, out, req_to_token.stride(0), bs, page_size, BLOCK=512)
