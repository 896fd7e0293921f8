"""What the FA kernels read of the paged KV cache per batch: ``seqused_k`` and the page table (the encoder's too, and
the local batches' of a DECODE graph), built for an eager batch or refilled in a CUDA graph's static buffers."""

from __future__ import annotations

import torch

from attngate.backends.fa_kernels import FaMetadata
from attngate.backends.fa_local import local_decode_in_place
from attngate.backends.page_ids import page_table
from attngate.backends.runtime.batch_metadata import check_page_aligned
from attngate.errors import BatchMetadataError, Problem
from attngate.facts.modes import ForwardMode
from attngate.plan.schema import Plan


class FaKvMetadata:
    """The KV half of a batch's :class:`FaMetadata`.

    Parameters
    ----------
    plan : Plan
        Reads each forward mode's ``fa.kv_extent``: the kernel reads prefix + new tokens, the prefix only, or no cache.
    req_to_token : torch.Tensor
        ``[max_requests, max_context_len]`` int32 on the device: each request's token slots in the pool.
    page_size : int
        Tokens per page of the pool (the plan's ``common.page_size``, checked against the pool).
    chunk : int or None
        ``attention_chunk_size`` of the chunked-local layers (None: the layers have none).
    """

    def __init__(self, plan: Plan, req_to_token: torch.Tensor, page_size: int, chunk: int | None):
        self._modes = {mode: plan.mode(mode) for mode in ForwardMode}
        self.req_to_token, self.page_size, self.chunk = req_to_token, page_size, chunk
        #: pages of a full row of req_to_token: the width of a page table by default and of a graph's static one
        self.max_pages = -(-req_to_token.shape[1] // page_size)

    def fill(
        self,
        md: FaMetadata,
        mode: ForwardMode,
        rows: torch.Tensor,
        seq_lens: torch.Tensor,
        extend_seq_lens: torch.Tensor | int,
        encoder_lens: torch.Tensor | None,
        *,
        in_place: bool = False,
        pages: int | None = None,
        encoder_lens_cpu: torch.Tensor | None = None,
    ) -> None:
        """seqused_k and page_table (and the encoder's) on the device; ``in_place`` refills a graph's static buffers
        (``extend_seq_lens`` then the graph's new tokens per request; ``encoder_lens_cpu`` spares a sync)."""
        extent = self._modes[mode].fa.kv_extent
        if extent == "none":
            return
        if in_place and encoder_lens is not None:  # eager batches checked this on their host copy
            host_enc = encoder_lens_cpu if encoder_lens_cpu is not None else encoder_lens.cpu()
            check_page_aligned(host_enc.numpy(), self.page_size, "encoder_lens", "FA")
        seqused = seq_lens if encoder_lens is None else seq_lens - encoder_lens
        if extent == "prefix":
            seqused = seqused - extend_seq_lens
        if in_place:
            if (encoder_lens is None) != (md.encoder_seqused_k is None):  # the cross layers read the captured buffers
                raise BatchMetadataError(
                    Problem(
                        "encoder_lens",
                        "this CUDA graph was captured "
                        + (
                            "without encoder tokens"
                            if encoder_lens is not None
                            else "with encoder tokens, which this replay does not give"
                        ),
                        code="batch-metadata.encoder-tokens",
                        help="capture it with encoder_lens" if encoder_lens is not None else None,
                    )
                )
            md.seqused_k.copy_(seqused)
            self.page_table(rows, encoder_lens, None, out=md.page_table)
            if md.local is not None:
                local_decode_in_place(md, self.req_to_token, rows, seqused, self.chunk, self.page_size)
            if encoder_lens is not None:
                md.encoder_seqused_k.copy_(encoder_lens)
                self.page_table(rows, None, None, out=md.encoder_page_table)
            return
        md.seqused_k, md.page_table = seqused.to(torch.int32), self.page_table(rows, encoder_lens, pages)
        if encoder_lens is not None:
            md.encoder_seqused_k = encoder_lens.to(torch.int32)
            md.encoder_page_table = self.page_table(rows, None, pages)

    def page_table(
        self, rows: torch.Tensor, offset: torch.Tensor | None, pages: int | None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``[bs, pages]`` int32 (default: as many as a row of req_to_token holds), starting ``offset`` tokens into the
        row; ``out``: a graph's static table to fill instead."""
        return page_table(
            self.req_to_token, rows, self.max_pages if pages is None else pages, self.page_size, offset, out
        )
