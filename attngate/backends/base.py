"""``AttentionBackend``: what every backend implements (the checks they share: attngate.backends.checks)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

from attngate.backends.checks import check_heads_per_rank, check_pool_dtype, check_served_layers, tree_mask_of
from attngate.backends.runtime.forward_batch import ForwardBatch
from attngate.backends.runtime.layer import AttentionLayer
from attngate.errors import BackendRefusal, Problem
from attngate.facts.modes import ForwardMode
from attngate.plan.schema import Plan


class AttentionBackend(ABC):
    """An attention backend: built from a Plan, the KV pool, the request table and the layer specs; it reads no
    server argument, only the plan.

    Call order
    ----------
    Eager: ``init_forward_metadata(batch)`` once per batch, then ``forward(...)`` once per layer of that batch.
    CUDA graphs: ``init_cuda_graph_state`` once; per captured (forward mode, batch size)
    ``init_forward_metadata_capture_cuda_graph`` before the capture's forwards; before each replay
    ``init_forward_metadata_replay_cuda_graph``. An eager batch may come between replays.

    Parameters
    ----------
    plan : Plan
        The resolved plan; checked intact (a plan edited in place raises PlanLoadError).
    kv_pool : MHATokenToKVPool or MLATokenToKVPool
        The paged KV cache: ``num_slots`` token slots, ``page_size`` slots per page, its dtype the plan's
        ``common.kv_cache_dtype`` (the model's for "auto").
    req_to_token : torch.Tensor
        ``[max_requests, max_context_len]`` int32 on ``device``: each request's token slots in the pool.
    layers : list of AttentionLayer
        The layer specs this backend serves (heads on this rank, head dims, kind, window, soft-cap, sinks).
    device : torch.device or str
        Where the pool, the request table and the batches live.
    checked : bool
        Validate every batch before a kernel launch (indices inside the pool, lengths inside ``req_to_token``) and
        raise BatchMetadataError instead of an illegal memory access; off by default, no cost when off. The
        reference backend checks every batch.
    q_dtype : torch.dtype or None
        The queries' dtype (the model's); None: the pool's. Differs from the pool's under an FP8 KV cache, where the
        FlashInfer backend needs it; backends that read 16-bit caches only take it and need none.

    Every backend takes these parameters, in this order, the last two by keyword
    (:class:`attngate.backends.factories.BackendFactory`): a caller never asks which a backend takes.

    Raises
    ------
    BackendRefusal
        The plan or the layers ask what the backend does not run (attngate.backends.capabilities), before any
        kernel import or launch; also SGLang's unified KV pool, and a KV dtype no pool stores.
    BatchMetadataError
        Layers whose heads do not fit the plan's ``common.attn_tp_size``, encoder-only layers among served ones, or
        a pool whose dtype or page size is not the plan's.
    """

    def __init__(
        self,
        plan: Plan,
        kv_pool,
        req_to_token: torch.Tensor,
        layers: list[AttentionLayer],
        device: torch.device | str = "cpu",
        *,
        checked: bool = False,
        q_dtype: torch.dtype | None = None,
    ):
        plan.check_intact()  # a plan edited in place would steer this backend without its rules
        if plan.common.unified_kv_pool:
            raise BackendRefusal(
                Problem(
                    "common.unified_kv_pool",
                    "attngate's backends read their own KV pool's page ids; "
                    "SGLang's unified memory pool (--enable-unified-memory) needs its index translator",
                    code="backend-refusal.unified-kv-pool",
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
        self.checked = checked
        self.q_dtype = q_dtype
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
        """Prepare the batch's metadata once; every layer's forward of this batch reuses it.

        Parameters
        ----------
        batch : ForwardBatch
            ``forward_mode``; ``req_pool_indices: [bs]`` int64, ``seq_lens: [bs]`` int32 (tokens after this
            forward, prefix + new) and ``seq_lens_cpu`` (the same on the host; lengths are read there, so no device
            sync); ``extend_prefix_lens`` / ``extend_seq_lens: [bs]`` int32 (and ``extend_seq_lens_cpu``);
            ``out_cache_loc: [num_tokens]`` int64, the slots the new tokens' K/V go to; optional ``encoder_lens``,
            ``encoder_out_cache_loc`` (cross attention) and ``spec_tree_mask: [bs, D, D]`` bool (a tree verify).

        Raises
        ------
        BatchMetadataError
            With ``checked=True``: every index outside the pool or the request table, every length that
            disagrees; always: a speculative tree the plan's mode does not verify, or one missing where it does.
        """

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer: AttentionLayer,
        batch: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        """Attention of one layer over the batch prepared by ``init_forward_metadata``.

        Parameters
        ----------
        q : torch.Tensor
            ``[num_tokens, num_q_heads, head_dim]`` (MLA absorbed: ``kv_lora_rank + qk_rope_head_dim``), bf16/fp16
            on ``device``; tokens request by request, as ``extend_seq_lens`` orders them.
        k, v : torch.Tensor or None
            ``[num_tokens, num_kv_heads, head_dim]`` and ``[num_tokens, num_kv_heads, v_head_dim]`` (MLA: the
            latent ckv ++ kpe as ``k``, ``v`` None); written to ``out_cache_loc`` first where the layer kind's
            ``common.write_kv_cache`` and ``save_kv_cache`` say so (FlashInfer's ragged+paged prefill writes after
            attending: its paged half reads the prefix only). None when nothing is written (a cross layer's decode).
        layer : AttentionLayer
            One of the layers the backend was built with.
        batch : ForwardBatch
            The batch of the last ``init_forward_metadata`` (or the replayed graph's).
        save_kv_cache : bool
            False: attend without writing (the caller wrote the K/V itself).

        Returns
        -------
        torch.Tensor
            ``[num_tokens, num_q_heads, v_head_dim]`` in q's dtype; ``[0, ...]`` for an IDLE batch.

        Raises
        ------
        BatchMetadataError
            The layer's kind needs metadata this batch did not build (a prefix on a layer that writes no cache).
        """
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
        """Allocate the static metadata buffers captured graphs read, once, before any capture.

        Parameters
        ----------
        max_bs : int
            The largest batch size to be captured (requests).
        max_num_tokens : int
            The most tokens of one captured forward (``max_bs`` times the tokens per request).
        """
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
        """Build the metadata of one graph to capture, over the static buffers, before its forwards are captured.

        Parameters
        ----------
        bs : int
            Requests in the captured batch.
        num_tokens : int
            Tokens of the captured forward: ``bs`` times the tokens per request (1 for DECODE, the draft tokens for
            TARGET_VERIFY).
        req_pool_indices, seq_lens : torch.Tensor
            ``[bs]`` int64 and ``[bs]`` int32 on the device: the capture's rows and lengths (placeholders).
        encoder_lens : torch.Tensor or None
            ``[bs]`` int32, where the layers have cross attention.
        forward_mode : ForwardMode
            The mode captured; the plan's ``common.capture_cuda_graph`` for it must be true.

        Raises
        ------
        UsageError
            A mode or batch size the plan's table or the state's buffers do not serve.
        """
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
        """Update the captured graph's static buffers in place before a replay (no allocation, no device sync).

        Parameters
        ----------
        bs, forward_mode
            Which captured graph replays (captured by ``init_forward_metadata_capture_cuda_graph``).
        req_pool_indices, seq_lens : torch.Tensor
            ``[bs]`` int64 and int32 on the device: this replay's rows and lengths (prefix + new).
        seq_lens_cpu : torch.Tensor
            ``seq_lens`` on the host (lengths are read there).
        encoder_lens, encoder_lens_cpu : torch.Tensor or None
            ``[bs]`` int32 on the device and on the host; without the host copy a batch with encoder tokens costs
            a device-to-host copy, a sync.
        spec_tree_mask : torch.Tensor or None
            A tree verify's ``[bs, D, D]`` bool, as ForwardBatch.spec_tree_mask: required where the plan's mode has
            ``common.tree_mask``, refused elsewhere.

        Raises
        ------
        UsageError
            No graph was captured for (forward_mode, bs).
        BatchMetadataError
            With ``checked=True``: rows or lengths outside the request table; always: a tree mask the plan refuses.
        """
        raise NotImplementedError(f"{type(self).__name__} does not capture CUDA graphs")

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        """The ``seq_lens`` value a server pads a captured batch's unused rows with (tokens)."""
        return 1
