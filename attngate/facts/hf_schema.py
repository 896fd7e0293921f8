"""The Hugging Face ``config.json`` keys the rules read, as typed models, one per concern.

Each model is strict (no bool where an integer goes, no ``"false"`` where a switch goes, no float where a count goes),
ignores the keys it does not concern, and bounds every number from below by what the key means and from above by
what no released model comes near (a config beyond one is corrupt, and nothing gets sized by it). An explicit
``null`` means the key's default, as transformers reads it; attngate.facts.hf_config drops nulls before
validation. ``requirements`` on a model states what one key needs of another, each problem with the key it is
about; ``problems`` turns a pydantic ValidationError into attngate's Problems with their key paths.

Sources: transformers' config classes (LlamaConfig, Qwen2Config, Gemma2/3Config, Llama4TextConfig, MllamaConfig,
WhisperConfig, NemotronHConfig, DeepseekV2/V3Config) for the names, defaults and meanings; SGLang 0.5.23
``srt/configs/model_config.py`` for how it reads them (cited at each key where it differs from presence).
"""

# no `from __future__ import annotations`: pydantic would compile and evaluate each field's annotation string at
# import, a few ms of a cold `attngate explain` over the models of this module (issue 53 item 9)

from typing import Annotated, Any, Iterator, Literal, Optional, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from attngate.errors import Problem

_LAYERS, _HEADS, _DIMS, _HIDDEN, _TOKENS = 4096, 65536, 65536, 1 << 20, 1 << 40

Layers = Annotated[int, Field(ge=1, le=_LAYERS, description="a positive integer")]
Heads = Annotated[int, Field(ge=1, le=_HEADS, description="a positive integer")]
Dim = Annotated[int, Field(ge=1, le=_DIMS, description="a positive integer (elements)")]
Hidden = Annotated[int, Field(ge=1, le=_HIDDEN, description="a positive integer (elements)")]
Tokens = Annotated[int, Field(ge=1, le=_TOKENS, description="a positive integer (tokens)")]
#: a scale or a soft-cap: a soft-cap of 0 divides by zero in tanh(x / cap), a negative scale makes the scale complex
Positive = Annotated[
    float,
    Field(gt=0, le=1e9, allow_inf_nan=False, description="a finite number above 0 (or null for none)"),
]


def _false_only(value: bool) -> bool:
    if value:
        raise ValueError("true names no config")
    return value


#: a tower or feature sub-config: an object, or null / false for none (a bare true, 0 or "" is no config)
SubConfig = Union[dict[str, Any], Annotated[bool, AfterValidator(_false_only)]]

LAYER_TYPES = (
    "full_attention",
    "attention",  # GraniteMoeHybrid
    "sliding_attention",
    "chunked_attention",
    # hybrid models' layers without softmax attention (Qwen3-Next / Qwen3.5, LFM2, GraniteMoeHybrid): no KV cache
    "linear_attention",
    "conv",
    "mamba",
    "mamba2",
)


class Concern(BaseModel):
    """One concern's keys of a config mapping: strict types, unknown keys ignored."""

    # each concern's validator is built on its first config (a decoder-only model never needs EncoderDecoderShape's)
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True, defer_build=True)

    def requirements(self) -> Iterator[tuple[str, str]]:
        """(key, message) for each requirement one key puts on another that this config breaks."""
        return iter(())


class ModelLevel(Concern):
    """Keys of the whole model, read at the top level of config.json whatever its language-model stack."""

    architectures: list[str] = Field(default=[], description="a list of strings")
    model_type: str = Field(min_length=1, description="a model type name")
    is_encoder_decoder: bool = Field(default=False, description="true or false")
    # a tower is an object; null or false means none (SGLang 0.5.23 model_config.py l.804-815 tests hasattr, which a
    # null tower would pass; attngate reads the value)
    vision_config: Optional[SubConfig] = Field(default=None, description="an object (or null / false for none)")
    audio_config: Optional[SubConfig] = Field(default=None, description="an object (or null / false for none)")


