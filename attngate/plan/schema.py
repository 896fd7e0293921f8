"""The Plan: every attention decision, resolved once at start-up, frozen, typed and fingerprinted.

Gates are grouped by consumer (``plan.fa``, ``plan.flashinfer``, ``plan.common``: the same names as the rules' gate prefixes) and by
scope: *global* gates hold for the whole server; *mode* gates form one table per forward mode
(``plan.mode(ForwardMode.DECODE)``); *layer* gates one table per layer kind
(``plan.layer(LayerKind.SLIDING_WINDOW)``). A rule names a gate as ``<group>.<field>``, e.g.
``fa.skip_kv_cache``; the gate's type and default come from the field below.
"""

# no `from __future__ import annotations`: pydantic would compile and evaluate each field's annotation string at
# import, a few ms of a cold `attngate explain` over the models of this module (issue 53 item 9)

import hashlib
import json
from typing import Any, ClassVar, Literal, Optional

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    computed_field,
)

from attngate.errors import PlanLoadError, Problem, UsageError, check_arguments
from attngate.facts.choices import AttentionBackendName, KvCacheDtype
from attngate.facts.modes import ForwardMode, LayerKind
from attngate.util.suggest import suggestion
from attngate.util.validated import ValidatedModel


def gate(default: Any, doc: str, *, from_fact: str | None = None, ge: int | None = None, le: int | None = None) -> Any:
    """Declare a gate: its default, what it means, (``from_fact``) a fact that supplies the default, and the domain
    of a number (``ge``/``le``, inclusive): a rule setting a value outside it does not load, a plan holding one does
    not validate."""
    extra = {"from_fact": from_fact} if from_fact else None
    return Field(default, description=doc, json_schema_extra=extra, ge=ge, le=le)


