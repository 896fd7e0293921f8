"""Model configs generated around the example ones (wrong types, nulls, falsy values, out-of-range numbers, missing
sizes, keys moved into a nested text_config, llm_config or language_config, keys set at the top level beside one): each is refused naming the key it is about, or resolves to a plan whose
every layer the chosen kernel backend accepts (attngate.backends.capabilities, the backends' own construction check)."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attngate import ModelFacts, Platform, ServerArgs, resolve
from attngate.backends.capabilities import REFUSALS, refusals
from attngate.backends.runtime.layer import layers_from_model
from attngate.errors import ModelConfigError, PlanError
from tests.support.helpers import MODELS

EXAMPLES = sorted(p.stem for p in MODELS.glob("*.json"))
KEYS = (  # what the reader reads for attention
    "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size", "num_hidden_layers", "sliding_window",
    "use_sliding_window", "max_window_layers", "attention_chunk_size", "layer_types", "kv_lora_rank",
    "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "attn_logit_softcapping", "query_pre_attn_scalar",
    "is_causal", "index_topk", "vision_config", "cross_attention_layers", "sliding_window_pattern", "torch_dtype",
)  # fmt: skip
VALUES = st.one_of(
    st.none(), st.just(False), st.just(True), st.just(0), st.just(""), st.just([]), st.just({}),
    st.integers(-3, 4), st.integers(5, 300), st.sampled_from([64, 128, 192, 256, 512, 4096]),
    st.floats(-100, 1e4, allow_nan=False), st.text(max_size=6), st.lists(st.sampled_from(["sliding_attention", "full_attention", 3]), max_size=4),
)  # fmt: skip
SUB_CONFIGS = ("text_config", "llm_config", "language_config")  # the language-model stacks SGLang reads
MOVES = tuple(f"<into {name}>" for name in SUB_CONFIGS)
EDITS = st.lists(
    st.tuples(st.sampled_from(KEYS), st.one_of(st.just("<remove>"), st.sampled_from(MOVES), VALUES)),
    min_size=1,
    max_size=3,
)


def _edited(raw: dict, edits) -> dict:
    raw = json.loads(json.dumps(raw))
    for key, value in edits:
        if value == "<remove>":
            raw.pop(key, None)
            for name in SUB_CONFIGS:
                raw.get(name, {}).pop(key, None)
        elif value in MOVES:
            if key in raw:
                raw.setdefault(value[len("<into ") : -1], {})[key] = raw.pop(key)
        else:
            raw[key] = value
    return raw


@settings(max_examples=150, deadline=3000, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(EXAMPLES), EDITS, st.sampled_from(["sm90", "sm100"]))
def test_a_config_is_refused_with_its_key_or_planned_on_layers_the_backend_accepts(name, edits, gpu):
    raw = _edited(json.loads((MODELS / f"{name}.json").read_text()), edits)
    try:
        facts = ModelFacts.from_hf_dict(raw, source=name)
    except ModelConfigError as err:
        named = " ".join(f"{p.where} {p.message}" for p in err.problems)
        assert any(key in named for key, _ in edits) or any(n in named for n in SUB_CONFIGS) or "required" in named, (
            named
        )
        return
    try:
        resolution = resolve(ServerArgs(), facts, Platform.from_name(gpu, runs_sglang=False))  # attngate's backends
    except PlanError:
        return  # refused with the rules that say why
    plan = resolution.plan
    layers = layers_from_model(facts, plan)
    for backend in {plan.prefill_backend, plan.decode_backend} & set(REFUSALS):
        problems = refusals(backend, plan, layers, int(gpu[2:]) // 10)
        assert not problems, (name, edits, backend, [str(p) for p in problems])
