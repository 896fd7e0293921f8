"""The reader of a Hugging Face ``config.json``: the keys the rules read, validated per concern by the typed models
of attngate.facts.hf_schema, every problem of the file collected with its key path, and the fields of
attngate.facts.model.ModelFacts built from them.

Where each key is read (the precedence):

- Keys of the whole model (``architectures``, ``model_type``, ``is_encoder_decoder``, ``vision_config``,
  ``audio_config``) at the top level.
- Keys of the language model in its sub-config where the file has one, chosen as SGLang 0.5.23 chooses it
  (``srt/utils/hf_transformers/common.py`` ``get_hf_text_config``: ``thinker_config`` (its ``text_config`` where it
  has one), then ``llm_config``, ``language_config``, ``text_config``; a ``Llava*ForCausalLM`` reads the top
  level), else at the top level. A key the sub-config omits takes transformers' default for the sub-config's model
  type, never the top level's value: a language-model key at the top level beside a sub-config that gives it no
  equal value is refused (SGLang would ignore it, so the file says two things). ``torch_dtype`` alone falls back to
  the top level, as SGLang copies the parent's dtype into a sub-config without one.
- An encoder-decoder model's two stacks by their own keys (attngate.facts.hf_schema.EncoderDecoderShape).
- ``null`` means the key's default, as transformers reads it (for a feature key: none).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from attngate.errors import ModelConfigError, Problem
from attngate.facts.hf_layout import Layout, layout
from attngate.facts.hf_schema import (
    AttentionShape,
    Concern,
    EncoderDecoderShape,
    LanguageFeatures,
    LayerLayout,
    LogitScaling,
    MlaRanks,
    ModelLevel,
    problems,
)
from attngate.facts.modes import LayerKind

_LANGUAGE_STACKS = ("thinker_config", "llm_config", "language_config", "text_config")
_LANGUAGE_CONCERNS = (AttentionShape, EncoderDecoderShape, MlaRanks, LogitScaling, LayerLayout, LanguageFeatures)
_LANGUAGE_KEYS = frozenset(k for c in _LANGUAGE_CONCERNS for k in c.model_fields) - {"torch_dtype"}
#: defaults that transformers' config class (or SGLang's own, where it registers one) applies where a key is absent,
#: by the language model's type
_GEMMA3_TEXT = {"sliding_window_pattern": 6, "sliding_window": 4096, "head_dim": 256}  # Gemma3TextConfig
_TEXT_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": _GEMMA3_TEXT,
    "gemma3": _GEMMA3_TEXT,
    "hy_v4": {"learnable_sink": True},  # SGLang 0.5.23 reads hy_v4 through its own HYV4Config (configs/hy_v4.py l.44)
}


def _derived_keys(text_type: str, values: dict[str, Any]) -> dict[str, Any]:
    """Keys a config class derives from others where they are absent: SGLang 0.5.23's ExaoneConfig reads
    ``num_layers`` as ``num_hidden_layers`` (configs/exaone.py l.142, attribute_map); its MiniCPM3 attention takes
    ``v_head_dim`` as ``hidden_size // num_attention_heads`` (models/minicpm3.py l.290), no config key."""
    derived: dict[str, Any] = {}
    if text_type == "exaone" and "num_hidden_layers" not in values and "num_layers" in values:
        derived["num_hidden_layers"] = values["num_layers"]
    heads, hidden = values.get("num_attention_heads"), values.get("hidden_size")
    if text_type == "minicpm3" and "v_head_dim" not in values and isinstance(heads, int) and isinstance(hidden, int):
        derived["v_head_dim"] = hidden // heads if heads > 0 else None
    return derived


#: architectures whose attention always has learned sinks, without a config key (SGLang 0.5.23 model_config.py
#: l.88-95, SWA_SINK_ARCHS)
_SINK_ARCHITECTURES = frozenset(
    {"GptOssForCausalLM", "GraniteSWAForCausalLM", "GraniteMoeSWAForCausalLM", "IQuestQ1ForCausalLM", "IQuestQ1MTP"}
)
#: MiMo-V2 and its MTP draft: sinks where either sink-bias key is set (model_config.py l.74-77, l.1284-1288)
_MIMO_V2_ARCHITECTURES = frozenset({"MiMoV2ForCausalLM", "MiMoV2FlashForCausalLM", "MiMoV2MTP"})


