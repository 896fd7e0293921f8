"""ModelFacts on every real config: the facts each must yield."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attngate import ModelConfigError, ModelFacts
from attngate.facts.modes import LayerKind as K
from tests.support.helpers import MODELS

# name: (arch, q heads, kv heads, head_dim, v_head_dim, window, chunk, layer kind counts, sinks, softcap, enc-dec)
EXPECTED = {
    "Llama-3.1-8B": ("mha", 32, 8, 128, 128, None, None, {K.FULL: 32}, False, None, False),
    "Qwen3-8B": ("mha", 32, 8, 128, 128, None, None, {K.FULL: 36}, False, None, False),
    "Qwen3-Embedding-8B": ("mha", 32, 8, 128, 128, None, None, {K.FULL: 36}, False, None, False),
    "Qwen3-30B-A3B": ("mha", 32, 4, 128, 128, None, None, {K.FULL: 48}, False, None, False),
    "Qwen2.5-7B-Instruct": ("mha", 28, 4, 128, 128, None, None, {K.FULL: 28}, False, None, False),
    "Mistral-7B-v0.1": ("mha", 32, 8, 128, 128, 4096, None, {K.SLIDING_WINDOW: 32}, False, None, False),
    "Mixtral-8x7B-v0.1": ("mha", 32, 8, 128, 128, None, None, {K.FULL: 32}, False, None, False),
    "e5-mistral-7b-instruct": ("mha", 32, 8, 128, 128, 4096, None, {K.SLIDING_WINDOW: 32}, False, None, False),
    "gte-Qwen2-7B-instruct": ("mha", 28, 4, 128, 128, None, None, {K.ENCODER_ONLY: 28}, False, None, False),
    "all-MiniLM-L6-v2": ("mha", 12, 12, 32, 32, None, None, {K.ENCODER_ONLY: 6}, False, None, False),
    "DeepSeek-V2-Lite": ("mla", 16, 16, 192, 128, None, None, {K.FULL: 27}, False, None, False),
    "DeepSeek-V3": ("mla", 128, 128, 192, 128, None, None, {K.FULL: 61}, False, None, False),
    "Kimi-K2-Instruct": ("mla", 64, 64, 192, 128, None, None, {K.FULL: 61}, False, None, False),
    "gemma-2-9b": ("mha", 16, 8, 256, 256, 4096, None, {K.SLIDING_WINDOW: 21, K.FULL: 21}, False, 50.0, False),
    "gemma-2-9b-it": ("mha", 16, 8, 256, 256, 4096, None, {K.SLIDING_WINDOW: 21, K.FULL: 21}, False, 50.0, False),
    "gemma-3-1b-it": ("mha", 4, 1, 256, 256, 512, None, {K.SLIDING_WINDOW: 22, K.FULL: 4}, False, None, False),
    "gemma-3-27b-it": ("mha", 32, 16, 128, 128, 1024, None, {K.SLIDING_WINDOW: 52, K.FULL: 10}, False, None, False),
    "gpt-oss-20b": ("mha", 64, 8, 64, 64, 128, None, {K.SLIDING_WINDOW: 12, K.FULL: 12}, True, None, False),
    "MiMo-V2-Flash": ("mha", 64, 4, 192, 128, 128, None, {K.SLIDING_WINDOW: 39, K.FULL: 9}, True, None, False),
    "gpt-oss-120b": ("mha", 64, 8, 64, 64, 128, None, {K.SLIDING_WINDOW: 18, K.FULL: 18}, True, None, False),
    "Llama-3.2-11B-Vision-Instruct": (
        "mha",
        32,
        8,
        128,
        128,
        None,
        None,
        {K.FULL: 32, K.CROSS_ATTENTION: 8},
        False,
        None,
        False,
    ),
    "whisper-large-v3-turbo": (
        "mha",
        20,
        20,
        64,
        64,
        None,
        None,
        {K.ENCODER_ONLY: 32, K.FULL: 4, K.CROSS_ATTENTION: 4},
        False,
        None,
        True,
    ),
    "Llama-4-Scout-17B-16E-Instruct": (
        "mha",
        40,
        8,
        128,
        128,
        None,
        8192,
        {K.CHUNKED_LOCAL: 36, K.FULL: 12},
        False,
        None,
        False,
    ),
}


def test_every_real_config_is_covered():
    assert {p.stem for p in MODELS.glob("*.json")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_facts_of_real_config(name):
    arch, heads, kv, hd, vhd, window, chunk, kinds, sinks, softcap, enc_dec = EXPECTED[name]
    m = ModelFacts.from_hf_config(MODELS / f"{name}.json")
    assert (m.attention_arch, m.num_attention_heads, m.num_key_value_heads, m.head_dim, m.v_head_dim) == (
        arch,
        heads,
        kv,
        hd,
        vhd,
    )
    assert (m.sliding_window, m.attention_chunk_size) == (window, chunk)
    assert Counter(m.layer_kinds) == kinds
    assert (m.has_attention_sinks, m.attn_logit_softcapping, m.is_encoder_decoder) == (sinks, softcap, enc_dec)


def test_layer_patterns_are_in_the_right_places():
    assert ModelFacts.from_hf_config(MODELS / "gemma-2-9b.json").layer_kinds[:2] == (K.SLIDING_WINDOW, K.FULL)
    g3 = ModelFacts.from_hf_config(MODELS / "gemma-3-1b-it.json").layer_kinds
    assert [i for i, k in enumerate(g3) if k == K.FULL] == [5, 11, 17, 23]
    mllama = ModelFacts.from_hf_config(MODELS / "Llama-3.2-11B-Vision-Instruct.json").layer_kinds
    assert [i for i, k in enumerate(mllama) if k == K.CROSS_ATTENTION] == [3, 8, 13, 18, 23, 28, 33, 38]
    llama4 = ModelFacts.from_hf_config(MODELS / "Llama-4-Scout-17B-16E-Instruct.json").layer_kinds
    assert [i for i, k in enumerate(llama4) if k == K.FULL][:3] == [3, 7, 11]


def test_derived_facts():
    ds = ModelFacts.from_hf_config(MODELS / "DeepSeek-V2-Lite.json")
    assert ds.use_mla and ds.kv_lora_rank == 512 and ds.has_asymmetric_kv
    g = ModelFacts.from_hf_config(MODELS / "gemma-3-27b-it.json")
    assert g.is_hybrid_swa and g.is_multimodal and not g.use_mla
    assert ModelFacts.from_hf_config(MODELS / "all-MiniLM-L6-v2.json").is_encoder_only


def _llama(**changes) -> dict:
    raw = json.loads((MODELS / "Llama-3.1-8B.json").read_text())
    raw.update(changes)
    return raw


def test_hybrid_models_list_only_their_attention_layers():
    """Qwen3-Next / Qwen3.5 (linear attention), LFM2 (short convolution), GraniteMoeHybrid (Mamba) and NemotronH
    (``hybrid_override_pattern``) as their Hub configs state them: the layers without softmax attention hold no
    KV cache and are left out, the rest keep their order."""
    qwen3_next = _llama(
        architectures=["Qwen3NextForCausalLM"],
        model_type="qwen3_next",
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 8,
    )
    lfm2 = _llama(model_type="lfm2", layer_types=["conv", "conv", "full_attention", "conv"] * 8)
    granite = _llama(model_type="granitemoehybrid", layer_types=["mamba"] * 5 + ["attention"] + ["mamba"] * 26)
    nemotron_h = _llama(model_type="nemotron_h", hybrid_override_pattern="M-M-M*-E" * 4)
    facts = [ModelFacts.from_hf_dict(raw) for raw in (qwen3_next, lfm2, granite, nemotron_h)]
    assert [Counter(f.layer_kinds) for f in facts] == [{K.FULL: 8}, {K.FULL: 8}, {K.FULL: 1}, {K.FULL: 4}]
    assert facts[0].attention_layer_ids == tuple(range(3, 32, 4)) and facts[2].attention_layer_ids == (5,)
    assert facts[3].attention_layer_ids == (5, 13, 21, 29)  # the "*" of each "M-M-M*-E"
    assert facts[0].attention_position(7) == 1  # what transformers' layer_idx 7 reads from the plan and the KV pool
    with pytest.raises(ValueError, match="model layer 6 is not one of its softmax-attention layers"):
        facts[0].attention_position(6)
    llama = ModelFacts.from_hf_config(MODELS / "Llama-3.1-8B.json")
    assert llama.attention_layer_ids is None and llama.attention_position(31) == 31
    with pytest.raises(ValueError):
        llama.attention_position(32)
    with pytest.raises(ModelConfigError, match="attention_layer_ids"):
        llama.model_copy(update={"attention_layer_ids": (3, 1)})


@pytest.mark.parametrize(
    "changes, key",
    [
        ({"layer_types": ["linear_attention"] * 32}, "layer_types: names no attention layer"),
        ({"hybrid_override_pattern": "M-" * 16}, "hybrid_override_pattern: names no attention layer"),
        (
            {"hybrid_override_pattern": "M*"},
            "hybrid_override_pattern: must give num_hidden_layers=32 characters, got 2",
        ),
        (
            {"sliding_window": 4096, "sliding_window_pattern": "LLXG"},
            "sliding_window_pattern: must be an integer or a string of 'L'",
        ),
    ],
)
def test_hybrid_and_letter_patterns_that_cannot_be_read_name_their_key(changes, key):
    with pytest.raises(ModelConfigError, match=key):
        ModelFacts.from_hf_dict(_llama(**changes))


def test_exaone4_letter_pattern_repeats_local_and_global_layers():
    """EXAONE 4's ``sliding_window_pattern: "LLLG"`` means what the integer 4 means (transformers' Exaone4Config)."""
    letters = ModelFacts.from_hf_dict(_llama(model_type="exaone4", sliding_window=4096, sliding_window_pattern="LLLG"))
    number = ModelFacts.from_hf_dict(_llama(model_type="exaone4", sliding_window=4096, sliding_window_pattern=4))
    assert letters.layer_kinds == number.layer_kinds and letters.layer_kinds[:4] == (K.SLIDING_WINDOW,) * 3 + (K.FULL,)


def test_a_bidirectional_decoder_keeps_its_layer_kinds_and_halves_its_window():
    """EmbeddingGemma (use_bidirectional_attention): the sliding/global pattern stays, the window is transformers'
    |q - k| < sliding_window // 2 + 1 (so sliding_window_size 256 on each side); a non-bool flag is an error."""
    from tests.support.helpers import embedding_gemma

    m = embedding_gemma()
    assert m.use_bidirectional_attention and m.sliding_window == 257 and m.is_hybrid_swa and not m.is_encoder_only
    assert m.layer_kinds[:6] == (K.SLIDING_WINDOW,) * 5 + (K.FULL,)
    assert not embedding_gemma(use_bidirectional_attention=None).use_bidirectional_attention
    assert embedding_gemma(use_bidirectional_attention=None).sliding_window == 512
    with pytest.raises(ModelConfigError, match="use_bidirectional_attention: must be true or false"):
        embedding_gemma(use_bidirectional_attention="yes")


