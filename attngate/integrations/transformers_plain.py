"""``attn_implementation="attngate"`` without an AttngateRuntime: ``model(ids)`` and ``model.generate()``.

The plan is resolved once per model from its config (SGLang's default ServerArgs, or those given to
:func:`configure`) and kept in the model's context (:mod:`attngate.integrations.transformers_context`), which its
attention modules hold. Each attention call takes transformers' own K/V (its
DynamicCache or static cache) and its mask, and applies the plan's decisions for the layer's kind:
causality and the window (``plan.layer(kind).common``), soft-cap, learned sinks and scaling from the
same layer spec the runtime binds. transformers' mask supplies only what the plan cannot know: where
each query sits among the keys, which keys are padding, on a cross-attention layer which encoder tokens
each query sees (Mllama: the images before it), and on a chunked-local layer where its chunks begin
(absolute positions, which transformers' chunk cache of the last attention_chunk_size - 1 keys does not
keep; a mask that shows a query more keys than the plan's chunk is refused). On a GPU the phase runs on the plan's
backend: where the plan runs it on FA through ``flash_attn.cute``, FA4 reads the padded batch and transformers' cache in
place with device-side lengths (:func:`attngate.integrations.transformers_ops.fa_in_place`) where each
request's valid queries and keys are one run each (:func:`attngate.integrations.transformers_ops.reads_in_place`);
cross-attention and chunked-local layers, and FlashInfer's ragged prefill wrapper (its kernel family from the plan),
take the batch unpadded into varlen rows; otherwise attention runs in float32 torch (the reference semantics).
"""

from __future__ import annotations

from typing import Any

import torch

from attngate.backends.reference import visible_keys
from attngate.errors import Problem, UsageError
from attngate.facts.modes import LayerKind
from attngate.integrations import transformers_ops
from attngate.integrations.transformers_context import (  # noqa: F401 - configure and plan_of are public here
    LayerDecisions,
    configure,
    decisions_of,
    plan_of,
)
from attngate.integrations.transformers_rows import PaddedBatch, chunk_extents, self_attention_valid


