"""The FlashInfer backend's CUDA graphs: per captured (forward mode, batch size) its own wrappers over static
buffers, the page ids built inside the graph (:class:`GraphPageIds`), and re-planning at replay. A mixin of
:class:`attngate.backends.flashinfer.FlashInferBackend`, whose plan() helpers it calls."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attngate.backends.checks import captured_graph, check_capture_mode, check_graph_batch
from attngate.backends.page_ids import GraphPageIds
from attngate.backends.runtime.batch_metadata import BatchLengths, check_page_aligned, host
from attngate.errors import BatchMetadataError, Problem
from attngate.facts.modes import ForwardMode
from attngate.types import BatchPath


@dataclass
class CapturedWrappers:
    """One captured (forward mode, batch size): its wrappers and, per wrapper, the page ids the graph builds."""

    wrappers: list
    per_req: int  # new tokens per request
    rows: torch.Tensor  # [bs] int64, req_pool_indices, copied in at each re-plan; shared by the wrappers' ids
    ids: list[GraphPageIds]
    planned: bool = False  # the capture's plan() ran: the wrappers hold a kernel module fast_decode_plan may reuse


class FlashInferCudaGraphs:
    """The CUDA-graph hooks of the backend API (see :class:`attngate.backends.base.AttentionBackend`)."""

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self._graph_max = (max_bs, max_num_tokens)  # wrappers and their static buffers are made per captured batch size
        self._graph_masks: dict[
            int, torch.Tensor
        ] = {}  # per wrapper index: a tree verify's packed mask, shared by the graphs

    def _graph_mask_buffers(self, index: int, bs: int) -> dict[str, torch.Tensor]:
        """Wrapper ``index``'s custom-mask buffers for a tree-verify graph of ``bs`` requests. The packed mask (bits
        for up to max_num_tokens queries over a whole req_to_token row each, plus a padding byte per request: FlashInfer's
        segment_packbits pads each request to whole bytes) is shared by every captured batch size, as SGLang shares one:
        a graph replays right after its own plan() rewrote it. Its byte offsets (mask_indptr) are per batch size."""
        mask = self._graph_masks.get(index)
        if mask is None:
            max_bs, max_tokens = self._graph_max
            size = -(-max_tokens * self.req_to_token.shape[1] // 8) + max_bs
            mask = self._graph_masks[index] = torch.zeros(size, dtype=torch.uint8, device=self.device)
        return dict(custom_mask_buf=mask, mask_indptr_buf=torch.zeros(bs + 1, dtype=torch.int32, device=self.device))

    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode
    ):
        check_capture_mode(
            self.plan, bs, forward_mode, self._graph_max[0] if self._graph_max else None
        )  # the plan's table decides
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
                g.wrappers.append(
                    self.fi.BatchDecodeWithPagedKVCacheWrapper(
                        self.workspace,
                        "NHD",
                        use_cuda_graph=True,
                        use_tensor_cores=self.decode_use_tensor_cores,
                        backend=self.decode_kernel_family,
                        paged_kv_indptr_buffer=ids.kv_indptr,
                        paged_kv_indices_buffer=ids.kv_indices,
                        paged_kv_last_page_len_buffer=ids.last_page_len,
                    )
                )
            else:
                qo = torch.arange(0, (bs + 1) * per_req, per_req, dtype=torch.int32, device=self.device)
                mask = self._graph_mask_buffers(spec.index, bs) if tree and not spec.cross else {}
                g.wrappers.append(
                    self.fi.BatchPrefillWithPagedKVCacheWrapper(
                        self.workspace,
                        "NHD",
                        use_cuda_graph=True,
                        qo_indptr_buf=qo,
                        paged_kv_indptr_buf=ids.kv_indptr,
                        paged_kv_indices_buf=ids.kv_indices,
                        paged_kv_last_page_len_buf=ids.last_page_len,
                        backend=self.prefill_kernel_family,
                        **mask,
                    )
                )
        self._graphs[(forward_mode, bs)] = g
        chain = (
            torch.ones(bs, per_req, per_req, dtype=torch.bool, device=self.device).tril() if tree else None
        )  # captured as a chain
        self._replan_graph(g, req_pool_indices, seq_lens.cpu(), encoder_lens, forward_mode, spec_tree_mask=chain)
        g.planned = True

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
        g = captured_graph(self._graphs, forward_mode, bs)
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
        self._replan_graph(
            g, req_pool_indices, seq_lens_cpu, encoder_lens, forward_mode, encoder_lens_cpu, spec_tree_mask
        )

    def _replan_graph(
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
                    )
                )
        g.rows.copy_(rows, non_blocking=True)
        for ids in g.ids:
            ids.filled = False
        decode = mode == ForwardMode.DECODE
        qo_indptr = None if decode else host(lens.qo_indptr)
        for spec, wrapper in zip(self.specs, g.wrappers):
            if decode:
                self._plan_decode(wrapper, spec, lens, g)
            else:
                self._plan_paged(
                    wrapper,
                    spec,
                    qo_indptr,
                    lens,
                    prefix_only=False,
                    causal=spec.causal and not spec.cross,
                    graph=g,
                    tree=None if spec.cross else tree,
                )
        if decode:
            self._active_decode = g.wrappers
        else:
            self._active_paged = g.wrappers
        self._batch_path = BatchPath.DECODE if decode else BatchPath.PAGED
        self._graph = g