class _Group(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    #: the backends that read this group's gates (``attention_backend`` names); empty: every backend
    read_by: ClassVar[tuple[str, ...]] = ()


class _FaGroup(_Group):
    read_by: ClassVar[tuple[str, ...]] = ("fa3", "fa4")


class _FlashInferGroup(_Group):
    read_by: ClassVar[tuple[str, ...]] = ("flashinfer",)


#: upper bounds of the numeric gates, as ServerArgs and the config reader bound what they come from: a token count
#: (ServerArgs.context_length), a page (ServerArgs.page_size), ranks (ServerArgs.tp_size), heads (facts.hf_schema)
_TOKENS, _PAGE, _RANKS, _HEADS = 1 << 40, 1 << 16, 1 << 16, 1 << 16

KvExtent = Literal["prefix_plus_new", "prefix", "none"]
MlaForm = Literal["absorbed", "non_absorbed", "non_absorbed_without_prefix"]


# ---- global gates --------------------------------------------------------------------------------


class FlashAttentionGates(_FaGroup):
    """Read by the FA3/FA4 backend."""

    skip_kv_cache: bool = gate(
        False,
        "Embedding fast path: attend on the raw K/V; neither write nor read the paged cache. One value for both sides.",
    )
    precompute_scheduler_metadata: bool = gate(
        True, "Compute FA3 scheduler_metadata once per decode batch (and at CUDA-graph capture/replay)."
    )
    num_splits: int = gate(
        0, "split-KV count passed to every FA call; 0 = the kernel chooses (FA3 refuses more than 256).", ge=0, le=256
    )
    decode_fixed_split_keys: Optional[int] = gate(
        None,
        "keys (tokens) per piece where attngate cuts a decode request's keys into kernel rows itself (FA4 on SM90, "
        "which has no split-KV; the plain transformers path); None = pieces sized to fill the GPU for the batch.",
        ge=1,
        le=_TOKENS,
    )
    provider: Literal["flash_attn.cute", "flash_attn_interface"] = gate(
        "flash_attn.cute",
        "The FlashAttention package the backend calls: FA4 (flash_attn.cute) or FA3 (flash_attn_interface).",
    )


class FlashInferGates(_FlashInferGroup):
    """Read by the FlashInfer backend; every wrapper kind (single, sliding window, cross attention) takes the split settings."""

    wrapper_dispatch: Literal["single", "sliding_window", "cross_attention"] = gate(
        "single", "Wrapper sets: one, or two split by sliding-window vs full layers, or by self vs cross attention."
    )
    use_ragged_prefill: bool = gate(
        True,
        "EXTEND: new tokens through the ragged wrapper, cached prefix through the paged wrapper, merged with merge_state.",
    )
    prefill_fixed_split_size: Optional[int] = gate(
        None, "fixed_split_size (tokens) of every prefill plan; None = FlashInfer chooses.", ge=1, le=_TOKENS
    )
    decode_fixed_split_size: Optional[int] = gate(
        None, "fixed_split_size (tokens) of every eager decode plan; None = FlashInfer chooses.", ge=1, le=_TOKENS
    )
    cuda_graph_disable_split_kv: bool = gate(False, "disable_split_kv of every CUDA-graph decode plan.")
    decode_use_tensor_cores: bool = gate(False, "use_tensor_cores of every decode wrapper.")
    workspace_size_mb: int = gate(
        384, "float workspace buffer, MiB (at most 1 TiB: more than any GPU holds).", ge=1, le=1 << 20
    )
    prefill_kernel_family: Literal["fa2", "fa3"] = gate(
        "fa2", "Kernel family of the prefill (ragged and paged) wrappers."
    )
    mla_kernel_family: Literal["fa2", "fa3"] = gate(
        "fa2", "Kernel family of BatchMLAPagedAttentionWrapper (absorbed MLA)."
    )
    multi_item_scoring: bool = gate(
        False,
        "EXTEND scores several items per request: item masks from delimiter tokens replace the causal mask (SGLang's MultiItemScoringParams). attngate's FlashInfer backend does not implement it and refuses such a plan.",
    )
    decode_kernel_family: Literal["fa2"] = gate(
        "fa2",
        "Kernel family of every decode wrapper: fa2 (the CUDA-core decode kernel, or the fa2 prefill kernel under decode_use_tensor_cores). Never FlashInfer's 'auto', which probes for cuDNN on every plan().",
    )
    eager_decode_replan: Literal["plan", "fast_decode_plan"] = gate(
        "plan",
        "How an eager decode wrapper is re-planned after its first plan(): plan(), or flashinfer.fast_decode_plan handed the device kv_indptr and kv_last_page_len that the page-id build copies anyway. fast_decode_plan reads kv_last_page_len on the host under tensor-core decode unless page_size is 1, a device-to-host sync, so only there or without tensor cores.",
    )
    graph_decode_replan: Literal["plan", "fast_decode_plan"] = gate(
        "plan",
        "How a captured CUDA-graph decode wrapper is re-planned before each replay: FlashInfer's plan(), or flashinfer.fast_decode_plan (the backend fills the graph's static kv_indptr and kv_last_page_len in one copy; FlashInfer keeps the kernel module of the capture's plan() and copies nothing).",
    )


class CommonGates(_Group):
    """Read by every backend."""

    page_size: int = gate(1, "tokens per KV page", from_fact="page_size", ge=1, le=_PAGE)
    attn_tp_size: int = gate(
        1,
        "ranks one attention layer's heads are split over (attention TP)",
        from_fact="attn_tp_size",
        ge=1,
        le=_RANKS,
    )
    num_q_heads_per_rank: int = gate(
        1,
        "query heads of one attention TP rank: what a backend's layers carry",
        from_fact="num_q_heads_per_rank",
        ge=1,
        le=_HEADS,
    )
    num_kv_heads_per_rank: int = gate(
        1,
        "KV heads of one rank (replicated beyond the model's KV heads)",
        from_fact="num_kv_heads_per_rank",
        ge=1,
        le=_HEADS,
    )
    swa_num_q_heads_per_rank: int = gate(
        1,
        "query heads of one attention TP rank in a sliding-window layer (its own where the config gives swa_* keys)",
        from_fact="swa_num_q_heads_per_rank",
        ge=1,
        le=_HEADS,
    )
    swa_num_kv_heads_per_rank: int = gate(
        1,
        "KV heads of one rank in a sliding-window layer (replicated beyond the layer's KV heads)",
        from_fact="swa_num_kv_heads_per_rank",
        ge=1,
        le=_HEADS,
    )
    kv_cache_dtype: KvCacheDtype = gate(
        "auto", "KV cache storage dtype (ServerArgs' choices)", from_fact="kv_cache_dtype"
    )
    cuda_graph: bool = gate(True, "CUDA graphs are captured at all.")
    mla_chunked_prefix_cache: bool = gate(
        True, "MLA prefill attends to the cached prefix in chunks (MHA over decompressed KV)."
    )
    unified_kv_pool: bool = gate(
        False,
        "SGLang's unified memory pool: page ids are read through its index translator. attngate's backends read their own pool's ids and refuse such a plan.",
        from_fact="enable_unified_memory",
    )


# ---- per-forward-mode gates ----------------------------------------------------------------------


class FlashAttentionModeGates(_FaGroup):
    kv_extent: KvExtent = gate(
        "prefix_plus_new", "What seqused_k / cache_seqlens cover, in eager runs and CUDA-graph replay alike."
    )


class FlashInferModeGates(_FlashInferGroup):
    paged_kv_extent: KvExtent = gate("prefix_plus_new", "What the paged wrapper's kv_indptr covers.")


class CommonModeGates(_Group):
    capture_cuda_graph: bool = gate(False, "This mode is captured and replayed as a CUDA graph.")
    mla_form: MlaForm = gate(
        "absorbed",
        "How MLA layers attend in this mode: absorbed (q_nope absorbed into the latent, attention over the "
        "latent cache ckv ++ kpe), non_absorbed (K/V decompressed from the latent for prefix and new tokens, "
        "q/k head dim qk_nope+qk_rope, v head dim v_head_dim), or non_absorbed_without_prefix (non-absorbed "
        "for a batch without cached prefix, else absorbed). The latent is written before attention in every form.",
    )
    tree_mask: bool = gate(
        False,
        "The draft tokens of this mode form a speculative tree (speculative_eagle_topk > 1): each attends to the "
        "cached prefix and to its ancestors in the tree (ForwardBatch.spec_tree_mask), not to every earlier draft token.",
    )
    runs_on: Literal["prefill", "decode"] = gate(
        "prefill",
        "Which of the plan's two backends runs this mode where they differ: "
        "prefill_backend or decode_backend (SGLang's HybridAttnBackend). Plan.backend_for(mode) names it.",
    )


class ModeGates(_Group):
    """The gates of one forward mode."""

    fa: FlashAttentionModeGates = FlashAttentionModeGates()
    flashinfer: FlashInferModeGates = FlashInferModeGates()
    common: CommonModeGates = CommonModeGates()


# ---- per-layer-kind gates ------------------------------------------------------------------------


class FlashInferLayerGates(_FlashInferGroup):
    wrapper_index: int = gate(
        0, "Which wrapper of the set (of at most two) a layer of this kind runs through.", ge=0, le=1
    )


class CommonLayerGates(_Group):
    causal: bool = gate(True, "Queries attend only to earlier positions.")
    use_window: bool = gate(
        False,
        "The layer's sliding window (window_left) applies; every pass over the layer (ragged and paged) receives it.",
    )
    write_kv_cache: bool = gate(True, "The layer's K/V are written to the paged cache.")


class LayerGates(_Group):
    """The gates of one layer kind."""

    flashinfer: FlashInferLayerGates = FlashInferLayerGates()
    common: CommonLayerGates = CommonLayerGates()


def _table(name: str, keys: list[str], row: type[BaseModel]) -> type[BaseModel]:
    fields = {k: (row, row()) for k in keys}
    from pydantic import create_model

    return create_model(name, __base__=_Group, **fields)  # type: ignore[call-overload]


ModeTable = _table("ModeTable", [m.value for m in ForwardMode], ModeGates)
LayerTable = _table("LayerTable", [k.value for k in LayerKind], LayerGates)


def _member(enum: type[ForwardMode] | type[LayerKind], value: object, parameter: str) -> Any:
    try:
        return enum(value)
    except ValueError:
        names = [m.value for m in enum]
        raise UsageError(
            Problem(
                parameter,
                f"no {enum.__name__} {value!r}; one of {', '.join(names)}",
                help=suggestion(str(value), names),
                code="usage.unknown-enum-value",
            )
        ) from None


class Plan(ValidatedModel):
    """The resolved attention plan. Backends read it and nothing else.

    ``fingerprint`` (sha256 of the canonical JSON) lets every rank of a distributed server check
    that it resolved the same plan. ``model_copy(update=...)`` validates (PlanLoadError).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    error = PlanLoadError
    _sealed: str = PrivateAttr("")

    prefill_backend: AttentionBackendName
    decode_backend: AttentionBackendName
    fa: FlashAttentionGates = FlashAttentionGates()
    flashinfer: FlashInferGates = FlashInferGates()
    common: CommonGates = CommonGates()
    modes: ModeTable = ModeTable()  # type: ignore[valid-type]
    layers: LayerTable = LayerTable()  # type: ignore[valid-type]

    def mode(self, mode: ForwardMode | str) -> ModeGates:
        """The gates of one forward mode (a ForwardMode or its value, e.g. ``"decode"``); UsageError for none such."""
        return getattr(self.modes, _member(ForwardMode, mode, "mode").value)

    def backend_for(self, mode: ForwardMode | str) -> AttentionBackendName:
        """The backend that runs forward mode ``mode``: ``decode_backend`` where the mode's ``common.runs_on`` is
        "decode", else ``prefill_backend``. UsageError for a mode that does not exist."""
        return self.decode_backend if self.mode(mode).common.runs_on == "decode" else self.prefill_backend

    def heads_per_rank(self, kind: LayerKind | str) -> tuple[int, int]:
        """(query heads, KV heads) one attention TP rank holds in a layer of ``kind``: ``common.swa_num_*_per_rank``
        for sliding-window layers, else ``common.num_*_per_rank``. UsageError for no LayerKind."""
        if _member(LayerKind, kind, "kind") == LayerKind.SLIDING_WINDOW:
            return self.common.swa_num_q_heads_per_rank, self.common.swa_num_kv_heads_per_rank
        return self.common.num_q_heads_per_rank, self.common.num_kv_heads_per_rank

    def layer(self, kind: LayerKind | str) -> LayerGates:
        """The gates of one layer kind (a LayerKind or its value, e.g. ``"sliding_window"``); UsageError for none such."""
        return getattr(self.layers, _member(LayerKind, kind, "kind").value)

    def model_post_init(self, context: Any) -> None:
        self._sealed = self.fingerprint  # what the plan held when it was validated

    def check_intact(self) -> None:
        """PlanLoadError if the plan was changed after validation (``object.__setattr__``, ``__dict__``):
        pydantic's frozen models refuse only plain attribute assignment."""
        if self.fingerprint != self._sealed:
            raise PlanLoadError(
                Problem(
                    "plan",
                    "changed after it was validated; resolve() or Plan.from_json() a new one",
                    code="plan-load.edited",
                )
            )

    def canonical_json(self) -> str:
        body = self.model_dump(mode="json", exclude={"fingerprint"})
        return json.dumps(body, sort_keys=True, separators=(",", ":"))

    @computed_field  # type: ignore[prop-decorator]
    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    def to_json(self, indent: int | None = 2) -> str:
        return self.model_dump_json(indent=indent)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        """Load a plan from its JSON text, only whole and only as a resolution wrote it (attngate.plan.load): every
        key present at every depth and no other, no key twice in one object, every gate inside its domain, and a
        ``fingerprint`` of 64 hex digits equal to the sha256 of the content. Raises PlanLoadError listing every
        problem with its JSON path; UsageError for ``text`` that is no string."""
        from attngate.plan.load import load_plan  # it reads this module's models

        check_arguments(("text", text, str, "the plan's JSON text, as Plan.to_json() writes it"))
        return load_plan(cls, text)
