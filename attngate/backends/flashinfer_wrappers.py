"""The FlashInfer backend's wrapper sets: the eager one (a decode, a paged-prefill and a ragged-prefill wrapper per
:class:`~attngate.backends.flashinfer_plans.WrapperSpec`) and, per captured CUDA graph, a :class:`CapturedWrappers`.
Every wrapper is built here, over one float workspace, each on the kernel family the plan names (FlashInfer's
"auto" is never left to choose)."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch

from attngate.backends.page_ids import GraphPageIds
from attngate.plan.schema import FlashInferGates


class FlashInferWrappers:
    """The eager wrappers of a backend, ``count`` of each kind (one per wrapper spec, indexed like the specs), and
    the factory of the CUDA-graph ones.

    Parameters
    ----------
    fi : module
        ``flashinfer``.
    gates : FlashInferGates
        ``plan.flashinfer``; reads ``workspace_size_mb``, ``decode_use_tensor_cores``, ``decode_kernel_family`` and
        ``prefill_kernel_family``.
    count : int
        Wrappers of each kind: 1, or 2 under a sliding-window or cross-attention ``wrapper_dispatch``.
    device : torch.device
        Where the workspace lives.
    """

    def __init__(self, fi: ModuleType, gates: FlashInferGates, count: int, device: torch.device):
        self.fi = fi
        self.gates = gates
        #: ``[workspace_size_mb << 20]`` uint8, the float workspace every wrapper (eager and captured) shares
        self.workspace = torch.empty(gates.workspace_size_mb << 20, dtype=torch.uint8, device=device)
        # an explicit decode family: 'auto' re-probes for cuDNN on every plan() (about 100 µs per step, bench/RESULTS.md)
        self.decode = [
            fi.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace,
                "NHD",
                use_tensor_cores=gates.decode_use_tensor_cores,
                backend=gates.decode_kernel_family,
            )
            for _ in range(count)
        ]
        self.paged = [
            fi.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD", backend=gates.prefill_kernel_family)
            for _ in range(count)
        ]
        self.ragged = [
            fi.BatchPrefillWithRaggedKVCacheWrapper(self.workspace, "NHD", backend=gates.prefill_kernel_family)
            for _ in range(count)
        ]

    def graph_decode(self, ids: GraphPageIds):
        """A CUDA-graph decode wrapper over ``ids``' static kv_indptr, kv_indices and kv_last_page_len."""
        return self.fi.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=self.gates.decode_use_tensor_cores,
            backend=self.gates.decode_kernel_family,
            paged_kv_indptr_buffer=ids.kv_indptr,
            paged_kv_indices_buffer=ids.kv_indices,
            paged_kv_last_page_len_buffer=ids.last_page_len,
        )

    def graph_paged(self, qo_indptr: torch.Tensor, ids: GraphPageIds, mask: dict[str, torch.Tensor]):
        """A CUDA-graph paged-prefill wrapper over ``qo_indptr: [bs + 1]`` int32 (static: a graph's tokens per request
        are fixed) and ``ids``' static buffers; ``mask``: a tree verify's ``custom_mask_buf`` and ``mask_indptr_buf``,
        else empty."""
        return self.fi.BatchPrefillWithPagedKVCacheWrapper(
            self.workspace,
            "NHD",
            use_cuda_graph=True,
            qo_indptr_buf=qo_indptr,
            paged_kv_indptr_buf=ids.kv_indptr,
            paged_kv_indices_buf=ids.kv_indices,
            paged_kv_last_page_len_buf=ids.last_page_len,
            backend=self.gates.prefill_kernel_family,
            **mask,
        )


@dataclass
class CapturedWrappers:
    """One captured (forward mode, batch size): its wrappers and, per wrapper, the page ids the graph builds.

    Attributes
    ----------
    wrappers : list
        The graph's FlashInfer wrappers, one per wrapper of the set.
    per_req : int
        New tokens per request.
    rows : torch.Tensor
        ``[bs]`` int64 on the device: ``req_pool_indices``, copied in at each re-plan; shared by the wrappers' ids.
    ids : list of GraphPageIds
        Per wrapper, the page ids the graph builds.
    planned : bool
        The capture's plan() ran: the wrappers hold a kernel module fast_decode_plan may reuse.
    """

    wrappers: list
    per_req: int
    rows: torch.Tensor
    ids: list[GraphPageIds]
    planned: bool = False
