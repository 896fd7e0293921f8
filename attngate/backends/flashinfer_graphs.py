"""The FlashInfer backend's CUDA graphs: per captured (forward mode, batch size) its own wrappers over static
buffers (:class:`~attngate.backends.flashinfer_wrappers.CapturedWrappers`), the page ids built inside the graph
(:class:`GraphPageIds`), and re-planning at replay."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from attngate.backends.checks import captured_graph, check_capture_mode
from attngate.backends.flashinfer_plans import FlashInferPlanner, WrapperSpec
from attngate.backends.flashinfer_wrappers import CapturedWrappers, FlashInferWrappers
from attngate.backends.page_ids import GraphPageIds
from attngate.backends.runtime.batch_metadata import BatchLengths, check_page_aligned, host
from attngate.backends.runtime.layer import AttentionLayer
from attngate.errors import BatchMetadataError, Problem
from attngate.facts.modes import ForwardMode, LayerKind
from attngate.plan.schema import Plan

#: ``(mode, spec_tree_mask, new) -> [bs, D, D] bool or None``: :meth:`attngate.backends.base.AttentionBackend.spec_tree`
SpecTree = Callable[[ForwardMode, torch.Tensor | None, Sequence[int]], torch.Tensor | None]


class FlashInferCudaGraphs:
    """The captured graphs of a FlashInfer backend: builds each graph's wrappers and static buffers, and re-plans
    them before each replay (the backend then runs its forwards on them).

    Parameters
    ----------
    plan : Plan
        Reads the mode table's ``common.capture_cuda_graph`` (through :func:`check_capture_mode`) and
        ``common.tree_mask``, and the layer table's ``flashinfer.wrapper_index``.
    specs : list of WrapperSpec
        The wrapper set's specs; a graph has one wrapper per spec.
    layers : list of AttentionLayer
        The backend's layers: each wrapper's first layer fills its page ids inside the graph.
    wrappers : FlashInferWrappers
        Builds the captured wrappers (over the backend's workspace).
    planner : FlashInferPlanner
        Plans them, at capture and at each replay.
    req_to_token : torch.Tensor
        ``[max_requests, max_context_len]`` int32 on ``device``.
    page_size : int
        Tokens per page of the pool.
    device : torch.device
        Where the static buffers live.
    spec_tree : callable
        The backend's :meth:`~attngate.backends.base.AttentionBackend.spec_tree` (a tree verify's mask, checked).
    """

    def __init__(
        self,
        plan: Plan,
        specs: list[WrapperSpec],
        layers: list[AttentionLayer],
        wrappers: FlashInferWrappers,
        planner: FlashInferPlanner,
        req_to_token: torch.Tensor,
        page_size: int,
        device: torch.device,
        spec_tree: SpecTree,
    ):
        self.plan, self.specs, self.spec_tree = plan, specs, spec_tree
        self.wrappers, self.planner = wrappers, planner
        self.req_to_token, self.page_size, self.device = req_to_token, page_size, device
        self.graphs: dict[tuple[ForwardMode, int], CapturedWrappers] = {}
        self._max: tuple[int, int] | None = None  # (max_bs, max_num_tokens), set by init_state
        self._masks: dict[
            int, torch.Tensor
        ] = {}  # per wrapper index: a tree verify's packed mask, shared by the graphs
        has_encoder = any(lay.kind == LayerKind.CROSS_ATTENTION for lay in layers)
        self._shiftable = [s.window_left >= 0 or (has_encoder and not s.cross) for s in specs]
        self._first_layer = [
            min(
                (lay.layer_id for lay in layers if plan.layer(lay.kind).flashinfer.wrapper_index == s.index),
                default=-1,
            )
            for s in specs
        ]

    def init_state(self, max_bs: int, max_num_tokens: int) -> None:
        """``init_cuda_graph_state``: wrappers and their static buffers are made per captured batch size."""
        self._max = (max_bs, max_num_tokens)
        self._masks = {}

    def _mask_buffers(self, index: int, bs: int) -> dict[str, torch.Tensor]:
        """Wrapper ``index``'s custom-mask buffers for a tree-verify graph of ``bs`` requests. The packed mask (bits
        for up to max_num_tokens queries over a whole req_to_token row each, plus a padding byte per request: FlashInfer's
        segment_packbits pads each request to whole bytes) is shared by every captured batch size, as SGLang shares one:
        a graph replays right after its own plan() rewrote it. Its byte offsets (mask_indptr) are per batch size."""
        mask = self._masks.get(index)
        if mask is None:
            max_bs, max_tokens = self._max
            size = -(-max_tokens * self.req_to_token.shape[1] // 8) + max_bs
            mask = self._masks[index] = torch.zeros(size, dtype=torch.uint8, device=self.device)
        return dict(custom_mask_buf=mask, mask_indptr_buf=torch.zeros(bs + 1, dtype=torch.int32, device=self.device))

    def capture(self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode) -> CapturedWrappers:
        """The wrappers of a graph of ``bs`` requests, ``num_tokens // bs`` tokens each, in ``forward_mode``, planned
        for the capture's lengths (a tree verify is captured as a chain). Arguments as
        ``init_forward_metadata_capture_cuda_graph``'s."""
        check_capture_mode(self.plan, bs, forward_mode, self._max[0] if self._max else None)  # the plan's table decides
        max_pages = self.req_to_token.shape[1] // self.page_size + 1
        per_req = num_tokens // bs
        rows = torch.zeros(bs, dtype=torch.int64, device=self.device)
        g = CapturedWrappers(
            [],
            per_req,
            rows,
            [
                GraphPageIds.packed_buffers(rows, bs * max_pages, first, shifted=shiftable)
                for shiftable, first in zip(self._shiftable, self._first_layer)
            ],
        )
        tree = self.plan.mode(forward_mode).common.tree_mask
        for spec, ids in zip(self.specs, g.ids):
            if forward_mode == ForwardMode.DECODE:
                g.wrappers.append(self.wrappers.graph_decode(ids))
            else:
                qo = torch.arange(0, (bs + 1) * per_req, per_req, dtype=torch.int32, device=self.device)
                mask = self._mask_buffers(spec.index, bs) if tree and not spec.cross else {}
                g.wrappers.append(self.wrappers.graph_paged(qo, ids, mask))
        self.graphs[(forward_mode, bs)] = g
        chain = (
            torch.ones(bs, per_req, per_req, dtype=torch.bool, device=self.device).tril() if tree else None
        )  # captured as a chain
        self.replan(g, req_pool_indices, seq_lens.cpu(), encoder_lens, forward_mode, spec_tree_mask=chain)
        g.planned = True
        return g

    def captured(self, mode: ForwardMode, bs: int) -> CapturedWrappers:
        """The graph captured for ``(mode, bs)``; UsageError naming what was captured when there is none."""
        return captured_graph(self.graphs, mode, bs)

    def replan(
        self, g: CapturedWrappers, rows, seq_lens_cpu, encoder_lens, mode, encoder_lens_cpu=None, spec_tree_mask=None
    ) -> None:
        """Plan the captured wrappers for new lengths: plan() refills their static buffers in place (a tree verify's
        mask too), the rows are copied into the graph's, and the graph itself rebuilds the page ids."""
        lens = BatchLengths.for_graph(mode, rows, seq_lens_cpu, g.per_req, encoder_lens, encoder_lens_cpu)
        tree = self.spec_tree(mode, spec_tree_mask, lens.new)
        if lens.has_encoder:
            check_page_aligned(lens.enc, self.page_size, "encoder_lens", "FlashInfer")
            # a wrapper captured without first tokens fills its page ids from token 0; self-attention ranges here start later
            if any(ids.first_token is None and not spec.cross for spec, ids in zip(self.specs, g.ids)):
                raise BatchMetadataError(
                    Problem(
                        "encoder_lens",
                        "this CUDA graph's layers have no cross attention and read "
                        "from token 0, but the batch has encoder tokens",
                        code="batch-metadata.encoder-tokens",
                    )
                )
        g.rows.copy_(rows, non_blocking=True)
        for ids in g.ids:
            ids.filled = False
        decode = mode == ForwardMode.DECODE
        qo_indptr = None if decode else host(lens.qo_indptr)
        for spec, wrapper in zip(self.specs, g.wrappers):
            if decode:
                self.planner.plan_decode(wrapper, spec, lens, g)
            else:
                self.planner.plan_paged(
                    wrapper,
                    spec,
                    qo_indptr,
                    lens,
                    prefix_only=False,
                    causal=spec.causal and not spec.cross,
                    graph=g,
                    tree=None if spec.cross else tree,
                )
