"""``ModelFacts``: the attention facts of a model, read from a Hugging Face ``config.json``
(attngate.facts.hf_config reads the file).

Source of the layouts: transformers' config classes (Gemma2 alternation, Gemma3
``sliding_window_pattern``, EXAONE 4's letter pattern, ``layer_types`` (hybrid models' included),
Qwen2 ``use_sliding_window``/``max_window_layers``, Llama-4 ``attention_chunk_size``/``no_rope_layers``,
Mllama ``cross_attention_layers``, NemotronH's ``hybrid_override_pattern``, Whisper's encoder-decoder
keys, Gemma3TextConfig's ``use_bidirectional_attention`` and the window it halves) and SGLang's ``ModelConfig`` (MLA where ``kv_lora_rank`` is present).
"""

# no `from __future__ import annotations`: pydantic would compile and evaluate each field's annotation string at
# import, a few ms of a cold `attngate explain` over the models of this module (issue 53 item 9)

from pathlib import Path
from typing import Any, Literal, NamedTuple, Optional

from pydantic import ConfigDict, model_validator

from attngate.errors import ModelConfigError, Problem, UsageError, check_arguments, quoted
from attngate.facts.hf_config import read_hf_config
from attngate.facts.modes import LayerKind
from attngate.util.inputs import is_directory, parse_json, read_text
from attngate.util.validated import ValidatedModel


class HeadShape(NamedTuple):
    """One layer kind's attention shape: query heads, KV heads, and the q·k and V head dims (elements)."""

    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    v_head_dim: int


