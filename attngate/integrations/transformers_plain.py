"""``attn_implementation="attngate"`` without an AttngateRuntime: ``model(ids)`` and ``model.generate()``.

The plan is resolved once per model from its config (SGLang's default ServerArgs, or those given to
:func:`configure`) and cached on the config. Each attention call takes transformers' own K/V (its
DynamicCache or static cache) and its mask, and applies the plan's decisions for the layer's kind:
causality and the window (``plan.layer(kind).common``), soft-cap, learned sinks and scaling from the
same layer spec the runtime binds. transformers' mask supplies only what the plan cannot know: where
each query sits among the keys, which keys are padding, on a cross-attention layer which encoder tokens
each query sees (Mllama: the images before it), and on a chunked-local layer where its chunks begin
(absolute positions, which transformers' chunk cache of the last attention_chunk_size - 1 keys does not
keep; a mask that shows a query more keys than the plan's chunk is refused). On a GPU the batch is
unpadded into varlen rows and the phase runs on the plan's backend: one FA4 varlen call where the
plan runs it on FA through ``flash_attn.cute``, FlashInfer's ragged prefill wrapper (its kernel family
from the plan) where the plan runs it on FlashInfer; otherwise attention runs in float32 torch (the
reference semantics).
"""

from __future__ import annotations

import importlib
import weakref
from dataclasses import dataclass
from typing import Any, Optional

import torch

from attngate.backends.reference import visible_keys
from attngate.engine.resolve import resolve
from attngate.engine.result import Resolution
from attngate.errors import BatchMetadataError, ModelConfigError, Problem, UsageError
from attngate.facts.model import ModelFacts
from attngate.facts.modes import LayerKind
from attngate.facts.platform import Platform
from attngate.facts.server_args import ServerArgs
from attngate.runtime.layer import AttentionLayer, layers_from_model

# per config object (kept off the config itself, which transformers serializes and copies)
_PLANS: dict[int, tuple[Resolution, list[AttentionLayer]]] = {}


