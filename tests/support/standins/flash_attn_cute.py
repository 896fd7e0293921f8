"""A CPU stand-in of ``flash_attn.cute`` (FlashAttention-4, flash_attn_4 4.0.0b36 signatures).

``flash_attn_varlen_func`` takes ragged K/V (``cu_seqlens_k``) or the paged cache (``page_table``,
``seqused_k``), windows ``(left, right)`` with None for unbounded, soft-cap, learned sinks, the
absorbed-MLA input ``qv`` and ``num_splits`` (1: none, 0: FA's batch-dependent heuristic, n: n
pieces); attngate hands it no ``scheduler_metadata`` (invariant fa-precompute-only-on-fa3-interface).
Every problem found is raised in one ``ValueError``.
"""

from __future__ import annotations

import types

import torch

from tests.support.standins.graphs import RECORDER
from tests.support.standins.kernel_math import attend, heuristic_chunk, request_mask

BLOCK_N = 128  # keys per tile: splits cut at tile boundaries
#: The compute capability major the stand-in runs as (the real kernel reads the GPU's, or FLASH_ATTENTION_ARCH): its
#: architecture limits are checked for it; None checks none of them.
ARCH: int | None = None
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _arch_problems(problems: list[str], q, v, qv, paged: bool, num_splits: int) -> None:
    """flash-attn-4 4.0.0b36's architecture limits (_flash_attn_fwd, _validate_head_dims) for :data:`ARCH`."""
    arch = ARCH
    if arch is None:
        return
    if paged and arch in (8, 12):
        problems.append(f"paged KV not supported on SM {arch}.0")
    if num_splits != 1 and arch != 10:
        problems.append(f"SplitKV not supported on SM {arch}.0")
    if v.dtype in _FP8 and arch != 10:
        problems.append("FP8 is only supported on SM100")
    if qv is not None and arch != 10:
        problems.append("only support Blackwell arch with qv")
    d, dv = q.shape[-1], v.shape[-1]
    if qv is None and arch == 9 and not (d <= 256 and dv <= 256):
        problems.append(f"(head_dim, head_dim_v)=({d}, {dv}) is not supported on SM90")
    if qv is None and arch == 10 and not ((d <= 128 and dv <= 128) or (d, dv) in ((192, 128), (256, 256))):
        problems.append(f"(head_dim, head_dim_v)=({d}, {dv}) is not supported on SM100/SM110")


def _lengths(problems: list[str], name: str, t: torch.Tensor | None, entries: int | None) -> list[int] | None:
    if t is None:
        return None
    if t.dtype != torch.int32 or t.dim() != 1 or (entries is not None and t.numel() != entries):
        problems.append(f"{name} must be 1-D int32 with {entries} entries, got {t.dtype} {tuple(t.shape)}")
        return None
    return t.tolist()


