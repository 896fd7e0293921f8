"""Page ids on the device, gathered from ``req_to_token`` with no host sync: kv_indices (FlashInfer's flat
layout), page_table (FlashAttention's padded one), and the static buffers a CUDA graph rebuilds them in.

The ranges come from :meth:`attngate.backends.runtime.batch_metadata.BatchLengths.kv_pages` on the host; on CUDA with
Triton installed one kernel gathers them (:mod:`attngate.backends.page_ids_triton`), elsewhere torch ops.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attngate.backends.runtime.batch_metadata import PageRange, host
from attngate.backends.triton_optional import triton_launcher
from attngate.errors import BatchMetadataError, Problem


def page_ids(
    req_to_token: torch.Tensor, rows: torch.Tensor, pages: PageRange, page_size: int, packed: torch.Tensor | None = None
) -> torch.Tensor:
    """``[pages.total_pages]`` int32 on ``req_to_token``'s device: request b's page ids
    ``req_to_token[rows[b], first_token[b] + j * page_size] // page_size`` for ``j < counts[b]``, request by request
    (kv_indices). Sized on the host, its ranges copied to the device in one copy: no device sync. With
    ``page_size`` 1 these are token slots. ``packed``: ``pages.packed`` already on the device (a caller that hands its
    kv_indptr and kv_last_page_len to a kernel too copies it once, with :func:`device_ranges`); default: copied here."""
    device = req_to_token.device
    out = torch.empty(pages.total_pages, dtype=torch.int32, device=device)
    if out.numel():
        bs = len(pages.indptr) - 1
        packed = device_ranges(pages, device) if packed is None else packed
        first = packed[bs + 1 : 2 * bs + 1] if pages.shifted else None
        fill_page_ids(req_to_token, rows, packed, first, out, page_size)
    return out


def device_ranges(pages: PageRange, device: torch.device | str) -> torch.Tensor:
    """``pages.packed`` on ``device``, one host-to-device copy: ``[: bs + 1]`` is kv_indptr, ``[bs + 1: 2 * bs + 1]``
    first_token, ``[2 * bs + 1:]`` kv_last_page_len (int32)."""
    return torch.from_numpy(pages.packed).to(device, non_blocking=True)  # kv_pages made it contiguous


def fill_page_ids(
    req_to_token: torch.Tensor,
    rows: torch.Tensor,
    kv_indptr: torch.Tensor,
    first_token: torch.Tensor | None,
    out: torch.Tensor,
    page_size: int,
) -> None:
    """Writes :func:`page_ids` into ``out`` (int32, at least ``kv_indptr[-1]`` long) from device arrays alone
    (``rows: [bs]``, ``kv_indptr``: int32 whose first ``bs + 1`` entries are read, ``first_token: [bs]`` or None
    for 0), with no host sync and no shape that depends on them: it may run inside a CUDA graph, reading that
    graph's static buffers.

    On CUDA with Triton installed one kernel does it (as SGLang's create_flashinfer_kv_indices_triton);
    elsewhere a few torch ops over the whole of ``out`` compute the same.
    """
    if rows.numel() == 0:
        return
    launch = _triton_page_ids() if req_to_token.is_cuda else None
    if launch is not None:
        launch(req_to_token, rows, kv_indptr, first_token, out, page_size)
        return
    j = torch.arange(out.numel(), device=out.device)
    indptr = kv_indptr[: rows.numel() + 1].long()
    b = torch.searchsorted(indptr[1:], j, right=True).clamp_(max=rows.numel() - 1)  # the request of flat position j
    col = (j - indptr[b]) * page_size
    if first_token is not None:
        col += first_token.long()[b]
    slots = req_to_token[rows[b], col.clamp_(max=req_to_token.shape[1] - 1)]
    out.copy_(torch.where(j < indptr[-1], slots // page_size, out))


@dataclass
class GraphPageIds:
    """The page ids of one CUDA-graph wrapper, built inside the graph: the replay hook copies the rows (and first
    tokens) in and plan() fills ``kv_indptr``; then, in every captured forward, the wrapper's first layer launches
    :func:`fill_page_ids` on these buffers, so each replay rebuilds the ids with no host work.

    Attributes
    ----------
    rows : torch.Tensor
        ``[bs]`` int64 on the device: ``req_pool_indices`` (may be shared by a graph's wrappers).
    kv_indptr : torch.Tensor
        ``[bs + 1]`` int32: each request's offset into ``kv_indices`` (pages).
    kv_indices : torch.Tensor
        int32, at least as long as every page a batch of ``bs`` may read: the page ids.
    first_token : torch.Tensor or None
        ``[bs]`` int32 for ranges that can start past token 0; None: every range starts at token 0.
    first_layer : int
        The layer that fills the ids.
    filled : bool
        The current forward has filled them.
    packed : torch.Tensor or None
        ``[3 * bs + 1]`` int32 laid out as :attr:`PageRange.packed`: kv_indptr, first_token, last_page_len.
    last_page_len : torch.Tensor or None
        ``[bs]`` int32 (tokens in each request's last page), a view of ``packed``.
    """

    rows: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    first_token: torch.Tensor | None
    first_layer: int
    filled: bool = False
    packed: torch.Tensor | None = None
    last_page_len: torch.Tensor | None = None

    @classmethod
    def packed_buffers(cls, rows: torch.Tensor, num_pages: int, first_layer: int, *, shifted: bool) -> GraphPageIds:
        """Static buffers laid out as :attr:`PageRange.packed`, so :meth:`load` fills kv_indptr, first_token and
        last_page_len with one copy. ``rows``: ``[bs]`` int64 on the device; ``num_pages``: kv_indices capacity;
        ``shifted``: ranges may start past token 0 (first_token is kept; else None, token 0)."""
        bs = rows.numel()
        packed = torch.zeros(3 * bs + 1, dtype=torch.int32, device=rows.device)
        return cls(
            rows,
            packed[: bs + 1],
            torch.zeros(num_pages, dtype=torch.int32, device=rows.device),
            packed[bs + 1 : 2 * bs + 1] if shifted else None,
            first_layer,
            packed=packed,
            last_page_len=packed[2 * bs + 1 :],
        )

    def load(self, pages: PageRange) -> None:
        """Copy a batch's ranges into the static buffers, one host-to-device copy (what FlashInfer's fast_decode_plan
        leaves to its caller). Needs :meth:`packed_buffers`' layout and a batch of this graph's size."""
        self.packed.copy_(host(pages.packed), non_blocking=True)

    def on_layer(self, layer_id: int, req_to_token: torch.Tensor, page_size: int) -> None:
        """Before a layer of this wrapper runs: its first layer fills the ids; a layer before it would read stale
        ones (BatchMetadataError naming the layer to run first)."""
        if layer_id == self.first_layer:
            fill_page_ids(req_to_token, self.rows, self.kv_indptr, self.first_token, self.kv_indices, page_size)
            self.filled = True
        elif not self.filled:
            raise BatchMetadataError(
                Problem(
                    f"layer {layer_id}",
                    f"a CUDA-graph forward runs layer {self.first_layer} first: it fills the page ids this layer reads",
                    code="batch-metadata.page-ids-unfilled",
                )
            )


def page_table(
    req_to_token: torch.Tensor,
    rows: torch.Tensor,
    num_pages: int,
    page_size: int,
    first_token: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[bs, num_pages]`` int32 on the device, the padded layout of :func:`page_ids` (FA's ``page_table``):
    row b holds the page ids of ``req_to_token[rows[b]]`` from token ``first_token[b]`` on (``[bs]`` on the
    device, page-aligned, which callers check on the host; default 0), columns past the row's end clamped to
    its last entry. ``out``: a ``[bs, num_pages]`` int32 buffer to fill instead (a CUDA graph's static table).
    No host sync: one Triton launch on CUDA; elsewhere torch ops."""
    bs = rows.shape[0]
    if out is None:
        out = torch.empty(bs, num_pages, dtype=torch.int32, device=req_to_token.device)
    if bs == 0 or num_pages == 0:
        return out
    launch = _triton_page_ids() if req_to_token.is_cuda else None
    if launch is not None:
        launch(req_to_token, rows, None, first_token, out, page_size, num_pages)
        return out
    cols = _strided(req_to_token.device, num_pages, page_size)[None, :]
    if first_token is not None:
        cols = first_token[:, None].long() + cols
    cols = cols.clamp(max=req_to_token.shape[1] - 1).expand(bs, num_pages)
    out.copy_(torch.gather(req_to_token.index_select(0, rows), 1, cols) // page_size)
    return out


@functools.lru_cache(maxsize=64)
def _strided(device: torch.device, num_pages: int, page_size: int) -> torch.Tensor:
    """``[num_pages]`` int64: the first token of each page (made once per shape, not per batch)."""
    return torch.arange(0, num_pages * page_size, page_size, device=device)


def _triton_page_ids() -> Callable[..., None] | None:
    """The Triton launcher of :func:`fill_page_ids` and :func:`page_table` (:mod:`attngate.backends.page_ids_triton`),
    None without Triton."""
    return triton_launcher("attngate.backends.page_ids_triton", "launch")
