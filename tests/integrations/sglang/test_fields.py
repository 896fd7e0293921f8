"""The SGLang field mapping, deviations and the comparison, on a CPU without SGLang (its values are stand-in dicts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from attngate import ModelFacts, Platform, ServerArgs, load_rules
from attngate.errors import RulesError, ServerArgsError
from attngate.integrations.sglang.compare import Verdict, compare_case
from attngate.integrations.sglang.fields import (
    attngate_values,
    from_sglang,
    to_sglang_kwargs,
)
from attngate.rules.deviations import matching_deviations
from attngate.rules.load import parse_rules, shipped_rules_path

MODELS = Path(__file__).resolve().parents[3] / "examples" / "models"


def sglang_values(**overrides) -> dict:
    """What SGLang 0.5.23's resolved_dict() holds for attngate's fields, at SGLang's defaults."""
    values = {n: f.default for n, f in ServerArgs.model_fields.items() if n != "enable_piecewise_cuda_graph"}
    values.update(
        attn_dp_size=1, cuda_graph_config={"decode": {"backend": "full"}, "prefill": {"backend": "breakable"}}
    )
    values.update(overrides)
    return values


def test_renamed_fields_are_read_from_their_sglang_spelling():
    values = attngate_values(
        sglang_values(
            attn_dp_size=4,
            dp_size=1,
            enable_dp_attention=False,
            cuda_graph_config={"decode": {"backend": "disabled"}, "prefill": {"backend": "breakable"}},
        )
    )
    assert values["enable_dp_attention"] is True and values["dp_size"] == 4
    assert values["disable_cuda_graph"] is True
    assert values["enable_piecewise_cuda_graph"] is False  # breakable is not the torch.compile piecewise graph
    assert attngate_values(sglang_values(dp_size=2))["enable_dp_attention"] is False


def test_a_field_sglang_lacks_is_an_error_naming_it():
    values = sglang_values()
    del values["page_size"], values["attn_dp_size"]
    with pytest.raises(ServerArgsError) as err:
        attngate_values(values)
    text = str(err.value)
    assert "page_size" in text and "attn_dp_size" in text and "RENAMED" in text


def test_to_sglang_kwargs_round_trips_and_refuses_what_sglang_cannot_say():
    args = ServerArgs(attention_backend="fa3", page_size=16, enable_dp_attention=True, dp_size=2, tp_size=2)
    kwargs = to_sglang_kwargs(args)
    assert kwargs == {
        "attention_backend": "fa3",
        "page_size": 16,
        "enable_dp_attention": True,
        "dp_size": 2,
        "tp_size": 2,
    }
    given = sglang_values(**kwargs)
    assert from_sglang(given) == args
    with pytest.raises(ServerArgsError) as err:
        to_sglang_kwargs({"enable_piecewise_cuda_graph": True, "no_such_arg": 1})
    assert "enable_piecewise_cuda_graph" in str(err.value) and "no_such_arg" in str(err.value)


def _case(
    given: dict, resolved: dict | None, refusal: str | None = None, model: str = "Llama-3.1-8B", gpu: str = "sm90"
):
    return compare_case(
        "t",
        sglang_values(**given),
        None if resolved is None else sglang_values(**resolved),
        refusal,
        ModelFacts.from_hf_config(MODELS / f"{model}.json"),
        Platform.from_name(gpu),
        load_rules(),
    )


def test_compare_agrees_with_sglangs_default_choice():
    result = _case({}, {"attention_backend": "fa3", "page_size": 1, "chunked_prefill_size": 8192})
    assert result.verdict == Verdict.AGREE, result.differences


def test_compare_names_the_rule_behind_a_difference():
    result = _case({}, {"attention_backend": "flashinfer", "page_size": 1})
    assert result.verdict == Verdict.DISAGREE
    assert result.differences["attention_backend"] == ("flashinfer", "fa3")
    assert result.origins["attention_backend"] == "default-backend.mha-hopper"


def test_attngate_refusal_declared_by_a_deviation_naming_its_rule():
    # fa3 on SM100: SGLang resolves it and fails in its attention registry at model load
    result = _case({"attention_backend": "fa3"}, {"attention_backend": "fa3", "page_size": 1}, gpu="sm100")
    assert result.verdict == Verdict.DEVIATION
    assert result.declared["refusal"] == ["sglang.registry-refusals-at-start-up"]


def test_a_refusal_by_a_rule_no_deviation_names_stays_undeclared():
    # SGLang refuses; attngate accepts: no deviation declares it
    result = _case({}, None, refusal="ValueError: no")
    assert result.verdict == Verdict.ONE_REFUSES and not result.declared


def test_deviation_of_attention_backend_covers_the_phases_it_stands_for():
    result = _case(
        {},
        {"attention_backend": "flashinfer", "page_size": 1, "is_embedding": True},
        model="all-MiniLM-L6-v2",
        gpu="sm80",
    )
    assert result.differences["attention_backend"] == ("flashinfer", "triton")
    assert result.verdict == Verdict.DEVIATION
    assert set(result.declared) == {"attention_backend", "prefill_attention_backend", "decode_attention_backend"}


def test_matching_deviations_reads_the_arguments_as_given():
    rules = load_rules()
    model = ModelFacts.from_hf_config(MODELS / "all-MiniLM-L6-v2.json")
    assert matching_deviations(rules, ServerArgs(), model, Platform.from_name("sm80")) == {
        "attention_backend": ["sglang.default-backend-for-head-dims-flashinfer-cannot-run"],
        "page_size": ["sglang.default-backend-for-head-dims-flashinfer-cannot-run"],
        "sglang_refusal": ["sglang.default-backend-for-head-dims-flashinfer-cannot-run"],
    }
    assert matching_deviations(rules, ServerArgs(attention_backend="triton"), model, Platform.from_name("sm80")) == {}


