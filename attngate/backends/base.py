"""``AttentionBackend``: what every backend implements (the checks they share: attngate.backends.checks)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

from attngate.backends.checks import check_heads_per_rank, check_pool_dtype, check_served_layers, tree_mask_of
from attngate.errors import BackendRefusal, Problem
from attngate.facts.modes import ForwardMode
from attngate.plan.schema import Plan
from attngate.runtime.forward_batch import ForwardBatch
from attngate.runtime.layer import AttentionLayer


class AttentionBackend(ABC):
    """Built from a Plan, the KV pool, the request table and the layer specs; reads no server argument.

    ``forward(q, k, v, layer, batch)`` takes ``q: [num_tokens, num_q_heads, head_dim]``,
    ``k: [num_tokens, num_kv_heads, head_dim]``, ``v: [num_tokens, num_kv_heads, v_head_dim]`` and
    returns ``[num_tokens, num_q_heads, v_head_dim]`` in q's dtype.
    """

    def __init__(
        self,
        plan: Plan,
        kv_pool,
        req_to_token: torch.Tensor,
        layers: list[AttentionLayer],
        device: torch.device | str = "cpu",
    ):
        plan.check_intact()  # a plan edited in place would steer this backend without its rules
        if plan.common.unified_kv_pool:
            raise BackendRefusal(
                Problem(
                    "common.unified_kv_pool",
                    "attngate's backends read their own KV pool's page ids; "
                    "SGLang's unified memory pool (--enable-unified-memory) needs its index translator",
                )
            )
        check_heads_per_rank(plan, layers)
        check_served_layers(layers)
        check_pool_dtype(plan, kv_pool)
        self.plan = plan
        self._tree_modes = frozenset(m for m in ForwardMode if plan.mode(m).common.tree_mask)
        self.kv_pool = kv_pool
        self.req_to_token = req_to_token
        self.layers = layers
        self.device = torch.device(device)
        self._paged_views: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def paged_kv(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's K and V buffers viewed as pages: ``[num_pages, page_size, num_kv_heads, head_dim]`` each.
        Made once per layer (the pool's buffers never move), not on every forward."""
        views = self._paged_views.get(layer_id)
        if views is None:
            ps = self.plan.common.page_size
            views = self._paged_views[layer_id] = tuple(
                b.view(b.shape[0] // ps, ps, *b.shape[1:]) for b in self.kv_pool.get_kv_buffer(layer_id)
            )
        return views

    def spec_tree(
        self, mode: ForwardMode, spec_tree_mask: torch.Tensor | None, new: Sequence[int]
    ) -> torch.Tensor | None:
        """:func:`tree_mask_of` under this backend's plan, with no work where neither the plan's mode nor the batch has
        a tree (every step of a server without speculative trees)."""
        if spec_tree_mask is None and mode not in self._tree_modes:
            return None
        return tree_mask_of(self.plan, mode, spec_tree_mask, new)

    @abstractmethod
    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Prepare per-batch metadata once; every layer's forward of this batch reuses it."""

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer: AttentionLayer,
        batch: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        if batch.forward_mode == ForwardMode.IDLE:
            return q.new_empty((0, layer.num_q_heads, layer.v_head_dim))
        if batch.forward_mode == ForwardMode.DECODE:
            return self.forward_decode(q, k, v, layer, batch, save_kv_cache)
        return self.forward_extend(q, k, v, layer, batch, save_kv_cache)

    @abstractmethod
    def forward_extend(
        self, q, k, v, layer: AttentionLayer, batch: ForwardBatch, save_kv_cache: bool
    ) -> torch.Tensor: ...

    @abstractmethod
    def forward_decode(
        self, q, k, v, layer: AttentionLayer, batch: ForwardBatch, save_kv_cache: bool
    ) -> torch.Tensor: ...

    # ---- CUDA graphs: declared here, implemented by GPU backends ----------------------------------

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Allocate the static metadata buffers that captured graphs read."""
        raise NotImplementedError(f"{type(self).__name__} does not capture CUDA graphs")

    def init_forward_metadata_capture_cuda_graph(
        self,
        bs: int,
        num_tokens: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        encoder_lens: torch.Tensor | None,
        forward_mode: ForwardMode,
    ) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not capture CUDA graphs")

    def init_forward_metadata_replay_cuda_graph(
        self,
        bs: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        encoder_lens: torch.Tensor | None,
        forward_mode: ForwardMode,
        encoder_lens_cpu: torch.Tensor | None = None,
        spec_tree_mask: torch.Tensor | None = None,
    ) -> None:
        """Update the static buffers in place before a replay. ``encoder_lens_cpu``: ``encoder_lens`` on the host, as
        ``seq_lens_cpu`` is ``seq_lens`` (without it, a batch with encoder tokens costs a device-to-host copy, a sync).
        ``spec_tree_mask``: a tree verify's ``[bs, D, D]`` bool, as ForwardBatch.spec_tree_mask (required where the
        plan's mode has ``common.tree_mask``, refused elsewhere)."""
        raise NotImplementedError(f"{type(self).__name__} does not capture CUDA graphs")

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1
