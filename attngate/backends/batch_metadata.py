"""Per-batch metadata computed once and shared by every backend (vLLM's CommonAttentionMetadata).

:class:`BatchLengths` holds each request's lengths on the host, taken from the batch's CPU copies
(``seq_lens_cpu``, ``extend_seq_lens_cpu``, ``encoder_lens_cpu``), so building it costs no device
sync. :meth:`BatchLengths.kv_pages` turns them into the page ranges a kernel reads (window and
cross attention included); :func:`page_ids` gathers the page ids of those ranges on the device,
sized from the host, again without a sync. The reference, FA and FlashInfer backends all derive
their own kernel arguments from these.

Host arrays are numpy: a batch's length arithmetic is a dozen tiny ops, which cost about 1 µs each
in numpy and 5 to 10 µs each as torch CPU ops (bench/RESULTS.md, host time per step).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import numpy as np
import torch

from attngate.backends.errors import BatchMetadataError
from attngate.backends.forward_batch import ForwardBatch
from attngate.errors import Problem
from attngate.facts.modes import ForwardMode


def indptr_of(counts: np.ndarray) -> np.ndarray:
    """``[len(counts) + 1]`` int32 prefix sums (qo_indptr, kv_indptr, cu_seqlens)."""
    out = np.zeros(len(counts) + 1, dtype=np.int32)
    np.cumsum(counts, out=out[1:])
    return out


def host(arr: np.ndarray) -> torch.Tensor:
    """A host tensor sharing ``arr``'s memory (what FlashInfer's plan() and the H2D copies take). Pageable on
    purpose: staging in pinned memory from torch's caching host allocator measured 30 to 130 µs slower per
    FlashInfer decode step on an H100 host (bench/RESULTS.md)."""
    return torch.from_numpy(np.ascontiguousarray(arr))


class PageRange(NamedTuple):
    """The pages one kernel reads per request: ``counts`` pages of its row of ``req_to_token`` from token
    ``first_token`` (page-aligned) on, ``kv_len`` tokens from there.
    ``packed`` (``[3 * bs + 1]`` int32) holds ``indptr`` (kv_indptr, ``[bs + 1]``), ``first_token`` (``[bs]``) and
    ``last_page_len`` (``[bs]``, in [1, page_size]; page_size for a request without pages, FlashInfer's convention)
    back to back, so one host-to-device copy puts all three on the device (:func:`page_ids`,
    :meth:`GraphPageIds.load`); ``indptr`` and ``last_page_len`` are views of it and go to plan() as they are.
    ``shifted``: some range may start past token 0 (a window or encoder tokens), so the kernels need first_token."""

    indptr: np.ndarray
    last_page_len: np.ndarray
    packed: np.ndarray
    kv_len: np.ndarray
    shifted: bool

    @property
    def first_token(self) -> np.ndarray:
        return self.packed[len(self.indptr): 2 * len(self.indptr) - 1]

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.indptr)

    @property
    def total_pages(self) -> int:
        return int(self.indptr[-1])


@dataclass(frozen=True)
class BatchLengths:
    """Each request's lengths, host-side, ``[bs]`` numpy int64.

    ``seq``: tokens in the row of ``req_to_token`` after this forward's writes (encoder tokens first);
    ``new``: this forward's tokens (extend_seq_lens); ``enc``: encoder tokens; ``prefix``: decoder
    tokens cached before this forward (``seq - enc - new``). ``rows`` is ``req_pool_indices`` as given
    (device).
    """

    mode: ForwardMode
    rows: torch.Tensor
    seq: np.ndarray
    new: np.ndarray
    enc: np.ndarray

    @classmethod
    def from_batch(cls, batch: ForwardBatch) -> BatchLengths:
        """From the batch's host copies; a batch without ``extend_seq_lens_cpu`` or ``encoder_lens_cpu`` costs
        a device-to-host copy for the missing one."""
        seq = batch.seq_lens_cpu.numpy().astype(np.int64)
        if batch.forward_mode == ForwardMode.DECODE:
            new = np.ones_like(seq)
        elif batch.extend_seq_lens_cpu is not None:
            new = np.asarray(batch.extend_seq_lens_cpu, dtype=np.int64)
        else:
            new = batch.extend_seq_lens.cpu().numpy().astype(np.int64)
        return cls(batch.forward_mode, batch.req_pool_indices, seq, new, _encoder_lens(batch.encoder_lens, batch.encoder_lens_cpu, seq))

    @classmethod
    def for_graph(cls, mode: ForwardMode, rows: torch.Tensor, seq_lens_cpu: torch.Tensor, per_req: int,
                  encoder_lens: torch.Tensor | None, encoder_lens_cpu: torch.Tensor | None = None) -> BatchLengths:
        """A CUDA-graph batch: ``per_req`` new tokens per request."""
        seq = seq_lens_cpu.numpy().astype(np.int64)
        return cls(mode, rows, seq, np.full_like(seq, per_req), _encoder_lens(encoder_lens, encoder_lens_cpu, seq))

    @property
    def batch_size(self) -> int:
        return len(self.seq)

    @cached_property
    def prefix(self) -> np.ndarray:
        return self.seq - self.enc - self.new

    @cached_property
    def qo_indptr(self) -> np.ndarray:
        """``[bs + 1]`` int32, cu_seqlens_q."""
        return indptr_of(self.new)

    @property
    def num_tokens(self) -> int:
        return int(self.qo_indptr[-1])

    @property
    def max_new(self) -> int:
        return int(self.new.max(initial=0))

    @property
    def max_seq(self) -> int:
        return int(self.seq.max(initial=0))

    @cached_property
    def has_prefix(self) -> bool:
        return bool((self.prefix > 0).any())

    def kv_pages(self, page_size: int, *, window_left: int = -1, prefix_only: bool = False, cross: bool = False) -> PageRange:
        """The pages a kernel reads per request: the encoder tokens (``cross``), or the decoder tokens (prefix,
        plus the new ones unless ``prefix_only``) from the first one a query can see under ``window_left``
        (-1: no window) on. Pages are whole, so a window's range starts at the page holding its first key.
        A dozen numpy ops on ``[bs]`` arrays: this runs for every batch and every CUDA-graph replay."""
        bs = len(self.seq)
        packed = np.zeros(3 * bs + 1, dtype=np.int32)
        indptr, first, last_len = packed[: bs + 1], packed[bs + 1: 2 * bs + 1], packed[2 * bs + 1:]
        if cross:  # the encoder tokens open the row
            end, shifted = self.enc, False
        else:
            end = self.seq - self.new if prefix_only else self.seq
            shifted = window_left >= 0 or self.has_encoder
            if window_left >= 0:  # from the page holding the first visible key
                np.maximum(self.enc, end - (0 if prefix_only else self.new) - window_left, out=first, casting="unsafe")
                first -= first % page_size
            elif shifted:
                np.subtract(self.enc, self.enc % page_size, out=first, casting="unsafe")
        kv_len = np.maximum(end - first, 0) if shifted else end
        counts = (kv_len + (page_size - 1)) // page_size
        np.cumsum(counts, out=indptr[1:])
        np.subtract(kv_len, counts * page_size, out=last_len, casting="unsafe")
        last_len += page_size  # kv_len - (counts - 1) * page_size: page_size where kv_len is 0
        return PageRange(indptr, last_len, packed, kv_len, shifted)

    @cached_property
    def has_encoder(self) -> bool:
        return bool(self.enc.any())


def _encoder_lens(device_lens: torch.Tensor | None, host_lens: torch.Tensor | None, seq: np.ndarray) -> np.ndarray:
    if host_lens is not None:
        return host_lens.numpy().astype(np.int64)
    if device_lens is not None:
        return device_lens.cpu().numpy().astype(np.int64)  # a device sync; pass encoder_lens_cpu to avoid it
    return np.zeros_like(seq)


def check_page_aligned(lens: np.ndarray, page_size: int, what: str, backend: str) -> None:
    """BatchMetadataError when ``lens`` (e.g. encoder_lens) are not whole pages."""
    if page_size > 1 and bool((lens % page_size).any()):
        raise BatchMetadataError(Problem(what, f"must be multiples of page_size {page_size} on the {backend} backend"))


def page_ids(req_to_token: torch.Tensor, rows: torch.Tensor, pages: PageRange, page_size: int,
             packed: torch.Tensor | None = None) -> torch.Tensor:
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
        first = packed[bs + 1: 2 * bs + 1] if pages.shifted else None
        fill_page_ids(req_to_token, rows, packed, first, out, page_size)
    return out


def device_ranges(pages: PageRange, device: torch.device | str) -> torch.Tensor:
    """``pages.packed`` on ``device``, one host-to-device copy: ``[: bs + 1]`` is kv_indptr, ``[bs + 1: 2 * bs + 1]``
    first_token, ``[2 * bs + 1:]`` kv_last_page_len (int32)."""
    return torch.from_numpy(pages.packed).to(device, non_blocking=True)  # kv_pages made it contiguous


def fill_page_ids(req_to_token: torch.Tensor, rows: torch.Tensor, kv_indptr: torch.Tensor, first_token: torch.Tensor | None,
                  out: torch.Tensor, page_size: int) -> None:
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
    :func:`fill_page_ids` on these buffers, so each replay rebuilds the ids with no host work."""

    rows: torch.Tensor  # [bs] int64, req_pool_indices (may be shared by a graph's wrappers)
    kv_indptr: torch.Tensor  # [bs + 1] int32
    kv_indices: torch.Tensor  # [at least every page a batch of bs may read] int32
    first_token: torch.Tensor | None  # [bs] int32 for ranges that can start past token 0, else None (token 0)
    first_layer: int  # the layer that fills the ids
    filled: bool = False  # the current forward has filled them
    packed: torch.Tensor | None = None  # [3 * bs + 1] int32 laid out as PageRange.packed: kv_indptr, first_token, last_page_len
    last_page_len: torch.Tensor | None = None  # [bs] int32, a view of packed

    @classmethod
    def packed_buffers(cls, rows: torch.Tensor, num_pages: int, first_layer: int, *, shifted: bool) -> GraphPageIds:
        """Static buffers laid out as :attr:`PageRange.packed`, so :meth:`load` fills kv_indptr, first_token and
        last_page_len with one copy. ``rows``: ``[bs]`` int64 on the device; ``num_pages``: kv_indices capacity;
        ``shifted``: ranges may start past token 0 (first_token is kept; else None, token 0)."""
        bs = rows.numel()
        packed = torch.zeros(3 * bs + 1, dtype=torch.int32, device=rows.device)
        return cls(rows, packed[: bs + 1], torch.zeros(num_pages, dtype=torch.int32, device=rows.device),
                   packed[bs + 1: 2 * bs + 1] if shifted else None, first_layer, packed=packed, last_page_len=packed[2 * bs + 1:])

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
            raise BatchMetadataError(Problem(f"layer {layer_id}", f"a CUDA-graph forward runs layer {self.first_layer} first: "
                                                                  "it fills the page ids this layer reads"))


def page_table(req_to_token: torch.Tensor, rows: torch.Tensor, num_pages: int, page_size: int,
               first_token: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
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


_TRITON: list = []


def _triton_page_ids():
    """The Triton launcher of :func:`fill_page_ids` and :func:`page_table`, or None where Triton is not installed
    (imported on first use)."""
    if not _TRITON:
        try:
            from attngate.backends import page_ids_triton
            _TRITON.append(page_ids_triton.launch)
        except ImportError:
            _TRITON.append(None)
    return _TRITON[0]