def flash_attn_varlen_func(
    q,
    k,
    v,
    qv=None,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    max_seqlen_q=None,
    max_seqlen_k=None,
    min_seqlen_k=None,
    seqused_q=None,
    seqused_k=None,
    gather_kv_indices=None,
    page_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(None, None),
    learnable_sink=None,
    softcap=0.0,
    num_splits=1,
    pack_gqa=None,
    deterministic=False,
    score_mod=None,
    score_mod_bwd=None,
    mask_mod=None,
    block_sparse_tensors=None,
    aux_tensors=None,
    aux_scalars=None,
    return_lse=False,
    scheduler_metadata=None,
    seqlen_k_per_split=None,
    disable_scheduler_metadata=False,
    **_,
):
    RECORDER.launch(
        "flash_attn_varlen_func",
        q=q,
        k=k,
        v=v,
        qv=qv,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k,
        seqused_k=seqused_k,
        page_table=page_table,
        softmax_scale=softmax_scale,
        causal=causal,
        window_size=tuple(window_size),
        softcap=softcap,
        num_splits=num_splits,
        scheduler_metadata=scheduler_metadata,
    )
    problems: list[str] = []
    paged = page_table is not None
    cu_q = _lengths(problems, "cu_seqlens_q", cu_seqlens_q, None)
    bs = len(cu_q) - 1 if cu_q else 0
    used_q = _lengths(problems, "seqused_q", seqused_q, bs)
    q_at, q_lens = _runs(problems, "q", cu_q, used_q, q.shape[0])
    if max_seqlen_q is not None and q_lens and max(q_lens) > max_seqlen_q:
        problems.append(
            f"max_seqlen_q {max_seqlen_q} is below the longest query run {max(q_lens)}: its tail is never computed"
        )
    if q.shape[1] % k.shape[-2]:
        problems.append(f"{q.shape[1]} query heads are not a multiple of {k.shape[-2]} KV heads")
    if q.dtype != k.dtype or k.dtype != v.dtype:
        problems.append(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if paged:
        used = _lengths(problems, "seqused_k", seqused_k, bs)
        if page_table.dtype != torch.int32 or page_table.dim() != 2 or page_table.shape[0] != bs:
            problems.append(
                f"page_table must be [{bs}, max_pages] int32, got {page_table.dtype} {tuple(page_table.shape)}"
            )
        elif page_table.stride(-1) != 1:  # flash_attn.cute asserts the same
            problems.append("page_table must be contiguous in the last dimension")
        elif used is not None:
            ps, pages = k.shape[1], k.shape[0]
            for b, n in enumerate(used):
                need = -(-n // ps)
                row = page_table[b, :need]
                if need > page_table.shape[1] or (row.numel() and (int(row.min()) < 0 or int(row.max()) >= pages)):
                    problems.append(
                        f"request {b}: seqused_k {n} reads pages {row.tolist()[:8]} outside the table or the cache of {pages}"
                    )
        kv_lens = used
    else:
        cu_k = _lengths(problems, "cu_seqlens_k", cu_seqlens_k, bs + 1)
        used_k = _lengths(problems, "seqused_k", seqused_k, bs)
        k_at, kv_lens = _runs(problems, "k", cu_k, used_k, min(k.shape[0], v.shape[0]))
    _arch_problems(problems, q, v, qv, paged, num_splits)
    if learnable_sink is not None and learnable_sink.shape != (q.shape[1],):
        problems.append(f"learnable_sink must be [{q.shape[1]}], got {tuple(learnable_sink.shape)}")
    if problems:
        raise ValueError("flash_attn_varlen_func: " + "; ".join(problems))

    left, right = window_size
    right = 0 if causal else right
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    if num_splits == 1:
        chunk = None
    elif num_splits == 0:
        chunk = heuristic_chunk(kv_lens, heads=k.shape[-2], min_chunk=BLOCK_N)
    else:
        chunk = -(-max(kv_lens, default=1) // num_splits // BLOCK_N) * BLOCK_N or BLOCK_N
    # rows no run names are left as the kernel leaves them: unwritten (NaN here, so that a caller reading them shows)
    out = torch.full((q.shape[0], q.shape[1], v.shape[-1]), float("nan"), dtype=q.dtype, device=q.device)
    lse_out = torch.full((q.shape[0], q.shape[1]), float("nan"), device=q.device)
    for b in range(bs):
        rows = slice(q_at[b], q_at[b] + q_lens[b])
        if paged:
            pages = page_table[b, : -(-kv_lens[b] // k.shape[1])].long()
            kb, vb = (c[pages].flatten(0, 1)[: kv_lens[b]] for c in (k, v))
        else:
            kb, vb = k[k_at[b] : k_at[b] + kv_lens[b]], v[k_at[b] : k_at[b] + kv_lens[b]]
        mask = request_mask(
            q_lens[b],
            kv_lens[b],
            causal=causal,
            window_left=-1 if left is None else left,
            window_right=-1 if right is None else right,
        )
        o, lse = attend(
            q[rows],
            kb,
            vb,
            mask,
            scale=scale,
            out_dtype=q.dtype,
            chunk=chunk,
            softcap=softcap,
            sinks=learnable_sink,
            qv=None if qv is None else qv[rows],
        )
        out[rows], lse_out[rows] = o, lse
    return out, lse_out.transpose(0, 1)


def _runs(
    problems: list[str], name: str, cu: list[int] | None, used: list[int] | None, total: int
) -> tuple[list[int], list[int]]:
    """Each request's first row and length as flash_attn.cute's SeqlenInfo reads them: the offset from
    ``cu_seqlens``, the length from ``seqused`` where given (rows between runs are skipped), else from the next
    offset, in which case ``cu_seqlens`` must rise from 0 to every row."""
    if cu is None:
        return [], []
    if used is None:
        if cu[0] != 0 or any(b < a for a, b in zip(cu, cu[1:])) or cu[-1] != total:
            problems.append(f"cu_seqlens_{name} must rise from 0 to the {total} rows, got {cu[:8]}")
        return cu[:-1], [b - a for a, b in zip(cu, cu[1:])]
    for b, (at, n) in enumerate(zip(cu, used)):
        if n < 0 or at < 0 or at + n > total:
            problems.append(f"request {b}: {name} rows [{at}, {at + n}) outside the {total} rows")
    return cu[:-1], used


def modules() -> dict[str, types.ModuleType]:
    """``sys.modules`` entries for ``flash_attn``, ``flash_attn.cute`` and ``flash_attn.cute.interface``."""
    interface = types.ModuleType("flash_attn.cute.interface")
    interface.flash_attn_varlen_func = flash_attn_varlen_func
    cute = types.ModuleType("flash_attn.cute")
    cute.flash_attn_varlen_func = flash_attn_varlen_func
    cute.interface = interface
    cute.__stand_in__ = True
    root = types.ModuleType("flash_attn")
    root.cute = cute
    return {"flash_attn": root, "flash_attn.cute": cute, "flash_attn.cute.interface": interface}
