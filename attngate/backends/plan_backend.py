"""``PlanBackend``: the backends the plan names, each forward mode on its own (SGLang's HybridAttnBackend).

A plan names a prefill backend and a decode backend (``--prefill-attention-backend`` and
``--decode-attention-backend`` apart, or one ``--attention-backend`` for both), and each forward mode's
``common.runs_on`` says which of the two runs it (:meth:`attngate.Plan.backend_for`: DECODE and IDLE on the
decode backend, TARGET_VERIFY there too under ``--speculative-attention-mode decode``, the rest on the prefill
backend). ``PlanBackend`` builds the attngate backend of each name once over one KV pool and request table (fa3
and fa4 share :class:`FlashAttentionBackend`, whose provider the plan names) and hands each batch, each layer's
forward and each CUDA-graph capture and replay to the backend of the batch's mode.
"""

from __future__ import annotations

import torch

from attngate.backends.base import AttentionBackend
from attngate.backends.capabilities import kernel_backend_refusals
from attngate.backends.factories import BackendFactory, backend_factory
from attngate.backends.runtime.forward_batch import ForwardBatch
from attngate.backends.runtime.layer import AttentionLayer
from attngate.errors import BackendRefusal
from attngate.facts.modes import ForwardMode
from attngate.plan.backends import KERNEL_BACKEND_NAMES
from attngate.plan.schema import Plan

#: The backend names attngate runs on GPU kernels, and the factory that builds each (from the backend registry).
KERNEL_BACKENDS: dict[str, BackendFactory] = {name: backend_factory(name) for name in KERNEL_BACKEND_NAMES}


class PlanBackend(AttentionBackend):
    """The plan's prefill and decode backends behind one interface; every call goes to the backend of the batch's
    forward mode (``plan.backend_for(mode)``). ``checked`` and ``q_dtype`` go to every backend it builds.

    Raises BackendRefusal naming each side of the plan attngate has no kernel backend for (e.g. triton), and
    whatever the chosen backends raise for the model's layers, before any kernel runs.
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
        problems = kernel_backend_refusals(plan)
        if problems:
            raise BackendRefusal(problems)
        built: dict[BackendFactory, AttentionBackend] = {}  # fa3 and fa4 share one factory, so one backend
        for name in dict.fromkeys((plan.prefill_backend, plan.decode_backend)):
            factory = KERNEL_BACKENDS[name]
            if factory not in built:
                built[factory] = factory(plan, kv_pool, req_to_token, layers, device, checked=checked, q_dtype=q_dtype)
        self.backends: list[AttentionBackend] = list(built.values())  # each distinct backend once
        self._by_mode = {mode: built[KERNEL_BACKENDS[plan.backend_for(mode)]] for mode in ForwardMode}

    def backend_of(self, mode: ForwardMode) -> AttentionBackend:
        """The backend that runs ``mode`` under this plan."""
        return self._by_mode[mode]

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        self._by_mode[batch.forward_mode].init_forward_metadata(batch)

    def forward(self, q, k, v, layer: AttentionLayer, batch: ForwardBatch, save_kv_cache: bool = True) -> torch.Tensor:
        return self._by_mode[batch.forward_mode].forward(q, k, v, layer, batch, save_kv_cache)

    def forward_extend(self, q, k, v, layer, batch, save_kv_cache):
        return self._by_mode[batch.forward_mode].forward_extend(q, k, v, layer, batch, save_kv_cache)

    def forward_decode(self, q, k, v, layer, batch, save_kv_cache):
        return self._by_mode[batch.forward_mode].forward_decode(q, k, v, layer, batch, save_kv_cache)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        for backend in self.backends:
            backend.init_cuda_graph_state(max_bs, max_num_tokens)

    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode
    ):
        self._by_mode[forward_mode].init_forward_metadata_capture_cuda_graph(
            bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode
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
    ):
        self._by_mode[forward_mode].init_forward_metadata_replay_cuda_graph(
            bs,
            req_pool_indices,
            seq_lens,
            seq_lens_cpu,
            encoder_lens,
            forward_mode,
            encoder_lens_cpu=encoder_lens_cpu,
            spec_tree_mask=spec_tree_mask,
        )

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return self._by_mode[ForwardMode.DECODE].get_cuda_graph_seq_len_fill_value()
