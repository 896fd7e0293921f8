"""Per-batch metadata computed once and shared by every backend (vLLM's CommonAttentionMetadata).

:class:`BatchLengths` holds each request's lengths on the host, taken from the batch's CPU copies
(``seq_lens_cpu``, ``extend_seq_lens_cpu``, ``encoder_lens_cpu``), so building it costs no device
sync. :meth:`BatchLengths.kv_pages` turns them into the page ranges a kernel reads (window and
cross attention included); :func:`attngate.backends.page_ids.page_ids` gathers the page ids of those ranges on the device,
sized from the host, again without a sync. The reference, FA and FlashInfer backends all derive
their own kernel arguments from these.

Host arrays are numpy: a batch's length arithmetic is a dozen tiny ops, which cost about 1 µs each
in numpy and 5 to 10 µs each as torch CPU ops (bench/RESULTS.md, host time per step).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import numpy as np
import torch

from attngate.backends.runtime.forward_batch import ForwardBatch
from attngate.errors import BatchMetadataError, Problem
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
        return self.packed[len(self.indptr) : 2 * len(self.indptr) - 1]

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
        return cls(
            batch.forward_mode,
            batch.req_pool_indices,
            seq,
            new,
            _encoder_lens(batch.encoder_lens, batch.encoder_lens_cpu, seq),
        )

    @classmethod
    def for_graph(
        cls,
        mode: ForwardMode,
        rows: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        per_req: int,
        encoder_lens: torch.Tensor | None,
        encoder_lens_cpu: torch.Tensor | None = None,
    ) -> BatchLengths:
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

    def kv_pages(
        self, page_size: int, *, window_left: int = -1, prefix_only: bool = False, cross: bool = False
    ) -> PageRange:
        """The pages a kernel reads per request: the encoder tokens (``cross``), or the decoder tokens (prefix,
        plus the new ones unless ``prefix_only``) from the first one a query can see under ``window_left``
        (-1: no window) on. Pages are whole, so a window's range starts at the page holding its first key.
        A dozen numpy ops on ``[bs]`` arrays: this runs for every batch and every CUDA-graph replay."""
        bs = len(self.seq)
        packed = np.zeros(3 * bs + 1, dtype=np.int32)
        indptr, first, last_len = packed[: bs + 1], packed[bs + 1 : 2 * bs + 1], packed[2 * bs + 1 :]
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
        raise BatchMetadataError(
            Problem(
                what,
                f"must be multiples of page_size {page_size} on the {backend} backend",
                code="batch-metadata.not-whole-pages",
            )
        )