def configure(model: torch.nn.Module, server_args: ServerArgs | None = None, platform: Platform | None = None) -> Resolution:
    """Resolve (again) the plan ``model`` (or any module holding its ``config``) attends by outside a runtime;
    returns the Resolution. Raises PlanError; UsageError for a ``model`` without a transformers ``config``."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        raise UsageError(Problem("model", f"takes a transformers model (or a module holding its config), not {type(model).__name__}"))
    source = (getattr(config, "architectures", None) or [type(model).__name__])[0]
    try:
        facts = ModelFacts.from_hf_dict(config.to_dict(), source=source)
    except ModelConfigError as err:
        key = getattr(config, "base_config_key", "")
        if key and key != "text_config":  # a vision or audio tower's attention, under one attn_implementation for all
            err.problems.append(Problem(source, f"attngate resolves plans for language models; give the {key} tower its own "
                                                f"implementation: attn_implementation={{'text_config': 'attngate', '{key}': 'sdpa'}}"))
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


@dataclass(frozen=True)
class _LayerDecisions:
    """What the plan decides for one attention module, as plain values (what a torch.compile graph reads)."""

    layer_id: int
    kind: LayerKind
    causal: bool
    window: int | None  # earlier keys a query sees; None: no window on this layer
    scaling: float
    logit_cap: float
    attention_chunk_size: int  # 0: not chunked local
    prefill_kernel: str | None  # on a GPU: "fa", "flashinfer", or None (float32 torch)
    decode_kernel: str | None
    prefill_kernel_family: str  # FlashInfer's ragged wrapper's
    workspace_size_mb: int


# each attention module's latest decisions, read by torch.compile graphs (which cannot run the plan's Python): kept by
# every eager call and by configure() for every module of the model it is given; a graph guards on its entry, so a
# plan configured again retraces the graphs that read the old one
_DECISIONS: dict[int, _LayerDecisions] = {}


def _decide(module: torch.nn.Module) -> _LayerDecisions:
    """The module's decisions from its model's plan (resolved here on first use), kept for compiled graphs. Raises as
    :func:`plain_attention` says."""
    if plan_of(module) is None:
        configure(module)
    resolution, layers = plan_of(module)
    layer = layers[_position(resolution.model, module)]
    plan, gates = resolution.plan, resolution.plan.layer(layer.kind).common
    decisions = _LayerDecisions(
        layer_id=layer.layer_id, kind=layer.kind, causal=gates.causal,
        window=layer.sliding_window_size if gates.use_window and layer.sliding_window_size >= 0 else None,
        scaling=layer.scaling, logit_cap=layer.logit_cap, attention_chunk_size=layer.attention_chunk_size or 0,
        prefill_kernel=_kernel_of(resolution, plan.prefill_backend), decode_kernel=_kernel_of(resolution, plan.decode_backend),
        prefill_kernel_family=plan.flashinfer.prefill_kernel_family, workspace_size_mb=plan.flashinfer.workspace_size_mb)
    if id(module) not in _DECISIONS:
        weakref.finalize(module, _DECISIONS.pop, id(module), None)
    _DECISIONS[id(module)] = decisions
    return decisions


# the first traced call of a module no eager call or configure() has seen: a graph break (fullgraph=True refuses it)
_decide_outside_the_graph = torch.compiler.disable(
    _decide, reason="attngate resolves a model's plan on its first attention call, in Python: call "
                    "attngate.integrations.transformers.configure(model) before torch.compile(..., fullgraph=True)")


def _keep_decisions(model: torch.nn.Module) -> None:
    """Decide again for every attention module under ``model`` that attends by a configured plan (a module the plan
    cannot place, an MLP say, is no attention module of it)."""
    for module in model.modules():
        if hasattr(module, "config") and plan_of(module) is not None:
            try:
                _decide(module)
            except BatchMetadataError:
                _DECISIONS.pop(id(module), None)


def plain_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """``query: [B, H, S, D]``, ``key``/``value: [B, H_kv, S_kv, D/Dv]`` (transformers' cache included),
    ``attention_mask: [B, 1, S, S_kv]`` bool or additive, or None -> ``([B, S, H, Dv], None)``. Raises
    BatchMetadataError where a chunked-local layer's mask does not chunk as the plan says or the module has no place
    in the plan (no layer_idx); ModelConfigError where the
    module's config is no language model's (a vision tower's, naming the sub-config to give another implementation).

    Traceable by torch.compile with ``fullgraph=True`` once the model is configured (or has run): a call on a GPU
    kernel is one opaque op of the graph (``attngate::plain_kernel_attention``), the float32 path is traced, except on
    chunked-local layers, whose mask check reads the host (a graph break)."""
    if torch.compiler.is_compiling():
        d = _DECISIONS.get(id(module)) or _decide_outside_the_graph(module)
    else:  # every eager call reads the plan afresh: an edit to its layer specs applies at once
        d = _decide(module)
    scale = d.scaling if scaling is None else float(scaling)
    sinks = getattr(module, "sinks", None)
    b, h, s, _ = query.shape
    s_kv = key.shape[2]
    visible = _visible(attention_mask, b, s, s_kv, query.device, d.causal)  # [B, S, S_kv] as transformers masks it
    kernel = (d.prefill_kernel if s > 1 else d.decode_kernel) if _on_gpu(query) else None
    if kernel is not None:
        return torch.ops.attngate.plain_kernel_attention(query, key, value, visible, attention_mask, sinks, id(module), kernel,
                                                         scale), None
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
        _chunk_extents(visible, visible.any(-1), d)  # the mask chunks as the plan says
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


# an opaque op to torch.compile (as vLLM registers its attention): the varlen lengths live on the host and a kernel
# package's Python is no graph's, so a compiled model keeps one graph around it rather than breaking at every layer
@torch.library.custom_op("attngate::plain_kernel_attention", mutates_args=())
def _kernel_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, visible: torch.Tensor,
                      attention_mask: Optional[torch.Tensor], sinks: Optional[torch.Tensor], module_id: int, kernel: str,
                      scale: float) -> torch.Tensor:
    """The call on the GPU kernel ``kernel`` ("fa" or "flashinfer") for the attention module ``module_id`` (its
    decisions as kept), over the batch unpadded into varlen rows: ``[B, S, H, Dv]``, zeros at padding queries.
    ``attention_mask``, transformers' (``visible`` is made from it), names the batch's layout: every layer it reaches
    shares one unpadding."""
    d = _DECISIONS[module_id]
    rows = _unpad(query, key, value, visible, d, attention_mask)
    run = _fa_varlen if kernel == "fa" else _flashinfer_ragged
    out = run(d, rows, scale=scale, sinks=sinks)
    return rows.pad_back(out, query, value)


@_kernel_attention.register_fake
def _(query, key, value, visible, attention_mask, sinks, module_id, kernel, scale) -> torch.Tensor:
    b, h, s, _ = query.shape
    return query.new_empty(b, s, h, value.shape[-1])


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
        raise BatchMetadataError(Problem(type(module).__name__, "an attention module without a layer_idx: attngate cannot "
                                                               "tell which of the plan's layers it is"))
    try:
        return model.attention_position(idx)
    except ValueError as err:
        raise BatchMetadataError(Problem(type(module).__name__, str(err))) from None


def _on_gpu(t: torch.Tensor) -> bool:
    return t.is_cuda


def _kernel_of(resolution: Resolution, backend: str) -> str | None:
    """Which kernel runs a phase on ``backend`` on a GPU: ``"fa"`` (FA4's varlen kernel, where the plan runs FA
    through flash_attn.cute), ``"flashinfer"`` (its ragged prefill wrapper), or None (float32 torch: a provider
    this path does not call)."""
    plan = resolution.plan
    if backend in ("fa3", "fa4") and plan.flashattention.provider == "flash_attn.cute":
        return "fa"
    return "flashinfer" if backend == "flashinfer" else None


@dataclass
class _Rows:
    """A padded batch unpadded into varlen rows: each row's valid keys are contiguous and its valid queries
    are its last positions (left padding, transformers' dynamic and static caches)."""

    q: torch.Tensor  # [total_q, H, D]
    k: torch.Tensor  # [total_k, H_kv, D]
    v: torch.Tensor  # [total_k, H_kv, Dv]
    q_at: tuple[torch.Tensor, torch.Tensor]  # [total_q] int64 each: the request and position of each valid query
    lens: torch.Tensor  # [2, B] int32 on the host: valid queries, valid keys per row

    @property
    def cu_seqlens(self) -> tuple[torch.Tensor, torch.Tensor]:
        """cu_seqlens_q, cu_seqlens_k: ``[B + 1]`` int32 on the host."""
        cu = torch.nn.functional.pad(torch.cumsum(self.lens, 1, dtype=torch.int32), (1, 0))
        return cu[0], cu[1]

    def pad_back(self, out: torch.Tensor, query: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """``[total_q, H, Dv]`` -> ``[B, S, H, Dv]``, zeros at padding queries (transformers ignores them)."""
        padded = out.new_zeros(query.shape[0], query.shape[2], query.shape[1], value.shape[-1])
        padded[self.q_at] = out
        return padded


def _unpad(query, key, value, visible: torch.Tensor, layer: _LayerDecisions, attention_mask: torch.Tensor | None = None) -> _Rows:
    """Varlen rows from transformers' mask ``visible: [B, S, S_kv]``: one per request (its valid queries over its
    valid keys), where each valid position is found once per ``attention_mask`` (see :func:`_valid_positions`); on a
    chunked-local layer one per request and chunk; on a cross-attention layer one per run of a request's queries that
    see the same keys (host syncs at every call)."""
    if layer.attention_chunk_size:
        return _chunk_rows(query, key, value, visible, visible.any(-1), layer)  # padding queries see nothing
    if layer.kind == LayerKind.CROSS_ATTENTION:
        return _key_set_rows(query, key, value, visible, visible.any(-1))
    at = _valid_positions(visible, attention_mask, layer.causal)
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    return _Rows(q[at.q], k[at.k], v[at.k], at.q, at.lens)


@dataclass(frozen=True)
class _ValidPositions:
    """Where a padded batch's valid queries and keys sit: (request, position) index pairs, ``[total]`` int64 each."""

    q: tuple[torch.Tensor, torch.Tensor]
    k: tuple[torch.Tensor, torch.Tensor]
    lens: torch.Tensor  # [2, B] int32 on the host


# the valid positions of the masks of the forwards in flight: transformers hands every layer of a forward the same mask
# object (one per layer type), so its host syncs are paid once per forward, not at every layer
_VALID: dict[tuple, _ValidPositions] = {}


def _valid_positions(visible: torch.Tensor, attention_mask: torch.Tensor | None, causal: bool) -> _ValidPositions:
    """The valid positions of ``visible: [B, S, S_kv]``, made from ``attention_mask`` (kept while the mask lives and is
    not edited), or without one from the shape alone (causal, or every key). One host sync where not kept."""
    # the mask's version counter too: an in-place edit (a caller's own 4D mask, reused) is another layout
    mask_key = None if attention_mask is None else (id(attention_mask), attention_mask._version)
    key = (mask_key, causal, *visible.shape, visible.device)
    if key in _VALID:
        return _VALID[key]
    q_valid, kv_valid = visible.any(-1), visible.any(1)
    lens = torch.stack([q_valid.sum(1), kv_valid.sum(1)]).to(torch.int32).cpu()
    found = _ValidPositions(q_valid.nonzero(as_tuple=True), kv_valid.nonzero(as_tuple=True), lens)
    if attention_mask is not None:
        weakref.finalize(attention_mask, _VALID.pop, key, None)
    elif sum(k[0] is None for k in _VALID) >= 64:  # shapes alone: a decode grows S_kv every step
        for stale in [k for k in _VALID if k[0] is None]:
            del _VALID[stale]
    _VALID[key] = found
    return found


def _chunk_rows(query, key, value, visible: torch.Tensor, q_valid: torch.Tensor, layer: _LayerDecisions) -> _Rows:
    """Chunked local attention (SGLang's local virtual batches): the queries of a request that share a chunk (the
    same first visible key) form one row over the keys from that chunk's first one to the row's last query, so
    that causal bottom-right alignment within the row is the chunk's mask."""
    row, first, last = _chunk_extents(visible, q_valid, layer)
    _, q_lens = torch.unique_consecutive(row * visible.shape[-1] + first, return_counts=True)
    ends = q_lens.cumsum(0) - 1  # each chunk row's last query
    k_lens = last[ends] - first[ends] + 1
    k_rows = torch.repeat_interleave(row[ends], k_lens)
    k_cols = torch.arange(int(k_lens.sum())) - torch.repeat_interleave(k_lens.cumsum(0) - k_lens - first[ends], k_lens)
    return _gathered_rows(query, key, value, q_valid, q_lens, k_lens, k_rows, k_cols)


def _key_set_rows(query, key, value, visible: torch.Tensor, q_valid: torch.Tensor) -> _Rows:
    """Cross attention: each run of consecutive queries of a request that see the same keys (the text after one
    image, say) forms one non-causal row over exactly those keys."""
    rows = _request_of(q_valid)
    seen = visible[q_valid]  # [total_q, S_kv], queries in order
    starts = torch.ones(rows.shape[0], dtype=torch.bool, device=visible.device)
    starts[1:] = (rows[1:] != rows[:-1]) | (seen[1:] != seen[:-1]).any(-1)
    firsts = starts.nonzero()[:, 0]
    group, k_cols = seen[firsts].nonzero(as_tuple=True)  # each run's keys, run by run
    q_lens = torch.diff(firsts, append=firsts.new_tensor([rows.shape[0]]))
    return _gathered_rows(query, key, value, q_valid, q_lens.cpu(), seen[firsts].sum(-1).cpu(), rows[firsts][group], k_cols)


def _request_of(q_valid: torch.Tensor) -> torch.Tensor:
    """``[total_q]`` int64: the request (batch row) of each valid query, in row-major order."""
    b, s = q_valid.shape
    return torch.arange(b, device=q_valid.device)[:, None].expand(b, s)[q_valid]


def _gathered_rows(query, key, value, q_valid: torch.Tensor, q_lens: torch.Tensor, k_lens: torch.Tensor,
                   k_rows: torch.Tensor, k_cols: torch.Tensor) -> _Rows:
    """Rows of ``q_lens`` consecutive valid queries each over the keys ``key[k_rows, :, k_cols]``, row after row
    (lengths on the host, indices on either side)."""
    k_rows, k_cols = k_rows.to(key.device, non_blocking=True), k_cols.to(key.device, non_blocking=True)
    k, v = key.transpose(1, 2)[k_rows, k_cols], value.transpose(1, 2)[k_rows, k_cols]
    q_at = q_valid.nonzero(as_tuple=True)
    return _Rows(query.transpose(1, 2)[q_at], k, v, q_at, torch.stack([q_lens, k_lens]).to(torch.int32))


def _chunk_extents(visible: torch.Tensor, q_valid: torch.Tensor, layer: _LayerDecisions) -> torch.Tensor:
    """``[3, total_q]`` int64 on the host (one sync), per valid query in row-major order: its row, first and last
    visible key. Raises BatchMetadataError naming the layer where the mask shows a query keys that are not one
    range, or more of them than the plan's attention_chunk_size."""
    s_kv = visible.shape[-1]
    j = torch.arange(s_kv, device=visible.device)
    first, last = torch.where(visible, j, s_kv).amin(-1), torch.where(visible, j, -1).amax(-1)
    row, first, last, count = torch.stack([_request_of(q_valid), first[q_valid], last[q_valid], visible.sum(-1)[q_valid]]).cpu()
    span, where, problems = last - first + 1, f"layer {layer.layer_id}", []
    if bool((span != count).any()):
        problems.append(Problem(where, "transformers' mask shows a query keys that are not one range; a chunked-local "
                                       "layer attends to the keys of one chunk up to the query"))
    if span.numel() and int(span.max()) > layer.attention_chunk_size:
        problems.append(Problem(where, f"transformers' mask shows a query {int(span.max())} keys, more than the plan's "
                                       f"attention_chunk_size {layer.attention_chunk_size}: the model does not chunk this "
                                       "layer as the plan says"))
    if problems:
        raise BatchMetadataError(problems)
    return torch.stack([row, first, last])


def _fa_varlen(d: _LayerDecisions, rows: _Rows, *, scale: float, sinks) -> torch.Tensor:
    """One varlen call of FA4 over the rows, with the layer's causality, window and soft-cap."""
    causal, window = d.causal, d.window
    varlen = importlib.import_module("flash_attn.cute").flash_attn_varlen_func
    cu_q, cu_k = (cu.to(rows.q.device, non_blocking=True) for cu in rows.cu_seqlens)
    out = varlen(rows.q, rows.k, rows.v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=int(rows.lens[0].max()),
                 max_seqlen_k=int(rows.lens[1].max()), softmax_scale=scale, causal=causal,
                 window_size=(window, 0 if causal else window) if window is not None else (None, None),
                 learnable_sink=None if sinks is None else sinks.float(), softcap=d.logit_cap)
    return out[0] if isinstance(out, tuple) else out


# FlashInfer ragged wrappers per (device, layer spec), each re-planned only when the batch's lengths change, so
# all layers of one forward share one plan() (two with alternating windows)
_RAGGED: dict[tuple, list] = {}
_WORKSPACES: dict[torch.device, torch.Tensor] = {}


def _flashinfer_ragged(d: _LayerDecisions, rows: _Rows, *, scale: float, sinks) -> torch.Tensor:
    """FlashInfer's ragged prefill wrapper over the rows (prefill and decode: bottom-right causal), in the
    plan's kernel family (``flashinfer.prefill_kernel_family``)."""
    if sinks is not None:  # the plan refuses FlashInfer for sinks (flashinfer.no-attention-sinks); a config edited since
        raise ValueError("FlashInfer runs no learned attention sinks; configure() the model again with another attention_backend")
    fi, family = importlib.import_module("flashinfer"), d.prefill_kernel_family
    causal, window, softcap = d.causal, d.window, d.logit_cap
    heads, (kv_heads, head_dim), head_dim_vo = rows.q.shape[1], rows.k.shape[1:], rows.v.shape[-1]
    spec = (rows.q.device, family, causal, window, softcap, scale, heads, kv_heads, head_dim, head_dim_vo, rows.q.dtype)
    if spec not in _RAGGED:
        if rows.q.device not in _WORKSPACES:  # one float workspace per device, shared as the backends share theirs
            _WORKSPACES[rows.q.device] = torch.empty(d.workspace_size_mb << 20, dtype=torch.uint8, device=rows.q.device)
        _RAGGED[spec] = [fi.BatchPrefillWithRaggedKVCacheWrapper(_WORKSPACES[rows.q.device], "NHD", backend=family), None]
    entry = _RAGGED[spec]
    wrapper, planned = entry
    if planned is None or not torch.equal(planned, rows.lens):
        cu_q, cu_k = rows.cu_seqlens
        wrapper.plan(cu_q, cu_k, heads, kv_heads, head_dim, head_dim_vo=head_dim_vo, causal=causal, sm_scale=scale,
                     window_left=-1 if window is None else window, logits_soft_cap=softcap or None,
                     q_data_type=rows.q.dtype, kv_data_type=rows.k.dtype)
        entry[1] = rows.lens
    return wrapper.run(rows.q, rows.k, rows.v)


def _visible(attention_mask: torch.Tensor | None, b: int, s: int, s_kv: int, device, causal: bool) -> torch.Tensor:
    if attention_mask is None and not causal:  # an unpadded encoder batch, or cross attention over every encoder token
        return torch.ones(b, s, s_kv, dtype=torch.bool, device=device)
    if attention_mask is None:  # transformers passes none for an unpadded causal batch: causal, bottom-right
        return (torch.arange(s_kv, device=device)[None, :] <= torch.arange(s, device=device)[:, None] + (s_kv - s)).expand(b, s, s_kv)
    mask = attention_mask[:, 0, :, :s_kv]
    visible = mask if mask.dtype == torch.bool else mask == 0
    return visible.expand(b, s, s_kv)
