"""The reader of a Hugging Face ``config.json``: the keys the rules read, checked by value, every problem collected
with its key path, and the per-layer kinds worked out from each family's layout keys into the fields of attngate.facts.model.ModelFacts."""

from __future__ import annotations

import math
from typing import Any

from attngate.errors import Problem
from attngate.facts.modes import LayerKind

_LAYER_TYPE_NAMES: dict[str, LayerKind | None] = {
    "full_attention": LayerKind.FULL,
    "attention": LayerKind.FULL,  # GraniteMoeHybrid
    "sliding_attention": LayerKind.SLIDING_WINDOW,
    "chunked_attention": LayerKind.CHUNKED_LOCAL,
    # hybrid models' layers without softmax attention (Qwen3-Next / Qwen3.5, LFM2, GraniteMoeHybrid): no KV cache
    "linear_attention": None,
    "conv": None,
    "mamba": None,
    "mamba2": None,
}
#: NemotronH's ``hybrid_override_pattern``: one character per layer, "*" attention, "M" Mamba-2, "-" MLP, "E" MoE.
_HYBRID_PATTERN_CHARS = frozenset("*M-E")
#: Defaults that transformers applies when a nested ``text_config`` omits a key.
_TEXT_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {"sliding_window_pattern": 6, "sliding_window": 4096, "head_dim": 256},
    "gemma3": {"sliding_window_pattern": 6, "sliding_window": 4096, "head_dim": 256},
}
_SINK_MODEL_TYPES = {"gpt_oss"}  # sinks have no config key; the architecture implies them
_BIDIRECTIONAL_MODEL_TYPES = {"bert", "roberta", "xlm-roberta", "distilbert", "nomic_bert", "modernbert"}

# upper bounds per key, far beyond any released model: a config that exceeds one is corrupt
_LAYER_LIMIT, _HEAD_LIMIT, _DIM_LIMIT = 4096, 65536, 65536
_INT_LIMITS = {
    "num_hidden_layers": _LAYER_LIMIT,
    "encoder_layers": _LAYER_LIMIT,
    "decoder_layers": _LAYER_LIMIT,
    "num_attention_heads": _HEAD_LIMIT,
    "num_key_value_heads": _HEAD_LIMIT,
    "decoder_attention_heads": _HEAD_LIMIT,
    "head_dim": _DIM_LIMIT,
    "v_head_dim": _DIM_LIMIT,
    "qk_nope_head_dim": _DIM_LIMIT,
    "qk_rope_head_dim": _DIM_LIMIT,
    "kv_lora_rank": _DIM_LIMIT,
    "hidden_size": 1 << 20,
    "d_model": 1 << 20,
}
_DEFAULT_INT_LIMIT = 1 << 40  # windows, chunks, positions: tokens


