"""The Triton kernel of :func:`attngate.backends.page_ids.fill_page_ids` and ``page_table``: one launch per
batch, no host sync.

Imported only on CUDA hosts with Triton installed (an ImportError here selects the torch ops instead).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


# integers are not specialised (bs 1 or 16-divisible sizes would each compile a variant of their own)
@triton.jit(do_not_specialize=["r2t_stride", "r2t_width", "width", "page_size"])
def _page_ids_kernel(
    req_to_token,
    rows,
    kv_indptr,
    first_token,
    out,
    r2t_stride,
    r2t_width,
    width,
    page_size,
    CSR: tl.constexpr,
    HAS_FIRST: tl.constexpr,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    row = tl.load(rows + b).to(tl.int64)
    if CSR:  # request b's pages go to out[kv_indptr[b]:kv_indptr[b + 1]]
        start = tl.load(kv_indptr + b).to(tl.int64)
        count = tl.load(kv_indptr + b + 1).to(tl.int64) - start
    else:  # row b of a [bs, width] table
        start = b.to(tl.int64) * width
        count = width
    first = tl.load(first_token + b).to(tl.int64) if HAS_FIRST else 0
    base = req_to_token + row * r2t_stride
    for j0 in range(0, count, BLOCK):
        j = j0 + tl.arange(0, BLOCK)
        keep = j < count
        col = tl.minimum(first + j * page_size, r2t_width - 1)
        slot = tl.load(base + col, mask=keep)
        tl.store(out + start + j, (slot // page_size).to(tl.int32), mask=keep)


def launch(
    req_to_token: torch.Tensor,
    rows: torch.Tensor,
    kv_indptr: torch.Tensor | None,
    first_token: torch.Tensor | None,
    out: torch.Tensor,
    page_size: int,
    width: int = 0,
) -> None:
    """Writes ``out`` in place: CSR by ``kv_indptr`` (``[bs + 1]`` on the device) or, with ``kv_indptr`` None, a
    ``[bs, width]`` table; ``first_token``: ``[bs]`` on the device, each request's first token (default 0)."""
    bs = rows.shape[0]
    csr, has_first = kv_indptr is not None, first_token is not None
    _page_ids_kernel[(bs,)](
        req_to_token,
        rows,
        kv_indptr if csr else rows,
        first_token if has_first else rows,
        out,
        req_to_token.stride(0),
        req_to_token.shape[1],
        width,
        page_size,
        CSR=csr,
        HAS_FIRST=has_first,
        BLOCK=512 if csr else 64,
    )