def test_bad_deviations_are_all_reported_with_their_place():
    text = (
        shipped_rules_path()
        .read_text()
        .replace(
            "\ndeviations:\n",
            """
deviations:
  - {id: x.one, fields: [page_sise, page_size], when: "true", reason: r, source: s}
  - {id: x.two, fields: refusal, rules: [no.such-rule], reason: r, source: s}
  - {id: x.three, fields: page_size, rules: [fa3.requires-sm80-or-sm90], when: "use_mlaa", reason: r, source: s}
  - {id: x.four, fields: [page_size], rules: [fa3.requires-sm80-or-sm90], reason: r, source: s}
""",
        )
    )
    with pytest.raises(RulesError) as err:
        parse_rules(text, "r.yaml")
    text = str(err.value)
    assert "'page_sise' is neither a server argument nor refusal / sglang_refusal" in text and "page_size" in text
    assert "no rule 'no.such-rule'" in text
    assert "'x.three': fields: refusal (attngate refuses) goes with rules:" in text and "use_mlaa" in text
    assert "'x.four': fields: refusal (attngate refuses) goes with rules:" in text
    assert text.count("r.yaml:") >= 5


@pytest.mark.parametrize(
    "model, expected", [("Llama-3.1-8B", (5, 4, 8)), ("Qwen3-8B", (3, 1, 4)), ("Mistral-7B-v0.1", (3, 1, 4))]
)
def test_eagle_auto_parameters_follow_sglang(model: str, expected: tuple[int, int, int]):
    # found by attngate conform: SGLang 0.5.23's _auto_choose_speculative_params gives a tree to Llama and Grok-1 only
    from attngate import resolve

    args = resolve(
        ServerArgs(speculative_algorithm="EAGLE"),
        ModelFacts.from_hf_config(MODELS / f"{model}.json"),
        Platform.from_name("sm90"),
    ).server_args
    assert (args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens) == expected


def test_an_attngate_refusal_is_declared_only_where_deviations_name_all_its_rules_between_them():
    rules, model, sm100 = (
        load_rules(),
        ModelFacts.from_hf_config(MODELS / "gemma-2-9b.json"),
        Platform.from_name("sm100"),
    )
    both = frozenset({"fa3.requires-sm80-or-sm90", "known.flashinfer-swa-non-eagle-verify"})
    assert matching_deviations(rules, ServerArgs(), model, sm100, both)["refusal"] == [
        "sglang.registry-refusals-at-start-up",
        "sglang.known-failures-refused",
    ]
    unnamed = frozenset({"fa3.requires-sm80-or-sm90", "kv-dtype.nvfp4-blackwell"})
    assert "refusal" not in matching_deviations(rules, ServerArgs(), model, sm100, unnamed)


def test_lint_finds_a_deviation_that_cannot_hold_and_two_that_overlap():
    from attngate.analysis.lint import lint_rules

    text = (
        shipped_rules_path()
        .read_text()
        .replace(
            "\ndeviations:\n",
            """
deviations:
  - {id: x.never, fields: page_size, when: "use_mla and not use_mla", reason: r, source: s}
  - {id: x.wide, fields: [page_size, tp_size], when: "sm_major == 9", reason: r, source: s}
  - {id: x.narrow, fields: tp_size, when: "sm_major >= 9 and tp_size > 2", reason: r, source: s}
  - {id: x.other-field, fields: dp_size, when: "sm_major == 9", reason: r, source: s}
  - {id: x.other-rule, fields: refusal, rules: [kv-dtype.nvfp4-blackwell], reason: r, source: s}
  - {id: x.same-rule, fields: refusal, rules: [fa3.requires-sm80-or-sm90], when: "sm_major == 10", reason: r, source: s}
""",
        )
    )
    found = [f.message for f in lint_rules(parse_rules(text, "r.yaml"))]
    assert "deviation 'x.never' can never hold" in found
    assert any("'x.wide' and 'x.narrow' both declare tp_size" in m for m in found)
    assert not any("x.other-field" in m or "x.other-rule" in m for m in found)
    assert any("'x.same-rule' and 'sglang.registry-refusals-at-start-up' both declare refusal" in m for m in found)


def test_generated_cases_meet_every_model_gpu_and_every_two_settings_once():
    from itertools import combinations

    from attngate.integrations.sglang.cases import generate_cases, value_domains

    rules = load_rules()
    models = [MODELS / f"{name}.json" for name in ("Llama-3.1-8B", "DeepSeek-V2-Lite", "gemma-2-9b")]
    cases = generate_cases(models, ["sm90", "sm100"], rules)
    settings = [(n, v) for n, vs in value_domains(rules).items() for v in vs if v != ServerArgs.model_fields[n].default]
    pairs = [p for p in combinations(settings, 2) if p[0][0] != p[1][0]]
    assert len(cases) == 3 * 2 + len(settings) * 2 + len(pairs)
    assert {(c.model_config, c.gpu) for c in cases if not c.args} == {(m, g) for m in models for g in ("sm90", "sm100")}
    assert len({c.name for c in cases}) == len(cases)
    paired = [frozenset(c.args.items()) for c in cases[3 * 2 + len(settings) * 2 :]]
    assert len(set(paired)) == len(pairs)  # every pair once, none twice