class ConfigReader:
    """Reads one config mapping, recording each problem with the key it concerns."""

    def __init__(self, raw: dict[str, Any], source: str):
        self.raw = raw
        self.source = source
        self.problems: list[Problem] = []
        self.attention_ids: tuple[int, ...] | None = None  # set where some layers have no softmax attention
        text = raw.get("text_config")
        if text is not None and not isinstance(text, dict):
            self._bad("text_config", "must be an object")
            text = None
        self.text: dict[str, Any] = text or {}
        self.prefix = "text_config." if text else ""
        text_type = self.text.get("model_type") or raw.get("model_type")
        self.defaults = _TEXT_DEFAULTS.get(text_type, {}) if text and isinstance(text_type, str) else {}
        self.bidirectional = self.bool_("use_bidirectional_attention") is True

    def _bad(self, key: str, message: str) -> None:
        self.problems.append(Problem(f"{self.source}: {key}", message))

    def get(self, key: str, default: Any = None) -> Any:
        """Look a key up in text_config first, then at the top level, then transformers' default; an explicit
        null means the default, as in transformers."""
        if self.text.get(key) is not None:
            return self.text[key]
        if self.raw.get(key) is not None:
            return self.raw[key]
        return self.defaults.get(key, default)

    def where(self, key: str) -> str:
        return self.prefix + key if self.text.get(key) is not None else key

    def int_(self, key: str, *, required: bool = False, default: int | None = None, minimum: int = 1) -> int | None:
        value = self.get(key, default)
        if value is None:
            if required:
                self._bad(key, "missing (required for attention)")
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            self._bad(self.where(key), f"must be {what}, got {value!r}")
            return None
        limit = _INT_LIMITS.get(key, _DEFAULT_INT_LIMIT)
        if value > limit:  # checked before anything is sized by it
            self._bad(self.where(key), f"{value} is beyond any real model (at most {limit})")
            return None
        return value

    def bool_(self, key: str) -> bool | None:
        """A switch read as transformers reads it: true, false or absent; any other value names the key."""
        value = self.get(key)
        if value is not None and not isinstance(value, bool):
            self._bad(self.where(key), f"must be true or false, got {value!r}")
            return None
        return value

    def positive_float(self, key: str) -> float | None:
        """A scale or a soft-cap: absent (null) means none, as transformers reads it; otherwise a finite number above
        0 (a soft-cap of 0 divides by zero in tanh(x / cap), a negative scale makes the softmax scale complex)."""
        value = self.get(key)
        if value is None:
            return None
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or not 0 < value <= 1e9
        ):
            self._bad(self.where(key), f"must be a finite number above 0 (or null for none), got {value!r}")
            return None
        return float(value)

    def read(self) -> dict[str, Any] | None:
        raw = self.raw
        archs = raw.get("architectures") or []
        if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
            self._bad("architectures", f"must be a list of strings, got {archs!r}")
            archs = []
        model_type = raw.get("model_type")
        if not isinstance(model_type, str):
            self._bad("model_type", f"missing or not a string ({model_type!r})")
            model_type = ""
        is_enc_dec = self.bool_("is_encoder_decoder") is True  # "false" (a string) is refused, not taken as true
        if is_enc_dec:
            heads_key, kv_key, hidden_key = "decoder_attention_heads", "decoder_attention_heads", "d_model"
        else:
            heads_key, kv_key, hidden_key = "num_attention_heads", "num_key_value_heads", "hidden_size"
        heads = self.int_(heads_key, required=True)
        kv_heads = self.int_(kv_key, default=heads)
        encoder_heads = self.int_("encoder_attention_heads", default=heads) if is_enc_dec else heads
        if heads and encoder_heads and encoder_heads != heads:  # one head count per model: no encoder built wrong
            self._bad(
                self.where("encoder_attention_heads"),
                f"{encoder_heads} differs from decoder_attention_heads={heads}; attngate plans one head count per model",
            )
        hidden = self.int_(hidden_key)
        kv_lora_rank = self.int_("kv_lora_rank")
        qk_rope = self.int_("qk_rope_head_dim")
        if kv_lora_rank is not None:
            head_dim, v_head_dim = self._mla_head_dims(qk_rope)
        else:
            head_dim = self.int_("head_dim")
            if head_dim is None and heads and hidden:
                if hidden % heads:
                    self._bad(hidden_key, f"{hidden} is not divisible by {heads_key}={heads}; set head_dim")
                head_dim = hidden // heads
            elif head_dim is None:
                self._bad("head_dim", f"missing, and cannot be derived without {hidden_key}")
            v_head_dim = head_dim
        if heads and kv_heads and heads % kv_heads:
            self._bad(self.where(kv_key), f"{kv_heads} does not divide num_attention_heads={heads}")
        layer_kinds, window, chunk = self._layer_kinds(model_type, is_enc_dec)
        for kind, size, key in (
            (LayerKind.SLIDING_WINDOW, window, "sliding_window"),
            (LayerKind.CHUNKED_LOCAL, chunk, "attention_chunk_size"),
        ):
            # a layer kind needs its size (no plan with a window of -1); a bad value is reported where it is read
            if kind in layer_kinds and size is None and self.get(key) is None:
                self._bad(key, f"missing: the config has {kind.value} layers, which need it (tokens)")
        dtype = self._dtype()
        if self.problems:
            return None
        return dict(
            source=self.source,
            architectures=tuple(archs),
            model_type=model_type,
            attention_arch="mla" if kv_lora_rank is not None else "mha",
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            v_head_dim=v_head_dim,
            kv_lora_rank=kv_lora_rank,
            qk_rope_head_dim=qk_rope,
            sliding_window=window,
            attention_chunk_size=chunk,
            layer_kinds=layer_kinds,
            attention_layer_ids=self.attention_ids,
            is_encoder_decoder=is_enc_dec,
            # a tower's config is an object; null (or false) means none, as transformers reads it (SGLang 0.5.23
            # configs/model_config.py l.804-815 tests hasattr, which a null tower would pass)
            is_multimodal=isinstance(raw.get("vision_config"), dict) or isinstance(raw.get("audio_config"), dict),
            attn_logit_softcapping=self.positive_float("attn_logit_softcapping"),
            final_logit_softcapping=self.positive_float("final_logit_softcapping"),
            query_pre_attn_scalar=self.positive_float("query_pre_attn_scalar"),
            has_attention_sinks=model_type in _SINK_MODEL_TYPES,
            # an object, as Qwen2.5-1M ships it (SGLang 0.5.23 model_config.py l.2174 tests hasattr only)
            has_dual_chunk_attention=isinstance(self.get("dual_chunk_attention_config"), dict),
            # a top-k count: SGLang 0.5.23 model_config.py l.211 (is_deepseek_dsa: index_topk is not None) and l.485
            # (the indexer's top-k); false or 0 is refused here, not read as present
            has_dsa_indexer=self.int_("index_topk") is not None,
            use_bidirectional_attention=self.bidirectional,
            max_position_embeddings=self.int_("max_position_embeddings"),
            torch_dtype=dtype,
        )

    def _dtype(self) -> str | None:
        value = self.raw.get("torch_dtype") or self.text.get("torch_dtype")
        if value is not None and not isinstance(value, str):
            self._bad("torch_dtype", f'must be a dtype name such as "bfloat16", got {value!r}')
            return None
        return value

    def _mla_head_dims(self, qk_rope: int | None) -> tuple[int, int]:
        qk_nope = self.int_("qk_nope_head_dim", required=True)
        v_head_dim = self.int_("v_head_dim", required=True)
        if qk_rope is None:
            self._bad("qk_rope_head_dim", "missing (required with kv_lora_rank)")
        return (qk_nope or 0) + (qk_rope or 0), v_head_dim or 0

    def _layer_kinds(self, model_type: str, is_enc_dec: bool) -> tuple[tuple[LayerKind, ...], int | None, int | None]:
        """Per-layer kinds, the active sliding window (tokens) and the local-attention chunk (tokens)."""
        if is_enc_dec:
            enc = self.int_("encoder_layers", required=True) or 0
            dec = self.int_("decoder_layers", required=True) or 0
            decoder = (LayerKind.FULL, LayerKind.CROSS_ATTENTION) * dec
            return (LayerKind.ENCODER_ONLY,) * enc + decoder, None, None
        n = self.int_("num_hidden_layers", required=True) or 0
        # is_causal false: transformers' bidirectional text models (SGLang 0.5.23 model_config.py l.648 sets it for
        # its embedding models); a string is refused by bool_, never read as true
        if model_type in _BIDIRECTIONAL_MODEL_TYPES or self.bool_("is_causal") is False:
            return (LayerKind.ENCODER_ONLY,) * n, None, None
        window = self.int_("sliding_window")
        chunk = self.int_("attention_chunk_size")
        use_sliding_window = self.bool_("use_sliding_window")
        if use_sliding_window is False:  # transformers' Qwen2Config: sliding_window only where use_sliding_window
            window = None  # Qwen2/Qwen3: a window is configured but switched off
        if self.bidirectional and window:  # transformers' Gemma3TextConfig: |q - k| < sliding_window // 2 + 1
            window = window // 2 + 1
        cross = self.get("cross_attention_layers")
        if cross is not None:
            if not isinstance(cross, list) or not all(type(i) is int and 0 <= i < n for i in cross):
                self._bad(self.where("cross_attention_layers"), f"must list layer indices below {n}")
                cross = []
            return tuple(LayerKind.CROSS_ATTENTION if i in cross else LayerKind.FULL for i in range(n)), None, None
        layer_types = self.get("layer_types")
        if layer_types is not None:
            return self._from_layer_types(layer_types, n), window, chunk
        hybrid = self.get("hybrid_override_pattern")
        if hybrid is not None:
            return self._from_hybrid_pattern(hybrid, n), window, chunk
        if chunk is not None:
            return self._chunked_llama4(n), window, chunk
        if window is None:
            return (LayerKind.FULL,) * n, None, None
        if model_type == "gemma2":  # even layers slide, odd layers are global
            return tuple(LayerKind.SLIDING_WINDOW if i % 2 == 0 else LayerKind.FULL for i in range(n)), window, None
        if isinstance(
            self.get("sliding_window_pattern"), str
        ):  # EXAONE 4: "LLLG", local (L) or global (G) per layer, repeated
            return self._from_letter_pattern(self.get("sliding_window_pattern"), n), window, None
        pattern = self.int_("sliding_window_pattern")
        if pattern is not None:  # every pattern-th layer is global
            return (
                tuple(LayerKind.FULL if (i + 1) % pattern == 0 else LayerKind.SLIDING_WINDOW for i in range(n)),
                window,
                None,
            )
        if use_sliding_window is True:
            # transformers' Qwen2: layer i slides where i >= max_window_layers; 0 makes every layer slide
            first = self.int_("max_window_layers", default=0, minimum=0) or 0
            return tuple(LayerKind.SLIDING_WINDOW if i >= first else LayerKind.FULL for i in range(n)), window, None
        return (LayerKind.SLIDING_WINDOW,) * n, window, None  # Mistral-style global window

    def _from_layer_types(self, layer_types: Any, n: int) -> tuple[LayerKind, ...]:
        key = self.where("layer_types")
        if not isinstance(layer_types, list) or len(layer_types) != n:
            self._bad(key, f"must be a list of num_hidden_layers={n} layer types")
            return ()
        kinds: dict[int, LayerKind] = {}  # model layer index -> kind, attention layers only
        for i, name in enumerate(layer_types):
            if not isinstance(name, str) or name not in _LAYER_TYPE_NAMES:
                self._bad(f"{key}[{i}]", f"unsupported layer type {name!r}; attngate knows {sorted(_LAYER_TYPE_NAMES)}")
                kinds[i] = LayerKind.FULL
            elif _LAYER_TYPE_NAMES[name] is not None:
                kinds[i] = _LAYER_TYPE_NAMES[name]
        return self._attention_layers(kinds, n, key)

    def _from_letter_pattern(self, pattern: str, n: int) -> tuple[LayerKind, ...]:
        if not pattern or not set(pattern) <= {"L", "G"}:
            self._bad(
                self.where("sliding_window_pattern"),
                f"must be an integer or a string of 'L' (local) and 'G' (global), got {pattern!r}",
            )
            return ()
        return tuple(LayerKind.SLIDING_WINDOW if pattern[i % len(pattern)] == "L" else LayerKind.FULL for i in range(n))

    def _from_hybrid_pattern(self, pattern: Any, n: int) -> tuple[LayerKind, ...]:
        key = self.where("hybrid_override_pattern")
        if not isinstance(pattern, str) or len(pattern) != n or not set(pattern) <= _HYBRID_PATTERN_CHARS:
            self._bad(
                key,
                f"must be a string of num_hidden_layers={n} characters from '*M-E' ('*': attention), got {pattern!r}",
            )
            return ()
        return self._attention_layers({i: LayerKind.FULL for i, c in enumerate(pattern) if c == "*"}, n, key)

    def _attention_layers(self, kinds: dict[int, LayerKind], n: int, key: str) -> tuple[LayerKind, ...]:
        """The kinds of the attention layers among ``n`` model layers; records their model indices when some
        layers have none."""
        if not kinds:
            self._bad(key, "names no attention layer; attngate plans softmax attention only")
        if len(kinds) < n:
            self.attention_ids = tuple(sorted(kinds))
        return tuple(kinds[i] for i in sorted(kinds))

    def _chunked_llama4(self, n: int) -> tuple[LayerKind, ...]:
        # Llama-4: RoPE layers attend within chunks; every no_rope_layer_interval-th layer is global NoPE.
        no_rope = self.get("no_rope_layers") or []
        if no_rope:
            if not isinstance(no_rope, list) or len(no_rope) != n:
                self._bad(self.where("no_rope_layers"), f"must be a list of {n} flags")
                return ()
            return tuple(LayerKind.CHUNKED_LOCAL if use_rope else LayerKind.FULL for use_rope in no_rope)
        interval = self.int_("no_rope_layer_interval", default=4) or 4
        return tuple(LayerKind.FULL if (i + 1) % interval == 0 else LayerKind.CHUNKED_LOCAL for i in range(n))
