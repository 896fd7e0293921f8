"""``attn_implementation="attngate"`` without an AttngateRuntime: ``model(ids)`` and ``model.generate()``.

The plan is resolved once per model from its config (SGLang's default ServerArgs, or those given to
:func:`configure`) and cached on the config. Each attention call takes transformers' own K/V (its
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

import weakref
from typing import Any

import torch

from attngate.backends.reference import visible_keys
from attngate.backends.runtime.layer import AttentionLayer, layers_from_model
from attngate.engine.resolve import resolve
from attngate.engine.result import Resolution
from attngate.errors import BatchMetadataError, ModelConfigError, Problem, UsageError
from attngate.facts.model import ModelFacts
from attngate.facts.modes import LayerKind
from attngate.facts.platform import Platform
from attngate.facts.server_args import ServerArgs
from attngate.integrations import transformers_ops
from attngate.integrations.torch_platform import attngate_platform
from attngate.integrations.transformers_rows import (
    DECISIONS,
    LayerDecisions,
    chunk_extents,
    per_mask,
    self_attention_valid,
    visible_mask,
)

# per config object (kept off the config itself, which transformers serializes and copies)
_PLANS: dict[int, tuple[Resolution, list[AttentionLayer]]] = {}


def configure(
    model: torch.nn.Module, server_args: ServerArgs | None = None, platform: Platform | None = None
) -> Resolution:
    """Resolve (again) the plan ``model`` (or any module holding its ``config``) attends by outside a runtime;
    returns the Resolution. Raises PlanError; UsageError for a ``model`` without a transformers ``config``."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        raise UsageError(
            Problem("model", f"takes a transformers model (or a module holding its config), not {type(model).__name__}")
        )
    source = (getattr(config, "architectures", None) or [type(model).__name__])[0]
    try:
        facts = ModelFacts.from_hf_dict(config.to_dict(), source=source)
    except ModelConfigError as err:
        key = getattr(config, "base_config_key", "")
        if key and key != "text_config":  # a vision or audio tower's attention, under one attn_implementation for all
            err.problems.append(
                Problem(
                    source,
                    f"attngate resolves plans for language models; give the {key} tower its own "
                    f"implementation: attn_implementation={{'text_config': 'attngate', '{key}': 'sdpa'}}",
                )
            )
            raise ModelConfigError(err.problems) from None
        raise
    if platform is None:
        platform = attngate_platform()
    resolution = resolve(server_args or ServerArgs(), facts, platform)
    entry = (resolution, layers_from_model(facts))
    text = getattr(config, "text_config", None)
    for cfg in (config, text) if text is not None else (config,):
        if id(cfg) not in _PLANS:
            weakref.finalize(cfg, _PLANS.pop, id(cfg), None)
        _PLANS[id(cfg)] = entry
    _keep_decisions(model)
    return resolution


def plan_of(module: torch.nn.Module) -> tuple[Resolution, list[AttentionLayer]] | None:
    """The Resolution and layer specs a model (or one of its attention modules) attends by; None before the first call."""
    return _PLANS.get(id(module.config))


def _decide(module: torch.nn.Module) -> LayerDecisions:
    """The module's decisions from its model's plan (resolved here on first use), kept for compiled graphs. Raises as
    :func:`plain_attention` says."""
    if plan_of(module) is None:
        configure(module)
    resolution, layers = plan_of(module)
    layer = layers[_position(resolution.model, module)]
    plan, gates = resolution.plan, resolution.plan.layer(layer.kind).common
    decisions = LayerDecisions(
        layer_id=layer.layer_id,
        kind=layer.kind,
        causal=gates.causal,
        window=layer.sliding_window_size if gates.use_window and layer.sliding_window_size >= 0 else None,
        scaling=layer.scaling,
        logit_cap=layer.logit_cap,
        attention_chunk_size=layer.attention_chunk_size or 0,
        prefill_kernel=_kernel_of(resolution, plan.prefill_backend),
        decode_kernel=_kernel_of(resolution, plan.decode_backend),
        prefill_kernel_family=plan.flashinfer.prefill_kernel_family,
        workspace_size_mb=plan.flashinfer.workspace_size_mb,
    )
    if id(module) not in DECISIONS:
        weakref.finalize(module, DECISIONS.pop, id(module), None)
    DECISIONS[id(module)] = decisions
    return decisions