class AttentionShape(Concern):
    """Heads and head size of a decoder-only language model (LlamaConfig's names).

    ``num_key_value_heads`` null: as many as query heads (MHA, SGLang model_config.py's fallback);
    ``head_dim`` null: ``hidden_size // num_attention_heads``, as transformers derives it; ``v_head_dim`` null: the
    head dim (an MHA model's V rows may be narrower, MiMo-V2's 128 beside 192: SGLang 0.5.23 model_config.py l.1352).
    The ``swa_*`` keys give the sliding-window layers their own shape (SGLang 0.5.23 model_config.py l.1357-1365 and
    ``get_swa_num_kv_heads`` l.1713, models/mimo_v2.py l.192-204): each absent key is the model's value, except
    ``swa_v_head_dim``, which defaults to ``swa_head_dim`` as SGLang reads it."""

    num_hidden_layers: Layers
    num_attention_heads: Heads
    num_key_value_heads: Optional[Heads] = None
    head_dim: Optional[Dim] = None
    v_head_dim: Optional[Dim] = None
    hidden_size: Optional[Hidden] = None
    swa_num_attention_heads: Optional[Heads] = None
    swa_num_key_value_heads: Optional[Heads] = None
    swa_head_dim: Optional[Dim] = None
    swa_v_head_dim: Optional[Dim] = None

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    def derived_head_dim(self) -> int | None:
        return _head_dim(self.head_dim, self.hidden_size, self.num_attention_heads)

    def derived_v_head_dim(self) -> int | None:
        return self.v_head_dim or self.derived_head_dim()

    def swa_shape(self) -> tuple[int, int, int | None, int | None]:
        """(query heads, KV heads, head dim, V head dim) of the sliding-window layers: the ``swa_*`` keys, each absent
        one the model's (``swa_v_head_dim``: ``swa_head_dim`` where that is given, SGLang's default)."""
        head_dim = self.swa_head_dim or self.derived_head_dim()
        v_head_dim = self.swa_v_head_dim or self.swa_head_dim or self.derived_v_head_dim()
        return (
            self.swa_num_attention_heads or self.num_attention_heads,
            self.swa_num_key_value_heads or self.kv_heads,
            head_dim,
            v_head_dim,
        )

    def requirements(self) -> Iterator[tuple[str, str]]:
        heads = self.num_attention_heads
        if heads % self.kv_heads:
            yield "num_key_value_heads", f"{self.kv_heads} does not divide num_attention_heads={heads}"
        yield from _head_dim_problems(self.head_dim, self.hidden_size, "hidden_size", heads, "num_attention_heads")
        swa_heads, swa_kv_heads, _, _ = self.swa_shape()
        given = self.swa_num_attention_heads is not None or self.swa_num_key_value_heads is not None
        if given and swa_heads % swa_kv_heads:  # the model's own counts are checked above
            key = "swa_num_key_value_heads" if self.swa_num_key_value_heads else "swa_num_attention_heads"
            yield key, f"{swa_kv_heads} KV heads do not divide {swa_heads} query heads of the sliding-window layers"


class EncoderDecoderShape(Concern):
    """The two stacks of an encoder-decoder model (WhisperConfig / BartConfig names): encoder layers first, then each
    decoder layer's self and cross attention. The decoder's head count is the model's; the encoder's must equal it
    (attngate plans one head count per model; null means the decoder's)."""

    encoder_layers: Layers
    decoder_layers: Layers
    decoder_attention_heads: Heads
    encoder_attention_heads: Optional[Heads] = None
    d_model: Optional[Hidden] = None
    head_dim: Optional[Dim] = None

    def derived_head_dim(self) -> int | None:
        return _head_dim(self.head_dim, self.d_model, self.decoder_attention_heads)

    def derived_v_head_dim(self) -> int | None:
        return self.derived_head_dim()  # no key of its own: V rows as wide as K's

    def requirements(self) -> Iterator[tuple[str, str]]:
        heads, encoder = self.decoder_attention_heads, self.encoder_attention_heads
        if encoder is not None and encoder != heads:
            yield (
                "encoder_attention_heads",
                f"{encoder} differs from decoder_attention_heads={heads}; attngate plans one head count per model",
            )
        yield from _head_dim_problems(self.head_dim, self.d_model, "d_model", heads, "decoder_attention_heads")