def test_folder_path_reads_config_json(tmp_path):
    (tmp_path / "config.json").write_text((MODELS / "Qwen3-8B.json").read_text())
    assert ModelFacts.from_hf_config(tmp_path).num_key_value_heads == 8


def test_malformed_configs_name_every_bad_key(tmp_path):
    bad = json.loads((MODELS / "gpt-oss-20b.json").read_text())
    bad["num_key_value_heads"] = 7
    bad["layer_types"][3] = "global_attention"
    bad["sliding_window"] = "wide"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ModelConfigError) as err:
        ModelFacts.from_hf_config(path)
    text = str(err.value)
    assert "num_key_value_heads" in text and "layer_types[3]" in text and "sliding_window" in text
    assert len(err.value.problems) == 3


def test_not_json_and_missing(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(ModelConfigError, match=r"config.json:1:2"):
        ModelFacts.from_hf_config(path)
    with pytest.raises(ModelConfigError, match="cannot read"):
        ModelFacts.from_hf_config(tmp_path / "missing.json")
    with pytest.raises(ModelConfigError, match="num_attention_heads"):
        ModelFacts.from_hf_dict({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64})


@pytest.mark.parametrize(
    "model, edit, needle",
    [  # values read as transformers and SGLang read them, not by truthiness
        ("DeepSeek-V3", {"index_topk": False}, "index_topk: must be a positive integer (tokens), got False"),
        (
            "Qwen2.5-7B-Instruct",
            {"use_sliding_window": "false"},
            "use_sliding_window: must be true or false, got 'false'",
        ),
        ("Qwen2.5-7B-Instruct", {"is_causal": "false"}, "is_causal: must be true or false, got 'false'"),
    ],
)
def test_a_feature_key_of_the_wrong_type_is_an_error_naming_it(model, edit, needle):
    raw = json.loads((MODELS / f"{model}.json").read_text())
    with pytest.raises(ModelConfigError) as err:
        ModelFacts.from_hf_dict({**raw, **edit})
    assert needle in str(err.value) and len(err.value.problems) == 1


@pytest.mark.parametrize(
    "edit", [{"vision_config": None}, {"audio_config": None}, {"dual_chunk_attention_config": False}]
)
def test_a_null_or_false_feature_config_means_no_such_feature(edit):
    facts = ModelFacts.from_hf_dict({**json.loads((MODELS / "Qwen2.5-7B-Instruct.json").read_text()), **edit})
    assert not facts.is_multimodal and not facts.has_dual_chunk_attention


@pytest.mark.parametrize(
    "file, change, key",
    [
        ("Llama-3.1-8B", {"layer_types": ["sliding_attention"] * 32}, "sliding_window: missing"),
        ("Llama-3.1-8B", {"layer_types": ["chunked_attention"] * 32}, "attention_chunk_size: missing"),
        ("gemma-2-9b", {"query_pre_attn_scalar": -256}, "query_pre_attn_scalar: must be a finite number above 0"),
        ("gemma-2-9b", {"attn_logit_softcapping": 0}, "attn_logit_softcapping: must be a finite number above 0"),
        ("gemma-2-9b", {"final_logit_softcapping": -30.0}, "final_logit_softcapping"),
    ],
)
def test_a_layer_kind_needs_its_size_and_scales_are_positive(file, change, key):
    raw = {**json.loads((MODELS / f"{file}.json").read_text()), **change}
    with pytest.raises(ModelConfigError) as err:
        ModelFacts.from_hf_dict(raw)
    assert key in str(err.value)


def test_max_window_layers_0_makes_every_layer_slide():
    """transformers' Qwen2: layer i slides where i >= max_window_layers, so 0 is valid and slides them all."""
    raw = json.loads((MODELS / "Qwen2.5-7B-Instruct.json").read_text())
    raw.pop("layer_types", None)
    facts = ModelFacts.from_hf_dict({**raw, "use_sliding_window": True, "max_window_layers": 0, "sliding_window": 4096})
    assert set(facts.layer_kinds) == {K.SLIDING_WINDOW}
    null = ModelFacts.from_hf_dict(
        {**json.loads((MODELS / "gemma-2-9b.json").read_text()), "attn_logit_softcapping": None}
    )
    assert null.attn_logit_softcapping is None  # null: no soft-cap, as transformers reads it


def test_an_encoder_with_its_own_head_count_is_refused_not_built_with_the_decoders():
    whisper = json.loads((MODELS / "whisper-large-v3-turbo.json").read_text())
    with pytest.raises(ModelConfigError) as err:
        ModelFacts.from_hf_dict({**whisper, "encoder_attention_heads": 8})
    assert "encoder_attention_heads: 8 differs from decoder_attention_heads=20" in str(err.value)
    with pytest.raises(ModelConfigError) as err:
        ModelFacts.from_hf_dict({**whisper, "is_encoder_decoder": "false"})
    assert "is_encoder_decoder: must be true or false" in str(err.value)


def _gemma3() -> dict:
    return json.loads((MODELS / "gemma-3-27b-it.json").read_text())


def test_the_language_model_is_read_from_its_sub_config_only():
    """SGLang's get_hf_text_config: the sub-config alone; a key it omits takes transformers' default for its model
    type, never the top level's value, and a top-level key beside it that says otherwise is refused."""
    raw = _gemma3()
    facts = ModelFacts.from_hf_dict(raw)
    assert facts.head_dim == raw["text_config"]["head_dim"] and facts.model_type == "gemma3"
    del raw["text_config"]["head_dim"]
    assert ModelFacts.from_hf_dict(raw).head_dim == 256  # Gemma3TextConfig's default
    with pytest.raises(ModelConfigError) as err:
        ModelFacts.from_hf_dict({**raw, "head_dim": 128, "num_attention_heads": 8})
    assert [p.where.split(": ")[1] for p in err.value.problems] == ["head_dim", "num_attention_heads"]
    assert "text_config gives no head_dim" in str(err.value)
    del raw["text_config"]["model_type"]  # Gemma3Config builds a Gemma3TextConfig all the same
    assert ModelFacts.from_hf_dict(raw).head_dim == 256
    same = {**_gemma3(), "num_attention_heads": _gemma3()["text_config"]["num_attention_heads"]}
    assert ModelFacts.from_hf_dict(same) == facts.model_copy(update={"source": "<config>"})


@pytest.mark.parametrize("stack", ["llm_config", "language_config", "thinker_config"])
def test_every_sub_config_sglang_reads_is_read_and_named_in_problems(stack):
    text = _gemma3()["text_config"]
    raw = {"model_type": "composite", "architectures": ["X"], stack: {**text, "num_key_value_heads": 3}}
    with pytest.raises(ModelConfigError, match=rf"{stack}\.num_key_value_heads: 3 does not divide"):
        ModelFacts.from_hf_dict(raw)
    nested = {"model_type": "qwen2_5_omni", "thinker_config": {"text_config": text}, "torch_dtype": "float16"}
    facts = ModelFacts.from_hf_dict(nested)
    assert facts.num_key_value_heads == text["num_key_value_heads"]
    assert facts.torch_dtype == "float16"  # the parent's dtype where the sub-config has none, as SGLang copies it


def test_a_sub_config_that_is_no_object_or_misses_the_heads_is_named():
    with pytest.raises(ModelConfigError, match="text_config: must be an object") as err:
        ModelFacts.from_hf_dict({**_gemma3(), "text_config": [1]})
    assert len(err.value.problems) == 1  # its keys are not then looked for at the top level
    with pytest.raises(ModelConfigError, match="text_config.num_attention_heads: missing"):
        ModelFacts.from_hf_dict({**_gemma3(), "text_config": {"head_dim": 128}})
    llama = json.loads((MODELS / "Llama-3.1-8B.json").read_text())
    assert ModelFacts.from_hf_dict({**llama, "text_config": None}).head_dim == 128  # null: no sub-config


def test_the_typed_models_report_every_problem_of_the_file_with_its_key_path():
    raw = _gemma3()
    raw["text_config"].update(num_hidden_layers=True, sliding_window_pattern="LXG", attn_logit_softcapping="50")
    raw.update(vision_config="siglip", architectures="Gemma3")
    with pytest.raises(ModelConfigError) as err:
        ModelFacts.from_hf_dict(raw)
    assert sorted(p.where.split(": ")[1] for p in err.value.problems) == [
        "architectures",
        "text_config.attn_logit_softcapping",
        "text_config.num_hidden_layers",
        "text_config.sliding_window_pattern",
        "vision_config",
    ]
    assert "vision_config: must be an object (or null / false for none), got 'siglip'" in str(err.value)


@pytest.mark.parametrize("value", [0, True, "", "siglip", []])
def test_a_tower_is_an_object_or_null_or_false(value):
    """vision_config / audio_config / dual_chunk_attention_config: an object, or null / false for none; 0 (which a
    lax Literal[False] took as false), true or a name is refused naming the key."""
    raw = json.loads((MODELS / "Qwen3-8B.json").read_text())
    for key in ("vision_config", "audio_config", "dual_chunk_attention_config"):
        with pytest.raises(ModelConfigError, match=f"{key}: must be an object \\(or null / false for none\\)"):
            ModelFacts.from_hf_dict({**raw, key: value})


def test_an_mha_models_narrower_v_rows_are_read_as_sglang_reads_them():
    """``v_head_dim`` on an MHA model (MiMo-V2: 192 / 128) is its V rows' width (SGLang 0.5.23 model_config.py
    l.1352); SM100's default then skips trtllm_mha, which needs K and V rows of one width."""
    from attngate import Platform, ServerArgs, resolve

    raw = json.loads((MODELS / "Qwen3-8B.json").read_text())
    facts = ModelFacts.from_hf_dict({**raw, "head_dim": 192, "v_head_dim": 128}, source="mimo-like")
    assert (facts.head_dim, facts.v_head_dim, facts.has_asymmetric_kv) == (192, 128, True)
    resolution = resolve(ServerArgs(), facts, Platform.from_name("sm100"))
    assert resolution.plan.decode_backend == "fa4"
    assert "default-backend.mha-blackwell-asymmetric-kv" in [a.rule for a in resolution.adjustments]
    assert ModelFacts.from_hf_dict(raw, source="Qwen3-8B").v_head_dim == 128  # absent: the head dim
    deepseek = json.loads((MODELS / "DeepSeek-V3.json").read_text())
    with pytest.raises(ModelConfigError) as err:  # read by the shape and by MLA's ranks: named once
        ModelFacts.from_hf_dict({**deepseek, "v_head_dim": "128"}, source="DeepSeek-V3")
    assert [p.where for p in err.value.problems] == ["DeepSeek-V3: v_head_dim"]


def test_mimo_v2_reads_its_sliding_layers_own_shape_and_pattern():
    """MiMo-V2-Flash: ``hybrid_layer_pattern`` (1 sliding, 0 full: layers 0, 5, 11, ... 47 full), the window from
    ``sliding_window_size``, and the sliding layers' own 64/8 heads beside the full layers' 64/4 (SGLang 0.5.23
    model_config.py get_hybrid_layer_ids, models/mimo_v2.py l.192-204)."""
    m = ModelFacts.from_hf_config(MODELS / "MiMo-V2-Flash.json")
    assert [i for i, k in enumerate(m.layer_kinds) if k == K.FULL] == [0, 5, 11, 17, 23, 29, 35, 41, 47]
    assert m.swa_shape == (64, 8, 192, 128) and m.shape(K.FULL) == (64, 4, 192, 128)
    assert m.head_shapes == ((64, 4, 192, 128), (64, 8, 192, 128))
    assert (m.swa_num_key_value_heads, m.num_key_value_heads, m.has_asymmetric_kv) == (8, 4, True)


@settings(max_examples=60, deadline=None)
@given(
    heads=st.sampled_from([8, 16, 32]),
    kv=st.sampled_from([None, 1, 2, 4, 8]),
    swa_heads=st.sampled_from([None, 8, 16, 32]),
    swa_kv=st.sampled_from([None, 1, 2, 4, 8]),
    swa_dim=st.sampled_from([None, 64, 128, 192]),
    swa_v_dim=st.sampled_from([None, 64, 128]),
    pattern=st.lists(st.integers(0, 1), min_size=4, max_size=4),
)
def test_any_swa_shape_is_the_sliding_layers_and_only_theirs(heads, kv, swa_heads, swa_kv, swa_dim, swa_v_dim, pattern):
    """For any ``swa_*`` keys: each sliding-window layer has the keys' shape (an absent key the model's;
    ``swa_v_head_dim`` absent: ``swa_head_dim``, SGLang's default), each full layer the model's; a shape whose KV heads
    do not divide its query heads is refused naming the key, and so is nothing else."""
    raw = {
        "architectures": ["MiMoV2FlashForCausalLM"],
        "model_type": "mimo_v2_flash",
        "num_hidden_layers": 4,
        "num_attention_heads": heads,
        "head_dim": 128,
        "sliding_window_size": 128,
        "hybrid_layer_pattern": pattern,
    }
    given_keys = {
        "num_key_value_heads": kv,
        "swa_num_attention_heads": swa_heads,
        "swa_num_key_value_heads": swa_kv,
        "swa_head_dim": swa_dim,
        "swa_v_head_dim": swa_v_dim,
    }
    raw.update({k: v for k, v in given_keys.items() if v is not None})
    model_kv = kv or heads
    want_swa = (swa_heads or heads, swa_kv or model_kv, swa_dim or 128, swa_v_dim or swa_dim or 128)
    bad = [k for k, (q, h) in {"num_key_value_heads": (heads, model_kv)}.items() if q % h]
    if want_swa[0] % want_swa[1]:
        bad.append("swa_num_key_value_heads" if swa_kv else "swa_num_attention_heads")
    if bad:
        with pytest.raises(ModelConfigError) as err:
            ModelFacts.from_hf_dict(raw, source="m")
        assert [p.where for p in err.value.problems] == [f"m: {k}" for k in bad]
        return
    m = ModelFacts.from_hf_dict(raw, source="m")
    for flag, kind in zip(pattern, m.layer_kinds):
        assert kind == (K.SLIDING_WINDOW if flag else K.FULL)
        assert m.shape(kind) == (want_swa if flag else (heads, model_kv, 128, 128))
    assert m.has_asymmetric_kv == (want_swa[2] != want_swa[3])


@pytest.mark.parametrize(
    "changes, sinks",
    [
        # SWA_SINK_ARCHS (SGLang 0.5.23 model_config.py l.88-95): the architecture alone, in any place of the list
        ({"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss"}, True),
        ({"architectures": ["GraniteSWAForCausalLM"], "model_type": "granite_swa"}, True),
        ({"architectures": ["GraniteMoeSWAForCausalLM"], "model_type": "granitemoe_swa"}, True),
        ({"architectures": ["IQuestQ1ForCausalLM"], "model_type": "iquest_q1"}, True),
        ({"architectures": ["X", "IQuestQ1MTP"], "model_type": "iquest_q1_mtp"}, True),
        ({"model_type": "gpt_oss"}, False),  # a model type names no sinks: SGLang reads the architectures
        ({"architectures": ["GraniteForCausalLM"], "model_type": "granite"}, False),  # plain Granite has none
        # MiMo-V2 (l.1284-1288): either sink-bias switch, and never learnable_sink
        ({"architectures": ["MiMoV2FlashForCausalLM"], "add_swa_attention_sink_bias": True}, True),
        ({"architectures": ["MiMoV2ForCausalLM"], "add_full_attention_sink_bias": True}, True),
        ({"architectures": ["MiMoV2MTP"], "add_swa_attention_sink_bias": True}, True),
        ({"architectures": ["MiMoV2FlashForCausalLM"], "add_swa_attention_sink_bias": False}, False),
        ({"architectures": ["MiMoV2FlashForCausalLM"], "learnable_sink": True}, False),
        ({"architectures": ["LlamaForCausalLM"], "add_swa_attention_sink_bias": True}, False),  # MiMo-V2's keys only
        # any other model (l.1289): learnable_sink; HY V4's config class defaults it to true (configs/hy_v4.py l.44)
        ({"learnable_sink": True}, True),
        ({"learnable_sink": False}, False),
        ({"learnable_sink": None}, False),
        ({"model_type": "hy_v4"}, True),
        ({"model_type": "hy_v4", "learnable_sink": False}, False),
        ({}, False),
    ],
)
def test_attention_sinks_are_read_as_sglang_detects_them(changes, sinks):
    """has_attention_sinks follows SGLang 0.5.23's ModelConfig._detect_attention_sinks (model_config.py
    l.1273-1289): it picks the default backend (R5: triton rather than FlashInfer) and FA3's provider."""
    assert ModelFacts.from_hf_dict(_llama(**changes)).has_attention_sinks is sinks


def test_a_sink_key_is_read_from_the_language_model_and_must_be_a_switch():
    """The sink keys are language-model keys (SGLang reads hf_text_config): read from the sub-config, refused at the
    top level beside a sub-config that says otherwise, and a switch, not a number or a string."""
    raw = _gemma3()
    assert not ModelFacts.from_hf_dict(raw).has_attention_sinks
    raw["text_config"]["learnable_sink"] = True
    assert ModelFacts.from_hf_dict(raw).has_attention_sinks
    with pytest.raises(ModelConfigError, match="learnable_sink: set at the top level beside text_config"):
        ModelFacts.from_hf_dict({**_gemma3(), "learnable_sink": True})
    for key in ("learnable_sink", "add_swa_attention_sink_bias", "add_full_attention_sink_bias"):
        with pytest.raises(ModelConfigError, match=f"{key}: must be true or false, got 1"):
            ModelFacts.from_hf_dict(_llama(architectures=["MiMoV2FlashForCausalLM"], **{key: 1}))