# the first traced call of a module no eager call or configure() has seen: a graph break (fullgraph=True refuses it)
_decide_outside_the_graph = torch.compiler.disable(
    _decide,
    reason="attngate resolves a model's plan on its first attention call, in Python: call "
    "attngate.integrations.transformers.configure(model) before torch.compile(..., fullgraph=True)",
)


def _keep_decisions(model: torch.nn.Module) -> None:
    """Decide again for every attention module under ``model`` that attends by a configured plan (a module the plan
    cannot place, an MLP say, is no attention module of it)."""
    for module in model.modules():
        if hasattr(module, "config") and plan_of(module) is not None:
            try:
                _decide(module)
            except BatchMetadataError:
                DECISIONS.pop(id(module), None)


def plain_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``query: [B, H, S, D]``, ``key``/``value: [B, H_kv, S_kv, D/Dv]`` (transformers' cache included),
    ``attention_mask: [B, 1, S, S_kv]`` bool or additive, or None -> ``([B, S, H, Dv], None)``. Raises
    BatchMetadataError where a chunked-local layer's mask does not chunk as the plan says or the module has no place
    in the plan (no layer_idx); ModelConfigError where the
    module's config is no language model's (a vision tower's, naming the sub-config to give another implementation).

    Traceable by torch.compile with ``fullgraph=True`` once the model is configured (or has run): a call on a GPU
    kernel is one opaque op of the graph (``attngate::fa_varlen``, ``attngate::plain_kernel_attention`` where the batch
    is unpadded), the float32 path is traced, except on
    chunked-local layers, whose mask check reads the host (a graph break)."""
    if torch.compiler.is_compiling():
        d = DECISIONS.get(id(module)) or _decide_outside_the_graph(module)
    else:  # every eager call reads the plan afresh: an edit to its layer specs applies at once
        d = _decide(module)
    scale = d.scaling if scaling is None else float(scaling)
    sinks = getattr(module, "sinks", None)
    b, h, s, _ = query.shape
    s_kv = key.shape[2]
    general = _mask_kind(attention_mask, b, h, s, s_kv) == "general"
    on_kernel = _on_gpu(query) and not general and s_kv > 0
    visible = visible_mask(attention_mask, b, s, s_kv, query.device, d.causal)  # [B, S, S_kv] as transformers masks it
    if on_kernel and not _plan_expresses(d, attention_mask, visible):
        general = on_kernel = False  # a caller's keep-mask with holes of its own: float32 torch applies it
    kernel = (d.prefill_kernel if s > 1 else d.decode_kernel) if on_kernel else None
    if (
        kernel == "fa"
        and d.kind != LayerKind.CROSS_ATTENTION
        and not d.attention_chunk_size
        and transformers_ops.reads_in_place(attention_mask, b, s, s_kv, query.device, d.causal)
    ):
        return transformers_ops.fa_in_place(d, query, key, value, attention_mask, sinks, scale), None
    if kernel is not None:
        return transformers_ops.kernel_attention(
            query, key, value, visible, attention_mask, sinks, id(module), kernel, scale
        ), None
    return _float_attention(d, query, key, value, attention_mask if general else None, visible, sinks, scale), None


def _plan_expresses(d: LayerDecisions, attention_mask: torch.Tensor | None, visible: torch.Tensor) -> bool:
    """Whether the kernels, which take padding and where each query sits from the mask and causality and the window
    from the plan, compute what ``visible`` shows: true of the masks transformers makes (and of no mask); a caller's
    mask that hides keys of its own (one key from one query) is not. On cross-attention and chunked-local layers the
    kernels take each query's keys from the mask itself. Eager: one host read per mask and layer shape, kept; a graph cannot look and
    takes the mask as transformers makes it."""
    if attention_mask is None or d.kind == LayerKind.CROSS_ATTENTION or d.attention_chunk_size:
        return True  # cross and chunked-local rows are cut from the mask itself
    if torch.compiler.is_compiling():
        return True

    def make() -> bool:
        # a padding query's row is the kernels' own (zeros), whatever the mask shows it
        q_valid = self_attention_valid(visible, d.causal)[0][..., None]
        return bool(((_plan_mask(d, visible, unpadded=True) == visible) | ~q_valid).all())

    return per_mask(attention_mask, ("expressed", d.causal, d.window, d.attention_chunk_size, *visible.shape), make)


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


def _mask_kind(attention_mask: torch.Tensor | None, b: int, h: int, s: int, s_kv: int) -> str:
    """``"keep"``: no mask, or a bool keep-mask shared by the heads (what transformers' mask function makes; the
    kernels express it); ``"general"``: a caller's 4D mask the kernels cannot express, a per-head bool mask or an
    additive float mask (soft biases, -inf, NaN), which float32 torch applies as transformers' eager attention does.
    Raises UsageError for any other mask (an integer keep-mask, which eager would add as a bias and sdpa refuses, or
    a shape that does not broadcast over ``[B, H, S, S_kv]``). A float or per-head mask is read once (eager; kept per
    mask) to find whether it only keeps or hides, as transformers' own additive masks (Mllama's cross attention) do;
    in a graph such a mask is general."""
    if attention_mask is None:
        return "keep"
    problems = []
    if attention_mask.dtype != torch.bool and not attention_mask.is_floating_point():
        problems.append(f"dtype {attention_mask.dtype}: a bool keep-mask or an additive float mask")
    shape = tuple(attention_mask.shape)
    if len(shape) != 4 or shape[0] not in (1, b) or shape[1] not in (1, h) or shape[2] not in (1, s) or shape[3] < s_kv:
        problems.append(f"shape {list(shape)}: [batch {b} or 1, heads {h} or 1, queries {s} or 1, keys >= {s_kv}]")
    if problems:
        raise UsageError([Problem("attention_mask", p) for p in problems])
    if attention_mask.dtype == torch.bool and shape[1] == 1:
        return "keep"
    if torch.compiler.is_compiling():  # a graph cannot look at the values: torch computes what the mask says
        return "general"
    return per_mask(
        attention_mask, ("kind", s_kv), lambda: "keep" if _keeps_only(attention_mask[..., :s_kv]) else "general"
    )


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


def _position(model: ModelFacts, module: torch.nn.Module) -> int:
    """The plan's layer of an attention module: by its model ``layer_idx`` (a hybrid's attention layers only); in an
    encoder-decoder (Whisper: the encoder's layers, then each decoder layer's self and cross attention) the encoder's
    modules, which carry no index, by their kind, and a decoder's by index and causality. Raises BatchMetadataError
    where the module cannot be placed."""
    idx = getattr(module, "layer_idx", None)
    if model.is_encoder_decoder:
        encoder = model.layer_kinds.count(LayerKind.ENCODER_ONLY)
        if not getattr(module, "is_decoder", True):
            return 0  # every encoder layer is one spec: non-causal, no window
        if isinstance(idx, int):
            idx = encoder + 2 * idx + (0 if getattr(module, "is_causal", True) else 1)
    if not isinstance(idx, int):
        raise BatchMetadataError(
            Problem(
                type(module).__name__,
                "an attention module without a layer_idx: attngate cannot tell which of the plan's layers it is",
            )
        )
    try:
        return model.attention_position(idx)
    except ValueError as err:
        raise BatchMetadataError(Problem(type(module).__name__, str(err))) from None


def _on_gpu(t: torch.Tensor) -> bool:
    """On a GPU in a dtype the kernels take (a float32 model attends in float32 torch, as on the CPU)."""
    return t.is_cuda and t.dtype in (torch.float16, torch.bfloat16)


def _kernel_of(resolution: Resolution, backend: str) -> str | None:
    """Which kernel runs a phase on ``backend`` on a GPU: ``"fa"`` (FA4's varlen kernel, where the plan runs FA
    through flash_attn.cute), ``"flashinfer"`` (its ragged prefill wrapper), or None (float32 torch: a provider
    this path does not call)."""
    plan = resolution.plan
    if backend in ("fa3", "fa4") and plan.fa.provider == "flash_attn.cute":
        return "fa"
    return "flashinfer" if backend == "flashinfer" else None
