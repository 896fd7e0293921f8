"""The FlashInfer backend's plan() calls: one :class:`WrapperSpec` per wrapper of the set (what its layers share),
and :class:`FlashInferPlanner`, which builds the plan() keywords every wrapper kind shares (the one place split
settings apply) and makes the decode and paged plan() calls, eager and under CUDA graphs (fast_decode_plan where
the plan says so)."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch

from attngate.backends.flashinfer_masks import packed_tree_mask, prefix_window_mask
from attngate.backends.flashinfer_wrappers import CapturedWrappers
from attngate.backends.page_ids import device_ranges, page_ids
from attngate.backends.runtime.batch_metadata import BatchLengths, PageRange, host
from attngate.backends.runtime.layer import AttentionLayer
from attngate.errors import BackendRefusal, Problem, UsageError
from attngate.facts.modes import LayerKind
from attngate.plan.schema import FlashInferGates, Plan


@dataclass
class WrapperSpec:
    """What every layer served by one wrapper of the set shares.

    Attributes
    ----------
    index : int
        The wrapper's place in the set (its layers' ``flashinfer.wrapper_index``).
    causal : bool
        Whether its layers attend causally.
    window_left : int
        Earlier keys a query sees (tokens); -1: no window.
    logits_soft_cap : float
        The layers' soft-cap (0: none).
    sm_scale : float
        The softmax scale.
    cross : bool
        The KV is the encoder tokens (cross attention).
    heads : tuple of (int, int, int)
        ``(num_q_heads, num_kv_heads, head_dim)`` of its layers (heads on this rank; head_dim in elements).
    """

    index: int
    causal: bool
    window_left: int
    logits_soft_cap: float
    sm_scale: float
    cross: bool
    heads: tuple[int, int, int]


def wrapper_specs(plan: Plan, layers: list[AttentionLayer]) -> list[WrapperSpec]:
    """One spec per wrapper of ``plan.flashinfer.wrapper_dispatch`` (one wrapper, or two), from the layers each layer
    kind's ``flashinfer.wrapper_index`` sends to it; UsageError for a layer sent past the set, or one that disagrees
    with the other layers of its wrapper."""
    count = 1 if plan.flashinfer.wrapper_dispatch == "single" else 2
    specs: list[WrapperSpec | None] = [None] * count
    for layer in layers:
        gates = plan.layer(layer.kind)
        i = gates.flashinfer.wrapper_index
        if i >= count:
            raise UsageError(
                Problem(
                    f"layer {layer.layer_id}",
                    f"({layer.kind.value}) maps to wrapper {i} of {count}",
                    code="usage.wrapper-index",
                )
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
                    code="usage.wrapper-layers-differ",
                )
            )
    head = layers[0]  # a wrapper no layer uses is planned like the first layer, never run
    return [
        s
        or WrapperSpec(
            i, True, -1, head.logit_cap, head.scaling, False, (head.num_q_heads, head.num_kv_heads, head.head_dim)
        )
        for i, s in enumerate(specs)
    ]


def check_fast_decode_plan(fi: ModuleType, gates: FlashInferGates) -> None:
    """BackendRefusal naming each of ``flashinfer.graph_decode_replan`` and ``flashinfer.eager_decode_replan`` that is
    fast_decode_plan where this FlashInfer does not export it."""
    fast = [
        f"flashinfer.{name}"
        for name, how in (
            ("graph_decode_replan", gates.graph_decode_replan),
            ("eager_decode_replan", gates.eager_decode_replan),
        )
        if how == "fast_decode_plan"
    ]
    if fast and not hasattr(fi, "fast_decode_plan"):
        version = getattr(fi, "__version__", "version unknown")
        raise BackendRefusal(
            [
                Problem(
                    gate,
                    f"is fast_decode_plan, which this FlashInfer ({version}) does not export; 0.7.2 does",
                    code="backend-refusal.kernel-version",
                )
                for gate in fast
            ]
        )


class FlashInferPlanner:
    """plan() of the backend's wrappers, eager and captured.

    Parameters
    ----------
    fi : module
        ``flashinfer`` (for ``fast_decode_plan``).
    gates : FlashInferGates
        ``plan.flashinfer``; reads ``prefill_fixed_split_size``, ``decode_fixed_split_size``,
        ``cuda_graph_disable_split_kv``, ``eager_decode_replan`` and ``graph_decode_replan``.
    req_to_token : torch.Tensor
        ``[max_requests, max_context_len]`` int32 on ``device``: each request's token slots in the pool.
    page_size : int
        Tokens per page of the pool (the plan's ``common.page_size``, checked against the pool).
    device : torch.device
        Where page ids and custom masks are built.
    q_dtype, kv_dtype : torch.dtype
        The queries' dtype (the model's; also that of the raw K/V the ragged wrapper reads) and the KV pool's.
    """

    def __init__(
        self,
        fi: ModuleType,
        gates: FlashInferGates,
        req_to_token: torch.Tensor,
        page_size: int,
        device: torch.device,
        *,
        q_dtype: torch.dtype,
        kv_dtype: torch.dtype,
    ):
        self.fi, self.gates = fi, gates
        self.req_to_token, self.page_size, self.device = req_to_token, page_size, device
        self.q_dtype, self.kv_dtype = q_dtype, kv_dtype
        self._kwargs_cache: dict[tuple[int, str, bool], dict] = {}
        self._decode_planned: set[int] = set()  # eager decode wrappers that ran plan(): fast_decode_plan may reuse them

    def plan_kwargs(self, spec: WrapperSpec, kind: str, *, cuda_graph: bool = False) -> dict:
        """The plan() keywords every wrapper kind shares; the only place split settings are applied. Built once per
        wrapper kind (they are fixed by the plan): callers pass it on with ``**`` and copy it to extend it."""
        key = (spec.index, kind, cuda_graph)
        kw = self._kwargs_cache.get(key)
        if kw is None:
            kw = self._kwargs_cache[key] = self._build_plan_kwargs(spec, kind, cuda_graph)
        return kw

    def _build_plan_kwargs(self, spec: WrapperSpec, kind: str, cuda_graph: bool) -> dict:
        kv = (
            self.q_dtype if kind == "ragged" else self.kv_dtype
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
                kw.update(disable_split_kv=self.gates.cuda_graph_disable_split_kv)
            elif self.gates.decode_fixed_split_size is not None:
                kw.update(fixed_split_size=max(self.gates.decode_fixed_split_size // self.page_size, 1))
        else:
            if cuda_graph:
                kw.update(disable_split_kv=self.gates.cuda_graph_disable_split_kv)
            elif self.gates.prefill_fixed_split_size is not None:
                tokens_per_page = 1 if kind == "ragged" else self.page_size
                kw.update(fixed_split_size=max(self.gates.prefill_fixed_split_size // tokens_per_page, 1))
        return kw

    def _pages(self, spec: WrapperSpec, lens: BatchLengths, *, prefix_only: bool) -> PageRange:
        return lens.kv_pages(self.page_size, window_left=spec.window_left, prefix_only=prefix_only, cross=spec.cross)

    def plan_decode(
        self, wrapper, spec: WrapperSpec, lens: BatchLengths, graph: CapturedWrappers | None = None
    ) -> None:
        """Plan decode ``wrapper`` (eager, or one of ``graph``'s) over ``spec``'s KV ranges of the batch: plan(), or
        fast_decode_plan where the plan's ``*_decode_replan`` says so and plan() has run on the wrapper before."""
        rng = self._pages(spec, lens, prefix_only=False)
        kw = self.plan_kwargs(spec, "decode", cuda_graph=graph is not None)
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
            self._decode_planned.add(spec.index)

    def _replans_fast(self, spec: WrapperSpec, graph: CapturedWrappers | None) -> bool:
        """fast_decode_plan re-plans this decode wrapper: the plan says so for its kind (CUDA-graph or eager), and plan()
        has run on it before (fast_decode_plan reuses the kernel module plan() chose)."""
        if graph is not None:
            return graph.planned and self.gates.graph_decode_replan == "fast_decode_plan"
        return spec.index in self._decode_planned and self.gates.eager_decode_replan == "fast_decode_plan"

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

    def plan_paged(
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
        """Plan paged-prefill ``wrapper`` (eager, or one of ``graph``'s) over ``spec``'s KV ranges of the batch.
        ``qo_indptr: [bs + 1]`` int32 on the host; ``prefix_only``: the cached prefix only (the paged half of a
        ragged+paged prefill), with a custom mask placing the queries after it where ``window_mask``; ``tree:
        [bs, D, D]`` bool, a speculative tree's verify mask (None: causal or none, as ``causal`` says)."""
        rng = self._pages(spec, lens, prefix_only=prefix_only)
        kw = self.plan_kwargs(spec, "paged", cuda_graph=graph is not None)
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