def plain_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The attention call of ``attn_implementation="attngate"`` outside a runtime, by the plan's decisions for the
    module's layer (its model's context, :mod:`attngate.integrations.transformers_context`).

    Traceable by torch.compile with ``fullgraph=True`` once the model is configured (or has run): a call on a GPU
    kernel is one opaque op of the graph (``attngate::fa_varlen``, ``attngate::plain_kernel_attention`` where the batch
    is unpadded), the float32 path is traced, except on chunked-local layers, whose mask check reads the host (a graph
    break).

    Parameters
    ----------
    module : torch.nn.Module
        The transformers attention module (its ``config``, ``layer_idx`` and ``sinks``).
    query : torch.Tensor
        ``[B, H, S, D]``.
    key, value : torch.Tensor
        ``[B, H_kv, S_kv, D]`` and ``[B, H_kv, S_kv, Dv]``, transformers' cache included.
    attention_mask : torch.Tensor or None
        ``[B|1, 1|H, S|1, >=S_kv]`` bool (True: seen) or additive float, or None.
    scaling : float, optional
        The model's softmax scale (default the layer spec's).

    Returns
    -------
    tuple of (torch.Tensor, None)
        ``[B, S, H, Dv]`` in the query's dtype, and no attention weights.

    Raises
    ------
    BatchMetadataError
        Where a chunked-local layer's mask does not chunk as the plan says, or the module has no place in the plan
        (no layer_idx).
    ModelConfigError
        Where the module's config is no language model's (a vision tower's, naming the sub-config to give another
        implementation).
    UsageError
        For a mask no attention takes (see :func:`_mask_kind`).
    """
    context, d = decisions_of(module)
    scale = d.scaling if scaling is None else float(scaling)
    sinks = _sinks(module)
    b, h, s, _ = query.shape
    batch = PaddedBatch(attention_mask, b, s, key.shape[2], query.device, context.masks)
    general = _mask_kind(batch, h) == "general"
    on_kernel = _on_gpu(query) and not general and batch.s_kv > 0
    if on_kernel and not _plan_expresses(d, batch):
        general = on_kernel = False  # a caller's keep-mask with holes of its own: float32 torch applies it
    kernel = (d.prefill_kernel if s > 1 else d.decode_kernel) if on_kernel else None
    if (
        kernel == "fa"
        and d.kind != LayerKind.CROSS_ATTENTION
        and not d.attention_chunk_size
        and transformers_ops.reads_in_place(batch, d.causal)
    ):  # the padded path reads the mask's extents alone: no [B, S, S_kv] visible set is made for it
        return transformers_ops.fa_in_place(d, batch, query, key, value, sinks, scale), None
    visible = batch.visible(d.causal)  # [B, S, S_kv] as transformers masks it
    if kernel is not None:
        return transformers_ops.kernel_attention(
            query, key, value, visible, attention_mask, sinks, d.name, kernel, scale
        ), None
    return _float_attention(d, query, key, value, attention_mask if general else None, visible, sinks, scale), None


def _plan_expresses(d: LayerDecisions, batch: PaddedBatch) -> bool:
    """Whether the kernels, which take padding and where each query sits from the mask and causality and the window
    from the plan, compute what the mask shows (:meth:`PaddedBatch.visible`): true of the masks transformers makes (and
    of no mask); a caller's mask that hides keys of its own (one key from one query) is not. On cross-attention and
    chunked-local layers the kernels take each query's keys from the mask itself. Eager: one host read per mask and
    layer shape, kept; a graph cannot look and takes the mask as transformers makes it."""
    if batch.mask is None or d.kind == LayerKind.CROSS_ATTENTION or d.attention_chunk_size:
        return True  # cross and chunked-local rows are cut from the mask itself
    if torch.compiler.is_compiling():
        return True

    def make() -> bool:
        visible = batch.visible(d.causal)
        # a padding query's row is the kernels' own (zeros), whatever the mask shows it
        q_valid = self_attention_valid(visible, d.causal)[0][..., None]
        return bool(((_plan_mask(d, visible, unpadded=True) == visible) | ~q_valid).all())

    key = ("expressed", d.causal, d.window, d.attention_chunk_size, batch.b, batch.s, batch.s_kv)
    return batch.kept(key, make)


def _plan_mask(d: LayerDecisions, visible: torch.Tensor, *, unpadded: bool = False) -> torch.Tensor:
    """``[B, S, S_kv]`` bool: the keys the plan lets each query see, given where ``visible: [B, S, S_kv]`` puts it
    among the keys and which keys are padding. Where each query sits: its last visible key under a causal mask, else
    bottom-right (a bidirectional layer's mask shows every key of the row to every query). Positions are the padded
    batch's (eager's semantics: a window is a distance between positions, whatever is masked between them), or with
    ``unpadded`` a key's rank among its row's valid keys, as the kernels read the rows: a key masked out inside a
    request (a hole) shortens the kernels' distances across it, so a windowed layer's kernel mask differs there."""
    b, s, s_kv = visible.shape
    j = torch.arange(s_kv, device=visible.device)
    bottom_right = (s_kv - s) + torch.arange(s, device=visible.device)
    last = torch.where(visible, j, -1).amax(-1) if s_kv else bottom_right.expand(b, s)
    at = torch.where(last >= 0, last, bottom_right) if d.causal else bottom_right.expand(b, s)  # [B, S] key index
    # the keys a query may see: on a cross layer its own mask's (data), else those some query of the row sees (not padding)
    row_keys = visible.any(1, keepdim=True)  # [B, 1, S_kv]
    seen = visible if d.kind == LayerKind.CROSS_ATTENTION else row_keys
    if not unpadded:
        return seen & visible_keys(at, j, causal=d.causal, window=d.window)
    rank = row_keys.long().cumsum(-1) - 1  # [B, 1, S_kv]
    q_pos = rank[:, 0].gather(1, at.clamp(0, max(s_kv - 1, 0))) if s_kv else at
    return seen & visible_keys(q_pos, rank, causal=d.causal, window=d.window)


def _mask_kind(batch: PaddedBatch, h: int) -> str:
    """``"keep"``: no mask, or a bool keep-mask shared by the heads (what transformers' mask function makes; the
    kernels express it); ``"general"``: a caller's 4D mask the kernels cannot express, a per-head bool mask or an
    additive float mask (soft biases, -inf, NaN), which float32 torch applies as transformers' eager attention does.
    Raises UsageError for any other mask (an integer keep-mask, which eager would add as a bias and sdpa refuses, or
    a shape that does not broadcast over ``[B, H, S, S_kv]``). A float or per-head mask is read once (eager; kept per
    mask) to find whether it only keeps or hides, as transformers' own additive masks (Mllama's cross attention) do;
    in a graph such a mask is general."""
    attention_mask, b, s, s_kv = batch.mask, batch.b, batch.s, batch.s_kv
    if attention_mask is None:
        return "keep"
    problems = []
    if attention_mask.dtype != torch.bool and not attention_mask.is_floating_point():
        problems.append(
            ("usage.attention-mask-dtype", f"dtype {attention_mask.dtype}: a bool keep-mask or an additive float mask")
        )
    shape = tuple(attention_mask.shape)
    if len(shape) != 4 or shape[0] not in (1, b) or shape[1] not in (1, h) or shape[2] not in (1, s) or shape[3] < s_kv:
        shapes = f"[batch {b} or 1, heads {h} or 1, queries {s} or 1, keys >= {s_kv}]"
        problems.append(("usage.attention-mask-shape", f"shape {list(shape)}: {shapes}"))
    if problems:
        raise UsageError([Problem("attention_mask", text, code=code) for code, text in problems])
    if attention_mask.dtype == torch.bool and shape[1] == 1:
        return "keep"
    if torch.compiler.is_compiling():  # a graph cannot look at the values: torch computes what the mask says
        return "general"
    return batch.kept(("kind", s_kv), lambda: "keep" if _keeps_only(attention_mask[..., :s_kv]) else "general")


def _keeps_only(mask: torch.Tensor) -> bool:
    """Whether a 4D mask says only keep or hide, the same for every head: an additive mask of zeros and masked entries
    (its dtype's minimum or -inf, as transformers' own additive masks are), or a bool mask whose heads agree. One host
    read."""
    keep = mask if mask.dtype == torch.bool else mask == 0
    if mask.dtype != torch.bool and not (keep | (mask <= torch.finfo(mask.dtype).min / 2)).all():
        return False
    return bool((keep == keep[:, :1]).all())


def _float_attention(
    d: LayerDecisions,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    general_mask: torch.Tensor | None,
    visible: torch.Tensor,
    sinks: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """Attention in float32 torch, the reference semantics: ``query: [B, H, S, D]``, ``key``/``value: [B, H_kv, S_kv,
    D/Dv]``, ``visible: [B, S, S_kv]`` bool -> ``[B, S, H, Dv]`` in the query's dtype. ``general_mask`` (``[B|1, H|1,
    S|1, >=S_kv]``, see :func:`_mask_kind`): per head, and added to the scores when float, as eager attention adds it."""
    b, h, s, _ = query.shape
    s_kv = key.shape[2]
    if d.attention_chunk_size:
        chunk_extents(visible, visible.any(-1), d)  # the mask chunks as the plan says
    # the plan's decisions on top of what the mask shows (a caller's mask may hide more than padding)
    mask = (_plan_mask(d, visible) & visible)[:, None]  # [B, 1, S, S_kv]
    rep = h // key.shape[1]
    k, v = key.float().repeat_interleave(rep, 1), value.float().repeat_interleave(rep, 1)
    scores = torch.einsum("bhqd,bhkd->bhqk", query.float(), k) * scale
    if d.logit_cap:
        scores = d.logit_cap * torch.tanh(scores / d.logit_cap)
    if general_mask is not None:
        given = general_mask[..., :s_kv]
        if given.dtype == torch.bool:
            mask = mask & given
        else:  # eager attention adds the mask; its masked entries (finfo.min, -inf) are masked here outright
            scores = scores + given.float()
            mask = mask & ~(given <= torch.finfo(given.dtype).min / 2)
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is not None:
        scores = torch.cat([scores, sinks.float().view(1, h, 1, 1).expand(b, h, s, 1)], dim=-1)
    # a query that sees no key (padding) attends to nothing; a NaN or +inf a caller's mask adds comes through, as in eager
    probs = torch.softmax(scores, dim=-1).masked_fill(~mask.any(-1, keepdim=True) & (sinks is None), 0.0)[..., :s_kv]
    out = torch.einsum("bhqk,bhkd->bqhd", probs, v)
    return out.to(query.dtype)


def _sinks(module: torch.nn.Module) -> torch.Tensor | None:
    """``module.sinks`` (gpt-oss' learned sink logits, a parameter) or None, found without ``nn.Module.__getattr__``'s
    miss, which raises and catches an AttributeError on every layer without sinks (about 1 µs a call)."""
    for held in (module._parameters, module._buffers, module.__dict__):
        sinks = held.get("sinks")
        if sinks is not None:
            return sinks
    return None


def _on_gpu(t: torch.Tensor) -> bool:
    """On a GPU in a dtype the kernels take (a float32 model attends in float32 torch, as on the CPU)."""
    return t.is_cuda and t.dtype in (torch.float16, torch.bfloat16)