def _has_attention_sinks(architectures: tuple[str, ...] | list[str], features: LanguageFeatures) -> bool:
    """SGLang 0.5.23's ``ModelConfig._detect_attention_sinks`` (model_config.py l.1273-1289) on the keys read: any
    listed architecture of SWA_SINK_ARCHS has sinks; MiMo-V2 has them where ``add_swa_attention_sink_bias`` or
    ``add_full_attention_sink_bias`` is true (and never through ``learnable_sink``); any other model where
    ``learnable_sink`` is true. A key absent means false, as SGLang's ``getattr(..., False)``."""
    if _SINK_ARCHITECTURES.intersection(architectures):
        return True
    if _MIMO_V2_ARCHITECTURES.intersection(architectures):
        return bool(features.add_swa_attention_sink_bias or features.add_full_attention_sink_bias)
    return bool(features.learnable_sink)


def read_hf_config(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """The ModelFacts fields of one config mapping. Raises ModelConfigError listing every problem, each named
    ``source: key.path``."""
    reader = _Reader(source)
    fields = reader.read(raw)
    if reader.problems or fields is None:
        raise ModelConfigError(reader.problems)
    return fields


def _present(mapping: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in mapping.items() if v is not None}  # null: the default, as transformers reads it


class _Reader:
    def __init__(self, source: str):
        self.source = source
        self.problems: list[Problem] = []

    def _bad(self, key: str, message: str) -> None:
        self.problems.append(Problem(f"{self.source}: {key}", message, code="model-config.bad-key"))

    def _concern(self, model: type[Concern], values: dict[str, Any], prefix: str) -> Any:
        """The validated concern, its requirements checked; None (its problems recorded) where it does not validate."""
        try:
            concern = model.model_validate(values)
        except ValidationError as error:  # a key two concerns read (v_head_dim: the shape's and MLA's) is named once
            self.problems += [p for p in problems(error, model, prefix, self.source) if p not in self.problems]
            return None
        for key, message in concern.requirements():
            self._bad(prefix + key, message)
        return concern

    def _language_stack(self, top: dict[str, Any], model: ModelLevel | None) -> tuple[str, dict[str, Any]] | None:
        """(key prefix, values) of the language model's keys: its sub-config, or the top level; None (the problem
        recorded) where the sub-config is no object, whose keys then cannot be read at all."""
        if model is not None and model.architectures:
            arch = model.architectures[0]
            if arch.startswith("Llava") and arch.endswith("ForCausalLM"):
                return "", top
        for name in _LANGUAGE_STACKS:
            if name not in top:
                continue
            sub, prefix = top[name], f"{name}."
            if name == "thinker_config" and isinstance(sub, dict) and isinstance(sub.get("text_config"), dict):
                sub, prefix = sub["text_config"], f"{name}.text_config."
            if not isinstance(sub, dict):
                self._bad(prefix.rstrip("."), f"must be an object (the language model's config), got {sub!r}")
                return None
            sub = _present(sub)
            self._refuse_mixed(top, sub, prefix)
            return prefix, {**sub, "torch_dtype": sub.get("torch_dtype", top.get("torch_dtype"))}
        return "", top

    def _refuse_mixed(self, top: dict[str, Any], sub: dict[str, Any], prefix: str) -> None:
        stack = prefix.rstrip(".")
        for key in sorted(_LANGUAGE_KEYS & top.keys()):
            if sub.get(key) != top[key]:
                there = f"{prefix}{key} is {sub[key]!r}" if key in sub else f"{stack} gives no {key}"
                self._bad(
                    key,
                    f"set at the top level beside {stack}, which the language model reads ({there}; SGLang's "
                    "get_hf_text_config ignores the top level): give it in one place",
                )

    def read(self, raw: dict[str, Any]) -> dict[str, Any] | None:
        top = _present(raw)
        model = self._concern(ModelLevel, top, "")
        stack = self._language_stack(top, model)
        if stack is None:
            return None
        prefix, values = stack
        model_type = model.model_type if model else ""
        text_type = values.get("model_type", model_type)
        defaults = _TEXT_DEFAULTS.get(text_type, {}) if isinstance(text_type, str) else {}
        values = {**defaults, **values}
        values.update(_derived_keys(text_type, values) if isinstance(text_type, str) else {})
        is_enc_dec = bool(model and model.is_encoder_decoder)
        shape = self._concern(EncoderDecoderShape if is_enc_dec else AttentionShape, values, prefix)
        mla = self._concern(MlaRanks, values, prefix)
        scaling = self._concern(LogitScaling, values, prefix)
        layout_keys = self._concern(LayerLayout, values, prefix)
        features = self._concern(LanguageFeatures, values, prefix)
        found = None
        if shape is not None and layout_keys is not None:
            found = self._layout(shape, layout_keys, text_type if isinstance(text_type, str) else "", prefix)
        if self.problems or None in (model, shape, mla, scaling, layout_keys, features, found):
            return None
        return self._fields(model, shape, mla, scaling, layout_keys, features, found)

    def _layout(self, shape: Any, keys: LayerLayout, model_type: str, prefix: str) -> Layout | None:
        if isinstance(shape, EncoderDecoderShape):
            decoder = (LayerKind.FULL, LayerKind.CROSS_ATTENTION) * shape.decoder_layers
            return Layout((LayerKind.ENCODER_ONLY,) * shape.encoder_layers + decoder)
        found, found_problems = layout(keys, shape.num_hidden_layers, model_type)
        for key, message in found_problems:
            self._bad(prefix + key, message)
        return None if found_problems else found

    def _fields(
        self,
        model: ModelLevel,
        shape: AttentionShape | EncoderDecoderShape,
        mla: MlaRanks,
        scaling: LogitScaling,
        keys: LayerLayout,
        features: LanguageFeatures,
        found: Layout,
    ) -> dict[str, Any]:
        is_mla = mla.kv_lora_rank is not None
        if isinstance(shape, EncoderDecoderShape):
            heads = kv_heads = shape.decoder_attention_heads
        else:
            heads, kv_heads = shape.num_attention_heads, shape.kv_heads
        head_dim, v_head_dim = mla.head_dims if is_mla else (shape.derived_head_dim(), shape.derived_v_head_dim())
        swa_shape = shape.swa_shape() if isinstance(shape, AttentionShape) and not is_mla else None
        if swa_shape == (heads, kv_heads, head_dim, v_head_dim):
            swa_shape = None
        return dict(
            source=self.source,
            architectures=tuple(model.architectures),
            model_type=model.model_type,
            attention_arch="mla" if is_mla else "mha",
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            v_head_dim=v_head_dim,
            swa_shape=swa_shape,
            kv_lora_rank=mla.kv_lora_rank,
            qk_rope_head_dim=mla.qk_rope_head_dim,
            sliding_window=found.window,
            attention_chunk_size=found.chunk,
            layer_kinds=found.kinds,
            attention_layer_ids=found.attention_ids,
            is_encoder_decoder=model.is_encoder_decoder,
            is_multimodal=isinstance(model.vision_config, dict) or isinstance(model.audio_config, dict),
            attn_logit_softcapping=scaling.attn_logit_softcapping,
            final_logit_softcapping=scaling.final_logit_softcapping,
            query_pre_attn_scalar=scaling.query_pre_attn_scalar,
            has_attention_sinks=_has_attention_sinks(model.architectures, features),
            has_dual_chunk_attention=isinstance(features.dual_chunk_attention_config, dict),
            has_dsa_indexer=mla.index_topk is not None,
            use_bidirectional_attention=keys.use_bidirectional_attention is True,
            max_position_embeddings=features.max_position_embeddings,
            torch_dtype=features.torch_dtype,
        )
