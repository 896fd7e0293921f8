"""The FlashInfer backend's plan() calls: one :class:`WrapperSpec` per wrapper of the set (what its layers share),
the plan() keywords every wrapper kind shares (the one place split settings apply), and the decode and paged
plan() calls, eager and under CUDA graphs (fast_decode_plan where the plan says so). A mixin of
:class:`attngate.backends.flashinfer.FlashInferBackend`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attngate.backends.flashinfer_graphs import CapturedWrappers
from attngate.backends.flashinfer_masks import packed_tree_mask, prefix_window_mask
from attngate.backends.page_ids import device_ranges, page_ids
from attngate.backends.runtime.batch_metadata import BatchLengths, PageRange, host
from attngate.errors import Problem, UsageError
from attngate.facts.modes import LayerKind


@dataclass
class WrapperSpec:
    """What every layer served by one wrapper of the set shares."""

    index: int
    causal: bool
    window_left: int  # -1: no window
    logits_soft_cap: float
    sm_scale: float
    cross: bool  # KV = the encoder tokens
    heads: tuple[int, int, int]  # num_q_heads, num_kv_heads, head_dim of its layers


class FlashInferPlanning:
    """plan() for the backend's wrappers (reads the backend's plan settings, pool and request table)."""

    def _wrapper_specs(self, dispatch: str) -> list[WrapperSpec]:
        count = 1 if dispatch == "single" else 2
        specs: list[WrapperSpec | None] = [None] * count
        for layer in self.layers:
            gates = self.layer_gates[layer.kind]
            i = gates.flashinfer.wrapper_index
            if i >= count:
                raise UsageError(
                    Problem(f"layer {layer.layer_id}", f"({layer.kind.value}) maps to wrapper {i} of {count}")
                )
            spec = WrapperSpec(
                i,
                gates.common.causal,
                layer.sliding_window_size if gates.common.use_window else -1,
                layer.logit_cap,
                layer.scaling,
                layer.kind == LayerKind.CROSS_ATTENTION,
                (layer.num_q_heads, layer.num_kv_heads, layer.head_dim),
            )
            if specs[i] is None:
                specs[i] = spec
            elif specs[i] != spec:
                raise UsageError(
                    Problem(
                        f"layer {layer.layer_id}",
                        f"disagrees with the other layers of wrapper {i} ({specs[i]} vs "
                        f"{spec}); one wrapper serves one kind of layer",
                    )
                )
        head = self.layers[0]  # a wrapper no layer uses is planned like the first layer, never run
        return [
            s
            or WrapperSpec(
                i, True, -1, head.logit_cap, head.scaling, False, (head.num_q_heads, head.num_kv_heads, head.head_dim)
            )
            for i, s in enumerate(specs)
        ]

    def _plan_kwargs(self, spec: WrapperSpec, kind: str, *, cuda_graph: bool = False) -> dict:
        """The plan() keywords every wrapper kind shares; the only place split settings are applied. Built once per
        wrapper kind (they are fixed by the plan): callers pass it on with ``**`` and copy it to extend it."""
        key = (spec.index, kind, cuda_graph)
        kw = self._kwargs_cache.get(key)
        if kw is None:
            kw = self._kwargs_cache[key] = self._build_plan_kwargs(spec, kind, cuda_graph)
        return kw

    def _build_plan_kwargs(self, spec: WrapperSpec, kind: str, cuda_graph: bool) -> dict:
        kv = (
            self.q_dtype if kind == "ragged" else self._dtype
        )  # the ragged wrapper reads the raw K/V, in the model's dtype
        kw = dict(
            q_data_type=self.q_dtype,
            kv_data_type=kv,
            sm_scale=spec.sm_scale,
            logits_soft_cap=spec.logits_soft_cap or None,
            window_left=spec.window_left,
        )
        if kind == "decode":
            if cuda_graph:
                kw.update(disable_split_kv=self.cuda_graph_disable_split_kv)
            elif self.decode_fixed_split_size is not None:
                kw.update(fixed_split_size=max(self.decode_fixed_split_size // self.page_size, 1))
        else:
            if cuda_graph:
                kw.update(disable_split_kv=self.cuda_graph_disable_split_kv)
            elif self.prefill_fixed_split_size is not None:
                tokens_per_page = 1 if kind == "ragged" else self.page_size
                kw.update(fixed_split_size=max(self.prefill_fixed_split_size // tokens_per_page, 1))
        return kw

    def _pages(self, spec: WrapperSpec, lens: BatchLengths, *, prefix_only: bool) -> PageRange:
        return lens.kv_pages(self.page_size, window_left=spec.window_left, prefix_only=prefix_only, cross=spec.cross)

    def _plan_decode(
        self, wrapper, spec: WrapperSpec, lens: BatchLengths, graph: CapturedWrappers | None = None
    ) -> None:
        rng = self._pages(spec, lens, prefix_only=False)
        kw = self._plan_kwargs(spec, "decode", cuda_graph=graph is not None)
        if self._replans_fast(spec, graph):
            indptr_host = host(rng.indptr)
            indptr, ids, last_page_len = self._fast_plan_arrays(spec, lens, rng, graph, indptr_host)
            self.fi.fast_decode_plan(
                wrapper,
                indptr,
                ids,
                last_page_len,
                *spec.heads,
                self.page_size,
                global_override_indptr_cpu=indptr_host,
                **kw,
            )
            return
        wrapper.plan(
            host(rng.indptr),
            self._ids_for_plan(spec, lens, rng, graph),
            host(rng.last_page_len),
            *spec.heads,
            self.page_size,
            **kw,
        )
        if graph is None:
            self._decode_planned[spec.index] = True

    def _replans_fast(self, spec: WrapperSpec, graph: CapturedWrappers | None) -> bool:
        """fast_decode_plan re-plans this decode wrapper: the plan says so for its kind (CUDA-graph or eager), and plan()
        has run on it before (fast_decode_plan reuses the kernel module plan() chose)."""
        if graph is not None:
            return graph.planned and self.graph_decode_replan == "fast_decode_plan"
        return self._decode_planned[spec.index] and self.eager_decode_replan == "fast_decode_plan"

    def _fast_plan_arrays(
        self,
        spec: WrapperSpec,
        lens: BatchLengths,
        rng: PageRange,
        graph: CapturedWrappers | None,
        indptr_host: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(kv_indptr, kv_indices, kv_last_page_len) for fast_decode_plan, which copies none of them. CUDA graph: the
        static buffers filled by one copy (:meth:`GraphPageIds.load`), indptr and last_page_len handed on the host (it
        reads them there; the kernels read the static ones) and the whole kv_indices buffer (it reads its length only).
        Eager: device views of the page ranges the page-id build copies anyway; the wrapper keeps these tensors."""
        if graph is not None:
            ids = graph.ids[spec.index]
            ids.load(rng)
            return indptr_host, ids.kv_indices, host(rng.last_page_len)
        packed, bs = device_ranges(rng, self.device), lens.batch_size
        return (
            packed[: bs + 1],
            page_ids(self.req_to_token, lens.rows, rng, self.page_size, packed),
            packed[2 * bs + 1 :],
        )

    def _plan_paged(
        self,
        wrapper,
        spec: WrapperSpec,
        qo_indptr: torch.Tensor,
        lens: BatchLengths,
        *,
        prefix_only: bool,
        causal: bool,
        window_mask: bool = False,
        graph: CapturedWrappers | None = None,
        tree: torch.Tensor | None = None,
    ) -> None:
        rng = self._pages(spec, lens, prefix_only=prefix_only)
        kw = self._plan_kwargs(spec, "paged", cuda_graph=graph is not None)
        if window_mask:  # paged half of a ragged+paged window layer: queries sit after the prefix
            kw = kw | dict(custom_mask=prefix_window_mask(spec.window_left, rng, lens, self.device), window_left=-1)
        elif tree is not None:  # a speculative tree's verify; a window layer keeps its window_left beside the mask
            kw = kw | dict(custom_mask=packed_tree_mask(rng, tree))
        wrapper.plan(
            qo_indptr,
            host(rng.indptr),
            self._ids_for_plan(spec, lens, rng, graph),
            host(rng.last_page_len),
            *spec.heads,
            self.page_size,
            causal=causal,
            **kw,
        )

    def _ids_for_plan(
        self, spec: WrapperSpec, lens: BatchLengths, rng: PageRange, graph: CapturedWrappers | None
    ) -> torch.Tensor:
        """Eager: the page ids, built now. CUDA graph: a view of the wrapper's static kv_indices (plan()'s copy of
        it onto itself is skipped), which the graph fills (:meth:`GraphPageIds.on_layer`); only the ranges' first
        tokens are copied in now, for wrappers whose ranges can start past token 0."""
        if graph is None:
            return page_ids(self.req_to_token, lens.rows, rng, self.page_size)
        ids = graph.ids[spec.index]
        if ids.first_token is not None:
            ids.first_token.copy_(host(rng.first_token), non_blocking=True)
        return ids.kv_indices[: rng.total_pages]
