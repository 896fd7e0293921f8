"""MLA layers on the FA kernels: per batch the form the plan's mode table gives (``common.mla_form``, with
:func:`attngate.backends.mla.absorbed_for_batch`), and the attention over the paged latent cache: absorbed, or the
latent decompressed into K and V."""

from __future__ import annotations

import torch

from attngate.backends.fa_kernels import Fa3Kernel, Fa4Kernel, FaMetadata
from attngate.backends.mla import absorb_q, absorbed_for_batch, check_mla_weights, decompress, project_out
from attngate.backends.page_ids import page_ids
from attngate.backends.runtime.batch_metadata import BatchLengths, host
from attngate.backends.runtime.forward_batch import ForwardBatch
from attngate.backends.runtime.layer import AttentionLayer
from attngate.errors import Problem, UsageError
from attngate.facts.modes import ForwardMode
from attngate.plan.schema import Plan


class FaMla:
    """The MLA path of the FA backend.

    Parameters
    ----------
    plan : Plan
        Reads each forward mode's ``common.mla_form`` and ``fa.num_splits``.
    kernel : Fa3Kernel or Fa4Kernel
        The backend's kernel.
    kv_pool : MLATokenToKVPool
        The latent cache: one row ``ckv ++ kpe`` per token slot.
    req_to_token : torch.Tensor
        ``[max_requests, max_context_len]`` int32 on ``device``.
    page_size : int
        Tokens per page of the pool.
    device : torch.device
        Where the batch's slots and ``cu_seqlens_k`` go.
    """

    def __init__(
        self,
        plan: Plan,
        kernel: Fa3Kernel | Fa4Kernel,
        kv_pool,
        req_to_token: torch.Tensor,
        page_size: int,
        device: torch.device,
    ):
        self.plan, self.kernel, self.kv_pool = plan, kernel, kv_pool
        self.req_to_token, self.page_size, self.device = req_to_token, page_size, device
        self._absorbed = True
        self._kv: tuple[torch.Tensor, torch.Tensor, int] | None = None  # non-absorbed over a prefix: slots, cu, max

    def prepare(self, lens: BatchLengths) -> None:
        """An eager batch: the form, and for non-absorbed attention over a prefix, every cached token's slot and
        cu_seqlens_k."""
        self._absorbed = absorbed_for_batch(self.plan.mode(lens.mode).common.mla_form, lens.has_prefix)
        self._kv = None
        if not self._absorbed and lens.has_prefix:
            tokens = lens.kv_pages(1)  # page size 1: every cached token's slot
            slots = page_ids(self.req_to_token, lens.rows, tokens, 1).long()
            self._kv = (slots, host(tokens.indptr).to(self.device), lens.max_seq)

    def prepare_graph(self, mode: ForwardMode) -> None:
        """A CUDA graph's batch reads the latent cache absorbed (its shapes are fixed; decompressing a prefix is
        not); UsageError where the plan's mode runs MLA non-absorbed."""
        if not absorbed_for_batch(self.plan.mode(mode).common.mla_form, True):
            raise UsageError(
                Problem(
                    "forward_mode",
                    f"the plan runs MLA non-absorbed in {mode.value}; only absorbed modes replay as CUDA graphs",
                    code="usage.cuda-graph-mode",
                )
            )
        self._absorbed, self._kv = True, None

    def forward(self, q, k, layer: AttentionLayer, batch: ForwardBatch, md: FaMetadata, write: bool) -> torch.Tensor:
        """``q: [T, H, qk_nope + qk_rope]``, ``k``: the latent ``[T, 1, kv_lora_rank + qk_rope]`` -> ``[T, H, v_head_dim]``."""
        check_mla_weights(layer)
        if write and k is not None:
            self.kv_pool.set_kv_buffer(layer.layer_id, batch.out_cache_loc, k)
        cache = self.kv_pool.kv_buffer[layer.layer_id]
        if self._absorbed:
            paged = cache.view(-1, self.page_size, 1, cache.shape[-1])
            q_abs = absorb_q(q, layer)
            r = layer.kv_lora_rank
            out = self.kernel.mla_absorbed(
                q_abs[..., r:],
                paged[..., r:],
                paged[..., :r],
                q_abs[..., :r],
                md=md,
                layer=layer,
                num_splits=self.plan.fa.num_splits,
            )
            return project_out(out, layer)
        if self._kv is None:  # no prefix: this forward's latent is all there is
            k_full, v_full = decompress(k, layer)
            cu_k, max_k = md.cu_seqlens_q, md.max_seqlen_q
        else:
            slots, cu_k, max_k = self._kv
            k_full, v_full = decompress(cache[slots], layer)
        return self.kernel(
            q,
            k_full,
            v_full,
            cu_seqlens_q=md.cu_seqlens_q,
            max_seqlen_q=md.max_seqlen_q,
            cu_seqlens_k=cu_k,
            max_seqlen_k=max_k,
            layer=layer,
            causal=True,
            window=(None, None),
            num_splits=self.plan.fa.num_splits,
        )
