"""The FlashAttention backend (serves ``attention_backend`` fa3 and fa4), taking every decision from the Plan.

Provider (``plan.fa.provider``): FA4's ``flash_attn.cute.flash_attn_varlen_func`` with
``cu_seqlens_q``, ``seqused_k`` and ``page_table``, or FA3's ``flash_attn_interface`` where installed.

Per batch (``init_forward_metadata``): ``cu_seqlens_q [bs+1]`` int32, ``seqused_k [bs]`` int32 (what
``plan.mode(mode).fa.kv_extent`` says the kernel reads: post-write ``seq_lens`` for
prefix + new tokens, in eager runs and CUDA-graph replay alike), and ``page_table [bs, max_pages]``
int32 (``req_to_token`` rows, one slot per page, divided by ``page_size``). Per layer: the write and
the read of the KV cache both follow the layer kind's ``common.write_kv_cache`` (false under the fast path ``fa.skip_kv_cache``);
``causal`` / ``use_window`` come from the layer-kind table; ``num_splits`` from ``fa.num_splits``.

Chunked-local layers (Llama 4, ``attention_chunk_size``) run over local virtual batches (SGLang's
``make_local_attention_virtual_batches``): each request's queries are cut at chunk boundaries, and
each piece is one causal varlen batch entry whose keys start at its chunk's first token (its page
table row starts at that page, so ``attention_chunk_size`` must be a multiple of ``page_size``).
Built on the host from the batch's CPU lengths in eager runs; CUDA graphs replay DECODE only.
"""

from __future__ import annotations

import torch

from attngate.backends.base import AttentionBackend
from attngate.backends.capabilities import fa_refusals
from attngate.backends.checks import (
    check_batch,
    check_pool_page_size,
)
from attngate.backends.fa_graphs import FaCudaGraphs
from attngate.backends.fa_kernels import (
    Fa3Kernel,
    Fa4Kernel,
    FaMetadata,
    fa_window_size,
)
from attngate.backends.fa_local import local_decode_in_place, local_virtual_batches
from attngate.backends.mla import (
    absorb_q,
    absorbed_for_batch,
    check_mla_weights,
    decompress,
    project_out,
)
from attngate.backends.page_ids import page_ids, page_table
from attngate.backends.runtime.batch_metadata import BatchLengths, check_page_aligned, host
from attngate.backends.runtime.forward_batch import ForwardBatch
from attngate.backends.runtime.layer import AttentionLayer
from attngate.errors import BackendRefusal, BatchMetadataError, Problem
from attngate.facts.modes import ForwardMode, LayerKind
from attngate.plan.schema import Plan


