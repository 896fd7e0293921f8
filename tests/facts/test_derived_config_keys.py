"""Keys a model's config class derives where the config.json leaves them out (issue 51: a config attngate cannot read
while SGLang serves it is a difference): EXAONE 3's ``num_layers`` (SGLang's ExaoneConfig attribute_map) and
MiniCPM3's ``v_head_dim`` (``hidden_size // num_attention_heads`` in SGLang's MiniCPM3 attention)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attngate import ModelFacts
from attngate.errors import ModelConfigError


def _exaone(layers: int, **extra) -> dict:
    return {
        "architectures": ["ExaoneForCausalLM"],
        "model_type": "exaone",
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_layers": layers,
        **extra,
    }


def _minicpm3(hidden: int, heads: int, **extra) -> dict:
    return {
        "architectures": ["MiniCPM3ForCausalLM"],
        "model_type": "minicpm3",
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "num_hidden_layers": 4,
        "qk_nope_head_dim": 64,
        "qk_rope_head_dim": 32,
        "q_lora_rank": 768,
        "kv_lora_rank": 256,
        **extra,
    }


@settings(max_examples=30, deadline=5000)
@given(layers=st.integers(1, 200))
def test_exaone_reads_num_layers_as_num_hidden_layers(layers):
    facts = ModelFacts.from_hf_dict(_exaone(layers), source="exaone")
    assert len(facts.layer_kinds) == layers
    # a num_hidden_layers given wins, as the attribute map only fills an absent key
    assert len(ModelFacts.from_hf_dict(_exaone(layers, num_hidden_layers=3), source="exaone").layer_kinds) == 3


@settings(max_examples=30, deadline=5000)
@given(heads=st.sampled_from([8, 16, 32, 40, 64]), per_head=st.sampled_from([32, 64, 128]))
def test_minicpm3_takes_its_v_head_dim_from_the_hidden_size(heads, per_head):
    facts = ModelFacts.from_hf_dict(_minicpm3(heads * per_head, heads), source="minicpm3")
    assert facts.attention_arch == "mla" and facts.v_head_dim == per_head
    assert facts.head_dim == 96  # qk_nope + qk_rope
    assert ModelFacts.from_hf_dict(_minicpm3(2560, 40, v_head_dim=128), source="minicpm3").v_head_dim == 128


def test_other_model_types_derive_nothing():
    raw = {**_exaone(8), "model_type": "llama", "architectures": ["LlamaForCausalLM"]}
    with pytest.raises(ModelConfigError, match="num_hidden_layers"):
        ModelFacts.from_hf_dict(raw, source="llama without num_hidden_layers")
