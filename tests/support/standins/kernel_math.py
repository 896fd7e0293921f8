"""Attention of one request as the kernels compute it: bottom-right causal alignment, windows,
soft-cap, learned sinks, and split-KV with partial states kept in the output dtype.

Shapes: ``q: [Lq, H, D]``, ``k: [Lk, Hk, D]``, ``v: [Lk, Hk, Dv]`` (``H % Hk == 0``, GQA maps query
head h to KV head ``h // (H / Hk)``). States are ``(o: [Lq, H, Dv] fp32, lse: [Lq, H] fp32)``, lse in
natural log; a query that sees no key has lse ``-inf`` and output 0.
"""

from __future__ import annotations

import torch

GRID = 132 * 2  # CTAs the split heuristic fills: an H100's 132 SMs, two CTAs each


def request_mask(lq: int, lk: int, *, causal: bool, window_left: int = -1, window_right: int = -1) -> torch.Tensor:
    """``[lq, lk]`` bool: the queries are the last ``lq`` positions of the ``lk`` keys (bottom-right)."""
    pos = torch.arange(lq)[:, None] + (lk - lq)
    j = torch.arange(lk)[None, :]
    mask = torch.ones(lq, lk, dtype=torch.bool)
    if causal:
        mask &= j <= pos
    if window_left >= 0:
        mask &= j >= pos - window_left
    if window_right >= 0:
        mask &= j <= pos + window_right
    return mask


def partial_state(
    q, k, v, mask: torch.Tensor, *, scale: float, softcap: float = 0.0, qv: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention state of ``q`` over these keys only. ``qv: [Lq, H, Dv]`` adds ``qv . v`` to each
    score (FA's absorbed-MLA input)."""
    rep = q.shape[1] // k.shape[1]
    kf, vf = k.float().repeat_interleave(rep, 1), v.float().repeat_interleave(rep, 1)
    s = torch.einsum("qhd,khd->qhk", q.float(), kf)
    if qv is not None:
        s = s + torch.einsum("qhd,khd->qhk", qv.float(), vf)
    s = s * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~mask[:, None, :].to(s.device), float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)  # rows that see no key: exp(-inf + inf) is nan
    return torch.einsum("qhk,khd->qhd", p, vf), lse


def merge_states(states: list[tuple[torch.Tensor, torch.Tensor]], *, sinks: torch.Tensor | None = None):
    """One state from several over disjoint key sets; ``sinks: [H]`` adds one logit per head to the denominator."""
    lses = torch.stack([lse for _, lse in states])
    total = torch.logsumexp(lses, 0)
    if sinks is not None:
        total = torch.logaddexp(total, sinks.float().to(total.device)[None, :].expand_as(total))
    weights = torch.exp(lses - total).nan_to_num(0.0)
    out = sum(w[..., None] * o.float() for w, (o, _) in zip(weights, states))
    return out, total


def attend(
    q,
    k,
    v,
    mask: torch.Tensor,
    *,
    scale: float,
    out_dtype: torch.dtype,
    chunk: int | None = None,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    qv: torch.Tensor | None = None,
):
    """``(o [Lq, H, Dv] in out_dtype, lse [Lq, H] fp32)``. ``chunk``: split-KV every ``chunk`` keys;
    each partial output is stored in ``out_dtype`` before the merge, as the kernels do, so where a
    request is cut changes the rounding of its result."""
    lk = k.shape[0]
    if chunk is None or chunk >= lk:
        o, lse = partial_state(q, k, v, mask, scale=scale, softcap=softcap, qv=qv)
        if sinks is not None:
            o, lse = merge_states([(o, lse)], sinks=sinks)
        return o.to(out_dtype), lse
    states = []
    for a in range(0, lk, chunk):
        o, lse = partial_state(
            q, k[a : a + chunk], v[a : a + chunk], mask[:, a : a + chunk], scale=scale, softcap=softcap, qv=qv
        )
        states.append((o.to(out_dtype), lse))
    o, lse = merge_states(states, sinks=sinks)
    return o.to(out_dtype), lse


def heuristic_chunk(units: list[int], *, heads: int, min_chunk: int, tiles: list[int] | None = None) -> int | None:
    """FlashInfer's split-KV heuristic (a binary search for the smallest chunk, in pages or tokens, whose
    work items ``sum(ceil(units_i / chunk) * tiles_i) * heads`` fit the grid). None: nobody is split.
    Batch-dependent by design: a lone long request is cut fine, the same request in a full batch is not."""
    if not units or max(units) == 0:
        return None
    tiles = tiles or [1] * len(units)
    low, high = max(min_chunk, 1), max(units)
    while low < high:
        mid = (low + high) // 2
        if sum(-(-u // mid) * t for u, t in zip(units, tiles)) * heads > GRID:
            low = mid + 1
        else:
            high = mid
    return None if low >= max(units) else low