class ModelFacts(ValidatedModel):
    """Attention facts of one model.

    Head dims are in elements; ``layer_kinds`` lists every attention layer in execution order
    (encoder layers first for an encoder-decoder model, then each decoder layer's self attention
    followed by its cross attention). A hybrid model's layers without softmax attention (linear
    attention, Mamba, short convolution) hold no KV cache and are not listed, so entry i is the
    model's i-th attention layer, as SGLang numbers the layers of a hybrid model's KV pool.

    The head counts and dims are the full-attention layers'; ``swa_shape`` gives the sliding-window layers their own
    where they differ (MiMo-V2: 64 / 8 heads beside 64 / 4), and :meth:`shape` is one layer kind's.
    """

    model_config = ConfigDict(frozen=True)
    error = ModelConfigError

    source: str
    architectures: tuple[str, ...]
    model_type: str
    attention_arch: Literal["mha", "mla"]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    v_head_dim: int
    #: the sliding-window layers' shape where it differs from the model's (config ``swa_*`` keys); None: the model's
    swa_shape: Optional[HeadShape] = None
    kv_lora_rank: Optional[int] = None
    qk_rope_head_dim: Optional[int] = None
    sliding_window: Optional[int] = None
    attention_chunk_size: Optional[int] = None
    layer_kinds: tuple[LayerKind, ...]
    #: the model layer index (transformers' ``layer_idx``) of each ``layer_kinds`` entry; None: entry i is layer i
    attention_layer_ids: Optional[tuple[int, ...]] = None
    is_encoder_decoder: bool = False
    is_multimodal: bool = False
    attn_logit_softcapping: Optional[float] = None
    final_logit_softcapping: Optional[float] = None
    query_pre_attn_scalar: Optional[float] = None
    has_attention_sinks: bool = False
    has_dual_chunk_attention: bool = False
    has_dsa_indexer: bool = False  # DeepSeek Sparse Attention: config has index_topk (DeepSeek-V3.2, GLM-5)
    #: decoder layers that attend both ways (EmbeddingGemma: Gemma3TextModel with use_bidirectional_attention): not
    #: causal, and a sliding-window layer's window reaches as far after a query as before it
    use_bidirectional_attention: bool = False
    max_position_embeddings: Optional[int] = None
    torch_dtype: Optional[str] = None

    @model_validator(mode="after")
    def _consistent(self) -> "ModelFacts":
        """What the config reader guarantees, for facts built directly (every problem at once)."""
        problems = []
        counts = {
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "v_head_dim": self.v_head_dim,
        }
        problems += [f"{name} must be positive, got {value}" for name, value in counts.items() if value <= 0]
        if self.num_key_value_heads > 0 and self.num_attention_heads % self.num_key_value_heads:
            problems.append(
                f"num_key_value_heads {self.num_key_value_heads} does not divide num_attention_heads {self.num_attention_heads}"
            )
        swa = self.swa_shape
        if swa is not None:
            problems += [
                f"swa_shape.{name} must be positive, got {value}" for name, value in swa._asdict().items() if value <= 0
            ]
            if min(swa) > 0 and swa.num_attention_heads % swa.num_key_value_heads:
                problems.append(
                    f"swa_shape.num_key_value_heads {swa.num_key_value_heads} does not divide its "
                    f"num_attention_heads {swa.num_attention_heads}"
                )
            if self.attention_arch == "mla":
                problems.append("swa_shape is for MHA models (MLA layers share one latent shape)")
        if (self.attention_arch == "mla") != (self.kv_lora_rank is not None):
            problems.append("kv_lora_rank is set exactly for attention_arch 'mla'")
        if self.attention_arch == "mla" and not self.qk_rope_head_dim:
            problems.append("MLA needs qk_rope_head_dim")
        if not self.layer_kinds:
            problems.append("layer_kinds must list at least one layer")
        ids = self.attention_layer_ids
        if ids is not None and (
            len(ids) != len(self.layer_kinds) or any(b <= a for a, b in zip(ids, ids[1:])) or min(ids, default=0) < 0
        ):
            problems.append(
                "attention_layer_ids must give one increasing, non-negative model layer index per entry of layer_kinds"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def attention_position(self, layer_idx: int) -> int:
        """The position in ``layer_kinds`` (and in the KV pool) of model layer ``layer_idx``. Raises ValueError
        for a layer without softmax attention or past the model (UsageError for a ``layer_idx`` that is no int)."""
        if not isinstance(layer_idx, int) or isinstance(layer_idx, bool):
            raise UsageError(
                Problem(
                    "layer_idx",
                    f"takes an int (a model layer's index), not {type(layer_idx).__name__}",
                    code="usage.argument-type",
                )
            )
        if self.attention_layer_ids is None:
            if 0 <= layer_idx < len(self.layer_kinds):
                return layer_idx
        elif layer_idx in self.attention_layer_ids:
            return self.attention_layer_ids.index(layer_idx)
        raise ValueError(
            f"{self.source}: model layer {layer_idx} is not one of its softmax-attention layers "
            f"({list(self.attention_layer_ids or range(len(self.layer_kinds)))})"
        )

    # ---- derived facts -------------------------------------------------------------------------

    def shape(self, kind: LayerKind) -> HeadShape:
        """The heads and head dims of ``kind``'s layers: ``swa_shape`` for sliding-window layers where the config gives
        one, else the model's. UsageError for a ``kind`` that is no LayerKind (or its value)."""
        try:
            kind = LayerKind(kind)
        except ValueError:
            raise UsageError(
                Problem(
                    "kind",
                    f"{quoted(kind)} is no layer kind; one of {', '.join(k.value for k in LayerKind)}",
                    code="usage.argument-value",
                )
            ) from None
        if kind == LayerKind.SLIDING_WINDOW and self.swa_shape is not None:
            return self.swa_shape
        return HeadShape(self.num_attention_heads, self.num_key_value_heads, self.head_dim, self.v_head_dim)

    @property
    def head_shapes(self) -> tuple[HeadShape, ...]:
        """The distinct shapes of the model's attention layers, in layer order."""
        return tuple(dict.fromkeys(self.shape(kind) for kind in self.layer_kinds))

    @property
    def swa_num_attention_heads(self) -> int:
        return self.shape(LayerKind.SLIDING_WINDOW).num_attention_heads

    @property
    def swa_num_key_value_heads(self) -> int:
        return self.shape(LayerKind.SLIDING_WINDOW).num_key_value_heads

    @property
    def swa_head_dim(self) -> int:
        return self.shape(LayerKind.SLIDING_WINDOW).head_dim

    @property
    def swa_v_head_dim(self) -> int:
        return self.shape(LayerKind.SLIDING_WINDOW).v_head_dim

    @property
    def architecture(self) -> str:
        return self.architectures[0] if self.architectures else ""

    @property
    def use_mla(self) -> bool:
        return self.attention_arch == "mla"

    @property
    def has_sliding_window(self) -> bool:
        return LayerKind.SLIDING_WINDOW in self.layer_kinds

    @property
    def has_recurrent_layers(self) -> bool:
        """Some layers keep a recurrent state instead of a KV cache (linear attention, Mamba, convolution)."""
        return self.attention_layer_ids is not None

    @property
    def is_hybrid_swa(self) -> bool:
        return self.has_sliding_window and LayerKind.FULL in self.layer_kinds

    @property
    def is_local_attention_model(self) -> bool:
        return LayerKind.CHUNKED_LOCAL in self.layer_kinds

    @property
    def has_cross_attention(self) -> bool:
        return LayerKind.CROSS_ATTENTION in self.layer_kinds

    @property
    def is_encoder_only(self) -> bool:
        return not self.is_encoder_decoder and all(k == LayerKind.ENCODER_ONLY for k in self.layer_kinds)

    @property
    def gqa_group_size(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def has_asymmetric_kv(self) -> bool:
        """Some layer's V rows differ in width from its K rows (SGLang 0.5.23 ModelConfig.has_asymmetric_kv: the full
        or the sliding-window shape)."""
        return any(
            s.head_dim != s.v_head_dim for s in (self.shape(LayerKind.FULL), self.shape(LayerKind.SLIDING_WINDOW))
        )

    @property
    def head_dims_multiple_of_8(self) -> bool:
        """FlashAttention's head-dim alignment for 16-bit inputs (flash_attn.cute's _validate_head_dims), on every
        layer kind's shape."""
        shapes = (self.shape(LayerKind.FULL), self.shape(LayerKind.SLIDING_WINDOW))
        return all(s.head_dim % 8 == 0 and s.v_head_dim % 8 == 0 for s in shapes)

    # ---- reading a config.json -----------------------------------------------------------------

    @classmethod
    def from_hf_config(cls, path: str | Path) -> "ModelFacts":
        """Read a ``config.json`` (or a folder holding one). Raises ModelConfigError naming the key (UsageError for a
        path that is no path)."""
        check_arguments(("path", path, (str, Path), "a config mapping goes to ModelFacts.from_hf_dict"))
        path = Path(path)
        if is_directory(path):
            path = path / "config.json"
        raw = parse_json(read_text(path, ModelConfigError, "config.json"), str(path), ModelConfigError)
        if not isinstance(raw, dict):
            raise ModelConfigError(
                Problem(str(path), "config.json must hold a JSON object", code="model-config.not-object")
            )
        return cls.from_hf_dict(raw, source=str(path))

    @classmethod
    def from_hf_dict(cls, raw: dict[str, Any], *, source: str = "<config>") -> "ModelFacts":
        """Build facts from a config mapping; every problem is collected into one ModelConfigError (UsageError for a
        ``raw`` that is no mapping)."""
        check_arguments(
            ("raw", raw, dict, "a config.json's mapping; a path goes to ModelFacts.from_hf_config"),
            ("source", source, str, "the name problems are reported under"),
        )
        return cls(**read_hf_config(raw, source))
