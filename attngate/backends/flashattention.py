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
from attngate.backends.checks import check_batch, check_graph_batch, check_pool_page_size
from attngate.backends.fa_graphs import FaCudaGraphs
from attngate.backends.fa_kernels import (
    Fa3Kernel,
    Fa4Kernel,
    FaMetadata,
    fa_window_size,
)
from attngate.backends.fa_local import local_virtual_batches
from attngate.backends.fa_metadata import FaKvMetadata
from attngate.backends.fa_mla import FaMla
from attngate.backends.runtime.batch_metadata import BatchLengths, check_page_aligned, host
from attngate.backends.runtime.forward_batch import ForwardBatch
from attngate.backends.runtime.layer import AttentionLayer
from attngate.errors import BackendRefusal, BatchMetadataError, Problem
from attngate.facts.modes import ForwardMode, LayerKind
from attngate.plan.schema import Plan


class FlashAttentionBackend(AttentionBackend):
    """FA3/FA4 over the paged pool. ``checked=True`` validates every batch before a kernel launch
    (indices inside the pool, lengths inside req_to_token) and raises BatchMetadataError instead of
    an illegal memory access; off by default, no cost when off. ``q_dtype`` is taken and not needed: FA reads 16-bit
    caches only, in the queries' dtype.

    Composed of the kernel (:class:`Fa3Kernel` or :class:`Fa4Kernel`, as ``plan.fa.provider`` says), the KV
    metadata (:class:`FaKvMetadata`, ``self.kv``: seqused_k and page tables), the MLA path where the layers have MLA
    (:class:`FaMla`, ``self.mla``) and the CUDA-graph keeper (:class:`FaCudaGraphs`, ``self.graphs``); the backend
    keeps the current batch's metadata (``self.md``)."""

    def __init__(
        self,
        plan: Plan,
        kv_pool,
        req_to_token: torch.Tensor,
        layers: list[AttentionLayer],
        device: torch.device | str = "cuda",
        *,
        checked: bool = False,
        q_dtype: torch.dtype | None = None,
    ):
        super().__init__(plan, kv_pool, req_to_token, layers, device, checked=checked, q_dtype=q_dtype)
        self.page_size = check_pool_page_size(plan, kv_pool)
        self.kernel = Fa3Kernel() if plan.fa.provider == "flash_attn_interface" else Fa4Kernel()
        self._layer_gates = {kind: plan.layer(kind).common for kind in LayerKind}
        # the scheduler metadata is planned for full-attention layers; window and cross layers never take it
        self._scheduled = next((lay for lay in layers if lay.kind == LayerKind.FULL and not lay.is_mla), None)
        self._scheduled_ids = {
            lay.layer_id for lay in layers if lay.kind == LayerKind.FULL and _same_shape(lay, self._scheduled)
        }
        self.chunk = next((lay.attention_chunk_size for lay in layers if lay.kind == LayerKind.CHUNKED_LOCAL), None)
        cuda = torch.device(device).type == "cuda"
        problems = fa_refusals(plan, layers, torch.cuda.get_device_capability(device)[0] if cuda else None)
        if problems:
            raise BackendRefusal(problems)
        self.kv = FaKvMetadata(plan, req_to_token, self.page_size, self.chunk)
        self.mla = (
            FaMla(plan, self.kernel, kv_pool, req_to_token, self.page_size, self.device)
            if any(lay.is_mla for lay in layers)
            else None
        )
        self.graphs = FaCudaGraphs(plan, layers, self.kv, self.mla, self.page_size, self.device, self.chunk)
        self._arange = torch.arange(req_to_token.shape[0] + 1, dtype=torch.int32, device=self.device)
        self.md: FaMetadata | None = None  # the current batch's: an eager batch's, or a captured graph's

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
        self.kv.fill(
            self.md,
            batch.forward_mode,
            batch.req_pool_indices,
            batch.seq_lens,
            batch.extend_seq_lens,
            batch.encoder_lens,
            pages=-(-max_k // self.page_size),
        )
        if self.mla is not None:
            self.mla.prepare(lens)
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
            and self.plan.fa.precompute_scheduler_metadata
            and self._scheduled is not None
        ):
            self.md.scheduler_metadata = self.kernel.scheduler_metadata(
                self.md,
                self._scheduled,
                max_k,
                num_splits=self.plan.fa.num_splits,
                page_size=self.page_size,
                dtype=self.kv_pool.dtype,
            )

    # ---- forward -----------------------------------------------------------------------------------

    def forward_decode(self, q, k, v, layer, batch, save_kv_cache):
        return self.forward_extend(q, k, v, layer, batch, save_kv_cache)

    def forward_extend(self, q, k, v, layer: AttentionLayer, batch: ForwardBatch, save_kv_cache: bool) -> torch.Tensor:
        md = self.md
        if layer.kind == LayerKind.CHUNKED_LOCAL:  # the local virtual batches replace the request batch
            if md.local is None:
                raise BatchMetadataError(
                    Problem(
                        f"layer {layer.layer_id}",
                        "chunked-local layer, but no local metadata was built",
                        code="batch-metadata.no-local-metadata",
                    )
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
            return self.mla.forward(q, k, layer, batch, md, cached and save_kv_cache)
        if save_kv_cache and cached and k is not None:
            loc = batch.encoder_out_cache_loc if cross else batch.out_cache_loc
            self.kv_pool.set_kv_buffer(layer.layer_id, loc, k, v)
        window = fa_window_size(layer.sliding_window_size if gates.use_window else None, gates.causal)
        common = dict(
            layer=layer,
            causal=gates.causal,
            window=window,
            num_splits=self.plan.fa.num_splits,
            cu_seqlens_q=md.cu_seqlens_q,
            max_seqlen_q=md.max_seqlen_q,
        )
        if not cached:  # the embedding fast path / encoder-only layers: attend on the raw K/V of this forward
            return self.kernel(q, k, v, cu_seqlens_k=md.cu_seqlens_q, max_seqlen_k=md.max_seqlen_q, **common)
        if md.seqused_k is None:
            raise BatchMetadataError(
                Problem(
                    f"forward mode {batch.forward_mode.value}",
                    "the plan reads no KV cache in this mode",
                    code="batch-metadata.no-kv-read",
                )
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

    # ---- CUDA graphs (see :class:`attngate.backends.base.AttentionBackend`) ------------------------

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self.graphs.init_state(max_bs)

    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode
    ):
        self.md = self.graphs.capture(bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode)

    def init_forward_metadata_replay_cuda_graph(
        self,
        bs,
        req_pool_indices,
        seq_lens,
        seq_lens_cpu,
        encoder_lens,
        forward_mode,
        encoder_lens_cpu=None,
        spec_tree_mask=None,
    ):
        md = self.md = self.graphs.captured(forward_mode, bs)  # eager batches in between replaced self.md
        if self.mla is not None:
            self.mla.prepare_graph(forward_mode)
        per_req = md.max_seqlen_q
        self.spec_tree(forward_mode, spec_tree_mask, [per_req] * bs)  # chains only
        if self.checked:
            check_graph_batch(
                self,
                bs,
                per_req,
                req_pool_indices,
                seq_lens,
                seq_lens_cpu,
                encoder_lens,
                forward_mode,
                encoder_lens_cpu,
            )
        self.kv.fill(
            md,
            forward_mode,
            req_pool_indices,
            seq_lens,
            per_req,
            encoder_lens,
            in_place=True,
            encoder_lens_cpu=encoder_lens_cpu,
        )


def _same_shape(a: AttentionLayer, b: AttentionLayer | None) -> bool:
    return b is not None and (a.num_q_heads, a.num_kv_heads, a.head_dim, a.v_head_dim) == (
        b.num_q_heads,
        b.num_kv_heads,
        b.head_dim,
        b.v_head_dim,
    )