def _head_dim(head_dim: int | None, hidden: int | None, heads: int) -> int | None:
    """``head_dim`` where given, else the hidden size split over the heads (transformers' derivation)."""
    return head_dim if head_dim is not None else (hidden // heads if hidden else None)


def _head_dim_problems(
    head_dim: int | None, hidden: int | None, hidden_key: str, heads: int, heads_key: str
) -> Iterator[tuple[str, str]]:
    if head_dim is None and hidden is None:
        yield "head_dim", f"missing, and cannot be derived without {hidden_key}"
    elif head_dim is None and hidden and hidden % heads:
        yield hidden_key, f"{hidden} is not divisible by {heads_key}={heads}; set head_dim"


class MlaRanks(Concern):
    """Multi-head latent attention (DeepseekV2Config): present where ``kv_lora_rank`` is (SGLang model_config.py
    reads MLA from the architecture and this key). ``index_topk``: DeepSeek Sparse Attention's indexer top-k, a
    count (SGLang 0.5.23 model_config.py l.211 ``is_deepseek_dsa``: ``index_topk is not None``; false or 0 is refused
    here rather than read as present)."""

    kv_lora_rank: Optional[Dim] = None
    qk_nope_head_dim: Optional[Dim] = None
    qk_rope_head_dim: Optional[Dim] = None
    v_head_dim: Optional[Dim] = None
    index_topk: Optional[Tokens] = None

    @property
    def head_dims(self) -> tuple[int, int]:
        """(qk head dim, v head dim) of the non-absorbed form: nope + rope, and v."""
        return (self.qk_nope_head_dim or 0) + (self.qk_rope_head_dim or 0), self.v_head_dim or 0

    def requirements(self) -> Iterator[tuple[str, str]]:
        if self.kv_lora_rank is not None:
            for key in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                if getattr(self, key) is None:
                    yield key, "missing (required with kv_lora_rank)"


class LogitScaling(Concern):
    """Soft-caps and the query scale (Gemma2/3Config); null means none."""

    attn_logit_softcapping: Optional[Positive] = None
    final_logit_softcapping: Optional[Positive] = None
    query_pre_attn_scalar: Optional[Positive] = None


class LayerLayout(Concern):
    """The keys that say which layers slide, chunk, cross-attend or hold no KV cache, and their sizes (tokens).

    Read by attngate.facts.hf_layout; each family's key is documented there. ``use_sliding_window`` false switches a
    configured window off (Qwen2Config); ``is_causal`` false makes every layer bidirectional (SGLang 0.5.23
    model_config.py l.648 sets it for its embedding models)."""

    sliding_window: Optional[Tokens] = None
    #: MiMo-V2's window key: SGLang 0.5.23's models/mimo_v2.py hands ``sliding_window_size`` to its window layers
    sliding_window_size: Optional[Tokens] = None
    use_sliding_window: Optional[bool] = Field(default=None, description="true or false")
    max_window_layers: Optional[Annotated[int, Field(ge=0, le=_LAYERS)]] = Field(
        default=None, description="an integer >= 0"
    )
    sliding_window_pattern: Optional[Union[Layers, Annotated[str, Field(pattern=r"^[LG]+$")]]] = Field(
        default=None, description="an integer or a string of 'L' (local) and 'G' (global)"
    )
    layer_types: Optional[list[Literal[LAYER_TYPES]]] = Field(default=None, description="a list of layer types")
    attention_chunk_size: Optional[Tokens] = None
    no_rope_layers: Optional[list[Union[bool, Annotated[int, Field(ge=0, le=1)]]]] = Field(
        default=None, description="a list of flags (0 or 1, one per layer)"
    )
    no_rope_layer_interval: Optional[Layers] = None
    hybrid_override_pattern: Optional[Annotated[str, Field(pattern=r"^[*M\-E]+$")]] = Field(
        default=None, description="a string of characters from '*M-E' ('*': attention)"
    )
    #: MiMo-V2 (and SGLang's generic hybrid fallback): 1 a sliding-window layer, 0 a full-attention layer
    hybrid_layer_pattern: Optional[list[Annotated[int, Field(ge=0, le=1, strict=True)]]] = Field(
        default=None, description="a list of 0 (full attention) and 1 (sliding window), one per layer"
    )
    cross_attention_layers: Optional[list[Annotated[int, Field(ge=0, le=_LAYERS)]]] = Field(
        default=None, description="a list of layer indices"
    )
    is_causal: Optional[bool] = Field(default=None, description="true or false")
    use_bidirectional_attention: Optional[bool] = Field(default=None, description="true or false")

    def per_layer_lengths(self, n: int) -> Iterator[tuple[str, str]]:
        """The per-layer keys must give one entry per model layer (``n`` = num_hidden_layers)."""
        for key, what in (
            ("layer_types", "layer types"),
            ("hybrid_override_pattern", "characters"),
            ("hybrid_layer_pattern", "flags"),
            ("no_rope_layers", "flags"),
        ):
            value = getattr(self, key)
            if value and len(value) != n:
                yield key, f"must give num_hidden_layers={n} {what}, got {len(value)}"
        if self.cross_attention_layers and max(self.cross_attention_layers) >= n:
            yield "cross_attention_layers", f"must list layer indices below num_hidden_layers={n}"


class LanguageFeatures(Concern):
    """Feature keys of the language model read by value: a sub-config is an object, null or false for none."""

    # Qwen2.5-1M ships an object (SGLang 0.5.23 model_config.py l.2174 tests hasattr only)
    dual_chunk_attention_config: Optional[SubConfig] = Field(
        default=None, description="an object (or null / false for none)"
    )
    max_position_embeddings: Optional[Tokens] = None
    torch_dtype: Optional[str] = Field(default=None, description='a dtype name such as "bfloat16"')
    # learned attention sinks (SGLang 0.5.23 model_config.py l.1273-1289 ``_detect_attention_sinks``): MiMo-V2's
    # per-layer-kind switches, and any other model's ``learnable_sink``; read by value, as SGLang's getattr reads them
    add_swa_attention_sink_bias: Optional[bool] = Field(default=None, description="true or false")
    add_full_attention_sink_bias: Optional[bool] = Field(default=None, description="true or false")
    learnable_sink: Optional[bool] = Field(default=None, description="true or false")


def problems(error: ValidationError, model: type[Concern], prefix: str, source: str) -> list[Problem]:
    """One Problem per key path of ``error`` (the first of a union's member errors), named ``source: prefix+key``."""
    found: dict[str, Problem] = {}
    for item in error.errors(include_url=False):
        key, *rest = item["loc"]
        path = prefix + str(key) + "".join(f"[{i}]" for i in rest if isinstance(i, int))
        if path not in found:
            found[path] = Problem(
                f"{source}: {path}", _message(item, model.model_fields.get(str(key))), code="model-config.invalid-value"
            )
    return list(found.values())


def _message(item: Any, field: Any) -> str:
    kind, got, ctx = item["type"], item["input"], item.get("ctx") or {}
    if kind == "missing":
        return "missing (required for attention)"
    if kind == "less_than_equal" and isinstance(got, int) and not isinstance(got, bool):
        return f"{got} is beyond any real model (at most {ctx['le']})"
    if kind == "literal_error":
        return f"unsupported value {got!r}; attngate knows {ctx['expected']}"
    described = field.description if field is not None and field.description else _described(field)
    return f"must be {described}, got {got!r}"


def _described(field: Any) -> str:
    for meta in getattr(field, "metadata", ()):
        if getattr(meta, "description", None):
            return meta.description
    inner = getattr(field, "annotation", None)
    for arg in getattr(inner, "__args__", ()):  # Optional[Annotated[..., Field(description=...)]]
        for meta in getattr(arg, "__metadata__", ()):
            if getattr(meta, "description", None):
                return meta.description
    return "a valid value"
