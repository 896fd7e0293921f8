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
from attngate.integrations.transformers_rows import (
    DECISIONS,
    LayerDecisions,
    chunk_extents,
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
        platform = Platform.detect() if torch.cuda.is_available() else Platform.from_name("sm90")
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
    kernel = (d.prefill_kernel if s > 1 else d.decode_kernel) if _on_gpu(query) else None
    if (
        kernel == "fa"
        and d.kind != LayerKind.CROSS_ATTENTION
        and not d.attention_chunk_size
        and transformers_ops.reads_in_place(attention_mask, b, s, s_kv, query.device, d.causal)
    ):
        return transformers_ops.fa_in_place(d, query, key, value, attention_mask, sinks, scale), None
    visible = visible_mask(attention_mask, b, s, s_kv, query.device, d.causal)  # [B, S, S_kv] as transformers masks it
    if kernel is not None:
        return transformers_ops.kernel_attention(
            query, key, value, visible, attention_mask, sinks, id(module), kernel, scale
        ), None
    # where each query sits among the keys: its last visible key under a causal mask, else bottom-right (a
    # bidirectional layer's mask shows every key of the row to every query). Positions are padded ones: a window
    # (a distance) reads them as the unpadded positions would.
    j = torch.arange(s_kv, device=query.device)
    bottom_right = (s_kv - s) + torch.arange(s, device=query.device)
    last = torch.where(visible, j, -1).amax(-1)
    q_pos = torch.where(last >= 0, last, bottom_right) if d.causal else bottom_right.expand(b, s)
    # the keys a query may see: on a cross layer its own mask's (data), else those some query of the row sees (not padding)
    seen = visible if d.kind == LayerKind.CROSS_ATTENTION else visible.any(1, keepdim=True)
    mask = seen & visible_keys(q_pos, j, causal=d.causal, window=d.window)
    if d.attention_chunk_size:
        chunk_extents(visible, visible.any(-1), d)  # the mask chunks as the plan says
        mask &= visible
    rep = h // key.shape[1]
    k, v = key.float().repeat_interleave(rep, 1), value.float().repeat_interleave(rep, 1)
    scores = torch.einsum("bhqd,bhkd->bhqk", query.float(), k) * scale
    if d.logit_cap:
        scores = d.logit_cap * torch.tanh(scores / d.logit_cap)
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    if sinks is not None:
        scores = torch.cat([scores, sinks.float().view(1, h, 1, 1).expand(b, h, s, 1)], dim=-1)
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)[..., :s_kv]
    out = torch.einsum("bhqk,bhkd->bqhd", probs, v)
    return out.to(query.dtype), None


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
