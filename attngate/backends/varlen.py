"""The plain transformers path's kernel calls (:mod:`attngate.integrations.transformers_plain`): one varlen
call over a padded batch unpadded into rows, on FA4 (``flash_attn.cute``) or FlashInfer's ragged prefill wrapper.
The caller decides every argument from the Plan; these only call, importing the kernel package on first use.

Shapes: ``q: [total_q, num_q_heads, head_dim]``, ``k: [total_k, num_kv_heads, head_dim]``,
``v: [total_k, num_kv_heads, v_head_dim]`` (bf16/fp16, one CUDA device); ``cu_seqlens_q``/``cu_seqlens_k``:
``[num_rows + 1]`` int32; the result ``[total_q, num_q_heads, v_head_dim]`` in q's dtype.
"""

from __future__ import annotations

import importlib
import sys

import torch

from attngate.backends import fa4_launch
from attngate.backends.fa_kernels import fa_window_size


def fa4_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    scale: float,
    causal: bool,
    window_left: int | None,
    softcap: float,
    sinks: torch.Tensor | None,
    seqused_q: torch.Tensor | None = None,
    seqused_k: torch.Tensor | None = None,
    return_lse: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One ``flash_attn.cute.flash_attn_varlen_func`` call (its compiled launch replayed where
    :mod:`attngate.backends.fa4_launch` may) -> ``(out [total_q, H, Dv], lse [H, total_q] fp32 or None)``.
    ``cu_seqlens_*`` on the host (the unpadded rows) or the device; ``seqused_*`` (device, ``[num_rows]`` int32):
    each row's length from its ``cu_seqlens`` offset, rows between runs left unread and unwritten
    (attngate.backends.fa_padded). ``window_left``: earlier keys a query sees (None: no window); ``softcap`` 0: none;
    ``sinks: [num_q_heads]`` learned sinks (passed as float32) or None."""
    module = sys.modules.get("flash_attn.cute") or importlib.import_module("flash_attn.cute")  # or a test's stand-in
    # a bound, not a length (each row's own comes from cu_seqlens/seqused): a power of two keeps one launch signature
    # over a decode's growing keys (attngate.backends.fa4_launch)
    max_seqlen_k = max(256, 1 << (max(int(max_seqlen_k), 1) - 1).bit_length())
    return fa4_launch.flash_attn_varlen(
        module,
        q,
        k,
        v,
        cu_seqlens_q=_on(cu_seqlens_q, q),
        cu_seqlens_k=_on(cu_seqlens_k, q),
        seqused_q=seqused_q,
        seqused_k=seqused_k,
        max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k,
        softmax_scale=scale,
        causal=causal,
        window_size=fa_window_size(window_left, causal),
        learnable_sink=None if sinks is None else sinks.float(),
        softcap=softcap,
        return_lse=return_lse,
    )


def _on(t: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``t`` on q's device (a host tensor copied without a sync); one already there as it is, with no dispatch (and
    no device objects made: ``get_device`` is an int)."""
    return t if t.get_device() == q.get_device() else t.to(q.device, non_blocking=True)


# FlashInfer ragged wrappers per (device, kernel family, layer spec), each re-planned only when the rows' lengths
# change, so all layers of one forward share one plan() (two with alternating windows)
_RAGGED: dict[tuple, list] = {}
_WORKSPACES: dict[torch.device, torch.Tensor] = {}


def flashinfer_ragged(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    kernel_family: str,
    scale: float,
    causal: bool,
    window_left: int | None,
    softcap: float,
    workspace_size_mb: int,
) -> torch.Tensor:
    """``BatchPrefillWithRaggedKVCacheWrapper`` (bottom-right causal: prefill and decode alike) in ``kernel_family``
    (the plan's ``flashinfer.prefill_kernel_family``). ``lens: [2, num_rows]`` int32 on the host (queries, keys per
    row) decides whether plan() runs again; ``cu_seqlens_*`` on the host, as plan() reads them there;
    ``workspace_size_mb``: the float workspace, one per device."""
    fi = importlib.import_module("flashinfer")
    heads, (kv_heads, head_dim), head_dim_vo = q.shape[1], k.shape[1:], v.shape[-1]
    spec = (
        q.device,
        kernel_family,
        causal,
        window_left,
        softcap,
        scale,
        heads,
        kv_heads,
        head_dim,
        head_dim_vo,
        q.dtype,
    )
    if spec not in _RAGGED:
        if q.device not in _WORKSPACES:  # one float workspace per device, shared as the backends share theirs
            _WORKSPACES[q.device] = torch.empty(workspace_size_mb << 20, dtype=torch.uint8, device=q.device)
        _RAGGED[spec] = [
            fi.BatchPrefillWithRaggedKVCacheWrapper(_WORKSPACES[q.device], "NHD", backend=kernel_family),
            None,
        ]
    entry = _RAGGED[spec]
    wrapper, planned = entry
    if planned is None or not torch.equal(planned, lens):
        wrapper.plan(
            cu_seqlens_q,
            cu_seqlens_k,
            heads,
            kv_heads,
            head_dim,
            head_dim_vo=head_dim_vo,
            causal=causal,
            sm_scale=scale,
            window_left=-1 if window_left is None else window_left,
            logits_soft_cap=softcap or None,
            q_data_type=q.dtype,
            kv_data_type=k.dtype,
        )
        entry[1] = lens
    return wrapper.run(q, k, v)
