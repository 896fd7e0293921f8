"""How conform scores a case, on the CPU (no SGLang: its side stands in as the values it would resolve): a
difference is never scored as agreement, and a config attngate cannot read while SGLang serves it is a refusal of
attngate's, never "both refuse"."""

from __future__ import annotations

import pytest

from attngate import Platform, load_rules
from attngate.facts.server_args import ServerArgs
from attngate.integrations.sglang.compare import CaseResult, Verdict, compare_case, unreadable_config
from attngate.rules.deviations import REFUSAL
from tests.support.helpers import model


def _sglang_resolved() -> dict:
    """What SGLang's resolved_dict() holds of the fields attngate compares (its names: attn_dp_size, cuda_graph_config)."""
    return ServerArgs().model_dump() | {"attn_dp_size": 1, "cuda_graph_config": None}


def test_a_config_attngate_cannot_read_while_sglang_serves_it_is_an_undeclared_refusal():
    result = unreadable_config("gemma-3-4b-it/sm90/0", _sglang_resolved(), None, "config.json: no num_attention_heads")
    assert result.sglang is not None and result.attngate is None
    assert result.differences == {REFUSAL: (None, "config.json: no num_attention_heads")}
    assert result.verdict is Verdict.ONE_REFUSES


def test_a_config_both_sides_refuse_is_both_refuse():
    result = unreadable_config("x/sm90/0", None, "ValueError: bad config", "config.json: no num_attention_heads")
    assert not result.differences and result.verdict is Verdict.BOTH_REFUSE


def test_an_undeclared_difference_outranks_both_refusing():
    result = CaseResult("x", None, None, differences={REFUSAL: (None, "refused")})
    assert result.verdict is Verdict.ONE_REFUSES
    result.declared[REFUSAL] = ["some.deviation"]
    assert result.verdict is Verdict.BOTH_REFUSE


@pytest.mark.parametrize(
    "name, given, refused_by",
    [
        # FA's FP8 query cast without a scale (sglang issues 5700, 20820)
        (
            "Qwen2.5-7B-Instruct",
            {"attention_backend": "fa3", "kv_cache_dtype": "fp8_e4m3"},
            "known.fa-fp8-kv-query-cast-without-scale",
        ),
        # SGLang's FlashInfer runs gemma-2 uncapped and its ragged prefill without the window (sglang issue 33915)
        (
            "gemma-2-9b-it",
            {"attention_backend": "flashinfer"},
            "known.flashinfer-ragged-prefill-drops-window, known.flashinfer-softcap-planned-uncapped",
        ),
        # the same soft-cap on the decode side alone
        (
            "gemma-2-9b-it",
            {"prefill_attention_backend": "fa3", "decode_attention_backend": "flashinfer"},
            "known.flashinfer-softcap-planned-uncapped",
        ),
    ],
)
def test_attngates_refusal_of_what_sglang_serves_names_the_rules_that_refused(name, given, refused_by):
    """SGLang serves it with a known failure of its own; attngate refuses, declared by sglang.known-failures-refused,
    and the refusal's origin names the rules that refused."""
    given = _sglang_resolved() | given
    result = compare_case(f"{name}/sm90", given, given, None, model(name), Platform.from_name("sm90"), load_rules())
    assert result.attngate is None and set(result.differences) == {REFUSAL}
    assert result.origins[REFUSAL] == refused_by
    assert result.declared == {REFUSAL: ["sglang.known-failures-refused"]}
    assert result.verdict is Verdict.DEVIATION


def _fallback_case(name: str, gpu: str, given: dict, sglang_changes: dict):
    """A case where attngate refuses SGLang's default backend and runs another (a fallback); SGLang's side is attngate's
    own resolved values with ``sglang_changes``."""
    facts, platform, rules = model(name), Platform.from_name(gpu), load_rules()
    from attngate import resolve

    resolution = resolve(ServerArgs(**given), facts, platform, rules)
    assert resolution.default_refusal is not None  # the case is a fallback
    sglang = resolution.server_args.model_dump() | {"attn_dp_size": 1, "cuda_graph_config": None} | sglang_changes
    return compare_case(f"{name}/{gpu}", _sglang_resolved() | given, sglang, None, facts, platform, rules)


def test_a_fallback_that_lands_on_sglangs_own_values_agrees():
    """Qwen2.5 with multi-item scoring and EAGLE on SM100: SGLang picks FlashInfer before filling the speculative
    parameters; attngate refuses its default (trtllm_mha, through mis.flashinfer-only) and falls back to FlashInfer."""
    result = _fallback_case("Qwen2.5-7B-Instruct", "sm100", {"enable_mis": True, "speculative_algorithm": "EAGLE"}, {})
    assert result.attngate is not None and not result.differences and result.verdict is Verdict.AGREE


def test_a_fallback_whose_values_differ_is_declared_only_by_deviations_naming_its_rules():
    given = {"enable_mis": True}
    kept = {"attention_backend": "trtllm_mha", "prefill_attention_backend": None, "decode_attention_backend": None}
    result = _fallback_case("Qwen2.5-7B-Instruct", "sm100", given, kept)  # SGLang kept a default attngate refuses
    assert set(result.differences) >= {"attention_backend"} and REFUSAL not in result.differences
    assert result.origins["attention_backend"] == "mis.flashinfer-only"
    assert not result.declared and result.verdict is Verdict.DISAGREE  # no deviation names mis.flashinfer-only here
    # gemma-2 on SM80: SGLang's default FlashInfer runs it uncapped (sglang 33915); attngate falls back, declared
    gemma = _fallback_case("gemma-2-9b-it", "sm80", {}, {"attention_backend": "flashinfer"} | dict.fromkeys(kept, None))
    assert gemma.declared and all(ids == ["sglang.known-failures-refused"] for ids in gemma.declared.values())
    assert gemma.verdict is Verdict.DEVIATION
