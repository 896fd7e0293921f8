"""The FlashInfer backend, taking every decision from ``plan.flashinfer`` and the per-mode and per-layer tables.

Wrapper sets (``flashinfer.wrapper_dispatch``): one; or two for sliding-window models (wrapper 0
serves window layers with a KV range trimmed to the window, wrapper 1 full layers); or two for
cross attention (wrapper 0 self attention after the encoder tokens, wrapper 1 the encoder tokens).
A layer's wrapper is ``plan.layer(kind).flashinfer.wrapper_index``.

EXTEND with ``use_ragged_prefill`` (the mode table's ``paged_kv_extent`` is then ``prefix``): new tokens through the ragged wrapper, the cached prefix through
the paged wrapper, merged with ``merge_state`` (only the rows of requests that have a prefix); a window (``window_left``) applies to both halves,
and on the paged half a custom mask places each query after the prefix. Without ragged, and for
TARGET_VERIFY and DRAFT_EXTEND_V2: the new K/V are written first, then one causal paged pass.

Every prefill wrapper (ragged, paged, CUDA-graph) runs the kernel family ``flashinfer.prefill_kernel_family``
(fa3 on SM90 where it serves the model's layers, rule flashinfer.prefill-fa3-on-hopper; FlashInfer's
"auto" is never left to choose). Every plan() call is built by :meth:`FlashInferPlanner.plan_kwargs`, so the deterministic settings
(``prefill_fixed_split_size``, ``decode_fixed_split_size``, ``cuda_graph_disable_split_kv``) reach
every wrapper kind through one place. plan() gets its indptr and last_page_len arrays on the host
(FlashInfer reads them there and copies them to the device itself): a device array would cost a
device-to-host copy that waits for all queued GPU work, so the host could not run ahead.

CUDA graphs: the page ids are built inside the graph. Re-planning a captured wrapper copies the
lengths (plan() fills its static kv_indptr) and the request rows; the graph's first layer of each
wrapper fills the wrapper's static kv_indices from those buffers (one kernel, replayed with the
graph), so a replay's host work is the lengths and plan() alone. plan() of the fa2 and fa3 families
never reads the page ids on the host; run() reads them on the device.

Decode re-plans: after a decode wrapper's first plan(), ``flashinfer.graph_decode_replan`` (captured wrappers) and
``flashinfer.eager_decode_replan`` say whether plan() runs again or FlashInfer's ``fast_decode_plan``, which keeps the
kernel module plan() chose and copies nothing: a replay fills the static kv_indptr, first tokens and kv_last_page_len
itself, in one copy (:meth:`GraphPageIds.load`); an eager batch hands it the device copy of its page ranges.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import torch

from attngate.backends.base import AttentionBackend
from attngate.backends.capabilities import flashinfer_refusals
from attngate.backends.checks import check_batch, check_graph_batch, check_pool_page_size, is_fp8
from attngate.backends.flashinfer_graphs import FlashInferCudaGraphs
from attngate.backends.flashinfer_mla import FlashInferMLABackend
from attngate.backends.flashinfer_plans import FlashInferPlanner, WrapperSpec, check_fast_decode_plan, wrapper_specs
from attngate.backends.flashinfer_wrappers import CapturedWrappers, FlashInferWrappers
from attngate.backends.runtime.batch_metadata import (
    BatchLengths,
    check_page_aligned,
    host,
)
from attngate.backends.runtime.forward_batch import ForwardBatch
from attngate.backends.runtime.layer import AttentionLayer
from attngate.errors import BackendRefusal, BatchMetadataError, Problem, UsageError
from attngate.facts.modes import ForwardMode, LayerKind
from attngate.plan.schema import Plan
from attngate.types import BatchPath


class FlashInferBackend(AttentionBackend):
    """FlashInfer over the paged pool. ``checked=True`` validates every batch before a kernel launch
    (shared with the FA backend); off by default, no cost when off. ``q_dtype``: the dtype of the
    queries (the model's dtype; default the KV pool's, which differs under an FP8 KV cache). Each
    wrapper is planned with the head counts of the layers it serves.

    Composed of the wrapper specs (:func:`wrapper_specs`), the eager wrapper set (:class:`FlashInferWrappers`,
    ``self.wrappers``), the planner of every plan() call (:class:`FlashInferPlanner`, ``self.planner``) and the
    CUDA-graph keeper (:class:`FlashInferCudaGraphs`, ``self.graphs``); the backend keeps what the current batch
    runs on (eager or a graph's wrappers, and its path).

    MLA layers are :class:`FlashInferMLABackend`'s (the latent cache needs other wrappers): the ``flashinfer`` name
    builds through :func:`flashinfer_backend`, which picks the class, as SGLang's ``flashinfer`` name serves MLA
    models through flashinfer_mla.

    Raises
    ------
    BackendRefusal
        What :func:`attngate.backends.capabilities.flashinfer_refusals` lists for the plan and the layers.
    UsageError
        MLA layers (build through :func:`flashinfer_backend`); layers that write no KV cache while EXTEND reads the
        paged cache; no ``q_dtype`` with an FP8 pool.
    """

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
        problems = flashinfer_refusals(plan, layers)
        if problems:
            raise BackendRefusal(problems)
        if any(layer.is_mla for layer in layers):
            raise UsageError(
                Problem(
                    "layers",
                    "MLA layers run on FlashInferMLABackend: build through flashinfer_backend(...)",
                    code="usage.mla-layers",
                )
            )
        self.fi = importlib.import_module("flashinfer")
        check_fast_decode_plan(self.fi, plan.flashinfer)
        self.page_size = check_pool_page_size(plan, kv_pool)
        self.layer_gates = {kind: plan.layer(kind) for kind in LayerKind}
        self.specs = wrapper_specs(plan, layers)
        unwritten = [
            lay.layer_id
            for lay in layers
            if lay.kind != LayerKind.CROSS_ATTENTION and not self.layer_gates[lay.kind].common.write_kv_cache
        ]
        # only where FlashInfer runs EXTEND: under FA prefill (the embedding fast path) FlashInfer only decodes
        extend = ForwardMode.EXTEND
        if (
            unwritten
            and plan.backend_for(extend) == "flashinfer"
            and plan.mode(extend).flashinfer.paged_kv_extent != "prefix"
        ):
            raise UsageError(
                Problem(
                    f"layers {unwritten}",
                    "write no KV cache (common.write_kv_cache) but EXTEND runs through the "
                    "paged wrapper (flashinfer.paged_kv_extent prefix_plus_new), which would read their stale slots",
                    code="usage.unwritten-layers-paged-extend",
                )
            )
        self.wrappers = FlashInferWrappers(self.fi, plan.flashinfer, len(self.specs), self.device)
        if q_dtype is None and is_fp8(kv_pool.dtype):
            raise UsageError(
                Problem(
                    "q_dtype",
                    f"needed with a {kv_pool.dtype} KV pool: the model's dtype, which the queries "
                    "and the raw K/V of a ragged extend keep",
                    code="usage.q-dtype-missing",
                )
            )
        self.planner = FlashInferPlanner(
            self.fi,
            plan.flashinfer,
            req_to_token,
            self.page_size,
            self.device,
            q_dtype=q_dtype or kv_pool.dtype,
            kv_dtype=kv_pool.dtype,
        )
        self.graphs = FlashInferCudaGraphs(
            plan,
            self.specs,
            layers,
            self.wrappers,
            self.planner,
            req_to_token,
            self.page_size,
            self.device,
            self.spec_tree,
        )
        # what the current batch runs on: the eager wrappers, or after a capture or replay hook a graph's
        self._active_decode, self._active_paged = self.wrappers.decode, self.wrappers.paged
        self._graph: CapturedWrappers | None = None  # the graph whose buffers the current forward reads (None: eager)
        self._batch_path = BatchPath.NONE
        self._merge_rows: torch.Tensor | None = None

    # ---- per batch ------------------------------------------------------------------------------

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        if self.checked:
            check_batch(batch, self.req_to_token, self.kv_pool.num_slots)
        mode = batch.forward_mode
        self._active_decode, self._active_paged, self._graph = self.wrappers.decode, self.wrappers.paged, None
        if mode == ForwardMode.IDLE:
            self._batch_path = BatchPath.NONE
            return
        lens = BatchLengths.from_batch(batch)
        if lens.has_encoder:
            check_page_aligned(lens.enc, self.page_size, "encoder_lens", "FlashInfer")
        tree = self.spec_tree(mode, batch.spec_tree_mask, lens.new)
        if mode == ForwardMode.DECODE:
            self._batch_path = BatchPath.DECODE
            for spec, wrapper in zip(self.specs, self.wrappers.decode):
                self.planner.plan_decode(wrapper, spec, lens)
            return
        has_prefix = lens.has_prefix
        # the mode table decides: under ragged prefill the paged wrapper covers only the cached prefix
        ragged = self.plan.mode(mode).flashinfer.paged_kv_extent == "prefix"
        self._batch_path = (BatchPath.RAGGED_PAGED if has_prefix else BatchPath.RAGGED) if ragged else BatchPath.PAGED
        self._merge_rows = self._rows_with_prefix(lens) if ragged and has_prefix else None
        qo_indptr = host(lens.qo_indptr)
        for spec, paged, rag in zip(self.specs, self.wrappers.paged, self.wrappers.ragged):
            if spec.cross or not ragged:
                self.planner.plan_paged(
                    paged,
                    spec,
                    qo_indptr,
                    lens,
                    prefix_only=False,
                    causal=spec.causal and not spec.cross,
                    tree=None if spec.cross else tree,
                )
                continue
            rag.plan(qo_indptr, qo_indptr, *spec.heads, causal=spec.causal, **self.planner.plan_kwargs(spec, "ragged"))
            if has_prefix:
                self.planner.plan_paged(
                    paged, spec, qo_indptr, lens, prefix_only=True, causal=False, window_mask=spec.window_left >= 0
                )

    def _rows_with_prefix(self, lens: BatchLengths) -> torch.Tensor | None:
        """``[num_tokens]`` bool: the new tokens whose request has a cached prefix (None: all of them). The paged
        half's state of a request without prefix is undefined on the fa3 family (measured on FlashInfer
        0.7.2: finite lse and a nonzero output over zero keys, where fa2 gives -inf and 0), so only these
        rows merge it."""
        with_prefix = lens.prefix > 0
        if bool(with_prefix.all()):
            return None
        return host(np.repeat(with_prefix, lens.new)).to(self.device, non_blocking=True)

    # ---- forward --------------------------------------------------------------------------------

    def _wrapper_of(self, layer: AttentionLayer) -> tuple[int, WrapperSpec]:
        i = self.layer_gates[layer.kind].flashinfer.wrapper_index
        if self._graph is not None:  # under a CUDA graph's buffers: the wrapper's first layer fills its page ids
            self._graph.ids[i].on_layer(layer.layer_id, self.req_to_token, self.page_size)
        return i, self.specs[i]

    def _write(self, layer, batch, k, v, spec: WrapperSpec, save: bool) -> None:
        if save and k is not None and self.layer_gates[layer.kind].common.write_kv_cache:
            loc = batch.encoder_out_cache_loc if spec.cross else batch.out_cache_loc
            self.kv_pool.set_kv_buffer(layer.layer_id, loc, k, v)

    def forward_decode(self, q, k, v, layer, batch, save_kv_cache):
        i, spec = self._wrapper_of(layer)
        self._write(layer, batch, k, v, spec, save_kv_cache)
        return self._active_decode[i].run(q, self.paged_kv(layer.layer_id))

    def forward_extend(self, q, k, v, layer, batch, save_kv_cache):
        i, spec = self._wrapper_of(layer)
        path = self._batch_path if not spec.cross else BatchPath.PAGED
        if path == BatchPath.PAGED:
            self._write(layer, batch, k, v, spec, save_kv_cache)
            return self._active_paged[i].run(q, self.paged_kv(layer.layer_id))
        if path == BatchPath.RAGGED:
            out = self.wrappers.ragged[i].run(q, k, v)
        elif not self.layer_gates[layer.kind].common.write_kv_cache:
            raise BatchMetadataError(
                Problem(
                    f"layer {layer.layer_id} ({layer.kind.value})",
                    "writes no KV cache, so it cannot attend to a cached prefix",
                    code="batch-metadata.prefix-without-cache",
                )
            )
        else:
            o_new, s_new = self.wrappers.ragged[i].run(q, k, v, return_lse=True)  # lse: [tokens, heads]
            o_pre, s_pre = self._active_paged[i].run(q, self.paged_kv(layer.layer_id), return_lse=True)
            if self._merge_rows is None:
                out, _ = self.fi.merge_state(o_pre, s_pre, o_new, s_new)
            else:  # requests without a prefix keep their ragged state
                self.fi.merge_state_in_place(o_new, s_new, o_pre, s_pre, mask=self._merge_rows)
                out = o_new
        self._write(layer, batch, k, v, spec, save_kv_cache)  # after attention: the paged half reads the prefix only
        return out

    # ---- CUDA graphs (see :class:`attngate.backends.base.AttentionBackend`) ------------------------

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self.graphs.init_state(max_bs, max_num_tokens)

    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode
    ):
        g = self.graphs.capture(bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode)
        self._run_on_graph(g, forward_mode)

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
        g = self.graphs.captured(forward_mode, bs)
        if self.checked:
            check_graph_batch(
                self,
                bs,
                g.per_req,
                req_pool_indices,
                seq_lens,
                seq_lens_cpu,
                encoder_lens,
                forward_mode,
                encoder_lens_cpu,
            )
        self.graphs.replan(
            g, req_pool_indices, seq_lens_cpu, encoder_lens, forward_mode, encoder_lens_cpu, spec_tree_mask
        )
        self._run_on_graph(g, forward_mode)

    def _run_on_graph(self, g: CapturedWrappers, mode: ForwardMode) -> None:
        """The forwards that follow run on ``g``'s wrappers (planned), their first layers filling its page ids."""
        decode = mode == ForwardMode.DECODE
        if decode:
            self._active_decode = g.wrappers
        else:
            self._active_paged = g.wrappers
        self._batch_path = BatchPath.DECODE if decode else BatchPath.PAGED
        self._graph = g


def flashinfer_backend(
    plan: Plan,
    kv_pool,
    req_to_token: torch.Tensor,
    layers: list[AttentionLayer],
    device: torch.device | str = "cuda",
    **options: Any,
) -> FlashInferBackend | FlashInferMLABackend:
    """The backend of the ``flashinfer`` name (its registry factory): :class:`FlashInferMLABackend` where any layer is
    an MLA layer, else :class:`FlashInferBackend`; the arguments, and ``options`` (``checked``, ``q_dtype``), as both
    take them (:class:`attngate.backends.factories.BackendFactory`).

    Raises
    ------
    BackendRefusal, BatchMetadataError, UsageError
        As the chosen class raises them.
    """
    cls = FlashInferMLABackend if any(layer.is_mla for layer in layers) else FlashInferBackend
    return cls(plan, kv_pool, req_to_token, layers, device, **options)
