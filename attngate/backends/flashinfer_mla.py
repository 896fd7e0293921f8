"""FlashInfer MLA (SGLang's flashinfer_mla): the ``flashinfer`` backend for models with multi-head latent attention.

Every token keeps one latent row ``ckv ++ kpe`` (``MLATokenToKVPool``). Per batch the mode's
``common.mla_form`` (with :func:`attngate.backends.mla.absorbed_for_batch`) picks the path, and
the latent of the new tokens is written before attention on both paths:

- absorbed: ``BatchMLAPagedAttentionWrapper`` over the paged latent cache, causal, bottom-right
  aligned (a query at position p of a request sees keys ``<= p``); q_nope is absorbed through
  ``w_kc`` first and the latent output projected through ``w_vc`` after. Decode, target verify,
  draft extend and EXTEND over a prefix without the chunked prefix cache take this path.
- non-absorbed: the latent of prefix and new tokens is decompressed into K (qk_nope + qk_rope)
  and V (v_head_dim), and ``BatchPrefillWithRaggedKVCacheWrapper`` runs causal attention of the new
  tokens against them (no prefix: the raw latent of this forward, no gather).

Kernel families come from the plan: ``flashinfer.mla_kernel_family`` for the MLA wrapper,
``flashinfer.prefill_kernel_family`` for the ragged wrapper. CUDA graphs: every mode the plan
captures (DECODE, TARGET_VERIFY, DRAFT_EXTEND_V2; all absorbed), the MLA wrapper's static buffers
re-planned in place before each replay; as in the FlashInfer backend, the graph builds its page ids itself
(the replay hook copies the rows; the first layer of the captured forward fills kv_indices).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import numpy as np
import torch

from attngate.backends.base import AttentionBackend
from attngate.backends.capabilities import flashinfer_mla_refusals
from attngate.backends.checks import (
    captured_graph,
    check_batch,
    check_capture_mode,
    check_graph_batch,
    check_pool_page_size,
)
from attngate.backends.mla import (
    absorb_q,
    absorbed_for_batch,
    check_mla_weights,
    decompress,
    project_out,
)
from attngate.backends.page_ids import GraphPageIds, page_ids
from attngate.backends.runtime.batch_metadata import BatchLengths, host
from attngate.backends.runtime.forward_batch import ForwardBatch
from attngate.backends.runtime.layer import AttentionLayer
from attngate.errors import BackendRefusal, Problem, UsageError
from attngate.facts.modes import ForwardMode
from attngate.plan.schema import Plan


@dataclass
class _MLAGraph:
    """One captured (forward mode, batch size): its MLA wrapper and the page ids the graph builds."""

    wrapper: object
    per_req: int  # queries per request
    ids: GraphPageIds


class FlashInferMLABackend(AttentionBackend):
    """FlashInfer over the latent cache; built by :func:`attngate.backends.flashinfer.flashinfer_backend` (the
    ``flashinfer`` name's factory) when the layers are MLA layers."""

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
        problems = flashinfer_mla_refusals(plan, layers)
        if problems:
            raise BackendRefusal(problems)
        self.fi = importlib.import_module("flashinfer")
        self.page_size = check_pool_page_size(plan, kv_pool)
        self._head = layers[0]
        self._dtype = kv_pool.dtype
        self.q_dtype = q_dtype or kv_pool.dtype  # the model's dtype; differs from the pool's under an FP8 cache
        self._family = plan.flashinfer.mla_kernel_family
        self.workspace = torch.empty(plan.flashinfer.workspace_size_mb << 20, dtype=torch.uint8, device=self.device)
        self.mla_wrapper = self.fi.mla.BatchMLAPagedAttentionWrapper(self.workspace, backend=self._family)
        self.ragged_wrapper = self.fi.BatchPrefillWithRaggedKVCacheWrapper(
            self.workspace, "NHD", backend=plan.flashinfer.prefill_kernel_family
        )
        self._active_mla = self.mla_wrapper
        self._graphs: dict[tuple[ForwardMode, int], _MLAGraph] = {}
        self._graph: _MLAGraph | None = None  # the graph whose buffers the current forward reads (None: eager)
        self._graph_max_bs: int | None = None  # set by init_cuda_graph_state
        self._first_layer = min(
            lay.layer_id for lay in layers
        )  # fills a graph's page ids (one wrapper serves every layer)
        self._absorbed = True
        self._has_prefix = False
        self._latent_rows: torch.Tensor | None = None  # non-absorbed with prefix: slots of prefix + new tokens

    # ---- metadata ----------------------------------------------------------------------------------

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        if self.checked:
            check_batch(batch, self.req_to_token, self.kv_pool.num_slots)
        if batch.forward_mode == ForwardMode.IDLE:
            return
        self._active_mla, self._graph = self.mla_wrapper, None
        lens = BatchLengths.from_batch(batch)
        self.spec_tree(batch.forward_mode, batch.spec_tree_mask, lens.new)  # refuses a tree batch: chains only
        self._has_prefix = lens.has_prefix
        self._absorbed = absorbed_for_batch(self.plan.mode(batch.forward_mode).common.mla_form, self._has_prefix)
        qo_indptr = host(lens.qo_indptr)
        if self._absorbed:
            self._plan_mla(self.mla_wrapper, qo_indptr, lens)
            return
        tokens = lens.kv_pages(1)  # every cached token of the request, page size 1: slots
        self._latent_rows = page_ids(self.req_to_token, lens.rows, tokens, 1).long() if self._has_prefix else None
        head = self._head
        self.ragged_wrapper.plan(
            qo_indptr,
            host(tokens.indptr),
            head.num_q_heads,
            head.num_q_heads,
            head.head_dim,
            head_dim_vo=head.v_head_dim,
            causal=True,
            sm_scale=head.scaling,
            q_data_type=self.q_dtype,
            kv_data_type=self.q_dtype,
        )  # K/V are decompressed in q's dtype

    def _plan_mla(self, wrapper, qo_indptr: torch.Tensor, lens: BatchLengths, graph: _MLAGraph | None = None) -> None:
        """Plan the MLA wrapper. Eager: page ids built now. CUDA graph: plan() gets a view of the graph's static
        kv_indices (its copy onto itself is skipped; the fa2 and fa3 families read no page id on the host), which the
        graph's first layer fills (:meth:`GraphPageIds.on_layer`)."""
        pages = lens.kv_pages(self.page_size)
        head = self._head
        ids = (
            graph.ids.kv_indices[: pages.total_pages]
            if graph is not None
            else page_ids(self.req_to_token, lens.rows, pages, self.page_size)
        )
        metadata = self.fi.mla.MLAPlanMetadata.csr(qo_indptr, host(pages.indptr), ids, host(lens.seq.astype(np.int32)))
        wrapper.plan(
            metadata=metadata,
            num_heads=head.num_q_heads,
            head_dim_ckv=head.kv_lora_rank,
            head_dim_kpe=head.qk_rope_head_dim,
            page_size=self.page_size,
            causal=True,
            sm_scale=head.scaling,
            q_data_type=self.q_dtype,
            kv_data_type=self._dtype,
            query_layout="packed",
            kv_cache_layout="packed",
        )

    # ---- forward -----------------------------------------------------------------------------------

    def forward_decode(self, q, k, v, layer, batch, save_kv_cache):
        return self.forward_extend(q, k, v, layer, batch, save_kv_cache)

    def forward_extend(self, q, k, v, layer: AttentionLayer, batch: ForwardBatch, save_kv_cache: bool) -> torch.Tensor:
        """``q: [T, H, qk_nope + qk_rope]``, ``k: [T, 1, kv_lora_rank + qk_rope]`` (the latent) -> ``[T, H, v_head_dim]``."""
        check_mla_weights(layer)
        if self._graph is not None:  # under a CUDA graph's buffers: the first layer fills the page ids
            self._graph.ids.on_layer(layer.layer_id, self.req_to_token, self.page_size)
        if (
            save_kv_cache and k is not None
        ):  # every MLA layer kind writes: mla_refusals checked the plan at construction
            self.kv_pool.set_kv_buffer(layer.layer_id, batch.out_cache_loc, k)
        cache = self.kv_pool.kv_buffer[layer.layer_id]
        if self._absorbed:
            paged = cache.view(-1, self.page_size, cache.shape[-1])
            out_latent = self._active_mla.run(query=absorb_q(q, layer), kv_cache=paged)
            return project_out(out_latent, layer)
        latent = cache[self._latent_rows] if self._has_prefix else k
        k_full, v_full = decompress(latent, layer, q.dtype)
        return self.ragged_wrapper.run(q, k_full, v_full)

    # ---- CUDA graphs ---------------------------------------------------------------------------------

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self._graph_max_bs = max_bs

    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode
    ):
        """One MLA wrapper per (mode, batch size), ``num_tokens // bs`` queries per request (1 for DECODE; the
        draft tokens of TARGET_VERIFY / DRAFT_EXTEND_V2), its static buffers re-planned in place before each replay."""
        check_capture_mode(self.plan, bs, forward_mode, self._graph_max_bs)  # the plan's table is the one source
        if not absorbed_for_batch(self.plan.mode(forward_mode).common.mla_form, True):
            raise UsageError(
                Problem(
                    "forward_mode",
                    f"the plan runs MLA non-absorbed in {forward_mode.value}; only absorbed modes "
                    "replay as CUDA graphs",
                    code="usage.cuda-graph-mode",
                )
            )
        max_pages = bs * (self.req_to_token.shape[1] // self.page_size + 1)
        buffers = dict(
            qo_indptr=torch.zeros(bs + 1, dtype=torch.int32, device=self.device),
            kv_indptr=torch.zeros(bs + 1, dtype=torch.int32, device=self.device),
            kv_indices=torch.zeros(max_pages, dtype=torch.int32, device=self.device),
            kv_len_arr=torch.zeros(bs, dtype=torch.int32, device=self.device),
        )
        wrapper = self.fi.mla.BatchMLAPagedAttentionWrapper(
            self.workspace, use_cuda_graph=True, backend=self._family, **buffers
        )
        ids = GraphPageIds(
            torch.zeros(bs, dtype=torch.int64, device=self.device),
            buffers["kv_indptr"],
            buffers["kv_indices"],
            None,
            self._first_layer,
        )
        self._graphs[(forward_mode, bs)] = _MLAGraph(wrapper, num_tokens // bs, ids)
        self.init_forward_metadata_replay_cuda_graph(
            bs, req_pool_indices, seq_lens, seq_lens.cpu(), encoder_lens, forward_mode
        )

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
    ):  # MLA models have no encoder
        g = captured_graph(self._graphs, forward_mode, bs)
        self.spec_tree(forward_mode, spec_tree_mask, [g.per_req] * bs)  # chains only
        if self.checked:
            check_graph_batch(self, bs, g.per_req, req_pool_indices, seq_lens, seq_lens_cpu, encoder_lens, forward_mode)
        lens = BatchLengths.for_graph(forward_mode, req_pool_indices, seq_lens_cpu, g.per_req, None)
        g.ids.rows.copy_(req_pool_indices, non_blocking=True)
        g.ids.filled = False
        self._plan_mla(g.wrapper, host(lens.qo_indptr), lens, g)
        self._active_mla, self._absorbed, self._graph = g.wrapper, True, g