class FlashAttentionBackend(FaCudaGraphs, AttentionBackend):
    """FA3/FA4 over the paged pool. ``checked=True`` validates every batch before a kernel launch
    (indices inside the pool, lengths inside req_to_token) and raises BatchMetadataError instead of
    an illegal memory access; off by default, no cost when off."""

    def __init__(
        self,
        plan: Plan,
        kv_pool,
        req_to_token: torch.Tensor,
        layers: list[AttentionLayer],
        device: torch.device | str = "cuda",
        *,
        checked: bool = False,
    ):
        super().__init__(plan, kv_pool, req_to_token, layers, device)
        fa = plan.fa
        self.num_splits = fa.num_splits
        self.precompute_scheduler_metadata = fa.precompute_scheduler_metadata
        self.page_size = check_pool_page_size(plan, kv_pool)
        self.kernel = Fa3Kernel() if fa.provider == "flash_attn_interface" else Fa4Kernel()
        self.checked = checked
        self._layer_gates = {kind: plan.layer(kind).common for kind in LayerKind}
        self._kv_extent = {mode: plan.mode(mode).fa.kv_extent for mode in ForwardMode}
        # the scheduler metadata is planned for full-attention layers; window and cross layers never take it
        self._scheduled = next((lay for lay in layers if lay.kind == LayerKind.FULL and not lay.is_mla), None)
        self._scheduled_ids = {
            lay.layer_id for lay in layers if lay.kind == LayerKind.FULL and _same_shape(lay, self._scheduled)
        }
        self._mla = next((lay for lay in layers if lay.is_mla), None)
        self._mla_absorbed, self._mla_kv = True, None
        self.chunk = next((lay.attention_chunk_size for lay in layers if lay.kind == LayerKind.CHUNKED_LOCAL), None)
        cuda = torch.device(device).type == "cuda"
        problems = fa_refusals(plan, layers, torch.cuda.get_device_capability(device)[0] if cuda else None)
        if problems:
            raise BackendRefusal(problems)
        self._max_pages = -(-req_to_token.shape[1] // self.page_size)  # a full row of req_to_token
        self._arange = torch.arange(req_to_token.shape[0] + 1, dtype=torch.int32, device=self.device)
        self.md: FaMetadata | None = None
        self._graph: dict[str, torch.Tensor] | None = None
        # per captured (mode, batch size): its own cu_seqlens_q, views of the shared static buffers that replays refill
        self._graph_md: dict[tuple[ForwardMode, int], FaMetadata] = {}

    # ---- metadata ----------------------------------------------------------------------------------

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        if self.checked:
            check_batch(batch, self.req_to_token, self.kv_pool.num_slots)
        if batch.forward_mode == ForwardMode.IDLE:
            self.md = None
            return
        lens = BatchLengths.from_batch(batch)
        self.spec_tree(batch.forward_mode, batch.spec_tree_mask, lens.new)  # refuses a tree batch: chains only
        if lens.has_encoder:
            check_page_aligned(lens.enc, self.page_size, "encoder_lens", "FA")
        if batch.forward_mode == ForwardMode.DECODE:  # one query per request: cu_seqlens_q is a slice of a fixed arange
            if lens.batch_size >= self._arange.shape[0]:  # more requests than rows (DP padding shares one row)
                self._arange = torch.arange(lens.batch_size + 1, dtype=torch.int32, device=self.device)
            cu, max_q = self._arange[: lens.batch_size + 1], 1
        else:
            cu, max_q = host(lens.qo_indptr).to(self.device, non_blocking=True), lens.max_new
        self.md = FaMetadata(cu, max_q, None, None)
        max_k = lens.max_seq
        self._fill_kv_metadata(
            self.md,
            batch.forward_mode,
            batch.req_pool_indices,
            batch.seq_lens,
            batch.extend_seq_lens,
            batch.encoder_lens,
            pages=-(-max_k // self.page_size),
        )
        if self._mla is not None:
            self._mla_metadata(lens)
        if self.chunk is not None:
            self.md.local = local_virtual_batches(
                self.req_to_token,
                batch.req_pool_indices,
                lens.seq.tolist(),
                lens.new.tolist(),
                self.chunk,
                self.page_size,
            )
        if (
            batch.forward_mode == ForwardMode.DECODE
            and self.precompute_scheduler_metadata
            and self._scheduled is not None
        ):
            self.md.scheduler_metadata = self.kernel.scheduler_metadata(
                self.md,
                self._scheduled,
                max_k,
                num_splits=self.num_splits,
                page_size=self.page_size,
                dtype=self.kv_pool.dtype,
            )

    def _fill_kv_metadata(
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
        extent = self._kv_extent[mode]
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
                            "without encoder tokens; capture it with encoder_lens"
                            if encoder_lens is not None
                            else "with encoder tokens, which this replay does not give"
                        ),
                    )
                )
            md.seqused_k.copy_(seqused)
            self._page_table(rows, encoder_lens, None, out=md.page_table)
            if md.local is not None:
                local_decode_in_place(md, self.req_to_token, rows, seqused, self.chunk, self.page_size)
            if encoder_lens is not None:
                md.encoder_seqused_k.copy_(encoder_lens)
                self._page_table(rows, None, None, out=md.encoder_page_table)
            return
        md.seqused_k, md.page_table = seqused.to(torch.int32), self._page_table(rows, encoder_lens, pages)
        if encoder_lens is not None:
            md.encoder_seqused_k = encoder_lens.to(torch.int32)
            md.encoder_page_table = self._page_table(rows, None, pages)

    def _mla_metadata(self, lens: BatchLengths) -> None:
        """MLA per batch: the form, and for non-absorbed attention over a prefix, every cached token's slot and cu_seqlens_k."""
        self._mla_absorbed = absorbed_for_batch(self.plan.mode(lens.mode).common.mla_form, lens.has_prefix)
        self._mla_kv = None
        if not self._mla_absorbed and lens.has_prefix:
            tokens = lens.kv_pages(1)  # page size 1: every cached token's slot
            slots = page_ids(self.req_to_token, lens.rows, tokens, 1).long()
            self._mla_kv = (slots, host(tokens.indptr).to(self.device), lens.max_seq)

    def _forward_mla(
        self, q, k, layer: AttentionLayer, batch: ForwardBatch, md: FaMetadata, write: bool
    ) -> torch.Tensor:
        """``q: [T, H, qk_nope + qk_rope]``, ``k``: the latent ``[T, 1, kv_lora_rank + qk_rope]`` -> ``[T, H, v_head_dim]``."""
        check_mla_weights(layer)
        if write and k is not None:
            self.kv_pool.set_kv_buffer(layer.layer_id, batch.out_cache_loc, k)
        cache = self.kv_pool.kv_buffer[layer.layer_id]
        if self._mla_absorbed:
            paged = cache.view(-1, self.page_size, 1, cache.shape[-1])
            q_abs = absorb_q(q, layer)
            r = layer.kv_lora_rank
            out = self.kernel.mla_absorbed(
                q_abs[..., r:],
                paged[..., r:],
                paged[..., :r],
                q_abs[..., :r],
                md=md,
                layer=layer,
                num_splits=self.num_splits,
            )
            return project_out(out, layer)
        if self._mla_kv is None:  # no prefix: this forward's latent is all there is
            k_full, v_full = decompress(k, layer)
            cu_k, max_k = md.cu_seqlens_q, md.max_seqlen_q
        else:
            slots, cu_k, max_k = self._mla_kv
            k_full, v_full = decompress(cache[slots], layer)
        return self.kernel(
            q,
            k_full,
            v_full,
            cu_seqlens_q=md.cu_seqlens_q,
            max_seqlen_q=md.max_seqlen_q,
            cu_seqlens_k=cu_k,
            max_seqlen_k=max_k,
            layer=layer,
            causal=True,
            window=(None, None),
            num_splits=self.num_splits,
        )

    def _page_table(
        self, rows: torch.Tensor, offset: torch.Tensor | None, pages: int | None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``[bs, pages]`` int32 (default: as many as a row of req_to_token holds), starting ``offset`` tokens into the
        row; ``out``: a graph's static table to fill instead."""
        return page_table(
            self.req_to_token, rows, self._max_pages if pages is None else pages, self.page_size, offset, out
        )

    # ---- forward -----------------------------------------------------------------------------------

    def forward_decode(self, q, k, v, layer, batch, save_kv_cache):
        return self.forward_extend(q, k, v, layer, batch, save_kv_cache)

    def forward_extend(self, q, k, v, layer: AttentionLayer, batch: ForwardBatch, save_kv_cache: bool) -> torch.Tensor:
        md = self.md
        if layer.kind == LayerKind.CHUNKED_LOCAL:  # the local virtual batches replace the request batch
            if md.local is None:
                raise BatchMetadataError(
                    Problem(f"layer {layer.layer_id}", "chunked-local layer, but no local metadata was built")
                )
            md = (
                md.local
                if md.seqused_k is not None
                else FaMetadata(md.local.cu_seqlens_q, md.local.max_seqlen_q, None, None)
            )
        gates = self._layer_gates[layer.kind]
        cached = gates.write_kv_cache  # the write side and the read side both read this
        cross = layer.kind == LayerKind.CROSS_ATTENTION
        if layer.is_mla:
            return self._forward_mla(q, k, layer, batch, md, cached and save_kv_cache)
        if save_kv_cache and cached and k is not None:
            loc = batch.encoder_out_cache_loc if cross else batch.out_cache_loc
            self.kv_pool.set_kv_buffer(layer.layer_id, loc, k, v)
        window = fa_window_size(layer.sliding_window_size if gates.use_window else None, gates.causal)
        common = dict(
            layer=layer,
            causal=gates.causal,
            window=window,
            num_splits=self.num_splits,
            cu_seqlens_q=md.cu_seqlens_q,
            max_seqlen_q=md.max_seqlen_q,
        )
        if not cached:  # the embedding fast path / encoder-only layers: attend on the raw K/V of this forward
            return self.kernel(q, k, v, cu_seqlens_k=md.cu_seqlens_q, max_seqlen_k=md.max_seqlen_q, **common)
        if md.seqused_k is None:
            raise BatchMetadataError(
                Problem(f"forward mode {batch.forward_mode.value}", "the plan reads no KV cache in this mode")
            )
        k_cache, v_cache = self.paged_kv(layer.layer_id)
        if cross:
            return self.kernel(
                q, k_cache, v_cache, seqused_k=md.encoder_seqused_k, page_table=md.encoder_page_table, **common
            )
        scheduled = md.scheduler_metadata if layer.layer_id in self._scheduled_ids else None
        return self.kernel(
            q,
            k_cache,
            v_cache,
            seqused_k=md.seqused_k,
            page_table=md.page_table,
            scheduler_metadata=scheduled,
            **common,
        )


def _same_shape(a: AttentionLayer, b: AttentionLayer | None) -> bool:
    return b is not None and (a.num_q_heads, a.num_kv_heads, a.head_dim, a.v_head_dim) == (
        b.num_q_heads,
        b.num_kv_heads,
        b.head_dim,
        b.v_head_dim,
    )
